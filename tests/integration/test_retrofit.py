"""The learned-sink retrofit of SmolLM2 (docs/results.md, "Learned-sink
retrofit"): tools/retrofit_sinks.py rebuilds it from the downloaded model and
the committed logits tools/data/sinks_trained.txt.

- The rebuilt GGUF declares normalizer `sink`, its blk.N.attn_sinks tensors
  hold exactly the committed numbers (parsed here on their own, read back with
  the gguf package), and every original tensor is byte-identical.
- Window-only eviction of the retrofit stays within the bound docs/results.md
  states (RATIO_BOUND) of the vanilla model with `sinks:4`, on the tokens after
  the first eviction of a short text that training never saw; on the same
  tokens the vanilla model without pinned sinks is far worse (VANILLA_MIN), so
  the text does exercise what the sink logits are for.
"""
import json
import math
import os
import subprocess
import sys

import gguf
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCALARS = os.path.join(ROOT, "tools", "data", "sinks_trained.txt")
TEXT = os.path.join(ROOT, "tests", "fixtures", "retrofit_heldout.txt")
WINDOW = 64
TOKENS = 448
RATIO_BOUND = 1.40
VANILLA_MIN = 2.5


@pytest.fixture(scope="module")
def retrofit(model, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("retrofit") / "smollm2-sink.gguf")
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "retrofit_sinks.py"),
                    "--model", model, "--scalars", SCALARS, "--out", out],
                   check=True, capture_output=True)
    return out


def committed_logits():
    rows = []
    with open(SCALARS) as f:
        for line in f:
            if not line.startswith("#") and line.strip():
                rows.append([float(x) for x in line.split()])
    return np.array(rows, dtype=np.float32)


def test_rebuilt_gguf_holds_the_committed_sinks_and_the_original_weights(model, retrofit):
    src, dst = gguf.GGUFReader(model), gguf.GGUFReader(retrofit)
    field = dst.fields["llama.attention.normalizer"]
    assert bytes(field.parts[field.data[0]]).decode() == "sink"
    want = committed_logits()
    n_layer, n_head = want.shape
    assert (n_layer, n_head) == (30, 9)
    got = {t.name: t for t in dst.tensors}
    for l in range(n_layer):
        t = got[f"blk.{l}.attn_sinks"]
        assert t.tensor_type == gguf.GGMLQuantizationType.F32
        assert list(t.shape) == [n_head]
        np.testing.assert_array_equal(np.asarray(t.data, dtype=np.float32), want[l])
    assert len(dst.tensors) == len(src.tensors) + n_layer
    for t in src.tensors:
        u = got[t.name]
        assert u.tensor_type == t.tensor_type and list(u.shape) == list(t.shape)
        a, b = np.asarray(u.data).reshape(-1), np.asarray(t.data).reshape(-1)
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), t.name


def late_ppl(binary, model, policy, tmp_path):
    js = str(tmp_path / f"{policy.replace(':', '')}-{os.path.basename(model)}.json")
    subprocess.run([binary, "perplexity", "-m", model, "--text", TEXT, "--policy", policy,
                    "--window", str(WINDOW), "--max-tokens", str(TOKENS), "-t", "2",
                    "--no-progress", "--json", js], check=True, capture_output=True)
    with open(js) as f:
        d = json.load(f)
    assert d["window"] == WINDOW and d["tokens"] == TOKENS
    late = d["nll"][WINDOW:]
    return math.exp(sum(late) / len(late)), d["normalizer"]


def test_window_only_retrofit_stays_within_the_bound_of_vanilla_with_sinks(
        binary, model, retrofit, tmp_path):
    ref, norm = late_ppl(binary, model, "sinks:4", tmp_path)
    assert norm == "softmax"
    fixed, norm = late_ppl(binary, retrofit, "window", tmp_path)
    assert norm == "sink"
    bare, _ = late_ppl(binary, model, "window", tmp_path)
    assert bare / ref > VANILLA_MIN, (bare, ref)
    assert fixed / ref < RATIO_BOUND, (fixed, ref)
