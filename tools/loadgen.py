#!/usr/bin/env python3
"""loadgen.py: a load generator for OpenAI-compatible streaming servers.

N concurrent long sessions, each a stream of M generated tokens over one or
several streamed requests, against any OpenAI-compatible base URL (streamsink,
llama-server, vLLM). Sessions start all at once and run back to back (closed
loop), or arrive at a fixed rate (open loop). Measures time to first token,
inter-token latency (p50/p90/p99), aggregate tokens/s and errors; where the
server is streamsink it also scrapes /metrics for the KV and eviction figures.
Writes a JSON report and a PNG (latency over time and over the position in the
session; `plot` overlays several reports, one line per label, e.g. per policy).

    tools/loadgen.py run --base-url http://127.0.0.1:8080/v1 --sessions 8 \\
        --tokens 4096 --requests-per-session 4 --label sinks:4 --json out.json --png out.png
    tools/loadgen.py plot --png all.png window.json sinks4.json dense.json

Only the standard library is needed to run (asyncio and raw HTTP/1.1, one
connection per request); the PNG needs matplotlib (scripts/requirements-tools.txt).

Sessions: against streamsink (detected from its X-Streamsink-Replica header
or its /metrics) the requests of a session carry the same session_id (body)
and X-Session-Id (header), so each follow-up sends only its new text and the
server continues the session's KV window. Against other servers
(--session-mode resend) each follow-up resends the whole text so far.

Bounds: every run stops after --time-limit seconds and --max-requests
requests, whatever is left is cancelled and counted. Only loopback addresses
are accepted unless --allow-remote is given.
"""

import argparse
import asyncio
import ipaddress
import json
import math
import os
import random
import socket
import ssl
import sys
import time
import urllib.parse

DEFAULT_PROMPT = "Count from 1 to 100000, separated by commas: 1, 2, 3, 4, 5,"
DEFAULT_CHAT = "Count from 1 to 100000, separated by commas."
FOLLOW_PROMPT = ","
FOLLOW_CHAT = "Continue counting from where you stopped."


# ---- small statistics ------------------------------------------------------------------------

def percentile(xs, q):
    """Linear-interpolated percentile of a list (q in [0, 100]); None when empty."""
    if not xs:
        return None
    s = sorted(xs)
    if len(s) == 1:
        return s[0]
    k = (len(s) - 1) * q / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def dist(xs):
    if not xs:
        return {"n": 0}
    return {"n": len(xs), "mean": sum(xs) / len(xs), "p50": percentile(xs, 50),
            "p90": percentile(xs, 90), "p99": percentile(xs, 99), "max": max(xs)}


# ---- raw HTTP/1.1 ----------------------------------------------------------------------------

class Target:
    def __init__(self, base_url):
        u = urllib.parse.urlsplit(base_url)
        if u.scheme not in ("http", "https"):
            raise ValueError(f"base URL must be http:// or https://, got {base_url!r}")
        self.scheme = u.scheme
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.prefix = u.path.rstrip("/")  # e.g. /v1
        self.hostport = u.netloc

    def is_loopback(self):
        try:
            infos = socket.getaddrinfo(self.host, self.port, proto=socket.IPPROTO_TCP)
        except OSError:
            return False
        return all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


class HTTPResponse:
    def __init__(self, status, headers, reader, writer):
        self.status = status
        self.headers = headers
        self.reader = reader
        self.writer = writer

    async def chunks(self):
        """Yields body bytes as they arrive (chunked, Content-Length or until close)."""
        r = self.reader
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                line = await r.readline()
                if not line:
                    raise ConnectionError("connection closed inside a chunked body")
                n = int(line.split(b";")[0].strip() or b"0", 16)
                if n == 0:
                    await r.readline()
                    return
                data = await r.readexactly(n)
                await r.readexactly(2)
                yield data
        elif "content-length" in self.headers:
            left = int(self.headers["content-length"])
            while left > 0:
                data = await r.read(min(left, 65536))
                if not data:
                    raise ConnectionError("connection closed before Content-Length bytes")
                left -= len(data)
                yield data
        else:
            while True:
                data = await r.read(65536)
                if not data:
                    return
                yield data

    async def body(self):
        out = b""
        async for c in self.chunks():
            out += c
        return out

    def close(self):
        try:
            self.writer.close()
        except Exception:
            pass


