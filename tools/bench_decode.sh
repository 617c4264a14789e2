#!/usr/bin/env bash
# Decoder benchmark: prompt tokens/s for a 512-token prompt and
# decode tokens/s for 128 tokens, for SmolLM2-135M Q4_1 and a Q8_0 copy made
# by tools/requant_gguf.py, on 2 threads. Each configuration runs REPS times
# (default 5); the median of each figure is printed, all from one run.
#   usage: tools/bench_decode.sh [build dir]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${1:-build}"
REPS="${REPS:-5}"
THREADS="${THREADS:-2}"
Q41=$(STREAMSINK_VENV=.venv bash scripts/fetch-model.sh)
Q80="$(dirname "$Q41")/SmolLM2-135M-Instruct.Q8_0.gguf"
if [ ! -f "$Q80" ]; then
  .venv/bin/python tools/requant_gguf.py "$Q41" "$Q80" --type q8_0 >&2
fi
TEXT=$(mktemp)
trap 'rm -f "$TEXT"' EXIT
bible Gen1:1-Gen10:32 > "$TEXT"
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
printf "%-6s %-8s %14s %14s\n" model threads "prompt tok/s" "decode tok/s"
for M in "$Q41" "$Q80"; do
  P=(); D=()
  for _ in $(seq "$REPS"); do
    out=$("$BUILD/streamsink" run -m "$M" -f "$TEXT" --prompt-tokens 512 -n 128 --ignore-eos \
          -t "$THREADS" --chunk 512 2>&1 >/dev/null)
    P+=("$(echo "$out" | sed -n 's/^prompt: .*(\(.*\) tokens\/s)/\1/p')")
    D+=("$(echo "$out" | sed -n 's/^decode: .*(\(.*\) tokens\/s)/\1/p')")
  done
  name=$(basename "$M" .gguf | sed 's/.*\.//')
  printf "%-6s %-8s %14s %14s\n" "$name" "$THREADS" "$(printf '%s\n' "${P[@]}" | median)" \
    "$(printf '%s\n' "${D[@]}" | median)"
done
