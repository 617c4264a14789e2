#!/usr/bin/env python3
"""requant_gguf.py: rewrite a GGUF file with its Q4_1 weights requantized to Q8_0 or Q4_0.

    tools/requant_gguf.py IN.gguf OUT.gguf --type q8_0|q4_0 [--verify]

Reads IN with the `gguf` package's GGUFReader, dequantizes every Q4_1 tensor
with our own numpy code (block layout in engine/quant.h), quantizes it to Q8_0
with our own code (the same rule as engine/quant.c and ggml's reference:
d = max|x| / 127 in f32, q = roundf(x / d) rounding half away from zero, d
stored as f16), or to Q4_0 (engine/quant.c's and ggml's reference: max = the
value of largest magnitude with its sign, d = max / -8, q = min(15, (int)(x / d
+ 8.5)), d stored as f16), copies F32/F16/BF16/Q8_0 tensors and all metadata unchanged
(strings byte for byte, same value types, same order) except general.file_type,
which becomes 7 (MOSTLY_Q8_0) or 2 (MOSTLY_Q4_0), and writes OUT with gguf.GGUFWriter.

--verify re-reads OUT and checks every requantized tensor against the Q4_1
original: the Q4_1 dequantization must equal gguf.quants' exactly, and each
value must be within the Q8_0 bound |x - x8| <= d8/2 + 127 * |d8 - d| (about
0.56 * d8) of its block; a Q4_0 value within d4 + 9 * |d4 - d| of it (one step: q - 8
is clamped to 7 on the side opposite max), d the unrounded scale. Copied tensors must be byte-identical.

Needs numpy and gguf (pip install gguf numpy); nothing else.
"""

import argparse
import sys

import numpy as np

try:
    import gguf
    from gguf import GGMLQuantizationType as QT
    from gguf import GGUFValueType as VT
except ImportError:
    sys.exit("requant_gguf.py: needs the gguf package (pip install gguf numpy)")

QK = 32
Q4_1_BLOCK = 20  # f16 d, f16 m, 16 bytes of nibbles
Q8_0_BLOCK = 34  # f16 d, 32 int8
Q4_0_BLOCK = 18  # f16 d, 16 bytes of nibbles
FILE_TYPE_MOSTLY_Q8_0 = 7
FILE_TYPE_MOSTLY_Q4_0 = 2
FILE_TYPE = {"q8_0": FILE_TYPE_MOSTLY_Q8_0, "q4_0": FILE_TYPE_MOSTLY_Q4_0}
COPIED = (QT.F32, QT.F16, QT.BF16, QT.Q8_0)


def dequant_q4_1(raw):
    """uint8 [..., nblocks * 20] -> float32 [..., nblocks * 32]; x = d * nib + m.
    Element j < 16 of a block is the low nibble of qs[j], element j + 16 the high."""
    lead = raw.shape[:-1]
    b = np.ascontiguousarray(raw).reshape(-1, Q4_1_BLOCK)
    d = b[:, 0:2].copy().view(np.float16).astype(np.float32)  # [nb, 1]
    m = b[:, 2:4].copy().view(np.float16).astype(np.float32)
    qs = b[:, 4:]
    nib = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)  # [nb, 32]
    x = nib * d + m
    return x.reshape(*lead, -1)


def roundf(v):
    """C roundf (half away from zero) for float32 input, exact: the add is done in f64."""
    v64 = v.astype(np.float64)
    return np.trunc(v64 + np.copysign(0.5, v64))


def quant_q8_0(x):
    """float32 [..., n] (n a multiple of 32) -> uint8 [..., n / 32 * 34]."""
    lead = x.shape[:-1]
    blocks = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, QK)
    amax = np.abs(blocks).max(axis=1, keepdims=True)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        idv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    q = roundf((blocks * idv).astype(np.float32)).astype(np.int8)
    out = np.empty((blocks.shape[0], Q8_0_BLOCK), dtype=np.uint8)
    out[:, 0:2] = d.astype(np.float16).view(np.uint8)
    out[:, 2:] = q.view(np.uint8)
    return out.reshape(*lead, -1)


