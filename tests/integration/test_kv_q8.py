"""The 8-bit KV cache (--kv-dtype q8_0: every 32 values of a stored key or
value row as one Q8_0 block, an f16 scale and 32 int8; 34 bytes against
f16's 64).

- Quality: the same text scored with q8_0 and with f16 KV (streamsink
  perplexity, SmolLM2 and Gemma 3, a window that slides and one that does
  not) gives perplexities within Q8_BOUND of each other, and the KV cache
  takes 68 / 128 of f16's bytes. Measured on tests/fixtures/retrofit_heldout.txt
  (docs/kv-policies.md, "KV storage"): ratios 0.982-1.008.
- Serving: a server with --kv-dtype q8_0 answers the openai client, greedy
  completions repeat exactly, and a streamed chat completes.
- A session saved by a q8_0 server and read by an f16 one is refused with a
  409 that names both dtypes, and kept on disk; the q8_0 server's KV pool
  (/metrics streamsink_kv_bytes) is 68 / 128 of the f16 one's.
- A bad --kv-dtype is a usage error (exit 2) for serve, run and perplexity,
  and so is --kv-f32 with another --kv-dtype.

Continuing a q8_0 session after a restart is in test_session_snapshots.py.
"""
import json
import os
import subprocess

import pytest

from conftest import Server
from session_util import complete

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEXT = os.path.join(ROOT, "tests", "fixtures", "retrofit_heldout.txt")
Q8_BOUND = 0.03  # |ppl(q8_0) / ppl(f16) - 1|; measured at most 0.018


def score(binary, model, dtype, window, tmp_path):
    js = str(tmp_path / f"{dtype}-{window}-{os.path.basename(model)}.json")
    r = subprocess.run([binary, "perplexity", "-m", model, "--text", TEXT, "--window",
                        str(window), "--kv-dtype", dtype, "-t", "2", "--no-progress", "--json",
                        js], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    with open(js) as f:
        d = json.load(f)
    assert d["kv_dtype"] == dtype and d["window"] == window
    return d


@pytest.mark.parametrize("which", ["smollm2", "gemma3"])
def test_q8_0_kv_scores_text_like_f16_in_about_half_the_bytes(binary, model, gemma_model, which,
                                                               tmp_path):
    m = model if which == "smollm2" else gemma_model
    for window in (64, 512):
        f16 = score(binary, m, "f16", window, tmp_path)
        q8 = score(binary, m, "q8_0", window, tmp_path)
        assert q8["tokens"] == f16["tokens"] > window  # the 64-token window slides
        ratio = q8["perplexity"] / f16["perplexity"]
        print(f"{which} W={window}: perplexity f16 {f16['perplexity']:.4f} "
              f"q8_0 {q8['perplexity']:.4f} ratio {ratio:.4f}")
        assert abs(ratio - 1) < Q8_BOUND, (window, f16["perplexity"], q8["perplexity"])
        # not the same numbers: the cache really holds 8-bit values
        assert q8["nll"] != f16["nll"]
        assert q8["kv_bytes"] * 128 == f16["kv_bytes"] * 68


def test_a_q8_0_server_serves_the_openai_client_and_repeats_greedy_text(binary, model):
    s = Server(binary, model, ["--kv-dtype", "q8_0", "--window", "256"])
    try:
        c = s.client()
        prompt = "The three primary colours are"
        a = c.completions.create(model="smol", prompt=prompt, max_tokens=24, temperature=0)
        b = c.completions.create(model="smol", prompt=prompt, max_tokens=24, temperature=0)
        assert a.choices[0].text and a.choices[0].text == b.choices[0].text
        parts = []
        for ch in c.chat.completions.create(
                model="smol", messages=[{"role": "user", "content": "Say hello."}],
                max_tokens=16, stream=True):
            if ch.choices and ch.choices[0].delta.content:
                parts.append(ch.choices[0].delta.content)
        assert "".join(parts)
    finally:
        assert s.stop() == 0, s.log()


def test_a_q8_0_session_on_an_f16_server_is_a_409_naming_both(binary, model, tmp_path):
    d = tmp_path / "sessions"
    d.mkdir()
    s1 = Server(binary, model, ["--session-dir", str(d), "--kv-dtype", "q8_0"])
    try:
        st, r = complete(s1, "One, two, three,", "q8-sess", max_tokens=4)
        assert st == 200, r
        q8_bytes = s1.metrics()["streamsink_kv_bytes"]
    finally:
        assert s1.stop() == 0, s1.log()
    assert (d / "q8-sess.snap").exists()
    s2 = Server(binary, model, ["--session-dir", str(d), "--kv-dtype", "f16"])
    try:
        st, r = complete(s2, " four,", "q8-sess", max_tokens=4, session_create=False)
        assert st == 409, r
        assert r["error"]["code"] == "session_snapshot_incompatible"
        assert "q8_0" in r["error"]["message"] and "f16" in r["error"]["message"], r
        assert (d / "q8-sess.snap").exists()  # kept for a server that can read it
        # the same pool in f16: the q8_0 server allocated 68 / 128 of its bytes
        assert q8_bytes * 128 == s2.metrics()["streamsink_kv_bytes"] * 68
    finally:
        assert s2.stop() == 0, s2.log()


@pytest.mark.parametrize("cmd", ["serve", "run", "perplexity"])
def test_a_bad_kv_dtype_is_a_usage_error(binary, model, cmd):
    args = {"serve": ["--port", "0"], "run": ["-p", "hi", "-n", "1"],
            "perplexity": ["--text", TEXT]}[cmd]
    r = subprocess.run([binary, cmd, "-m", model, *args, "--kv-dtype", "q4"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "--kv-dtype expects f16, f32 or q8_0, got 'q4'" in r.stderr
    if cmd != "serve":  # --kv-f32 is the older spelling of --kv-dtype f32
        r = subprocess.run([binary, cmd, "-m", model, *args, "--kv-dtype", "q8_0", "--kv-f32"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, (r.returncode, r.stderr)
        assert "--kv-f32 and --kv-dtype q8_0 disagree" in r.stderr
