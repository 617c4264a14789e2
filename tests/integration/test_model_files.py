"""Model files the engine cannot run are a clear load error (exit 3), never
an assert or a crash later: here a Llama file whose head dimension is larger
than the attention kernels take, and one whose tokenizer has more tokens
than its embedding has rows."""

import json
import os
import subprocess

import numpy as np

def write_llama(path, dim, heads, vocab_tokens, bos, rows=None, name=b"head-dim-test"):
    """A complete one-layer F32 Llama GGUF with the byte-level tokenizer of the
    matched normalizer fixtures; every tensor present with its right shape
    (token_embd with rows rows, the tokenizer's count by default); name is
    general.name's bytes (or text)."""
    import gguf
    rng = np.random.default_rng(0)
    V, D, F = len(vocab_tokens), dim, 64
    R = rows or V
    wr = gguf.GGUFWriter(path, "llama")
    wr.add_key_value("general.name", name, gguf.GGUFValueType.STRING)
    wr.add_context_length(256)
    wr.add_embedding_length(D)
    wr.add_block_count(1)
    wr.add_feed_forward_length(F)
    wr.add_head_count(heads)
    wr.add_head_count_kv(heads)
    wr.add_key_length(D // heads)
    wr.add_value_length(D // heads)
    wr.add_rope_dimension_count(D // heads)
    wr.add_rope_freq_base(10000.0)
    wr.add_layer_norm_rms_eps(1e-5)
    wr.add_file_type(0)
    wr.add_tokenizer_model("gpt2")
    wr.add_tokenizer_pre("gpt2")
    wr.add_token_list(vocab_tokens)
    wr.add_token_types([1] * (V - 1) + [3])
    wr.add_token_merges(["\u0120 \u0120"])
    wr.add_bos_token_id(bos)
    wr.add_eos_token_id(bos)
    shapes = {"token_embd.weight": (R, D), "output_norm.weight": (D,),
              "blk.0.attn_norm.weight": (D,), "blk.0.ffn_norm.weight": (D,),
              "blk.0.attn_q.weight": (D, D), "blk.0.attn_k.weight": (D, D),
              "blk.0.attn_v.weight": (D, D), "blk.0.attn_output.weight": (D, D),
              "blk.0.ffn_gate.weight": (F, D), "blk.0.ffn_up.weight": (F, D),
              "blk.0.ffn_down.weight": (D, F)}
    for name, shape in shapes.items():
        wr.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()


def byte_vocab():
    """GPT-2's byte-level alphabet (each byte as one printable character) plus
    an end-of-text token, as the matched normalizer fixtures use."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table, k = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = b
        else:
            table[b] = 256 + k
            k += 1
    return [chr(table[b]) for b in range(256)] + ["<|endoftext|>"], 256


def test_head_dim_over_the_kernels_bound_is_a_load_error(binary, tmp_path):
    tokens, bos = byte_vocab()
    ok, big = str(tmp_path / "dh256.gguf"), str(tmp_path / "dh512.gguf")
    write_llama(ok, 256, 1, tokens, bos)   # the largest head the kernels take
    write_llama(big, 512, 1, tokens, bos)
    good = subprocess.run([binary, "run", "-m", ok, "-p", "hi", "-n", "2"],
                          capture_output=True, text=True, timeout=120)
    assert good.returncode == 0, good.stderr  # the control: the file format itself is fine
    bad = subprocess.run([binary, "run", "-m", big, "-p", "hi", "-n", "2"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 3, (bad.returncode, bad.stderr)
    assert "key_length" in bad.stderr and "512" in bad.stderr, bad.stderr
    served = subprocess.run([binary, "serve", "-m", big, "--port", "0"],
                            capture_output=True, text=True, timeout=120)
    assert served.returncode == 3, served.stderr


def test_a_tokenizer_larger_than_the_embedding_is_a_load_error(binary, tmp_path):
    """Ids past the embedding's rows would be read past it (a text prompt's
    "\u00ff" is id 255 here, the row of a 200-row embedding it has not)."""
    tokens, bos = byte_vocab()
    short, padded = str(tmp_path / "short.gguf"), str(tmp_path / "padded.gguf")
    write_llama(short, 64, 1, tokens, bos, rows=200)
    write_llama(padded, 64, 1, tokens, bos, rows=320)  # more rows than tokens is fine
    good = subprocess.run([binary, "run", "-m", padded, "-p", "hi \u00ff", "-n", "2"],
                          capture_output=True, text=True, timeout=120)
    assert good.returncode == 0, good.stderr
    for cmd in (["run", "-p", "hi \u00ff", "-n", "2"], ["serve", "--port", "0"]):
        bad = subprocess.run([binary, cmd[0], "-m", short, *cmd[1:]],
                             capture_output=True, text=True, timeout=120)
        assert bad.returncode == 3, (bad.returncode, bad.stderr)
        assert "257 tokens" in bad.stderr and "200 rows" in bad.stderr, bad.stderr


def test_a_models_names_cannot_break_an_answer_a_scrape_or_the_log(binary, tmp_path):
    """The file's name is the served id and general.name a metrics label;
    both are anybody's bytes. /health wrote the id into its JSON unescaped,
    the label kept a raw CR and bytes that are no UTF-8 (a scrape Prometheus
    refuses), and the log wrote a newline in the file's name as a line of
    its own. Now each is valid UTF-8 with no control character (U+FFFD in
    their place: one for a character cut short, as Python's errors="replace"
    reads it), escaped where its format says."""
    from conftest import Server
    tokens, bos = byte_vocab()
    real = str(tmp_path / "m.gguf")
    write_llama(real, 64, 1, tokens, bos, name=b'A"b\\c\r\xe2\x82\xff-end')
    evil = os.fsdecode(os.fsencode(str(tmp_path)) +
                       b'/we"ird\na\tme\r\nFAKE 2025-01-01T00:00:00.000Z error forged\xff.gguf')
    os.symlink(real, evil)
    s = Server(binary, evil, [])
    try:
        status, _, body = s.get("/health")
        assert status == 200
        model_id = json.loads(body)["model"]
        assert model_id == 'we"ird\ufffda\ufffdme\ufffd\ufffdFAKE 2025-01-01T00:00:00.000Z error forged\ufffd', model_id
        status, _, body = s.get("/v1/models")
        assert json.loads(body)["data"][0]["id"] == model_id
        status, _, body = s.get("/metrics")
        text = body.decode("utf-8")  # strict: a scrape is UTF-8
        info = [l for l in text.splitlines() if l.startswith("streamsink_model_info{")]
        want = b'A\\"b\\\\c\r\xe2\x82\xff-end'.decode("utf-8", "replace").replace("\r", "\ufffd")
        assert want == 'A\\"b\\\\c\ufffd\ufffd\ufffd-end'
        assert len(info) == 1 and f'name="{want}"' in info[0], info
    finally:
        assert s.stop() == 0
    assert not any(line.startswith("FAKE") for line in s.lines), s.log()
    assert "\\x0a" in s.log()
