"""Partial and lazy reads: select, like, open() slicing, mmap."""

import numpy as np
import pytest

import treepack
from treepack import _core


def test_proposal_example(loc):
    data = ["hello", {"world": ["!", (1, 2)]}]
    treepack.save(data, loc)
    structure = treepack.load_structure(loc)
    assert isinstance(structure[0], treepack.LeafInfo) and structure[0].kind == "str"
    assert structure[1]["world"][1][0].path == "1/world/1/0"

    def mask(x):
        if isinstance(x, treepack.LeafInfo):
            return None if x.kind == "str" else x
        if isinstance(x, dict):
            return {k: mask(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(mask(v) for v in x)
        return x

    assert treepack.load(loc, like=mask(structure)) == [None, {"world": [None, (1, 2)]}]
    assert treepack.load(loc) == data


def big_tree():
    return {
        "params": {"w": np.arange(512 * 1024, dtype=np.float32).reshape(512, 1024), "b": np.ones(1024, np.float32)},
        "opt": {"m": np.zeros((512, 1024), np.float32)},
        "step": 10,
    }


def test_select_reads_only_selected_bytes(loc):
    tree = big_tree()
    treepack.save(tree, loc, chunk_bytes=256 << 10)
    r = _core.Reader(loc)
    before = r.io_stats()[0]
    from treepack import _codec

    out = r.load(_codec.Decoder((), False, False), _codec.np_dtype, select=["params/w"])
    read = r.io_stats()[0] - before
    assert read == tree["params"]["w"].nbytes
    assert out["opt"]["m"] is None and out["step"] is None and out["params"]["b"] is None
    assert np.array_equal(out["params"]["w"], tree["params"]["w"])
    sel = treepack.load(loc, select=["params/**", "step"])
    assert sel["opt"]["m"] is None and sel["step"] == 10 and sel["params"]["b"].shape == (1024,)


def test_open_is_lazy_and_slices_numpy_style(loc):
    tree = big_tree()
    treepack.save(tree, loc, chunk_bytes=64 << 10)
    v = treepack.open(loc)
    assert set(v.keys()) == {"params", "opt", "step"}
    w = v["params"]["w"]
    assert isinstance(w, treepack.LazyArray)
    assert w.shape == (512, 1024) and w.dtype == np.float32 and w.nbytes == 512 * 1024 * 4
    full = tree["params"]["w"]
    for idx in [(slice(10, 20), slice(5, 9)), 3, (Ellipsis, -1), (slice(None, None, 7), 2), (slice(500, None),)]:
        assert np.array_equal(w[idx], full[idx]), idx
    assert v["step"] == 10
    assert np.array_equal(np.asarray(v["params"]["b"]), np.ones(1024, np.float32))
    reader = v._r
    b0 = reader.io_stats()[0]
    w[100, 0:10]
    assert reader.io_stats()[0] - b0 <= 64 << 10  # one chunk, not the 2 MiB array
    with pytest.raises(IndexError):
        w[::-1]


def test_mmap_is_read_only_and_backed_by_the_file(tmp_path):
    loc = str(tmp_path / "m.tpk")
    tree = big_tree()
    treepack.save(tree, loc)
    back = treepack.load(loc, mmap=True)
    w = back["params"]["w"]
    assert not w.flags.writeable and not w.flags.owndata
    assert np.array_equal(w, tree["params"]["w"])
    with pytest.raises(ValueError):
        w[0, 0] = 1
    base = w
    while getattr(base, "base", None) is not None and not isinstance(base, treepack._core.BytesOwner):
        base = base.base
    assert isinstance(base, treepack._core.BytesOwner)
    normal = treepack.load(loc)
    assert normal["params"]["w"].flags.writeable


def test_metadata_and_info(loc):
    info = treepack.save({"a": np.zeros(10)}, loc, metadata={"step": 5, "tags": ["x"]})
    assert info.leaves == 1 and info.bytes_written > 80 and info.location == loc
    assert treepack.open(loc).metadata == {"step": 5, "tags": ["x"]}
