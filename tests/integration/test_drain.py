"""SIGTERM drains: no new connections, running streams finish, exit 0. A
stream that outlives --drain-timeout is cancelled, and the exit is still 0."""

import json
import signal
import socket
import time

import pytest

from conftest import ENDLESS, parse_response, read_until_quiet


def test_sigterm_lets_a_running_stream_finish_then_exits_0(start_server):
    s = start_server("--drain-timeout", "60")
    c = s.client()
    stream = c.completions.create(model="smol", prompt="Once upon a time", max_tokens=12,
                                  temperature=0, stream=True)
    it = iter(stream)
    first = next(it)
    s.proc.send_signal(signal.SIGTERM)
    deadline = time.time() + 10
    with pytest.raises(OSError):  # the listener is closed (soon after the signal)
        while time.time() < deadline:
            socket.create_connection(("127.0.0.1", s.port), timeout=2).close()
            time.sleep(0.05)
    rest = list(it)
    chunks = [first] + rest
    assert chunks[-1].choices[0].finish_reason == "length"
    assert sum(1 for ch in chunks if ch.choices[0].text) >= 1
    assert s.proc.wait(30) == 0
    assert "drained" in s.log()


def test_drain_timeout_cancels_what_is_left_and_exits_0(start_server):
    s = start_server("--drain-timeout", "1")
    c = s.client()
    stream = c.completions.create(model="smol", prompt=ENDLESS, max_tokens=None, temperature=0,
                                  stream=True)
    it = iter(stream)
    next(it)
    t0 = time.time()
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(30) == 0
    assert time.time() - t0 < 15
    assert "drain timeout" in s.log()


def read_head(sock, timeout=10):
    sock.settimeout(timeout)
    buf = b""
    while b"\r\n\r\n" not in buf:
        got = sock.recv(4096)
        if not got:
            break
        buf += got
    return buf


