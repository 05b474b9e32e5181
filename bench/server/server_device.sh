#!/usr/bin/env bash
# The HTTP server on a GPU machine that has no cpp-httplib, nlohmann-json or package registry:
# builds `ntransformer serve` against the copies in .deps/ and installs the openai client from
# .whl/openai (both made by scripts/vendor-deps.sh), then measures aggregate throughput at 1, 8 and
# 32 clients with bench/server/bench_server.py. Stages, each a few minutes:
#   bench/server/server_device.sh build   # configure (must say "HTTP server: enabled") + build ntransformer
#   bench/server/server_device.sh smoke   # libcpp-httplib and brotli resolve from .deps; one request, openai client
#   bench/server/server_device.sh 8b      # 8B resident in VRAM: 5 s warm-up + 30 s per level, ~2 min
#   bench/server/server_device.sh 70b     # 70B, --vram-budget 24G --ram-budget 48G: 15 + 45 s per level, ~3 min + load
# Env: NT_BUILD_DIR (build-gpu), DEPS (.deps), WHL (.whl/openai), SITE (/tmp/nt-site: where the
# wheels are unpacked), M8, M70 (models/synth/llama-{8b,70b}-q4_k_m.gguf), CLIENTS (1,8,32), OUT
# (each stage's log, and the benchmarks' JSON, go there). A dry run on a machine without a GPU:
# NT_CUDA=OFF DEVICE=cpu M8=models/SmolLM2-135M-Instruct.Q4_1.gguf bench/server/server_device.sh build smoke.
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${NT_BUILD_DIR:-build-gpu}
deps=$(realpath -m "${DEPS:-.deps}")
whl=${WHL:-.whl/openai}
site=${SITE:-/tmp/nt-site}
m8=${M8:-models/synth/llama-8b-q4_k_m.gguf}
m70=${M70:-models/synth/llama-70b-q4_k_m.gguf}
clients=${CLIENTS:-1,8,32}
device=${DEVICE:-cuda}
out=${OUT:-}
nt="$build/ntransformer"

run() {
    echo "+ $*"
    "$@"
}

# The openai client: already importable, or unpacked from the wheels (pip when there is one; a
# wheel is a zip file, so plain unzipping installs it too).
python_deps() {
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    python3 -c "import openai; openai.OpenAI" 2>/dev/null && return 0  # a 1.x client or later
    mkdir -p "$site"
    python3 -m pip install -q --no-index --no-deps --target "$site" "$whl"/*.whl 2>/dev/null ||
        for w in "$whl"/*.whl; do python3 -m zipfile -e "$w" "$site" || return 1; done
    python3 -c "import openai; print('openai', openai.__version__, 'from', openai.__file__)"
}

bench() {  # bench NAME MODEL [bench_server.py arguments...]
    local name=$1 model=$2
    shift 2
    python_deps || return 1
    run python3 bench/server/bench_server.py --build "$build" -m "$model" --device "$device" --clients "$clients" \
        ${out:+--json "$out/server-$name.json"} "$@"
}

stage() {
    case "$1" in
    build)
        mkdir -p "$build"
        run cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DNT_CUDA=${NT_CUDA:-ON} -DCMAKE_CUDA_ARCHITECTURES=${NT_CUDA_ARCH:-90} \
            -DNT_TESTS=OFF -DCMAKE_PREFIX_PATH="$deps/httplib;$deps/nlohmann_json" >"$build/configure.log" 2>&1 ||
            { cat "$build/configure.log"; return 1; }
        grep -E "HTTP server|CUDA compiler identification" "$build/configure.log"
        grep -q "HTTP server: enabled" "$build/configure.log" || return 1
        run cmake --build "$build" -j "$(nproc)" --target ntransformer 2>&1 | grep -E "error:|warning:|Built target ntransformer"
        test "${PIPESTATUS[0]}" = 0
        ;;
    smoke)
        local libs
        libs=$(ldd "$nt") || return 1
        grep -E "httplib|brotli|ssl|crypto|libz|not found" <<<"$libs"
        if grep -q "not found" <<<"$libs"; then return 1; fi
        python_deps || return 1
        run python3 - "$nt" "$m8" "$device" <<'EOF'
import sys
sys.path.insert(0, "tests/python")
from server_helpers import Server
s = Server(sys.argv[1], sys.argv[2], device=sys.argv[3], ctx=256, start_timeout=300)
try:
    c = s.client()
    r = c.completions.create(model=c.models.list().data[0].id, prompt="Once upon a time", max_tokens=8)
    print("smoke:", "".join(s.log).strip(), "|", r.usage, "|", s.health())
finally:
    s.close()
EOF
        ;;
    8b)
        bench 8b "$m8" --seconds 30 --warmup 5 --max-tokens 64
        ;;
    70b)
        bench 70b "$m70" --seconds 45 --warmup 15 --max-tokens 32 -- --vram-budget 24G --ram-budget 48G
        ;;
    *)
        echo "unknown stage '$1'" >&2
        return 1
        ;;
    esac
}

status=0
for s in "$@"; do
    echo "== $s"
    if [ -n "$out" ]; then
        mkdir -p "$out"
        stage "$s" 2>&1 | tee "$out/$s.log"
        rc=${PIPESTATUS[0]}
    else
        stage "$s"
        rc=$?
    fi
    [ "$rc" = 0 ] || { echo "== $s failed ($rc)"; status=1; break; }
done
exit $status
