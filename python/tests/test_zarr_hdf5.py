"""Zarr and HDF5 conversions (docs/convert.md): files written by zarr-python 3 (v3 and v2) and
h5py convert to trees, trees convert to files those libraries open, value by value for every
dtype each holds; foreign files load directly; what cannot be held is named."""

import json

import ml_dtypes
import numpy as np
import pytest

import treepack
from treepack import _hierarchy_map

import h5py

try:
    import zarr
except ImportError:  # zarr-python 3 needs Python 3.11+ (docs/convert.md); the HDF5 tests run anyway
    zarr = None

needs_zarr = pytest.mark.skipif(zarr is None, reason="zarr-python 3 needs Python 3.11+")
EXTS = ["zarr", "h5"] if zarr is not None else ["h5"]

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "complex64", "complex128"]


def arrays():
    rng = np.random.default_rng(1)
    out = {}
    for name in DTYPES:
        dt = np.dtype(name)
        if dt.kind == "b":
            a = rng.integers(0, 2, (7, 5)).astype(bool)
        elif dt.kind in "iu":
            info = np.iinfo(dt)
            a = rng.integers(info.min, info.max, (7, 5), dtype=dt, endpoint=True)
        elif dt.kind == "c":
            a = (rng.standard_normal((7, 5)) + 1j * rng.standard_normal((7, 5))).astype(dt)
        else:
            a = rng.standard_normal((7, 5)).astype(dt)
            a[0, 0] = np.nan
            a[0, 1] = -np.inf
        out[name] = a
    out["bfloat16"] = rng.standard_normal((3, 4)).astype(ml_dtypes.bfloat16)
    out["float8_e4m3fn"] = rng.standard_normal(6).astype(ml_dtypes.float8_e4m3fn)
    out["scalar"] = np.array(2.5)
    out["empty"] = np.zeros((0, 3), np.int32)
    return out


def tree():
    return {
        "arrays": arrays(),
        "big": np.arange(300_000, dtype=np.float64).reshape(3000, 100),
        "cfg": {"lr": 3e-4, "steps": 10, "name": "run", "on": True, "off": None},
        "layers": [{"w": np.ones((2, 2), np.float32)}, {"w": np.zeros((2, 2), np.float32)}],
        "shape": (3, "x"),
        "blob": b"\x00\x01bytes",
    }


def same(a, b):
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        return (isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
                and a.tobytes() == b.tobytes())
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("ext", EXTS)
def test_trees_round_trip_exactly_for_every_dtype(tmp_path, ext):
    t = tree()
    treepack.save(t, tmp_path / "t", compression="zstd", metadata={"run": 7})
    info = treepack.convert(tmp_path / "t", tmp_path / f"out.{ext}")
    assert info["tensors"] == len(arrays()) + 3  # + big and the two layers' w
    assert same(treepack.load(tmp_path / f"out.{ext}"), t)
    treepack.convert(tmp_path / f"out.{ext}", tmp_path / "back")
    assert treepack.diff(tmp_path / "t", tmp_path / "back") == []
    assert treepack.load_structure(tmp_path / "back") is not None
    with pytest.raises(FileExistsError):
        treepack.convert(tmp_path / "t", tmp_path / f"out.{ext}")
    treepack.convert(tmp_path / "t", tmp_path / f"out.{ext}", overwrite=True)


@needs_zarr
def test_the_zarr_store_opens_in_zarr_python_with_the_chunk_grid_and_codec(tmp_path):
    t = tree()
    treepack.save(t, tmp_path / "t", compression="zstd", chunk_bytes=64 << 10)
    treepack.convert(tmp_path / "t", tmp_path / "out.zarr")
    g = zarr.open_group(str(tmp_path / "out.zarr"), mode="r")
    assert g.metadata.zarr_format == 3
    big = g["big"]
    assert big.chunks == tuple(treepack._core.Reader(str(tmp_path / "t"), None).chunk_shape("big"))
    assert type(big.compressors[0]).__name__ == "ZstdCodec"
    assert np.array_equal(big[...], t["big"])
    assert g["cfg"].attrs["lr"] == 3e-4 and g["cfg"].attrs["name"] == "run"
    # bfloat16 is stored as its bits (uint16), named in the `treepack` attribute.
    bf = g["arrays/bfloat16"]
    assert bf.dtype == np.uint16 and bf.attrs["treepack"]["dtype"] == "bfloat16"
    assert np.array_equal(bf[...], t["arrays"]["bfloat16"].view(np.uint16))


