#!/usr/bin/env bash
# Oversubscription benchmark: does a 2-thread decoder lose to a 1-thread one
# when another process keeps one core busy? Runs, in turn, 1 and 2 threads
# with a busy loop pinned to the last CPU, and the same without it:
#   - one stream: `streamsink run`, a 512-token prompt, then N_PREDICT tokens;
#   - batched: `bench_batch --batches 8` (window 1,024, a 64-token prompt).
# With a second build directory (a baseline), its 2-thread figures are
# taken in the same rounds. Each configuration runs REPS times, interleaved;
# the median and the range of each figure are printed, all from one run.
#   usage: tools/bench_oversub.sh [build dir] [baseline build dir]
# Environment: REPS (5), N_PREDICT (128), MODEL (the shipped Q4_1 file; a
# Q4_0 copy from tools/requant_gguf.py is what tools/peer_bench.sh measures).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${1:-build}"
BASE="${2:-}"
REPS="${REPS:-5}"
N_PREDICT="${N_PREDICT:-128}"
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
KEYS=()
one() { # key build threads: appends prompt, decode and batch-8 tokens/s to R[key.*]
  local out
  [[ " ${KEYS[*]} " == *" $1 "* ]] || KEYS+=("$1")
  out=$("$2/streamsink" run -m "$MODEL" -f "$TEXT" --prompt-tokens 512 -n "$N_PREDICT" \
        --ignore-eos -t "$3" --chunk 512 2>&1 >/dev/null)
  R[$1.prompt]+="$(echo "$out" | sed -n 's/^prompt: .*(\(.*\) tokens\/s)/\1/p') "
  R[$1.decode]+="$(echo "$out" | sed -n 's/^decode: .*(\(.*\) tokens\/s)/\1/p') "
  out=$("$2/bench_batch" --model "$MODEL" --threads "$3" --window 1024 --fill 64 \
        --batches 8 --steps 32 2>/dev/null)
  R[$1.batch8]+="$(echo "$out" | sed -n 's/^batch 8 rep 0 tokens\/s \(.*\)/\1/p') "
}
stats() { # median (min-max) of the numbers in $1
  echo "$1" | tr ' ' '\n' | grep . | sort -g |
    awk '{a[NR]=$1} END {printf "%.1f (%.1f-%.1f)", (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2), a[1], a[NR]}'
}
round() { # prefix
  one "$1|$BUILD|1" "$BUILD" 1
  one "$1|$BUILD|2" "$BUILD" 2
  if [ -n "$BASE" ]; then one "$1|$BASE|2" "$BASE" 2; fi
}

for rep in $(seq "$REPS"); do
  echo "round $rep of $REPS" >&2
  burn_on
  round busy
  burn_off
  round idle
done

echo "model $(basename "$MODEL"); busy loop on CPU $BURN_CPU of $(nproc); $(date -u '+%Y-%m-%d %H:%M UTC');" \
  "tokens/s, median (min-max) of $REPS"
printf "| other core | build | threads | prompt 512 | decode %s | 8 streams, batched |\n" "$N_PREDICT"
printf "|---|---|---|---|---|---|\n"
for k in "${KEYS[@]}"; do
  IFS='|' read -r load build threads <<< "$k"
  printf "| %s | %s | %s | %s | %s | %s |\n" "$load" "$build" "$threads" \
    "$(stats "${R[$k.prompt]}")" "$(stats "${R[$k.decode]}")" "$(stats "${R[$k.batch8]}")"
done
