"""A save that cannot keep some objects names them all at once (session 47; a Weave user's
report: a log of traced calls holding objects of three classes took three failed saves to list).

The walker notes each object `encode_other` refuses (`UnsupportedObjectError`), goes on with a
stand-in that is never written, and raises one error for all of them, grouped by type; past
`UnsupportedObjectError.LIMIT` it stops looking. Other errors still stop the save where they
happen."""

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
            treepack.save({"a": w, "b": [w]}, tmp_path / f"t{shared}", shared=shared)
        assert [x for x, _, _ in info.value.objects] == ["a", "b/0"]


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
