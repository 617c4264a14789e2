"""POST /v1/completions through the official openai client: greedy output equal
to `streamsink run`, streamed == whole, max_tokens -> length, stop sequences,
seed determinism, logprobs (text_offset after bytes that are not UTF-8
too), usage, token-array prompts, /v1/models, and the
text of control tokens left out unless skip_special_tokens is false,
ignore_eos and logit_bias."""

import codecs
import json

import pytest

from conftest import run_cli

PROMPT = "The capital of France is"


def test_greedy_completion_equals_streamsink_run(binary, model, client):
    r = client.completions.create(model="smol", prompt=PROMPT, max_tokens=16, temperature=0)
    assert r.object == "text_completion"
    assert r.id.startswith("cmpl-")
    c = r.choices[0]
    assert c.index == 0
    assert r.usage.completion_tokens <= 16
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    expected = run_cli(binary, model, PROMPT, 16)
    assert c.text == expected


def test_streamed_completion_concatenates_to_the_whole_one(client):
    whole = client.completions.create(model="smol", prompt=PROMPT, max_tokens=12, temperature=0)
    chunks = list(client.completions.create(model="smol", prompt=PROMPT, max_tokens=12,
                                            temperature=0, stream=True))
    assert chunks, "no chunks"
    assert all(ch.object == "text_completion" for ch in chunks)
    assert len({ch.id for ch in chunks}) == 1
    text = "".join(ch.choices[0].text for ch in chunks)
    assert text == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert all(ch.choices[0].finish_reason is None for ch in chunks[:-1])


def test_max_tokens_gives_finish_reason_length(client):
    r = client.completions.create(model="smol", prompt="Count: 1, 2, 3,", max_tokens=5,
                                  temperature=0)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 5


def test_stop_sequence_ends_the_text_before_it_and_never_leaks(client):
    base = client.completions.create(model="smol", prompt=PROMPT, max_tokens=16,
                                     temperature=0).choices[0].text
    assert len(base) > 6
    # a stop string that straddles token boundaries, from the middle of the greedy text
    stop = base[3:7]
    cut = base[:base.index(stop)]
    r = client.completions.create(model="smol", prompt=PROMPT, max_tokens=16, temperature=0,
                                  stop=[stop, "never-appears"])
    assert r.choices[0].text == cut
    assert r.choices[0].finish_reason == "stop"
    chunks = list(client.completions.create(model="smol", prompt=PROMPT, max_tokens=16,
                                            temperature=0, stop=stop, stream=True))
    streamed = "".join(ch.choices[0].text for ch in chunks)
    assert streamed == cut
    assert stop not in streamed
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_same_seed_same_text(client):
    kw = dict(model="smol", prompt="Once upon a time", max_tokens=12, temperature=1.0, seed=1234)
    a = client.completions.create(**kw).choices[0].text
    b = client.completions.create(**kw).choices[0].text
    assert a == b


def test_completion_logprobs_have_the_legacy_shape(client):
    r = client.completions.create(model="smol", prompt=PROMPT, max_tokens=6, temperature=0,
                                  logprobs=3)
    lp = r.choices[0].logprobs
    n = r.usage.completion_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(
        lp.text_offset) == n
    assert all(x <= 0 for x in lp.token_logprobs)
    assert all(len(t) == 3 for t in lp.top_logprobs)
    assert lp.text_offset == sorted(lp.text_offset)
    assert "".join(lp.tokens) == r.choices[0].text
    # greedy: the chosen token is the most likely one
    for tok, alts in zip(lp.tokens, lp.top_logprobs):
        assert max(alts, key=alts.get) == tok


