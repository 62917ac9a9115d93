#!/usr/bin/env python3
"""Reference GGUF files for tests/gguf_test.cc, written by the `gguf` package (llama.cpp's
gguf-py) with numpy only.

tests/golden/gguf/types.gguf holds, for every type flowkv reads:
  deq.<TYPE>           a [2, 2 blocks] tensor of random blocks: random bytes whose f16 scale
                       fields are replaced by random finite halves, so every bit of every
                       quant field is exercised;
  deq.<TYPE>.expected  the package's numpy dequantization of it (F32);
and, for the types the package quantizes in numpy (F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1):
  quant.<TYPE>.input   random f32 values (F32);
  quant.<TYPE>         the package's quantization of them.
Its metadata has one key of every GGUF value type (scalars, a string, arrays of numbers, of
strings and of bools) for the reader test. tests/golden/gguf/aligned64.gguf is a small file with
general.alignment = 64. tests/golden/gguf/folded.gguf holds a 5-D tensor the way flowkv's
writer stores one (io/gguf.h): its leading sizes folded into one 4-D tensor, the shape in metadata
"flowkv.shape.<name>" (INT64 array), and a 4-D tensor without such a key.

Deterministic (fixed seed): running it again writes identical files.
Usage: python/ref/.venv/bin/python python/ref/dump_gguf.py [out_dir]
"""
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]
QUANTIZABLE = ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]

# Byte offsets of each block's f16 scale fields (ggml-common.h).
F16_FIELDS = {
    "Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2],
    "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
}


def random_halves(rng, n):
    """Random finite f16 bit patterns (normals and subnormals, both signs)."""
    h = rng.integers(0, 1 << 16, size=n, dtype=np.uint32).astype(np.uint16)
    inf_nan = (h & 0x7C00) == 0x7C00
    h[inf_nan] &= 0xBFFF  # clear the exponent's top bit: a finite value
    return h


def random_blocks(rng, name, rows, cols):
    qt = T[name]
    block, type_size = GGML_QUANT_SIZES[qt]
    if name == "F32":
        return rng.standard_normal((rows, cols)).astype(np.float32)
    if name == "F16":
        return random_halves(rng, rows * cols).reshape(rows, cols).view(np.float16)
    if name == "BF16":
        x = (rng.standard_normal(rows * cols) * 4).astype(np.float32)
        raw = (x.view(np.uint32) >> 16).astype(np.uint16)
        return raw.reshape(rows, cols)
    nblocks = rows * cols // block
    raw = rng.integers(0, 256, size=(nblocks, type_size), dtype=np.uint32).astype(np.uint8)
    for off in F16_FIELDS[name]:
        raw[:, off:off + 2] = random_halves(rng, nblocks).view(np.uint8).reshape(nblocks, 2)
    return raw.reshape(rows, cols // block * type_size)


def add_metadata(w):
    w.add_name("flowkv gguf reference")
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -2000000000)
    w.add_float32("test.f32", 1.5)
    w.add_uint64("test.u64", 18000000000000000000)
    w.add_int64("test.i64", -9000000000000000000)
    w.add_float64("test.f64", -2.25)
    w.add_bool("test.bool", True)
    w.add_string("test.string", "héllo gguf")
    w.add_array("test.array_i32", [1, -2, 3])
    w.add_array("test.array_f32", [0.5, -1.0])
    w.add_array("test.array_str", ["a", "bc", ""])
    w.add_array("test.array_bool", [True, False])


def dump_types(path, rng):
    w = gguf.GGUFWriter(path, "flowkv-test")
    add_metadata(w)
    for name in TYPES:
        qt = T[name]
        block = GGML_QUANT_SIZES[qt][0]
        rows, cols = 2, 2 * max(block, 32)
        raw = random_blocks(rng, name, rows, cols)
        if name == "BF16":
            expected = gguf.quants.dequantize(raw.view(np.uint8), qt)
            w.add_tensor(f"deq.{name}", raw.view(np.uint8), raw_dtype=qt)
        elif name in ("F32", "F16"):
            expected = gguf.quants.dequantize(raw, qt)
            w.add_tensor(f"deq.{name}", raw)
        else:
            expected = gguf.quants.dequantize(raw, qt)
            w.add_tensor(f"deq.{name}", raw, raw_dtype=qt)
        expected = np.asarray(expected, dtype=np.float32).reshape(rows, cols)
        w.add_tensor(f"deq.{name}.expected", expected)
    for name in QUANTIZABLE:
        qt = T[name]
        x = (rng.standard_normal((2, 64)) * rng.uniform(0.01, 10.0, size=(2, 1))).astype(np.float32)
        x[1, 32:48] = 0.0  # an all-zero half block and a partly zero block
        q = gguf.quants.quantize(x, qt)
        w.add_tensor(f"quant.{name}.input", x)
        if name == "F16":
            w.add_tensor(f"quant.{name}", q)
        else:
            w.add_tensor(f"quant.{name}", q, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def dump_aligned(path, rng):
    w = gguf.GGUFWriter(path, "flowkv-test")
    w.add_custom_alignment(64)
    w.add_tensor("a", rng.standard_normal(3).astype(np.float32))
    w.add_tensor("b.weight", rng.standard_normal((2, 5)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def dump_folded(path, rng):
    w = gguf.GGUFWriter(path, "flowkv-test")
    shape = [2, 3, 2, 4, 5]
    x = rng.standard_normal(shape).astype(np.float32)
    w.add_tensor("conv.weight", x.reshape(6, 2, 4, 5))
    w.add_array("flowkv.shape.conv.weight", np.array(shape, dtype=np.int64).tolist())
    w.add_tensor("plain", rng.standard_normal((1, 2, 1, 3)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "..", "tests", "golden", "gguf")
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(20261201)
    dump_types(os.path.join(out, "types.gguf"), rng)
    dump_aligned(os.path.join(out, "aligned64.gguf"), rng)
    dump_folded(os.path.join(out, "folded.gguf"), rng)
    print("wrote", out)


if __name__ == "__main__":
    main()
