"""The session and stream metrics move with what happens: sessions in memory
and on disk, snapshot bytes (the files' sizes), save and restore counts and
their latency histograms (cumulative buckets that end at the count), and
stream resumes."""

import json
import os

from conftest import Server
from session_util import call, complete

PROMPT = "The river Thames flows through London. Its bridges are"
BOUNDS = ["0.001", "0.005", "0.025", "0.1", "0.25", "1", "5", "30", "+Inf"]


def histogram(m, name):
    """(bucket counts in bound order, count, sum) of a histogram in /metrics."""
    buckets = [m[f'{name}_bucket{{le="{b}"}}'] for b in BOUNDS]
    return buckets, m[f"{name}_count"], m[f"{name}_sum"]


def check_histogram(m, name, n):
    buckets, count, total = histogram(m, name)
    assert count == n, (name, count)
    assert buckets == sorted(buckets), (name, buckets)  # cumulative
    assert buckets[-1] == n, (name, buckets)
    assert (total > 0) == (n > 0), (name, total)
    if n == 1:
        # one observation: the first bucket that counts it is the one its time falls in
        i = next(i for i, b in enumerate(buckets) if b > 0)
        assert i == len(BOUNDS) - 1 or total <= float(BOUNDS[i]), (name, buckets, total)
        assert i == 0 or total > float(BOUNDS[i - 1]), (name, buckets, total)


def test_session_and_stream_metrics_follow_saves_restores_and_resumes(binary, model, tmp_path):
    d = tmp_path / "sessions"
    d.mkdir()
    args = ["--session-dir", str(d), "--window", "64"]
    s = Server(binary, model, args)
    try:
        m = s.metrics()
        assert m["streamsink_sessions"] == 0 and m["streamsink_sessions_on_disk"] == 0
        check_histogram(m, "streamsink_session_save_seconds", 0)
        for sid in ("met-1", "met-2"):
            st, r = complete(s, PROMPT, sid, max_tokens=4)
            assert st == 200, r
        st, r = call(s, "POST", "/v1/sessions/met-1/save")
        assert st == 200, r
        m = s.metrics()
        assert m["streamsink_sessions"] == 2
        assert m["streamsink_sessions_on_disk"] == 1
        assert m["streamsink_session_snapshot_bytes"] == os.path.getsize(d / "met-1.snap")
        assert m["streamsink_session_saves_total"] == 1
        check_histogram(m, "streamsink_session_save_seconds", 1)
        check_histogram(m, "streamsink_session_restore_seconds", 0)

        # a streamed request, then a resume of it from its first event
        body = json.dumps({"model": "smol", "prompt": PROMPT, "max_tokens": 4, "temperature": 0,
                           "stream": True}).encode()
        status, headers, _ = s.post("/v1/completions", body)
        assert status == 200 and "x-stream-id" in headers
        assert s.metrics()["streamsink_stream_resumes_total"] == 0
        status, _, replay = s.get(f"/v1/streams/{headers['x-stream-id']}",
                                  {"Last-Event-ID": "1"})
        assert status == 200 and b"data: [DONE]" in replay
        m = s.metrics()
        assert m["streamsink_stream_resumes_total"] == 1
        assert m["streamsink_streams_detached"] == 0
    finally:
        assert s.stop() == 0, s.log()

    # SIGTERM wrote met-2 too; the next server counts both files and restores one
    s = Server(binary, model, args)
    try:
        m = s.metrics()
        assert m["streamsink_sessions"] == 0 and m["streamsink_sessions_on_disk"] == 2
        assert m["streamsink_session_snapshot_bytes"] == sum(
            os.path.getsize(d / f"met-{i}.snap") for i in (1, 2))
        st, r = complete(s, " and", "met-2", max_tokens=2, session_create=False)
        assert st == 200 and r["session"]["restored"] is True, r
        m = s.metrics()
        assert m["streamsink_sessions"] == 1
        assert m["streamsink_session_restores_total"] == 1
        check_histogram(m, "streamsink_session_restore_seconds", 1)
        st, _ = call(s, "DELETE", "/v1/sessions/met-2")
        assert st == 204
        m = s.metrics()
        assert m["streamsink_sessions"] == 0 and m["streamsink_sessions_on_disk"] == 1
    finally:
        assert s.stop() == 0, s.log()
