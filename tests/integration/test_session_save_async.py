"""A session snapshot is written off the engine thread: while a large session
(window 2048, f32 KV: about 94 MB) is saved, another running stream keeps
emitting tokens, and the engine thread's share of the save (the KV copy) is
a small part of the whole (checksum, write, fsync, rename). A write that
fails keeps the snapshot in memory, and SIGTERM says what it could not
write."""

import os
import resource
import shutil
import signal
import threading
import time

from conftest import Server
from session_util import call, complete, continuation

LONG = ("The history of the river Thames begins long before London. In the last ice age the "
        "river flowed far to the north, through the Vale of St Albans, until a great sheet of "
        "ice pushed it south to roughly its present course. ")


def background_stream(s):
    """Starts a greedy stream on its own thread and returns once it emits:
    (the list its tokens' arrival times go into, a function that waits for
    n tokens after time t1, then ends the stream and its thread). The
    stream runs until ended (ignore_eos, no useful max_tokens): one of
    1,000 tokens had ended before a save that a test thread late by some
    seconds sent, and none came during the save."""
    times = []
    started = threading.Event()
    stop = threading.Event()

    def stream():
        c = s.client()
        with c.completions.create(model="smol", prompt="1, 2, 3, 4, 5,", max_tokens=100000,
                                  temperature=0, stream=True,
                                  extra_body={"ignore_eos": True}) as resp:
            for ch in resp:
                if ch.choices and ch.choices[0].text:
                    times.append(time.monotonic())
                    started.set()
                if stop.is_set():
                    break  # closing the connection cancels it

    t = threading.Thread(target=stream)
    t.start()
    assert started.wait(60)
    time.sleep(0.2)

    def end_after(t1, n):
        deadline = time.monotonic() + 60
        while sum(1 for x in times if x > t1) < n and t.is_alive():
            assert time.monotonic() < deadline, "the stream stopped"
            time.sleep(0.05)
        stop.set()
        t.join(60)
        assert not t.is_alive()

    return times, end_after


def test_a_stream_keeps_running_while_a_large_session_is_written(binary, model, tmp_path):
    d = tmp_path / "sessions"
    d.mkdir()
    s = Server(binary, model, ["--session-dir", str(d), "--window", "2048", "--kv-dtype", "f32",
                               "--max-prompt", "0"])
    try:
        st, r = complete(s, LONG * 48, "big", max_tokens=1)
        assert st == 200, r
        assert r["session"]["tokens_seen"] > 2048  # the whole window is stored

        times, end_after = background_stream(s)
        before = s.metrics()
        t0 = time.monotonic()
        st, info = call(s, "POST", "/v1/sessions/big/save")
        t1 = time.monotonic()
        end_after(t1, 20)
        # the counters are published after the engine turn that answered
        s.wait_metric("streamsink_session_saves_total",
                      lambda v: v >= before["streamsink_session_saves_total"] + 1)
        after = s.metrics()
        assert st == 200, info
        assert (d / "big.snap").stat().st_size > 90_000_000
        during = [x for x in times if t0 < x < t1]
        # the engine answered the save only after the writer's fsync and rename;
        # a save on the engine thread stops every stream for all of that time
        assert len(during) >= 3, (len(during), t1 - t0)
        assert len(times) > len(during) + 10  # the stream went on before and after
        saves = after["streamsink_session_saves_total"] - before["streamsink_session_saves_total"]
        assert saves == 1
        eng = (after["streamsink_session_save_engine_seconds_total"] -
               before["streamsink_session_save_engine_seconds_total"])
        total = (after["streamsink_session_save_seconds_sum"] -
                 before["streamsink_session_save_seconds_sum"])
        assert 0 < eng < total
        assert after["streamsink_snapshot_saves_inflight"] == 0
        assert after["streamsink_snapshot_saves_held"] == 0
        gaps = [b - a for a, b in zip(times, times[1:])]
        print(f"save {total * 1e3:.0f} ms (engine thread {eng * 1e3:.0f} ms), "
              f"{len(during)} tokens during it, largest gap {max(gaps) * 1e3:.0f} ms")

        # what was written is what a restart restores
        st, r = complete(s, " and then", "big", max_tokens=4)
        assert st == 200, r
    finally:
        assert s.stop() == 0, s.log()


