"""Streams outlive their TCP connection: every SSE event carries an id, the
response names its stream (X-Stream-Id), and a client that lost the
connection resumes with GET /v1/streams/{id} and Last-Event-ID, receiving
every later event exactly once, then the live stream, then [DONE].

The reference for "exactly once" is an uninterrupted greedy run of the same
request through the official openai client: the texts must be identical."""

import json
import re
import socket
import time

import pytest

from conftest import ENDLESS, Server, parse_response

KEY = "sk-resume-owner"
OTHER_KEY = "sk-resume-other"
BUF = 4096  # --stream-buffer: about twenty completion chunks
AUTH = {"Authorization": f"Bearer {KEY}"}


# ---- a raw SSE client ----------------------------------------------------------------------


class SSE:
    """One HTTP/1.1 response read from a socket: status and headers, then the
    body (de-chunked as it arrives) parsed into SSE events the way the WHATWG
    EventSource does: 'id' sets the last event id, 'data' lines join with \\n,
    a blank line dispatches, lines starting with ':' are comments."""

    def __init__(self, sock):
        self.sock = sock
        self.raw = b""
        self.body = b""
        self.chunked = False
        self.eof = False
        self.status, self.headers = self._head()

    def _recv(self):
        try:
            data = self.sock.recv(65536)
        except (ConnectionResetError, socket.timeout):
            data = b""
        if not data:
            self.eof = True
        self.raw += data

    def _head(self):
        while b"\r\n\r\n" not in self.raw:
            self._recv()
            if self.eof:
                raise AssertionError(f"no response head: {self.raw!r}")
        head, _, self.raw = self.raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        self.chunked = headers.get("transfer-encoding") == "chunked"
        return int(lines[0].split()[1]), headers

    def _fill(self):
        """Moves more body bytes from the socket into self.body; False at the end."""
        while True:
            if not self.chunked:
                if self.raw:
                    self.body += self.raw
                    self.raw = b""
                    return True
            else:
                line, sep, rest = self.raw.partition(b"\r\n")
                if sep:
                    n = int(line.split(b";")[0], 16)
                    if n == 0:
                        return False
                    if len(rest) >= n + 2:
                        self.body += rest[:n]
                        self.raw = rest[n + 2:]
                        return True
            if self.eof:
                return False
            self._recv()

    def events(self):
        """Yields (id or None, data) per dispatched event; comments are skipped."""
        eid, data = None, []
        while True:
            while b"\n" not in self.body:
                if not self._fill():
                    return
            line, _, self.body = self.body.partition(b"\n")
            line = line.decode()
            if line == "":
                if data:
                    yield eid, "\n".join(data)
                eid, data = None, []
            elif line.startswith(":"):
                continue
            else:
                field, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if field == "id":
                    eid = value
                elif field == "data":
                    data.append(value)

    def rest(self):
        """Every remaining body byte, until the end of the response."""
        while self._fill():
            pass
        return self.body


