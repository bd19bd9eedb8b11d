"""``treepack.open`` and ``load_structure`` of the files the Python package reads for other tools
(issue 54): ``.npy``, ``.npz`` (stored and compressed members), HDF5, Zarr, Orbax and JAX
checkpoints, written here with the real libraries. A view reads the file's index only; each
slice reads what it touches, through the same checks a load makes, and gives what a load gives.
Laziness is proven with damaged array data: opening, listing and reading the undamaged parts
succeed, and only reading the damaged part fails, with the file named."""

from __future__ import annotations

import collections
import zipfile

import numpy as np
import pytest

import treepack
from hostile_harness import Hostile


def same(expected, got, where="<root>"):
    """Exact equality: container types, keys in order, dtypes, shapes, values."""
    if isinstance(expected, np.ndarray):
        g = np.asarray(got)
        assert (expected.dtype, expected.shape) == (g.dtype, g.shape), f"{where}: {g.dtype}{g.shape}"
        assert np.array_equal(expected, g), where
        return
    assert type(expected) is type(got), f"{where}: {type(expected)} vs {type(got)}"
    if isinstance(expected, dict):
        assert list(expected) == list(got), where
        for k in expected:
            same(expected[k], got[k], f"{where}/{k}")
    elif isinstance(expected, (list, tuple)):
        assert len(expected) == len(got), where
        for i, (a, b) in enumerate(zip(expected, got)):
            same(a, b, f"{where}/{i}")
    else:
        assert expected == got, f"{where}: {expected!r} vs {got!r}"


def browse(view, loaded, where="<root>"):
    """Every key of ``view`` as the loaded tree has it; every array sliced two ways and whole."""
    if isinstance(loaded, dict):
        assert list(view.keys()) == list(loaded), where
        for k in loaded:
            browse(view[k], loaded[k], f"{where}/{k}")
    elif isinstance(loaded, (list, tuple)):
        assert len(view) == len(loaded), where
        for i, v in enumerate(loaded):
            browse(view[i], v, f"{where}/{i}")
    elif isinstance(loaded, np.ndarray) and loaded.ndim > 0 and isinstance(view, treepack.LazyArray):
        assert (view.shape, view.dtype) == (loaded.shape, loaded.dtype), where
        same(loaded[1:3], view[1:3], where)
        same(loaded[..., -1:], view[..., -1:], where)
        same(loaded, view.read(), where)
        same(loaded, np.asarray(view), where)
    else:
        same(loaded, view if not isinstance(view, treepack.LazyArray) else view.read(), where)


def check_structure(st, loaded, where="<root>"):
    if isinstance(loaded, dict):
        children = getattr(st, "children", st)
        assert list(children) == list(loaded), where
        for k in loaded:
            check_structure(children[k], loaded[k], f"{where}/{k}")
    elif isinstance(loaded, (list, tuple)):
        for i, v in enumerate(loaded):
            check_structure(st[i], v, f"{where}/{i}")
    elif isinstance(loaded, np.ndarray):
        assert st.kind == "array" and tuple(st.shape) == loaded.shape and st.nbytes == loaded.nbytes, where


