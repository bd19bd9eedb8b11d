"""Objects held at several places, and cycles, converted to Zarr and HDF5 (issue 51), and
``select=`` / ``--select`` for conversions (docs/convert.md, "Objects at several places" and
"Converting part of a tree").

HDF5 writes a shared object once and links it from its other places (hard links); treepack's
HDF5 reader gives every link to one group or dataset back as one object. Zarr has no links: a
shared array is written at each place, a shared group once (its other places empty groups), each
later place noting the first (``same``), and the reader gives back one object. Either way the
tree comes back with the same sharing, in time and space linear in the places. A cycle cannot be
written: refused naming the place."""

import dataclasses
import os

import ml_dtypes
import numpy as np
import pytest

import treepack

h5py = pytest.importorskip("h5py")
try:
    import zarr
except ImportError:  # zarr-python 3 needs Python 3.11+
    zarr = None
EXTS = ["zarr", "h5"] if zarr is not None else ["h5"]


def size_of(p):
    if os.path.isdir(p):
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(p) for f in fs)
    return os.path.getsize(p)


# ---------------------------------------------------------------- shared objects


@pytest.mark.parametrize("ext", EXTS)
@pytest.mark.parametrize("kind", ["list", "dict"])
def test_ten_levels_of_an_object_held_twice_convert_in_linear_time_and_space(attack, ext, kind):
    # 2^10 paths to the one array; before, HDF5 expanded every path (10 s, 160 MB, killed) and
    # Zarr failed with "Object of type ndarray is not JSON serializable". In a child limited to
    # 1 GiB of address space (glibc's per-thread malloc arenas held to 2, as zarr-python's
    # thread pool would reserve 64 MiB each).
    r = attack.run(f"""
import os, time
import numpy as np, treepack
import {"zarr" if ext == "zarr" else "h5py"}  # imported before the clock starts
try:
    import dask.array
except ImportError:
    pass
x = [np.arange(3)] if {kind!r} == "list" else {{"a": np.arange(3)}}
for i in range(10):
    x = [x, x] if {kind!r} == "list" else {{"l": x, "r": x}}
src, dst = LOC + "-src", LOC + ".{ext}"
treepack.save({{"x": x}}, src)
t0 = time.perf_counter()
treepack.convert(src, dst)
back = treepack.load(dst)
took = time.perf_counter() - t0
size = os.path.getsize(dst) if os.path.isfile(dst) else sum(
    os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(dst) for f in fs)
b = back["x"]
pairs = []
for _ in range(10):
    l, r = (b[0], b[1]) if isinstance(b, list) else (b["l"], b["r"])
    pairs.append(l is r)
    b = l
leaf = b[0] if isinstance(b, list) else b["a"]
treepack.convert(dst, LOC + "-back")
result = dict(took=took, size=size, shared=all(pairs), leaf=leaf.tolist(),
              diff=treepack.diff(src, LOC + "-back"),
              # VmHWM, not ru_maxrss: Linux carries a forking parent's high-water mark across exec.
              peak_mb=int(next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM:"))) // 1024)
""", timeout=60.0, mem_bytes=1 << 30, env={"MALLOC_ARENA_MAX": "2"})
    assert r["outcome"] == "ok", r
    res = eval(r["result"])  # noqa: S307 - our own child's repr of a dict of plain values
    assert res["shared"] and res["leaf"] == [0, 1, 2] and res["diff"] == [], res
    assert res["took"] < 1.0, res  # convert there and load back
    # 11 groups and one array, each written once (Zarr: 10 more empty groups noting the first)
    assert res["size"] < 120_000, res
    assert res["peak_mb"] < 400, res


def round_trip(tmp_path, tree, ext, **save_kwargs):
    treepack.save(tree, tmp_path / "t", overwrite=True, **save_kwargs)
    dst = tmp_path / f"out.{ext}"
    treepack.convert(tmp_path / "t", dst, overwrite=True)
    back = treepack.load(dst)
    treepack.convert(dst, tmp_path / "back", overwrite=True)
    assert treepack.diff(tmp_path / "t", tmp_path / "back") == []
    assert treepack.root_hash(tmp_path / "t") == treepack.root_hash(tmp_path / "back")
    return dst, back