def post_stream(server, path, body, headers=AUTH):
    s = server.connect()
    data = json.dumps(body).encode()
    h = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    s.sendall((f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(data)}\r\n{h}\r\n").encode() + data)
    return SSE(s)


def resume(server, sid, last_id=None, headers=AUTH):
    s = server.connect()
    h = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    if last_id is not None:
        h += f"Last-Event-ID: {last_id}\r\n"
    s.sendall(f"GET /v1/streams/{sid} HTTP/1.1\r\nHost: x\r\n{h}\r\n".encode())
    return SSE(s)


def error_of(resp):
    status, _, body = resp
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    return status, err["code"]


def text_of(data, chat):
    if data == "[DONE]":
        return ""
    obj = json.loads(data)
    if "error" in obj:
        raise AssertionError(obj)
    out = ""
    for ch in obj["choices"]:
        out += (ch["delta"].get("content") or "") if chat else ch["text"]
    return out


# ---- servers and references --------------------------------------------------------------------


@pytest.fixture(scope="module")
def srv(binary, model, tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "keys"
    keys.write_text(f"{KEY}\n{OTHER_KEY}\n")
    # keep-alive comments between nearly every two events: the official client must cope
    s = Server(binary, model, ["--api-key-file", str(keys), "--stream-buffer", str(BUF),
                               "--stream-grace", "60", "--max-seqs", "4",
                               "--sse-keepalive", "0.02"])
    yield s
    assert s.stop() == 0, s.log()


COMPLETION = {"model": "smol", "prompt": ENDLESS, "max_tokens": 40, "temperature": 0,
              "stream": True}
CHAT = {"model": "smol", "messages": [{"role": "user", "content": "Name three colors."}],
        "max_tokens": 24, "temperature": 0, "stream": True}


@pytest.fixture(scope="module")
def reference(srv):
    """Uninterrupted greedy runs through the official openai client."""
    c = srv.client(api_key=KEY)
    out = {}
    body = dict(COMPLETION)
    out["completion"] = "".join(ch.choices[0].text for ch in c.completions.create(**body))
    chat = dict(CHAT)
    out["chat"] = "".join(ch.choices[0].delta.content or ""
                          for ch in c.chat.completions.create(**chat) if ch.choices)
    assert len(out["completion"]) > 20 and len(out["chat"]) > 5, out
    return out


def collect(sse, chat, ids, stop_after=None):
    """Appends (id, data) of sse's events to ids until [DONE] or stop_after events;
    returns the text."""
    text = ""
    n = 0
    for eid, data in sse.events():
        ids.append((eid, data))
        text += text_of(data, chat)
        n += 1
        if data == "[DONE]" or (stop_after is not None and n >= stop_after):
            break
    return text


def check_ids(events):
    """Ids are 1, 2, 3, ... with none missing or repeated; [DONE] is last."""
    ids = [int(e) for e, _ in events]
    assert ids == list(range(1, len(ids) + 1)), ids
    assert events[-1][1] == "[DONE]"
    assert all(d != "[DONE]" for _, d in events[:-1])


# ---- tests -------------------------------------------------------------------------------------


def test_every_event_has_an_id_and_the_response_names_its_stream(srv, reference):
    sids = set()
    for _ in range(2):
        sse = post_stream(srv, "/v1/completions", COMPLETION)
        assert sse.status == 200
        sid = sse.headers["x-stream-id"]
        assert re.fullmatch(r"[0-9a-f]{32}", sid), sid
        sids.add(sid)
        events = []
        text = collect(sse, False, events)
        sse.sock.close()
        check_ids(events)
        assert text == reference["completion"]
    assert len(sids) == 2


def test_keepalives_between_events_are_comment_lines_the_openai_client_skips(srv, reference):
    """A keep-alive is ': keep-alive' and no blank line: the openai client keeps
    the last event id across events and would dispatch the blank line as an
    event with empty data, which it then fails to parse as JSON."""
    s = srv.connect()
    # a prompt of about 2,000 tokens: its prefill keeps the stream without an
    # event for far longer than the keep-alive period on any machine (decoding
    # alone can emit every token sooner than that)
    long_prompt = "Count to one thousand: " + ", ".join(str(i) for i in range(1, 800)) + ","
    data = json.dumps({**COMPLETION, "prompt": long_prompt, "max_tokens": 8}).encode()
    s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
               f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode() + data)
    raw = b""
    while True:
        got = s.recv(65536)
        if not got:
            break
        raw += got
    s.close()
    body = parse_response(raw)[2]
    assert body.count(b": keep-alive\n") >= 1  # the test means something
    assert b": keep-alive\n\n" not in body
    # the reference fixture streamed through the openai client over the same server
    assert len(reference["completion"]) > 20


def test_resume_after_a_mid_stream_disconnect_yields_every_token_once(srv, reference):
    first = post_stream(srv, "/v1/completions", COMPLETION)
    sid = first.headers["x-stream-id"]
    events = []
    text = collect(first, False, events, stop_after=5)
    first.sock.close()  # the connection dies mid-stream
    srv.wait_metric("streamsink_streams_detached", lambda v: v >= 1, timeout=10)
    second = resume(srv, sid, events[-1][0])
    assert second.status == 200
    assert second.headers["x-stream-id"] == sid
    assert second.headers["content-type"].startswith("text/event-stream")
    text += collect(second, False, events)
    second.sock.close()
    check_ids(events)
    assert text == reference["completion"]


def test_a_chat_stream_from_the_openai_client_resumes_where_it_broke(srv, reference):
    c = srv.client(api_key=KEY)
    raw = c.chat.completions.with_raw_response.create(**CHAT)
    sid = raw.headers["x-stream-id"]
    stream = raw.parse()
    text = ""
    it = iter(stream)
    for _ in range(4):  # the role chunk and three tokens
        ch = next(it)
        text += ch.choices[0].delta.content or ""
    stream.close()
    # the client saw events 1..4; a reconnect names the last one
    events = []
    sse = resume(srv, sid, 4)
    text += collect(sse, True, events)
    sse.sock.close()
    assert [int(e) for e, _ in events] == list(range(5, 5 + len(events)))
    assert events[-1][1] == "[DONE]"
    assert text == reference["chat"]


def test_eventsource_style_reconnects_deliver_everything_exactly_once(srv, reference):
    """The WHATWG EventSource algorithm: keep the last id seen, reconnect to the
    same URL sending it as Last-Event-ID, until the stream ends."""
    first = post_stream(srv, "/v1/completions", COMPLETION)
    sid = first.headers["x-stream-id"]
    events = []
    collect(first, False, events, stop_after=1)
    first.sock.close()
    last_id = events[-1][0]
    for _ in range(200):
        sse = resume(srv, sid, last_id)
        assert sse.status == 200, sse.rest()
        got = []
        collect(sse, False, got, stop_after=3)  # then the connection drops again
        sse.sock.close()
        events += got
        if got:
            last_id = got[-1][0]
        if events[-1][1] == "[DONE]":
            break
    check_ids(events)
    assert "".join(text_of(d, False) for _, d in events) == reference["completion"]
    # without Last-Event-ID: from the start, as far as the buffer still holds it
    sse = resume(srv, sid)
    if sse.status == 200:
        again = []
        collect(sse, False, again)
        assert again == events[len(events) - len(again):]
    else:
        assert sse.status == 410
    sse.sock.close()


def wait_detached_full(srv, timeout=120):
    """The metrics once a stream with no client has filled its buffer and
    its sequence is paused (or as they stand at the timeout)."""
    deadline = time.time() + timeout
    while True:
        m = srv.metrics()
        if m["streamsink_streams_buffer_full"] >= 1 and m["streamsink_paused_sequences"] >= 1:
            return m
        if time.time() >= deadline:
            return m
        time.sleep(0.2)


def test_detached_generation_fills_the_buffer_pauses_and_resumes_completely(srv, reference):
    # the finished streams of earlier tests keep their tails (constant, or less as they expire)
    base = srv.metrics()["streamsink_stream_buffer_bytes"]
    first = post_stream(srv, "/v1/completions", COMPLETION)
    sid = first.headers["x-stream-id"]
    events = []
    collect(first, False, events, stop_after=2)
    first.sock.close()
    # 40 chunks are about twice --stream-buffer: the detached stream fills it and pauses
    m = wait_detached_full(srv)
    assert m["streamsink_streams_buffer_full"] == 1, m
    assert m["streamsink_paused_sequences"] == 1, m
    # bounded: the limit plus the event or two in flight when the pause landed
    assert m["streamsink_stream_buffer_bytes"] - base <= BUF + 2048, (base, m)
    gen = m["streamsink_generated_tokens_total"]
    assert m["streamsink_requests_inflight"] >= 1
    time.sleep(1.5)
    assert srv.metrics()["streamsink_generated_tokens_total"] - gen <= 1
    # nothing was dropped: the resumed stream completes the greedy text
    sse = resume(srv, sid, events[-1][0])
    collect(sse, False, events)
    sse.sock.close()
    check_ids(events)
    assert "".join(text_of(d, False) for _, d in events) == reference["completion"]
    srv.wait_metric("streamsink_streams_buffer_full", lambda v: v == 0)


def test_a_stream_that_detaches_after_a_full_buffer_stays_within_it(srv):
    """A client read more than --stream-buffer (the delivered events were
    trimmed to the bound while it was attached), then left. The detached
    stream kept every delivered event and paused only when its undelivered
    ones filled the buffer: about twice the bound. Now it drops delivered
    events beyond half the buffer and pauses when the whole buffer is full,
    and still keeps the newest delivered ones, which a client may have lost
    in the broken connection: a resume from an event before the last one it
    got still completes the text."""
    body = dict(COMPLETION, max_tokens=120)
    c = srv.client(api_key=KEY)
    whole = "".join(ch.choices[0].text for ch in c.completions.create(**body))
    base = srv.metrics()["streamsink_stream_buffer_bytes"]
    first = post_stream(srv, "/v1/completions", body)
    sid = first.headers["x-stream-id"]
    events = []
    collect(first, False, events, stop_after=30)  # some 6 KB: more than BUF
    first.sock.close()
    m = wait_detached_full(srv)
    assert m["streamsink_streams_buffer_full"] == 1, m
    assert m["streamsink_stream_buffer_bytes"] - base <= BUF + 2048, (base, m)
    kept = events[:-3]  # as if the last three were lost in the socket
    sse = resume(srv, sid, kept[-1][0])
    assert sse.status == 200, sse.rest()
    collect(sse, False, kept)
    sse.sock.close()
    check_ids(kept)
    assert "".join(text_of(d, False) for _, d in kept) == whole
    srv.wait_metric("streamsink_streams_buffer_full", lambda v: v == 0)


def test_a_stream_whose_client_stopped_reading_goes_on_once_detached(srv):
    """A client that stops reading pauses its stream with the buffer nearly
    full of delivered events (written to its connection). Once it leaves,
    the detached stream drops those beyond half the buffer and generates
    ahead into the rest for a resume, then pauses, full."""
    body = dict(COMPLETION, max_tokens=3000, ignore_eos=True)
    data = json.dumps(body).encode()
    sock = srv.connect(rcvbuf=4096)
    h = "".join(f"{k}: {v}\r\n" for k, v in AUTH.items())
    sock.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                  f"application/json\r\nContent-Length: {len(data)}\r\n{h}\r\n").encode() + data)
    assert SSE(sock).status == 200  # the head only; then it reads nothing
    srv.wait_metric("streamsink_paused_sequences", lambda v: v == 1, timeout=120)
    time.sleep(0.5)  # the pause has landed: nothing more is made
    g0 = srv.metrics()["streamsink_generated_tokens_total"]
    sock.close()
    srv.wait_metric("streamsink_streams_buffer_full", lambda v: v == 1, timeout=60)
    srv.wait_metric("streamsink_paused_sequences", lambda v: v == 1, timeout=60)
    time.sleep(0.5)
    ahead = srv.metrics()["streamsink_generated_tokens_total"] - g0
    assert ahead >= 5, ahead  # half the buffer's worth of events: some ten tokens
    srv.wait_metric("streamsink_streams_buffer_full", lambda v: v == 1)


