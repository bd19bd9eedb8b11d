"""A save that cannot keep some objects names them all at once (session 47; a Weave user's
report: a log of traced calls holding objects of three classes took three failed saves to list).

The walker notes each object `encode_other` refuses (`UnsupportedObjectError`), goes on with a
stand-in that is never written, and raises one error for all of them, grouped by type; past
`UnsupportedObjectError.LIMIT` it stops looking. Other errors still stop the save where they
happen."""

import dataclasses
import os

import numpy as np
import pytest

import treepack
from treepack import UnsupportedObjectError


class Widget:
    pass


class Gadget:
    def __init__(self):
        self.fd = 3


class Scaled(np.ndarray):
    pass


def _listing(root):
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        out += [os.path.join(dirpath, n) for n in dirnames + filenames]
    return sorted(out)


def test_every_unsupported_object_is_named_once_grouped_by_type(tmp_path):
    w1, w2 = Widget(), Widget()
    tree = {
        "calls": [{"input": w1, "output": 1}, {"input": w2, "output": 2}],
        "tool": Gadget(),
        "ok": np.arange(3),
        "arr": np.arange(4.0).view(Scaled),
    }
    p = tmp_path / "t"
    before = _listing(tmp_path)
    with pytest.raises(UnsupportedObjectError) as info:
        treepack.save(tree, p)
    e = info.value
    assert isinstance(e, TypeError) and isinstance(e, treepack.TreepackError)
    widget = f"{__name__}:Widget"
    gadget = f"{__name__}:Gadget"
    assert [(w, t) for w, t, _ in e.objects] == [
        ("calls/0/input", widget), ("calls/1/input", widget), ("tool", gadget), ("arr", f"{__name__}:Scaled"),
    ]
    msg = str(e)
    assert msg.startswith("cannot save 4 objects (3 kinds; the first at `calls/0/input`):"), msg
    assert f"`calls/0/input`, `calls/1/input`: objects of type {widget} are not supported; register" in msg, msg
    assert f"`tool`: objects of type {gadget} are not supported" in msg, msg
    assert f"`arr`: {__name__}.Scaled is a subclass of numpy.ndarray that treepack does not know" in msg, msg
    assert not e.stopped
    # Nothing was written, and the next save of what can be saved works.
    assert _listing(tmp_path) == before
    treepack.save({"ok": np.arange(3)}, p)
    assert treepack.load(p)["ok"].tolist() == [0, 1, 2]


def test_one_object_keeps_the_one_line_message(tmp_path):
    with pytest.raises(UnsupportedObjectError) as info:
        treepack.save({"a": {"b": Widget()}}, tmp_path / "t")
    assert str(info.value) == (
        f"cannot save `a/b`: objects of type {__name__}:Widget are not supported; register the type with "
        "treepack.register(...), make it a dataclass, or pass allow_pickle=True"
    )
    assert info.value.objects == [("a/b", f"{__name__}:Widget", str(info.value).split(": ", 1)[1])]


def test_the_save_stops_looking_past_the_limit(tmp_path):
    limit = UnsupportedObjectError.LIMIT
    tree = [Widget() for _ in range(limit * 3)]
    with pytest.raises(UnsupportedObjectError) as info:
        treepack.save(tree, tmp_path / "t")
    e = info.value
    assert e.stopped and len(e.objects) == limit
    assert [w for w, _, _ in e.objects] == [str(i) for i in range(limit)]
    msg = str(e)
    assert msg.startswith(f"cannot save at least {limit} objects (one kind; the first at `0`):"), msg
    assert f"`0`, `1`, `2`, `3`, `4` and {limit - 5} more places: objects of type" in msg, msg
    assert msg.endswith("(the save stopped looking there)"), msg


def test_one_object_at_two_places_is_named_at_both(tmp_path):
    w = Widget()
    for shared in (True, False):
        with pytest.raises(UnsupportedObjectError) as info:
            treepack.save({"a": w, "b": [w], "c": Widget()}, tmp_path / f"t{shared}", shared=shared)
        assert [x for x, _, _ in info.value.objects] == ["a", "b/0", "c"]
        # Two objects (one of them at two places), not three.
        assert str(info.value).startswith("cannot save 2 objects (one kind; 3 places, the first at `a`):\n"
                                          "  - `a`, `b/0`, `c`: objects of type"), str(info.value)
    with pytest.raises(UnsupportedObjectError) as info:
        treepack.save({"a": w, "b": [w]}, tmp_path / "one")
    assert str(info.value).startswith("cannot save 1 object (one kind; 2 places, the first at `a`):"), str(info.value)


def test_refused_dtypes_zones_and_tensors_are_named_with_the_rest(tmp_path):
    import datetime

    class OwnZone(datetime.tzinfo):
        def utcoffset(self, d):
            return datetime.timedelta(hours=1)

    tree = {
        "f128": np.ones(2, np.longdouble),
        "meta": np.zeros(2, dtype=np.dtype(np.float32, metadata={"unit": "m"})),
        "when": datetime.datetime(2026, 1, 1, tzinfo=OwnZone()),
        "ok": [1, 2, np.arange(3)],
        "w": Widget(),
    }
    with pytest.raises(UnsupportedObjectError) as info:
        treepack.save(tree, tmp_path / "t")
    got = {w: (t, r) for w, t, r in info.value.objects}
    assert list(got) == ["f128", "meta", "when", "w"], got
    assert got["f128"][0] == "numpy:ndarray" and "long double" in got["f128"][1]
    assert "carries metadata" in got["meta"][1]
    assert got["when"][0] == "datetime:datetime" and "OwnZone" in got["when"][1] and "cannot be kept" in got["when"][1]
    assert "x.astimezone(datetime.timezone.utc)" in got["when"][1]
    assert not (tmp_path / "t").exists()


