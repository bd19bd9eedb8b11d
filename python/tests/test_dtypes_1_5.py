"""Format 1.5 (issue 51): every dtype JAX and ml_dtypes have, saved and loaded exactly.

float8_e3m4, float8_e4m3, float8_e8m0fnu, float6_e2m3fn, float6_e3m2fn, float4_e2m1fn, int4,
uint4, int2, uint2, int1, uint1: one element per byte, as ml_dtypes holds them (docs/format.md
section 5, "Sub-byte types"). A second reader, ml_dtypes itself, reads the stored pack bytes and
gets the same values; numpy arrays, jax.Arrays (with shardings, ``like=``) and
torch.float8_e8m0fnu tensors come back bit for bit.
"""

import base64
import json
import os

import ml_dtypes
import numpy as np
import pytest

import treepack

NEW = ["float8_e3m4", "float8_e4m3", "float8_e8m0fnu", "float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn",
       "int4", "uint4", "int2", "uint2", "int1", "uint1"]
#: Bits of the sub-byte types (the others use all 8).
BITS = {"float6_e2m3fn": 6, "float6_e3m2fn": 6, "float4_e2m1fn": 4, "int4": 4, "uint4": 4, "int2": 2, "uint2": 2,
        "int1": 1, "uint1": 1}
#: Every one-byte ml_dtypes type, in the order of crates/treepack/tests/data/ml_dtypes_values.txt.
ONE_BYTE = ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3b11fnuz"] + NEW
TABLE = os.path.join(os.path.dirname(__file__), "..", "..", "crates", "treepack", "tests", "data", "ml_dtypes_values.txt")


def dt(name):
    return np.dtype(getattr(ml_dtypes, name))


def every_value(name, n=4096):
    """``n`` elements cycling through every canonical byte of the dtype (for the 8-bit floats all
    256: NaN, infinities, extremes, both zeros), as an array of that dtype."""
    codes = 1 << BITS.get(name, 8)
    return (np.arange(n) % codes).astype(np.uint8).view(dt(name))


def same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def same_values(a, b):
    """Equal as numbers, NaN equal to NaN and -0.0 told from 0.0."""
    x, y = np.asarray(a).astype(np.float64), np.asarray(b).astype(np.float64)
    return x.shape == y.shape and np.array_equal(np.signbit(x), np.signbit(y)) and np.array_equal(x, y, equal_nan=True)


def manifest(loc):
    with open(os.path.join(loc, "treepack.json")) as f:
        return json.load(f)


# ---------------------------------------------------------------- the spec's table of values


def table_text():
    lines = ["# The value ml_dtypes gives each canonical byte of each one-byte dtype (python/tests/test_dtypes_1_5.py",
             "# writes it with TREEPACK_BLESS=1 and checks it; format/dtype.rs's decoders are checked against it)."]
    for name in ONE_BYTE:
        v = np.arange(1 << BITS.get(name, 8), dtype=np.uint8).view(dt(name)).astype(np.float64)
        lines.append(name + " " + " ".join(repr(float(x)) for x in v))
    return "\n".join(lines) + "\n"


def test_the_value_table_the_rust_decoders_are_tested_against_is_ml_dtypes():
    want = table_text()
    if os.environ.get("TREEPACK_BLESS"):
        with open(TABLE, "w") as f:
            f.write(want)
    with open(TABLE) as f:
        assert f.read() == want, "ml_dtypes reads some byte differently: rerun with TREEPACK_BLESS=1 and check the diff"


def test_ml_dtypes_holds_every_new_dtype_one_element_per_byte_with_the_high_bits_zero():
    """The packing rule is ml_dtypes' (and JAX's) memory layout: what it makes of each value."""
    for name in NEW:
        assert dt(name).itemsize == 1 and dt(name).name == name, name
    for name in ("int4", "int2", "int1", "uint4", "uint2", "uint1"):
        info = ml_dtypes.iinfo(dt(name))
        vals = np.arange(int(info.min), int(info.max) + 1)
        assert vals.astype(dt(name)).view(np.uint8).tolist() == [v % (1 << BITS[name]) for v in vals.tolist()], name
    assert np.array([-1, -8], dt("int4")).view(np.uint8).tolist() == [0x0F, 0x08]
    assert np.array([-6.0, -0.0], dt("float4_e2m1fn")).view(np.uint8).tolist() == [0x0F, 0x08]
    assert np.array([-7.5], dt("float6_e2m3fn")).view(np.uint8).tolist() == [0x3F]