def test_a_second_client_takes_the_stream_over_and_the_first_is_closed(srv, reference):
    first = post_stream(srv, "/v1/completions", COMPLETION)
    sid = first.headers["x-stream-id"]
    events = []
    collect(first, False, events, stop_after=2)
    before = srv.metrics()["streamsink_stream_takeovers_total"]
    second = resume(srv, sid, events[-1][0])  # while the first is still attached
    assert second.status == 200
    # the first connection ends without [DONE]
    rest = first.rest()
    assert first.eof and b"[DONE]" not in rest
    first.sock.close()
    collect(second, False, events)
    second.sock.close()
    assert srv.metrics()["streamsink_stream_takeovers_total"] == before + 1
    # the second client got everything after the id it named, once
    ids = [int(e) for e, _ in events]
    tail = ids[2:]
    assert tail == list(range(3, 3 + len(tail))) and events[-1][1] == "[DONE]"
    assert "".join(text_of(d, False) for _, d in events[:2] + events[2:]) == \
        reference["completion"]


def test_a_finished_stream_stays_resumable_until_its_events_are_dropped(srv, reference):
    sse = post_stream(srv, "/v1/completions", COMPLETION)
    sid = sse.headers["x-stream-id"]
    events = []
    collect(sse, False, events)
    sse.sock.close()
    last = int(events[-1][0])
    # the tail is still there: the last two events again
    again = resume(srv, sid, last - 2)
    got = []
    collect(again, False, got)
    again.sock.close()
    assert got == events[-2:]
    # the client has everything: an empty, well-formed stream
    done = resume(srv, sid, last)
    assert done.status == 200 and done.rest() == b""
    done.sock.close()
    # the head was dropped to keep within --stream-buffer: 410
    assert error_of(srv.get(f"/v1/streams/{sid}", {**AUTH, "Last-Event-ID": "0"})) == \
        (410, "stream_events_expired")
    assert error_of(srv.get(f"/v1/streams/{sid}", AUTH)) == (410, "stream_events_expired")
    # beyond the last event: 400
    assert error_of(srv.get(f"/v1/streams/{sid}", {**AUTH, "Last-Event-ID": str(last + 1)})) == \
        (400, "invalid_last_event_id")


