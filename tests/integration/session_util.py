"""Helpers for the session suites: JSON requests over http.client (any method,
any headers), and the snapshot file's checksum (zlib's crc32, computed here
independently of engine/snapshot.c)."""

import http.client
import json
import struct
import zlib


def call(server, method, path, body=None, key=None, headers=None, timeout=120):
    """(status, parsed JSON or None) of one request."""
    h = {"Content-Type": "application/json"}
    if key:
        h["Authorization"] = f"Bearer {key}"
    h.update(headers or {})
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers=h)
        resp = conn.getresponse()
        raw = resp.read()
        return resp.status, (json.loads(raw) if raw else None)
    finally:
        conn.close()


def io_done(server, key=None):
    """Returns once the server's session IO thread has done every job asked
    of it so far (a file moved aside, say): a GET of a session that is not
    in memory is answered by a job of its own, done after them."""
    st, r = call(server, "GET", "/v1/sessions/no-such-session-io-barrier", key=key)
    assert st == 404, r


def complete(server, prompt, sid, max_tokens=24, key=None, **extra):
    body = {"model": "smol", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "logprobs": 1, "session_id": sid, **extra}
    return call(server, "POST", "/v1/completions", body, key=key)


def continuation(resp):
    """What must match bit for bit: the text and every token's logprob."""
    ch = resp["choices"][0]
    return ch["text"], ch["logprobs"]["tokens"], ch["logprobs"]["token_logprobs"]


def reseal(data):
    """data with its trailing CRC-32 recomputed."""
    data = bytearray(data)
    data[-4:] = struct.pack("<I", zlib.crc32(bytes(data[:-4])) & 0xFFFFFFFF)
    return bytes(data)