def npz_files(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {"w": rng.standard_normal((40, 30)).astype(np.float32), "f": np.asfortranarray(np.arange(24).reshape(4, 6)),
              "i8": np.arange(7, dtype=np.int8), "empty": np.zeros((0, 3)), "s": np.array(["ab", "cde"]),
              "rec": np.array([(1, 2.0)], dtype=[("a", "<i4"), ("b", "<f8")]), "scalar": np.float64(2.5)}
    np.savez(tmp_path / "stored.npz", **arrays)
    np.savez_compressed(tmp_path / "deflated.npz", **arrays)
    with zipfile.ZipFile(tmp_path / "stored.npz", "a") as z:
        z.writestr("notes.txt", b"not an array")
    return arrays


@pytest.mark.parametrize("name", ["stored.npz", "deflated.npz"])
def test_an_npz_opens_lazily_and_reads_what_a_load_reads(tmp_path, name):
    npz_files(tmp_path)
    p = tmp_path / name
    loaded = treepack.load(p)
    view = treepack.open(p)
    assert isinstance(view["w"], treepack.LazyArray)
    browse(view, loaded)
    same(loaded, view.read())
    same(loaded["w"], view["w"][...])
    check_structure(treepack.load_structure(p), loaded)
    if name == "stored.npz":
        assert view["notes.txt"] == b"not an array" == loaded["notes.txt"]
        assert treepack.load_structure(p)["notes.txt"].kind == "bytes"


def test_an_npy_opens_as_a_lazy_array(tmp_path):
    a = np.arange(60, dtype=np.int16).reshape(3, 20)
    np.save(tmp_path / "a.npy", a)
    la = treepack.open(tmp_path / "a.npy")
    assert isinstance(la, treepack.LazyArray) and (la.shape, la.dtype) == (a.shape, a.dtype)
    same(a[1:, 5:9], la[1:, 5:9])
    same(a, la.read())
    st = treepack.load_structure(tmp_path / "a.npy")
    assert (st.kind, st.shape, st.dtype, st.nbytes) == ("array", (3, 20), "int16", a.nbytes)


def test_a_damaged_npz_member_fails_only_when_read(tmp_path):
    """The index is read at open; a member's data only when sliced: a deflated member with
    damaged data opens, lists and leaves the others readable; reading it names the file."""
    np.savez_compressed(tmp_path / "d.npz", good=np.arange(10.0), bad=np.random.default_rng(1).standard_normal(5000))
    raw = bytearray((tmp_path / "d.npz").read_bytes())
    with zipfile.ZipFile(tmp_path / "d.npz") as z:
        info = z.getinfo("bad.npy")
    # Damage the middle of the member's deflate stream (its header, at the start, stays intact).
    mid = info.header_offset + 30 + len(info.filename) + info.compress_size // 2
    raw[mid:mid + 64] = bytes(64)
    (tmp_path / "d.npz").write_bytes(bytes(raw))
    view = treepack.open(tmp_path / "d.npz")
    assert view.keys() == ["good", "bad"]
    same(np.arange(10.0)[2:5], view["good"][2:5])
    assert treepack.load_structure(tmp_path / "d.npz")["bad"].shape == (5000,)
    with pytest.raises(treepack.ForeignFileError, match="d.npz"):
        view["bad"][0:2]


def test_a_stored_npz_member_whose_local_header_lies_is_refused_at_open(tmp_path):
    np.savez(tmp_path / "t.npz", x=np.arange(1000.0))
    raw = (tmp_path / "t.npz").read_bytes()
    with zipfile.ZipFile(tmp_path / "t.npz") as z:
        info = z.getinfo("x.npy")
    # The local header's extra-field length says the data starts 60000 bytes later.
    at = info.header_offset + 28
    (tmp_path / "t.npz").write_bytes(raw[:at] + (60000).to_bytes(2, "little") + raw[at + 2:])
    with pytest.raises(treepack.ForeignFileError, match="member 'x.npy' cannot be read .*damaged or truncated zip"):
        treepack.open(tmp_path / "t.npz")


def test_object_arrays_and_hostile_headers_are_refused_at_open(tmp_path):
    np.savez(tmp_path / "o.npz", o=np.array([{"a": 1}], dtype=object), x=np.arange(3))
    with pytest.raises(treepack.ForeignFileError, match="needs pickle"):
        treepack.open(tmp_path / "o.npz")
    with pytest.raises(treepack.ForeignFileError, match="needs pickle"):
        treepack.load_structure(tmp_path / "o.npz")
    h = Hostile(tmp_path)
    # A header declaring far more than the file holds is refused before anything is allocated,
    # in a child process with a memory limit.
    header = b"{'descr': '<f8', 'fortran_order': False, 'shape': (1000000000000,), }"
    header = header + b" " * (118 - len(header)) + b"\n"
    h.loc.write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + bytes(64))
    for call in ("treepack.open(LOC)", "treepack.load_structure(LOC)"):
        h.error(f"import treepack\n{call}\n", "ForeignFileError", match="declares shape", mem_bytes=1 << 30)


def test_an_hdf5_file_opens_lazily_groups_attributes_and_all(tmp_path):
    h5py = pytest.importorskip("h5py")
    with h5py.File(tmp_path / "f.h5", "w") as f:
        f["layer/w"] = np.arange(600, dtype=np.float32).reshape(20, 30)
        f.create_dataset("chunked", data=np.arange(10000).reshape(100, 100), chunks=(10, 10), compression="gzip")
        f["layer"].attrs["note"] = "hello"
        f["deep/a/b/c"] = np.arange(3)
    loaded = treepack.load(tmp_path / "f.h5")
    view = treepack.open(tmp_path / "f.h5")
    browse(view, loaded)
    same(loaded, view.read())
    same(loaded["layer"], view["layer"].read())
    check_structure(treepack.load_structure(tmp_path / "f.h5"), loaded)
    assert view["chunked"]._r.chunk_shape("chunked") == [10, 10]


def test_a_zarr_store_opens_lazily_and_a_damaged_chunk_fails_only_when_read(tmp_path):
    zarr = pytest.importorskip("zarr")
    g = zarr.open_group(tmp_path / "s.zarr", mode="w")
    g.create_array("a", data=np.arange(100.0).reshape(10, 10), chunks=(5, 10))
    g.create_group("sub").create_array("b", data=np.arange(7, dtype=np.int32))
    g.attrs["meta"] = 1
    loaded = treepack.load(tmp_path / "s.zarr")
    view = treepack.open(tmp_path / "s.zarr")
    browse(view, loaded)
    same(loaded, view.read())
    check_structure(treepack.load_structure(tmp_path / "s.zarr"), loaded)
    # The second chunk of `a` (rows 5-9) damaged: rows 0-4 still read, rows 5-9 fail, naming the store.
    chunk = next(p for p in (tmp_path / "s.zarr" / "a").rglob("*") if p.is_file() and p.parts[-2:] == ("1", "0"))
    chunk.write_bytes(b"garbage, not a zstd frame")
    view = treepack.open(tmp_path / "s.zarr")
    assert "float64" in view._repr_html_()  # (drawn from the structure: nothing read)
    same(np.arange(100.0).reshape(10, 10)[0:5], view["a"][0:5])
    with pytest.raises(treepack.ForeignFileError, match="s.zarr"):
        view["a"][5:10]