@pytest.mark.parametrize("prompt", [
    "La crème brûlée est un dessert français. Le café",
    "日本語の文章: 東京は",
])
def test_text_offset_counts_characters_as_a_python_str_does(client, prompt):
    # text_offset is an index into the text as the client holds it (a str of
    # code points, as vLLM counts), so each token is found where it says,
    # after characters of two and three bytes. A token that is part of a
    # character (its string holds U+FFFD) is not in the text as such.
    kw = dict(model="smol", prompt=prompt, max_tokens=16, temperature=0, logprobs=1)
    c = client.completions.create(**kw).choices[0]
    text, lp = c.text, c.logprobs
    assert not text.isascii()
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[-1] <= len(text)
    whole = [(t, o) for t, o in zip(lp.tokens, lp.text_offset) if "\ufffd" not in t]
    assert any(not t.isascii() for t, _ in whole)
    for t, o in whole:
        assert text[o:o + len(t)] == t, (t, o, text)
    streamed = [o for ch in client.completions.create(stream=True, **kw)
                if ch.choices and ch.choices[0].logprobs
                for o in ch.choices[0].logprobs.text_offset]
    assert streamed == lp.text_offset


def token_bytes(model):
    """Each token's bytes by id, from the GGUF's token texts (read with the
    gguf package) mapped back through GPT-2's byte-level alphabet
    (bytes_to_unicode), independently of the server's tokenizer."""
    bs = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + len(cs) - 188)
    byte_of = {chr(c): b for b, c in zip(bs, cs)}
    return {k: bytes(byte_of[ch] for ch in text) for text, k in vocabulary(model).items()
            if all(ch in byte_of for ch in text)}


def python_offsets(pieces):
    """The text of the tokens whose bytes are pieces, as Python decodes UTF-8
    with errors="replace" (a maximal subpart that is not UTF-8 is one U+FFFD),
    where each token's text starts in it, and whether it starts a character
    there. A token whose first byte starts a character or a U+FFFD (decoding
    the bytes before it and from it apart gives the same text) starts after
    everything before it; one whose first byte is inside a character begun
    before it starts where that character does."""
    text = b"".join(pieces).decode("utf-8", "replace")
    offsets, starts = [], []
    for i in range(len(pieces) + 1):
        before, after = b"".join(pieces[:i]), b"".join(pieces[i:])
        head = before.decode("utf-8", "replace")
        starts.append(head + after.decode("utf-8", "replace") == text)
        if not starts[-1]:
            head = codecs.getincrementaldecoder("utf-8")("replace").decode(before)
        offsets.append(len(head))
    return text, offsets[:-1], starts


def check_offsets(text, offsets, pieces):
    """text_offset as docs/serving.md has it: Python's offsets, and
    text[text_offset[i]:] starts with token i's text where that text is
    characters of its own (it starts one and the next token starts another)."""
    want_text, want, starts = python_offsets(pieces)
    assert text == want_text
    assert offsets == want, (offsets, want)
    for i, (o, p) in enumerate(zip(offsets, pieces)):
        if starts[i] and starts[i + 1]:
            assert text[o:].startswith(p.decode("utf-8", "replace")), (i, o, p, text)


def check_stream_offsets(chunks, text, offsets):
    """A stream is the whole answer in pieces: each token's logprobs come on
    a chunk whose text_offset is the characters sent before it."""
    sent, got = "", []
    for ch in chunks:
        c = ch.choices[0]
        if c.logprobs:
            assert c.logprobs.text_offset == [len(sent)] * len(c.logprobs.text_offset)
            got += c.logprobs.text_offset
        sent += c.text
    assert sent == text
    assert got == offsets


BROKEN = 10813  # SmolLM2: the bytes F0 9F, the start of a 4-byte character


