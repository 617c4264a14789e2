"""SIGTERM drains: no new connections, running streams finish, exit 0. A
stream that outlives --drain-timeout is cancelled, and the exit is still 0."""

import signal
import socket
import time

import pytest

from conftest import ENDLESS


def test_sigterm_lets_a_running_stream_finish_then_exits_0(start_server):
    s = start_server("--drain-timeout", "60")
    c = s.client()
    stream = c.completions.create(model="smol", prompt="Once upon a time", max_tokens=12,
                                  temperature=0, stream=True)
    it = iter(stream)
    first = next(it)
    s.proc.send_signal(signal.SIGTERM)
    deadline = time.time() + 10
    with pytest.raises(OSError):  # the listener is closed (soon after the signal)
        while time.time() < deadline:
            socket.create_connection(("127.0.0.1", s.port), timeout=2).close()
            time.sleep(0.05)
    rest = list(it)
    chunks = [first] + rest
    assert chunks[-1].choices[0].finish_reason == "length"
    assert sum(1 for ch in chunks if ch.choices[0].text) >= 1
    assert s.proc.wait(30) == 0
    assert "drained" in s.log()


def test_drain_timeout_cancels_what_is_left_and_exits_0(start_server):
    s = start_server("--drain-timeout", "1")
    c = s.client()
    stream = c.completions.create(model="smol", prompt=ENDLESS, max_tokens=None, temperature=0,
                                  stream=True)
    it = iter(stream)
    next(it)
    t0 = time.time()
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(30) == 0
    assert time.time() - t0 < 15
    assert "drain timeout" in s.log()
