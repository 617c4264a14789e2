#!/usr/bin/env python3
"""What response_format json_object costs a stream: a running server's time
between tokens for a greedy chat answer of --tokens tokens, plain
(ignore_eos, so that it runs the whole length) and as a JSON object (a
prompt the model answers with a JSON object that does not close within the
length), interleaved, --reps rounds. Prints each mode's median gap between
streamed tokens (the median over rounds of each round's median), its
spread, and the ratio. With --streams N, N such streams run at once in
each round, and the figure is each round's median gap over all of them
(the mask runs on the backend's threads, one sequence's row per task).

    build/streamsink serve --model-alias smol --port 8080 &
    .venv/bin/python tools/bench_json.py --url http://127.0.0.1:8080/v1 --reps 7
"""
import argparse
import statistics
import threading
import time

from openai import OpenAI


def gaps(client, model, tokens, json_mode, prompt):
    kw = ({"response_format": {"type": "json_object"}} if json_mode
          else {"extra_body": {"ignore_eos": True}})
    t_last, out, n = None, [], 0
    for ch in client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}],
            max_tokens=tokens, temperature=0, stream=True, **kw):
        if not ch.choices or not ch.choices[0].delta.content:
            continue
        t = time.perf_counter()
        if t_last is not None:
            out.append(t - t_last)
        t_last, n = t, n + 1
    return statistics.median(out), n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080/v1")
    ap.add_argument("--model", default="smol")
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--streams", type=int, default=1)
    ap.add_argument("--prompt", default="Tell me a joke.",
                    help="the user message (the default's JSON answer is mostly strings; "
                         "--prompt numbers gets one mostly of structure and numbers)")
    a = ap.parse_args()
    if a.prompt == "numbers":
        a.prompt = "Write a JSON object with the key numbers holding the numbers from 1 to 100."
    client = OpenAI(base_url=a.url, api_key="none")
    res = {False: [], True: []}
    counts = {False: [], True: []}
    for _ in range(a.reps):
        for mode in (False, True):
            out = [None] * a.streams
            def one(i):
                out[i] = gaps(client, a.model, a.tokens, mode, a.prompt)
            threads = [threading.Thread(target=one, args=(i,)) for i in range(a.streams)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            res[mode].append(statistics.median(g for g, _ in out) * 1e3)
            counts[mode].append(statistics.median(n for _, n in out))
    print(f"{'mode':<12} {'median ms/token':>16} {'min':>7} {'max':>7} {'chunks':>7}")
    for mode, name in ((False, "plain"), (True, "json_object")):
        v = res[mode]
        print(f"{name:<12} {statistics.median(v):>16.2f} {min(v):>7.2f} {max(v):>7.2f} "
              f"{statistics.median(counts[mode]):>7.0f}")
    print(f"ratio json_object / plain: {statistics.median(res[True]) / statistics.median(res[False]):.2f}")


if __name__ == "__main__":
    main()
