"""Session affinity through nginx: two `streamsink serve` replicas (--name r1
and r2) behind nginx running a config made from deploy/nginx/streamsink.conf.
Every request of a session (X-Session-Id) lands on one replica, both replicas
get traffic, requests without a session are spread, streamed tokens pass
through the proxy as they are made, and a stream resumes through the proxy
from whichever replica holds it. Failover: with one shared --session-dir,
a session saved on a replica that is then killed (SIGKILL) continues on the
other one, exactly.

nginx comes from the Debian package `nginx` (scripts/install-deps.sh); it runs
as a foreground process with a temp prefix, config, pid file and logs. Without
the binary the module is skipped, loudly.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from conftest import ENDLESS, REPO, Server
from session_util import call, complete, continuation
from test_resume import SSE

NGINX_CONF = os.path.join(REPO, "deploy", "nginx", "streamsink.conf")
REPLICA_HEADER = "x-streamsink-replica"


def find_nginx():
    for p in (shutil.which("nginx"), "/usr/sbin/nginx"):
        if p and os.access(p, os.X_OK):
            return p
    return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def nginx_config(prefix, port, upstreams):
    """deploy/nginx/streamsink.conf with its replica lists replaced by upstreams
    ("127.0.0.1:PORT" strings) and its listen line by a loopback port, wrapped
    in a main config that keeps every path inside prefix."""
    with open(NGINX_CONF) as f:
        site = f.read()
    servers = "".join(f"    server {u} max_fails=2 fail_timeout=10s;\n" for u in upstreams)
    site, n = re.subn(r"[ \t]*# replicas: begin\n.*?# replicas: end\n", servers, site,
                      flags=re.S)
    assert n == 2, "deploy/nginx/streamsink.conf lost its two '# replicas: begin/end' blocks"
    site, n = re.subn(r"^(\s*)listen\s+\d+;", rf"\1listen 127.0.0.1:{port};", site, flags=re.M)
    assert n == 1, "deploy/nginx/streamsink.conf should have one 'listen PORT;' line"
    # A root master would hand the workers to `nobody`, who cannot enter the temp dir.
    user = "user root;\n" if os.geteuid() == 0 else ""
    return f"""{user}worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log info;
