"""The deployment files (deploy/) checked where no container runtime or
cluster is: the Docker build context that deploy/Dockerfile and its
.dockerignore make is assembled into a temp dir and configured with CMake,
and the packages the image installs cover the libraries CMake looks for;
the Kubernetes router routes as deploy/nginx/streamsink.conf does (which
test_nginx_affinity.py runs); the manifests, the systemd unit, and the
shell scripts of scripts/ and deploy/ (shellcheck).

The Dockerfile and ignore-file readers below understand only the forms
those two files use, and fail on anything else, so that a new form is
checked by hand (and taught to them) rather than misread.
"""

import os
import posixpath
import re
import shutil
import subprocess

import pytest

from conftest import REPO

DOCKERFILE = os.path.join(REPO, "deploy", "Dockerfile")
DOCKERIGNORE = DOCKERFILE + ".dockerignore"  # BuildKit reads <Dockerfile>.dockerignore
NGINX_CONF = os.path.join(REPO, "deploy", "nginx", "streamsink.conf")
K8S = os.path.join(REPO, "deploy", "k8s")

# ---- Dockerfile ------------------------------------------------------------------------------


def dockerfile_stages(path):
    """{stage name: (base image or stage, [(KEYWORD, argument)])} in file order.
    Continuation lines are joined; comment lines are dropped, also inside a
    continuation (as Docker does)."""
    stages = {}
    cur = None
    logical = ""
    with open(path) as f:
        lines = f.read().split("\n")
    for line in lines:
        if line.lstrip().startswith("#") or (not logical and not line.strip()):
            continue
        if line.endswith("\\"):
            logical += line[:-1] + " "
            continue
        logical += line
        kw, _, arg = logical.strip().partition(" ")
        logical = ""
        kw, arg = kw.upper(), arg.strip()
        if kw == "FROM":
            m = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", arg, re.I)
            assert m, f"FROM {arg}: a form this reader does not know"
            cur = m.group(2) or f"stage{len(stages)}"
            stages[cur] = (m.group(1), [])
        elif cur is not None:
            stages[cur][1].append((kw, arg))
    assert not logical, "the Dockerfile ends inside a continuation line"
    return stages


def stage_chain(stages, target):
    """The stages target is built on, the first one first, target last."""
    chain = [target]
    while stages[chain[0]][0] in stages:
        chain.insert(0, stages[chain[0]][0])
    return chain


def apt_packages(instructions):
    """Every package named by `apt-get install` in the RUN instructions."""
    out = set()
    for kw, arg in instructions:
        if kw != "RUN":
            continue
        for cmd in re.split(r"&&|;", arg):
            words = cmd.split()
            if "apt-get" in words and "install" in words:
                out.update(w for w in words[words.index("install") + 1:]
                           if not w.startswith("-"))
    return out


# ---- .dockerignore ---------------------------------------------------------------------------


def glob_regex(pattern):
    """A regex for one ignore pattern, with Go's filepath.Match meaning (what
    Docker uses): `*` and `?` stay within one path element; `**` spans any."""
    if re.search(r"[\[\]\\{}]", pattern):
        raise AssertionError(f"ignore pattern {pattern!r}: a form this reader does not know")
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out)


def read_dockerignore(path):
    """[(regex, is_exception)] in file order."""
    rules = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            exception = line.startswith("!")
            pat = line[1:].strip() if exception else line
            pat = posixpath.normpath(pat.lstrip("/"))
            rules.append((glob_regex(pat), exception))
    return rules


