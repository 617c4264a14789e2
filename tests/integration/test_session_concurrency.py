"""Concurrent save, restore, continuation, description and deletion of one
session cannot interleave: a session hammered from several clients at once
(explicit saves, continuations, GETs, another key's DELETEs, and other
sessions that push it out of its KV slot so that it is written and read back
over and over) continues with exactly the tokens and logprobs of a twin
session on a server that never saves anything; sessions deleted while their
saves race are gone for good; and the server keeps serving."""

import os
import threading
import time

from conftest import Server
from session_util import call, complete, continuation

LONG = ("The history of the river Thames begins long before London. In the last ice age the "
        "river flowed far to the north, through the Vale of St Albans, until a great sheet of "
        "ice pushed it south to roughly its present course. Early farmers cleared the woods of "
        "its valley, and later the Romans built a bridge near the place where the City of "
        "London now stands.")
WORDS = ["boats", "mills", "bridges", "floods", "fish", "docks", "ferries", "swans", "tides",
         "locks", "barges", "islands", "markets", "storms", "gardens", "churches"]
TURNS = [f" Then came the {w}," for w in WORDS]
# every slot counts: two slots, so the other sessions push the hammered one out
# (written, freed, read back) between its turns; one-second idle expiry too
ARGS = ["--window", "64", "--max-seqs", "2", "--max-queue", "64", "--session-idle", "1"]
KEYS = ["--api-key", "key-a", "--api-key", "key-b"]


