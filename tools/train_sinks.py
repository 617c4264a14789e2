#!/usr/bin/env python3
"""Trains only the per-head sink logits of a vanilla Llama GGUF (SmolLM2-135M:
30 layers x 9 heads = 270 scalars), everything else frozen, under window-only
attention, so that a null key learns to do the evicted first token's job.

Command that made tools/data/sinks_trained.txt (2 shared CPU cores):

    nice /root/refvenv/bin/python tools/train_sinks.py \
        --model ~/.cache/streamsink/SmolLM2-135M-Instruct.Q4_1.gguf \
        --steps 30 --seq 320 --window 128 --threads 1 --out tools/data/sinks_trained.txt

Then tools/retrofit_sinks.py builds the GGUF from the downloaded model and that file.
`--write-texts DIR` only writes the texts of the retrofit table: kjv_revelation.txt
(held out; perplexity and probe) and kjv_matthew200.txt (`streamsink calibrate`).

The forward is written here from the GGUF (weights dequantized with the gguf
package, float32): RMSNorm, pairwise-adjacent RoPE (the converter already
permuted Q and K), GQA, SwiGLU, tied output. Attention is window-only: query t
sees keys t-W+1..t at their absolute positions (the engine's `window` policy;
a contiguous window keeps true distances), normalized with the `sink`
normalizer e^{z_i} / (e^{s_h} + Σ_j e^{z_j}). The loss is next-token
cross-entropy on positions t >= W only, where the first token is out of reach,
because those are the queries whose sink must now be the null key.
Data: the King James Bible minus Revelation (`bible`, Debian bible-kjv);
Revelation is the held-out text of the perplexity table. Sinks start at 0
(softmax1), so the result is independent of `streamsink calibrate`.
"""
import argparse
import math
import os
import re
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tokenizer_fixture import build_tokenizer  # noqa: E402


def kjv_books():
    """{book abbreviation: [verse text]} from `bible` (Debian bible-kjv)."""
    raw = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], check=True,
                         capture_output=True, text=True).stdout
    books = {}
    for line in raw.splitlines():
        m = re.match(r"^(\S+?)(\d+):(\d+) (.*)$", line)
        if m:
            books.setdefault(m.group(1), []).append(m.group(4))
    return books


def kjv_train_text():
    return "\n".join("\n".join(v) for b, v in kjv_books().items() if b != "Rev")


def write_texts(d):
    """The evaluation texts of the retrofit table: Revelation (held out of
    training) for perplexity and probe, the first 200 verses of Matthew for
    `streamsink calibrate`."""
    books = kjv_books()
    os.makedirs(d, exist_ok=True)
    for name, verses in (("kjv_revelation.txt", books["Rev"]),
                         ("kjv_matthew200.txt", books["Mat"][:200])):
        with open(os.path.join(d, name), "w") as f:
            f.write("\n".join(verses) + "\n")
        print(f"wrote {os.path.join(d, name)}")


def load_weights(path):
    import gguf
    r = gguf.GGUFReader(path)
    kv = {}
    for k, f in r.fields.items():
        if f.types and f.types[0] != gguf.GGUFValueType.ARRAY:
            v = f.parts[f.data[0]]
            kv[k] = bytes(v).decode() if f.types[0] == gguf.GGUFValueType.STRING else v[0]
    w = {}
    for t in r.tensors:
        a = gguf.quants.dequantize(t.data, t.tensor_type)
        w[t.name] = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).reshape(
            [int(x) for x in reversed(t.shape)])
    return kv, w


def rope_tables(T, dh, base):
    i = torch.arange(dh // 2, dtype=torch.float64)
    a = torch.arange(T, dtype=torch.float64)[:, None] * base ** (-2.0 * i / dh)[None, :]
    return torch.cos(a).float(), torch.sin(a).float()


def rope(x, c, s):
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)