def test_text_offset_after_bytes_that_never_make_a_character(model, client):
    # each F0 9F is made a U+FFFD by the next token's first byte: the offset
    # of that next token is after it, not on it
    pieces = [token_bytes(model)[BROKEN]] * 3
    assert pieces[0] == b"\xf0\x9f"
    kw = dict(model="smol", prompt="Hi", max_tokens=3, temperature=0, logprobs=1,
              logit_bias={str(BROKEN): 100})
    c = client.completions.create(**kw).choices[0]
    assert c.text == "\ufffd" * 3
    check_offsets(c.text, c.logprobs.text_offset, pieces)
    check_stream_offsets(list(client.completions.create(stream=True, **kw)), c.text,
                         c.logprobs.text_offset)
    # with a stop string the logprobs wait for their tokens' text: the same offsets
    s = client.completions.create(stop=["never-appears"], **kw).choices[0]
    assert s.logprobs.text_offset == c.logprobs.text_offset
    check_stream_offsets(list(client.completions.create(stream=True, stop=["never-appears"],
                                                        **kw)), c.text, c.logprobs.text_offset)
    # chat: each token's logprobs keep its own bytes, the text reads the same
    chat = list(client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "Hi"}], max_tokens=3,
        temperature=0, logprobs=True, logit_bias={str(BROKEN): 100}, stream=True))
    lp = [t for ch in chat if ch.choices and ch.choices[0].logprobs
          for t in ch.choices[0].logprobs.content]
    assert [bytes(t.bytes) for t in lp] == pieces
    assert "".join(ch.choices[0].delta.content or "" for ch in chat if ch.choices) == c.text


def test_echoed_text_offsets_around_broken_and_split_characters(model, client):
    by_bytes = {v: k for k, v in token_bytes(model).items()}
    pieces = [b"A", b"\xf0\x9f", b"B", b"\xf0\x9f", b"\xf0\x9f",  # broken by a token
              b"\xf0", b"\x9f", b"\x98", b"\x80",  # U+1F600 in four tokens
              b"\xf0", b"\x9f", b"C",  # broken across tokens, then by the next
              b"\xe0", b"\x80",  # E0 needs A0..BF next: two U+FFFD
              b"\xc3", b"\xa9", b"\xf0\x9f"]  # é in two tokens; a tail left at the end
    ids = [by_bytes[p] for p in pieces]
    kw = dict(model="smol", prompt=ids, max_tokens=0, echo=True, logprobs=1)
    c = client.completions.create(**kw).choices[0]
    check_offsets(c.text, c.logprobs.text_offset, pieces)
    check_stream_offsets(list(client.completions.create(stream=True, **kw)), c.text,
                         c.logprobs.text_offset)


def control_token_texts(model):
    """The texts of the GGUF's CONTROL tokens (token_type 3), read with the
    gguf package, independently of the server's tokenizer."""
    from gguf import GGUFReader
    r = GGUFReader(model)
    tt, toks = r.fields["tokenizer.ggml.token_type"], r.fields["tokenizer.ggml.tokens"]
    return {bytes(toks.parts[toks.data[i]]).decode() for i, k in enumerate(tt.data)
            if int(tt.parts[k][0]) == 3}


# After a closed user turn, greedy SmolLM2 opens the assistant's turn with
# <|im_start|> (a control token) before its answer.
OPEN_TURN = "<|im_start|>user\nSay hi.<|im_end|>\n"


def test_control_tokens_text_is_left_out_unless_asked(binary, model, client):
    controls = control_token_texts(model)
    assert "<|im_start|>" in controls and len(controls) == 17
    kw = dict(model="smol", prompt=OPEN_TURN, max_tokens=10, temperature=0, logprobs=1)
    shown = client.completions.create(extra_body={"skip_special_tokens": False}, **kw)
    hidden = client.completions.create(**kw)
    raw, lp = shown.choices[0].text, shown.choices[0].logprobs
    assert lp.tokens[0] == "<|im_start|>", lp.tokens  # the case this test is about
    assert raw == "".join(lp.tokens)
    # the same tokens, logprobs and count; only the control tokens' text is gone
    assert hidden.choices[0].logprobs.tokens == lp.tokens
    assert hidden.choices[0].logprobs.token_logprobs == lp.token_logprobs
    assert hidden.usage.completion_tokens == shown.usage.completion_tokens
    text = hidden.choices[0].text
    assert text == "".join(t for t in lp.tokens if t not in controls)
    assert text.startswith("assistant\n") and "<|" not in text
    assert text == run_cli(binary, model, OPEN_TURN, 10)  # `run` leaves them out too
    streamed = "".join(ch.choices[0].text for ch in client.completions.create(
        model="smol", prompt=OPEN_TURN, max_tokens=10, temperature=0, stream=True))
    assert streamed == text