def test_concurrent_saves_restores_and_deletes_of_one_session_cannot_interleave(
        binary, model, tmp_path):
    d = tmp_path / "sessions"
    d.mkdir()
    s = Server(binary, model, [*ARGS, *KEYS, "--session-dir", str(d)])
    errors = []  # (what, status, body) of every answer that must not happen
    done = threading.Event()
    lock = threading.Lock()
    turns = list(TURNS)
    accepted = []  # (position after the turn, turn, continuation)
    counts = {"restored": 0, "busy": 0, "saves": 0, "gets": 0, "decoys": 0}

    def bad(what, st, r):
        with lock:
            errors.append((what, st, r))
        done.set()

    def left_memory(limit_s=60):
        """Waits until the hammered session has left its slot (written out after
        its idle second, or pushed out by a decoy): whichever turn comes next
        must read it back."""
        t_end = time.monotonic() + limit_s
        while not done.is_set() and time.monotonic() < t_end:
            st, r = call(s, "GET", "/v1/sessions/hammered", key="key-a")
            if st == 200 and not r["in_memory"]:
                return True
            time.sleep(0.05)
        return done.is_set()

    def continuer():
        while not done.is_set():
            with lock:
                if not turns:
                    return
                k = len(TURNS) - len(turns)
                turn = turns.pop(0)
            # every fourth turn waits for the session to leave memory, so that
            # reads back between turns happen however the threads are scheduled
            if k % 4 == 3 and not left_memory():
                bad("the idle session never left memory", 0, None)
                return
            while not done.is_set():
                st, r = complete(s, turn, "hammered", max_tokens=6, key="key-a",
                                 session_create=False)
                if st == 409 and r["error"]["code"] == "session_busy":
                    with lock:
                        counts["busy"] += 1
                    time.sleep(0.01)
                    continue  # the turn was not taken: the session is unchanged
                if st != 200 or r["session"]["created"]:
                    bad(f"continue {turn!r}", st, r)  # the context was lost
                    return
                with lock:
                    accepted.append((r["session"]["position"], turn, continuation(r)))
                    counts["restored"] += r["session"]["restored"]
                break

    def saver():
        while not done.is_set():
            st, r = call(s, "POST", "/v1/sessions/hammered/save", key="key-a")
            if st == 200:
                if r["id"] != "hammered" or not r["on_disk"]:
                    bad("save", st, r)
                with lock:
                    counts["saves"] += 1
            elif not (st == 409 and r["error"]["code"] == "session_busy"):
                bad("save", st, r)

    def getter():
        while not done.is_set():
            st, r = call(s, "GET", "/v1/sessions/hammered", key="key-a")
            if st != 200 or r["id"] != "hammered":
                bad("get", st, r)  # wherever it is (slot, writer, disk), it exists
            st, r = call(s, "GET", "/v1/sessions", key="key-a")
            if st != 200 or [x["id"] for x in r["data"]].count("hammered") != 1:
                bad("list", st, r)  # listed exactly once
            # for another key it does not exist, and it cannot delete or save it
            for method, path in (("DELETE", "/v1/sessions/hammered"),
                                 ("POST", "/v1/sessions/hammered/save"),
                                 ("GET", "/v1/sessions/hammered")):
                st, r = call(s, method, path, key="key-b")
                if st != 404:
                    bad(f"{method} {path} with another key", st, r)
            with lock:
                counts["gets"] += 1

    def decoy():
        """Two other sessions at a time take both slots (the hammered one, idle,
        is written and freed), and each is deleted while saves of it race the
        DELETE."""
        i = 0
        while not done.is_set():
            sids = [f"decoy-{i}", f"decoy-{i + 1}"]
            made = []
            makers = [threading.Thread(target=lambda sid=sid: made.append(
                (sid, complete(s, LONG, sid, max_tokens=2, key="key-a")))) for sid in sids]
            answers = []
            racers = [threading.Thread(target=lambda m=m, p=p: answers.append(
                (m, call(s, m, p, key="key-a")))) for sid in sids for m, p in
                (("POST", f"/v1/sessions/{sid}/save"), ("DELETE", f"/v1/sessions/{sid}"),
                 ("POST", f"/v1/sessions/{sid}/save"), ("GET", f"/v1/sessions/{sid}"))]
            for group in (makers, racers):
                for t in group:
                    t.start()
                for t in group:
                    t.join()
            for sid, (st, r) in made:
                if st != 200:
                    bad(f"decoy {sid}", st, r)
            for m, (st, r) in answers:
                if st not in ((204,) if m == "DELETE" else (200, 404)):
                    bad(f"{m} racing a delete", st, r)
            for sid in sids:
                # deleted: gone from memory, from the writer and from the disk
                st, r = call(s, "GET", f"/v1/sessions/{sid}", key="key-a")
                if st != 404:
                    bad(f"GET {sid} after its delete", st, r)
                if (d / f"{sid}.snap").exists():
                    bad(f"{sid}.snap after its delete", 0, None)
            i += 2
            with lock:
                counts["decoys"] += 2

    try:
        st, r = complete(s, LONG, "hammered", max_tokens=6, key="key-a")
        assert st == 200 and r["session"]["created"] is True, r
        first = continuation(r)
        workers = [threading.Thread(target=f) for f in
                   (continuer, continuer, saver, saver, getter, decoy)]
        for t in workers:
            t.start()
        for t in workers[:2]:
            t.join(600)
        done.set()
        for t in workers:
            t.join(120)
        assert not errors, errors[:5]
        assert len(accepted) == len(TURNS)
        # the interleavings happened: the session was read back between turns
        # (the turn after a wait for it to leave memory reads it back, whoever takes it)
        assert counts["restored"] >= 1, counts
        assert counts["saves"] >= 1 and counts["decoys"] >= 1, counts
        m = s.metrics()
        assert m["streamsink_session_restores_total"] >= counts["restored"]
        assert m["streamsink_session_restore_failures_total"] == 0
        # nothing was moved aside as unreadable, no temporary file was left
        left = sorted(os.listdir(d))
        assert not [f for f in left if not f.endswith(".snap") and f != "owner.secret"], left
        # the server still serves everyone
        assert s.proc.poll() is None, s.log()
        assert s.get("/health")[0] == 200
        st, r = complete(s, LONG, "bystander", max_tokens=4, key="key-b")
        assert st == 200, r
        st, r = call(s, "GET", "/v1/sessions/hammered", key="key-a")
        assert st == 200
        final_seen = r["tokens_seen"]
    finally:
        assert s.stop() == 0, s.log()

    # the twin: the same turns, in the order the session took them, on a
    # server without a session directory, where the session never leaves its slot
    accepted.sort(key=lambda a: a[0])
    twin = Server(binary, model, [*ARGS[:2], *KEYS, "--max-seqs", "2"])
    try:
        st, r = complete(twin, LONG, "twin", max_tokens=6, key="key-a")
        assert st == 200 and continuation(r) == first
        for pos, turn, got in accepted:
            st, r = complete(twin, turn, "twin", max_tokens=6, key="key-a",
                             session_create=False)
            assert st == 200 and r["session"]["restored"] is False, r
            assert r["session"]["position"] == pos, turn
            assert continuation(r) == got, turn
        st, r = call(twin, "GET", "/v1/sessions/twin", key="key-a")
        assert r["tokens_seen"] == final_seen
    finally:
        assert twin.stop() == 0, twin.log()
