"""Small Llama-shaped GGUF models for whole-model tests, one per weight type.

Weights of types gguf-py can quantize (F32, F16, BF16, Q4_0..Q8_0) are real quantizations of
random normal weights; the K-quants get random blocks with scales chosen so the dequantized
weights have a realistic magnitude. Both engines read the same bytes, so the comparison is
exact in what it tests: the arithmetic on those blocks.

  python3 synth_model.py OUT.gguf --type q4_K [--tied] [--layers 2]
"""
import argparse

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import quantize

TYPES = {
    "f32": T.F32, "f16": T.F16, "bf16": T.BF16, "q4_0": T.Q4_0, "q4_1": T.Q4_1, "q5_0": T.Q5_0,
    "q5_1": T.Q5_1, "q8_0": T.Q8_0, "q2_K": T.Q2_K, "q3_K": T.Q3_K, "q4_K": T.Q4_K, "q5_K": T.Q5_K,
    "q6_K": T.Q6_K,
}

# byte offset of each f16 scale field in a K-quant block, and the range its values are drawn from
K_SCALES = {
    T.Q2_K: [(80, 2e-3, 5e-3)],
    T.Q3_K: [(108, 2e-4, 6e-4)],
    T.Q4_K: [(0, 2e-4, 5e-4)],
    T.Q5_K: [(0, 1e-4, 2.5e-4)],
    T.Q6_K: [(208, 5e-6, 1.5e-5)],
}


def _zero_mean_kquant(rng, qtype, raw):
    """Sets the scale bytes so each sub-block's min cancels its mean: weights centred on 0."""
    n = raw.shape[0]
    if qtype in (T.Q4_K, T.Q5_K):
        # 6-bit scale and min per sub-block, packed in 12 bytes; with values < 16 the packing is
        # sc_j = b[j], m_j = b[j+4] (j < 4) and sc_j = b[j+4] & 15, m_j = b[j+4] >> 4 (j >= 4).
        v = rng.integers(1, 16, size=(n, 8), dtype=np.uint8)
        raw[:, 4:8] = v[:, :4]
        raw[:, 8:12] = v[:, :4]
        raw[:, 12:16] = v[:, 4:] | (v[:, 4:] << 4)
        d = raw[:, 0:2].copy().view("<f2").astype(np.float32)[:, 0]
        half_range = 7.5 if qtype == T.Q4_K else 15.5
        raw[:, 2:4] = (d * half_range).astype("<f2").view(np.uint8).reshape(n, 2)
    elif qtype == T.Q2_K:
        v = rng.integers(1, 16, size=(n, 16), dtype=np.uint8)
        raw[:, 0:16] = v | (v << 4)
        d = raw[:, 80:82].copy().view("<f2").astype(np.float32)[:, 0]
        raw[:, 82:84] = (d * 1.5).astype("<f2").view(np.uint8).reshape(n, 2)
    # Q3_K and Q6_K quants are already centred (q - 4, q - 32) with signed scales.


def make_weight(rng, qtype, rows, cols, std=0.02):
    if qtype in K_SCALES:
        block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
        nblk = rows * cols // block_elems
        raw = rng.integers(0, 256, size=(nblk, block_bytes), dtype=np.uint8)
        for off, lo, hi in K_SCALES[qtype]:
            raw[:, off:off + 2] = rng.uniform(lo, hi, nblk).astype("<f2").view(np.uint8).reshape(nblk, 2)
        _zero_mean_kquant(rng, qtype, raw)
        return raw.reshape(rows, cols // block_elems * block_bytes)
    w = (rng.standard_normal((rows, cols)) * std).astype(np.float32)
    if qtype == T.F32:
        return w
    return quantize(w, qtype)


def copy_tokenizer(writer, vocab_path):
    """Copies tokenizer.* keys from a real model so the synthetic model can tokenize text."""
    r = gguf.GGUFReader(vocab_path)
    n_vocab = 0
    for name, field in r.fields.items():
        if not name.startswith("tokenizer."):
            continue
        if name == "tokenizer.chat_template":
            writer.add_chat_template(bytes(field.parts[field.data[0]]).decode())
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            etype = field.types[1]
            items = [field.parts[i] for i in field.data]
            if etype == gguf.GGUFValueType.STRING:
                vals = [bytes(x).decode("utf-8", errors="surrogateescape") for x in items]
            else:
                vals = [x.tolist()[0] for x in items]
            writer.add_array(name, vals)
            if name == "tokenizer.ggml.tokens":
                n_vocab = len(vals)
        elif vtype == gguf.GGUFValueType.STRING:
            writer.add_string(name, bytes(field.parts[field.data[0]]).decode())
        elif vtype == gguf.GGUFValueType.BOOL:
            writer.add_bool(name, bool(field.parts[field.data[0]][0]))
        else:
            writer.add_uint32(name, int(field.parts[field.data[0]][0]))
    return n_vocab


def write_model(path, type_name, vocab_path, n_layer=2, n_embd=256, n_ff=512, n_head=4, n_head_kv=2,
                tied=False, seed=0, rope_base=10000.0, freq_factors=None):
    qtype = TYPES[type_name]
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name(f"synthetic-{type_name}")
    w.add_context_length(2048)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(rope_base)
    w.add_rope_dimension_count(n_embd // n_head)
    n_vocab = copy_tokenizer(w, vocab_path)
    hd = n_embd // n_head

    def add(name, rows, cols, t=qtype, std=0.02):
        data = make_weight(rng, t, rows, cols, std)
        w.add_tensor(name, data, raw_shape=data.shape if t != T.F32 else None, raw_dtype=t)

    def add_norm(name):
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(n_embd)).astype(np.float32))

    add("token_embd.weight", n_vocab, n_embd, std=0.5)
    for i in range(n_layer):
        p = f"blk.{i}."
        add_norm(p + "attn_norm.weight")
        add(p + "attn_q.weight", n_head * hd, n_embd)
        add(p + "attn_k.weight", n_head_kv * hd, n_embd)
        add(p + "attn_v.weight", n_head_kv * hd, n_embd)
        add(p + "attn_output.weight", n_embd, n_head * hd)
        add_norm(p + "ffn_norm.weight")
        add(p + "ffn_gate.weight", n_ff, n_embd)
        add(p + "ffn_up.weight", n_ff, n_embd)
        add(p + "ffn_down.weight", n_embd, n_ff)
    add_norm("output_norm.weight")
    if not tied:
        add("output.weight", n_vocab, n_embd, std=0.05)
    if freq_factors is not None:
        w.add_tensor("rope_freqs.weight", np.asarray(freq_factors, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--type", default="q8_0", choices=TYPES)
    ap.add_argument("--vocab", required=True, help="GGUF file whose tokenizer to copy")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--tied", action="store_true")
    a = ap.parse_args()
    write_model(a.out, a.type, a.vocab, n_layer=a.layers, tied=a.tied)
