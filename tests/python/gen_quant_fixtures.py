#!/usr/bin/env python3
"""Write quantization fixtures for tests/unit/test_quant.cpp, computed by gguf-py.

usage: gen_quant_fixtures.py OUT_DIR

For every type, OUT_DIR/dq_<type>.bin holds random blocks (random bytes with the f16/f32 scale
fields set to random finite values) and OUT_DIR/dq_<type>.f32 the float32 values
gguf.quants.dequantize returns for them. For every type gguf-py can quantize,
OUT_DIR/q_<type>.f32 holds float32 inputs and OUT_DIR/q_<type>.bin gguf.quants.quantize's bytes.

gguf-py has no Q8_1 or Q8_K; for those the expected values come from the numpy transcriptions
of ggml's reference code below (dequant: d * q; quantize: quantize_row_q8_1_ref and
quantize_row_q8_K_ref).
"""
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

QK_K = 256

# name -> (type, block elements, block bytes, [(offset, 'f16'|'f32'), ...] scale fields)
TYPES = {
    "f32": (T.F32, 1, 4, []),
    "f16": (T.F16, 1, 2, []),
    "bf16": (T.BF16, 1, 2, []),
    "q4_0": (T.Q4_0, 32, 18, [(0, "f16")]),
    "q4_1": (T.Q4_1, 32, 20, [(0, "f16"), (2, "f16")]),
    "q5_0": (T.Q5_0, 32, 22, [(0, "f16")]),
    "q5_1": (T.Q5_1, 32, 24, [(0, "f16"), (2, "f16")]),
    "q8_0": (T.Q8_0, 32, 34, [(0, "f16")]),
    "q8_1": (None, 32, 36, [(0, "f16"), (2, "f16")]),
    "q2_K": (T.Q2_K, QK_K, 84, [(80, "f16"), (82, "f16")]),
    "q3_K": (T.Q3_K, QK_K, 110, [(108, "f16")]),
    "q4_K": (T.Q4_K, QK_K, 144, [(0, "f16"), (2, "f16")]),
    "q5_K": (T.Q5_K, QK_K, 176, [(0, "f16"), (2, "f16")]),
    "q6_K": (T.Q6_K, QK_K, 210, [(208, "f16")]),
    "q8_K": (None, QK_K, 292, [(0, "f32")]),
}


def finite_f16_bits(rng, count):
    """Random f16 bit patterns over the whole finite range (subnormals and zeros included)."""
    bits = rng.integers(0, 1 << 16, size=count, dtype=np.uint32).astype(np.uint16)
    inf_nan = (bits & 0x7C00) == 0x7C00
    bits[inf_nan] &= np.uint16(0xBFFF)  # clear the exponent's top bit: a finite value
    return bits


def random_blocks(rng, name, nblocks):
    _, elems, size, fields = TYPES[name]
    if name == "f32":
        return rng.standard_normal(nblocks).astype(np.float32).view(np.uint8)
    if name == "f16":
        return finite_f16_bits(rng, nblocks).view(np.uint8)
    if name == "bf16":
        bits = rng.integers(0, 1 << 16, size=nblocks, dtype=np.uint32).astype(np.uint16)
        bits[(bits & 0x7F80) == 0x7F80] &= np.uint16(0xBFFF)
        return bits.view(np.uint8)
    raw = rng.integers(0, 256, size=(nblocks, size), dtype=np.uint32).astype(np.uint8)
    for off, kind in fields:
        if kind == "f16":
            raw[:, off:off + 2] = finite_f16_bits(rng, nblocks).view(np.uint8).reshape(nblocks, 2)
        else:
            vals = (rng.standard_normal(nblocks) * 10.0 ** rng.uniform(-6, 3, nblocks))
            raw[:, off:off + 4] = vals.astype(np.float32).view(np.uint8).reshape(nblocks, 4)
    return raw.reshape(-1)


