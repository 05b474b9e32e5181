#!/usr/bin/env bash
# Installs what building and testing ntransformer needs on Debian/Ubuntu: the C++ toolchain,
# GoogleTest, clang (libFuzzer), cpp-httplib and nlohmann-json (the server), Chromium (the chat
# page's test), and the Python packages the tests compare against (gguf-py, llama-cpp-python
# built from PyPI, sentencepiece, tokenizers, jinja2, the openai client). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
pkgs="build-essential cmake libgtest-dev clang libclang-rt-dev python3 python3-pip git ca-certificates libcpp-httplib-dev nlohmann-json3-dev pkg-config chromium"
missing=""
for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi
# pip refuses to touch a Debian-managed Python unless told; a user-managed one needs no flag.
pipflags=""
if python3 -m pip install --help 2>/dev/null | grep -q break-system-packages && \
   [ -f "$(python3 -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')/EXTERNALLY-MANAGED" ]; then
  pipflags="--break-system-packages"
fi
python3 -m pip install --quiet $pipflags -r requirements-test.txt
