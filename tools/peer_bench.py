#!/usr/bin/env python3
"""peer_bench.py: streamsink vs llama.cpp on the same GGUF files, interleaved.

Driven by tools/peer_bench.sh (which builds the peer and makes the model
copies); the standard library, plus numpy for the copy rate and the gguf
package for the limits where they are installed. For every repetition, model
and thread count, each figure is measured once on each side, the order
alternating between repetitions (A B, B A, ...), so slow phases of a shared
machine hit both.

Figures (tokens/s):
  prompt    512-token prompt.  A: streamsink run --prompt-tokens 512 --chunk 512;
            B: llama-bench -p 512 -n 0.
  decode    128 generated tokens after it.  A: the same run's decode figure;
            B: llama-bench -p 0 -n 128 -d 512 (the same 512-token context).
  ctx4096   128 tokens decoded at a 4,096-token context.  A: sinks:4 window
            4,096, full and evicting (a 4,200-token prompt); B: llama-bench
            -p 0 -n 128 -d 4096.
  prompt4096  512 prompt tokens after a 4,096-token context.  A: the last
            512-token chunk of a 4,608-token prompt, sinks:4 window 4,096
            (full and sliding: every token of the chunk evicts one); B:
            llama-bench -p 512 -n 0 -d 4096.
  batch     aggregate decode of B sequences after a P-token prompt each
            (--batch-fill P, default W: a full window).  A: bench_batch (B
            greedy streams, window W, prompt P); B: llama-batched-bench
            -npp P -ntg STEPS -npl B. Measured at the largest thread count
            only.
llama.cpp's figure is the better of its two attention paths (flash attention
off and on, both run in the same call), whichever wins for that figure.
--kv-dtype q8_0 runs both sides with an 8-bit KV cache (streamsink
--kv-dtype q8_0; llama.cpp -ctk q8_0 -ctv q8_0, which needs its flash
attention path, so that one alone).
Prints one row per (figure, model, threads): both medians, the ratio A/B and
the spread min/median/max of each side.

Then, where the gguf package can read the model files, where each figure's
limit is. Per token: the bytes a forward pass reads (the weight matrices once
per step, so divided by the step's tokens: 1 for decode, B for batch B, 512
for a prompt chunk; plus each visible key's K and V rows) and its arithmetic
(2 x the matrices' values for the products, 4 x heads x head_dim per key and
layer for the attention). Times each side's median tokens/s, the bytes are
set against the one-thread memory copy rate of the same run and the
products' operations against the repacked kernels' peak (with
--bench-matmul: bench_matmul peak's VPDPBUSD rate in their instruction mix,
the best repetition's, times the threads). Keys per token: decode 576.5 (the
mean over 128 tokens after 512), ctx4096 4,100 (sinks:4 and a full window of
4,096), batch B the prompt plus half the steps, capped by the window; prompt
256.5 and prompt4096 4,100 for the FLOPs. Prompt rows show no bytes: a
chunk reads its K/V per group of tokens, not per token. The same model of a
step is applied to both sides.
"""

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time


def run(cmd, timeout=3600):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout)
    if p.returncode != 0:
        sys.stderr.write(p.stdout + p.stderr)
        raise RuntimeError(f"failed ({p.returncode}): {' '.join(cmd)}")
    return p.stdout, p.stderr


def ss_run(a, model, threads, ctx4096):
    cmd = [a.streamsink, "run", "-m", model, "-f", a.text, "--ignore-eos", "-t", str(threads),
           "--chunk", "512"]
    cmd += ["--kv-dtype", a.kv_dtype]
    if ctx4096:
        cmd += ["--prompt-tokens", "4200", "--kv-policy", "sinks:4", "--ctx", "4096", "-n", "128"]
    else:
        cmd += ["--prompt-tokens", "512", "-n", "128"]
    _, err = run(cmd)
    p = re.search(r"^prompt: .*\(([0-9.]+) tokens/s\)", err, re.M)
    d = re.search(r"^decode: .*\(([0-9.]+) tokens/s\)", err, re.M)
    if not p or not d:
        raise RuntimeError("streamsink run printed no speed lines:\n" + err)
    return float(p.group(1)), float(d.group(1))