def test_a_hidden_control_token_just_before_a_stop_string_keeps_its_logprobs(client):
    kw = dict(model="smol", prompt=OPEN_TURN, max_tokens=10, temperature=0, logprobs=1,
              stop=["assistant"])
    for skip, text in ((True, ""), (False, "<|im_start|>")):
        c = client.completions.create(extra_body={"skip_special_tokens": skip}, **kw).choices[0]
        assert c.finish_reason == "stop"
        assert c.text == text
        assert c.logprobs.tokens == ["<|im_start|>"], (skip, c.logprobs.tokens)
        assert c.logprobs.text_offset == [0]


def vocabulary(model):
    """Token id by its text as the GGUF stores it (byte-level: a space is
    'Ġ'), read with the gguf package."""
    from gguf import GGUFReader
    toks = GGUFReader(model).fields["tokenizer.ggml.tokens"]
    return {bytes(toks.parts[i]).decode(): k for k, i in enumerate(toks.data)}


def test_logit_bias_steers_the_pick_but_not_the_logprobs(model, client):
    ids = vocabulary(model)
    kw = dict(model="smol", prompt=PROMPT, max_tokens=3, temperature=0, logprobs=2)
    plain = client.completions.create(**kw).choices[0].logprobs
    first, alts = plain.tokens[0], plain.top_logprobs[0]
    second = min(alts, key=alts.get)  # the runner-up of the top two
    assert second != first
    ban = {str(ids[first.replace(" ", "\u0120")]): -100}
    banned = client.completions.create(logit_bias=ban, **kw).choices[0].logprobs
    assert banned.tokens[0] == second
    # logprobs are the model's: the runner-up's own, the banned token still listed
    assert banned.token_logprobs[0] == pytest.approx(alts[second], abs=1e-5)
    assert banned.top_logprobs[0] == pytest.approx(alts, abs=1e-5)
    force = {str(ids["\u0120the"]): 100}
    forced = client.completions.create(model="smol", prompt=PROMPT, max_tokens=5,
                                       temperature=1, seed=3, logit_bias=force)
    assert forced.choices[0].text == " the" * 5
    chat = client.chat.completions.create(model="smol", messages=[{"role": "user",
                                                                   "content": "Hi"}],
                                          max_tokens=4, temperature=0, logit_bias=force)
    assert chat.choices[0].message.content == " the" * 4


@pytest.mark.parametrize("name", ["skip_special_tokens", "ignore_eos"])
def test_boolean_extensions_must_be_booleans(server, name):
    for path, body in (("/v1/completions", '{"prompt":"x","%s":"no"}' % name),
                       ("/v1/chat/completions", '{"messages":[{"role":"user","content":"x"}],'
                                                '"%s":1}' % name)):
        status, _, resp = server.post(path, body)
        assert status == 400, resp
        assert b'"param":"%s"' % name.encode() in resp


def test_ignore_eos_generates_past_the_end_of_the_answer(client):
    kw = dict(model="smol", messages=[{"role": "user", "content": "Say hi."}], temperature=0)
    plain = client.chat.completions.create(max_tokens=64, **kw)
    assert plain.choices[0].finish_reason == "stop"  # the model ended its turn
    n = plain.usage.completion_tokens + 6
    past = client.chat.completions.create(max_tokens=n, extra_body={"ignore_eos": True}, **kw)
    assert past.choices[0].finish_reason == "length"
    assert past.usage.completion_tokens == n
    shown = client.chat.completions.create(
        max_tokens=n, extra_body={"ignore_eos": True, "skip_special_tokens": False}, **kw)
    # greedy: the same answer, then the end-of-turn token (its text shown only
    # when asked), then more
    answer = plain.choices[0].message.content
    assert shown.choices[0].message.content.startswith(answer + "<|im_end|>")
    assert past.choices[0].message.content.startswith(answer)
    assert len(past.choices[0].message.content) > len(answer)


