"""Partial and lazy reads: select, like, open() slicing, mmap."""

import os

import numpy as np
import pytest

import treepack
from treepack import _core


def test_leaf_info_repr_is_python_and_evaluates_back(tmp_path):
    # Keys with quotes, a backslash and non-ASCII text: the repr must be Python's, not Rust's.
    tree = {"it's \\ \u00e9": np.zeros((2, 3), np.float32), "n": 5}
    treepack.save(tree, tmp_path / "t")
    s = treepack.load_structure(tmp_path / "t")
    arr, n = s["it's \\ \u00e9"], s["n"]
    assert repr(arr) == (
        "LeafInfo(path=\"it's \\\\ \u00e9\", kind='array', dtype='float32', shape=(2, 3), nbytes=24, inline=True)"
    )
    assert repr(n) == "LeafInfo(path='n', kind='int', dtype=None, shape=None, nbytes=0, inline=True)"
    for x in (arr, n):
        assert eval(repr(x), {"LeafInfo": treepack.LeafInfo}) == x


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


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="thread names are read from /proc")
@pytest.mark.parametrize("name", ["ckpt", "ckpt.tpk"])
def test_local_opens_and_mmap_loads_start_no_io_runtime(tmp_path, name):
    # Starting the async runtime's threads was most of a fresh process's mmap load (W6): a local
    # open, structure read and mmap load (verified or not) run on the calling thread.
    import subprocess
    import sys

    loc = str(tmp_path / name)
    tree = big_tree()
    treepack.save(tree, loc)
    child = f"""
import os, numpy as np, treepack
loc = {loc!r}
a = treepack.load(loc, mmap=True)
b = treepack.load(loc, mmap=True, verify=True)
treepack.load_structure(loc)
v = treepack.open(loc)
names = [open(f"/proc/self/task/{{t}}/comm").read().strip() for t in os.listdir("/proc/self/task")]
assert not [n for n in names if n.startswith("treepack-io")], names
assert v["params"]["w"][1, :3].tolist() == [1024.0, 1025.0, 1026.0]
w = np.arange(512 * 1024, dtype=np.float32).reshape(512, 1024)
assert np.array_equal(a["params"]["w"], w) and np.array_equal(b["params"]["w"], w)
assert a["step"] == 10 and not a["params"]["w"].flags.writeable
treepack.load(loc)  # a whole (copying) load of a local tree still works after them
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_an_mmap_load_of_a_truncated_pack_is_a_corrupt_error(tmp_path):
    loc = tmp_path / "ckpt"
    treepack.save(big_tree(), str(loc))
    (pack,) = (loc / "packs").iterdir()
    with open(pack, "r+b") as f:
        f.truncate(os.path.getsize(pack) // 2)
    with pytest.raises(treepack.CorruptError, match="past the end of the file"):
        treepack.load(str(loc), mmap=True)


def test_metadata_and_info(loc):
    info = treepack.save({"a": np.zeros(10)}, loc, metadata={"step": 5, "tags": ["x"]})
    assert info.leaves == 1 and info.bytes_written > 80 and info.location == loc
    assert treepack.open(loc).metadata == {"step": 5, "tags": ["x"]}


def _every_kind():
    """A tree with every kind of node, key and key-path escape."""
    import collections
    import dataclasses
    import datetime as dt

    Point = collections.namedtuple("Point", "x y")

    @dataclasses.dataclass
    class Cfg:
        name: str
        sizes: tuple

    return {
        "arrays": {"big": np.arange(300_000, dtype=np.float32).reshape(300, 1000), "tiny": np.int8([1, 2, 3])},
        "scalars": [None, True, 1 << 80, -3, 2.5, float("nan"), 1 + 2j, "s", b"b" * 10],
        "blobs": ("x" * 5000, b"\x00" * 5000),
        "keys": {1: "int", (1, "a/b"): "tuple", None: "none", 2.5: "float", False: "bool", "": "empty", "a/b~c*": "escaped"},
        "records": [Point(1, 2), Cfg("c", (1, 2))],
        "when": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc),
        "deep": [[[{"k": [()]}]]],
    }


def test_one_pass_structure_equals_the_reader_structure(tmp_path):
    """load_structure builds its objects while parsing the manifest (no manifest tree); it must
    give exactly what the Reader's walk over the parsed manifest gives, for every kind of node,
    key and key-path escape, in both layouts."""
    tree = _every_kind()
    for p in (str(tmp_path / "d"), str(tmp_path / "f.tpk")):
        treepack.save(tree, p, chunk_bytes=256 << 10)
        fast = _core.structure_one_pass(p, treepack._struct_node, None)
        assert fast is not None
        slow = _core.Reader(p, None).structure(treepack._struct_node)
        assert repr(fast) == repr(slow)  # repr: the NaN leaf's info compares equal, its value would not
        assert fast["keys"][(1, "a/b")].path == "keys/~t(~i1,a~1b)"
        assert fast["keys"]["a/b~c*"].path == "keys/a~1b~0c~2"
        assert fast["arrays"]["big"].inline is False and fast["arrays"]["big"].shape == (300, 1000)
        assert treepack.load_structure(p) == fast


def test_structure_leaves_no_cycle_collection_behind(tmp_path):
    """Leaf infos hold no Python objects, so they (and dicts/tuples of nothing else) are not
    tracked by the cycle collector: 100k tracked leaves left a ~40 ms collection for the
    caller's next allocation. Containers must still behave: a dict tracks itself again when
    something that could form a cycle is stored in it, and such a cycle is collected."""
    import gc
    import weakref

    tree = {"a": {"x": 1, "y": np.zeros(3)}, "t": (1, "s"), "l": [1, 2], "mixed": {"x": 1, "d": {"y": 2}}}
    for p in (str(tmp_path / "d"), str(tmp_path / "f.tpk")):
        treepack.save(tree, p)
        for read in (treepack.load_structure, lambda p: _core.Reader(p, None).structure(treepack._struct_node)):
            s = read(p)
            assert not gc.is_tracked(s["a"]["x"]) and not gc.is_tracked(s["a"]) and not gc.is_tracked(s["t"])
            assert gc.is_tracked(s["l"]) and gc.is_tracked(s["mixed"]) and gc.is_tracked(s)
            assert s["a"]["y"].shape == (3,) and s["t"][1].kind == "str"

            class Box:
                pass

            box = Box()
            box.d = s["a"]
            s["a"]["box"] = box  # a cycle through a dict that was untracked
            assert gc.is_tracked(s["a"])
            gone = weakref.ref(box)
            del box, s
            gc.collect()
            assert gone() is None, "a cycle through an untracked structure dict was never collected"


def test_one_pass_structure_falls_back_to_the_full_error(loc):
    treepack.save({"a": np.zeros(4, np.float32)}, loc)
    manifest = __import__("pathlib").Path(loc) / "treepack.json"
    text = manifest.read_bytes()
    manifest.write_bytes(text.replace(b'"float32"', b'"float33"'))
    assert _core.structure_one_pass(loc, treepack._struct_node, None) is None
    with pytest.raises(treepack.TreepackError, match="checksum|hash"):
        treepack.load_structure(loc)


def test_one_pass_load_equals_the_audited_reader_load(tmp_path):
    """A whole-tree load of an all-inline tree builds its objects while parsing the manifest; it
    must equal the audited Reader load for every inline kind and built-in type, and step aside
    (None) for records, custom types that need the audit, and stored leaves."""
    import datetime as dt
    import decimal
    import enum
    import pathlib
    import pickle
    import uuid

    from treepack import _codec

    tree = {
        "nums": [None, True, False, 0, -(1 << 70), 1.5, float("-inf"), 3 - 4j],
        "text": ("", "é/~*", b"\x00\xff"),
        "keys": {7: 1, (1, "x"): 2, None: 3, 0.5: 4, True: 5},
        "arrays": [np.arange(6, dtype=np.int16).reshape(2, 3), np.float64([1.5]), np.zeros((0, 3), np.uint8)],
        "builtins": [
            dt.datetime(2026, 5, 6, 7, 8, 9, 10, tzinfo=dt.timezone.utc), dt.date(2026, 1, 2), dt.time(3, 4),
            dt.timedelta(days=2, seconds=3), decimal.Decimal("1.25"), uuid.UUID(int=7), pathlib.PurePosixPath("a/b"),
            {1, 2}, frozenset({"a"}), bytearray(b"ab"), range(1, 9, 2), slice(1, None, 2), Ellipsis, np.float32(2.5),
        ],
        "empty": [{}, [], ()],
    }
    for p in (str(tmp_path / "d"), str(tmp_path / "f.tpk")):
        treepack.save(tree, p)
        dec = _codec.Decoder((), False, False)
        fast = _core.load_one_pass(p, dec, _codec.np_dtype, _codec.AUDIT_FREE)
        assert fast is not None
        r = _core.Reader(p, None)
        slow = r.load(_codec.Decoder((), False, False), _codec.np_dtype)
        assert pickle.dumps(fast) == pickle.dumps(slow)
        assert fast["keys"][(1, "x")] == 2 and fast["builtins"][0] == tree["builtins"][0]
        assert treepack.load(p)["arrays"][0].tolist() == [[0, 1, 2], [3, 4, 5]]

    class Color(enum.Enum):
        RED = 1

    # A few stored leaves are read on the spot (a blob shared by many records, one big array).
    img = bytes(range(256)) * 16
    few = {"a": np.arange(100_000, dtype=np.float32), "recs": [{"i": i, "img": img} for i in range(50)]}
    for p in (str(tmp_path / "few"), str(tmp_path / "few.tpk")):
        treepack.save(few, p)
        fast = _core.load_one_pass(p, _codec.Decoder((), False, False), _codec.np_dtype, _codec.AUDIT_FREE)
        assert fast is not None
        assert fast["a"].tolist() == few["a"].tolist() and fast["recs"][49]["img"] == img
        assert fast["recs"][0]["img"] is fast["recs"][49]["img"]  # one object, as the Reader path gives
    # More than 16 stored leaves: the packs (16 MiB at most) are read whole, once.
    many = {f"a{i}": np.full(2000, i, np.float32) for i in range(20)}
    p = str(tmp_path / "many")
    treepack.save(many, p)
    fast = _core.load_one_pass(p, _codec.Decoder((), False, False), _codec.np_dtype, _codec.AUDIT_FREE)
    assert fast is not None and [fast[f"a{i}"][0] for i in range(20)] == list(range(20))
    needs_reader = {
        "stored": {"big": np.random.default_rng(0).random((16 << 20) // 4 + 1, np.float32), "n": 1},  # packs > 16 MiB
        "enum": {"c": Color.RED},  # py.enum names a class: the audit decides
        "record": {"p": __import__("collections").namedtuple("P", "x")(1)},
    }
    for name, t in needs_reader.items():
        p = str(tmp_path / name)
        treepack.save(t, p)
        assert _core.load_one_pass(p, _codec.Decoder((), False, False), _codec.np_dtype, _codec.AUDIT_FREE) is None, name
    assert treepack.load(str(tmp_path / "stored"))["n"] == 1


@pytest.mark.slow
def test_one_pass_of_a_big_manifest_equals_the_reader(tmp_path):
    """Manifests over 1 MiB are parsed by two threads (the big container's items are split
    between this thread and a helper whose owned trees are replayed here); structure and load
    must still equal the Reader's, key paths included, with the big container at the root (a
    list of records) or one level down (W2's shape), in both layouts."""
    import collections
    import datetime as dt
    import pickle

    from treepack import _codec

    Point = collections.namedtuple("Point", "x y")

    def item(i):
        return {
            "id": f"call-{i}", "n": i, "score": i / 7, "ok": i % 2 == 0, "none": None,
            "ts": dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=i),
            "emb": np.full(4, i, np.float32), "pair": (i, "x/y~"), "keys": {i: "int", (1, "a/b"): "t"},
            "raw": b"\x00\x01" * 3, "nested": [[{"k": [()]}]],
        }

    shapes = {
        "list": [item(i) for i in range(3000)],
        "wrapped": {"opt": {f"p{i}": item(i) for i in range(3000)}},
    }
    for name, tree in shapes.items():
        for p in (str(tmp_path / name), str(tmp_path / f"{name}.tpk")):
            treepack.save(tree, p)
            if not p.endswith(".tpk"):  # big enough to be split (the .tpk holds the same manifest)
                assert os.path.getsize(os.path.join(p, "treepack.json")) >= 1 << 20
            fast = _core.load_one_pass(p, _codec.Decoder((), False, False), _codec.np_dtype, _codec.AUDIT_FREE)
            assert fast is not None, p
            slow = _core.Reader(p, None).load(_codec.Decoder((), False, False), _codec.np_dtype)
            assert pickle.dumps(fast) == pickle.dumps(slow), p
            s_fast = _core.structure_one_pass(p, treepack._struct_node, None)
            s_slow = _core.Reader(p, None).structure(treepack._struct_node)
            assert repr(s_fast) == repr(s_slow), p
        one = fast[2999] if name == "list" else fast["opt"]["p2999"]
        assert one["id"] == "call-2999" and one["keys"][(1, "a/b")] == "t" and one["emb"].tolist() == [2999.0] * 4
        leaf = s_fast[2999]["keys"][(1, "a/b")] if name == "list" else s_fast["opt"]["p2999"]["keys"][(1, "a/b")]
        assert leaf.path == ("2999" if name == "list" else "opt/p2999") + "/keys/~t(~i1,a~1b)"
    # Records in a big manifest: the structure takes the helped path too.
    recs = [Point(i, str(i) * 20) for i in range(12000)]
    p = str(tmp_path / "recs")
    treepack.save(recs, p)
    assert os.path.getsize(os.path.join(p, "treepack.json")) >= 1 << 20
    s_fast = _core.structure_one_pass(p, treepack._struct_node, None)
    assert repr(s_fast) == repr(_core.Reader(p, None).structure(treepack._struct_node))
    assert s_fast[11999].path == "11999"


