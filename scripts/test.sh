#!/usr/bin/env bash
# The whole test suite: installs what the tests need, fetches the default model, builds, then
# runs the unit tests (ctest), the comparisons against independent references (pytest), and
# each fuzz target briefly. Exits non-zero on any failure.
#   NT_BUILD_DIR (default build), NT_FUZZ_SECONDS (default 30), NT_JOBS (default nproc)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${NT_BUILD_DIR:-build}
jobs=${NT_JOBS:-$(nproc)}
export NT_BUILD_DIR=$(realpath -m "$build")

scripts/setup.sh
scripts/fetch-model.sh

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release ${NT_CMAKE_ARGS:-}
cmake --build "$build" -j "$jobs"

echo "== unit tests"
(cd "$build" && ctest --output-on-failure -j "$jobs" -L unit)

echo "== comparisons with independent references"
python3 -m pytest -q tests/python

echo "== fuzzers"
scripts/run-fuzzers.sh "${NT_FUZZ_SECONDS:-30}"
echo "all tests passed"