def test_refused_tensors_are_named_with_the_rest(tmp_path):
    torch = pytest.importorskip("torch")
    tagged = torch.ones(2)
    tagged.tp_dim = 0
    param = torch.nn.Parameter(torch.ones(2))
    param._is_sharded = True
    tree = {
        "c32": torch.ones(2, dtype=torch.complex32),
        "meta": torch.ones(2, device="meta"),
        "tagged": tagged,
        "param": param,
        "ok": torch.arange(3),
        "w": Widget(),
    }
    with pytest.raises(UnsupportedObjectError) as info:
        treepack.save(tree, tmp_path / "t")
    got = {w: (t, r) for w, t, r in info.value.objects}
    assert list(got) == ["c32", "meta", "tagged", "param", "w"], got
    assert got["c32"][0] == "torch:Tensor" and "complex32" in got["c32"][1]
    assert "meta device" in got["meta"][1]
    # Python attributes on a tensor (torch.save keeps them) were dropped silently.
    assert "Python attributes (tp_dim)" in got["tagged"][1] and "t.detach()" in got["tagged"][1]
    assert got["param"][0] == "torch.nn.parameter:Parameter" and "(_is_sharded)" in got["param"][1]
    assert not (tmp_path / "t").exists()
    # What the message says to do works.
    treepack.save({"tagged": {"tensor": tagged.detach(), "attrs": vars(tagged)}}, tmp_path / "t")
    back = treepack.load(tmp_path / "t")
    assert back["tagged"]["attrs"] == {"tp_dim": 0} and back["tagged"]["tensor"].tolist() == [1.0, 1.0]


def test_inside_text_walks_records_and_background_saves(tmp_path):
    import dataclasses

    @dataclasses.dataclass
    class Call:
        name: str
        args: list

    # Plain containers (written as text while walked), a shared plain dict (a second walk), a
    # record holding the objects, a background save: each names every object.
    shared = {"k": 1}
    tree = {"s1": shared, "s2": shared, "calls": [Call("f", [Widget()]), Call("g", [1, Gadget()])]}
    for blocking in (True, False):
        with pytest.raises(UnsupportedObjectError) as info:
            treepack.save(tree, tmp_path / f"t{blocking}", blocking=blocking)
        assert [x for x, _, _ in info.value.objects] == ["calls/0/args/0", "calls/1/args/1"]
        assert not (tmp_path / f"t{blocking}").exists()


def test_another_error_stops_the_save_where_it_happens(tmp_path):
    class Bad:
        pass

    def to_data(obj):
        raise RuntimeError("no")

    treepack.register(Bad, name="test.bad-unsupported", to_data=to_data, from_data=lambda d: Bad())
    with pytest.raises(TypeError) as info:
        treepack.save({"a": Widget(), "b": Bad()}, tmp_path / "t")
    assert not isinstance(info.value, UnsupportedObjectError)
    assert "cannot save `b`: to_data of the type registered as 'test.bad-unsupported'" in str(info.value)


def test_allow_pickle_keeps_them(tmp_path):
    p = tmp_path / "t"
    treepack.save({"a": Widget(), "b": [Gadget()]}, p, allow_pickle=True)
    back = treepack.load(p, allow_pickle=True)
    assert type(back["a"]) is Widget and back["b"][0].fd == 3


def test_value_keys_after_str_keys_are_kept_not_refused(tmp_path):
    # A dict whose first key is a str was taken for one of plain keys, and a later numpy integer
    # or enum key was refused with no way out but reordering: the save now starts over looking
    # at every key, and such a dict is stored as pairs (py.dict), keys and all.
    import enum

    class Color(enum.Enum):
        RED = 1

    p = tmp_path / "t"
    shared = {"x": 1}
    tree = {"a": {"s": 1, np.int64(2): 2}, "b": [{"k": "v", Color.RED: 3}], "c": shared, "d": shared}
    treepack.save(tree, p)
    back = treepack.load(p, trust=[f"{__name__}.*"])
    assert back["a"] == {"s": 1, 2: 2} and [type(k) for k in back["a"]] == [str, np.int64]
    assert list(back["b"][0]) == ["k", Color.RED] and back["b"][0][Color.RED] == 3
    assert back["c"] is back["d"]


@dataclasses.dataclass
class ListRecord(list):
    tag: str = "x"


@dataclasses.dataclass
class OddState:
    n: int = 1

    def __getstate__(self):
        return [1, 2]


def test_refused_containers_and_records_are_named_with_the_rest(tmp_path):
    import collections

    tree = {
        "dd": collections.defaultdict(lambda: 0),
        "lr": ListRecord(),
        "odd": OddState(),
        "w": Widget(),
    }
    with pytest.raises(UnsupportedObjectError) as info:
        treepack.save(tree, tmp_path / "t")
    got = {w: r for w, _, r in info.value.objects}
    assert list(got) == ["dd", "lr", "odd", "w"], got
    assert "default_factory" in got["dd"] and "also derives from list" in got["lr"]
    assert "__getstate__ returns a list" in got["odd"]
    assert not (tmp_path / "t").exists()
