#!/usr/bin/env python3
"""The retrofit gap table: window-only perplexity of learned-sink retrofits of
SmolLM2 against the vanilla model with `sinks:4`, on held-out texts, at several
windows, all measured with `streamsink perplexity` (f16 KV, one thread per run).

    tools/retrofit_eval.py --build build --out out/retrofit \\
        --model trained=out/smollm2-sink-trained.gguf [--model NAME=GGUF ...] \\
        [--windows 128,256,1024] [--late-tokens 1000] [--jobs 2]

Writes the texts (tools/train_sinks.py --write-texts) into OUT/texts, one JSON
per run (skipped when it exists, so an interrupted run resumes), and prints a
Markdown table: perplexity over all scored tokens and over tokens t >= W (the
ones that come after the first eviction), and the ratio of the latter to the
vanilla model's `sinks:4` on the same tokens; then the same for the tokens
t < W (the real first token still in the window, where the vanilla model's
`sinks:4` and window runs are the same model on the same keys). Stdlib only; the texts need the
reference venv (train_sinks.py imports torch), so pass --texts DIR to reuse
texts written before.
"""
import argparse
import json
import math
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

TEXTS = ["coreutils_manual.txt", "debian_history.txt", "kjv_revelation.txt"]


def ppl(v):
    return math.exp(sum(v) / len(v)) if v else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default="out/retrofit")
    ap.add_argument("--vanilla", default=os.path.expanduser(
        "~/.cache/streamsink/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--model", action="append", default=[], metavar="NAME=GGUF")
    ap.add_argument("--texts", help="folder with the texts (default: write them into OUT/texts)")
    ap.add_argument("--text-names", default=",".join(TEXTS[:2]))
    ap.add_argument("--windows", default="128,256,1024")
    ap.add_argument("--late-tokens", type=int, default=1000,
                    help="tokens scored after the first W (each run scores W + this many)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--no-vanilla-window", action="store_true",
                    help="skip the vanilla model's window-only runs")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    texts = a.texts or os.path.join(a.out, "texts")
    if not a.texts:
        subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "train_sinks.py"),
                        "--write-texts", texts], check=True)
    models = [("vanilla", a.vanilla)] + [tuple(m.split("=", 1)) for m in a.model]
    windows = [int(x) for x in a.windows.split(",")]
    names = a.text_names.split(",")
    runs = []
    for t in names:
        for W in windows:
            runs.append(("vanilla", a.vanilla, t, W, "sinks:4"))
            if not a.no_vanilla_window:
                runs.append(("vanilla", a.vanilla, t, W, "window"))
            for name, path in models[1:]:
                runs.append((name, path, t, W, "window"))

    def job(r):
        name, path, t, W, pol = r
        js = os.path.join(a.out, f"{name}-{t[:-4]}-{W}-{pol.replace(':', '')}.json")
        if not os.path.exists(js):
            cmd = [os.path.join(a.build, "streamsink"), "perplexity", "-m", path, "--text",
                   os.path.join(texts, t), "--policy", pol, "--window", str(W), "-t", "1",
                   "--no-progress", "--max-tokens", str(W + a.late_tokens), "--json", js + ".part"]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            os.replace(js + ".part", js)
        with open(js) as f:
            return r, json.load(f)

    with ThreadPoolExecutor(a.jobs) as ex:
        res = {r: d for r, d in ex.map(job, runs)}
    print("| text | W | model | policy | ppl, all tokens | ppl, tokens >= W | vs vanilla sinks:4 "
          "| ppl, tokens < W | vs vanilla, t < W |")
    print("|---|---|---|---|---|---|---|---|---|")
    for t in names:
        for W in windows:
            base = res[("vanilla", a.vanilla, t, W, "sinks:4")]
            b, b_early = ppl(base["nll"][W:]), ppl(base["nll"][:W])
            for r in runs:
                if r[2] != t or r[3] != W:
                    continue
                d = res[r]
                late, early = ppl(d["nll"][W:]), ppl(d["nll"][:W])
                print(f"| {t[:-4]} | {W} | {r[0]} | {r[4]} | {d['perplexity']:.3f} | "
                      f"{late:.3f} ({len(d['nll']) - W} tok) | {late / b:.3f}x | "
                      f"{early:.3f} | {early / b_early:.3f}x |")


if __name__ == "__main__":
    main()
