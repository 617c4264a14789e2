#!/usr/bin/env bash
# Installs what building and testing streamsink needs: Debian packages (as
# root, or through sudo) and a Python venv at .venv for the test tools.
# Idempotent; safe to run on every build.
set -euo pipefail
cd "$(dirname "$0")/.."
PKGS=(build-essential cmake pkg-config clang libclang-rt-14-dev clang-format libuv1-dev libcjson-dev node-llhttp
      libutf8proc-dev libsimde-dev zlib1g-dev libssl-dev python3-venv python3-pip bible-kjv nginx
      shellcheck)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  echo "installing Debian packages: ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -r scripts/requirements-test.txt