# ---------------------------------------------------------------- numpy arrays


@pytest.mark.parametrize("name", NEW)
def test_numpy_arrays_round_trip_bit_for_bit(loc, name):
    big = every_value(name).reshape(64, 64)
    tree = {"big": big, "small": big[0, :3].copy(), "scalar": big[0, 5], "empty": np.zeros((0, 3), dt(name))}
    treepack.save(tree, loc, chunk_bytes=1024)
    m = manifest(loc)
    assert m["version"] == [1, 5]
    assert m["root"]["big"]["dtype"] == name and len(m["root"]["big"]["chunks"]) == 4
    assert "data" in m["root"]["small"]  # inline
    for mmap in (False, True):
        out = treepack.load(loc, mmap=mmap)
        for k, v in tree.items():
            assert same(out[k], v), (k, mmap)
    st = treepack.load_structure(loc)
    assert st["big"].dtype == name and st["big"].shape == (64, 64) and st["big"].nbytes == 4096
    # Partial reads: slices across chunks.
    v = treepack.open(loc)
    assert same(v["big"][10:40:3, 5:60], big[10:40:3, 5:60])
    assert same(v["big"][-1], big[-1])
    assert same(treepack.load(loc, select=["small"])["small"], tree["small"])


def test_a_struct_with_sub_byte_fields_round_trips(loc):
    rec = np.dtype([("q", dt("int4"), (4,)), ("scale", dt("float8_e8m0fnu"))])
    a = np.zeros(300, rec)
    a["q"] = np.arange(1200).reshape(300, 4) % 16 - 8
    a["scale"] = (2.0 ** (np.arange(300) % 40 - 20)).astype(dt("float8_e8m0fnu"))
    treepack.save({"blocks": a}, loc)
    assert manifest(loc)["version"] == [1, 5]
    out = treepack.load(loc)["blocks"]
    assert same(out, a) and out.dtype == rec


def test_older_dtypes_alone_stay_format_1_4(loc):
    treepack.save({"w": np.ones(300, dt("float8_e4m3fn"))}, loc)
    assert manifest(loc)["version"] == [1, 4]


def pack_bytes(loc, node):
    """The node's canonical bytes read from the location's files without treepack: inline data, or
    each raw chunk at its offset in its pack (one chunk per array here)."""
    if "data" in node:
        return base64.b64decode(node["data"])
    packs = manifest(loc)["packs"]
    out = b""
    for c in node["chunks"]:
        assert c["codec"] == "raw"
        with open(os.path.join(loc, packs[c["pack"]]["path"]), "rb") as f:
            f.seek(c["offset"])
            out += f.read(c["length"])
    return out


def test_a_second_reader_reads_the_stored_bytes_as_the_same_values(loc):
    """ml_dtypes reads the pack bytes at each chunk's offset (np.frombuffer with its dtype) and gets
    the values saved: every canonical byte of every new dtype, NaN, infinities and extremes
    included, chunked and inline."""
    tree = {name: every_value(name, 1024) for name in NEW}
    extremes = {}
    for name in NEW:
        d = dt(name)
        if name.startswith(("int", "uint")):
            info = ml_dtypes.iinfo(d)
            extremes[name] = np.array([info.min, info.max, 0], d)
        else:
            info = ml_dtypes.finfo(d)
            special = [np.nan] if name == "float8_e8m0fnu" else [np.nan, np.inf, -np.inf] if name in ("float8_e3m4", "float8_e4m3") else []
            vals = [float(info.max), float(info.tiny), float(info.smallest_subnormal)] + special
            if name != "float8_e8m0fnu":
                vals += [float(info.min), -0.0]
            extremes[name] = np.array(vals, np.float64).astype(d)
    tree["extremes"] = extremes
    treepack.save(tree, loc, chunk_bytes=1 << 20)
    m = manifest(loc)
    for name in NEW:
        node = m["root"][name]
        assert "chunks" in node and node["dtype"] == name
        second = np.frombuffer(pack_bytes(loc, node), dtype=dt(name))
        assert same(second, tree[name]) and same_values(second, tree[name]), name
        node = m["root"]["extremes"][name]
        assert "data" in node  # inline
        second = np.frombuffer(pack_bytes(loc, node), dtype=dt(name))
        assert same(second, extremes[name]) and same_values(second, extremes[name]), name
    # NaN and the infinities are really there.
    assert np.isnan(np.frombuffer(pack_bytes(loc, m["root"]["extremes"]["float8_e8m0fnu"]), dt("float8_e8m0fnu")).astype(float)).any()
    e4 = np.frombuffer(pack_bytes(loc, m["root"]["extremes"]["float8_e4m3"]), dt("float8_e4m3")).astype(float)
    assert np.isinf(e4).sum() == 2 and np.isnan(e4).sum() == 1 and np.nanmax(e4[np.isfinite(e4)]) == 240.0


