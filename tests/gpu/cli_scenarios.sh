#!/usr/bin/env bash
# The command line on the GPU, end to end, where the kernel tests do not reach: prompts longer
# than a step (-b), perplexity's chunks, and --exact giving the CPU backend's results.
#   tests/gpu/cli_scenarios.sh BUILD_DIR MODEL
# Prints one PASS/FAIL line a scenario; exits non-zero if any failed. NT_SCENARIO_DEVICE=cpu runs
# the same commands on the CPU backend (a dry run on a machine without a GPU).
set -uo pipefail
cd "$(dirname "$0")/../.."
nt="$1/ntransformer"
model="$2"
gpu=${NT_SCENARIO_DEVICE:-cuda}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() {  # name, then the command; PASS when it exits 0
    local name=$1
    shift
    if "$@" >"$tmp/out" 2>"$tmp/err"; then
        echo "PASS $name"
    else
        echo "FAIL $name: $(tail -n 2 "$tmp/err" | tr '\n' ' ')"
        fail=1
    fi
}
# A long prompt (about 350 tokens for SmolLM2), 16 greedy tokens after it.
gen=(-p "$(head -c 1500 tests/data/sample.txt | tr '\n' ' ')" -n 16 --temp 0 -c 4096)
# generate on the GPU with the arguments given prints the CPU backend's text.
cpu_text() {
    "$nt" generate -m "$model" --device cpu "${gen[@]}" >"$tmp/cpu" || return 1
    "$nt" generate -m "$model" --device "$gpu" "$@" "${gen[@]}" >"$tmp/gpu" || return 1
    cmp -s "$tmp/cpu" "$tmp/gpu" ||
        { echo "texts differ: '$(head -c 80 "$tmp/cpu")' / '$(head -c 80 "$tmp/gpu")'" >&2; return 1; }
}
# perplexity on the GPU with the arguments given prints the CPU backend's estimate.
cpu_ppl() {
    local a b
    a=$("$nt" perplexity -m "$model" -f tests/data/sample.txt --chunks 3 -c 512 --device cpu 2>&1 |
        grep "^Final estimate") || return 1
    b=$("$nt" perplexity -m "$model" -f tests/data/sample.txt --chunks 3 -c 512 --device "$gpu" "$@" 2>&1 |
        grep "^Final estimate") || return 1
    [ "$a" = "$b" ] || { echo "'$a' / '$b'" >&2; return 1; }
}

check "bench: a prompt of 1024 in steps of 256" \
    "$nt" bench -m "$model" --device "$gpu" -p 1024 -b 256 -n 8 -r 1 -c 2048
check "perplexity: chunks of 512 in steps of 128" \
    "$nt" perplexity -m "$model" -f tests/data/sample.txt --chunks 2 -c 512 -b 128 --device "$gpu"
check "--exact: generate gives the CPU's text, the prompt in one step" cpu_text --exact
check "--exact: generate gives the CPU's text, the prompt in steps of 64" cpu_text --exact -b 64
check "--exact: perplexity gives the CPU's estimate, chunks in steps of 128" cpu_ppl --exact -b 128
exit $fail
