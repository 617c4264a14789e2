#!/usr/bin/env python3
"""What a conversation sent whole each turn costs, with and without the
prefix a free KV slot keeps: a running server's time to the first token of
each turn of a greedy chat of --turns turns (each user turn a sentence,
each answer --max-tokens tokens), the whole history sent every turn, as an
OpenAI client without a session sends it. Each turn is sent twice in a
row: as is (the slot the previous turn left holds all of the history but
the newest messages) and with cache_prompt false (the whole history
prefilled); both give the same answer. Prints, per turn, the prompt's
tokens, those cached, and both times; then the medians over the turns
from --from on and their ratio.

    build/streamsink serve --model-alias smol --port 8080 &
    .venv/bin/python tools/bench_prefix.py --url http://127.0.0.1:8080/v1 --turns 12
"""
import argparse
import statistics
import time

from openai import OpenAI

ASKS = ["Tell me about the history of the printing press.",
        "What changed for books after it?", "Who could read at that time?",
        "How were books sold?", "What did scribes do next?",
        "Which cities printed the most?", "How fast could a press print?",
        "What were the first printed books?", "How did paper supply keep up?",
        "What happened to the price of books?", "Did censorship follow?",
        "What came after the hand press?"]


def first_token(client, model, messages, max_tokens, cache):
    """Seconds to the first content chunk, the answer, and the usage."""
    t = time.perf_counter()
    ttft, text, usage = None, [], None
    for chunk in client.chat.completions.create(
            model=model, messages=messages, max_tokens=max_tokens, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"cache_prompt": cache}):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                if ttft is None:
                    ttft = time.perf_counter() - t
                text.append(c.delta.content)
    return ttft if ttft is not None else time.perf_counter() - t, "".join(text), usage


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080/v1")
    ap.add_argument("--model", default="smol")
    ap.add_argument("--turns", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--from", dest="start", type=int, default=3,
                    help="the first turn counted in the medians (1-based)")
    a = ap.parse_args()
    client = OpenAI(base_url=a.url, api_key="none")
    messages = [{"role": "system", "content": "You are a helpful assistant."}]
    kept, whole = [], []
    print("turn  prompt  cached  ttft kept (s)  ttft whole (s)")
    for turn in range(a.turns):
        messages.append({"role": "user", "content": ASKS[turn % len(ASKS)]})
        t_kept, answer, u = first_token(client, a.model, messages, a.max_tokens, True)
        t_whole, again, w = first_token(client, a.model, messages, a.max_tokens, False)
        if answer != again:
            raise SystemExit(f"turn {turn + 1}: the answers differ")
        d = u.prompt_tokens_details
        cached = d.cached_tokens if d is not None else 0
        print(f"{turn + 1:4d}  {u.prompt_tokens:6d}  {cached:6d}  {t_kept:13.3f}  {t_whole:14.3f}")
        if turn + 1 >= a.start:
            kept.append(t_kept)
            whole.append(t_whole)
        messages.append({"role": "assistant", "content": answer})
    mk, mw = statistics.median(kept), statistics.median(whole)
    print(f"median time to first token from turn {a.start}: kept {mk:.3f} s, whole {mw:.3f} s, "
          f"{mw / mk:.2f}x")


if __name__ == "__main__":
    main()
