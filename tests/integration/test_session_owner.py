"""Who owns a session on disk, across restarts and replicas (--session-dir).

A snapshot names its owner by a keyed hash of the API key itself (SipHash-2-4
under a secret kept in DIR/owner.secret), not by the key's place in the key
list, so:

- a restart with the keys reordered or extended keeps every session with its
  key, and every other key gets 404;
- the secret is made once, mode 0600, and every server on the directory
  uses it (a second server on the same directory agrees on the owners);
- a snapshot of the previous format (version 1, which recorded a key's index)
  is refused with a clear 409 and left in place when it names a key, and read
  as before when it was made by an open server."""

import os
import stat
import struct

from conftest import Server
from session_util import call, complete, io_done, reseal

PROMPT = "My secret is 4417. Remember it. The capital of France is"


def test_a_session_keeps_its_key_when_the_key_list_changes_across_a_restart(binary, model,
                                                                             tmp_path):
    d = tmp_path / "sessions"
    d.mkdir()
    s1 = Server(binary, model, ["--session-dir", str(d), "--api-key", "key-a", "--api-key",
                                "key-b"])
    try:
        st, r = complete(s1, PROMPT, "of-b", max_tokens=4, key="key-b")
        assert st == 200, r
        st, r = complete(s1, PROMPT, "of-a", max_tokens=4, key="key-a")
        assert st == 200, r
    finally:
        assert s1.stop() == 0, s1.log()
    assert (d / "of-b.snap").exists() and (d / "of-a.snap").exists()
    # key-b was second, now it is first; key-a moved and a new key-c took its place
    s2 = Server(binary, model, ["--session-dir", str(d), "--api-key", "key-c", "--api-key",
                                "key-b", "--api-key", "key-a"])
    try:
        for other in ("key-a", "key-c"):
            st, r = call(s2, "GET", "/v1/sessions/of-b", key=other)
            assert st == 404 and r["error"]["code"] == "session_not_found", (other, r)
            st, r = complete(s2, " What is my secret?", "of-b", max_tokens=4, key=other,
                             session_create=False)
            assert st == 404 and r["error"]["code"] == "session_not_found", (other, r)
        st, r = call(s2, "GET", "/v1/sessions", key="key-c")
        assert st == 200 and r["data"] == [], r
        st, r = call(s2, "GET", "/v1/sessions", key="key-a")
        assert [x["id"] for x in r["data"]] == ["of-a"], r
        st, r = call(s2, "GET", "/v1/sessions", key="key-b")
        assert [x["id"] for x in r["data"]] == ["of-b"], r
        st, r = complete(s2, " What is my secret?", "of-b", max_tokens=4, key="key-b",
                         session_create=False)
        assert st == 200, r
        assert r["session"]["restored"] is True
        st, r = complete(s2, " And of Italy?", "of-a", max_tokens=4, key="key-a",
                         session_create=False)
        assert st == 200 and r["session"]["restored"] is True, r
    finally:
        assert s2.stop() == 0, s2.log()


def test_the_owner_secret_is_private_and_shared_by_servers_on_one_directory(binary, model,
                                                                             tmp_path):
    d = tmp_path / "sessions"
    d.mkdir()
    keys = ["--api-key", "key-a", "--api-key", "key-b"]
    s1 = Server(binary, model, ["--session-dir", str(d), *keys])
    s2 = Server(binary, model, ["--session-dir", str(d), "--api-key", "key-b"])
    try:
        sec = d / "owner.secret"
        st_ = os.stat(sec)
        assert stat.S_IMODE(st_.st_mode) == 0o600
        assert st_.st_size > 0
        before = sec.read_bytes()
        st, r = complete(s1, PROMPT, "shared", max_tokens=4, key="key-b")
        assert st == 200, r
        st, r = call(s1, "POST", "/v1/sessions/shared/save", key="key-b")
        assert st == 200, r
        # the other replica restores it for the same key (a failover), not for another
        st, r = complete(s2, " What is my secret?", "shared", max_tokens=4, key="key-b",
                         session_create=False)
        assert st == 200 and r["session"]["restored"] is True, r
        assert sec.read_bytes() == before
    finally:
        assert s1.stop() == 0, s1.log()
        assert s2.stop() == 0, s2.log()


def to_version_1(data, key_index):
    """The same snapshot in the previous layout: no owner hash, the key's index
    at offset 76, the id length at 168 (layout in engine/snapshot.h)."""
    idl = data[176] | data[177] << 8
    body = bytearray(data[:168]) + data[176:]
    body[8:12] = struct.pack("<I", 1)
    body[12:16] = struct.pack("<I", 170 + idl)
    body[16:24] = struct.pack("<Q", len(body))
    body[76:80] = struct.pack("<i", key_index)
    return reseal(bytes(body))


def test_a_version_1_snapshot_of_a_key_is_refused_and_kept(binary, model, tmp_path):
    d = tmp_path / "sessions"
    d.mkdir()
    s1 = Server(binary, model, ["--session-dir", str(d)])
    try:
        for sid in ("old-keyed", "old-open"):
            st, r = complete(s1, PROMPT, sid, max_tokens=4)
            assert st == 200, r
    finally:
        assert s1.stop() == 0, s1.log()
    keyed = d / "old-keyed.snap"
    keyed.write_bytes(to_version_1(keyed.read_bytes(), 0))
    opened = d / "old-open.snap"
    opened.write_bytes(to_version_1(opened.read_bytes(), -1))
    s2 = Server(binary, model, ["--session-dir", str(d), "--api-key", "key-a"])
    try:
        st, r = complete(s2, " Again", "old-keyed", max_tokens=4, key="key-a")
        assert st == 409, r
        assert r["error"]["code"] == "session_snapshot_incompatible"
        assert "version 1" in r["error"]["message"], r
        io_done(s2, key="key-a")  # nothing is moved aside later either
        assert keyed.exists() and not (d / "old-keyed.bad").exists()
        # an open server's session never belonged to a key
        st, r = complete(s2, " Again", "old-open", max_tokens=4, key="key-a",
                         session_create=False)
        assert st == 404, r
        assert opened.exists()
    finally:
        assert s2.stop() == 0, s2.log()
    s3 = Server(binary, model, ["--session-dir", str(d)])
    try:
        st, r = complete(s3, " Again", "old-open", max_tokens=4, session_create=False)
        assert st == 200 and r["session"]["restored"] is True, r
        st, r = call(s3, "GET", "/v1/sessions")
        assert "old-keyed" not in [x["id"] for x in r["data"]]
        assert keyed.exists()
    finally:
        assert s3.stop() == 0, s3.log()
