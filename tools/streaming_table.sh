#!/usr/bin/env bash
# The StreamingLLM table for SmolLM2-135M (issue 3): perplexity on the King
# James Bible (Debian's bible-kjv, dumped with the `bible` program) under each
# KV policy, windows 256 and 1024, 20,000 scored tokens. recompute re-runs the
# whole window for each scored token (O(W) per token), so it scores every
# STRIDE-th token only; the table compares every policy on those same tokens
# too. Writes JSON per run, table.md and ppl.png into OUT.
#   usage: tools/streaming_table.sh [build dir] [out dir]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${1:-build}"
OUT="${2:-out/streaming}"
N="${N:-20000}"
THREADS="${THREADS:-2}"
mkdir -p "$OUT"
MODEL=$(STREAMSINK_VENV=.venv bash scripts/fetch-model.sh)
TEXT="$OUT/kjv.txt"
bible Gen1:1-Rev22:21 > "$TEXT"
run() { # name, args...
  local name=$1; shift
  if [ ! -f "$OUT/$name.json" ]; then
    echo "== $name" >&2
    "$BUILD/streamsink" perplexity -m "$MODEL" --text "$TEXT" -t "$THREADS" --no-progress \
      --json "$OUT/$name.json" "$@" > "$OUT/$name.txt"
  fi
}
run dense --policy dense --max-tokens "$N"
for W in 256 1024; do
  run "window-$W" --policy window --window "$W" --max-tokens "$N"
  run "sinks1-$W" --policy sinks:1 --window "$W" --max-tokens "$N"
  run "sinks4-$W" --policy sinks:4 --window "$W" --max-tokens "$N"
done
run recompute-256 --policy recompute --window 256 --max-tokens "$N" --stride "${STRIDE_256:-32}"
run recompute-1024 --policy recompute --window 1024 --max-tokens "$N" --stride "${STRIDE_1024:-128}"
.venv/bin/python -m pip install -q --disable-pip-version-check -r scripts/requirements-tools.txt
.venv/bin/python tools/streaming_table.py "$OUT"
