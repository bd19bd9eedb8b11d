"""treepack.jax (issue 54): the calls of jax.experimental.array_serialization.pytree_serialization
on treepack trees. The first part ports JAX's own UserPytreeAPITest (jax-ml/jax,
jax/experimental/array_serialization/serialization_test.py) case by case, with `tree_save` and
`tree_load` made of treepack.jax; where treepack's rules differ from JAX's, the test says so and
asserts treepack's behaviour (docs/jax.md, "Switching from jax.experimental.array_serialization").
The rest: shardings and masks on 8 CPU devices (conftest sets XLA_FLAGS), overwrite rules, typed
keys, futures, and checkpoints JAX's own save wrote.
"""

import asyncio
import dataclasses
import json
import os
import pathlib
import subprocess
import sys
from functools import partial
from typing import Any

import numpy as np
import pytest

import treepack

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import treepack.jax as ser  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P, SingleDeviceSharding  # noqa: E402

if len(jax.devices()) < 8:  # pragma: no cover - conftest asks for 8
    pytest.skip("needs 8 JAX devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)", allow_module_level=True)

TRUST = [__name__ + ".*"]


def dev0():
    return SingleDeviceSharding(jax.devices()[0])


def tree_load(path, **kw):
    return ser.load(path, dev0(), **kw)


tree_save = ser.save


def mesh(shape, axes):
    return Mesh(np.array(jax.devices()[: int(np.prod(shape))]).reshape(shape), axes)


def same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def assert_tree_equal(p1, p2, is_leaf=None):
    """JAX's assertPyTreeEqual, exact: the same structure, leaves of the same type, arrays of the
    same dtype, shape and bytes."""
    leaves1, struct1 = jax.tree.flatten(p1, is_leaf=is_leaf)
    leaves2, struct2 = jax.tree.flatten(p2, is_leaf=is_leaf)
    assert struct1 == struct2
    for a, b in zip(leaves1, leaves2):
        assert isinstance(a, type(b)) and isinstance(b, type(a)), (a, b)
        if isinstance(a, (np.ndarray, jax.Array)):
            assert same(a, b), (a, b)
        else:
            assert a == b


def random(shape, dtype=jnp.float32, seed=0):
    return jax.random.normal(jax.random.key(seed), shape=shape).astype(dtype)


def clean_tree(dtype=jnp.float32):
    r1, r2, r3 = random((), dtype, 1), random((4,), dtype, 2), random((2, 3), dtype, 3)
    return (r1, {"a": r2, "rs": [r1, r2, r3], "c": {"d": {"e": (r2,)}}})


DTYPES = [
    jnp.uint8, jnp.uint16, jnp.uint32, jnp.int8, jnp.int16, jnp.int32, jnp.float8_e4m3fn, jnp.float8_e4m3fnuz,
    jnp.float8_e5m2, jnp.float8_e5m2fnuz, jnp.float8_e4m3b11fnuz, jnp.bfloat16, jnp.float16, jnp.float32,
    jnp.complex64,
]
if jax.config.x64_enabled:  # pragma: no cover - the suite runs without x64, as JAX's does by default
    DTYPES += [jnp.uint64, jnp.int64, jnp.float64, jnp.complex128]


@jax.tree_util.register_pytree_node_class
class CustomNode:
    def __init__(self, a):
        self.a = a

    def tree_flatten(self):
        return (self.a,), None

    @classmethod
    def tree_unflatten(cls, aux_data, children):
        return cls(*children)


@partial(jax.tree_util.register_dataclass, data_fields=["a", "d"], meta_fields=["c"])
@dataclasses.dataclass
class CustomDataclass:
    a: Any
    c: str
    d: Any


@jax.tree_util.register_static
class CustomStatic:
    def __init__(self, a):
        self.a = a


@jax.tree_util.register_static
@dataclasses.dataclass
class StaticP:
    a: Any = 2


@partial(jax.tree_util.register_dataclass, data_fields=["a", "b"], meta_fields=["op"])
@dataclasses.dataclass
class WithArrayMeta:
    a: Any
    b: Any
    op: Any