def test_a_stream_keeps_running_while_a_large_session_is_restored(binary, model, tmp_path):
    """The restore's file is read and checked (about 94 MB, its CRC-32) by the
    session IO thread; the engine thread only copies the cells into the slot,
    so a running stream keeps emitting tokens meanwhile."""
    d = tmp_path / "sessions"
    d.mkdir()
    args = ["--session-dir", str(d), "--window", "2048", "--kv-dtype", "f32", "--max-prompt", "0"]
    s = Server(binary, model, args)
    try:
        st, r = complete(s, LONG * 48, "big", max_tokens=1)
        assert st == 200, r
    finally:
        assert s.stop() == 0, s.log()
    assert (d / "big.snap").stat().st_size > 90_000_000
    s = Server(binary, model, args)
    try:
        times, end_after = background_stream(s)
        t0 = time.monotonic()
        st, r = complete(s, " and then", "big", max_tokens=1, session_create=False)
        t1 = time.monotonic()
        end_after(t1, 3)
        assert st == 200, r
        assert r["session"]["restored"] is True
        m = s.metrics()
        assert m["streamsink_session_restores_total"] == 1
        during = [x for x in times if t0 < x < t1]
        # a restore that reads the file on the engine thread stops every stream
        # for the read and the checksum
        assert len(during) >= 3, (len(during), t1 - t0)
        eng = m["streamsink_session_restore_seconds_sum"]  # the engine thread's part
        assert 0 < eng < 0.5 * (t1 - t0), (eng, t1 - t0)
        gaps = [b - a for a, b in zip(times, times[1:])]
        print(f"restore + 1 token {(t1 - t0) * 1e3:.0f} ms (engine thread "
              f"{m['streamsink_session_restore_seconds_sum'] * 1e3:.0f} ms), {len(during)} tokens "
              f"during it, largest gap {max(gaps) * 1e3:.0f} ms")
    finally:
        assert s.stop() == 0, s.log()


TURN2 = " and in the centuries that followed"


def test_a_failed_write_keeps_the_snapshot_in_memory_and_sigterm_names_what_is_lost(
        binary, model, tmp_path):
    """RLIMIT_FSIZE makes every snapshot write fail (EFBIG, as a full disk
    fails with ENOSPC). With one slot, session b pushes session a out: a's
    KV is copied out and its slot freed, the write fails, and the copy is
    held. a then comes back from that copy exactly as if it never left
    (same tokens and logprobs as on a server where it stayed in memory).
    SIGTERM tries once more and names the sessions it could not write."""
    ref = Server(binary, model, ["--window", "64"])
    try:
        st, r = complete(ref, LONG, "a", max_tokens=8)
        assert st == 200, r
        st, r = complete(ref, TURN2, "a", max_tokens=24)
        assert st == 200, r
        want = continuation(r)
    finally:
        assert ref.stop() == 0, ref.log()

    d = tmp_path / "sessions"
    d.mkdir()
    old_lim = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_sig = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, old_lim[1]))
    try:
        s = Server(binary, model, ["--session-dir", str(d), "--window", "64", "--max-seqs", "1"])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_lim)
        signal.signal(signal.SIGXFSZ, old_sig)
    try:
        st, r = complete(s, LONG, "a", max_tokens=8)
        assert st == 200, r
        st, r = complete(s, LONG, "b", max_tokens=8)  # the only slot: a leaves memory
        assert st == 200, r
        s.wait_metric("streamsink_snapshot_saves_held", lambda v: v == 1)
        assert s.metrics()["streamsink_session_save_failures_total"] >= 1
        assert os.listdir(d) == []  # nothing written, no temp file left behind
        st, r = complete(s, TURN2, "a", max_tokens=24, session_create=False)
        assert st == 200, r
        assert r["session"]["restored"] is True  # from the held copy
        assert continuation(r) == want
    finally:
        assert s.stop() == 0, s.log()
    log = s.log()
    assert "session 'a' is lost" in log, log
    assert "session 'b' is lost" in log, log


