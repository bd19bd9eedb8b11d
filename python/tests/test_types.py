"""Every type the issue lists round-trips exactly, with no registration."""

import collections
import dataclasses
import datetime as dt
import decimal
import enum
import math
import pathlib
import uuid
import zoneinfo

import numpy as np
import pytest

import treepack


def same(a, b):
    """Exact equality: types, float bits, array dtypes and values."""
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, np.generic):
        return type(a) is type(b) and a.dtype == b.dtype and a.tobytes() == b.tobytes()
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a.hex() == b.hex() or (math.isnan(a) and math.isnan(b))
    if isinstance(a, complex):
        return same(a.real, b.real) and same(a.imag, b.imag)
    if isinstance(a, dict):
        return list(a.keys()) == list(b.keys()) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if dataclasses.is_dataclass(a):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    return a == b


@pytest.mark.parametrize("layout", ["dir", "file.tpk", "memory"])
def test_builtins_round_trip(tmp_path, layout):
    tree = {
        "none": None, "t": True, "f": False, "small": -7, "big": 3**200, "neg_big": -(2**70),
        "float": 0.1, "nan": float("nan"), "inf": float("inf"), "ninf": -math.inf, "negzero": -0.0,
        "complex": complex(1.5, -0.0), "str": "héllo ✓", "long_str": "x" * 100_000, "bytes": b"\x00\xff",
        "long_bytes": bytes(range(256)) * 100, "bytearray": bytearray(b"abc"),
        "list": [1, [2, [3]]], "tuple": (1, (2,)), "empty": ([], (), {}),
        "set": {1, 2, 3}, "frozenset": frozenset({"a"}), "range": range(2, 20, 3), "slice": slice(1, None, 2),
        "ellipsis": ..., "decimal": decimal.Decimal("-1.2300"), "uuid": uuid.UUID(int=12345),
        "path": pathlib.PurePosixPath("/a/b"), "winpath": pathlib.PureWindowsPath("C:\\x"),
        "date": dt.date(2024, 2, 29), "time": dt.time(12, 30, 1, 5),
        "tz_time": dt.time(1, 2, tzinfo=dt.timezone(dt.timedelta(hours=-3))),
        "naive": dt.datetime(2020, 1, 1, 0, 0, 0, 7),
        "utc": dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc),
        "zone": dt.datetime(2021, 11, 7, 1, 30, fold=1, tzinfo=zoneinfo.ZoneInfo("America/New_York")),
        "delta": dt.timedelta(days=-1, seconds=5, microseconds=7),
        1: "int key", 2.5: "float key", None: "none key", True: "bool key", ("a", 1): "tuple key",
    }
    loc = str(tmp_path / layout) if layout != "memory" else f"memory://types/{tmp_path.name}"
    info = treepack.save(tree, loc)
    assert info.leaves > 30
    back = treepack.load(loc)
    assert list(back.keys()) == list(tree.keys())
    for k in tree:
        assert same(tree[k], back[k]), (k, tree[k], back[k])
    assert back["zone"].tzinfo.key == "America/New_York" and back["zone"].fold == 1


DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "complex64", "complex128", "S5", "U3", ">f8", ">i4", "<U2"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_numpy_dtypes(loc, dtype):
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 255, size=6 * np.dtype(dtype).itemsize, dtype=np.uint8)
    a = raw.view(np.dtype(dtype).newbyteorder("=") if np.dtype(dtype).kind != "U" else "<U" + str(np.dtype(dtype).itemsize // 4))
    if np.dtype(dtype).kind == "U":
        a = np.array(["ab", "é", "", "xyz"[: np.dtype(dtype).itemsize // 4], "1", "2"], dtype=dtype)
    a = a.astype(dtype).reshape(2, 3)
    tree = {"a": a, "zero_d": np.array(a[0, 0]), "empty": a[:0], "scalar": a[1, 2]}
    treepack.save(tree, loc)
    back = treepack.load(loc)
    for k in ("a", "zero_d", "empty"):
        assert back[k].shape == tree[k].shape
        assert back[k].dtype == tree[k].dtype.newbyteorder("<") or back[k].dtype == tree[k].dtype
        assert np.array_equal(back[k], tree[k], equal_nan=back[k].dtype.kind in "fc"), k
        assert back[k].flags.writeable and back[k].flags.c_contiguous
    assert type(back["scalar"]) is type(tree["scalar"]) or back["scalar"].dtype == tree["scalar"].dtype
    assert back["scalar"].tobytes() == np.asarray(tree["scalar"]).astype(back["scalar"].dtype).tobytes()


def test_structured_and_strided_arrays(loc):
    rec = np.zeros(4, dtype=np.dtype([("id", "<i4"), ("pos", ">f4", (2,)), ("name", "S3")], align=True))
    rec["id"] = [1, 2, 3, 4]
    rec["pos"] = [[1, 2], [3, 4], [5, 6], [7, 8]]
    rec["name"] = [b"a", b"bb", b"ccc", b""]
    strided = np.arange(100, dtype=np.float64).reshape(10, 10)[::3, 1::4]
    fortran = np.asfortranarray(np.arange(12, dtype=np.int16).reshape(3, 4))
    treepack.save({"rec": rec, "strided": strided, "fortran": fortran}, loc)
    back = treepack.load(loc)
    assert back["rec"].dtype.names == ("id", "pos", "name")
    assert back["rec"].dtype.itemsize == 4 + 8 + 3  # packed on storage
    for f in rec.dtype.names:
        assert np.array_equal(back["rec"][f], rec[f])
    assert np.array_equal(back["strided"], strided)
    assert np.array_equal(back["fortran"], fortran)


def test_ml_dtypes(loc):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    tree = {n: np.array([0.5, -1.0, 2.0], dtype=getattr(ml_dtypes, n)) for n in ("bfloat16", "float8_e4m3fn", "float8_e5m2")}
    tree["scalar"] = ml_dtypes.bfloat16(3.0)
    treepack.save(tree, loc)
    back = treepack.load(loc)
    for n in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        assert back[n].dtype == tree[n].dtype and back[n].tobytes() == tree[n].tobytes()
    assert back["scalar"].dtype == ml_dtypes.bfloat16 and float(back["scalar"]) == 3.0
    assert treepack.load_structure(loc)["bfloat16"].dtype == "bfloat16"


@dataclasses.dataclass
class Point:
    x: float
    y: np.ndarray
    tags: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Frozen:
    a: int


Pair = collections.namedtuple("Pair", ["left", "right"])


class Color(enum.Enum):
    RED = 1
    GREEN = "g"


class Level(enum.IntEnum):
    LOW = 1


def test_dataclasses_namedtuples_enums_with_trust(loc):
    tree = {"p": Point(1.5, np.ones(3), ["a"]), "f": Frozen(3), "pair": Pair(1, Pair(2, None)), "c": Color.GREEN, "lvl": Level.LOW}
    treepack.save(tree, loc)
    with pytest.raises(treepack.UntrustedTypeError) as e:
        treepack.load(loc)
    for name in ("test_types:Point", "test_types:Frozen", "test_types:Pair", "test_types:Color", "test_types:Level"):
        assert name in str(e.value)
    assert e.value.types["test_types:Pair"] == ["pair", "pair/right"]
    back = treepack.load(loc, trust=["test_types.*"])
    assert same(back["p"], tree["p"]) and type(back["p"]) is Point
    assert back["f"] == Frozen(3) and back["pair"] == tree["pair"] and type(back["pair"].right) is Pair
    assert back["c"] is Color.GREEN and back["lvl"] is Level.LOW
    # exact-name trust works too
    assert treepack.load(loc, trust=["test_types:*"])["f"] == Frozen(3)


def test_unsupported_object_is_refused_with_its_path(loc):
    class Opaque:
        pass

    with pytest.raises(TypeError, match=r"cannot save `a/0/~i3`.*Opaque.*register"):
        treepack.save({"a": [{3: Opaque()}]}, loc)


def test_reference_cycles_are_refused_in_plain_trees(loc):
    x = []
    x.append(x)
    with pytest.raises(ValueError, match="reference cycle"):
        treepack.save(x, loc, shared=False)


def test_datetimes_round_trip_exactly(tmp_path):
    """Datetimes take a fast path in Rust for naive/UTC/fixed-offset values; every variant must
    come back identical (value, tzinfo, fold, type) to what the general decoder produces."""
    import zoneinfo

    ny = zoneinfo.ZoneInfo("America/New_York")
    values = [
        dt.datetime(1, 1, 1),
        dt.datetime(9999, 12, 31, 23, 59, 59, 999999),
        dt.datetime(2026, 3, 4, 5, 6, 7, 8),
        dt.datetime(2026, 3, 4, 5, 6, 7, fold=1),
        dt.datetime(2026, 3, 4, tzinfo=dt.timezone.utc),
        dt.datetime(2026, 3, 4, 1, 2, 3, 4, tzinfo=dt.timezone(dt.timedelta(hours=-3, minutes=-30))),
        dt.datetime(2026, 3, 4, tzinfo=dt.timezone(dt.timedelta(hours=5, seconds=1, microseconds=7))),
        dt.datetime(2026, 3, 4, tzinfo=dt.timezone(dt.timedelta(hours=1), "CET")),
        dt.datetime(2026, 3, 4, tzinfo=dt.timezone(dt.timedelta(0), "Zulu")),
        dt.datetime(2021, 11, 7, 1, 30, fold=1, tzinfo=ny),
    ]
    treepack.save(values, tmp_path / "t")
    back = treepack.load(tmp_path / "t")
    for a, b in zip(values, back):
        assert type(b) is dt.datetime
        assert (a, a.fold, a.tzinfo, a.tzname(), a.utcoffset()) == (b, b.fold, b.tzinfo, b.tzname(), b.utcoffset()), (a, b)


def test_a_registered_datetime_codec_wins_over_the_fast_path(tmp_path):
    from treepack import _registry

    treepack.register(dt.datetime, name="test.epoch", to_data=lambda d: d.timestamp(), from_data=lambda x: ("epoch", x))
    try:
        v = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
        treepack.save({"t": v}, tmp_path / "t")
        assert treepack.load(tmp_path / "t")["t"] == ("epoch", v.timestamp())
    finally:
        reg = _registry._by_class.pop(dt.datetime)
        _registry._by_name.pop(reg.name, None)


def test_fast_and_general_datetime_encodings_load_the_same_values(tmp_path):
    # The compact form (naive and UTC, fold 0) is the extension's alone (issue 24: one owner per
    # encoding); without the fast path the Python encoder writes the general form. Both load
    # back as the same values, time zones and folds.
    from treepack import _codec, _core

    vals = [dt.datetime(2026, 1, 2, 3, 4, 5), dt.datetime(2026, 1, 2, 3, 4, 5, 6, fold=1),
            dt.datetime(1, 1, 1, tzinfo=dt.timezone.utc), dt.datetime(2026, 1, 2, tzinfo=dt.timezone(dt.timedelta(hours=2)))]
    enc = lambda o, w: _codec.encode_other(o, w, False)  # noqa: E731
    for fast in (True, False):
        _core.prepare(vals, enc, _codec.encode_array, fast_datetime=fast).write(str(tmp_path / f"t{fast}"))
    assert '"data":"2026-01-02T03:04:05"' in (tmp_path / "tTrue" / "treepack.json").read_text()
    assert '"data":{"fold":0,"iso":"2026-01-02T03:04:05","tz":null}' in (tmp_path / "tFalse" / "treepack.json").read_text()
    for fast in (True, False):
        back = treepack.load(tmp_path / f"t{fast}")
        assert back == vals
        assert [(v.tzinfo, v.fold) for v in back] == [(v.tzinfo, v.fold) for v in vals]


def test_deep_trees_work_on_threads_with_small_stacks(tmp_path):
    """Encoding, decoding and the structure view recurse once per level; they must grow their
    stack instead of overflowing it (regression: a debug build crashed on a reference cycle)."""
    import threading

    deep: list = []
    cur = deep
    for _ in range(990):
        nxt: list = []
        cur.append(nxt)
        cur = nxt
    out: dict = {}

    def work() -> None:
        try:
            treepack.save(deep, tmp_path / "deep")
            back = treepack.load(tmp_path / "deep")
            treepack.load_structure(tmp_path / "deep")
            depth = 0
            while back:
                back = back[0]
                depth += 1
            out["depth"] = depth
            cyc: list = []
            cyc.append(cyc)
            try:
                treepack.save(cyc, tmp_path / "cyc", shared=False)
            except ValueError as e:
                out["cycle"] = str(e)
        except BaseException as e:  # noqa: BLE001 - report to the main thread
            out["error"] = e

    old = threading.stack_size(256 * 1024)
    try:
        t = threading.Thread(target=work)
        t.start()
        t.join()
    finally:
        threading.stack_size(old)
    assert "error" not in out, out.get("error")
    assert out["depth"] == 990
    assert "reference cycle" in out["cycle"]


def test_datetimes_in_the_object_form_still_load(tmp_path):
    """Files written before the compact `py.datetime` form (a string) used an object
    {"iso", "tz", "fold"} for every datetime; both decoders must keep reading it."""
    import json

    from treepack import _codec, _core

    def legacy(o, where):
        if type(o) is dt.datetime:
            tz = None if o.tzinfo is None else {"offset": [0, 0, 0], "name": "UTC"}
            data = {"iso": o.replace(tzinfo=None).isoformat(), "tz": tz, "fold": o.fold}
            return ("custom", "py.datetime", json.dumps(data), [])
        return _codec.encode_other(o, where, False)

    vals = [dt.datetime(2026, 1, 2, 3, 4, 5, 6), dt.datetime(2026, 1, 2, tzinfo=dt.timezone.utc)]
    _core.prepare(vals, legacy, _codec.encode_array, fast_datetime=False).write(str(tmp_path / "t"))
    assert '"iso"' in (tmp_path / "t" / "treepack.json").read_text()
    back = treepack.load(tmp_path / "t")
    assert back == vals and [b.tzinfo for b in back] == [None, dt.timezone.utc]


def test_naive_and_utc_datetimes_are_stored_as_one_string(tmp_path):
    vals = [dt.datetime(2026, 1, 2, 3, 4, 5), dt.datetime(2026, 1, 2, tzinfo=dt.timezone.utc)]
    treepack.save(vals, tmp_path / "t")
    text = (tmp_path / "t" / "treepack.json").read_text()
    assert '"data":"2026-01-02T03:04:05"' in text and '"data":"2026-01-02T00:00:00Z"' in text


def test_deduplicated_str_and_bytes_load_as_one_shared_object(tmp_path):
    """A bytes/str value stored once (content-deduplicated) comes back as one immutable object,
    like pickle's memo; arrays, which are mutable, are shared only when they were one object."""
    img = bytes(range(256)) * 16
    text = "x" * 5000
    arr = np.arange(4096, dtype=np.float32)
    # Equal arrays that are distinct objects stay distinct (their chunk is stored once).
    tree = [{"img": img, "text": text, "a": arr.copy()} for _ in range(3)] + [{"img": bytes(img)}]
    treepack.save(tree, tmp_path / "t")
    back = treepack.load(tmp_path / "t")
    assert [r["img"] for r in back] == [img] * 4
    assert back[0]["img"] is back[1]["img"] is back[3]["img"]
    assert back[0]["text"] == text and back[0]["text"] is back[2]["text"]
    assert back[0]["a"] is not back[1]["a"]
    back[0]["a"][0] = 7.0
    assert back[1]["a"][0] == 0.0
