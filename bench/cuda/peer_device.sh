#!/usr/bin/env bash
# ntransformer against llama.cpp on the same GPU machine, same synthetic files, alternating in
# one run (DESIGN.md's peer; a figure without it in the same run is not a comparison):
#   scripts/vendor-peer.sh                 # here: packs llama.cpp's source into .peer/
#   bench/cuda/peer_device.sh              # there: builds both, benches
# Carry .peer (and .deps) in the first call only: a later call that carries .peer again replaces
# the folder there, and with it the llama.cpp build kept in .peer/build.
# Builds llama-bench (CUDA, sm_90 unless NT_CUDA_ARCH, flash attention on at run time) into
# .peer/build and ntransformer into NT_BUILD_DIR, writes the synthetic 8B models (PEER_MODELS,
# default "q4_k_m q6_k q8_0"), then runs `ntransformer bench -p 512 -n 128 -r 3` and
# `llama-bench -p 512 -n 128 -r 3 -ngl 99 -fa on` on each and prints one markdown table with the
# ratio. PEER_70B=1 adds the resident 70B Q4_K_M (tg64; the 8B Q6_K and Q8_0 files make room).
# Building takes about 6 minutes on 16 cores: where it has taken more than PEER_BUILD_LIMIT
# seconds (default 330) the script stops after it; run it again on the warm machine (both
# builds are kept) for the benches. Env as bench/device_env.sh; OUT keeps the logs.
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/device_env.sh
out=${OUT:-/tmp}
t0=$(date +%s)
lb=.peer/build/bin/llama-bench
[ -f .peer/llamacpp.tar.xz ] || { echo "no .peer/llamacpp.tar.xz: run scripts/vendor-peer.sh first and carry .peer" >&2; exit 1; }
cat .peer/VERSION 2>/dev/null
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null

peer_build=""
if [ ! -x "$lb" ]; then
    (
        rm -rf .peer/src && mkdir -p .peer/src && tar -xJf .peer/llamacpp.tar.xz -C .peer/src &&
            cmake -S .peer/src/llama.cpp -B .peer/build -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
                -DCMAKE_CUDA_ARCHITECTURES=${NT_CUDA_ARCH:-90} -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
                -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
                -DLLAMA_BUILD_APP=OFF >/dev/null &&
            cmake --build .peer/build -j "$(nproc)" --target llama-bench
    ) >"$out/peer_build.log" 2>&1 &
    peer_build=$!
fi
# Ours always (incremental: the tree may have changed since a warm machine's last build).
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DNT_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=${NT_CUDA_ARCH:-90} >/dev/null &&
    cmake --build "$build" -j "$(nproc)" --target ntransformer 2>&1 | grep -E " error"
MODELS_TYPES="${PEER_MODELS:-q4_k_m q6_k q8_0}"
mkdir -p "$models"
for t in $MODELS_TYPES; do synth_model "$models/llama-8b-$t.gguf" 8b "$t" >/dev/null; done
if [ -n "$peer_build" ]; then
    wait "$peer_build" || { echo "llama.cpp did not build: $out/peer_build.log" >&2; grep -E "error" "$out/peer_build.log" | head -5; exit 1; }
fi
[ -x "$nt" ] && [ -x "$lb" ] || { echo "a build is missing" >&2; exit 1; }
took=$(($(date +%s) - t0))
if [ "$took" -gt "${PEER_BUILD_LIMIT:-330}" ]; then
    echo "built in $took s: run again (on the warm machine) for the benches"
    exit 0
fi

# One model: both engines, their rows as "engine|test|t/s" lines in $out/peer_rows.txt.
both() {
    local name=$1 m=$2 n=$3 r=$4
    "$nt" bench -m "$m" --device cuda -p 512 -n "$n" -r "$r" 2>&1 | tee -a "$out/peer_ours.log" |
        awk -F'|' -v k="$name" '/\| (pp|tg)[0-9]+ /{gsub(/ /,"",$6); print k "|ours|" $6 "|" $7}' >>"$out/peer_rows.txt"
    "$lb" -m "$m" -p 512 -n "$n" -r "$r" -ngl 99 -fa on -o md 2>&1 | tee -a "$out/peer_llamacpp.log" |
        awk -F'|' -v k="$name" '/\| +(pp|tg)[0-9]+ /{t=$(NF-2); gsub(/ /,"",t); print k "|llama.cpp|" t "|" $(NF-1)}' >>"$out/peer_rows.txt"
}
: >"$out/peer_rows.txt"
for t in $MODELS_TYPES; do both "8B $t" "$models/llama-8b-$t.gguf" 128 3; done
if [ "${PEER_70B:-0}" = 1 ]; then
    rm -f "$models/llama-8b-q8_0.gguf" "$models/llama-8b-q6_k.gguf"
    synth_model "$m70" 70b q4_k_m >/dev/null
    both "70B q4_k_m" "$m70" 64 2
fi
python3 - "$out/peer_rows.txt" <<'EOF'
import collections, re, sys
rows = collections.OrderedDict()
for line in open(sys.argv[1]):
    model, engine, test, ts = [f.strip() for f in line.split("|")]
    rows.setdefault((model, test), {})[engine] = ts
print("| model | test | ntransformer (t/s) | llama.cpp (t/s) | ours / llama.cpp |")
print("| --- | --- | ---: | ---: | ---: |")
def num(s):  # "438.69 ± 0.11" -> 438.69
    m = re.match(r"[0-9.]+", s)
    return float(m.group(0)) if m else None
for (model, test), e in rows.items():
    a, b = e.get("ours", "-"), e.get("llama.cpp", "-")
    ra = f"{num(a) / num(b):.2f}" if num(a) and num(b) else "-"
    print(f"| {model} | {test} | {a} | {b} | {ra} |")
EOF
echo "total $(($(date +%s) - t0)) s"
