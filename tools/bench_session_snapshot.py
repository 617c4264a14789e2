#!/usr/bin/env python3
"""Session snapshot size and save/restore time (--session-dir), per window.

For each window W: starts `streamsink serve --window W --session-dir TMP`,
fills a session past its window (a prompt of about W + 256 tokens), saves it
REPS times with POST /v1/sessions/{id}/save, restarts the server and restores
it REPS times (a restart pushes the session out of memory, SIGTERM writes it,
then a 1-token request reads it back). Save times: the engine thread's share
(streamsink_session_save_engine_seconds_total: the KV copy, the time every
stream waits), the whole save (streamsink_session_save_seconds: copy, then
checksum, write + fsync + rename on the writer thread) and the client's round
trip (answered after the rename). Restore times: the engine's own (read +
check + copy in) and the client's. Medians are printed.

  tools/bench_session_snapshot.py [--windows 1024,4096] [--reps 5] [--kv-dtype f16]

Uses $STREAMSINK_MODEL (default: the cache path of scripts/fetch-model.sh) and
build/streamsink (or --bin).
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))

from conftest import Server, default_model  # noqa: E402
from session_util import call  # noqa: E402

TEXT = ("In the beginning God created the heaven and the earth. And the earth was without "
        "form, and void; and darkness was upon the face of the deep. And the Spirit of God "
        "moved upon the face of the waters. And God said, Let there be light: and there was "
        "light. ")


def metric(s, name):
    return s.metrics().get(name, 0.0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--windows", default="1024,4096")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--kv-dtype", default="f16")
    ap.add_argument("--bin", default=os.path.join(HERE, "..", "build", "streamsink"))
    a = ap.parse_args()
    model = default_model()
    print(f"model {os.path.basename(model)}, kv {a.kv_dtype}, reps {a.reps}")
    print("| window | tokens stored | snapshot bytes | save median (engine thread) | save median "
          "(total) | save median (client) | restore median (engine) | restore median (client) |")
    print("|---|---|---|---|---|---|---|---|")
    for w in [int(x) for x in a.windows.split(",")]:
        with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as d:
            args = ["--window", str(w), "--session-dir", d, "--kv-dtype", a.kv_dtype,
                    "--max-prompt", "0"]
            s = Server(a.bin, model, args)
            try:
                reps = (w + 256) // 48 + 1  # TEXT is about 48 tokens
                st, r = call(s, "POST", "/v1/completions",
                             {"prompt": TEXT * reps, "max_tokens": 1, "temperature": 0,
                              "session_id": "bench"}, timeout=1800)
                assert st == 200, r
                stored = r["session"]["tokens_seen"]
                saves, saves_e, saves_c = [], [], []
                for _ in range(a.reps):
                    n0 = metric(s, "streamsink_session_saves_total")
                    before = metric(s, "streamsink_session_save_seconds_sum")
                    before_e = metric(s, "streamsink_session_save_engine_seconds_total")
                    t0 = time.perf_counter()
                    st, r = call(s, "POST", "/v1/sessions/bench/save")
                    saves_c.append(time.perf_counter() - t0)
                    assert st == 200, r
                    # the counters are published after the engine turn that answered
                    s.wait_metric("streamsink_session_saves_total", lambda v: v >= n0 + 1)
                    saves.append(metric(s, "streamsink_session_save_seconds_sum") - before)
                    saves_e.append(metric(s, "streamsink_session_save_engine_seconds_total") -
                                   before_e)
                size = r["bytes"]
            finally:
                s.stop()
            rest, rest_c = [], []
            for _ in range(a.reps):
                s = Server(a.bin, model, args)
                try:
                    t0 = time.perf_counter()
                    st, r = call(s, "GET", "/v1/sessions/bench")  # on disk: header only
                    assert st == 200 and not r["in_memory"], r
                    t0 = time.perf_counter()
                    st, r = call(s, "POST", "/v1/completions",
                                 {"prompt": " and", "max_tokens": 1, "temperature": 0,
                                  "session_id": "bench", "session_create": False})
                    rest_c.append(time.perf_counter() - t0)
                    assert st == 200 and r["session"]["restored"], r
                    rest.append(metric(s, "streamsink_session_restore_seconds_sum"))
                finally:  # SIGTERM writes it again for the next restart
                    s.stop()
            ms = lambda xs: f"{1000 * statistics.median(xs):.1f} ms"  # noqa: E731
            print(f"| {w} | {stored} | {size} | {ms(saves_e)} | {ms(saves)} | {ms(saves_c)} | "
                  f"{ms(rest)} | "
                  f"{ms(rest_c)} |", flush=True)


if __name__ == "__main__":
    main()
