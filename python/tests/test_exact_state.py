"""Exact means exact: an instance's whole state comes back (issue 51, findings 1, 2 and 5).

Records keep every attribute, not only their fields; pydantic models keep their private
attributes, extras and fields set; cycles either come back as cycles or are refused at save
with the path — never a stand-in object left inside a deque.
"""

import collections
import dataclasses
import pickle
from typing import Any, NamedTuple

import numpy as np
import pytest

import treepack


def roundtrip(x, tmp_path, **kw):
    p = str(tmp_path / "t")
    treepack.save(x, p, overwrite=True)
    return treepack.load(p, trust=["test_exact_state.*"], **kw)


@dataclasses.dataclass
class WithPost:
    a: int
    b: list = dataclasses.field(default_factory=list)

    def __post_init__(self):
        self.derived = self.a * 2
        self._cache = {"k": [1, 2]}


@dataclasses.dataclass(slots=True)
class Slotted:
    a: int


class SlottedPlus(Slotted):
    __slots__ = ("extra", "empty")


@dataclasses.dataclass(frozen=True)
class Frozen:
    a: int

    def __post_init__(self):
        object.__setattr__(self, "hidden", self.a + 1)


@dataclasses.dataclass
class NotInit:
    a: int
    late: int = dataclasses.field(init=False)
    never: int = dataclasses.field(init=False)

    def __post_init__(self):
        self.late = 7  # `never` stays unset, as in the original


class Pt(NamedTuple):
    x: int
    y: int


class PtPlus(collections.namedtuple("PtBase", "x y")):
    pass


@dataclasses.dataclass
class OwnState:
    a: int
    lock: object = None

    def __getstate__(self):
        return {"a": self.a, "restored_by_setstate": False}

    def __setstate__(self, st):
        self.a = st["a"]
        self.lock = "made by __setstate__"


def test_dataclass_attributes_beyond_fields_come_back(tmp_path):
    x = WithPost(3, [1])
    x.set_later = "yes"
    back = roundtrip({"x": x}, tmp_path)["x"]
    assert type(back) is WithPost
    assert vars(back) == vars(x) == pickle.loads(pickle.dumps(x)).__dict__
    assert back.derived == 6 and back._cache == {"k": [1, 2]} and back.set_later == "yes"


def test_slots_frozen_and_unset_fields(tmp_path):
    s = SlottedPlus(1)
    s.extra = [5]
    f = Frozen(4)
    n = NotInit(1)
    back = roundtrip([s, f, n], tmp_path)
    assert type(back[0]) is SlottedPlus and back[0].a == 1 and back[0].extra == [5]
    assert not hasattr(back[0], "empty")
    assert back[1] == f and back[1].hidden == 5
    with pytest.raises(dataclasses.FrozenInstanceError):
        back[1].a = 2
    assert back[2].late == 7 and not hasattr(back[2], "never")


def test_namedtuples_with_extra_attributes(tmp_path):
    p = PtPlus(1, 2)
    p.note = "extra"
    back = roundtrip({"p": p, "q": Pt(3, 4)}, tmp_path)
    assert type(back["p"]) is PtPlus and tuple(back["p"]) == (1, 2) and back["p"].note == "extra"
    assert back["q"] == Pt(3, 4) and type(back["q"]) is Pt


def test_a_class_with_its_own_getstate_and_setstate(tmp_path):
    back = roundtrip(OwnState(5, lock=object()), tmp_path)
    assert back.a == 5 and back.lock == "made by __setstate__"


def test_attrs_classes(tmp_path):
    attr = pytest.importorskip("attr")

    @attr.define
    class A:
        x: int
        y: list = attr.Factory(list)

    @attr.s(frozen=True)
    class B:
        x = attr.ib()

        def __attrs_post_init__(self):
            object.__setattr__(self, "more", self.x * 10)

    p = str(tmp_path / "t")
    treepack.save({"a": A(1, [2]), "b": B(3)}, p)
    back = treepack.load(p, trust=["test_exact_state.*"])
    assert back["a"] == A(1, [2]) and type(back["a"]) is A
    assert back["b"] == B(3) and back["b"].more == 30