events {{ worker_connections 256; }}
http {{
    log_format affinity '$remote_addr "$request" $status sid=$http_x_session_id '
                        'pool=$streamsink_pool up=$upstream_addr';
    access_log {prefix}/access.log affinity;
    client_body_temp_path {prefix}/client_body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
{site}
}}
"""


class Nginx:
    def __init__(self, binary, prefix, upstreams):
        self.prefix = prefix
        self.port = free_port()
        self.conf = os.path.join(prefix, "nginx.conf")
        with open(self.conf, "w") as f:
            f.write(nginx_config(prefix, self.port, upstreams))
        cmd = [binary, "-p", prefix, "-c", self.conf, "-e", os.path.join(prefix, "error.log")]
        t = subprocess.run(cmd + ["-t"], capture_output=True, text=True, timeout=30)
        if t.returncode != 0:
            raise RuntimeError(f"nginx -t rejected the generated config:\n{t.stderr}\n{self.conf}")
        self.proc = subprocess.Popen(cmd + ["-g", "daemon off;"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.STDOUT)
        deadline = time.time() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.time() > deadline:
                    self.proc.kill()
                    raise RuntimeError("nginx did not start:\n" + self.log("error.log"))
                time.sleep(0.05)
        self.base = f"http://127.0.0.1:{self.port}"

    def log(self, name):
        try:
            with open(os.path.join(self.prefix, name)) as f:
                return f.read()
        except OSError:
            return ""

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)  # graceful: finish open requests
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def nginx_bin():
    b = find_nginx()
    if b is None:
        msg = ("\n" + "!" * 78 + "\n"
               "test_nginx_affinity SKIPPED: no nginx binary. Install the Debian package\n"
               "`nginx` (scripts/install-deps.sh should list it); session affinity through\n"
               "deploy/nginx/streamsink.conf is NOT being tested.\n" + "!" * 78)
        print(msg, file=sys.stderr)
        pytest.skip("nginx binary missing: apt-get install nginx (NOT TESTED: session affinity)")
    return b


@pytest.fixture(scope="module")
def cluster(binary, model, nginx_bin, tmp_path_factory):
    """Two replicas (r1, r2) and nginx in front; yields (nginx, {name: Server})."""
    common = ["--threads", "1", "--max-seqs", "8", "--max-queue", "64", "--window", "512",
              "--sse-keepalive", "1", "--drain-timeout", "10"]
    replicas = {}
    front = None
    try:
        for name in ("r1", "r2"):
            replicas[name] = Server(binary, model, common + ["--name", name])
        prefix = str(tmp_path_factory.mktemp("nginx"))
        front = Nginx(nginx_bin, prefix,
                      [f"127.0.0.1:{s.port}" for s in replicas.values()])
        yield front, replicas
    finally:
        if front is not None:
            front.stop()
        for s in replicas.values():
            rc = s.stop()
            assert rc == 0, s.log()


def proxy_client(front):
    return openai.OpenAI(base_url=front.base + "/v1", api_key="sk-test", max_retries=0,
                         timeout=120)


def completion_via(client, prompt, max_tokens, headers=None, body=None):
    """(replica name, completion) of one non-streamed request."""
    raw = client.completions.with_raw_response.create(
        model="smol", prompt=prompt, max_tokens=max_tokens, temperature=0,
        extra_headers=headers or None, extra_body=body or None)
    return raw.headers.get(REPLICA_HEADER), raw.parse()


def test_every_request_of_a_session_lands_on_one_replica(cluster):
    front, replicas = cluster
    client = proxy_client(front)
    n_sessions, n_turns = 12, 3
    # Even sessions: the header only. Odd ones: the header and the same id in the
    # body (the server reads the body; nginx routes on the header).
    sessions = [f"affinity-{i:02d}-{os.getpid()}" for i in range(n_sessions)]
    seen = {sid: [] for sid in sessions}

    def turn(i, t):
        sid = sessions[i]
        body = {"session_id": sid} if i % 2 else None
        prompt = f"Session {i}, turn {t}: the weather today is"
        name, c = completion_via(client, prompt, 3, {"X-Session-Id": sid}, body)
        assert c.choices[0].finish_reason in ("length", "stop")
        return sid, name, c.usage.prompt_tokens

    # Turns interleave across sessions (and across nginx's upstream keep-alive
    # connections); each session's turns stay in order.
    with ThreadPoolExecutor(4) as pool:
        for t in range(n_turns):
            for sid, name, _ in pool.map(lambda i: turn(i, t), range(n_sessions)):
                seen[sid].append(name)

    per_replica = {name: 0 for name in replicas}
    for sid, names in seen.items():
        assert len(names) == n_turns
        assert None not in names, f"{sid}: a response without {REPLICA_HEADER}"
        assert len(set(names)) == 1, f"{sid} moved between replicas: {names}"
        per_replica[names[0]] += 1
    print(f"\nsessions per replica: {per_replica} "
          f"({n_sessions} sessions x {n_turns} requests)", file=sys.stderr)
    assert set(per_replica) == set(replicas)
    assert all(n > 0 for n in per_replica.values()), (
        f"one replica got every session: {per_replica}\n{front.log('access.log')}")
    # The replicas' own counters agree with the headers.
    for name, s in replicas.items():
        m = s.metrics()
        assert m["streamsink_requests_total{endpoint=\"/v1/completions\",status=\"200\"}"] >= \
            per_replica[name] * n_turns


def test_requests_without_a_session_are_spread_over_replicas(cluster):
    front, replicas = cluster
    client = proxy_client(front)
    names = [completion_via(client, "Hello, my name is", 2)[0] for _ in range(6)]
    print(f"\nsession-less requests landed on: {names}", file=sys.stderr)
    assert None not in names
    assert set(names) == set(replicas), f"round robin did not spread: {names}"


def test_tokenize_and_detokenize_pass_through_the_proxy(cluster):
    import http.client
    import json
    front, replicas = cluster
    host, port = front.base.split("//")[1].split(":")
    out = {}
    for path, body in (("/tokenize", {"content": "Hello, my name is"}),
                       ("/detokenize", {"tokens": [19556, 28, 957, 1462, 314]})):
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        out[path] = (r.status, json.loads(r.read()), r.getheader("X-Streamsink-Replica"))
        conn.close()
    status, tok, name = out["/tokenize"]
    assert status == 200 and name in replicas, out
    assert tok["count"] == len(tok["tokens"]) > 0
    status, detok, name = out["/detokenize"]
    assert status == 200 and name in replicas, out
    assert isinstance(detok["content"], str)


def test_session_id_in_the_body_alone_is_accepted_through_the_proxy(cluster):
    # nginx cannot route on it (it does not read bodies), but it must pass
    # through untouched and the replica must accept it.
    front, replicas = cluster
    client = proxy_client(front)
    name, c = completion_via(client, "One, two,", 2, body={"session_id": f"body-{os.getpid()}"})
    assert name in replicas
    assert c.usage.completion_tokens == 2


def test_streamed_tokens_arrive_through_the_proxy_as_they_are_made(cluster):
    front, replicas = cluster
    client = proxy_client(front)
    n = 64
    t0 = time.monotonic()
    arrivals = []
    with client.completions.with_streaming_response.create(
            model="smol", prompt=ENDLESS, max_tokens=n, temperature=0, stream=True,
            extra_headers={"X-Session-Id": f"stream-{os.getpid()}"}) as resp:
        assert resp.headers.get(REPLICA_HEADER) in replicas
        assert resp.headers.get("content-type", "").startswith("text/event-stream")
        for chunk in resp.parse():
            if chunk.choices and chunk.choices[0].finish_reason is None:
                arrivals.append(time.monotonic() - t0)
    assert len(arrivals) == n, f"{len(arrivals)} token chunks, wanted {n}"
    first, last = arrivals[0], arrivals[-1]
    mid = (first + last) / 2
    early = sum(1 for t in arrivals if t < mid)
    print(f"\nthrough nginx: first chunk {first:.3f}s, last chunk {last:.3f}s after the "
          f"request; {early}/{n} chunks before the midpoint {mid:.3f}s", file=sys.stderr)
    # A buffering proxy hands over every chunk at once, at the end; one that
    # flushes only its first buffer delivers the rest in a lump at the end.
    assert last - first > 0.5 * last, f"first {first:.3f}s, last {last:.3f}s"
    assert early >= n // 4, f"only {early} of {n} chunks arrived before {mid:.3f}s"


def stream_request(front, method, path, headers, body=None):
    """Sends one request to nginx on a fresh connection; returns the SSE reader
    of its response (test_resume.SSE)."""
    s = socket.create_connection(("127.0.0.1", front.port), timeout=60)
    data = json.dumps(body).encode() if body is not None else b""
    h = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    if body is not None:
        h += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
    s.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\n{h}\r\n".encode() + data)
    return SSE(s)


def body_of(sse):
    """The body of a response with a Content-Length (an error), read to its end."""
    n = int(sse.headers.get("content-length", "0"))
    while len(sse.raw) < n and not sse.eof:
        sse._recv()
    sse.sock.close()
    return sse.raw[:n]


def read_events(sse, events, n=None):
    """Appends (id, data) of sse's events to events until [DONE] or n events."""
    got = 0
    for eid, data in sse.events():
        events.append((eid, data))
        got += 1
        if data == "[DONE]" or (n is not None and got >= n):
            break
    sse.sock.close()


