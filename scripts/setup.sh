#!/usr/bin/env bash
# setup.sh - installs everything pipeshard needs on a fresh Debian machine, idempotently:
#   Debian packages (compiler, CMake, libraries), a Python venv for the test references
#   (.cache/venv), and the models (.cache/models). Each step is skipped when already done.
# Usage: scripts/setup.sh [--no-python] [--no-models]
set -euo pipefail
cd "$(dirname "$0")/.."

want_python=1 want_models=1
for a in "$@"; do
  case "$a" in
    --no-python) want_python=0 ;;
    --no-models) want_models=0 ;;
    *) echo "setup.sh: unknown option '$a'" >&2; exit 2 ;;
  esac
done

debs=(build-essential cmake pkg-config python3 python3-venv iproute2 clang-format
      libpcre2-dev libutf8proc-dev libcjson-dev libxxhash-dev libsodium-dev libmicrohttpd-dev libedit-dev
      gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user   # these three: tests/cross_neon.sh
      chromium chromium-driver)                                # tests/test_chat_page.py (headless)
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# python3 may come from elsewhere (pyenv); only ask apt for it when none is on PATH.
if command -v python3 >/dev/null && python3 -m venv --help >/dev/null 2>&1; then
  missing=("${missing[@]/python3-venv}"); missing=("${missing[@]/python3}")
fi
read -ra missing <<<"${missing[*]}"
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ((want_python)); then
  py=.cache/venv/bin/python
  if [ ! -x "$py" ]; then
    echo "setup: creating .cache/venv"
    python3 -m venv .cache/venv
  fi
  if ! "$py" -c "import numpy, gguf, tokenizers, sentencepiece, jinja2, xxhash, openai, selenium" 2>/dev/null; then
    echo "setup: installing Python test references into .cache/venv"
    "$py" -m pip install -q --disable-pip-version-check -r scripts/requirements.txt
  fi
fi

if ((want_models)); then
  scripts/fetch_models.sh
fi
