#!/usr/bin/env bash
# gpu-check.sh: the CUDA backend's one device check. Builds what it
# needs, runs the CUDA tests and the benchmark, prints one table, and writes
# the full log into LOGDIR.
#
#   usage: tools/gpu-check.sh LOGDIR
#
# It compiles the engine's model/forward/kvcache/CPU/CUDA sources and the
# tests' support code directly with gcc and nvcc (no CMake, no
# libuv/cJSON/utf8proc: the lent GPU machine has none of them and cannot fetch
# them), then:
#   1. tests/invariants/test_cuda_matches_cpu (every op and whole steps against
#      the CPU backend, SmolLM2 and Gemma 3 270M whole steps when their files
#      are present; its "cuda-vs-cpu NAME REL" lines become the first half of
#      the table);
#   2. tools/bench_cuda on SmolLM2-135M: decode tokens/s at batch 1, 16 and 64
#      with a full 4,096-token window, prompt tokens/s, the attention op's
#      memory traffic next to a device-to-device copy in the same run;
#   3. tools/bench_cuda on Gemma 3 270M when its file is present: decode
#      tokens/s at batch 1 and 16 with the global layers' 4,096-token window
#      full (the local layers keep their 512), prompt tokens/s; its rows join
#      the benchmark table, marked "Gemma 3 270M".
# The real SmolLM2 file is used when $MODEL (or $STREAMSINK_MODEL) names one;
# otherwise the benchmark runs --synthetic (random weights, SmolLM2-135M's
# shapes, the same work per token) and the table says so. Gemma 3 runs only
# from its real file, $GEMMA_MODEL (or $STREAMSINK_GEMMA_MODEL). A device
# call carries 64 MiB: split a file with `split -b 60M` into an ignored
# folder, carry one part per call while the machine is warm (SmolLM2's 98 MB
# in two, Gemma's 253 MB in five), and `cat` the parts together there.
#
# On a machine without a CUDA device it builds everything, says so and exits
# 77 before the tests (which would only skip) and the benchmarks.
#
# Environment: CUDA_ARCH (default 90: H100/H200), MODEL, GEMMA_MODEL.
# Budget: about 1-2 minutes to build, 1-3 for the tests (Gemma's CPU reference
# steps take the longest), 2-4 for the SmolLM2 benchmark, 1-2 for Gemma's.
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${1:?usage: tools/gpu-check.sh LOGDIR}
mkdir -p "$LOG"
LOG=$(cd "$LOG" && pwd)
ARCH=${CUDA_ARCH:-90}
MODEL=${MODEL:-${STREAMSINK_MODEL:-}}
GEMMA=${GEMMA_MODEL:-${STREAMSINK_GEMMA_MODEL:-}}
B=build-gpu
mkdir -p "$B/obj"
exec > >(tee "$LOG/gpu-check.log") 2>&1

echo "== $(date -u +%Y-%m-%dT%H:%MZ) $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
have_gpu=1
nvidia-smi -L 2>/dev/null || { echo "nvidia-smi: not found, or no device"; have_gpu=0; }
nvcc --version | tail -1

echo "== build (sm_$ARCH)"
# function sections: the linker drops what the tests do not reach (cmd/common.c
# holds the default model path next to functions that need the whole decoder)
CFLAGS=(-O2 -std=c11 -D_GNU_SOURCE -DSS_HAVE_CUDA=1 -ffunction-sections -fdata-sections -I. -Iengine
        -Iengine/include -Ikvcache -Icmd -Itests)
