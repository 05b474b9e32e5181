#!/usr/bin/env python3
"""Aggregate generation throughput of `ntransformer serve` at several numbers of concurrent clients.

Each client (the official openai client, one thread each) streams /v1/completions requests back to
back: a short prompt, max_tokens tokens with the model's end-of-generation tokens banned. Throughput
is the server's own count (nt_generated_tokens_total) over the measuring window, after a warm-up;
the average batch is step tokens per forward step. When a window closes, the clients drop their
streams (the server cancels those requests) and the next level starts on an idle server, so a
level costs warm-up + window + about one step.

  bench/server/bench_server.py -m models/SmolLM2-135M-Instruct.Q4_1.gguf --clients 1,8,32
  bench/server/bench_server.py -m 70b.gguf --device cuda --seconds 45 --max-tokens 32 \\
      --json out.json -- --vram-budget 24G --ram-budget 48G

Arguments after `--` go to `ntransformer serve` as they are.
"""
import argparse
import json
import os
import pathlib
import platform
import re
import shlex
import subprocess
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "python"))
from server_helpers import Server  # noqa: E402

PROMPTS = ["Once upon a time", "The history of the bicycle", "A recipe for bread:", "Dear diary, today",
           "The ocean is", "In the year 2100,", "My favourite book is", "The mountain village"]
# End-of-generation tokens that a vocabulary may have besides the ids in its metadata.
EOG_TEXTS = ["<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<|eom_id|>", "</s>"]


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def gpu_names():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired):
        return []


def model_facts(cli, model):
    """(general.name, end-of-generation token ids): the ids from the metadata (eos/eot/eom) and any
    of EOG_TEXTS that the tokenizer reads as one special token."""
    info = subprocess.run([cli, "info", "-m", model], capture_output=True, text=True, check=True).stdout
    name = re.search(r"^\s*general\.name\s+(.*)$", info, re.M)
    ids = {int(m) for m in re.findall(r"^\s*tokenizer\.ggml\.eo[stm]_token_id\s+(\d+)\s*$", info, re.M)}
    for text in EOG_TEXTS:
        tok = subprocess.run([cli, "tokenize", "-m", model, "-p", text, "--ids", "--no-bos"], capture_output=True,
                             text=True, check=True)
        got = json.loads(tok.stdout)
        if len(got) == 1:
            ids.add(got[0])
    return (name.group(1).strip().strip('"') if name else pathlib.Path(model).name), sorted(ids)