def test_only_the_key_that_started_a_stream_can_resume_it(srv):
    sse = post_stream(srv, "/v1/completions", COMPLETION)
    sid = sse.headers["x-stream-id"]
    collect(sse, False, [], stop_after=1)
    other = {"Authorization": f"Bearer {OTHER_KEY}"}
    # another valid key: as if the stream did not exist
    assert error_of(srv.get(f"/v1/streams/{sid}", {**other, "Last-Event-ID": "1"})) == \
        (404, "stream_not_found")
    assert error_of(srv.get("/v1/streams/" + "0" * 32, other)) == (404, "stream_not_found")
    # no key at all: 401 before anything is revealed
    assert srv.get(f"/v1/streams/{sid}")[0] == 401
    assert srv.get(f"/v1/streams/{sid}", {"Authorization": "Bearer sk-wrong"})[0] == 401
    # the owner still can
    own = resume(srv, sid, 1)
    assert own.status == 200
    collect(own, False, [])
    own.sock.close()
    sse.sock.close()


HOSTILE_IDS = ["", "x", "0" * 31, "0" * 33, "0" * 4000, "A" * 32, "g" * 32,
               "../../../../etc/passwd", "%00" + "0" * 29, "0" * 16 + "%2F" + "0" * 13,
               "0" * 32 + "/x", "0" * 32 + "%00", "\u00e9" * 16]

