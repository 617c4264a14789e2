#!/usr/bin/env python3
"""Trains only the per-head sink logits of a vanilla Llama GGUF (SmolLM2-135M:
30 layers x 9 heads = 270 scalars), and optionally sink values and keys,
everything else frozen, under window-only attention, so that a null key learns
to do the evicted first token's job.

Commands that made the committed files (2 shared CPU cores, one thread each;
the machine was heavily loaded, so the times in their headers are wall times
at a small share of one core):

    M=~/.cache/streamsink/SmolLM2-135M-Instruct.Q4_1.gguf
    # tools/data/sinks_trained.txt: 30 steps of a 90-step schedule, from sinks_trained30.txt
    nice /root/refvenv/bin/python tools/train_sinks.py --model $M --steps 90 --stop-after 30 \
        --windows 64,128,256 --loss-tokens 160 --lr 0.05 \
        --init tools/data/sinks_trained30.txt --threads 1 --out tools/data/sinks_trained.txt
    # tools/data/sinks_fit.txt: the layer-wise fit (fit_sinks), no training
    nice /root/refvenv/bin/python tools/train_sinks.py --model $M --fit \
        --windows 128,256,1024 --fit-tokens 384 --threads 1 --out tools/data/sinks_fit.txt

    # tools/data/sinks_trained_v.txt + tools/data/sinks_values.f32: logits and one value
    # vector per query head (blk.N.attn_sinks_v), trained together from sinks_trained.txt
    nice /root/refvenv/bin/python tools/train_sinks.py --model $M --steps 120 \
        --windows 64,128,256 --loss-tokens 160 --lr 0.02 --lr-values 0.05 \
        --init tools/data/sinks_trained.txt --sink-values tools/data/sinks_values.f32 \
        --keep-every 30 --threads 1 --out tools/data/sinks_trained_v.txt

    # tools/data/sinks_trained_v2.txt + tools/data/sinks_values_v2.f32: from the two files
    # above, windows 64-1,024, the first W tokens scored too, four more sources
    nice /root/refvenv/bin/python tools/train_sinks.py --model $M --steps 120 --stop-after 100 \
        --windows 64,128,256,64,128,256,1024 --loss-tokens 160 --lr 0.01 --lr-values 0.03 \
        --early-weight 0.5 \
        --sources kjv-without-revelation,gnu-manuals,more-manuals,licenses,man7,doc-texts \
        --init tools/data/sinks_trained_v.txt --init-values tools/data/sinks_values.f32 \
        --sink-values tools/data/sinks_values_v2.f32 --keep-every 20 --threads 1 \
        --out tools/data/sinks_trained_v2.txt

    # tools/data/sinks_trained_v3.txt + sinks_values_v3.f32 + sinks_keys_v3.f32: from the
    # v2 files, one sink key per KV head trained from 0 with them, the best of a fixed
    # validation slice per window, at most 2,700 s of training
    nice -n 10 /root/refvenv/bin/python tools/train_sinks.py --model $M --steps 180 \
        --windows 64,128,256,128,256,1024 --loss-tokens 160 --lr 0.005 --lr-values 0.01 \
        --lr-keys 0.02 --early-weight 0.5 \
        --sources kjv-without-revelation,gnu-manuals,more-manuals,licenses,man7,doc-texts \
        --init tools/data/sinks_trained_v2.txt --init-values tools/data/sinks_values_v2.f32 \
        --sink-values tools/data/sinks_values_v3.f32 --sink-keys tools/data/sinks_keys_v3.f32 \
        --val-every 6 --val-tokens 320 --max-seconds 2700 --keep-every 30 --threads 1 \
        --out tools/data/sinks_trained_v3.txt

tools/data/sinks_trained30.txt came from the first version of this script:
30 steps of 320-token slices of the KJV without Revelation, window 128, lr 0.1,
init 0 (its header says so).

Then tools/retrofit_sinks.py builds the GGUF from the downloaded model and those files.
`--write-texts DIR` only writes the evaluation texts (tools/retrofit_eval.py uses them):
kjv_revelation.txt, coreutils_manual.txt and debian_history.txt (held out of training)
and kjv_matthew200.txt (`streamsink calibrate`). `--eval FILE` only prints the
window-only perplexity of this script's forward on a text, for quick comparisons;
the figures in docs/results.md come from `streamsink perplexity`.

The forward is written here from the GGUF (weights dequantized with the gguf
package, float32): RMSNorm, pairwise-adjacent RoPE (the converter already
permuted Q and K), GQA, SwiGLU, tied output. Attention is the engine's `window`
policy (kvcache/kvcache.h): query t sees keys max(0, t-W+1)..t, each at its
absolute position, which inside a contiguous window gives true distances, so
RoPE, being relative, sees what the server's cache gives it. Normalizer: `sink`,
e^{z_i} / (e^{s_h} + sum_j e^{z_j}). The loss is next-token cross-entropy on
positions t >= W only, where the first token is out of reach, because those are
the queries whose sink must now be the null key. K (after RoPE) and V are
rounded to f16, as the engine's default KV cache stores them (--kv-f32: not).

--early-weight X also scores the tokens t < W, where the real first token is
still in the window, so that the sink does not hurt the model before the first
eviction: the loss is (mean NLL t >= W + X mean NLL t < W) / (1 + X).

Each step takes one window from --windows (in turn; a window may be listed more
than once to take it more often) and one text source (in turn, after each pass
over --windows), and a random slice of W + --loss-tokens tokens of it (seeded
generator), so one run covers several windows and several kinds of text. The
sources (--sources, source_text) are texts that the Debian packages installed
here have, none of them an evaluation text nor from an evaluation text's
package: the King James Bible without Revelation (`kjv-without-revelation`,
Debian bible-kjv), the GNU manuals of sed, grep, gzip, diffutils and findutils
(`gnu-manuals`, /usr/share/info), the GPL-3 (`gpl-3`,
/usr/share/common-licenses); and, for the v2 files, the manuals of bc, bzip2,
ed, gettext, time and wget (`more-manuals`), the other licenses of
/usr/share/common-licenses (`licenses`: Apache-2.0, Artistic, GPL-2,
LGPL-2.1, MPL-2.0, GFDL-1.3), the 172 section-7 pages of the Linux man-pages
project rendered by `man` at 80 columns (`man7`, package manpages) and
plain-text documentation from /usr/share/doc (`doc-texts`: the sed FAQ, the
libpng and libjpeg manuals, the X11 protocol, dpkg's trigger spec). Held out:
Revelation, the coreutils manual, the Debian project history (packages
coreutils and debian-history contribute nothing). Given its seed the run is
deterministic (one thread, deterministic kernels).

--sink-values FILE also trains one value vector per query head, v_h (Dh floats),
so that the output is (e^{s_h} v_h + sum_i e^{z_i} v_i) / (e^{s_h} + sum_i e^{z_i}):
the tensors blk.N.attn_sinks_v of docs/gguf-normalizer.md. FILE is raw little-endian
float32, layer by layer, head by head (tools/retrofit_sinks.py --values reads it).
--sink-keys FILE also trains one sink key per KV head, k_g (Dh floats), so that the
sink logit of query head h at position p is s_h + q_{p,h} . k_g / sqrt(Dh) with q
before RoPE (the sink at distance 0 from every query): the tensors blk.N.attn_sinks_k
of docs/gguf-normalizer.md. FILE is raw little-endian float32, layer by layer, KV head
by KV head (tools/retrofit_sinks.py --keys reads it). Keys start at 0 (--init-keys to
start elsewhere), where the model is exactly the one without them.

--val-every N scores a fixed validation slice per distinct window (W + --val-tokens
tokens from the last tenth of a training source, window i from source i in turn;
training then draws its slices from the first nine tenths only) before training and
every N steps, with the training loss (the same --early-weight), averaged over the
windows, and writes the files only when that is the best so far: the files hold the
best checkpoint, and their header says at which step. --max-seconds stops the run
before a step that would start after that many seconds.

Every step is one forward and one backward of the frozen model in float32 on one
thread: 6-12 s for W = 64-256 with 160 scored tokens on an idle core of the build
machine, about twice that when it is loaded; 70-141 s for W = 1,024 (1,184 tokens).
"""
import argparse
import gzip
import math
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tokenizer_fixture import build_tokenizer  # noqa: E402

