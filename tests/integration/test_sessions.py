"""Sessions: two requests on one session_id produce what one request with the
concatenated prompt produces (greedy), because the second prompt is appended
to the session's KV stream."""

import pytest

from session_util import call


def test_two_session_turns_equal_one_concatenated_prompt(client):
    a = "The capital of France is"
    b = " The capital of Germany is"
    first = client.completions.create(model="smol", prompt=a, max_tokens=3, temperature=0,
                                      extra_body={"session_id": "sess-concat"})
    t1 = first.choices[0].text
    second = client.completions.create(model="smol", prompt=b, max_tokens=6, temperature=0,
                                       extra_headers={"X-Session-Id": "sess-concat"})
    one = client.completions.create(model="smol", prompt=a + t1 + b, max_tokens=6, temperature=0)
    assert second.choices[0].text == one.choices[0].text
    assert second.usage.prompt_tokens < one.usage.prompt_tokens  # only the new text was sent


@pytest.mark.parametrize("first_max_tokens", [None, 5])
def test_chat_session_turns_are_the_conversation_the_template_renders(server, first_max_tokens):
    """A chat session sends only its new turns; what the model sees must be
    the whole conversation as the template renders it: the default system
    turn before the first message, and each assistant turn ended as the
    template ends it ("<|im_end|>" and a newline), whether the model ended
    it (EOS) or max_tokens did. So the second turn's greedy answer, its
    logprobs and the session's token count are those of one stateless
    request with the history. Before, the first turn had no system turn
    and the next began right after the EOS, without its newline (or, after
    max_tokens, with the assistant turn never closed)."""
    sid = f"chat-turns-{first_max_tokens}"
    q1 = [{"role": "user", "content": "Hi! Who are you?"}]
    q2 = [{"role": "user", "content": "What can you help me with?"}]

    def chat(messages, max_tokens, session=None):
        body = {"model": "smol", "messages": messages, "max_tokens": max_tokens,
                "temperature": 0, "logprobs": True}
        if session:
            body["session_id"] = session
        st, r = call(server, "POST", "/v1/chat/completions", body)
        assert st == 200, r
        return r

    def answer(r):
        ch = r["choices"][0]
        return (ch["message"]["content"], ch["finish_reason"],
                [(x["token"], x["logprob"]) for x in ch["logprobs"]["content"]])

    s1, alone1 = chat(q1, first_max_tokens, sid), chat(q1, first_max_tokens)
    assert answer(s1) == answer(alone1)
    assert s1["usage"]["prompt_tokens"] == alone1["usage"]["prompt_tokens"]
    assert s1["choices"][0]["finish_reason"] == ("stop" if first_max_tokens is None else "length")
    a1 = s1["choices"][0]["message"]["content"]
    s2 = chat(q2, 12, sid)
    alone2 = chat(q1 + [{"role": "assistant", "content": a1}] + q2, 12)
    assert answer(s2) == answer(alone2)
    st, info = call(server, "GET", f"/v1/sessions/{sid}")
    assert st == 200, info
    assert info["tokens_seen"] == alone2["usage"]["prompt_tokens"] + alone2["usage"]["completion_tokens"]


@pytest.mark.parametrize("where", ["tokens", "mid_token", "first_token"])
@pytest.mark.parametrize("logprobs", [False, True])
def test_a_stop_string_leaves_the_session_holding_what_the_client_was_sent(server, where, logprobs):
    """A turn that a stop string ends gives its tokens back: the session
    holds the answer as sent, not the stop string, so the next turn answers
    what one stateless request with the history as the client has it
    answers. A token whose text starts before the stop string stays whole
    (mid_token); a stop string at the very start leaves the prompt alone
    (first_token). With and without logprobs (the engine holds text back in
    two ways). Before, the session kept every token through the stop
    string: tokens_seen counted them and the second turn saw them."""
    sid = f"stop-gives-back-{where}-{logprobs}"
    q1 = [{"role": "user", "content": "Hi! Who are you?"}]
    q2 = [{"role": "user", "content": "What can you help me with?"}]

    def chat(messages, max_tokens, session=None, stop=None, lp=True):
        body = {"model": "smol", "messages": messages, "max_tokens": max_tokens,
                "temperature": 0, "logprobs": lp}
        if session:
            body["session_id"] = session
        if stop:
            body["stop"] = [stop]
        st, r = call(server, "POST", "/v1/chat/completions", body)
        assert st == 200, r
        return r

    probe = chat(q1, 24)
    toks = [x["token"] for x in probe["choices"][0]["logprobs"]["content"]]
    text = "".join(toks)

    def at(i):
        return len("".join(toks[:i]))

    if where == "first_token":
        k, stop, kept = 0, toks[0] + toks[1], 0
    else:
        # a two-token stop string whose first occurrence starts at token k
        k = next(i for i in range(3, len(toks) - 1)
                 if toks[i].startswith(" ") and len(toks[i]) > 2 and toks[i + 1].strip()
                 and text.find(toks[i] + toks[i + 1]) == at(i))
        stop = toks[k] + toks[k + 1]
        kept = k
        if where == "mid_token":
            stop = stop[2:]
            assert text.find(stop) == at(k) + 2
            kept = k + 1  # the token the stop string starts inside stays
    s1 = chat(q1, 24, sid, stop, logprobs)
    a1 = s1["choices"][0]["message"]["content"]
    assert s1["choices"][0]["finish_reason"] == "stop"
    assert a1 == text[:text.find(stop)]
    st, info = call(server, "GET", f"/v1/sessions/{sid}")
    assert st == 200, info
    assert info["tokens_seen"] == s1["usage"]["prompt_tokens"] + kept, (info, kept)
    if where == "mid_token":
        return  # the session holds the whole token, the client part of it
    s2 = chat(q2, 12, sid)
    alone2 = chat(q1 + [{"role": "assistant", "content": a1}] + q2, 12)
    assert s2["choices"][0]["message"]["content"] == alone2["choices"][0]["message"]["content"]
    assert ([x["logprob"] for x in s2["choices"][0]["logprobs"]["content"]] ==
            [x["logprob"] for x in alone2["choices"][0]["logprobs"]["content"]])
    st, info = call(server, "GET", f"/v1/sessions/{sid}")
    assert st == 200, info
    assert info["tokens_seen"] == alone2["usage"]["prompt_tokens"] + alone2["usage"]["completion_tokens"]


