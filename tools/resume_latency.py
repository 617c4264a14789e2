#!/usr/bin/env python3
"""Time from a reconnect to the first replayed event of a resumed stream.

Against a running `streamsink serve`: starts a streamed completion, drops the
connection after a few events, then reconnects with GET /v1/streams/{id} and
Last-Event-ID and times, on a fresh TCP connection each time, from connect()
to the complete first replayed event (its `id:` line, its data, the blank
line). Two cases:

  detached  the stream is still generating with no client (one resume of
            each of --streams streams, right after the drop, from the event
            before the last one seen: that one is in the buffer, so the time
            is the replay's, not the next token's);
  finished  the stream has ended and its tail is in the buffer (--n resumes
            of one stream, each from a Last-Event-ID drawn from the ids the
            buffer still holds).

Prints the median, p90, p99 and max in milliseconds. Standard library only.

  tools/resume_latency.py --base http://127.0.0.1:8080 [--api-key KEY] [--n 200]
"""

import argparse
import json
import random
import socket
import statistics
import time
import urllib.parse


def connect(host, port):
    s = socket.create_connection((host, port), timeout=60)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_head(s, buf=b""):
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            raise RuntimeError("connection closed before the response head")
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:])}
    return int(lines[0].split()[1]), headers, rest


def first_event(s, rest):
    """Reads until one complete SSE event (ends with a blank line) is in the body;
    returns its id. Chunked framing: the event arrives in one chunk."""
    buf = rest
    while True:
        line, sep, body = buf.partition(b"\r\n")
        if sep:
            n = int(line.split(b";")[0], 16)
            if n == 0:
                return None
            if len(body) >= n:
                event = body[:n]
                if event.startswith(b":"):  # a keep-alive comment
                    buf = body[n + 2:]
                    continue
                assert event.endswith(b"\n\n"), event
                return int(event.split(b"\n")[0][len(b"id: "):])
        chunk = s.recv(65536)
        if not chunk:
            return None
        buf += chunk


def start_stream(host, port, auth, max_tokens):
    s = connect(host, port)
    body = json.dumps({"prompt": "Count to one thousand: 1, 2, 3, 4, 5,", "max_tokens": max_tokens,
                       "temperature": 0, "stream": True}).encode()
    s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n{auth}\r\n").encode() + body)
    status, headers, rest = read_head(s)
    assert status == 200, status
    return s, headers["x-stream-id"], rest


def resume_once(host, port, auth, sid, last_id):
    t0 = time.perf_counter()
    s = connect(host, port)
    s.sendall((f"GET /v1/streams/{sid} HTTP/1.1\r\nHost: x\r\n{auth}"
               f"Last-Event-ID: {last_id}\r\n\r\n").encode())
    status, _, rest = read_head(s)
    eid = first_event(s, rest) if status == 200 else None
    dt = time.perf_counter() - t0
    s.close()
    return status, eid, dt


def summary(name, xs):
    xs = sorted(xs)
    q = lambda p: xs[min(len(xs) - 1, int(p * len(xs)))]
    print(f"{name:9s} n={len(xs):4d}  median {statistics.median(xs) * 1e3:7.3f} ms  "
          f"p90 {q(0.9) * 1e3:7.3f}  p99 {q(0.99) * 1e3:7.3f}  max {xs[-1] * 1e3:7.3f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="http://127.0.0.1:8080")
    ap.add_argument("--api-key", default="")
    ap.add_argument("--n", type=int, default=200, help="resumes of the finished stream")
    ap.add_argument("--streams", type=int, default=10, help="streams resumed while detached")
    ap.add_argument("--max-tokens", type=int, default=24)
    a = ap.parse_args()
    u = urllib.parse.urlparse(a.base)
    host, port = u.hostname, u.port or 80
    auth = f"Authorization: Bearer {a.api_key}\r\n" if a.api_key else ""

    detached = []
    for _ in range(a.streams):
        s, sid, rest = start_stream(host, port, auth, a.max_tokens)
        got = first_event(s, rest)  # the first event arrived: drop the connection
        s.close()
        status, eid, dt = resume_once(host, port, auth, sid, got - 1)
        assert status == 200 and eid == got, (status, eid, got)
        detached.append(dt)

    # a finished stream: read it to [DONE], then resume from ids it still holds
    s, sid, rest = start_stream(host, port, auth, a.max_tokens)
    buf = rest
    while b"data: [DONE]" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
    s.close()
    last = int(buf.rsplit(b"id: ", 1)[1].split(b"\n")[0])
    finished = []
    rng = random.Random(1)
    for _ in range(a.n):
        k = rng.randrange(max(0, last - 8), last)
        status, eid, dt = resume_once(host, port, auth, sid, k)
        assert status == 200 and eid == k + 1, (status, eid, k)
        finished.append(dt)

    summary("detached", detached)
    summary("finished", finished)


if __name__ == "__main__":
    main()
