"""A log of traced calls, as an observability tool keeps them (session 46's user): partial and
lazy reads of objects that hold only empty containers, of calls that refer to each other, and
of keys the key-path syntax escapes come back whole; what a load would refuse is refused by the
save."""

import collections
import dataclasses
import uuid

import numpy as np
import pytest

import treepack


@dataclasses.dataclass
class Messages:
    messages: list
    meta: dict


def _trust():
    return [__name__ + ".*"]


def test_objects_of_empty_containers_come_back_from_a_partial_load(tmp_path):
    p = str(tmp_path / "t")
    shared = {"k": 1}
    call = {"inputs": Messages([], {}), "recent": collections.deque([], maxlen=3), "objs": np.array([], dtype=object),
            "x": 1, "a": shared, "b": shared}  # (a shared object: the selection is closed over refs)
    treepack.save({"call": call, "other": 2}, p, allow_pickle=False)
    for select in (["call"], ["call/**"], ["call/inputs", "call/recent", "call/objs"]):
        out = treepack.load(p, select=select, trust=_trust())["call"]
        assert out["inputs"] == Messages([], {}), select
        assert out["recent"] == collections.deque([], maxlen=3) and out["recent"].maxlen == 3, select
        assert isinstance(out["objs"], np.ndarray) and out["objs"].dtype == object and out["objs"].size == 0, select
    # A mask from load_structure, and True over the subtree, keep them too.
    mask = treepack.load_structure(p)
    mask["other"] = None
    out = treepack.load(p, like=mask, trust=_trust())
    assert out["call"]["inputs"] == Messages([], {}) and out["other"] is None
    out = treepack.load(p, like={"call": True, "other": None}, trust=_trust())
    assert out["call"]["inputs"] == Messages([], {}) and list(out["call"]["recent"]) == []


def test_a_lazy_read_of_a_call_that_holds_its_parent(tmp_path):
    p = str(tmp_path / "t")
    root = {"id": uuid.UUID(int=1), "parent_id": None, "parent": None, "children": []}
    child = {"id": uuid.UUID(int=2), "parent_id": root["id"], "parent": root, "children": []}
    root["children"].append(child)
    treepack.save({"calls": [root, child]}, p)
    v = treepack.open(p)
    got = v["calls"][1].read()  # a ref place: the object lies inside the parent it refers to
    assert got["id"] == uuid.UUID(int=2) and got["parent"]["children"][0] is got
    assert got["parent_id"] is got["parent"]["id"]
    whole = v["calls"][0].read()
    assert whole["children"][0]["parent"] is whole


@dataclasses.dataclass
class Secret:
    x: int


def test_a_lazy_read_audits_the_objects_its_refs_bring(tmp_path):
    p = str(tmp_path / "t")
    s = Secret(1)
    treepack.save({"a": {"s": s}, "b": {"same": s}}, p)
    # `b/same` is a ref to `a/s`: reading `b` builds the Secret stored under `a`.
    with pytest.raises(treepack.UntrustedTypeError, match="Secret"):
        treepack.open(p)["b"].read()
    assert treepack.open(p, trust=_trust())["b"].read()["same"] == Secret(1)


def test_like_masks_and_templates_with_keys_the_key_paths_escape(tmp_path):
    p = str(tmp_path / "t")
    tree = {1: {"w": np.arange(3.0)}, "a*b": {"w": np.ones(2)}, "": [np.zeros(1)], (2, "x"): {"e": []}}
    treepack.save(tree, p)
    mask = treepack.load_structure(p)
    out = treepack.load(p, like=mask)
    np.testing.assert_array_equal(out[1]["w"], np.arange(3.0))
    np.testing.assert_array_equal(out["a*b"]["w"], np.ones(2))
    assert out[(2, "x")] == {"e": []}
    jax = pytest.importorskip("jax")
    # (JAX sorts a dict's keys: one type of key per dict)
    p = str(tmp_path / "j")
    treepack.save({"ints": {1: np.arange(3.0), 2: np.ones(1)}, "a*b": {"w": np.ones(2)}, "": [np.zeros(1)]}, p)
    f32 = np.float32
    like = {"ints": {1: jax.ShapeDtypeStruct((3,), f32), 2: jax.ShapeDtypeStruct((1,), f32)},
            "a*b": {"w": jax.ShapeDtypeStruct((2,), f32)}, "": [jax.ShapeDtypeStruct((1,), f32)]}
    out = treepack.load(p, like=like)
    assert isinstance(out["ints"][1], jax.Array) and float(out["ints"][1][2]) == 2.0
    assert float(out["a*b"]["w"][0]) == 1.0 and out[""][0].shape == (1,)
    out = treepack.load(p, like=like, select=["ints/~i1"])
    assert out["ints"][2] is None and float(out["ints"][1][1]) == 1.0 and out["a*b"]["w"] is None


def test_a_pydantic_model_that_would_not_load_is_refused_by_the_save(tmp_path):
    pydantic = pytest.importorskip("pydantic")

    class Split(pydantic.BaseModel):
        tokens: list

        @pydantic.field_validator("tokens", mode="before")
        @classmethod
        def split(cls, v):
            return v.split()

    class Tolerant(pydantic.BaseModel):
        tokens: list

        @pydantic.field_validator("tokens", mode="before")
        @classmethod
        def split(cls, v):
            return v.split() if isinstance(v, str) else v

    with pytest.raises(TypeError, match=r"cannot save `calls/0/inputs`: the fields of this .*Split do not validate again"):
        treepack.save({"calls": [{"inputs": Split(tokens="a b")}]}, str(tmp_path / "t"))
    p = str(tmp_path / "ok")
    treepack.save({"calls": [{"inputs": Tolerant(tokens="a b")}]}, p)
    back = treepack.load(p, trust=["*Tolerant", __name__ + ".*"])
    assert back["calls"][0]["inputs"].tokens == ["a", "b"]


def test_an_exception_is_refused_with_what_to_save_instead(tmp_path):
    with pytest.raises(TypeError, match=r"cannot save `calls/0/error`: .*ValueError.*traceback.format_exception\(e\)"):
        treepack.save({"calls": [{"error": ValueError("bad", 3)}]}, str(tmp_path / "t"))
