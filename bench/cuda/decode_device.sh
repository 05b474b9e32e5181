#!/usr/bin/env bash
# Resident decode on a GPU machine (issue 3's decode targets), in stages:
#   bench/cuda/decode_device.sh build    # configure + build ntransformer, nt_gpu_tests and the harnesses
#   bench/cuda/decode_device.sh models   # synthetic Llama-3 8B in Q4_K_M, Q8_0 and Q6_K (written in the background)
#   bench/cuda/decode_device.sh ab       # 8B tgN (TG_N, default 128; AB_MODELS, default q4_k_m) as shipped, then with each setting of AB
#                                        # ("base" in AB: the tree of AB_BASE as shipped, built first:
#                                        # AB_BASE a tarball of another commit, `git archive REV > F`)
#   bench/cuda/decode_device.sh gemv     # bench_gemv on 8B and 70B shapes (GEMV_TYPES, GEMV_N rows, default 1), as shipped and with each setting of GEMV_AB
#                                        # (GEMV_AB="- NT_GEMV_MMA=0" GEMV_N=2,4,8: the tensor-core kernel against the CUDA-core ones)
#   bench/cuda/decode_device.sh attention # bench_attention: decode at 8..8192 positions (and one row with the rope inside), prefill
#   bench/cuda/decode_device.sh readback # 8B tg128 (AB_MODELS) with each bench --readback, and generate
#                                        # (default sampler, greedy) end to end
#   bench/cuda/decode_device.sh exact    # the prompt path with the CPU's arithmetic: its tests, the integer GEMM
#                                        # (best kernel and mma.sync), prefill attention v3, 8B pp512 by GEMM kernel
#   bench/cuda/decode_device.sh types    # 8B Q4_K_M, Q8_0, Q6_K: pp512 and tg128 (the BENCHMARKS.md rows)
#   bench/cuda/decode_device.sh candidates # each code change not yet measured (bench/cuda/candidate_*.patch, or
#                                        # CANDIDATES: names there) built in, its tests run, and 8B tg128
#                                        # (AB_MODELS) alternating with the binary built before it
#   bench/cuda/decode_device.sh rings    # 8B tg128 of each model with each TMA ring default against the sizes
#                                        # beside it (the defaults were tuned on H100s: on another GPU, run
#                                        # it after types, and l2 after it)
#   bench/cuda/decode_device.sh 70b      # resident synthetic 70B Q4_K_M: pp512 and tg64, and pp512 on the exact
#                                        # path (after types: needs the disk)
#   bench/cuda/decode_device.sh rings70b # 70B tg64 with its two-unit slices' ring at 12 and 20 KB against
#                                        # as shipped (after 70b)
#   bench/cuda/decode_device.sh l2_70b   # 70B tg64 with the L2 warm-up at none and 4 MiB against as
#                                        # shipped (after 70b)
#   bench/cuda/decode_device.sh tests    # the whole GPU suite; failures again with NT_PDL_PREFETCH=0 and NT_PDL=0
#   bench/cuda/decode_device.sh profile  # one 8B Q4_K_M decode token under ncu: each kernel's time
#   bench/cuda/decode_device.sh sections # the first kernels of one 8B Q4_K_M decode token under ncu's
#                                        # SpeedOfLight, Occupancy, LaunchStats and WarpStateStats
#                                        # sections (NCU_COUNT kernels, default 60): per kernel, its
#                                        # time, DRAM throughput, occupancy and top stall reasons
#   bench/cuda/decode_device.sh timeline # 8B decode tokens (AB_MODELS) traced kernel by kernel in place
#                                        # (kernel_trace.cpp, CUPTI): each kernel's time and gaps
#   bench/cuda/decode_device.sh stalls   # 8B decode tokens (AB_MODELS) with every warp's PC sampled, kernels
#                                        # left concurrent (pc_stalls.cpp, CUPTI): each kernel's samples by
#                                        # stall reason, and the attention's PCs (PC_DETAIL) one by one
#   bench/cuda/decode_device.sh phases   # 8B decode tokens (AB_MODELS) with each CTA's phases marked on the GPU clock
#                                        # (a second build, -DNT_PHASE_TRACE=ON, in build-phase): per kernel
#                                        # of a layer, the handoff from the kernel before and the work after it
#   bench/cuda/decode_device.sh fences   # 8B tg128 (AB_MODELS) with the counted arrivals (arrival.cuh) as
#                                        # fences (NT_FENCE_SC=1) and as the acquire-release count (=0), then
#                                        # with the SwiGLU pair's and the attention merge's ordering dropped
#                                        # (bench/cuda/fence_probe.patch, built in and removed again): what a
#                                        # fence-free handoff could save at most
#   bench/cuda/decode_device.sh fromfloat # 8B tg128 (AB_MODELS) by the types whose down projection quantizes
#                                        # the pair's float output itself (NT_GEMV_FROM_FLOAT)
#   bench/cuda/decode_device.sh l2       # 8B tg128 (AB_MODELS) with the feed-forward's first weights requested
#                                        # into L2 during the attention as shipped, none and by size (NT_L2_WARM)
#   bench/cuda/decode_device.sh l2after  # the same after the o projection's wait (NT_L2_WARM_AFTER=1), by size
#   bench/cuda/decode_device.sh ablate   # 8B tg128 (AB_MODELS) with each decode op left out in turn
#                                        # (bench/cuda/ablate_ops.patch, built in and removed again):
#                                        # what each op costs in place, inside the graph
# Env: NT_BUILD_DIR (build-gpu), MODELS (models/synth), SYNTH (../shared/tools/synth_gguf.py), OUT,
# TL_TOKENS (timeline: decode tokens traced, default 24).
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/device_env.sh
out=${OUT:-/tmp}
model() {  # the 8B model of type $1, or with "70b" the 70B Q4_K_M
    if [ "$1" = 70b ]; then echo "$m70"; else echo "$models/llama-8b-$1.gguf"; fi
}
wait_model() {  # the models stage writes in the background (in this run, or an earlier one)
    while [ ! -f "$(model "$1")" ]; do
        if [ -z "$(jobs -rp)" ]; then
            echo "no $(model "$1"): run the models stage first (in this call or an earlier one)" >&2
            return 1
        fi
        sleep 2
    done
}

