"""Hostile foreign files (issue 50, findings 4 and 7), each met in a fresh interpreter by the
child-process harness (``hostile_harness.py``: time and memory limits, nothing outside may change,
the canary module must never be imported).

Finding 4: converters must not read outside the file they were given. HDF5 external raw storage,
external links, virtual datasets and links that leave the file are refused by name before any of
their bytes are read; soft links inside the file are followed (cycles, dangling links and links
through an external link are refused); a Zarr store is read without following any link (a
symlink anywhere in it is refused by name, v2 and v3), with each node's own metadata, and its
object dtypes and unknown codecs (pickle-like) are refused by name. ``.npz`` member names are
only keys. Finding 7: errors say what, where (file, and the key path of a leaf inside a tree),
and what to do; declared sizes are checked before anything of that size is allocated.

Every refusal asserts the name of what was refused and that the secret's bytes are neither in
the message nor in any result."""

import base64
import io
import json
import os
import re
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

import treepack

h5py = pytest.importorskip("h5py")
try:
    import zarr
except ImportError:  # zarr-python 3 needs Python 3.11+
    zarr = None
needs_zarr = pytest.mark.skipif(zarr is None, reason="zarr-python 3 needs Python 3.11+")

SECRET_TEXT = "SECRET-0123456789"
# The secret as the numbers of a uint8 array's repr (what a tree holding its bytes would show).
SECRET_NUMBERS = "83, 69, 67, 82, 69, 84, 45, 48"


def no_secret(r: dict) -> dict:
    for field in ("message", "result", "traceback"):
        text = r.get(field, "")
        assert SECRET_TEXT not in text and SECRET_NUMBERS not in re.sub(r"\s+", " ", text), (field, text)
    return r


def refused(attack, code: str, *names: str, **kw) -> dict:
    """Run ``code``; it must fail with a TreepackError naming every one of ``names``."""
    r = attack.error(code, "TreepackError", **kw)
    for n in names:
        assert n in r["message"], f"{n!r} not in: {r['message']}"
    assert "nothing" in r["message"] or "none of" in r["message"], r["message"]
    return no_secret(r)


def load_code(path: Path) -> str:
    return f"import treepack\nresult = treepack.load({str(path)!r})\n"


# ---------------------------------------------------------------- HDF5: external raw storage


def test_hdf5_external_storage_is_refused_by_name(attack):
    secret = str(attack.outside / "secret.txt")
    p = attack.tmp / "ext.h5"
    with h5py.File(p, "w") as f:
        f["fine"] = np.arange(3)
        f.create_dataset("x", shape=(16,), dtype="u1", external=[(secret, 0, 16)])
    r = refused(attack, load_code(p), "ext.h5", "`/x`", "external file", "secret.txt")
    assert "copy the data into the file" in r["message"]


def test_hdf5_external_storage_in_a_group_with_an_offset(attack):
    secret = str(attack.outside / "secret.txt")
    p = attack.tmp / "nested.h5"
    with h5py.File(p, "w") as f:
        f.create_group("g/sub").create_dataset("x", shape=(2, 4), dtype="u1", external=[(secret, 2, 8)])
    refused(attack, load_code(p), "`/g/sub/x`", "external file")


def test_hdf5_external_storage_refused_by_convert_writes_nothing(attack):
    secret = str(attack.outside / "secret.txt")
    p = attack.tmp / "ext.h5"
    with h5py.File(p, "w") as f:
        f.create_dataset("x", shape=(50,), dtype="u1", external=[(secret, 0, 50)])
    refused(attack, f"import treepack\ntreepack.convert({str(p)!r}, LOC)\n", "`/x`")
    assert not attack.loc.exists()


# ---------------------------------------------------------------- HDF5: external links


def _secret_h5(attack, name: str = "other.h5") -> Path:
    """An HDF5 file beside the location (not inside what is loaded) holding the secret."""
    other = attack.tmp / name
    with h5py.File(other, "w") as f:
        f["s"] = np.frombuffer(attack.secret, np.uint8)
        f.create_group("grp")["s"] = np.frombuffer(attack.secret, np.uint8)
    return other