INFO = "/usr/share/info"
TRAIN_INFO = ["sed.info.gz", "grep.info.gz", "gzip.info.gz", "diffutils.info.gz",
              "find.info.gz", "find.info-1.gz", "find.info-2.gz"]
LICENSE = "/usr/share/common-licenses/GPL-3"
COREUTILS = os.path.join(INFO, "coreutils.info.gz")
HISTORY = "/usr/share/doc/debian-history/docs/project-history.en.txt.gz"
EVAL_CHARS = 16000
SOURCES_V1 = ["kjv-without-revelation", "gnu-manuals", "gpl-3"]
MORE_INFO = ["bc.info.gz", "bzip2.info.gz", "ed.info.gz", "gettext.info.gz", "time.info.gz",
             "wget.info.gz"]
LICENSES = "/usr/share/common-licenses"
MORE_LICENSES = ["Apache-2.0", "Artistic", "GPL-2", "LGPL-2.1", "MPL-2.0", "GFDL-1.3"]
DOC_TEXTS = ["/usr/share/doc/sed/sedfaq.txt.gz", "/usr/share/doc/libpng16-16/libpng-manual.txt.gz",
             "/usr/share/doc/libjpeg62-turbo-dev/libjpeg.txt.gz",
             "/usr/share/doc/xproto/x11protocol.txt.gz", "/usr/share/doc/dpkg/spec/triggers.txt"]


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


