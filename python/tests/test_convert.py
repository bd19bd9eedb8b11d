"""Conversion to and from safetensors, .npy and .npz (issue 31), against files written and read by
the real libraries."""

import numpy as np
import pytest

import treepack

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32", "float64"]


def _arrays():
    rng = np.random.default_rng(0)
    out = {}
    for d in DTYPES:
        a = rng.integers(0, 100, size=(3, 5)).astype(d) if d != "bool" else rng.integers(0, 2, size=(3, 5)).astype(bool)
        out[f"x_{d}"] = a
    out["empty"] = np.zeros((0, 4), np.float32)
    out["scalar"] = np.array(3.5, np.float64)
    return out


def test_safetensors_files_from_the_library_convert_both_ways(tmp_path):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    flat = _arrays()
    flat["layers.0.w"] = np.arange(12, dtype=np.float32).reshape(3, 4)
    flat["layers.1.w"] = np.arange(12, dtype=np.float32).reshape(3, 4) * 2
    src = tmp_path / "m.safetensors"
    safetensors_numpy.save_file(flat, str(src), metadata={"format": "np", "note": "hi"})
    info = treepack.convert(src, tmp_path / "t", separator=".")
    assert info["tensors"] == len(flat)
    tree = treepack.load(tmp_path / "t")
    np.testing.assert_array_equal(tree["layers"]["1"]["w"], flat["layers.1.w"])  # nested at "."
    for k, v in _arrays().items():
        assert tree[k].dtype == v.dtype and tree[k].shape == v.shape
        np.testing.assert_array_equal(tree[k], v)
    assert treepack.open(tmp_path / "t").metadata == {"format": "np", "note": "hi"}
    # Back to safetensors, read by the library.
    treepack.convert(tmp_path / "t", tmp_path / "back.safetensors")
    back = safetensors_numpy.load_file(str(tmp_path / "back.safetensors"))
    assert set(back) == set(flat)
    for k in flat:
        assert back[k].dtype == flat[k].dtype
        np.testing.assert_array_equal(back[k], flat[k])
    # Flat names kept as they are: the default.
    treepack.convert(src, tmp_path / "flat")
    assert "layers.0.w" in treepack.load(tmp_path / "flat")


def test_bf16_and_float8_through_torch_safetensors(tmp_path):
    torch = pytest.importorskip("torch")
    st_torch = pytest.importorskip("safetensors.torch")
    sd = {"w": torch.randn(4, 8).to(torch.bfloat16), "f8": torch.randn(3, 3).to(torch.float8_e4m3fn), "i": torch.arange(5)}
    st_torch.save_file(sd, str(tmp_path / "m.safetensors"))
    treepack.convert(tmp_path / "m.safetensors", tmp_path / "t.tpk")
    t = treepack.load(tmp_path / "t.tpk")
    assert str(t["w"].dtype) == "bfloat16" and str(t["f8"].dtype) == "float8_e4m3fn"
    treepack.convert(tmp_path / "t.tpk", tmp_path / "b.safetensors")
    back = st_torch.load_file(str(tmp_path / "b.safetensors"))
    for k in sd:
        assert back[k].dtype == sd[k].dtype and torch.equal(back[k].view(torch.uint8), sd[k].view(torch.uint8))


def test_what_safetensors_cannot_hold_is_named(tmp_path):
    treepack.save({"w": np.ones(3), "cfg": {"name": "run"}}, tmp_path / "t")
    with pytest.raises(ValueError, match=r"cfg/name.*str cannot be stored in safetensors"):
        treepack.convert(tmp_path / "t", tmp_path / "x.safetensors")
    assert not (tmp_path / "x.safetensors").exists()
    treepack.save({"c": np.ones(3, np.complex64)}, tmp_path / "c")
    with pytest.raises(ValueError, match="safetensors has no complex64"):
        treepack.convert(tmp_path / "c", tmp_path / "c.safetensors")


def test_hostile_safetensors_files_fail_clearly(tmp_path):
    good = tmp_path / "g.safetensors"
    pytest.importorskip("safetensors.numpy").save_file({"a": np.ones(4, np.float32)}, str(good))
    data = good.read_bytes()
    cases = {
        "truncated": data[:-3],
        "huge-header-length": (10**12).to_bytes(8, "little") + data[8:],
        "giant-shape": None,
        "not-json": (8).to_bytes(8, "little") + b"notjson!" + b"\0" * 16,
    }
    import json as _json
    n = int.from_bytes(data[:8], "little")
    header = _json.loads(data[8:8 + n])
    header["a"]["shape"] = [2**40, 2**40]
    h = _json.dumps(header).encode()
    cases["giant-shape"] = len(h).to_bytes(8, "little") + h + data[8 + n:]
    for name, content in cases.items():
        p = tmp_path / f"{name}.safetensors"
        p.write_bytes(content)
        with pytest.raises(treepack.FormatError, match="not a valid safetensors file"):
            treepack.convert(p, tmp_path / f"out-{name}")
        assert not (tmp_path / f"out-{name}").exists()


