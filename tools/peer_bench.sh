#!/usr/bin/env bash
# Side-by-side CPU benchmark of streamsink and llama.cpp on the same GGUF
# files, in one sitting, interleaved (A B, then B A, ...). Not run by CI.
#   usage: tools/peer_bench.sh [build dir]
# Builds llama.cpp's llama-bench and llama-batched-bench from the pinned
# llama-cpp-python sdist (tools/peer_build.sh, cached under
# ~/.cache/streamsink/peer), makes Q4_0 and Q8_0 copies of the shipped Q4_1
# file with tools/requant_gguf.py, then runs tools/peer_bench.py, which prints
# every pair with its ratio and spread (min/median/max over REPS), then where
# each figure's limit is (bytes per token against the copy rate, the products'
# operations against the kernels' peak; tools/peer_bench.py).
# Environment (defaults): REPS (3), THREADS (1,2), FORMATS (q4_1,q4_0,q8_0),
# FIGURES (prompt,decode,ctx4096,prompt4096,batch), BATCHES (1,4,8,16,32),
# BATCH_WINDOW (1024), BATCH_FILL (prompt tokens per sequence; default
# BATCH_WINDOW, a full window), BATCH_STEPS (32), KV_DTYPE (f16; or q8_0 on both
# sides), PEER_DIR, PEER_VERSION, PEER_NO_AMX (1: a llama.cpp build without
# ggml's AMX path, for CPUs with AMX-INT8 where that path crashes; see
# tools/peer_build.sh), PEER_ISA (avx2: both sides limited to AVX2, FMA and
# F16C, as on a CPU without AVX-512: llama.cpp built so, streamsink run with
# STREAMSINK_ISA=avx2; avxvnni: the same with AVX-VNNI on both sides).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${1:-build}"
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
PEER_BIN=$(PYTHON="$PY" tools/peer_build.sh)
case "${PEER_ISA:-}" in avx2 | avxvnni) export STREAMSINK_ISA="$PEER_ISA" ;; esac
Q41=$(STREAMSINK_VENV=.venv bash scripts/fetch-model.sh)
DIR=$(dirname "$Q41")
MODELS=()
IFS=, read -r -a FMTS <<< "${FORMATS:-q4_1,q4_0,q8_0}"
for f in "${FMTS[@]}"; do
  case "$f" in
    q4_1) MODELS+=("$Q41") ;;
    q4_0|q8_0)
      up=$(echo "$f" | tr a-z A-Z)
      out="$DIR/SmolLM2-135M-Instruct.$up.gguf"
      [ -f "$out" ] || "$PY" tools/requant_gguf.py "$Q41" "$out" --type "$f" >&2
      MODELS+=("$out") ;;
    *) echo "peer_bench.sh: unknown format $f" >&2; exit 2 ;;
  esac
done
TEXT=$(mktemp)
trap 'rm -f "$TEXT"' EXIT
bible Gen1:1-Gen50:26 > "$TEXT"
"$PY" tools/peer_bench.py --streamsink "$BUILD/streamsink" --bench-batch "$BUILD/bench_batch" \
  --llama-bench "$PEER_BIN/llama-bench" --llama-batched-bench "$PEER_BIN/llama-batched-bench" \
  --bench-matmul "$BUILD/bench_matmul" --text "$TEXT" --reps "${REPS:-3}" --threads "${THREADS:-1,2}" \
  --figures "${FIGURES:-prompt,decode,ctx4096,prompt4096,batch}" --batches "${BATCHES:-1,4,8,16,32}" \
  --batch-window "${BATCH_WINDOW:-1024}" --batch-fill "${BATCH_FILL:-0}" \
  --batch-steps "${BATCH_STEPS:-32}" \
  --kv-dtype "${KV_DTYPE:-f16}" "${MODELS[@]}"
