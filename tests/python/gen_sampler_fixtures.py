#!/usr/bin/env python3
"""Runs llama.cpp's own samplers (through llama-cpp-python) on random logits and writes what they
produce into the fixture that tests/unit/test_sampler.cpp compares our Sampler against.

Per case, llama.cpp applies the default chain without the final draw: penalties (after accepting
a token history) -> top-k -> top-p -> min-p -> temperature. The fixture records the logits after
the penalties alone, and the surviving candidates with their probabilities (softmax of the
temperature-scaled logits llama.cpp leaves, in float64). Greedy cases (temperature 0) leave one.

Usage: gen_sampler_fixtures.py [--out PATH]
Format (floats in numpy's shortest float32 repr, which strtof reads back exactly):
  case NAME / vocab V / params top_k top_p min_p temperature repeat_penalty repeat_last_n
  frequency_penalty presence_penalty / logits V floats / accepted N ids /
  penalized N id:value (only the changed entries) / kept N id:prob / end
"""
import argparse
import ctypes
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "sampler_fixtures.txt")

# name, vocab, top_k, top_p, min_p, temperature, repeat_penalty, repeat_last_n, freq, presence
CASES = [
    ("defaults", 4096, 40, 0.95, 0.05, 0.8, 1.0, 64, 0.0, 0.0),
    ("defaults_penalised", 4096, 40, 0.95, 0.05, 0.8, 1.1, 64, 0.0, 0.0),
    ("top_p_whole_vocab", 4096, 0, 0.9, 0.0, 1.0, 1.0, 64, 0.0, 0.0),
    ("min_p_whole_vocab", 700, 0, 1.0, 0.02, 1.3, 1.0, 64, 0.0, 0.0),
    ("top_k_only", 700, 25, 1.0, 0.0, 0.7, 1.0, 64, 0.0, 0.0),
    ("top_k_large_then_top_p", 4096, 1000, 0.97, 0.0, 1.2, 1.0, 64, 0.0, 0.0),
    ("all_penalties_window_16", 700, 40, 0.95, 0.05, 0.8, 1.3, 16, 0.2, 0.4),
    ("all_penalties_whole_history", 700, 60, 0.99, 0.01, 1.5, 1.2, -1, 0.1, 0.3),
    ("negative_penalties", 700, 40, 0.95, 0.05, 0.8, 0.8, 64, -0.3, -0.5),
    ("untruncated", 64, 0, 1.0, 0.0, 1.0, 1.0, 64, 0.0, 0.0),
    ("untruncated_hot", 64, 0, 1.0, 0.0, 2.0, 1.0, 64, 0.5, 0.0),
    ("greedy", 700, 40, 0.95, 0.05, 0.0, 1.0, 64, 0.0, 0.0),
    ("greedy_penalised", 700, 40, 0.95, 0.05, 0.0, 1.5, 64, 0.5, 1.0),
]


def f32(x):
    return repr(np.float32(x)).replace("np.float32(", "").rstrip(")")


def token_array(logits):
    import llama_cpp

    n = len(logits)
    data = (llama_cpp.llama_token_data * n)()
    for i, x in enumerate(logits):
        data[i].id, data[i].logit, data[i].p = i, float(x), 0.0
    arr = llama_cpp.llama_token_data_array(
        data=ctypes.cast(data, ctypes.POINTER(llama_cpp.llama_token_data)), size=n, selected=-1,
        sorted=False)
    return data, arr


def run_case(seed, case):
    import llama_cpp

    name, V, top_k, top_p, min_p, temp, rp, last_n, freq, pres = case
    rng = np.random.default_rng(seed)
    logits = rng.normal(0.0, 2.5, V).astype(np.float32)
    # A history that repeats likely tokens, so that the penalties matter.
    top = np.argsort(-logits, kind="stable")[:30]
    history = [int(t) for t in rng.choice(top, size=48)] + [int(t) for t in rng.integers(0, V, 8)]
    window = len(history) if last_n < 0 else last_n  # llama.cpp's common layer: -1 = context

    def penalties():
        s = llama_cpp.llama_sampler_init_penalties(V, window, rp, freq, pres)
        for t in history:
            llama_cpp.llama_sampler_accept(s, t)
        return s

    # Penalties alone, to record the penalised logits.
    data, arr = token_array(logits)
    s = penalties()
    llama_cpp.llama_sampler_apply(s, ctypes.byref(arr))
    llama_cpp.llama_sampler_free(s)
    penalised = {data[i].id: np.float32(data[i].logit) for i in range(arr.size)}
    changed = [(i, penalised[i]) for i in range(V) if penalised[i] != logits[i]]

    # The chain.
    data, arr = token_array(logits)
    chain = [penalties(), llama_cpp.llama_sampler_init_top_k(top_k),
             llama_cpp.llama_sampler_init_top_p(top_p, 0),
             llama_cpp.llama_sampler_init_min_p(min_p, 0), llama_cpp.llama_sampler_init_temp(temp)]
    for s in chain:
        llama_cpp.llama_sampler_apply(s, ctypes.byref(arr))
        llama_cpp.llama_sampler_free(s)
    kept = [(data[i].id, float(np.float32(data[i].logit))) for i in range(arr.size)]
    kept = [(i, l) for i, l in kept if np.isfinite(l)]  # temperature 0 leaves -inf behind
    m = max(l for _, l in kept)
    w = np.array([np.exp(l - m) for _, l in kept])
    probs = w / w.sum()
    # The candidate order is llama.cpp's; sort by id so the fixture does not depend on it.
    kept_probs = sorted(zip([i for i, _ in kept], probs))

    # Ties near the top would let llama.cpp's unstable sort pick either token; avoid them.
    assert len(set(logits[top].tolist())) == len(top), name

    out = [f"case {name}", f"vocab {V}",
           "params " + " ".join(str(x) for x in (top_k, f32(top_p), f32(min_p), f32(temp), f32(rp),
                                               last_n, f32(freq), f32(pres))),
           "logits " + " ".join(f32(x) for x in logits),
           f"accepted {len(history)} " + " ".join(str(t) for t in history),
           f"penalized {len(changed)} " + " ".join(f"{i}:{f32(v)}" for i, v in changed),
           f"kept {len(kept_probs)} " + " ".join(f"{i}:{p:.17g}" for i, p in kept_probs),
           "end"]
    return "\n".join(out) + "\n"


def build():
    text = ("# Generated by tests/python/gen_sampler_fixtures.py from llama.cpp's samplers "
            "(llama-cpp-python); do not edit.\n")
    for k, case in enumerate(CASES):
        text += run_case(1000 + k, case)
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args()
    text = build()
    with open(args.out, "w") as f:
        f.write(text)
    print(f"wrote {args.out} ({len(text)} bytes)")


if __name__ == "__main__":
    main()
