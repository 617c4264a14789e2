"""Sessions that outlive their server (--session-dir): a session written on
SIGTERM and read back by the next process continues with exactly the tokens
(and logprobs) the same session gives when it never left memory, for f16,
f32 and q8_0 KV, the `window` and `sinks:4` policies, and a session longer than the
window (eviction happened before the save). Bad snapshots (truncated,
corrupted, another model, another version) get a clear error and are moved
aside; a save on a full disk fails cleanly and keeps the session in memory;
the session API lists, describes and deletes, bound to the key."""

import json
import os
import re
import resource
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest
import requests

from conftest import ENDLESS, Server
from session_util import call, complete, continuation, io_done, reseal

LONG = ("The history of the river Thames begins long before London. In the last ice age the "
        "river flowed far to the north, through the Vale of St Albans, until a great sheet of "
        "ice pushed it south to roughly its present course. Early farmers cleared the woods of "
        "its valley, and later the Romans built a bridge near the place where the City of "
        "London now stands. Through the Middle Ages the river carried wool, timber and stone,")
TURN2 = " and in the centuries that followed"
WINDOW = "64"
# A stat the shim stalls, and the longest gap between a stream's tokens that
# says the engine thread did not wait for it: half the stall, so that a
# thread late by seconds on a loaded host (a stream stopped 2.5 s) is not
# taken for a stat on the engine thread, which stops it for the whole stall.
STAT_STALL_S = 10
STREAM_GAP_LIMIT_S = STAT_STALL_S / 2


def pol_id(pol):
    return pol.replace(":", "")


@pytest.mark.parametrize("dtype", ["f16", "f32", "q8_0"])
def test_greedy_session_continues_after_a_sigterm_restart_exactly(binary, model, tmp_path,
                                                                   dtype):
    d = tmp_path / "sessions"
    d.mkdir()
    args = ["--session-dir", str(d), "--window", WINDOW, "--kv-dtype", dtype]
    ref = {}
    s1 = Server(binary, model, args)
    try:
        for pol in ("window", "sinks:4"):
            for sid in (f"ref-{pol_id(pol)}", f"live-{pol_id(pol)}"):
                st, r = complete(s1, LONG, sid, max_tokens=40, kv_policy=pol)
                assert st == 200, r
                assert r["session"]["created"] is True
                assert r["session"]["kv_policy"] == pol
                # longer than the window: the window slid before the save
                assert r["session"]["tokens_seen"] > int(WINDOW) + 40
            st, r = complete(s1, TURN2, f"ref-{pol_id(pol)}", max_tokens=24)
            assert st == 200, r
            assert r["session"]["restored"] is False and r["session"]["created"] is False
            ref[pol] = continuation(r)
    finally:
        assert s1.stop() == 0, s1.log()
    for pol in ("window", "sinks:4"):
        assert (d / f"live-{pol_id(pol)}.snap").exists()
    s2 = Server(binary, model, args)
    try:
        for pol in ("window", "sinks:4"):
            st, r = complete(s2, TURN2, f"live-{pol_id(pol)}", max_tokens=24,
                             session_create=False)
            assert st == 200, r
            assert r["session"]["restored"] is True
            assert continuation(r) == ref[pol]
        m = s2.metrics()
        assert m["streamsink_session_restores_total"] == 2
    finally:
        assert s2.stop() == 0, s2.log()


