"""Many concurrent streams all complete, and each greedy stream equals the
same prompt run alone (continuous batching changes nothing per stream); so
does each seeded sampled stream, tokens and log-probs, although the streams
of a step are sampled in parallel on the backend's threads."""

import os
from concurrent.futures import ThreadPoolExecutor

N = int(os.environ.get("STREAMSINK_TEST_STREAMS", "64"))


def test_concurrent_greedy_streams_equal_their_solo_runs(start_server):
    s = start_server("--max-seqs", str(min(N, 64)), "--max-queue", str(N), "--window", "512")
    prompts = [f"Fact number {i}: the" for i in range(8)]
    c = s.client(timeout=600)
    solo = {p: c.completions.create(model="smol", prompt=p, max_tokens=8, temperature=0)
            .choices[0].text for p in prompts}

    def one(i):
        p = prompts[i % len(prompts)]
        text = "".join(ch.choices[0].text for ch in
                       c.completions.create(model="smol", prompt=p, max_tokens=8, temperature=0,
                                            stream=True))
        return p, text

    with ThreadPoolExecutor(max_workers=N) as ex:
        results = list(ex.map(one, range(N)))
    assert len(results) == N
    wrong = [(p, text, solo[p]) for p, text in results if text != solo[p]]
    assert not wrong, f"{len(wrong)} of {N} streams differ from their solo run, e.g. {wrong[0]}"


def test_concurrent_sampled_streams_equal_their_solo_runs(start_server):
    n = min(N, 24)
    s = start_server("--max-seqs", str(n), "--max-queue", str(n), "--window", "512")
    c = s.client(timeout=600)
    # (prompt, seed, top_logprobs or None): half ask for log-probs, which the
    # sampling threads compute with a scratch copy of each row
    runs = [(f"Story {i % 6} begins:", 1000 + i, 2 if i % 2 else None) for i in range(n)]

    def one(run):
        p, seed, lp = run
        kw = dict(model="smol", prompt=p, max_tokens=12, temperature=1.0, top_p=0.9, seed=seed)
        if lp:
            kw["logprobs"] = lp
        r = c.completions.create(**kw).choices[0]
        probs = (r.logprobs.token_logprobs, r.logprobs.top_logprobs) if lp else None
        return r.text, probs

    solo = [one(r) for r in runs]
    with ThreadPoolExecutor(max_workers=n) as ex:
        together = list(ex.map(one, runs))
    wrong = [(run, a, b) for run, a, b in zip(runs, together, solo) if a != b]
    assert not wrong, f"{len(wrong)} of {n} sampled streams differ from their solo run: {wrong[0]}"
    assert len({t for t, _ in solo}) > n // 2  # the seeds do sample different texts
