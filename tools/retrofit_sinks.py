#!/usr/bin/env python3
"""Rebuilds a learned-sink (or softmax1) GGUF from a downloaded vanilla model.

    python3 tools/retrofit_sinks.py --model ~/.cache/streamsink/SmolLM2-135M-Instruct.Q4_1.gguf \
        --scalars tools/data/sinks_calibrated.txt --out /tmp/smollm2-sinks-cal.gguf
    python3 tools/retrofit_sinks.py --model ... --scalars tools/data/sinks_trained.txt \
        --out /tmp/smollm2-sinks-trained.gguf
    python3 tools/retrofit_sinks.py --model ... --scalars tools/data/sinks_trained_v.txt \
        --values tools/data/sinks_values.f32 --out /tmp/smollm2-sinks-values.gguf
    python3 tools/retrofit_sinks.py --model ... --scalars tools/data/sinks_trained_v3.txt \
        --values tools/data/sinks_values_v3.f32 --keys tools/data/sinks_keys_v3.f32 \
        --out /tmp/smollm2-sinks-keys.gguf
    python3 tools/retrofit_sinks.py --model ... --softmax1 --out /tmp/smollm2-softmax1.gguf

The scalars file holds one line per layer of H sink logits ('#' lines are comments),
as written by `streamsink calibrate` and tools/train_sinks.py. The values file
(--values, tools/train_sinks.py --sink-values) holds the sink value vectors as raw
little-endian float32, layer by layer, head by head, head_dim each. The keys file
(--keys, tools/train_sinks.py --sink-keys) holds one sink key per KV head in the
same layout: layer by layer, kv head by kv head, head_dim each.

The file is spliced at the byte level (no gguf package needed, stdlib only), so
every original weight stays byte-identical: the GGUF data section is copied
unchanged and tensor offsets are relative to it, so the original tensor infos
keep their offsets. Added: the key <arch>.attention.normalizer (= "sink", or
"softmax1" with --softmax1), and for sink one F32 tensor blk.N.attn_sinks of
shape [H] per layer (with --values also blk.N.attn_sinks_v, shape [head_dim, H],
with --keys blk.N.attn_sinks_k, shape [head_dim, Hkv]), appended after the original data (README, "The GGUF
normalizer convention"). The output is checked by re-reading it.
"""
import argparse
import hashlib
import math
import struct
import sys

GGUF_MAGIC = b"GGUF"
T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR, T_U64, T_I64, T_F64 = range(13)
SCALAR = {T_U8: "B", T_I8: "b", T_U16: "H", T_I16: "h", T_U32: "I", T_I32: "i", T_F32: "f",
          T_BOOL: "?", T_U64: "Q", T_I64: "q", T_F64: "d"}
GGML_F32 = 0


class Reader:
    def __init__(self, buf, off=0):
        self.b, self.o = buf, off

    def get(self, fmt):
        v = struct.unpack_from("<" + fmt, self.b, self.o)
        self.o += struct.calcsize("<" + fmt)
        return v[0]

    def string(self):
        n = self.get("Q")
        s = self.b[self.o:self.o + n]
        self.o += n
        return s.decode("utf-8")

    def value(self, t):
        if t == T_STR:
            return self.string()
        if t == T_ARR:
            et, n = self.get("I"), self.get("Q")
            return [self.value(et) for _ in range(n)]
        return self.get(SCALAR[t])


def parse(buf):
    """Returns (kv {key: (type, value)}, kv_end, tensors [(name, dims, type, offset)],
    infos_end, alignment, data_start)."""
    r = Reader(buf)
    if buf[:4] != GGUF_MAGIC:
        sys.exit("not a GGUF file")
    r.o = 4
    version = r.get("I")
    if version != 3:
        sys.exit(f"GGUF version {version}: only 3 is handled")
    n_t, n_kv = r.get("Q"), r.get("Q")
    kv = {}
    for _ in range(n_kv):
        k = r.string()
        t = r.get("I")
        kv[k] = (t, r.value(t))
    kv_end = r.o
    tensors = []
    for _ in range(n_t):
        name = r.string()
        nd = r.get("I")
        dims = [r.get("Q") for _ in range(nd)]
        tensors.append((name, dims, r.get("I"), r.get("Q")))
    infos_end = r.o
    align = kv.get("general.alignment", (T_U32, 32))[1]
    data_start = (infos_end + align - 1) // align * align
    return kv, kv_end, tensors, infos_end, align, data_start


def gguf_str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def read_scalars(path, n_layer, n_head):
    rows = []
    for line in open(path):
        line = line.split("#", 1)[0].strip()
        if line:
            rows.append([float(x) for x in line.split()])
    if len(rows) != n_layer or any(len(r) != n_head for r in rows):
        sys.exit(f"{path}: expected {n_layer} lines of {n_head} numbers")
    return rows


