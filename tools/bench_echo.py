#!/usr/bin/env python3
"""What scoring a prompt through the API costs: a running server's time for
one prompt of --tokens token ids, plain (max_tokens 1), echoed alone
(echo, max_tokens 0), and echoed with log-probs (logprobs 0 and 5), the
variants interleaved, --reps rounds; prints each one's median, min and max
and its ratio to the plain prompt's median. With --beside-stream each
request runs while a greedy stream decodes, and the table adds the
stream's largest gap between tokens while the request ran (what a
prompt's prefill costs the other streams).

    build/streamsink serve --model-alias smol --port 8080 &
    .venv/bin/python tools/bench_echo.py --url http://127.0.0.1:8080 --tokens 512 --reps 9
"""
import argparse
import json
import http.client
import statistics
import threading
import time
import urllib.parse
import urllib.request

TEXT = ("Once upon a time, in a small village at the edge of a great forest, there lived an "
        "old woodcutter and his wife. They were poor, but they were kind, and every evening "
        "they shared what little bread they had with the birds that came to their window. ")


def post(url, path, body):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        out = json.loads(r.read())
    return time.perf_counter() - t, out


class Stream:
    """A greedy stream that counts its tokens' arrival times until stopped."""

    def __init__(self, url, model):
        u = urllib.parse.urlparse(url)
        self.conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
        body = {"model": model, "prompt": "Count to one thousand: 1, 2, 3, 4, 5,",
                "max_tokens": 100000, "temperature": 0, "stream": True, "ignore_eos": True}
        self.conn.request("POST", "/v1/completions", json.dumps(body),
                          {"Content-Type": "application/json"})
        self.resp = self.conn.getresponse()
        self.times = []
        self.stop = False
        self.thread = threading.Thread(target=self.read, daemon=True)
        self.thread.start()
        while len(self.times) < 8:
            time.sleep(0.01)

    def read(self):
        try:
            for line in self.resp:
                if self.stop:
                    break
                if line.startswith(b"data: {"):
                    self.times.append(time.perf_counter())
        except Exception:  # noqa: BLE001 (the connection closed under it)
            pass  # closed by close()

    def largest_gap(self, t0, t1):
        ts = [t for t in self.times if t0 <= t <= t1 + 1.0]
        return max((b - a for a, b in zip(ts, ts[1:]) if a <= t1), default=float("nan"))

    def close(self):
        self.stop = True
        self.conn.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--model", default="smol")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--beside-stream", action="store_true")
    a = ap.parse_args()
    _, tk = post(a.url, "/tokenize", {"content": TEXT * (a.tokens // 40 + 1)})
    ids = tk["tokens"][:a.tokens]
    assert len(ids) == a.tokens, len(ids)
    variants = {
        "plain, max_tokens 1": {"max_tokens": 1, "temperature": 0},
        "echo, max_tokens 0": {"max_tokens": 0, "echo": True},
        "echo + logprobs 0": {"max_tokens": 0, "echo": True, "logprobs": 0},
        "echo + logprobs 5": {"max_tokens": 0, "echo": True, "logprobs": 5},
    }
    times = {k: [] for k in variants}
    gaps = {k: [] for k in variants}
    stream = Stream(a.url, a.model) if a.beside_stream else None
    for _ in range(a.reps):
        for k, extra in variants.items():
            t0 = time.perf_counter()
            t, out = post(a.url, "/v1/completions", dict(extra, model=a.model, prompt=ids))
            assert out["usage"]["prompt_tokens"] >= a.tokens, out
            times[k].append(t)
            if stream:
                time.sleep(0.3)  # the stream's tokens after the request
                gaps[k].append(stream.largest_gap(t0, t0 + t))
    if stream:
        stream.close()
    base = statistics.median(times["plain, max_tokens 1"])
    print(f"prompt of {a.tokens} token ids, {a.reps} rounds, interleaved"
          + (", beside a greedy stream" if stream else ""))
    print("| request | median ms | min-max ms | prompt tokens/s | over plain |"
          + (" stream's largest gap, median (max) ms |" if stream else ""))
    print("|---|---|---|---|---|" + ("---|" if stream else ""))
    for k, v in times.items():
        m = statistics.median(v)
        row = (f"| {k} | {m * 1e3:.1f} | {min(v) * 1e3:.1f}-{max(v) * 1e3:.1f} | "
               f"{a.tokens / m:.0f} | {m / base:.2f}x |")
        if stream:
            row += f" {statistics.median(gaps[k]) * 1e3:.1f} ({max(gaps[k]) * 1e3:.1f}) |"
        print(row)


if __name__ == "__main__":
    main()
