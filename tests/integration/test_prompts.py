"""A list of prompts in one completion, through the official openai client.

The reference for each choice is a request of its prompt alone: choice
p * n + j answers prompt p with seed + j, so its text must equal what a
request of prompt p with n = 1 and that seed answers (batch invariance
makes the runs' tokens the same). The usage counts each prompt once and
every choice's tokens; a stream names each chunk's choice; what cannot be
served is a 400 naming the prompt, or the item of the list at fault.
"""

import json

import openai
import pytest

PROMPTS = ["Once upon a time, in a small village,", "The capital of France is",
           "def fibonacci(n):"]


def test_each_choice_answers_its_prompt_as_a_request_of_one(client):
    r = client.completions.create(model="smol", prompt=PROMPTS, max_tokens=16, temperature=1.0,
                                  seed=21, n=2)
    assert [c.index for c in r.choices] == list(range(6))
    singles = [client.completions.create(model="smol", prompt=PROMPTS[k // 2], max_tokens=16,
                                         temperature=1.0, seed=21 + k % 2) for k in range(6)]
    for c, one in zip(r.choices, singles):
        assert c.text == one.choices[0].text
        assert c.finish_reason == one.choices[0].finish_reason
    assert len({c.text for c in r.choices}) > 3  # other prompts, other seeds: other answers
    assert r.usage.prompt_tokens == sum(singles[k].usage.prompt_tokens for k in (0, 2, 4))
    assert r.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_token_id_prompts_and_echo(server, client):
    ids = []
    for p in PROMPTS[:2]:
        status, _, raw = server.post("/tokenize", json.dumps({"content": p}))
        assert status == 200, raw
        ids.append(json.loads(raw)["tokens"])
    r = client.completions.create(model="smol", prompt=ids, max_tokens=6, temperature=0,
                                  echo=True, logprobs=1)
    assert len(r.choices) == 2
    for c, p, toks in zip(r.choices, PROMPTS, ids):
        one = client.completions.create(model="smol", prompt=toks, max_tokens=6, temperature=0,
                                        echo=True, logprobs=1)
        assert c.text == one.choices[0].text
        assert c.text.startswith(p)
        assert c.logprobs.token_logprobs == one.choices[0].logprobs.token_logprobs
    assert r.usage.prompt_tokens == len(ids[0]) + len(ids[1])


def test_a_stream_names_each_prompt_s_choices(client):
    kw = dict(model="smol", prompt=PROMPTS, max_tokens=12, temperature=0.7, seed=4, n=2)
    whole = client.completions.create(**kw)
    text, finish, usage = {}, {}, None
    for chunk in client.completions.create(stream=True, stream_options={"include_usage": True},
                                           **kw):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text[c.index] = text.get(c.index, "") + c.text
            if c.finish_reason is not None:
                assert c.index not in finish  # each choice ends once
                finish[c.index] = c.finish_reason
    assert sorted(finish) == list(range(6))
    assert [text[i] for i in range(6)] == [c.text for c in whole.choices]
    assert usage is not None and usage.prompt_tokens == whole.usage.prompt_tokens
    assert usage.completion_tokens == whole.usage.completion_tokens


@pytest.mark.parametrize("prompt, extra, param, what", [
    (["a", [5, 6]], {}, "prompt[1]", "a string"),
    ([[5, 6], []], {}, "prompt[1]", "non-empty"),
    (["a", "b", "c"], {"n": 3}, "prompt", "--max-seqs"),  # 9 sequences; the server runs 8
    (["a"] * 9, {}, "prompt", "--max-seqs"),
    (["a", "b"], {"session_id": "prompts-s1"}, "prompt", "session"),
])
def test_what_cannot_be_served_is_a_400_naming_the_prompt(client, prompt, extra, param, what):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="smol", prompt=prompt, max_tokens=4, extra_body=extra)
    err = e.value.body
    assert err["param"] == param, err
    assert what in err["message"], err


def test_a_prompt_over_the_limit_is_named_by_its_place(start_server):
    s = start_server("--max-prompt", "24")
    c = s.client()
    long_text = "one two three four five six seven eight nine ten " * 4
    for prompt, param in [(["hi", "hello", long_text], "prompt[2]"),
                          ([[1, 2], list(range(100, 130)), [3]], "prompt[1]"),
                          ([long_text, "hi"], "prompt[0]")]:
        with pytest.raises(openai.BadRequestError) as e:
            c.completions.create(model="smol", prompt=prompt, max_tokens=4)
        err = e.value.body
        assert err["param"] == param and err["code"] == "context_length_exceeded", err
    r = c.completions.create(model="smol", prompt=["hi", "hello"], max_tokens=2)
    assert len(r.choices) == 2  # the server still serves


def test_evictions_are_counted_under_the_policy_that_made_them(start_server):
    # kv_evicted_tokens_total{policy} named the server's default policy
    # whatever the request's: a researcher comparing policies read one series
    s = start_server("--window", "64")  # the default: sinks:4
    long = " ".join(["river"] * 120)
    counts = {}
    for pol in ("window", "sinks:8"):
        status, _, body = s.post("/v1/completions", json.dumps(
            {"model": "smol", "prompt": long, "max_tokens": 4, "kv_policy": pol,
             "temperature": 0, "ignore_eos": True}))
        assert status == 200, body
        counts[pol] = json.loads(body)["usage"]["prompt_tokens"] + 4 - 1
    m = s.metrics()
    name = "streamsink_kv_evicted_tokens_total"
    # a window of 64 keeps the last 64 positions (a sinks policy its sinks too)
    assert m[name + '{policy="window"}'] == counts["window"] - 64
    assert m[name + '{policy="sinks:8"}'] == counts["sinks:8"] - 64 - 8
    assert m[name + '{policy="sinks:4"}'] == 0  # the default's series, though none used it