def ignored(rules, path):
    """Docker's rule: the last pattern that matches the path or one of its
    parent directories decides."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    out = False
    for rx, exception in rules:
        if any(rx.fullmatch(p) for p in prefixes):
            out = not exception
    return out


def context_files(rules):
    """The files of the build context: those of a clean checkout (tracked, or
    untracked and not ignored by git) that the ignore file lets through."""
    r = subprocess.run(["git", "-C", REPO, "ls-files", "-z", "--cached", "--others",
                        "--exclude-standard"], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        pytest.skip(f"no git checkout at {REPO}: {r.stderr.strip()}")
    files = [f for f in r.stdout.split("\0") if f and os.path.isfile(os.path.join(REPO, f))]
    return sorted(f for f in files if not ignored(rules, f))


# ---- COPY ------------------------------------------------------------------------------------


def copy_sources(ctx, src):
    """[(context path, path below dest, whether it is the source itself)] of
    every file one COPY source names: a file goes to dest/its name, the
    contents of a directory to dest/."""
    src = posixpath.normpath(src.lstrip("/"))
    if src == ".":
        return [(f, f, False) for f in ctx]
    depth = src.count("/") + 1
    rx = glob_regex(src)
    out = []
    for f in ctx:
        parts = f.split("/")
        if len(parts) >= depth and rx.fullmatch("/".join(parts[:depth])):
            rest = parts[depth:]
            out.append((f, "/".join(rest) if rest else parts[-1], not rest))
    if not out:
        raise AssertionError(f"COPY {src}: nothing in the build context (.dockerignore)")
    return out


def image_files(instructions, ctx):
    """({absolute image path: context path}, the last WORKDIR) that the
    instructions make. Only `COPY src... dest` (no flags, no JSON form, no
    variables) is understood; ADD is refused."""
    workdir = "/"
    files = {}
    for kw, arg in instructions:
        if kw == "WORKDIR":
            assert "$" not in arg, f"WORKDIR {arg}: variables are not understood here"
            workdir = posixpath.normpath(posixpath.join(workdir, arg))
        elif kw == "ADD":
            raise AssertionError(f"ADD {arg}: not understood here; use COPY")
        elif kw == "COPY":
            if re.match(r"(--|\[|<<)", arg) or "$" in arg:
                raise AssertionError(f"COPY {arg}: a form this reader does not know")
            words = arg.split()
            assert len(words) >= 2, f"COPY {arg}: no destination"
            *srcs, dest = words
            to_dir = dest.endswith("/") or dest == "."
            dest = posixpath.normpath(posixpath.join(workdir, dest))
            for src in srcs:
                is_glob = bool(re.search(r"[*?]", src))
                if (len(srcs) > 1 or is_glob) and not to_dir:
                    raise AssertionError(f"COPY {arg}: several sources need a dest ending in /")
                for f, below, whole in copy_sources(ctx, src):
                    if whole and not to_dir:
                        files[dest] = f  # COPY file newname
                    else:
                        files[posixpath.join(dest, below)] = f
    return files, workdir


def build_context_tree(tmp_path, target):
    stages = dockerfile_stages(DOCKERFILE)
    assert target in stages, f"deploy/Dockerfile has no stage {target}: {list(stages)}"
    chain = stage_chain(stages, target)
    instructions = [ins for name in chain for ins in stages[name][1]]
    ctx = context_files(read_dockerignore(DOCKERIGNORE))
    files, workdir = image_files(instructions, ctx)
    root = tmp_path / "src"
    n = 0
    for path, f in files.items():
        rel = posixpath.relpath(path, workdir)
        if rel.startswith(".."):
            continue  # outside the directory the build runs in
        dst = root / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.join(REPO, f), dst)
        n += 1
    assert n > 0, f"the stages {chain} copy nothing into {workdir}"
    return root


def test_the_build_stage_context_configures_with_cmake(tmp_path):
    """What `docker build --target cpu` gives CMake: the build stages' COPY
    lines over the context the ignore file leaves. Configure only (seconds);
    the build itself needs the image's compiler and packages."""
    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.skip("no cmake")
    src = build_context_tree(tmp_path, "build-cpu")
    r = subprocess.run([cmake, "-S", str(src), "-B", str(src / "build"),
                        "-DCMAKE_BUILD_TYPE=Release", "-DSTREAMSINK_CUDA=OFF"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (
        "cmake cannot configure the Docker build stage's sources (deploy/Dockerfile COPY "
        "lines, deploy/Dockerfile.dockerignore):\n" + r.stdout[-3000:] + r.stderr[-6000:])


# pkg-config module (CMakeLists.txt) -> (Debian -dev package for the build stage,
# Debian runtime package for the runtime stage)
PKG_CONFIG_DEBIAN = {
    "libuv": ("libuv1-dev", "libuv1"),
    "libcjson": ("libcjson-dev", "libcjson1"),
    "libutf8proc": ("libutf8proc-dev", "libutf8proc2"),
    "zlib": ("zlib1g-dev", "zlib1g"),
    "libcrypto": ("libssl-dev", "libssl3"),
}


def test_the_image_installs_every_library_cmake_looks_for():
    with open(os.path.join(REPO, "CMakeLists.txt")) as f:
        modules = re.findall(r"pkg_check_modules\(\s*\w+\s+REQUIRED\s+IMPORTED_TARGET\s+(\S+?)\s*\)",
                             f.read())
    assert modules, "CMakeLists.txt: no pkg_check_modules(... REQUIRED IMPORTED_TARGET ...)"
    stages = dockerfile_stages(DOCKERFILE)
    build = apt_packages(stages["build-base"][1])
    runtime = apt_packages(stages["runtime-base"][1])
    for m in modules:
        assert m in PKG_CONFIG_DEBIAN, f"{m}: add its Debian packages to PKG_CONFIG_DEBIAN"
        dev, lib = PKG_CONFIG_DEBIAN[m]
        assert dev in build, f"deploy/Dockerfile build-base does not install {dev} ({m})"
        assert lib in runtime, f"deploy/Dockerfile runtime-base does not install {lib} ({m})"


# ---- the Kubernetes router -------------------------------------------------------------------


def nginx_directives(text):
    """An nginx config's lines without comments, blank lines or runs of spaces."""
    out = []
    for line in text.splitlines():
        line = re.sub(r"\s+", " ", line.split("#", 1)[0]).strip()
        if line:
            out.append(line)
    return out


def block(lines, opening):
    """The lines of the block that starts with the line `opening`, braces included."""
    start = lines.index(opening)
    depth = 0
    for i in range(start, len(lines)):
        depth += lines[i].count("{") - lines[i].count("}")
        if depth == 0:
            return lines[start:i + 1]
    raise AssertionError(f"{opening}: no closing brace")


def test_the_k8s_router_routes_as_the_nginx_config_does():
    """router.yaml embeds deploy/nginx/streamsink.conf with pod names: the
    map and the server block (every location) must be the same directives."""
    yaml = pytest.importorskip("yaml")
    with open(os.path.join(K8S, "base", "router.yaml")) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    router = nginx_directives(next(d for d in docs if d["kind"] == "ConfigMap")
                              ["data"]["default.conf"])
    with open(NGINX_CONF) as f:
        site = nginx_directives(f.read())
    for opening in ("map $http_x_session_id $streamsink_pool {", "server {"):
        assert block(router, opening) == block(site, opening), (
            f"deploy/k8s/base/router.yaml and deploy/nginx/streamsink.conf differ in `{opening}`")


def kustomize(overlay):
    """The objects `kubectl kustomize deploy/k8s/OVERLAY` renders (no cluster needed)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl")
    yaml = pytest.importorskip("yaml")
    r = subprocess.run([kubectl, "kustomize", os.path.join(K8S, overlay)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def server_container(objects):
    sts = [d for d in objects if d["kind"] == "StatefulSet" and
           d["metadata"]["name"] == "streamsink"]
    assert len(sts) == 1, "one StatefulSet streamsink"
    pod = sts[0]["spec"]["template"]["spec"]
    c = [c for c in pod["containers"] if c["name"] == "streamsink"]
    assert len(c) == 1, "one container streamsink"
    return pod, c[0]


def flag(args, name):
    """The value of the last `name value` in args (the server takes the last), or None."""
    vals = [args[i + 1] for i, a in enumerate(args[:-1]) if a == name]
    return vals[-1] if vals else None


@pytest.mark.parametrize("overlay,tag", [("base", "cpu"), ("gpu", "cuda")])
def test_the_k8s_replicas_keep_sessions_on_their_shared_volume(overlay, tag):
    """A patch of `args` replaces the whole list: an overlay must repeat the
    session flags, or its replicas keep sessions in memory only while the
    shared volume sits mounted and unused."""
    pod, c = server_container(kustomize(overlay))
    args = c["args"]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert flag(args, "--session-dir") == mounts["sessions"], (overlay, args)
    assert flag(args, "--session-disk-max") is not None, (overlay, args)
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["sessions"]["persistentVolumeClaim"]["claimName"] == "streamsink-sessions"
    assert c["image"] == f"streamsink:{tag}", (overlay, c["image"])


@pytest.mark.parametrize("overlay", ["base", "gpu"])
def test_the_k8s_replicas_take_their_api_keys_from_a_secret(overlay):
    """No open server: the replicas read --api-key-file from a mounted Secret,
    which the operator makes (the repository holds no key); the probes use
    /health, which needs no key."""
    objects = kustomize(overlay)
    pod, c = server_container(objects)
    path = flag(c["args"], "--api-key-file")
    assert path is not None, (overlay, c["args"])
    vols = {v["name"]: v for v in pod["volumes"]}
    mount = [m for m in c["volumeMounts"] if posixpath.dirname(path) == m["mountPath"]]
    assert len(mount) == 1, (path, c["volumeMounts"])
    assert mount[0].get("readOnly") is True
    secret = vols[mount[0]["name"]].get("secret")
    assert secret is not None, vols[mount[0]["name"]]
    assert secret.get("optional") is not True  # no Secret: no pod, rather than an open server
    items = {i["key"]: i["path"] for i in secret.get("items", [])}
    assert items.get(posixpath.basename(path), posixpath.basename(path)) == \
        posixpath.basename(path)
    assert not any(d["kind"] == "Secret" for d in objects), "a committed Secret"
    assert "--api-key" not in c["args"]  # a key on the command line shows in ps
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["path"] == "/health", (probe, c[probe])


# ---- systemd ---------------------------------------------------------------------------------

SYSTEMD_UNIT = os.path.join(REPO, "deploy", "systemd", "streamsink.service")


def unit_service_settings(text):
    """{key: [values]} of the unit's [Service] section."""
    out = {}
    section = None
    logical = ""
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(("#", ";")) or (not logical and not line):
            continue
        if line.endswith("\\"):
            logical += line[:-1] + " "
            continue
        line, logical = logical + line, ""
        if line.startswith("["):
            section = line
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{line}: not KEY=VALUE"
        if section == "[Service]":
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def test_the_systemd_unit_can_write_its_sessions_and_read_its_keys():
    """ProtectSystem=strict leaves the service only the directories its unit
    names writable (StateDirectory=, ...), and DynamicUser= makes its user up
    at start, so it can read no root-only file: its keys come in as a
    credential. Every --session-dir and --api-key-file the unit names, in a
    setting or in its install notes, must work under both."""
    with open(SYSTEMD_UNIT) as f:
        text = f.read()
    s = unit_service_settings(text)
    assert s["ProtectSystem"] == ["strict"] and s["DynamicUser"] == ["yes"], s
    writable = [posixpath.join("/var/lib", d) for v in s.get("StateDirectory", [])
                for d in v.split()]
    writable += [p.lstrip("-") for v in s.get("ReadWritePaths", []) for p in v.split()]
    dirs = re.findall(r"--session-dir\s+([/$][^\s\"]*)", text)
    assert dirs, "the unit should say where sessions go (--session-dir)"
    for d in dirs:
        assert any(d == w or d.startswith(w + "/") for w in writable), (
            f"--session-dir {d} is read-only under ProtectSystem=strict (writable: {writable})")
    creds = dict(v.split(":", 1) for v in s.get("LoadCredential", []))
    files = re.findall(r"--api-key-file\s+([/$][^\s\"]*)", text)
    assert files, "the unit should say where the API keys come from (--api-key-file)"
    for path in files:
        m = re.fullmatch(r"\$\{CREDENTIALS_DIRECTORY\}/([^/]+)", path)
        assert m and m.group(1) in creds, (
            f"--api-key-file {path}: the dynamic user reads keys only as a credential "
            f"(LoadCredential=ID:FILE, --api-key-file ${{CREDENTIALS_DIRECTORY}}/ID); "
            f"credentials: {creds}")


def test_the_systemd_unit_passes_systemd_analyze_verify(tmp_path):
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("no systemd-analyze")
    with open(SYSTEMD_UNIT) as f:
        text = f.read()
    # verify checks that ExecStart's program exists: any executable stands in
    assert "/usr/local/bin/streamsink " in text
    unit = tmp_path / "streamsink.service"
    unit.write_text(text.replace("/usr/local/bin/streamsink ", shutil.which("true") + " "))
    r = subprocess.run([tool, "verify", "--man=no", str(unit)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and not r.stderr.strip(), r.stdout + r.stderr


# ---- shell scripts ---------------------------------------------------------------------------


def test_the_scripts_and_the_entrypoint_pass_shellcheck():
    tool = shutil.which("shellcheck")
    if tool is None:
        pytest.skip("no shellcheck")
    scripts = sorted(os.path.join(d, f) for d in ("scripts", "deploy")
                     for f in os.listdir(os.path.join(REPO, d)) if f.endswith(".sh"))
    assert "deploy/docker-entrypoint.sh" in scripts and "scripts/test.sh" in scripts
    r = subprocess.run([tool, *scripts], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
