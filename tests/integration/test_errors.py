"""Every error a client can cause: the right status, OpenAI's error shape
{"error":{"message","type","param","code"}}, the SDK's matching exception
class, and a server that keeps serving everyone else."""

import json
import os
import socket
import subprocess
import time

import openai
import pytest

from conftest import ENDLESS

MESSAGES = [{"role": "user", "content": "Hello"}]


def error_of(body):
    obj = json.loads(body)
    e = obj["error"]
    assert set(e) == {"message", "type", "param", "code"}
    assert isinstance(e["message"], str) and e["message"]
    assert e["param"] is None or isinstance(e["param"], str)
    assert e["code"] is None or isinstance(e["code"], str)
    return e


@pytest.mark.parametrize("kwargs,param", [
    (dict(temperature=5), "temperature"),
    (dict(top_p=-1), "top_p"),
    (dict(n=0), "n"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(logprobs=9), "logprobs"),
    (dict(extra_body={"kv_policy": "sideways"}), "kv_policy"),
    (dict(extra_body={"session_id": ""}), "session_id"),
    (dict(extra_body={"top_k": "many"}), "top_k"),
])
def test_bad_params_raise_bad_request_naming_the_param(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as ei:
        client.completions.create(model="smol", prompt="Hi", max_tokens=kwargs.pop("max_tokens", 2),
                                  **kwargs)
    assert ei.value.status_code == 400
    assert ei.value.body["param"] == param
    assert ei.value.body["type"] == "invalid_request_error"


def test_chat_bad_params_raise_bad_request(client):
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model="smol", messages=[{"role": "wizard", "content": "x"}])
    assert ei.value.body["param"] == "messages[0].role"
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model="smol", messages=MESSAGES, top_logprobs=2)
    assert ei.value.body["param"] == "top_logprobs"


def test_unknown_fields_are_ignored(client):
    r = client.completions.create(model="smol", prompt="Hi", max_tokens=1,
                                  extra_body={"frobnicate": {"deep": [1, 2]}})
    assert r.usage.completion_tokens == 1


def test_bad_json_is_a_400_with_openai_shape(server):
    status, _, body = server.post("/v1/completions", '{"prompt": ')
    assert status == 400
    e = error_of(body)
    assert e["type"] == "invalid_request_error"


def test_unknown_path_is_404_and_wrong_method_405(server, client):
    status, _, body = server.get("/v1/nothing-here")
    assert status == 404
    assert error_of(body)["code"] == "unknown_url"
    status, headers, body = server.get("/v1/completions")
    assert status == 405
    assert headers["allow"] == "POST"
    error_of(body)
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_body_over_max_body_is_413(start_server):
    s = start_server("--max-body", "4096")
    big = json.dumps({"prompt": "x" * 10000, "max_tokens": 1})
    status, headers, body = s.post("/v1/completions", big)
    assert status == 413
    error_of(body)
    with pytest.raises(openai.APIStatusError) as ei:
        s.client().completions.create(model="smol", prompt="y" * 10000, max_tokens=1)
    assert ei.value.status_code == 413
    assert s.get("/health")[0] == 200  # still serving


def test_headers_over_the_limit_are_431(server):
    status, _, body = server.get("/health", {"X-Big": "v" * 40000})
    assert status == 431
    error_of(body)


def test_malformed_request_line_is_400(server):
    raw = server.raw(b"THIS IS NOT HTTP\r\n\r\n")
    assert raw.startswith(b"HTTP/1.1 400 ")


def test_slowloris_gets_408(start_server):
    s = start_server("--read-timeout", "1")
    c = s.connect()
    c.sendall(b"GET /health HTTP/1.1\r\nHo")
    t0 = time.time()
    got = b""
    c.settimeout(1)
    while time.time() - t0 < 5:
        c.sendall(b"s")  # a byte at a time does not extend the deadline
        try:
            chunk = c.recv(4096)
        except socket.timeout:
            continue
        except (ConnectionResetError, BrokenPipeError):
            break
        if not chunk:
            break
        got += chunk
    c.close()
    assert got.startswith(b"HTTP/1.1 408 ")


def test_api_key_is_required_on_v1_but_not_on_health_or_metrics(start_server):
    s = start_server("--api-key", "sekret")
    with pytest.raises(openai.AuthenticationError) as ei:
        s.client(api_key="wrong").completions.create(model="smol", prompt="Hi", max_tokens=1)
    assert ei.value.status_code == 401
    assert ei.value.body["code"] == "invalid_api_key"
    status, _, _ = s.get("/v1/models")
    assert status == 401
    assert s.get("/health")[0] == 200
    assert s.get("/metrics")[0] == 200
    r = s.client(api_key="sekret").completions.create(model="smol", prompt="Hi", max_tokens=1)
    assert r.usage.completion_tokens == 1


