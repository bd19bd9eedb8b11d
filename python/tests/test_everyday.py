"""The everyday types pickle handles (issue 26): collections mappings and deques, fractions,
memoryviews, numpy datetime64/timedelta64, masked arrays and dtype objects — exact round trips,
strict loading, readable key paths; and the registry's visible order and conflicts."""

import collections
import fractions
import json
import os

import numpy as np
import pytest

import treepack


def roundtrip(tmp_path, tree, name="t", **load_kw):
    p = str(tmp_path / name)
    treepack.save(tree, p)
    return treepack.load(p, **load_kw), p


def test_ordered_dict_keeps_type_order_attributes_and_readable_key_paths(tmp_path):
    # What torch's state_dict() returns: an OrderedDict with a `_metadata` attribute.
    sd = collections.OrderedDict([("layer1.weight", np.arange(6, dtype=np.float32).reshape(2, 3)), ("layer1.bias", np.zeros(2))])
    sd._metadata = collections.OrderedDict([("", {"version": 1}), ("layer1", {"version": 2})])
    back, p = roundtrip(tmp_path, {"model": sd})
    m = back["model"]
    assert type(m) is collections.OrderedDict
    assert list(m) == ["layer1.weight", "layer1.bias"]
    assert np.array_equal(m["layer1.weight"], sd["layer1.weight"])
    assert m._metadata == {"": {"version": 1}, "layer1": {"version": 2}}
    # Key paths read like the dict's own.
    one = treepack.load(p, select=["model/layer1.bias"])
    assert np.array_equal(one["model"]["layer1.bias"], np.zeros(2))
    assert treepack.load_structure(p)["model"].type_name == "py.ordereddict"


def test_mappings_with_other_keys_counter_defaultdict_and_deque(tmp_path):
    tree = {
        "od": collections.OrderedDict([(1, "a"), ((2, 3), "b"), ("x", None)]),
        "count": collections.Counter("mississippi"),
        "dd_list": collections.defaultdict(list, {"a": [1, 2]}),
        "dd_none": collections.defaultdict(None, {1: 2}),
        "dq": collections.deque([1, 2.5, "x"], maxlen=5),
        "dq_free": collections.deque(),
    }
    back, _ = roundtrip(tmp_path, tree)
    assert type(back["od"]) is collections.OrderedDict and list(back["od"].items()) == [(1, "a"), ((2, 3), "b"), ("x", None)]
    assert type(back["count"]) is collections.Counter and back["count"] == collections.Counter("mississippi")
    dd = back["dd_list"]
    assert type(dd) is collections.defaultdict and dd.default_factory is list and dd == {"a": [1, 2]}
    dd["new"].append(1)
    assert back["dd_none"].default_factory is None and back["dd_none"] == {1: 2}
    assert back["dq"] == collections.deque([1, 2.5, "x"]) and back["dq"].maxlen == 5
    assert back["dq_free"].maxlen is None and len(back["dq_free"]) == 0


class Bag(list):
    pass


def test_defaultdict_factories_beyond_builtins_need_trust(tmp_path):
    p = str(tmp_path / "dd")
    treepack.save({"d": collections.defaultdict(collections.OrderedDict, {"k": collections.OrderedDict(a=1)})}, p)
    # collections.OrderedDict is a class, not one of the built-in factories: it must be trusted.
    with pytest.raises(treepack.UntrustedTypeError, match="collections:OrderedDict"):
        treepack.load(p)
    placeholder = treepack.load(p, on_missing="placeholder")["d"]
    assert isinstance(placeholder, treepack.Unloadable) and "not trusted" in placeholder.reason
    back = treepack.load(p, trust=["collections.*"])["d"]
    assert back.default_factory is collections.OrderedDict and back["k"] == {"a": 1}
    with pytest.raises(TypeError, match=r"cannot save `d`.*default_factory <function .*lambda.*neither a built-in type"):
        treepack.save({"d": collections.defaultdict(lambda: 0)}, str(tmp_path / "lam"))


def test_fraction_and_memoryview(tmp_path):
    big = fractions.Fraction(3**90, 7**40)
    back, _ = roundtrip(tmp_path, {"f": fractions.Fraction(-3, 4), "big": big, "mv": memoryview(b"abc" * 1000)})
    assert back["f"] == fractions.Fraction(-3, 4) and type(back["f"]) is fractions.Fraction
    assert back["big"] == big
    assert back["mv"] == b"abc" * 1000 and type(back["mv"]) is bytes  # a memoryview comes back as bytes