def test_previews_decode_the_values_as_ml_dtypes_does(loc):
    tree = {name: every_value(name, 1024) for name in NEW}
    treepack.save(tree, loc)
    root = manifest(loc)["root"]
    for name in NEW:
        p = root[name]["preview"]
        head = tree[name][:6].astype(np.float64)
        assert [float(x) if not isinstance(x, str) else float(x) for x in p["head"]] == pytest.approx(head.tolist(), nan_ok=True), name
        finite = tree[name].astype(np.float64)
        finite = finite[np.isfinite(finite)]
        assert (float(p["min"]), float(p["max"])) == pytest.approx((finite.min(), finite.max()), rel=1e-6), name
        if name.startswith(("int", "uint")):
            assert isinstance(p["min"], int) and isinstance(p["max"], int), name


def test_non_canonical_bytes_are_kept_and_previewed_as_null(loc):
    """A byte with a high bit set (made by .view() from other bytes; ml_dtypes itself never makes
    one) has no defined value (docs/format.md): treepack stores and loads it unchanged, and
    previews show null for it."""
    raw = np.array([0x10, 0xF7, 0x07] * 100, np.uint8)
    a = raw.view(dt("int4"))
    treepack.save({"a": a}, loc)
    assert same(treepack.load(loc)["a"], a)
    p = manifest(loc)["root"]["a"]["preview"]
    assert p["head"] == [None, None, 7, None, None, 7] and (p["min"], p["max"]) == (7, 7)


@pytest.mark.parametrize("ext", ["h5", "zarr"])
def test_zarr_and_hdf5_hold_them_as_their_bits(tmp_path, ext):
    pytest.importorskip("zarr" if ext == "zarr" else "h5py")
    tree = {name: every_value(name, 256) for name in NEW}
    treepack.save(tree, tmp_path / "t")
    treepack.convert(tmp_path / "t", tmp_path / f"out.{ext}")
    back = treepack.load(tmp_path / f"out.{ext}")
    for name in NEW:
        assert same(back[name], tree[name]), name
    treepack.convert(tmp_path / f"out.{ext}", tmp_path / "back")
    assert treepack.diff(tmp_path / "t", tmp_path / "back") == []


def test_safetensors_has_float8_e8m0fnu_and_refuses_the_sub_byte_types(tmp_path):
    e8 = every_value("float8_e8m0fnu", 256)
    treepack.save({"scale": e8}, tmp_path / "t")
    treepack.convert(tmp_path / "t", tmp_path / "m.safetensors")
    assert same(treepack.load(tmp_path / "m.safetensors")["scale"], e8)
    treepack.save({"q": every_value("int4", 256)}, tmp_path / "q")
    with pytest.raises(Exception, match="safetensors has no int4 dtype"):
        treepack.convert(tmp_path / "q", tmp_path / "q.safetensors")


# ---------------------------------------------------------------- torch


