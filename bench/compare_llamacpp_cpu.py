#!/usr/bin/env python3
"""Side-by-side CPU throughput: ntransformer against llama.cpp (llama-cpp-python's CPU build).

  bench/compare_llamacpp_cpu.py MODEL.gguf [--build build] [-p 512] [-n 128] [-r 3] [-t THREADS]

Both engines run the same file with the same thread count, one after the other in this run:
prompt processing of p random tokens in one batch, and n single-token decode steps from an empty
context (llama-bench's pp/tg tests). Prints a markdown table with the ratio ours / llama.cpp.
"""
import argparse
import json
import os
import subprocess
import time

import numpy as np
import llama_cpp


def llama_cpp_bench(model, p, n, reps, threads):
    m = llama_cpp.Llama(model_path=model, n_ctx=max(p, n) + 16, n_batch=p, n_ubatch=p, n_threads=threads,
                        n_threads_batch=threads, verbose=False, logits_all=False)
    n_vocab = m.n_vocab()
    rng = np.random.default_rng(1234)
    pp, tg = [], []
    for r in range(reps + 1):  # first round is a warm-up
        toks = rng.integers(0, n_vocab, size=p).tolist()
        m.reset()  # eval() then drops the cached positions from 0 on
        t0 = time.perf_counter()
        m.eval(toks)
        dt = time.perf_counter() - t0
        if r:
            pp.append(p / dt)
        m.reset()  # eval() then drops the cached positions from 0 on
        t0 = time.perf_counter()
        for i in range(n):
            m.eval([int(rng.integers(0, n_vocab))])
        dt = time.perf_counter() - t0
        if r:
            tg.append(n / dt)
    return np.mean(pp), np.std(pp), np.mean(tg), np.std(tg)


def ours_bench(build, model, p, n, reps, threads):
    out = subprocess.run([os.path.join(build, "ntransformer"), "bench", "-m", model, "-p", str(p), "-n", str(n), "-r",
                          str(reps), "-t", str(threads), "--device", "cpu", "--json"], capture_output=True, text=True,
                         check=True).stdout
    j = json.loads(out)
    return j["pp"]["tok_s"], j["pp"]["sd"], j["tg"]["tok_s"], j["tg"]["sd"], j


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--build", default="build")
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("-t", type=int, default=os.cpu_count())
    a = ap.parse_args()
    o = ours_bench(a.build, a.model, a.p, a.n, a.r, a.t)
    l = llama_cpp_bench(a.model, a.p, a.n, a.r, a.t)
    print(f"model: {os.path.basename(a.model)}, threads: {a.t}, cpu: {os.cpu_count()} cores")
    print("| test | ntransformer t/s | llama.cpp t/s | ours / llama.cpp |")
    print("| --- | ---: | ---: | ---: |")
    print(f"| pp{a.p} | {o[0]:.2f} ± {o[1]:.2f} | {l[0]:.2f} ± {l[1]:.2f} | {o[0] / l[0]:.2f} |")
    print(f"| tg{a.n} | {o[2]:.2f} ± {o[3]:.2f} | {l[2]:.2f} ± {l[3]:.2f} | {o[2] / l[2]:.2f} |")
    j = o[4]
    print(f"\ndecode reads {j['decode_bytes_per_token'] / 2**20:.1f} MiB/token: ours {j['decode_gb_s']:.1f} GB/s "
          f"of a measured {j['ceiling_gb_s']:.1f} GB/s memory ceiling ({100 * j['fraction_of_ceiling']:.0f}%)")


if __name__ == "__main__":
    main()
