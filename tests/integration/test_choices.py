"""n: several choices for one prompt, through the official openai client.

The reference for each choice is a request of one choice: choice i samples
with seed + i, so its text must equal what the same request with n = 1 and
that seed answers (batch invariance makes the two runs' tokens the same).
The usage counts the prompt once and every choice's tokens; a stream names
each chunk's choice and ends each choice once; --max-response bounds all the
choices of a whole answer together; what cannot be served is a 400 naming n.
"""

import json

import openai
import pytest

from conftest import ENDLESS_CHAT, Server

PROMPT = "Once upon a time, in a small village,"
CHAT = [{"role": "user", "content": "Tell me about cats."}]


def test_each_choice_is_the_request_of_one_with_its_seed(client):
    r = client.completions.create(model="smol", prompt=PROMPT, max_tokens=24, temperature=1.0,
                                  seed=11, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    singles = [client.completions.create(model="smol", prompt=PROMPT, max_tokens=24,
                                         temperature=1.0, seed=11 + i) for i in range(3)]
    for c, one in zip(r.choices, singles):
        assert c.text == one.choices[0].text
        assert c.finish_reason == one.choices[0].finish_reason
    assert len({c.text for c in r.choices}) > 1  # the seeds sample different answers
    assert r.usage.prompt_tokens == singles[0].usage.prompt_tokens
    assert r.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_a_chat_stream_names_each_choice_and_equals_the_whole_answer(client):
    kw = dict(model="smol", messages=CHAT, max_tokens=32, temperature=0.8, seed=5, n=2)
    whole = client.chat.completions.create(**kw)
    text, finish, roles = {}, {}, {}
    usage = None
    for chunk in client.chat.completions.create(stream=True,
                                                stream_options={"include_usage": True}, **kw):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.role:
                roles[c.index] = roles.get(c.index, 0) + 1
            text[c.index] = text.get(c.index, "") + (c.delta.content or "")
            if c.finish_reason is not None:
                assert c.index not in finish  # each choice ends once
                finish[c.index] = c.finish_reason
    assert roles == {0: 1, 1: 1}
    assert [text[i] for i in range(2)] == [c.message.content for c in whole.choices]
    assert [finish[i] for i in range(2)] == [c.finish_reason for c in whole.choices]
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens


def test_each_choice_has_the_logprobs_of_its_own_tokens(client):
    r = client.chat.completions.create(model="smol", messages=CHAT, max_tokens=16,
                                       temperature=1.0, seed=3, n=2, logprobs=True,
                                       top_logprobs=2)
    total = 0
    for c in r.choices:
        items = c.logprobs.content
        assert b"".join(bytes(it.bytes) for it in items) == c.message.content.encode()
        assert all(len(it.top_logprobs) == 2 for it in items)
        total += len(items)
    assert r.usage.completion_tokens == total


def test_greedy_choices_are_the_same_answer(client):
    r = client.completions.create(model="smol", prompt=PROMPT, max_tokens=12, temperature=0,
                                  n=4)
    one = client.completions.create(model="smol", prompt=PROMPT, max_tokens=12, temperature=0)
    assert [c.text for c in r.choices] == [one.choices[0].text] * 4


@pytest.mark.parametrize("extra, what", [
    ({"n": 0}, "1 to 128"),
    ({"n": 129}, "1 to 128"),
    ({"n": 9}, "--max-seqs"),  # the module's server runs 8 at once
    ({"n": 2, "session_id": "choices-s1"}, "session"),
])
def test_what_cannot_be_served_is_a_400_naming_n(client, extra, what):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="smol", prompt=PROMPT, max_tokens=4, extra_body=extra)
    err = e.value.body
    assert err["param"] == "n"
    assert what in err["message"]


def test_more_choices_than_free_slots_wait_and_are_served(start_server):
    s = start_server("--max-seqs", "2", "--max-queue", "4")
    c = s.client()
    r = c.completions.create(model="smol", prompt=PROMPT, max_tokens=8, temperature=1.0,
                             seed=1, n=2)
    assert len(r.choices) == 2 and all(ch.finish_reason == "length" for ch in r.choices)


MAX_RESPONSE = 8192


def test_max_response_bounds_all_choices_together(binary, model):
    s = Server(binary, model, ["--max-response", str(MAX_RESPONSE), "--max-seqs", "4"])
    try:
        status, _, raw = s.post("/v1/chat/completions", json.dumps({
            "model": "smol", "messages": ENDLESS_CHAT, "max_tokens": 200, "temperature": 0,
            "n": 3, "logprobs": True, "top_logprobs": 20}))
        assert status == 200, raw[:300]
        assert len(raw) <= MAX_RESPONSE + 2048, len(raw)
        j = json.loads(raw)
        held = 0
        for ch in j["choices"]:
            assert ch["finish_reason"] == "length"
            content = ch["logprobs"]["content"]
            assert b"".join(bytes(it["bytes"]) for it in content) == \
                ch["message"]["content"].encode()
            held += len(content)
        # usage counts the tokens the answers hold, not those made after the bound
        assert j["usage"]["completion_tokens"] == held, j["usage"]
    finally:
        assert s.stop() == 0, s.log()