def test_a_session_held_in_memory_after_a_failed_write_is_listed_and_described(binary, model,
                                                                               tmp_path):
    """A session that left its KV slot but whose snapshot could not be
    written exists only as the held copy: the session API must still show it
    (listed, described, deletable), and only to its key."""
    d = tmp_path / "sessions"
    d.mkdir()
    old_lim = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_sig = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, old_lim[1]))
    try:
        s = Server(binary, model, ["--session-dir", str(d), "--window", "64", "--max-seqs", "1",
                                   "--api-key", "key-a", "--api-key", "key-b"])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_lim)
        signal.signal(signal.SIGXFSZ, old_sig)
    try:
        st, r = complete(s, LONG, "held", max_tokens=8, key="key-a")
        assert st == 200, r
        seen = r["session"]["tokens_seen"]
        st, r = complete(s, LONG, "other", max_tokens=8, key="key-b")  # "held" leaves its slot
        assert st == 200, r
        s.wait_metric("streamsink_snapshot_saves_held", lambda v: v == 1)
        assert not (d / "held.snap").exists()
        st, r = call(s, "GET", "/v1/sessions", key="key-a")
        assert st == 200, r
        assert [x["id"] for x in r["data"]] == ["held"], r
        info = r["data"][0]
        assert info["in_memory"] is False and info["on_disk"] is False, info
        assert info["tokens_seen"] == seen, info
        st, r = call(s, "GET", "/v1/sessions/held", key="key-a")
        assert st == 200 and r["id"] == "held" and r["tokens_seen"] == seen, r
        st, r = call(s, "GET", "/v1/sessions/held", key="key-b")
        assert st == 404, r
        st, r = call(s, "GET", "/v1/sessions", key="key-b")
        assert [x["id"] for x in r["data"]] == ["other"], r
        st, r = call(s, "DELETE", "/v1/sessions/held", key="key-a")
        assert st == 204, r
        assert s.metrics()["streamsink_snapshot_saves_held"] == 0
        st, r = call(s, "GET", "/v1/sessions", key="key-a")
        assert r["data"] == [], r
    finally:
        assert s.stop() == 0, s.log()


def test_a_request_no_slot_can_come_free_for_is_refused_not_left_waiting(binary, model, tmp_path):
    """Every KV slot holds an idle session, and both places for snapshots
    whose write failed are taken (the session directory was removed under
    the server): no session can leave memory without being lost, and nothing
    runs that would free a slot. A request that needs a slot gets 503 at
    once, not a wait with no answer; the failed writes are counted as
    writes, not once per step that found no place."""
    d = tmp_path / "sessions"
    d.mkdir()
    s = Server(binary, model, ["--session-dir", str(d), "--max-seqs", "2"])
    try:
        shutil.rmtree(d)
        d.mkdir()  # not the directory the server holds open: every write fails
        for sid in "abcd":  # c and d push a and b out; their writes fail and are held
            assert complete(s, "hi", sid, max_tokens=2)[0] == 200
        s.wait_metric("streamsink_snapshot_saves_held", lambda v: v == 2)
        st, r = complete(s, "hi", "e", max_tokens=2)
        assert st == 503 and r["error"]["code"] == "session_save_failed", r
        st, r = call(s, "POST", "/v1/completions",
                     {"model": "smol", "prompt": "hi", "max_tokens": 2}, timeout=30)
        assert st == 503, r
        before = s.metrics()["streamsink_session_save_failures_total"]
        time.sleep(2)
        assert s.metrics()["streamsink_session_save_failures_total"] - before <= 1
        st, r = complete(s, " again", "c", max_tokens=2)  # a session in memory still runs
        assert st == 200, r
    finally:
        s.stop()
