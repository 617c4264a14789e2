"""echo on /v1/completions, through the official openai client: the prompt's
tokens come first, each with its log-prob given the tokens before it (the
first has none: null), as the legacy OpenAI API and vLLM give them, and
max_tokens 0 answers the prompt alone (what evaluation harnesses send to
score a text).

The log-probs are checked three ways:
- against the model's own decoding: a text the server generated, echoed
  back, gets the very log-probs generation gave each of its tokens (a
  prefill row is bit for bit a decode step's);
- against themselves under other chunkings and a sliding window: a prompt
  longer than the window is scored as the window sees it, the same for a
  chunk of 1 and of 7 tokens, and as an unbounded window sees it until the
  first eviction;
- against `streamsink perplexity` (a decoder fed one token at a time,
  scored in double) under the `window` and `sinks:4` policies;
- against Hugging Face transformers (tests/fixtures/logits_smollm2.txt, the
  fixture the C reference test uses): each row's greedy token, and the
  differences between the log-probs of the reference's top tokens.
"""

import json
import os

import pytest

PROMPT = "The capital of France is"
STORY = ("Once upon a time, in a small village at the edge of a great forest, there lived an old "
         "woodcutter and his wife. They were poor, but they were kind, and every evening they "
         "shared what little bread they had with the birds that came to their window. One "
         "winter, when the snow lay deep on the ground, a stranger knocked at their door.")
FIXTURE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "logits_smollm2.txt")
# tests/reference/test_reference_logits.c: the serving path's logits are
# within 1.5 of transformers'; a difference of two logits within twice that
FAST_TOL = 1.5


def post(server, path, body):
    status, _, raw = server.post(path, json.dumps(body))
    return status, json.loads(raw)


def test_an_echoed_answer_gets_the_logprobs_generation_gave_it(client):
    gen = client.completions.create(model="smol", prompt=PROMPT, max_tokens=24, temperature=0,
                                    logprobs=5)
    g = gen.choices[0]
    r = client.completions.create(model="smol", prompt=PROMPT + g.text, max_tokens=0, echo=True,
                                  logprobs=5)
    e = r.choices[0]
    n_p = gen.usage.prompt_tokens
    assert e.text == PROMPT + g.text
    assert e.finish_reason == "length"
    assert r.usage.completion_tokens == 0
    # the text tokenizes back into the same tokens (else the comparison below means nothing)
    assert r.usage.prompt_tokens == n_p + len(g.logprobs.tokens)
    assert len(e.logprobs.tokens) == r.usage.prompt_tokens
    assert "".join(e.logprobs.tokens) == e.text
    assert e.logprobs.tokens[n_p:] == g.logprobs.tokens
    assert e.logprobs.token_logprobs[0] is None and e.logprobs.top_logprobs[0] is None
    assert all(isinstance(x, float) for x in e.logprobs.token_logprobs[1:])
    assert e.logprobs.token_logprobs[n_p:] == g.logprobs.token_logprobs
    assert e.logprobs.top_logprobs[n_p:] == g.logprobs.top_logprobs
    offsets = [len("".join(e.logprobs.tokens[:i])) for i in range(len(e.logprobs.tokens))]
    assert e.logprobs.text_offset == offsets


def test_echo_then_the_answer_offsets_and_usage(client):
    r = client.completions.create(model="smol", prompt=PROMPT, max_tokens=6, temperature=0,
                                  echo=True, logprobs=2)
    plain = client.completions.create(model="smol", prompt=PROMPT, max_tokens=6, temperature=0,
                                      logprobs=2)
    e, p = r.choices[0], plain.choices[0]
    assert e.text == PROMPT + p.text
    n_p = r.usage.prompt_tokens
    assert r.usage.completion_tokens == plain.usage.completion_tokens
    assert e.logprobs.tokens[n_p:] == p.logprobs.tokens
    assert e.logprobs.token_logprobs[n_p:] == p.logprobs.token_logprobs
    # the answer's offsets count from the start of the echoed prompt
    assert e.logprobs.text_offset[n_p:] == [len(PROMPT) + o for o in p.logprobs.text_offset]
    # echo without logprobs: the text only
    t = client.completions.create(model="smol", prompt=PROMPT, max_tokens=6, temperature=0,
                                  echo=True)
    assert t.choices[0].text == PROMPT + p.text
    assert t.choices[0].logprobs is None