HOSTILE_LAST_IDS = ["-1", "abc", "1e3", "0x10", "18446744073709551616",
                    "9" * 60, "9" * 5000, "1 2", "+3", "3.0"]


def test_hostile_stream_ids_and_last_event_ids_get_clear_errors(srv):
    sse = post_stream(srv, "/v1/completions", COMPLETION)
    sid = sse.headers["x-stream-id"]
    events = []
    collect(sse, False, events)
    sse.sock.close()
    for bad in HOSTILE_IDS:
        path = "/v1/streams/" + bad
        raw = srv.raw(f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                      f"Connection: close\r\n\r\n".encode("utf-8"))
        status, _, body = parse_response(raw)
        assert status in (400, 404, 414), (bad[:40], status, body[:200])
        if status != 414:  # the transport's own 400s (a non-ASCII URL) carry no code
            assert json.loads(body)["error"]["code"] in ("invalid_stream_id", "stream_not_found",
                                                         "unknown_url", None)
    # a well-formed id nobody made
    assert error_of(srv.get("/v1/streams/" + "0123456789abcdef" * 2, AUTH)) == \
        (404, "stream_not_found")
    for bad in HOSTILE_LAST_IDS:
        status, _, body = srv.get(f"/v1/streams/{sid}", {**AUTH, "Last-Event-ID": bad})
        assert status in (400, 431), (bad[:40], status, body[:200])
        if status == 400:
            assert json.loads(body)["error"]["code"] == "invalid_last_event_id"
    # two Last-Event-ID headers: which one is meant?
    status, _, _ = parse_response(srv.raw(
        f"GET /v1/streams/{sid} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
        "Last-Event-ID: 1\r\nLast-Event-ID: 2\r\nConnection: close\r\n\r\n".encode()))
    assert status == 400
    # other methods
    status, headers, _ = parse_response(srv.raw(
        f"POST /v1/streams/{sid} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
        "Content-Length: 0\r\nConnection: close\r\n\r\n".encode()))
    assert status == 405 and headers["allow"] == "GET"
    status, headers, _ = parse_response(srv.raw(
        f"HEAD /v1/streams/{sid} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
        "Connection: close\r\n\r\n".encode()))
    assert status == 405 and headers["allow"] == "GET"
    # the server is fine, and the stream still resumes
    assert srv.get("/health")[0] == 200
    again = resume(srv, sid, int(events[-1][0]) - 1)
    assert again.status == 200
    got = []
    collect(again, False, got)
    again.sock.close()
    assert got == events[-1:]


