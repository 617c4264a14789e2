"""Sessions: two requests on one session_id produce what one request with the
concatenated prompt produces (greedy), because the second prompt is appended
to the session's KV stream."""


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
