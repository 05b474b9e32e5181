#!/usr/bin/env python3
"""Aggregate generation throughput of `ntransformer serve` at several numbers of concurrent clients.

Each client (the official openai client, one thread each) sends /v1/completions requests back to
back: a short prompt, max_tokens tokens with end-of-generation banned, so every request decodes
exactly max_tokens. Throughput is the server's own count (nt_generated_tokens_total) over the
measuring window, after a warm-up; the average batch is step tokens per forward step.

  bench/server/bench_server.py -m models/SmolLM2-135M-Instruct.Q4_1.gguf --clients 1,8,32
"""
import argparse
import json
import os
import pathlib
import platform
import subprocess
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "python"))
from server_helpers import Server  # noqa: E402

PROMPTS = ["Once upon a time", "The history of the bicycle", "A recipe for bread:", "Dear diary, today",
           "The ocean is", "In the year 2100,", "My favourite book is", "The mountain village"]


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def measure(server, model_id, eog_bias, clients, seconds, warmup, max_tokens):
    stop = threading.Event()
    latencies, errors, lock = [], [], threading.Lock()

    def loop(i):
        client = server.client()
        k = i
        while not stop.is_set():
            t0 = time.time()
            try:
                r = client.completions.create(model=model_id, prompt=PROMPTS[k % len(PROMPTS)], max_tokens=max_tokens,
                                              temperature=0.8, logit_bias=eog_bias)
                assert r.usage.completion_tokens == max_tokens
                with lock:
                    latencies.append(time.time() - t0)
            except Exception as e:  # reported, and the run fails
                with lock:
                    errors.append(repr(e))
            k += 1

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    time.sleep(warmup)
    m0, t0 = server.metrics(), time.time()
    time.sleep(seconds)
    m1, t1 = server.metrics(), time.time()
    stop.set()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit(f"{len(errors)} failed requests, e.g. {errors[0]}")
    dt = t1 - t0
    gen = m1["nt_generated_tokens_total"] - m0["nt_generated_tokens_total"]
    steps = m1["nt_steps_total"] - m0["nt_steps_total"]
    step_tokens = m1["nt_step_tokens_total"] - m0["nt_step_tokens_total"]
    step_secs = m1["nt_step_seconds_total"] - m0["nt_step_seconds_total"]
    lat = sorted(latencies)
    return {
        "clients": clients,
        "tok_s": gen / dt,
        "per_client_tok_s": gen / dt / clients,
        "avg_batch": step_tokens / steps if steps else 0,
        "step_ms": 1000 * step_secs / steps if steps else 0,
        "busy": step_secs / dt,
        "p50_s": lat[len(lat) // 2] if lat else 0,
        "requests": len(lat),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--build", default=os.environ.get("NT_BUILD_DIR", str(ROOT / "build")))
    ap.add_argument("--clients", default="1,8,32")
    ap.add_argument("--parallel", type=int, default=0, help="server slots (default: the largest client count)")
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--warmup", type=float, default=5)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    args = ap.parse_args()
    levels = [int(c) for c in args.clients.split(",")]
    parallel = args.parallel or max(levels)
    cli = str(pathlib.Path(args.build) / "ntransformer")
    tok = subprocess.run([cli, "tokenize", "-m", args.model, "-p", "<|im_end|><|endoftext|>", "--ids"],
                         capture_output=True, text=True, check=True)
    eog_bias = {str(t): -100 for t in json.loads(tok.stdout)}
    server = Server(cli, args.model, "--parallel", str(parallel), "--queue", str(2 * max(levels)), ctx=args.ctx,
                    device=args.device)
    try:
        model_id = server.client().models.list().data[0].id
        load = os.getloadavg()
        print(f"# {cpu_name()}, {os.cpu_count()} threads; load average {load[0]:.1f} before the run")
        print(f"# ntransformer serve -m {pathlib.Path(args.model).name} --device {args.device} --parallel {parallel} "
              f"-c {args.ctx}; "
              f"{args.max_tokens} tokens per request, {args.seconds:.0f} s per level after {args.warmup:.0f} s warm-up")
        print("| clients | aggregate tok/s | tok/s per client | avg batch (tokens/step) | step ms | engine busy | "
              "p50 request s |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for n in levels:
            r = measure(server, model_id, eog_bias, n, args.seconds, args.warmup, args.max_tokens)
            print(f"| {n} | {r['tok_s']:.1f} | {r['per_client_tok_s']:.1f} | {r['avg_batch']:.1f} | "
                  f"{r['step_ms']:.1f} | {100 * r['busy']:.0f}% | {r['p50_s']:.2f} |", flush=True)
        print(f"# load average {os.getloadavg()[0]:.1f} after the run")
    finally:
        server.close()


if __name__ == "__main__":
    main()