def test_the_hdf5_file_opens_in_h5py(tmp_path):
    t = tree()
    treepack.save(t, tmp_path / "t", compression="zstd")
    treepack.convert(tmp_path / "t", tmp_path / "out.h5")
    with h5py.File(tmp_path / "out.h5", "r") as f:
        assert np.array_equal(f["big"][...], t["big"])
        assert f["big"].compression == "gzip"
        assert f["cfg"].attrs["steps"] == 10 and f["cfg"].attrs["name"] == "run"
        assert json.loads(f["cfg"].attrs["treepack"])["none"] == ["off"]
        assert np.array_equal(f["arrays/complex128"][...], t["arrays"]["complex128"])


@needs_zarr
def test_stores_written_by_zarr_python_v3_and_v2_convert(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((100, 40)).astype(np.float32)
    for fmt in (3, 2):
        p = str(tmp_path / f"v{fmt}.zarr")
        root = zarr.open_group(p, mode="w", zarr_format=fmt)
        root.attrs["title"] = "made by zarr"
        a = root.create_array("x", shape=x.shape, chunks=(25, 40), dtype="float32")
        a[...] = x
        sub = root.create_group("sub")
        sub.attrs.update({"n": 3, "ok": False})
        b = sub.create_array("i", shape=(10,), dtype="int16", chunks=(4,))
        b[...] = np.arange(10, dtype=np.int16)
        t = treepack.load(p)
        assert t["title"] == "made by zarr" and t["sub"]["n"] == 3 and t["sub"]["ok"] is False
        assert np.array_equal(t["x"], x) and t["sub"]["i"].dtype == np.int16
        treepack.convert(p, tmp_path / f"from-v{fmt}.tpk")
        assert np.array_equal(treepack.load(tmp_path / f"from-v{fmt}.tpk", select=["x"])["x"], x)


def test_files_written_by_h5py_convert(tmp_path):
    p = tmp_path / "data.hdf5"
    with h5py.File(p, "w") as f:
        f.attrs["source"] = "instrument"
        f.attrs["calib"] = np.array([1.0, 2.0])
        g = f.create_group("run/1")
        g.create_dataset("signal", data=np.arange(1000, dtype=np.float32), chunks=(100,), compression="gzip")
        g.create_dataset("label", data=np.array([b"ab", b"cd"]))
        g.attrs["rate"] = 44100
    t = treepack.load(p)
    assert t["source"] == "instrument" and np.array_equal(t["calib"], [1.0, 2.0])
    assert np.array_equal(t["run"]["1"]["signal"], np.arange(1000, dtype=np.float32))
    assert t["run"]["1"]["rate"] == 44100 and t["run"]["1"]["label"].tolist() == [b"ab", b"cd"]
    assert treepack.load(p, select=["run/**"])["source"] is None


def test_what_zarr_and_hdf5_cannot_hold_is_named(tmp_path):
    import dataclasses

    @dataclasses.dataclass
    class Cfg:
        lr: float

    for tree_, says in (
        ({"cfg": Cfg(0.1)}, "`cfg`: a record"),
        ({1: np.ones(2)}, "is not a string"),
        ({"a/b": np.ones(2)}, "cannot be a"),
        ({"z": 1 + 2j}, "`z`: a complex number"),
        ({"treepack": 1}, "reserved"),
        (np.ones(3), "single array"),
    ):
        treepack.save(tree_, tmp_path / "t", overwrite=True, allow_pickle=False)
        for ext in EXTS:
            with pytest.raises(ValueError, match=says):
                treepack.convert(tmp_path / "t", tmp_path / f"bad.{ext}")
            assert not (tmp_path / f"bad.{ext}").exists()
    # Variable-length strings (object arrays) have no fixed dtype.
    if zarr is None:
        return
    root = zarr.open_group(str(tmp_path / "s.zarr"), mode="w", zarr_format=3)
    root.create_array("s", shape=(2,), dtype=str)[...] = np.array(["a", "bcd"], dtype=object)
    with pytest.raises(ValueError, match="`s`: an array of Python objects"):
        treepack.load(tmp_path / "s.zarr")


def test_damaged_files_fail_clearly(tmp_path):
    p = tmp_path / "cut.h5"
    with h5py.File(p, "w") as f:
        f.create_dataset("x", data=np.arange(100000.0))
    p.write_bytes(p.read_bytes()[:1000])
    with pytest.raises(ValueError, match="not a readable HDF5"):
        treepack.load(p)
    (tmp_path / "junk.h5").write_bytes(b"not hdf5 at all" * 100)
    with pytest.raises(ValueError, match="not a readable HDF5"):
        treepack.convert(tmp_path / "junk.h5", tmp_path / "x")
    if zarr is None:
        return
    z = tmp_path / "bad.zarr"
    z.mkdir()
    (z / "zarr.json").write_text('{"zarr_format": 3, "node_type": "grop"')
    with pytest.raises(ValueError, match="not a readable Zarr"):
        treepack.load(z)


def test_big_arrays_are_copied_in_blocks(tmp_path, monkeypatch):
    # Arrays above BLOCK_BYTES are written in blocks of whole chunk rows and read back as Dask
    # arrays (when Dask is there) that the save computes block by block.
    monkeypatch.setattr(_hierarchy_map, "BLOCK_BYTES", 8 << 10)
    t = {"big": np.arange(200_000, dtype=np.float64).reshape(2000, 100), "bf": np.ones((300, 30), ml_dtypes.bfloat16)}
    treepack.save(t, tmp_path / "t", chunk_bytes=16 << 10)
    for ext in EXTS:
        treepack.convert(tmp_path / "t", tmp_path / f"o.{ext}")
        treepack.convert(tmp_path / f"o.{ext}", tmp_path / f"b-{ext}")
        assert same(treepack.load(tmp_path / f"b-{ext}"), t)


def test_safetensors_and_npz_load_directly(tmp_path):
    from safetensors.numpy import save_file

    save_file({"layers.0.w": np.ones((2, 2), np.float32)}, str(tmp_path / "m.safetensors"))
    # Flat where the source is flat: names as stored (a state_dict's keys); nested on request.
    assert treepack.load(tmp_path / "m.safetensors")["layers.0.w"].shape == (2, 2)
    assert treepack.load(tmp_path / "m.safetensors", separator=".")["layers"]["0"]["w"].shape == (2, 2)
    np.savez(tmp_path / "d.npz", a=np.arange(3))
    assert treepack.load(tmp_path / "d.npz", select=["a"])["a"].tolist() == [0, 1, 2]
    with pytest.raises(TypeError, match="mmap"):
        treepack.load(tmp_path / "d.npz", mmap=True)


def test_giant_declared_shapes_are_refused_before_reading(tmp_path):
    with h5py.File(tmp_path / "giant.h5", "w") as f:
        f.create_dataset("x", shape=(10**7, 10**7), dtype="f8", chunks=(1000, 1000))  # 800 TB, nothing stored
    with pytest.raises(ValueError, match="HDF5 dataset `/x`: the arrays up to here declare 800000000000000 bytes"):
        treepack.load(tmp_path / "giant.h5")
    if zarr is not None:
        root = zarr.open_group(str(tmp_path / "giant.zarr"), mode="w", zarr_format=3)
        root.create_array("y", shape=(10**12,), dtype="int8", chunks=(10**6,))
        with pytest.raises(ValueError, match="`y`: .*sparse array of fill values"):
            treepack.convert(tmp_path / "giant.zarr", tmp_path / "out")
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("ext", EXTS)
def test_every_dtype_reads_the_same_in_the_library_and_back(tmp_path, ext):
    # Written by treepack, read by zarr-python / h5py; written by zarr-python / h5py, read by
    # treepack: value by value, for every dtype the format holds natively.
    native = {k: v for k, v in arrays().items() if k in DTYPES}
    treepack.save({"a": native}, tmp_path / "t")
    treepack.convert(tmp_path / "t", tmp_path / f"out.{ext}")
    if ext == "zarr":
        g = zarr.open_group(str(tmp_path / "out.zarr"), mode="r")
        got = {k: g[f"a/{k}"][...] for k in native}
        src = zarr.open_group(str(tmp_path / "lib.zarr"), mode="w", zarr_format=3)
        for k, v in native.items():
            src.create_array(k, shape=v.shape, dtype=v.dtype, chunks=(3, 5))[...] = v
    else:
        with h5py.File(tmp_path / "out.h5", "r") as f:
            got = {k: f[f"a/{k}"][...] for k in native}
        with h5py.File(tmp_path / "lib.h5", "w") as f:
            for k, v in native.items():
                f.create_dataset(k, data=v, chunks=(3, 5), compression="gzip")
    for k, v in native.items():
        assert got[k].dtype == v.dtype and got[k].tobytes() == v.tobytes(), k
    back = treepack.load(tmp_path / f"lib.{ext}")
    for k, v in native.items():
        assert back[k].dtype == v.dtype and back[k].tobytes() == v.tobytes(), k


@pytest.mark.parametrize("ext", EXTS)
def test_a_state_dict_converts_as_a_group_and_comes_back_ordered(tmp_path, ext):
    import collections

    sd = collections.OrderedDict([("0.weight", np.ones((3, 4), np.float32)), ("0.bias", np.zeros(3, np.float32)),
                                  ("2.weight", np.ones((1, 3), np.float32))])
    treepack.save({"model": sd, "step": 3}, tmp_path / "ck")
    treepack.convert(tmp_path / "ck", tmp_path / f"ck.{ext}")
    back = treepack.load(tmp_path / f"ck.{ext}")
    assert type(back["model"]) is collections.OrderedDict and list(back["model"]) == list(sd)
    assert same(dict(back["model"]), dict(sd)) and back["step"] == 3
