#!/usr/bin/env python3
"""What n choices cost against n requests of one: a running server's wall
time for one completion of --n choices, and for --n requests of one choice
sent at once (what a client without n would do), the same prompt of about
--prompt-tokens tokens, --max-tokens sampled tokens each (ignore_eos, so
every answer runs the whole length), interleaved, --reps rounds. The first
choice prefills the prompt for the others, where n requests of one each
prefill it (all sent with cache_prompt false, so that neither starts from
a prefix a free slot kept). Prints each mode's median seconds, its spread,
and the ratio.

    build/streamsink serve --model-alias smol --port 8080 &
    .venv/bin/python tools/bench_choices.py --url http://127.0.0.1:8080/v1 --n 4 --reps 5
"""
import argparse
import statistics
import threading
import time

from openai import OpenAI

WORDS = ("the river ran past the old mill and under the stone bridge where the children "
         "of the village played in summer ").split()


def prompt_of(client, model, tokens):
    text = " ".join(WORDS[i % len(WORDS)] for i in range(tokens))
    r = client.completions.create(model=model, prompt=text, max_tokens=1, temperature=0)
    return text, r.usage.prompt_tokens


def one_request(client, model, prompt, n, max_tokens, seed):
    t = time.perf_counter()
    r = client.completions.create(model=model, prompt=prompt, n=n, max_tokens=max_tokens,
                                  temperature=1.0, seed=seed,
                                  extra_body={"ignore_eos": True, "cache_prompt": False})
    assert len(r.choices) == n
    return time.perf_counter() - t


def n_requests(client, model, prompt, n, max_tokens, seed):
    errors = []

    def run(i):
        try:
            one_request(client, model, prompt, 1, max_tokens, seed + i)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    t = time.perf_counter()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080/v1")
    ap.add_argument("--model", default="smol")
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=1000)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    client = OpenAI(base_url=a.url, api_key="sk-none", max_retries=0, timeout=600)
    prompt, n_prompt = prompt_of(client, a.model, a.prompt_tokens)
    times = {"n choices": [], "n requests": []}
    for rep in range(a.reps):
        times["n choices"].append(one_request(client, a.model, prompt, a.n, a.max_tokens, rep))
        times["n requests"].append(n_requests(client, a.model, prompt, a.n, a.max_tokens, rep))
    print(f"prompt {n_prompt} tokens, n = {a.n}, {a.max_tokens} tokens each, {a.reps} rounds")
    med = {}
    for mode, ts in times.items():
        med[mode] = statistics.median(ts)
        print(f"{mode:>10}: median {med[mode]:.3f} s (min {min(ts):.3f}, max {max(ts):.3f})")
    print(f"n requests / n choices: {med['n requests'] / med['n choices']:.2f}x")


if __name__ == "__main__":
    main()
