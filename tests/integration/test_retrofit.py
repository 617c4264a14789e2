"""The learned-sink retrofits of SmolLM2 (docs/results.md, "Learned-sink
retrofit" and "Sink values"): tools/retrofit_sinks.py rebuilds them from the
downloaded model and the committed files: the logits alone
(tools/data/sinks_trained.txt), logits with one value vector per query
head (tools/data/sinks_trained_v.txt + tools/data/sinks_values.f32), and
those trained on with the first W tokens scored too
(tools/data/sinks_trained_v2.txt + tools/data/sinks_values_v2.f32), and
those with one sink key per KV head as well (tools/data/sinks_trained_v3.txt +
tools/data/sinks_values_v3.f32 + tools/data/sinks_keys_v3.f32).

- The rebuilt GGUFs declare normalizer `sink`, their blk.N.attn_sinks (and
  blk.N.attn_sinks_v) tensors hold exactly the committed numbers (parsed here
  on their own, read back with the gguf package), and every original tensor
  is byte-identical.
- Window-only eviction of each retrofit stays within the bound docs/results.md
  states (RATIO_BOUND, VALUES_RATIO_BOUND) of the vanilla model with
  `sinks:4`, on the tokens after the first eviction of a short text that
  training never saw; on the same tokens the vanilla model without pinned
  sinks is far worse (VANILLA_MIN), so the text does exercise what the sinks
  are for. The v2 retrofit also stays below its bound before the first
  eviction (EARLY_BOUND_V2: the tokens t < W, with the real first token still
  in the window, against the vanilla model on the same tokens); so does the
  v3 retrofit with sink keys (KEYS_V3_RATIO_BOUND, EARLY_BOUND_V3).
- A file whose sink values skip layer 0 is refused at load.
- Sink keys (blk.N.attn_sinks_k, one per KV head): the rebuild script adds
  them byte for byte; keys that are all zero score exactly like the file
  without them (the same NLL to the last bit); and a file whose keys skip
  layer 0, have the wrong shape, hold a NaN or come without the sink
  normalizer is refused at load with a message that says which.
"""
import json
import math
import os
import struct
import subprocess
import sys

import gguf
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCALARS = os.path.join(ROOT, "tools", "data", "sinks_trained.txt")
SCALARS_V = os.path.join(ROOT, "tools", "data", "sinks_trained_v.txt")
VALUES = os.path.join(ROOT, "tools", "data", "sinks_values.f32")
TEXT = os.path.join(ROOT, "tests", "fixtures", "retrofit_heldout.txt")
WINDOW = 64
TOKENS = 448
RATIO_BOUND = 1.40
# measured 1.14x (21.64 vs 18.99, 2026-12-01); the same 5% margin as RATIO_BOUND (1.33x -> 1.40x)
VALUES_RATIO_BOUND = 1.20
VANILLA_MIN = 2.5
SCALARS_V2 = os.path.join(ROOT, "tools", "data", "sinks_trained_v2.txt")
VALUES_V2 = os.path.join(ROOT, "tools", "data", "sinks_values_v2.f32")
# measured 1.19x after the first eviction (22.43 vs 18.90) and 0.79x before it (30.53 vs 38.65),
# 2026-12-02; the same 5% margin
VALUES_V2_RATIO_BOUND = 1.25
EARLY_BOUND_V2 = 0.83
SCALARS_V3 = os.path.join(ROOT, "tools", "data", "sinks_trained_v3.txt")
VALUES_V3 = os.path.join(ROOT, "tools", "data", "sinks_values_v3.f32")
KEYS_V3 = os.path.join(ROOT, "tools", "data", "sinks_keys_v3.f32")
# measured 1.06x after the first eviction (19.90 vs 18.83) and 0.79x before it (31.00 vs 39.06),
# 2026-12-02 (v2 the same day: 1.20x and 0.78x); the same 5% margin
KEYS_V3_RATIO_BOUND = 1.11
EARLY_BOUND_V3 = 0.84


