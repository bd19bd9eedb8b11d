"""Awkward Arrays (docs/python.md, "Awkward Arrays"): the form as data plus flat buffers in
packs; exact round trips of ragged lists, records, options, unions and strings; a lazy view
reads only the buffers of the fields it touches; damaged nodes fail clearly."""

import awkward as ak
import numpy as np
import pytest

import treepack
from treepack.integrations import awkward as awkward_arrays


def events(n=1000):
    rows = [
        {"x": [1.5, 2.5], "name": "a", "opt": None, "u": 1, "pt": {"px": 1.0, "py": -1.0}},
        {"x": [], "name": "bcd", "opt": 3, "u": "s", "pt": {"px": 0.5, "py": 2.0}},
    ]
    return ak.with_name(ak.Array(rows * (n // 2)), "Event")


@pytest.mark.parametrize("arr", [
    events(),
    ak.Array([[1, 2, 3], [], [4]]),
    ak.Array(["one", "two", None, "three"]),
    ak.Array([[[1.0], []], [[2.0, 3.0]]]),
    ak.Array(np.arange(12).reshape(3, 4)),
    ak.Array([]),
    ak.Array([1, "a", [2.0], None]),
], ids=["records", "ragged", "strings-with-none", "nested", "regular", "empty", "union"])
def test_awkward_arrays_round_trip_exactly(tmp_path, arr):
    treepack.save({"a": arr, "step": 3}, tmp_path / "t", compression="zstd")
    back = treepack.load(tmp_path / "t")["a"]
    assert isinstance(back, ak.Array)
    assert str(back.type) == str(arr.type)
    assert ak.array_equal(back, arr, equal_nan=True)
    assert ak.parameters(back) == ak.parameters(arr)


def test_the_form_is_readable_and_buffers_are_arrays(tmp_path):
    treepack.save({"ev": events()}, tmp_path / "t")
    s = treepack.load_structure(tmp_path / "t")["ev"]
    assert s.type_name == "py.awkward" and s.data["form"]["class"] == "RecordArray"
    assert s.data["form"]["fields"] == ["x", "name", "opt", "u", "pt"] and s.data["length"] == 1000
    assert all(leaf.kind == "array" for leaf in s.children["buffers"].values())
    # Untrusted-type audits let it through (a built-in type: nothing is imported or called).
    assert not treepack.untrusted_types(tmp_path / "t")


def test_a_lazy_view_reads_only_the_fields_it_touches(tmp_path):
    arr = events(200_000)
    treepack.save({"ev": arr}, tmp_path / "t")
    v = treepack.open(tmp_path / "t")
    lazy = v["ev"]
    assert isinstance(lazy, ak.Array) and len(lazy) == len(arr)
    before = v._r.io_stats()[0]
    total = ak.sum(lazy["pt", "px"])
    read = v._r.io_stats()[0] - before
    assert total == ak.sum(arr["pt", "px"])
    px_bytes = 200_000 * 8
    assert px_bytes <= read < px_bytes * 1.5, (read, px_bytes)
    stored = sum(leaf.nbytes for leaf in treepack.load_structure(tmp_path / "t")["ev"].children["buffers"].values())
    assert read < stored / 5


def test_damaged_awkward_nodes_fail_clearly(tmp_path, monkeypatch):
    good = awkward_arrays.encode

    def bad_form(obj):
        kind, name, data, kids = good(obj)
        return kind, name, data.replace("ListOffsetArray", "NoSuchArray"), kids

    monkeypatch.setattr(awkward_arrays, "encode", bad_form)
    treepack.save({"a": ak.Array([[1], [2, 3]])}, tmp_path / "t")
    monkeypatch.setattr(awkward_arrays, "encode", good)
    with pytest.raises(ValueError, match="py.awkward: the stored form and buffers do not make an array"):
        treepack.load(tmp_path / "t")
    # A buffer shorter than its form says: refused, not read past.
    def short(obj):
        kind, name, data, kids = good(obj)
        bufs = {k: v[:1] for k, v in kids[0][1].items()}
        return kind, name, data, [("buffers", bufs)]

    monkeypatch.setattr(awkward_arrays, "encode", short)
    treepack.save({"a": ak.Array([[1.0] * 100, [2.0] * 50])}, tmp_path / "s")
    monkeypatch.setattr(awkward_arrays, "encode", good)
    with pytest.raises(ValueError, match="do not make an array"):
        treepack.load(tmp_path / "s")