def test_a_stream_resumes_through_the_proxy_on_the_replica_that_holds_it(cluster):
    """GET /v1/streams/{id} names no replica, and a stream lives only on the
    one that started it. Through the proxy every resume must find it: with
    Last-Event-ID, the events after that id, from that replica."""
    front, replicas = cluster
    body = {"model": "smol", "prompt": ENDLESS, "max_tokens": 24, "temperature": 0,
            "stream": True}
    # Plain streams go round robin, so they start on both replicas. The last
    # one is a session turn (X-Session-Id): its resumes carry the header too.
    sid = f"resume-{os.getpid()}"
    # Each replica sees every stream from nginx's address, one owner, which may
    # keep --max-detached (4) running streams without a client: four in all.
    starts = [{}] * 3 + [{"X-Session-Id": sid}]
    streams = []
    for headers in starts:
        sse = stream_request(front, "POST", "/v1/completions", headers,
                             dict(body, session_id=sid) if headers else body)
        assert sse.status == 200, body_of(sse)
        events = []
        read_events(sse, events, 2)  # then the connection drops
        streams.append((sse.headers["x-stream-id"], sse.headers[REPLICA_HEADER], headers,
                        events))
    assert {home for _, home, _, _ in streams} == set(replicas), streams

    # EventSource-style: reconnect from the last id seen, read two events, drop
    for stream_id, home, headers, events in streams:
        for _ in range(20):
            last = events[-1][0]
            sse = stream_request(front, "GET", f"/v1/streams/{stream_id}",
                                 {**headers, "Last-Event-ID": last})
            assert sse.status == 200, (stream_id, home, sse.status, body_of(sse),
                                       front.log("access.log")[-2000:])
            assert sse.headers[REPLICA_HEADER] == home
            assert sse.headers["x-stream-id"] == stream_id
            got = []
            read_events(sse, got, 2)
            assert got and int(got[0][0]) == int(last) + 1, (last, got)
            events += got
            if events[-1][1] == "[DONE]":
                break
        ids = [int(e) for e, _ in events]
        assert ids == list(range(1, len(ids) + 1)), ids
        assert events[-1][1] == "[DONE]"

    # nginx's log names every replica it asked: a session's resumes went
    # straight to the session's replica; the others were found by asking on
    asked = {}
    for line in front.log("access.log").splitlines():
        m = re.search(r'"GET /v1/streams/([0-9a-f]{32}) [^"]*" (\d+) .* up=(.*)$', line)
        if m:
            asked.setdefault(m.group(1), []).append(m.group(3).split(", "))
    for stream_id, home, headers, _ in streams:
        ups = asked[stream_id]
        if headers:
            assert all(len(u) == 1 for u in ups), ups
        assert all(u[-1] == f"127.0.0.1:{replicas[home].port}" for u in ups), (home, ups)
    assert any(len(u) > 1 for ups in asked.values() for u in ups), asked

    # a finished stream replays its tail, as often as it is asked for
    for stream_id, home, headers, events in streams:
        for _ in range(3):
            sse = stream_request(front, "GET", f"/v1/streams/{stream_id}",
                                 {**headers, "Last-Event-ID": events[-4][0]})
            assert sse.status == 200, (stream_id, home, sse.status, body_of(sse))
            assert sse.headers[REPLICA_HEADER] == home
            got = []
            read_events(sse, got)
            assert got == events[-3:]

    # a stream no replica holds is still 404 stream_not_found, after asking each
    sse = stream_request(front, "GET", "/v1/streams/" + "0123456789abcdef" * 2, {})
    assert sse.status == 404
    assert json.loads(body_of(sse))["error"]["code"] == "stream_not_found"