def ss_prompt_depth(a, model, threads):
    """Tokens/s of the last 512-token chunk of a 4,608-token prompt at a full
    sliding window of 4,096 (streamsink run's "prompt's last chunk" line)."""
    cmd = [a.streamsink, "run", "-m", model, "-f", a.text, "--ignore-eos", "-t", str(threads),
           "--chunk", "512", "--kv-dtype", a.kv_dtype, "--prompt-tokens", "4608", "--kv-policy",
           "sinks:4", "--ctx", "4096", "-n", "1"]
    _, err = run(cmd)
    m = re.search(r"^prompt's last chunk: 512 tokens after 4096 .*\(([0-9.]+) tokens/s\)", err,
                  re.M)
    if not m:
        raise RuntimeError("streamsink run printed no last-chunk line:\n" + err)
    return float(m.group(1))


def llama_bench(a, model, threads, args):
    """llama.cpp's better figure of its two attention paths, measured in one
    call: flash attention off and on (its default, auto, picks on for the CPU,
    which is the faster for prompts and 3x slower at a 4,096-token depth)."""
    fa = ["0", "1"] if a.kv_dtype == "f16" else ["1"]
    out, _ = run([a.llama_bench, "-m", model, "-t", str(threads), "-r", "1", "-fa", ",".join(fa),
                  "-ctk", a.kv_dtype, "-ctv", a.kv_dtype, "-o", "jsonl"] + args)
    rows = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    if len(rows) != len(fa):
        raise RuntimeError(f"llama-bench: expected {len(fa)} result rows (-fa):\n" + out)
    return max(float(r["avg_ts"]) for r in rows)


def ss_batch(a, model, threads, batches):
    out, _ = run([a.bench_batch, "--model", model, "--threads", str(threads), "--window",
                  str(a.batch_window), "--fill", str(a.batch_fill), "--batches",
                  ",".join(map(str, batches)), "--steps", str(a.batch_steps), "--kv-dtype",
                  a.kv_dtype])
    res = {}
    for m in re.finditer(r"^batch (\d+) rep \d+ tokens/s ([0-9.]+)", out, re.M):
        res[int(m.group(1))] = float(m.group(2))
    return res


def llama_batch(a, model, threads, batches):
    """Aggregate decode tokens/s per batch size, the better of flash attention
    off and on (see llama_bench)."""
    ctx = max(batches) * (a.batch_fill + a.batch_steps) + 64
    res = {}
    for fa in ("off", "on") if a.kv_dtype == "f16" else ("on",):
        out, err = run([a.llama_batched_bench, "-m", model, "-t", str(threads), "-tb",
                        str(threads), "-c", str(ctx), "-b", "2048", "-ub", "512", "-npp",
                        str(a.batch_fill), "-ntg", str(a.batch_steps), "-npl",
                        ",".join(map(str, batches)), "-fa", fa, "-ctk", a.kv_dtype, "-ctv",
                        a.kv_dtype, "--output-format", "jsonl"])
        for line in (out + "\n" + err).splitlines():
            i = line.find("{")
            if i < 0 or '"speed_tg"' not in line:
                continue
            r = json.loads(line[i:])
            res[int(r["pl"])] = max(res.get(int(r["pl"]), 0.0), float(r["speed_tg"]))
    return res


def copy_gbps():
    """Single-thread memory copy bandwidth (bytes read + written per second) of a
    256 MiB buffer, best of 5: the ceiling for streaming weights on one core.
    None without numpy."""
    try:
        import numpy as np
    except ImportError:
        return None
    src = np.ones(32 << 20, dtype=np.float64)
    dst = np.empty_like(src)
    best = 0.0
    for _ in range(5):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = max(best, 2 * src.nbytes / (time.perf_counter() - t) / 1e9)
    return best


def model_geometry(path):
    """What a forward pass of the GGUF file at path reads and computes, per
    token: {"weights": bytes of the matrices, "macs": their values, "kv_key":
    K + V bytes of one key over all layers (f16), "attn_flops_key": the
    attention's FLOPs per key over all layers}; None without the gguf package."""
    try:
        import gguf
    except ImportError:
        return None
    r = gguf.GGUFReader(path)

    def field(key):
        f = r.fields[key]
        return f.parts[f.data[0]]

    arch = bytes(field("general.architecture")).decode()
    n_layer = int(field(f"{arch}.block_count")[0])
    n_head = int(field(f"{arch}.attention.head_count")[0])
    n_kv = int(field(f"{arch}.attention.head_count_kv")[0])
    embd = int(field(f"{arch}.embedding_length")[0])
    key = f"{arch}.attention.key_length"
    head_dim = int(field(key)[0]) if key in r.fields else embd // n_head
    names = {t.name for t in r.tensors}
    weights = macs = 0
    for t in r.tensors:
        if len(t.shape) != 2 or not t.name.endswith(".weight"):
            continue
        # the embedding is read a row per token, unless it is also the
        # output matrix (tied: no output.weight)
        if t.name == "token_embd.weight" and "output.weight" in names:
            continue
        weights += int(t.n_bytes)
        macs += int(t.n_elements)
    return {"weights": weights, "macs": macs, "kv_key": n_layer * n_kv * head_dim * 2 * 2,
            "attn_flops_key": 4 * n_head * head_dim * n_layer}


