"""POST /v1/completions through the official openai client: greedy output equal
to `streamsink run`, streamed == whole, max_tokens -> length, stop sequences,
seed determinism, logprobs, usage, token-array prompts, /v1/models."""

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