@pytest.mark.parametrize("extra", [{}, {"max_tokens": None},
                                   {"max_tokens": 8, "session_id": "ignore-eos-1"}])
def test_ignore_eos_needs_an_end_and_no_session(server, extra):
    # without max_tokens nothing would end it (the window evicts); on a
    # session what follows the answer would stay in its history
    body = {"prompt": "Hi", "ignore_eos": True, **extra}
    status, _, resp = server.post("/v1/completions", json.dumps(body))
    assert status == 400, resp
    assert b'"param":"ignore_eos"' in resp


def test_min_tokens_masks_the_end_of_the_answer_after_taking_its_logprobs(client):
    """min_tokens (vLLM's): the answer cannot end before that many tokens.
    Where greedy would pick the end-of-turn token, the logprobs still show
    it as the model's first choice (they are taken before the mask), and
    another token is picked; the answer before it is unchanged."""
    kw = dict(model="smol", messages=[{"role": "user", "content": "Say hi."}], temperature=0,
              logprobs=True, top_logprobs=5)
    plain = client.chat.completions.create(max_tokens=64, **kw)
    assert plain.choices[0].finish_reason == "stop"
    m = plain.usage.completion_tokens  # the last one is the end of the turn
    longer = client.chat.completions.create(max_tokens=64, extra_body={"min_tokens": m + 4}, **kw)
    assert longer.usage.completion_tokens >= m + 4
    lp = longer.choices[0].logprobs.content
    assert [t.token for t in lp[:m - 1]] == [t.token for t in plain.choices[0].logprobs.content]
    assert lp[m - 1].top_logprobs[0].token == "<|im_end|>"
    assert lp[m - 1].token != "<|im_end|>"
    # greedy picks the model's first choice that is not an end-of-generation token
    eog = {"<|im_end|>", "<|endoftext|>"}
    assert lp[m - 1].token == next(t.token for t in lp[m - 1].top_logprobs if t.token not in eog)
    assert longer.choices[0].message.content.startswith(plain.choices[0].message.content)
    # past the first min_tokens tokens it may end (vLLM counts the same way:
    # the end-of-turn token is the m-th)
    exact = client.chat.completions.create(max_tokens=64, extra_body={"min_tokens": m - 1}, **kw)
    assert exact.choices[0].message.content == plain.choices[0].message.content
    assert exact.usage.completion_tokens == m


@pytest.mark.parametrize("min_tokens", [0, 3, 6])
def test_min_tokens_stop_strings_match_only_in_the_text_after_them(client, min_tokens):
    kw = dict(model="smol", prompt=PROMPT, max_tokens=16, temperature=0, logprobs=0)
    base = client.completions.create(**kw).choices[0]
    offs = base.logprobs.text_offset
    stop = base.logprobs.tokens[1]
    assert stop.strip() and base.text.find(stop) == offs[1] - offs[0]
    after = offs[min_tokens] - offs[0]
    at = base.text.find(stop, after)
    got = client.completions.create(stop=[stop], extra_body={"min_tokens": min_tokens},
                                    **kw).choices[0]
    assert got.text == (base.text[:at] if at >= 0 else base.text)
    assert got.finish_reason == ("stop" if at >= 0 else "length")


@pytest.mark.parametrize("body", [{"min_tokens": 9, "max_tokens": 8}, {"min_tokens": -1},
                                  {"min_tokens": "3"}, {"min_tokens": 10 ** 6},
                                  {"min_tokens": 10 ** 6, "max_tokens": None}])
def test_min_tokens_is_refused_when_it_cannot_be_met(server, body):
    status, _, resp = server.post("/v1/completions", json.dumps({"prompt": "Hi", **body}))
    assert status == 400, resp
    assert b'"param":"min_tokens"' in resp


