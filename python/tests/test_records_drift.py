"""A record whose class changed since the save (a field renamed, or added with no default the
class holds) is refused with a BuildError naming the fields, not built without them (session 47:
such an instance's repr raised AttributeError)."""

import sys
import types

import pytest

import treepack

BEFORE = """
import dataclasses

@dataclasses.dataclass
class P:
    x: int
    z: int

@dataclasses.dataclass(slots=True)
class S:
    x: int
"""


@pytest.fixture
def module():
    m = types.ModuleType("drift_mod")
    sys.modules["drift_mod"] = m
    exec(BEFORE, m.__dict__)
    yield m
    del sys.modules["drift_mod"]


def _redefine(m, text):
    exec(BEFORE.replace("    z: int\n", text, 1), m.__dict__)


def test_a_renamed_field_is_refused_naming_both(module, tmp_path):
    p = tmp_path / "t"
    treepack.save({"p": module.P(1, 2)}, p)
    _redefine(module, "    y: int\n")
    with pytest.raises(treepack.BuildError, match=r"at `p`: ValueError: the stored record lacks the fields \['y'\] of P "
                       r"and holds \['z'\] it does not declare: the class changed since the save"):
        treepack.load(p, trust=["drift_mod.*"])
    out = treepack.load(p, trust=["drift_mod.*"], on_missing="placeholder")
    assert isinstance(out["p"], treepack.Unloadable)


def test_fields_added_with_defaults_the_class_holds_load(module, tmp_path):
    p = tmp_path / "t"
    treepack.save({"p": module.P(1, 2), "s": module.S(3)}, p)
    _redefine(module, "    z: int\n    w: int = 5\n    late: int = dataclasses.field(init=False)\n")
    back = treepack.load(p, trust=["drift_mod.*"])
    assert (back["p"].x, back["p"].z, back["p"].w) == (1, 2, 5)
    # A default made per instance is not held by the class: the instance would lack it.
    _redefine(module, "    z: int\n    v: list = dataclasses.field(default_factory=list)\n")
    with pytest.raises(treepack.BuildError, match=r"lacks the fields \['v'\] of P"):
        treepack.load(p, trust=["drift_mod.*"])


def test_a_slots_class_needs_every_field(module, tmp_path):
    p = tmp_path / "t"
    treepack.save({"s": module.S(3)}, p)
    exec(BEFORE.replace("class S:\n    x: int\n", "class S:\n    x: int\n    y: int = 0\n"), module.__dict__)
    with pytest.raises(treepack.BuildError, match=r"lacks the fields \['y'\] of S"):
        treepack.load(p, trust=["drift_mod.*"])


def test_a_field_the_instance_does_not_hold_stays_the_class_s(tmp_path):
    import dataclasses

    @dataclasses.dataclass
    class C:
        a: int
        b: int = dataclasses.field(init=False, default=5)

    c = C(1)
    assert "b" not in vars(c)
    p = tmp_path / "t"
    treepack.save({"c": c}, p)
    back = treepack.load(p, trust=[f"{__name__}.*"])["c"]
    assert vars(back) == {"a": 1} and back.b == 5