def test_a_streamed_echo_is_the_whole_one_in_pieces(client):
    whole = client.completions.create(model="smol", prompt=STORY, max_tokens=8, temperature=0,
                                      echo=True, logprobs=3)
    chunks = list(client.completions.create(model="smol", prompt=STORY, max_tokens=8,
                                            temperature=0, echo=True, logprobs=3, stream=True))
    w = whole.choices[0]
    assert "".join(ch.choices[0].text for ch in chunks) == w.text
    assert w.text.startswith(STORY)
    lps = [ch.choices[0].logprobs for ch in chunks if ch.choices[0].logprobs]
    assert [t for lp in lps for t in lp.tokens] == w.logprobs.tokens
    assert [t for lp in lps for t in lp.token_logprobs] == w.logprobs.token_logprobs
    assert [t for lp in lps for t in lp.top_logprobs] == w.logprobs.top_logprobs
    assert [t for lp in lps for t in lp.text_offset] == w.logprobs.text_offset
    assert chunks[-1].choices[0].finish_reason == "length"


def test_a_prompt_past_the_window_is_scored_as_the_window_sees_it(start_server, server):
    body = {"model": "smol", "prompt": STORY, "max_tokens": 0, "echo": True, "logprobs": 3}
    by_chunk = {}
    for chunk in ("1", "7"):
        s = start_server("--window", "24", "--chunk", chunk, "--max-seqs", "2")
        status, r = post(s, "/v1/completions", body)
        assert status == 200, r
        by_chunk[chunk] = r["choices"][0]["logprobs"]
    status, r = post(server, "/v1/completions", body)  # a window of 4096
    assert status == 200, r
    full = r["choices"][0]["logprobs"]
    n = len(full["tokens"])
    assert n > 60
    # chunked prefill is token by token, bit for bit, through the evictions
    assert by_chunk["1"] == by_chunk["7"]
    lp = by_chunk["7"]["token_logprobs"]
    # no token has been evicted while the window holds them all (24 tokens,
    # 4 of them sinks): the same log-probs as the unbounded window...
    assert lp[:24] == full["token_logprobs"][:24]
    # ...and past it, what the window keeps is all the model sees
    later = [i for i in range(30, n) if lp[i] != full["token_logprobs"][i]]
    assert len(later) > (n - 30) // 2


def read_fixture():
    prompts, cur = [], None
    with open(FIXTURE) as f:
        for line in f:
            w = line.split()
            if not w or w[0] == "#":
                continue
            if w[0] == "prompt":
                cur = {"ids": [], "top": []}
                prompts.append(cur)
            elif w[0] == "ids":
                cur["ids"] = [int(x) for x in w[1:]]
            elif w[0] == "pos":
                cur["top"].append([(int(a), float(b)) for a, b in
                                   (x.split(":") for x in w[3:])])
    return prompts


