"""Strict JSON at the API's edge (api/request.c), over raw HTTP and with the
official client where it can send the body: one RFC 8259 object and nothing
after it; no U+0000 in any string (C strings would cut it short); only the
models the server serves; tool calling refused, not dropped; non-finite
numbers named as such; trees too big or too deep refused before cJSON builds
them; and every rejection that one parameter causes names it."""

import json

import openai
import pytest

MESSAGES = [{"role": "user", "content": "Hello"}]


def error_of(body):
    e = json.loads(body)["error"]
    assert set(e) == {"message", "type", "param", "code"}
    assert isinstance(e["message"], str) and e["message"]
    return e


def post(server, path, body):
    """Raw POST; returns (status, the error object or None)."""
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    status, _, raw = server.post(path, body)
    return status, (error_of(raw) if status >= 400 else None)


@pytest.fixture(scope="module")
def model_id(server):
    """The served model's id as /v1/models reports it (the GGUF's basename)."""
    status, _, body = server.get("/v1/models")
    assert status == 200
    return json.loads(body)["data"][0]["id"]


def completion(model_id, **kw):
    return {"model": model_id, "prompt": "Hi", "max_tokens": 1, **kw}


def chat(model_id, **kw):
    return {"model": model_id, "messages": MESSAGES, "max_tokens": 1, **kw}


def assert_alive(server, client, model_id):
    r = client.completions.create(model=model_id, prompt="Hi", max_tokens=1)
    assert r.usage.completion_tokens == 1


# 1. only whitespace may follow the object


@pytest.mark.parametrize("tail", [" xyz", '{"prompt":"again"}', "]", "\x00", "\x0c"])
def test_bytes_after_the_json_object_are_a_400(server, model_id, tail):
    status, e = post(server, "/v1/completions", json.dumps(completion(model_id)) + tail)
    assert status == 400
    assert e["param"] is None
    assert e["code"] == "invalid_json"
    assert e["type"] == "invalid_request_error"


def test_whitespace_after_the_json_object_is_fine(server, model_id):
    status, _ = post(server, "/v1/completions", json.dumps(completion(model_id)) + " \r\n\t")
    assert status == 200


# 2. U+0000 in a string


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", '{"model":"%s","prompt":"a\\u0000b","max_tokens":1}', "prompt"),
    ("/v1/completions", '{"model":"%s","prompt":["\\u0000"],"max_tokens":1}', "prompt"),
    ("/v1/completions", '{"model":"%s","prompt":"x","stop":["a","b\\u0000"]}', "stop"),
    ("/v1/completions", '{"model":"%s","prompt":"x","session_id":"s\\u0000t"}', "session_id"),
    ("/v1/chat/completions",
     '{"model":"%s","messages":[{"role":"user","content":"hi"},'
     '{"role":"user","content":"x\\u0000y"}]}', "messages[1].content"),
    ("/v1/chat/completions",
     '{"model":"%s","messages":[{"role":"user\\u0000x","content":"hi"}]}', "messages[0].role"),
    ("/v1/completions", '{"model":"%s","prompt":"a\\\\\\u0000"}', "prompt"),
])
def test_u0000_in_a_string_is_a_400_naming_the_param(server, model_id, path, body, param):
    status, e = post(server, path, body % model_id)
    assert status == 400
    assert e["param"] == param
    assert "U+0000" in e["message"]


def test_u0000_from_the_client_is_a_400_naming_the_param(client, model_id):
    with pytest.raises(openai.BadRequestError) as ei:
        client.completions.create(model=model_id, prompt="secret\x00ignored", max_tokens=1)
    assert ei.value.body["param"] == "prompt"
    with pytest.raises(openai.BadRequestError) as ei:
        client.completions.create(model=model_id, prompt="x", stop=["\x00"], max_tokens=1)
    assert ei.value.body["param"] == "stop"
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model=model_id, max_tokens=1,
                                       messages=[{"role": "user", "content": "a\x00b"}])
    assert ei.value.body["param"] == "messages[0].content"


def test_an_escaped_backslash_before_u0000_is_text(server, client, model_id):
    # the JSON text "a\\u0000b" is the seven characters a\u0000b
    status, _ = post(server, "/v1/completions",
                     '{"model":"%s","prompt":"a\\\\u0000b","max_tokens":1}' % model_id)
    assert status == 200
    r = client.completions.create(model=model_id, prompt="a\\u0000b", max_tokens=1)
    assert r.usage.prompt_tokens > 3


# 3. the model must be one the server serves (404 until server/router.c passes the names)


def test_the_served_model_id_is_accepted(client, model_id):
    r = client.completions.create(model=model_id, prompt="Hi", max_tokens=1)
    assert r.model == model_id


def test_an_unknown_model_is_a_404_model_not_found(server, client):
    status, e = post(server, "/v1/completions", completion("no-such-model"))
    assert status == 404
    assert e == {"message": "The model `no-such-model` does not exist.",
                 "type": "invalid_request_error", "param": "model", "code": "model_not_found"}
    with pytest.raises(openai.NotFoundError) as ei:
        client.chat.completions.create(model="no-such-model", messages=MESSAGES, max_tokens=1)
    assert ei.value.status_code == 404
    assert ei.value.body["code"] == "model_not_found"
    assert ei.value.body["param"] == "model"


# 4. tool calling: refused, not dropped


