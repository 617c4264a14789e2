"""Prompt prefixes kept in free KV slots, through the official openai client.

A client that sends the whole conversation each turn (as every OpenAI
client does without a session) gets the turn's answer from a prefill of
only what is new: the usage says how many prompt tokens were cached, and
the answer is the one the whole prefill gives (cache_prompt false).
"""

import json
import socket

import openai

from conftest import Server, parse_response, read_until_quiet

TURN = [{"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Name three colours of the rainbow."}]


def cached(usage):
    d = usage.prompt_tokens_details
    return d.cached_tokens if d is not None else 0


def test_a_conversation_sent_whole_prefills_only_its_new_turn(server, client):
    kw = dict(model="smol", max_tokens=24, temperature=0)
    r1 = client.chat.completions.create(messages=TURN, **kw)
    turn2 = TURN + [{"role": "assistant", "content": r1.choices[0].message.content},
                    {"role": "user", "content": "And three more?"}]
    before = server.metrics()["streamsink_prompt_tokens_cached_total"]
    r2 = client.chat.completions.create(messages=turn2, **kw)
    after = server.metrics()["streamsink_prompt_tokens_cached_total"]
    whole = client.chat.completions.create(messages=turn2, extra_body={"cache_prompt": False},
                                           **kw)
    # the first turn's prompt at least came from its slot; the rest was prefilled
    assert r1.usage.prompt_tokens <= cached(r2.usage) < r2.usage.prompt_tokens
    assert after - before == cached(r2.usage)
    assert cached(whole.usage) == 0 and whole.usage.prompt_tokens_details is None
    assert r2.choices[0].message.content == whole.choices[0].message.content
    assert r2.usage.prompt_tokens == whole.usage.prompt_tokens


def test_a_sampled_completion_with_logprobs_is_the_same_from_a_cached_prefix(client):
    prompt = "The history of the printing press begins in " * 8
    kw = dict(model="smol", prompt=prompt, max_tokens=16, temperature=1.0, seed=9, logprobs=2)
    first = client.completions.create(**kw)
    again = client.completions.create(**kw)
    whole = client.completions.create(extra_body={"cache_prompt": False}, **kw)
    assert cached(again.usage) == again.usage.prompt_tokens - 1  # all but the last token
    assert again.choices[0].text == whole.choices[0].text == first.choices[0].text
    assert again.choices[0].logprobs.token_logprobs == whole.choices[0].logprobs.token_logprobs
    assert again.choices[0].logprobs.top_logprobs == whole.choices[0].logprobs.top_logprobs


def test_cache_prompt_must_be_a_boolean(client):
    try:
        client.completions.create(model="smol", prompt="hi", max_tokens=1,
                                  extra_body={"cache_prompt": "no"})
    except openai.BadRequestError as e:
        assert e.body["param"] == "cache_prompt"
    else:
        raise AssertionError("accepted")


def test_a_session_s_slot_is_not_offered_to_others(binary, model):
    """A session's cells are its own: a request whose prompt starts as the
    session's does is prefilled whole while the session holds its slot."""
    s = Server(binary, model, ["--max-seqs", "2"])
    try:
        c = s.client()
        text = "A session that keeps its own cache: " * 6
        r = c.completions.create(model="smol", prompt=text, max_tokens=4, temperature=0,
                                 extra_body={"session_id": "prefix-s1"})
        assert cached(r.usage) == 0
        other = c.completions.create(model="smol", prompt=text + " more", max_tokens=4,
                                     temperature=0)
        assert cached(other.usage) == 0
    finally:
        assert s.stop() == 0, s.log()


def test_one_key_never_starts_from_another_key_s_prefix(binary, model):
    """A slot's record is its API key's: another key's request with the same
    prompt prefills it whole (no cached tokens, nothing to time), the same
    key's does not."""
    s = Server(binary, model, ["--api-key", "key-a", "--api-key", "key-b"])
    try:
        text = "The secret system prompt of key a says that " * 6
        kw = dict(model="smol", max_tokens=2, temperature=0)
        a = s.client(api_key="key-a")
        b = s.client(api_key="key-b")
        a.completions.create(prompt=text, **kw)
        rb = b.completions.create(prompt=text + "and", **kw)
        ra = a.completions.create(prompt=text + "and", **kw)
        assert cached(rb.usage) == 0
        assert cached(ra.usage) > 0
    finally:
        assert s.stop() == 0, s.log()


def test_a_conversation_longer_than_the_window_still_prefills_only_its_new_turn(binary, model):
    """With a window of 128 (a ring of 128 + 32), the history passes the
    ring by the third turn; each turn still starts where the last ended,
    and answers as a whole prefill does."""
    s = Server(binary, model, ["--window", "128", "--chunk", "32"])
    try:
        c = s.client()
        kw = dict(model="smol", max_tokens=64, temperature=0)
        messages = list(TURN)
        for turn in range(4):
            r = c.chat.completions.create(messages=messages, **kw)
            whole = c.chat.completions.create(messages=messages,
                                              extra_body={"cache_prompt": False}, **kw)
            assert r.choices[0].message.content == whole.choices[0].message.content
            if turn >= 2:  # past the ring: the previous turn's history is kept
                assert r.usage.prompt_tokens > 160
                assert cached(r.usage) > r.usage.prompt_tokens - 40, r.usage
            messages += [{"role": "assistant", "content": r.choices[0].message.content},
                         {"role": "user", "content": f"Tell me more, part {turn + 2}."}]
    finally:
        assert s.stop() == 0, s.log()


def complete_from(port, source, prompt):
    """A completion sent from the client address source; its usage."""
    body = json.dumps({"model": "smol", "prompt": prompt, "max_tokens": 2,
                       "temperature": 0}).encode()
    sock = socket.create_connection(("127.0.0.1", port), source_address=(source, 0))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                 b"\r\nConnection: close\r\nContent-Length: " + str(len(body)).encode()
                 + b"\r\n\r\n" + body)
    status, _, raw = parse_response(read_until_quiet(sock))
    sock.close()
    assert status == 200, raw[:200]
    return json.loads(raw)["usage"]


def test_on_an_open_server_one_client_address_never_starts_from_another_s(binary, model):
    """With no API keys, a record is its client address's: a client at
    127.0.0.2 sending what one at 127.0.0.1 sent gets no cached tokens."""
    s = Server(binary, model, [])
    try:
        text = "What the first client asked the server in confidence was " * 5
        complete_from(s.port, "127.0.0.1", text)
        other = complete_from(s.port, "127.0.0.2", text + "this")
        same = complete_from(s.port, "127.0.0.1", text + "this")
        assert other.get("prompt_tokens_details") is None, other
        assert same["prompt_tokens_details"]["cached_tokens"] > 0, same
    finally:
        assert s.stop() == 0, s.log()


def test_the_records_memory_does_not_follow_max_prompt(binary, model):
    """A slot's record is bounded by its cells, not by --max-prompt: a
    server told to take prompts of 10^12 tokens starts and serves."""
    s = Server(binary, model, ["--max-prompt", "1000000000000"])
    try:
        r = s.client().completions.create(model="smol", prompt="hi", max_tokens=2)
        assert r.usage.completion_tokens == 2
    finally:
        assert s.stop() == 0, s.log()