def test_pydantic_private_extra_and_fields_set(tmp_path):
    pydantic = pytest.importorskip("pydantic")

    class M(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="allow")
        a: int
        b: str = "default"
        _secret: int = pydantic.PrivateAttr(default=0)

    m = M(a=1, extra_field=[1, 2])
    m._secret = 42
    p = str(tmp_path / "t")
    treepack.save({"m": m}, p)
    back = treepack.load(p, trust=["test_exact_state.*"])["m"]
    assert back == m
    assert back._secret == 42
    assert back.__pydantic_extra__ == {"extra_field": [1, 2]}
    assert back.model_fields_set == m.model_fields_set == {"a", "extra_field"}
    assert back.model_dump(exclude_unset=True) == m.model_dump(exclude_unset=True)


def test_transformers_configs_keep_everything(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    for cfg in (
        transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128, n_positions=32),
        transformers.BertConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64, vocab_size=100),
    ):
        cfg._name_or_path = "my/model"
        p = str(tmp_path / type(cfg).__name__)
        treepack.save({"config": cfg}, p)
        back = treepack.load(p, trust=["transformers.*"])["config"]
        assert type(back) is type(cfg)
        assert vars(back) == vars(cfg), set(vars(cfg)) ^ set(vars(back))
        assert back.to_dict() == cfg.to_dict()
        assert back._name_or_path == "my/model"
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(back if isinstance(back, transformers.GPT2Config) else transformers.GPT2Config(n_layer=1))
    assert model.config.n_layer in (1, 2)
    p = str(tmp_path / "gpt2cfg")
    cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
    treepack.save(cfg, p)
    loaded = treepack.load(p, trust=["transformers.*"])
    model = transformers.GPT2LMHeadModel(loaded)
    assert model.config.to_dict() == cfg.to_dict()


# ---------------------------------------------------------------- cycles


@dataclasses.dataclass
class Node:
    name: str
    children: list = dataclasses.field(default_factory=list)
    parent: object = None


def test_cycles_through_lists_dicts_and_dataclasses_come_back(tmp_path):
    root = Node("root")
    kid = Node("kid", parent=root)
    root.children.append(kid)
    lst = [1]
    lst.append(lst)
    d = {"a": 1}
    d["self"] = d
    back = roundtrip({"tree": root, "lst": lst, "d": d}, tmp_path)
    assert back["tree"].children[0].parent is back["tree"]
    assert back["lst"][1] is back["lst"]
    assert back["d"]["self"] is back["d"]


def _objarray_self():
    a = np.empty(2, dtype=object)
    a[0] = 1
    a[1] = a
    return a


def _namedtuple_cycle():
    inner = []
    p = Pt(1, inner)
    inner.append(p)
    return p


def _tuple_cycle():
    # Met from the list, the cycle closes inside the tuple (from the tuple, inside the list: fine).
    outer = []
    outer.append((1, outer))
    return outer


def _numpy_keyed_dict_cycle():
    d = {np.int64(1): 1}
    d[np.int64(2)] = [d]
    return d


@pytest.mark.parametrize(
    "make,what",
    [
        (_objarray_self, "a numpy object array"),
        (_namedtuple_cycle, "Pt"),
        (_tuple_cycle, "through a tuple"),
        (_numpy_keyed_dict_cycle, "keys are not all str"),
    ],
)
def test_cycles_that_cannot_be_rebuilt_are_refused_at_save_naming_the_path(tmp_path, make, what):
    with pytest.raises(ValueError) as e:
        treepack.save({"x": make()}, str(tmp_path / "t"))
    msg = str(e.value)
    assert "cannot save `x" in msg and "contains itself" in msg and what in msg, msg
    assert not (tmp_path / "t").exists()


class MappingSub(dict):
    pass


class UserMapping(collections.UserDict):
    pass


def _deque_self():
    q = collections.deque([1])
    q.append(q)
    return q, lambda b: b[1]


def _deque_via_list():
    q = collections.deque(maxlen=4)
    q.append([q])
    return q, lambda b: b[0][0]


def _list_through_deque():
    outer = []
    outer.append(collections.deque([outer]))
    return outer, lambda b: b[0][0]


def _ordereddict_self():
    o = collections.OrderedDict(a=1)
    o["me"] = o
    return o, lambda b: b["me"]


def _ordereddict_int_keys():
    o = collections.OrderedDict({3: "x"})
    o[1] = [o]
    return o, lambda b: b[1][0]


def _defaultdict_self():
    d = collections.defaultdict(list)
    d["me"] = d
    return d, lambda b: b["me"]