def read_text(path):
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rt", encoding="utf-8", errors="replace") as f:
        return f.read()


def man_text(path):
    """A man page rendered as plain text (man -l, 80 columns, no overstrike)."""
    env = dict(os.environ, MANWIDTH="80", MAN_KEEP_FORMATTING="0")
    r = subprocess.run(["man", "-l", path], capture_output=True, text=True, env=env,
                       errors="replace")
    return re.sub(r".\x08", "", r.stdout)


def package_files(pkg, pattern):
    r = subprocess.run(["dpkg", "-L", pkg], capture_output=True, text=True)
    return sorted(f for f in r.stdout.split() if re.search(pattern, f) and os.path.isfile(f))


def source_text(name):
    """One training source by name. None of them is, or comes from the package
    of, an evaluation text (Revelation, the coreutils manual, the Debian project
    history: coreutils and debian-history contribute nothing)."""
    if name == "kjv-without-revelation":
        return "\n".join("\n".join(v) for b, v in kjv_books().items() if b != "Rev")
    if name == "gnu-manuals":
        return "\n".join(read_text(os.path.join(INFO, n)) for n in TRAIN_INFO
                         if os.path.exists(os.path.join(INFO, n)))
    if name == "gpl-3":
        return read_text(LICENSE)
    if name == "more-manuals":  # other Texinfo manuals: bc, bzip2, ed, gettext, time, wget
        return "\n".join(read_text(os.path.join(INFO, n)) for n in MORE_INFO
                         if os.path.exists(os.path.join(INFO, n)))
    if name == "licenses":  # /usr/share/common-licenses but the GPL-3
        return "\n".join(read_text(os.path.join(LICENSES, n)) for n in MORE_LICENSES
                         if os.path.exists(os.path.join(LICENSES, n)))
    if name == "man7":  # overview pages of the Linux man-pages project (package manpages)
        return "\n".join(man_text(f) for f in package_files("manpages", r"/man7/.*\.7\.gz$"))
    if name == "doc-texts":  # plain-text documentation in /usr/share/doc
        return "\n".join(read_text(f) for f in DOC_TEXTS if os.path.exists(f))
    sys.exit(f"unknown training source {name}")


def train_sources(names=",".join(SOURCES_V1)):
    """[(name, text)]: the training texts, none of them an evaluation text."""
    return [(n, source_text(n)) for n in names.split(",")]


def eval_texts():
    """{file name: text}: the held-out texts and the calibration text."""
    books = kjv_books()
    core = read_text(COREUTILS)
    core = core[core.index("\n1 Introduction\n") + 1:]
    hist = read_text(HISTORY)
    hist = hist[re.search(r"Chapter\s1\.\s+Introduction", hist).start():]
    return {"kjv_revelation.txt": "\n".join(books["Rev"]) + "\n",
            "kjv_matthew200.txt": "\n".join(books["Mat"][:200]) + "\n",
            "coreutils_manual.txt": core[:EVAL_CHARS],
            "debian_history.txt": hist[:EVAL_CHARS]}


def write_texts(d):
    os.makedirs(d, exist_ok=True)
    for name, text in eval_texts().items():
        with open(os.path.join(d, name), "w") as f:
            f.write(text)
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


