"""Soak + chaos: one server, many kinds of client at once, then the invariants
that must survive them.

While greedy streams run through the official openai client, other threads
disconnect at random points, read slowly or not at all, pipeline requests on
one keep-alive connection, send malformed requests and open and drop thousands
of short connections. Afterwards:

 1. every greedy text equals the same request run alone on the quiet server
    (greedy decoding is batch-invariant here, so the comparison is exact);
 2. every gauge in /metrics returns to its idle value within a bounded wait;
 3. the server's RSS after the chaos is within a bound of its RSS after a
    warm-up round of the same kinds;
 4. SIGTERM with long streams still running exits 0 within the drain timeout
    plus a few seconds, and each stream either finished or ends with an
    error event (code server_shutting_down) and data: [DONE].

STREAMSINK_SOAK_SCALE (default 1) multiplies the size of the chaos round;
STREAMSINK_SOAK_SEED picks the random choices. `pytest -s` prints a summary.
"""

import json
import os
import random
import re
import signal
import socket
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from conftest import ENDLESS, ENDLESS_CHAT, rss_kib

SCALE = float(os.environ.get("STREAMSINK_SOAK_SCALE", "1"))
SEED = int(os.environ.get("STREAMSINK_SOAK_SEED", "20251201"))

STALL_S = 3          # --write-stall-timeout: stalled and too-slow readers go within the test
DRAIN_S = 5          # --drain-timeout
MIN_READ_RATE = 4096  # --min-read-rate, bytes/s
MAX_BODY = 65536     # --max-body, small so one malformed kind is a 413
IDLE_WAIT_S = 60     # how long the gauges may take to settle after the chaos
SLOW_LIMIT_S = 120 * max(1.0, SCALE)  # a too-slow reader must be closed within this
# RSS after the chaos round may exceed RSS after the warm-up round by this much.
# Measured (2 cores, --window 512): RSS is ~480 MiB at start (weights and the KV
# pool, all touched at start-up), ~510 after the warm-up round, and the chaos
# round adds 0-3.5 MiB; a second chaos round adds under 0.1 MiB. The chaos opens
# ~3,300 connections (3,000 of them churn) and sends ~1,100 requests (1,000 of
# them 24 KB bodies refused after JSON parsing), so keeping ~5 KiB per connection
# or ~16 KB per request crosses the bound (the churn grows with the scale, the
# bound does not). Checked by leaking on purpose with an LD_PRELOAD free() that
# skips chunks of one size: struct http_conn's 20 KiB gave +60 MiB per round,
# the 24 KB bodies +49 MiB; both fail here.
RSS_BOUND_KIB = 16 * 1024

SERVER_ARGS = ["--max-seqs", "8", "--max-queue", "64", "--max-conns", "64",
               "--sse-keepalive", "1", "--drain-timeout", str(DRAIN_S),
               "--write-stall-timeout", str(STALL_S), "--min-read-rate", str(MIN_READ_RATE),
               "--sndbuf", "4096", "--high-water", "16384", "--low-water", "4096",
               "--max-body", str(MAX_BODY), "--window", "512",
               # a stream whose client left runs on detached for this long, then is cancelled
               "--stream-grace", "2"]

# the value each gauge must return to when nothing runs (the scrape itself is
# the one open connection)
IDLE = {
    "streamsink_active_sequences": 0,
    "streamsink_paused_sequences": 0,
    "streamsink_requests_inflight": 0,
    "streamsink_queued_requests": 0,
    "streamsink_connections_paused": 0,
    "streamsink_write_queue_bytes": 0,
    "streamsink_write_queue_max_bytes": 0,
    "streamsink_kv_slots_used": 0,
    "streamsink_sessions": 0,
    "streamsink_draining": 0,
    "streamsink_engine_healthy": 1,
    "streamsink_connections_open": 1,
    "streamsink_streams": 0,  # detached and finished streams are gone after --stream-grace
    "streamsink_streams_detached": 0,
    "streamsink_stream_buffer_bytes": 0,
}
COUNTERS = ["streamsink_client_disconnects_total", "streamsink_write_stall_closes_total",
            "streamsink_slow_reader_closes_total", "streamsink_connections_accepted_total",
            "streamsink_connections_rejected_total", "streamsink_connections_reclaimed_total",
            "streamsink_generated_tokens_total"]


def scaled(k):
    return max(1, round(k * SCALE))


# ---- raw HTTP helpers ---------------------------------------------------------------


def post_bytes(path, obj, close=False, extra=""):
    body = json.dumps(obj).encode() if not isinstance(obj, bytes) else obj
    conn = "Connection: close\r\n" if close else ""
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{extra}{conn}\r\n").encode() + body


def get_bytes(path, close=False):
    conn = "Connection: close\r\n" if close else ""
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n{conn}\r\n".encode()


