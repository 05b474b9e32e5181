#!/usr/bin/env python3
"""Whole model, GPU against CPU: top-1 agreement over 512 positions and perplexity.

  compare_devices.py BUILD_DIR SMOLLM2.gguf [--synthetic-types q4_0,q4_K,...]

For SmolLM2 (real text) and small synthetic models in every weight type: the logits of 512
positions from both backends, top-1 agreement >= 99%; and `ntransformer perplexity` over the
whole of tests/data/sample.txt (29 chunks of 512) on both devices within 0.1% of each other.
The GPU runs the prompt path twice against the one CPU run: as it is by default and with the
CPU's arithmetic (--exact, NT_EXACT_PROMPT=1); and the decode path (one token a step).
Prints one line per check and exits non-zero on failure.

Each line also gives the CPU against itself with one norm weight vector moved by one ulp (see
nudged()): how far a rounding-sized difference alone moves the same figures. For perplexity
that floor is the range over several such nudges. The whole text is scored because over 4 chunks
the floor alone spans 0.05-0.46%, wider than the target; over 29 chunks it is 0.003-0.088%.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))


def prompt_env(exact):
    """The environment of a run on the default prompt path (FP16 GEMM, flash attention) or, with
    exact, on the one with the CPU's arithmetic (--exact)."""
    env = dict(os.environ)
    env.pop("NT_EXACT_PROMPT", None)
    if exact:
        env["NT_EXACT_PROMPT"] = "1"
    return env


def logits(build, model, ids, device, batch=512, exact=False):
    with tempfile.TemporaryDirectory() as d:
        f_ids, f_out = os.path.join(d, "ids"), os.path.join(d, "out")
        with open(f_ids, "w") as f:
            f.write(" ".join(map(str, ids)) + "\n")
        subprocess.run([os.path.join(build, "tests", "tools", "nt_logits"), model, f_ids, f_out, "--device", device,
                        "--batch", str(batch)], check=True, env=prompt_env(exact))
        return np.fromfile(f_out, dtype=np.float32).reshape(len(ids), -1)


# Norm vectors the perplexity floor nudges, and in which direction (the first is the logits' one,
# nudged()'s default).
PPL_NUDGES = [("blk.0.attn_norm.weight", 1), ("blk.0.attn_norm.weight", -1), ("blk.5.ffn_norm.weight", 1),
              ("blk.15.attn_norm.weight", 1), ("blk.29.ffn_norm.weight", -1)]


def nudged(model, out, name=PPL_NUDGES[0][0], direction=PPL_NUDGES[0][1]):
    """A copy of `model` with one F32 norm vector moved by one ulp (up for direction 1, down for
    -1): a rounding-sized change.

    CPU against this copy is the floor of any GPU-vs-CPU comparison: the 8-bit activation
    quantization turns rounding-sized differences into quantization steps, which grow through the
    layers, so a backend that is not bit-identical to the CPU cannot agree better than this."""
    import gguf
    t = next(t for t in gguf.GGUFReader(model).tensors if t.name == name)
    data = bytearray(open(model, "rb").read())
    a = np.frombuffer(bytes(data[t.data_offset:t.data_offset + 4 * t.n_elements]), dtype=np.float32)
    toward = np.float32(np.inf if direction > 0 else -np.inf)
    data[t.data_offset:t.data_offset + 4 * t.n_elements] = np.nextafter(a, toward).astype(np.float32).tobytes()
    with open(out, "wb") as f:
        f.write(data)
    return out