async def http_request(t, method, path, headers=None, body=None, connect_timeout=10.0):
    ctx = ssl.create_default_context() if t.scheme == "https" else None
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(t.host, t.port, ssl=ctx, limit=1 << 20), connect_timeout)
    h = {"Host": t.hostport, "Connection": "close", "User-Agent": "streamsink-loadgen/1"}
    if body is not None:
        h["Content-Type"] = "application/json"
        h["Content-Length"] = str(len(body))
    h.update(headers or {})
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items())
    writer.write(head.encode("latin-1") + b"\r\n" + (body or b""))
    await writer.drain()
    status_line = await reader.readline()
    parts = status_line.decode("latin-1").split(None, 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/"):
        writer.close()
        raise ConnectionError(f"bad status line {status_line[:80]!r}")
    status = int(parts[1])
    rh = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        k, _, v = line.decode("latin-1").partition(":")
        rh[k.strip().lower()] = v.strip()
    return HTTPResponse(status, rh, reader, writer)


def sse_events(buf):
    """Splits complete SSE events off buf: (list of data strings, rest of buf).
    Comments (': keep-alive') are dropped."""
    out = []
    buf = buf.replace(b"\r\n", b"\n")
    while True:
        i = buf.find(b"\n\n")
        if i < 0:
            return out, buf
        event, buf = buf[:i], buf[i + 2:]
        data = [ln[5:].lstrip(b" ") for ln in event.split(b"\n") if ln.startswith(b"data:")]
        if data:
            out.append(b"\n".join(data).decode("utf-8", "replace"))


# ---- the run ---------------------------------------------------------------------------------

class Run:
    def __init__(self, args, target):
        self.a = args
        self.t = target
        self.t0 = None
        self.requests = []     # one dict per finished (or failed) request
        self.tokens = []       # (t since start, itl or None, position in session, session)
        self.errors = {}
        self.sessions_started = 0
        self.sessions_done = 0
        self.sessions_failed = 0
        self.active = 0
        self.n_requests = 0
        self.n_tokens = 0
        self.metrics_series = []
        self.streamsink = False
        self.replicas = {}
        self.stop = False

    def now(self):
        return time.perf_counter() - self.t0

    def error(self, kind):
        self.errors[kind] = self.errors.get(kind, 0) + 1

    # -- one request ---------------------------------------------------------------------------

    def body_for(self, sess, k, budget):
        a = self.a
        body = {"model": a.model, "max_tokens": budget, "stream": True,
                "stream_options": {"include_usage": True}, "temperature": a.temperature}
        if a.seed is not None:
            body["seed"] = a.seed + sess["index"]
        if a.ignore_eos:
            body["ignore_eos"] = True
            # past the end the model writes control tokens too: shown, each
            # makes a chunk, so chunks still count tokens (vLLM's name)
            body["skip_special_tokens"] = False
        if a.kv_policy:
            body["kv_policy"] = a.kv_policy
        sessions = a.session_mode == "streamsink"
        if sessions:
            body["session_id"] = sess["id"]
        if a.endpoint == "chat":
            if sessions:
                text = (a.prompt or DEFAULT_CHAT) if k == 0 else (a.follow_prompt or FOLLOW_CHAT)
                body["messages"] = [{"role": "user", "content": text}]
            else:
                if k > 0:
                    sess["messages"].append({"role": "user",
                                             "content": a.follow_prompt or FOLLOW_CHAT})
                body["messages"] = list(sess["messages"])
        else:
            if sessions:
                body["prompt"] = (a.prompt or DEFAULT_PROMPT) if k == 0 else (
                    a.follow_prompt or FOLLOW_PROMPT)
            else:
                if k > 0:
                    sess["text"] += a.follow_prompt or FOLLOW_PROMPT
                body["prompt"] = sess["text"]
        return body

    async def request(self, sess, k, budget):
        a = self.a
        path = self.t.prefix + ("/chat/completions" if a.endpoint == "chat" else "/completions")
        body = self.body_for(sess, k, budget)
        headers = {"Accept": "text/event-stream"}
        if a.api_key:
            headers["Authorization"] = f"Bearer {a.api_key}"
        if a.session_mode == "streamsink":
            headers["X-Session-Id"] = sess["id"]
        rec = {"session": sess["index"], "k": k, "budget": budget, "t_send": self.now(),
               "ttft": None, "chunks": 0, "tokens": 0, "finish": None, "error": None}
        self.n_requests += 1
        resp = None
        text = []
        try:
            resp = await http_request(self.t, "POST", path, headers, json.dumps(body).encode())
            rep = resp.headers.get("x-streamsink-replica")
            if rep:
                self.streamsink = True
                self.replicas[rep] = self.replicas.get(rep, 0) + 1
                rec["replica"] = rep
            if resp.status != 200:
                msg = (await resp.body())[:300].decode("utf-8", "replace")
                rec["error"] = f"http {resp.status}"
                rec["message"] = msg
                self.error(f"http {resp.status}")
                return rec, ""
            buf = b""
            last = None
            done = False
            usage = None
            async for data in resp.chunks():
                buf += data
                events, buf = sse_events(buf)
                for ev in events:
                    if ev == "[DONE]":
                        done = True
                        continue
                    try:
                        obj = json.loads(ev)
                    except ValueError:
                        self.error("bad SSE json")
                        continue
                    if "error" in obj and obj.get("error"):
                        rec["error"] = "stream error"
                        rec["message"] = str(obj["error"].get("message", ""))[:300]
                        self.error("stream error frame")
                        continue
                    if obj.get("usage"):
                        usage = obj["usage"]
                    for ch in obj.get("choices") or []:
                        if ch.get("finish_reason"):
                            rec["finish"] = ch["finish_reason"]
                        if "text" in ch:
                            piece = ch["text"]
                        else:
                            delta = ch.get("delta") or {}
                            piece = delta.get("content")
                            if not piece and "role" in delta:
                                piece = None  # the role-only opening chunk of a chat
                        if piece is None or (ch.get("finish_reason") and not piece):
                            continue  # not a token: a role chunk or the closing chunk
                        tnow = self.now()
                        if rec["ttft"] is None:
                            rec["ttft"] = tnow - rec["t_send"]
                            itl = None
                        else:
                            itl = tnow - last
                        last = tnow
                        rec["chunks"] += 1
                        self.n_tokens += 1
                        self.tokens.append((tnow, itl, sess["generated"] + rec["chunks"] - 1,
                                            sess["index"]))
                        text.append(piece or "")
            rec["tokens"] = usage["completion_tokens"] if usage else rec["chunks"]
            if usage:
                rec["prompt_tokens"] = usage.get("prompt_tokens")
            if not done and rec["error"] is None:
                rec["error"] = "no [DONE]"
                self.error("stream ended without [DONE]")
        except asyncio.CancelledError:
            rec["error"] = "cancelled"
            raise
        except asyncio.TimeoutError:
            rec["error"] = "timeout"
            self.error("timeout")
        except (OSError, ConnectionError, asyncio.IncompleteReadError, ValueError) as e:
            rec["error"] = f"{type(e).__name__}: {e}"[:200]
            self.error(f"connection: {type(e).__name__}")
        finally:
            rec["t_end"] = self.now()
            self.requests.append(rec)
            if resp is not None:
                resp.close()
        return rec, "".join(text)

    # -- one session ---------------------------------------------------------------------------

    async def session(self, index):
        a = self.a
        sess = {"index": index, "id": f"{a.session_prefix}-{os.getpid()}-{index}",
                "generated": 0, "text": a.prompt or DEFAULT_PROMPT,
                "messages": [{"role": "user", "content": a.prompt or DEFAULT_CHAT}]}
        self.sessions_started += 1
        self.active += 1
        per = max(1, math.ceil(a.tokens / a.requests_per_session))
        k = 0
        ok = False
        try:
            while sess["generated"] < a.tokens and not self.stop:
                if k >= a.requests_per_session + a.extra_requests:
                    self.error("session short: model kept stopping")
                    break
                if self.n_requests >= a.max_requests:
                    self.stop = True
                    self.error("max requests")
                    break
                budget = min(per, a.tokens - sess["generated"])
                rec, text = await asyncio.wait_for(self.request(sess, k, budget),
                                                   a.request_timeout)
                if rec["error"]:
                    break
                sess["generated"] += rec["tokens"]
                if a.session_mode != "streamsink":
                    if a.endpoint == "chat":
                        sess["messages"].append({"role": "assistant", "content": text})
                    else:
                        sess["text"] += text
                k += 1
            ok = sess["generated"] >= a.tokens
        except asyncio.TimeoutError:
            self.error("timeout")
        finally:
            self.active -= 1
            if ok:
                self.sessions_done += 1
            else:
                self.sessions_failed += 1

    # -- arrival ---------------------------------------------------------------------------------

    async def closed_loop(self):
        a = self.a
        nxt = iter(range(a.total_sessions))

        async def worker():
            for i in nxt:
                if self.stop:
                    return
                await self.session(i)

        await asyncio.gather(*(worker() for _ in range(a.sessions)))

    async def open_loop(self):
        a = self.a
        sem = asyncio.Semaphore(a.sessions)
        tasks = []
        rng = random.Random(a.seed or 0)

        async def one(i):
            async with sem:
                await self.session(i)

        t_next = 0.0
        for i in range(a.total_sessions):
            if self.stop:
                break
            delay = t_next - self.now()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i)))
            t_next += rng.expovariate(a.rate) if a.poisson else 1.0 / a.rate
        await asyncio.gather(*tasks)

    # -- /metrics ----------------------------------------------------------------------------------

    async def scrape(self):
        try:
            r = await asyncio.wait_for(http_request(self.t, "GET", "/metrics"), 5)
            try:
                body = await asyncio.wait_for(r.body(), 5)
            finally:
                r.close()
        except (OSError, ConnectionError, asyncio.TimeoutError, ValueError):
            return None
        if r.status != 200 or b"streamsink_" not in body:
            return None
        out = {}
        for line in body.decode("utf-8", "replace").splitlines():
            if not line or line.startswith("#"):
                continue
            name, _, value = line.rpartition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                pass
        return out

    async def sampler(self):
        while True:
            await asyncio.sleep(self.a.metrics_interval)
            m = await self.scrape()
            if m is not None:
                keep = {k: v for k, v in m.items() if k.startswith((
                    "streamsink_kv_", "streamsink_active_sequences", "streamsink_queued_requests",
                    "streamsink_sessions", "streamsink_paused_sequences",
                    "streamsink_generated_tokens_total"))}
                self.metrics_series.append({"t": self.now(), **keep})

    # -- progress line -------------------------------------------------------------------------------

    def progress_line(self):
        el = self.now()
        itls = [x[1] for x in self.tokens[-2000:] if x[1] is not None]
        p50 = percentile(itls, 50)
        p99 = percentile(itls, 99)
        ttfts = [r["ttft"] for r in self.requests[-200:] if r["ttft"] is not None]
        t50 = percentile(ttfts, 50)
        return (f"[{el:7.1f}s] sessions {self.sessions_done + self.sessions_failed}/"
                f"{self.a.total_sessions} done, {self.active} active | req {self.n_requests} | "
                f"tok {self.n_tokens} ({self.n_tokens / el if el > 0 else 0:.1f}/s) | "
                f"ttft p50 {'-' if t50 is None else f'{t50:.2f}s'} | itl p50 "
                f"{'-' if p50 is None else f'{p50 * 1e3:.0f}ms'} p99 "
                f"{'-' if p99 is None else f'{p99 * 1e3:.0f}ms'} | err "
                f"{sum(self.errors.values())}")

    async def progress(self):
        tty = sys.stderr.isatty()
        period = 0.5 if tty else 10.0
        while True:
            await asyncio.sleep(period)
            line = self.progress_line()
            if tty:
                sys.stderr.write("\r" + line[:200].ljust(120))
            else:
                sys.stderr.write(line + "\n")
            sys.stderr.flush()

    # -- main ----------------------------------------------------------------------------------------

    async def main(self):
        a = self.a
        self.t0 = time.perf_counter()
        before = await self.scrape() if a.metrics else None
        if before is not None:
            self.streamsink = True
        if a.session_mode == "auto":
            a.session_mode = "streamsink" if (before is not None or await self.probe()) \
                else "resend"
        if a.ignore_eos and a.session_mode == "streamsink":
            raise SystemExit("loadgen: --ignore-eos cannot be used on streamsink sessions (the "
                             "server refuses it there: what the model writes past its answer "
                             "would stay in the session); use --session-mode resend")
        bg = []
        if not a.quiet:
            bg.append(asyncio.create_task(self.progress()))
        if before is not None:
            bg.append(asyncio.create_task(self.sampler()))
        self.t0 = time.perf_counter()
        body = self.open_loop() if a.arrival == "rate" else self.closed_loop()
        timed_out = False
        try:
            await asyncio.wait_for(body, a.time_limit)
        except asyncio.TimeoutError:
            timed_out = True
            self.error("time limit")
        wall = self.now()
        for t in bg:
            t.cancel()
        await asyncio.gather(*bg, return_exceptions=True)
        if not a.quiet:
            sys.stderr.write(("\r" if sys.stderr.isatty() else "") + self.progress_line() + "\n")
        after = await self.scrape() if before is not None else None
        return self.report(wall, timed_out, before, after)

    async def probe(self):
        """True when the server names itself as streamsink (X-Streamsink-Replica)."""
        try:
            r = await asyncio.wait_for(http_request(self.t, "GET", self.t.prefix + "/models"), 5)
            r.close()
            return "x-streamsink-replica" in r.headers
        except (OSError, ConnectionError, asyncio.TimeoutError, ValueError):
            return False

    def report(self, wall, timed_out, before, after):
        a = self.a
        ok = [r for r in self.requests if not r["error"]]
        ttft = [r["ttft"] for r in ok if r["ttft"] is not None]
        ttft_first = [r["ttft"] for r in ok if r["ttft"] is not None and r["k"] == 0]
        itl = [x[1] for x in self.tokens if x[1] is not None]
        gen = sum(r["tokens"] for r in self.requests)
        t_first = min((r["t_send"] for r in self.requests), default=0.0)
        t_last = max((r["t_end"] for r in self.requests), default=0.0)
        span = max(t_last - t_first, 1e-9)
        # time series: per second, tokens and ITL quantiles
        series = {}
        for t, d, _, _ in self.tokens:
            b = series.setdefault(int(t), [])
            if d is not None:
                b.append(d)
        counts = {}
        for t, _, _, _ in self.tokens:
            counts[int(t)] = counts.get(int(t), 0) + 1
        over_time = [{"t": s, "tokens": counts.get(s, 0), "itl_p50": percentile(series[s], 50),
                      "itl_p99": percentile(series[s], 99)} for s in sorted(series)]
        # by position in the session (the dense-vs-window picture), buckets of pos_bucket
        bypos = {}
        for _, d, pos, _ in self.tokens:
            if d is not None:
                bypos.setdefault(pos // a.pos_bucket, []).append(d)
        over_position = [{"pos": b * a.pos_bucket, "itl_p50": percentile(v, 50),
                          "itl_p99": percentile(v, 99), "n": len(v)}
                         for b, v in sorted(bypos.items())]
        out = {
            "label": a.label,
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "host": {"hostname": socket.gethostname(), "cpus": os.cpu_count()},
            "config": {k: v for k, v in vars(a).items() if k not in ("api_key", "func")},
            "server": {"streamsink": self.streamsink, "replicas": self.replicas},
            "wall_s": wall,
            "timed_out": timed_out,
            "sessions": {"total": a.total_sessions, "started": self.sessions_started,
                         "completed": self.sessions_done, "failed": self.sessions_failed},
            "requests": {"total": len(self.requests), "ok": len(ok),
                         "failed": len(self.requests) - len(ok)},
            "errors": self.errors,
            "tokens": {"generated": gen, "chunks": len(self.tokens),
                       "per_s": gen / span, "span_s": span},
            "ttft_s": dist(ttft),
            "ttft_first_request_s": dist(ttft_first),
            "itl_s": dist(itl),
            "over_time": over_time,
            "over_position": over_position,
            "request_log": self.requests if a.keep_requests else [],
        }
        if before is not None and after is not None:
            out["metrics"] = metrics_summary(before, after, self.metrics_series)
        return out


def metrics_summary(before, after, series):
    def delta(prefix):
        return {k: after[k] - before.get(k, 0.0) for k in after if k.startswith(prefix)}

    def peak(name):
        vals = [s.get(name) for s in series if s.get(name) is not None]
        return max(vals) if vals else after.get(name)

    def mean_of(h):
        c = after.get(h + "_count", 0) - before.get(h + "_count", 0)
        s = after.get(h + "_sum", 0) - before.get(h + "_sum", 0)
        return s / c if c > 0 else None

    evicted = delta("streamsink_kv_evicted_tokens_total")
    return {
        "kv_bytes": after.get("streamsink_kv_bytes"),
        "kv_slots_total": after.get("streamsink_kv_slots_total"),
        "kv_slots_used_peak": peak("streamsink_kv_slots_used"),
        "active_sequences_peak": peak("streamsink_active_sequences"),
        "queued_requests_peak": peak("streamsink_queued_requests"),
        "kv_window_tokens": after.get("streamsink_kv_window_tokens"),
        "evicted_tokens": {k.partition("{")[2].rstrip("}") or "all": v
                           for k, v in evicted.items()},
        "generated_tokens": after.get("streamsink_generated_tokens_total", 0)
        - before.get("streamsink_generated_tokens_total", 0),
        "prompt_tokens": after.get("streamsink_prompt_tokens_total", 0)
        - before.get("streamsink_prompt_tokens_total", 0),
        "engine_steps": after.get("streamsink_engine_steps_total", 0)
        - before.get("streamsink_engine_steps_total", 0),
        "server_ttft_mean_s": mean_of("streamsink_time_to_first_token_seconds"),
        "server_itl_mean_s": mean_of("streamsink_inter_token_latency_seconds"),
        "model": [k for k in after if k.startswith("streamsink_model_info")],
        "series": series,
    }


# ---- plot --------------------------------------------------------------------------------------

def plot(reports, png, title=None):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.stderr.write("loadgen: matplotlib is missing (pip install -r "
                         "scripts/requirements-tools.txt); no PNG written\n")
        return False
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    for i, r in enumerate(reports):
        color = f"C{i}"
        label = r.get("label") or f"run {i}"
        ot = [p for p in r["over_time"] if p["itl_p50"] is not None]
        ax1.plot([p["t"] for p in ot], [p["itl_p50"] * 1e3 for p in ot], color=color,
                 label=f"{label} p50")
        ax1.plot([p["t"] for p in ot], [p["itl_p99"] * 1e3 for p in ot], color=color,
                 linestyle=":", label=f"{label} p99")
        op = [p for p in r["over_position"] if p["itl_p50"] is not None]
        ax2.plot([p["pos"] for p in op], [p["itl_p50"] * 1e3 for p in op], color=color,
                 label=f"{label} p50")
        ax2.plot([p["pos"] for p in op], [p["itl_p99"] * 1e3 for p in op], color=color,
                 linestyle=":", label=f"{label} p99")
    ax1.set_xlabel("time since start (s)")
    ax1.set_ylabel("inter-token latency (ms)")
    ax1.set_title("latency over time")
    ax2.set_xlabel("generated tokens so far in the session")
    ax2.set_ylabel("inter-token latency (ms)")
    ax2.set_title("latency over the session")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return True


# ---- command line ------------------------------------------------------------------------------

def summary_text(r):
    def ms(d, k):
        v = d.get(k)
        return "-" if v is None else f"{v * 1e3:.1f}"

    lines = [
        f"label {r['label'] or '-'}: {r['sessions']['completed']}/{r['sessions']['total']} sessions "
        f"completed, {r['requests']['total']} requests, {r['tokens']['generated']} tokens in "
        f"{r['tokens']['span_s']:.1f}s = {r['tokens']['per_s']:.1f} tok/s",
        f"  TTFT ms   p50 {ms(r['ttft_s'], 'p50')}  p90 {ms(r['ttft_s'], 'p90')}  "
        f"p99 {ms(r['ttft_s'], 'p99')}  (first requests p50 {ms(r['ttft_first_request_s'], 'p50')})",
        f"  ITL ms    p50 {ms(r['itl_s'], 'p50')}  p90 {ms(r['itl_s'], 'p90')}  "
        f"p99 {ms(r['itl_s'], 'p99')}  max {ms(r['itl_s'], 'max')}",
        f"  errors    {r['errors'] or 'none'}",
    ]
    m = r.get("metrics")
    if m:
        lines.append(f"  server    kv {m['kv_bytes'] / 2**20 if m['kv_bytes'] else 0:.0f} MiB, "
                     f"slots used peak {m['kv_slots_used_peak']}/{m['kv_slots_total']}, "
                     f"window {m['kv_window_tokens']}, evicted {m['evicted_tokens']}, "
                     f"steps {m['engine_steps']:.0f}")
    return "\n".join(lines)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="loadgen.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run a load test")
    r.add_argument("--base-url", default="http://127.0.0.1:8080/v1",
                   help="OpenAI base URL, with /v1 (default %(default)s)")
    r.add_argument("--sessions", "-n", type=int, default=4,
                   help="concurrent sessions (closed loop) or the concurrency cap (rate)")
    r.add_argument("--total-sessions", type=int, default=None,
                   help="sessions in the whole run (default: --sessions)")
    r.add_argument("--tokens", "-m", type=int, default=256, help="generated tokens per session")
    r.add_argument("--requests-per-session", type=int, default=1,
                   help="streamed requests the tokens of a session are split over")
    r.add_argument("--extra-requests", type=int, default=8,
                   help="further requests allowed when the model stops early")
    r.add_argument("--arrival", choices=("closed", "rate"), default="closed")
    r.add_argument("--rate", type=float, default=1.0, help="sessions per second (--arrival rate)")
    r.add_argument("--poisson", action="store_true", help="exponential gaps between arrivals")
    r.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    r.add_argument("--model", default=None,
                   help="the request's model field (default: the first id of GET BASE/models)")
    r.add_argument("--prompt", default=None, help="first prompt of each session")
    r.add_argument("--follow-prompt", default=None, help="prompt of each follow-up request")
    r.add_argument("--temperature", type=float, default=0.0)
    r.add_argument("--seed", type=int, default=None)
    r.add_argument("--ignore-eos", action="store_true",
                   help="send ignore_eos (vLLM/llama-server extension)")
    r.add_argument("--kv-policy", default=None, help="send kv_policy per request (streamsink)")
    r.add_argument("--session-mode", choices=("auto", "streamsink", "resend"), default="auto",
                   help="session_id + X-Session-Id (streamsink) or resend the text (others)")
    r.add_argument("--session-prefix", default="loadgen")
    r.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", ""))
    r.add_argument("--time-limit", type=float, default=900.0, help="seconds for the whole run")
    r.add_argument("--request-timeout", type=float, default=900.0, help="seconds per request")
    r.add_argument("--max-requests", type=int, default=10000)
    r.add_argument("--no-metrics", dest="metrics", action="store_false",
                   help="do not scrape /metrics")
    r.add_argument("--metrics-interval", type=float, default=2.0)
    r.add_argument("--pos-bucket", type=int, default=64,
                   help="tokens per bucket of the latency-over-position series")
    r.add_argument("--label", default="", help="name of this run in plots (e.g. the policy)")
    r.add_argument("--json", default=None, help="write the report here")
    r.add_argument("--png", default=None, help="write the plot here")
    r.add_argument("--keep-requests", action="store_true", help="put every request in the JSON")
    r.add_argument("--allow-remote", action="store_true", help="allow a non-loopback server")
    r.add_argument("--quiet", "-q", action="store_true", help="no progress line")
    pl = sub.add_parser("plot", help="overlay several JSON reports in one PNG")
    pl.add_argument("--png", required=True)
    pl.add_argument("--title", default=None)
    pl.add_argument("reports", nargs="+")
    a = p.parse_args(argv)
    if a.cmd == "run":
        if a.total_sessions is None:
            a.total_sessions = a.sessions
        for name in ("sessions", "total_sessions", "tokens", "requests_per_session"):
            if getattr(a, name) < 1:
                p.error(f"--{name.replace('_', '-')} must be at least 1")
        if a.rate <= 0:
            p.error("--rate must be positive")
    return a


