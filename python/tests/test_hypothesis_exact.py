"""``load(save(x))`` equals ``x`` in the pickle sense, for generated trees (issue 51): the same
types everywhere (keys included), equal values, and the same identity structure — an object at
two places is one object after loading, a cycle is a cycle, and records keep attributes set
beside their fields. The reference is pickle itself: a treepack round trip must have the shape
``pickle.loads(pickle.dumps(x))`` has."""

import collections
import dataclasses
import os
import pickle
import tempfile
from typing import Any, NamedTuple

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import treepack  # noqa: E402
from test_exact_values import Color, Mode  # noqa: E402  (the enums the examples use: one of each kind)


@dataclasses.dataclass
class Rec:
    a: Any = None
    b: Any = None


class Pair(NamedTuple):
    x: Any
    y: Any


# ---------------------------------------------------------------- generation

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.binary(max_size=8),
    st.sampled_from([Color.RED, Color.BLUE, Mode.TRAIN]),
    st.integers(-5, 5).map(np.int64),
    st.floats(-10, 10, allow_nan=False).map(np.float32),
    st.lists(st.integers(-100, 100), max_size=6).map(lambda v: np.array(v, dtype=np.int16)),
)

str_keys = st.text(min_size=1, max_size=5)
other_keys = st.one_of(
    st.integers(-50, 50),
    st.integers(-50, 50).map(np.int64),
    st.sampled_from([Color.RED, Color.BLUE]),
    st.tuples(st.integers(0, 3), st.text(max_size=2)),
)


def containers(children):
    return st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(str_keys, children, max_size=4),
        st.dictionaries(other_keys, children, max_size=3),
        st.dictionaries(str_keys, children, max_size=3).map(collections.OrderedDict),
        st.lists(children, max_size=3).map(collections.deque),
        st.builds(Rec, children, children),
        st.builds(Pair, children, children),
        st.frozensets(st.one_of(st.integers(-9, 9), st.text(max_size=3)), max_size=3),
    )


trees = st.recursive(scalars, containers, max_leaves=20)

#: Containers a loader makes first and fills after, or patches after (a cycle may close
#: through them, as pickle allows). A dict whose keys are not all format keys (numpy scalars,
#: enum members) is built from its pairs: a cycle through it is refused at save
#: (test_exact_state.py).
FILLED_AFTER = (list, dict, Rec, collections.OrderedDict, collections.deque)


def filled_after(x):
    return type(x) in FILLED_AFTER and not (
        type(x) is dict and any(type(k) not in (str, int, float, bool, type(None), tuple) for k in x)
    )


def _mutable_places(x, ancestors, out, seen):
    """Every list, dict and Rec in ``x`` with the containers above it."""
    if id(x) in seen:
        return
    seen.add(id(x))
    kids = []
    if isinstance(x, (list, tuple, collections.deque)):
        kids = list(x)
    elif isinstance(x, dict):
        kids = list(x.values())
    elif isinstance(x, Rec):
        kids = list(vars(x).values())
    if type(x) in FILLED_AFTER:
        out.append((x, list(ancestors)))
    for k in kids:
        _mutable_places(k, ancestors + [x], out, seen)


@st.composite
def shared_trees(draw):
    """A generated tree, then references to some of its objects put elsewhere in it (sharing),
    some of them pointing up at an ancestor (cycles through lists, dicts, records, OrderedDicts
    and deques only: one that closes inside a tuple cannot be rebuilt and is refused at save —
    tested in test_exact_state.py) — and attributes set on records beside their fields."""
    root = [draw(trees), draw(trees)]
    places = []
    _mutable_places(root, [], places, set())
    for _ in range(draw(st.integers(0, 4))):
        target, ancestors = places[draw(st.integers(0, len(places) - 1))]
        candidates = [p for p, _ in places if p is not target]
        up = [a for i, a in enumerate(ancestors) if all(filled_after(c) for c in ancestors[i:] + [target])]
        pool = candidates + up
        if not pool:
            continue
        obj = pool[draw(st.integers(0, len(pool) - 1))]
        # The edge target -> obj closes a cycle through every object on a path from obj down to
        # target — paths earlier edges made included, not only the path the tree was drawn with.
        if all(filled_after(c) for c in _on_paths(obj, target)):
            _put(target, obj, draw)
    for rec, _ in places:
        if isinstance(rec, Rec) and draw(st.booleans()):
            rec.extra = draw(scalars)
    return root


def _kids(obj):
    if isinstance(obj, (list, tuple, collections.deque, frozenset)):
        return list(obj)
    if isinstance(obj, dict):
        return list(obj.values())
    if isinstance(obj, Rec):
        return list(vars(obj).values())
    return []


def _on_paths(obj, target):
    """Every object on some path from ``obj`` down to ``target`` (both included; none when
    ``target`` does not lie inside ``obj``): the objects a new edge target -> obj would put on
    a cycle."""
    reaches = {}  # id -> whether target lies at or below it (False while being walked)
    keep = {}

    def walk(o):
        if o is target:
            reaches[id(o)] = True
            keep[id(o)] = o
            return True
        if id(o) in reaches:
            return reaches[id(o)]
        reaches[id(o)] = False
        found = False
        for k in _kids(o):
            found = walk(k) or found
        if found:
            reaches[id(o)] = True
            keep[id(o)] = o
        return found

    walk(obj)
    return list(keep.values())


def _put(target, obj, draw):
    if isinstance(target, (list, collections.deque)):
        target.append(obj)
    elif isinstance(target, dict):
        key = f"shared{len(target)}" if all(type(k) is str for k in target) or not target else None
        if key is None:
            key = next(k for k in range(1000, 2000) if k not in target)
            if not all(isinstance(k, (int, np.integer)) and not isinstance(k, bool) for k in target):
                return
        target[key] = obj
    elif isinstance(target, Rec):
        target.b = obj


# ---------------------------------------------------------------- comparison


def same(a, b, pairs):
    """Equal in the pickle sense: types, values, and identity (``pairs`` maps id(a-part) to the
    b-part met for it: the same a-object must meet the same b-object everywhere)."""
    if type(a) is not type(b):
        return False
    tracked = isinstance(a, (list, tuple, dict, collections.deque, Rec, np.ndarray, frozenset)) and not (
        isinstance(a, tuple) and len(a) == 0
    )
    if tracked:
        if id(a) in pairs:
            return pairs[id(a)] is b
        pairs[id(a)] = b
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    if isinstance(a, (list, tuple, collections.deque)):
        return len(a) == len(b) and all(same(x, y, pairs) for x, y in zip(a, b))
    if isinstance(a, dict):
        if [type(k) for k in a] != [type(k) for k in b] or list(a) != list(b):
            return False
        return all(same(a[k], b[k], pairs) for k in a)
    if isinstance(a, Rec):
        return list(vars(a)) == list(vars(b)) and all(same(v, vars(b)[k], pairs) for k, v in vars(a).items())
    if isinstance(a, float) and a != a:
        return b != b
    return bool(a == b)


@settings(max_examples=int(os.environ.get("TREEPACK_HYPOTHESIS_EXAMPLES", "60")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(shared_trees())
def test_load_of_save_is_pickle_exact(x):
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "t")
        treepack.save(x, p)
        back = treepack.load(p, trust=[__name__ + ".*", "test_exact_values.*"])
    ref = pickle.loads(pickle.dumps(x))
    assert same(x, ref, {}), "the comparison itself must accept pickle's round trip"
    assert same(x, back, {}), (x, back)
