#!/usr/bin/env python3
"""Matched small Llama models that differ only in the attention normalizer.

Commands that made the committed fixtures (two processes, 1 thread each, on a
shared 2-core machine under load: 270-395 s of wall time per model, roughly 2
CPU-minutes per model (~1.1 s of CPU per step), 100 steps of 16 x 256 tokens;
final loss softmax 2.24, softmax1 2.25, sink 2.25, softpick 2.36 nats/byte):

    nice /root/refvenv/bin/python tools/train_normalizers.py --steps 100 --threads 1 \
        --only softmax,softmax1 --out tests/fixtures
    nice /root/refvenv/bin/python tools/train_normalizers.py --steps 100 --threads 1 \
        --only sink,softpick --out tests/fixtures

Each model's run is seeded on its own (same init, same batches), so how the
four are split over processes changes nothing. These are exactness fixtures,
not good language models: 100 steps is far below the issue's hour-long recipe.

What it does, for each normalizer in softmax, softmax1, sink, softpick (DESIGN.md):
  1. trains a byte-level Llama (BOS + 256 byte tokens, pairwise-adjacent RoPE as
     GGUF Llama files use, RMSNorm, SwiGLU, GQA, tied embeddings) on the King James
     Bible minus Revelation (`bible Gen1:1-Rev22:21`, Debian bible-kjv), with the
     same seed, data order and schedule for every normalizer. The `sink` model
     learns one logit per head, initialized at 0 (so it starts as softmax1);
  2. exports it to tests/fixtures/norm_<name>.gguf: general.architecture llama,
     llama.attention.normalizer, blk.N.attn_sinks (sink only), F16 matrices and
     F32 norms, a gpt2 byte-level tokenizer (the 256 byte tokens, so no merge is
     needed; one merge whose result is not in the vocabulary is written because
     the engine requires the key and gguf-py drops empty arrays, and the engine
     skips it as Hugging Face does);
  3. writes reference logits, tests/fixtures/norm_<name>_logits.txt, for a
     held-out prompt (Revelation 1, never trained on) longer than the window,
     under each eviction policy the model supports (window for all, sinks:4 for
     softmax, dense), from an independent float64 forward on the exported
     (F16-rounded) weights. The cache is simulated as StreamingLLM describes it:
     per query, the visible keys are [first S tokens] + [last W tokens], and the
     positions are re-encoded inside the cache (keys at 0..n-1, query at n-1).
     The engine instead stores keys rotated at absolute positions and rotates the
     query twice; DESIGN.md shows both are exact, so they must agree.

CI never runs this script; it only reads the committed fixtures.
"""
import argparse
import math
import os
import re
import subprocess
import time

import numpy as np
import torch
import torch.nn.functional as F

NORMALIZERS = ["softmax", "softmax1", "sink", "softpick"]
BOS = 256
VOCAB = 257
SOFTPICK_EPS = 1e-6

# Fixture geometry: the prompt is 4x the window.
FIX_WINDOW = 24
FIX_PROMPT = 96
FIX_SINKS = 4


def kjv_text():
    """Returns (train, heldout): KJV without Revelation, and Revelation."""
    raw = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], check=True,
                         capture_output=True, text=True).stdout
    train, held = [], []
    for line in raw.splitlines():
        m = re.match(r"^(\S+?)(\d+):(\d+) (.*)$", line)
        if not m:
            continue
        (held if m.group(1) == "Rev" else train).append(m.group(4))
    return "\n".join(train), "\n".join(held)