def _unregister_serialization(*classes):
    """Undo jax.export.register_pytree_node_serialization (JAX's test does the same)."""
    from jax._src.export import _export

    for t in classes:
        if t in _export.serialization_registry:
            name = _export.serialization_registry[t][0]
            del _export.serialization_registry[t]
            del _export.deserialization_registry[name]


# ---------------------------------------------------------------- JAX's UserPytreeAPITest, ported


@pytest.mark.parametrize("tree", [{"a": 1}, [1, 2, 3], (1, 2, 3), 1, 2, 3], ids=str)
def test_save_then_load(tmp_path, tree):
    tree = jax.tree.map(jnp.array, tree)
    tree_save(tree, tmp_path)
    tree2 = tree_load(tmp_path)
    assert_tree_equal(tree, tree2)
    assert all(x.sharding == dev0() for x in jax.tree.leaves(tree2))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_saving_dtype(tmp_path, dtype):
    test_tree = clean_tree(dtype)
    tree_save(test_tree, tmp_path)
    assert_tree_equal(test_tree, tree_load(tmp_path))


def test_do_not_overwrite_noncheckpoint_directories(tmp_path):
    (tmp_path / "hello.txt").write_text("Hello World")
    with pytest.raises(RuntimeError, match="Refusing to work on a directory that is not a previous checkpoint.") as e:
        tree_save({"a": jnp.ones(1)}, tmp_path)
    # Named, with what to do; a ValueError too, as treepack.save's refusal of such a folder is.
    assert str(tmp_path) in str(e.value) and "hello.txt" in str(e.value) and "Remove them" in str(e.value)
    assert isinstance(e.value, ValueError)
    assert sorted(os.listdir(tmp_path)) == ["hello.txt"] and (tmp_path / "hello.txt").read_text() == "Hello World"
    # Beside a checkpoint too: nothing of it is replaced and the file stays.
    tree_save({"a": jnp.ones(1)}, tmp_path / "ckpt")
    (tmp_path / "ckpt" / "notes.txt").write_text("mine")
    with pytest.raises(RuntimeError, match="notes.txt"):
        tree_save({"a": jnp.zeros(1)}, tmp_path / "ckpt")
    assert same(tree_load(tmp_path / "ckpt")["a"], jnp.ones(1))


def test_checkpoint_exists(tmp_path):
    tree_save({"a": jnp.ones(1)}, tmp_path)
    with pytest.raises(ValueError, match="overwrite=False") as e:
        tree_save({"a": jnp.ones(1)}, tmp_path, overwrite=False)
    assert isinstance(e.value, FileExistsError) and str(tmp_path) in str(e.value)
    # overwrite=True (the default) replaces it.
    tree_save({"a": jnp.full(1, 5.0), "b": None}, tmp_path)
    out = tree_load(tmp_path)
    assert same(out["a"], jnp.full(1, 5.0)) and out["b"] is None
    # Any non-empty directory counts, as with JAX; an empty one does not.
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x").write_text("x")
    with pytest.raises(ValueError, match="Files already exist"):
        tree_save({"a": jnp.ones(1)}, tmp_path / "other", overwrite=False)
    (tmp_path / "empty").mkdir()
    tree_save({"a": jnp.ones(1)}, tmp_path / "empty", overwrite=False)
    assert same(tree_load(tmp_path / "empty")["a"], jnp.ones(1))