# bench of the model $1 names (model: an 8B type or 70b) with -p $2 -n $3 -r 3 and the settings after them
# (VAR=VALUE ...), by NT_BIN (another ntransformer binary, the base tree's) or this tree's.
bench_model() {
    local t=$1 p=$2 n=$3
    shift 3
    env "$@" "${NT_BIN:-$nt}" bench -m "$(model $t)" --device cuda -p "$p" -n "$n" -r 3 2>&1
}
# tgN (N = TG_N, default 128) of the model $1 names (model) with the settings after it: "t/s ± sd".
tg_rate() {
    local t=$1 n=${TG_N:-128}
    shift
    bench_model "$t" 0 "$n" "$@" | grep -E "tg$n " | awk -F'|' '{print $7}'
}
# "LABEL: <type> <setting> tgN <t/s>" for each model of AB_MODELS, each N of TG_LENGTHS (default
# 128) and each setting after the label (VAR=VALUE), in that order, each model once the models
# stage has written it.
tg_each() {
    local label=$1 t env n
    shift
    for t in ${AB_MODELS:-q4_k_m}; do
        wait_model $t || return 1
        for n in ${TG_LENGTHS:-128}; do
            for env in "$@"; do
                if [ "$env" = shipped ]; then  # with_patch's copy of the binary before the patch
                    echo "$label: $t shipped tg$n $(TG_N=$n NT_BIN=$build/ntransformer.shipped tg_rate $t NT_AS_SHIPPED=1)"
                else
                    echo "$label: $t $env tg$n $(TG_N=$n tg_rate $t $env)"
                fi
            done
        done
    done
}
# pp512 of the 8B model of type $1 with the settings after it: bench's table row.
pp512() {
    local t=$1
    shift
    bench_model "$t" 512 0 "$@" | grep -E "pp512"
}

