#!/usr/bin/env python3
"""make_padded_vocab_fixture.py: tests/fixtures/norm_softmax_padded.gguf, the
tiny softmax fixture with its embedding (tied to the output) padded from 257
to 320 rows, as real models pad theirs past the tokenizer (Qwen2's 151,936
rows for 151,665 tokens): the model's vocabulary is then larger than the
tokenizer's, and ids 257..319 are logits with no token behind them. The new
rows are drawn from a seeded normal with the old rows' spread, so that a hot
sampler picks them. Everything else is copied unchanged.

    .venv/bin/python tools/make_padded_vocab_fixture.py

Needs numpy and gguf (pip install gguf numpy).
"""
import os
import sys

import numpy as np

try:
    import gguf
except ImportError:
    sys.exit("make_padded_vocab_fixture.py: needs the gguf package (pip install gguf numpy)")

sys.path.insert(0, os.path.dirname(__file__))
from requant_gguf import field_value  # noqa: E402

HERE = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures")
SRC = os.path.join(HERE, "norm_softmax.gguf")
DST = os.path.join(HERE, "norm_softmax_padded.gguf")
ROWS = 320


def main():
    reader = gguf.GGUFReader(SRC)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(DST, arch)
    for name, f in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if name == "general.alignment":
            writer.add_custom_alignment(int(f.contents()))
            continue
        val, vtype, sub = field_value(f)
        writer.add_key_value(name, val, vtype, sub)
    rng = np.random.default_rng(20261206)
    for t in reader.tensors:
        data = np.asarray(t.data)
        if t.name == "token_embd.weight":
            old = data.astype(np.float32)
            extra = rng.normal(0.0, float(old.std()), (ROWS - old.shape[0], old.shape[1]))
            data = np.concatenate([old, extra.astype(np.float32)]).astype(data.dtype)
        writer.add_tensor(t.name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"{DST}: token_embd padded to {ROWS} rows")


if __name__ == "__main__":
    main()
