#!/usr/bin/env python3
"""Independent reference for the GGUF reader tests (tests/unit/test_gguf.cpp).

  gguf_py_dump.py FILE             print FILE as gguf-py's GGUFReader sees it, in the canonical
                                   text form that the C++ test renders from our own reader
  gguf_py_dump.py --write-sample F write a sample file with gguf-py's GGUFWriter: every value
                                   type, nested arrays, alignment 64, several tensor types

Canonical form, one line per item (the C++ side must produce the same bytes):
  version V / alignment A / data_offset D / n_kv N / n_tensors N
  kv KEY=VALUE          VALUE = TYPEID:PAYLOAD; ints in decimal, floats as the hex of their
                        IEEE bits at the stored width, bools 0/1, strings as hex of their bytes,
                        arrays as 9:ELEMTYPE:COUNT:[v,v,...] (items recursively, nesting kept)
  tensor NAME type=ID ne=D0,D1,.. offset=ABSOLUTE nbytes=N crc32=HEX
"""
import struct
import sys
import zlib

import numpy as np
import gguf
from gguf import GGUFValueType as VT

SCALARS = {VT.UINT8, VT.INT8, VT.UINT16, VT.INT16, VT.UINT32, VT.INT32, VT.UINT64, VT.INT64}


def walk(parts, i, t):
    """Reads one value of type t from a ReaderField's parts starting at index i.

    gguf-py flattens nested arrays in ReaderField.contents(), so the structure is rebuilt from
    the raw parts instead: a string is [length, bytes], a scalar one part, an array
    [elem_type, count, items...]."""
    t = VT(int(t))
    if t == VT.STRING:
        return f"{int(t)}:{bytes(parts[i + 1]).hex()}", i + 2
    if t in SCALARS:
        return f"{int(t)}:{int(parts[i][0])}", i + 1
    if t == VT.BOOL:
        return f"{int(t)}:{1 if bool(parts[i][0]) else 0}", i + 1
    if t == VT.FLOAT32:
        return f"{int(t)}:{struct.pack('<f', parts[i][0]).hex()}", i + 1
    if t == VT.FLOAT64:
        return f"{int(t)}:{struct.pack('<d', parts[i][0]).hex()}", i + 1
    if t == VT.ARRAY:
        et, n = int(parts[i][0]), int(parts[i + 1][0])
        i += 2
        items = []
        for _ in range(n):
            s, i = walk(parts, i, et)
            items.append(s)
        return f"{int(t)}:{et}:{n}:[{','.join(items)}]", i
    raise ValueError(f"unknown value type {t}")


def dump(path):
    r = gguf.GGUFReader(path)
    out = [
        f"version {int(r.fields['GGUF.version'].parts[0][0])}",
        f"alignment {int(r.alignment)}",
        f"data_offset {int(r.data_offset)}",
    ]
    kvs = [(k, f) for k, f in r.fields.items() if not k.startswith("GGUF.")]
    out.append(f"n_kv {len(kvs)}")
    out.append(f"n_tensors {len(r.tensors)}")
    for key, f in kvs:
        # parts: key length, key bytes, value type, then the value's parts
        value, end = walk(f.parts, 3, f.parts[2][0])
        assert end == len(f.parts), key
        out.append(f"kv {key}={value}")
    for t in r.tensors:
        raw = np.asarray(r.data[t.data_offset:t.data_offset + t.n_bytes])
        ne = ",".join(str(int(x)) for x in t.shape)
        out.append(f"tensor {t.name} type={int(t.tensor_type)} ne={ne} offset={t.data_offset} "
                   f"nbytes={t.n_bytes} crc32={zlib.crc32(raw.tobytes()):08x}")
    sys.stdout.buffer.write(("\n".join(out) + "\n").encode())


def write_sample(path):
    w = gguf.GGUFWriter(path, arch="llama")  # writes general.architecture itself
    w.add_custom_alignment(64)
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 65000)
    w.add_int16("test.i16", -32000)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -2000000000)
    w.add_float32("test.f32", 0.1)
    w.add_uint64("test.u64", 2**64 - 1)
    w.add_int64("test.i64", -(2**63))
    w.add_float64("test.f64", -1.0 / 3.0)
    w.add_bool("test.true", True)
    w.add_bool("test.false", False)
    w.add_string("test.string", "h\u00e9llo \u4e16\u754c\n")
    w.add_key_value("test.arr_u8", [0, 1, 255], VT.ARRAY, VT.UINT8)
    w.add_key_value("test.arr_i16", [-32768, 0, 32767], VT.ARRAY, VT.INT16)
    w.add_key_value("test.arr_u64", [2**64 - 1, 7], VT.ARRAY, VT.UINT64)
    w.add_key_value("test.arr_f64", [1.5, -2.25, 1e300], VT.ARRAY, VT.FLOAT64)
    w.add_key_value("test.arr_bool", [True, False, True], VT.ARRAY, VT.BOOL)
    w.add_array("test.arr_f32", [0.5, -1.25, 3.0e-7])
    w.add_array("test.arr_str", ["a", "", "\u00fc\u00df"])
    w.add_array("test.arr_nested", [[1, 2, 3], [4], [5, 6]])
    w.add_array("test.arr_nested_str", [["x", "y"], ["z"]])
    rng = np.random.default_rng(7)
    w.add_tensor("f32", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((2, 7)).astype(np.float16))
    # Quantized tensors as raw bytes: byte shape (rows, row bytes) with raw_dtype.
    q8 = rng.integers(0, 256, size=(2, 2 * 34), dtype=np.uint8)  # 2 rows x 64 elements
    w.add_tensor("q8_0", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    q4k = rng.integers(0, 256, size=(1, 144), dtype=np.uint8)  # 1 row x 256 elements
    w.add_tensor("q4_k", q4k, raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--write-sample":
        write_sample(sys.argv[2])
    elif len(sys.argv) == 2:
        dump(sys.argv[1])
    else:
        sys.exit(__doc__)
