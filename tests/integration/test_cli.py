"""The command-line front end (cmd/): what a command allocates for the flags
it is given, its exit codes and messages, the files it writes, and the
checks serve makes on its settings before it loads the model.

Memory is bounded with RLIMIT_AS in the child rather than measured: a step
sized by a flag instead of what the step can use asks for gigabytes and
fails under the limit, a right-sized one runs."""

import json
import os
import queue
import re
import resource
import signal
import subprocess
import threading
import time

import pytest

from test_model_files import byte_vocab, write_llama

GiB = 1 << 30


def limited(nbytes):
    def pre():
        resource.setrlimit(resource.RLIMIT_AS, (nbytes, nbytes))
    return pre


def cli(binary, *args, timeout=300, **kw):
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=timeout, **kw)


def serve_until_listening(binary, args, timeout=90, preexec_fn=None):
    """Starts `serve --port 0 ARGS`. Returns (exit code, log) when it exits on
    its own, or (None, log) once it listens (it is then stopped). A server
    that does neither within timeout fails the test."""
    p = subprocess.Popen([binary, "serve", "--port", "0", *args], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, errors="replace",
                         preexec_fn=preexec_fn)
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(l) for l in p.stderr] + [lines.put(None)],
                     daemon=True).start()
    log = []
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            p.kill()
            p.wait()
            raise AssertionError("serve neither listened nor exited:\n" + "".join(log))
        if line is None:
            return p.wait(60), "".join(log)  # its stderr closed: it is exiting
        log.append(line)
        if "listening on http://" in line:
            p.terminate()
            p.wait(60)
            return None, "".join(log)


