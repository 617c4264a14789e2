"""n: several choices for one prompt, through the official openai client.

The reference for each choice is a request of one choice: choice i samples
with seed + i, so its text must equal what the same request with n = 1 and
that seed answers (batch invariance makes the two runs' tokens the same).
The usage counts the prompt once and every choice's tokens; a stream names
each chunk's choice and ends each choice once; --max-response bounds all the
choices of a whole answer together; what cannot be served is a 400 naming n.
"""

import json
import shutil
import signal
import socket
import threading
import time

import openai
import pytest

from conftest import ENDLESS, ENDLESS_CHAT, Server
from session_util import call, complete

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


def test_best_of_answers_the_candidates_with_the_highest_logprob_per_token(client):
    """best_of 4, n 2: the candidates are the requests of one with seeds
    seed..seed+3; the answer is the two with the highest mean token
    log-prob (as each reports them with logprobs), best first, and the
    usage bills all four."""
    kw = dict(model="smol", prompt=PROMPT, max_tokens=12, temperature=1.0)
    cands = [client.completions.create(seed=70 + i, logprobs=0, **kw) for i in range(4)]
    mean = [sum(c.choices[0].logprobs.token_logprobs) / c.usage.completion_tokens
            for c in cands]
    assert all(c.usage.completion_tokens == len(c.choices[0].logprobs.token_logprobs)
               for c in cands)
    best = sorted(range(4), key=lambda i: -mean[i])[:2]
    assert best != [0, 1]  # (so that the order is the judgement, not the seeds')
    assert len({round(m, 6) for m in mean}) == 4  # no tie to settle
    r = client.completions.create(seed=70, n=2, best_of=4, **kw)
    assert [c.index for c in r.choices] == [0, 1]
    assert [c.text for c in r.choices] == [cands[i].choices[0].text for i in best]
    assert r.usage.completion_tokens == sum(c.usage.completion_tokens for c in cands)
    assert r.usage.prompt_tokens == cands[0].usage.prompt_tokens
    # with log-probs, the answered candidates carry their own
    r = client.completions.create(seed=70, best_of=4, logprobs=0, **kw)
    assert r.choices[0].logprobs.token_logprobs == \
        cands[best[0]].choices[0].logprobs.token_logprobs


@pytest.mark.parametrize("extra, what", [
    ({"best_of": 2, "stream": True}, "streamed"),
    ({"best_of": 1, "n": 2}, "expected n"),
    ({"best_of": 21}, "to 20"),
    ({"best_of": 9}, "--max-seqs"),
])
def test_what_best_of_cannot_do_is_a_400_naming_it(server, extra, what):
    body = {"model": "smol", "prompt": PROMPT, "max_tokens": 4, **extra}
    status, _, raw = server.post("/v1/completions", json.dumps(body))
    err = json.loads(raw)["error"]
    assert status == 400 and err["param"] == "best_of", err
    assert what in err["message"], err


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


def test_choices_wait_until_all_their_slots_are_free(start_server):
    """Two slots, one held by a stream: a request of two choices waits (it
    is not started on one slot), and runs once the stream's client leaves."""
    s = start_server("--max-seqs", "2", "--max-queue", "4", "--stream-grace", "0")
    c = s.client()
    busy = c.completions.create(model="smol", prompt=ENDLESS, max_tokens=5000, temperature=0,
                                stream=True)
    next(iter(busy))  # it runs
    done = {}

    def two():
        done["r"] = c.completions.create(model="smol", prompt=PROMPT, max_tokens=8,
                                         temperature=1.0, seed=1, n=2)

    t = threading.Thread(target=two)
    t.start()
    time.sleep(1.5)
    assert "r" not in done  # waiting for its second slot
    assert s.metrics()["streamsink_active_sequences"] == 1
    busy.close()  # a disconnect cancels it (grace 0): both slots free
    t.join(60)
    r = done["r"]
    assert len(r.choices) == 2 and all(ch.finish_reason == "length" for ch in r.choices)