def test_a_stream_nobody_resumes_is_cancelled_after_the_grace_period(start_server):
    s = start_server("--stream-grace", "5", "--max-seqs", "2")
    total = s.metrics()["streamsink_kv_slots_total"]
    body = {"model": "smol", "prompt": ENDLESS, "max_tokens": 100000, "temperature": 0,
            "stream": True}
    sse = post_stream(s, "/v1/completions", body, headers={})
    sid = sse.headers["x-stream-id"]
    collect(sse, False, [], stop_after=2)
    sse.sock.close()
    m = s.wait_metric("streamsink_streams_detached", lambda v: v == 1, timeout=10)
    assert m == 1
    assert s.metrics()["streamsink_kv_slots_free"] < total  # generating on, detached
    s.wait_metric("streamsink_streams_expired_total", lambda v: v == 1, timeout=30)
    s.wait_metric("streamsink_kv_slots_free", lambda v: v == total, timeout=10)
    m = s.metrics()
    assert m["streamsink_streams_detached"] == 0
    assert m["streamsink_active_sequences"] == 0
    assert m["streamsink_requests_inflight"] == 0
    assert m["streamsink_stream_buffer_bytes"] == 0
    assert error_of(s.get(f"/v1/streams/{sid}")) == (404, "stream_not_found")


def test_with_no_grace_a_disconnect_cancels_at_once(start_server):
    s = start_server("--stream-grace", "0")
    total = s.metrics()["streamsink_kv_slots_total"]
    body = {"model": "smol", "prompt": ENDLESS, "max_tokens": 2000, "temperature": 0,
            "stream": True}
    sse = post_stream(s, "/v1/completions", body, headers={})
    sid = sse.headers["x-stream-id"]
    collect(sse, False, [], stop_after=2)
    sse.sock.close()
    s.wait_metric("streamsink_kv_slots_free", lambda v: v == total, timeout=10)
    assert s.metrics()["streamsink_streams"] == 0
    assert error_of(s.get(f"/v1/streams/{sid}")) == (404, "stream_not_found")