@pytest.mark.parametrize("ext", EXTS)
def test_shared_arrays_come_back_as_one_array(tmp_path, ext):
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    bf = np.arange(6).astype(ml_dtypes.bfloat16)
    # The first place in document order is `z` (a dict's order, not the names' order).
    tree = {"z": w, "a": w, "layers": [w, {"w": w}], "bf": bf, "bf2": bf}
    dst, back = round_trip(tmp_path, tree, ext)
    assert back["z"] is back["a"] is back["layers"][0] is back["layers"][1]["w"]
    assert back["bf"] is back["bf2"] and back["bf"].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(back["z"], w)
    if ext == "h5":
        with h5py.File(dst) as f:  # hard links: one dataset
            addr = {h5py.h5o.get_info(f[p].id).addr for p in ("z", "a", "layers/0", "layers/1/w")}
            assert len(addr) == 1
            np.testing.assert_array_equal(f["layers/1/w"][...], w)
    else:  # every place holds the array, the later ones noting the first
        g = zarr.open_group(str(dst), mode="r")
        for p in ("a", "layers/0", "layers/1/w"):
            np.testing.assert_array_equal(g[p][...], w)
            assert g[p].attrs["treepack"]["same"] == "/z"
        assert "same" not in g["z"].attrs.get("treepack", {})
        assert g["bf2"].attrs["treepack"] == {"dtype": "bfloat16", "same": "/bf"}


@pytest.mark.parametrize("ext", EXTS)
def test_shared_dicts_lists_and_tuples_come_back_shared(tmp_path, ext):
    cfg = {"lr": 1e-3, "name": "run", "w": np.ones(3)}
    items = [np.zeros(2), "x", None]
    pair = (np.ones(1), 5)
    tree = {"b": {"cfg": cfg, "items": items}, "a": {"cfg": cfg, "items": items},
            "t": (cfg, pair, pair), "more": [items, pair]}
    dst, back = round_trip(tmp_path, tree, ext)
    assert back["a"]["cfg"] is back["b"]["cfg"] is back["t"][0]
    assert back["a"]["items"] is back["b"]["items"] is back["more"][0]
    assert back["t"][1] is back["t"][2] is back["more"][1] and isinstance(back["t"][1], tuple)
    assert back["a"]["cfg"]["name"] == "run" and back["b"]["items"][1] == "x"
    if ext == "h5":
        with h5py.File(dst) as f:
            assert f["a/cfg"].id == f["b/cfg"].id == f["t/0"].id
            assert f["a/cfg"].attrs["name"] == "run"  # the attributes are the one group's
    else:
        g = zarr.open_group(str(dst), mode="r")
        assert g["a/cfg"].attrs["treepack"] == {"same": "/b/cfg"} and list(g["a/cfg"]) == []
        assert g["b/cfg"].attrs["name"] == "run"


@pytest.mark.parametrize("ext", EXTS)
def test_records_held_twice_are_refused_at_their_first_place(tmp_path, ext):
    @dataclasses.dataclass
    class Cfg:
        lr: float

    c = Cfg(0.1)
    treepack.save({"p": np.ones(2), "a": c, "b": [c]}, tmp_path / "t", allow_pickle=False)
    with pytest.raises(ValueError, match="`a`: a record .* leave it out \\(select\\)"):
        treepack.convert(tmp_path / "t", tmp_path / f"out.{ext}")
    assert not (tmp_path / f"out.{ext}").exists()
    # Left out, the rest converts (nothing of the record is built: no trust needed).
    treepack.convert(tmp_path / "t", tmp_path / f"out.{ext}", select=["p"])
    assert list(treepack.load(tmp_path / f"out.{ext}")) == ["p"]