def parse_one(buf):
    """One complete response at the start of buf: ((status, headers, body), rest),
    or None while it is incomplete. Bodies are dechunked."""
    head, sep, rest = buf.partition(b"\r\n\r\n")
    if not sep:
        return None
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0].startswith("HTTP/1."), f"not a status line: {lines[0]!r}"
    status = int(lines[0].split()[1])
    headers = {}
    for l in lines[1:]:
        k, _, v = l.partition(":")
        headers[k.strip().lower()] = v.strip()
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            line, sep, after = rest.partition(b"\r\n")
            if not sep:
                return None
            n = int(line.split(b";")[0], 16)
            if len(after) < n + 2:
                return None
            if n == 0:
                if not after.startswith(b"\r\n"):
                    return None
                return (status, headers, body), after[2:]
            assert after[n:n + 2] == b"\r\n", f"chunk not followed by CRLF: {after[:n + 8]!r}"
            body += after[:n]
            rest = after[n + 2:]
    n = int(headers.get("content-length", "0"))
    if len(rest) < n:
        return None
    return (status, headers, rest[:n]), rest[n:]


def read_responses(sock, count, timeout):
    """Reads until count complete responses arrived. Returns (responses, rest, how):
    how is 'ok', 'eof', 'reset' or 'timeout'."""
    buf, out = b"", []
    deadline = time.time() + timeout
    sock.settimeout(1.0)
    while True:
        while len(out) < count:
            got = parse_one(buf)
            if got is None:
                break
            out.append(got[0])
            buf = got[1]
        if len(out) >= count:
            return out, buf, "ok"
        if time.time() > deadline:
            return out, buf, "timeout"
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return out, buf, "reset"
        if not chunk:
            return out, buf, "eof"
        buf += chunk


def read_to_end(sock, timeout, step=65536, pause=0.0):
    """Reads until EOF (or a reset, or the timeout): (bytes, 'eof'|'reset'|'timeout')."""
    buf = b""
    deadline = time.time() + timeout
    sock.settimeout(1.0)
    while time.time() < deadline:
        try:
            chunk = sock.recv(step)
        except socket.timeout:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return buf, "reset"
        if not chunk:
            return buf, "eof"
        buf += chunk
        if pause:
            time.sleep(pause)
    return buf, "timeout"


def sse_data(body):
    """The data: payloads of an SSE body, in order (comments dropped)."""
    out = []
    for ev in body.split(b"\n\n"):
        for line in ev.split(b"\n"):
            if line.startswith(b"data: "):
                out.append(line[len(b"data: "):])
    return out


def text_of(events):
    """(text, finish_reason, error) of a list of SSE payloads."""
    text, finish, err = "", None, None
    for e in events:
        if e == b"[DONE]":
            continue
        obj = json.loads(e)
        if "error" in obj:
            err = obj["error"]
            continue
        for ch in obj.get("choices") or []:
            piece = ch.get("text")
            if piece is None:
                piece = (ch.get("delta") or {}).get("content")
            text += piece or ""
            finish = ch.get("finish_reason") or finish
    return text, finish, err


def set_rst_on_close(sock):
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


# ---- the requests ----------------------------------------------------------------------

PROMPTS = ["The capital of France is", "Once upon a time, in a small village,",
           "def fibonacci(n):", "The three primary colors are", "Water boils at",
           "A good breakfast includes", "The sun rises in the", "In 1969, the first man"]
QUESTIONS = ["Name a fruit.", "What is two plus two?", "Write a haiku about the sea.",
             "Say hello in French.", "What colour is the sky?", "Give me a word that rhymes "
             "with cat.", "Name a planet.", "What do bees make?"]


