#!/usr/bin/env bash
# Steady-state sliding-window decode: SmolLM2-135M Q4_1 with a full
# 4,096-token window (sinks:4 + 4,092 window tokens after a 4,200-token prompt),
# so every decode step evicts one token. Prints the median decode tokens/s of
# REPS runs (default 5) on THREADS threads (default 2), f16 KV.
#   usage: tools/bench_window.sh [build dir]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${1:-build}"
REPS="${REPS:-5}"
THREADS="${THREADS:-2}"
MODEL=$(STREAMSINK_VENV=.venv bash scripts/fetch-model.sh)
TEXT=$(mktemp)
trap 'rm -f "$TEXT"' EXIT
bible Gen1:1-Gen50:26 > "$TEXT"
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
D=()
for _ in $(seq "$REPS"); do
  out=$("$BUILD/streamsink" run -m "$MODEL" -f "$TEXT" --prompt-tokens 4200 --kv-policy sinks:4 \
        --ctx 4096 -n 256 --ignore-eos -t "$THREADS" --chunk 512 2>&1 >/dev/null)
  D+=("$(echo "$out" | sed -n 's/^decode: .*(\(.*\) tokens\/s)/\1/p')")
done
echo "window 4096 (sinks:4), f16 KV, $THREADS threads: decode tokens/s runs: ${D[*]}"
echo "median decode tokens/s: $(printf '%s\n' "${D[@]}" | median)"