@pytest.mark.parametrize("test_load_fail", [True, False])
def test_custom_types(tmp_path, test_load_fail):
    magic_value = jnp.ones(()) * 37
    n = CustomNode(magic_value)
    d = CustomDataclass(magic_value, "hello", magic_value + 1)
    tree_to_save = [n, (d,)]
    # JAX saves a register_static node whose aux data is the object itself through the
    # serializer registered for it (pickle, in JAX's test); treepack stores no code and no
    # pickle: refused, naming it.
    with pytest.raises(TypeError, match="CustomStatic"):
        tree_save([n, (d, CustomStatic(magic_value - 1))], tmp_path)
    # JAX needs every custom node registered to save; treepack saves any registered pytree
    # node, and rebuilds it when its class is trusted: registering it for JAX's serialization
    # trusts it, as trust= does.
    tree_save(tree_to_save, tmp_path)
    if test_load_fail:
        with pytest.raises(treepack.UntrustedTypeError) as e:
            tree_load(tmp_path)
        assert set(e.value.types) == {f"{__name__}:CustomNode", f"{__name__}:CustomDataclass"}
        return
    import importlib

    jax_export = importlib.import_module("jax.export")  # (a submodule older JAX does not import with jax)
    for kw in ({"trust": TRUST}, {}):
        if not kw:
            if not hasattr(jax_export, "register_pytree_node_serialization"):
                continue  # a JAX without the registry: trust= alone
            for cls in (CustomNode, CustomDataclass):
                jax_export.register_pytree_node_serialization(
                    cls, serialized_name=cls.__name__, serialize_auxdata=json.dumps, deserialize_auxdata=json.loads)
        try:
            tree2 = tree_load(tmp_path, **kw)
        finally:
            _unregister_serialization(CustomNode, CustomDataclass)
        assert isinstance(tree2[0], CustomNode) and isinstance(tree2[1][0], CustomDataclass)
        assert tree2[0].a == magic_value
        assert tree2[1][0].a == magic_value
        assert tree2[1][0].c == "hello"
        assert tree2[1][0].d == magic_value + 1
    # shardings made of the classes themselves: the result is built from them, no trust needed.
    shardings = [CustomNode(dev0()), (CustomDataclass(dev0(), "hello", dev0()),)]
    tree3 = ser.load(tmp_path, shardings)
    assert tree3[1][0].c == "hello" and tree3[1][0].d == magic_value + 1


def test_flax_frozen_dict(tmp_path):
    FrozenDict = pytest.importorskip("flax.core.frozen_dict").FrozenDict
    tree = FrozenDict(a=1, b=clean_tree())
    tree_save(tree, tmp_path)
    out = tree_load(tmp_path, trust=["flax.*"])
    assert isinstance(out, FrozenDict) and out["a"] == 1
    assert_tree_equal(out["b"], tree["b"])


def test_custom_node_registration(tmp_path):
    # JAX refuses both nodes until a serializer is registered for them. treepack saves the
    # static dataclass as a record (its field is data) and trusts it on load when told to...
    data: list = [jnp.ones(1), {"world": [jnp.zeros(3), (jnp.ones(1), jnp.ones(2))]}, 7 * jnp.ones(()), StaticP()]
    magic_value = -171
    data[-1].a = jnp.array(magic_value)
    tree_save(data, tmp_path)
    with pytest.raises(treepack.UntrustedTypeError, match="StaticP"):
        tree_load(tmp_path)
    ret = tree_load(tmp_path, trust=TRUST)
    assert len(ret) == len(data) and isinstance(ret[-1], StaticP) and ret[-1].a == magic_value
    # ...but a meta field holding an array is static data that is not JSON: refused, naming it;
    # with omit_static=True it is left out, and the class given in shardings supplies it.
    magic_val = 17 * jnp.ones(2)
    data.append(WithArrayMeta(jnp.ones(1), jnp.zeros(2), magic_val))
    with pytest.raises(TypeError, match=r"static .*data of .*WithArrayMeta .*jaxlib"):
        tree_save(data, tmp_path)
    tree_save(data, tmp_path, omit_static=True)
    shardings = [dev0(), dev0(), dev0(), dev0(), WithArrayMeta(dev0(), dev0(), magic_val)]
    ret = ser.load(tmp_path, shardings, trust=TRUST)
    assert len(ret) == len(data) and jnp.linalg.norm(ret[-1].op - magic_val) < 1e-5
    assert same(ret[-1].b, jnp.zeros(2))


