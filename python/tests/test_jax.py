"""JAX (issue 28): jax.Array leaves with shardings, typed PRNG keys, pytree containers (flax,
optax), loading onto any sharding, non-blocking saves in a training loop.

Runs against real jax, flax and optax (installed into .venv by scripts/python-env.sh) on 8 CPU
devices (conftest sets XLA_FLAGS). The wheel test venvs do not install them: skipped there.
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import treepack

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
flax = pytest.importorskip("flax")
optax = pytest.importorskip("optax")

from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

if len(jax.devices()) < 8:  # pragma: no cover - conftest asks for 8
    pytest.skip("needs 8 JAX devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)", allow_module_level=True)


def mesh(shape, axes):
    n = int(np.prod(shape))
    return Mesh(np.array(jax.devices()[:n]).reshape(shape), axes)


def manifest(path):
    return json.load(open(os.path.join(path, "treepack.json")))


def node(m, *keys):
    n = m["root"]
    for k in keys:
        n = n[k]  # dicts of string keys are JSON objects (format 1.4)
    return n


def same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# ---------------------------------------------------------------- leaves


def test_arrays_of_every_dtype_round_trip_as_jax_arrays(loc):
    tree = {
        "f32": jnp.arange(12.0, dtype=jnp.float32).reshape(3, 4),
        "bf16": jnp.linspace(-2, 2, 7, dtype=jnp.bfloat16),
        "f16": jnp.ones(3, jnp.float16),
        "f8": jnp.array([0.5, -1.0, 448.0], jnp.float8_e4m3fn),
        "f8b": jnp.array([1.0, 2.0], jnp.float8_e5m2),
        "i8": jnp.array([-1, 2], jnp.int8),
        "u32": jnp.array([1, 2**32 - 1], jnp.uint32),
        "b": jnp.array([True, False]),
        "c64": jnp.array([1 + 2j], jnp.complex64),
        "scalar": jnp.float32(3.5),
        "empty": jnp.zeros((0, 3)),
        "int": jnp.int32(7),
    }
    treepack.save(tree, loc)
    out = treepack.load(loc)
    for k, v in tree.items():
        assert isinstance(out[k], jax.Array), k
        assert same(out[k], v), k
    m = manifest(loc)
    assert node(m, "bf16")["as"] == {"type": "jax.Array"} and node(m, "bf16")["dtype"] == "bfloat16"
    assert m["version"] == [1, 4]  # annotations (1.3), dicts as objects (1.4)
    # A reader without the JAX layer sees plain arrays (open() reads numpy).
    assert isinstance(treepack.open(loc)["f32"][1:], np.ndarray)


def test_sharded_arrays_record_their_sharding_and_chunks_tile_the_shards(loc):
    m8 = mesh((4, 2), ("data", "model"))
    x = jax.device_put(jnp.arange(512 * 256, dtype=jnp.float32).reshape(512, 256), NamedSharding(m8, P("data", "model")))
    r = jax.device_put(jnp.ones((64, 64)), NamedSharding(m8, P()))  # replicated
    treepack.save({"x": x, "r": r}, loc, chunk_bytes=16 * 1024)
    m = manifest(loc)
    nx = node(m, "x")
    assert nx["as"]["sharding"] == {"mesh": {"axes": ["data", "model"], "shape": [4, 2]}, "spec": ["data", "model"]}
    shard = x.sharding.shard_shape(x.shape)  # (128, 128)
    cs = nx["chunk_shape"]
    assert all(s % c == 0 for s, c in zip(shard, cs)), (shard, cs)
    assert cs[0] * cs[1] * 4 <= 16 * 1024
    assert node(m, "r")["as"]["sharding"]["spec"] == []
    out = treepack.load(loc)
    assert same(out["x"], x) and same(out["r"], r)
    assert len(out["x"].devices()) == 1  # without like=: one device


def test_typed_prng_keys_come_back_as_keys(loc):
    keys = {"fry": jax.random.key(0), "rbg": jax.random.key(1, impl="rbg"), "many": jax.random.split(jax.random.key(2), 4),
            "raw": jax.random.PRNGKey(3)}
    treepack.save(keys, loc)
    out = treepack.load(loc)
    for k in ("fry", "rbg", "many"):
        assert jax.dtypes.issubdtype(out[k].dtype, jax.dtypes.prng_key), k
        assert str(jax.random.key_impl(out[k])) == str(jax.random.key_impl(keys[k]))
        assert same(jax.random.key_data(out[k]), jax.random.key_data(keys[k]))
    assert same(jax.random.normal(out["fry"], (3,)), jax.random.normal(keys["fry"], (3,)))
    assert out["raw"].dtype == jnp.uint32 and same(out["raw"], keys["raw"])  # old-style keys are arrays
    assert node(manifest(loc), "fry")["as"] == {"impl": "threefry2x32", "type": "jax.random.key"}


# ---------------------------------------------------------------- like=: shardings


def test_load_onto_another_mesh_and_partition_spec(loc):
    x = jax.device_put(jnp.arange(64 * 32, dtype=jnp.float32).reshape(64, 32), NamedSharding(mesh((8,), ("d",)), P("d")))
    treepack.save({"x": x, "step": 3}, loc, chunk_bytes=1024)
    cases = [
        NamedSharding(mesh((4,), ("d",)), P("d")),  # 8 -> 4 devices
        NamedSharding(mesh((2, 2), ("a", "b")), P("b", "a")),  # another spec
        NamedSharding(mesh((8,), ("d",)), P(None, "d")),  # the other axis
        NamedSharding(mesh((4,), ("d",)), P()),  # replicated
    ]
    for s in cases:
        out = treepack.load(loc, like={"x": jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), "step": True})
        assert out["x"].sharding == s
        assert same(out["x"], x)
        assert out["step"] == 3
        for sh in out["x"].addressable_shards:
            assert same(sh.data, np.asarray(x)[sh.index])
    # A jax.Array in like= gives its sharding; a different dtype casts.
    target = jax.device_put(jnp.zeros((64, 32), jnp.bfloat16), NamedSharding(mesh((2,), ("d",)), P("d")))
    out = treepack.load(loc, like={"x": target, "step": None})
    assert out["x"].dtype == jnp.bfloat16 and out["x"].sharding == target.sharding and out["step"] is None
    assert same(out["x"], x.astype(jnp.bfloat16))


def test_replicated_load_reads_each_chunk_once(loc):
    x = np.arange(256 * 64, dtype=np.float32).reshape(256, 64)
    treepack.save({"x": x}, loc, chunk_bytes=8 * 1024)
    r = treepack.open(loc)._r
    s = NamedSharding(mesh((8,), ("d",)), P())  # every device holds the whole array
    before = r.io_stats()
    out = jax.make_array_from_callback  # noqa: F841 (the load below goes through it)
    from treepack.integrations import jax as tpjax
    from treepack._api import _struct_node
    from treepack import _codec

    st = r.structure(_struct_node)
    got = tpjax._read_target(r, st["x"], jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), "`x`", _codec.np_dtype)
    after = r.io_stats()
    assert same(got, x) and len(got.addressable_shards) == 8
    assert after[0] - before[0] == x.nbytes  # bytes read: the array once, not 8 times
    # A row-sharded load reads each device's rows: again each byte once.
    before = r.io_stats()
    s = NamedSharding(mesh((8,), ("d",)), P("d"))
    got = tpjax._read_target(r, st["x"], jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), "`x`", _codec.np_dtype)
    assert r.io_stats()[0] - before[0] == x.nbytes and same(got, x)


def test_like_mismatches_name_the_key_path(loc):
    treepack.save({"p": {"w": jnp.ones((4, 2))}, "names": ["a"]}, loc)
    s = NamedSharding(mesh((2,), ("d",)), P("d"))
    with pytest.raises(ValueError, match=r"at `p/w` the file holds float32 with shape \(4, 2\).*shape \(2, 4\); a load can cast dtypes but not change shapes"):
        treepack.load(loc, like={"p": {"w": jax.ShapeDtypeStruct((2, 4), jnp.float32, sharding=s)}, "names": None})
    with pytest.raises(ValueError, match=r"at `names/0` like= has a JAX array but the file holds a str leaf"):
        treepack.load(loc, like={"p": None, "names": [jax.ShapeDtypeStruct((1,), jnp.float32)]})
    with pytest.raises(ValueError, match=r"at `p` like= has the key 'v' but the file holds no such key there \(a dict with \['w'\]\)"):
        treepack.load(loc, like={"p": {"v": jax.ShapeDtypeStruct((4, 2), jnp.float32)}, "names": None})
    with pytest.raises(ValueError, match=r"at `p/w` the sharding does not fit the stored shape \(4, 2\).*partitioned 8 times"):
        bad = NamedSharding(mesh((8,), ("d",)), P("d"))  # 4 rows cannot be split 8 ways
        treepack.load(loc, like={"p": {"w": jax.ShapeDtypeStruct((4, 2), jnp.float32, sharding=bad)}, "names": None})


# ---------------------------------------------------------------- pytree containers


def test_flax_and_optax_containers_round_trip_when_trusted(loc):
    from flax import nnx
    from flax.core import FrozenDict

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.lin = nnx.Linear(4, 3, rngs=rngs)
            self.bn = nnx.BatchNorm(3, rngs=rngs)

        def __call__(self, x):
            return self.bn(self.lin(x))

    model = Net(nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    params = {"dense": {"kernel": jnp.ones((4, 3)), "bias": jnp.zeros(3)}}
    opt = optax.adamw(1e-3).init(params)
    tree = {"frozen": FrozenDict({"a": jnp.ones(2), "b": {"c": 1}}), "state": state, "opt": opt}
    treepack.save(tree, loc)
    with pytest.raises(treepack.UntrustedTypeError) as e:
        treepack.load(loc)
    for name in ("flax.core.frozen_dict:FrozenDict", "flax.nnx.statelib:State", "flax.nnx.variablelib:Param",
                 "optax._src.transform:ScaleByAdamState"):
        assert name in str(e.value)
    out = treepack.load(loc, trust=["flax.*", "optax.*"])
    assert type(out["frozen"]) is FrozenDict and out["frozen"]["b"]["c"] == 1
    assert jax.tree.structure(out["state"]) == jax.tree.structure(state)
    assert jax.tree.structure(out["opt"]) == jax.tree.structure(opt)
    assert all(same(a, b) for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(tree)))
    restored = nnx.merge(graphdef, out["state"])
    x = jnp.ones((2, 4))
    assert same(restored(x), model(x))
    # Key paths are the pytree keys: structure reads and select see inside the containers.
    st = treepack.load_structure(loc)
    assert st["state"].type_name == "jax.pytree" and st["state"].data["class"] == "flax.nnx.statelib:State"
    assert st["state"].children["lin"]["kernel"].children["value"].path == "state/lin/kernel/value"
    part = treepack.load(loc, select=["state/lin/**"], trust=["flax.*", "optax.*"])
    assert same(part["state"]["lin"]["kernel"].value, state["lin"]["kernel"].value)
    assert jax.tree.leaves(part["opt"]) == [] and part["frozen"] is None


def _train_state():
    import flax.linen as nn
    from flax.training import train_state

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(2)(nn.relu(nn.Dense(8)(x)))

    model = MLP()
    params = model.init(jax.random.key(0), jnp.ones((1, 4)))
    return train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-2))


def _step(state, x, y):
    def loss(p):
        return jnp.mean((state.apply_fn(p, x) - y) ** 2)

    return state.apply_gradients(grads=jax.grad(loss)(state.params))


def test_train_state_code_fields_are_refused_then_omitted_and_restored_from_like(loc):
    state = _train_state()
    with pytest.raises(TypeError, match=r"TrainState holds code.*apply_fn \(a bound method Module.apply\), tx .*omit_static=True.*like="):
        treepack.save(state, loc)
    x, y = jax.random.normal(jax.random.key(1), (16, 4)), jnp.ones((16, 2))
    for _ in range(3):
        state = _step(state, x, y)
    treepack.save(state, loc, omit_static=True)
    # Without a template the type cannot be rebuilt (its static data was left out): said so.
    with pytest.raises(LookupError, match=r"TrainState.*omit_static=True.*like="):
        treepack.load(loc, trust=["flax.*", "optax.*"])
    fresh = _train_state()
    back = treepack.load(loc, like=fresh)  # no trust needed: the template's classes are used
    assert type(back) is type(state) and back.apply_fn is fresh.apply_fn and back.tx is fresh.tx
    assert int(back.step) == 3
    assert all(same(a, b) for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(state)))
    # Training resumes identically.
    assert all(same(a, b) for a, b in zip(jax.tree.leaves(_step(back, x, y)), jax.tree.leaves(_step(state, x, y))))
    # An abstract template (jax.eval_shape) onto a mesh: each leaf gets the template's sharding.
    rep = NamedSharding(mesh((4,), ("d",)), P())
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=rep), jax.eval_shape(lambda: fresh))
    back = treepack.load(loc, like=abstract)
    assert all(leaf.sharding == rep for leaf in jax.tree.leaves(back))


def test_untrusted_load_with_placeholders_keeps_the_children(loc):
    from flax.core import FrozenDict

    treepack.save({"f": FrozenDict({"w": jnp.ones(2)})}, loc)
    out = treepack.load(loc, on_missing="placeholder")
    assert isinstance(out["f"], treepack.Unloadable) and same(out["f"].data["w"], jnp.ones(2))


# ---------------------------------------------------------------- non-blocking saves


def test_background_save_of_donated_arrays_keeps_the_saved_values(loc):
    x = jnp.arange(1 << 16, dtype=jnp.float32)
    expect = np.asarray(x).copy()
    h = treepack.save({"x": x}, loc, blocking=False)
    step = jax.jit(lambda a: a * 2, donate_argnums=0)
    y = step(x)  # the save holds x's buffer: it is not reused, nothing is lost
    h.result()
    assert same(treepack.load(loc)["x"], expect) and same(y, expect * 2)


# ---------------------------------------------------------------- without jax


def _run(code, env_extra=None):
    env = {**os.environ, **(env_extra or {})}
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_loading_without_jax_names_the_leaves_or_gives_numpy(loc):
    treepack.save({"w": jnp.ones(3), "k": jax.random.key(0), "n": np.ones(2)}, loc)
    out = _run(f"""
        import sys
        sys.modules["jax"] = None  # jax cannot be imported
        import treepack
        try:
            treepack.load({loc!r})
        except ImportError as e:
            print("ERR", e)
        out = treepack.load({loc!r}, on_missing="placeholder")
        print(type(out["w"]).__name__, out["k"].dtype, out["k"].shape)
    """)
    assert "ERR this tree holds 2 JAX array(s) (`w`, `k`)" in out and "pip install jax" in out
    assert "ndarray uint32 (2,)" in out


def test_numpy_true_gives_numpy_arrays_without_importing_jax(loc):
    treepack.save({"w": jnp.ones((2, 3), jnp.bfloat16), "k": jax.random.key(0)}, loc)
    out = _run(f"""
        import sys, treepack
        out = treepack.load({loc!r}, numpy=True)
        print(type(out["w"]).__name__, out["w"].dtype, out["k"].dtype, out["k"].shape, "jax" in sys.modules)
    """)
    assert out.strip() == "ndarray bfloat16 uint32 (2,) False"


def test_a_tree_without_jax_leaves_never_imports_jax(loc):
    treepack.save({"w": np.ones(3), "s": "x"}, loc)
    out = _run(f"""
        import sys, treepack
        treepack.load({loc!r}); treepack.load_structure({loc!r})
        print("jax" in sys.modules)
    """)
    assert out.strip() == "False"


# ---------------------------------------------------------------- multi-process (real processes)

WORKER = os.path.join(os.path.dirname(__file__), "jax_worker.py")


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _job(nproc, loc, mode, timeout=240, env_extra=None):
    """Run `nproc` worker processes of one JAX job; returns [(returncode, output)] by process."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS",)}
    env.update(env_extra or {})
    procs = [
        subprocess.Popen([sys.executable, WORKER, str(i), str(nproc), str(port), loc, mode], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i in range(nproc)
    ]
    out = []
    try:
        for p in procs:
            text, _ = p.communicate(timeout=timeout)
            out.append((p.returncode, text))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def _expected(n_devices):
    return {
        "w": np.arange(n_devices * 8 * 6, dtype=np.float32).reshape(n_devices * 8, 6),
        "m": (np.arange(n_devices * 4 * 8, dtype=np.int32).reshape(n_devices * 4, 8) * 3),
        "r": np.linspace(0, 1, 10, dtype=np.float32),
        "bf": np.arange(16 * n_devices, dtype=np.float32).astype(jnp.bfloat16).reshape(n_devices, 16),
    }


@pytest.mark.parametrize("nproc", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_processes_of_a_jax_job_save_one_checkpoint(tmp_path, nproc):
    loc = str(tmp_path / "ckpt")
    res = _job(nproc, loc, "save")
    for i, (rc, text) in enumerate(res):
        assert rc == 0, f"process {i}:\n{text[-3000:]}"
        assert f"SAVED {i}" in text and f"LOADED {i}" in text  # each process loaded its shards onto another mesh
    # One tree: every process wrote packs, one manifest names them all.
    m = manifest(loc)
    assert len(m["packs"]) == nproc and m["stats"]["parts"] == nproc
    e = _expected(2 * nproc)
    # A single process (8 devices here) loads it onto a mesh of its own: identical values.
    s = NamedSharding(mesh((2, 4), ("a", "b")), P("b")) if nproc == 4 else NamedSharding(mesh((4,), ("d",)), P("d"))
    out = treepack.load(loc, like={
        "params": {"w": jax.ShapeDtypeStruct(e["w"].shape, jnp.float32, sharding=s), "m": True},
        "r": True, "bf": True, "step": True, "name": True,
    })
    assert same(out["params"]["w"], e["w"]) and out["params"]["w"].sharding == s
    assert same(out["params"]["m"], e["m"]) and same(out["r"], e["r"]) and same(out["bf"], e["bf"])
    assert out["step"] == 7 and out["name"] == "run"
    w = node(m, "params")
    assert w["w"]["as"]["sharding"] == {"mesh": {"axes": ["d"], "shape": [2 * nproc]}, "spec": ["d"]}
    assert treepack.verify(loc).ok


def test_a_background_multi_process_save_to_an_object_store(s3):
    # Every process writes its packs to (moto) S3 and returns at once; process 0 commits.
    loc = "s3://bucket/jax/mp"
    env = {"AWS_ENDPOINT_URL": s3["endpoint"], "AWS_REGION": s3["region"], "AWS_ACCESS_KEY_ID": s3["aws_access_key_id"],
           "AWS_SECRET_ACCESS_KEY": s3["aws_secret_access_key"], "TREEPACK_TEST_BACKGROUND": "1"}
    res = _job(2, loc, "save", env_extra=env)
    for i, (rc, text) in enumerate(res):
        assert rc == 0 and f"LOADED {i}" in text, f"process {i}:\n{text[-3000:]}"
    e = _expected(4)
    out = treepack.load(loc, storage_options=s3)
    assert same(out["params"]["w"], e["w"]) and same(out["bf"], e["bf"]) and out["step"] == 7
    assert treepack.verify(loc, storage_options=s3).ok


def test_the_seeds_example_structure_then_a_partial_read(loc):
    # ../shared/seeds/jax-save-load-proposal.txt: save plain data, read only its structure, then
    # read only the non-string leaves through a mask built with jax.tree.map.
    data = ["hello", {"world": ["!", (1, 2)]}]
    treepack.save(data, loc)
    structure = treepack.load_structure(loc)
    assert [leaf.kind for leaf in jax.tree.leaves(structure)] == ["str", "str", "int", "int"]
    mask = jax.tree.map(lambda x: None if x.kind == "str" else x, structure)
    assert treepack.load(loc, like=mask) == [None, {"world": [None, (1, 2)]}]
    assert treepack.load(loc) == data


@pytest.mark.slow
def test_a_process_dying_mid_save_commits_nothing(tmp_path):
    loc = str(tmp_path / "ckpt")
    res = _job(2, loc, "die", env_extra={"TREEPACK_BARRIER_TIMEOUT": "8"})
    rc0, text0 = res[0]
    assert res[1][0] == 9  # process 1 died
    assert rc0 == 3 and "TIMEOUT" in text0 and "process 1's part" in text0 and "nothing was committed" in text0, text0[-2000:]
    assert not os.path.exists(os.path.join(loc, "treepack.json"))
    with pytest.raises(FileNotFoundError):
        treepack.load(loc)


def test_each_process_reads_only_its_shards(tmp_path):
    loc = str(tmp_path / "one")
    e = _expected(4)
    treepack.save({"w": e["w"]}, loc, chunk_bytes=8 * 6 * 4)  # one chunk per device's rows
    res = _job(2, loc, "load")
    for i, (rc, text) in enumerate(res):
        assert rc == 0, text[-3000:]
        line = next(ln for ln in text.splitlines() if ln.startswith("READ"))
        _, pid, read, total = line.split()
        assert int(read) == int(total) // 2, line  # half the devices, half the bytes


# ---------------------------------------------------------------- hostile files


def test_hostile_jax_nodes_get_clear_errors(tmp_path, rewrite_manifest):
    from flax.core import FrozenDict

    def fresh(name, tree):
        p = tmp_path / name
        treepack.save(tree, p)
        return p

    # A key whose impl JAX does not have.
    p = fresh("impl", {"k": jax.random.key(0)})
    rewrite_manifest(p, b'"impl":"threefry2x32"', b'"impl":"os.system"')
    with pytest.raises(ValueError, match=r"jax.random.key leaf: key data of shape \(2,\) with impl 'os.system'"):
        treepack.load(p)
    # Key data that does not fit the impl's key shape.
    p = fresh("keyshape", {"k": jax.random.key(0)})
    rewrite_manifest(p, b'"impl":"threefry2x32"', b'"impl":"rbg"')
    with pytest.raises(ValueError, match=r"jax.random.key leaf"):
        treepack.load(p)
    # A pytree node naming a class that is not a pytree node (trusted, so it gets that far).
    p = fresh("notnode", {"f": FrozenDict({"a": 1})})
    rewrite_manifest(p, b"flax.core.frozen_dict:FrozenDict", b"collections:Counter")
    with pytest.raises(LookupError, match=r"collections:Counter.*cannot be rebuilt as a JAX pytree node"):
        treepack.load(p, trust=["collections.*"])
    # Static data that is not the tagged JSON the writer makes.
    p = fresh("aux", {"f": FrozenDict({"a": 1})})
    rewrite_manifest(p, b'"aux":{"tuple":["a"]}', b'"aux":{"set":["a"]}')
    with pytest.raises(ValueError, match=r"jax.pytree: malformed static data"):
        treepack.load(p, trust=["flax.*"])
    # Untrusted: refused before anything is imported, naming the class from the node's data.
    p = fresh("untrusted", {"f": FrozenDict({"a": 1})})
    rewrite_manifest(p, b"flax.core.frozen_dict:FrozenDict", b"os:system")
    with pytest.raises(treepack.UntrustedTypeError, match=r"os:system"):
        treepack.load(p)
    # The sharding member is informational: nonsense there changes nothing.
    x = jax.device_put(jnp.ones((8, 2)), NamedSharding(mesh((4,), ("d",)), P("d")))
    p = fresh("sharding", {"x": x})
    rewrite_manifest(p, b'"axes":["d"]', b'"axes":["nope","nope"]')
    assert same(treepack.load(p)["x"], x)