def test_echoed_logprobs_agree_with_transformers(server):
    prompts = read_fixture()
    assert len(prompts) >= 3
    texts = {}

    def text_of(i):  # a token's text as the logprobs name it (raw bytes as UTF-8)
        if i not in texts:
            status, d = post(server, "/detokenize", {"tokens": [i]})
            assert status == 200
            texts[i] = d["content"]
        return texts[i]

    checked = 0
    for p in prompts:
        ids = p["ids"]
        status, r = post(server, "/v1/completions",
                         {"model": "smol", "prompt": ids, "max_tokens": 0, "echo": True,
                          "logprobs": 5})
        assert status == 200, r
        lp = r["choices"][0]["logprobs"]
        assert len(lp["tokens"]) == len(ids)
        assert lp["token_logprobs"][0] is None
        for pos in range(len(ids) - 1):
            ref = p["top"][pos]  # transformers' row at pos: the token after it
            ours = lp["top_logprobs"][pos + 1]
            top_id, top_logit = ref[0]
            top_text = text_of(top_id)
            if "\ufffd" in top_text:
                continue  # a part of a character: its key is not its own
            assert top_text in ours, (pos, top_text, ours)
            if top_logit - ref[1][1] > FAST_TOL:  # a clear greedy token: ours too
                assert max(ours, key=ours.get) == top_text, (pos, ref[:2], ours)
            for i, logit in ref[1:]:
                t = text_of(i)
                if t not in ours or "\ufffd" in t or sum(text_of(j) == t for j, _ in ref) > 1:
                    continue
                d_ours = ours[t] - ours[top_text]
                d_ref = logit - top_logit
                assert abs(d_ours - d_ref) <= 2 * FAST_TOL, (pos, t, d_ours, d_ref)
                checked += 1
    print("pairs checked", checked)
    assert checked > 500


def test_a_character_the_prompt_leaves_partial_is_the_answers_to_complete(server):
    status, t = post(server, "/tokenize", {"content": "A \U0001F99C B", "with_pieces": True})
    assert status == 200
    ids = [x["id"] for x in t["tokens"]]
    pieces = [x["piece"] for x in t["tokens"]]
    # the parrot is three tokens of bytes: " \xf0\x9f", "\xa6", "\x9c"
    k = next(i for i, pc in enumerate(pieces) if isinstance(pc, list))
    assert all(isinstance(pc, list) for pc in pieces[k:k + 3])
    # the prompt ends inside the character, the answer's forced token ends it
    status, r = post(server, "/v1/completions",
                      {"model": "smol", "prompt": ids[:k + 2], "max_tokens": 1, "echo": True,
                       "logit_bias": {str(ids[k + 2]): 100}, "temperature": 0})
    assert status == 200, r
    assert r["choices"][0]["text"] == "A \U0001F99C"
    # the prompt alone: the partial character is flushed as U+FFFD at the end
    status, r = post(server, "/v1/completions",
                      {"model": "smol", "prompt": ids[:k + 2], "max_tokens": 0, "echo": True})
    assert status == 200, r
    assert r["choices"][0]["text"].startswith("A ")
    assert r["choices"][0]["text"][2:] and set(r["choices"][0]["text"][2:]) == {"\ufffd"}
    status, r = post(server, "/v1/completions",
                      {"model": "smol", "prompt": ids, "max_tokens": 0, "echo": True})
    assert r["choices"][0]["text"] == "A \U0001F99C B"


@pytest.mark.parametrize("body,param", [
    ({"prompt": PROMPT, "max_tokens": 0}, "max_tokens"),
    ({"prompt": PROMPT, "max_tokens": 0, "echo": False}, "max_tokens"),
    ({"prompt": PROMPT, "max_tokens": -1, "echo": True}, "max_tokens"),
    ({"prompt": PROMPT, "echo": True, "session_id": "echo-session"}, "echo"),
    ({"prompt": PROMPT, "echo": "yes"}, "echo"),
])
def test_echo_refusals_name_the_field(server, body, param):
    status, r = post(server, "/v1/completions", dict(body, model="smol"))
    assert status == 400, r
    assert r["error"]["param"] == param


def test_chat_refuses_echo(server):
    status, r = post(server, "/v1/chat/completions",
                     {"model": "smol", "messages": [{"role": "user", "content": "hi"}],
                      "echo": True})
    assert status == 400, r
    assert r["error"]["param"] == "echo"