def _corrupt_chunk(path, key):
    """Damage the stored bytes of the array at ``key`` (a top-level list index): a load that
    reads them fails its hash check, so a load that succeeds did not read them."""
    m = json.loads((pathlib.Path(path) / "treepack.json").read_text())
    chunk = m["root"][key]["chunks"][0]
    pack = pathlib.Path(path) / m["packs"][chunk["pack"]]["path"]
    raw = bytearray(pack.read_bytes())
    raw[chunk["offset"]] ^= 0xFF
    pack.write_bytes(bytes(raw))


def test_masked_reading(tmp_path):
    data: list = [jnp.ones(1), {"world": [jnp.zeros(3), (jnp.ones(1), jnp.ones(2))]}, 7 * jnp.ones(())]
    tree_save(data, tmp_path)
    for mask in [False, True]:
        ret = tree_load(tmp_path, mask=mask)
        expected = jax.tree.map(lambda x: None if not mask else x, data)
        assert_tree_equal(ret, expected, is_leaf=lambda x: x is None)

    mask = [True, False, False]
    expected = data[:1] + jax.tree.map(lambda x: None, data[1:])
    assert_tree_equal(tree_load(tmp_path, mask=mask), expected, is_leaf=lambda x: x is None)

    mask = [True, True, False]
    expected = data[:2] + jax.tree.map(lambda x: None, data[2:])
    assert_tree_equal(tree_load(tmp_path, mask=mask), expected, is_leaf=lambda x: x is None)

    mask = [True, {"world": [True, (False, True)]}, False]
    data[1]["world"][1] = (None, data[1]["world"][1][1])
    assert_tree_equal(tree_load(tmp_path, mask=mask), expected, is_leaf=lambda x: x is None)
    # (JAX's last case compares against the previous `expected`; the one it means:)
    want = [data[0], {"world": [data[1]["world"][0], (None, jnp.ones(2))]}, None]
    assert_tree_equal(tree_load(tmp_path, mask=mask), want, is_leaf=lambda x: x is None)


def test_masked_out_leaves_are_never_read(tmp_path):
    big = [jnp.arange(50_000, dtype=jnp.float32), jnp.ones(50_000, jnp.float32)]  # stored in packs, not inline
    tree_save(big, tmp_path)
    _corrupt_chunk(tmp_path, 1)
    with pytest.raises(treepack.CorruptError):
        tree_load(tmp_path)
    out = tree_load(tmp_path, mask=[True, False])
    assert same(out[0], big[0]) and out[1] is None


@pytest.mark.parametrize("obj", [b"hello", "hello", 1, 1.0, 1j], ids=repr)
def test_non_array_leaves_are_saved(tmp_path, obj):
    # JAX: "For serialization, all leaves must be either None or jax.Array-like objects" (a
    # TODO there). treepack stores them, and they load as stored.
    data = [{"world": [jnp.zeros(3), (jnp.ones(1), jnp.ones(2))]}, obj]
    tree_save(data, tmp_path)
    out = tree_load(tmp_path)
    assert out[1] == obj and type(out[1]) is type(obj)
    assert_tree_equal(out[0], data[0])
    assert ser.load_pytreedef(tmp_path)[1].kind == type(obj).__name__


def test_load_pytreedef(tmp_path):
    data = [jnp.ones(1), {"world": [jnp.zeros(3), (jnp.ones(1), jnp.ones(2))]}, 7 * jnp.ones(())]
    tree_save(data, tmp_path)
    pytreedef = ser.load_pytreedef(tmp_path)
    expected_pytreedef = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), data)
    assert_tree_equal(pytreedef, expected_pytreedef)


