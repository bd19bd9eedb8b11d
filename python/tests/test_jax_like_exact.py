"""A JAX researcher's pass (session 46): ``like=`` JAX templates are checked node by node against
the file (a different optimizer's state never loads silently), ``select=`` applies to them, and
``CheckpointManager`` takes JAX steps and refuses steps its retention would delete at once."""

import typing

import numpy as np
import pytest

import treepack

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
optax = pytest.importorskip("optax")


def _adam_checkpoint(tmp_path):
    p = {"w": jnp.ones(3)}
    st = optax.adam(1e-3).init(p)
    st = (st[0]._replace(count=jnp.array(5, jnp.int32), mu={"w": jnp.full(3, 0.25)}), st[1])
    d = str(tmp_path / "ck")
    treepack.save({"params": p, "opt": st}, d)
    return d, p


@pytest.mark.parametrize("tx, message", [
    ("sgd", r"at `opt/0` like= \(optax\S*:EmptyState; the file holds a record of type optax\S*:ScaleByAdamState\) "
            r"has no key 'count', which the file holds \(and 2 more\)"),
    ("momentum", r"at `opt/0` like= has the key 'trace' but the file holds no such key there \(a record of type "
                 r"optax\S*:ScaleByAdamState"),
    ("lion", r"at `opt` the file holds a tuple of 2 items but like= has 3"),
    ("adamw", r"at `opt` the file holds a tuple of 2 items but like= has 3"),
])
def test_a_different_optimizers_state_is_refused_naming_the_place(tmp_path, tx, message):
    d, p = _adam_checkpoint(tmp_path)
    make = {"sgd": lambda: optax.sgd(0.1), "momentum": lambda: optax.sgd(0.1, momentum=0.9),
            "lion": lambda: optax.lion(0.1), "adamw": lambda: optax.adamw(0.1)}[tx]
    with pytest.raises(ValueError, match=message) as e:
        treepack.load(d, like={"params": p, "opt": make().init(p)})
    assert str(e.value).startswith(d + ": like=:")


def test_the_same_optimizers_state_loads_exactly(tmp_path):
    d, p = _adam_checkpoint(tmp_path)
    out = treepack.load(d, like={"params": p, "opt": optax.adam(0.1).init(p)})
    assert type(out["opt"][0]).__name__ == "ScaleByAdamState" and type(out["opt"][1]).__name__ == "EmptyState"
    assert int(out["opt"][0].count) == 5 and out["opt"][0].count.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(out["opt"][0].mu["w"]), np.full(3, 0.25, np.float32))


def test_a_stored_key_the_template_lacks_is_refused_and_none_skips_it(tmp_path):
    d = str(tmp_path / "ck")
    treepack.save({"params": {"w": jnp.ones(3)}, "ema": {"w": jnp.full(3, 2.0)}}, d)
    sds = jax.ShapeDtypeStruct((3,), jnp.float32)
    with pytest.raises(ValueError, match=r"at the root like= has no key 'ema', which the file holds"):
        treepack.load(d, like={"params": {"w": sds}})
    out = treepack.load(d, like={"params": {"w": sds}, "ema": None})
    assert out["ema"] is None and isinstance(out["params"]["w"], jax.Array)
    # An empty container where the file holds more is refused too (nothing under it to check).
    with pytest.raises(ValueError, match=r"at `ema` like= has no key 'w'"):
        treepack.load(d, like={"params": {"w": sds}, "ema": {}})


def test_select_applies_to_a_jax_template(tmp_path):
    d = str(tmp_path / "ck")
    treepack.save({"params": {"w": jnp.ones(3)}, "ema": {"w": jnp.full(3, 2.0)}}, d)
    sds = jax.ShapeDtypeStruct((3,), jnp.float32)
    out = treepack.load(d, like={"params": {"w": sds}, "ema": {"w": sds}}, select=["params/**"])
    assert out["ema"]["w"] is None
    np.testing.assert_array_equal(np.asarray(out["params"]["w"]), np.ones(3, np.float32))
    # What select leaves out, the template may leave out too.
    out = treepack.load(d, like={"params": {"w": sds}}, select="params/**")
    assert set(out) == {"params"}
    with pytest.raises(KeyError, match=r"parms/\*\*.*select matches nothing in"):
        treepack.load(d, like={"params": {"w": sds}, "ema": {"w": sds}}, select=["parms/**"])


class ZA(typing.NamedTuple):
    z: typing.Any
    a: typing.Any


class B(typing.NamedTuple):
    y: typing.Any


