#!/usr/bin/env bash
# Oversubscription benchmark: does a 2-thread decoder lose to a 1-thread one
# when another process keeps one core busy? Runs, in turn, 1 and 2 threads
# with a busy loop pinned to the last CPU, and the same without it:
#   - one stream: `streamsink run`, a 512-token prompt, then 128 tokens;
#   - batched: `bench_batch --batches 8` (window 1,024, a 64-token prompt).
# Each configuration runs REPS times (default 5), interleaved; the median and
# the range of each figure are printed, all from one run.
#   usage: tools/bench_oversub.sh [build dir]
# Environment: REPS (5), MODEL (the shipped Q4_1 file; a Q4_0 copy from
# tools/requant_gguf.py is what tools/peer_bench.sh measures).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${1:-build}"
REPS="${REPS:-5}"
MODEL="${MODEL:-$(STREAMSINK_VENV=.venv bash scripts/fetch-model.sh)}"
BURN_CPU=$(($(nproc) - 1))
TEXT=$(mktemp)
BURNER=
cleanup() {
  rm -f "$TEXT"
  if [ -n "$BURNER" ]; then kill "$BURNER" 2>/dev/null || true; fi
}
trap cleanup EXIT
bible Gen1:1-Gen10:32 > "$TEXT"

burn_on() { taskset -c "$BURN_CPU" awk 'BEGIN { for (;;) x++ }' & BURNER=$!; sleep 0.5; }
burn_off() { kill "$BURNER"; wait "$BURNER" 2>/dev/null || true; BURNER=; }

declare -A R
one() { # key threads: appends prompt, decode and batch-8 tokens/s to R[key.*]
  local out
  out=$("$BUILD/streamsink" run -m "$MODEL" -f "$TEXT" --prompt-tokens 512 -n 128 --ignore-eos \
        -t "$2" --chunk 512 2>&1 >/dev/null)
  R[$1.prompt]+="$(echo "$out" | sed -n 's/^prompt: .*(\(.*\) tokens\/s)/\1/p') "
  R[$1.decode]+="$(echo "$out" | sed -n 's/^decode: .*(\(.*\) tokens\/s)/\1/p') "
  out=$("$BUILD/bench_batch" --model "$MODEL" --threads "$2" --window 1024 --fill 64 \
        --batches 8 --steps 32 2>/dev/null)
  R[$1.batch8]+="$(echo "$out" | sed -n 's/^batch 8 rep 0 tokens\/s \(.*\)/\1/p') "
}
stats() { # median (min-max) of the numbers in $1
  echo "$1" | tr ' ' '\n' | grep . | sort -g |
    awk '{a[NR]=$1} END {printf "%.1f (%.1f-%.1f)", (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2), a[1], a[NR]}'
}

for rep in $(seq "$REPS"); do
  echo "round $rep of $REPS" >&2
  burn_on
  one busy1 1
  one busy2 2
  burn_off
  one idle1 1
  one idle2 2
done

echo "model $(basename "$MODEL"); busy loop on CPU $BURN_CPU of $(nproc); tokens/s, median (min-max) of $REPS"
printf "| other core | threads | prompt 512 | decode 128 | 8 streams, batched |\n|---|---|---|---|---|\n"
for k in busy1 busy2 idle1 idle2; do
  printf "| %s | %s | %s | %s | %s |\n" "$([ "${k%?}" = busy ] && echo busy || echo idle)" "${k: -1}" \
    "$(stats "${R[$k.prompt]}")" "$(stats "${R[$k.decode]}")" "$(stats "${R[$k.batch8]}")"
done