@pytest.mark.parametrize("data", [
    None, [None], [None, np.ones(())],
    [None, {"world": [None, (np.ones(1), np.ones(2))]}, np.ones(())],
    [None, {"world": [np.zeros(3), (None, np.ones(2))]}, None],
], ids=str)
def test_save_and_load_null_leaves(tmp_path, data):
    data = jax.tree.map(lambda x: jnp.array(x, dtype=jnp.float32), data)
    tree_save(data, tmp_path)
    pytreedef = ser.load_pytreedef(tmp_path)
    is_leaf = lambda x: x is None  # noqa: E731
    expected_pytreedef = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype) if x is not None else x, data, is_leaf=is_leaf)
    assert_tree_equal(pytreedef, expected_pytreedef)
    load_data = tree_load(tmp_path)
    load_leaves, load_struct = jax.tree.flatten(load_data, is_leaf=is_leaf)
    expected_leaves, expected_struct = jax.tree.flatten(data, is_leaf=is_leaf)
    assert load_struct == expected_struct
    assert len(load_leaves) == len(expected_leaves)
    for l1, l2 in zip(load_leaves, expected_leaves):
        if l1 is None:
            assert l2 is None
        else:
            assert same(l1, l2)


def test_ts_specs_do_not_apply(tmp_path):
    # JAX's test_custom_ts_specs: tensorstore specs are JAX's storage; treepack has its own.
    data = [jnp.ones(()), (jnp.zeros(()), jnp.ones(())), None]
    with pytest.raises(TypeError, match="ts_specs"):
        tree_save(data, tmp_path, ts_specs={"driver": "zarr"})
    tree_save(data, tmp_path, ts_specs=None)
    with pytest.raises(TypeError, match="ts_specs"):
        tree_load(tmp_path, ts_specs={"driver": "zarr"})
    assert_tree_equal(tree_load(tmp_path, ts_specs=None), data, is_leaf=lambda x: x is None)


def test_save_load_future_printable(tmp_path):
    data = [jnp.ones(())]
    save_fut = ser.nonblocking_save(data, tmp_path)
    assert "PyTreeFuture(done=" in str(save_fut) and "ShapeDtypeStruct(shape=(), dtype=float32)" in str(save_fut)
    assert save_fut.pytree == [jax.ShapeDtypeStruct((), jnp.float32)]
    info = save_fut.result()
    assert save_fut.done() and info.arrays == 1 and "done=True" in str(save_fut)
    load_fut = ser.nonblocking_load(tmp_path, shardings=dev0())
    assert load_fut.pytree == [jax.ShapeDtypeStruct((), jnp.float32)]
    str(load_fut)
    assert_tree_equal(load_fut.result(), data)


def test_format_alone_not_supported(tmp_path):
    data = jnp.arange(16 * 16, dtype=jnp.bfloat16).reshape((16, 16))
    data = jax.device_put(data, NamedSharding(mesh((1, 1), ("x", "y")), P("x", None)))
    tree_save(data, tmp_path)
    with pytest.raises(NotImplementedError, match="Deserialization with `Format` instead of `Sharding` is not currently supported."):
        ser.load(tmp_path, shardings=data.format)


def test_formats_support(tmp_path):
    data = jnp.arange(16 * 16, dtype=jnp.float32).reshape((16, 16))
    data_bf16_format = jnp.arange(16 * 16, dtype=jnp.bfloat16).reshape((16, 16)).format
    data = jax.device_put(data, NamedSharding(mesh((1, 1), ("x", "y")), P("x", None)))
    tree_save(data, tmp_path)
    out = ser.load(tmp_path, shardings=jax.ShapeDtypeStruct(data.shape, jnp.bfloat16, sharding=data_bf16_format))
    assert out.dtype == jnp.bfloat16 and same(out, data.astype(jnp.bfloat16))


# ---------------------------------------------------------------- shardings on 8 devices


def _params():
    x = jnp.arange(64 * 32, dtype=jnp.float32).reshape(64, 32)
    return {
        "params": {"w": jax.device_put(x, NamedSharding(mesh((8,), ("d",)), P("d"))), "b": jnp.arange(32.0)},
        "opt": (jnp.ones((64, 32)), None),
        "step": jnp.int32(7),
    }


def test_one_sharding_for_every_array(tmp_path):
    tree = _params()
    tree_save(tree, tmp_path, chunk_bytes=1024)
    for s in (NamedSharding(mesh((4,), ("d",)), P()), NamedSharding(mesh((2, 2), ("a", "b")), P())):
        out = ser.load(tmp_path, s)
        assert_tree_equal(out, tree, is_leaf=lambda x: x is None)
        assert all(x.sharding == s for x in jax.tree.leaves(out))