compile_c() {
  local src=$1 obj extra=()
  obj="$B/obj/$(echo "$src" | tr '/' '_').o"
  case "$src" in
    *_avx2.c) extra=(-mavx2 -mfma -mf16c) ;;
    *_avx512.c) extra=(-mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c -mavx2) ;;
  esac
  gcc "${CFLAGS[@]}" "${extra[@]}" -c "$src" -o "$obj" && echo "$obj"
}
SRCS=(kvcache/*.c engine/gguf.c engine/quant.c engine/quant_k.c engine/model.c engine/rope.c
      engine/forward.c engine/backend.c engine/cpu/*.c tests/support/rng.c tests/support/tiny_model.c
      tests/support/model_file.c cmd/common.c)
OBJS=()
fail=0
for s in "${SRCS[@]}"; do
  o=$(compile_c "$s") || { echo "build failed: $s"; fail=1; }
  OBJS+=("$o")
done
for cu in engine/cuda/*.cu; do
  o="$B/obj/$(basename "$cu" .cu).o"
  nvcc -O3 -std=c++17 -arch="sm_$ARCH" -Xcompiler=-fno-exceptions,-fno-rtti -Iengine -Iengine/include -Ikvcache \
    -c "$cu" -o "$o" || { echo "build failed: $cu"; fail=1; }
  OBJS+=("$o")
done
if [ "$fail" = 0 ]; then
  gcc "${CFLAGS[@]}" -Itests -c tests/invariants/test_cuda_matches_cpu.c -o "$B/obj/test.o" &&
    nvcc -arch="sm_$ARCH" -Xlinker --gc-sections -o "$B/test_cuda_matches_cpu" "$B/obj/test.o" \
      "${OBJS[@]}" -lcublas -lm -lpthread || fail=1
  gcc "${CFLAGS[@]}" -c tools/bench_cuda.c -o "$B/obj/bench.o" &&
    nvcc -arch="sm_$ARCH" -Xlinker --gc-sections -o "$B/bench_cuda" "$B/obj/bench.o" "${OBJS[@]}" \
      -lcublas -lm -lpthread || fail=1
fi
if [ "$fail" != 0 ]; then
  echo "gpu-check: the build failed"
  exit 1
fi

echo "== build: done"
if [ "$have_gpu" = 0 ]; then
  echo "gpu-check: no CUDA device on this machine: everything built; the CUDA tests and"
  echo "the benchmarks need a GPU, so they do not run here (exit 77)"
  exit 77
fi

echo "== tests: CUDA against CPU"
STREAMSINK_MODEL=${MODEL:-/nonexistent} STREAMSINK_GEMMA_MODEL=${GEMMA:-/nonexistent} \
  timeout 420 "$B/test_cuda_matches_cpu" >"$LOG/test_cuda_matches_cpu.log" 2>&1
test_rc=$?
cat "$LOG/test_cuda_matches_cpu.log"

echo "== benchmark"
if [ -n "$MODEL" ] && [ -f "$MODEL" ]; then
  bench_args=(--model "$MODEL")
else
  bench_args=(--synthetic)
fi
timeout 360 "$B/bench_cuda" "${bench_args[@]}" --window 4096 --batches 1,16,64 --steps 32 \
  >"$LOG/bench_cuda.md" 2>"$LOG/bench_cuda.err"
bench_rc=$?
cat "$LOG/bench_cuda.err"
if [ -n "$GEMMA" ] && [ -f "$GEMMA" ]; then
  echo "== benchmark: Gemma 3 270M"
  timeout 240 "$B/bench_cuda" --model "$GEMMA" --window 4096 --batches 1,16 --steps 32 \
    >"$LOG/bench_cuda_gemma.md" 2>"$LOG/bench_cuda_gemma.err"
  gemma_rc=$?
  cat "$LOG/bench_cuda_gemma.err"
else
  gemma_rc=skipped
fi

echo
echo "== gpu-check table ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), $(date -u +%Y-%m-%d))"
echo
echo "| op (CUDA vs CPU, largest relative error) | error |"
echo "|---|---|"
# keep the worst figure per op name (attention is listed per layer and normalizer)
grep '^cuda-vs-cpu ' "$LOG/test_cuda_matches_cpu.log" | grep -v '^cuda-vs-cpu forward' |
  sed 's/^cuda-vs-cpu //' |
  awk '{v=$NF; $NF=""; sub(/ +$/, ""); n=$0; sub(/ L[0-9]+/, "", n);
        if (!(n in w) || v+0 > w[n]+0) { if (!(n in w)) o[++k]=n; w[n]=v } }
       END { for (i=1;i<=k;i++) printf "| %s | %s |\n", o[i], w[o[i]] }'
grep '^cuda-vs-cpu forward' "$LOG/test_cuda_matches_cpu.log" | sed 's/^cuda-vs-cpu /  /'
echo
echo "test_cuda_matches_cpu: exit $test_rc ($(tail -1 "$LOG/test_cuda_matches_cpu.log"))"
echo
cat "$LOG/bench_cuda.md"
# Gemma's rows join the same table (its header lines dropped)
if [ "$gemma_rc" = skipped ]; then
  echo "| Gemma 3 270M | not run: no GEMMA_MODEL / STREAMSINK_GEMMA_MODEL file |"
else
  tail -n +3 "$LOG/bench_cuda_gemma.md" | grep -v '^| backend ' | sed 's/^| /| Gemma 3 270M: /'
fi
if [ "$gemma_rc" = skipped ]; then
  echo "bench_cuda: exit $bench_rc; Gemma 3: not run"
else
  echo "bench_cuda: exit $bench_rc; Gemma 3: exit $gemma_rc"
fi
[ "$test_rc" = 0 ] && [ "$bench_rc" = 0 ] && { [ "$gemma_rc" = 0 ] || [ "$gemma_rc" = skipped ]; }
