#!/usr/bin/env python3
"""What a client deleting sessions in a loop costs one stream's decode.

    build/streamsink serve -p 18431 --session-dir DIR &
    tools/delete_stall.py --url http://127.0.0.1:18431 --dir DIR --files 20000

A DELETE reads the snapshot's header, unlinks it, syncs the directory and
recounts it (every file's size, for the disk metrics and
--session-disk-max). With --files N the script first copies one saved
snapshot N times into DIR under other names, so that every recount sees N
files. Then, in turn: one streamed greedy completion of --tokens tokens
alone, and the same while a client creates a session, saves it and deletes
it as fast as it can. It prints for both the decode rate, the median and
largest gap between two tokens, and for the second the DELETEs made and
their median time. Standard library only.
"""
import argparse
import json
import statistics
import threading
import time
import urllib.request

from session_files import call, fill


def stream(url, model, tokens):
    """Arrival times of the streamed completion's text events."""
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": tokens,
            "temperature": 0, "stream": True}
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"}, method="POST")
    times = []
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            if line.startswith(b"data: {"):
                times.append(time.monotonic())
    return times


def report(name, times, extra=""):
    gaps = [b - a for a, b in zip(times, times[1:])]
    rate = (len(times) - 1) / (times[-1] - times[0])
    print(f"{name}: {rate:.1f} tokens/s, gap median {1e3 * statistics.median(gaps):.2f} ms, "
          f"max {1e3 * max(gaps):.2f} ms{extra}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:18431")
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--files", type=int, default=0)
    ap.add_argument("--dir")
    a = ap.parse_args()
    model = call(a.url + "/v1/models")["data"][0]["id"]
    if a.files:
        sid = fill(a.url, model, a.dir, a.files, "filler")
        call(a.url + f"/v1/sessions/{sid}", "DELETE")

    report("alone", stream(a.url, model, a.tokens))

    stop = threading.Event()
    deletes = []

    def deleter():
        while not stop.is_set():
            sid = call(a.url + "/v1/sessions", "POST")["id"]
            call(a.url + "/v1/completions", "POST",
                 {"model": model, "prompt": "Hi", "max_tokens": 1, "session_id": sid})
            call(a.url + f"/v1/sessions/{sid}/save", "POST")
            t = time.monotonic()
            call(a.url + f"/v1/sessions/{sid}", "DELETE")
            deletes.append(time.monotonic() - t)

    th = threading.Thread(target=deleter)
    th.start()
    try:
        times = stream(a.url, model, a.tokens)
    finally:
        stop.set()
        th.join()
    report("with a deleter", times,
           f"; {len(deletes)} DELETEs, median {1e3 * statistics.median(deletes):.1f} ms"
           if deletes else "; no DELETE finished")


if __name__ == "__main__":
    main()
