#!/usr/bin/env bash
# policy_compare.sh: latency and throughput of KV policies under concurrent load
# For each policy and each concurrency level it starts a
# fresh `streamsink serve` (one KV slot per session), runs tools/loadgen.py
# (N sessions of TOKENS generated tokens each, closed loop), stops the server
# with SIGTERM, and at the end writes OUT/README.md (a markdown table with the
# date and the machine) and OUT/latency-N.png (one plot per concurrency level,
# one line per policy). The JSON of every run stays in OUT/.
#
# Policies:
#   window    pure sliding window of WINDOW tokens (the model is softmax, so
#             quality collapses without sinks; the cost is what is measured)
#   sinks:4   StreamingLLM: 4 pinned sinks + a window of WINDOW
#   dense     no eviction, up to the model's context (--window 0: 8192 for
#             SmolLM2). A dense sequence cannot outgrow the context, so its
#             sessions generate min(TOKENS, context - prompt - margin) tokens;
#             with TOKENS=4096 and an 8192 context they fit, and the table
#             says when a cap applied.
#   recompute StreamingLLM's oracle (re-encode the window every token) is an
#             evaluation policy: the server refuses it, at start and per
#             request. The script tries it, records the refusal in the table,
#             and measures nothing for it; its quality numbers come from
#             `streamsink perplexity --policy recompute` (tools/streaming_table.sh).
#
# Usage: tools/policy_compare.sh [OUT]        (default OUT: out/policy-compare)
# Environment (defaults in brackets):
#   SESSIONS ["1 8 32"]  TOKENS [4096]  REQUESTS [1] (streamed requests per session)
#   POLICIES ["window sinks:4 dense recompute"]  WINDOW [1024]  THREADS [nproc]
#   STREAMSINK [build/streamsink]  MODEL [$STREAMSINK_MODEL or the fetch-model.sh cache]
#   PY [.venv/bin/python]  TIME_LIMIT [3600 s per run, also each request's limit]
#   EXTRA_SERVE_ARGS [""]
#   RESUME [0]: 1 keeps OUT/runs.tsv and skips every (policy, sessions, TOKENS)
#               row it already has with a report or a refusal (a long
#               comparison can be continued after a stop)
#
# Cost: 32 sessions x 4096 tokens is 131k tokens per policy; at 100-300
# tokens/s on 2 cores that is 7-20 minutes per policy, about an hour for the
# whole table. A small proof: SESSIONS="1 2" TOKENS=256 WINDOW=128.
# Memory: a dense slot holds the whole context, about 195 MB of f16 KV for
# SmolLM2 at 8192 tokens, so 32 dense sessions need about 6.2 GB.
# On a shared machine, THREADS=1 avoids the thread pool waiting on descheduled
# workers (see the load column: runs on a busy machine measure the neighbours).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

OUT=${1:-out/policy-compare}
SESSIONS=${SESSIONS:-"1 8 32"}
TOKENS=${TOKENS:-4096}
REQUESTS=${REQUESTS:-1}
POLICIES=${POLICIES:-"window sinks:4 dense recompute"}
WINDOW=${WINDOW:-1024}
THREADS=${THREADS:-$(nproc)}
STREAMSINK=${STREAMSINK:-build/streamsink}
PY=${PY:-.venv/bin/python}
TIME_LIMIT=${TIME_LIMIT:-3600}
EXTRA_SERVE_ARGS=${EXTRA_SERVE_ARGS:-}
MODEL=${MODEL:-${STREAMSINK_MODEL:-${XDG_CACHE_HOME:-$HOME/.cache}/streamsink/SmolLM2-135M-Instruct.Q4_1.gguf}}
DENSE_MARGIN=64   # prompt (about 30 tokens) + follow-up prompts + the pending token

[ -x "$STREAMSINK" ] || { echo "policy_compare: no binary at $STREAMSINK (scripts/build.sh)" >&2; exit 2; }
[ -f "$MODEL" ] || { echo "policy_compare: no model at $MODEL (scripts/fetch-model.sh)" >&2; exit 2; }
[ -x "$PY" ] || PY=python3
RESUME=${RESUME:-0}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
# runs.tsv: policy, sessions, tokens asked, tokens per session, json or refusal, load
[ "$RESUME" = 1 ] && [ -f "$OUT/runs.tsv" ] || : >"$OUT/runs.tsv"
# a row counts as done when it has the same tokens and either a report that
# exists or the server's refusal (a failed start or a lost report runs again)
done_before() {
  [ "$RESUME" = 1 ] || return 1
  local js
  js=$(awk -F'\t' -v p="$1" -v n="$2" -v t="$TOKENS" \
    '$1 == p && $2 == n && $3 == t { print $5 }' "$OUT/runs.tsv" | tail -1)
  case "$js" in
    REFUSED*) return 0 ;;
    "") return 1 ;;
    *) [ -f "$js" ] ;;
  esac
}

