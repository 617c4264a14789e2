#!/usr/bin/env bash
# Runs every test from a fresh clone: installs dependencies, fetches the
# default model and Gemma 3 270M, checks formatting, builds with warnings as
# errors, runs the unit, invariant and reference tests, then the unit tests again under
# AddressSanitizer + UndefinedBehaviorSanitizer, the threaded ones under
# ThreadSanitizer, and every fuzz target for a bounded time.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
# assigned, then exported: `export X="$(cmd)"` would hide a failed fetch from set -e
STREAMSINK_MODEL="$(STREAMSINK_VENV=.venv bash scripts/fetch-model.sh)"
export STREAMSINK_MODEL
# Gemma 3 270M (253 MB): the Q5_0/K-quant tests check every tensor of it
STREAMSINK_GEMMA_MODEL="$(STREAMSINK_VENV=.venv bash scripts/fetch-model.sh gemma3-270m)"
export STREAMSINK_GEMMA_MODEL

echo "== clang-format"
git ls-files -z '*.c' '*.h' '*.cu' '*.cuh' | xargs -0 -r clang-format --dry-run --Werror

echo "== build (warnings are errors)"
BUILD_DIR=build-ci bash scripts/build.sh -DSTREAMSINK_WERROR=ON

echo "== tests"
(cd build-ci && ctest --output-on-failure --timeout 900 -j1)

echo "== unit tests under AddressSanitizer + UndefinedBehaviorSanitizer"
BUILD_DIR=build-asan bash scripts/build.sh -DSTREAMSINK_WERROR=ON -DSTREAMSINK_CUDA=OFF \
  -DSTREAMSINK_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=Debug
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -L unit -j1)

echo "== threaded tests under ThreadSanitizer (the engine's queues, the HTTP connection, the CPU thread pool, requests through the engine thread)"
cmake -S . -B build-tsan -DSTREAMSINK_CUDA=OFF -DSTREAMSINK_SANITIZE=thread \
  -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build-tsan -j"$(nproc)" --target test_queue test_http_conn test_threadpool \
  test_engine_requests
(cd build-tsan && TSAN_OPTIONS=halt_on_error=1 ctest --output-on-failure \
  -R '^(test_queue|test_http_conn|test_threadpool|test_engine_requests)$' -j1)

echo "== fuzzing: each libFuzzer target for a bounded time from its seed corpus"
bash scripts/fuzz.sh
