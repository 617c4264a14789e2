"""Gemma 3 270M served end to end with the official openai client: completions
(streamed and not, greedy, the same text), a chat in Gemma's turn format, and
a stream that runs past the local layers' 512-token window, and a session
past that window saved, restored by the next process and continued exactly.
Skips only when
the Gemma file is absent (scripts/fetch-model.sh gemma3-270m)."""
import json

import pytest

from conftest import Server
from session_util import call, complete, continuation


@pytest.fixture(scope="module")
def gemma(binary, gemma_model):
    # the file carries no tokenizer.chat_template: the operator names its format
    s = Server(binary, gemma_model, ["--max-seqs", "2", "--window", "1024",
                                     "--chat-template", "gemma"])
    yield s
    rc = s.stop()
    assert rc == 0, s.log()


def test_gemma_greedy_completion_streams_the_same_text_as_it_returns(gemma):
    c = gemma.client()
    whole = c.completions.create(model="smol", prompt="The capital of France is",
                                 max_tokens=12, temperature=0)
    text = whole.choices[0].text
    # transformers' greedy continuation starts with token 506 (" the"), the
    # fixture's top-1 at the prompt's last position (tests/fixtures/logits_gemma3.txt)
    assert text.startswith(" the"), text
    pieces = [ch.choices[0].text for ch in c.completions.create(
        model="smol", prompt="The capital of France is", max_tokens=12, temperature=0,
        stream=True) if ch.choices]
    assert "".join(pieces) == text
    assert whole.usage.prompt_tokens == 6  # BOS + 5, as transformers tokenizes it


def test_gemma_chat_answers_in_its_turn_format(gemma):
    c = gemma.client()
    question = "What is the tallest mountain on Earth?"
    out = []
    for ch in c.chat.completions.create(
            model="smol", messages=[{"role": "user", "content": question}],
            max_tokens=24, temperature=0, stream=True):
        if ch.choices and ch.choices[0].delta.content:
            out.append(ch.choices[0].delta.content)
    text = "".join(out)
    assert text.strip(), text
    # the same turn written out by hand, as a completion
    turn = f"<start_of_turn>user\n{question}<end_of_turn>\n<start_of_turn>model\n"
    comp = c.completions.create(model="smol", prompt=turn, max_tokens=24, temperature=0)
    assert text == comp.choices[0].text
    assert "chat gemma from --chat-template)" in gemma.log()


def test_gemma_streams_past_the_local_window(gemma):
    c = gemma.client()
    prompt = "The river ran past the old mill and under the stone bridge. " * 60
    pieces = []
    usage = None
    for ch in c.completions.create(model="smol", prompt=prompt, max_tokens=16, temperature=0,
                                   stream=True, stream_options={"include_usage": True}):
        if ch.choices:
            pieces.append(ch.choices[0].text)
        if ch.usage:
            usage = ch.usage
    assert usage is not None and usage.prompt_tokens > 512  # the local layers slide
    assert "".join(pieces).strip()


def test_gemma_session_past_the_local_window_continues_after_a_restart_exactly(binary,
                                                                             gemma_model,
                                                                             tmp_path):
    # a session longer than the local layers' 512-token window is saved (POST
    # .../save, then again on SIGTERM), read back by the next process and
    # continued: the same tokens and logprobs as the same session continued
    # without leaving memory
    d = tmp_path / "sessions"
    d.mkdir()
    args = ["--max-seqs", "2", "--window", "1024", "--session-dir", str(d)]
    prompt = "The river ran past the old mill and under the stone bridge. " * 50
    turn2 = " Then the rain came, and"
    s1 = Server(binary, gemma_model, args)
    try:
        for sid in ("g-ref", "g-live"):
            status, r = complete(s1, prompt, sid, max_tokens=8)
            assert status == 200, r
            assert r["session"]["tokens_seen"] > 512  # the local layers slid
        status, body = call(s1, "POST", "/v1/sessions/g-live/save")
        assert status == 200, body
        status, r = complete(s1, turn2, "g-ref", max_tokens=16)
        assert status == 200, r
        assert r["session"]["restored"] is False and r["session"]["created"] is False
        ref = continuation(r)
    finally:
        assert s1.stop() == 0, s1.log()
    data = (d / "g-live.snap").read_bytes()
    assert data[8:12] == (3).to_bytes(4, "little")  # the layout with local layers
    assert int.from_bytes(data[176:180], "little") == 6  # every sixth layer is global
    assert int.from_bytes(data[184:192], "little") == 512
    s2 = Server(binary, gemma_model, args)
    try:
        status, r = complete(s2, turn2, "g-live", max_tokens=16, session_create=False)
        assert status == 200, r
        assert r["session"]["restored"] is True
        assert continuation(r) == ref
    finally:
        assert s2.stop() == 0, s2.log()