def test_a_client_that_leaves_frees_every_choice_s_slot(start_server):
    """With no queue, a request of three choices on three slots leaves no
    room; once its client closes the connection, all three slots are free
    and the next request of three is served, not refused."""
    s = start_server("--max-seqs", "3", "--max-queue", "0")
    body = json.dumps({"model": "smol", "prompt": ENDLESS, "max_tokens": 5000,
                       "temperature": 0, "n": 3}).encode()
    sock = socket.create_connection(("127.0.0.1", s.port))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                 b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    s.wait_metric("streamsink_active_sequences", lambda v: v == 3)
    status, _, raw = s.post("/v1/completions", json.dumps({"model": "smol", "prompt": PROMPT,
                                                           "max_tokens": 2}))
    assert status == 429, raw[:200]  # no place while it runs
    sock.close()
    s.wait_metric("streamsink_active_sequences", lambda v: v == 0)
    r = s.client().completions.create(model="smol", prompt=PROMPT, max_tokens=4, n=3)
    assert len(r.choices) == 3


def test_choices_whose_slots_hold_sessions_that_cannot_leave_are_refused(binary, model,
                                                                         tmp_path):
    """One slot free, two holding idle sessions that cannot leave memory
    (their directory is gone and both places for failed writes are taken):
    a request of two choices gets 503 at once instead of waiting with no
    answer, and a request of one still runs on the free slot."""
    d = tmp_path / "sessions"
    d.mkdir()
    s = Server(binary, model, ["--session-dir", str(d), "--max-seqs", "3"])
    try:
        shutil.rmtree(d)
        d.mkdir()  # not the directory the server holds open: every write fails
        for sid in "abcde":  # d and e push a and b out; their writes fail and are held
            assert complete(s, "hi", sid, max_tokens=2)[0] == 200
        s.wait_metric("streamsink_snapshot_saves_held", lambda v: v == 2)
        st, r = call(s, "DELETE", "/v1/sessions/e")  # a free slot; c and d stay
        assert st == 204, r
        st, r = call(s, "POST", "/v1/completions", {"model": "smol", "prompt": "hi",
                                                     "max_tokens": 2, "n": 2}, timeout=30)
        assert st == 503 and r["error"]["code"] == "session_save_failed", r
        st, r = call(s, "POST", "/v1/completions", {"model": "smol", "prompt": "hi",
                                                     "max_tokens": 2}, timeout=30)
        assert st == 200, r
    finally:
        s.stop()


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


def test_a_stream_of_choices_cut_at_the_drain_ends_once_with_the_cut_s_error(start_server):
    """At the drain timeout every choice is cancelled: the stream ends with
    one error frame (server_shutting_down) and [DONE], after the tokens of
    both choices, and no choice is told it stopped."""
    s = start_server("--drain-timeout", "1")
    body = json.dumps({"model": "smol", "prompt": ENDLESS, "max_tokens": 5000,
                       "temperature": 0, "n": 2, "stream": True}).encode()
    sock = socket.create_connection(("127.0.0.1", s.port))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                 b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    s.wait_metric("streamsink_active_sequences", lambda v: v == 2)
    s.proc.send_signal(signal.SIGTERM)
    sock.settimeout(30)
    raw = b""
    while b"data: [DONE]" not in raw:
        got = sock.recv(65536)
        if not got:
            break
        raw += got
    sock.close()
    assert s.proc.wait(30) == 0
    datas = [line[6:] for line in raw.decode(errors="replace").split("\n")
             if line.startswith("data: ")]
    assert datas[-1] == "[DONE]"
    frames = [json.loads(d) for d in datas[:-1] if d.startswith("{")]
    errors = [f for f in frames if "error" in f]
    assert len(errors) == 1 and errors[0]["error"]["code"] == "server_shutting_down"
    assert frames[-1] is errors[0]
    texts = {0: "", 1: ""}
    for f in frames:
        for ch in f.get("choices", []):
            assert ch["finish_reason"] is None
            texts[ch["index"]] += ch["text"]
    assert texts[0] and texts[1]


def test_inter_token_latency_is_each_choices_own(server):
    """n choices step together: the inter-token latency histogram takes the
    gap between a choice's tokens, one observation per token after its
    first. It took the gaps between all of a request's tokens, so n = 2
    gave 2k - 1 observations, half of them the microseconds between two
    choices' tokens of one step."""
    before = server.metrics()
    name = "streamsink_inter_token_latency_seconds"
    for n, stream in ((2, False), (3, True)):
        body = {"model": "smol", "prompt": "Once upon a time", "max_tokens": 12, "n": n,
                "temperature": 1.0, "seed": 7, "ignore_eos": True, "stream": stream}
        status, _, _ = server.post("/v1/completions", json.dumps(body))
        assert status == 200
    after = server.metrics()
    assert after[name + "_count"] - before[name + "_count"] == 2 * 11 + 3 * 11