def test_hdf5_external_link_is_refused_by_name(attack):
    other = _secret_h5(attack)
    p = attack.tmp / "link.h5"
    with h5py.File(p, "w") as f:
        f["l"] = h5py.ExternalLink(str(other), "/s")
    refused(attack, load_code(p), "`/l`", "external link", "other.h5")


def test_hdf5_external_link_to_a_group_deep_inside(attack):
    other = _secret_h5(attack)
    p = attack.tmp / "link.h5"
    with h5py.File(p, "w") as f:
        f.create_group("a/b")["c"] = h5py.ExternalLink(str(other), "/grp")
    refused(attack, load_code(p), "`/a/b/c`", "external link")


def test_hdf5_external_link_to_a_text_file_is_refused_before_opening_it(attack):
    p = attack.tmp / "link.h5"
    with h5py.File(p, "w") as f:
        f["l"] = h5py.ExternalLink(str(attack.outside / "secret.txt"), "/x")
    refused(attack, load_code(p), "`/l`", "secret.txt")


def test_hdf5_soft_link_through_an_external_link_is_refused(attack):
    other = _secret_h5(attack)
    p = attack.tmp / "soft-ext.h5"
    with h5py.File(p, "w") as f:
        f["z"] = h5py.ExternalLink(str(other), "/grp")
        f.create_group("g")["s"] = h5py.SoftLink("/z/s")
    # The soft link is met first (members are read in name order), and named.
    refused(attack, load_code(p), "`/g/s`", "through the external link `/z`", "other.h5")


# ---------------------------------------------------------------- HDF5: virtual datasets


def _vds(f, name: str, source: str, dset: str = "s") -> None:
    lay = h5py.VirtualLayout(shape=(16,), dtype="u1")
    lay[:] = h5py.VirtualSource(source, dset, shape=(50,))[:16]
    f.create_virtual_dataset(name, lay)


def test_hdf5_virtual_dataset_over_an_outside_file_is_refused(attack):
    other = _secret_h5(attack)
    p = attack.tmp / "vds.h5"
    with h5py.File(p, "w") as f:
        _vds(f, "v", str(other))
    refused(attack, load_code(p), "`/v`", "virtual dataset", "other.h5")


def test_hdf5_virtual_dataset_in_a_group(attack):
    other = _secret_h5(attack)
    p = attack.tmp / "vds.h5"
    with h5py.File(p, "w") as f:
        _vds(f.create_group("deep/er"), "v", str(other))
    refused(attack, load_code(p), "`/deep/er/v`", "virtual dataset")


def test_hdf5_virtual_dataset_over_its_own_file_is_refused_too(attack):
    # Decision: every VDS is refused, even one mapping this file ("."): its sources are names.
    p = attack.tmp / "vds-self.h5"
    with h5py.File(p, "w") as f:
        f["s"] = np.arange(50, dtype=np.uint8)
        _vds(f, "v", ".")
    refused(attack, load_code(p), "`/v`", "virtual dataset")


# ---------------------------------------------------------------- HDF5: soft and hard links


def test_hdf5_soft_link_inside_the_file_is_followed(attack):
    # Decision: a soft link to a dataset or group inside the file reads as a copy of its target.
    p = attack.tmp / "soft.h5"
    with h5py.File(p, "w") as f:
        f.create_group("data")["x"] = np.arange(5)
        f["alias"] = h5py.SoftLink("/data/x")
        f.create_group("g")["rel"] = h5py.SoftLink("../data")  # no `..` in HDF5: a dangling name
    r = attack.error(load_code(p), "TreepackError", match="`/g/rel`")
    assert "does not exist" in r["message"]
    with h5py.File(p, "a") as f:
        del f["g/rel"]
    r = attack.run(load_code(p))
    assert r["outcome"] == "ok" and "'alias': array([0, 1, 2, 3, 4])" in r["result"], r