def rebuild(model, out, scalars, values=None, keys=None):
    cmd = [sys.executable, os.path.join(ROOT, "tools", "retrofit_sinks.py"), "--model", model,
           "--scalars", scalars, "--out", out]
    if values:
        cmd += ["--values", values]
    if keys:
        cmd += ["--keys", keys]
    subprocess.run(cmd, check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def retrofit(model, tmp_path_factory):
    return rebuild(model, str(tmp_path_factory.mktemp("retrofit") / "smollm2-sink.gguf"), SCALARS)


@pytest.fixture(scope="module")
def retrofit_v(model, tmp_path_factory):
    return rebuild(model, str(tmp_path_factory.mktemp("retrofit_v") / "smollm2-sink-v.gguf"),
                   SCALARS_V, VALUES)


@pytest.fixture(scope="module")
def retrofit_v2(model, tmp_path_factory):
    return rebuild(model, str(tmp_path_factory.mktemp("retrofit_v2") / "smollm2-sink-v2.gguf"),
                   SCALARS_V2, VALUES_V2)


N_LAYER, N_HEAD_KV, HEAD_DIM = 30, 3, 64


@pytest.fixture(scope="module")
def keyed(model, tmp_path_factory):
    """The v2 retrofit with random sink keys (N(0, 0.05^2), seed 0) and with
    all-zero sink keys."""
    d = tmp_path_factory.mktemp("retrofit_keys")
    rnd = np.random.RandomState(0).normal(0, 0.05, (N_LAYER, N_HEAD_KV, HEAD_DIM))
    rnd.astype("<f4").tofile(str(d / "keys.f32"))
    np.zeros((N_LAYER, N_HEAD_KV, HEAD_DIM), dtype="<f4").tofile(str(d / "zero.f32"))
    return {
        "keys": str(d / "keys.f32"),
        "random": rebuild(model, str(d / "random.gguf"), SCALARS_V2, VALUES_V2,
                          str(d / "keys.f32")),
        "zero": rebuild(model, str(d / "zero.gguf"), SCALARS_V2, VALUES_V2, str(d / "zero.f32")),
    }


@pytest.fixture(scope="module")
def retrofit_v3(model, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("retrofit_v3") / "smollm2-sink-v3.gguf")
    return rebuild(model, out, SCALARS_V3, VALUES_V3, KEYS_V3)


def committed_logits(path=SCALARS):
    rows = []
    with open(path) as f:
        for line in f:
            if not line.startswith("#") and line.strip():
                rows.append([float(x) for x in line.split()])
    return np.array(rows, dtype=np.float32)


def check_rebuilt(model, path, scalars, values, keys=None):
    src, dst = gguf.GGUFReader(model), gguf.GGUFReader(path)
    field = dst.fields["llama.attention.normalizer"]
    assert bytes(field.parts[field.data[0]]).decode() == "sink"
    want = committed_logits(scalars)
    n_layer, n_head = want.shape
    assert (n_layer, n_head) == (30, 9)
    head_dim = 64
    want_v = np.fromfile(values, dtype="<f4").reshape(n_layer, n_head, head_dim) if values \
        else None
    got = {t.name: t for t in dst.tensors}
    want_k = np.fromfile(keys, dtype="<f4").reshape(n_layer, N_HEAD_KV, head_dim) if keys \
        else None
    for l in range(n_layer):
        if want_k is None:
            assert f"blk.{l}.attn_sinks_k" not in got
        else:
            t = got[f"blk.{l}.attn_sinks_k"]
            assert t.tensor_type == gguf.GGMLQuantizationType.F32
            assert list(t.shape) == [head_dim, N_HEAD_KV]  # GGUF order: ne0 = head_dim
            np.testing.assert_array_equal(
                np.asarray(t.data, dtype=np.float32).reshape(N_HEAD_KV, head_dim), want_k[l])
        t = got[f"blk.{l}.attn_sinks"]
        assert t.tensor_type == gguf.GGMLQuantizationType.F32
        assert list(t.shape) == [n_head]
        np.testing.assert_array_equal(np.asarray(t.data, dtype=np.float32), want[l])
        if want_v is None:
            assert f"blk.{l}.attn_sinks_v" not in got
            continue
        t = got[f"blk.{l}.attn_sinks_v"]
        assert t.tensor_type == gguf.GGMLQuantizationType.F32
        assert list(t.shape) == [head_dim, n_head]  # GGUF order: ne0 = head_dim
        np.testing.assert_array_equal(
            np.asarray(t.data, dtype=np.float32).reshape(n_head, head_dim), want_v[l])
    n_new = n_layer * (1 + (want_v is not None) + (want_k is not None))
    assert len(dst.tensors) == len(src.tensors) + n_new
    for t in src.tensors:
        u = got[t.name]
        assert u.tensor_type == t.tensor_type and list(u.shape) == list(t.shape)
        a, b = np.asarray(u.data).reshape(-1), np.asarray(t.data).reshape(-1)
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), t.name


def test_rebuilt_gguf_holds_the_committed_sinks_and_the_original_weights(model, retrofit):
    check_rebuilt(model, retrofit, SCALARS, None)


