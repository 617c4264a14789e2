"""Many concurrent streams all complete, and each greedy stream equals the
same prompt run alone (continuous batching changes nothing per stream)."""

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
