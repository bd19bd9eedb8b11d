"""Errors of a build name the exact key path of the node that failed (session 45).

The load builds without keeping key paths (that would cost every load); a failing node's path is
collected only as its error travels out (`Build::failed_under`). Before, a custom object that
could not be built was placed at every node of its type, and other build errors (a dict whose
keys share one hash) named neither the file nor a path."""

import fractions
import os
import re

import blake3
import numpy as np
import pytest

import treepack


def _edit(loc, fn):
    p = os.path.join(loc, "treepack.json")
    text = open(p).read()
    body = text[: text.rindex(',\n"manifest_hash"')]
    new = fn(body)
    assert new != body
    open(p, "w").write(new + ',\n"manifest_hash":"' + blake3.blake3(new.encode()).hexdigest() + '"}\n')


@pytest.fixture
def fractions_tree(tmp_path):
    """Three fractions; the one at `b/1` made from a string, which its node refuses."""
    loc = str(tmp_path / "t")
    treepack.save({"a": fractions.Fraction(1, 3), "b": [fractions.Fraction(1, 2), fractions.Fraction(2, 3)]}, loc)
    _edit(loc, lambda b: b.replace('[["numerator",2],["denominator",3]]', '[["numerator","2"],["denominator",3]]'))
    return loc


def test_a_custom_object_that_cannot_be_built_is_placed_where_it_failed(fractions_tree):
    with pytest.raises(treepack.BuildError) as e:
        treepack.load(fractions_tree)
    # Only the failing fraction, not all three of its type.
    assert e.value.paths == ["b/1"], e.value.paths
    assert str(e.value).startswith(f"{fractions_tree}: cannot build py.fraction at `b/1`:"), str(e.value)


def test_a_partial_load_places_the_failure_from_the_root(fractions_tree):
    with pytest.raises(treepack.BuildError) as e:
        treepack.load(fractions_tree, select=["b/**"])
    assert e.value.paths == ["b/1"], e.value.paths
    with pytest.raises(treepack.BuildError) as e:
        treepack.open(fractions_tree)["b"].read()
    assert e.value.paths == ["b/1"] and f"{fractions_tree}: cannot build py.fraction at `b/1`" in str(e.value)
    # The node not selected is not built: no error.
    assert treepack.load(fractions_tree, select=["a"])["a"] == fractions.Fraction(1, 3)


def _colliding_dict(tmp_path):
    """A tree with a dict at `runs/~i7/steps` (under an int key) whose 3000 int keys share one
    hash: refused as built (design decision 106)."""
    M = 2**61 - 1
    keys = [i * M for i in range(1, 3000)]
    loc = str(tmp_path / "c")
    treepack.save({"runs": {7: {"steps": {k: 0 for k in keys}}, 8: {"steps": {1: 0}}}}, loc)
    return loc


def test_a_refused_dict_names_the_file_and_its_key_path(tmp_path):
    loc = _colliding_dict(tmp_path)
    with pytest.raises(ValueError, match=r"one hash") as e:
        treepack.load(loc)
    assert str(e.value).startswith(f"{loc}: at `runs/~i7/steps`: a dict in the file has"), str(e.value)
    with pytest.raises(ValueError) as e:
        treepack.load_structure(loc)
    assert str(e.value).startswith(f"{loc}: at `runs/~i7/steps`: a dict in the file has"), str(e.value)
    # The place is written as selections write it: the subtree there is what a view refuses.
    with pytest.raises(ValueError, match="one hash") as e:
        treepack.open(loc)["runs"][7].read()
    assert str(e.value).startswith(f"{loc}: at `runs/~i7/steps`: "), str(e.value)


def test_a_like_that_does_not_match_names_the_file_and_what_to_do(tmp_path):
    loc = str(tmp_path / "ckpt")
    treepack.save({"w": np.zeros(3), "b": np.zeros(2)}, loc)
    with pytest.raises(ValueError) as e:
        treepack.load(loc, like={"w": np.zeros(3), "b": np.zeros(2), "lm_head": np.zeros(3)})
    msg = str(e.value)
    assert msg.startswith(f"{loc}: like=: at ") and "'lm_head' that the file does not hold" in msg, msg
    assert "leave it out of like=" in msg and "strict=False" in msg, msg
    with pytest.raises(ValueError, match=f"^{re.escape(loc)}: like=: .*float64.*float32"):
        treepack.load(loc, like={"w": np.zeros(3, np.float32), "b": np.zeros(2)})


def test_a_selection_that_matches_nothing_names_the_tree_as_the_user_does(tmp_path):
    # In a repository it named the tree's internal manifest (`…/trees/de0d….json`).
    mgr = treepack.CheckpointManager(tmp_path / "run1")
    mgr.save(9, {"params": {"w": 1}}, blocking=True)
    with pytest.raises(KeyError) as e:
        mgr.restore(9, select=["parms/**"])
    assert f"select matches nothing in {tmp_path / 'run1'}@step-9 " in str(e.value), str(e.value)
    mgr.close()
