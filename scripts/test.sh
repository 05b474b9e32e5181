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

# Where nvcc exists the CUDA backend and GPU tests are compiled too (for one architecture, to
# keep CI short); they run on a GPU machine (scripts/gpu-check.sh), but for the host-side
# checks (the kernels' block arithmetic, the TMA GEMV's settings: *Host), which run here too.
cuda_args=""
if command -v nvcc >/dev/null 2>&1; then cuda_args="-DCMAKE_CUDA_ARCHITECTURES=${NT_CUDA_ARCH:-90}"; fi
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release $cuda_args ${NT_CMAKE_ARGS:-}
cmake --build "$build" -j "$jobs"

echo "== unit tests"
(cd "$build" && ctest --output-on-failure -j "$jobs" -L unit)
if [ -x "$build/tests/nt_gpu_tests" ]; then
    "$build/tests/nt_gpu_tests" --gtest_brief=1 --gtest_filter='*Host.*'
fi

echo "== comparisons with independent references"
python3 -m pytest -q tests/python

echo "== fuzzers"
scripts/run-fuzzers.sh "${NT_FUZZ_SECONDS:-30}"
echo "all tests passed"