def test_rebuilt_gguf_holds_the_committed_sink_values_and_the_original_weights(model, retrofit_v):
    check_rebuilt(model, retrofit_v, SCALARS_V, VALUES)


def test_rebuilt_gguf_holds_the_committed_v2_sinks_and_the_original_weights(model, retrofit_v2):
    check_rebuilt(model, retrofit_v2, SCALARS_V2, VALUES_V2)


def test_rebuilt_gguf_holds_the_committed_v3_sink_keys_and_the_original_weights(
        model, retrofit_v3):
    check_rebuilt(model, retrofit_v3, SCALARS_V3, VALUES_V3, KEYS_V3)


def run_nll(binary, model, policy, tmp_path):
    js = str(tmp_path / f"{policy.replace(':', '')}-{os.path.basename(model)}.json")
    subprocess.run([binary, "perplexity", "-m", model, "--text", TEXT, "--policy", policy,
                    "--window", str(WINDOW), "--max-tokens", str(TOKENS), "-t", "2",
                    "--no-progress", "--json", js], check=True, capture_output=True)
    with open(js) as f:
        d = json.load(f)
    assert d["window"] == WINDOW and d["tokens"] == TOKENS
    return d["nll"], d["normalizer"]


def ppl(nll):
    return math.exp(sum(nll) / len(nll))


def late_ppl(binary, model, policy, tmp_path):
    nll, norm = run_nll(binary, model, policy, tmp_path)
    return ppl(nll[WINDOW:]), norm


def test_window_only_retrofit_stays_within_the_bound_of_vanilla_with_sinks(
        binary, model, retrofit, tmp_path):
    ref, norm = late_ppl(binary, model, "sinks:4", tmp_path)
    assert norm == "softmax"
    fixed, norm = late_ppl(binary, retrofit, "window", tmp_path)
    assert norm == "sink"
    bare, _ = late_ppl(binary, model, "window", tmp_path)
    assert bare / ref > VANILLA_MIN, (bare, ref)
    assert fixed / ref < RATIO_BOUND, (fixed, ref)


def test_window_only_retrofit_with_sink_values_stays_within_its_bound(
        binary, model, retrofit_v, tmp_path):
    ref, _ = late_ppl(binary, model, "sinks:4", tmp_path)
    fixed, norm = late_ppl(binary, retrofit_v, "window", tmp_path)
    assert norm == "sink"
    assert fixed / ref < VALUES_RATIO_BOUND, (fixed, ref)


def check_early_and_late(binary, model, retrofit, late_bound, early_bound, tmp_path):
    """The window-only retrofit against vanilla sinks:4 on the tokens after
    the first eviction (late) and before it (early)."""
    ref, _ = run_nll(binary, model, "sinks:4", tmp_path)
    got, norm = run_nll(binary, retrofit, "window", tmp_path)
    assert norm == "sink"
    late = ppl(got[WINDOW:]) / ppl(ref[WINDOW:])
    early = ppl(got[:WINDOW]) / ppl(ref[:WINDOW])
    assert late < late_bound, (late, early)
    assert early < early_bound, (late, early)


def test_v2_retrofit_stays_within_its_bounds_before_and_after_the_first_eviction(
        binary, model, retrofit_v2, tmp_path):
    check_early_and_late(binary, model, retrofit_v2, VALUES_V2_RATIO_BOUND, EARLY_BOUND_V2,
                         tmp_path)


def test_v3_retrofit_with_sink_keys_stays_within_its_bounds_before_and_after_the_first_eviction(
        binary, model, retrofit_v3, tmp_path):
    check_early_and_late(binary, model, retrofit_v3, KEYS_V3_RATIO_BOUND, EARLY_BOUND_V3,
                         tmp_path)


def test_sink_values_that_skip_layer_0_are_refused_at_load(binary, retrofit_v, tmp_path):
    """blk.0.attn_sinks_v renamed (same length, so the file stays valid
    GGUF): the other layers' values would be used and layer 0's silently
    zero; the engine refuses the file instead (exit 3, load error)."""
    buf = open(retrofit_v, "rb").read()
    assert buf.count(b"blk.0.attn_sinks_v") == 1
    bad = str(tmp_path / "skip0.gguf")
    with open(bad, "wb") as f:
        f.write(buf.replace(b"blk.0.attn_sinks_v", b"blk.0.attn_sinks_w"))
    r = subprocess.run([binary, "perplexity", "-m", bad, "--text", TEXT, "--window", str(WINDOW),
                        "--max-tokens", "80", "-t", "1", "--no-progress"],
                       capture_output=True, text=True)
    assert r.returncode == 3, (r.returncode, r.stderr)
    assert "blk.1.attn_sinks_v present but blk.0.attn_sinks_v missing" in r.stderr, r.stderr