def test_hdf5_link_cycles_are_refused_by_name(attack):
    p = attack.tmp / "loops.h5"
    with h5py.File(p, "w") as f:
        f.create_group("a")["loop"] = h5py.SoftLink("/a")
    refused(attack, load_code(p), "`/a/loop`", "group `/a` again")
    with h5py.File(p, "w") as f:
        g = f.create_group("a")
        g["hard"] = g
    refused(attack, load_code(p), "`/a/hard`", "group `/a` again", "cycle")


def test_hdf5_shared_groups_cannot_blow_up_the_tree(attack):
    # 60 levels of a group linked twice from its parent: 2^60 paths. Each group is read once
    # and every link to it gives that one object (shared, as treepack stores it): 60 groups.
    p = attack.tmp / "dag.h5"
    with h5py.File(p, "w") as f:
        g = f.create_group("l0")
        for i in range(1, 60):
            nxt = f.create_group(f"l{i}")
            g["x"], g["y"] = nxt, nxt
            g = nxt
        g["data"] = np.arange(4)
    r = attack.run(f"""
import time, treepack
t0 = time.perf_counter()
t = treepack.load({str(p)!r})
took = time.perf_counter() - t0
g, n = t["l0"], 0
while "x" in g:
    assert g["x"] is g["y"] and g["x"] is t[f"l{{n + 1}}"]
    g, n = g["x"], n + 1
result = (n, g["data"].tolist(), took < 5)
""", timeout=30.0, mem_bytes=1 << 30)
    assert r["outcome"] == "ok" and r["result"] == "(59, [0, 1, 2, 3], True)", r


def test_hdf5_dangling_and_deep_soft_links_are_refused(attack):
    p = attack.tmp / "dangle.h5"
    with h5py.File(p, "w") as f:
        f["d"] = h5py.SoftLink("/nothing/here")
    refused(attack, load_code(p), "`/d`", "does not exist")
    with h5py.File(p, "w") as f:
        f["s0"] = h5py.SoftLink("/s1")
        f["s1"] = h5py.SoftLink("/s0")
    refused(attack, load_code(p), "`/s0`", "more than 16 soft links")


# ---------------------------------------------------------------- HDF5: siblings


def test_hdf5_references_are_refused_by_name(attack):
    p = attack.tmp / "refs.h5"
    with h5py.File(p, "w") as f:
        f["x"] = np.arange(3)
        f.create_dataset("r", data=[f["x"].ref], dtype=h5py.ref_dtype)
    attack.error(load_code(p), "TreepackError", match="HDF5 dataset `/r`: an array of HDF5 object references")
    with h5py.File(p, "w") as f:
        f["x"] = np.arange(3)
        f.attrs["where"] = f["x"].ref
    attack.error(load_code(p), "TreepackError", match="'where' holds object or region references")


def test_hdf5_filter_that_is_not_available_is_refused_clearly(attack):
    p = attack.tmp / "plugin.h5"
    with h5py.File(p, "w") as f:
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_chunk((4,))
        dcpl.set_filter(32001, h5py.h5z.FLAG_OPTIONAL, (0, 0, 0, 0, 5, 1, 1))  # Blosc, a plugin
        h5py.h5d.create(f.id, b"x", h5py.h5t.NATIVE_UINT8, h5py.h5s.create_simple((4,)), dcpl=dcpl)
    if h5py.h5z.filter_avail(32001):
        pytest.skip("the Blosc plugin is installed here")
    attack.error(load_code(p), "TreepackError", match="HDF5 `/x` is compressed with HDF5 filter 32001")


def test_hdf5_driver_from_the_environment_is_not_used(attack):
    # HDF5_DRIVER=family would read x.h5 as members named by a pattern; the sec2 driver is named.
    p = attack.tmp / "plain.h5"
    with h5py.File(p, "w") as f:
        f["x"] = np.arange(3)
    r = attack.run(load_code(p), env={"HDF5_DRIVER": "family"})
    assert r["outcome"] == "ok" and "array([0, 1, 2])" in r["result"], r


def test_hdf5_compound_datasets_load(attack):
    p = attack.tmp / "compound.h5"
    with h5py.File(p, "w") as f:
        f["c"] = np.array([(1, 2.5)], dtype=[("a", "<i4"), ("b", "<f8")])
    r = attack.run(load_code(p))
    assert r["outcome"] == "ok" and "(1, 2.5)" in r["result"], r