def measure(server, model_id, eog_bias, clients, seconds, warmup, max_tokens, top_k=0):
    stop = threading.Event()
    done, errors, lock = [], [], threading.Lock()  # done: (seconds, first-token seconds, tokens)

    def loop(i):
        client = server.client()
        k = i
        while not stop.is_set():
            t0 = time.time()
            first, tokens, finished = None, 0, False
            try:
                extra = {"logit_bias": eog_bias} if eog_bias else {}
                if top_k:
                    extra["extra_body"] = {"top_k": top_k}
                stream = client.completions.create(model=model_id, prompt=PROMPTS[k % len(PROMPTS)],
                                                   max_tokens=max_tokens, temperature=0.8, stream=True,
                                                   stream_options={"include_usage": True}, **extra)
                with stream:  # leaving early closes the connection: the server cancels the request
                    for chunk in stream:
                        if first is None and chunk.choices and chunk.choices[0].text:
                            first = time.time() - t0
                        if chunk.usage:
                            tokens, finished = chunk.usage.completion_tokens, True
                        if stop.is_set():
                            break
                if finished:
                    with lock:
                        done.append((time.time() - t0, first or 0.0, tokens))
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
    idle_s = server.wait_idle(timeout=120)
    dt = t1 - t0
    gen = m1["nt_generated_tokens_total"] - m0["nt_generated_tokens_total"]
    steps = m1["nt_steps_total"] - m0["nt_steps_total"]
    step_tokens = m1["nt_step_tokens_total"] - m0["nt_step_tokens_total"]
    step_secs = m1["nt_step_seconds_total"] - m0["nt_step_seconds_total"]
    full = [d for d in done if d[2] == max_tokens]
    lat = sorted(d[0] for d in full)
    ttft = sorted(d[1] for d in full)
    return {
        "clients": clients,
        "window_s": round(dt, 2),
        "generated_tokens": int(gen),
        "tok_s": gen / dt,
        "per_client_tok_s": gen / dt / clients,
        "steps": int(steps),
        "avg_batch": step_tokens / steps if steps else 0,
        "step_ms": 1000 * step_secs / steps if steps else 0,
        "busy": step_secs / dt,
        "p50_s": lat[len(lat) // 2] if lat else None,
        "p50_first_token_s": ttft[len(ttft) // 2] if ttft else None,
        "requests_done": len(full),
        "requests_short": len(done) - len(full),  # ended at an end-of-generation token not banned
        "drain_s": round(idle_s, 2),
    }


def fmt_s(v):
    return "—" if v is None else f"{v:.2f}"


def main():
    argv = sys.argv[1:]
    serve_extra = []
    if "--" in argv:
        at = argv.index("--")
        argv, serve_extra = argv[:at], argv[at + 1:]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--build", default=os.environ.get("NT_BUILD_DIR", str(ROOT / "build")),
                    help="build folder holding ntransformer (default: $NT_BUILD_DIR, else build/)")
    ap.add_argument("--clients", default="1,8,32")
    ap.add_argument("--parallel", type=int, default=0, help="server slots (default: the largest client count)")
    ap.add_argument("--seconds", type=float, default=30, help="measuring window per level")
    ap.add_argument("--warmup", type=float, default=5, help="seconds of load before each window")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens per request")
    ap.add_argument("--top-k", type=int, default=0,
                    help="send llama.cpp's top_k extension (0: OpenAI's plain temperature sampling over the "
                         "whole vocabulary, which a GPU server samples on the host)")
    ap.add_argument("--allow-eog", action="store_true",
                    help="send no logit_bias (requests may end early at an end-of-generation token); "
                         "a lone request then decodes fed on the device, which a bias rules out")
    ap.add_argument("--ctx", type=int, default=512, help="context per slot")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    ap.add_argument("--start-timeout", type=float, default=900,
                    help="seconds the server may take to load the model (a streamed 70B pins and plans first)")
    ap.add_argument("--json", help="also write the results, the commands and the machine to this file")
    args = ap.parse_args(argv)
    levels = [int(c) for c in args.clients.split(",")]
    parallel = args.parallel or max(levels)
    cli = str(pathlib.Path(args.build) / "ntransformer")
    if not os.access(cli, os.X_OK):
        raise SystemExit(f"{cli} is not an executable; build it, or point --build (or NT_BUILD_DIR) at its folder.")
    model_name, eog_ids = model_facts(cli, args.model)
    eog_bias = None if args.allow_eog else {str(t): -100 for t in eog_ids}
    serve_args = ["--parallel", str(parallel), "--queue", str(2 * max(levels)), *serve_extra]
    serve_cmd = (f"ntransformer serve -m {pathlib.Path(args.model).name} --device {args.device} -c {args.ctx} "
                 + shlex.join(serve_args))
    t_start = time.time()
    server = Server(cli, args.model, *serve_args, ctx=args.ctx, device=args.device, start_timeout=args.start_timeout,
                    stop_timeout=120)
    load_s = time.time() - t_start
    results = []
    try:
        model_id = server.client().models.list().data[0].id
        load = os.getloadavg()
        gpus = gpu_names() if args.device != "cpu" else []
        print(f"# {shlex.join(['bench/server/bench_server.py', *sys.argv[1:]])}")
        print(f"# {cpu_name()}, {os.cpu_count()} threads" + (f"; GPU {', '.join(gpus)}" if gpus else "")
              + f"; load average {load[0]:.1f} before the run")
        print(f"# {model_name}: {serve_cmd}; ready in {load_s:.0f} s")
        for line in server.log:
            print(f"#   serve: {line.rstrip()}")
        print(f"# {args.max_tokens} tokens per request (end-of-generation ids {eog_ids} "
              f"{'allowed' if args.allow_eog else 'banned'}), temperature 0.8"
              + (f", top-k {args.top_k}" if args.top_k else "") + ", "
              f"{args.seconds:g} s per level after {args.warmup:g} s warm-up")
        print("| clients | aggregate tok/s | tok/s per client | avg batch (tokens/step) | step ms | engine busy | "
              "p50 request s | p50 first token s |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |", flush=True)
        for n in levels:
            r = measure(server, model_id, eog_bias, n, args.seconds, args.warmup, args.max_tokens, args.top_k)
            results.append(r)
            print(f"| {n} | {r['tok_s']:.1f} | {r['per_client_tok_s']:.2f} | {r['avg_batch']:.1f} | "
                  f"{r['step_ms']:.1f} | {100 * r['busy']:.0f}% | {fmt_s(r['p50_s'])} | "
                  f"{fmt_s(r['p50_first_token_s'])} |", flush=True)
        print(f"# load average {os.getloadavg()[0]:.1f} after the run; "
              + "; ".join(f"{r['clients']} clients: {r['requests_done']} requests completed "
                          f"({r['requests_short']} ended early), idle {r['drain_s']} s after" for r in results))
    finally:
        if args.json:
            pathlib.Path(args.json).write_text(json.dumps({
                "command": shlex.join(["bench/server/bench_server.py", *sys.argv[1:]]),
                "serve": serve_cmd, "model": model_name, "model_file": args.model, "load_s": round(load_s, 1),
                "cpu": cpu_name(), "threads": os.cpu_count(), "gpus": gpu_names() if args.device != "cpu" else [],
                "max_tokens": args.max_tokens, "seconds": args.seconds, "warmup": args.warmup,
                "eog_ids": eog_ids, "serve_log": server.log, "results": results,
                "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            }, indent=1) + "\n")
        server.close()


if __name__ == "__main__":
    main()