def dequant_q8_0(raw):
    lead = raw.shape[:-1]
    b = np.ascontiguousarray(raw).reshape(-1, Q8_0_BLOCK)
    d = b[:, 0:2].copy().view(np.float16).astype(np.float32)
    q = b[:, 2:].copy().view(np.int8).astype(np.float32)
    return (q * d).reshape(*lead, -1)


def quant_q4_0(x):
    """float32 [..., n] (n a multiple of 32) -> uint8 [..., n / 32 * 18]. Element j < 16
    of a block goes to the low nibble of qs[j], element j + 16 to the high one."""
    lead = x.shape[:-1]
    blocks = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, QK)
    idx = np.abs(blocks).argmax(axis=1)  # first of the largest magnitudes, as the C loop
    mx = blocks[np.arange(blocks.shape[0]), idx][:, None]
    d = (mx / np.float32(-8)).astype(np.float32)
    with np.errstate(divide="ignore"):
        idv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    v = (blocks * idv).astype(np.float32) + np.float32(8.5)
    q = np.minimum(np.float32(15), v).astype(np.int32).astype(np.uint8)  # v > 0: trunc = floor
    out = np.empty((blocks.shape[0], Q4_0_BLOCK), dtype=np.uint8)
    out[:, 0:2] = d.astype(np.float16).view(np.uint8)
    out[:, 2:] = q[:, :16] | (q[:, 16:] << 4)
    return out.reshape(*lead, -1)


def dequant_q4_0(raw):
    lead = raw.shape[:-1]
    b = np.ascontiguousarray(raw).reshape(-1, Q4_0_BLOCK)
    d = b[:, 0:2].copy().view(np.float16).astype(np.float32)
    qs = b[:, 2:]
    nib = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32) - 8
    return (nib * d).reshape(*lead, -1)


def field_value(f):
    """A reader field as (value, type, sub_type) for GGUFWriter.add_key_value,
    keeping strings as raw bytes so nothing is re-encoded."""
    main = f.types[0]
    if main == VT.ARRAY:
        sub = f.types[1]
        if len(f.types) > 2 or sub == VT.ARRAY:
            raise ValueError(f"{f.name}: arrays of arrays are not supported by this tool")
        if sub == VT.STRING:
            return [bytes(f.parts[i]) for i in f.data], main, sub
        return [f.parts[i].tolist()[0] for i in f.data], main, sub
    if main == VT.STRING:
        return bytes(f.parts[f.data[0]]), main, None
    return f.parts[f.data[0]].tolist()[0], main, None


def requant(src, dst, target):
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(dst, arch)

    for name, f in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue  # the header fields; the writer adds the architecture itself
        if name == "general.alignment":
            writer.add_custom_alignment(int(f.contents()))
            continue
        val, vtype, sub = field_value(f)
        if name == "general.file_type":
            val = FILE_TYPE[target]
        writer.add_key_value(name, val, vtype, sub)

    n_requant = 0
    for t in reader.tensors:
        tt = QT(t.tensor_type)
        if tt == QT.Q4_1 and target == "q8_0":
            x = dequant_q4_1(t.data)  # [ne1.., ne0] float32
            writer.add_tensor(t.name, quant_q8_0(x), raw_dtype=QT.Q8_0)
            n_requant += 1
        elif tt == QT.Q4_1 and target == "q4_0":
            x = dequant_q4_1(t.data)
            writer.add_tensor(t.name, quant_q4_0(x), raw_dtype=QT.Q4_0)
            n_requant += 1
        elif tt in COPIED:
            if tt in (QT.F32, QT.F16):
                writer.add_tensor(t.name, np.asarray(t.data))
            else:
                writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=tt)
        else:
            raise ValueError(f"tensor {t.name}: type {tt.name} is not supported by this tool")

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"{dst}: {len(reader.tensors)} tensors, {n_requant} requantized Q4_1 -> {target.upper()}")