def test_an_echo_with_logprobs_stays_within_max_response(start_server):
    s = start_server("--max-response", "8192", "--max-seqs", "2")
    status, r = post(s, "/v1/completions", {"model": "smol", "prompt": STORY * 4,
                                            "max_tokens": 0, "echo": True, "logprobs": 5})
    assert status == 200, r
    c = r["choices"][0]
    assert c["finish_reason"] == "length"
    body = json.dumps(c["logprobs"]) + c["text"]
    assert len(body.encode()) <= 8192 + 1024
    n = len(c["logprobs"]["tokens"])
    assert 0 < n < r["usage"]["prompt_tokens"]
    assert c["text"] == "".join(c["logprobs"]["tokens"])
    # the server goes on serving
    status, r = post(s, "/v1/completions", {"model": "smol", "prompt": PROMPT, "max_tokens": 2})
    assert status == 200


def test_echo_scores_a_text_as_the_perplexity_command_does(binary, model, start_server,
                                                           tmp_path):
    """The API's echo under a KV policy against `streamsink perplexity`, which
    feeds a decoder one token at a time and scores in double: each token's
    log-prob is minus its NLL, through a window of 64 the text overflows,
    under `window` and `sinks:4`, whose evictions differ."""
    import subprocess
    text = STORY * 2
    tf = tmp_path / "text.txt"
    tf.write_text(text)
    s = start_server("--window", "64", "--max-seqs", "2")
    scored = {}
    for policy in ("window", "sinks:4"):
        jf = tmp_path / "ppl.json"
        subprocess.run([binary, "perplexity", "-m", model, "--text", str(tf), "--policy", policy,
                        "--window", "64", "--json", str(jf), "--no-progress"], check=True,
                       capture_output=True, timeout=300)
        nll = json.loads(jf.read_text())["nll"]
        status, r = post(s, "/v1/completions", {"model": "smol", "prompt": text, "max_tokens": 0,
                                                "echo": True, "logprobs": 0,
                                                "kv_policy": policy})
        assert status == 200, r
        lp = r["choices"][0]["logprobs"]["token_logprobs"]
        assert lp[0] is None
        assert len(lp) - 1 == len(nll) > 120
        # the NLLs are written with 5 decimals; the server's log-sum-exp is a float's
        worst = max(abs(a + b) for a, b in zip(lp[1:], nll))
        assert worst < 2e-5, (policy, worst)
        scored[policy] = lp
    assert scored["window"][:64] == scored["sinks:4"][:64]
    assert sum(a != b for a, b in zip(scored["window"][70:], scored["sinks:4"][70:])) > 50


def test_a_client_that_leaves_mid_echo_frees_its_slot(start_server):
    """A streamed echo with logprobs of a long prompt, its client gone after
    the first chunks (mid-prefill: the prompt takes 32 tokens a step): the
    sequence is cancelled, its slot is free, and the server answers the next
    request as before."""
    import time
    s = start_server("--stream-grace", "0", "--max-seqs", "2")
    c = s.client()
    want = c.completions.create(model="smol", prompt=PROMPT, max_tokens=4, temperature=0)
    stream = c.completions.create(model="smol", prompt=STORY * 12, max_tokens=0, echo=True,
                                  logprobs=5, stream=True)
    it = iter(stream)
    for _ in range(3):
        next(it)
    m = s.metrics()
    assert m["streamsink_active_sequences"] == 1
    stream.close()
    deadline = time.time() + 60
    while True:  # (the loop counts the request over after the engine frees its slot)
        m = s.metrics()
        if (m["streamsink_kv_slots_free"] == m["streamsink_kv_slots_total"]
                and m["streamsink_active_sequences"] == 0
                and m["streamsink_requests_inflight"] == 0):
            break
        assert time.time() < deadline, m
        time.sleep(0.05)
    again = c.completions.create(model="smol", prompt=PROMPT, max_tokens=4, temperature=0)
    assert again.choices[0].text == want.choices[0].text