def read_scalars(path, L, H):
    rows = []
    for line in open(path):
        line = line.split("#", 1)[0].strip()
        if line:
            rows.append([float(x) for x in line.split()])
    if len(rows) != L or any(len(r) != H for r in rows):
        sys.exit(f"{path}: expected {L} lines of {H} numbers")
    return torch.tensor(rows, dtype=torch.float32)


def rope_tables(T, dh, base):
    i = torch.arange(dh // 2, dtype=torch.float64)
    a = torch.arange(T, dtype=torch.float64)[:, None] * base ** (-2.0 * i / dh)[None, :]
    return torch.cos(a).float(), torch.sin(a).float()


def rope(x, c, s):
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)


def read_values(path, L, H, Dh):
    """Sink value vectors [L, H, Dh] (or sink keys [L, Hkv, Dh]) from a raw
    little-endian float32 file (tools/retrofit_sinks.py --values and --keys
    read the same layout)."""
    a = np.fromfile(path, dtype="<f4")
    if a.size != L * H * Dh:
        sys.exit(f"{path}: expected {L} x {H} x {Dh} float32, got {a.size} numbers")
    return torch.from_numpy(a.reshape(L, H, Dh).astype(np.float32))


def write_values(path, v):
    np.ascontiguousarray(v.detach().numpy(), dtype="<f4").tofile(path + ".part")
    os.replace(path + ".part", path)


