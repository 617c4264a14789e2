#!/usr/bin/env bash
# Build the peer llama.cpp benchmarks (llama-bench, llama-batched-bench) for
# tools/peer_bench.sh: downloads the pinned llama-cpp-python sdist from PyPI
# and builds its vendored llama.cpp, CPU only, -DGGML_NATIVE=ON, into a cache
# directory outside the repository. Never run by CI.
#   usage: tools/peer_build.sh        (prints the bin directory on stdout)
# Environment: PEER_DIR (default ~/.cache/streamsink/peer), PEER_VERSION
# (default 0.3.36), PYTHON (default .venv/bin/python, else python3), JOBS (2),
# PEER_NO_AMX (1: leave out ggml's AMX path, build-VERSION-noamx). On a CPU
# with AMX-INT8 a native build routes Q4_0/Q4_1 products through ggml's AMX
# kernels, and 0.3.36's llama-bench crashed in them (SIGSEGV in
# ggml_backend_amx_mul_mat, 2026-12-03); with PEER_NO_AMX=1 the build names
# every other extension this CPU has instead of -march=native. PEER_ISA=avx2
# (build-VERSION-avx2) builds for AVX, AVX2, FMA and F16C only: what an
# AVX2-only CPU runs, for comparing on a bigger one against streamsink capped
# the same way (tools/peer_bench.sh sets STREAMSINK_ISA=avx2 with it).
# PEER_ISA=avxvnni (build-VERSION-avxvnni) adds AVX-VNNI to those, as on an
# Intel CPU without AVX-512 since Alder Lake (streamsink: STREAMSINK_ISA=avxvnni).
set -euo pipefail
cd "$(dirname "$0")/.."
PEER_DIR="${PEER_DIR:-$HOME/.cache/streamsink/peer}"
PEER_VERSION="${PEER_VERSION:-0.3.36}"
JOBS="${JOBS:-2}"
PYTHON="${PYTHON:-}"
if [ -z "$PYTHON" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
SRC="$PEER_DIR/llama_cpp_python-$PEER_VERSION"
BDIR="$PEER_DIR/build-$PEER_VERSION"
ISA_FLAGS=(-DGGML_NATIVE=ON)
if [ "${PEER_NO_AMX:-0}" = 1 ]; then
  BDIR="$BDIR-noamx"
  ISA_FLAGS=(-DGGML_NATIVE=OFF)
  flags=$(grep -m1 '^flags' /proc/cpuinfo)
  has() { [[ " $flags " == *" $1 "* ]]; }
  has avx && ISA_FLAGS+=(-DGGML_AVX=ON)
  has avx2 && ISA_FLAGS+=(-DGGML_AVX2=ON)
  has fma && ISA_FLAGS+=(-DGGML_FMA=ON)
  has f16c && ISA_FLAGS+=(-DGGML_F16C=ON)
  has avx_vnni && ISA_FLAGS+=(-DGGML_AVX_VNNI=ON)
  has avx512f && ISA_FLAGS+=(-DGGML_AVX512=ON)
  has avx512vbmi && ISA_FLAGS+=(-DGGML_AVX512_VBMI=ON)
  has avx512_vnni && ISA_FLAGS+=(-DGGML_AVX512_VNNI=ON)
  has avx512_bf16 && ISA_FLAGS+=(-DGGML_AVX512_BF16=ON)
fi
if [ "${PEER_ISA:-}" = avx2 ]; then
  BDIR="$PEER_DIR/build-$PEER_VERSION-avx2"
  ISA_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON)
elif [ "${PEER_ISA:-}" = avxvnni ]; then
  BDIR="$PEER_DIR/build-$PEER_VERSION-avxvnni"
  ISA_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
    -DGGML_AVX_VNNI=ON)
elif [ -n "${PEER_ISA:-}" ]; then
  echo "peer_build.sh: PEER_ISA is avx2, avxvnni or unset" >&2
  exit 2
fi
BIN="$BDIR/bin"
if [ -x "$BIN/llama-bench" ] && [ -x "$BIN/llama-batched-bench" ]; then
  echo "$BIN"
  exit 0
fi
mkdir -p "$PEER_DIR"
TARBALL="$PEER_DIR/llama_cpp_python-$PEER_VERSION.tar.gz"
if [ ! -f "$TARBALL" ]; then
  "$PYTHON" -m pip download --no-deps --no-binary :all: "llama-cpp-python==$PEER_VERSION" \
    -d "$PEER_DIR" >&2
fi
if [ ! -d "$SRC" ]; then
  tar -xzf "$TARBALL" -C "$PEER_DIR"
fi
LLAMA="$SRC/vendor/llama.cpp"
[ -f "$LLAMA/CMakeLists.txt" ] || { echo "peer_build.sh: no vendored llama.cpp in $SRC" >&2; exit 1; }
cmake -S "$LLAMA" -B "$BDIR" -DCMAKE_BUILD_TYPE=Release \
  "${ISA_FLAGS[@]}" -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
  -DLLAMA_BUILD_TOOLS=ON -DBUILD_SHARED_LIBS=OFF >&2
nice cmake --build "$BDIR" -j"$JOBS" --target llama-bench llama-batched-bench >&2
echo "$BIN"
