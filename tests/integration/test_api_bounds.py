"""What api/ promises about sizes and numbers, end to end:

- a non-streamed answer with logprobs stays within --max-response: its text
  plus its logprobs' JSON (before, --max-response bounded only the text, and
  20 alternatives a token held ~12.6 KB of server memory and sent ~1.3 KB
  until the answer ended); a stream is not cut by it (each frame is one
  token's worth, and nothing accumulates);
- a top_p that rounds to 0 as a float is greedy, as top_p 0 is;
- 64-bit integers are taken exactly, and an out-of-range number is quoted
  as sent.

Text holding U+0000 (SmolLM2's token 190 is the byte 0x00) goes out as
"\\u0000" (tests/unit/test_api_response.c); the model never picks that token
(not among the top 5 after prompts built from it, none in 4,500 tokens
sampled at temperature 2), so it is not checked here.
"""

import json

import pytest

from conftest import ENDLESS, ENDLESS_CHAT, Server

MAX_RESPONSE = 8192


@pytest.fixture(scope="module")
def small(binary, model):
    """A server whose non-streamed answers are bounded at 8 KiB."""
    s = Server(binary, model, ["--max-response", str(MAX_RESPONSE), "--max-seqs", "4"])
    yield s
    rc = s.stop()
    assert rc == 0, s.log()


def post_json(server, path, body):
    status, _, raw = server.post(path, json.dumps(body))
    return status, raw


def test_a_whole_chat_answer_with_top_logprobs_stays_within_max_response(small):
    status, raw = post_json(small, "/v1/chat/completions", {
        "model": "smol", "messages": ENDLESS_CHAT, "max_tokens": 200, "temperature": 0,
        "logprobs": True, "top_logprobs": 20})
    assert status == 200, raw[:300]
    # the text and the logprobs share the budget; the rest is the object's frame
    assert len(raw) <= MAX_RESPONSE + 1024, len(raw)
    j = json.loads(raw)
    ch = j["choices"][0]
    assert ch["finish_reason"] == "length"  # as --max-response ends an answer
    content = ch["logprobs"]["content"]
    assert len(content) >= 3
    # usage counts the tokens the answer holds, not those generated after it
    # was full (before: the refused token and any made before the cancel)
    assert j["usage"]["completion_tokens"] == len(content), j["usage"]
    assert j["usage"]["total_tokens"] == j["usage"]["prompt_tokens"] + len(content)
    assert all(len(it["top_logprobs"]) == 20 for it in content)
    # whole tokens only: the text is the tokens' bytes
    joined = b"".join(bytes(it["bytes"]) for it in content)
    assert joined == ch["message"]["content"].encode()


def test_a_whole_completion_with_logprobs_stays_within_max_response(small):
    status, raw = post_json(small, "/v1/completions", {
        "model": "smol", "prompt": ENDLESS, "max_tokens": 300, "temperature": 0,
        "logprobs": 5})
    assert status == 200, raw[:300]
    assert len(raw) <= MAX_RESPONSE + 1024, len(raw)
    j = json.loads(raw)
    ch = j["choices"][0]
    assert ch["finish_reason"] == "length"
    lp = ch["logprobs"]
    n = len(lp["tokens"])
    assert n >= 10
    assert len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == n
    assert "".join(lp["tokens"]) == ch["text"]
    assert j["usage"]["completion_tokens"] == n, j["usage"]


def test_a_stream_with_top_logprobs_is_not_cut_by_max_response(small):
    body = {"model": "smol", "messages": ENDLESS_CHAT, "max_tokens": 60, "temperature": 0,
            "logprobs": True, "top_logprobs": 20, "stream": True}
    status, _, raw = small.post("/v1/chat/completions", json.dumps(body))
    assert status == 200
    frames = [l[6:] for l in raw.split(b"\n") if l.startswith(b"data: ")]
    assert frames[-1] == b"[DONE]"
    chunks = [json.loads(f) for f in frames[:-1]]
    items = [i for c in chunks if c["choices"] and c["choices"][0]["logprobs"]
             for i in c["choices"][0]["logprobs"]["content"]]
    assert len(items) == 60  # ~80 KB of logprobs in all: ten times --max-response
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert max(len(f) for f in frames) < 4096  # one token's worth a frame


