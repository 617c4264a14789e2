#!/usr/bin/env bash
# Oversubscription benchmark: does a 2-thread decoder lose to a 1-thread one
# when another process keeps one of its two cores busy? Everything runs on
# CPUs 0 and 1 (on a larger machine the scheduler would otherwise move the
# threads off the busy core). Runs, in turn, 1 and 2 threads with a busy
# loop pinned to CPU 1, and the same without it:
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
if [ "$BASE" = "$BUILD" ]; then BASE=; fi
REPS="${REPS:-5}"
N_PREDICT="${N_PREDICT:-128}"
MODEL="${MODEL:-$(STREAMSINK_VENV=.venv bash scripts/fetch-model.sh)}"
CPUS=0,1
BURN_CPU=1
TEXT=$(mktemp)
BURNER=
cleanup() {
  rm -f "$TEXT"
  if [ -n "$BURNER" ]; then kill "$BURNER" 2>/dev/null || true; fi
}
trap cleanup EXIT
bible Gen1:1-Gen10:32 > "$TEXT"

burn_on() {
  taskset -c "$BURN_CPU" awk 'BEGIN { for (;;) x++ }' &
  BURNER=$!
  sleep 0.5
  kill -0 "$BURNER" || { echo "bench_oversub: the busy loop did not start on CPU $BURN_CPU" >&2; exit 1; }
}
burn_off() { kill "$BURNER"; wait "$BURNER" 2>/dev/null || true; BURNER=; }

declare -A R
KEYS=()
need() { # value what: the value, or a stop if a figure was not found
  if [ -z "$1" ]; then echo "bench_oversub: no $2 figure in the output" >&2; exit 1; fi
  echo "$1"
}
one() { # key build threads: appends prompt, decode and batch-8 tokens/s to R[key.*]
  local out p d b
  [[ " ${KEYS[*]} " == *" $1 "* ]] || KEYS+=("$1")
  out=$(taskset -c "$CPUS" "$2/streamsink" run -m "$MODEL" -f "$TEXT" --prompt-tokens 512 \
        -n "$N_PREDICT" --ignore-eos -t "$3" --chunk 512 2>&1 >/dev/null)
  p=$(need "$(echo "$out" | sed -n 's/^prompt: .*(\(.*\) tokens\/s)/\1/p')" prompt)
  d=$(need "$(echo "$out" | sed -n 's/^decode: .*(\(.*\) tokens\/s)/\1/p')" decode)
  out=$(taskset -c "$CPUS" "$2/bench_batch" --model "$MODEL" --threads "$3" --window 1024 \
        --fill 64 --batches 8 --steps 32 2>/dev/null)
  b=$(need "$(echo "$out" | sed -n 's/^batch 8 rep 0 tokens\/s \(.*\)/\1/p')" batch)
  R[$1.prompt]+="$p "
  R[$1.decode]+="$d "
  R[$1.batch8]+="$b "
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

echo "model $(basename "$MODEL"); CPUs $CPUS, busy loop on CPU $BURN_CPU; $(date -u '+%Y-%m-%d %H:%M UTC');" \
  "tokens/s, median (min-max) of $REPS"
printf "| other core | build | threads | prompt 512 | decode %s | 8 streams, batched |\n" "$N_PREDICT"
printf "|---|---|---|---|---|---|\n"
for k in "${KEYS[@]}"; do
  IFS='|' read -r load build threads <<< "$k"
  printf "| %s | %s | %s | %s | %s | %s |\n" "$load" "$build" "$threads" \
    "$(stats "${R[$k.prompt]}")" "$(stats "${R[$k.decode]}")" "$(stats "${R[$k.batch8]}")"
done