max_sessions=1
for n in $SESSIONS; do [ "$n" -gt "$max_sessions" ] && max_sessions=$n; done

SERVER_PID=""
SERVER_LOG=""
SERVER_RC=""
cleanup() {
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start_server LOG ARGS...: starts streamsink on a free port; sets SERVER_PID and
# PORT; returns 1 (log kept) when the server exits instead of listening.
start_server() {
  SERVER_LOG=$1
  shift
  # shellcheck disable=SC2086 # EXTRA_SERVE_ARGS is a list of words
  "$STREAMSINK" serve -m "$MODEL" --host 127.0.0.1 --port 0 --threads "$THREADS" \
    --max-queue 64 --drain-timeout 5 "$@" $EXTRA_SERVE_ARGS >"$SERVER_LOG" 2>&1 &
  SERVER_PID=$!
  PORT=""
  for _ in $(seq 1 600); do
    PORT=$(sed -n 's/.*listening on http:\/\/[^:]*:\([0-9][0-9]*\).*/\1/p' "$SERVER_LOG" | head -1)
    [ -n "$PORT" ] && return 0
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      wait "$SERVER_PID" 2>/dev/null && SERVER_RC=0 || SERVER_RC=$?
      SERVER_PID=""
      return 1
    fi
    sleep 0.1
  done
  echo "policy_compare: the server did not start in 60 s" >&2
  stop_server
  SERVER_RC=timeout
  return 1
}

stop_server() {
  if [ -n "$SERVER_PID" ]; then
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=""
  fi
}

loadavg() { cut -d' ' -f1 /proc/loadavg; }

for policy in $POLICIES; do
  tag=${policy//:/}
  case "$policy" in
    recompute)
      if done_before "$policy" "$(echo $SESSIONS | cut -d' ' -f1)"; then
        continue
      fi
      # The server refuses it; record exactly what it says, at start and per request.
      start_msg="" req_msg=""
      if start_server "$OUT/$tag-serve.log" --kv-policy recompute --max-seqs 1; then
        start_msg="started (unexpected)"
        stop_server
      else
        start_msg="\`serve --kv-policy recompute\` exits $SERVER_RC: $(grep -m1 -i 'error' "$OUT/$tag-serve.log" || tail -1 "$OUT/$tag-serve.log")"
      fi
      if start_server "$OUT/$tag-request.log" --max-seqs 1; then
        req_msg=$("$PY" - "$PORT" <<'PYEOF'
import json, sys, urllib.request, urllib.error
body = json.dumps({"model": "m", "prompt": "Hello", "max_tokens": 4,
                   "kv_policy": "recompute"}).encode()
req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/v1/completions", body,
                             {"Content-Type": "application/json"})
try:
    urllib.request.urlopen(req, timeout=120).read()
    print("per request: accepted (unexpected)")
except urllib.error.HTTPError as e:
    msg = json.loads(e.read() or b"{}").get("error", {}).get("message", "")
    print(f"per request: HTTP {e.code}: {msg}")
PYEOF
)
        stop_server
      fi
      echo "policy_compare: recompute refused: $start_msg; $req_msg" >&2
      for n in $SESSIONS; do
        printf '%s\t%s\t%s\t-\tREFUSED %s; %s\t%s\n' "$policy" "$n" "$TOKENS" "$start_msg" \
          "$req_msg" "$(loadavg)" >>"$OUT/runs.tsv"
      done
      continue
      ;;
    dense) serve_args=(--kv-policy dense --window 0) ;;
    *) serve_args=(--kv-policy "$policy" --window "$WINDOW") ;;
  esac
  for n in $SESSIONS; do
    if done_before "$policy" "$n"; then
      echo "policy_compare: $policy with $n sessions: in runs.tsv already (RESUME=1)" >&2
      continue
    fi
    log="$OUT/$tag-$n-serve.log"
    if ! start_server "$log" "${serve_args[@]}" --max-seqs "$n"; then
      echo "policy_compare: $policy with $n sessions: the server did not start:" >&2
      tail -3 "$log" >&2
      printf '%s\t%s\t%s\t-\tFAILED server start: %s\t%s\n' "$policy" "$n" "$TOKENS" \
        "$(tail -1 "$log")" "$(loadavg)" >>"$OUT/runs.tsv"
      continue
    fi
    tokens=$TOKENS
    if [ "$policy" = dense ]; then
      ctx=$("$PY" -c 'import sys, urllib.request
for l in urllib.request.urlopen(sys.argv[1], timeout=30).read().decode().splitlines():
    if l.startswith("streamsink_kv_window_tokens "):
        print(int(float(l.split()[1])))' "http://127.0.0.1:$PORT/metrics" 2>/dev/null || true)
      ctx=${ctx:-8192}
      if [ $((tokens + DENSE_MARGIN)) -gt "$ctx" ]; then
        tokens=$((ctx - DENSE_MARGIN))
        echo "policy_compare: dense holds $ctx tokens: $tokens tokens per session, not $TOKENS" >&2
      fi
    fi
    load=$(loadavg)
    echo "policy_compare: $policy, $n session(s) x $tokens tokens (port $PORT, load $load)" >&2
    json="$OUT/$tag-$n.json"
    "$PY" tools/loadgen.py run --base-url "http://127.0.0.1:$PORT/v1" --sessions "$n" \
      --tokens "$tokens" --requests-per-session "$REQUESTS" --extra-requests 64 \
      --session-mode streamsink --session-prefix "$tag-$n" --label "$policy" \
      --time-limit "$TIME_LIMIT" --request-timeout "$TIME_LIMIT" --json "$json" || true
    stop_server
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$policy" "$n" "$TOKENS" "$tokens" "$json" "$load" \
      >>"$OUT/runs.tsv"
  done
done

# ---- table and plots ----------------------------------------------------------------------
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD -- engine kvcache server api 2>/dev/null || commit="$commit+dirty"
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
mem=$(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)
"$PY" - "$OUT" "$commit" "$cpu" "$(nproc)" "$mem" "$THREADS" "$WINDOW" "$REQUESTS" "$MODEL" \
  "$ROOT" <<'PYEOF'
import json, os, subprocess, sys, time
out, commit, cpu, ncpu, mem, threads, window, requests, model, root = sys.argv[1:11]
rows = [l.rstrip("\n").split("\t") for l in open(os.path.join(out, "runs.tsv")) if l.strip()]

def ms(d, k):
    v = d.get(k)
    return "-" if v is None else f"{v * 1e3:.0f}"

lines = [
    "# KV policies under concurrent load",
    "",
    f"- date: {time.strftime('%Y-%m-%d %H:%M %Z')}",
    f"- machine: {cpu}, {ncpu} CPUs, {mem}; server `--threads {threads}`, CPU backend",
    f"- model: `{os.path.basename(model)}`; commit `{commit}`",
    f"- load: closed loop, every session streams its tokens over {requests} request(s) "
    f"(session_id), greedy; one fresh server per row, one KV slot per session",
    f"- window and sinks:4 keep {window} window tokens; dense keeps the model's whole context",
    "",
    "| policy | sessions | tokens/session | done | tok/s (all) | TTFT p50 ms | ITL p50 ms "
    "| ITL p90 ms | ITL p99 ms | evicted tokens | KV MiB | errors | load avg |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
]
notes = []
by_n = {}
for policy, n, asked, tokens, what, load in rows:
    if what.startswith(("REFUSED", "FAILED")):
        lines.append(f"| {policy} | {n} | - | - | - | - | - | - | - | - | - | "
                     f"{what.split(' ', 1)[0].lower()} | {load} |")
        note = f"- **{policy}**: {what.split(' ', 1)[1]}"
        if note not in notes:
            notes.append(note)
        continue
    if not os.path.exists(what):
        lines.append(f"| {policy} | {n} | {tokens} | no report | | | | | | | | | {load} |")
        continue
    r = json.load(open(what))
    by_n.setdefault(n, []).append(what)
    m = r.get("metrics") or {}
    ev = sum((m.get("evicted_tokens") or {}).values()) if m else None
    kv = m.get("kv_bytes")
    tok = f"{tokens}" + (" (capped)" if tokens != asked else "")
    err = ", ".join(f"{k}: {v}" for k, v in r["errors"].items()) or "0"
    lines.append(
        f"| {policy} | {n} | {tok} | {r['sessions']['completed']}/{r['sessions']['total']} "
        f"| {r['tokens']['per_s']:.1f} | {ms(r['ttft_first_request_s'], 'p50')} "
        f"| {ms(r['itl_s'], 'p50')} | {ms(r['itl_s'], 'p90')} | {ms(r['itl_s'], 'p99')} "
        f"| {'-' if ev is None else f'{ev:.0f}'} | {'-' if kv is None else f'{kv / 2**20:.0f}'} "
        f"| {err} | {load} |")
    if tokens != asked:
        note = (f"- **dense** generated {tokens} tokens per session instead of {asked}: a dense "
                f"sequence cannot outgrow the model's context.")
        if note not in notes:
            notes.append(note)
lines += ["", "TTFT is the first request of each session (its prompt is prefilled); ITL is "
          "measured by the client between token frames. \"load avg\" is the machine's 1-minute "
          "load when the run started: on a shared machine it says how much the neighbours "
          "took.", ""]
if notes:
    lines += ["Notes:", ""] + notes + [""]
for n, files in sorted(by_n.items(), key=lambda kv: int(kv[0])):
    png = os.path.join(out, f"latency-{n}.png")
    rc = subprocess.call([sys.executable, os.path.join(root, "tools", "loadgen.py"), "plot",
                          "--png", png, "--title", f"{n} concurrent session(s)", *files])
    if rc == 0:
        lines.append(f"![{n} sessions](latency-{n}.png)")
open(os.path.join(out, "README.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PYEOF
echo "policy_compare: wrote $OUT/README.md" >&2