def test_stop_sequence_s_tokens_have_no_logprobs_and_the_rest_keep_their_offsets(client):
    kw = dict(model="smol", prompt=PROMPT, max_tokens=16, temperature=0, logprobs=2)
    base = client.completions.create(**kw).choices[0]
    blp = base.logprobs
    assert "".join(blp.tokens) == base.text
    # a stop string from inside a token's text: that token keeps its logprobs
    # (its text starts before the cut), the tokens after it have none
    i = next(i for i in range(2, len(blp.tokens)) if len(blp.tokens[i]) >= 2)
    stop = base.text[blp.text_offset[i] + 1:blp.text_offset[i] + 5]
    cut = base.text.index(stop)
    k = sum(1 for o in blp.text_offset if o < cut)
    assert k < len(blp.tokens)
    r = client.completions.create(stop=stop, **kw).choices[0]
    assert r.text == base.text[:cut] and r.finish_reason == "stop"
    assert r.logprobs.tokens == blp.tokens[:k]
    assert r.logprobs.token_logprobs == blp.token_logprobs[:k]
    assert r.logprobs.top_logprobs == blp.top_logprobs[:k]
    assert r.logprobs.text_offset == blp.text_offset[:k]
    # streamed: each token's logprobs come on the chunk that starts its text
    chunks = list(client.completions.create(stop=stop, stream=True, **kw))
    seen, at = [], 0
    for ch in chunks:
        c = ch.choices[0]
        if c.logprobs is not None and c.logprobs.tokens:
            assert c.logprobs.text_offset == [at]
            assert c.text.startswith(c.logprobs.tokens[0][:len(c.text)])
            seen += c.logprobs.tokens
        at += len(c.text)
    assert seen == blp.tokens[:k]
    assert "".join(ch.choices[0].text for ch in chunks) == base.text[:cut]


def test_chat_stop_sequence_s_tokens_have_no_logprobs(client):
    kw = dict(model="smol", messages=[{"role": "user", "content": "Say something about the sea."}],
              max_tokens=24, temperature=0, logprobs=True, top_logprobs=1)
    base = client.chat.completions.create(**kw).choices[0]
    toks = [x.token for x in base.logprobs.content]
    assert "".join(toks) == base.message.content
    starts = [sum(len(t) for t in toks[:i]) for i in range(len(toks))]
    i = next(i for i in range(2, len(toks)) if len(toks[i]) >= 2)
    stop = base.message.content[starts[i]:starts[i] + 4]
    cut = base.message.content.index(stop)
    k = sum(1 for o in starts if o < cut)
    r = client.chat.completions.create(stop=[stop], **kw).choices[0]
    assert r.message.content == base.message.content[:cut] and r.finish_reason == "stop"
    assert [x.token for x in r.logprobs.content] == toks[:k]
    assert [x.logprob for x in r.logprobs.content] == [x.logprob for x in
                                                       base.logprobs.content[:k]]
    streamed = []
    for ch in client.chat.completions.create(stop=[stop], stream=True, **kw):
        if ch.choices and ch.choices[0].logprobs is not None:
            streamed += [x.token for x in ch.choices[0].logprobs.content]
    assert streamed == toks[:k]


def test_streamed_usage_comes_last_with_no_choices(client):
    chunks = list(client.completions.create(model="smol", prompt=PROMPT, max_tokens=4,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    last = chunks[-1]
    assert last.choices == []
    assert last.usage.completion_tokens == 4
    assert all(ch.usage is None for ch in chunks[:-1])


def test_token_id_prompt_is_accepted(client):
    r = client.completions.create(model="smol", prompt=[504, 3575, 282], max_tokens=3,
                                  temperature=0)
    assert r.usage.prompt_tokens == 3
    assert r.usage.completion_tokens >= 1


def test_models_lists_the_loaded_model(client):
    models = client.models.list()
    ids = [m.id for m in models.data]
    assert ids == ["SmolLM2-135M-Instruct.Q4_1"]
    assert client.models.retrieve(ids[0]).id == ids[0]


@pytest.mark.parametrize("n", [1])
def test_n_equal_one_is_fine(client, n):
    r = client.completions.create(model="smol", prompt=PROMPT, max_tokens=2, n=n, temperature=0)
    assert len(r.choices) == 1