# The tree of AB_BASE (a tarball of another commit) built beside this one in BASE_SRC, for
# "base" in AB: prints its ntransformer binary (the build's log in $out/base_build.log).
base_src=${BASE_SRC:-/tmp/nt-base}
build_base() {
    local bin="$base_src/build-gpu/ntransformer"
    [ -n "${AB_BASE:-}" ] && [ -f "$AB_BASE" ] || { echo "AB_BASE names no tarball" >&2; return 1; }
    if [ ! -x "$bin" ]; then
        mkdir -p "$base_src" && tar -xf "$AB_BASE" -C "$base_src" || return 1
        [ -d .deps ] && ln -sfn "$PWD/.deps" "$base_src/.deps"
        (cd "$base_src" &&
            cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DNT_CUDA=ON \
                -DCMAKE_CUDA_ARCHITECTURES=${NT_CUDA_ARCH:-90} &&
            cmake --build build-gpu -j "$(nproc)" --target ntransformer) >"$out/base_build.log" 2>&1
        [ -x "$bin" ] || { echo "the base tree did not build: $out/base_build.log" >&2; return 1; }
    fi
    echo "$bin"
}

# Builds bench/cuda/NAME.cpp, a CUPTI injection library, as $build/libnt_NAME.so.
cupti_library() {
    local cuda=${CUDA_HOME:-/usr/local/cuda} lib hdr
    lib=$(find -L "$cuda/" -name 'libcupti.so' 2>/dev/null | head -1)
    hdr=$(find -L "$cuda/" -name 'cupti_pcsampling.h' 2>/dev/null | head -1)
    [ -n "$lib" ] && [ -n "$hdr" ] || { echo "no CUPTI under $cuda"; return 1; }
    run g++ -shared -fPIC -O2 -I"$(dirname "$hdr")" -I"$cuda/include" "bench/cuda/$1.cpp" \
        -L"$(dirname "$lib")" -Wl,-rpath,"$(dirname "$lib")" -lcupti -o "$build/libnt_$1.so"
}

# Decodes TOKENS tokens of model TYPE with the injection library NAME loaded (its settings come
# from the caller's environment): bench's output, stderr included.
injected_decode() {
    CUDA_INJECTION64_PATH="$PWD/$build/libnt_$1.so" "$nt" bench -m "$(model "$2")" --device cuda \
        -p 0 -n "$3" -r 1 2>&1
}

# Applies (or with -R after it, takes out) a patch of bench/cuda (a probe, or a candidate not
# yet measured): git where the tree is a checkout, else patch.
probe_patch() {
    local p=bench/cuda/$1
    shift
    echo "+ apply $* $p"
    git apply "$@" "$p" 2>/dev/null || patch -p1 --forward "$@" <"$p" >/dev/null
}

# A patch under test (a probe or a candidate not yet measured): build the patch in, run the GPU
# tests TESTS (a gtest filter; none if empty) with the settings TEST_ENV, tg128 with each
# SETTING (tg_each LABEL; "shipped": the binary built before the patch, in the same run),
# then take the patch out and build again.
#   with_patch PATCH LABEL TESTS TEST_ENV SETTING...
with_patch() {
    local patch=$1 label=$2 tests=$3 test_env=$4 targets=ntransformer
    shift 4
    [ -n "$tests" ] && targets="ntransformer nt_gpu_tests"
    cp "$build/ntransformer" "$build/ntransformer.shipped" || return 1
    probe_patch "$patch" || return 1
    run cmake --build "$build" -j "$(nproc)" --target $targets 2>&1 | grep -E " error"
    if [ -n "$tests" ]; then
        env $test_env "$build/tests/nt_gpu_tests" --gtest_brief=1 --gtest_filter="$tests" 2>&1 | tail -n 3
    fi
    tg_each "$label" "$@"
    probe_patch "$patch" -R
    run cmake --build "$build" -j "$(nproc)" --target $targets 2>&1 | grep -E " error"
}