@pytest.fixture
def failover_cluster(binary, model, nginx_bin, tmp_path):
    """Two replicas sharing one --session-dir behind nginx; yields (nginx,
    {name: Server}, the directory). Replicas still alive at the end are stopped."""
    d = tmp_path / "sessions"
    d.mkdir()
    common = ["--threads", "1", "--max-seqs", "4", "--window", "64", "--drain-timeout", "5",
              "--session-dir", str(d)]
    replicas = {}
    front = None
    try:
        for name in ("f1", "f2"):
            replicas[name] = Server(binary, model, common + ["--name", name])
        front = Nginx(nginx_bin, str(tmp_path), [f"127.0.0.1:{s.port}" for s in
                                                 replicas.values()])
        yield front, replicas, d
    finally:
        if front is not None:
            front.stop()
        for s in replicas.values():
            s.stop()


def test_a_session_saved_on_a_killed_replica_continues_on_the_other(failover_cluster):
    """SIGKILL after a save: nginx's hash moves the session to the survivor,
    which restores it from the shared directory and continues it exactly as
    the dead replica would have (a twin session on the survivor, never moved,
    is the reference)."""
    front, replicas, d = failover_cluster

    sid = f"failover-{os.getpid()}"
    prompt = ("The river Thames rises in the Cotswolds and flows east through Oxford, "
              "Reading and London before it reaches the North Sea, carrying barges, "
              "rowing boats and, for centuries, most of the trade of southern England.")
    st, r = call(front, "POST", "/v1/completions",
                 {"model": "smol", "prompt": prompt, "max_tokens": 24, "temperature": 0,
                  "session_id": sid}, headers={"X-Session-Id": sid})
    assert st == 200 and r["session"]["created"], r
    owner = None
    for name, s in replicas.items():
        if call(s, "GET", f"/v1/sessions/{sid}")[0] == 200:
            owner = name
    assert owner is not None
    survivor = next(n for n in replicas if n != owner)
    st, r = call(front, "POST", f"/v1/sessions/{sid}/save", headers={"X-Session-Id": sid})
    assert st == 200 and r["on_disk"], r
    # the reference: the same two turns on the survivor, in memory throughout
    twin = sid + "-twin"
    st, _ = complete(replicas[survivor], prompt, twin, max_tokens=24)
    assert st == 200
    st, r = complete(replicas[survivor], " Its name", twin, max_tokens=16)
    ref = continuation(r)

    replicas[owner].stop(signal.SIGKILL)
    st, r = call(front, "POST", "/v1/completions",
                 {"model": "smol", "prompt": " Its name", "max_tokens": 16, "temperature": 0,
                  "logprobs": 1, "session_id": sid, "session_create": False},
                 headers={"X-Session-Id": sid})
    assert st == 200, r
    assert r["session"]["restored"] is True
    assert continuation(r) == ref
    assert call(replicas[survivor], "GET", f"/v1/sessions/{sid}")[1]["in_memory"] is True