# ---------------------------------------------------------------- Zarr: links out of the store


def _secret_zarr(attack, fmt: int, name: str) -> Path:
    """A Zarr group outside the store whose array `name` holds the secret."""
    elsewhere = attack.tmp / "elsewhere.zarr"
    g = zarr.open_group(str(elsewhere), mode="w", zarr_format=fmt)
    n = len(attack.secret)
    g.create_array(name, shape=(n,), dtype="u1", chunks=(n,), compressors=None, fill_value=0)[:] = np.frombuffer(
        attack.secret, np.uint8)
    return elsewhere


def _zarr_array(path: Path, fmt: int, name: str = "x", n: int = 50) -> Path:
    g = zarr.open_group(str(path), mode="w", zarr_format=fmt)
    g.create_array(name, shape=(n,), dtype="u1", chunks=(n,), compressors=None, fill_value=0)[:] = 7
    chunk = path / name / ("0" if fmt == 2 else "c/0")
    assert chunk.is_file(), sorted(os.listdir(path / name))
    return chunk


@needs_zarr
@pytest.mark.parametrize("fmt", [2, 3])
def test_zarr_chunk_symlink_to_a_secret_is_refused(attack, fmt):
    store = attack.tmp / "s.zarr"
    chunk = _zarr_array(store, fmt)
    chunk.unlink()
    chunk.symlink_to(attack.outside / "secret.txt")
    refused(attack, load_code(store), "`x/0`" if fmt == 2 else "`x/c/0`", "symbolic link")


@needs_zarr
@pytest.mark.parametrize("fmt", [2, 3])
def test_zarr_array_folder_symlink_is_refused(attack, fmt):
    # The array folder is a link to an array holding the secret, outside the store.
    elsewhere = _secret_zarr(attack, fmt, "x")
    store = attack.tmp / "s.zarr"
    zarr.open_group(str(store), mode="w", zarr_format=fmt)
    (store / "x").symlink_to(elsewhere / "x", target_is_directory=True)
    refused(attack, load_code(store), "`x`", "symbolic link")


@needs_zarr
def test_zarr_metadata_and_unused_symlinks_are_refused(attack):
    store = attack.tmp / "s.zarr"
    _zarr_array(store, 3)
    (store / "notes.txt").symlink_to(attack.outside / "secret.txt")
    refused(attack, load_code(store), "`notes.txt`", "symbolic link")
    (store / "notes.txt").unlink()
    meta = store / "x" / "zarr.json"
    (attack.tmp / "real.json").write_bytes(meta.read_bytes())
    meta.unlink()
    meta.symlink_to(attack.tmp / "real.json")
    refused(attack, load_code(store), "`x/zarr.json`", "symbolic link")


@needs_zarr
def test_zarr_fifo_in_a_store_is_refused_without_hanging(attack):
    store = attack.tmp / "s.zarr"
    chunk = _zarr_array(store, 3)
    chunk.unlink()
    os.mkfifo(chunk)
    attack.error(load_code(store), "TreepackError", match="`x/c/0` is not a regular file")


@needs_zarr
def test_zarr_link_swapped_in_after_the_check_is_refused_by_the_store(attack):
    # The store opens every key one segment at a time without following links: a chunk
    # replaced by a link after the folder was checked is still refused.
    store = attack.tmp / "s.zarr"
    chunk = _zarr_array(store, 3)
    code = f"""
        import os, treepack
        from treepack import _hierarchy
        check = _hierarchy._check_zarr_store
        def racing(root):
            out = check(root)
            os.unlink({str(chunk)!r})
            os.symlink({str(attack.outside / "secret.txt")!r}, {str(chunk)!r})
            return out
        _hierarchy._check_zarr_store = racing
        result = treepack.load({str(store)!r})
    """
    refused(attack, code, "`x/c/0`", "symbolic link")