def test_torch_float8_e8m0fnu_round_trips_and_packed_types_are_refused(loc):
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "float8_e8m0fnu"):
        pytest.skip("torch without float8_e8m0fnu")
    t = torch.from_numpy(every_value("float8_e8m0fnu", 512).view(np.uint8).copy()).view(torch.float8_e8m0fnu)
    treepack.save({"s": t, "small": t[:3].clone()}, loc)
    node = manifest(loc)["root"]["s"]
    assert node["dtype"] == "float8_e8m0fnu" and node["as"] == {"type": "torch.Tensor"}
    out = treepack.load(loc)
    for k, want in (("s", t), ("small", t[:3])):
        assert type(out[k]) is torch.Tensor and out[k].dtype == torch.float8_e8m0fnu, k
        assert out[k].view(torch.uint8).numpy().tobytes() == want.view(torch.uint8).numpy().tobytes(), k
    # Read by anything else: the ml_dtypes array.
    assert same(treepack.open(loc)["s"][:], every_value("float8_e8m0fnu", 512))
    # torch's packed float4 and its placeholder sub-byte integers have no exact treepack dtype.
    for name in ("float4_e2m1fn_x2", "int4", "uint1"):
        if hasattr(torch, name):
            with pytest.raises(TypeError, match=f"torch dtype {name} has no treepack dtype"):
                treepack.save({"x": torch.zeros(4, dtype=getattr(torch, name))}, loc + name)


# ---------------------------------------------------------------- JAX


def jax_holds(name):
    """Whether this JAX (and its backend) makes arrays of the dtype: XLA's CPU backend has no
    float6 arrays (jax.device_put raises)."""
    jax = pytest.importorskip("jax")
    try:
        jax.device_put(np.zeros(2, dt(name))).block_until_ready()
        return True
    except Exception:  # noqa: BLE001 - JAX's own error types
        return False


def test_jax_has_every_new_dtype_and_holds_all_but_float6():
    jnp = pytest.importorskip("jax.numpy")
    # Older JAX releases (those for Python 3.10) lack some of them: every one JAX has must be
    # the dtype treepack stores.
    have = [n for n in NEW if hasattr(jnp, n)]
    assert "int4" in have and "uint4" in have, have
    for name in have:
        assert np.dtype(getattr(jnp, name)) == dt(name), name
    held = [n for n in have if jax_holds(n)]
    assert set(have) - set(held) <= {"float6_e2m3fn", "float6_e3m2fn"}, held


@pytest.mark.parametrize("name", NEW)
def test_jax_arrays_round_trip_with_shardings_and_like(loc, name):
    jax = pytest.importorskip("jax")
    if not jax_holds(name):
        pytest.skip(f"this JAX backend has no {name} arrays (numpy arrays of it are tested above)")
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    host = every_value(name).reshape(64, 64)
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("a", "b"))
    tree = {"x": jax.device_put(host), "s": jax.device_put(host, NamedSharding(mesh, P("a", "b"))),
            "small": jax.device_put(host[0, :5].copy())}
    treepack.save(tree, loc, chunk_bytes=512)
    m = manifest(loc)
    assert m["version"] == [1, 5] and m["root"]["x"]["dtype"] == name
    assert m["root"]["s"]["as"]["sharding"]["spec"] == ["a", "b"]
    out = treepack.load(loc)
    for k, v in tree.items():
        assert isinstance(out[k], jax.Array) and out[k].dtype == dt(name), k
        assert same(out[k], v), k
    # like=: ShapeDtypeStructs of the dtype, on one device and on another sharding.
    other = NamedSharding(Mesh(np.array(jax.devices()[:8]), ("d",)), P(None, "d"))
    like = {"x": jax.ShapeDtypeStruct((64, 64), dt(name)), "s": jax.ShapeDtypeStruct((64, 64), dt(name), sharding=other),
            "small": jax.ShapeDtypeStruct((5,), dt(name))}
    back = treepack.load(loc, like=like)
    for k, v in tree.items():
        assert back[k].dtype == dt(name) and same(back[k], v), k
    assert back["s"].sharding == other
    st = treepack.load_structure(loc)
    assert st["x"].dtype == name and st["s"].dtype == name
    assert same(treepack.open(loc)["s"][3:50:7, 10:20], host[3:50:7, 10:20])