def test_a_prefix_tree_of_shardings_places_each_subtree(tmp_path):
    tree = _params()
    tree_save(tree, tmp_path, chunk_bytes=1024)
    rows = NamedSharding(mesh((4,), ("d",)), P("d"))
    cols = NamedSharding(mesh((2, 2), ("a", "b")), P(None, ("a", "b")))
    shardings = {"params": {"w": cols, "b": rows}, "opt": rows, "step": dev0()}
    out = ser.load(tmp_path, shardings)
    assert out["params"]["w"].sharding == cols and out["params"]["b"].sharding == rows
    assert out["opt"][0].sharding == rows and out["opt"][1] is None and out["step"].sharding == dev0()
    for sh in out["params"]["w"].addressable_shards:
        assert same(sh.data, np.asarray(tree["params"]["w"])[sh.index])
    assert_tree_equal(out, tree, is_leaf=lambda x: x is None)


def test_shape_dtype_structs_cast_and_place(tmp_path):
    tree = _params()
    tree_save(tree, tmp_path)
    s = NamedSharding(mesh((8,), ("d",)), P("d"))
    # A prefix struct: its dtype and sharding for each array below it (each keeps its own shape,
    # as with JAX; the struct's shape only has to suit its sharding).
    prefix = jax.ShapeDtypeStruct((8,), jnp.bfloat16, sharding=s)
    out = ser.load(tmp_path, {"params": prefix, "opt": dev0(), "step": None})
    assert out["params"]["w"].dtype == jnp.bfloat16 and out["params"]["w"].sharding == s
    assert same(out["params"]["b"], tree["params"]["b"].astype(jnp.bfloat16))
    assert out["step"].sharding == jax.sharding.SingleDeviceSharding(jax.devices()[0])  # None: the default device
    # The full tree, as jax.eval_shape gives it with shardings added: the same.
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.float16, sharding=dev0()), tree)
    out = ser.load(tmp_path, abstract)
    assert all(x.dtype == jnp.float16 for x in jax.tree.leaves(out))
    assert same(out["opt"][0], jnp.ones((64, 32), jnp.float16)) and out["step"] == 7
    # At an array itself, its shape must be the stored one (JAX ignores it; treepack refuses).
    abstract["params"]["w"] = jax.ShapeDtypeStruct((32, 64), jnp.float32, sharding=dev0())
    with pytest.raises(ValueError, match=r"params/w.*shape \(64, 32\)"):
        ser.load(tmp_path, abstract)


def test_shardings_that_do_not_fit_are_named(tmp_path):
    tree_save(_params(), tmp_path)
    with pytest.raises(ValueError, match=r"shardings at `params` has the keys \['w'\].*\['b', 'w'\]"):
        ser.load(tmp_path, {"params": {"w": dev0()}, "opt": dev0(), "step": dev0()})
    with pytest.raises(ValueError, match=r"shardings has a list at `opt`.*a tuple"):
        ser.load(tmp_path, {"params": dev0(), "opt": [dev0(), dev0()], "step": dev0()})
    with pytest.raises(ValueError, match=r"shardings has a dict at `step`.*an array"):
        ser.load(tmp_path, {"params": dev0(), "opt": dev0(), "step": {"x": dev0()}})
    with pytest.raises(TypeError, match=r"shardings at `opt` is a builtins.str"):
        ser.load(tmp_path, {"params": dev0(), "opt": "cpu", "step": dev0()})
    with pytest.raises(ValueError, match=r"mask at `params` has the keys \['x'\]"):
        ser.load(tmp_path, dev0(), mask={"params": {"x": True}, "opt": True, "step": True})
    with pytest.raises(ValueError, match=r"^treepack.jax.load: at `params/(w|b)` the sharding does not fit"):
        ser.load(tmp_path, {"params": NamedSharding(mesh((3,), ("d",)), P("d")), "opt": dev0(), "step": dev0()})


