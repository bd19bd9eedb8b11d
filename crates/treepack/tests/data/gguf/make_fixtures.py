"""Writes the GGUF fixture of crates/treepack/tests/gguf.rs with gguf-py (llama.cpp's own
writer, PyPI `gguf`), and the expectations it is checked against. Run from the repository root
with a Python that has numpy and gguf (`pip install gguf`):

    .venv/bin/python crates/treepack/tests/data/gguf/make_fixtures.py

Everything is deterministic (fixed seeds, fixed inputs); the files are committed.
"""

import json
import os

import numpy as np
import gguf

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    rng = np.random.default_rng(54)
    path = os.path.join(HERE, "gguf_py.gguf")
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_name("treepack fixture")
    w.add_uint32("llama.context_length", 4096)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_float64("test.f64", -0.25)
    w.add_int8("test.i8", -8)
    w.add_uint8("test.u8", 200)
    w.add_int16("test.i16", -300)
    w.add_uint16("test.u16", 60000)
    w.add_int32("test.i32", -70000)
    w.add_int64("test.i64", -(2**40))
    w.add_uint64("test.u64", 2**63 + 5)
    w.add_bool("test.bool", True)
    w.add_array("tokenizer.ggml.tokens", ["<s>", "</s>", "héllo", ""])
    w.add_array("tokenizer.ggml.scores", [0.0, -1.5, 2.25, 3.0])
    w.add_array("test.nested", [[1, 2], [3]])
    tensors = {}
    f32 = rng.standard_normal((3, 5)).astype(np.float32)
    f16 = rng.standard_normal((2, 4)).astype(np.float16)
    i32 = np.arange(6, dtype=np.int32).reshape(2, 3)
    # Quantized tensors as their bytes, rows of whole blocks: gguf-py derives the shape of the values.
    q8 = rng.integers(0, 256, size=(2, 2 * 34), dtype=np.uint8)
    q4k = rng.integers(0, 256, size=(3, 144), dtype=np.uint8)
    w.add_tensor("token_embd.weight", f32)
    w.add_tensor("blk.0.attn_norm.weight", f16)
    w.add_tensor("ids", i32)
    w.add_tensor("blk.0.ffn_up.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("blk.0.ffn_down.weight", q4k, raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    for name, a, dtype, shape, ggml in [
        ("token_embd.weight", f32, "float32", [3, 5], None),
        ("blk.0.attn_norm.weight", f16, "float16", [2, 4], None),
        ("ids", i32, "int32", [2, 3], None),
        ("blk.0.ffn_up.weight", q8, "uint8", [q8.nbytes], ["Q8_0", [2, 64]]),
        ("blk.0.ffn_down.weight", q4k, "uint8", [q4k.nbytes], ["Q4_K", [3, 256]]),
    ]:
        tensors[name] = {"dtype": dtype, "shape": shape, "hex": a.tobytes().hex(), "quantized": ggml}
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    # What gguf-py's own reader makes of it: the metadata, the tensors in order.
    r = gguf.GGUFReader(path)
    order = [t.name for t in r.tensors]
    meta = {}
    for f in r.fields.values():
        if f.name.startswith("GGUF."):
            continue
        v = f.contents()
        meta[f.name] = v
    # gguf-py's reader flattens arrays of arrays (its contents() reads the leaves); the file
    # holds them nested, as written.
    assert meta["test.nested"] == [1, 2, 3]
    meta["test.nested"] = [[1, 2], [3]]
    with open(os.path.join(HERE, "expected.json"), "w") as fh:
        json.dump({"order": order, "tensors": tensors, "metadata": meta}, fh, indent=1, sort_keys=True)
        fh.write("\n")


if __name__ == "__main__":
    main()