stage() {
    case "$1" in
    build)
        run cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DNT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=${NT_CUDA_ARCH:-90} >/dev/null &&
            run cmake --build "$build" -j "$(nproc)" --target ntransformer nt_gpu_tests bench_gemv bench_gemm bench_attention 2>&1 |
            grep -E "error|warning: .*spill"
        test "${PIPESTATUS[0]}" = 0
        ;;
    models)
        mkdir -p "$models"
        (for t in q4_k_m q8_0 q6_k; do
            synth_model "$(model $t)" 8b $t >/dev/null
        done) &
        ;;
    ab)
        # One line per setting (AB: space-separated settings, each VAR=VALUE[,VAR=VALUE...],
        # "-" for as shipped, "base" for AB_BASE's tree as shipped).
        local settings=${AB:-- NT_PIPE_TWO_ROWS=0 NT_PDL_PREFETCH=0 NT_PDL=0} base_nt=""
        if [[ " $settings " == *" base "* ]]; then
            base_nt=$(build_base) || return 1
        fi
        for t in ${AB_MODELS:-q4_k_m}; do
            wait_model $t || return 1
            for env in $settings; do
                if [ "$env" = base ]; then
                    echo "ab: $t base tg${TG_N:-128} $(NT_BIN=$base_nt tg_rate $t NT_AS_SHIPPED=1)"
                    continue
                fi
                [ "$env" = - ] && env=NT_AS_SHIPPED=1
                echo "ab: $t $env tg${TG_N:-128} $(tg_rate $t ${env//,/ })"
            done
        done
        ;;
    gemv)
        # One table per setting (GEMV_AB: space-separated VAR=VALUE settings, "-" for as shipped).
        types=${GEMV_TYPES:-q4_K,q6_K,q8_0}
        ns=${GEMV_N:-1}  # activation rows, e.g. 2,4,8 (a server's batched steps, short prompts)
        for env in ${GEMV_AB:-- NT_GEMV_TMA=0}; do
            [ "$env" = - ] && env=NT_AS_SHIPPED=1
            echo "+ $env bench_gemv --types $types --shapes 8b,70b --n $ns --pdl"
            env $env "$build/bench/bench_gemv" --types "$types" --shapes 8b,70b --n "$ns" --pdl \
                >"$out/gemv_$env.txt" 2>&1 || echo "bench_gemv FAILED"
            grep -E "^\*" "$out/gemv_$env.txt" | awk '{print "gemv '$env':", $2, $3, $4, $5, $9, $11}'
        done
        ;;
    attention)
        "$build/bench/bench_attention" --iters 200 >"$out/attention.txt" 2>&1 || echo "bench_attention FAILED"
        grep -E "^ +(8|64|128|512|4096) +1 |^rope fused" "$out/attention.txt"
        ;;
    readback)
        # 8B tg128 (AB_MODELS) with each way a step's token comes back (bench --readback),
        # then generate with the default sampler and greedy, end to end.
        for t in ${AB_MODELS:-q4_k_m}; do
            wait_model $t || return 1
            for r in fed drawn top sampled row none; do
                echo "readback: $t $r tg128 $("$nt" bench -m "$(model $t)" --device cuda -p 0 -n 128 -r 3 \
                    --readback $r 2>&1 | grep -E "tg128" | awk -F'|' '{print $7}')"
            done
            for a in "" "--temp 0"; do
                echo "generate: $t ${a:-default sampler} $("$nt" generate -m "$(model $t)" --device cuda \
                    -p "Hello there" -n 128 --stats $a 2>&1 >/dev/null | grep -E "decode:|redrawn" | tr '\n' ' ')"
            done
        done
        ;;
    exact)
        # The prompt path with the CPU's arithmetic (NT_EXACT_PROMPT=1): its tests (the integer
        # GEMM bit for bit against vec_dot and across its kernels, the exact prefill attention
        # against the CPU), the GEMM alone (bench_gemm's mmq: the kernel matmul takes, on
        # compute capability 9.0 wgmma for Q4_K, Q5_K, Q6_K and the 32-element block types;
        # mmq-sync: the mma.sync kernel), the attention kernels (prefill v3 = exact, bit for bit
        # against v1), then 8B Q4_K_M pp512 with the best GEMM, with mma.sync alone
        # (NT_MMQ_WGMMA=0), and on the default FP16 path; 8B Q6_K and Q8_0 pp512 with the best
        # GEMM and mma.sync alone.
        NT_EXACT_PROMPT=1 "$build/tests/nt_gpu_tests" --gtest_brief=1 \
            --gtest_filter='MatmulParity.*:MatmulTypes*:CudaBackend.AttentionAgainstCpu:CudaBackend.RopeAttention' \
            2>&1 | tail -n 5
        echo "+ bench_gemm --types ${GEMM_TYPES:-q4_K,q5_K,q6_K,q8_0,q4_0} --shapes 8b --n 512"
        NT_EXACT_PROMPT=1 "$build/bench/bench_gemm" --types "${GEMM_TYPES:-q4_K,q5_K,q6_K,q8_0,q4_0}" \
            --shapes 8b --n 512 --iters 10 2>&1 | grep -E "matmul|mmq|FAIL"
        "$build/bench/bench_attention" --iters 20 2>&1 | sed -n '/== prefill/,$p'
        for t in q4_k_m q6_k q8_0; do
            wait_model $t || return 1
            for e in 1 0; do echo "exact $t: wgmma $e $(pp512 $t NT_MMQ_WGMMA=$e NT_EXACT_PROMPT=1)"; done
        done
        echo "default q4_k_m: $(pp512 q4_k_m)"
        ;;
    types)
        for t in ${TYPES:-q4_k_m q8_0 q6_k}; do
            wait_model $t || return 1
            run "$nt" bench -m "$(model $t)" --device cuda -p 512 -n 128 -r 3 2>&1 | grep -E "^\||^decode:"
        done
        ;;
    candidates)
        # A code change is measured against the same tree without it, never as a run-time
        # switch (both forms in one binary change the code it is about). CANDIDATE_TESTS: the
        # gtest filter run with each (default: the backend's and the attention's).
        local c
        for c in ${CANDIDATES:-$(cd bench/cuda && ls candidate_*.patch 2>/dev/null)}; do
            with_patch "$c" "${c%.patch}" "${CANDIDATE_TESTS:-CudaBackend*:*Attention*}" "" \
                shipped NT_AS_SHIPPED=1 shipped NT_AS_SHIPPED=1 shipped NT_AS_SHIPPED=1
        done
        ;;
    rings)
        # Each ring default of tma_ring_bytes against the sizes beside it, one model at a time
        # (AB_MODELS is not read), the shipped binary again after every few settings so that a
        # drift of the machine shows. A type's ring setting alone would also move its pair's:
        # the pair is held there at tma_ring_bytes' default (p4, p6, p8: change them with it).
        # 33 runs of tgN.
        local p4=NT_TMA_RING_PAIR_Q4_K=28672 p6=NT_TMA_RING_PAIR_Q6_K=16384 p8=NT_TMA_RING_PAIR_Q8_0=28672
        AB_MODELS=q4_k_m tg_each rings NT_AS_SHIPPED=1 \
            NT_TMA_RING_PAIR_Q4_K=24576 NT_TMA_RING_PAIR_Q4_K=36864 NT_AS_SHIPPED=1 \
            NT_TMA_RING_SLICES4_Q4_K=8192 NT_TMA_RING_SLICES4_Q4_K=16384 NT_TMA_RING_SLICES4_Q4_K=20480 \
            NT_AS_SHIPPED=1 "NT_TMA_RING_Q4_K=12288 $p4" "NT_TMA_RING_Q4_K=20480 $p4" \
            "NT_TMA_RING_Q4_K=24576 $p4" NT_AS_SHIPPED=1 "NT_TMA_RING_Q6_K=12288 $p6" \
            "NT_TMA_RING_Q6_K=20480 $p6" NT_AS_SHIPPED=1
        AB_MODELS=q6_k tg_each rings NT_AS_SHIPPED=1 \
            "NT_TMA_RING_Q6_K=12288 $p6" "NT_TMA_RING_Q6_K=20480 $p6" NT_AS_SHIPPED=1 \
            NT_TMA_RING_PAIR_Q6_K=12288 NT_TMA_RING_PAIR_Q6_K=20480 NT_TMA_RING_PAIR_Q6_K=24576 \
            NT_AS_SHIPPED=1 NT_TMA_RING_SLICES4_Q6_K=16384 NT_TMA_RING_SLICES4_Q6_K=20480 NT_AS_SHIPPED=1
        AB_MODELS=q8_0 tg_each rings NT_AS_SHIPPED=1 \
            NT_TMA_RING_PAIR_Q8_0=20480 NT_TMA_RING_PAIR_Q8_0=36864 NT_AS_SHIPPED=1 \
            "NT_TMA_RING_Q8_0=8192 $p8" "NT_TMA_RING_Q8_0=16384 $p8" "NT_TMA_RING_Q8_0=20480 $p8" \
            NT_AS_SHIPPED=1
        ;;
    70b)
        # Resident 70B Q4_K_M (42.5 GB): the 8B Q8_0 and Q6_K files make room on a 64 GB disk.
        rm -f "$(model q8_0)" "$(model q6_k)"
        mkdir -p "$models"
        run synth_model "$m70" 70b q4_k_m >/dev/null
        run "$nt" bench -m "$m70" --device cuda -p 512 -n 64 -r 2 2>&1 | grep -E "^\||^decode:"
        # The prompt with the CPU's arithmetic (the issue's 1300 tok/s, on the exact path).
        echo "exact: $(NT_EXACT_PROMPT=1 "$nt" bench -m "$m70" --device cuda -p 512 -n 0 -r 2 2>&1 | grep -E "pp512")"
        ;;
    rings70b | l2_70b)
        # 70B tg64, alternating with as shipped (after 70b): rings70b its two-unit column slices'
        # ring (NT_TMA_RING_SLICES_Q4_K, by default the single matrices' 16 KB) at 12 and 20 KB;
        # l2_70b the L2 warm-up (as shipped an eighth of each matrix, 16.5 MB) at none and 4 MiB.
        [ -f "$m70" ] || { echo "no $m70: run the 70b stage first" >&2; return 1; }
        local env a=NT_TMA_RING_SLICES_Q4_K=12288 b=NT_TMA_RING_SLICES_Q4_K=20480
        [ "$1" = l2_70b ] && a=NT_L2_WARM=0 b=NT_L2_WARM=4194304
        for env in NT_AS_SHIPPED=1 $a $b NT_AS_SHIPPED=1 $a $b NT_AS_SHIPPED=1; do
            echo "$1: $env tg64 $(TG_N=64 tg_rate 70b $env)"
        done
        ;;
    tests)
        "$build/tests/nt_gpu_tests" --gtest_brief=1 ${TESTS:+--gtest_filter="$TESTS"} 2>&1 | tee "$out/gpu_tests.log" | tail -n 40
        failed=$(grep -E "^\[  FAILED  \] [A-Za-z_]+\.[A-Za-z_0-9/]+" "$out/gpu_tests.log" | awk '{print $4}' | sort -u | paste -sd: -)
        if [ -n "$failed" ]; then
            for env in NT_PDL_PREFETCH=0 NT_PDL=0; do
                echo "+ $env nt_gpu_tests --gtest_filter=$failed"
                env $env "$build/tests/nt_gpu_tests" --gtest_brief=1 --gtest_filter="$failed" 2>&1 | tail -n 5
            done
            return 1
        fi
        ;;
    profile)
        wait_model q4_k_m || return 1
        run timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum --csv --log-file "$out/ncu.csv" \
            "$nt" bench -m "$(model q4_k_m)" --device cuda -p 0 -n 1 -r 1 >/dev/null 2>&1
        python3 - "$out/ncu.csv" <<'EOF'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head, rows = rows[0], rows[1:]