def test_mask_and_shardings_together(tmp_path):
    tree = _params()
    tree_save(tree, tmp_path)
    s = NamedSharding(mesh((2,), ("d",)), P("d"))
    out = ser.load(tmp_path, {"params": s, "opt": dev0(), "step": dev0()},
                   mask={"params": {"w": True, "b": False}, "opt": False, "step": True})
    assert out["params"]["b"] is None and out["opt"] == (None, None) and out["step"] == 7
    assert out["params"]["w"].sharding == s and same(out["params"]["w"], tree["params"]["w"])


def test_typed_keys_stay_keys_on_the_sharding(tmp_path):
    keys = {"fry": jax.random.split(jax.random.key(0), 8), "rbg": jax.random.key(1, impl="rbg"),
            "raw": jax.random.PRNGKey(3)}
    tree_save(keys, tmp_path)
    s = NamedSharding(mesh((8,), ("d",)), P("d"))
    out = ser.load(tmp_path, {"fry": s, "rbg": dev0(), "raw": dev0()})
    assert out["fry"].sharding == s and str(jax.random.key_impl(out["fry"])) == "threefry2x32"
    assert same(jax.random.key_data(out["fry"]), jax.random.key_data(keys["fry"]))
    assert str(jax.random.key_impl(out["rbg"])) == "rbg"
    assert out["raw"].dtype == jnp.uint32 and same(out["raw"], keys["raw"])  # old-style keys are arrays
    abstract = ser.load_pytreedef(tmp_path)
    assert abstract["fry"] == jax.eval_shape(lambda: keys["fry"])
    assert abstract["rbg"] == jax.eval_shape(lambda: keys["rbg"])
    assert abstract["raw"] == jax.ShapeDtypeStruct((2,), jnp.uint32)
    # load_pytreedef's tree as shardings: keys of each impl come back as such, on the default device.
    again = ser.load(tmp_path, abstract)
    assert str(jax.random.key_impl(again["rbg"])) == "rbg" and same(jax.random.key_data(again["rbg"]), jax.random.key_data(keys["rbg"]))
    assert same(jax.random.key_data(again["fry"]), jax.random.key_data(keys["fry"])) and same(again["raw"], keys["raw"])


def test_records_and_namedtuples_need_trust_or_a_template(tmp_path):
    import collections

    NT = collections.namedtuple("NT", "x y")
    tree = {"nt": NT(jnp.ones(2), None), "n": None}
    tree_save(tree, tmp_path)
    with pytest.raises(treepack.UntrustedTypeError):
        tree_load(tmp_path)
    structure = ser.load_pytreedef(tmp_path)
    assert isinstance(structure["nt"], treepack.StructNode) and structure["nt"]["x"] == jax.ShapeDtypeStruct((2,), jnp.float32)
    out = ser.load(tmp_path, {"nt": NT(dev0(), None), "n": None})  # the class from the template
    assert isinstance(out["nt"], NT) and same(out["nt"].x, jnp.ones(2)) and out["nt"].y is None
    # Masked out, a record is not built (nothing of it is loaded), so it needs no trust.
    assert tree_load(tmp_path, mask={"nt": False, "n": True}) == {"nt": None, "n": None}


# ---------------------------------------------------------------- saving: files, futures


