#!/usr/bin/env bash
# Builds every libFuzzer target in tests/fuzz (clang, ASan + UBSan, ntcore instrumented too) in
# build-fuzz and runs each for SECONDS seconds. Exits non-zero if any target crashes, leaks, hits
# undefined behaviour or times out; the offending input is left in build-fuzz/artifacts/.
#
#   scripts/run-fuzzers.sh [SECONDS] [TARGET...]     default: 30 s, every tests/fuzz/fuzz_*.cpp
#
# Corpora persist in build-fuzz/corpus/<target>/ between runs. Seeds come from
# tests/fuzz/seeds/<target>/ when present; fuzz_gguf also gets sample files written by gguf-py
# (tests/python/gguf_py_dump.py) when python3 has the gguf package. A dictionary
# tests/fuzz/<target>.dict is used when present.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-30}
shift || true
build=${NT_FUZZ_BUILD_DIR:-$root/build-fuzz}
jobs=${NT_FUZZ_BUILD_JOBS:-2}

if [ $# -gt 0 ]; then
    targets=("$@")
else
    targets=()
    for src in "$root"/tests/fuzz/fuzz_*.cpp; do
        [ -e "$src" ] && targets+=("$(basename "$src" .cpp)")
    done
fi
if [ ${#targets[@]} -eq 0 ]; then
    echo "run-fuzzers: no fuzz targets in tests/fuzz" >&2
    exit 1
fi

cmake -S "$root" -B "$build" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNT_FUZZ=ON -DNT_TESTS=OFF -DNT_CUDA=OFF >/dev/null
cmake --build "$build" -j"$jobs" --target "${targets[@]}"

# Seeds that need tools: small valid files covering every value type, v2 and v3.
seed_gguf() {
    local dir=$1
    mkdir -p "$dir"
    if python3 -c 'import gguf' 2>/dev/null; then
        python3 "$root/tests/python/gguf_py_dump.py" --write-sample "$dir/sample_v3.gguf"
        # v2 has the same layout; only the version field differs.
        python3 - "$dir/sample_v3.gguf" "$dir/sample_v2.gguf" <<'PY'
import sys
b = bytearray(open(sys.argv[1], "rb").read())
b[4:8] = (2).to_bytes(4, "little")
open(sys.argv[2], "wb").write(b)
PY
    fi
}

failed=()
for t in "${targets[@]}"; do
    exe="$build/tests/fuzz/$t"
    corpus="$build/corpus/$t"
    seeds="$build/seeds/$t"
    mkdir -p "$corpus" "$seeds" "$build/artifacts"
    [ -d "$root/tests/fuzz/seeds/$t" ] && cp -r "$root/tests/fuzz/seeds/$t/." "$seeds/"
    [ "$t" = fuzz_gguf ] && seed_gguf "$seeds"
    args=(-max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
          -artifact_prefix="$build/artifacts/$t-")
    [ -f "$root/tests/fuzz/$t.dict" ] && args+=(-dict="$root/tests/fuzz/$t.dict")
    echo "== $t: ${secs}s"
    if "$exe" "${args[@]}" "$corpus" "$seeds" > "$build/$t.log" 2>&1; then
        tail -n 12 "$build/$t.log" | grep -E 'stat::number_of_executed_runs|stat::peak_rss_mb|Done' || true
        echo "== $t: ok ($(ls "$corpus" | wc -l) corpus files)"
    else
        tail -n 60 "$build/$t.log"
        echo "== $t: FAILED (log: $build/$t.log)"
        failed+=("$t")
    fi
done

if [ ${#failed[@]} -gt 0 ]; then
    echo "run-fuzzers: failed: ${failed[*]}" >&2
    exit 1
fi
echo "run-fuzzers: all ${#targets[@]} target(s) ran ${secs}s without a finding"