TOOL = {"type": "function",
        "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}


@pytest.mark.parametrize("kwargs,param", [
    (dict(tools=[TOOL]), "tools"),
    (dict(tools=[TOOL], tool_choice="auto"), "tools"),
    (dict(functions=[TOOL["function"]]), "functions"),
    (dict(tool_choice="required"), "tool_choice"),
    (dict(tool_choice={"type": "function", "function": {"name": "get_weather"}}), "tool_choice"),
    (dict(function_call={"name": "get_weather"}), "function_call"),
])
def test_tool_calling_is_a_400_naming_the_param(client, model_id, kwargs, param):
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model=model_id, messages=MESSAGES, max_tokens=1, **kwargs)
    assert ei.value.body["param"] == param
    assert ei.value.body["code"] == "unsupported_parameter"
    assert "does not support tool calling" in ei.value.body["message"]


@pytest.mark.parametrize("kwargs", [
    dict(tools=[]),
    dict(tool_choice="none"),
    dict(tools=[], tool_choice="auto"),
    dict(functions=[], function_call="none"),
    dict(parallel_tool_calls=False),
])
def test_tool_fields_that_ask_for_no_tool_call_are_accepted(client, model_id, kwargs):
    r = client.chat.completions.create(model=model_id, messages=MESSAGES, max_tokens=1, **kwargs)
    assert r.choices[0].message.tool_calls is None


def test_tool_fields_on_raw_posts(server, model_id):
    status, e = post(server, "/v1/chat/completions", chat(model_id, tool_choice="sometimes"))
    assert (status, e["param"]) == (400, "tool_choice")
    status, e = post(server, "/v1/chat/completions", chat(model_id, parallel_tool_calls="yes"))
    assert (status, e["param"]) == (400, "parallel_tool_calls")
    status, e = post(server, "/v1/completions", completion(model_id, tools=[TOOL]))
    assert (status, e["param"]) == (400, "tools")


# 5. numbers that are not finite


@pytest.mark.parametrize("param", ["temperature", "top_p", "top_k", "min_p", "presence_penalty",
                                   "frequency_penalty", "seed", "n", "max_tokens", "logprobs",
                                   "best_of"])
def test_a_non_finite_number_is_a_400_naming_the_param(server, model_id, param):
    # 1e400 is valid JSON that parses as infinity (the openai client cannot send it: Python's
    # json refuses to write inf without allow_nan, and Infinity is not JSON)
    body = '{"model":"%s","prompt":"Hi","%s":-1e400}' % (model_id, param)
    status, e = post(server, "/v1/completions", body)
    assert status == 400
    assert e["param"] == param
    assert e["code"] == "invalid_value"
    assert e["message"] == f"Invalid value for '{param}': the number is out of range (not finite)."


def test_a_non_finite_token_id_is_a_400(server, model_id):
    status, e = post(server, "/v1/completions", '{"model":"%s","prompt":[1,1e999]}' % model_id)
    assert (status, e["param"]) == (400, "prompt")
    assert "not finite" in e["message"]


# 6. trees too big or too deep, refused before they are built


def test_a_huge_token_array_is_a_413_before_parsing(server, client, model_id):
    n = 3_000_000  # about 6 MB: under the 8 MiB body limit, far over the value limit
    body = '{"model":"%s","max_tokens":1,"prompt":[%s]}' % (model_id, ",".join(["1"] * n))
    status, e = post(server, "/v1/completions", body)
    assert status == 413
    assert e["code"] == "request_too_large"
    assert e["param"] is None
    assert "values" in e["message"]
    assert_alive(server, client, model_id)


def test_deep_nesting_is_a_400(server, client, model_id):
    body = json.dumps(completion(model_id))[:-1] + ', "deep": ' + "[" * 100 + "]" * 100 + "}"
    status, e = post(server, "/v1/completions", body)
    assert status == 400
    assert e["code"] == "json_too_deep"
    assert e["param"] is None
    status, _ = post(server, "/v1/completions", "[" * 100_000)
    assert status == 400
    assert_alive(server, client, model_id)


def test_a_long_token_prompt_within_the_limit_is_served(client, model_id):
    r = client.completions.create(model=model_id, prompt=[1] * 2000, max_tokens=1)
    assert r.usage.prompt_tokens >= 2000


# 7. every rejection caused by one parameter names it


def test_a_key_given_twice_is_a_400_naming_it(server, model_id):
    # cJSON would read the first value, Python's json (a proxy in front) the last
    body = '{"model":"%s","prompt":"Hi","max_tokens":1,"max_tokens":100000}' % model_id
    status, e = post(server, "/v1/completions", body)
    assert (status, e["param"]) == (400, "max_tokens")
    assert "more than once" in e["message"]


@pytest.mark.parametrize("path,fields,param", [
    ("/v1/completions", dict(temperature="hot"), "temperature"),
    ("/v1/completions", dict(max_tokens=1e300), "max_tokens"),
    ("/v1/completions", dict(prompt=[1, 2, 10**9]), "prompt"),
    ("/v1/completions", dict(prompt="caf\udce9"), "prompt"),  # a lone surrogate: not UTF-8
    ("/v1/completions", dict(stop=["a"] * 5), "stop"),
    ("/v1/chat/completions", dict(echo=True), "echo"),
    ("/v1/completions", dict(stream_options={"include_usage": True}), "stream_options"),
    ("/v1/chat/completions", dict(messages=[{"role": "wizard", "content": "x"}]),
     "messages[0].role"),
    ("/v1/chat/completions", dict(messages=[{"role": "user", "content": [{"type": "image_url"}]}]),
     "messages[0].content"),
    ("/v1/chat/completions", dict(top_logprobs=3), "top_logprobs"),
])
def test_rejections_name_the_param(server, model_id, path, fields, param):
    base = completion(model_id) if path == "/v1/completions" else chat(model_id)
    body = json.dumps({**base, **fields}, ensure_ascii=False).encode("utf-8", "surrogateescape")
    status, e = post(server, path, body)
    assert status == 400
    assert e["param"] == param