def perplexity(build, model, text_file, device, exact=False):
    r = subprocess.run([os.path.join(build, "ntransformer"), "perplexity", "-m", model, "-f", text_file, "-c", "512",
                        "--device", device, "--chunks", "-1"], capture_output=True, text=True, check=True,
                       env=prompt_env(exact))
    m = re.search(r"PPL = ([0-9.]+)", r.stdout)
    return float(m.group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("smollm2")
    ap.add_argument("--synthetic-types", default="f32,f16,bf16,q4_0,q4_1,q5_0,q5_1,q8_0,q2_K,q3_K,q4_K,q5_K,q6_K")
    ap.add_argument("--gpu-device", default="cuda", help="the device compared with the CPU (cpu: a dry run)")
    a = ap.parse_args()
    dev = a.gpu_device
    text = os.path.join(HERE, "..", "data", "sample.txt")
    failures = 0

    def check(name, ok, detail):
        nonlocal failures
        failures += 0 if ok else 1
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)

    tok = subprocess.run([os.path.join(a.build, "ntransformer"), "tokenize", "-m", a.smollm2, "-f", text, "--ids"],
                         capture_output=True, text=True, check=True).stdout
    ids = [int(x) for x in tok.strip().strip("[]").split(",")][:512]
    models = [("SmolLM2", a.smollm2, ids)]
    tmp = tempfile.mkdtemp()
    try:
        import gguf  # noqa: F401  (synthetic models and the CPU's own floor)
        have_gguf = True
    except ImportError:
        have_gguf = False
    try:
        import synth_model
        rng = np.random.default_rng(5)
        for t in a.synthetic_types.split(","):
            path = os.path.join(tmp, f"synth-{t}.gguf")
            synth_model.write_model(path, t, a.smollm2, tied=t in ("q4_0", "q6_K", "f16"), seed=17)
            models.append((f"synthetic {t}", path, [1] + rng.integers(0, 49152, size=511).tolist()))
    except ImportError as e:
        print(f"note: synthetic models skipped ({e})")
    for name, path, toks in models:
        cpu = logits(a.build, path, toks, "cpu")
        floor_note = ""
        if have_gguf:
            floor = logits(a.build, nudged(path, os.path.join(tmp, "nudged.gguf")), toks, "cpu")
            f_agree = float((cpu.argmax(1) == floor.argmax(1)).mean())
            f_rel = float(np.abs(cpu - floor).max() / cpu.std())
            floor_note = f"(CPU against itself with one norm vector 1 ulp up: {f_agree * 100:.2f}%, {f_rel:.4f} x std)"
        # Both prompt paths against the one CPU run: the default and --exact (the CPU's
        # arithmetic, whose rows should be the CPU's bit for bit).
        for label, exact in (("", False), (" --exact", True)):
            gpu = logits(a.build, path, toks, dev, exact=exact)
            agree = float((cpu.argmax(1) == gpu.argmax(1)).mean())
            rel = float(np.abs(cpu - gpu).max() / cpu.std())
            same = int((cpu == gpu).all(1).sum())
            check(f"{name} top-1 prompt path{label}", agree >= 0.99,
                  f"{agree * 100:.2f}% of {len(toks)} positions, {same} rows bit-identical to the CPU's, "
                  f"max|diff| {rel:.4f} x std {floor_note}")
        gpu1 = logits(a.build, path, toks, dev, batch=1)  # decode path (GEMV, split-K attention)
        agree1 = float((cpu.argmax(1) == gpu1.argmax(1)).mean())
        # The decode path computes the CPU's arithmetic (each block's term and every sum across
        # lanes, chunks and slices in double): its rows should be the CPU's, bit for bit.
        same1 = int((cpu == gpu1).all(1).sum())
        check(f"{name} top-1 decode path", agree1 >= 0.99,
              f"{agree1 * 100:.2f}% of {len(toks)} positions, {same1} rows bit-identical to the CPU's")
    p_cpu = perplexity(a.build, a.smollm2, text, "cpu")
    floor = ""
    if have_gguf:
        apart = [abs(perplexity(a.build, nudged(a.smollm2, os.path.join(tmp, "nudged.gguf"), n, d), text, "cpu") - p_cpu)
                 / p_cpu * 100 for n, d in PPL_NUDGES]
        floor = (f"; CPU against itself with one norm vector 1 ulp off ({len(apart)} nudges): "
                 f"{min(apart):.3f}-{max(apart):.3f}% apart")
    for label, exact in (("", False), (" --exact", True)):
        p_gpu = perplexity(a.build, a.smollm2, text, dev, exact=exact)
        detail = f"cpu {p_cpu:.4f} gpu {p_gpu:.4f} ({abs(p_gpu - p_cpu) / p_cpu * 100:.3f}% apart)" + floor
        check(f"SmolLM2 perplexity{label}", abs(p_gpu - p_cpu) / p_cpu <= 0.001, detail)
    print(f"{len(models) * 3 + 2 - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