@pytest.mark.parametrize("ext", EXTS)
def test_cycles_are_refused_naming_the_place(tmp_path, ext):
    c = {"a": np.arange(2)}
    c["self"] = c
    lst = [np.ones(1)]
    lst.append([lst])
    root = {"w": np.ones(1)}
    root["me"] = root
    for tree, says in (({"c": c}, "`c/self`: holds `c` again"),
                       ({"x": {"l": lst}}, "`x/l/1/0`: holds `x/l` again"),
                       (root, "`me`: holds `<the root>` again")):
        treepack.save(tree, tmp_path / "t", overwrite=True)
        with pytest.raises(ValueError, match=says) as e:
            treepack.convert(tmp_path / "t", tmp_path / f"out.{ext}")
        assert "a cycle" in str(e.value)
        assert not (tmp_path / f"out.{ext}").exists()
        assert not [n for n in os.listdir(tmp_path) if ".partial-" in n]
    # Left out, the rest converts.
    treepack.save({"c": c, "w": np.ones(2)}, tmp_path / "t", overwrite=True)
    treepack.convert(tmp_path / "t", tmp_path / f"out.{ext}", select=["c/a", "w"])
    back = treepack.load(tmp_path / f"out.{ext}")
    assert list(back) == ["c", "w"] and list(back["c"]) == ["a"]


def test_hdf5_files_with_hard_links_read_as_shared_objects(tmp_path):
    # A file from h5py itself: a dataset and a group each linked from two places.
    p = tmp_path / "links.h5"
    with h5py.File(p, "w") as f:
        d = f.create_dataset("data", data=np.arange(4))
        g = f.create_group("grp")
        g["x"] = d
        f["alias"] = g
        f["soft"] = h5py.SoftLink("/data")
    t = treepack.load(p)
    assert t["data"] is t["grp"]["x"] is t["alias"]["x"] is t["soft"]
    assert t["grp"] is t["alias"]
    # Stored as treepack stores shared objects: once, at the first place h5py lists (`alias`,
    # by name), the other places refs.
    treepack.convert(p, tmp_path / "t")
    s = treepack.load_structure(tmp_path / "t")
    kinds = {k: getattr(v, "kind", type(v).__name__) for k, v in s.items()}
    assert kinds == {"alias": "dict", "data": "ref", "grp": "ref", "soft": "ref"}, kinds
    assert s["data"].target == "alias/x" and s["grp"].target == "alias"


@pytest.mark.skipif(zarr is None, reason="zarr-python 3 needs Python 3.11+")
def test_zarr_same_notes_that_do_not_hold_are_refused(tmp_path):
    w = np.arange(6.0)
    treepack.save({"g": {"x": 1}, "a": w, "b": w, "h": {"x": 1}}, tmp_path / "t")
    treepack.convert(tmp_path / "t", tmp_path / "ok.zarr")
    ok = treepack.load(tmp_path / "ok.zarr")
    assert ok["a"] is ok["b"] and ok["g"] == ok["h"] and ok["g"] is not ok["h"]

    def edited(name, edit):
        dst = tmp_path / f"{name}.zarr"
        treepack.convert(tmp_path / "t", dst)
        g = zarr.open_group(str(dst), mode="r+")
        edit(g)
        return dst

    cases = [
        (edited("nothing", lambda g: g["b"].attrs.update({"treepack": {"same": "/nope"}})), "was not read before it"),
        (edited("later", lambda g: g["a"].attrs.update({"treepack": {"same": "/b"}})), "was not read before it"),
        (edited("group", lambda g: g["b"].attrs.update({"treepack": {"same": "/g"}})), "which is not an array"),
        (edited("shape", lambda g: (g.__delitem__("b"), g.create_array("b", data=np.arange(3.0)),
                                    g["b"].attrs.update({"treepack": {"same": "/a"}}))), "says it is the array at '/a'"),
        (edited("members", lambda g: g["h"].attrs.update({"treepack": {"same": "/g"}})), "holds members or attributes"),
    ]
    for dst, says in cases:
        with pytest.raises(treepack.ForeignFileError, match=says):
            treepack.load(dst)
    # A group naming its own ancestor (a cycle) is refused the same way.
    g = zarr.open_group(str(tmp_path / "cyc.zarr"), mode="w", zarr_format=3)
    g.create_group("p").create_group("q").attrs["treepack"] = {"same": "/p"}
    with pytest.raises(treepack.ForeignFileError, match="`p/q` says it is the object at '/p'.*not read before it"):
        treepack.load(tmp_path / "cyc.zarr")