def kernel_peak(bench_matmul):
    """bench_matmul peak's VPDPBUSD rate in the repacked kernels' instruction
    mix, as int8 GOP/s for one thread (64 multiply-adds an instruction); None
    where the CPU has no AVX512-VNNI."""
    out, _ = run([bench_matmul, "peak"])
    m = re.search(r"in the kernels' mix ([0-9.]+)/ns", out)
    return float(m.group(1)) * 128 if m else None


def keys_per_token(a, fig):
    if fig == "decode":
        return 512 + 64.5
    if fig == "ctx4096":
        return 4100
    if fig.startswith("batch"):
        return min(a.batch_fill + (a.batch_steps + 1) / 2, a.batch_window + 4)
    return None


def print_limits(a, res, copies, peaks, geo):
    copy = statistics.median(copies) if copies else None
    peak = max(peaks) if peaks else None
    print("# where the limit is, per figure: bytes and FLOPs per token (weights once per step, "
          "K/V once per key) times each side's median tokens/s (A streamsink / B llama.cpp), "
          "against the one-thread copy rate (median "
          + (f"{copy:.1f} GB/s" if copy else "not measured")
          + ") and the products' int8 peak (best "
          + (f"{peak:.0f} GOP/s a thread" if peak else "not measured") + " x threads)")
    print("| figure | model | threads | MB/token, weights + K/V | GFLOP/token, products + "
          "attention | GB/s, A / B | of copy, A / B | products GOP/s, A / B | of peak, A / B |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (fig, model, t), (xa, xb) in res.items():
        g = geo.get(model)
        if not g or not xa or not xb:
            continue
        ma, mb = statistics.median(xa), statistics.median(xb)
        step = int(fig[5:]) if fig.startswith("batch") else 512 if fig.startswith("prompt") else 1
        keys = keys_per_token(a, fig)
        kv_key = g["kv_key"] * (34 / 64 if a.kv_dtype == "q8_0" else 1)
        prod = 2 * g["macs"]
        attn = g["attn_flops_key"] * (keys if keys else 256.5 if fig == "prompt" else 4100)
        row = (f"| {fig} | {os.path.basename(model).split('.')[-2]} | {t} |")
        if keys:
            w, kv = g["weights"] / step, kv_key * keys
            gba, gbb = ma * (w + kv) / 1e9, mb * (w + kv) / 1e9
            row += f" {w / 1e6:.2f} + {kv / 1e6:.2f} |"
        else:
            row += " - |"
        row += f" {prod / 1e9:.3f} + {attn / 1e9:.3f} |"
        if keys:
            row += f" {gba:.1f} / {gbb:.1f} |"
            row += f" {gba / copy:.2f} / {gbb / copy:.2f} |" if copy else " - |"
        else:
            row += " - | - |"
        pa, pb = ma * prod / 1e9, mb * prod / 1e9
        row += f" {pa:.0f} / {pb:.0f} |"
        row += f" {pa / (peak * t):.2f} / {pb / (peak * t):.2f} |" if peak else " - |"
        print(row)


def spread(xs):
    return f"{min(xs):.1f}/{statistics.median(xs):.1f}/{max(xs):.1f}"


def print_table(a, res, copies):
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    flags = line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    have = line.split(":", 1)[1].split()
                    flags += " (" + " ".join(x for x in have if x.startswith(("avx", "fma", "f16c"))) + ")"
                    break
    except OSError:
        pass
    print(f"# peer_bench {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {flags}; "
          f"{os.cpu_count()} CPUs; load average at end {os.getloadavg()[0]:.1f}; "
          f"{a.reps} repetitions interleaved; {platform.machine()}; KV cache {a.kv_dtype}; "
          f"batch: window {a.batch_window}, prompt {a.batch_fill}, {a.batch_steps} steps")
    if os.environ.get("STREAMSINK_ISA"):
        print(f"# STREAMSINK_ISA={os.environ['STREAMSINK_ISA']}: streamsink capped at that ISA "
              "(and llama.cpp built for it, PEER_ISA)")
    if copies:
        print(f"# memory copy, one thread, 256 MiB (read + write): {spread(copies)} GB/s "
              "(min/median/max, one per repetition)")
    print("| figure | model | threads | streamsink | llama.cpp | ratio | streamsink min/med/max "
          "| llama.cpp min/med/max |")
    print("|---|---|---|---|---|---|---|---|")
    for (fig, model, t), (xa, xb) in res.items():
        if not xa or not xb:
            continue
        ma, mb = statistics.median(xa), statistics.median(xb)
        name = os.path.basename(model).split(".")[-2]
        print(f"| {fig} | {name} | {t} | {ma:.1f} | {mb:.1f} | {ma / mb:.2f} | {spread(xa)} "
              f"| {spread(xb)} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streamsink", required=True)
    ap.add_argument("--bench-batch", required=True)
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("--llama-batched-bench", required=True)
    ap.add_argument("--bench-matmul", help="build/bench_matmul, for the kernels' peak")
    ap.add_argument("--text", required=True, help="prompt text file (4,200+ tokens)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--figures", default="prompt,decode,ctx4096,prompt4096,batch")
    ap.add_argument("--batches", default="1,4,8,16,32")
    ap.add_argument("--batch-window", type=int, default=1024)
    ap.add_argument("--batch-steps", type=int, default=32)
    ap.add_argument("--batch-fill", type=int, default=0,
                    help="prompt tokens per sequence (default: the window)")
    ap.add_argument("--kv-dtype", choices=("f16", "q8_0"), default="f16")
    ap.add_argument("models", nargs="+")
    a = ap.parse_args()
    threads = [int(x) for x in a.threads.split(",")]
    figures = a.figures.split(",")
    batches = [int(x) for x in a.batches.split(",")]
    if a.batch_fill <= 0:
        a.batch_fill = a.batch_window
    if a.batch_fill > a.batch_window:
        ap.error("--batch-fill must not exceed --batch-window")
    res = {}  # (figure, model, threads) -> ([A...], [B...])

    def add(fig, model, t, side, v):
        res.setdefault((fig, model, t), ([], []))[side].append(v)

    geo = {}
    for model in a.models:
        g = model_geometry(model)
        if g:
            geo[model] = g
    t_start = time.time()
    copies, peaks = [], []
    for rep in range(a.reps):
        c = copy_gbps()
        if c:
            copies.append(c)
        p = kernel_peak(a.bench_matmul) if a.bench_matmul else None
        if p:
            peaks.append(p)
        for model in a.models:
            for t in threads:
                order = (0, 1) if (rep % 2 == 0) else (1, 0)
                for side in order:
                    if side == 0:
                        if "prompt" in figures or "decode" in figures:
                            p, d = ss_run(a, model, t, False)
                            add("prompt", model, t, 0, p)
                            add("decode", model, t, 0, d)
                        if "ctx4096" in figures:
                            add("ctx4096", model, t, 0, ss_run(a, model, t, True)[1])
                        if "prompt4096" in figures:
                            add("prompt4096", model, t, 0, ss_prompt_depth(a, model, t))
                    else:
                        if "prompt" in figures:
                            add("prompt", model, t, 1,
                                llama_bench(a, model, t, ["-p", "512", "-n", "0"]))
                        if "decode" in figures:
                            add("decode", model, t, 1,
                                llama_bench(a, model, t, ["-p", "0", "-n", "128", "-d", "512"]))
                        if "ctx4096" in figures:
                            add("ctx4096", model, t, 1,
                                llama_bench(a, model, t, ["-p", "0", "-n", "128", "-d", "4096"]))
                        if "prompt4096" in figures:
                            add("prompt4096", model, t, 1,
                                llama_bench(a, model, t, ["-p", "512", "-n", "0", "-d", "4096"]))
                    print(f"rep {rep} {os.path.basename(model)} t={t} side={'AB'[side]} done "
                          f"({time.time() - t_start:.0f} s)", file=sys.stderr, flush=True)
            if "batch" in figures:
                t = max(threads)
                for side in ((0, 1) if rep % 2 == 0 else (1, 0)):
                    r = (ss_batch if side == 0 else llama_batch)(a, model, t, batches)
                    for bsz in batches:
                        if bsz in r:
                            add(f"batch{bsz}", model, t, side, r[bsz])
                print(f"rep {rep} {os.path.basename(model)} batch done "
                      f"({time.time() - t_start:.0f} s)", file=sys.stderr, flush=True)
        if rep + 1 < a.reps:
            print(f"## after repetition {rep + 1} of {a.reps}", flush=True)
            print_table(a, res, copies)

    print_table(a, res, copies)
    if geo:
        print_limits(a, res, copies, peaks, geo)


if __name__ == "__main__":
    main()
