#!/usr/bin/env bash
# Tiered memory and streaming (issue 4) on a GPU machine, in stages that each fit in a few
# minutes. Every stage prints the command it runs; results go to stdout (and $OUT/<stage>.log).
#   bench/streaming_device.sh build   # configure + build ntransformer and nt_gpu_tests
#   bench/streaming_device.sh test    # GPU streaming tests (every type, all three tiers, graphs, roofline)
#   bench/streaming_device.sh models  # synthetic 70B and 8B Q4_K_M (42.5 GB + 4.9 GB)
#   bench/streaming_device.sh doctor  # links, PCIe, pinning, O_DIRECT on the models' file system
#   bench/streaming_device.sh 70b     # --vram-budget 24G --ram-budget 48G: pp512 and decode vs the PCIe roofline
#   bench/streaming_device.sh disk    # --ram-budget 16G: disk tier vs the O_DIRECT ceiling
#   bench/streaming_device.sh gds     # the same disk tier read by cuFile into VRAM (--gds) vs O_DIRECT
#   bench/streaming_device.sh sweep   # decode with 2 and 4 slots, prefetch 2 and 4 (defaults by measurement)
#   bench/streaming_device.sh 8b      # 8B resident vs budgets that hold everything (within 2%)
# Env: NT_BUILD_DIR (build-gpu), MODELS (models/synth), SYNTH (../shared/tools/synth_gguf.py), OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/device_env.sh
out=${OUT:-}
m8="$models/llama-8b-q4_k_m.gguf"

stage() {
    case "$1" in
    build)
        run cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DNT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=${NT_CUDA_ARCH:-90} >/dev/null &&
            run cmake --build "$build" -j "$(nproc)" --target ntransformer nt_gpu_tests 2>&1 | grep -E "error|warning: .*spill|Built target"
        ;;
    test)
        run "$build/tests/nt_gpu_tests" --gtest_filter='Streaming.*'
        ;;
    models)
        mkdir -p "$models"
        run synth_model "$m70" 70b q4_k_m
        run synth_model "$m8" 8b q4_k_m
        ls -l "$models"
        ;;
    doctor)
        run "$nt" doctor -m "$m70" --read 1G --pin 8G
        ;;
    70b)
        # Target: decode s/token <= 1.10 x streamed bytes / pinned H2D (both printed), pp512 >= 800 tok/s.
        run "$nt" bench -m "$m70" --device cuda --vram-budget 24G --ram-budget 48G -p 512 -n 8 -r 1 \
            ${out:+--trace "$out/trace-70b.json"}
        ;;
    disk)
        # Target: disk bytes at >= 85% of the O_DIRECT read bandwidth measured at load.
        run "$nt" bench -m "$m70" --device cuda --vram-budget 24G --ram-budget 16G -p 0 -n 3 -r 1 \
            ${out:+--trace "$out/trace-70b-disk.json"}
        ;;
    gds)
        # Same plan as `disk`, once with O_DIRECT into pinned staging, once with --gds (cuFile
        # straight into the VRAM slots, no H2D copy); the plan says which path ran.
        run "$nt" bench -m "$m70" --device cuda --vram-budget 24G --ram-budget 16G -p 0 -n 3 -r 1
        run "$nt" bench -m "$m70" --device cuda --vram-budget 24G --ram-budget 16G -p 0 -n 3 -r 1 --gds \
            ${out:+--trace "$out/trace-70b-gds.json"}
        ;;
    sweep)
        for k in 2 4; do run "$nt" bench -m "$m70" --device cuda --vram-budget 24G --ram-budget 48G -p 0 -n 6 -r 1 --slots $k | grep -E "tg6|streaming|H2D|overlap|roofline|VRAM "; done
        for d in 2 4; do run "$nt" bench -m "$m70" --device cuda --vram-budget 24G --ram-budget 16G -p 0 -n 2 -r 1 --prefetch $d | grep -E "tg2|streaming|disk|overlap|roofline"; done
        ;;
    8b)
        run "$nt" bench -m "$m8" --device cuda -p 512 -n 128 -r 3
        run "$nt" bench -m "$m8" --device cuda -p 512 -n 128 -r 3 --vram-budget 100G --ram-budget 16G
        ;;
    *)
        echo "unknown stage '$1'" >&2
        return 1
        ;;
    esac
}

for s in "$@"; do
    echo "== $s"
    if [ -n "$out" ]; then
        mkdir -p "$out"
        stage "$s" 2>&1 | tee "$out/$s.log"
    else
        stage "$s"
    fi
done
