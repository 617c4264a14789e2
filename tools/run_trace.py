#!/usr/bin/env python3
"""Sums up a CPU thread pool run trace, per kind of run.

    STREAMSINK_TRACE_RUNS=/tmp/runs.txt build/bench_batch --model M --batches 32 ...
    tools/run_trace.py build/bench_batch /tmp/runs.txt [--skip 0.33]

The trace (engine/cpu/threadpool.c) holds each run's publication and each
part's thread, start and end. Per part function, over the runs kept (--skip
leaves out that fraction of the first runs, e.g. a prefill before the decode
steps), this prints:

  runs     how many
  wall     first part's start to last part's end, summed (ms)
  busy     the parts' own time, summed over threads (ms)
  idle     threads x wall - busy: a thread waiting inside the run, at its
           start (the claim) or its end (the other threads' last parts) (ms)
  before   the caller's time from the previous run's last part to this
           run's publication: work no other thread shares (ms)
  claim    publication to the first part's start, mean (us)

and the span the runs cover, so that each column reads as a share of it.
Part functions are named from the binary's symbols (nm).
"""
import argparse
import collections
import subprocess
import sys


def symbols(binary):
    out = subprocess.run(["nm", binary], check=True, capture_output=True, text=True).stdout
    syms = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) == 3 and f[1] in "tTwW":
            syms[int(f[0], 16)] = f[2]
    return syms


def read(path):
    pub, parts, dropped = {}, collections.defaultdict(list), 0
    with open(path) as f:
        for line in f:
            f_ = line.split()
            if f_[0] == "run":
                pub[int(f_[1])] = (int(f_[2], 16), int(f_[3]))
            elif f_[0] == "part":
                gen, fn, thr, part, t0, t1 = f_[1:]
                parts[int(gen)].append((int(fn, 16), int(thr), int(part), int(t0), int(t1)))
            elif f_[0] == "dropped":
                dropped = int(f_[1])
    return pub, parts, dropped


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("binary")
    ap.add_argument("trace")
    ap.add_argument("--skip", type=float, default=0.0,
                    help="fraction of the first runs to leave out (default 0)")
    a = ap.parse_args()
    syms = symbols(a.binary)
    pub, parts, dropped = read(a.trace)
    if dropped:
        print(f"note: the trace dropped {dropped} events past its capacity", file=sys.stderr)
    # runs in time order (the caller's solo runs are numbered apart)
    gens = sorted((g for g in parts if g in pub), key=lambda g: pub[g][1])
    gens = gens[int(len(gens) * a.skip):]
    if not gens:
        sys.exit("run_trace: no runs in the trace")
    n_threads = 1 + max(p[1] for g in gens for p in parts[g])
    agg = collections.defaultdict(lambda: [0, 0, 0, 0, 0, 0])
    prev_end = None
    for g in gens:
        fn, t_pub = pub[g]
        ps = parts[g]
        start = min(p[3] for p in ps)
        end = max(p[4] for p in ps)
        busy = sum(p[4] - p[3] for p in ps)
        r = agg[syms.get(fn, hex(fn))]
        r[0] += 1
        r[1] += end - start
        r[2] += busy
        r[3] += n_threads * (end - start) - busy
        if prev_end is not None:
            r[4] += max(0, t_pub - prev_end)
        r[5] += start - t_pub
        prev_end = end
    span = prev_end - pub[gens[0]][1]
    print(f"{len(gens)} runs, {n_threads} threads, span {span / 1e6:.1f} ms")
    print()
    print("| part function | runs | wall ms | busy ms | idle ms | before ms | claim us |")
    print("|---|---|---|---|---|---|---|")
    tot = [0] * 6
    for name, r in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        print(f"| {name} | {r[0]} | {r[1] / 1e6:.1f} | {r[2] / 1e6:.1f} | {r[3] / 1e6:.1f} "
              f"| {r[4] / 1e6:.1f} | {r[5] / r[0] / 1e3:.2f} |")
        tot = [x + y for x, y in zip(tot, r)]
    print(f"| all | {tot[0]} | {tot[1] / 1e6:.1f} | {tot[2] / 1e6:.1f} | {tot[3] / 1e6:.1f} "
          f"| {tot[4] / 1e6:.1f} | {tot[5] / tot[0] / 1e3:.2f} |")
    print()
    print(f"shares of the span: in runs {100 * tot[1] / span:.1f}%, "
          f"threads idle inside runs {100 * tot[3] / (n_threads * span):.1f}% of thread time, "
          f"caller alone between runs {100 * tot[4] / span:.1f}%")


if __name__ == "__main__":
    main()