def test_npz_and_safetensors_write_a_shared_array_at_each_place(tmp_path):
    from safetensors.numpy import load_file

    w = np.arange(4, dtype=np.float32)
    treepack.save({"emb": w, "head": w, "cfg": {"d": {"k": w}}}, tmp_path / "t")
    treepack.convert(tmp_path / "t", tmp_path / "m.safetensors")
    got = load_file(str(tmp_path / "m.safetensors"))
    assert sorted(got) == ["cfg.d.k", "emb", "head"] and all((v == w).all() for v in got.values())
    treepack.convert(tmp_path / "t", tmp_path / "m.npz")
    with np.load(tmp_path / "m.npz") as z:
        assert sorted(z.files) == ["cfg.d.k", "emb", "head"] and (z["head"] == w).all()
    # A dict held twice: no links in a flat file, refused naming both places.
    d = {"k": w}
    treepack.save({"a": d, "b": d}, tmp_path / "t2")
    for ext in ("safetensors", "npz"):
        with pytest.raises(ValueError, match="`b`: holds the object at `a` again"):
            treepack.convert(tmp_path / "t2", tmp_path / f"bad.{ext}")
        treepack.convert(tmp_path / "t2", tmp_path / f"ok.{ext}", select=["a"])


# ---------------------------------------------------------------- select=


def checkpoint(tmp_path):
    @dataclasses.dataclass
    class Opt:
        step: int

    tree = {"params": {"w": np.ones((2, 3), np.float32), "b": np.zeros(3, np.float32)},
            "opt": Opt(3), "cfg": {"name": "run", "lr": 1e-3}, "layers": [np.ones(2), "note", np.zeros(2)]}
    treepack.save(tree, tmp_path / "ckpt", allow_pickle=False)
    return tmp_path / "ckpt"


def test_select_converts_only_what_it_selects_from_treepack(tmp_path):
    from safetensors.numpy import load_file

    ckpt = checkpoint(tmp_path)
    with pytest.raises(ValueError, match="leave it out \\(select\\)"):
        treepack.convert(ckpt, tmp_path / "all.safetensors")
    info = treepack.convert(ckpt, tmp_path / "p.safetensors", select="params/**")
    assert info["tensors"] == 2 and sorted(load_file(str(tmp_path / "p.safetensors"))) == ["params.b", "params.w"]
    treepack.convert(ckpt, tmp_path / "p.npz", select=["params/w", "layers/0", "layers/2"])
    with np.load(tmp_path / "p.npz") as z:
        assert sorted(z.files) == ["layers.0", "layers.2", "params.w"]
    for ext in EXTS:
        dst = tmp_path / f"p.{ext}"
        treepack.convert(ckpt, dst, select=["params/w", "cfg", "layers/2", "?ema/**"])
        back = treepack.load(dst)
        assert list(back) == ["params", "cfg", "layers"] and list(back["params"]) == ["w"]
        assert back["cfg"] == {"name": "run", "lr": 1e-3}
        # An item left out of a list is None: the others keep their index.
        assert back["layers"][:2] == [None, None] and (back["layers"][2] == 0).all()