def completion_request(stream=False, max_tokens=3, prompt="Hello", **extra):
    body = json.dumps({"model": "smol", "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0, "stream": stream, **extra}).encode()
    return (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def wait_read(s):
    """Returns once the server has read the bytes already sent on an open
    connection: a /metrics round trip on a new connection, which the loop
    accepts after that one (one accept pass, in order) and reads in the same
    pass as that one's bytes or after. A fixed sleep did not: a server loop
    late by that long had the signal first and closed the connection as idle."""
    s.metrics()


def wait_for_log(s, text, timeout=10):
    deadline = time.time() + timeout
    while text not in s.log() and time.time() < deadline:
        time.sleep(0.05)
    assert text in s.log()


@pytest.mark.parametrize("path", ["/v1/completions", "/tokenize"])
def test_a_request_whose_headers_end_during_the_drain_is_refused_from_them(start_server, path):
    # A draining server takes no new work, so a POST whose headers arrive
    # during the drain is refused from its headers: no 100 Continue asks its
    # client to upload a body only to be refused after it.
    s = start_server("--drain-timeout", "30")
    running = s.connect()
    running.sendall(completion_request(stream=True, max_tokens=400, prompt=ENDLESS))
    assert read_head(running).startswith(b"HTTP/1.1 200")
    body = json.dumps({"model": "smol", "prompt": "Hello", "max_tokens": 3}).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Expect: 100-continue\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    late = s.connect()
    late.sendall(head[:20])  # under way when the signal comes: not idle, not closed
    wait_read(s)
    s.proc.send_signal(signal.SIGTERM)
    wait_for_log(s, "draining")
    late.sendall(head[20:])
    got = read_until_quiet(late, timeout=10, quiet=1)
    assert got.startswith(b"HTTP/1.1 503"), got
    assert b"Retry-After: 1" in got and b"server_shutting_down" in got
    late.close()
    running.close()  # the stream's client leaves: it is cancelled, and the drain ends
    assert s.proc.wait(30) == 0


def test_a_request_cut_inside_a_long_engine_step_still_gets_its_ending(start_server):
    # A cut request waits for the engine's answer to its cancel (the tokens
    # it made last), but only for part of the time the endings have to
    # flush: a step that outlasts it (here one prefill chunk of some 4,000
    # tokens on one thread) does not cost the client its ending.
    s = start_server("--threads", "1", "--chunk", "8192", "--max-step-tokens", "8192",
                     "--drain-timeout", "0.1")
    prompt = " ".join(["The river flows past the old mill and the bridge."] * 360)
    body = json.dumps({"model": "smol", "prompt": prompt, "max_tokens": 4, "temperature": 0,
                       "stream": True}).encode()
    c = s.connect()
    c.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
    time.sleep(0.5)  # the prefill step runs
    s.proc.send_signal(signal.SIGTERM)
    got = read_until_quiet(c, timeout=60)
    assert got.startswith(b"HTTP/1.1 503"), got[:300]
    assert b"server_shutting_down" in got
    assert s.proc.wait(60) == 0


def test_a_request_still_arriving_at_the_signal_is_answered_on_an_idle_server(start_server):
    # Nothing runs, but a request is half sent: the drain waits for the rest
    # and answers it (a 503 its client can retry elsewhere), instead of
    # closing the connection under it.
    s = start_server("--drain-timeout", "30")
    req = completion_request()
    late = s.connect()
    late.sendall(req[:20])
    wait_read(s)
    s.proc.send_signal(signal.SIGTERM)
    wait_for_log(s, "draining")
    time.sleep(0.3)
    late.sendall(req[20:])
    got = read_until_quiet(late, timeout=10, quiet=1)
    assert got.startswith(b"HTTP/1.1 503"), got
    assert b"server_shutting_down" in got and b"Connection: close" in got
    assert s.proc.wait(30) == 0


def test_a_request_never_finished_gets_its_503_when_the_drain_times_out(start_server):
    s = start_server("--drain-timeout", "1")
    late = s.connect()
    late.sendall(completion_request()[:30])
    wait_read(s)
    t0 = time.time()
    s.proc.send_signal(signal.SIGTERM)
    got = read_until_quiet(late, timeout=15, quiet=1)
    assert got.startswith(b"HTTP/1.1 503"), got
    assert b"server_shutting_down" in got
    assert s.proc.wait(30) == 0
    assert time.time() - t0 < 10


def test_a_request_pipelined_behind_a_stream_at_the_signal_is_answered(start_server):
    # The stream's response said keep-alive before the signal, so its client
    # was free to pipeline the next request behind it: that one is read and
    # answered (503, Connection: close) after the stream, not dropped.
    s = start_server("--drain-timeout", "60")
    c = s.connect()
    c.sendall(completion_request(stream=True, max_tokens=1000, prompt=ENDLESS) +
              completion_request())
    head = read_head(c)
    assert head.startswith(b"HTTP/1.1 200") and b"Connection: keep-alive" in head, head
    s.proc.send_signal(signal.SIGTERM)
    got = head + read_until_quiet(c, timeout=60, quiet=3)
    first, sep, second = got.partition(b"\r\n0\r\n\r\n")
    assert sep and b"data: [DONE]" in first, got[-500:]
    assert second.startswith(b"HTTP/1.1 503"), second[:300]
    assert b"server_shutting_down" in second and b"Connection: close" in second
    assert s.proc.wait(30) == 0


def test_a_request_pipelined_behind_a_cut_stream_gets_its_503(start_server):
    # Only part of it has come when the drain times out: it starts arriving
    # once the cut stream's ending is out, and is refused then.
    s = start_server("--drain-timeout", "1", "--stream-grace", "0")
    c = s.connect()
    c.sendall(completion_request(stream=True, max_tokens=3000, prompt="Once upon a time") +
              completion_request()[:30])
    head = read_head(c)
    assert head.startswith(b"HTTP/1.1 200"), head
    s.proc.send_signal(signal.SIGTERM)
    got = read_until_quiet(c, timeout=30, quiet=3)
    first, sep, second = got.partition(b"\r\n0\r\n\r\n")
    assert sep and b"server_shutting_down" in first and b"data: [DONE]" in first, got[-300:]
    assert second.startswith(b"HTTP/1.1 503"), second[:300]
    assert s.proc.wait(30) == 0


def test_a_refusal_at_the_cut_is_counted_under_its_endpoint(start_server):
    # A completion whose headers were taken before the signal is still
    # uploading its body at the cut: its 503 counts as a completions request.
    # The /metrics pipelined behind a stream is answered after the cut.
    s = start_server("--drain-timeout", "1", "--stream-grace", "0")
    body = json.dumps({"model": "smol", "prompt": "x" * 5000, "max_tokens": 3}).encode()
    a = s.connect()
    a.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body[:100])
    b = s.connect()
    b.sendall(completion_request(stream=True, max_tokens=3000, prompt="Once upon a time") +
              b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert read_head(b).startswith(b"HTTP/1.1 200")
    s.proc.send_signal(signal.SIGTERM)
    got_a = read_until_quiet(a, timeout=15, quiet=2)
    assert got_a.startswith(b"HTTP/1.1 503") and b"server_shutting_down" in got_a, got_a[:200]
    got_b = read_until_quiet(b, timeout=15, quiet=2)
    metrics = got_b[got_b.find(b"\r\n0\r\n\r\nHTTP/1.1 200"):].decode(errors="replace")
    assert 'streamsink_requests_total{endpoint="/v1/completions",status="503"} 1' in metrics, \
        [l for l in metrics.splitlines() if "requests_total{" in l]
    assert s.proc.wait(30) == 0


def test_blank_lines_behind_a_stream_at_the_signal_leave_nothing_open(start_server):
    # Only CRLF followed the stream on its connection: no request is owed, so
    # the connection closes after the stream instead of idling open (where it
    # took new requests during the drain).
    s = start_server("--drain-timeout", "30", "--stream-grace", "0")
    keeper = s.connect()  # keeps the drain open
    keeper.sendall(completion_request(stream=True, max_tokens=None, prompt=ENDLESS))
    assert read_head(keeper).startswith(b"HTTP/1.1 200")
    c = s.connect()
    c.sendall(completion_request(stream=True, max_tokens=40, prompt="Once upon a time") + b"\r\n")
    assert read_head(c).startswith(b"HTTP/1.1 200")
    s.proc.send_signal(signal.SIGTERM)
    wait_for_log(s, "draining")
    got = read_until_quiet(c, timeout=30, quiet=2)
    assert b"data: [DONE]" in got and got.endswith(b"\r\n0\r\n\r\n"), got[-200:]
    time.sleep(0.5)
    try:
        c.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        late = read_until_quiet(c, timeout=5, quiet=1)
    except OSError:
        late = b""
    assert not late.startswith(b"HTTP/1.1"), late[:200]
    keeper.close()  # its stream is cancelled, and the drain ends
    assert s.proc.wait(30) == 0


def test_the_tail_of_an_answer_still_queued_at_the_signal_is_delivered(start_server):
    # The answer is complete and its connection idle (keep-alive: the queue
    # is under --low-water), but its client has not read all of it yet. The
    # signal closes the connection once the tail is out, not under it.
    s = start_server("--high-water", "262144", "--low-water", "262144", "--sndbuf", "4096",
                     "--drain-timeout", "10")
    c = s.connect(rcvbuf=4096)
    c.sendall(completion_request(max_tokens=300, prompt=ENDLESS, logprobs=5))
    s.wait_metric('streamsink_requests_total{endpoint="/v1/completions",status="200"}',
                  lambda v: v == 1, timeout=60)
    s.proc.send_signal(signal.SIGTERM)
    wait_for_log(s, "draining")
    got = read_until_quiet(c, timeout=30, quiet=2)
    status, headers, body = parse_response(got)
    assert status == 200, got[:200]
    assert len(body) == int(headers["content-length"]) > 40000, (len(body), headers)
    json.loads(body)
    assert s.proc.wait(30) == 0
