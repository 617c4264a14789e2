"""response_format {"type": "json_object"}: the answer is one JSON object,
through the official openai client, on chat and on completions.

Python's json module (strict: no NaN or Infinity) is the reference: every
answer that ends with finish_reason "stop" must load as a dict. The same
prompts without response_format show that the grammar is what makes them
JSON (SmolLM2 fences its JSON in Markdown, or answers in prose). Sampled
answers at temperature 1 parse too, a stream equals the whole answer, the
log-probs still describe the tokens sent, and a schema is refused by name.
"""

import json

import pytest

CAT = "Describe a cat as JSON with keys name, age and color."
FRANCE = "What is the capital of France?"
NUMBERS = "Write a JSON object with the key numbers holding the numbers from 1 to 100."


def strict_object(text):
    def no_constant(name):
        raise ValueError(name)

    try:
        v = json.loads(text, parse_constant=no_constant)
    except ValueError:
        return None
    return v if isinstance(v, dict) else None


def chat(client, content, **kw):
    return client.chat.completions.create(model="smol",
                                          messages=[{"role": "user", "content": content}], **kw)


@pytest.mark.parametrize("prompt", [CAT, FRANCE])
def test_a_json_object_answer_parses_where_the_plain_one_does_not(client, prompt):
    plain = chat(client, prompt, max_tokens=200, temperature=0)
    assert strict_object(plain.choices[0].message.content) is None
    r = chat(client, prompt, max_tokens=200, temperature=0,
             response_format={"type": "json_object"})
    c = r.choices[0]
    assert c.finish_reason == "stop"
    assert strict_object(c.message.content) is not None, c.message.content
    # the answer ends at the object's close: nothing but whitespace after it
    assert c.message.content.rstrip().endswith("}")


def test_sampled_json_answers_parse(client):
    stopped = 0
    for seed in range(6):
        r = chat(client, CAT, max_tokens=256, temperature=1.0, seed=seed,
                 response_format={"type": "json_object"})
        c = r.choices[0]
        text = c.message.content
        assert text.lstrip().startswith("{"), text
        if c.finish_reason == "stop":
            stopped += 1
            assert strict_object(text) is not None, text
        else:
            assert c.finish_reason == "length" and r.usage.completion_tokens == 256
    assert stopped >= 4


def test_a_streamed_json_answer_equals_the_whole_one(client):
    kw = dict(max_tokens=128, temperature=0.8, seed=7, response_format={"type": "json_object"})
    whole = chat(client, CAT, **kw).choices[0]
    parts, finish = [], None
    for ch in chat(client, CAT, stream=True, **kw):
        if ch.choices:
            parts.append(ch.choices[0].delta.content or "")
            finish = ch.choices[0].finish_reason or finish
    assert "".join(parts) == whole.message.content
    assert finish == whole.finish_reason


def test_json_object_on_completions(client):
    r = client.completions.create(model="smol", prompt='A dog as a JSON object with keys "name" and "age":\n',
                                  max_tokens=200, temperature=0,
                                  extra_body={"response_format": {"type": "json_object"}})
    c = r.choices[0]
    assert c.finish_reason == "stop"
    assert strict_object(c.text) is not None, c.text


def test_logprobs_describe_the_tokens_sent(client):
    r = chat(client, CAT, max_tokens=200, temperature=0, logprobs=True, top_logprobs=3,
             response_format={"type": "json_object"})
    c = r.choices[0]
    items = c.logprobs.content
    assert "".join(i.token for i in items) == c.message.content
    assert len(items) == r.usage.completion_tokens
    for i in items:
        assert i.logprob <= 0
        # the model's own distribution: the token sent is among the model's
        # alternatives or below them, never above its own best
        assert i.logprob <= i.top_logprobs[0].logprob + 1e-6


@pytest.mark.parametrize("fmt", [
    {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
    {"type": "yaml"},
    "json_object",
])
def test_other_formats_are_refused_by_name(server, fmt):
    body = {"model": "smol", "messages": [{"role": "user", "content": "hi"}],
            "response_format": fmt}
    status, _, raw = server.post("/v1/chat/completions", json.dumps(body))
    assert status == 400
    assert json.loads(raw)["error"]["param"] == "response_format"


def test_a_json_turn_on_a_session_is_closed_as_any_turn(client, server):
    """The answer ends at the object's close, with no end-of-generation
    token: the next turn on the session must still see the assistant turn
    ended as the template ends it, so it answers what one stateless request
    with the history answers."""
    q1 = [{"role": "user", "content": CAT}]
    q2 = [{"role": "user", "content": "Now tell me about its favourite food."}]
    fmt = {"type": "json_object"}
    s1 = chat(client, CAT, max_tokens=200, temperature=0, response_format=fmt,
              extra_body={"session_id": "json-turns"})
    alone1 = chat(client, CAT, max_tokens=200, temperature=0, response_format=fmt)
    a1 = s1.choices[0].message.content
    assert a1 == alone1.choices[0].message.content and s1.choices[0].finish_reason == "stop"
    s2 = client.chat.completions.create(model="smol", messages=q2, max_tokens=24,
                                        temperature=0, extra_body={"session_id": "json-turns"})
    alone2 = client.chat.completions.create(
        model="smol", messages=q1 + [{"role": "assistant", "content": a1}] + q2,
        max_tokens=24, temperature=0)
    assert s2.choices[0].message.content == alone2.choices[0].message.content
    status, _, raw = server.get("/v1/sessions/json-turns")
    assert status == 200
    assert json.loads(raw)["tokens_seen"] == \
        alone2.usage.prompt_tokens + alone2.usage.completion_tokens


def test_the_mask_s_shortcuts_allow_what_reading_every_token_allows(start_server, monkeypatch):
    """The mask rules most tokens out before reading them (plain string text
    inside a string, the first byte, leading whitespace). A server that
    reads every token (STREAMSINK_JSON_MASK=read) must sample the very same
    answers from the same seeds: any token the shortcuts allowed or refused
    wrongly would change the distribution, and so the tokens, somewhere."""
    answers = []
    for mode in (None, "read"):
        if mode:
            monkeypatch.setenv("STREAMSINK_JSON_MASK", mode)
        else:
            monkeypatch.delenv("STREAMSINK_JSON_MASK", raising=False)
        c = start_server().client()
        got = []
        for seed, prompt in enumerate([CAT, FRANCE, NUMBERS, CAT, NUMBERS, FRANCE]):
            r = chat(c, prompt, max_tokens=160, temperature=1.3, top_p=1.0, seed=seed,
                     logprobs=True, response_format={"type": "json_object"})
            got.append([(i.token, i.logprob) for i in r.choices[0].logprobs.content])
        answers.append(got)
    assert answers[0] == answers[1]
    assert sum(len(a) for a in answers[0]) > 400
