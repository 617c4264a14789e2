"""A hostile client at the HTTP layer: strict RFC 9112 framing, work and memory
before authentication, connection floods, lingering error responses, half-closed
clients, slow readers and shutdown. Raw sockets where the SDK cannot misbehave,
the official openai client where it can show the effect."""

import json
import os
import re
import signal
import socket
import subprocess
import threading
import time

import openai
import pytest

from conftest import ENDLESS, ENDLESS_CHAT, parse_response, read_until_quiet, rss_kib

KEY = "sk-hostile-test-key"


def responses(raw):
    """Every status line in a byte stream of responses (a response may follow
    the previous body with no line break in between)."""
    return re.findall(rb"HTTP/1\.[01] \d{3} ", raw)


# ---- strict framing ---------------------------------------------------------------


@pytest.mark.parametrize("after", [b"XYZ not http\r\n\r\n",
                                   b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"])
def test_upgrade_is_answered_once_and_the_rest_is_not_http(server, after):
    raw = server.raw(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
                     b"Upgrade: websocket\r\n\r\n" + after, timeout=10)
    assert len(responses(raw)) == 1, raw
    assert parse_response(raw)[0] == 200


def test_chunk_data_must_end_with_crlf(server):
    body = b'{"model":"smol","prompt":"Hi","max_tokens":1}'
    raw = server.raw(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" +
                     b"%x\r\n" % len(body) + body + b"XY0\r\n\r\n", timeout=10)
    assert parse_response(raw)[0] == 400, raw


def test_valid_chunk_extensions_are_accepted(server):
    body = b'{"model":"smol","prompt":"Hi","max_tokens":1}'
    a, b = body[:10], body[10:]
    raw = server.raw(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" +
                     b"%x;name=value\r\n" % len(a) + a + b"\r\n" +
                     b'%x;q="quoted value";flag\r\n' % len(b) + b + b"\r\n0\r\n\r\n", timeout=30)
    status, _, out = parse_response(raw)
    assert status == 200, raw
    assert json.loads(out)["usage"]["completion_tokens"] == 1


@pytest.mark.parametrize("head", [
    b"GET /health HTTP/1.1\r\nHost: x\r\nX-Note: a\r\n b\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:\r\n chunked\r\n\r\n"
    b"2\r\n{}\r\n0\r\n\r\n",
])
def test_obs_folded_header_is_400(server, head):
    # refused for the fold itself, and the connection closed: a folded
    # Transfer-Encoding taken as chunked would read the body another way than
    # a proxy in front that does not unfold it
    t0 = time.monotonic()
    raw = server.raw(head, timeout=10)
    assert parse_response(raw)[0] == 400, raw
    assert b"folded" in raw and b"Connection: close" in raw, raw
    assert time.monotonic() - t0 < 5, "the connection was not closed after the 400"


def sent_in_two(server, head, cut):
    """What the server answers to head sent whole (cut None), or in two
    reads split at byte cut."""
    c = server.connect()
    if cut is None:
        c.sendall(head)
    else:
        c.sendall(head[:cut])
        time.sleep(0.05)
        c.sendall(head[cut:])
    raw = read_until_quiet(c, 10)
    c.close()
    return raw


@pytest.mark.parametrize("field", [b"X-Empty:", b"X-Empty: ", b"X-Empty:\t", b"Accept-Encoding:"])
def test_an_empty_header_value_is_not_a_fold(server, field):
    # RFC 9110 5.5 allows empty values (requests and curl send them); llhttp
    # gives one as an empty span at the next line, which was taken for a fold;
    # whole, and split anywhere across reads
    head = b"GET /health HTTP/1.1\r\nHost: x\r\n" + field + b"\r\nConnection: close\r\n\r\n"
    start = head.index(field)
    for cut in [None] + list(range(start + len(field) - 2, start + len(field) + 4)):
        raw = sent_in_two(server, head, cut)
        assert parse_response(raw)[0] == 200, (cut, raw)


def test_an_empty_host_is_a_host(server):
    # RFC 9112 3.2: a target without an authority sends an empty Host
    raw = server.raw(b"GET /health HTTP/1.1\r\nHost:\r\nConnection: close\r\n\r\n",
                     timeout=10)
    assert parse_response(raw)[0] == 200, raw


@pytest.mark.parametrize("fold", [b"X-Empty:\r\n folded\r\n", b"X-Empty:\r\n \r\n",
                                  b"X-Empty:\r\n\t\r\n", b"X-Empty: \r\n  \r\n"])
def test_a_fold_after_an_empty_value_is_still_400(server, fold):
    # a line of blanks folded onto an empty value came as the same empty span
    # as the empty value alone; split anywhere across reads, as well
    head = b"GET /health HTTP/1.1\r\nHost: x\r\n" + fold + b"Connection: close\r\n\r\n"
    start = head.index(b"X-Empty")
    for cut in [None] + list(range(start + 7, start + len(fold))):
        raw = sent_in_two(server, head, cut)
        assert parse_response(raw)[0] == 400, (cut, raw)
        assert b"folded" in raw, (cut, raw)


def test_http10_with_transfer_encoding_is_faulty_framing(server):
    # RFC 9112 6.1: an HTTP/1.0 message with Transfer-Encoding has faulty
    # framing, and the connection closes after it; an HTTP/1.0 proxy in front
    # would take the chunks for the next request (here a hidden GET)
    inner = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
    raw = server.raw(b"POST /v1/completions HTTP/1.0\r\nConnection: keep-alive\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n" % len(inner) + inner +
                     b"\r\n0\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n", timeout=10)
    assert len(responses(raw)) == 1, raw
    assert parse_response(raw)[0] == 400, raw
    assert b"Connection: close" in raw, raw


@pytest.mark.parametrize("codings", [b"gzip, chunked", b"xyz, chunked"])
def test_transfer_codings_other_than_chunked_are_501(server, codings):
    # RFC 9112 6.1: a coding the server does not understand is 501; the body
    # below would be read as if it were not gzipped
    raw = server.raw(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: " +
                     codings + b"\r\n\r\n2\r\n{}\r\n0\r\n\r\n", timeout=10)
    status, _, body = parse_response(raw)
    assert status == 501, raw
    assert b"Connection: close" in raw, raw


@pytest.mark.parametrize("fields", [[b"gzip"], [b"identity, gzip"], [b" Identity ", b"br"],
                                    [b"x" * 40]])
def test_a_content_coding_other_than_identity_is_415(server, fields):
    # RFC 9110 15.5.16: a body whose content coding is not accepted is 415,
    # with Accept-Encoding naming what is; it was read as JSON still coded
    # (400 "control character at byte 0" for gzip's magic)
    import gzip
    body = gzip.compress(b'{"model":"smol","prompt":"Hi","max_tokens":1}')
    head = b"".join(b"Content-Encoding: " + f + b"\r\n" for f in fields)
    raw = server.raw(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     b"Content-Type: application/json\r\n" + head +
                     b"Content-Length: %d\r\n\r\n" % len(body) + body, timeout=10)
    status, headers, resp = parse_response(raw)
    assert status == 415, raw
    assert b"Accept-Encoding: identity" in raw, raw
    assert json.loads(resp)["error"]["code"] == "unsupported_content_encoding", raw


@pytest.mark.parametrize("value", [b"identity", b"IDENTITY", b" identity , identity", b"", b","])
def test_identity_content_coding_is_no_coding(server, value):
    body = b'{"model":"smol","prompt":"Hi","max_tokens":1}'
    raw = server.raw(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     b"Content-Type: application/json\r\nContent-Encoding: " + value +
                     b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body, timeout=30)
    assert parse_response(raw)[0] == 200, raw


def test_chunked_in_any_case_is_chunked(server):
    body = b'{"model":"smol","prompt":"Hi","max_tokens":1}'
    raw = server.raw(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     b"Content-Type: application/json\r\nTransfer-Encoding:  Chunked \r\n\r\n" +
                     b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n", timeout=30)
    assert parse_response(raw)[0] == 200, raw


def test_http10_expect_100_continue_is_ignored(server):
    # RFC 9110 10.1.1: a server MUST ignore 100-continue in an HTTP/1.0 request
    c = server.connect()
    c.sendall(b"POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
              b"Content-Length: 2\r\nExpect: 100-continue\r\n\r\n")
    raw = read_until_quiet(c, 3, quiet=1.0)
    c.sendall(b"{}")
    raw += read_until_quiet(c, 10)
    c.close()
    assert b"100 Continue" not in raw, raw
    assert parse_response(raw)[0] == 400, raw  # {} has no prompt


def test_the_absolute_form_of_a_target_is_served(server):
    # RFC 9112 3.2.2: a server MUST accept the absolute form
    raw = server.raw(b"GET http://x/v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                     timeout=10)
    status, _, body = parse_response(raw)
    assert status == 200, raw
    assert json.loads(body)["object"] == "list"
    raw = server.raw(b"GET HTTP://X:8080/health?probe=1 HTTP/1.1\r\nHost: x\r\n"
                     b"Connection: close\r\n\r\n", timeout=10)
    assert parse_response(raw)[0] == 200, raw


@pytest.mark.parametrize("head", [
    b"GET " + b" " * 100_000 + b"/health HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: x\r\nX-A:" + b" " * 100_000 + b"v\r\n\r\n",
])
def test_blanks_count_toward_the_header_limit(server, head):
    # bytes llhttp passes to no callback (blanks in the request line, before a
    # value) were not counted: a head of any size went through
    raw = server.raw(head, timeout=10)
    assert parse_response(raw)[0] == 431, raw


@pytest.mark.parametrize("ext", [b";" + b"a" * 100_000, b';a="' + b"v" * 100_000 + b'"'])
def test_chunk_extensions_are_bounded(server, ext):
    # no callback kept them and nothing counted them: megabytes of extensions
    # went through with a two-byte body
    body = b'{"model":"smol","prompt":"Hi","max_tokens":1}'
    raw = server.raw(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                     b"Connection: close\r\nContent-Type: application/json\r\n\r\n%x" % len(body) + ext + b"\r\n" +
                     body + b"\r\n0\r\n\r\n", timeout=30)
    assert parse_response(raw)[0] == 413, raw


@pytest.mark.parametrize("head", [
    b"GET /health HTTP/1.1\r\n\r\n",                          # no Host
    b"GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",   # two Hosts
])
def test_http11_needs_exactly_one_host(server, head):
    assert parse_response(server.raw(head, timeout=10))[0] == 400


def test_http10_without_host_is_fine(server):
    assert parse_response(server.raw(b"GET /health HTTP/1.0\r\n\r\n", timeout=10))[0] == 200


@pytest.mark.parametrize("line", [b"GET /health\r\n\r\n", b"GET /health HTTP/2.0\r\nHost: x\r\n\r\n",
                                  b"GET /health HTTP/1.2\r\nHost: x\r\n\r\n"])
def test_only_http10_and_http11_are_served(server, line):
    raw = server.raw(line, timeout=10)
    assert not raw.startswith(b"HTTP/1.1 200"), raw
    if raw:
        assert parse_response(raw)[0] in (400, 505)


@pytest.mark.parametrize("name", ["Authorization", "X-Session-Id"])
def test_duplicate_singleton_headers_are_400(server, name):
    raw = server.raw(f"GET /v1/models HTTP/1.1\r\nHost: x\r\n{name}: a\r\n{name}: b\r\n\r\n"
                     .encode(), timeout=10)
    status, _, body = parse_response(raw)
    assert status == 400, raw
    assert name.lower() in json.loads(body)["error"]["message"].lower()


def test_head_is_get_without_a_body(server):
    s = server.connect()
    s.sendall(b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n"
              b"Connection: close\r\n\r\n")
    raw = read_until_quiet(s, 10)
    s.close()
    assert len(responses(raw)) == 2, raw
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert b"content-length:" in head.lower()
    assert rest.startswith(b"HTTP/1.1 200"), "HEAD must send no body"


def test_half_closed_client_still_gets_its_answer(server):
    s = server.connect()
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    s.shutdown(socket.SHUT_WR)
    raw = read_until_quiet(s, 10)
    s.close()
    assert parse_response(raw)[0] == 200, raw


# ---- before authentication ------------------------------------------------------------


def test_unknown_paths_and_methods_need_the_key_first(start_server):
    s = start_server("--api-key", KEY)
    assert s.get("/v1/nope")[0] == 401
    assert s.get("/nope")[0] == 401
    assert s.get("/v1/completions")[0] == 401          # wrong method, but no key yet
    assert s.get("/health")[0] == 200                    # probes stay open
    auth = {"Authorization": f"Bearer {KEY}"}
    assert s.get("/v1/nope", auth)[0] == 404
    assert s.get("/v1/completions", auth)[0] == 405


def test_an_authorization_longer_than_any_key_is_a_wrong_key(start_server):
    s = start_server("--api-key", KEY)
    long = "Bearer " + "k" * 600  # far below --max-header
    status, _, body = s.get("/v1/models", {"Authorization": long})
    assert status == 401, body
    assert s.get("/v1/models", {"Authorization": f"Bearer {KEY}"})[0] == 200


def test_a_key_too_long_for_the_authorization_header_is_refused_at_start(binary, model):
    # the Authorization value is read up to 511 bytes: "Bearer " and a key of
    # 504; a longer key loaded, and no request could ever match it
    longest = "k" * 504
    from conftest import Server
    s = Server(binary, model, ["--api-key", longest])
    try:
        assert s.get("/v1/models", {"Authorization": f"Bearer {longest}"})[0] == 200
        assert s.get("/v1/models", {"Authorization": f"Bearer {longest[:-1]}"})[0] == 401
    finally:
        assert s.stop() == 0
    r = subprocess.run([binary, "serve", "-m", model, "--port", "0", "--api-key", longest + "k"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "an API key is longer than 504 bytes" in r.stderr


@pytest.mark.parametrize("how", ["flag", "env"])
@pytest.mark.parametrize("key", ["", "   ", "sk-a\nb"])
def test_an_empty_key_or_one_no_header_can_carry_is_refused_at_start(binary, model, how, key):
    # `--api-key "$KEY"` with KEY unset served an open API without a word:
    # a blank key is an error, as a control character is (no request could
    # send it); only a key file's lines may be blank
    args, env = ["--api-key", key], dict(os.environ)
    if how == "env":
        args, env["STREAMSINK_API_KEY"] = [], key
    r = subprocess.run([binary, "serve", "-m", model, "--port", "0", *args], capture_output=True,
                       text=True, timeout=60, env=env)
    assert r.returncode == 2, r.stderr
    assert "an API key" in r.stderr


def test_a_key_file_that_gives_no_key_is_refused_at_start(binary, model, tmp_path):
    # a directory read as an empty file ("holds no key", not why); a file of
    # comments only passed when --api-key gave another key, so the keys the
    # operator meant to add were silently not there
    comments = tmp_path / "keys"
    comments.write_text("# rotated out\n\n")
    for args, why in [(["--api-key-file", str(tmp_path)], "Is a directory"),
                      (["--api-key-file", str(comments), "--api-key", "sk-flag"],
                       "holds no key")]:
        r = subprocess.run([binary, "serve", "-m", model, "--port", "0", *args],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, r.stderr
        assert f"--api-key-file {args[1]}" in r.stderr and why in r.stderr, r.stderr


def test_a_key_that_starts_with_a_hash_is_a_key_outside_a_key_file(binary, model):
    # '#' starts a comment in a key file only: as a flag it was dropped,
    # and the server ran open
    from conftest import Server
    s = Server(binary, model, ["--api-key", "#sk-hash"])
    try:
        assert s.get("/v1/models")[0] == 401
        assert s.get("/v1/models", {"Authorization": "Bearer #sk-hash"})[0] == 200
    finally:
        assert s.stop() == 0


def test_no_body_is_read_or_continued_before_the_key(start_server):
    s = start_server("--api-key", KEY)
    c = s.connect()
    c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: 8000000\r\nExpect: 100-continue\r\n\r\n")
    raw = read_until_quiet(c, 10, quiet=1.0)
    c.close()
    assert b"100 Continue" not in raw
    assert parse_response(raw)[0] == 401, raw


def test_unauthenticated_uploads_do_not_grow_memory(start_server):
    s = start_server("--api-key", KEY, "--max-conns", "400")
    before = rss_kib(s.proc.pid)
    socks = []
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 8000000\r\n\r\n")
    part = b"x" * 262144
    for _ in range(300):
        c = s.connect()
        c.setblocking(False)
        try:
            c.send(head + part)  # what the kernel takes; a server that buffers bodies keeps it
        except BlockingIOError:
            pass
        socks.append(c)
    time.sleep(2.0)
    grown = rss_kib(s.proc.pid) - before
    for c in socks:
        c.close()
    # 300 x 8 MB would be 2.4 GB; each connection may hold its fixed buffers only
    assert grown < 40 * 1024, f"RSS grew by {grown} KiB"
    assert s.get("/health")[0] == 200


def test_authenticated_bodies_share_a_server_wide_budget(start_server):
    s = start_server("--api-key", KEY, "--max-body-total", "4000000", "--max-body", "3000000")
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: 2500000\r\n\r\n").encode()
    a = s.connect()
    a.sendall(head + b"x" * 2000000)          # a body in progress holds its bytes
    # read by the server before b starts (a sleep was a guess: a late server
    # read the two bodies side by side and might refuse a)
    s.wait_metric("streamsink_request_body_bytes", lambda v: v >= 2000000, timeout=60)
    assert s.metrics()["streamsink_request_body_total_limit_bytes"] == 4000000
    b = s.connect()
    b.sendall(head + b"x" * 2000000)          # this one would pass the budget as it grows
    raw = read_until_quiet(b, 10, quiet=1.0)
    a.close()
    b.close()
    status, headers, _ = parse_response(raw)
    assert status == 503, raw
    assert headers.get("retry-after")
    # both gone, every byte they held is given back
    s.wait_metric("streamsink_request_body_bytes", lambda v: v == 0, timeout=30)


# ---- connection slots --------------------------------------------------------------------


def test_idle_connections_are_reclaimed_when_the_limit_is_reached(start_server):
    s = start_server("--max-conns", "16")
    idle = [s.connect() for _ in range(16)]
    time.sleep(0.3)
    try:
        for _ in range(5):  # every new client is served; the oldest idle one makes room
            assert s.get("/health")[0] == 200
    finally:
        for c in idle:
            c.close()


def test_lingering_connections_are_reclaimed_when_the_limit_is_reached(start_server):
    # after an error (a 401 needs no key) a connection lingers for the client's
    # FIN, up to 30 s while bytes keep coming: a client that trickles them on
    # every slot held /health at 503 before lingering ones could be reclaimed
    s = start_server("--api-key", KEY, "--max-conns", "8")
    socks = []
    for _ in range(8):
        c = s.connect()
        c.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        socks.append(c)
    for c in socks:
        assert read_until_quiet(c, 5, quiet=0.3).startswith(b"HTTP/1.1 401 ")
    stop = threading.Event()

    def trickle():
        while not stop.wait(0.5):
            for c in socks:
                try:
                    c.send(b"x")
                except OSError:
                    pass

    t = threading.Thread(target=trickle)
    t.start()
    try:
        time.sleep(1.0)
        for _ in range(3):
            assert s.get("/health")[0] == 200
    finally:
        stop.set()
        t.join()
        for c in socks:
            c.close()


def test_connections_whose_clients_leave_their_answers_unread_are_reclaimed(start_server):
    # pipelined requests to the endpoints that need no key, their answers never
    # read: each connection waits for its client to take them (the next request
    # is not read until then), up to --write-stall-timeout, or for ever at the
    # minimum read rate; they held every slot, /health at 503, without a key
    s = start_server("--api-key", KEY, "--max-conns", "8")
    socks = []
    for _ in range(8):
        c = s.connect(rcvbuf=4096)
        c.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 300)
        socks.append(c)
    try:
        time.sleep(1.0)
        for _ in range(3):
            assert s.get("/health")[0] == 200
        assert s.metrics()["streamsink_connections_reclaimed_total"] >= 1
    finally:
        for c in socks:
            c.close()


def test_connections_holding_large_answers_nobody_reads_are_reclaimed(start_server):
    # /detokenize answers ~4 MB (just under --max-response) from a 350 KB
    # request, on the loop: a client that asks on every slot and reads
    # nothing held them all, /health at 503, until --write-stall-timeout (and
    # again at once)
    s = start_server("--max-conns", "8")
    body = json.dumps({"tokens": [46778] * 50000}).encode()
    socks = []
    for _ in range(8):
        c = s.connect(rcvbuf=4096)
        c.sendall(b"POST /detokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        socks.append(c)
    try:
        time.sleep(1.5)  # every answer is queued, and none of it taken for a second
        deadline = time.time() + 2.0
        while True:
            status = s.get("/health")[0]
            if status == 200 or time.time() > deadline:
                break
            time.sleep(0.2)
        assert status == 200
        assert s.metrics()["streamsink_connections_reclaimed_total"] >= 1
    finally:
        for c in socks:
            c.close()


def an_answer_beside_a_half_sent_request(start_server):
    """A server at --max-conns 2 holding a's complete answer (300 tokens with
    logprobs, unread so far) and b's request, half sent: (server, a, b)."""
    s = start_server("--max-conns", "2", "--sndbuf", "4096")
    body = json.dumps({"model": "smol", "prompt": ENDLESS, "max_tokens": 300,
                       "temperature": 0, "logprobs": 5}).encode()
    a = s.connect(rcvbuf=4096)
    a.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    s.wait_metric("streamsink_requests_inflight", lambda v: v == 0, timeout=120)
    b = s.connect()
    b.sendall(b"GET /health HTTP/1.1\r\n")  # and the rest never comes
    return s, a, b


def assert_whole_answer_and_closed(got, b):
    """a got its whole answer, and b (the half-sent request) was closed to
    make room: a FIN, or a reset when the server had not yet read its bytes
    when it closed it (as idle)."""
    status, headers, out = parse_response(bytes(got))
    assert status == 200 and len(out) == int(headers["content-length"]), len(got)
    assert json.loads(out)["usage"]["completion_tokens"] == 300
    b.settimeout(10)
    try:
        assert b.recv(100) == b""
    except ConnectionResetError:
        pass


def test_a_client_still_reading_its_answer_is_not_reclaimed(start_server):
    # a finished answer still going out to a client that reads it steadily is
    # that client's work: at --max-conns a half-sent request makes room first
    s, a, b = an_answer_beside_a_half_sent_request(start_server)
    got = bytearray()

    def read_steadily():
        while True:
            try:
                d = a.recv(4096)
            except OSError:
                return
            if not d:
                return
            got.extend(d)
            time.sleep(0.05)

    t = threading.Thread(target=read_steadily)
    t.start()
    try:
        assert s.get("/health")[0] == 200  # a third client: someone makes room
        t.join(60)
        assert_whole_answer_and_closed(got, b)
    finally:
        a.close()
        b.close()


def test_a_client_pausing_between_reads_goes_after_a_half_sent_request(start_server):
    # a client that reads its answer in bursts may take nothing for longer
    # than the stalled-answer rule's second: at --max-conns the half-sent
    # request still makes room first (it went first only after the answer)
    s, a, b = an_answer_beside_a_half_sent_request(start_server)
    try:
        time.sleep(1.5)  # a's answer is complete and untaken for over a second
        assert s.get("/health")[0] == 200  # a third client: someone makes room
        a.settimeout(60)
        got = bytearray()
        while True:
            d = a.recv(65536)
            if not d:
                break
            got.extend(d)
            _, headers, out = parse_response(bytes(got))
            if "content-length" in headers and len(out) >= int(headers["content-length"]):
                break
        assert_whole_answer_and_closed(got, b)
    finally:
        a.close()
        b.close()


def with_open_files(binary, tmp_path, n):
    """A wrapper that runs binary with soft and hard limits of n open files."""
    w = tmp_path / "streamsink-nofile"
    w.write_text(f'#!/bin/sh\nulimit -n {n} || exit 99\nexec "{binary}" "$@"\n')
    os.chmod(w, 0o755)
    return str(w)


def test_idle_sockets_past_the_open_file_limit_do_not_lock_everyone_out(binary, model, tmp_path):
    # with --max-conns (1024) above the limit on open files, accept failed with
    # EMFILE once the sockets had taken them all: libuv dropped every new
    # connection before a slot could be reclaimed for it, and nothing was logged
    from conftest import Server
    s = Server(with_open_files(binary, tmp_path, 64), model, [])
    idle = []
    try:
        for _ in range(80):
            idle.append(s.connect())
        time.sleep(0.5)
        for _ in range(3):
            assert s.get("/health")[0] == 200
        assert "--max-conns lowered from 1024 to " in s.log()
    finally:
        for c in idle:
            c.close()
        assert s.stop() == 0


def test_an_open_file_limit_too_low_for_any_connections_is_a_config_error(binary, model, tmp_path):
    r = subprocess.run([with_open_files(binary, tmp_path, 24), "serve", "-m", model, "--port", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "the limit on open files (24, ulimit -n)" in r.stderr


def test_connections_running_requests_are_not_reclaimed(start_server):
    s = start_server("--max-conns", "2", "--max-seqs", "2")
    c = s.client()
    stream = c.completions.create(model="smol", prompt=ENDLESS, max_tokens=None, temperature=0,
                                  stream=True)
    it = iter(stream)
    next(it)
    for _ in range(3):
        s.get("/health")  # these fill and free the second slot
    assert next(it).choices[0].text is not None  # the stream was not closed to make room
    stream.close()


# ---- errors while a body arrives -----------------------------------------------------------


def test_413_reaches_a_client_that_is_still_sending(start_server):
    """The 413 goes out from the headers; a client that keeps sending its body for
    a few seconds more must be able to finish and read it (no reset, no EPIPE)."""
    s = start_server("--max-body", "100000")
    c = s.connect()
    body = b"x" * 2000000
    c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body))
    for i in range(0, len(body), 65536):  # about 4.5 s of sending, as a slow uplink would
        c.sendall(body[i:i + 65536])
        time.sleep(0.15)
    raw = read_until_quiet(c, 10)
    c.close()
    assert parse_response(raw)[0] == 413, raw


# ---- slow readers -------------------------------------------------------------------------------


def fat_stream_request():
    """A long greedy chat stream whose every frame carries 20 top logprobs (~2 KB),
    so buffers fill within a few hundred tokens even on a slow machine."""
    body = json.dumps({"model": "smol", "messages": ENDLESS_CHAT, "max_tokens": 100000,
                       "temperature": 0, "stream": True, "logprobs": True,
                       "top_logprobs": 20}).encode()
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)


def test_backpressure_starts_within_a_bounded_number_of_bytes(start_server):
    s = start_server("--max-seqs", "2")
    c = s.connect(rcvbuf=4096)
    c.sendall(fat_stream_request())
    s.wait_metric("streamsink_paused_sequences", lambda v: v == 1, timeout=120)
    time.sleep(1.0)
    m = s.metrics()
    c.close()
    # each token is one ~2 KB frame: the kernel and the write queue together may hold
    # a few hundred KB (--sndbuf 64 KiB, --high-water 64 KiB), not megabytes
    assert m["streamsink_streamed_tokens_total"] < 400, m["streamsink_streamed_tokens_total"]


def test_a_reader_below_the_minimum_rate_is_closed_and_its_slot_freed(start_server):
    s = start_server("--max-seqs", "1", "--min-read-rate", "8192", "--write-stall-timeout", "4",
                     "--high-water", "16384", "--low-water", "4096", "--sndbuf", "4096",
                     "--stream-grace", "0")  # the closed stream is not kept for a resume
    c = s.connect(rcvbuf=4096)
    c.sendall(fat_stream_request())
    c.settimeout(1.0)
    closed = False
    t0 = time.time()
    while time.time() - t0 < 60:  # read 1 KB every half second: 2 KB/s
        try:
            got = c.recv(1024)
        except socket.timeout:
            continue
        except ConnectionResetError:
            closed = True
            break
        if not got:
            closed = True
            break
        time.sleep(0.5)
    c.close()
    assert closed, "a 2 KB/s reader was never closed"
    s.wait_metric("streamsink_active_sequences", lambda v: v == 0, timeout=20)
    assert s.metrics().get("streamsink_slow_reader_closes_total", 0) >= 1
    assert s.client().completions.create(model="smol", prompt="Hi",
                                         max_tokens=1).usage.completion_tokens == 1


def test_a_slow_reader_is_judged_when_its_backlog_waits_in_the_kernel(start_server):
    # With a write queue that empties on every pause (--low-water 0, a small
    # --high-water), a reader that takes what its buffer holds every 2.5 s
    # (about 2.3 KB/s here, under the 4,096 B/s asked) keeps its backlog in
    # the kernel's buffers. It is judged on that backlog as well; judged on
    # the write queue alone, such readers were left running (two of three).
    # (--write-stall-timeout 5: a reader thread woken late on a loaded machine
    # is not closed as stalled instead)
    s = start_server("--max-seqs", "3", "--min-read-rate", "4096", "--write-stall-timeout", "5",
                     "--high-water", "4096", "--low-water", "0", "--sndbuf", "4096",
                     "--stream-grace", "0")
    closed = [None] * 3

    def reader(i):
        c = s.connect(rcvbuf=4096)
        c.sendall(fat_stream_request())
        c.settimeout(1.0)
        t0 = time.time()
        while time.time() - t0 < 40:
            try:
                got = c.recv(65536)
            except socket.timeout:
                continue
            except ConnectionResetError:
                got = b""
            if not got:
                closed[i] = time.time() - t0
                break
            time.sleep(2.5)
        c.close()

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(t is not None for t in closed), closed
    assert s.metrics().get("streamsink_slow_reader_closes_total", 0) >= 3


def test_a_fast_reader_is_not_judged_over_the_idle_time_between_its_requests(start_server):
    # The first answer (13 KB of /metrics against a 4 KB receive buffer)
    # leaves bytes in the kernel when its last write completes, which opens a
    # rate window. The client reads them all; the next request, after an
    # idle gap longer than --write-stall-timeout, starts a new window instead
    # of being judged over the gap (it was closed as a slow reader).
    s = start_server("--write-stall-timeout", "3")
    c = s.connect(rcvbuf=4096)
    req = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    for i in range(3):
        c.sendall(req)
        time.sleep(0.5)
        got = read_until_quiet(c, timeout=10, quiet=0.5)
        status, headers, body = parse_response(got)
        assert status == 200, (i, got[:200])
        assert len(body) > 8192, len(body)
        if i == 0:
            time.sleep(5)
    c.close()
    assert s.metrics().get("streamsink_slow_reader_closes_total", 0) == 0


# ---- shutdown ------------------------------------------------------------------------------------


def test_a_stream_cut_by_shutdown_ends_with_an_error_event_and_done(start_server):
    s = start_server("--drain-timeout", "1")
    c = s.connect()
    body = json.dumps({"model": "smol", "prompt": ENDLESS, "max_tokens": 100000,
                       "temperature": 0, "stream": True}).encode()
    c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    first = c.recv(4096)
    assert first.startswith(b"HTTP/1.1 200")
    s.proc.send_signal(signal.SIGTERM)
    raw = first + read_until_quiet(c, 30)
    c.close()
    assert s.proc.wait(30) == 0
    _, _, out = parse_response(raw)  # dechunked: fails if the chunk terminator is missing
    assert raw.endswith(b"0\r\n\r\n"), raw[-200:]
    # each event is "id: N" then its data line
    events = [line[len(b"data: "):] for e in out.split(b"\n\n") for line in e.split(b"\n")
              if line.startswith(b"data: ")]
    assert events[-1] == b"[DONE]"
    err = json.loads(events[-2])["error"]
    assert err["code"] == "server_shutting_down"


# ---- the API key ---------------------------------------------------------------------------------


def test_api_key_from_a_file_or_the_environment_not_the_command_line(binary, model, tmp_path):
    from conftest import Server
    keyfile = tmp_path / "keys"
    keyfile.write_text(f"# one key per line\n{KEY}\nsk-second-key\n")
    os.chmod(keyfile, 0o600)
    s = Server(binary, model, ["--api-key-file", str(keyfile)])
    try:
        with open(f"/proc/{s.proc.pid}/cmdline", "rb") as f:
            assert KEY.encode() not in f.read()
        assert s.get("/v1/models")[0] == 401
        assert s.get("/v1/models", {"Authorization": f"Bearer {KEY}"})[0] == 200
        assert s.get("/v1/models", {"Authorization": "Bearer sk-second-key"})[0] == 200
    finally:
        assert s.stop() == 0
    os.environ["STREAMSINK_API_KEY"] = KEY
    try:
        s = Server(binary, model, [])
    finally:
        del os.environ["STREAMSINK_API_KEY"]
    try:
        assert s.get("/v1/models")[0] == 401
        assert s.get("/v1/models", {"Authorization": f"Bearer {KEY}"})[0] == 200
    finally:
        assert s.stop() == 0


# ---- prompts ----------------------------------------------------------------------------------------


def test_a_prompt_over_the_context_is_a_400_before_the_engine(server, client):
    long_prompt = "word " * 9000  # more tokens than the model's 8,192-token context
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as ei:
            r = client.completions.create(model="smol", prompt=long_prompt, max_tokens=1,
                                          stream=stream)
            list(r) if stream else None
        assert ei.value.body["param"] == "prompt"
        assert ei.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model="smol", max_tokens=1,
                                       messages=[{"role": "user", "content": long_prompt}])
    assert ei.value.body["param"] == "messages"
    assert ei.value.body["code"] == "context_length_exceeded"
    m = server.metrics()
    assert m["streamsink_requests_inflight"] == 0


def test_engine_side_rejections_name_their_param(server, client):
    with pytest.raises(openai.BadRequestError) as ei:  # more sinks than a slot keeps
        client.completions.create(model="smol", prompt="Hi", max_tokens=1,
                                  extra_body={"kv_policy": "sinks:64"})
    assert ei.value.body["param"] == "kv_policy"
    with pytest.raises(openai.BadRequestError) as ei:
        client.completions.create(model="smol", prompt=[49152], max_tokens=1)
    assert ei.value.body["param"] == "prompt"


def test_a_huge_prompt_does_not_stall_running_streams(server):
    """Tokenizing megabytes takes seconds; it must not run on the engine thread."""
    c = server.connect()
    body = json.dumps({"model": "smol", "prompt": ENDLESS, "max_tokens": 100000,
                       "temperature": 0, "stream": True}).encode()
    c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    stamps, stop = [], threading.Event()

    def reader():
        c.settimeout(1.0)
        while not stop.is_set():
            try:
                got = c.recv(65536)
            except socket.timeout:
                continue
            if not got:
                return
            stamps.append((time.time(), got.count(b"data: ")))

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    while sum(n for _, n in stamps) < 5:
        time.sleep(0.05)
    t0 = time.time()
    status, _, out = server.post("/v1/completions",
                                 json.dumps({"model": "smol", "max_tokens": 1,
                                             "prompt": "lorem ipsum " * 660000}))  # 7.9 MB
    t1 = time.time()
    time.sleep(0.5)
    stop.set()
    t.join(5)
    c.close()
    assert status == 400, out
    assert json.loads(out)["error"]["code"] == "context_length_exceeded"
    during = [ts for ts, n in stamps if n and t0 - 1.0 <= ts <= t1 + 0.5]
    gaps = [b - a for a, b in zip(during, during[1:])]
    assert during and max(gaps, default=0) < 2.0, (t1 - t0, gaps)


# ---- what /metrics counts of refusals ---------------------------------------------------------------


def test_every_refusal_is_counted_and_a_401_names_no_path(start_server):
    # requests_total counts every request answered: the connection's own
    # refusals (bad framing, a limit, the read timeout) were not counted at
    # all; a session's 201 and 204 were "other"; and a 401 was counted under
    # the path asked for, which told anyone reading the open /metrics which
    # paths exist
    s = start_server("--api-key", KEY, "--max-header", "4096", "--max-body", "1000",
                     "--read-timeout", "1")
    auth = f"Authorization: Bearer {KEY}\r\n"
    sent = {
        b"GARBAGE\r\n\r\n": 400,
        b"GET / HTTP/9.9\r\nHost: x\r\n\r\n": 505,
        b"GET /" + b"a" * 3000 + b" HTTP/1.1\r\nHost: x\r\n\r\n": 414,
        b"GET /health HTTP/1.1\r\nHost: x\r\nX: " + b"b" * 5000 + b"\r\n\r\n": 431,
        (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\n"
         f"Content-Length: 5000\r\n\r\n").encode(): 413,
        (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\n"
         f"Content-Length: 10\r\n\r\n{{").encode(): 408,
    }
    for raw, status in sent.items():
        got = s.raw(raw, timeout=10, quiet=3)
        assert got.startswith(f"HTTP/1.1 {status}".encode()), (status, got[:200])
    for path in ("/v1/sessions", "/tokenize", "/no-such-path"):
        assert s.get(path)[0] == 401
    hdr = {"Authorization": f"Bearer {KEY}"}
    status, _, body = s.post("/v1/sessions", "", hdr)
    assert status == 201, body
    sid = json.loads(body)["id"]
    assert s.post("/v1/completions", json.dumps({"model": "smol", "prompt": "Hi", "max_tokens": 1,
                                                  "session_id": sid}), hdr)[0] == 200
    status, _, body = s.raw((f"DELETE /v1/sessions/{sid} HTTP/1.1\r\nHost: x\r\n{auth}"
                             f"Connection: close\r\n\r\n").encode())[:12], None, None
    assert status == b"HTTP/1.1 204", status
    m = s.metrics()
    got = {k: v for k, v in m.items() if k.startswith("streamsink_requests_total{")}
    want = {
        'streamsink_requests_total{endpoint="other",status="400"}': 1,
        'streamsink_requests_total{endpoint="other",status="505"}': 1,
        'streamsink_requests_total{endpoint="other",status="414"}': 1,
        'streamsink_requests_total{endpoint="other",status="431"}': 1,
        'streamsink_requests_total{endpoint="/v1/completions",status="413"}': 1,
        'streamsink_requests_total{endpoint="/v1/completions",status="408"}': 1,
        'streamsink_requests_total{endpoint="other",status="401"}': 3,
        'streamsink_requests_total{endpoint="/v1/sessions",status="201"}': 1,
        'streamsink_requests_total{endpoint="/v1/sessions",status="204"}': 1,
        'streamsink_requests_total{endpoint="/v1/completions",status="200"}': 1,
    }
    assert got == want, got
