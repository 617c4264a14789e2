"""A session snapshot is written off the engine thread: while a large session
(window 2048, f32 KV: about 94 MB) is saved, another running stream keeps
emitting tokens, and the engine thread's share of the save (the KV copy) is
a small part of the whole (checksum, write, fsync, rename)."""

import threading
import time

from conftest import Server
from session_util import call, complete

LONG = ("The history of the river Thames begins long before London. In the last ice age the "
        "river flowed far to the north, through the Vale of St Albans, until a great sheet of "
        "ice pushed it south to roughly its present course. ")


def test_a_stream_keeps_running_while_a_large_session_is_written(binary, model, tmp_path):
    d = tmp_path / "sessions"
    d.mkdir()
    s = Server(binary, model, ["--session-dir", str(d), "--window", "2048", "--kv-dtype", "f32",
                               "--max-prompt", "0"])
    try:
        st, r = complete(s, LONG * 48, "big", max_tokens=1)
        assert st == 200, r
        assert r["session"]["tokens_seen"] > 2048  # the whole window is stored

        times = []
        started = threading.Event()

        def stream():
            c = s.client()
            for ch in c.completions.create(model="smol", prompt="1, 2, 3, 4, 5,", max_tokens=400,
                                           temperature=0, stream=True):
                if ch.choices and ch.choices[0].text:
                    times.append(time.monotonic())
                    started.set()

        t = threading.Thread(target=stream)
        t.start()
        assert started.wait(60)
        time.sleep(0.2)
        before = s.metrics()
        t0 = time.monotonic()
        st, info = call(s, "POST", "/v1/sessions/big/save")
        t1 = time.monotonic()
        t.join()
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