def forward_loss(kv, w, sinks, ids, window, n_skip):
    arch = kv["general.architecture"]
    L = int(kv[f"{arch}.block_count"])
    H = int(kv[f"{arch}.attention.head_count"])
    Hkv = int(kv[f"{arch}.attention.head_count_kv"])
    eps = float(kv[f"{arch}.attention.layer_norm_rms_epsilon"])
    base = float(kv.get(f"{arch}.rope.freq_base", 10000.0))
    T = ids.shape[0]
    emb = w["token_embd.weight"]
    D = emb.shape[1]
    Dh = D // H
    c, s = rope_tables(T, Dh, base)
    t = torch.arange(T)
    mask = (t[None, :] <= t[:, None]) & (t[None, :] > t[:, None] - window)  # [T, T]

    def rms(x, g):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g

    x = emb[ids]
    for l in range(L):
        p = f"blk.{l}."
        h = rms(x, w[p + "attn_norm.weight"])
        q = (h @ w[p + "attn_q.weight"].T).view(T, H, Dh).transpose(0, 1)
        k = (h @ w[p + "attn_k.weight"].T).view(T, Hkv, Dh).transpose(0, 1)
        v = (h @ w[p + "attn_v.weight"].T).view(T, Hkv, Dh).transpose(0, 1)
        q, k = rope(q, c, s), rope(k, c, s)
        k = k.repeat_interleave(H // Hkv, dim=0)
        v = v.repeat_interleave(H // Hkv, dim=0)
        z = (q @ k.transpose(-1, -2)) / math.sqrt(Dh)
        z = z.masked_fill(~mask, float("-inf"))
        zz = torch.cat([z, sinks[l].view(H, 1, 1).expand(H, T, 1)], dim=-1)
        a = torch.softmax(zz, dim=-1)[..., :-1]
        o = (a @ v).transpose(0, 1).reshape(T, D)
        x = x + o @ w[p + "attn_output.weight"].T
        h = rms(x, w[p + "ffn_norm.weight"])
        x = x + (F.silu(h @ w[p + "ffn_gate.weight"].T) * (h @ w[p + "ffn_up.weight"].T)) \
            @ w[p + "ffn_down.weight"].T
    out = w.get("output.weight", emb)
    xs = rms(x[n_skip:-1], w["output_norm.weight"])
    return F.cross_entropy(xs @ out.T, ids[n_skip + 1:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model")
    ap.add_argument("--out")
    ap.add_argument("--write-texts", metavar="DIR",
                    help="only write the evaluation and calibration texts into DIR")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seq", type=int, default=320)
    ap.add_argument("--window", type=int, default=128)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    if a.write_texts:
        return write_texts(a.write_texts)
    if not a.model or not a.out:
        ap.error("--model and --out are required")
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)

    kv, w = load_weights(a.model)
    arch = kv["general.architecture"]
    L = int(kv[f"{arch}.block_count"])
    H = int(kv[f"{arch}.attention.head_count"])
    tok, _ = build_tokenizer(a.model)
    ids = torch.tensor(tok.encode(kjv_train_text()).ids, dtype=torch.long)
    print(f"{L} x {H} sink logits; {len(ids)} training tokens; window {a.window}, "
          f"sequences of {a.seq}, loss on positions >= {a.window}", flush=True)

    sinks = torch.zeros(L, H, requires_grad=True)  # softmax1 to start
    opt = torch.optim.Adam([sinks], lr=a.lr)
    g = torch.Generator().manual_seed(a.seed)
    t0 = time.time()
    for step in range(a.steps):
        for pg in opt.param_groups:
            pg["lr"] = a.lr * 0.5 * (1 + math.cos(math.pi * step / a.steps))
        st = int(torch.randint(0, len(ids) - a.seq, (1,), generator=g))
        loss = forward_loss(kv, w, sinks, ids[st:st + a.seq], a.window, a.window)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {step:3d} loss {loss.item():.4f} mean sink {sinks.mean().item():+.3f} "
              f"({time.time() - t0:.0f}s)", flush=True)
    with open(a.out, "w") as f:
        f.write(f"# sink logits from tools/train_sinks.py: {L} layers x {H} heads, one line "
                f"per layer\n# {a.steps} steps of {a.seq} tokens, window {a.window}, Adam lr "
                f"{a.lr} cosine, init 0, KJV without Revelation; {time.time() - t0:.0f}s\n")
        for row in sinks.detach().tolist():
            f.write(" ".join(f"{v:.6f}" for v in row) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
