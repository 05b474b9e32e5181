"""Whole-model logits against llama.cpp (llama-cpp-python, CPU) on the same GGUF files.

For SmolLM2 and for small synthetic models in every weight type: the logits of every position
of several prompts, max |diff| relative to the logits' spread and top-1 agreement; greedy
32-token continuations must be identical.
"""
import os
import subprocess
import tempfile

import numpy as np
import pytest

from conftest import tool
import synth_model

llama_cpp = pytest.importorskip("llama_cpp") if os.environ.get("NT_ALLOW_MISSING_REFERENCE") == "1" else __import__("llama_cpp")

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Once upon a time, in a land far away, there lived a dragon who loved mathematics. Every morning",
    "<|im_start|>user\nWhat is 12 * 7?<|im_end|>\n<|im_start|>assistant\n",
]


def reference_logits(path, prompts_ids):
    m = llama_cpp.Llama(model_path=path, logits_all=True, n_ctx=512, n_batch=512, n_threads=2,
                        verbose=False, seed=0)
    out = []
    for ids in prompts_ids:
        m.reset()
        m.eval(ids)
        out.append(np.array(m.scores[: len(ids)], dtype=np.float32))
    return m, out


def our_logits(path, prompts_ids, n_vocab, batch=512):
    with tempfile.TemporaryDirectory() as d:
        ids_file, out_file = os.path.join(d, "ids"), os.path.join(d, "out")
        with open(ids_file, "w") as f:
            for ids in prompts_ids:
                f.write(" ".join(map(str, ids)) + "\n")
        subprocess.run([tool("nt_logits"), path, ids_file, out_file, "--device", "cpu", "--batch", str(batch)],
                       check=True)
        flat = np.fromfile(out_file, dtype=np.float32)
    out, off = [], 0
    for ids in prompts_ids:
        n = len(ids) * n_vocab
        out.append(flat[off:off + n].reshape(len(ids), n_vocab))
        off += n
    assert off == flat.size
    return out


def compare(ref, ours, rel_tol, top1_min):
    worst, agree, total = 0.0, 0, 0
    for r, o in zip(ref, ours):
        assert r.shape == o.shape
        assert np.isfinite(o).all()
        spread = float(r.std())
        worst = max(worst, float(np.abs(r - o).max()) / spread)
        agree += int((r.argmax(1) == o.argmax(1)).sum())
        total += r.shape[0]
    assert worst <= rel_tol, f"max |diff| = {worst:.4f} x logit std (limit {rel_tol})"
    assert agree / total >= top1_min, f"top-1 agreement {agree}/{total}"
    return worst, agree / total


def greedy_ours(cli, path, prompt, n):
    r = subprocess.run([cli, "generate", "-m", path, "-p", prompt, "-n", str(n), "--temp", "0", "--device", "cpu"],
                       capture_output=True, check=True)
    return r.stdout.decode("utf-8", errors="replace").rstrip("\n")


def greedy_ref(m, prompt, n):
    m.reset()
    out = m.create_completion(prompt, max_tokens=n, temperature=0.0, top_k=1, repeat_penalty=1.0)
    return out["choices"][0]["text"]


def test_smollm2_logits_match_llamacpp(smollm2):
    m = llama_cpp.Llama(model_path=smollm2, vocab_only=True, verbose=False)
    ids = [m.tokenize(p.encode(), add_bos=True, special=True) for p in PROMPTS]
    ref_model, ref = reference_logits(smollm2, ids)
    ours = our_logits(smollm2, ids, ref[0].shape[1])
    # llama.cpp's own batched and token-by-token logits differ by up to ~0.15 x std on these
    # prompts (different activation rounding paths), and real activations have outliers that
    # amplify rounding; we measured at most 0.43 (one position), typical 0.15. A wrong kernel
    # shows up as several x std at every position.
    worst, agree = compare(ref, ours, rel_tol=0.6, top1_min=0.97)
    typical = np.mean([np.median(np.abs(r - o).max(1)) / r.std() for r, o in zip(ref, ours)])
    assert typical <= 0.25, f"median per-position max |diff| = {typical:.3f} x std"
    print(f"SmolLM2: max |diff| {worst:.4f} x std, top-1 agreement {agree:.3f}")


def test_smollm2_batched_equals_unbatched(smollm2):
    """Prompt processing in chunks of 7 tokens gives the same logits as one batch."""
    m = llama_cpp.Llama(model_path=smollm2, vocab_only=True, verbose=False)
    ids = [m.tokenize(PROMPTS[2].encode(), add_bos=True)]
    a = our_logits(smollm2, ids, 49152, batch=512)[0]
    b = our_logits(smollm2, ids, 49152, batch=7)[0]
    assert np.abs(a - b).max() <= 1e-3 * a.std()


