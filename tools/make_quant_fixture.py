#!/usr/bin/env python3
"""Dequantization fixtures for Q5_0 and the K-quants, from the `gguf` package.

The `gguf` Python package (llama.cpp's own reader, numpy code written
independently of ggml's C) dequantizes blocks here; the C test
(tests/unit/test_quant_k.c) dequantizes the same bytes with engine/quant_k.c
and must get the same float bits.

Two outputs:

--blocks FILE   random blocks of each type (random bytes, with the f16 scales
                set to finite values of varied magnitude and sign, and a few
                all-0x00 / all-0xff blocks), their bytes and the gguf
                dequantized floats, as hex. Committed: tests/fixtures/quant_k_blocks.txt.

--model GGUF --digests FILE
                for every Q5_0 / Q4_K / Q6_K / Q8_0 tensor of a model file, a
                64-bit digest of its gguf-dequantized float32 bits (see digest()
                below; tests/unit/test_quant_k.c computes the same). Only digests
                are committed, never weights: tests/fixtures/gemma3_dequant_digests.txt.

Made with (the test venv has gguf and numpy):
    .venv/bin/python tools/make_quant_fixture.py --blocks tests/fixtures/quant_k_blocks.txt
    .venv/bin/python tools/make_quant_fixture.py \\
        --model ~/.cache/streamsink/gemma-3-270m-q4_k_m.gguf \\
        --digests tests/fixtures/gemma3_dequant_digests.txt
"""
import argparse
import sys

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader
from gguf.quants import dequantize

# type: (bytes per block, values per block, byte offsets of f16 scales)
LAYOUTS = {
    Q.Q5_0: (22, 32, [0]),
    Q.Q3_K: (110, 256, [108]),
    Q.Q4_K: (144, 256, [0, 2]),
    Q.Q5_K: (176, 256, [0, 2]),
    Q.Q6_K: (210, 256, [208]),
}
M64 = (1 << 64) - 1


def random_blocks(rng, t, n):
    size, _, scale_offsets = LAYOUTS[t]
    blocks = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    blocks[0, :] = 0
    blocks[1, :] = 0xFF
    for off in scale_offsets:
        # magnitudes from 2^-20 (subnormal f16) to 2^4, either sign; block 0
        # keeps zero scales; block 1's scales become finite too
        mag = np.exp2(rng.uniform(-20.0, 4.0, size=n)).astype(np.float32)
        sign = np.where(rng.integers(0, 2, size=n) == 1, -1.0, 1.0).astype(np.float32)
        h = (mag * sign).astype(np.float16)
        h[0] = 0.0
        blocks[:, off : off + 2] = h.view(np.uint8).reshape(n, 2)
    return blocks


def write_blocks(path):
    rng = np.random.default_rng(20261201)
    with open(path, "w") as f:
        f.write("# made by tools/make_quant_fixture.py --blocks; gguf's dequantizer, float bits as hex\n")
        for t in LAYOUTS:
            n = 12
            blocks = random_blocks(rng, t, n)
            values = dequantize(blocks.reshape(-1), t).astype(np.float32).reshape(-1)
            f.write(f"type {t.name} {int(t)} blocks {n}\n")
            for b in range(n):
                f.write("bytes " + blocks[b].tobytes().hex() + "\n")
            bits = values.view(np.uint32)
            per_line = 32
            for i in range(0, len(bits), per_line):
                f.write("values " + " ".join(f"{v:08x}" for v in bits[i : i + per_line]) + "\n")
            f.write("end\n")


def mix64(x):
    """splitmix64's finalizer over a uint64 array (wrapping arithmetic)."""
    x = x.copy()
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def digest(values):
    """sum over i of mix64(i) * mix64(bits_i + 1) mod 2^64: position-dependent,
    exact, and vectorizable on both sides."""
    bits = values.astype(np.float32).reshape(-1).view(np.uint32).astype(np.uint64)
    idx = np.arange(len(bits), dtype=np.uint64)
    with np.errstate(over="ignore"):
        return int(np.sum(mix64(idx) * mix64(bits + np.uint64(1)), dtype=np.uint64)) & M64


def write_digests(model, path):
    r = GGUFReader(model)
    with open(path, "w") as f:
        f.write(f"# made by tools/make_quant_fixture.py --digests from {model.split('/')[-1]}\n")
        f.write("# tensor type values digest (of gguf's dequantized float32 bits)\n")
        for t in r.tensors:
            if t.tensor_type not in (Q.Q5_0, Q.Q4_K, Q.Q6_K, Q.Q8_0):
                continue
            values = dequantize(t.data, t.tensor_type)
            f.write(f"{t.name} {t.tensor_type.name} {values.size} {digest(values):016x}\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks")
    ap.add_argument("--model")
    ap.add_argument("--digests")
    a = ap.parse_args()
    if not a.blocks and not (a.model and a.digests):
        ap.error("give --blocks FILE and/or --model GGUF --digests FILE")
    if a.blocks:
        write_blocks(a.blocks)
    if a.model and a.digests:
        write_digests(a.model, a.digests)
    return 0


if __name__ == "__main__":
    sys.exit(main())