def write_text(tmp_path, text, name="text.txt"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# ---- what a step allocates ---------------------------------------------------------------

def test_run_and_perplexity_size_their_step_by_what_it_can_use(binary, model, tmp_path):
    """--chunk and a recompute --window sized the step's buffers as given:
    `run -p hi --chunk 20000` asked for about 5 GB for a one-token prompt,
    `perplexity --policy recompute --window 100000` for about 20 GB for a
    two-token text (failed before: out of memory under a 3 GiB limit)."""
    two = write_text(tmp_path, "Hello world")
    r = cli(binary, "run", "-m", model, "-p", "hi", "-n", "1", "--chunk", "20000",
            preexec_fn=limited(3 * GiB))
    assert r.returncode == 0, r.stderr
    r = cli(binary, "perplexity", "-m", model, "--text", two, "--policy", "recompute",
            "--window", "100000", "--no-progress", preexec_fn=limited(3 * GiB))
    assert r.returncode == 0, r.stderr
    assert re.search(r"tokens\s+1 scored", r.stdout), r.stdout


def test_serve_caps_its_step_at_the_slots_and_the_context(binary, model):
    """A step holds at most one chunk per slot, and a chunk at most the
    model's context (8192 for SmolLM2): --max-step-tokens 1000000 with 8
    slots of 256, and --chunk 65536 on one slot, sized buffers for a million
    and 65,536 tokens (failed before: out of memory under the limit)."""
    code, log = serve_until_listening(binary, ["-m", model, "--max-step-tokens", "1000000"],
                                      preexec_fn=limited(4 * GiB))
    assert code is None, log
    code, log = serve_until_listening(
        binary, ["-m", model, "--max-seqs", "1", "--chunk", "65536", "--max-step-tokens", "65536"],
        preexec_fn=limited(5 * GiB))
    assert code is None, log


# ---- perplexity ----------------------------------------------------------------------------

def test_perplexity_with_no_token_to_score_is_a_usage_error(binary, model, tmp_path):
    """dense with --window 1 scores nothing: it printed `perplexity -nan`,
    wrote it to --json (not JSON) and exited 0."""
    two = write_text(tmp_path, "Hello world")
    out = tmp_path / "p.json"
    r = cli(binary, "perplexity", "-m", model, "--text", two, "--policy", "dense", "--window",
            "1", "--json", str(out), "--no-progress")
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "--window 1 scores no token" in r.stderr, r.stderr
    assert "nan" not in r.stdout
    assert not out.exists()


def test_perplexity_dense_note_names_the_window_flag(binary, model, tmp_path):
    """Where --window stops dense, the note says so; it blamed the model's
    context."""
    text = write_text(tmp_path, "The quick brown fox jumps over the lazy dog. " * 4)
    r = cli(binary, "perplexity", "-m", model, "--text", text, "--policy", "dense", "--window",
            "4", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert "dense stops at --window 4: scoring 3 of" in r.stderr, r.stderr
    assert "model's context" not in r.stderr


def test_perplexity_json_escapes_the_model_name(binary, tmp_path):
    """general.name is the file's to choose; it went into --json unescaped."""
    name = 'a "quoted" back\\slash\nnew\tline \x01 caf\u00e9'
    tokens, bos = byte_vocab()
    m = str(tmp_path / "named.gguf")
    write_llama(m, 64, 1, tokens, bos, name=name)
    text = write_text(tmp_path, "hello there, general kenobi")
    out = tmp_path / "p.json"
    r = cli(binary, "perplexity", "-m", m, "--text", text, "--json", str(out), "--no-progress")
    assert r.returncode == 0, r.stderr
    with open(out, encoding="utf-8") as f:
        doc = json.load(f)
    assert doc["model"] == name
    assert doc["tokens"] == len(doc["nll"]) > 0


def test_perplexity_sinks_and_another_policy_conflict(binary, model, tmp_path):
    """--sinks N is --policy sinks:N: with --policy dense it silently became
    sinks:4. The same policy twice is fine."""
    text = write_text(tmp_path, "Hello world, hello again")
    r = cli(binary, "perplexity", "-m", model, "--text", text, "--policy", "dense", "--sinks",
            "4", "--no-progress")
    assert r.returncode == 2, (r.returncode, r.stdout)
    assert "--sinks 4 means --policy sinks:4, but --policy is 'dense'" in r.stderr, r.stderr
    r = cli(binary, "perplexity", "-m", model, "--text", text, "--policy", "sinks:4", "--sinks",
            "4", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert re.search(r"policy\s+sinks:4", r.stdout), r.stdout


# ---- output that never arrived ---------------------------------------------------------------

def test_write_errors_are_exit_1_with_a_message(binary, model, tmp_path):
    """/dev/full takes nothing: each of these exited 0 (calibrate exited 1
    silently and said it wrote the file)."""
    text = write_text(tmp_path, "Hello world, hello again")
    probe_text = open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md")).read()
    long_text = write_text(tmp_path, probe_text, "long.txt")
    cases = [
        (["perplexity", "-m", model, "--text", text, "--json", "/dev/full", "--no-progress"],
         None, "error: writing /dev/full: No space left on device"),
        (["probe", "-m", model, "--json", "/dev/full"], None,
         "error: writing /dev/full: No space left on device"),
        (["calibrate", "-m", model, "--text", long_text, "--out", "/dev/full", "--tokens", "80"],
         None,
         "error: writing /dev/full: No space left on device"),
        (["run", "-m", model, "-p", "hi", "-n", "4"], "/dev/full",
         "error: writing standard output: No space left on device"),
        (["perplexity", "-m", model, "--text", text, "--no-progress"], "/dev/full",
         "error: writing standard output: No space left on device"),
    ]
    for args, stdout, msg in cases:
        if stdout:
            with open(stdout, "w") as so:
                r = subprocess.run([binary, *args], stdout=so, stderr=subprocess.PIPE, text=True,
                                   timeout=300)
        else:
            r = cli(binary, *args)
        assert r.returncode == 1, (args, r.returncode, r.stderr)
        assert msg in r.stderr, (args, r.stderr)
        if args[0] == "calibrate":
            assert "wrote" not in r.stdout, r.stdout


def test_a_stdout_closed_from_the_start_is_no_failure(binary, model):
    """`serve ... >&-`: the first socket took descriptor 1, and libuv's
    close of it asserted at the exit (SIGABRT after "bye"). Closed standard
    descriptors are /dev/null from the start: a clean exit is 0, and `run`'s
    output goes where its caller sent it."""
    closed = dict(stdout=None, preexec_fn=lambda: os.close(1))
    p = subprocess.Popen([binary, "serve", "-m", model, "--port", "0"], stderr=subprocess.PIPE,
                         text=True, errors="replace", **closed)
    for line in p.stderr:
        if "listening on http://" in line:
            p.send_signal(signal.SIGTERM)
            break
    p.stderr.read()
    assert p.wait(60) == 0
    r = subprocess.run([binary, "run", "-m", model, "-p", "hi", "-n", "2"], stderr=subprocess.PIPE,
                       text=True, timeout=120, **closed)
    assert r.returncode == 0, r.stderr


# ---- run ----------------------------------------------------------------------------------------

def test_run_counts_every_decode_step(binary, model):
    """-n 5 samples 5 tokens: the prompt's step gives the first, 4 decode
    steps the rest (it said 3: the loop left before counting the last)."""
    r = cli(binary, "run", "-m", model, "-p", "Count to ten: 1, 2,", "-n", "5", "--ignore-eos")
    assert r.returncode == 0, r.stderr
    assert re.search(r"^decode: 4 tokens in", r.stderr, re.M), r.stderr
    r = cli(binary, "run", "-m", model, "-p", "Count to ten: 1, 2,", "-n", "1")
    assert re.search(r"^decode: 0 tokens in", r.stderr, re.M), r.stderr


def test_run_prompt_and_file_conflict(binary, model, tmp_path):
    """-p and -f both: -p was dropped without a word."""
    f = write_text(tmp_path, "from the file")
    r = cli(binary, "run", "-m", model, "-p", "from the flag", "-f", f, "-n", "1")
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "-p and -f both give the prompt" in r.stderr, r.stderr


# ---- model files ----------------------------------------------------------------------------

def test_a_fifo_as_the_model_is_not_a_regular_file(binary, tmp_path):
    """open() of a FIFO waited for a writer forever, before the check that
    refuses anything but a regular file."""
    fifo = str(tmp_path / "model.gguf")
    os.mkfifo(fifo)
    try:
        r = cli(binary, "run", "-m", fifo, "-p", "hi", "-n", "1", timeout=30)
    except subprocess.TimeoutExpired:
        raise AssertionError("run -m FIFO still waiting after 30 s")
    assert r.returncode == 3, (r.returncode, r.stderr)
    assert "not a regular file" in r.stderr, r.stderr


# ---- serve's settings -----------------------------------------------------------------------

def test_serve_refuses_a_name_that_is_no_header_value(binary, model):
    """--name goes out as X-Streamsink-Replica: CR LF in it added a header of
    the caller's choosing to every response."""
    for name in ("r1\r\nX-Evil: 1", "tab\there", "caf\u00e9"):
        code, log = serve_until_listening(binary, ["-m", model, "--name", name])
        assert code == 2, (name, log)
        assert "--name may hold printable ASCII only" in log, log
    code, log = serve_until_listening(binary, ["-m", model, "--name", "x" * 201])
    assert code == 2, log
    code, log = serve_until_listening(binary, ["-m", model, "--name", "replica-1 (eu)"])
    assert code is None, log


def test_serve_refuses_an_unusable_session_dir_before_loading(binary, model, tmp_path):
    """A --session-dir the server cannot use is a setting (exit 2), found
    before the model loads; it was exit 3, a model error, after loading."""
    afile = tmp_path / "file"
    afile.write_text("")
    for d, why in ((str(tmp_path / "none" / "x"), "No such file or directory"),
                   (str(afile), "Not a directory")):
        code, log = serve_until_listening(binary, ["-m", model, "--session-dir", d])
        assert code == 2, (d, code, log)
        assert f"--session-dir {d}: {why}" in log, log
        assert "loading" not in log, log


def test_calibrate_keeps_its_comment_lines_whatever_the_names(binary, tmp_path):
    """calibrate --out writes the model's name and the text's path in its
    comment lines; a newline in either ended the comment, and the file's
    next line was no row of numbers. Each line is a comment or a layer's
    row of one number per head."""
    tokens, bos = byte_vocab()
    m = str(tmp_path / "named.gguf")
    name = "two\nlines, and a name longer than a buffer sized from a pointer holds"
    write_llama(m, 64, 1, tokens, bos, name=name)
    text = write_text(tmp_path, "The river flows past the old mill and the bridge. " * 6,
                      name="a\nb.txt")
    out = tmp_path / "sinks.txt"
    r = cli(binary, "calibrate", "-m", m, "--text", text, "--out", str(out), "--tokens", "80")
    assert r.returncode == 0, r.stderr
    rows = [l for l in out.read_text().splitlines() if not l.startswith("#")]
    assert len(rows) == 1, out.read_text()  # one layer
    assert "# model " + name.replace("\n", "\ufffd") + "," in out.read_text()
    assert len([float(x) for x in rows[0].split()]) == 1  # one head


@pytest.mark.parametrize("which,tokens", [("model", 65), ("model", 300), ("gemma_model", 600)])
def test_calibrate_agrees_with_the_probe(binary, request, tmp_path, which, tokens):
    """calibrate scores each head's first-position mass itself from q and k,
    and checks it against the probe's. Its pass ran the other attention path,
    whose rounding the 8-bit activations carried into a difference of about
    1e-2 a query (2.4e-2 with one query); and it scored Gemma's local layers
    over keys their sliding window of 512 does not see (2e-2 at 600 tokens).
    The two now compute the same thing, to rounding."""
    m = request.getfixturevalue(which)  # (a missing Gemma skips its case only)
    text = write_text(tmp_path, " ".join(
        f"The river passed the {w} mill at dawn, and the bridge was quiet." for w in
        ("old", "new", "red", "grey", "tall", "low", "stone", "wooden")) * 10)
    out = tmp_path / "sinks.txt"
    r = cli(binary, "calibrate", "-m", m, "--text", text, "--out", str(out), "--tokens",
            str(tokens))
    assert r.returncode == 0, r.stderr
    got = re.search(r"agrees with the probe to (\S+)", r.stdout)
    assert got and float(got.group(1)) < 1e-5, r.stdout[-300:]


@pytest.mark.parametrize("cmd", ["serve", "run"])
def test_the_fetch_hint_is_for_the_default_model_only(binary, tmp_path, cmd):
    """A missing model file hints at scripts/fetch-model.sh only when it is
    the file the script fetches; serve said it after an explicit -m too, and
    both said it for a $STREAMSINK_MODEL of another path, where fetching
    would not help."""
    env = {k: v for k, v in os.environ.items() if k != "STREAMSINK_MODEL"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "empty-cache")
    extra = ["--port", "0"] if cmd == "serve" else ["-p", "hi", "-n", "1"]
    explicit = cli(binary, cmd, "-m", str(tmp_path / "mine.gguf"), *extra, env=env)
    named = cli(binary, cmd, *extra, env=dict(env, STREAMSINK_MODEL=str(tmp_path / "env.gguf")))
    default = cli(binary, cmd, *extra, env=env)
    for r in (explicit, named, default):
        assert r.returncode == 3, r.stderr
        assert "No such file or directory" in r.stderr, r.stderr
    assert "fetch-model.sh" not in explicit.stderr, explicit.stderr
    assert "fetch-model.sh" not in named.stderr, named.stderr
    assert "fetch-model.sh" in default.stderr, default.stderr


def test_run_names_no_bos_when_it_leaves_an_empty_prompt(binary, model):
    r = cli(binary, "run", "-m", model, "-p", "", "--no-bos", "-n", "1")
    assert r.returncode == 2, r.stderr
    assert "--no-bos leaves no token" in r.stderr, r.stderr
    assert "has no BOS" not in r.stderr  # SmolLM2 has one


@pytest.mark.parametrize("cmd", ["probe", "calibrate", "perplexity"])
def test_a_tokenizer_failure_is_named_and_a_runtime_error(binary, model, tmp_path, cmd):
    """A 100 MB text under a 1.35 GB address space: the text and the model
    fit, its token array (4 bytes a byte) does not. probe said "needs more
    than 64 tokens of text (got -12)" and exit 2, as if the text were short;
    perplexity said the text "gives -12 tokens"."""
    text = tmp_path / "big.txt"
    with open(text, "w") as f:
        for _ in range(100):
            f.write("the cat sat. " * 80660)  # ~1 MB
    extra = ["--out", str(tmp_path / "logits.txt")] if cmd == "calibrate" else []
    r = cli(binary, cmd, "-m", model, "--text", str(text), *extra,
            preexec_fn=limited(1350 << 20))
    assert r.returncode == 1, r.stderr
    assert "error: tokenizing the text failed: Cannot allocate memory" in r.stderr, r.stderr