def test_bad_snapshots_get_a_clear_error_and_are_moved_aside(binary, model, tmp_path):
    d = tmp_path / "sessions"
    d.mkdir()
    args = ["--session-dir", str(d), "--window", WINDOW]
    names = ["trunc", "flip", "version", "model", "good"]
    s1 = Server(binary, model, args)
    try:
        for n in names:
            st, r = complete(s1, LONG, f"bad-{n}", max_tokens=4)
            assert st == 200, r
    finally:
        assert s1.stop() == 0, s1.log()
    p = {n: d / f"bad-{n}.snap" for n in names}
    data = p["trunc"].read_bytes()
    p["trunc"].write_bytes(data[:len(data) // 2])
    data = bytearray(p["flip"].read_bytes())
    data[len(data) // 2] ^= 0x10
    p["flip"].write_bytes(bytes(data))
    data = bytearray(p["version"].read_bytes())
    data[8:12] = (4).to_bytes(4, "little")  # newer than any this server reads
    p["version"].write_bytes(reseal(data))
    data = bytearray(p["model"].read_bytes())
    data[24] ^= 0xFF  # the model file's SHA-256
    p["model"].write_bytes(reseal(data))
    why = {"trunc": "truncated", "flip": "checksum", "version": "version 4",
           "model": "another model"}
    s2 = Server(binary, model, args)
    try:
        for n, word in why.items():
            st, r = complete(s2, TURN2, f"bad-{n}", max_tokens=4)
            assert st == 422, r
            assert r["error"]["code"] == "session_snapshot_invalid"
            assert word in r["error"]["message"], r
            io_done(s2)  # the IO thread moves the file aside
            assert not p[n].exists() and (d / f"bad-{n}.bad").exists()
            # the context is gone, and the next request says so
            st, r = complete(s2, TURN2, f"bad-{n}", max_tokens=4, session_create=False)
            assert st == 404 and r["error"]["code"] == "session_not_found"
            st, r = complete(s2, TURN2, f"bad-{n}", max_tokens=4)
            assert st == 200 and r["session"]["created"] is True
        st, r = complete(s2, TURN2, "bad-good", max_tokens=4)
        assert st == 200 and r["session"]["restored"] is True
        assert s2.metrics()["streamsink_session_restore_failures_total"] == 4
    finally:
        assert s2.stop() == 0, s2.log()


def test_a_snapshot_moved_aside_is_recounted_off_the_engine_thread(
        binary, model, tmp_path, monkeypatch):
    """A snapshot that cannot be restored (made with another model, as every
    one is after a model change; or damaged) is moved aside and the
    directory recounted by the IO thread: a recount stats every snapshot,
    and on the engine thread that stopped every stream for as long (here
    one snapshot's stat takes STAT_STALL_S, through an LD_PRELOAD shim). The count is
    the directory's, also when the file came after the last count (written
    by another replica)."""
    shim = build_fail_open_shim(tmp_path, stalls=True)
    d, args = sessions_written(binary, model, tmp_path, ("old-model", "slow"))
    bad, late = d / "old-model.snap", d / "late.snap"
    data = bytearray(bad.read_bytes())
    damaged = bytearray(data)
    damaged[len(damaged) // 2] ^= 0x10  # the checksum fails
    data[24] ^= 0xFF  # the model file's SHA-256
    bad.write_bytes(reseal(data))
    flag = tmp_path / "stall-now"
    monkeypatch.setenv("LD_PRELOAD", str(shim))
    monkeypatch.setenv("STALL_NAME", "slow.snap")
    monkeypatch.setenv("STALL_FLAG", str(flag))
    monkeypatch.setenv("STALL_S", str(STAT_STALL_S))
    s = Server(binary, model, args)
    try:
        assert s.metrics()["streamsink_sessions_on_disk"] == 2
        late.write_bytes(damaged)  # not counted yet
        stream = TimedStream(s, 100000)
        flag.touch()
        for sid in ("old-model", "late"):
            st, r = complete(s, TURN2, sid, max_tokens=4)
            assert st == 422 and r["error"]["code"] == "session_snapshot_invalid", r
        gap = stream.largest_gap_after_now()
        assert gap < STREAM_GAP_LIMIT_S, f"a stream stopped for {gap:.1f} s"
        flag.unlink()
        # recounts may still be stalled (STAT_STALL_S each)
        s.wait_metric("streamsink_sessions_on_disk", lambda v: v == 1, timeout=90)
        s.wait_metric("streamsink_session_snapshot_bytes",
                      lambda v: v == (d / "slow.snap").stat().st_size, timeout=90)
        assert sorted(os.listdir(d)) == ["late.bad", "old-model.bad", "slow.snap"]
    finally:
        if flag.exists():
            flag.unlink()
        assert s.stop() == 0, s.log()


def test_a_session_request_waiting_for_the_io_thread_holds_no_body(
        binary, model, tmp_path, monkeypatch):
    """A session request (GET, save, DELETE) needs nothing of its body: it
    is released when the request is read, not when the session IO thread
    answers it. A save sent with a large body behind a slow directory
    recount (a DELETE's, whose stat of one snapshot takes 20 s through the
    LD_PRELOAD shim) held it in --max-body-total meanwhile, and a completion
    that needed the room got 503. The test waits for each request to be in
    the engine rather than sleeping, and the stall is long (20 s) so that a
    server or a client late by seconds still sends the completion inside it."""
    stall_s = 20
    shim = build_fail_open_shim(tmp_path, stalls=True)
    d, args = sessions_written(binary, model, tmp_path, ("slow", "gone", "x"))
    flag = tmp_path / "stall-now"
    monkeypatch.setenv("LD_PRELOAD", str(shim))
    monkeypatch.setenv("STALL_NAME", "slow.snap")
    monkeypatch.setenv("STALL_FLAG", str(flag))
    monkeypatch.setenv("STALL_S", str(stall_s))
    budget = 1 << 20
    s = Server(binary, model, args + ["--max-body", str(budget), "--max-body-total", str(budget)])
    try:
        flag.touch()
        t0 = time.time()  # the stall starts after this, and lasts stall_s
        results = {}
        deleting = threading.Thread(
            target=lambda: results.update(delete=call(s, "DELETE", "/v1/sessions/gone")))
        deleting.start()
        wait_inflight(s, 1)  # the DELETE is in the engine: its recount goes first
        pad = b" " * (budget * 3 // 4)
        saving = threading.Thread(target=lambda: results.update(
            save=s.post("/v1/sessions/x/save", b"{}" + pad)))
        saving.start()
        wait_inflight(s, 2)  # the save is read, and waits behind the recount
        status, _, body = s.post("/v1/completions", json.dumps(
            {"model": "smol", "prompt": "Hello", "max_tokens": 1}).encode() + pad[:budget // 2])
        waited = time.time() - t0
        deleting.join(stall_s + 60)
        saving.join(stall_s + 60)
        # answered before the stall could end: the save still waited behind it
        assert waited < stall_s, "the completion came after the stall: nothing was tested"
        assert status == 200, body
        assert results["delete"][0] == 204 and results["save"][0] == 200, results
    finally:
        if flag.exists():
            flag.unlink()
        assert s.stop() == 0, s.log()


def test_a_session_in_memory_is_described_without_a_stat_on_the_engine_thread(
        binary, model, tmp_path, monkeypatch):
    """A completion on a session, a GET of it and a listing say whether its
    snapshot is on disk and how large, from what this server last wrote or
    read, not from a stat of the file on the engine thread: a file system
    slow to answer (here that stat takes STAT_STALL_S, through an LD_PRELOAD shim)
    stops no stream."""
    shim = build_fail_open_shim(tmp_path, stalls=True)
    flag = tmp_path / "stall-now"
    monkeypatch.setenv("LD_PRELOAD", str(shim))
    monkeypatch.setenv("STALL_NAME", "x.snap")
    monkeypatch.setenv("STALL_FLAG", str(flag))
    monkeypatch.setenv("STALL_S", str(STAT_STALL_S))
    d = tmp_path / "sessions"
    d.mkdir()
    s = Server(binary, model, ["--session-dir", str(d), "--window", WINDOW])
    try:
        assert complete(s, LONG, "x", max_tokens=4)[0] == 200
        st, r = call(s, "POST", "/v1/sessions/x/save")
        size = (d / "x.snap").stat().st_size
        assert st == 200 and r["on_disk"] is True and r["bytes"] == size, r
        stream = TimedStream(s, 100000)
        flag.touch()
        st, r = complete(s, TURN2, "x", max_tokens=2, session_create=False)
        assert st == 200 and r["session"]["on_disk"] is True, r
        assert r["session"]["bytes"] == size, r
        st, r = call(s, "GET", "/v1/sessions/x")
        assert st == 200 and r["on_disk"] is True and r["bytes"] == size, r
        st, r = call(s, "GET", "/v1/sessions")
        assert st == 200 and [(x["id"], x["on_disk"]) for x in r["data"]] == [("x", True)], r
        gap = stream.largest_gap_after_now()
        flag.unlink()
        assert gap < STREAM_GAP_LIMIT_S, f"a stream stopped for {gap:.1f} s"
    finally:
        if flag.exists():
            flag.unlink()
        assert s.stop() == 0, s.log()


def test_a_file_evicted_between_its_read_and_its_restore_is_not_said_to_be_on_disk(
        binary, model, tmp_path):
    """A completion on a session on disk has its file read by the IO thread
    and then waits for a KV slot; if that file is evicted meanwhile (another
    session's save goes over --session-disk-max), the session it restores is
    not on disk, and its answer and a GET say so."""
    d, args = sessions_written(binary, model, tmp_path, ("foo",))
    size = (d / "foo.snap").stat().st_size
    args += ["--max-seqs", "1", "--session-disk-max", str(size * 3 // 2)]
    # the server's writes fail (a file-size limit) until the test lifts it
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_sig = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, old[1]))
    try:
        s = Server(binary, model, args)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
        signal.signal(signal.SIGXFSZ, old_sig)
    try:
        assert complete(s, LONG, "bar", max_tokens=4)[0] == 200
        stream = TimedStream(s, 100000)  # takes the only slot: bar's save fails, held
        s.wait_metric("streamsink_snapshot_saves_held", lambda v: v == 1, timeout=30)
        out = {}
        foo = threading.Thread(target=lambda: out.update(
            r=complete(s, TURN2, "foo", max_tokens=2, session_create=False)))
        foo.start()  # foo.snap is read, and foo waits for the slot
        wait_inflight(s, 2)
        resource.prlimit(s.proc.pid, resource.RLIMIT_FSIZE, old)  # bar's retry is written,
        s.wait_metric("streamsink_session_disk_evictions_total", lambda v: v == 1, timeout=30)
        assert not (d / "foo.snap").exists()  # and foo's file evicted for it
        stream.stop()
        foo.join(60)
        st, r = out["r"]
        assert st == 200 and r["session"]["restored"] is True, r
        assert r["session"]["on_disk"] is False and r["session"]["bytes"] == 0, r
        st, r = call(s, "GET", "/v1/sessions/foo")
        assert st == 200 and r["on_disk"] is False, r
    finally:
        assert s.stop() == 0, s.log()


def to_local_layers(data, period):
    """A version-2 snapshot (every layer global) rewritten as version 3 of a
    model whose layers are all local (period > layers), with a local window
    equal to the global cells stored: the same KV bytes, a consistent file
    (layout in engine/snapshot.h). Period 0: version 3 with no local layers."""
    n = struct.unpack_from("<Q", data, 128)[0]  # cells stored
    pos_next = struct.unpack_from("<Q", data, 112)[0]
    idl = data[176] | data[177] << 8
    if period == 0:  # no local layers: no local window, no local cells
        n = 0
    body = bytearray(data[:176]) + struct.pack("<IIQQQ", period, 0, n, n, pos_next - n) + \
        data[176:]
    body[8:12] = struct.pack("<I", 3)
    body[12:16] = struct.pack("<I", 210 + idl)
    body[16:24] = struct.pack("<Q", len(body))
    return reseal(bytes(body))


def test_a_snapshot_of_other_local_layers_is_incompatible_and_kept(binary, model, tmp_path):
    d = tmp_path / "sessions"
    d.mkdir()
    args = ["--session-dir", str(d), "--window", WINDOW]
    s1 = Server(binary, model, args)
    try:
        st, r = complete(s1, LONG, "loc", max_tokens=4)
        assert st == 200, r
    finally:
        assert s1.stop() == 0, s1.log()
    f = d / "loc.snap"
    data = f.read_bytes()
    assert data[8:12] == (2).to_bytes(4, "little")  # SmolLM2's layers are all global
    changed = to_local_layers(data, 64)
    f.write_bytes(changed)
    s2 = Server(binary, model, args)
    try:
        st, r = complete(s2, TURN2, "loc", max_tokens=4, session_create=False)
        assert st == 409, r
        assert r["error"]["code"] == "session_snapshot_incompatible", r
        assert "local attention layers of period 64" in r["error"]["message"], r
        assert f.read_bytes() == changed  # kept, not moved aside
        f.write_bytes(to_local_layers(data, 0))  # period 0: every layer global again
        st, r = complete(s2, TURN2, "loc", max_tokens=4, session_create=False)
        assert st == 200, r
        assert r["session"]["restored"] is True
    finally:
        assert s2.stop() == 0, s2.log()


def test_a_full_disk_fails_the_save_cleanly_and_keeps_the_session(binary, model, tmp_path):
    """RLIMIT_FSIZE makes every write past 256 KiB fail with EFBIG (SIGXFSZ
    ignored, as a disk that fills up would fail with ENOSPC)."""
    d = tmp_path / "sessions"
    d.mkdir()
    old_lim = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_sig = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, old_lim[1]))
    try:
        s = Server(binary, model, ["--session-dir", str(d), "--window", WINDOW])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_lim)
        signal.signal(signal.SIGXFSZ, old_sig)
    try:
        st, r = complete(s, LONG, "full", max_tokens=8)
        assert st == 200, r
        st, r = call(s, "POST", "/v1/sessions/full/save")
        assert st == 500 and r["error"]["code"] == "session_save_failed", r
        assert "File too large" in r["error"]["message"]
        assert os.listdir(d) == []  # no snapshot, no temp file left behind
        st, r = complete(s, TURN2, "full", max_tokens=4, session_create=False)
        assert st == 200, r
        assert r["session"]["in_memory"] and not r["session"]["restored"]
        assert s.metrics()["streamsink_session_save_failures_total"] >= 1
    finally:
        assert s.stop() == 0, s.log()


def test_session_api_lists_describes_saves_and_deletes(binary, model, tmp_path):
    d = tmp_path / "sessions"
    d.mkdir()
    s = Server(binary, model, ["--session-dir", str(d), "--window", WINDOW])
    try:
        st, r = call(s, "POST", "/v1/sessions")
        assert st == 201 and r["id"].startswith("sess_") and len(r["id"]) == 37
        st, r2 = call(s, "POST", "/v1/sessions")
        assert r2["id"] != r["id"]
        sid = r["id"]
        st, r = complete(s, LONG, sid, max_tokens=8)
        assert st == 200 and r["session"]["created"] is True
        st, r = call(s, "GET", f"/v1/sessions/{sid}")
        assert st == 200 and r["in_memory"] is True and r["on_disk"] is False
        seen = r["tokens_seen"]
        st, r = call(s, "POST", f"/v1/sessions/{sid}/save")
        assert st == 200 and r["on_disk"] is True and r["bytes"] == os.path.getsize(
            d / f"{sid}.snap")
        st, r = call(s, "GET", "/v1/sessions")
        assert st == 200 and [x["id"] for x in r["data"]] == [sid]
        assert r["data"][0]["tokens_seen"] == seen and r["data"][0]["kv_policy"] == "sinks:4"
        st, r = call(s, "DELETE", f"/v1/sessions/{sid}")
        assert st == 204
        assert not (d / f"{sid}.snap").exists()
        st, r = call(s, "GET", f"/v1/sessions/{sid}")
        assert st == 404 and r["error"]["code"] == "session_not_found"
        st, r = complete(s, TURN2, sid, max_tokens=4, session_create=False)
        assert st == 404
        m = s.metrics()
        assert m["streamsink_sessions_on_disk"] == 0
    finally:
        assert s.stop() == 0, s.log()


def test_a_listing_reads_the_directory_off_the_engine_thread(binary, model, tmp_path):
    """GET /v1/sessions reads the header of every snapshot in the directory:
    thousands of files take a while, and a directory on a slow disk longer.
    The session IO thread reads them, so a listing that waits on its reads
    holds up nobody else's stream, a listing whose client left does not hold
    up the next one, and listings waiting their turn never fill the queue.
    The slow read here is a FIFO named like a snapshot: opening it waits for
    a writer."""
    d = tmp_path / "sessions"
    d.mkdir()
    s = Server(binary, model, ["--session-dir", str(d), "--window", WINDOW])
    fifo, moved = d / "slow.snap", d / "slow.fifo"
    try:
        st, r = call(s, "POST", "/v1/sessions")
        sid = r["id"]
        assert complete(s, LONG, sid, max_tokens=4)[0] == 200
        assert call(s, "POST", f"/v1/sessions/{sid}/save")[0] == 200
        os.mkfifo(fifo)
        # a client that gives up on its listing after 3 s and leaves
        with pytest.raises(TimeoutError):
            call(s, "GET", "/v1/sessions", timeout=3)
        body = {"model": "smol", "prompt": "The sea", "max_tokens": 8, "temperature": 0}
        st, r = call(s, "POST", "/v1/completions", body, timeout=60)
        assert st == 200 and r["usage"]["completion_tokens"] >= 1
        # at most 4 listings wait (here behind the first): more get 429 at
        # once, and completions still find room in the queue
        listed = [None] * 6

        def lister(i):
            listed[i] = call(s, "GET", "/v1/sessions", timeout=120)

        listers = [threading.Thread(target=lister, args=(i,)) for i in range(6)]
        for t in listers:
            t.start()
            time.sleep(0.2)
        deadline = time.time() + 30
        while sum(x is not None for x in listed) < 2 and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        refused = [x for x in listed if x is not None]
        assert len(refused) == 2 and all(st == 429 for st, _ in refused), refused
        assert call(s, "POST", "/v1/completions", body, timeout=60)[0] == 200
        # the FIFO leaves the listing's way, and a writer lets the open return
        os.rename(fifo, moved)
        os.close(os.open(moved, os.O_WRONLY | os.O_NONBLOCK))  # ENXIO: nobody was opening it
        for t in listers:
            t.join(60)
        ok = [r for st, r in listed if st == 200]
        assert len(ok) == 4 and all([x["id"] for x in r["data"]] == [sid] for r in ok)
    finally:
        for f in (fifo, moved):  # never leave a reader waiting on the FIFO
            try:
                os.close(os.open(f, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        assert s.stop() == 0, s.log()


def read_cut_stream(s, body, sigterm_at=None):
    """Reads the streamed completion body asks for while the server s stops:
    SIGTERM once the client holds sigterm_at tokens (None: once the response
    has begun). Waits for the exit (0). Returns the text, the tokens with
    logprobs received, the error event's error and whether [DONE] came."""
    text, n, error, done = "", 0, None, False
    with requests.post(s.base + "/v1/completions", json=body, stream=True, timeout=60) as r:
        assert r.status_code == 200
        if sigterm_at is None:
            s.proc.send_signal(signal.SIGTERM)
        for line in r.iter_lines():
            if not line.startswith(b"data: "):
                continue
            if line == b"data: [DONE]":
                done = True
                break
            ev = json.loads(line[6:])
            if "error" in ev:
                error = ev["error"]
                continue
            ch = ev["choices"][0]
            text += ch["text"]
            n += len(ch["logprobs"]["tokens"]) if ch.get("logprobs") else 0
            if n == sigterm_at:
                s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(30) == 0, s.log()
    s.thread.join(5)
    return text, n, error, done


def assert_saved_as_received(binary, model, flags, sid, text, n):
    """On a server started again with flags: session sid is what the same
    greedy prompt (ENDLESS) with max_tokens n makes, whose text is text."""
    s = Server(binary, model, flags)
    try:
        st, saved = call(s, "GET", f"/v1/sessions/{sid}")
        assert st == 200, saved
        st, ref = complete(s, ENDLESS, "ref", max_tokens=n)
        assert st == 200, ref
        assert ref["choices"][0]["text"] == text
        st, ref_info = call(s, "GET", "/v1/sessions/ref")
        assert st == 200
        assert (saved["tokens_seen"], saved["position"]) == (ref_info["tokens_seen"],
                                                             ref_info["position"])
    finally:
        assert s.stop() == 0, s.log()


def test_a_session_stream_cut_at_shutdown_keeps_what_its_client_received(binary, model,
                                                                          tmp_path):
    """A stream cut at the drain timeout ends with an error event and
    [DONE]; its session is saved. The client must have had every token the
    session holds: a session holding a token its client never saw would
    continue, after the restart, from a context the client does not know.
    So the saved session is the one that the same prompt with max_tokens set
    to the tokens received makes, and their texts agree."""
    d = tmp_path / "sessions"
    d.mkdir()
    s = Server(binary, model, ["--session-dir", str(d), "--drain-timeout", "1"])
    body = {"model": "smol", "prompt": ENDLESS, "max_tokens": None, "temperature": 0,
            "logprobs": 1, "stream": True, "session_id": "cut"}
    text, n, error, done = read_cut_stream(s, body, sigterm_at=8)
    assert done and error and error["code"] == "server_shutting_down", (done, error)
    assert n > 8
    assert_saved_as_received(binary, model, ["--session-dir", str(d)], "cut", text, n)


def test_a_session_stream_cut_while_it_holds_text_back_sends_that_text(binary, model,
                                                                        tmp_path):
    """Text that could start a stop string is held back until it cannot:
    here all of it, since the stop string is the answer's own first 255
    bytes and one more (256, the most a stop string may have). A cut at
    shutdown flushes it with its logprobs, so the client still has every
    token its saved session holds.

    The cut must come while the text is held: some 130 tokens (a digit is a
    token), half a second on one thread here, so a signal handled that much late lets the
    stream pass the held text and tests nothing (a late SIGTERM showed it).
    Such a try is made again, on a fresh server, up to three times."""
    for attempt in range(3):
        d = tmp_path / f"sessions-{attempt}"
        d.mkdir()
        # one thread and a cut 50 ms after the first token: the stream is
        # inside the held bytes when it is cut, unless the signal is late
        flags = ["--session-dir", str(d), "--threads", "1"]
        s = Server(binary, model, flags + ["--drain-timeout", "0.05"])
        st, plain = complete(s, ENDLESS, None, max_tokens=300)
        assert st == 200
        stop = plain["choices"][0]["text"][:255] + "#"
        assert len(stop.encode()) == 256
        body = {"model": "smol", "prompt": ENDLESS, "max_tokens": None, "temperature": 0,
                "logprobs": 1, "stream": True, "session_id": "held", "stop": [stop]}
        text, n, error, _ = read_cut_stream(s, body)
        if stop.startswith(text):
            break
    assert error and error["code"] == "server_shutting_down"
    assert n > 0 and stop.startswith(text), "every cut came after the held text"
    assert_saved_as_received(binary, model, flags, "held", text, n)


@pytest.mark.parametrize("when", ["after_a_chunk", "inside_the_first_step"])
def test_a_turn_left_inside_its_prompt_is_fed_whole_before_a_drain_ends(binary, model,
                                                                         tmp_path, when):
    """A session turn whose client leaves while its prompt is fed is no
    longer a request the server answers, but the engine still feeds the
    rest of its prompt (a session never holds part of one). A SIGTERM then
    finds no request running; the drain still waits for that feed, so the
    session saved at the exit holds the whole prompt, and nothing more.
    Inside the first step (a chunk of 2,048 tokens) the figures the engine
    publishes after each step still say it runs nothing: the drain asks the
    engine's queue, which counts a request from its submit to its end."""
    d = tmp_path / "sessions"
    d.mkdir()
    flags = ["--session-dir", str(d), "--threads", "1"]
    big = ["--chunk", "2048", "--max-step-tokens", "2048"] if when != "after_a_chunk" else []
    s = Server(binary, model, flags + big + ["--drain-timeout", "60"])
    prompt = " ".join([LONG] * 24)  # some 2,300 tokens: seconds of prefill on one thread
    body = json.dumps({"model": "smol", "prompt": prompt, "max_tokens": 8, "temperature": 0,
                       "session_id": "left"}).encode()
    c = s.connect()
    c.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
    if when == "after_a_chunk":
        s.wait_metric("streamsink_prompt_tokens_total", lambda v: v >= 256)  # a chunk is in
    else:
        # tokenized and admitted: the first step of seconds runs (a cancel
        # that reaches the engine before it starts drops the turn, which a
        # fixed 0.5 s sleep let happen on a loaded host)
        wait_step_running(s)
        assert s.metrics()["streamsink_prompt_tokens_total"] == 0
    c.close()
    s.wait_metric("streamsink_requests_inflight", lambda v: v == 0)
    if when == "after_a_chunk":
        assert s.metrics()["streamsink_active_sequences"] == 1  # still feeding
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(60) == 0, s.log()
    s.thread.join(5)
    s = Server(binary, model, flags)
    try:
        st, saved = call(s, "GET", "/v1/sessions/left")
        assert st == 200, saved
        st, r = complete(s, prompt, None, max_tokens=1)
        assert st == 200, r
        assert saved["tokens_seen"] == r["usage"]["prompt_tokens"], saved
    finally:
        assert s.stop() == 0, s.log()


@pytest.mark.parametrize("then", ["third_signal", "file_returns", "io_thread_signalled"])
def test_a_signal_ends_a_shutdown_stuck_behind_a_hung_file(binary, model, tmp_path, then):
    """SIGTERM waits for every session save, and saves wait behind the file
    operation in progress. On a file system that hangs (a FIFO named like a
    snapshot stands in for a dead NFS mount) that wait has no end, and the
    loop that takes signals waits on it. A signal then says what the wait is
    for and the next one ends the process (exit 1, saying what it gives up);
    a double Ctrl-C alone costs nothing: once the file returns, every
    snapshot is written and the exit is 0. The kernel gives a process's
    signal to any of its threads: given to the session IO thread held in the
    FIFO's open, the second signal cut that open short (EINTR), and the
    shutdown ended at once, the file given up."""
    d = tmp_path / "sessions"
    d.mkdir()
    s = Server(binary, model, ["--session-dir", str(d), "--drain-timeout", "1"])
    fifo = d / "zzz.snap"
    try:
        assert complete(s, LONG, "live", max_tokens=4)[0] == 200
        os.mkfifo(fifo)
        with pytest.raises(TimeoutError):  # a listing holds the IO thread on the FIFO
            call(s, "GET", "/v1/sessions", timeout=2)
        wait_io_held(s)
        s.proc.send_signal(signal.SIGTERM)
        with pytest.raises(subprocess.TimeoutExpired):  # held: its save cannot be written
            s.proc.wait(5)
        wait_log(s, "stopping")
        if then == "io_thread_signalled":
            tgkill(s.proc.pid, io_held_thread(s), signal.SIGTERM)
        else:
            s.proc.send_signal(signal.SIGTERM)
        with pytest.raises(subprocess.TimeoutExpired):
            s.proc.wait(3)
        wait_log(s, "signal again to exit without them")
        assert not (d / "live.snap").exists()
        if then == "third_signal":
            s.proc.send_signal(signal.SIGINT)
            assert s.proc.wait(60) == 1
            s.thread.join(5)
            assert "signal while stopping: exiting now" in s.log()
        else:
            assert open_fifo_writer(fifo), s.log()  # the stuck read returns
            assert s.proc.wait(30) == 0, s.log()
            assert (d / "live.snap").exists()
    finally:
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
        s.stop()


def io_held_thread(server):
    """The id of the server's thread waiting in the open of a FIFO (skips
    where the kernel does not say)."""
    task = f"/proc/{server.proc.pid}/task"
    for t in os.listdir(task):
        with open(f"{task}/{t}/wchan") as f:
            if f.read().strip() == "wait_for_partner":
                return int(t)
    pytest.skip("the kernel does not say which thread waits on the FIFO (no wchan)")


def tgkill(pid, tid, sig):
    """Sends sig to thread tid of process pid (tgkill(2); Python has no call for it)."""
    import ctypes
    import platform
    nr = {"x86_64": 234, "aarch64": 131}.get(platform.machine())  # SYS_tgkill
    if nr is None:
        pytest.skip(f"no tgkill number known here ({platform.machine()})")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(nr, pid, tid, int(sig)) != 0:
        raise OSError(ctypes.get_errno(), "tgkill")


def wait_log(server, text, timeout=60):
    """Waits until the server's log holds text (a signal is taken, and its
    line logged, when the server gets to it: seconds later on a loaded host)."""
    deadline = time.time() + timeout
    while text not in server.log():
        assert time.time() < deadline, f"{text!r} not logged in {timeout} s:\n{server.log()}"
        time.sleep(0.05)


def open_fifo_writer(path, timeout=30):
    """Opens and closes the FIFO at path for writing once a reader waits in
    its open (which then returns, and reads nothing). False if none came."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            return True
        except OSError:  # ENXIO: no reader yet
            time.sleep(0.05)
    return False


def wait_io_held(server, timeout=30):
    """Waits until a thread of the server waits in the open of a FIFO (the
    session IO thread, held by a FIFO named like a snapshot). Where the
    kernel does not tell (no wchan in /proc), waits 1 s instead."""
    task = f"/proc/{server.proc.pid}/task"
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            chans = []
            for t in os.listdir(task):
                with open(f"{task}/{t}/wchan") as f:
                    chans.append(f.read().strip())
        except OSError:
            chans = []
        if "wait_for_partner" in chans:
            return
        if all(c in ("", "0") for c in chans):
            time.sleep(1.0)
            return
        time.sleep(0.05)
    raise AssertionError("no thread of the server came to wait on the FIFO")


def task_cpu_ticks(pid):
    """CPU time (clock ticks) of each thread of process pid, by thread id."""
    out = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[t] = int(fields[11]) + int(fields[12])  # utime + stime
    return out


def wait_step_running(server, cpu_s=0.3, timeout=60):
    """Waits until the one request sent is in the engine and a thread of the
    server has since used cpu_s of CPU time (the engine feeding its prompt:
    tokenizing comes before the request is in the engine, and a scrape costs
    milliseconds)."""
    wait_inflight(server, 1)
    tick = os.sysconf("SC_CLK_TCK")
    before = task_cpu_ticks(server.proc.pid)
    deadline = time.time() + timeout
    while time.time() < deadline:
        now = task_cpu_ticks(server.proc.pid)
        if any(v - before.get(t, 0) >= cpu_s * tick for t, v in now.items()):
            return
        time.sleep(0.02)
    raise AssertionError(f"no thread of the server used {cpu_s} s of CPU in {timeout} s")


def wait_inflight(server, n):
    """Waits until n requests are in the engine (submitted, not answered):
    those started so far have arrived, in the order they were started."""
    server.wait_metric("streamsink_requests_inflight", lambda v: v == n, timeout=30)


def remove_fifo(fifo):
    """Removes the FIFO at fifo, if it is there, letting a reader that waits
    in its open go first (never leave one waiting on it)."""
    if fifo.exists():
        open_fifo_writer(fifo, timeout=1)
        fifo.unlink()


class Background:
    """Requests to a server on threads of their own: got[name] is (status,
    parsed JSON) once one is answered, threads the threads in order."""

    def __init__(self, server):
        self.server, self.got, self.threads = server, {}, []

    def start(self, name, method, path, body=None, key=None):
        def run():
            self.got[name] = call(self.server, method, path, body, key=key, timeout=120)

        self.threads.append(threading.Thread(target=run))
        self.threads[-1].start()

    def join(self):
        for t in self.threads:
            t.join(60)


def release_fifo_readers(path, threads):
    """Lets every open of the FIFO at path return, one after another, until
    threads are all done."""
    deadline = time.time() + 60
    while any(t.is_alive() for t in threads) and time.time() < deadline:
        open_fifo_writer(path, timeout=0.2)


def test_session_requests_read_and_delete_files_off_the_engine_thread(binary, model, tmp_path):
    """GET /v1/sessions/ID and a save of a session that is not in memory read
    the file's header (whose it is); a DELETE reads it, unlinks the file,
    syncs and recounts the directory; a completion naming a session that is
    not in memory reads the whole file. On a slow disk, or in a directory of
    thousands, that takes a while. The session IO thread does it and the
    request is answered when it is done, so streams go on meanwhile, and
    requests naming a session whose file is being worked on wait for it.
    The slow read here is a FIFO named like a snapshot: opening it waits for
    a writer."""
    d = tmp_path / "sessions"
    d.mkdir()
    s = Server(binary, model, ["--session-dir", str(d), "--window", WINDOW])
    fifo = d / "slow-file.snap"
    try:
        st, r = call(s, "POST", "/v1/sessions")
        sid = r["id"]
        assert complete(s, LONG, sid, max_tokens=4)[0] == 200
        assert call(s, "POST", f"/v1/sessions/{sid}/save")[0] == 200
        assert (d / f"{sid}.snap").exists()
        os.mkfifo(fifo)
        got = {}

        def request(name, method, path, body=None):
            got[name] = call(s, method, path, body, timeout=120)

        # a completion naming it: its file is read for a restore, whose owner
        # is checked from its header, by the IO thread too
        slow = {"model": "smol", "prompt": "Hi", "max_tokens": 2, "session_id": "slow-file"}
        asks = [("restore", "POST", "/v1/completions", slow),
                ("get", "GET", "/v1/sessions/slow-file"),
                ("save", "POST", "/v1/sessions/slow-file/save"),
                ("delete", "DELETE", "/v1/sessions/slow-file"),
                ("delete mine", "DELETE", f"/v1/sessions/{sid}"),
                ("get mine", "GET", f"/v1/sessions/{sid}")]
        threads = []
        for i, a in enumerate(asks):
            threads.append(threading.Thread(target=request, args=a))
            threads[-1].start()
            if i == 0:
                wait_io_held(s)
            wait_inflight(s, i + 1)
        # the IO thread waits in the FIFO's open; the engine thread does not
        body = {"model": "smol", "prompt": "The sea", "max_tokens": 8, "temperature": 0}
        st, r = call(s, "POST", "/v1/completions", body, timeout=60)
        assert st == 200 and r["usage"]["completion_tokens"] >= 1
        time.sleep(0.3)
        assert not got, got
        release_fifo_readers(fifo, threads[:4])
        for t in threads:
            t.join(60)
        # a FIFO is nobody's snapshot: not found, or for the restore, not a
        # snapshot at all (moved aside, as a damaged file is)
        for name in ("get", "save", "delete"):
            assert got[name][0] == 404, got
            assert got[name][1]["error"]["code"] == "session_not_found", got
        assert got["restore"][0] == 422, got
        assert got["restore"][1]["error"]["code"] == "session_snapshot_invalid", got
        # the session's own file is gone, and the GET behind its DELETE says so
        assert got["delete mine"] == (204, None), got
        assert got["get mine"][0] == 404, got
        assert not (d / f"{sid}.snap").exists()
        assert s.metrics()["streamsink_sessions_on_disk"] == 0
    finally:
        remove_fifo(fifo)
        assert s.stop() == 0, s.log()


def test_a_request_for_a_session_whose_file_is_being_written_waits_off_the_engine_thread(
        binary, model, tmp_path):
    """A session pushed out of its KV slot is saved by the IO thread; a GET of
    it while the write waits (here behind a read held on a FIFO) waits for
    the write, and the engine thread goes on with other streams."""
    d = tmp_path / "sessions"
    d.mkdir()
    s = Server(binary, model, ["--session-dir", str(d), "--window", WINDOW, "--max-seqs", "1"])
    fifo = d / "slow-file.snap"
    try:
        st, r = call(s, "POST", "/v1/sessions")
        sid = r["id"]
        assert complete(s, LONG, sid, max_tokens=4)[0] == 200
        os.mkfifo(fifo)
        got = {}

        def request(name, method, path):
            got[name] = call(s, method, path, timeout=120)

        held = threading.Thread(target=request, args=("held", "GET", "/v1/sessions/slow-file"))
        held.start()
        wait_io_held(s)
        # another session takes the only slot: sid is saved, behind the FIFO
        st, r = call(s, "POST", "/v1/sessions")
        assert complete(s, "Hello", r["id"], max_tokens=4)[0] == 200
        mine = threading.Thread(target=request, args=("mine", "GET", f"/v1/sessions/{sid}"))
        mine.start()
        wait_inflight(s, 2)
        body = {"model": "smol", "prompt": "The sea", "max_tokens": 8, "temperature": 0}
        st, r = call(s, "POST", "/v1/completions", body, timeout=60)
        assert st == 200 and r["usage"]["completion_tokens"] >= 1
        assert not got, got
        release_fifo_readers(fifo, [held])
        for t in (held, mine):
            t.join(60)
        assert got["held"][0] == 404, got
        st, r = got["mine"]
        assert st == 200 and r["id"] == sid and r["on_disk"] is True, got
        assert r["bytes"] == os.path.getsize(d / f"{sid}.snap")
    finally:
        remove_fifo(fifo)
        assert s.stop() == 0, s.log()


def test_session_requests_held_by_the_directory_keep_their_order_and_their_bound(
        binary, model, tmp_path):
    """With the IO thread held (a FIFO named like a snapshot) and its 4 places
    for session files taken, more session requests wait in the queue, each
    after the requests naming the same session sent before it (a DELETE sent
    first is not overtaken by a GET or a completion of that session). Once
    the IO thread has finished nothing for 10 s, at most 4 of them wait, so
    that completions keep their places (more get 429)."""
    d = tmp_path / "sessions"
    d.mkdir()
    s = Server(binary, model, ["--session-dir", str(d), "--window", WINDOW])
    fifo = d / "slow-file.snap"
    bg = Background(s)
    got, start = bg.got, bg.start
    try:
        assert complete(s, LONG, "x", max_tokens=4)[0] == 200  # x is in memory
        os.mkfifo(fifo)
        start("held", "GET", "/v1/sessions/slow-file")
        wait_io_held(s)
        for i in range(3):  # the other three places
            start(f"fill{i}", "GET", f"/v1/sessions/nosuch-{i}")
        wait_inflight(s, 4)
        start("delete x", "DELETE", "/v1/sessions/x")
        wait_inflight(s, 5)
        start("get x", "GET", "/v1/sessions/x")
        wait_inflight(s, 6)
        start("continue x", "POST", "/v1/completions",
              {"model": "smol", "prompt": TURN2, "max_tokens": 4, "temperature": 0,
               "session_id": "x", "session_create": False})
        wait_inflight(s, 7)
        time.sleep(10.5)  # the IO thread has finished nothing for SESSION_IO_SLOW_S
        for i in range(4):  # one after another, so that the last two are refused
            start(f"more{i}", "GET", f"/v1/sessions/more-{i}")
            if i < 2:
                wait_inflight(s, 8 + i)
            else:
                deadline = time.time() + 30
                while f"more{i}" not in got and time.time() < deadline:
                    time.sleep(0.05)
        # 4 session requests wait (delete x, get x and two more); the others
        # got 429 at once, and a completion still finds a place
        refused = sorted(k for k, v in got.items() if v[0] == 429)
        assert refused == ["more2", "more3"], got
        assert "too many session requests" in got["more2"][1]["error"]["message"]
        body = {"model": "smol", "prompt": "The sea", "max_tokens": 4, "temperature": 0}
        assert call(s, "POST", "/v1/completions", body, timeout=60)[0] == 200
        release_fifo_readers(fifo, bg.threads[:1])
        bg.join()
        assert got["held"][0] == 404 and got["fill0"][0] == 404, got
        assert got["delete x"] == (204, None), got
        assert got["get x"][0] == 404, got
        assert got["continue x"][0] == 404, got
        assert got["continue x"][1]["error"]["code"] == "session_not_found", got
    finally:
        remove_fifo(fifo)
        assert s.stop() == 0, s.log()


def test_another_keys_request_held_by_the_directory_does_not_hold_up_the_owner(
        binary, model, tmp_path):
    """Requests wait behind the earlier waiting requests naming the same
    session of the same key only: key B naming key A's session while the
    directory is held waits (for a place with the IO thread) without holding
    up A's own completions on it."""
    d = tmp_path / "sessions"
    d.mkdir()
    s = Server(binary, model, ["--session-dir", str(d), "--window", WINDOW,
                               "--api-key", "key-a", "--api-key", "key-b"])
    fifo = d / "slow-file.snap"
    bg = Background(s)
    got, start = bg.got, bg.start
    try:
        assert complete(s, LONG, "x", max_tokens=4, key="key-a")[0] == 200
        os.mkfifo(fifo)
        start("held", "GET", "/v1/sessions/slow-file", key="key-a")
        wait_io_held(s)
        for i in range(3):
            start(f"fill{i}", "GET", f"/v1/sessions/nosuch-{i}", key="key-a")
        wait_inflight(s, 4)
        start("b get x", "GET", "/v1/sessions/x", key="key-b")
        wait_inflight(s, 5)
        st, r = complete(s, TURN2, "x", max_tokens=4, key="key-a", session_create=False)
        assert st == 200 and r["session"]["created"] is False, r
        assert not got, got
        release_fifo_readers(fifo, bg.threads[:1])
        bg.join()
        assert got["b get x"][0] == 404, got
    finally:
        remove_fifo(fifo)
        assert s.stop() == 0, s.log()


def test_a_delete_does_not_overtake_a_completion_sent_before_it(binary, model, tmp_path):
    """A completion naming a session on disk waits for a KV slot (its file
    read); a DELETE of the session sent after it waits behind it, so the
    completion continues the session instead of finding it gone. Before the
    engine sees the completion, its prompt is tokenized off the loop: the
    DELETE waits in the router meanwhile (it went to the engine at once and
    sometimes overtook it, which a loaded CI host showed)."""
    d = tmp_path / "sessions"
    d.mkdir()
    s = Server(binary, model, ["--session-dir", str(d), "--window", WINDOW, "--max-seqs", "1"])
    got = {}

    def request(name, method, path, body=None):
        got[name] = call(s, method, path, body, timeout=120)

    try:
        assert complete(s, LONG, "x", max_tokens=4)[0] == 200
        # a long completion takes the only slot: x is written out
        body = {"model": "smol", "prompt": "1, 2, 3, 4, 5, 6, 7, 8,", "max_tokens": 1500,
                "temperature": 0}  # greedy, it counts on to the last token
        long = threading.Thread(target=request, args=("long", "POST", "/v1/completions", body))
        long.start()
        s.wait_metric("streamsink_active_sequences", lambda v: v == 1, timeout=30)
        turn = {"model": "smol", "prompt": TURN2, "max_tokens": 4, "temperature": 0,
                "session_id": "x", "session_create": False}
        first = threading.Thread(target=request,
                                 args=("continue x", "POST", "/v1/completions", turn))
        first.start()
        wait_inflight(s, 2)
        then = threading.Thread(target=request, args=("delete x", "DELETE", "/v1/sessions/x"))
        then.start()
        time.sleep(0.3)
        assert long.is_alive(), "the long completion ended before the test could race it"
        for t in (long, first, then):
            t.join(120)
        assert got["long"][0] == 200, got
        st, r = got["continue x"]
        assert st == 200 and r["session"]["created"] is False, got
        assert got["delete x"][0] in (204, 409), got
    finally:
        assert s.stop() == 0, s.log()


class TimedStream:
    """A greedy stream of max_tokens tokens on its own thread, each token's
    arrival time kept; returns once it has sent 5."""

    def __init__(self, server, max_tokens):
        self.times = []
        self.stopping = threading.Event()

        def run():
            it = server.client().completions.create(
                model="smol", prompt="1, 2, 3, 4, 5,", max_tokens=max_tokens, temperature=0,
                stream=True)
            for ch in it:
                if ch.choices and ch.choices[0].text:
                    self.times.append(time.monotonic())
                if self.stopping.is_set():
                    it.response.close()
                    break

        self.thread = threading.Thread(target=run)
        self.thread.start()
        deadline = time.time() + 60
        while len(self.times) < 5 and time.time() < deadline:
            time.sleep(0.05)

    def stop(self):
        """Closes the stream (the client leaves) and waits for its thread."""
        self.stopping.set()
        self.thread.join(60)

    def largest_gap_after_now(self):
        """Waits for a token sent after this call, closes the stream and
        returns the longest wait between two of its tokens, in seconds."""
        now = time.monotonic()
        deadline = now + 60
        while not (self.times and self.times[-1] > now):
            if time.monotonic() > deadline or not self.thread.is_alive():
                break
            time.sleep(0.05)
        self.stop()
        t = self.times
        assert t and t[-1] > now, "the stream ended before what it was to outlast"
        return max(b - a for a, b in zip(t, t[1:]))


def sessions_written(binary, model, tmp_path, ids):
    """A session directory in which a server made sessions ids and wrote
    them out as it stopped: (the directory, the server flags that use it)."""
    d = tmp_path / "sessions"
    d.mkdir()
    args = ["--session-dir", str(d), "--window", WINDOW]
    s1 = Server(binary, model, args)
    try:
        for sid in ids:
            assert complete(s1, LONG, sid, max_tokens=4)[0] == 200
    finally:
        assert s1.stop() == 0, s1.log()  # written on the way out
    return d, args


def build_fail_open_shim(tmp_path, stalls=False):
    """The LD_PRELOAD shim, built; with stalls, checked to stall an fstatat
    in this C library (where fstatat is a call into it of that name)."""
    shim = tmp_path / "fail_open.so"
    src = os.path.join(os.path.dirname(__file__), "shims", "fail_open.c")
    try:
        built = subprocess.run(["cc", "-shared", "-fPIC", "-o", str(shim), src, "-ldl"],
                               capture_output=True).returncode == 0
    except FileNotFoundError:
        built = False
    if not built:
        pytest.skip("no C compiler for the LD_PRELOAD shim")
    if stalls:
        probe = tmp_path / "probe.snap"
        probe.touch()
        env = dict(os.environ, LD_PRELOAD=str(shim), STALL_NAME="probe.snap",
                   STALL_FLAG=str(probe), STALL_S="0.5")
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-c",
                        "import os, sys; os.stat('probe.snap', dir_fd=os.open(sys.argv[1], 0))",
                        str(tmp_path)], env=env, check=True)
        probe.unlink()
        if time.monotonic() - t0 < 0.5:
            pytest.skip("this C library's fstatat does not go through the shim")
    return shim


def test_a_snapshot_that_cannot_be_opened_is_not_taken_for_a_missing_one(binary, model,
                                                                          tmp_path, monkeypatch):
    """A snapshot that exists but cannot be opened (here every open of it
    fails with EMFILE, as when the process is out of file descriptors) is not
    a missing session: a GET answers 503 session_read_failed and a DELETE
    500 session_delete_failed, a listing of the directory 503 (the file may
    be the caller's), and the file stays; once it opens again all work."""
    shim = build_fail_open_shim(tmp_path)
    d, args = sessions_written(binary, model, tmp_path, ("stuck",))
    snap, flag = d / "stuck.snap", tmp_path / "fail-now"
    assert snap.exists()
    monkeypatch.setenv("LD_PRELOAD", str(shim))
    monkeypatch.setenv("FAIL_OPEN_NAME", "stuck.snap")
    monkeypatch.setenv("FAIL_OPEN_FLAG", str(flag))
    s = Server(binary, model, args)
    try:
        flag.touch()
        st, r = call(s, "GET", "/v1/sessions/stuck")
        assert st == 503 and r["error"]["code"] == "session_read_failed", (st, r)
        assert "Too many open files" in r["error"]["message"], r
        st, r = call(s, "DELETE", "/v1/sessions/stuck")
        assert st == 500 and r["error"]["code"] == "session_delete_failed", (st, r)
        st, r = call(s, "GET", "/v1/sessions")
        assert st == 503 and r["error"]["code"] == "session_read_failed", (st, r)
        assert "Too many open files" in r["error"]["message"], r
        assert snap.exists()
        flag.unlink()
        st, r = call(s, "GET", "/v1/sessions")
        assert st == 200 and [x["id"] for x in r["data"]] == ["stuck"], r
        st, r = call(s, "GET", "/v1/sessions/stuck")
        assert st == 200 and r["on_disk"] is True, r
        assert call(s, "DELETE", "/v1/sessions/stuck")[0] == 204
        assert not snap.exists()
    finally:
        assert s.stop() == 0, s.log()


def test_a_listing_whose_directory_read_breaks_is_an_error(binary, model, tmp_path,
                                                           monkeypatch):
    """A listing whose directory read fails part way (readdir sets EIO
    before the last entry) answers 503 session_read_failed, not 200 with
    the sessions read so far; the next listing that reads through is whole.
    A file that no server could ever read as a snapshot (here a socket
    named like one, whose open fails with ENXIO) is left out, not an error
    for every key's listing."""
    shim = build_fail_open_shim(tmp_path)
    d = tmp_path / "sessions"
    d.mkdir()
    args = ["--session-dir", str(d), "--window", WINDOW]
    flag = tmp_path / "fail-now"
    monkeypatch.setenv("LD_PRELOAD", str(shim))
    monkeypatch.setenv("FAIL_READDIR_NAME", "breaks-here")
    monkeypatch.setenv("FAIL_READDIR_FLAG", str(flag))
    s = Server(binary, model, args + ["--max-seqs", "1"])
    try:
        cwd = os.getcwd()
        stray = socket.socket(socket.AF_UNIX)
        try:
            os.chdir(d)  # a short path for bind
            stray.bind("stray.snap")
        finally:
            os.chdir(cwd)
        for sid in ("a", "b", "c"):  # a and b are pushed out of the only slot, to disk
            assert complete(s, "Hello", sid, max_tokens=2)[0] == 200
        deadline = time.time() + 30
        while not all((d / f"{sid}.snap").exists() for sid in "ab") and time.time() < deadline:
            time.sleep(0.05)
        st, r = call(s, "GET", "/v1/sessions")
        assert st == 200 and sorted(x["id"] for x in r["data"]) == ["a", "b", "c"], r
        stray.close()
        (d / "breaks-here").touch()
        flag.touch()
        st, r = call(s, "GET", "/v1/sessions")
        assert st == 503 and r["error"]["code"] == "session_read_failed", (st, r)
        assert "Input/output error" in r["error"]["message"], r
        flag.unlink()
        st, r = call(s, "GET", "/v1/sessions")
        assert st == 200 and sorted(x["id"] for x in r["data"]) == ["a", "b", "c"], r
    finally:
        assert s.stop() == 0, s.log()


def test_a_slot_whose_session_cannot_be_saved_yet_is_waited_for_off_the_engine_thread(
        binary, model, tmp_path):
    """With the IO thread held (a FIFO named like a snapshot) and both save
    places taken by sessions pushed out of their slots, a completion that
    needs a third session's slot waits for a save place in the queue; the
    engine thread does not wait for the writer, and answers what needs no
    disk (a GET of a session in memory) meanwhile."""
    d = tmp_path / "sessions"
    d.mkdir()
    s = Server(binary, model, ["--session-dir", str(d), "--window", WINDOW, "--max-seqs", "2"])
    fifo = d / "slow-file.snap"
    bg = Background(s)
    got, start = bg.got, bg.start
    try:
        os.mkfifo(fifo)
        start("held", "GET", "/v1/sessions/slow-file")
        wait_io_held(s)
        # a and b take both slots; c and d push them out: two saves wait
        for sid in ("a", "b", "c", "d"):
            assert complete(s, "Hello", sid, max_tokens=2)[0] == 200
        body = {"model": "smol", "prompt": "The sea", "max_tokens": 4, "temperature": 0}
        start("needs a slot", "POST", "/v1/completions", body)
        wait_inflight(s, 2)  # it is in the engine, waiting (a sleep did not say so)
        st, r = call(s, "GET", "/v1/sessions/d", timeout=30)
        assert st == 200 and r["in_memory"] is True, r
        assert "needs a slot" not in got, got
        release_fifo_readers(fifo, bg.threads[:1])
        bg.join()
        assert got["needs a slot"][0] == 200, got
        s.wait_metric("streamsink_snapshot_saves_inflight", lambda v: v == 0, timeout=30)
        for sid in ("a", "b", "c"):  # written: a and b at once, c for the slot
            assert (d / f"{sid}.snap").exists(), sid
    finally:
        remove_fifo(fifo)
        assert s.stop() == 0, s.log()


def test_a_delete_that_cannot_remove_the_file_says_so(binary, model, tmp_path):
    """A DELETE of a session whose snapshot cannot be unlinked (here an
    immutable file) answers 500 session_delete_failed, not the 404 of a
    session that does not exist, and the session is still there."""
    d = tmp_path / "sessions"
    d.mkdir()
    s = Server(binary, model, ["--session-dir", str(d), "--window", WINDOW])
    snap = d / "stuck.snap"
    try:
        assert complete(s, LONG, "stuck", max_tokens=4)[0] == 200
        assert call(s, "POST", "/v1/sessions/stuck/save")[0] == 200
        if subprocess.run(["chattr", "+i", str(snap)], capture_output=True).returncode != 0:
            pytest.skip("chattr +i is not available on this file system")
        st, r = call(s, "DELETE", "/v1/sessions/stuck")
        assert st == 500 and r["error"]["code"] == "session_delete_failed", (st, r)
        assert "stuck" in r["error"]["message"]
        assert snap.exists()
        st, r = call(s, "GET", "/v1/sessions/stuck")
        assert st == 200 and r["on_disk"] is True and r["in_memory"] is False, r
    finally:
        subprocess.run(["chattr", "-i", str(snap)], capture_output=True)
        assert s.stop() == 0, s.log()


def test_a_session_that_leaves_memory_while_a_listing_is_made_is_listed(binary, model,
                                                                         tmp_path):
    """A listing records the sessions in memory when it starts and the IO
    thread adds the files of the others: a session that leaves memory while
    the directory is read (its save queued behind the listing) is listed
    from memory, not lost between the two."""
    d = tmp_path / "sessions"
    d.mkdir()
    s = Server(binary, model, ["--session-dir", str(d), "--window", WINDOW, "--max-seqs", "1"])
    fifo, moved = d / "slow.snap", d / "slow.fifo"
    try:
        ids = {n: call(s, "POST", "/v1/sessions")[1]["id"] for n in ("C", "A", "B")}
        assert complete(s, "The sea", ids["C"], max_tokens=2)[0] == 200
        assert complete(s, "The sea", ids["A"], max_tokens=2)[0] == 200  # C leaves: saved
        deadline = time.monotonic() + 30
        while not (d / f"{ids['C']}.snap").exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert not (d / f"{ids['A']}.snap").exists()  # A: in memory only
        os.mkfifo(fifo)
        out = {}
        lister = threading.Thread(target=lambda: out.update(l=call(s, "GET", "/v1/sessions")))
        lister.start()
        wait_io_held(s)
        # B takes A's slot: A leaves memory, its save queued behind the listing
        assert complete(s, "The sea", ids["B"], max_tokens=2)[0] == 200
        # a restore of C, queued behind A's save: the listing's answer waits for it
        restore = threading.Thread(
            target=lambda: out.update(c=complete(s, "The sea", ids["C"], max_tokens=2)))
        restore.start()
        wait_inflight(s, 2)
        os.rename(fifo, moved)
        os.close(os.open(moved, os.O_WRONLY | os.O_NONBLOCK))
        lister.join(60)
        restore.join(60)
        st, r = out["l"]
        assert st == 200 and out["c"][0] == 200
        assert sorted(x["id"] for x in r["data"]) == sorted([ids["A"], ids["C"]])
        st, r = call(s, "GET", "/v1/sessions")
        assert sorted(x["id"] for x in r["data"]) == sorted(ids.values())
    finally:
        for f in (fifo, moved):
            try:
                os.close(os.open(f, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        assert s.stop() == 0, s.log()


def test_disk_use_is_bounded_least_recently_written_first(binary, model, tmp_path):
    d = tmp_path / "sessions"
    d.mkdir()
    s = Server(binary, model, ["--session-dir", str(d), "--window", WINDOW,
                               "--session-disk-max", str(3 * 1024 * 1024)])
    try:
        for i in range(3):  # about 1.5 MB each at window 64: two fit
            st, r = complete(s, LONG, f"disk-{i}", max_tokens=4)
            assert st == 200
            st, r = call(s, "POST", f"/v1/sessions/disk-{i}/save")
            assert st == 200, r
        assert sorted(os.listdir(d)) == ["disk-1.snap", "disk-2.snap"]
        m = s.metrics()
        assert m["streamsink_session_disk_evictions_total"] == 1
        assert m["streamsink_session_snapshot_bytes"] <= 3 * 1024 * 1024
        # all three are still in memory; each says whether its file is left
        for i in range(3):
            st, r = call(s, "GET", f"/v1/sessions/disk-{i}")
            f = d / f"disk-{i}.snap"
            assert st == 200 and r["in_memory"] is True, r
            assert r["on_disk"] is f.exists(), r
            assert r["bytes"] == (f.stat().st_size if f.exists() else 0), r
        st, r = complete(s, TURN2, "disk-0", max_tokens=2)  # what a completion says
        assert st == 200 and r["session"]["on_disk"] is False, r
        listed = {x["id"]: x for x in call(s, "GET", "/v1/sessions")[1]["data"]}
        assert [listed[f"disk-{i}"]["on_disk"] for i in range(3)] == [False, True, True]
    finally:
        assert s.stop() == 0, s.log()


# 1,566,897 bytes a snapshot at window 64: four fit, a fifth is over
TWO_KEYS_DISK_MAX = 7_000_000


def two_keys_bounded_server(binary, model, tmp_path):
    """A server of keys key-a and key-b with DIR bounded to four snapshots;
    returns it, DIR, a save of a session made for a key, and DIR's sessions."""
    d = tmp_path / "sessions"
    d.mkdir()
    s = Server(binary, model, ["--session-dir", str(d), "--window", WINDOW,
                               "--api-key", "key-a", "--api-key", "key-b",
                               "--session-disk-max", str(TWO_KEYS_DISK_MAX)])

    def save(sid, key):
        st, r = complete(s, LONG, sid, max_tokens=4, key=key)
        assert st == 200, r
        st, r = call(s, "POST", f"/v1/sessions/{sid}/save", key=key)
        assert st == 200, r

    def on_disk():
        return sorted(f[:-5] for f in os.listdir(d) if f.endswith(".snap"))

    return s, d, save, on_disk


def test_one_key_cannot_push_another_keys_snapshots_off_the_disk(binary, model, tmp_path):
    s, d, save, on_disk = two_keys_bounded_server(binary, model, tmp_path)
    limit = TWO_KEYS_DISK_MAX
    try:
        for sid, key in (("b-0", "key-b"), ("a-0", "key-a"), ("a-1", "key-a"),
                         ("a-2", "key-a")):
            save(sid, key)  # b-0 is the least recently written
        assert on_disk() == ["a-0", "a-1", "a-2", "b-0"]
        # key-a holds the most bytes: its own oldest goes, not key-b's older one
        save("a-3", "key-a")
        assert on_disk() == ["a-1", "a-2", "a-3", "b-0"]
        # key-b's save, key-a still holding more: key-a's oldest goes again
        save("b-1", "key-b")
        assert on_disk() == ["a-2", "a-3", "b-0", "b-1"]
        m = s.metrics()
        assert m["streamsink_session_disk_evictions_total"] == 2
        assert m["streamsink_session_snapshot_bytes"] <= limit
        # key-b's first session is still there
        st, r = complete(s, TURN2, "b-0", max_tokens=4, key="key-b", session_create=False)
        assert st == 200 and r["session"]["created"] is False, r
    finally:
        assert s.stop() == 0, s.log()


def test_a_count_of_the_directory_that_breaks_part_way_changes_nothing(binary, model, tmp_path,
                                                                         monkeypatch):
    """The writer recounts the directory after each save and enforces
    --session-disk-max on that count. A count whose directory read fails
    part way (readdir sets EIO at the first snapshot it meets) is not taken
    for the directory: the figures stay those of the last whole count,
    nothing is evicted on it, and the log says so once; the next whole
    count enforces the bound as usual."""
    shim = build_fail_open_shim(tmp_path)
    flag = tmp_path / "fail-now"
    monkeypatch.setenv("LD_PRELOAD", str(shim))
    monkeypatch.setenv("FAIL_READDIR_NAME", "*.snap")
    monkeypatch.setenv("FAIL_READDIR_FLAG", str(flag))
    s, d, save, on_disk = two_keys_bounded_server(binary, model, tmp_path)

    def snap_bytes():
        return sum((d / f"{x}.snap").stat().st_size for x in on_disk())

    def figures():
        m = s.metrics()
        return (m["streamsink_sessions_on_disk"], m["streamsink_session_snapshot_bytes"],
                m["streamsink_session_disk_evictions_total"])

    try:
        for sid, key in (("b-0", "key-b"), ("a-0", "key-a"), ("a-1", "key-a"),
                         ("a-2", "key-a")):
            save(sid, key)
        assert on_disk() == ["a-0", "a-1", "a-2", "b-0"]
        whole = figures()
        assert whole == (4, snap_bytes(), 0), whole
        flag.touch()
        save("a-3", "key-a")  # over the bound, but the count after it breaks
        save("a-4", "key-a")
        assert on_disk() == ["a-0", "a-1", "a-2", "a-3", "a-4", "b-0"]
        assert figures() == whole  # before: 0 snapshots, 0 bytes (what was read)
        assert s.log().count("could not be counted") == 1, s.log()
        # an engine message is a log line like any other (it was a bare
        # "streamsink: ..." with no time or level, past --log-level)
        line = next(l for l in s.lines if "could not be counted" in l)
        assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z warn  the session directory",
                        line), line
        flag.unlink()
        save("b-1", "key-b")  # a whole count: key-a's oldest go until the bound holds
        assert on_disk() == ["a-3", "a-4", "b-0", "b-1"]
        assert figures() == (4, snap_bytes(), 3)
        assert snap_bytes() <= TWO_KEYS_DISK_MAX
        assert "counted again" in s.log(), s.log()
    finally:
        assert s.stop() == 0, s.log()


def test_a_sampled_session_with_penalties_continues_after_a_restart_exactly(binary, model,
                                                                            tmp_path):
    """The sampler is the request's (its seed, its penalty window over the
    tokens it feeds), so a seeded, penalized continuation after a SIGTERM
    restart draws exactly the tokens it draws without one."""
    d = tmp_path / "sessions"
    d.mkdir()
    args = ["--session-dir", str(d), "--window", WINDOW]
    sampling = {"temperature": 0.9, "top_p": 0.95, "top_k": 40, "seed": 1234,
                "presence_penalty": 0.8, "frequency_penalty": 0.6}
    s1 = Server(binary, model, args)
    try:
        first = set()
        for sid in ("ref-sampled", "live-sampled", "other-seed"):
            st, r = complete(s1, LONG, sid, max_tokens=40, **sampling)
            assert st == 200, r
            first.add(str(continuation(r)))
        assert len(first) == 1  # three sessions in one state
        st, r = complete(s1, TURN2, "ref-sampled", max_tokens=32, **sampling)
        assert st == 200 and r["session"]["restored"] is False, r
        ref = continuation(r)
        # the seed matters: another one draws other tokens (equality below is no luck)
        st, r = complete(s1, TURN2, "other-seed", max_tokens=32, **{**sampling, "seed": 99})
        assert st == 200 and continuation(r) != ref
    finally:
        assert s1.stop() == 0, s1.log()
    s2 = Server(binary, model, args)
    try:
        st, r = complete(s2, TURN2, "live-sampled", max_tokens=32, session_create=False,
                         **sampling)
        assert st == 200 and r["session"]["restored"] is True, r
        assert continuation(r) == ref
    finally:
        assert s2.stop() == 0, s2.log()


def test_sigkill_loses_only_what_came_after_the_last_save(binary, model, tmp_path):
    """A SIGKILL loses what a session did since its last snapshot, no more: the
    next process continues from the snapshot exactly as a twin that never had
    the lost turn, says where it is (position), and a half-written temp file
    of a write the kill cut (simulated) is not a session and changes nothing."""
    d = tmp_path / "sessions"
    d.mkdir()
    args = ["--session-dir", str(d), "--window", WINDOW]
    s1 = Server(binary, model, args)
    try:
        for sid in ("killed", "twin"):
            st, r = complete(s1, LONG, sid, max_tokens=16)
            assert st == 200, r
        st, r = call(s1, "POST", "/v1/sessions/killed/save")
        assert st == 200, r
        saved_position = r["position"]
        st, r = complete(s1, " This turn is lost,", "killed", max_tokens=8)
        assert st == 200 and r["session"]["position"] > saved_position
        st, r = complete(s1, TURN2, "twin", max_tokens=24)  # the twin skips the lost turn
        assert st == 200
        ref, ref_position = continuation(r), r["session"]["position"]
    finally:
        assert s1.stop(signal.SIGKILL) == -signal.SIGKILL
    # what a write cut by the kill leaves: a temp file, never renamed
    snap = (d / "killed.snap").read_bytes()
    (d / f".tmp-killed-{s1.proc.pid}-7").write_bytes(snap[:len(snap) // 3])
    s2 = Server(binary, model, args)
    try:
        st, r = call(s2, "GET", "/v1/sessions")
        assert st == 200 and [x["id"] for x in r["data"]] == ["killed"]
        st, r = complete(s2, TURN2, "killed", max_tokens=24, session_create=False)
        assert st == 200 and r["session"]["restored"] is True, r
        assert continuation(r) == ref
        assert r["session"]["position"] == ref_position  # from the snapshot on
        assert s2.metrics()["streamsink_sessions_on_disk"] == 1
    finally:
        assert s2.stop() == 0, s2.log()


def test_temp_files_of_writes_that_died_are_deleted_once_stale(binary, model, tmp_path):
    d = tmp_path / "sessions"
    d.mkdir()
    hour_ago = time.time() - 3600

    def plant(name, old):
        p = d / name
        p.write_bytes(b"\0" * 100_000)
        if old:
            os.utime(p, (hour_ago, hour_ago))
        return p

    dead = plant(".tmp-dead-123-0", True)
    live = plant(".tmp-live-123-1", False)  # a write in progress (another replica's)
    s = Server(binary, model, ["--session-dir", str(d), "--window", WINDOW])
    try:
        assert not dead.exists() and live.exists()  # the start-up scan
        dead = plant(".tmp-dead-456-0", True)
        st, r = complete(s, LONG, "tmp", max_tokens=4)
        assert st == 200
        st, r = call(s, "POST", "/v1/sessions/tmp/save")
        assert st == 200
        assert not dead.exists() and live.exists()  # the scan after the save
        assert sorted(os.listdir(d)) == [".tmp-live-123-1", "tmp.snap"]
        assert "deleted 1 temporary snapshot file" in s.log()
    finally:
        assert s.stop() == 0, s.log()


def test_a_drain_writes_each_session_out_once_idle_not_at_its_end(binary, model, tmp_path):
    """Behind a router, a session's next turn during a replica's drain finds
    the listener closed and goes to the next replica, which reads the
    session from the shared directory. The sessions were written only when
    the drain ended, so that replica found nothing and started the session
    afresh ("created": true), and its later save overwrote the real one.
    Now the drain writes an idle session at once, and a session whose turn
    runs at the signal when the turn ends, while a stream its client does
    not read keeps the drain open."""
    d = tmp_path / "sessions"
    d.mkdir()
    s = Server(binary, model, ["--session-dir", str(d), "--threads", "1", "--drain-timeout",
                               "60", "--write-stall-timeout", "60", "--min-read-rate", "0"])
    held = None
    try:
        st, r = complete(s, LONG, "idle-at-signal", max_tokens=4)
        assert st == 200, r
        held = s.connect(rcvbuf=4096)  # a stream nobody reads: it pauses and stays
        body = json.dumps({"model": "smol", "prompt": ENDLESS, "max_tokens": 100000,
                           "stream": True, "ignore_eos": True}).encode()
        held.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                      f"application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body)
        s.wait_metric("streamsink_paused_sequences", lambda v: v == 1, timeout=60)
        turn = requests.post(f"http://127.0.0.1:{s.port}/v1/completions", stream=True, timeout=60,
                             json={"model": "smol", "prompt": LONG, "max_tokens": 32,
                                   "temperature": 0, "stream": True,
                                   "stream_options": {"include_usage": True},
                                   "session_id": "running-at-signal"})
        lines = turn.iter_lines()
        assert next(l for l in lines if l.startswith(b"data: "))  # the turn runs
        s.proc.send_signal(signal.SIGTERM)
        deadline = time.time() + 15
        while not (d / "idle-at-signal.snap").exists() and time.time() < deadline:
            time.sleep(0.05)
        assert (d / "idle-at-signal.snap").exists(), s.log()
        rest = [l for l in lines if l.startswith(b"data: ")]
        assert rest[-1] == b"data: [DONE]"  # the turn ran to its end
        generated = json.loads(rest[-2][6:])["usage"]["completion_tokens"]
        deadline = time.time() + 15
        while not (d / "running-at-signal.snap").exists() and time.time() < deadline:
            time.sleep(0.05)
        assert (d / "running-at-signal.snap").exists(), s.log()
        assert s.proc.poll() is None  # the drain still runs, held open by the paused stream
    finally:
        if held:
            held.close()
    assert s.proc.wait(60) == 0, s.log()
    s.thread.join(5)
    s = Server(binary, model, ["--session-dir", str(d)])
    try:
        st, r = complete(s, LONG, None, max_tokens=1)
        assert st == 200, r
        for sid, tokens in [("idle-at-signal", 4), ("running-at-signal", generated)]:
            st, saved = call(s, "GET", f"/v1/sessions/{sid}")
            assert st == 200, saved
            assert saved["tokens_seen"] == r["usage"]["prompt_tokens"] + tokens, (sid, saved)
    finally:
        assert s.stop() == 0, s.log()