@needs_zarr
def test_zarr_store_keys_never_leave_the_folder(attack):
    store = attack.tmp / "s.zarr"
    _zarr_array(store, 3)
    code = f"""
        import zarr
        from treepack import _hierarchy
        s = _hierarchy._confined_store_class(zarr)({str(store)!r})
        assert s.get_sync("x/zarr.json") is not None and s.get_sync("x/missing") is None
        s.get_sync("../outside/secret.txt")
    """
    refused(attack, code, "`../outside/secret.txt`", "'..' segment")


@needs_zarr
@pytest.mark.parametrize("fmt", [2, 3])
def test_zarr_consolidated_metadata_pointing_elsewhere_is_not_used(attack, fmt):
    # Decision: consolidated metadata is ignored; each node's own metadata file is read, so a
    # consolidated entry naming an array outside the store brings nothing in.
    elsewhere = _secret_zarr(attack, fmt, "s")
    store = attack.tmp / "s.zarr"
    _zarr_array(store, fmt, n=4)
    zarr.consolidate_metadata(str(store))
    if fmt == 2:
        m = json.loads((store / ".zmetadata").read_text())
        m["metadata"]["../elsewhere.zarr/s/.zarray"] = json.loads((elsewhere / "s" / ".zarray").read_text())
        (store / ".zmetadata").write_text(json.dumps(m))
    else:
        m = json.loads((store / "zarr.json").read_text())
        m["consolidated_metadata"]["metadata"]["../elsewhere.zarr/s"] = json.loads(
            (elsewhere / "s" / "zarr.json").read_text())
        (store / "zarr.json").write_text(json.dumps(m))
    r = no_secret(attack.run(load_code(store)))
    assert r["outcome"] == "ok" and r["result"] == "{'x': array([7, 7, 7, 7], dtype=uint8)}", r


def test_zarr_and_hdf5_urls_are_refused(attack):
    # (load() reads a URL as a treepack location; convert() takes the format from the extension.)
    for url in ("s3://bucket/x.zarr", "file:///tmp/x.h5", "n5://x.zarr", "az://c/x.hdf5"):
        attack.error(f"import treepack\ntreepack.convert({url!r}, LOC)\n", "TreepackError", match="local paths only")


# ---------------------------------------------------------------- Zarr: object dtypes and codecs


def _pickle_payload(attack) -> bytes:
    """Pickle bytes that import the canary module and construct its class when unpickled."""
    from hostile_harness import CANARY_MODULE

    return f"c{CANARY_MODULE}\nBoom\n(tR.".encode()


def _v2_array(store: Path, zarray_edit: dict, chunk: bytes, path: str = "x") -> None:
    g = zarr.open_group(str(store), mode="w", zarr_format=2)
    g.create_array(path, shape=(1,), dtype="u1", chunks=(1,), compressors=None, fill_value=0)
    meta = store / path / ".zarray"
    doc = json.loads(meta.read_text())
    doc.update(zarray_edit)
    meta.write_text(json.dumps(doc))
    (store / path / "0").write_bytes(chunk)


@needs_zarr
def test_zarr_v2_object_dtype_is_refused_with_its_path(attack):
    store = attack.tmp / "obj.zarr"
    _v2_array(store, {"dtype": "|O", "filters": [{"id": "pickle"}], "fill_value": None}, _pickle_payload(attack))
    r = refused(attack, load_code(store), "`x`", "object dtype", "'pickle'")
    assert "never decodes Python objects" in r["message"]


@needs_zarr
def test_zarr_v2_object_field_in_a_group_is_refused(attack):
    store = attack.tmp / "obj.zarr"
    g = zarr.open_group(str(store), mode="w", zarr_format=2)
    g.create_group("g")
    _v2_array(store / "g", {"dtype": [["a", "<i4"], ["b", "|O"]], "filters": [{"id": "pickle"}], "fill_value": None},
              _pickle_payload(attack))
    refused(attack, load_code(store), "`g/x`", "object dtype")