def test_npz_and_npy_convert_both_ways_without_pickle(tmp_path):
    arrays = _arrays()
    arrays["a/b"] = np.ones(2)  # a name with the key-path separator in it
    np.savez(tmp_path / "d.npz", **{k.replace("/", "_"): v for k, v in arrays.items()}, **{"g.x": np.arange(3)})
    treepack.convert(tmp_path / "d.npz", tmp_path / "t", separator=".")
    t = treepack.load(tmp_path / "t")
    np.testing.assert_array_equal(t["g"]["x"], np.arange(3))
    np.testing.assert_array_equal(t["x_uint16"], arrays["x_uint16"])
    treepack.convert(tmp_path / "t", tmp_path / "back.npz")
    with np.load(tmp_path / "back.npz", allow_pickle=False) as z:
        assert set(z.files) == {k.replace("/", "_") for k in arrays} | {"g.x"}
        np.testing.assert_array_equal(z["g.x"], np.arange(3))
        assert z["x_bool"].dtype == bool
    np.save(tmp_path / "one.npy", np.arange(10.0))
    treepack.convert(tmp_path / "one.npy", tmp_path / "one")
    np.testing.assert_array_equal(treepack.load(tmp_path / "one"), np.arange(10.0))
    treepack.convert(tmp_path / "one", tmp_path / "again.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "again.npy"), np.arange(10.0))
    # Object arrays would need pickle: refused.
    np.save(tmp_path / "obj.npy", np.array([{"x": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="never unpickles"):
        treepack.convert(tmp_path / "obj.npy", tmp_path / "obj")


def test_memmaps_save_as_their_values_and_unknown_subclasses_are_named(tmp_path):
    np.save(tmp_path / "m.npy", np.arange(6.0))
    m = np.load(tmp_path / "m.npy", mmap_mode="r")
    treepack.save({"m": m}, tmp_path / "t")
    back = treepack.load(tmp_path / "t")["m"]
    assert type(back) is np.ndarray and back.tolist() == list(range(6))

    class Mine(np.ndarray):
        pass

    with pytest.raises(TypeError, match=r"Mine is a subclass of numpy.ndarray.*np.asarray"):
        treepack.save({"x": np.ones(3).view(Mine)}, tmp_path / "u")


def test_damaged_npy_and_npz_files_fail_clearly(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(10))
    b = (tmp_path / "a.npy").read_bytes()
    (tmp_path / "giant.npy").write_bytes(b.replace(b"'shape': (10,)", b"'shape': (99999999999,)"))
    with pytest.raises(ValueError, match="giant.npy: not a readable .npy file"):
        treepack.load(tmp_path / "giant.npy")
    np.savez(tmp_path / "z.npz", a=np.arange(1000))
    (tmp_path / "cut.npz").write_bytes((tmp_path / "z.npz").read_bytes()[:300])
    with pytest.raises(ValueError, match="cut.npz: not a readable .npz file"):
        treepack.convert(tmp_path / "cut.npz", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_progress_and_the_python_command(tmp_path):
    import subprocess
    import sys

    treepack.save({"a": np.arange(100_000.0), "b": {"c": np.ones((300, 300), np.float32)}}, tmp_path / "t")
    total = 100_000 * 8 + 300 * 300 * 4
    exts = ["npz", "safetensors", "h5"] + (["zarr"] if sys.version_info >= (3, 11) else [])
    for ext in exts:
        seen = []
        treepack.convert(tmp_path / "t", tmp_path / f"o.{ext}", progress=lambda d, t: seen.append((d, t)))
        assert seen and seen[-1] == (total, total), (ext, seen[-3:])
        seen.clear()
        treepack.convert(tmp_path / f"o.{ext}", tmp_path / f"back-{ext}", progress=lambda d, t: seen.append((d, t)))
        assert seen and seen[-1][0] == seen[-1][1] >= total, (ext, seen[-3:])
    cmd = [sys.executable, "-m", "treepack", "convert"]
    out = subprocess.run(cmd + [str(tmp_path / "t"), str(tmp_path / "cli.h5")], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("converted 2 arrays"), out
    out = subprocess.run(cmd + [str(tmp_path / "t"), str(tmp_path / "cli.h5")], capture_output=True, text=True)
    assert out.returncode == 2 and "exists; pass overwrite" in out.stderr, out