def first_model_id(a):
    """The first model the server lists (servers refuse names they do not serve)."""
    import urllib.request
    req = urllib.request.Request(a.base_url.rstrip("/") + "/models")  # the base ends in /v1
    if a.api_key:
        req.add_header("Authorization", f"Bearer {a.api_key}")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.load(r)["data"][0]["id"]
    except Exception as e:  # noqa: BLE001 - any failure: fall back to a placeholder
        sys.stderr.write(f"loadgen: GET /v1/models failed ({e}); sending model 'default'\n")
        return "default"


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    if a.cmd == "plot":
        reports = []
        for path in a.reports:
            with open(path) as f:
                reports.append(json.load(f))
        return 0 if plot(reports, a.png, a.title) else 1
    try:
        target = Target(a.base_url)
    except ValueError as e:
        sys.stderr.write(f"loadgen: {e}\n")
        return 2
    if not a.allow_remote and not target.is_loopback():
        sys.stderr.write(f"loadgen: {target.host} is not a loopback address; pass --allow-remote "
                         "to load a remote server\n")
        return 2
    if a.model is None:
        a.model = first_model_id(a)
    run = Run(a, target)
    try:
        report = asyncio.run(run.main())
    except KeyboardInterrupt:
        sys.stderr.write("\nloadgen: interrupted\n")
        return 130
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    if a.png:
        plot([report], a.png, a.label or None)
    print(summary_text(report))
    return 0 if report["requests"]["ok"] > 0 and not report["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