@pytest.mark.parametrize("unit", ["Y", "M", "W", "D", "h", "m", "s", "ms", "us", "ns", "ps", "fs", "as"])
def test_datetime64_and_timedelta64_arrays_in_every_unit(tmp_path, unit):
    a = np.array([0, 1, -5, 10**6], dtype="int64").view(f"M8[{unit}]")
    a[2] = np.datetime64("NaT")
    td = np.arange(6, dtype="int64").reshape(2, 3).view(f"m8[{unit}]")
    tree = {"a": a, "td": td, "be": a.astype(f">M8[{unit}]"), "strided": td[:, ::2], "s": a[1], "d": td[1, 2]}
    back, _ = roundtrip(tmp_path, tree)
    for k in ("a", "td", "be", "strided"):
        assert back[k].dtype == np.dtype(f"M8[{unit}]" if k in ("a", "be") else f"m8[{unit}]"), k
        assert np.array_equal(back[k].view("i8"), tree[k].astype(tree[k].dtype.newbyteorder("=")).view("i8")), k
    assert np.isnat(back["a"][2])
    assert type(back["s"]) is np.datetime64 and back["s"] == a[1] and back["s"].dtype == a.dtype
    assert type(back["d"]) is np.timedelta64 and back["d"] == td[1, 2]


def test_datetime64_with_a_multiplier_and_generic_units(tmp_path):
    tree = {"x": np.array([1, 2], dtype="M8[10ms]"), "g": np.timedelta64(5), "nat": np.datetime64("NaT")}
    back, _ = roundtrip(tmp_path, tree)
    assert back["x"].dtype == np.dtype("M8[10ms]") and np.array_equal(back["x"], tree["x"])
    assert back["g"] == np.timedelta64(5) and back["g"].dtype == np.dtype("m8")
    assert np.isnat(back["nat"])


def test_masked_arrays_keep_mask_fill_value_and_hardness(tmp_path):
    m = np.ma.masked_array(np.arange(6.0).reshape(2, 3), mask=[[0, 1, 0], [1, 0, 0]], fill_value=-1.0)
    plain = np.ma.masked_array([1, 2, 3])  # nomask
    hard = np.ma.masked_array([1, 2], mask=[1, 0], hard_mask=True)
    back, _ = roundtrip(tmp_path, {"m": m, "plain": plain, "hard": hard})
    b = back["m"]
    assert type(b) is np.ma.MaskedArray
    assert np.array_equal(b.mask, m.mask) and np.array_equal(b.data, m.data) and b.fill_value == -1.0
    assert not back["plain"].mask.any() and np.array_equal(back["plain"].data, [1, 2, 3])
    assert back["hard"].hardmask and np.array_equal(back["hard"].mask, [True, False])


def test_numpy_dtype_objects(tmp_path):
    import ml_dtypes

    dts = [np.dtype("float32"), np.dtype(">i8"), np.dtype("S5"), np.dtype("<U3"), np.dtype("M8[ns]"),
           np.dtype("m8[3s]"), np.dtype([("a", "<i4"), ("b", "<f8", (2,))]), np.dtype(ml_dtypes.bfloat16), np.dtype(bool)]
    back, _ = roundtrip(tmp_path, {"dts": dts})
    for got, want in zip(back["dts"], dts):
        assert isinstance(got, np.dtype)
        # Stored canonically: little-endian (a big-endian dtype comes back as its little-endian twin).
        assert got == want.newbyteorder("<") if want.byteorder == ">" else got == want, (got, want)


def test_object_arrays_keep_shape_elements_and_identity(tmp_path):
    a = np.empty((2, 3), dtype=object)
    shared = [1, 2]
    a[0] = [shared, "s", None]  # an element that is a list stays one element
    a[1] = [np.arange(3), {"k": fractions.Fraction(1, 3)}, shared]
    back, _ = roundtrip(tmp_path, {"a": a, "empty": np.empty((0, 4), dtype=object), "zero_d": np.array(5, dtype=object),
                                   "strided": np.array([[1], [2]], dtype=object).T})
    got = back["a"]
    assert got.dtype == object and got.shape == (2, 3)
    assert got[0, 0] == [1, 2] and got[0, 0] is got[1, 2] and got[0, 1] == "s" and got[0, 2] is None
    assert np.array_equal(got[1, 0], np.arange(3)) and got[1, 1] == {"k": fractions.Fraction(1, 3)}
    assert back["empty"].shape == (0, 4) and back["empty"].dtype == object
    assert back["zero_d"].shape == () and back["zero_d"][()] == 5
    assert back["strided"].tolist() == [[1, 2]]


