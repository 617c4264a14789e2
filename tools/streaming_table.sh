#!/usr/bin/env bash
# The StreamingLLM table for SmolLM2-135M: perplexity on the King
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
JOBS="${JOBS:-2}" # runs at a time (each on THREADS threads)
run() { # name, args...
  local name=$1; shift
  if [ ! -f "$OUT/$name.json" ]; then
    echo "== $name" >&2
    "$BUILD/streamsink" perplexity -m "$MODEL" --text "$TEXT" -t "$THREADS" --no-progress \
      --json "$OUT/$name.json.part" "$@" > "$OUT/$name.txt"
    mv "$OUT/$name.json.part" "$OUT/$name.json"
  fi
}
jobs_wait() { while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do sleep 1; done; }
# longest first, so the pool stays full
for spec in \
  "recompute-1024 --policy recompute --window 1024 --stride ${STRIDE_1024:-128}" \
  "recompute-256 --policy recompute --window 256 --stride ${STRIDE_256:-32}" \
  "dense --policy dense" \
  "window-1024 --policy window --window 1024" "sinks1-1024 --policy sinks:1 --window 1024" \
  "sinks4-1024 --policy sinks:4 --window 1024" "window-256 --policy window --window 256" \
  "sinks1-256 --policy sinks:1 --window 256" "sinks4-256 --policy sinks:4 --window 256"; do
  jobs_wait
  # shellcheck disable=SC2086
  run $spec --max-tokens "$N" &
done
wait
.venv/bin/python -m pip install -q --disable-pip-version-check -r scripts/requirements-tools.txt
.venv/bin/python tools/streaming_table.py "$OUT"
