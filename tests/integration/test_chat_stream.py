"""POST /v1/chat/completions through the official openai client, and the SSE
wire format byte for byte on a raw socket."""

import json
import re

from conftest import chatml, dechunk, parse_response, read_until_quiet, run_cli

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def test_greedy_chat_equals_streamsink_run_on_the_rendered_template(binary, model, client):
    r = client.chat.completions.create(model="smol", messages=MESSAGES, max_tokens=12,
                                       temperature=0)
    assert r.object == "chat.completion"
    assert r.id.startswith("chatcmpl-")
    msg = r.choices[0].message
    assert msg.role == "assistant"
    expected = run_cli(binary, model, chatml(MESSAGES), 12)
    # `run` stops at EOS (<|im_end|>) like the server; the text is the same
    assert msg.content == expected


def test_chat_stream_role_first_then_content_then_finish(client):
    whole = client.chat.completions.create(model="smol", messages=MESSAGES, max_tokens=10,
                                           temperature=0)
    chunks = list(client.chat.completions.create(model="smol", messages=MESSAGES, max_tokens=10,
                                                 temperature=0, stream=True))
    assert all(ch.object == "chat.completion.chunk" for ch in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content == ""
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_chat_stream_include_usage(client):
    chunks = list(client.chat.completions.create(model="smol", messages=MESSAGES, max_tokens=3,
                                                 temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[-1].choices == []
    u = chunks[-1].usage
    assert u.completion_tokens == 3
    assert u.prompt_tokens > 10  # the rendered template, system prompt included
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens


def test_chat_logprobs_shape(client):
    r = client.chat.completions.create(model="smol", messages=MESSAGES, max_tokens=4,
                                       temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for item in content:
        assert item.logprob <= 0
        assert isinstance(item.bytes, list)
        assert len(item.top_logprobs) == 3
        assert item.top_logprobs[0].token == item.token  # greedy picks the top one
    assert "".join(i.token for i in content) == r.choices[0].message.content

    chunks = list(client.chat.completions.create(model="smol", messages=MESSAGES, max_tokens=3,
                                                 temperature=0, logprobs=True, top_logprobs=2,
                                                 stream=True))
    items = [i for ch in chunks if ch.choices and ch.choices[0].logprobs
             for i in ch.choices[0].logprobs.content]
    assert len(items) == 3
    assert all(len(i.top_logprobs) == 2 for i in items)


def test_chat_stop_sequence(client):
    base = client.chat.completions.create(model="smol", messages=MESSAGES, max_tokens=12,
                                          temperature=0).choices[0].message.content
    stop = base[2:5]
    r = client.chat.completions.create(model="smol", messages=MESSAGES, max_tokens=12,
                                       temperature=0, stop=stop)
    assert r.choices[0].message.content == base[:base.index(stop)]
    assert r.choices[0].finish_reason == "stop"


def test_sse_framing_byte_for_byte(server):
    body = json.dumps({"model": "smol", "messages": MESSAGES, "max_tokens": 4, "temperature": 0,
                       "stream": True}).encode()
    s = server.connect()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
              b"Content-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    raw = read_until_quiet(s, 60)
    s.close()
    status, headers, _ = parse_response(raw)
    assert status == 200
    assert headers["content-type"].startswith("text/event-stream")
    assert headers["transfer-encoding"] == "chunked"
    assert headers["x-streamsink-replica"] == "pytest"
    stream = dechunk(raw.partition(b"\r\n\r\n")[2])
    assert stream.endswith(b"data: [DONE]\n\n")
    frames = stream.split(b"\n\n")
    assert frames[-1] == b""
    # keep-alive comment lines (no blank line of their own) aside
    frames = [re.sub(rb"\A(:[^\n]*\n)+", b"", f) for f in frames[:-1]]
    assert re.fullmatch(rb"[0-9a-f]{32}", headers["x-stream-id"].encode())
    # every event has an id (1, 2, ...: a reconnect names the last one it saw)
    for i, f in enumerate(frames, 1):
        assert f.startswith(b"id: %d\n" % i), f
    frames = [f.partition(b"\n")[2] for f in frames]
    assert frames[-1] == b"data: [DONE]"
    for f in frames[:-1]:
        assert re.fullmatch(rb"data: \{.*\}", f), f
        obj = json.loads(f[len(b"data: "):])
        assert obj["object"] == "chat.completion.chunk"
        assert set(obj) == {"id", "object", "created", "model", "choices"}


def test_pipelined_requests_are_answered_in_order(server):
    reqs = b""
    for i in range(3):
        body = json.dumps({"prompt": f"{i} + {i} =", "max_tokens": 2, "temperature": 0}).encode()
        reqs += (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                 str(len(body)).encode() + b"\r\n\r\n" + body)
    reqs += b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    raw = server.raw(reqs, 120)
    assert raw.count(b"HTTP/1.1 200 OK") == 4
    parts = raw.split(b"HTTP/1.1 200 OK")[1:]
    assert all(b"text_completion" in p for p in parts[:3])
    assert b'"status":"ok"' in parts[3]