def test_strings_with_lone_surrogates_round_trip(tmp_path):
    # os.fsdecode of a file name that is not UTF-8 (pickle keeps these; JSON cannot hold them).
    names = [os.fsdecode(b"caf\xe9.txt"), "\ud800", "ok", "x\udfff\ud800y"]
    back, p = roundtrip(tmp_path, {"names": names, "one": names[1]})
    assert back["names"] == names and back["one"] == "\ud800"
    text = open(os.path.join(p, "treepack.json")).read()
    assert '"type":"py.str"' in text and '"ok"' in text  # only the odd ones are py.str nodes


def test_everyday_nodes_are_plain_data_in_the_manifest(tmp_path):
    p = str(tmp_path / "m")
    treepack.save({"f": fractions.Fraction(1, 3), "t": np.array(["2020-01-01"], dtype="M8[D]")}, p)
    text = open(os.path.join(p, "treepack.json")).read()
    assert '"t":"custom","type":"py.fraction"' in text and '"type":"py.datetime64"' in text
    assert '"unit":"D"' in text
    assert treepack.untrusted_types(p) == {}


def test_hostile_everyday_data_is_refused(tmp_path, rewrite_manifest):
    # A manifest whose py.datetime64 names a unit numpy would parse into something else, or whose
    # dtype text is not a time dtype: refused with a clear error, nothing evaluated.
    for i, (old, new, says) in enumerate(
        [(b'"unit":"s"', b'"unit":"s]1"', "bad datetime64"), (b'"time":"<M8[s]"', b'"time":"O"', "bad numpy time dtype"),
         (b'"shape":[2]', b'"shape":[1000000,1000000]', r"object array of shape \(1000000, 1000000\) cannot hold 2 items"),
         (b'"shape":[2]', b'"shape":[-2]', "needs a list of dimensions")]
    ):
        p = str(tmp_path / f"h{i}")
        treepack.save({"t": np.array([1], dtype="M8[s]"), "d": np.dtype("M8[s]"), "o": np.array([1, "x"], dtype=object)}, p)
        rewrite_manifest(p, old, new)
        with pytest.raises(ValueError, match=says):
            treepack.load(p)


def test_registry_lists_handlers_with_their_classes_and_refuses_a_second_handler():
    class Temp:
        pass

    class Hot(Temp):
        pass

    treepack.register(Temp, name="test.everyday.Temp", to_data=lambda o: 0, from_data=lambda d: Temp())
    treepack.register(Hot, name="test.everyday.Hot", to_data=lambda o: 1, from_data=lambda d: Hot())
    regs = treepack.registered()
    by_name = {r.name: r for r in regs}
    assert by_name["test.everyday.Hot"].cls is Hot and by_name["test.everyday.Temp"].cls is Temp
    names = [r.name for r in regs]
    assert names.index("test.everyday.Hot") < names.index("test.everyday.Temp")
    assert "test.everyday.Hot" in repr(by_name["test.everyday.Hot"])
    with pytest.raises(ValueError, match=r"already registered as 'test.everyday.Temp'.*one handler"):
        treepack.register(Temp, name="test.everyday.Temp2", to_data=str, from_data=str)
    # The same class under the same name (a notebook cell run again) replaces the handler.
    treepack.register(Temp, name="test.everyday.Temp", to_data=lambda o: 2, from_data=lambda d: Temp())
    assert [r.name for r in treepack.registered()].count("test.everyday.Temp") == 1


# ---------------------------------------------------------------- pydantic models

import pydantic  # noqa: E402


class Point(pydantic.BaseModel):
    x: int
    y: int = 0

    @pydantic.field_validator("x")
    @classmethod
    def small(cls, v):
        if v > 1000:
            raise ValueError("x must be at most 1000")
        return v


class Shape(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow", arbitrary_types_allowed=True)
    name: str
    points: list[Point]
    weights: np.ndarray


def test_pydantic_models_are_records_validated_on_load(tmp_path, rewrite_manifest):
    s = Shape(name="tri", points=[Point(x=1), Point(x=2, y=3)], weights=np.arange(3.0), color="red")
    p = str(tmp_path / "m")
    treepack.save({"shape": s}, p)
    st = treepack.load_structure(p)["shape"]
    assert st.kind == "record" and st.type_name == f"{__name__}:Shape" and list(st.children) == ["name", "points", "weights", "color"]
    with pytest.raises(treepack.UntrustedTypeError, match="Shape"):
        treepack.load(p)
    back = treepack.load(p, trust=[__name__ + ".*"])["shape"]
    assert type(back) is Shape and back.name == "tri" and back.points == s.points and back.color == "red"
    assert np.array_equal(back.weights, s.weights)
    # What the file says goes through the model's validators.
    rewrite_manifest(p, b'[["x",2]', b'[["x",5000]')
    with pytest.raises(ValueError, match="(?s)do not validate as Point.*at most 1000"):
        treepack.load(p, trust=[__name__ + ".*"])