def verify(src, dst, target):
    a = gguf.GGUFReader(src)
    b = gguf.GGUFReader(dst)
    bt = {t.name: t for t in b.tensors}
    assert len(a.tensors) == len(b.tensors), "tensor count differs"
    for name, f in a.fields.items():
        if name.startswith("GGUF.") or name == "general.file_type":
            continue
        g = b.fields.get(name)
        assert g is not None, f"missing key {name}"
        assert f.types == g.types, f"{name}: types differ"
        assert all(bytes(f.parts[i]) == bytes(g.parts[j]) for i, j in zip(f.data, g.data)), (
            f"{name}: value differs")
    assert b.fields["general.file_type"].contents() == FILE_TYPE[target]
    worst = 0.0
    for t in a.tensors:
        u = bt[t.name]
        assert list(t.shape) == list(u.shape), f"{t.name}: shape differs"
        if QT(t.tensor_type) != QT.Q4_1:
            assert t.tensor_type == u.tensor_type
            assert np.asarray(t.data).tobytes() == np.asarray(u.data).tobytes(), t.name
            continue
        x = dequant_q4_1(t.data)
        ref = gguf.quants.dequantize(np.asarray(t.data), QT.Q4_1)
        assert np.array_equal(x.reshape(ref.shape), ref), f"{t.name}: Q4_1 dequant differs"
        raw = np.asarray(u.data)
        if target == "q4_0":
            assert QT(u.tensor_type) == QT.Q4_0, f"{t.name}: not Q4_0"
            x4 = dequant_q4_0(raw)
            ref4 = gguf.quants.dequantize(raw, QT.Q4_0)
            assert np.array_equal(x4.reshape(ref4.shape), ref4), f"{t.name}: Q4_0 dequant differs"
            d4 = np.abs(raw.reshape(-1, Q4_0_BLOCK)[:, 0:2].copy().view(np.float16)
                        .astype(np.float64))
            xb = x.reshape(-1, QK).astype(np.float64)
            d = np.abs(xb).max(axis=1, keepdims=True) / 8
            # q - 8 is clamped to 7 on the side opposite max, so up to one step there
            bound = d4 + 9 * np.abs(d4 - d) + 1e-12
            err = np.abs(xb - x4.reshape(-1, QK).astype(np.float64))
            assert (err <= bound).all(), f"{t.name}: Q4_0 error above bound"
            worst = max(worst, float((err / np.maximum(d4, 1e-30)).max()))
            continue
        assert QT(u.tensor_type) == QT.Q8_0, f"{t.name}: not Q8_0"
        x8 = dequant_q8_0(raw)
        d8 = raw.reshape(-1, Q8_0_BLOCK)[:, 0:2].copy().view(np.float16).astype(np.float64)
        xb = x.reshape(-1, QK).astype(np.float64)
        d = np.abs(xb).max(axis=1, keepdims=True) / 127
        bound = d8 / 2 + 127 * np.abs(d8 - d) + 1e-12
        err = np.abs(xb - x8.reshape(-1, QK).astype(np.float64))
        assert (err <= bound).all(), f"{t.name}: Q8_0 error above bound"
        worst = max(worst, float((err / np.maximum(d8, 1e-30)).max()))
    print(f"verify: ok; worst |x - x_{target}| = {worst:.3f} * d")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", metavar="IN.gguf")
    ap.add_argument("dst", metavar="OUT.gguf")
    ap.add_argument("--type", default="q8_0", choices=["q8_0", "q4_0"], help="target type of Q4_1 tensors")
    ap.add_argument("--verify", action="store_true", help="re-read OUT and check it against IN")
    args = ap.parse_args()
    requant(args.src, args.dst, args.type)
    if args.verify:
        verify(args.src, args.dst, args.type)


if __name__ == "__main__":
    main()