# ---------------------------------------------------------------- model
def rope_cos_sin(pos, dh, base):
    """cos, sin [len(pos), dh/2] for pairwise RoPE (float64 angles, as the engine)."""
    i = torch.arange(dh // 2, dtype=torch.float64)
    theta = base ** (-2.0 * i / dh)
    a = pos.to(torch.float64)[:, None] * theta[None, :]
    return torch.cos(a), torch.sin(a)


def rope(x, cos, sin):
    """x [..., T, dh]; rotates adjacent pairs (2i, 2i+1)."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    c, s = cos.to(x.dtype), sin.to(x.dtype)
    y0 = x0 * c - x1 * s
    y1 = x0 * s + x1 * c
    return torch.stack((y0, y1), dim=-1).flatten(-2)


def normalize(z, mask, norm, sink):
    """z [B, H, Tq, Tk] scaled logits, mask bool (True = visible); returns weights.

    sink [H] (used by softmax1 as zeros and by sink as learned)."""
    neg = torch.finfo(z.dtype).min
    if norm == "softmax":
        return torch.softmax(z.masked_fill(~mask, neg), dim=-1)
    if norm in ("softmax1", "sink"):
        s = sink.to(z.dtype).view(1, -1, 1, 1).expand(z.shape[0], -1, z.shape[2], 1)
        zz = torch.cat([z.masked_fill(~mask, neg), s], dim=-1)
        return torch.softmax(zz, dim=-1)[..., :-1]
    if norm == "softpick":
        m = z.masked_fill(~mask, neg).amax(dim=-1, keepdim=True).detach()
        d = (torch.exp(z - m) - torch.exp(-m)).masked_fill(~mask, 0.0)
        return F.relu(d) / (d.abs().sum(dim=-1, keepdim=True) + SOFTPICK_EPS)
    raise ValueError(norm)


class Llama(torch.nn.Module):
    def __init__(self, a, norm):
        super().__init__()
        self.a, self.norm = a, norm
        D, H, Hkv, Dh, Fd = a.dim, a.heads, a.kv_heads, a.dim // a.heads, a.ffn
        self.emb = torch.nn.Parameter(torch.randn(VOCAB, D) * 0.02)
        self.layers = torch.nn.ModuleList()
        for _ in range(a.layers):
            ly = torch.nn.Module()
            ly.attn_norm = torch.nn.Parameter(torch.ones(D))
            ly.wq = torch.nn.Linear(D, H * Dh, bias=False)
            ly.wk = torch.nn.Linear(D, Hkv * Dh, bias=False)
            ly.wv = torch.nn.Linear(D, Hkv * Dh, bias=False)
            ly.wo = torch.nn.Linear(H * Dh, D, bias=False)
            ly.ffn_norm = torch.nn.Parameter(torch.ones(D))
            ly.w_gate = torch.nn.Linear(D, Fd, bias=False)
            ly.w_up = torch.nn.Linear(D, Fd, bias=False)
            ly.w_down = torch.nn.Linear(Fd, D, bias=False)
            torch.nn.init.normal_(ly.wo.weight, std=0.02 / math.sqrt(2 * a.layers))
            torch.nn.init.normal_(ly.w_down.weight, std=0.02 / math.sqrt(2 * a.layers))
            # sink: learned, initialized at 0; softmax1: fixed zeros
            ly.sinks = torch.nn.Parameter(torch.zeros(H), requires_grad=(norm == "sink"))
            self.layers.append(ly)
        self.out_norm = torch.nn.Parameter(torch.ones(D))

    def rms(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.a.eps) * w

    def forward(self, ids):
        a = self.a
        B, T = ids.shape
        H, Hkv, Dh = a.heads, a.kv_heads, a.dim // a.heads
        cos, sin = rope_cos_sin(torch.arange(T), Dh, a.rope_base)
        mask = torch.ones(T, T, dtype=torch.bool).tril()[None, None]
        x = self.emb[ids]
        for ly in self.layers:
            h = self.rms(x, ly.attn_norm)
            q = ly.wq(h).view(B, T, H, Dh).transpose(1, 2)
            k = ly.wk(h).view(B, T, Hkv, Dh).transpose(1, 2)
            v = ly.wv(h).view(B, T, Hkv, Dh).transpose(1, 2)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            k = k.repeat_interleave(H // Hkv, dim=1)
            v = v.repeat_interleave(H // Hkv, dim=1)
            z = q @ k.transpose(-1, -2) / math.sqrt(Dh)
            w = normalize(z, mask, self.norm, ly.sinks)
            o = (w @ v).transpose(1, 2).reshape(B, T, H * Dh)
            x = x + ly.wo(o)
            h = self.rms(x, ly.ffn_norm)
            x = x + ly.w_down(F.silu(ly.w_gate(h)) * ly.w_up(h))
        return self.rms(x, self.out_norm) @ self.emb.t()


def train(a, norm, data):
    torch.manual_seed(a.seed)
    model = Llama(a, norm)
    decay = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() == 2]
    other = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": other, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(a.seed + 1)  # same batches for every normalizer
    n = len(data) - a.ctx
    t0 = time.time()
    for step in range(a.steps):
        lr = a.lr * min(1.0, (step + 1) / 30) * 0.5 * (1 + math.cos(math.pi * step / a.steps))
        for pg in opt.param_groups:
            pg["lr"] = lr
        starts = torch.randint(0, n, (a.batch,), generator=g)
        seq = torch.stack([data[s:s + a.ctx - 1] for s in starts.tolist()])
        ids = torch.cat([torch.full((a.batch, 1), BOS), seq], dim=1)  # BOS first, always
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 40 == 0 or step == a.steps - 1:
            print(f"  {norm:9s} step {step:4d} loss {loss.item():.3f} "
                  f"({time.time() - t0:.0f}s)", flush=True)
    return model, time.time() - t0


# ---------------------------------------------------------------- export
def exported_weights(model):
    """The tensors as written to the GGUF: matrices rounded to F16, norms and sinks F32."""
    w = {"token_embd.weight": model.emb.detach().half().numpy(),
         "output_norm.weight": model.out_norm.detach().float().numpy()}
    for i, ly in enumerate(model.layers):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = ly.attn_norm.detach().float().numpy()
        w[p + "ffn_norm.weight"] = ly.ffn_norm.detach().float().numpy()
        for name, lin in (("attn_q", ly.wq), ("attn_k", ly.wk), ("attn_v", ly.wv),
                          ("attn_output", ly.wo), ("ffn_gate", ly.w_gate),
                          ("ffn_up", ly.w_up), ("ffn_down", ly.w_down)):
            w[p + name + ".weight"] = lin.weight.detach().half().numpy()  # [out, in] = ne0 in
        if model.norm == "sink":
            w[p + "attn_sinks"] = ly.sinks.detach().float().numpy()
    return w


def byte_tokens():
    """GPT-2's byte -> printable character table; token b is byte b."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    k = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + k)
            k += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


def write_gguf(path, a, norm, w):
    import gguf
    wr = gguf.GGUFWriter(path, "llama")
    wr.add_name(f"streamsink-norm-{norm}")
    wr.add_context_length(a.ctx)
    wr.add_embedding_length(a.dim)
    wr.add_block_count(a.layers)
    wr.add_feed_forward_length(a.ffn)
    wr.add_head_count(a.heads)
    wr.add_head_count_kv(a.kv_heads)
    wr.add_rope_freq_base(a.rope_base)
    wr.add_rope_dimension_count(a.dim // a.heads)
    wr.add_layer_norm_rms_eps(a.eps)
    wr.add_file_type(1)  # mostly F16
    wr.add_string("llama.attention.normalizer", norm)
    wr.add_tokenizer_model("gpt2")
    wr.add_tokenizer_pre("gpt2")
    wr.add_token_list(byte_tokens() + ["<|endoftext|>"])
    wr.add_token_types([1] * 256 + [3])
    # one merge whose result is not a token: the key must exist, the engine skips it
    wr.add_token_merges(["\u0120 \u0120"])
    wr.add_bos_token_id(BOS)
    wr.add_eos_token_id(BOS)
    wr.add_add_bos_token(True)
    for name, t in w.items():
        wr.add_tensor(name, t)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()


# ---------------------------------------------------------------- reference
def reference_logits(a, norm, w, ids, n_sinks, window):
    """Independent float64 forward on the exported weights, one query at a time,
    with the cache simulated as StreamingLLM does: the query at position p sees
    the first n_sinks tokens and the last `window` tokens (window = None: all),
    and positions are re-encoded inside that cache. Returns [T, V]."""
    T = len(ids)
    D, H, Hkv, Dh = a.dim, a.heads, a.kv_heads, a.dim // a.heads
    t = {k: torch.from_numpy(v.astype(np.float64)) for k, v in w.items()}

    def rms(x, g):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + a.eps) * g

    x = t["token_embd.weight"][torch.tensor(ids)]  # [T, D]
    for i in range(a.layers):
        p = f"blk.{i}."
        h = rms(x, t[p + "attn_norm.weight"])
        q = (h @ t[p + "attn_q.weight"].T).view(T, H, Dh)
        k = (h @ t[p + "attn_k.weight"].T).view(T, Hkv, Dh)  # un-rotated: rotated per query
        v = (h @ t[p + "attn_v.weight"].T).view(T, Hkv, Dh)
        sinks = t.get(p + "attn_sinks", torch.zeros(H, dtype=torch.float64))
        o = torch.zeros(T, H, Dh, dtype=torch.float64)
        for qp in range(T):
            if window is None:
                vis = list(range(qp + 1))
            else:
                lo = max(n_sinks, qp - window + 1)
                vis = [j for j in range(min(n_sinks, qp + 1))] + list(range(lo, qp + 1))
            n = len(vis)
            cos, sin = rope_cos_sin(torch.arange(n), Dh, a.rope_base)  # cache positions
            kk = rope(k[vis].transpose(0, 1), cos, sin)  # [Hkv, n, Dh]
            qq = rope(q[qp][:, None, :], cos[n - 1:], sin[n - 1:])  # [H, 1, Dh]
            kk = kk.repeat_interleave(H // Hkv, dim=0)
            vv = v[vis].transpose(0, 1).repeat_interleave(H // Hkv, dim=0)
            z = (qq @ kk.transpose(-1, -2))[None] / math.sqrt(Dh)  # [1, H, 1, n]
            mask = torch.ones_like(z, dtype=torch.bool)
            wt = normalize(z, mask, norm, sinks)
            o[qp] = (wt[0] @ vv)[:, 0, :]
        x = x + o.reshape(T, H * Dh) @ t[p + "attn_output.weight"].T
        h = rms(x, t[p + "ffn_norm.weight"])
        g = h @ t[p + "ffn_gate.weight"].T
        u = h @ t[p + "ffn_up.weight"].T
        x = x + (F.silu(g) * u) @ t[p + "ffn_down.weight"].T
    return rms(x, t["output_norm.weight"]) @ t["token_embd.weight"].T


def write_logits(path, norm, ids, runs):
    with open(path, "w") as f:
        f.write(f"# reference logits for norm_{norm}.gguf from tools/train_normalizers.py:\n"
                "# float64 forward on the exported weights, cache simulated with positions\n"
                "# re-encoded inside it (StreamingLLM). Format: prompt N, ids, then per policy\n"
                "# 'policy NAME window W', and 'pos P' + every vocabulary logit.\n")
        f.write(f"prompt {len(ids)}\n")
        f.write("ids " + " ".join(str(i) for i in ids) + "\n")
        for name, window, logits in runs:
            f.write(f"policy {name} window {window}\n")
            for p in range(len(ids)):
                f.write(f"pos {p} " + " ".join(f"{v:.6f}" for v in logits[p].tolist()) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/fixtures")
    ap.add_argument("--only", default=",".join(NORMALIZERS))
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=192)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--rope-base", type=float, default=10000.0)
    ap.add_argument("--eps", type=float, default=1e-5)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)

    train_text, held = kjv_text()
    data = torch.tensor(list(train_text.encode()), dtype=torch.long)
    prompt = [BOS] + list(held.encode())[:FIX_PROMPT - 1]
    print(f"train {len(data)} bytes, held-out prompt {len(prompt)} tokens")
    os.makedirs(a.out, exist_ok=True)
    for norm in a.only.split(","):
        model, secs = train(a, norm, data)
        w = exported_weights(model)
        path = os.path.join(a.out, f"norm_{norm}.gguf")
        write_gguf(path, a, norm, w)
        runs = [("window", FIX_WINDOW, reference_logits(a, norm, w, prompt, 0, FIX_WINDOW))]
        if norm == "softmax":
            runs.append((f"sinks:{FIX_SINKS}", FIX_WINDOW,
                         reference_logits(a, norm, w, prompt, FIX_SINKS, FIX_WINDOW)))
        runs.append(("dense", len(prompt), reference_logits(a, norm, w, prompt, 0, None)))
        write_logits(os.path.join(a.out, f"norm_{norm}_logits.txt"), norm, prompt, runs)
        print(f"  {norm}: trained {secs:.0f}s, wrote {path} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main()
