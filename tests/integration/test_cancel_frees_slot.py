"""A client that leaves mid-request cancels its sequence and frees its KV slot
within a step; /metrics shows it. A stream is cancelled at once with
--stream-grace 0; with a grace period it runs on detached until then
(test_resume.py)."""

import json
import time

from conftest import ENDLESS

TOTAL = "streamsink_kv_slots_total"
FREE = "streamsink_kv_slots_free"
ACTIVE = "streamsink_active_sequences"


def wait_all_free(server, timeout=10):
    deadline = time.time() + timeout
    while True:
        m = server.metrics()
        if m[FREE] == m[TOTAL] and m[ACTIVE] == 0:
            return
        assert time.time() < deadline, {k: m[k] for k in (FREE, TOTAL, ACTIVE)}
        time.sleep(0.1)


def test_closing_a_stream_mid_way_frees_its_slot(start_server):
    server = start_server("--stream-grace", "0")
    wait_all_free(server)
    before = server.metrics().get("streamsink_client_disconnects_total", 0)
    c = server.client()
    stream = c.completions.create(model="smol", prompt=ENDLESS, max_tokens=None, temperature=0,
                                  stream=True)
    it = iter(stream)
    for _ in range(3):
        next(it)
    m = server.metrics()
    assert m[ACTIVE] >= 1
    assert m[FREE] < m[TOTAL]
    stream.close()  # hang up
    t0 = time.time()
    wait_all_free(server)
    assert time.time() - t0 < 10
    m = server.metrics()
    assert m["streamsink_client_disconnects_total"] >= before + 1
    assert m["streamsink_requests_inflight"] == 0


def test_hanging_up_on_a_non_streamed_request_frees_its_slot(server):
    wait_all_free(server)
    body = json.dumps({"prompt": ENDLESS, "max_tokens": None, "temperature": 0}).encode()
    s = server.connect()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " +
              str(len(body)).encode() + b"\r\n\r\n" + body)
    server.wait_metric(ACTIVE, lambda v: v >= 1, timeout=20)
    s.close()
    wait_all_free(server)


def test_server_keeps_serving_after_disconnects(server):
    r = server.client().completions.create(model="smol", prompt="Hello", max_tokens=2)
    assert r.usage.completion_tokens == 2