def test_overwriting_a_checkpoint_jax_wrote(tmp_path):
    pytest.importorskip("tensorstore")  # JAX's own writer needs it (the wheel venvs have none)
    from jax.experimental.array_serialization import pytree_serialization as jax_ser

    jax_ser.save({"a": jnp.arange(3.0)}, tmp_path)
    assert "pytreedef.json" in os.listdir(tmp_path)
    tree_save({"b": jnp.ones(2)}, tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["treepack.json"]
    assert_tree_equal(tree_load(tmp_path), {"b": jnp.ones(2)})
    # With a file of someone else's beside it: refused, nothing removed.
    other = tmp_path / "jax2"
    jax_ser.save({"a": jnp.arange(3.0)}, other)
    (other / "README").write_text("keep")
    with pytest.raises(RuntimeError, match="README"):
        tree_save({"b": jnp.ones(2)}, other)
    assert sorted(os.listdir(other)) == ["README", "array_store", "pytreedef.json"]


def test_any_treepack_location(tmp_path):
    tree = {"w": jnp.arange(6.0), "n": None}
    f = tmp_path / "ckpt.tpk"  # one file
    tree_save(tree, f)
    assert f.is_file()
    with pytest.raises(ValueError, match="overwrite=False") as e:
        tree_save(tree, f, overwrite=False)
    assert isinstance(e.value, FileExistsError)
    tree_save({"w": jnp.ones(2)}, f)
    assert_tree_equal(ser.load(f, None), {"w": jnp.ones(2)})  # None: the default device
    assert ser.load_pytreedef(f) == {"w": jax.ShapeDtypeStruct((2,), jnp.float32)}


def test_nonblocking_save_errors_come_from_result(tmp_path):
    (tmp_path / "hello.txt").write_text("x")
    fut = ser.nonblocking_save({"a": jnp.ones(1)}, tmp_path)
    with pytest.raises(RuntimeError, match="Refusing to work on a directory"):
        fut.result()
    assert fut.done() and isinstance(fut.exception(), RuntimeError)
    with pytest.raises(FileNotFoundError):
        ser.nonblocking_load(tmp_path / "missing", dev0())  # the structure is read at once, as JAX's


def test_futures_can_be_awaited(tmp_path):
    tree = {"w": jnp.arange(10.0), "k": [jnp.ones(3), None]}

    async def main():
        await ser.nonblocking_save(tree, tmp_path)
        return await ser.nonblocking_load(tmp_path, dev0())

    assert_tree_equal(asyncio.run(main()), tree, is_leaf=lambda x: x is None)


def test_treepack_options_pass_through(tmp_path):
    tree = {"w": jnp.zeros((256, 256))}
    info = tree_save(tree, tmp_path, compression="zstd", metadata={"step": 3})
    assert info.bytes_written < 256 * 256 * 4 // 4
    assert_tree_equal(tree_load(tmp_path, verify=True), tree)
    assert_tree_equal(treepack.load(tmp_path), tree)  # an ordinary treepack tree
    with pytest.raises(TypeError, match="select="):
        tree_load(tmp_path, select=["w"])


def test_import_treepack_jax_imports_no_jax():
    code = "import sys, treepack.jax, treepack; print('jax' in sys.modules, 'treepack.integrations.jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


# ---------------------------------------------------------------- checkpoints JAX's own save wrote
#
# These need treepack's reader for JAX's checkpoints (format "jax": pytreedef.json and
# array_store/), which treepack.load and treepack.load_structure use; treepack.jax adds nothing.


def test_reads_a_checkpoint_jax_wrote(tmp_path):
    pytest.importorskip("tensorstore")  # JAX's own writer needs it (the wheel venvs have none)
    from jax.experimental.array_serialization import pytree_serialization as jax_ser

    x = jax.device_put(jnp.arange(64.0).reshape(8, 8), NamedSharding(mesh((4,), ("d",)), P("d")))
    data = {"a": x, "b": [jnp.ones((2, 3), jnp.bfloat16), None], "c": (jnp.int32(4),)}
    jax_ser.save(data, tmp_path)
    want = jax_ser.load_pytreedef(tmp_path)
    assert_tree_equal(ser.load_pytreedef(tmp_path), want, is_leaf=lambda x: x is None)
    s = NamedSharding(mesh((2,), ("d",)), P(None, "d"))
    out = ser.load(tmp_path, {"a": s, "b": dev0(), "c": dev0()}, mask={"a": True, "b": [False, True], "c": True})
    assert out["a"].sharding == s and same(out["a"], x)
    assert out["b"] == [None, None] and same(out["c"][0], jnp.int32(4))
    assert_tree_equal(tree_load(tmp_path), jax_ser.load(tmp_path, dev0()), is_leaf=lambda x: x is None)