def test_a_zarr_chunk_that_is_a_link_is_refused_when_read_and_nothing_outside_is_read(tmp_path):
    zarr = pytest.importorskip("zarr")
    h = Hostile(tmp_path)
    g = zarr.open_group(h.loc, mode="w")
    g.create_array("a", data=np.arange(20.0), chunks=(10,))
    chunk = next(p for p in (h.loc / "a").rglob("*") if p.is_file() and p.name == "1")
    chunk.unlink()
    chunk.symlink_to(h.outside / "secret.txt")
    r = h.error("import treepack\nv = treepack.open(LOC)\nprint(v['a'][0:10])\nv['a'][10:20]\n", "ForeignFileError",
                match="symbolic link")
    assert "SECRET" not in r["message"]


def test_orbax_and_jax_checkpoints_open_lazily(tmp_path):
    pytest.importorskip("jax")
    pytest.importorskip("tensorstore")
    ocp = pytest.importorskip("orbax.checkpoint")
    import warnings

    tree = {"w": np.arange(12.0).reshape(3, 4), "b": np.ones(2, np.float32), "n": {"k": np.arange(5)}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=False)).save(tmp_path / "o", tree)
        ocp.Checkpointer(ocp.PyTreeCheckpointHandler()).save(tmp_path / "ocdbt", tree)  # (one OCDBT store)
    browse(treepack.open(tmp_path / "ocdbt"), treepack.load(tmp_path / "ocdbt", numpy=True))
    loaded = treepack.load(tmp_path / "o", numpy=True)
    view = treepack.open(tmp_path / "o")
    browse(view, loaded)
    same(loaded["n"], treepack.load(tmp_path / "o", numpy=True, select="n/**")["n"])
    check_structure(treepack.load_structure(tmp_path / "o"), loaded)
    # Damaged data of `w`: the view opens and reads `b`; reading `w` fails naming it.
    for p in (tmp_path / "o" / "w").rglob("*"):
        if p.is_file() and not p.name.startswith(".") and p.name not in (".zarray", "zarr.json"):
            p.write_bytes(b"\0garbage")
    view = treepack.open(tmp_path / "o")
    same(np.ones(2, np.float32), view["b"][...])
    with pytest.raises(treepack.ForeignFileError, match="`w`"):
        view["w"][0:1]


def test_a_jax_pytree_serialization_checkpoint_opens_lazily(tmp_path):
    jnp = pytest.importorskip("jax.numpy")
    pytest.importorskip("tensorstore")
    pytest.importorskip("flatbuffers")
    from jax.experimental.array_serialization import pytree_serialization

    pytree_serialization.save({"a": jnp.arange(6.0).reshape(2, 3), "c": [jnp.ones(4), jnp.zeros(2)]}, tmp_path / "j")
    loaded = treepack.load(tmp_path / "j", numpy=True)
    view = treepack.open(tmp_path / "j")
    browse(view, loaded)
    check_structure(treepack.load_structure(tmp_path / "j"), loaded)


def test_an_ordered_dict_group_and_dask_blocks(tmp_path):
    """A Zarr group written from an OrderedDict opens as the custom node a load gives; a lazy
    array's ``to_dask`` reads its blocks through the file's own library."""
    pytest.importorskip("zarr")
    da = pytest.importorskip("dask.array")
    tree = collections.OrderedDict([("z", np.arange(50.0)), ("a", np.arange(3))])
    src = tmp_path / "t"
    treepack.save({"od": tree}, src)
    treepack.convert(src, tmp_path / "t.zarr")
    loaded = treepack.load(tmp_path / "t.zarr")
    view = treepack.open(tmp_path / "t.zarr")
    assert type(loaded["od"]) is collections.OrderedDict
    assert list(view["od"].keys()) == ["z", "a"]
    same(loaded["od"], view["od"].read())
    d = view["od"]["z"].to_dask(chunks=10)
    assert isinstance(d, da.Array) and d.chunks == ((10,) * 5,)
    same(np.arange(50.0), d.compute())


def test_a_foreign_view_refuses_keys_and_signatures_it_cannot_have(tmp_path):
    np.savez(tmp_path / "a.npz", x=np.arange(3))
    with pytest.raises(treepack.NotEncryptedError, match="not encrypted"):
        treepack.open(tmp_path / "a.npz", encryption=treepack.generate_encryption_key())
    with pytest.raises(treepack.UnsignedError, match="no treepack signature"):
        treepack.open(tmp_path / "a.npz", signed_by=[("k", "x" * 64)])