def greedy_specs(n):
    """n distinct greedy requests, half completions and half chat."""
    specs = []
    for i in range(n):
        kind = "completions" if i % 2 == 0 else "chat"
        pool = PROMPTS if kind == "completions" else QUESTIONS
        specs.append({"id": i, "kind": kind, "text": pool[(i // 2) % len(pool)] +
                      ("" if i < 2 * len(pool) else f" ({i})"),
                      "max_tokens": 16 + (i * 11) % 33, "include_usage": i % 3 == 0})
    return specs


def spec_body(spec, stream, **extra):
    body = {"model": "smol", "max_tokens": spec["max_tokens"], "temperature": 0,
            "stream": stream, **extra}
    if spec["kind"] == "completions":
        body["prompt"] = spec["text"]
    else:
        body["messages"] = [{"role": "user", "content": spec["text"]}]
    return body


def spec_path(spec):
    return "/v1/completions" if spec["kind"] == "completions" else "/v1/chat/completions"


def run_greedy(client, spec):
    """Streams spec through the openai client; returns its text (checking the shape)."""
    kw = {"model": "smol", "max_tokens": spec["max_tokens"], "temperature": 0, "stream": True}
    if spec["include_usage"]:
        kw["stream_options"] = {"include_usage": True}
    text, finish, usage, n_pieces = "", None, None, 0
    if spec["kind"] == "completions":
        chunks = client.completions.create(prompt=spec["text"], **kw)
    else:
        chunks = client.chat.completions.create(
            messages=[{"role": "user", "content": spec["text"]}], **kw)
    for ch in chunks:
        if ch.usage is not None:
            usage = ch.usage
        for c in ch.choices:
            piece = c.text if spec["kind"] == "completions" else c.delta.content
            if piece:
                text += piece
                n_pieces += 1
            finish = c.finish_reason or finish
    assert finish in ("stop", "length"), (spec, finish)
    if spec["include_usage"]:
        assert usage is not None, f"no usage chunk for {spec}"
        assert 0 < usage.completion_tokens <= spec["max_tokens"], (spec, usage)
        assert finish != "length" or usage.completion_tokens == spec["max_tokens"], (spec, usage)
        assert n_pieces <= usage.completion_tokens, (spec, n_pieces, usage)
    else:
        assert usage is None, f"usage sent without include_usage: {usage}"
    return text


def fat_endless_request():
    """A chat stream that never ends by itself, every frame ~2 KB (20 top logprobs)."""
    return post_bytes("/v1/chat/completions",
                      {"model": "smol", "messages": ENDLESS_CHAT, "max_tokens": 100000,
                       "temperature": 0, "stream": True, "logprobs": True, "top_logprobs": 20})


def malformed_requests():
    """(name, bytes, expected statuses): each is sent on a fresh connection."""
    ok = {"model": "smol", "prompt": "Hi", "max_tokens": 1}
    chunk_body = json.dumps(ok).encode()
    return [
        ("bad json", post_bytes("/v1/completions", b'{"model": "smol", "prompt": ', True), {400}),
        ("json not an object", post_bytes("/v1/completions", b"[1, 2, 3]", True), {400}),
        ("bad field value", post_bytes("/v1/completions", {**ok, "max_tokens": -5}, True), {400}),
        ("unknown model", post_bytes("/v1/completions", {**ok, "model": "no-such-model"}, True),
         {404}),
        ("unknown model chat", post_bytes("/v1/chat/completions",
                                          {"model": "gpt-nope", "max_tokens": 1,
                                           "messages": [{"role": "user", "content": "x"}]},
                                          True), {404}),
        ("body over --max-body", post_bytes("/v1/completions",
                                            {**ok, "prompt": "x" * (MAX_BODY + 1000)}, True),
         {413}),
        ("not http", b"THIS IS NOT HTTP\r\n\r\n", {400}),
        ("http/1.2", b"GET /health HTTP/1.2\r\nHost: x\r\n\r\n", {400, 505}),
        ("no host", b"GET /health HTTP/1.1\r\n\r\n", {400}),
        ("two hosts", b"GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", {400}),
        ("duplicate authorization", b"GET /v1/models HTTP/1.1\r\nHost: x\r\n"
                                    b"Authorization: Bearer a\r\nAuthorization: Bearer b\r\n\r\n",
         {400}),
        ("content-length with transfer-encoding",
         b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
         b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", {400}),
        ("chunk without crlf", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                               b"Transfer-Encoding: chunked\r\n\r\n" +
         b"%x\r\n" % len(chunk_body) + chunk_body + b"XY0\r\n\r\n", {400}),
        ("bad content-length", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                               b"Content-Length: 12abc\r\n\r\n{}", {400}),
        ("obs-fold", b"GET /health HTTP/1.1\r\nHost: x\r\nX-Note: a\r\n b\r\n\r\n", {400}),
        ("oversized headers", b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"v" * 20000 +
         b"\r\n\r\n", {431}),
        ("url too long", b"GET /health?" + b"q" * 3000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
         {414}),
        ("unknown path", get_bytes("/v1/nothing-here", True), {404}),
        ("wrong method", get_bytes("/v1/completions", True), {405}),
    ]


# ---- the chaos round -----------------------------------------------------------------------


class Round:
    """One round of chaos against server s; sizes is a dict of counts."""

    def __init__(self, s, name, sizes, specs, rng_seed):
        self.s, self.name, self.sizes, self.specs = s, name, sizes, specs
        self.seed = rng_seed
        self.lock = threading.Lock()
        self.problems = []          # strings; the test fails if any
        self.texts = []             # (spec id, variant, text) of every completed greedy text
        self.counts = {}            # kind -> number done
        self.max_gauges = {}
        self.others_done = threading.Event()

    def problem(self, msg):
        with self.lock:
            self.problems.append(f"[{self.name}] {msg}")

    def count(self, kind, n=1):
        with self.lock:
            self.counts[kind] = self.counts.get(kind, 0) + n

    def record(self, spec_id, variant, text):
        with self.lock:
            self.texts.append((spec_id, variant, text))

    # -- greedy streams through the openai client
    def greedy(self, client, spec):
        try:
            self.record(spec["id"], "openai-stream", run_greedy(client, spec))
            self.count("greedy streams")
        except Exception as e:  # noqa: BLE001 - every failure is a finding
            self.problem(f"greedy stream {spec} failed: {type(e).__name__}: {e}")

    # -- random disconnects
    def disconnects(self):
        rng = random.Random(self.seed + 1)
        for i in range(self.sizes["disconnects"]):
            chat = rng.random() < 0.5
            req = (fat_endless_request() if rng.random() < 0.3 else
                   post_bytes("/v1/chat/completions" if chat else "/v1/completions",
                              {"model": "smol", "max_tokens": 100000, "temperature": 0,
                               "stream": True,
                               **({"messages": ENDLESS_CHAT} if chat else {"prompt": ENDLESS})}))
            c = self.s.connect()
            try:
                if rng.random() < 0.3:
                    set_rst_on_close(c)
                if rng.random() < 0.15:  # gone in the middle of sending the request
                    c.sendall(req[:rng.randrange(1, len(req))])
                    self.count("disconnects mid-request")
                    continue
                c.sendall(req)
                want = rng.choice([0, 0, rng.randrange(1, 400), rng.randrange(400, 8000)])
                got = b""
                c.settimeout(60 * max(1.0, SCALE))  # the 200 waits for a slot
                while len(got) < want:
                    chunk = c.recv(want - len(got))
                    if not chunk:
                        self.problem(f"disconnect stream {i}: server closed after "
                                     f"{len(got)} bytes: {got[-300:]!r}")
                        break
                    got += chunk
                if got and not b"HTTP/1.1 200 OK\r\n".startswith(got[:17]):
                    self.problem(f"disconnect stream {i} got a non-200 answer: {got[:300]!r}")
                if got.startswith(b"HTTP/1.1 200"):
                    self.count("disconnects after the 200")
                else:
                    self.count("disconnects before the 200")
            except (socket.timeout, OSError) as e:
                self.problem(f"disconnect stream {i}: {type(e).__name__}: {e}")
            finally:
                c.close()
            time.sleep(rng.random() * 0.3)

    # -- readers below --min-read-rate: the server must close them
    def slow_reader(self, k):
        c = self.s.connect(rcvbuf=4096)
        try:
            c.sendall(fat_endless_request())
            t0 = time.time()
            # ~1 KB/s, below --min-read-rate as long as tokens come faster than one
            # ~2 KB frame every two seconds (they do once the rest of the round is over)
            got, how = read_to_end(c, timeout=SLOW_LIMIT_S, step=512, pause=0.5)
            if how == "timeout":
                self.problem(f"slow reader {k} (1 KB/s < {MIN_READ_RATE} B/s) was never closed; "
                             f"read {len(got)} bytes")
            elif not got.startswith(b"HTTP/1.1 200"):
                self.problem(f"slow reader {k} got {got[:200]!r}")
            elif b"data: [DONE]" in got:
                self.problem(f"slow reader {k}: a 100000-token stream ended with [DONE]")
            self.count("slow readers closed by the server")
            with self.lock:
                self.counts.setdefault("slow reader seconds", []).append(round(time.time() - t0))
        finally:
            c.close()

    # -- readers that never read: the server must close them after --write-stall-timeout
    def stalled_reader(self, k):
        c = self.s.connect(rcvbuf=4096)
        try:
            c.sendall(fat_endless_request())
            t0 = time.time()
            # read nothing until the rest of the round is over (at least a few stall
            # timeouts); the server should have closed us by then
            self.others_done.wait(600)
            t_others = time.time()
            while time.time() < max(t0 + 4 * STALL_S + 10, t_others + 2 * STALL_S + 10):
                time.sleep(0.5)
            # Now drain. A server that closed us delivers what it had queued and then
            # its FIN (or a reset) at once; one that did not would go on streaming.
            got, how = read_to_end(c, timeout=20)
            if how == "timeout":
                self.problem(f"stalled reader {k} was still open {time.time() - t0:.0f} s "
                             f"after it stopped reading (write-stall-timeout {STALL_S} s)")
            elif not got.startswith(b"HTTP/1.1 200"):
                self.problem(f"stalled reader {k} got {got[:200]!r}")
            elif b"data: [DONE]" in got:
                self.problem(f"stalled reader {k}: a 100000-token stream ended with [DONE]")
            self.count("stalled readers closed by the server")
        finally:
            c.close()

    # -- readers slower than tokens but above the minimum rate: paused and resumed,
    #    their text must come through whole
    def throttled_reader(self, spec):
        c = self.s.connect(rcvbuf=4096)
        try:
            c.sendall(post_bytes(spec_path(spec), spec_body(spec, True, logprobs=True,
                                                            top_logprobs=20), close=True))
            got, how = read_to_end(c, timeout=300, step=4096, pause=0.05)  # <= 80 KB/s
            if how != "eof":
                self.problem(f"throttled reader {spec}: ended by {how} after {len(got)} bytes")
                return
            got = parse_one(got)
            if got is None:
                self.problem(f"throttled reader {spec}: incomplete response")
                return
            (status, _, body), _ = got
            events = sse_data(body)
            text, finish, err = text_of(events)
            if status != 200 or err or events[-1:] != [b"[DONE]"] or finish is None:
                self.problem(f"throttled reader {spec}: status {status}, error {err}, "
                             f"finish {finish}, last events {events[-2:]}")
                return
            self.record(spec["id"], "raw-stream+logprobs, small rcvbuf", text)
            self.count("throttled readers")
        except Exception as e:  # noqa: BLE001
            self.problem(f"throttled reader {spec}: {type(e).__name__}: {e}")
        finally:
            c.close()

    # -- pipelined requests on one keep-alive connection
    def pipeline(self):
        rng = random.Random(self.seed + 2)
        completions = [sp for sp in self.specs if sp["kind"] == "completions"]
        c = self.s.connect()
        try:
            rounds = self.sizes["pipeline rounds"]
            for r in range(rounds):
                spec = completions[rng.randrange(len(completions))]
                stream = r % 2 == 1
                n_before = rng.randint(2, 4)
                last = r == rounds - 1
                data = (get_bytes("/health") * n_before +
                        post_bytes("/v1/completions", spec_body(spec, stream)) +
                        get_bytes("/health", close=last))
                c.sendall(data)
                resps, rest, how = read_responses(c, n_before + 2, timeout=300)
                if how != "ok":
                    self.problem(f"pipeline round {r}: {len(resps)} of {n_before + 2} responses, "
                                 f"then {how}")
                    return
                for j, (status, _, body) in enumerate(resps):
                    if status != 200:
                        self.problem(f"pipeline round {r} response {j}: status {status} {body!r}")
                        return
                    if j == n_before:  # the completion, in its place
                        if stream:
                            text, finish, err = text_of(sse_data(body))
                            if err or finish is None or not body.endswith(b"data: [DONE]\n\n"):
                                self.problem(f"pipeline round {r}: stream {body[-300:]!r}")
                                return
                        else:
                            obj = json.loads(body)
                            if obj.get("object") != "text_completion":
                                self.problem(f"pipeline round {r}: response {j} out of order: "
                                             f"{body[:200]!r}")
                                return
                            text = obj["choices"][0]["text"]
                        self.record(spec["id"], "pipelined " + ("stream" if stream else "json"),
                                    text)
                    elif json.loads(body).get("status") != "ok":
                        self.problem(f"pipeline round {r}: response {j} out of order: "
                                     f"{body[:200]!r}")
                        return
                if rest:
                    self.problem(f"pipeline round {r}: extra bytes after the answers: {rest!r}")
                if last:
                    tail, how = read_to_end(c, timeout=10)
                    if tail or how != "eof":
                        self.problem(f"pipeline: after Connection: close got {tail!r}, {how}")
                self.count("pipelined requests", n_before + 2)
                self.count("pipeline rounds")
        except Exception as e:  # noqa: BLE001
            self.problem(f"pipeline: {type(e).__name__}: {e}")
        finally:
            c.close()

    # -- malformed requests: each its 4xx, never a 5xx, never a reset before the status line
    def malformed(self):
        rng = random.Random(self.seed + 3)
        kinds = malformed_requests()
        for r in range(self.sizes["malformed rounds"]):
            rng.shuffle(kinds)
            for name, data, expect in kinds:
                c = self.s.connect()
                try:
                    try:
                        c.sendall(data)
                    except OSError as e:
                        self.problem(f"malformed '{name}': sending failed: {e}")
                        continue
                    resps, _, how = read_responses(c, 1, timeout=60)
                    if not resps:
                        self.problem(f"malformed '{name}': no status line, connection {how}")
                        continue
                    status, _, body = resps[0]
                    if status not in expect:
                        self.problem(f"malformed '{name}': status {status}, expected {expect}: "
                                     f"{body[:300]!r}")
                        continue
                    err = json.loads(body)["error"]
                    if not (isinstance(err["message"], str) and "type" in err):
                        self.problem(f"malformed '{name}': error body {body!r}")
                    self.count("malformed requests")
                    self.count(f"malformed -> {status}")
                except Exception as e:  # noqa: BLE001
                    self.problem(f"malformed '{name}': {type(e).__name__}: {e}")
                finally:
                    c.close()
                time.sleep(rng.random() * 0.1)

    # -- many short connections and many cheap requests, so that memory kept per
    #    connection or per request shows in RSS (see RSS_BOUND_KIB)
    def churn(self):
        rng = random.Random(self.seed + 4)
        for i in range(self.sizes["churn connections"]):
            c = self.s.connect()
            try:
                if i % 2 == 0:
                    c.sendall(get_bytes("/health", close=True))
                    resps, _, how = read_responses(c, 1, timeout=60)
                    if not resps or resps[0][0] != 200:
                        self.problem(f"churn connection {i}: {resps} {how}")
                        return
                else:  # connect, maybe start a request, and go
                    c.sendall(b"GET /health HTTP/1.1\r\n"[:rng.randrange(0, 12)])
            except OSError as e:
                self.problem(f"churn connection {i}: {type(e).__name__}: {e}")
                return
            finally:
                c.close()
        self.count("churn connections", self.sizes["churn connections"])
        # parsed, JSON-decoded and refused before the engine: 10 pipelined at a time
        # (24 KB bodies: 1000 of them kept would be 24 MiB)
        refused = post_bytes("/v1/completions", {"model": "no-such-model",
                                                 "prompt": "x" * 24000, "max_tokens": 1})
        c = self.s.connect()
        try:
            for b in range(self.sizes["churn requests"] // 10):
                c.sendall(refused * 10)
                resps, rest, how = read_responses(c, 10, timeout=60)
                if how != "ok" or rest or [st for st, _, _ in resps] != [404] * 10:
                    self.problem(f"churn requests batch {b}: {how} "
                                 f"{[st for st, _, _ in resps]} {rest[:200]!r}")
                    return
                self.count("churn requests", 10)
        except OSError as e:
            self.problem(f"churn requests: {type(e).__name__}: {e}")
        finally:
            c.close()

    # -- a scrape now and then: the chaos must really reach its states
    def poll_metrics(self, stop):
        while not stop.is_set():
            try:
                m = self.s.metrics()
            except Exception as e:  # noqa: BLE001
                self.problem(f"/metrics during the chaos: {type(e).__name__}: {e}")
                return
            with self.lock:
                for k in IDLE:
                    if k in m:
                        self.max_gauges[k] = max(self.max_gauges.get(k, 0), m[k])
            stop.wait(0.5)

    def run(self, client):
        t0 = time.time()
        stop_poll = threading.Event()
        poller = threading.Thread(target=self.poll_metrics, args=(stop_poll,), daemon=True)
        poller.start()
        greedy_jobs = [sp for sp in self.specs for _ in range(self.sizes["greedy repeats"])]
        random.Random(self.seed).shuffle(greedy_jobs)
        chat_specs = [sp for sp in self.specs if sp["kind"] == "chat"]
        with ThreadPoolExecutor(max_workers=6, thread_name_prefix="greedy") as gx, \
                ThreadPoolExecutor(max_workers=32, thread_name_prefix="chaos") as cx:
            others = [gx.submit(self.greedy, client, sp) for sp in greedy_jobs]
            others.append(cx.submit(self.disconnects))
            others.append(cx.submit(self.pipeline))
            others.append(cx.submit(self.malformed))
            others.append(cx.submit(self.churn))
            others += [cx.submit(self.slow_reader, k) for k in range(self.sizes["slow readers"])]
            others += [cx.submit(self.throttled_reader, chat_specs[k % len(chat_specs)])
                       for k in range(self.sizes["throttled readers"])]
            stalled = [cx.submit(self.stalled_reader, k)
                       for k in range(self.sizes["stalled readers"])]
            for f in others:
                f.result()
            self.others_done.set()
            for f in stalled:
                f.result()
        stop_poll.set()
        poller.join(10)
        self.seconds = time.time() - t0


def log_levels(lines):
    """Counts of the server's log lines by level, and the lines at warn or error."""
    levels, bad = {}, []
    for line in lines:
        m = re.match(r"\S+Z (\w+) ", line)
        if not m:
            continue
        levels[m.group(1)] = levels.get(m.group(1), 0) + 1
        if m.group(1) in ("warn", "error"):
            bad.append(line.rstrip())
    return levels, bad


def metrics_idle(m):
    bad = {k: m.get(k) for k, v in IDLE.items() if m.get(k) != v}
    if m.get("streamsink_kv_slots_free") != m.get("streamsink_kv_slots_total"):
        bad["streamsink_kv_slots_free"] = (m.get("streamsink_kv_slots_free"),
                                           m.get("streamsink_kv_slots_total"))
    return bad


def wait_idle(s, timeout):
    """Waits until every gauge is at its idle value, or the timeout.
    Returns (metrics, seconds waited, the gauges not at their idle value)."""
    t0 = time.time()
    while True:
        m = s.metrics()
        bad = metrics_idle(m)
        if not bad or time.time() - t0 > timeout:
            return m, time.time() - t0, bad
        time.sleep(0.25)


def server_failures(m):
    """Answers that mean the server failed or ran out of room: none is expected here
    (505 is the answer to an HTTP/1.2 request line, a client error)."""
    return {k: v for k, v in m.items()
            if k.startswith("streamsink_requests_total{") and v and
            any(f'status="{st}"' in k for st in (429, 500, 501, 503))}


# ---- shutdown with streams running -----------------------------------------------------------


def shutdown_streams(s, n_long):
    """Starts n_long endless raw streams and one short one, SIGTERMs once each has
    sent tokens, and checks how each ends and how the process exits."""
    reqs = [post_bytes("/v1/completions", {"model": "smol", "prompt": ENDLESS, "temperature": 0,
                                           "max_tokens": 100000, "stream": True})
            for _ in range(n_long)]
    reqs.append(post_bytes("/v1/chat/completions",
                           {"model": "smol", "messages": [{"role": "user", "content": "Hi"}],
                            "max_tokens": 24, "temperature": 0, "stream": True}))
    socks, first = [], []
    for r in reqs:
        c = s.connect()
        c.sendall(r)
        socks.append(c)
    for k, c in enumerate(socks):  # wait until every stream has sent a token
        buf = b""
        c.settimeout(120)
        deadline = time.time() + 120
        while buf.count(b"data: {") < 1 and time.time() < deadline:
            chunk = c.recv(65536)
            assert chunk, f"shutdown stream {k} closed before its first token: {buf!r}"
            buf += chunk
        assert buf.startswith(b"HTTP/1.1 200"), buf[:300]
        first.append(buf)
    # and an idle keep-alive connection: the drain closes it at once, not at the exit
    idle = s.connect()
    idle.sendall(get_bytes("/health"))
    resps, _, how = read_responses(idle, 1, timeout=60)
    assert how == "ok" and resps[0][0] == 200, (resps, how)
    results = [None] * len(socks)
    idle_end = {}

    def reader(k):
        results[k] = read_to_end(socks[k], timeout=DRAIN_S + 30)

    def idle_reader():
        got, how = read_to_end(idle, timeout=DRAIN_S + 30)
        idle_end.update(at=time.time(), got=got, how=how)

    threads = [threading.Thread(target=reader, args=(k,), daemon=True) for k in range(len(socks))]
    threads.append(threading.Thread(target=idle_reader, daemon=True))
    for t in threads:
        t.start()
    t0 = time.time()
    s.proc.send_signal(signal.SIGTERM)
    try:
        rc = s.proc.wait(DRAIN_S + 10)
    except Exception:  # noqa: BLE001
        rc = "still running"
    exit_s = time.time() - t0
    for t in threads:
        t.join(DRAIN_S + 35)
    for c in socks + [idle]:
        c.close()
    assert rc == 0, f"exit status {rc} {exit_s:.1f} s after SIGTERM\n{s.log()[-3000:]}"
    assert exit_s < DRAIN_S + 8, f"exit took {exit_s:.1f} s (drain timeout {DRAIN_S} s)"
    assert idle_end.get("how") == "eof" and idle_end["got"] == b"", idle_end
    idle_s = idle_end["at"] - t0
    assert idle_s < exit_s - 1.0, \
        f"the idle connection closed {idle_s:.1f} s after SIGTERM, the exit came at {exit_s:.1f} s"

    endings = []
    for k, (rest, how) in enumerate(results):
        raw = first[k] + rest
        assert how == "eof", f"shutdown stream {k} ended by {how}: {raw[-300:]!r}"
        assert raw.endswith(b"0\r\n\r\n"), f"stream {k} lacks its last chunk: {raw[-300:]!r}"
        parsed = parse_one(raw)
        assert parsed is not None and parsed[1] == b"", f"stream {k}: bad framing {raw[-300:]!r}"
        (status, _, body), _ = parsed
        events = sse_data(body)
        assert status == 200 and events[-1:] == [b"[DONE]"], (k, status, events[-3:])
        last = json.loads(events[-2])
        if "error" in last:
            assert last["error"]["code"] == "server_shutting_down", last
            endings.append("cut")
        else:
            _, finish, err = text_of(events)
            assert err is None and finish in ("stop", "length"), (k, events[-3:])
            endings.append("finished")
    # an endless stream cannot finish within the drain timeout: it must be cut
    assert endings[:n_long] == ["cut"] * n_long, endings
    return endings, exit_s, idle_s


# ---- the test ----------------------------------------------------------------------------------


def test_soak_chaos_then_identical_texts_idle_gauges_flat_rss_and_clean_shutdown(start_server):
    t_start = time.time()
    s = start_server(*SERVER_ARGS)
    pid = s.proc.pid
    specs = greedy_specs(scaled(8))
    client = s.client(timeout=600)
    rss_start = rss_kib(pid)

    warm_sizes = {"greedy repeats": 1, "disconnects": 4, "slow readers": 1, "stalled readers": 1,
                  "throttled readers": 1, "pipeline rounds": 2, "malformed rounds": 1,
                  "churn connections": 200, "churn requests": 100}
    warm = Round(s, "warm-up", warm_sizes, specs[:4], SEED)
    warm.run(client)
    client.close()  # its pooled keep-alive connections would count as open
    assert not warm.problems, "\n".join(warm.problems)
    _, warm_idle_s, bad = wait_idle(s, IDLE_WAIT_S)
    assert not bad, f"gauges not idle {IDLE_WAIT_S} s after the warm-up: {bad}"
    m_before = s.metrics()
    rss_warm = rss_kib(pid)

    sizes = {"greedy repeats": 2, "disconnects": scaled(24), "slow readers": scaled(2),
             "stalled readers": scaled(2), "throttled readers": scaled(2),
             "pipeline rounds": scaled(4), "malformed rounds": scaled(3),
             "churn connections": scaled(3000), "churn requests": scaled(1000)}
    client = s.client(timeout=600)
    chaos = Round(s, "chaos", sizes, specs, SEED + 100)
    chaos.run(client)
    client.close()
    rss_chaos_peak = rss_kib(pid)
    levels, warned = log_levels(s.lines)

    m_after, idle_s, not_idle = wait_idle(s, IDLE_WAIT_S)
    rss_after = rss_kib(pid)
    delta = {k: m_after.get(k, 0) - m_before.get(k, 0) for k in COUNTERS}

    # 1. every text equals the same request alone on the quiet server
    t_solo = time.time()
    solo_client = s.client(timeout=600)
    solo = {sp["id"]: run_greedy(solo_client, sp) for sp in specs}
    solo_client.close()
    solo_s = time.time() - t_solo
    texts = warm.texts + chaos.texts
    mismatches = [(sid, variant, text, solo[sid]) for sid, variant, text in texts
                  if text != solo[sid]]

    print(f"\n--- soak (scale {SCALE}, seed {SEED}) ---")
    print(f"warm-up {warm.seconds:.0f} s {dict(sorted(warm.counts.items()))}")
    print(f"chaos   {chaos.seconds:.0f} s {dict(sorted(chaos.counts.items()))}")
    short = {k.replace("streamsink_", ""): v for k, v in chaos.max_gauges.items()}
    print(f"chaos peaks: {short}")
    short = {k.replace("streamsink_", ""): v for k, v in delta.items()}
    print(f"counters during the chaos: {short}")
    print(f"gauges {'NOT ' if not_idle else ''}idle {idle_s:.1f} s after the chaos "
          f"(warm-up: {warm_idle_s:.1f} s) {not_idle or ''}")
    print(f"greedy texts compared: {len(texts)} against {len(solo)} solo runs ({solo_s:.0f} s), "
          f"{len(mismatches)} differ")
    print(f"server log until now: {levels}; warn/error lines: {warned[:5]}")
    print(f"RSS MiB: start {rss_start / 1024:.1f}, after warm-up {rss_warm / 1024:.1f}, "
          f"end of chaos {rss_chaos_peak / 1024:.1f}, idle after chaos {rss_after / 1024:.1f} "
          f"(+{(rss_after - rss_warm) / 1024:.1f}, bound +{RSS_BOUND_KIB / 1024:.0f})")

    assert not chaos.problems, "\n".join(chaos.problems)
    # 2. every gauge back to idle within a bounded wait
    assert not not_idle, (f"gauges not idle {IDLE_WAIT_S} s after the chaos: {not_idle}\n"
                          f"server log tail:\n{''.join(s.lines[-40:])}")
    assert not mismatches, "texts differ from their solo run:\n" + "\n".join(
        f"spec {sid} ({variant}):\n  chaos {text!r}\n  solo  {solo_text!r}"
        for sid, variant, text, solo_text in mismatches[:10])
    # the chaos must have reached the states it is meant to exercise
    assert chaos.max_gauges.get("streamsink_paused_sequences", 0) >= 1, chaos.max_gauges
    assert chaos.max_gauges.get("streamsink_active_sequences", 0) >= 2, chaos.max_gauges
    n_closed = sizes["slow readers"] + sizes["stalled readers"]
    closes = (delta["streamsink_write_stall_closes_total"] +
              delta["streamsink_slow_reader_closes_total"])
    assert closes >= n_closed, (closes, n_closed, delta)
    # disconnects: those that saw their 200 were running; none was counted twice
    after_200 = chaos.counts.get("disconnects after the 200", 0)
    assert after_200 <= delta["streamsink_client_disconnects_total"] <= sizes["disconnects"], \
        (after_200, delta)
    assert delta["streamsink_connections_rejected_total"] == 0, delta
    assert delta["streamsink_connections_reclaimed_total"] == 0, delta
    assert not server_failures(m_after), server_failures(m_after)
    assert not warned, "the server warned or failed during the chaos:\n" + "\n".join(warned)

    # 3. no memory kept per connection or request: RSS back near its warm-up level
    assert rss_after - rss_warm < RSS_BOUND_KIB, \
        f"RSS grew by {(rss_after - rss_warm) / 1024:.1f} MiB over the chaos round"

    # 4. SIGTERM with streams running
    endings, exit_s, idle_s = shutdown_streams(s, n_long=scaled(2))
    print(f"SIGTERM: exit 0 after {exit_s:.1f} s (drain timeout {DRAIN_S} s); "
          f"streams: {endings}; idle keep-alive connection closed after {idle_s:.1f} s")
    print(f"total {time.time() - t_start:.0f} s")
    assert "drain timeout" in s.log(), s.log()[-2000:]