def _evict(path):
    """Drop a saved tree's pages from the page cache, so the next load reads the disk."""
    files = [path] if os.path.isfile(path) else [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


@pytest.mark.parametrize("name", ["ckpt", "ckpt.tpk"])
def test_a_cold_checkpoint_loads_as_writable_arrays_equal_to_the_saved_ones(tmp_path, name):
    # More stored leaves than a one-pass load reads on the spot, mostly big (the whole-load path
    # that reads uncached leaves around the page cache), next to small ones.
    rng = np.random.default_rng(3)
    tree = {
        "layers": {f"{i:02d}": {"w": rng.standard_normal((300 + i, 1024), dtype=np.float32), "b": np.arange(8.0) + i} for i in range(20)},
        "step": 12,
    }
    p = str(tmp_path / name)
    treepack.save(tree, p)
    for state in ("cached", "evicted"):
        if state == "evicted":
            _evict(p)
        back = treepack.load(p)
        assert back["step"] == 12
        for k, layer in tree["layers"].items():
            got = back["layers"][k]
            for f in ("w", "b"):
                np.testing.assert_array_equal(got[f], layer[f], err_msg=f"{state} {k}/{f}")
                assert got[f].dtype == layer[f].dtype and got[f].flags.writeable, (state, k, f)
            assert got["w"].ctypes.data % 64 == 0, "big arrays are aligned as in the file"
        back["layers"]["00"]["w"][0, 0] = 5.0
        assert back["layers"]["00"]["w"][0, 0] == 5.0


def _reseal(manifest):
    """Rewrite a manifest file's trailing hash after an edit (to craft hostile manifests)."""
    import blake3

    data = manifest.read_bytes()
    body = data[: len(data) - 86]
    manifest.write_bytes(body + b',\n"manifest_hash":"' + blake3.blake3(body).hexdigest().encode() + b'"}\n')


def test_structure_of_a_big_manifest_is_read_by_the_outline_and_equals_the_reader(tmp_path):
    """Manifests of 256 KiB or more are read for load_structure by a helper thread's
    structure-only parse while this thread builds (leaf infos point into shared tables): the
    result must equal the Reader's for every kind of node, key and escape, in both layouts."""
    tree = _every_kind()
    tree["scalars"] += ["é\\\"", np.float16(1)]
    tree["many"] = {f"p{i}": {"step": i, "m": np.full(2, i, np.float32), "name": f"n{i}"} for i in range(6000)}
    for p in (str(tmp_path / "d"), str(tmp_path / "f.tpk")):
        treepack.save(tree, p, chunk_bytes=256 << 10)
        before = _core._outline_builds()
        fast = treepack.load_structure(p)
        assert _core._outline_builds() == before + 1, "the structure-only read did not answer"
        slow = _core.Reader(p, None).structure(treepack._struct_node)
        assert repr(fast) == repr(slow)  # repr: the NaN leaf's info compares equal, its value would not
        assert fast["many"] == slow["many"] and fast["keys"] == slow["keys"]
        assert fast["keys"][(1, "a/b")].path == "keys/~t(~i1,a~1b)"
        assert fast["keys"]["a/b~c*"].path == "keys/a~1b~0c~2"
        assert fast["scalars"][9].nbytes == len("é\\\"".encode())
        big, m = fast["arrays"]["big"], fast["many"]["p5999"]["m"]
        assert (big.inline, big.shape, big.dtype, big.nbytes) == (False, (300, 1000), "float32", 1_200_000)
        assert (m.path, m.kind, m.dtype, m.shape, m.nbytes, m.inline) == ("many/p5999/m", "array", "float32", (2,), 8, True)
        assert m == treepack.LeafInfo("many/p5999/m", "array", "float32", (2,), 8, True) and m != fast["many"]["p0"]["m"]
        assert eval(repr(m), {"LeafInfo": treepack.LeafInfo}) == m
        assert isinstance(fast["records"][1], treepack.StructNode) and fast["records"][1].path == "records/1"


def test_a_big_manifest_the_outline_refuses_gets_the_full_answer(tmp_path):
    """What the structure-only read cannot give (a repeated key, keys Python merges, a broken
    seal) falls back to the one-pass parse: its error, or its result."""
    tree = {"many": {f"p{i}": {"step": i, "name": f"n{i}"} for i in range(12000)}}
    p = tmp_path / "d"
    manifest = p / "treepack.json"
    treepack.save(tree, str(p))
    assert manifest.stat().st_size >= 256 << 10
    text = manifest.read_bytes()
    # A repeated key: refused by the full parse with the key named.
    manifest.write_bytes(text.replace(b'"p1":', b'"p0":', 1))
    _reseal(manifest)
    before = _core._outline_builds()
    with pytest.raises(treepack.TreepackError, match="duplicate key `p0`"):
        treepack.load_structure(str(p))
    # Keys Python takes for one (1 and 1.0) but the format does not: the one-pass result (int
    # keys keep the `items` form).
    treepack.save({"many": {i: v for i, v in enumerate(tree["many"].values())}}, str(p), overwrite=True)
    text = manifest.read_bytes()
    manifest.write_bytes(text.replace(b"[0,{", b"[1.0,{", 1))
    _reseal(manifest)
    s = treepack.load_structure(str(p))
    assert s == _core.Reader(str(p), None).structure(treepack._struct_node)
    assert len(s["many"]) == 11999 and s["many"][1]["step"].path in ("many/~i1/step", "many/~f1.0/step")
    # A broken seal: the checksum error.
    manifest.write_bytes(text.replace(b'"n5"', b'"n6"', 1))
    with pytest.raises(treepack.TreepackError, match="checksum|hash"):
        treepack.load_structure(str(p))
    assert _core._outline_builds() == before


def test_a_small_manifest_with_keys_python_merges_reads_alike_by_every_path(tmp_path):
    """Small manifests are outlined on the calling thread; a dict whose keys Python takes for one
    (1 and 1.0: distinct in the format) cannot be told from a repeated key there, so the Reader
    path answers, with the same merged dict a load gives; a real repeated key is refused."""
    p = tmp_path / "d"
    manifest = p / "treepack.json"
    treepack.save({"m": {0: 1, 2: 2, "c": 3}}, str(p))  # int keys: the `items` form
    text = manifest.read_bytes()
    manifest.write_bytes(text.replace(b"[0,1]", b"[1,1]", 1).replace(b"[2,2]", b"[1.0,2]", 1))
    _reseal(manifest)
    s = treepack.load_structure(str(p))
    assert s == _core.Reader(str(p), None).structure(treepack._struct_node)
    assert len(s["m"]) == 2 and s["m"][1].kind == "int" and s["m"]["c"].path == "m/c"
    assert treepack.load(str(p)) == {"m": {1: 2, "c": 3}}
    manifest.write_bytes(text.replace(b"[2,2]", b"[0,2]", 1))
    _reseal(manifest)
    with pytest.raises(treepack.TreepackError, match="duplicate key `~i0`"):
        treepack.load_structure(str(p))


def test_a_structure_node_reads_like_the_loaded_mapping(tmp_path):
    """Issue 51: load_structure of an OrderedDict state_dict (a py.ordereddict custom node) is
    indexed, iterated and measured like the dict load gives; missing keys say what is there."""
    import collections
    import dataclasses

    @dataclasses.dataclass
    class Opt:
        lr: float
        mu: np.ndarray

    sd = collections.OrderedDict([("lm_head.weight", np.zeros((4, 2), np.float32)), ("embed", np.ones(3)), ("n", 7)])
    treepack.save(sd, tmp_path / "sd")
    st = treepack.load_structure(tmp_path / "sd")
    loaded = treepack.load(tmp_path / "sd")
    assert isinstance(st, treepack.StructNode) and st.type_name == "py.ordereddict"
    assert st["lm_head.weight"].shape == (4, 2) and st["lm_head.weight"].dtype == "float32"
    assert list(st) == list(st.keys()) == list(loaded) == ["lm_head.weight", "embed", "n"]
    assert len(st) == len(loaded) == 3 and "embed" in st and "nope" not in st and [1] not in st
    assert [v.path for v in st.values()] == ["lm_head.weight", "embed", "n"]
    assert [(k, v.kind) for k, v in st.items()] == [("lm_head.weight", "array"), ("embed", "array"), ("n", "int")]
    assert st.get("n").kind == "int" and st.get("nope") is None and st.get([1], 5) == 5
    with pytest.raises(KeyError, match=r"'lm_head\.bias'.*py\.ordereddict at the root.*'lm_head\.weight'"):
        st["lm_head.bias"]
    # The shape the loaded tree has, key by key.
    assert {k: st[k].shape for k in st if st[k].kind == "array"} == {k: v.shape for k, v in loaded.items() if hasattr(v, "shape")}
    # A record: its fields by name; a node with no children is still true.
    treepack.save({"opt": Opt(0.1, np.zeros(2)), "e": collections.OrderedDict()}, tmp_path / "rec")
    st = treepack.load_structure(tmp_path / "rec")
    assert st["opt"]["mu"].shape == (2,) and st["opt"]["lr"].kind == "float" and sorted(st["opt"]) == ["lr", "mu"]
    assert len(st["e"]) == 0 and bool(st["e"]) and list(st["e"].items()) == []
    with pytest.raises(KeyError, match="at `opt`.*'lr', 'mu'"):
        st["opt"]["count"]
    # Still a frozen dataclass, and (with JAX) still a pytree node over its children.
    with pytest.raises(dataclasses.FrozenInstanceError):
        st["opt"].kind = "x"
    jax = pytest.importorskip("jax")
    paths = jax.tree.map(lambda leaf: leaf.path, treepack.load_structure(tmp_path / "sd"))
    assert isinstance(paths, treepack.StructNode) and dict(paths.items()) == {k: k for k in sd}
