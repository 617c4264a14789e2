#!/usr/bin/env python3
"""What clients listing sessions in a loop cost one stream's decode.

    build/streamsink serve -p 18431 --session-dir DIR &
    tools/list_flood.py --url http://127.0.0.1:18431 --listers 2 [--files 5000]

With --files N the script first makes one session, saves it, and copies its
snapshot N times into DIR (--dir, needed then) under other names, so that
every listing reads N headers (the copies name another session inside, so
they are read and left out). Then, in turn: one greedy completion of
--tokens tokens alone, and the same while --listers threads GET /v1/sessions
as fast as they can; it prints both decode rates (tokens/s of the whole
request), the listings made meanwhile and the median time of a listing
alone. Standard library only.
"""
import argparse
import statistics
import threading
import time

from session_files import call, fill


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:18431")
    ap.add_argument("--listers", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--files", type=int, default=0)
    ap.add_argument("--dir")
    a = ap.parse_args()
    model = call(a.url + "/v1/models")["data"][0]["id"]
    if a.files:
        fill(a.url, model, a.dir, a.files, "flood")

    def decode():
        body = {"model": model, "prompt": "Once upon a time", "max_tokens": a.tokens,
                "temperature": 0}
        t = time.monotonic()
        r = call(a.url + "/v1/completions", "POST", body)
        return r["usage"]["completion_tokens"] / (time.monotonic() - t)

    alone = []
    for _ in range(5):
        t = time.monotonic()
        call(a.url + "/v1/sessions")
        alone.append(time.monotonic() - t)
    print(f"one listing alone: median {statistics.median(alone) * 1e3:.1f} ms")
    print(f"decode alone: {decode():.1f} tokens/s")
    stop, made = threading.Event(), [0]

    def lister():
        while not stop.is_set():
            call(a.url + "/v1/sessions")
            made[0] += 1

    threads = [threading.Thread(target=lister) for _ in range(a.listers)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    rate = decode()
    stop.set()
    for t in threads:
        t.join()
    print(f"decode with {a.listers} listers: {rate:.1f} tokens/s ({made[0]} listings)")


if __name__ == "__main__":
    main()