def test_template_classes_against_stored_ones(tmp_path):
    d = str(tmp_path / "ck")
    treepack.save({"plain": (jnp.full(2, 9.0), jnp.full(2, 1.0)), "named": ZA(jnp.ones(2), jnp.zeros(2))}, d)
    # A plain tuple in the file takes the template's namedtuple, item by item.
    out = treepack.load(d, like={"plain": ZA(jnp.zeros(2), jnp.zeros(2)), "named": ZA(jnp.zeros(2), jnp.zeros(2))})
    assert type(out["plain"]) is ZA and float(out["plain"].z[0]) == 9.0 and float(out["plain"].a[0]) == 1.0
    # Another class with other fields is refused; a template with the same keys gives its own
    # class (the template's structure), a plain list where the file holds a tuple too.
    with pytest.raises(ValueError, match=r"at `named` like= has the key 'y' but the file holds no such key there"):
        treepack.load(d, like={"plain": (jnp.zeros(2), jnp.zeros(2)), "named": B(jnp.zeros(2))})
    out = treepack.load(d, like={"plain": [jnp.zeros(2), jnp.zeros(2)], "named": {"z": jnp.zeros(2), "a": jnp.zeros(2)}})
    assert type(out["plain"]) is list and type(out["named"]) is dict and float(out["named"]["z"][0]) == 1.0
    with pytest.raises(ValueError, match=r"at `plain` the file holds a tuple of 2 items but like= has a dict"):
        treepack.load(d, like={"plain": {"0": jnp.zeros(2), "1": jnp.zeros(2)}, "named": ZA(jnp.zeros(2), jnp.zeros(2))})


def test_a_train_state_against_dict_templates(tmp_path):
    pytest.importorskip("flax")
    from flax.training import train_state

    state = train_state.TrainState.create(apply_fn=None, params={"w": jnp.ones(2)}, tx=optax.sgd(0.1))
    d = str(tmp_path / "ck")
    treepack.save(state, d, omit_static=True)
    # A dict lacking a field is refused, naming the class it stands for; with every field it
    # gives the dict it is (the template's structure: nothing of the file left out).
    with pytest.raises(ValueError, match=r"at the root like= \(a dict; the file holds a JAX pytree node \S+:TrainState\) "
                                         r"has no key 'opt_state'"):
        treepack.load(d, like={"step": 0, "params": {"w": jnp.ones(2)}})
    as_dict = treepack.load(d, like={"step": 0, "params": {"w": jnp.ones(2)}, "opt_state": state.opt_state})
    assert type(as_dict) is dict and float(as_dict["params"]["w"][0]) == 1.0
    # Untrusted, the refusal says that only like= brings back what omit_static left out.
    with pytest.raises(treepack.UntrustedTypeError, match=r"the node at the root was saved with omit_static=True: its "
                                                          r"static data \(code\) was left out.*like=<an instance>"):
        treepack.load(d)
    back = treepack.load(d, like=state)
    assert int(back.step) == 0 and back.tx is state.tx