@needs_zarr
def test_zarr_pickle_codec_on_numbers_is_refused(attack):
    store = attack.tmp / "codec.zarr"
    _v2_array(store, {"filters": [{"id": "pickle"}]}, _pickle_payload(attack))
    refused(attack, load_code(store), "`x`", '"pickle"', "does not decode")
    g = zarr.open_group(str(attack.tmp / "v3.zarr"), mode="w", zarr_format=3)
    g.create_array("y", shape=(1,), dtype="u1", chunks=(1,), compressors=None, fill_value=0)
    meta = attack.tmp / "v3.zarr" / "y" / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["codecs"] = [{"name": "numcodecs.pickle"}] + doc["codecs"]
    meta.write_text(json.dumps(doc))
    refused(attack, load_code(attack.tmp / "v3.zarr"), "`y`", '"numcodecs.pickle"')


# ---------------------------------------------------------------- npy / npz


def _npy(a: np.ndarray, **shape_edit) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, a, allow_pickle=False)
    b = buf.getvalue()
    if "shape" in shape_edit:
        b = b.replace(f"'shape': {a.shape}".encode(), f"'shape': {shape_edit['shape']}".encode())
    return b


def _object_npy(attack) -> bytes:
    """An object-dtype .npy whose data is the canary pickle."""
    header = "{'descr': '|O', 'fortran_order': False, 'shape': (1,), }"
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + _pickle_payload(attack)


def test_npy_object_dtype_is_refused_and_never_unpickled(attack):
    p = attack.tmp / "obj.npy"
    p.write_bytes(_object_npy(attack))
    attack.error(load_code(p), "TreepackError", match="obj.npy: holds an array of Python objects")


def test_npz_object_member_is_refused_and_never_unpickled(attack):
    import zipfile

    p = attack.tmp / "obj.npz"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("ok.npy", _npy(np.arange(3)))
        z.writestr("bad.npy", _object_npy(attack))
    attack.error(load_code(p), "TreepackError", match="obj.npz: member 'bad.npy': holds an array of Python objects")


def test_npz_member_names_are_only_keys(attack):
    # Decision: a member named `../../x.npy` is a key like any other; nothing is extracted.
    import zipfile

    p = attack.tmp / "dots.npz"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("../../x.npy", _npy(np.arange(3)))
        z.writestr("/abs/y.npy", _npy(np.arange(2)))
    r = attack.run(f"import treepack\ntreepack.convert({str(p)!r}, LOC, separator=None)\n"
                   "result = treepack.load(LOC)\n")
    assert r["outcome"] == "ok" and "'../../x': array([0, 1, 2])" in r["result"], r


# ---------------------------------------------------------------- errors a user can act on


def test_huge_npy_shape_is_refused_before_allocating(attack):
    p = attack.tmp / "huge.npy"
    p.write_bytes(_npy(np.arange(10), shape=(10**18, 10**18)))
    r = attack.error(load_code(p), "TreepackError", match="huge.npy: not a readable .npy file")
    assert "(1000000000000000000, 1000000000000000000)" in r["message"] and "nothing was allocated" in r["message"]


def test_huge_npz_member_is_refused_before_allocating(attack):
    import zipfile

    p = attack.tmp / "huge.npz"
    with zipfile.ZipFile(p, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("x.npy", _npy(np.arange(3, dtype=np.uint8), shape=(10**15,)))
    r = attack.error(load_code(p), "TreepackError", match="huge.npz: member 'x.npy'")
    assert "1000000000000000 bytes" in r["message"] and "nothing was allocated" in r["message"]


def test_npz_zip_directory_that_lies_about_sizes_is_refused(attack):
    import zipfile

    p = attack.tmp / "bomb.npz"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("x.npy", _npy(np.arange(3, dtype=np.uint8)))
    b = bytearray(p.read_bytes())
    cd = b.rindex(b"PK\x01\x02")  # central directory entry: uncompressed size at +24
    struct.pack_into("<I", b, cd + 24, 0xFFFFFFF0)
    p.write_bytes(bytes(b))
    attack.error(load_code(p), "TreepackError", match="member 'x.npy' declares 4294967280 bytes")


def _png_chunk(t: bytes, d: bytes) -> bytes:
    return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))