def _counter_through_list():
    c = collections.Counter(a=2)
    c["me"] = [c]
    return c, lambda b: b["me"][0]


def _dict_subclass_self_and_attribute():
    m = MappingSub(a=1)
    m["me"] = m
    m.also = [m]
    return m, lambda b: b["me"] if b.also[0] is b else None


def _user_dict_self():
    u = UserMapping({1: "one"})
    u[2] = u
    return u, lambda b: b[2]


@pytest.mark.parametrize(
    "make",
    [_deque_self, _deque_via_list, _list_through_deque, _ordereddict_self, _ordereddict_int_keys, _defaultdict_self,
     _counter_through_list, _dict_subclass_self_and_attribute, _user_dict_self],
)
def test_cycles_through_containers_pickle_fills_after_making_them_round_trip(tmp_path, make):
    # pickle rebuilds these (their __reduce__ gives the items after the object): so does a load,
    # patching the stand-in the container was built with.
    x, inside = make()
    p = str(tmp_path / "t")
    treepack.save({"x": x}, p)
    for back in (treepack.load(p, trust=["test_exact_state.*"])["x"],
                 treepack.open(p, trust=["test_exact_state.*"])["x"].read()):
        assert type(back) is type(x)
        assert inside(back) is back
        assert type(pickle.loads(pickle.dumps(x))) is type(x)  # the reference does it too
    if isinstance(x, collections.deque):
        assert back.maxlen == x.maxlen


def test_a_crafted_cycle_through_an_object_array_fails_to_load_instead_of_loading_corrupt(tmp_path, rewrite_manifest):
    # Saved as an object array holding a shared list twice: then the list's ref is pointed at
    # the array's own id, as no treepack would write it (the array copies its items).
    shared = [0]
    a = np.empty(2, dtype=object)
    a[0] = shared
    a[1] = shared
    p = str(tmp_path / "t")
    treepack.save({"q": a}, p)
    rewrite_manifest(
        p,
        b'{"t":"custom","type":"py.objarray","data":{"shape":[2]},"children":[["items",[{"t":"shared","id":0,"v":[0]},{"t":"ref","id":0}]]]}',
        b'{"t":"shared","id":0,"v":{"t":"custom","type":"py.objarray","data":{"shape":[2]},"children":[["items",[1,{"t":"ref","id":0}]]]}}',
    )
    with pytest.raises(Exception) as e:
        treepack.load(p)
    assert "cycle" in str(e.value) or "holds itself" in str(e.value), str(e.value)


@dataclasses.dataclass
class KeepsState:
    a: Any = None

    def __setstate__(self, st):  # keeps the dict it is given: a cycle through it cannot be rebuilt
        self._state = st
        self.a = st.get("a")


def test_a_cycle_through_a_class_with_its_own_setstate_is_refused_at_save(tmp_path):
    k = KeepsState()
    k.a = [k]
    with pytest.raises(ValueError, match="contains itself"):
        treepack.save({"k": k}, str(tmp_path / "t"))
    # Without a cycle it round-trips through its __setstate__.
    back = roundtrip({"k": KeepsState([1, 2])}, tmp_path)["k"]
    assert back.a == [1, 2] and back._state["a"] == [1, 2]


def test_a_cycle_through_an_attrs_class_with_slots_round_trips(tmp_path):
    attr = pytest.importorskip("attr")

    @attr.define
    class Slot:
        me: Any = None

    s = Slot()
    s.me = [s]
    p = str(tmp_path / "t")
    treepack.save({"s": s}, p)
    back = treepack.load(p, trust=["test_exact_state.*"])["s"]
    assert back.me[0] is back


@dataclasses.dataclass(eq=False)
class ByIdentity:
    parent: Any = None


def test_a_set_holding_an_object_a_cycle_completes_later_loads_when_its_hash_is_its_identity(tmp_path):
    # The set is built while its element still awaits the cycle's field; an object hashed by
    # identity keeps its hash, so the load is exact (a content hash would be refused).
    lst = []
    n = ByIdentity(lst)
    lst.extend([n, {n}, frozenset([n])])
    p = str(tmp_path / "t")
    treepack.save({"l": lst}, p)
    back = treepack.load(p, trust=["test_exact_state.*"])["l"]
    assert back[0].parent is back and back[0] in back[1] and back[0] in back[2]