def test_rebuilt_gguf_holds_the_sink_keys_and_the_original_weights(model, keyed):
    check_rebuilt(model, keyed["random"], SCALARS_V2, VALUES_V2, keyed["keys"])


def test_zero_sink_keys_score_exactly_like_the_file_without_them(
        binary, retrofit_v2, keyed, tmp_path):
    without, _ = run_nll(binary, retrofit_v2, "window", tmp_path)
    zero, norm = run_nll(binary, keyed["zero"], "window", tmp_path)
    assert norm == "sink"
    assert zero == without
    rand, _ = run_nll(binary, keyed["random"], "window", tmp_path)
    assert rand != without  # the keys are used


def gguf_name(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def refused(binary, buf, tmp_path, name):
    bad = str(tmp_path / name)
    with open(bad, "wb") as f:
        f.write(buf)
    r = subprocess.run([binary, "perplexity", "-m", bad, "--text", TEXT, "--window", str(WINDOW),
                        "--max-tokens", "80", "-t", "1", "--no-progress"],
                       capture_output=True, text=True)
    assert r.returncode == 3, (r.returncode, r.stderr)
    return r.stderr


def test_sink_keys_that_skip_layer_0_are_refused_at_load(binary, keyed, tmp_path):
    buf = open(keyed["random"], "rb").read()
    assert buf.count(gguf_name("blk.0.attn_sinks_k")) == 1
    err = refused(binary, buf.replace(gguf_name("blk.0.attn_sinks_k"),
                                      gguf_name("blk.0.attn_sinks_j")), tmp_path, "skip0.gguf")
    assert "blk.1.attn_sinks_k present but blk.0.attn_sinks_k missing" in err, err


def test_sink_keys_missing_from_one_layer_are_refused_at_load(binary, keyed, tmp_path):
    buf = open(keyed["random"], "rb").read()
    err = refused(binary, buf.replace(gguf_name("blk.7.attn_sinks_k"),
                                      gguf_name("blk.7.attn_sinks_j")), tmp_path, "skip7.gguf")
    assert "'blk.7.attn_sinks_k' missing" in err, err


def test_sink_keys_of_the_wrong_shape_are_refused_at_load(binary, keyed, tmp_path):
    """[64, 3] rewritten as [32, 6]: the same bytes, so the file stays valid GGUF."""
    buf = open(keyed["random"], "rb").read()
    info = gguf_name("blk.4.attn_sinks_k") + struct.pack("<IQQ", 2, HEAD_DIM, N_HEAD_KV)
    assert buf.count(info) == 1
    bad = buf.replace(info, gguf_name("blk.4.attn_sinks_k") + struct.pack("<IQQ", 2, 32, 6))
    err = refused(binary, bad, tmp_path, "shape.gguf")
    assert "tensor 'blk.4.attn_sinks_k' has shape [32, 6], expected [64, 3]" in err, err


def test_sink_keys_with_a_nan_are_refused_at_load(binary, keyed, tmp_path):
    keys = np.fromfile(keyed["keys"], dtype="<f4")
    layer2 = keys[2 * N_HEAD_KV * HEAD_DIM:3 * N_HEAD_KV * HEAD_DIM].tobytes()
    buf = open(keyed["random"], "rb").read()
    assert buf.count(layer2) == 1
    poisoned = bytearray(layer2)
    poisoned[5 * 4:6 * 4] = struct.pack("<f", float("nan"))
    err = refused(binary, buf.replace(layer2, bytes(poisoned)), tmp_path, "nan.gguf")
    assert "blk.2.attn_sinks_k[5] is not a finite number" in err, err


def test_sink_keys_without_the_sink_normalizer_are_refused_at_load(binary, keyed, tmp_path):
    """The normalizer key and every blk.N.attn_sinks renamed (same lengths):
    the file reads as vanilla softmax that still carries sink keys."""
    buf = open(keyed["random"], "rb").read()
    key = gguf_name("llama.attention.normalizer")
    assert buf.count(key) == 1
    buf = buf.replace(key, gguf_name("llama.attention.normalizez"))
    for l in range(N_LAYER):
        for suffix in ("", "_v"):
            n = gguf_name(f"blk.{l}.attn_sinks{suffix}")
            assert buf.count(n) == 1
            buf = buf.replace(n, gguf_name(f"blk.{l}.attn_sinkz{suffix}"))
    err = refused(binary, buf, tmp_path, "nonorm.gguf")
    assert "attn_sinks_k tensors present but normalizer is 'softmax'" in err, err