@pytest.mark.parametrize("prompt", PROMPTS[:3])
def test_smollm2_greedy_continuation_matches(smollm2, cli, prompt):
    """32 greedy tokens: identical to llama.cpp's, or identical up to a near-tie.

    Two engines that sum in different orders can only agree on argmax where it is not a tie.
    So the texts must be identical, except that they may part at a step where llama.cpp itself
    rates our token within 0.05 x logit std of its own choice, given the same prefix. That is a
    third of the noise between llama.cpp's own batched and token-by-token paths on this model
    (0.15 x std); a real bug moves logits by several x std and parts the texts at a clear choice.
    """
    ref_model = llama_cpp.Llama(model_path=smollm2, n_ctx=512, n_threads=2, verbose=False, seed=0, logits_all=True)
    ref_text = greedy_ref(ref_model, prompt, 32).rstrip("\n")
    our_text = greedy_ours(cli, smollm2, prompt, 32)
    if our_text == ref_text:
        return
    prompt_ids = ref_model.tokenize(prompt.encode(), add_bos=True, special=True)
    ref_ids = ref_model.tokenize(ref_text.encode(), add_bos=False, special=True)
    our_ids = ref_model.tokenize(our_text.encode(), add_bos=False, special=True)
    k = next(i for i in range(min(len(ref_ids), len(our_ids)) + 1)
             if i == len(ref_ids) or i == len(our_ids) or ref_ids[i] != our_ids[i])
    assert k < len(ref_ids) and k < len(our_ids), f"one text is a prefix of the other:\n{our_text!r}\n{ref_text!r}"
    ref_model.reset()
    ref_model.eval(prompt_ids + ref_ids[:k])
    lg = np.array(ref_model.scores[len(prompt_ids) + k - 1])
    gap = float(lg[ref_ids[k]] - lg[our_ids[k]])
    assert gap <= 0.05 * float(lg.std()), (
        f"texts part at token {k} where llama.cpp prefers its token by {gap:.3f} (std {lg.std():.3f}):\n"
        f"ours: {our_text!r}\nref:  {ref_text!r}")


# max |diff| / logit std allowed per weight type. Float weights agree to rounding; 32-element
# quants differ by activation rounding (llama.cpp converts attention inputs to F16); K-quant
# models are flatter (small logit std), so the same absolute noise is a larger fraction. Position
# 0 is bit-identical for every quantized type (see test_synthetic_first_position_exact).
TOLERANCE = {"f32": 0.002, "f16": 0.005, "bf16": 0.02, "q4_0": 0.05, "q4_1": 0.05, "q5_0": 0.05, "q5_1": 0.05,
             "q8_0": 0.05, "q2_K": 0.3, "q3_K": 0.25, "q4_K": 0.25, "q5_K": 0.25, "q6_K": 0.25}


@pytest.fixture(scope="module")
def synth_dir():
    with tempfile.TemporaryDirectory() as d:
        yield d


@pytest.mark.parametrize("type_name", list(synth_model.TYPES))
def test_synthetic_model_logits_match_llamacpp(smollm2, synth_dir, type_name):
    path = os.path.join(synth_dir, f"synth-{type_name}.gguf")
    synth_model.write_model(path, type_name, smollm2, tied=type_name in ("q4_0", "q6_K", "f16"),
                            seed=hash(type_name) % 1000)
    rng = np.random.default_rng(7)
    ids = [[1] + rng.integers(0, 49152, size=n).tolist() for n in (5, 40, 130)]
    _, ref = reference_logits(path, ids)
    ours = our_logits(path, ids, 49152)
    worst, agree = compare(ref, ours, rel_tol=TOLERANCE[type_name], top1_min=0.9)
    print(f"{type_name}: max |diff| {worst:.4f} x std, top-1 agreement {agree:.3f}")


@pytest.mark.parametrize("type_name", ["q4_0", "q8_0", "q4_K", "q6_K", "q2_K"])
def test_synthetic_first_position_exact(smollm2, synth_dir, type_name):
    """With one token there is no attention mixing: quantized dot products must equal llama.cpp's."""
    path = os.path.join(synth_dir, f"first-{type_name}.gguf")
    synth_model.write_model(path, type_name, smollm2, seed=11)
    ids = [[5000]]  # one token: llama.cpp takes its vec_dot path, which ours must equal exactly
    _, ref = reference_logits(path, ids)
    ours = our_logits(path, ids, 49152)
    assert np.abs(ref[0][0] - ours[0][0]).max() <= 1e-4 * ref[0][0].std()


def test_llama31_rope_scaling_matches_llamacpp(smollm2, synth_dir):
    """Llama 3.1 rope: rope_freqs.weight factors and a large base, on float weights (tight)."""
    path = os.path.join(synth_dir, "rope31.gguf")
    hd = 64
    # Meta's llama3 factors for factor 8, low 1, high 4, original context 8192.
    base, factors = 500000.0, []
    for i in range(hd // 2):
        freq = base ** (-2.0 * i / hd)
        wavelen = 2 * np.pi / freq
        if wavelen < 8192 / 4:
            factors.append(1.0)
        elif wavelen > 8192 / 1:
            factors.append(8.0)
        else:
            smooth = (8192 / wavelen - 1) / (4 - 1)
            factors.append(1 / ((1 - smooth) / 8 + smooth))
    synth_model.write_model(path, "f32", smollm2, rope_base=base, freq_factors=factors, seed=5)
    rng = np.random.default_rng(3)
    ids = [[1] + rng.integers(0, 49152, size=300).tolist()]
    _, ref = reference_logits(path, ids)
    ours = our_logits(path, ids, 49152)
    compare(ref, ours, rel_tol=0.002, top1_min=0.99)