def dequant_reference(name, data):
    qtype, elems, size, _ = TYPES[name]
    if qtype is not None:
        return quants.dequantize(data, qtype).astype(np.float32, copy=False)
    blocks = data.reshape(-1, size)
    if name == "q8_1":
        d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
        q = blocks[:, 4:36].copy().view(np.int8).astype(np.float32)
    else:  # q8_K
        d = blocks[:, 0:4].copy().view(np.float32)
        q = blocks[:, 4:4 + QK_K].copy().view(np.int8).astype(np.float32)
    return (q * d).reshape(-1)


def np_roundf(x):
    """C roundf: half away from zero."""
    a = np.abs(x)
    fl = np.floor(a)
    return np.sign(x) * (fl + np.floor(2 * (a - fl)))


def quantize_q8_1(x):
    b = x.reshape(-1, 32)
    d = np.abs(b).max(axis=1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    q = np_roundf(b * inv).astype(np.int8)
    s = (q.astype(np.int32).sum(axis=1, keepdims=True).astype(np.float32) * d).astype(np.float16)
    out = np.concatenate([d.astype(np.float16).view(np.uint8), s.view(np.uint8), q.view(np.uint8)],
                         axis=1)
    return out.reshape(-1)


def quantize_q8_K(x):
    out = []
    for b in x.reshape(-1, QK_K):
        i = int(np.argmax(np.abs(b)))  # first index of the largest magnitude, like ggml's loop
        mx = b[i]
        if mx == 0:
            out.append(np.zeros(292, dtype=np.uint8))
            continue
        iscale = np.float32(-127) / mx
        q = np.minimum(127, np.rint(iscale * b)).astype(np.int8)  # rint: half to even
        bsums = q.astype(np.int32).reshape(16, 16).sum(axis=1).astype(np.int16)
        d = np.array([np.float32(1) / iscale], dtype=np.float32)
        out.append(np.concatenate([d.view(np.uint8), q.view(np.uint8), bsums.view(np.uint8)]))
    return np.concatenate(out)


def quantize_reference(name, x):
    if name == "f16":
        return x.astype(np.float16).view(np.uint8).reshape(-1)
    if name == "q8_1":
        return quantize_q8_1(x)
    if name == "q8_K":
        return quantize_q8_K(x)
    return quants.quantize(x, TYPES[name][0]).reshape(-1)


def quantize_inputs(rng, elems, nblocks):
    """Blocks of varied scale and shape, plus edge cases: zeros, a constant, a lone outlier."""
    scales = 10.0 ** rng.uniform(-4, 2, size=(nblocks, 1))
    x = rng.standard_normal((nblocks, elems)) * scales
    x[1::7] = np.abs(x[1::7])   # all positive
    x[2::7] = -np.abs(x[2::7])  # all negative
    x[3] = 0.0
    x[4] = 0.37
    x[5] = 0.0
    x[5, elems // 3] = -2.5
    x[6] = np.round(x[6] * 4) / 4  # many values on exact quant boundaries
    # No negative zeros: for a block whose minimum is zero, numpy's min() may return -0.0 where
    # ggml's reference loop keeps the first zero it meets, and the f16 min would differ in sign.
    return (x.astype(np.float32) + np.float32(0)).reshape(-1)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: gen_quant_fixtures.py OUT_DIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(20261129)
    for name, (_, elems, _, _) in TYPES.items():
        nblocks = 4096 if elems == 1 else (512 if elems == 32 else 64)
        data = random_blocks(rng, name, nblocks)
        expected = dequant_reference(name, data)
        assert expected.dtype == np.float32 and np.isfinite(expected).all(), name
        data.tofile(os.path.join(out, f"dq_{name}.bin"))
        expected.tofile(os.path.join(out, f"dq_{name}.f32"))
    for name in ["f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q8_1", "q8_K"]:
        elems = TYPES[name][1]
        x = quantize_inputs(rng, max(elems, 32), 64 if elems == QK_K else 256)
        x.tofile(os.path.join(out, f"q_{name}.f32"))
        np.asarray(quantize_reference(name, x), dtype=np.uint8).tofile(
            os.path.join(out, f"q_{name}.bin"))


if __name__ == "__main__":
    main()