def forward_nll(kv, w, sinks, ids, window, sink_v=None, score_from=0, kv_f16=True,
                sink_k=None):
    """Per-token NLL of ids[score_from + 1:] under the window policy with sink
    logits sinks [L, H] (None: vanilla softmax), optional sink values
    [L, H, Dh] (the null key's value: its weight times v_h joins the output)
    and optional sink keys [L, Hkv, Dh] (blk.N.attn_sinks_k: the sink logit of
    query head h at position p is s_h + scale q_{p,h} . k_g, q before RoPE,
    g = h's KV head; the sink sits at distance 0 from every query).
    kv_f16 rounds the cached K (after RoPE) and V to f16, as the engine's
    default KV cache stores them."""
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
        q0 = q
        q, k = rope(q, c, s), rope(k, c, s)
        if kv_f16:
            k, v = k.half().float(), v.half().float()
        k = k.repeat_interleave(H // Hkv, dim=0)
        v = v.repeat_interleave(H // Hkv, dim=0)
        z = (q @ k.transpose(-1, -2)) / math.sqrt(Dh)
        z = z.masked_fill(~mask, float("-inf"))
        if sinks is None:
            o = torch.softmax(z, dim=-1) @ v
        else:
            sl = sinks[l].view(H, 1, 1).expand(H, T, 1)
            if sink_k is not None:  # q before RoPE . k_g, per query
                kg = sink_k[l].repeat_interleave(H // Hkv, dim=0)  # [H, Dh]
                sl = sl + (q0 @ kg[:, :, None]) / math.sqrt(Dh)
            zz = torch.cat([z, sl], dim=-1)
            a = torch.softmax(zz, dim=-1)
            o = a[..., :-1] @ v
            if sink_v is not None:
                o = o + a[..., -1:] * sink_v[l].view(H, 1, Dh)
        o = o.transpose(0, 1).reshape(T, D)
        x = x + o @ w[p + "attn_output.weight"].T
        h = rms(x, w[p + "ffn_norm.weight"])
        x = x + (F.silu(h @ w[p + "ffn_gate.weight"].T) * (h @ w[p + "ffn_up.weight"].T)) \
            @ w[p + "ffn_down.weight"].T
    out = w.get("output.weight", emb)
    xs = rms(x[score_from:-1], w["output_norm.weight"])
    return F.cross_entropy(xs @ out.T, ids[score_from + 1:], reduction="none")


def fit_sinks(kv, w, seqs, n_pin=4, grid=None):
    """Layer-wise fit of the sink logits, no backpropagation. seqs: [(ids, W)].
    Every sequence runs through the retrofit (window-only, null key) layer by
    layer. At each layer and head the window-only output with a null key of
    logit s is o(s) = c_t(s) o_win,t with c_t = 1 / (1 + e^{s - log R_t}),
    R_t = sum_j e^{z_tj} over the window; the target is the vanilla output
    with the first n_pin tokens visible as well (`sinks:n_pin`, true
    positions), o_pin,t. s minimizes sum_{t >= W} |W_o,h (c_t(s) o_win,t - o_pin,t)|^2
    on a grid, then the layer runs with it and the next layer is fitted."""
    arch = kv["general.architecture"]
    L = int(kv[f"{arch}.block_count"])
    H = int(kv[f"{arch}.attention.head_count"])
    Hkv = int(kv[f"{arch}.attention.head_count_kv"])
    eps = float(kv[f"{arch}.attention.layer_norm_rms_epsilon"])
    base = float(kv.get(f"{arch}.rope.freq_base", 10000.0))
    emb = w["token_embd.weight"]
    D = emb.shape[1]
    Dh = D // H
    grid = torch.arange(-8.0, 16.0001, 0.05) if grid is None else grid

    def rms(x, g):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g

    xs = [emb[ids] for ids, _ in seqs]
    sinks = torch.zeros(L, H)
    for l in range(L):
        p = f"blk.{l}."
        Wo = w[p + "attn_output.weight"]  # [D, H*Dh]
        err = torch.zeros(H, len(grid), dtype=torch.float64)
        outs = []
        for i, (ids, W) in enumerate(seqs):
            x, T = xs[i], ids.shape[0]
            c, s = rope_tables(T, Dh, base)
            t = torch.arange(T)
            win = (t[None, :] <= t[:, None]) & (t[None, :] > t[:, None] - W)
            pin = win | ((t[None, :] < n_pin) & (t[None, :] <= t[:, None]))
            h = rms(x, w[p + "attn_norm.weight"])
            q = (h @ w[p + "attn_q.weight"].T).view(T, H, Dh).transpose(0, 1)
            k = (h @ w[p + "attn_k.weight"].T).view(T, Hkv, Dh).transpose(0, 1)
            v = (h @ w[p + "attn_v.weight"].T).view(T, Hkv, Dh).transpose(0, 1)
            q, k = rope(q, c, s), rope(k, c, s)
            k = k.repeat_interleave(H // Hkv, dim=0)
            v = v.repeat_interleave(H // Hkv, dim=0)
            z = (q @ k.transpose(-1, -2)) / math.sqrt(Dh)
            zw = z.masked_fill(~win, float("-inf"))
            logr = torch.logsumexp(zw, dim=-1)  # [H, T]
            o_win = torch.softmax(zw, dim=-1) @ v  # [H, T, Dh]
            o_pin = torch.softmax(z.masked_fill(~pin, float("-inf")), dim=-1) @ v
            for hh in range(H):
                wo = Wo[:, hh * Dh:(hh + 1) * Dh]
                a = (o_win[hh, W:] @ wo.T).double()
                b = (o_pin[hh, W:] @ wo.T).double()
                A, B = (a * a).sum(-1), (a * b).sum(-1)  # [n]
                cc = torch.sigmoid(logr[hh, W:].double()[None, :] - grid.double()[:, None])
                err[hh] += (cc * cc * A[None, :] - 2 * cc * B[None, :]).sum(-1)
            outs.append((o_win, logr))
        sinks[l] = grid[err.argmin(-1)]
        for i, (ids, W) in enumerate(seqs):
            o_win, logr = outs[i]
            cc = torch.sigmoid(logr - sinks[l].view(H, 1))  # [H, T]
            o = (o_win * cc[..., None]).transpose(0, 1).reshape(ids.shape[0], D)
            x = xs[i] + o @ Wo.T
            hf = rms(x, w[p + "ffn_norm.weight"])
            xs[i] = x + (F.silu(hf @ w[p + "ffn_gate.weight"].T) * (hf @ w[p + "ffn_up.weight"].T)) \
                @ w[p + "ffn_down.weight"].T
        print(f"layer {l:2d} sinks " + " ".join(f"{v:+.2f}" for v in sinks[l].tolist()), flush=True)
    return sinks


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model")
    ap.add_argument("--out")
    ap.add_argument("--write-texts", metavar="DIR",
                    help="only write the evaluation and calibration texts into DIR")
    ap.add_argument("--eval", metavar="FILE",
                    help="only print window-only perplexity on FILE (--init sinks, or "
                         "vanilla softmax with --vanilla)")
    ap.add_argument("--eval-tokens", type=int, default=2048)
    ap.add_argument("--vanilla", action="store_true")
    ap.add_argument("--init", help="start from these sink logits (default: all 0, softmax1)")
    ap.add_argument("--init-values",
                    help="start from (or with --eval, use) these sink value vectors "
                         "(raw float32, layers x heads x head_dim; default: all 0)")
    ap.add_argument("--steps", type=int, default=90, help="length of the cosine schedule")
    ap.add_argument("--stop-after", type=int, default=0,
                    help="stop after this many steps of the schedule (default: all)")
    ap.add_argument("--windows", default="64,128,256")
    ap.add_argument("--loss-tokens", type=int, default=160,
                    help="scored tokens per step, after the first W")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--sink-values", metavar="FILE",
                    help="also train one value vector per query head (blk.N.attn_sinks_v) "
                         "and write them to FILE (raw float32, layers x heads x head_dim)")
    ap.add_argument("--lr-values", type=float, default=0.02,
                    help="peak Adam learning rate of the value vectors")
    ap.add_argument("--sink-keys", metavar="FILE",
                    help="also train one sink key per KV head (blk.N.attn_sinks_k) and write "
                         "them to FILE (raw float32, layers x kv heads x head_dim)")
    ap.add_argument("--init-keys",
                    help="start from (or with --eval, use) these sink keys (default: all 0, "
                         "which is exactly the model without keys)")
    ap.add_argument("--lr-keys", type=float, default=0.01,
                    help="peak Adam learning rate of the sink keys")
    ap.add_argument("--val-every", type=int, default=0,
                    help="every this many steps (and before the first) score a fixed "
                         "validation slice per window and write the files only when the "
                         "validation loss is the best so far")
    ap.add_argument("--val-tokens", type=int, default=320,
                    help="scored tokens after the first W in each validation slice")
    ap.add_argument("--max-seconds", type=float, default=0,
                    help="stop before a step that would start after this many seconds")
    ap.add_argument("--freeze-logits", action="store_true",
                    help="with --sink-values: train the value vectors only")
    ap.add_argument("--kv-f32", action="store_true",
                    help="keep K and V in f32 (default: rounded to f16 like the engine's cache)")
    ap.add_argument("--fit", action="store_true",
                    help="no training: the layer-wise fit of fit_sinks on one slice of "
                         "--fit-tokens tokens after the window per source and window")
    ap.add_argument("--fit-tokens", type=int, default=384)
    ap.add_argument("--keep-every", type=int, default=0,
                    help="also keep a copy of the files every this many steps (OUT.stepN)")
    ap.add_argument("--early-weight", type=float, default=0.0,
                    help="also score the first W tokens (the real first token still in the "
                         "window): loss = (mean NLL t >= W + this x mean NLL t < W) / (1 + this)")
    ap.add_argument("--sources", default=",".join(SOURCES_V1),
                    help="training sources, taken in turn (see source_text)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    if a.write_texts:
        return write_texts(a.write_texts)
    if not a.model or not (a.out or a.eval):
        ap.error("--model and --out (or --eval) are required")
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    torch.use_deterministic_algorithms(True)
    windows = [int(x) for x in a.windows.split(",")]

    kv, w = load_weights(a.model)
    arch = kv["general.architecture"]
    L = int(kv[f"{arch}.block_count"])
    H = int(kv[f"{arch}.attention.head_count"])
    Hkv = int(kv[f"{arch}.attention.head_count_kv"])
    Dh = int(kv[f"{arch}.embedding_length"]) // H
    tok, _ = build_tokenizer(a.model)
    if a.eval:  # --init may list several files here, each evaluated in turn
        ids = torch.tensor(tok.encode(open(a.eval).read()).ids[:a.eval_tokens], dtype=torch.long)
        sv = read_values(a.init_values, L, H, Dh) if a.init_values else None
        sk_k = read_values(a.init_keys, L, Hkv, Dh) if a.init_keys else None
        cands = [("vanilla", None)] if a.vanilla else []
        cands += [(os.path.basename(f), read_scalars(f, L, H))
                  for f in (a.init.split(",") if a.init else [])]
        with torch.no_grad():
            for W in windows:
                for name, sk in cands:
                    nll = forward_nll(kv, w, sk, ids, W, sv if sk is not None else None,
                                      kv_f16=not a.kv_f32,
                                      sink_k=sk_k if sk is not None else None)
                    print(f"{os.path.basename(a.eval)} W={W} {name} window tokens={len(nll)} "
                          f"ppl={math.exp(nll.mean()):.3f} "
                          f"ppl(t>={W})={math.exp(nll[W:].mean()):.3f}", flush=True)
        return
    init = read_scalars(a.init, L, H) if a.init else torch.zeros(L, H)

    sources = [(n, torch.tensor(tok.encode(t).ids, dtype=torch.long))
               for n, t in train_sources(a.sources)]
    print(f"{L} x {H} sink logits{' + values' if a.sink_values else ''}; windows {windows}; "
          f"{a.loss_tokens} scored tokens per step; sources: "
          + ", ".join(f"{n} ({len(i)} tokens)" for n, i in sources), flush=True)

    if a.fit:
        g = torch.Generator().manual_seed(a.seed)
        seqs = []
        for W in windows:
            for name, ids in sources:
                n = W + a.fit_tokens + 1
                st = int(torch.randint(0, len(ids) - n, (1,), generator=g))
                seqs.append((ids[st:st + n], W))
        t0 = time.time()
        with torch.no_grad():
            sinks = fit_sinks(kv, w, seqs)
        el = time.time() - t0
        with open(a.out, "w") as f:
            f.write(f"# sink logits from tools/train_sinks.py --fit: {L} layers x {H} heads, "
                    f"one line per layer\n# layer-wise fit to the sinks:4 outputs, windows "
                    f"{a.windows}, {a.fit_tokens} tokens per source and window, seed {a.seed}; "
                    f"sources {', '.join(n for n, _ in sources)}; {el:.0f}s on one thread\n")
            for row in sinks.tolist():
                f.write(" ".join(f"{v:.6f}" for v in row) + "\n")
        print(f"wrote {a.out} ({el:.0f}s)")
        return

    sinks = init.clone().requires_grad_(not a.freeze_logits)
    groups = [{"params": [sinks], "lr": a.lr, "peak": a.lr}] if not a.freeze_logits else []
    sink_v = None
    if a.sink_values:
        v0 = read_values(a.init_values, L, H, Dh) if a.init_values else torch.zeros(L, H, Dh)
        sink_v = v0.clone().requires_grad_(True)
        groups.append({"params": [sink_v], "lr": a.lr_values, "peak": a.lr_values})
    elif a.init_values:
        sink_v = read_values(a.init_values, L, H, Dh)  # fixed, not trained
    sink_k = None
    if a.sink_keys:
        k0 = read_values(a.init_keys, L, Hkv, Dh) if a.init_keys else torch.zeros(L, Hkv, Dh)
        sink_k = k0.clone().requires_grad_(True)
        groups.append({"params": [sink_k], "lr": a.lr_keys, "peak": a.lr_keys})
    opt = torch.optim.Adam(groups)
    g = torch.Generator().manual_seed(a.seed)

    # Validation: one fixed slice per distinct window, from the last tenth of a
    # training source (window i: source i, in turn); training draws its slices
    # from the first nine tenths only, so the two never overlap.
    val = []
    if a.val_every:
        gv = torch.Generator().manual_seed(a.seed + 1)
        for i, W in enumerate(sorted(set(windows))):
            name, ids = sources[i % len(sources)]
            cut = len(ids) * 9 // 10
            n = W + a.val_tokens + 1
            if len(ids) - cut < n:
                sys.exit(f"source {name}: its last tenth is shorter than {n} tokens")
            st = cut + int(torch.randint(0, len(ids) - cut - n + 1, (1,), generator=gv))
            val.append((W, name, ids[st:st + n]))
        sources = [(n, ids[:len(ids) * 9 // 10]) for n, ids in sources]

    def step_loss(nll, W):
        if a.early_weight:
            late, early = nll[W:].mean(), nll[:W].mean()
            return (late + a.early_weight * early) / (1 + a.early_weight), late, early
        return nll.mean(), nll.mean(), nll.mean()

    def validate():
        losses = []
        with torch.no_grad():
            for W, name, ids in val:
                nll = forward_nll(kv, w, sinks, ids, W, sink_v, kv_f16=not a.kv_f32,
                                  sink_k=sink_k)
                loss, late, _ = step_loss(nll, W)
                losses.append(loss.item())
                print(f"  val W {W:4d} {name:22s} loss {loss.item():.4f} "
                      f"ppl(t>=W) {math.exp(late.item()):.3f}", flush=True)
        return sum(losses) / len(losses)

    def save(step, el, note, suffix=""):
        with open(a.out + suffix + ".part", "w") as f:
            f.write(f"# sink logits from tools/train_sinks.py: {L} layers x {H} heads, one "
                    f"line per layer\n# {step} of {a.steps} steps{note}, windows {a.windows}, "
                    f"{a.loss_tokens} scored tokens per step, Adam lr {a.lr} cosine"
                    + (f" (logits frozen)" if a.freeze_logits else "")
                    + (f", values lr {a.lr_values} -> {os.path.basename(a.sink_values)}"
                       f" (init {os.path.basename(a.init_values) if a.init_values else '0'})"
                       if a.sink_values else "")
                    + (f", keys lr {a.lr_keys} -> {os.path.basename(a.sink_keys)}"
                       f" (init {os.path.basename(a.init_keys) if a.init_keys else '0'})"
                       if a.sink_keys else "")
                    + (f", early weight {a.early_weight}" if a.early_weight else "")
                    + f", {'f32' if a.kv_f32 else 'f16'} K/V, seed "
                    f"{a.seed}, init {os.path.basename(a.init) if a.init else '0'}; sources "
                    f"{', '.join(n for n, _ in sources)}; {el:.0f}s on one thread\n")
            for row in sinks.detach().tolist():
                f.write(" ".join(f"{v:.6f}" for v in row) + "\n")
        os.replace(a.out + suffix + ".part", a.out + suffix)
        if a.sink_values:
            write_values(a.sink_values + suffix, sink_v)
        if a.sink_keys:
            write_values(a.sink_keys + suffix, sink_k)

    t0 = time.time()
    best = None
    if val:
        best = validate()
        print(f"validation before training: {best:.4f} ({time.time() - t0:.0f}s)", flush=True)
        save(0, time.time() - t0, f" (best validation loss {best:.4f})")
    n_run = a.stop_after if 0 < a.stop_after < a.steps else a.steps
    for step in range(n_run):
        if a.max_seconds and time.time() - t0 > a.max_seconds:
            print(f"stopping before step {step}: {a.max_seconds:.0f}s spent", flush=True)
            if not val and step % 10 != 0:  # the steps since the last save
                save(step, time.time() - t0, "")
            break
        for pg in opt.param_groups:
            pg["lr"] = pg["peak"] * 0.5 * (1 + math.cos(math.pi * step / a.steps))
        W = windows[step % len(windows)]
        name, ids = sources[(step // len(windows)) % len(sources)]
        n = W + a.loss_tokens + 1
        st = int(torch.randint(0, len(ids) - n, (1,), generator=g))
        nll = forward_nll(kv, w, sinks, ids[st:st + n], W, sink_v,
                          score_from=0 if a.early_weight else W, kv_f16=not a.kv_f32,
                          sink_k=sink_k)
        loss, late, early = step_loss(nll, W)
        opt.zero_grad()
        loss.backward()
        opt.step()
        vn = f" |v| {sink_v.detach().norm(dim=-1).mean().item():.3f}" if sink_v is not None else ""
        kn = f" |k| {sink_k.detach().norm(dim=-1).mean().item():.3f}" if sink_k is not None else ""
        ew = f" (t>=W {late.item():.4f}, t<W {early.item():.4f})" if a.early_weight else ""
        print(f"step {step:3d} W {W:4d} {name:22s} loss {loss.item():.4f}{ew} "
              f"mean sink {sinks.mean().item():+.3f}{vn}{kn} ({time.time() - t0:.0f}s)",
              flush=True)
        if val and ((step + 1) % a.val_every == 0 or step + 1 == n_run):
            vl = validate()
            print(f"validation after step {step + 1}: {vl:.4f} (best {best:.4f}) "
                  f"({time.time() - t0:.0f}s)", flush=True)
            if vl < best:
                best = vl
                save(step + 1, time.time() - t0, f" (best validation loss {best:.4f})")
        elif not val and ((step + 1) % 10 == 0 or step + 1 == n_run):
            save(step + 1, time.time() - t0, "")
        if a.keep_every and (step + 1) % a.keep_every == 0:  # this step's own copies
            save(step + 1, time.time() - t0, "", f".step{step + 1}")
    print(f"wrote {a.out} ({time.time() - t0:.0f}s)")


if __name__ == "__main__":
    main()
