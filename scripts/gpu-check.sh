#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: builds with CUDA, runs the GPU test suite (every kernel
# against the CPU backend, whole model GPU against CPU) and prints a pass/fail summary and the
# benchmark table. Needs only the CUDA toolkit, CMake and python3 with numpy (GoogleTest from
# .deps/ when not installed: scripts/vendor-deps.sh).
#   NT_BUILD_DIR (default build-gpu), NT_MODEL (default models/SmolLM2-135M-Instruct.Q4_1.gguf)
set -uo pipefail
cd "$(dirname "$0")/.."
build=${NT_BUILD_DIR:-build-gpu}
model=${NT_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DNT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=${NT_CUDA_ARCH:-native} >/dev/null || exit 1
cmake --build "$build" -j "$(nproc)" 2>&1 | grep -E "error|warning: .*spill" ; test "${PIPESTATUS[0]}" = 0 || exit 1
declare -A result
"$build/tests/nt_gpu_tests" --gtest_brief=1; result[kernels]=$?
# The prompt path with the CPU's arithmetic (integer GEMM, exact prefill attention); on
# compute capability 9.0 its GEMM again on the mma.sync kernel alone (NT_MMQ_WGMMA=0).
NT_EXACT_PROMPT=1 "$build/tests/nt_gpu_tests" --gtest_brief=1 \
  --gtest_filter='*Matmul*:CudaBackend*:CudaKernels*'; result[exact-prompt]=$?
NT_MMQ_WGMMA=0 NT_EXACT_PROMPT=1 "$build/tests/nt_gpu_tests" --gtest_brief=1 \
  --gtest_filter='MatmulParity.*'; result[exact-gemm-sync]=$?
"$build/tests/nt_unit_tests" --gtest_brief=1; result[unit]=$?
# Default and exact prompt paths and the decode path, against one CPU run a model.
python3 tests/gpu/compare_devices.py "$build" "$model"; result[whole-model]=$?
tests/gpu/cli_scenarios.sh "$build" "$model"; result[cli]=$?
"$build/ntransformer" bench -m "$model" --device cuda; result[bench]=$?
echo "== summary"
fail=0
for k in "${!result[@]}"; do
  if [ "${result[$k]}" = 0 ]; then echo "PASS $k"; else echo "FAIL $k"; fail=1; fi
done
exit $fail
