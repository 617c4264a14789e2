"""Fixtures for the integration suite: a real `streamsink serve` process on a
free loopback port with the real model, driven by the official openai client
and by raw sockets.

The binary comes from --streamsink-bin (ctest passes it) or $STREAMSINK_BIN,
else build/streamsink; the model from $STREAMSINK_MODEL, else the cache path
of scripts/fetch-model.sh. Without a model the suite is skipped.
"""

import os
import re
import signal
import socket
import subprocess
import threading
import time

import openai
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def pytest_addoption(parser):
    parser.addoption("--streamsink-bin", default=None, help="path of the streamsink binary")


def default_model():
    p = os.environ.get("STREAMSINK_MODEL")
    if p:
        return p
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "streamsink", "SmolLM2-135M-Instruct.Q4_1.gguf")


def default_gemma_model():
    """Gemma 3 270M Q4_K_M: $STREAMSINK_GEMMA_MODEL, else the cache path of
    `scripts/fetch-model.sh gemma3-270m`."""
    p = os.environ.get("STREAMSINK_GEMMA_MODEL")
    if p:
        return p
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "streamsink", "gemma-3-270m-q4_k_m.gguf")


@pytest.fixture(scope="session")
def binary(request):
    b = request.config.getoption("--streamsink-bin") or os.environ.get("STREAMSINK_BIN")
    b = b or os.path.join(REPO, "build", "streamsink")
    if not os.access(b, os.X_OK):
        pytest.skip(f"no streamsink binary at {b} (build it, or pass --streamsink-bin)")
    return b


@pytest.fixture(scope="session")
def model():
    m = default_model()
    if not os.path.exists(m):
        pytest.skip(f"no model at {m} (run scripts/fetch-model.sh)")
    return m


@pytest.fixture(scope="session")
def gemma_model():
    """Skips only when the file is absent; a present but broken file fails the
    tests that use it."""
    m = default_gemma_model()
    if not os.path.exists(m):
        pytest.skip(f"no Gemma model at {m} (run scripts/fetch-model.sh gemma3-270m)")
    return m


class Server:
    """A spawned `streamsink serve`; its log is collected from stderr."""

    def __init__(self, binary, model, args):
        # the suites name the model "smol"; the served id is the file name
        cmd = [binary, "serve", "-m", model, "--port", "0", "--name", "pytest",
               "--model-alias", "smol", *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, errors="replace")
        self.lines = []
        self.port = None
        ready = threading.Event()

        def pump():
            for line in self.proc.stdout:
                self.lines.append(line)
                m = re.search(r"listening on http://[^:]+:(\d+)", line)
                if m and self.port is None:
                    self.port = int(m.group(1))
                    ready.set()
            ready.set()

        self.thread = threading.Thread(target=pump, daemon=True)
        self.thread.start()
        ready.wait(60)
        if self.port is None:
            self.proc.kill()
            raise RuntimeError("streamsink serve did not start:\n" + self.log())
        self.base = f"http://127.0.0.1:{self.port}"

    def log(self):
        return "".join(self.lines)

    def client(self, api_key="sk-test", **kw):
        return openai.OpenAI(base_url=self.base + "/v1", api_key=api_key, max_retries=0,
                             timeout=kw.pop("timeout", 120), **kw)

    def connect(self, rcvbuf=0):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        s.settimeout(30)
        s.connect(("127.0.0.1", self.port))
        return s

    def raw(self, data, timeout=30, quiet=None):
        """Sends bytes on a fresh connection; returns everything until the server closes
        (or, with quiet, until nothing arrived for that many seconds)."""
        s = self.connect()
        try:
            s.sendall(data)
            return read_until_quiet(s, timeout, quiet)
        finally:
            s.close()

    def get(self, path, headers=None):
        h = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        resp = self.raw(f"GET {path} HTTP/1.1\r\nHost: x\r\n{h}Connection: close\r\n\r\n".encode())
        return parse_response(resp)

    def post(self, path, body, headers=None):
        if isinstance(body, str):
            body = body.encode()
        h = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n{h}Connection: close\r\n\r\n").encode()
        return parse_response(self.raw(head + body))

    def metrics(self):
        status, _, body = self.get("/metrics")
        assert status == 200
        out = {}
        for line in body.decode().splitlines():
            if not line or line.startswith("#"):
                continue
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
        return out

    def wait_metric(self, name, pred, timeout=20.0):
        deadline = time.time() + timeout
        while True:
            v = self.metrics().get(name)
            if v is not None and pred(v):
                return v
            if time.time() > deadline:
                raise AssertionError(f"{name} = {v} did not reach the expected value; the "
                                     f"server's log ends:\n{self.log()[-3000:]}")
            time.sleep(0.1)

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.thread.join(5)
        return self.proc.returncode


def read_until_quiet(s, timeout=30, quiet=None):
    """Reads until EOF, the timeout, or (with quiet) that many idle seconds after data."""
    buf = b""
    deadline = time.time() + timeout
    s.settimeout(quiet or 1.0)
    while time.time() < deadline:
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            if buf and quiet:
                break
            continue
        except ConnectionResetError:
            break
        if not chunk:
            break
        buf += chunk
    return buf


def dechunk(body):
    out = b""
    while body:
        line, _, rest = body.partition(b"\r\n")
        n = int(line.split(b";")[0], 16)
        if n == 0:
            break
        out += rest[:n]
        body = rest[n + 2:]
    return out


def parse_response(raw):
    """(status, headers dict lower-cased, body bytes) of the first response in raw."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1]) if lines and lines[0].startswith("HTTP/") else 0
    headers = {}
    for l in lines[1:]:
        k, _, v = l.partition(":")
        headers[k.strip().lower()] = v.strip()
    if headers.get("transfer-encoding") == "chunked":
        body = dechunk(body)
    elif "content-length" in headers:
        body = body[:int(headers["content-length"])]
    return status, headers, body


def rss_kib(pid):
    """Resident memory of a process (VmRSS), in KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def run_cli(binary, model, prompt, n):
    """`streamsink run` greedy output: the independent path the server must match."""
    r = subprocess.run([binary, "run", "-m", model, "-p", prompt, "-n", str(n)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    return out[:-1] if out.endswith("\n") else out  # run ends its output with a newline


@pytest.fixture(scope="module")
def server(binary, model):
    s = Server(binary, model, ["--max-seqs", "8", "--max-queue", "64", "--sse-keepalive", "1"])
    yield s
    rc = s.stop()
    assert rc == 0, s.log()


@pytest.fixture
def start_server(binary, model):
    """Starts a server with extra flags; stopped (SIGTERM, exit 0) after the test."""
    started = []

    def start(*args):
        s = Server(binary, model, list(args))
        started.append(s)
        return s

    yield start
    for s in started:
        rc = s.stop()
        assert rc == 0, s.log()


@pytest.fixture
def client(server):
    return server.client()


# Greedy SmolLM2 keeps counting for hundreds of tokens: a request that stays busy.
ENDLESS = "Count to one thousand: 1, 2, 3, 4, 5,"
ENDLESS_CHAT = [{"role": "user", "content": "Count from 1 to 1000, separated by commas."}]

CHATML_SYSTEM = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                 "Hugging Face<|im_end|>\n")


def chatml(messages, default_system=True):
    """SmolLM2's chat template, written out independently of api/chat_template.c."""
    out = ""
    if default_system and messages[0]["role"] != "system":
        out += CHATML_SYSTEM
    for m in messages:
        out += f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n"
    return out + "<|im_start|>assistant\n"