def test_select_converts_only_what_it_selects_into_treepack(tmp_path):
    from safetensors.numpy import save_file

    save_file({"layers.0.w": np.ones(2, np.float32), "layers.1.w": np.zeros(2, np.float32),
               "head": np.ones(1, np.float32)}, str(tmp_path / "m.safetensors"))
    np.savez(tmp_path / "m.npz", **{"layers.0.w": np.ones(2), "layers.1.w": np.zeros(2), "head": np.ones(1)})
    t = {"layers": [{"w": np.ones(2)}, {"w": np.zeros(2)}], "head": np.ones(1), "cfg": {"n": 1}}
    treepack.save(t, tmp_path / "t")
    sources = [tmp_path / "m.safetensors", tmp_path / "m.npz"]
    for ext in EXTS:
        treepack.convert(tmp_path / "t", tmp_path / f"m.{ext}")
        sources.append(tmp_path / f"m.{ext}")
    for src in sources:
        dst = tmp_path / f"from-{src.suffix[1:]}"
        # Flat files' names nested at "." so that the key paths are the tree's.
        info = treepack.convert(src, dst, select=["layers/1/**", "?nothing"], separator=".")
        assert info["tensors"] == 1, src
        back = treepack.load(dst)
        assert list(back) == ["layers"], (src, back)
        w = back["layers"]["1"]["w"] if isinstance(back["layers"], dict) else back["layers"][1]["w"]
        assert (w == 0).all()
        with pytest.raises(KeyError, match="`layrs/\\*\\*`.*select matches nothing in .*" + src.name):
            treepack.convert(src, tmp_path / f"none-{src.suffix[1:]}", select=["layrs/**"], separator=".")
        assert not (tmp_path / f"none-{src.suffix[1:]}").exists()
    # Through a tree between two foreign formats: the selection is made on the way in.
    treepack.convert(tmp_path / "m.safetensors", tmp_path / "head.npz", select=["head"])
    with np.load(tmp_path / "head.npz") as z:
        assert z.files == ["head"]


def test_select_of_a_ref_place_keeps_the_object_it_names(tmp_path):
    w = np.arange(3.0)
    treepack.save({"a": w, "b": w, "c": np.ones(1)}, tmp_path / "t")
    for ext in EXTS:
        treepack.convert(tmp_path / "t", tmp_path / f"r.{ext}", select=["b"])
        back = treepack.load(tmp_path / f"r.{ext}")
        assert list(back) == ["a", "b"] and back["a"] is back["b"]  # as load(select=["b"])


def test_python_cli_select(tmp_path, capsys):
    from treepack.__main__ import main

    ckpt = checkpoint(tmp_path)
    assert main(["convert", str(ckpt), str(tmp_path / "p.npz"), "--select", "params/**", "-q"]) == 0
    with np.load(tmp_path / "p.npz") as z:
        assert sorted(z.files) == ["params.b", "params.w"]
    assert main(["convert", str(ckpt), str(tmp_path / "x.npz"), "--select", "nope", "-q"]) == 2
    err = capsys.readouterr().err
    assert "`nope`" in err and "select matches nothing" in err and not (tmp_path / "x.npz").exists()


@pytest.mark.parametrize("ext", EXTS)
def test_overwrite_replaces_a_store_never_a_folder_or_file_of_something_else(tmp_path, ext):
    src = str(tmp_path / "src")
    treepack.save({"a": np.arange(3)}, src)
    dst = tmp_path / f"project.{ext}"
    if ext == "zarr":
        dst.mkdir()
        (dst / "notes.txt").write_text("mine")
    else:
        dst.write_text("not hdf5")
    with pytest.raises(FileExistsError, match="refusing to replace it"):
        treepack.convert(src, str(dst), overwrite=True)
    assert (dst / "notes.txt").read_text() == "mine" if ext == "zarr" else dst.read_text() == "not hdf5"
    # What a convert wrote is replaced.
    other = tmp_path / f"out.{ext}"
    treepack.convert(src, str(other))
    treepack.save({"a": np.arange(5)}, src, overwrite=True)
    treepack.convert(src, str(other), overwrite=True)
    assert np.array_equal(treepack.load(str(other))["a"], np.arange(5))
