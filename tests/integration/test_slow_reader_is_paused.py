"""A client that reads slower than tokens are made pauses its sequence at the
write queue's high-water mark (bounded bytes buffered, the sequence skips
steps), resumes at the low-water mark, and is closed when it stalls past the
write-stall timeout, freeing its slot."""

import json
import time

from conftest import ENDLESS_CHAT, read_until_quiet

HIGH = 16384
LOW = 4096


def big_stream_request():
    # top_logprobs=20 makes every chunk a few KB, so the socket buffers fill fast
    body = json.dumps({"model": "smol", "messages": ENDLESS_CHAT, "max_tokens": None,
                       "temperature": 0, "logprobs": True, "top_logprobs": 20,
                       "stream": True}).encode()
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " +
            str(len(body)).encode() + b"\r\n\r\n" + body)


def test_slow_reader_pauses_with_bounded_buffers_then_resumes(start_server):
    s = start_server("--high-water", str(HIGH), "--low-water", str(LOW),
                     "--write-stall-timeout", "60", "--sndbuf", "8192",
                     "--stream-grace", "0")  # the closed stream is not kept for a resume
    sock = s.connect(rcvbuf=4096)
    sock.sendall(big_stream_request())
    sock.recv(1024)  # headers and a first chunk; then stop reading
    m = None
    deadline = time.time() + 120
    while time.time() < deadline:
        m = s.metrics()
        if m["streamsink_paused_sequences"] == 1 and m["streamsink_connections_paused"] == 1:
            break
        time.sleep(0.2)
    assert m["streamsink_paused_sequences"] == 1, {k: v for k, v in m.items() if "paused" in k}
    # bounded: the high-water mark plus at most a token or two in flight (a few KB each)
    assert m["streamsink_write_queue_max_bytes"] <= HIGH + 16384
    gen = m["streamsink_generated_tokens_total"]
    time.sleep(2)
    m2 = s.metrics()
    assert m2["streamsink_generated_tokens_total"] - gen <= 2  # the sequence skips steps
    assert m2["streamsink_write_queue_max_bytes"] <= HIGH + 16384
    # read again: the queue drains below the low-water mark and the sequence resumes
    # (until the server shows new tokens, reading all along: it may be late)
    got = b""
    deadline = time.time() + 60
    while True:
        got += read_until_quiet(sock, timeout=1, quiet=None)
        m3 = s.metrics()
        if (m3["streamsink_generated_tokens_total"] > m2["streamsink_generated_tokens_total"]
                or time.time() > deadline):
            break
    assert len(got) > 0
    assert m3["streamsink_generated_tokens_total"] > m2["streamsink_generated_tokens_total"]
    sock.close()
    s.wait_metric("streamsink_active_sequences", lambda v: v == 0)


def test_stalled_reader_is_closed_and_its_slot_freed(start_server):
    s = start_server("--high-water", str(HIGH), "--low-water", str(LOW),
                     "--write-stall-timeout", "2", "--sndbuf", "8192",
                     "--stream-grace", "0")  # the closed stream is not kept for a resume
    sock = s.connect(rcvbuf=4096)
    sock.sendall(big_stream_request())
    s.wait_metric("streamsink_write_stall_closes_total", lambda v: v >= 1, timeout=120)
    s.wait_metric("streamsink_active_sequences", lambda v: v == 0)
    total = s.metrics()["streamsink_kv_slots_total"]
    s.wait_metric("streamsink_kv_slots_free", lambda v: v == total)
    sock.close()
