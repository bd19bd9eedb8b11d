"""Foreign formats are known by their content, by one detector in the core that ``treepack
convert`` (crates/treepack-cli/tests/cli.rs, the same cases), ``treepack.convert`` and
``treepack.load`` share: a file's name does not decide what it holds."""

import io
import os
import zipfile

import numpy as np
import pytest

import treepack
from treepack import _core


def _npy(a):
    b = io.BytesIO()
    np.save(b, a)
    return b.getvalue()


def test_a_misleading_extension_is_read_past(tmp_path):
    tree = {"params": {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, np.float32)}}
    treepack.save(tree, tmp_path / "t")
    # safetensors named .npz: converted and loaded as safetensors
    treepack.convert(tmp_path / "t", tmp_path / "w.safetensors")
    os.rename(tmp_path / "w.safetensors", tmp_path / "w.npz")
    assert _core.detect_format(str(tmp_path / "w.npz")) == "safetensors"
    # flat where the source is flat (names as stored), nested on request
    np.testing.assert_array_equal(treepack.load(tmp_path / "w.npz")["params.w"], tree["params"]["w"])
    back = treepack.load(tmp_path / "w.npz", separator=".")
    np.testing.assert_array_equal(back["params"]["w"], tree["params"]["w"])
    treepack.convert(tmp_path / "w.npz", tmp_path / "back", separator=".")
    np.testing.assert_array_equal(treepack.load(tmp_path / "back")["params"]["b"], tree["params"]["b"])
    # a treepack tree named .zarr is a treepack tree
    os.rename(tmp_path / "t", tmp_path / "tree.zarr")
    assert _core.detect_format(str(tmp_path / "tree.zarr")) == "treepack"
    np.testing.assert_array_equal(treepack.load(tmp_path / "tree.zarr")["params"]["w"], tree["params"]["w"])
    # npy named .safetensors, npz named .h5
    (tmp_path / "a.safetensors").write_bytes(_npy(np.arange(4, dtype=np.int64)))
    assert _core.detect_format(str(tmp_path / "a.safetensors")) == "npy"
    np.testing.assert_array_equal(treepack.load(tmp_path / "a.safetensors"), np.arange(4))
    with zipfile.ZipFile(tmp_path / "b.h5", "w") as z:
        z.writestr("x.npy", _npy(np.ones(2, np.float32)))
    assert _core.detect_format(str(tmp_path / "b.h5")) == "npz"
    np.testing.assert_array_equal(treepack.load(tmp_path / "b.h5")["x"], np.ones(2, np.float32))


def test_the_cli_cases_are_told_the_same(tmp_path):
    # The bytes cli.rs's convert_knows_a_source_by_its_content_not_its_name writes.
    for name, data, fmt in [
        ("a.safetensors", b"\x93NUMPY\x01\x00v\x00{'descr': '<f4'}", "npy"),
        ("b.safetensors", b"PK\x05\x06" + bytes(18), "npz"),
        ("c.safetensors", b"\x89HDF\r\n\x1a\n\x00\x00\x00\x00\x00\x08\x08\x00", "hdf5"),
    ]:
        (tmp_path / name).write_bytes(data)
        assert _core.detect_format(str(tmp_path / name)) == fmt, name
    # Zarr folders by the files that mark them; a destination (or anything not there) by its name.
    (tmp_path / "store.npy").mkdir()
    (tmp_path / "store.npy" / "zarr.json").write_text("{}")
    assert _core.detect_format(str(tmp_path / "store.npy")) == "zarr"
    assert _core.detect_format(str(tmp_path / "new.NPZ")) == "npz"
    assert _core.detect_format(str(tmp_path / "a.safetensors"), False) == "safetensors"
    assert _core.detect_format("s3://bucket/x.h5") == "hdf5"


def test_a_foreign_file_named_like_nothing_loads(tmp_path):
    h5py = pytest.importorskip("h5py")
    with h5py.File(tmp_path / "data.bin", "w") as f:
        f["x"] = np.arange(3)
    assert _core.detect_format(str(tmp_path / "data.bin")) == "hdf5"
    np.testing.assert_array_equal(treepack.load(tmp_path / "data.bin")["x"], np.arange(3))
