#!/usr/bin/env python3
"""Builds the StreamingLLM table and plot from tools/streaming_table.sh runs.

Each run's JSON has the per-token negative log-likelihood ("nll", token t
predicting t+1; recompute runs list only every stride-th token, in "scored").
The table gives each policy's perplexity over all its scored tokens, over the
tokens recompute scored (same positions for every policy), and the ratio to
recompute there. The plot shows perplexity per 512-token bin against position.
"""
import json
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(out, name):
    p = os.path.join(out, name + ".json")
    if not os.path.exists(p):
        return None
    with open(p) as f:
        d = json.load(f)
    d["positions"] = d.get("scored") or list(range(len(d["nll"])))
    d["by_pos"] = dict(zip(d["positions"], d["nll"]))
    return d


def ppl(vals):
    return math.exp(sum(vals) / len(vals)) if vals else float("nan")


def main():
    out = sys.argv[1]
    rows = []
    dense = load(out, "dense")
    lines = ["| window | policy | tokens scored | perplexity | on recompute's tokens | "
             "vs recompute there | KV bytes | tokens/s |", "|---|---|---|---|---|---|---|---|"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5), sharey=True)
    for ax, w in zip(axes, (256, 1024)):
        rec = load(out, "recompute-%d" % w)
        rec_pos = [p for p in rec["positions"]] if rec else []
        rec_ppl = ppl([rec["by_pos"][p] for p in rec_pos]) if rec else float("nan")
        runs = [("dense", dense), ("window", load(out, "window-%d" % w)),
                ("sinks:1", load(out, "sinks1-%d" % w)), ("sinks:4", load(out, "sinks4-%d" % w)),
                ("recompute", rec)]
        for label, d in runs:
            if d is None:
                continue
            # compare on the tokens both scored (dense stops at the context)
            both = [p for p in rec_pos if p in d["by_pos"]]
            cp = ppl([d["by_pos"][p] for p in both]) if both else float("nan")
            rp = ppl([rec["by_pos"][p] for p in both]) if both else float("nan")
            ratio = cp / rp if both else float("nan")
            lines.append("| %d | %s | %d | %.3f | %s | %s | %s | %.2f |" % (
                w, label + (" (context %d)" % d["window"] if label == "dense" else ""),
                len(d["nll"]), d["perplexity"],
                "%.3f (%d tok)" % (cp, len(both)) if both else "n/a",
                "%.2fx" % ratio if both else "n/a",
                "{:,}".format(d["kv_bytes"]), d["tokens_per_s"]))
            # perplexity per 512-token bin against position; recompute scored
            # only every stride-th token, so its bins are 2048 tokens wide
            width = 2048 if label == "recompute" else 512
            bins = {}
            for p, v in zip(d["positions"], d["nll"]):
                bins.setdefault(p // width, []).append(v)
            xs = sorted(bins)
            ax.plot([width * b + width // 2 for b in xs], [ppl(bins[b]) for b in xs],
                    label=label + (" (2048-token bins)" if width == 2048 else ""),
                    marker="o" if label == "recompute" else None, markersize=3)
        ax.set_yscale("log")
        ax.set_title("SmolLM2-135M, KJV Bible, window %d" % w)
        ax.set_xlabel("token position")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    axes[0].set_ylabel("perplexity per bin (log scale)")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "ppl.png"), dpi=110)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