def test_a_session_keeps_its_kv_policy_and_a_request_naming_another_is_refused(server):
    # a kv_policy sent on an existing session was silently ignored (200, the
    # session still sinks:4): now the same policy is fine and another is a 400
    st, r = call(server, "POST", "/v1/completions",
                 {"model": "smol", "prompt": "Hi", "max_tokens": 1, "session_id": "keeps-policy",
                  "kv_policy": "sinks:4"})
    assert st == 200, r
    st, r = call(server, "POST", "/v1/completions",
                 {"model": "smol", "prompt": " there", "max_tokens": 1,
                  "session_id": "keeps-policy", "kv_policy": "sinks:4"})
    assert st == 200, r
    st, r = call(server, "POST", "/v1/completions",
                 {"model": "smol", "prompt": " again", "max_tokens": 1,
                  "session_id": "keeps-policy", "kv_policy": "window"})
    assert st == 400 and r["error"]["param"] == "kv_policy", r
    assert "sinks:4" in r["error"]["message"] and "window" in r["error"]["message"], r
    st, r = call(server, "GET", "/v1/sessions/keeps-policy")
    assert st == 200 and r["kv_policy"] == "sinks:4", r


def test_listings_without_a_session_dir_never_wait_and_are_never_refused(server):
    # the cap on listings waiting for a directory read applies to listings
    # that wait: without --session-dir a burst during a decode is all 200
    import threading

    body = {"model": "smol", "prompt": "Once upon a time", "max_tokens": 200, "temperature": 0}
    gen = threading.Thread(target=lambda: call(server, "POST", "/v1/completions", body))
    gen.start()
    got = [None] * 12

    def lister(i):
        got[i] = call(server, "GET", "/v1/sessions")[0]

    listers = [threading.Thread(target=lister, args=(i,)) for i in range(12)]
    for t in listers:
        t.start()
    for t in listers:
        t.join(60)
    gen.join(120)
    assert got == [200] * 12, (got, server.log()[-3000:])


def test_a_burst_of_listings_admitted_in_one_pass_is_answered(binary, model):
    """Ten listings of seven sessions each, taken by the engine in one pass
    between two steps of a long prompt: 80 events, short of the event
    queue's 96 (--max-seqs 8) but more than the room the engine keeps for a
    step. It waited for that room without waking the loop thread, which
    alone makes it: every request hung, for good."""
    import random
    import threading
    import time

    from conftest import Server, read_until_quiet

    s = Server(binary, model, ["--max-seqs", "8", "--max-queue", "64"])
    try:
        for i in range(7):
            st, r = call(s, "POST", "/v1/completions", {
                "model": "smol", "prompt": f"Hi {i}", "max_tokens": 1, "session_id": f"burst-{i}"})
            assert st == 200, r
        rng = random.Random(7)
        words = " ".join(rng.choice(["apple", "river", "stone", "cloud", "seven", "green"])
                         for _ in range(4000))
        body = {"model": "smol", "prompt": words, "max_tokens": 3, "temperature": 0}
        fed0 = s.metrics()["streamsink_prompt_tokens_total"]
        gen = {}
        t = threading.Thread(target=lambda: gen.update(
            st=call(s, "POST", "/v1/completions", body, timeout=90)[0]))
        t.start()
        deadline = time.time() + 60  # until the long prompt is being fed
        while s.metrics()["streamsink_prompt_tokens_total"] == fed0 and time.time() < deadline:
            time.sleep(0.02)
        socks = [s.connect() for _ in range(10)]
        for k in socks:
            k.sendall(b"GET /v1/sessions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        got = [None] * 10

        def read(i):
            got[i] = read_until_quiet(socks[i], 30)

        readers = [threading.Thread(target=read, args=(i,)) for i in range(10)]
        for r in readers:
            r.start()
        for r in readers:
            r.join()
        heads = [g[:12] for g in got]
        assert heads == [b"HTTP/1.1 200"] * 10, (heads, s.log()[-2000:])
        assert all(g.count(b'"burst-') == 7 for g in got), got[0][-600:]
        t.join(90)
        assert gen.get("st") == 200, gen
    finally:
        s.stop()