def test_the_docs_name_every_series_a_scrape_shows(start_server, tmp_path):
    """docs/serving.md#metrics says what each series is; one it leaves out
    is one an operator has to guess at."""
    import re
    from conftest import REPO
    s = start_server("--session-dir", str(tmp_path))
    status, _, body = s.get("/metrics")
    assert status == 200
    families = {l.split()[2] for l in body.decode().splitlines() if l.startswith("# TYPE ")}
    with open(os.path.join(REPO, "docs", "serving.md")) as f:
        doc = f.read()
    section = doc[doc.index("\n## Metrics\n"):]
    section = section[:section.index("\n## ", 1)]
    named = set()
    for name in re.findall(r"`([a-z_/]+)(?:\{[^}]*\})?`", section):
        if "/" in name:  # kv_slots_total/free/used
            head, *tails = name.split("/")
            stem = head.rsplit("_", 1)[0]
            named |= {head} | {f"{stem}_{x}" for x in tails}
        else:
            named.add(name)
    missing = sorted(f for f in families if f.removeprefix("streamsink_") not in named)
    assert not missing, missing


def test_full_slots_and_queue_give_429_with_retry_after(start_server):
    s = start_server("--max-seqs", "1", "--max-queue", "0")
    c = s.client()
    stream = c.completions.create(model="smol", prompt=ENDLESS, max_tokens=None, temperature=0,
                                  stream=True)
    next(iter(stream))  # the only slot is busy now
    with pytest.raises(openai.RateLimitError) as ei:
        c.completions.create(model="smol", prompt="Hi", max_tokens=1)
    assert ei.value.status_code == 429
    assert ei.value.response.headers.get("retry-after") == "1"
    stream.close()


def test_over_max_conns_is_503_when_every_connection_runs_a_request(start_server):
    """Idle connections make room for new ones (test_hostile_http.py); connections
    that run requests do not, so beyond them a new client gets a 503."""
    s = start_server("--max-conns", "2", "--max-seqs", "2")
    body = json.dumps({"model": "smol", "prompt": ENDLESS, "max_tokens": 100000,
                       "temperature": 0, "stream": True}).encode()
    busy = []
    for _ in range(2):
        c = s.connect()
        c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                  b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        assert c.recv(4096).startswith(b"HTTP/1.1 200")
        busy.append(c)
    raw = s.raw(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert raw.startswith(b"HTTP/1.1 503 ")
    assert b"Retry-After: 1" in raw
    for c in busy:
        c.close()
    deadline = time.time() + 10  # once the server has seen the closes
    while s.get("/health")[0] != 200 and time.time() < deadline:
        time.sleep(0.1)
    assert s.get("/health")[0] == 200


def test_prompt_too_long_is_a_plain_400_even_when_streaming(start_server):
    s = start_server("--max-prompt", "8")
    c = s.client()
    long_prompt = "one two three four five six seven eight nine ten eleven twelve"
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model="smol", prompt=long_prompt, max_tokens=2)
    with pytest.raises(openai.BadRequestError):  # headers were held: still a plain error
        list(c.completions.create(model="smol", prompt=long_prompt, max_tokens=2, stream=True))


def test_busy_session_is_409(client):
    stream = client.completions.create(model="smol", prompt=ENDLESS, max_tokens=None,
                                       temperature=0, stream=True,
                                       extra_body={"session_id": "busy-1"})
    next(iter(stream))
    with pytest.raises(openai.ConflictError):
        client.completions.create(model="smol", prompt="More", max_tokens=1,
                                  extra_body={"session_id": "busy-1"})
    stream.close()


def test_backend_flag_is_checked_before_serving(binary, model):
    """--backend: an unknown name is a usage error (exit 2); cuda where the
    build or the machine has none is a runtime error (exit 1) that says why.
    Neither leaves a server behind."""
    bad = subprocess.run([binary, "serve", "-m", model, "--port", "0", "--backend", "gpu"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert "--backend expects cpu or cuda" in bad.stderr
    cuda = subprocess.run([binary, "run", "-m", model, "-p", "hi", "-n", "1", "--backend", "cuda"],
                          capture_output=True, text=True, timeout=120)
    if cuda.returncode == 0:
        pytest.skip("this machine has a GPU and a CUDA build: nothing to refuse")
    assert cuda.returncode == 1
    assert "cuda backend:" in cuda.stderr
    assert ("no CUDA support" in cuda.stderr) or ("no CUDA device" in cuda.stderr)