def test_a_resume_pipelined_behind_its_own_stream_is_answered_once(start_server):
    # The client sends GET /v1/streams/{id} on the same connection while the
    # stream still runs. With no grace period the stream is gone once its
    # response ends, so the pipelined GET, run as that response ends, must
    # find nothing (404) rather than replay a stream that is being freed.
    s = start_server("--stream-grace", "0")
    body = {"model": "smol", "prompt": ENDLESS, "max_tokens": 24, "temperature": 0,
            "stream": True}
    sse = post_stream(s, "/v1/completions", body, headers={})
    sid = sse.headers["x-stream-id"]
    sse.sock.sendall(f"GET /v1/streams/{sid} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    events = []
    collect(sse, False, events)
    check_ids(events)
    sse.rest()
    leftover = sse.raw
    assert leftover.startswith(b"0\r\n\r\n"), leftover[:40]
    second = SSE.__new__(SSE)
    second.sock, second.raw, second.body = sse.sock, leftover[5:], b""
    second.chunked, second.eof = False, False
    second.status, second.headers = second._head()
    assert second.status == 404, (second.status, second.raw)
    n = int(second.headers["content-length"])
    while len(second.raw) < n and not second.eof:
        second._recv()
    assert json.loads(second.raw[:n])["error"]["code"] == "stream_not_found"
    sse.sock.close()
    assert s.get("/health")[0] == 200
    assert s.metrics()["streamsink_streams"] == 0


def start_and_drop(s, n, headers):
    """Starts n endless streams, reads two events of each, drops each
    connection; returns their stream ids, oldest first."""
    sids = []
    body = {"model": "smol", "prompt": ENDLESS, "max_tokens": 100000, "temperature": 0,
            "stream": True}
    for _ in range(n):
        sse = post_stream(s, "/v1/completions", body, headers=headers)
        assert sse.status == 200, sse.raw
        sids.append(sse.headers["x-stream-id"])
        collect(sse, False, [], stop_after=2)
        sse.sock.close()
        time.sleep(0.2)  # detached in this order
    return sids


def test_one_client_cannot_hold_every_slot_with_detached_streams(start_server):
    """Four streams dropped by one peer (an open server: the owner is the
    peer's address) with --max-detached 2: the two oldest are cancelled and
    free their KV slots, the two newest stay resumable."""
    s = start_server("--stream-grace", "60", "--max-seqs", "4", "--max-detached", "2")
    total = s.metrics()["streamsink_kv_slots_total"]
    assert total == 4
    sids = start_and_drop(s, 4, {})
    s.wait_metric("streamsink_streams_detach_limited_total", lambda v: v == 2, timeout=20)
    s.wait_metric("streamsink_kv_slots_free", lambda v: v >= 2, timeout=20)
    m = s.metrics()
    assert m["streamsink_streams_detached"] == 2
    assert m["streamsink_active_sequences"] == 2
    for sid in sids[:2]:
        assert error_of(s.get(f"/v1/streams/{sid}")) == (404, "stream_not_found")
    for sid in sids[2:]:
        sse = resume(s, sid, 1, headers={})
        assert sse.status == 200
        assert [e for e, _ in collect_n(sse, 1)] == ["2"]
        sse.sock.close()
    # another request is served at once: the slots the limit freed
    sse = post_stream(s, "/v1/completions", {"model": "smol", "prompt": "Hi", "max_tokens": 2,
                                             "stream": True}, headers={})
    assert sse.status == 200
    sse.rest()
    sse.sock.close()


def test_the_detached_limit_counts_each_api_key_on_its_own(start_server):
    s = start_server("--stream-grace", "60", "--max-seqs", "4", "--max-detached", "2",
                     "--api-key", "key-a", "--api-key", "key-b")
    a = {"Authorization": "Bearer key-a"}
    b = {"Authorization": "Bearer key-b"}
    sids_b = start_and_drop(s, 1, b)
    sids_a = start_and_drop(s, 3, a)
    s.wait_metric("streamsink_streams_detach_limited_total", lambda v: v == 1, timeout=20)
    time.sleep(0.5)
    m = s.metrics()
    assert m["streamsink_streams_detach_limited_total"] == 1
    assert m["streamsink_streams_detached"] == 3
    assert error_of(s.get(f"/v1/streams/{sids_a[0]}", headers=a)) == (404, "stream_not_found")
    for sid, h in ((sids_a[1], a), (sids_a[2], a), (sids_b[0], b)):
        sse = resume(s, sid, 1, headers=h)
        assert sse.status == 200, sid
        sse.sock.close()


def collect_n(sse, n):
    out = []
    for eid, data in sse.events():
        out.append((eid, data))
        if len(out) == n:
            break
    return out


def test_a_stream_paused_by_the_total_bound_goes_on_when_room_comes_back(start_server):
    """--stream-buffer-total pauses a detached stream when all buffers
    together are full. When another stream's buffer is freed (it expired),
    the paused one generates again within a sweep, not only if its client
    comes back.

    The first stream's tail must outlive the second's pause: the grace is
    long enough for a loaded machine to start the second stream and fill
    its buffer (with 6 s, and 2 s of them slept away, a test thread late by
    4 s found the first expired), and the expiry is waited for."""
    s = start_server("--stream-buffer", "8192", "--stream-buffer-total", "8192",
                     "--stream-grace", "20", "--max-seqs", "4")
    short = {"model": "smol", "prompt": ENDLESS, "max_tokens": 24, "temperature": 0,
             "stream": True}
    sse = post_stream(s, "/v1/completions", short, headers={})
    collect(sse, False, [], stop_after=1)
    sse.sock.close()  # finishes detached; its tail stays for the grace period
    s.wait_metric("streamsink_streams_detached", lambda v: v == 0, timeout=30)
    endless = dict(short, max_tokens=100000)
    sse = post_stream(s, "/v1/completions", endless, headers={})
    collect(sse, False, [], stop_after=1)
    sse.sock.close()
    s.wait_metric("streamsink_streams_buffer_full", lambda v: v == 1, timeout=30)
    # the pause has landed (the step in flight at it too): its count is final
    s.wait_metric("streamsink_paused_sequences", lambda v: v == 1, timeout=30)
    m = s.metrics()
    assert m["streamsink_streams"] == 2, "the first stream expired too soon for this test"
    assert m["streamsink_paused_sequences"] == 1
    paused_at = m["streamsink_generated_tokens_total"]
    s.wait_metric("streamsink_streams", lambda v: v == 1, timeout=60)  # the first expired
    # within a sweep or so of the expiry (a loaded machine's loop may be late)
    s.wait_metric("streamsink_generated_tokens_total", lambda v: v > paused_at, timeout=10)


def test_a_finished_stream_outlives_a_connection_that_stalled_on_its_tail(start_server):
    """A stream that finished while its client stopped reading has its last
    events in the connection's queue, not with the client. The grace period
    runs from when they leave that queue or the connection closes (here:
    the write-stall timeout, longer than the grace), so the client can
    still resume from the last event it received. The close is counted as a
    write stall."""
    s = start_server("--stream-grace", "3", "--write-stall-timeout", "5", "--sndbuf", "4096")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # then reads nothing
    sock.settimeout(60)
    sock.connect(("127.0.0.1", s.port))
    body = json.dumps({"model": "smol", "prompt": ENDLESS, "max_tokens": 250, "temperature": 0,
                       "stream": True}).encode()
    sock.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                  f"\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body)
    s.wait_metric("streamsink_requests_inflight", lambda v: v == 0, timeout=60)
    assert s.metrics()["streamsink_write_queue_bytes"] > 0  # finished, its tail queued
    s.wait_metric("streamsink_write_stall_closes_total", lambda v: v == 1, timeout=30)
    sse = SSE(sock)
    sid = sse.headers["x-stream-id"]
    got = []
    sse.sock.settimeout(5)
    for eid, data in sse.events():
        got.append((eid, data))
    assert got and got[-1][1] != "[DONE]"  # the tail never reached the client
    again = resume(s, sid, last_id=got[-1][0], headers={})
    assert again.status == 200, again.raw
    rest = list(again.events())
    assert rest[0][0] == str(int(got[-1][0]) + 1) and rest[-1][1] == "[DONE]"