def read_vectors(path, n_layer, n_rows, head_dim, finite=False):
    """A raw little-endian float32 file of n_layer x n_rows x head_dim numbers
    (sink values or keys), split into one bytes block per layer."""
    blob = open(path, "rb").read()
    per = n_rows * head_dim * 4
    if len(blob) != n_layer * per:
        sys.exit(f"{path}: expected {n_layer} x {n_rows} x {head_dim} float32 "
                 f"({n_layer * per} bytes), got {len(blob)} bytes")
    if finite and not all(math.isfinite(x) for x in struct.unpack(f"<{len(blob) // 4}f", blob)):
        sys.exit(f"{path}: not every number is finite")
    return [blob[l * per:(l + 1) * per] for l in range(n_layer)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--scalars", help="sink logits, one line per layer")
    g.add_argument("--softmax1", action="store_true", help="normalizer softmax1, no tensors")
    ap.add_argument("--values", help="with --scalars: sink value vectors (raw float32, "
                                     "layers x heads x head_dim) -> blk.N.attn_sinks_v")
    ap.add_argument("--keys", help="with --scalars: sink keys (raw float32, layers x kv heads "
                                   "x head_dim) -> blk.N.attn_sinks_k")
    a = ap.parse_args()
    if (a.values or a.keys) and not a.scalars:
        ap.error("--values and --keys need --scalars")

    buf = open(a.model, "rb").read()
    kv, kv_end, tensors, infos_end, align, data_start = parse(buf)
    arch = kv["general.architecture"][1]
    n_layer = kv[f"{arch}.block_count"][1]
    n_head = kv[f"{arch}.attention.head_count"][1]
    n_head_kv = kv.get(f"{arch}.attention.head_count_kv", (T_U32, n_head))[1]
    head_dim = kv.get(f"{arch}.attention.key_length",
                      (T_U32, kv[f"{arch}.embedding_length"][1] // n_head))[1]
    norm_key = f"{arch}.attention.normalizer"
    if norm_key in kv or any("attn_sinks" in t[0] for t in tensors):
        sys.exit(f"{a.model} already declares a normalizer or has sink tensors")
    data = buf[data_start:]

    new_kv = gguf_str(norm_key) + struct.pack("<I", T_STR) + gguf_str(
        "softmax1" if a.softmax1 else "sink")
    new_infos, new_data = b"", b""
    n_new = 0
    if a.scalars:
        rows = read_scalars(a.scalars, n_layer, n_head)
        vals = read_vectors(a.values, n_layer, n_head, head_dim) if a.values else None
        keys = read_vectors(a.keys, n_layer, n_head_kv, head_dim, finite=True) if a.keys \
            else None
        off = (len(data) + align - 1) // align * align
        new_data = b"\0" * (off - len(data))

        def add(name, dims, blob):
            nonlocal new_infos, new_data, off, n_new
            new_infos += gguf_str(name) + struct.pack("<I", len(dims)) + b"".join(
                struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", GGML_F32, off)
            pad = (-len(blob)) % align
            new_data += blob + b"\0" * pad
            off += len(blob) + pad
            n_new += 1

        for l, row in enumerate(rows):
            add(f"blk.{l}.attn_sinks", [n_head], struct.pack(f"<{n_head}f", *row))
            if vals:
                add(f"blk.{l}.attn_sinks_v", [head_dim, n_head], vals[l])
            if keys:
                add(f"blk.{l}.attn_sinks_k", [head_dim, n_head_kv], keys[l])
    n_t, n_kv = len(tensors), len(kv)
    head = GGUF_MAGIC + struct.pack("<IQQ", 3, n_t + n_new, n_kv + 1)
    body = buf[24:kv_end] + new_kv + buf[kv_end:infos_end] + new_infos
    pre = head + body
    pre += b"\0" * ((-len(pre)) % align)
    out = pre + data + new_data
    with open(a.out, "wb") as f:
        f.write(out)

    # check: original tensors byte-identical, new ones as written
    kv2, _, tensors2, _, _, ds2 = parse(out)
    assert kv2[norm_key][1] == ("softmax1" if a.softmax1 else "sink")
    assert tensors2[:n_t] == tensors
    assert out[ds2:ds2 + len(data)] == data
    digest = hashlib.sha256(data).hexdigest()[:16]
    print(f"wrote {a.out}: {n_t} original tensors byte-identical (data sha256 {digest}...), "
          f"normalizer {kv2[norm_key][1]}, {n_new} sink tensors")


if __name__ == "__main__":
    main()
