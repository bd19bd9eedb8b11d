"""Values people have that were refused, now kept exactly (issue 51): numpy-scalar and enum dict
keys, torch dtypes/sizes/devices in configs, numpy random generators, dateutil time zones,
mapping subclasses (scikit-learn's Bunch, UserDict, transformers' BatchEncoding), and clear
advice for what stays unsupported."""

import collections
import datetime
import enum
import pickle

import numpy as np
import pytest

import treepack


class Color(enum.IntEnum):
    RED = 1
    BLUE = 2


class Mode(str, enum.Enum):
    TRAIN = "train"
    EVAL = "eval"


def rt(x, tmp_path, **kw):
    p = str(tmp_path / "t")
    treepack.save(x, p, overwrite=True)
    return treepack.load(p, trust=["test_exact_values.*", "sklearn.*", "transformers.*", "collections.*"], **kw)


def same_types(a, b):
    """Equal in the pickle sense: equal values and the same types, keys included."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(map(type, a)) == list(map(type, b)) and list(a) == list(b) and all(same_types(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_types(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b)
    return a == b


def test_numpy_scalar_and_enum_keys(tmp_path):
    g, v = np.array([1, 1, 2]), np.array([1.0, 2.0, 3.0])
    groups = {k: v[g == k] for k in np.unique(g)}  # numpy integers as keys, as a groupby gives
    assert type(next(iter(groups))) is np.int64
    tree = {
        "groups": groups,
        "strs": {np.str_("a"): 1, np.str_("b"): 2},
        "enums": {Color.RED: "r", Color.BLUE: "b"},
        "modes": {Mode.TRAIN: 1},
        "mixed": {1: "int first", np.int64(2): "then numpy", (np.int32(3), "x"): "tuple key"},
        "floats": {np.float32(0.5): 1},
        "plain": {1: 2, "s": 3},
    }
    back = rt(tree, tmp_path)
    for k in tree:
        assert same_types(back[k], tree[k]), (k, back[k])
    assert same_types(back, pickle.loads(pickle.dumps(tree)))


def test_a_str_first_dict_with_a_numpy_key_is_kept(tmp_path):
    # (It was refused; since session 47 the save starts over looking at every key:
    # test_save_unsupported.py.)
    back = rt({"d": {"a": 1, np.int64(1): 2}}, tmp_path)
    assert back == {"d": {"a": 1, 1: 2}} and [type(k) for k in back["d"]] == [str, np.int64]


def test_torch_dtype_size_device_in_configs(tmp_path):
    torch = pytest.importorskip("torch")
    cfg = {"dtype": torch.bfloat16, "shape": torch.Size([2, 3]), "device": torch.device("cuda:1"), "cpu": torch.device("cpu")}
    back = rt(cfg, tmp_path)
    assert back == cfg and type(back["shape"]) is torch.Size and back["dtype"] is torch.bfloat16
    transformers = pytest.importorskip("transformers")
    c = transformers.GPT2Config(n_layer=1, dtype=torch.float16)
    back = rt({"config": c}, tmp_path)["config"]
    assert back.dtype is torch.float16 and back.to_dict() == c.to_dict()


def test_torch_value_nodes_refuse_what_is_not_torch(tmp_path, rewrite_manifest):
    torch = pytest.importorskip("torch")
    p = str(tmp_path / "t")
    treepack.save({"d": torch.float32}, p)
    rewrite_manifest(p, b'"float32"', b'"nn"')
    with pytest.raises(ValueError, match="names no torch dtype"):
        treepack.load(p)


@pytest.mark.parametrize("bg", ["PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64"])
def test_numpy_generators_draw_the_same_next(tmp_path, bg):
    g = np.random.Generator(getattr(np.random, bg)(1234))
    g.random(5)
    back = rt({"rng": g}, tmp_path)["rng"]
    assert type(back) is np.random.Generator and type(back.bit_generator).__name__ == bg
    assert np.array_equal(back.random(10), g.random(10))
    assert np.array_equal(back.integers(0, 1 << 62, 5), g.integers(0, 1 << 62, 5))


def test_legacy_random_state(tmp_path):
    rs = np.random.RandomState(7)
    rs.rand(3)
    back = rt(rs, tmp_path)
    assert np.array_equal(back.rand(4), rs.rand(4))


def test_dateutil_time_zones(tmp_path):
    tz = pytest.importorskip("dateutil.tz")
    when = datetime.datetime(2026, 11, 27, 12, 30)
    zones = [tz.tzutc(), tz.tzoffset("XST", 3600 * 5 + 1800), tz.gettz("Europe/Paris"), tz.tzlocal()]
    tree = [when.replace(tzinfo=z) for z in zones]
    back = rt(tree, tmp_path)
    for a, b in zip(back, tree):
        assert a == b and type(a.tzinfo) is type(b.tzinfo) and a.utcoffset() == b.utcoffset() and a.tzname() == b.tzname()


class MyDict(dict):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.note = "kept"


class MyUser(collections.UserDict):
    pass


def test_mapping_subclasses(tmp_path):
    d = MyDict(a=1, b=[2])
    u = MyUser({"x": np.arange(3), 5: "int key"})
    u.extra = 1
    back = rt({"d": d, "u": u}, tmp_path)
    assert type(back["d"]) is MyDict and back["d"] == d and back["d"].note == "kept"
    assert type(back["u"]) is MyUser and np.array_equal(back["u"]["x"], u["x"]) and back["u"][5] == "int key"
    assert back["u"].extra == 1
    # Untrusted: refused before anything is built, as for records.
    p = str(tmp_path / "t2")
    treepack.save({"d": d}, p)
    with pytest.raises(treepack.UntrustedTypeError, match="MyDict"):
        treepack.load(p)
    assert isinstance(treepack.load(p, on_missing="placeholder")["d"], treepack.Unloadable)


def test_sklearn_bunch_and_batch_encoding(tmp_path):
    datasets = pytest.importorskip("sklearn.datasets")
    iris = datasets.load_iris()
    back = rt({"iris": iris}, tmp_path)["iris"]
    assert type(back) is type(iris) and sorted(back) == sorted(iris)
    assert np.array_equal(back.data, iris.data) and back.feature_names == iris.feature_names
    assert np.array_equal(back["target"], iris["target"])
    transformers = pytest.importorskip("transformers")
    enc = transformers.BatchEncoding({"input_ids": [[1, 2, 3]], "attention_mask": [[1, 1, 1]]})
    back = rt({"enc": enc}, tmp_path)["enc"]
    assert type(back) is transformers.BatchEncoding and dict(back) == dict(enc)
    assert back.input_ids == [[1, 2, 3]] and back.n_sequences == enc.n_sequences


def test_what_stays_unsupported_says_what_to_do(tmp_path):
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(2, 2)
    with pytest.raises(TypeError, match=r"cannot save `m`.*save model.state_dict\(\)"):
        treepack.save({"m": model}, str(tmp_path / "a"))
    opt = torch.optim.AdamW(model.parameters())
    with pytest.raises(TypeError, match=r"optimizer.state_dict\(\)"):
        treepack.save({"o": opt}, str(tmp_path / "b"))
    linear = pytest.importorskip("sklearn.linear_model")
    est = linear.LinearRegression().fit(np.eye(3), np.arange(3.0))
    with pytest.raises(TypeError, match=r"skops.io"):
        treepack.save({"e": est}, str(tmp_path / "c"))
    # Its fitted arrays and parameters, as the message says, do round-trip.
    st = {"params": est.get_params(), "coef_": est.coef_, "intercept_": est.intercept_}
    back = rt(st, tmp_path)
    assert back["params"] == est.get_params() and np.array_equal(back["coef_"], est.coef_)