def test_gemma_tokenize_puts_bos_first_when_asked(gemma):
    import json
    text = "The capital of France is"
    status, _, plain = gemma.post("/tokenize", json.dumps({"content": text}))
    assert status == 200
    status, _, added = gemma.post("/tokenize", json.dumps({"content": text, "add_special": True}))
    assert status == 200
    plain, added = json.loads(plain), json.loads(added)
    assert added["tokens"] == [2] + plain["tokens"]  # <bos>, which Gemma asks for
    # a completion's prompt is counted the same way (BOS + 5, as transformers has it)
    c = gemma.client().completions.create(model="smol", prompt=text, max_tokens=1)
    assert added["count"] == c.usage.prompt_tokens == 6


def test_gemma_session_that_gave_back_a_stop_string_continues_as_if_it_never_had_it(gemma):
    # past the local layers' window (their ring has wrapped), a turn that a
    # stop string ended gives its tokens back: the session then holds what
    # one cut by max_tokens just before the stop string holds, and the next
    # turns of the two agree token for token and logprob for logprob
    prompt = "The river ran past the old mill and under the stone bridge. " * 50
    turn2 = " Then the rain came, and"
    status, probe = call(gemma, "POST", "/v1/completions",
                         {"model": "smol", "prompt": prompt, "max_tokens": 16, "temperature": 0,
                          "logprobs": 1})
    assert status == 200, probe
    toks = probe["choices"][0]["logprobs"]["tokens"]
    text = "".join(toks)
    k = next(i for i in range(2, len(toks) - 1)
             if toks[i].startswith(" ") and len(toks[i]) > 1 and toks[i + 1].strip()
             and text.find(toks[i] + toks[i + 1]) == len("".join(toks[:i])))
    try:
        status, a = complete(gemma, prompt, "g-stop", max_tokens=16, stop=[toks[k] + toks[k + 1]])
        assert status == 200, a
        status, b = complete(gemma, prompt, "g-cut", max_tokens=k)
        assert status == 200, b
        assert a["choices"][0]["text"] == b["choices"][0]["text"] == "".join(toks[:k])
        assert a["choices"][0]["finish_reason"] == "stop"
        assert a["session"]["tokens_seen"] == b["session"]["tokens_seen"] > 512
        status, a2 = complete(gemma, turn2, "g-stop", max_tokens=16)
        assert status == 200, a2
        status, b2 = complete(gemma, turn2, "g-cut", max_tokens=16)
        assert status == 200, b2
        assert continuation(a2) == continuation(b2)
    finally:
        for sid in ("g-stop", "g-cut"):
            call(gemma, "DELETE", f"/v1/sessions/{sid}")


def test_gemma_echo_gives_the_prompt_back_with_bos_left_out(gemma):
    c = gemma.client()
    r = c.completions.create(model="smol", prompt="The capital of France is", max_tokens=0,
                             echo=True, logprobs=1)
    e = r.choices[0]
    assert e.text == "The capital of France is"
    assert r.usage.prompt_tokens == 6  # BOS + 5: BOS is fed, not echoed
    assert len(e.logprobs.tokens) == 5 and "".join(e.logprobs.tokens) == e.text
    # the first token is scored after BOS
    assert all(isinstance(x, float) for x in e.logprobs.token_logprobs)


def test_echo_leaves_out_a_sentencepiece_space_prefix(binary, gemma_model, tmp_path):
    """Gemma's tokenizer adds no space prefix; a copy of the file that says
    it does (tokenizer.ggml.add_space_prefix true: Llama 2's, Mistral's)
    encodes a text with a space in front, which its tokens decode to. The
    echo gives the text as sent, and its offsets count from the text."""
    data = bytearray(open(gemma_model, "rb").read())
    key = b"tokenizer.ggml.add_space_prefix"
    at = data.index(key) + len(key)
    assert data[at:at + 4] == (7).to_bytes(4, "little") and data[at + 4] == 0  # a bool, false
    data[at + 4] = 1
    copy = tmp_path / "gemma-space-prefix.gguf"
    copy.write_bytes(data)
    del data
    s = Server(binary, str(copy), ["--max-seqs", "1", "--window", "256",
                                   "--chat-template", "gemma"])
    try:
        text = "Hello world, it is sunny"
        status, _, raw = s.post("/tokenize", json.dumps({"content": text, "with_pieces": True}))
        assert status == 200
        pieces = [t["piece"] for t in json.loads(raw)["tokens"]]
        assert "".join(pieces) == " " + text  # the prefix is there
        status, _, raw = s.post("/v1/completions", json.dumps(
            {"model": "smol", "prompt": text, "max_tokens": 0, "echo": True, "logprobs": 0}))
        assert status == 200, raw
        ch = json.loads(raw)["choices"][0]
        assert ch["text"] == text
        lp = ch["logprobs"]
        assert lp["tokens"][0].startswith(" ")  # the token's own text
        assert lp["text_offset"][0] == 0 and lp["text_offset"][1] == len(lp["tokens"][0]) - 1
        # token ids are what they are: nothing is left out of their text
        ids = json.loads(s.post("/tokenize", json.dumps({"content": text}))[2])["tokens"]
        status, _, raw = s.post("/v1/completions", json.dumps(
            {"model": "smol", "prompt": ids, "max_tokens": 0, "echo": True}))
        assert json.loads(raw)["choices"][0]["text"] == " " + text
    finally:
        assert s.stop() == 0, s.log()