def test_orbax_checkpoint_with_a_template_keeps_its_namedtuples(tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    opt = optax.adam(1e-3).init({"w": jnp.ones(3)})
    state = {"opt": opt, "za": ZA(z=jnp.full(2, 9.0), a=jnp.full(2, 1.0))}
    ocp.PyTreeCheckpointer().save(tmp_path / "orb", state)
    back = treepack.load(str(tmp_path / "orb"), like=state)
    assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(state)
    assert type(back["za"]) is ZA and float(back["za"].z[0]) == 9.0


def test_checkpoint_manager_steps_from_jax_and_steps_it_would_delete(tmp_path):
    mgr = treepack.CheckpointManager(str(tmp_path / "run"), keep_last=2)
    mgr.save(jnp.array(10, jnp.int32), {"s": 10}, blocking=True)  # a TrainState's step: a 0-d int array
    mgr.save(np.array(20), {"s": 20}, blocking=True)
    assert mgr.all_steps() == [10, 20]
    with pytest.raises(TypeError, match="a checkpoint step is an int"):
        mgr.save(jnp.array(True), {"s": 1})
    with pytest.raises(TypeError, match="a checkpoint step is an int"):
        mgr.save(jnp.array(30.0), {"s": 1})
    # Older than the two kept: retention would delete it at once; refused, nothing written.
    with pytest.raises(ValueError, match=r"step 5 is older than the 2 newest steps \(10, 20\): keep_last=2 would delete"):
        mgr.save(5, {"s": 5})
    # A fresh manager (a resumed job) knows it from the repository.
    again = treepack.CheckpointManager(str(tmp_path / "run"), keep_last=2)
    with pytest.raises(ValueError, match=r"step 8 is older than the 2 newest steps"):
        again.save(8, {"s": 8})
    assert again.all_steps() == [10, 20]
    # Between the kept ones it is kept (10 goes instead).
    again.save(15, {"s": 15}, blocking=True)
    assert again.all_steps() == [15, 20]
    assert again.restore(jnp.array(20))["s"] == 20
    with pytest.raises(FileNotFoundError, match=r"no step 3 \(the steps kept: 15, 20\)"):
        again.restore(3)
    # keep_every keeps a multiple whatever its age.
    every = treepack.CheckpointManager(str(tmp_path / "run"), keep_last=2, keep_every=4)
    every.save(4, {"s": 4}, blocking=True)
    assert every.all_steps() == [4, 15, 20]


def test_flax_msgpack_files_and_older_orbax_folders_load(tmp_path):
    serialization = pytest.importorskip("flax.serialization")
    from treepack import _core

    params = {"Dense_0": {"kernel": jnp.arange(12.0).reshape(3, 4), "bias": jnp.zeros(4, jnp.bfloat16)}}
    state = {"params": params, "opt": optax.adam(1e-3).init(params), "step": 7, "name": "x",
             "ints": np.arange(3, dtype=np.int16)}
    b = serialization.to_bytes(state)
    (tmp_path / "model.msgpack").write_bytes(b)
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "checkpoint").write_bytes(b)
    # A TensorFlow checkpoint folder's `checkpoint` is text: not taken for one.
    (tmp_path / "tf").mkdir()
    (tmp_path / "tf" / "checkpoint").write_text('model_checkpoint_path: "ckpt-1"\n')
    assert _core.detect_format(str(tmp_path / "model.msgpack")) == "orbax"
    assert _core.detect_format(str(tmp_path / "old")) == "orbax"
    assert _core.detect_format(str(tmp_path / "tf")) == "treepack"
    ref = jax.tree_util.tree_leaves_with_path(serialization.msgpack_restore(b))
    for src in (tmp_path / "model.msgpack", tmp_path / "old"):
        back = dict((jax.tree_util.keystr(p), v) for p, v in jax.tree_util.tree_leaves_with_path(treepack.load(src)))
        assert len(back) == len(ref) >= 9
        for p, v in ref:
            w = back[jax.tree_util.keystr(p)]
            assert np.asarray(v).dtype == np.asarray(w).dtype and np.asarray(v).tobytes() == np.asarray(w).tobytes(), p
        treepack.convert(src, tmp_path / (src.name + ".tpk"))
        assert treepack.load(tmp_path / (src.name + ".tpk"))["step"] == 7
        # flax writes tuples as dicts of "0", "1", ...: the state itself is the template.
        back = treepack.load(src, like=state)
        assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(state)
        assert type(back["opt"][0]).__name__ == "ScaleByAdamState"
    with pytest.raises(ValueError, match=r"model.msgpack: like=: at `opt/0` like= has no key 'count'"):
        treepack.load(tmp_path / "model.msgpack", like={**state, "opt": optax.sgd(0.1).init(params)})


def test_a_stored_frozendict_loads_into_a_dict_template(tmp_path):
    flax_core = pytest.importorskip("flax.core")
    d = str(tmp_path / "ck")
    treepack.save({"v": flax_core.FrozenDict({"params": {"w": jnp.ones(3)}})}, d)
    out = treepack.load(d, like={"v": {"params": {"w": jnp.zeros(3)}}})  # (flax's init gives dicts now)
    assert type(out["v"]) is dict and float(out["v"]["params"]["w"][0]) == 1.0


def test_select_through_a_ref_with_a_template_that_names_only_the_ref(tmp_path):
    d = str(tmp_path / "ck")
    shared = {"w": jnp.full(2, 3.0)}
    treepack.save({"a": shared, "b": shared, "c": jnp.zeros(1)}, d)
    sds = jax.ShapeDtypeStruct((2,), jnp.float32)
    # `a` comes only because `b` refers to it: the template need not name it.
    out = treepack.load(d, like={"b": {"w": sds}}, select=["b/**"])
    assert float(out["b"]["w"][0]) == 3.0 and set(out) == {"b"}
    with pytest.raises(ValueError, match="like= has no key 'c'"):
        treepack.load(d, like={"b": {"w": sds}}, select=["b/**", "c"])


def test_a_failed_save_does_not_count_as_a_step_kept(tmp_path):
    mgr = treepack.CheckpointManager(str(tmp_path / "run"), keep_last=1)
    mgr.save(10, {"s": 10}, blocking=True)
    with pytest.raises(TypeError):
        mgr.save(20, {"s": object()}, blocking=True)  # (refused: nothing committed)
    mgr.save(15, {"s": 15}, blocking=True)  # newer than every step kept
    assert mgr.all_steps() == [15]