def test_a_top_p_that_rounds_to_zero_is_greedy(client):
    def text(**kw):
        r = client.completions.create(model="smol", prompt="The capital of France is",
                                      max_tokens=8, seed=5, **kw)
        return r.choices[0].text

    greedy = text(temperature=0)
    assert text(top_p=1e-46) == greedy  # 0.0 as a float: was a 400
    assert text(top_p=0) == greedy
    assert text(top_p=1e-40) == greedy  # a subnormal float: only the top token is kept


def test_max_tokens_may_be_int64_max(client):
    # greedy " Paris" starts with the stop string: the answer ends at once
    r = client.completions.create(model="smol", prompt="The capital of France is",
                                  max_tokens=2**63 - 1, temperature=0, stop=[" "])
    assert r.choices[0].finish_reason == "stop"
    r = client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "Hi"}],
                                       max_completion_tokens=2**63 - 1, temperature=0, stop=[" "])
    assert r.choices[0].finish_reason == "stop"


def test_seeds_a_double_cannot_tell_apart_are_distinct(client):
    def text(seed):
        r = client.completions.create(model="smol", prompt="Once upon a time", max_tokens=16,
                                      temperature=1.5, seed=seed)
        return r.choices[0].text

    a, b = text(2**53), text(2**53 + 1)  # one double: the same seed before
    assert text(2**53) == a
    assert a != b
    assert text(2**63 - 1) == text(2**63 - 1)
    assert text(-2**63) == text(-2**63)


@pytest.mark.parametrize("body,param,message", [
    ('"seed":9223372036854775808', "seed",
     "Invalid value for 'seed': 9223372036854775808 is outside the range "
     "[-9223372036854775808, 9223372036854775807]."),
    ('"max_tokens":1e19', "max_tokens",
     "Invalid value for 'max_tokens': 1e19 is outside the range [1, 9223372036854775807]."),
    ('"temperature":2.0000001', "temperature",
     "Invalid value for 'temperature': 2.0000001 is outside the range [0, 2]."),
])
def test_a_number_out_of_range_is_quoted_as_sent(server, body, param, message):
    status, _, raw = server.post("/v1/completions", '{"model":"smol","prompt":"Hi",%s}' % body)
    assert status == 400
    e = json.loads(raw)["error"]
    assert (e["param"], e["code"], e["message"]) == (param, "invalid_value", message)


def test_a_cut_answer_counts_no_token_whose_text_a_stop_string_held(start_server):
    """Text that may start a stop string is held back; its tokens' events
    come first, empty, and the text after them. When that text is what
    --max-response refuses, its tokens are not in the answer and not in
    usage (they were counted as their empty events came)."""
    limit = 1024  # the least the flag takes: about 220 tokens of a story
    s = start_server("--max-response", str(limit))
    body = {"model": "smol", "prompt": "Once upon a time", "max_tokens": 400, "temperature": 0}
    # the greedy answer's tokens, from a stream (--max-response bounds no stream)
    status, _, sse = s.post("/v1/completions", json.dumps(dict(body, stream=True, logprobs=1)))
    assert status == 200
    toks = [t for l in sse.split(b"\n") if l.startswith(b"data: {")
            for t in (json.loads(l[6:])["choices"][0]["logprobs"] or {}).get("tokens", [])]
    offs = [len("".join(toks[:i]).encode()) for i in range(len(toks))]
    assert offs and offs[-1] > limit, (status, len(toks))
    k = next(i for i in range(len(toks)) if offs[i] + len(toks[i].encode()) > limit)
    assert k >= 3
    stop = "".join(toks[k - 2:k + 1]) + "QQQ"  # held from token k - 2 on, then let go
    status, raw = post_json(s, "/v1/completions", dict(body, stop=[stop]))
    assert status == 200, raw[:300]
    j = json.loads(raw)
    text = j["choices"][0]["text"]
    assert j["choices"][0]["finish_reason"] == "length"
    assert "".join(toks).startswith(text) and len(text.encode()) <= offs[k - 2], (len(text), offs[k - 2])
    held = sum(1 for i in range(len(toks)) if offs[i] + len(toks[i].encode()) <= len(text.encode()))
    assert j["usage"]["completion_tokens"] == held, (j["usage"], held)