def _tree_with_file(tmp: Path, rewrite_manifest, value, payload: bytes) -> Path:
    """A saved tree {"a": {"leaf": value}} whose stored file bytes are replaced by ``payload``."""
    loc = tmp / "tree"
    treepack.save({"a": {"leaf": value}}, loc)
    old = re.search(rb'"b64":"([^"]*)"', (loc / "treepack.json").read_bytes()).group(1)
    rewrite_manifest(loc, old, base64.b64encode(payload))
    return loc


def test_png_decompression_bomb_names_the_key_path(attack, rewrite_manifest):
    Image = pytest.importorskip("PIL.Image")
    bomb = (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", 100000, 100000, 8, 0, 0, 0, 0))
            + _png_chunk(b"IDAT", zlib.compress(b"\0" * 10)) + _png_chunk(b"IEND", b""))
    loc = _tree_with_file(attack.tmp, rewrite_manifest, Image.new("L", (4, 4)), bomb)
    r = attack.error(load_code(loc), "TreepackError", match="`a/leaf`")
    assert "decompression bomb" in r["message"] and "MAX_IMAGE_PIXELS" in r["message"], r["message"]


def test_garbage_image_in_a_tree_names_the_key_path(attack, rewrite_manifest):
    Image = pytest.importorskip("PIL.Image")
    loc = _tree_with_file(attack.tmp, rewrite_manifest, Image.new("L", (4, 4)), b"not an image at all")
    r = attack.error(load_code(loc), "TreepackError", match="`a/leaf`")
    assert "not a readable PNG image" in r["message"] and "<_io.BytesIO" not in r["message"], r["message"]


def test_wav_with_a_lying_fmt_length_names_the_key_path(attack, rewrite_manifest, wav):
    import wave

    good = wav(1, 2, 8000, b"\0\0" * 10)
    for edit in ((16, 2), (40, 10**6)):  # the fmt chunk's length; the data chunk's length
        bad = bytearray(good)
        struct.pack_into("<I", bad, *edit)
        loc = _tree_with_file(attack.tmp, rewrite_manifest, wave.open(io.BytesIO(good), "rb"), bytes(bad))
        r = attack.error(load_code(loc), "TreepackError", match="`a/leaf`")
        assert "WAV file" in r["message"] and not r["message"].rstrip().endswith(":"), r["message"]
        import shutil

        shutil.rmtree(loc)


def test_corrupt_safetensors_names_the_file_and_the_format(attack):
    p = attack.tmp / "model.safetensors"
    header = b'{"w":{"dtype":"F32","shape":[1000000000000],"data_offsets":[0,16]}}'
    p.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 16)
    r = attack.error(load_code(p), "FormatError", match="model.safetensors: not a valid safetensors file")
    assert "not a treepack file" not in r["message"], r["message"]


def test_corrupt_repository_gc_state_names_the_file(attack):
    repo = attack.tmp / "repo"
    r = treepack.Repository(repo, create=True)
    r.save({"x": np.arange(3)}, "a")
    (repo / "gc.json").write_text("{not json")
    code = f"import treepack\ntreepack.Repository({str(repo)!r}).gc(grace_secs=0)\n"
    out = attack.error(code, "TreepackError", match=f"invalid gc state file {repo / 'gc.json'}")
    assert "manifest" not in out["message"] and "delete the file" in out["message"], out["message"]


def test_damaged_images_and_wavs_become_placeholders_when_asked(tmp_path, rewrite_manifest):
    Image = pytest.importorskip("PIL.Image")
    loc = _tree_with_file(tmp_path, rewrite_manifest, Image.new("L", (4, 4)), b"not an image at all")
    back = treepack.load(loc, on_missing="placeholder")["a"]["leaf"]
    assert isinstance(back, treepack.Unloadable) and back.type_name == "py.image"
    assert back.files == {"image": b"not an image at all"} and "not a readable PNG image" in back.reason
    with pytest.raises(treepack.TreepackError) as e:
        treepack.load(loc)
    assert "stored data does not make one" in str(e.value) and "importable" not in str(e.value)
