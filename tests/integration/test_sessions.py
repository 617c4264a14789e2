"""Sessions: two requests on one session_id produce what one request with the
concatenated prompt produces (greedy), because the second prompt is appended
to the session's KV stream."""

from session_util import call


def test_two_session_turns_equal_one_concatenated_prompt(client):
    a = "The capital of France is"
    b = " The capital of Germany is"
    first = client.completions.create(model="smol", prompt=a, max_tokens=3, temperature=0,
                                      extra_body={"session_id": "sess-concat"})
    t1 = first.choices[0].text
    second = client.completions.create(model="smol", prompt=b, max_tokens=6, temperature=0,
                                       extra_headers={"X-Session-Id": "sess-concat"})
    one = client.completions.create(model="smol", prompt=a + t1 + b, max_tokens=6, temperature=0)
    assert second.choices[0].text == one.choices[0].text
    assert second.usage.prompt_tokens < one.usage.prompt_tokens  # only the new text was sent


def test_a_session_keeps_its_kv_policy_and_a_request_naming_another_is_refused(server):
    # a kv_policy sent on an existing session was silently ignored (200, the
    # session still sinks:4): now the same policy is fine and another is a 400
    st, r = call(server, "POST", "/v1/completions",
                 {"model": "smol", "prompt": "Hi", "max_tokens": 1, "session_id": "keeps-policy",
                  "kv_policy": "sinks:4"})
    assert st == 200, r
    st, r = call(server, "POST", "/v1/completions",
                 {"model": "smol", "prompt": " there", "max_tokens": 1,
                  "session_id": "keeps-policy", "kv_policy": "sinks:4"})
    assert st == 200, r
    st, r = call(server, "POST", "/v1/completions",
                 {"model": "smol", "prompt": " again", "max_tokens": 1,
                  "session_id": "keeps-policy", "kv_policy": "window"})
    assert st == 400 and r["error"]["param"] == "kv_policy", r
    assert "sinks:4" in r["error"]["message"] and "window" in r["error"]["message"], r
    st, r = call(server, "GET", "/v1/sessions/keeps-policy")
    assert st == 200 and r["kv_policy"] == "sinks:4", r


def test_listings_without_a_session_dir_never_wait_and_are_never_refused(server):
    # the cap on listings waiting for a directory read applies to listings
    # that wait: without --session-dir a burst during a decode is all 200
    import threading

    body = {"model": "smol", "prompt": "Once upon a time", "max_tokens": 200, "temperature": 0}
    gen = threading.Thread(target=lambda: call(server, "POST", "/v1/completions", body))
    gen.start()
    got = [None] * 12

    def lister(i):
        got[i] = call(server, "GET", "/v1/sessions")[0]

    listers = [threading.Thread(target=lister, args=(i,)) for i in range(12)]
    for t in listers:
        t.start()
    for t in listers:
        t.join(60)
    gen.join(120)
    assert got == [200] * 12, got
