#!/usr/bin/env bash
# Copies build dependencies that a bare CUDA machine lacks (GoogleTest sources from Debian's
# libgtest-dev) into .deps/, a git-ignored folder that can travel with the tree.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps
if [ ! -f .deps/googletest/CMakeLists.txt ]; then
  [ -d /usr/src/googletest ] || { echo "error: /usr/src/googletest is missing; install libgtest-dev." >&2; exit 1; }
  rm -rf .deps/googletest
  cp -r /usr/src/googletest .deps/googletest
fi
echo ".deps ready: $(du -sh .deps | cut -f1)"