name, unit, val = head.index("Kernel Name"), head.index("Metric Unit"), head.index("Metric Value")
scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
t = collections.defaultdict(float); c = collections.Counter()
for r in rows:
    k = r[name].split("(")[0]
    t[k] += float(r[val].replace(",", "")) * scale.get(r[unit], 1.0); c[k] += 1
for k, v in sorted(t.items(), key=lambda kv: -kv[1])[:25]:
    print(f"{v:9.1f} us {c[k]:5d} x  {k[:150]}")
print(f"{sum(t.values()):9.1f} us total, {sum(c.values())} kernels")
EOF
        ;;
    sections)
        wait_model q4_k_m || return 1
        run timeout 400 ncu --clock-control none --section SpeedOfLight --section Occupancy \
            --section LaunchStats --section WarpStateStats --metrics dram__bytes_read.sum.per_second \
            --launch-count "${NCU_COUNT:-60}" \
            --kernel-name regex:"gemv|attn|rmsnorm" --page raw --csv --log-file "$out/ncu_sections.csv" \
            "$nt" bench -m "$(model q4_k_m)" --device cuda -p 0 -n 1 -r 1 >/dev/null 2>&1
        python3 bench/cuda/ncu_sections.py "$out/ncu_sections.csv"
        ;;
    timeline)
        cupti_library kernel_trace || return 1
        for t in ${AB_MODELS:-q4_k_m}; do
            wait_model $t || return 1
            echo "timeline: $t"
            NT_TRACE_OUT="$out/trace_$t.csv" injected_decode kernel_trace $t "${TL_TOKENS:-24}" |
                grep -E "\| tg"
            python3 bench/cuda/kernel_timeline.py "$out/trace_$t.csv" --tokens 8
        done
        ;;
    stalls)
        cupti_library pc_stalls || return 1
        for t in ${AB_MODELS:-q4_k_m}; do
            wait_model $t || return 1
            echo "stalls: $t"
            NT_PC_OUT="$out/stalls_$t.csv" NT_PC_DETAIL="${PC_DETAIL:-attn_decode_tiled}" \
                injected_decode pc_stalls $t "${TL_TOKENS:-64}" |
                grep -vE "^\s*$|^\| (model|---)"
        done
        ;;
    phases)
        local pb=${PHASE_BUILD_DIR:-build-phase}
        run cmake -S . -B "$pb" -DCMAKE_BUILD_TYPE=Release -DNT_CUDA=ON -DNT_PHASE_TRACE=ON \
            -DCMAKE_CUDA_ARCHITECTURES=${NT_CUDA_ARCH:-90} >/dev/null &&
            run cmake --build "$pb" -j "$(nproc)" --target ntransformer 2>&1 | grep -E " error"
        [ -x "$pb/ntransformer" ] || return 1
        for t in ${AB_MODELS:-q4_k_m}; do
            wait_model $t || return 1
            echo "phases: $t"
            NT_PHASE_OUT="$out/phases_$t.bin" "$pb/ntransformer" bench -m "$(model $t)" --device cuda \
                -p 0 -n "${TL_TOKENS:-8}" -r 1 2>&1 | grep -E "\| tg|phase trace"
            python3 bench/cuda/phase_timeline.py "$out/phases_$t.bin"
        done
        ;;
    fences)
        with_patch fence_probe.patch fences "" "" NT_FENCE_SC=1 NT_FENCE_SC=0 NT_FENCE_PROBE=1 \
            NT_FENCE_PROBE=2 NT_FENCE_PROBE=3 NT_FENCE_SC=0 NT_FENCE_SC=1
        ;;
    fromfloat)
        # The down projection quantizing the SwiGLU pair's float output itself, by type
        # (NT_GEMV_FROM_FLOAT, a mask: 1 Q4_K, 2 Q6_K; the default 2).
        tg_each "fromfloat" NT_GEMV_FROM_FLOAT=2 NT_GEMV_FROM_FLOAT=0 NT_GEMV_FROM_FLOAT=1 NT_GEMV_FROM_FLOAT=3 NT_GEMV_FROM_FLOAT=2
        ;;
    l2)
        # The feed-forward's first weights requested into L2 by the o projection's warps during
        # the attention (CudaBackend::warm_weights): as shipped (by type and size), none, and by
        # size.
        tg_each l2 NT_AS_SHIPPED=1 NT_L2_WARM=0 NT_L2_WARM=4194304 NT_L2_WARM=8388608 \
            NT_L2_WARM=16777216 NT_AS_SHIPPED=1
        ;;
    l2after)
        # The same requests after the o projection's wait (NT_L2_WARM_AFTER=1: the attention
        # done, o's weights in flight, the norm after it) against before it (as shipped).
        tg_each l2after NT_AS_SHIPPED=1 NT_L2_WARM=0 NT_L2_WARM_AFTER=1 \
            "NT_L2_WARM_AFTER=1 NT_L2_WARM=4194304" "NT_L2_WARM_AFTER=1 NT_L2_WARM=8388608" \
            "NT_L2_WARM_AFTER=1 NT_L2_WARM=16777216" NT_AS_SHIPPED=1 NT_L2_WARM_AFTER=1
        ;;
    ablate)
        # NT_SKIP=<op> (norm, qkv, attn, o, gateup or down, exactly) leaves that op out of
        # one-row decode steps, keeping what the next op expects of its activations: the
        # outputs are wrong, the timing is the step without it. The patch is host code only.
        with_patch ablate_ops.patch ablate "" "" NT_AS_SHIPPED=1 NT_SKIP=norm NT_SKIP=qkv \
            NT_SKIP=attn NT_SKIP=o NT_SKIP=gateup NT_SKIP=down NT_AS_SHIPPED=1
        ;;
    *)
        echo "unknown stage '$1'" >&2
        return 1
        ;;
    esac
}

rc=0
for s in "$@"; do
    echo "== $s"
    stage "$s" || rc=1
done
wait
exit $rc
