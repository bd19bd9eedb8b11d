"""JAX loads onto an accelerator through reused host buffers (issue 53; integrations/jax/staging.py).

No GPU here: the staged path is switched on for the 8 CPU devices (conftest's XLA_FLAGS), with
copies to the device that happen only when waited for, as a GPU's run after ``device_put``
returns. A buffer read into again before every copy out of it had finished would show in the
values loaded.
"""

import mmap
import os

import numpy as np
import pytest

import treepack

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from jax.sharding import Mesh, NamedSharding, PartitionSpec as P, SingleDeviceSharding  # noqa: E402

from treepack.integrations.jax import staging  # noqa: E402
from treepack import _staging  # noqa: E402

if len(jax.devices()) < 8:  # pragma: no cover - conftest asks for 8
    pytest.skip("needs 8 JAX devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)", allow_module_level=True)


class Later:
    """A copy to the device that happens when first waited for, from the buffer as it is then."""

    def __init__(self, x, sharding):
        self.x, self.sharding, self.done = x, sharding, None

    def value(self):
        if self.done is None:
            self.done = jax.device_put(np.array(self.x, copy=True), self.sharding)  # (None: the default device)
        return self.done


@pytest.fixture
def deferred(monkeypatch):
    """Staging on the CPU devices, 4 KiB buffers, copies made when waited for; counts what
    happened."""
    log = {"puts": 0, "waits": 0, "buffers": []}

    def put(x, sharding):
        assert sharding is None or len(sharding.device_set) == 1
        log["puts"] += 1
        return Later(x, sharding)

    def wait(h):
        log["waits"] += 1
        return h.value()

    real = staging._Buffer.__init__

    def buffer(self, device, n):
        log["buffers"].append(n)
        real(self, device, n)

    monkeypatch.setattr(staging, "staged", lambda sharding, reader: hasattr(reader, "read_many_into"))
    monkeypatch.setattr(staging, "_put", put)
    monkeypatch.setattr(staging, "_wait", wait)
    monkeypatch.setattr(staging._Buffer, "__init__", buffer)
    monkeypatch.setattr(staging, "STAGE_BYTES", 4096)
    monkeypatch.setattr(staging, "KEEP_BYTES", 8192)
    monkeypatch.setattr(_staging, "_kept", {})
    return log


def _mesh(shape, axes):
    n = int(np.prod(shape))
    return Mesh(np.array(jax.devices()[:n]).reshape(shape), axes)


def _tree():
    g = np.random.default_rng(7)
    return {
        "rows": g.standard_normal((64, 48)).astype(np.float32),  # 8 shards of 1536 bytes
        "replicated": np.arange(100, dtype=np.float32),  # one read, 8 devices
        "grid": g.standard_normal((16, 32)).astype(jnp.bfloat16),  # a 4 x 2 mesh
        "big": np.arange(3000, dtype=np.float32),  # 12000 bytes: a buffer of its own
        "small": np.int8([1, -2, 3, -4, 5]),
        "cast": np.linspace(0, 1, 10),  # float64, loaded as float32
        "empty": np.zeros((0, 4), np.float32),
        "scalar": np.array(2.5, np.float32),
        "layers": [g.integers(0, 1000, (8, 8), dtype=np.int32) for _ in range(12)],  # many small, packed
    }


def _template(tree):
    m8, m42 = _mesh((8,), ("x",)), _mesh((4, 2), ("a", "b"))

    def sds(a, sharding, dtype=None):
        return jax.ShapeDtypeStruct(np.shape(a), dtype or np.asarray(a).dtype, sharding=sharding)

    return {
        "rows": sds(tree["rows"], NamedSharding(m8, P("x"))),
        "replicated": sds(tree["replicated"], NamedSharding(m8, P())),
        "grid": sds(tree["grid"], NamedSharding(m42, P("a", "b"))),
        "big": sds(tree["big"], NamedSharding(m8, P())),
        "small": sds(tree["small"], SingleDeviceSharding(jax.devices()[3])),
        "cast": sds(tree["cast"], NamedSharding(_mesh((2,), ("x",)), P("x")), jnp.float32),
        "empty": sds(tree["empty"], NamedSharding(m8, P())),
        "scalar": sds(tree["scalar"], SingleDeviceSharding(jax.devices()[5])),
        "layers": [sds(a, NamedSharding(_mesh((2,), ("x",)), P(None, "x"))) for a in tree["layers"]],
    }


def _check(out, tree, like):
    flat_out, td_out = jax.tree_util.tree_flatten(out)
    flat_like, td_like = jax.tree_util.tree_flatten(like)
    flat_tree = jax.tree_util.tree_leaves(tree)
    assert td_out == td_like
    for got, want, t in zip(flat_out, flat_tree, flat_like):
        assert isinstance(got, jax.Array)
        assert got.sharding == t.sharding and got.dtype == t.dtype and got.shape == t.shape
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want).astype(t.dtype))
        for s in got.addressable_shards:  # each device's shard is its own part of the values
            np.testing.assert_array_equal(np.asarray(s.data), np.asarray(want).astype(t.dtype)[s.index])


@pytest.mark.parametrize("form", ["dir", "tpk", "zstd"])
def test_staged_loads_give_every_shard_its_values(tmp_path, deferred, form):
    tree = _tree()
    p = str(tmp_path / ("t.tpk" if form == "tpk" else "t"))
    treepack.save(tree, p, chunk_bytes=1024, compression="zstd" if form == "zstd" else None)
    like = _template(tree)
    out = treepack.load(p, like=like)
    _check(out, tree, like)
    # Every copy was waited for, each shard put once per device holding it.
    assert deferred["puts"] == deferred["waits"] == 8 + 8 + 8 + 8 + 1 + 2 + 8 + 1 + 12 * 2
    # At most three buffers cycled, of STAGE_BYTES or, for the big array, of its size; only
    # those of at most KEEP_BYTES are kept for the next load, which reuses them.
    first = deferred["buffers"]
    assert set(first) == {4096, 12032} and len(first) <= staging.STAGE_COUNT + 1
    kept = [b.view.size for b in _staging._kept["cpu"]]
    assert kept and set(kept) == {4096} and len(kept) <= staging.STAGE_COUNT
    deferred["buffers"] = []
    _check(treepack.load(p, like=like), tree, like)
    assert deferred["buffers"].count(4096) == staging.STAGE_COUNT - len(kept)


def test_staged_and_fresh_loads_agree(tmp_path, monkeypatch):
    """The same template loaded by the CPU's own path and through the buffers (real
    ``device_put``, whose CPU copies are immediate)."""
    tree = _tree()
    p = str(tmp_path / "t")
    treepack.save(tree, p, chunk_bytes=1024)
    like = _template(tree)
    fresh = treepack.load(p, like=like)
    monkeypatch.setattr(staging, "staged", lambda sharding, reader: True)
    monkeypatch.setattr(staging, "_put", lambda x, s: jax.device_put(np.array(x, copy=True), s))
    monkeypatch.setattr(_staging, "_kept", {})
    through = treepack.load(p, like=like)
    for a, b in zip(jax.tree_util.tree_leaves(fresh), jax.tree_util.tree_leaves(through)):
        assert a.sharding == b.sharding and a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_corrupt_chunk_is_named_and_the_copies_started_are_waited_for(tmp_path, deferred):
    tree = {"a": np.arange(2048, dtype=np.float32), "b": np.full(2048, 7, np.int32), "c": np.arange(512, dtype=np.int64)}
    p = str(tmp_path / "t")
    treepack.save(tree, p, chunk_bytes=1024)
    (pack,) = os.listdir(os.path.join(p, "packs"))
    pack = os.path.join(p, "packs", pack)
    data = bytearray(open(pack, "rb").read())
    at = bytes(data).index(tree["b"][:256].tobytes())  # "b"'s first chunk
    data[at + 5] ^= 0xFF
    open(pack, "wb").write(bytes(data))
    m8 = _mesh((8,), ("x",))
    like = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=NamedSharding(m8, P("x"))) for k, v in tree.items()}
    with pytest.raises(treepack.CorruptError, match=r"\bb\b"):
        treepack.load(p, like=like)
    assert deferred["puts"] > 0 and deferred["waits"] == deferred["puts"]
    assert {b.view.size for b in _staging._kept["cpu"]} == {4096}  # put back for the next load
    out = treepack.load(p, like={"a": like["a"], "b": None, "c": like["c"]})  # (None: b is skipped)
    np.testing.assert_array_equal(np.asarray(out["a"]), tree["a"])
    np.testing.assert_array_equal(np.asarray(out["c"]), tree["c"])


class _Client:
    """A device runtime that registers memory for DMA, as XLA's GPU clients do."""

    def __init__(self):
        self.mapped = {}

    def dma_map(self, address, size):
        assert address % mmap.PAGESIZE == 0 and size % mmap.PAGESIZE == 0 and address not in self.mapped
        self.mapped[address] = size

    def dma_unmap(self, address):
        del self.mapped[address]


class _Gpu:
    platform = "gpu"

    def __init__(self, client):
        self.client = client


def test_buffers_are_page_aligned_and_registered_for_dma_where_the_runtime_can():
    client = _Client()
    b = staging._Buffer(_Gpu(client), 10000)
    assert b.view.size == 10000 and b.view.flags.writeable and b.view.ctypes.data % mmap.PAGESIZE == 0
    assert client.mapped == {b.view.ctypes.data: -(-10000 // mmap.PAGESIZE) * mmap.PAGESIZE}  # whole pages
    b.view[:] = 1
    assert b.memory[:10000] == b"\x01" * 10000
    b.release()
    b.release()  # (once only)
    assert client.mapped == {}
    # The CPU runtime registers nothing (UNIMPLEMENTED): plain memory, which it copies from.
    c = staging._Buffer(jax.devices()[0], 4096)
    assert c.client is None and c.view.size == 4096


def test_buffers_kept_for_the_next_load_are_the_small_ones(monkeypatch):
    client = _Client()
    monkeypatch.setattr(_staging, "_kept", {})
    monkeypatch.setattr(staging, "KEEP_BYTES", 8192)
    small, big = staging._Buffer(_Gpu(client), 8192), staging._Buffer(_Gpu(client), 20000)
    staging._put_back("gpu", [small, None, big], lost=False)
    assert _staging._kept["gpu"] == [small] and list(client.mapped) == [small.view.ctypes.data]
    other = staging._Buffer(_Gpu(client), 4096)
    staging._put_back("gpu", [other], lost=False)  # another load's set, back second: released
    assert _staging._kept["gpu"] == [small] and list(client.mapped) == [small.view.ctypes.data]


def test_buffers_whose_copies_could_not_be_waited_for_are_never_freed(tmp_path, deferred, monkeypatch):
    p = str(tmp_path / "t")
    treepack.save({"a": np.arange(4096, dtype=np.float32)}, p, chunk_bytes=1024)

    def broken(h):
        raise RuntimeError("the device went away")

    monkeypatch.setattr(staging, "_wait", broken)
    monkeypatch.setattr(_staging, "_abandoned", [])
    m8 = _mesh((8,), ("x",))
    with pytest.raises(RuntimeError, match="the device went away"):
        treepack.load(p, like={"a": jax.ShapeDtypeStruct((4096,), np.float32, sharding=NamedSharding(m8, P("x")))})
    assert len(_staging._abandoned) == staging.STAGE_COUNT and "cpu" not in _staging._kept


def test_a_failed_read_is_the_error_even_when_the_copies_before_it_fail_too(tmp_path, deferred, monkeypatch):
    """A read fails after copies were started, and waiting for those fails as well: the load
    reports the read's error (the file's damage, named), and the buffers are never freed."""
    tree = {"a": np.arange(2048, dtype=np.float32), "b": np.full(2048, 7, np.int32)}
    p = str(tmp_path / "t")
    treepack.save(tree, p, chunk_bytes=1024)
    (pack,) = os.listdir(os.path.join(p, "packs"))
    pack = os.path.join(p, "packs", pack)
    data = bytearray(open(pack, "rb").read())
    data[bytes(data).index(tree["b"][:256].tobytes()) + 5] ^= 0xFF
    open(pack, "wb").write(bytes(data))

    def broken(h):
        raise RuntimeError("the device went away")

    monkeypatch.setattr(staging, "_wait", broken)
    monkeypatch.setattr(_staging, "_abandoned", [])
    m8 = _mesh((8,), ("x",))
    like = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=NamedSharding(m8, P("x"))) for k, v in tree.items()}
    with pytest.raises(treepack.CorruptError, match=r"\bb\b"):
        treepack.load(p, like=like)
    assert deferred["puts"] > 0 and _staging._abandoned and "cpu" not in _staging._kept


def test_only_an_accelerators_own_memory_is_staged():
    class Dev:
        def __init__(self, platform):
            self.platform = platform

    class Sharding:
        def __init__(self, platforms, memory_kind=None):
            self.addressable_devices = {Dev(p) for p in platforms}
            self.memory_kind = memory_kind

    class R:
        def read_many_into(self, items, verify=True):
            pass

    assert staging.staged(Sharding(["gpu", "gpu"]), R())
    assert staging.staged(Sharding(["gpu"], "device"), R())
    assert not staging.staged(Sharding(["gpu"], "pinned_host"), R())  # host memory: no copy to make
    assert not staging.staged(Sharding(["gpu", "cpu"]), R())
    assert not staging.staged(Sharding([]), R())
    assert not staging.staged(Sharding(["gpu"]), object())  # another tool's file: read as it is
    assert not staging.staged(SingleDeviceSharding(jax.devices()[0]), R())


def test_a_template_without_shardings_goes_to_the_default_accelerator_through_the_buffers(tmp_path, deferred, monkeypatch):
    monkeypatch.setattr(staging, "default_device", lambda: jax.devices()[0])
    tree = {"w": np.arange(3000, dtype=np.float32).reshape(30, 100), "b": np.arange(7, dtype=np.int16)}
    p = str(tmp_path / "t")
    treepack.save(tree, p, chunk_bytes=1024)
    out = treepack.load(p, like={k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in tree.items()})
    assert deferred["puts"] == deferred["waits"] == 2
    for k, v in tree.items():
        # As device_put(x) leaves it: on the default device, not committed to it.
        assert out[k].sharding == SingleDeviceSharding(jax.devices()[0]) and not out[k].committed
        np.testing.assert_array_equal(np.asarray(out[k]), v)


def test_no_default_accelerator_here():
    assert staging.default_device() is None  # the CPU: each array keeps its own memory


def test_a_flax_train_state_resumes_through_the_buffers(tmp_path, deferred):
    """A user's resume: a TrainState (linen MLP, adam) after a few steps, loaded onto a mesh from
    an abstract template and through ``treepack.jax.load``; training goes on identically."""
    nn = pytest.importorskip("flax.linen")
    optax = pytest.importorskip("optax")
    from flax.training import train_state

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(3)(nn.relu(nn.Dense(300)(x)))

    model = MLP()

    def fresh():
        params = model.init(jax.random.key(0), jnp.ones((1, 8)))
        return train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-2))

    def step(state):
        x, y = jnp.ones((4, 8)), jnp.zeros((4, 3))
        return state.apply_gradients(grads=jax.grad(lambda p: jnp.mean((state.apply_fn(p, x) - y) ** 2))(state.params))

    state = fresh()
    for _ in range(3):
        state = step(state)
    p = str(tmp_path / "ckpt")
    treepack.save(state, p, omit_static=True, chunk_bytes=2048)
    rep = NamedSharding(_mesh((4,), ("d",)), P())
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=rep), jax.eval_shape(fresh))
    back = treepack.load(p, like=abstract)
    assert deferred["puts"] == deferred["waits"] > 0
    assert int(back.step) == 3
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(state)):
        assert a.sharding == rep
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for a, b in zip(jax.tree.leaves(step(back)), jax.tree.leaves(step(state))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # JAX's own call, one sharding for every array of the parameters.
    import treepack.jax as tpj

    tpj.save(state.params, str(tmp_path / "params"))
    params = tpj.load(str(tmp_path / "params"), rep)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(state.params)):
        assert a.sharding == rep
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))




# ------------------------------------------------ a plain load onto the default accelerator


@pytest.fixture
def plain(deferred, monkeypatch):
    """``deferred``, with device 0 as an accelerator default device, the arrays a plain load
    returns left as the copies (``Later``) the GPU would make, and every array handed to a
    ``Stager`` logged, with the order of puts and waits (``events``)."""
    monkeypatch.setattr(staging, "default_device", lambda: jax.devices()[0])
    monkeypatch.setattr(staging, "_array", lambda h: h)
    deferred["given"], deferred["events"] = [], []
    real_put, real_wait, real_stage = staging._put, staging._wait, staging.Stager.put

    def put(x, sharding):
        h = real_put(x, sharding)
        h.n = deferred["puts"] - 1
        deferred["events"].append(("put", h.n))
        return h

    def wait(h):
        deferred["events"].append(("wait", h.n))
        return real_wait(h)

    def stage(self, x):
        deferred["given"].append((x.nbytes, x.flags.writeable))
        return real_stage(self, x)

    monkeypatch.setattr(staging, "_put", put)
    monkeypatch.setattr(staging, "_wait", wait)
    monkeypatch.setattr(staging.Stager, "put", stage)
    return deferred


def _resolve(x):
    """What the load gave, once the device's copies have all finished."""
    if isinstance(x, Later):
        return x.value()
    if isinstance(x, dict):
        return {k: _resolve(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_resolve(v) for v in x)
    return x


def _plain_tree():
    g = np.random.default_rng(11)
    return {
        "layers": [jnp.asarray(g.standard_normal((int(g.integers(1, 40)), 16)).astype(np.float32)) for _ in range(40)],
        "bf16": jnp.asarray(g.standard_normal((33, 7)), dtype=jnp.bfloat16),
        "big": jnp.arange(3000, dtype=jnp.float32),  # 12000 bytes > KEEP_BYTES: put as it is
        "empty": jnp.zeros((0, 3)),
        "key": jax.random.key(3),
        "step": 7,
        "name": "run-1",
    }


def _same(got, tree):
    assert set(got) == set(tree)
    for k in ("layers", "bf16", "big", "empty"):
        for a, b in zip(jax.tree.leaves(got[k]), jax.tree.leaves(tree[k])):
            assert isinstance(a, jax.Array) and a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert jax.random.key_impl(got["key"]) == jax.random.key_impl(tree["key"])
    np.testing.assert_array_equal(jax.random.key_data(got["key"]), jax.random.key_data(tree["key"]))
    assert got["step"] == 7 and got["name"] == "run-1"


@pytest.mark.parametrize("form", ["dir", "tpk", "zstd"])
def test_a_plain_load_goes_to_the_default_accelerator_from_the_mapped_file(tmp_path, plain, form):
    tree = _plain_tree()
    p = str(tmp_path / ("t.tpk" if form == "tpk" else "t"))
    treepack.save(tree, p, chunk_bytes=512, compression="zstd" if form == "zstd" else None)
    first = treepack.load(p)
    staged = [n for n, _ in plain["given"] if 0 < n <= staging.KEEP_BYTES]
    # Every array with data, in the buffers but the big one; the load was a mapped one (its
    # arrays read-only views of the file, or of what zstd decompressed), not a copy into fresh
    # memory of its own first.
    assert len(plain["given"]) == 40 + 3 and len(staged) == 41 == plain["puts"]
    assert not any(w for _, w in plain["given"])
    # Every copy finished before the load returned; three buffers, kept for the next load.
    assert plain["waits"] == plain["puts"]
    assert len(plain["buffers"]) == staging.STAGE_COUNT and set(plain["buffers"]) == {4096}
    assert len(_staging._kept["cpu"]) == staging.STAGE_COUNT
    # A second plain load and a template load reuse them.
    second = treepack.load(p)
    like = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), {k: tree[k] for k in ("layers", "bf16")})
    like.update({k: None for k in tree if k not in like})  # (skipped: a template names every stored key)
    third = treepack.load(p, like=like)
    assert len(plain["buffers"]) == staging.STAGE_COUNT  # no more made
    _same(_resolve(first), tree)
    _same(_resolve(second), tree)
    for a, b in zip(jax.tree.leaves(third), jax.tree.leaves(like)):
        assert isinstance(a, jax.Array) and a.shape == b.shape
    np.testing.assert_array_equal(np.asarray(third["bf16"]), np.asarray(tree["bf16"]))


def test_a_plain_load_fills_a_buffer_before_waiting_for_any_copy(tmp_path, plain):
    """Small arrays are packed into a buffer; the load waits only when it starts a buffer again
    from its start, for that buffer's copies alone, and for the rest when it ends."""
    tree = {f"a{i:02}": jnp.full((64,), i, jnp.float32) for i in range(50)}  # 256 bytes each
    p = str(tmp_path / "t")
    treepack.save(tree, p)
    out = treepack.load(p)
    # 16 to a buffer: the 49th put starts the first buffer again, after its 16 copies.
    ev = plain["events"]
    first_wait = next(i for i, e in enumerate(ev) if e[0] == "wait")
    assert ev[:first_wait] == [("put", n) for n in range(48)]
    assert ev[first_wait:first_wait + 16] == [("wait", n) for n in range(16)]
    assert ev[first_wait + 16:first_wait + 18] == [("put", 48), ("put", 49)]
    assert sorted(n for kind, n in ev[first_wait + 18:]) == list(range(16, 50))  # at the load's end
    assert len(plain["buffers"]) == 3
    for k, v in _resolve(out).items():
        np.testing.assert_array_equal(np.asarray(v), np.asarray(tree[k]))


def test_a_failure_in_a_plain_load_waits_for_its_copies_and_the_buffers_stay_usable(tmp_path, plain, monkeypatch):
    """A put that fails part-way (the device out of memory, say) fails the load, naming the
    error; the copies already started are waited for, and the buffers serve the next load."""
    tree = {f"a{i:02}": jnp.full((300,), i, jnp.float32) for i in range(20)}
    p = str(tmp_path / "t")
    treepack.save(tree, p)
    real = staging._put

    def failing(x, sharding):
        if plain["puts"] == 12:
            raise RuntimeError("RESOURCE_EXHAUSTED: out of memory on the device")
        return real(x, sharding)

    monkeypatch.setattr(staging, "_put", failing)
    with pytest.raises(RuntimeError, match="RESOURCE_EXHAUSTED"):
        treepack.load(p)
    assert plain["puts"] == 12 and plain["waits"] == 12
    monkeypatch.setattr(staging, "_put", real)
    for k, v in _resolve(treepack.load(p)).items():
        np.testing.assert_array_equal(np.asarray(v), np.asarray(tree[k]))
    assert len(plain["buffers"]) == 3 and not _staging._abandoned


def test_a_corrupt_chunk_in_a_plain_load_is_named_and_the_buffers_stay_usable(tmp_path, plain):
    tree = {"a": jnp.arange(512, dtype=jnp.float32), "b": jnp.full((512,), 7, jnp.int32), "c": jnp.arange(256, dtype=jnp.int32)}
    p = str(tmp_path / "t")
    treepack.save(tree, p, chunk_bytes=1024)
    (pack,) = os.listdir(os.path.join(p, "packs"))
    pack = os.path.join(p, "packs", pack)
    data = bytearray(open(pack, "rb").read())
    at = bytes(data).index(np.full(256, 7, np.int32).tobytes())  # "b"'s first chunk
    data[at + 5] ^= 0xFF
    open(pack, "wb").write(bytes(data))
    with pytest.raises(treepack.CorruptError, match=r"\bb\b"):
        treepack.load(p)
    out = _resolve(treepack.load(p, select=["a", "c"]))
    np.testing.assert_array_equal(np.asarray(out["a"]), np.asarray(tree["a"]))
    np.testing.assert_array_equal(np.asarray(out["c"]), np.asarray(tree["c"]))


def test_loaded_arrays_deleted_or_donated_do_not_touch_later_loads(tmp_path, monkeypatch):
    """Real ``device_put`` copies: a load keeps nothing of what it returned, so arrays the
    caller deletes (or donates to a jitted step) are never waited for by a later load."""
    monkeypatch.setattr(staging, "default_device", lambda: jax.devices()[0])
    monkeypatch.setattr(staging, "_put", lambda x, s: jax.device_put(np.array(x, copy=True)))
    monkeypatch.setattr(_staging, "_kept", {})
    monkeypatch.setattr(staging, "STAGE_BYTES", 4096)
    monkeypatch.setattr(staging, "KEEP_BYTES", 8192)
    tree = {f"a{i:02}": jnp.full((64,), i, jnp.float32) for i in range(40)}
    p = str(tmp_path / "t")
    treepack.save(tree, p)
    first = treepack.load(p)
    for v in first.values():
        v.delete()
    step = jax.jit(lambda t: jax.tree.map(lambda a: a + 1, t), donate_argnums=0)
    step(treepack.load(p))
    for load in (lambda: treepack.load(p), lambda: treepack.load(p, like=jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), tree))):
        for k, v in load().items():
            np.testing.assert_array_equal(np.asarray(v), np.asarray(tree[k]))


def test_plain_loads_on_four_threads_at_once(tmp_path, plain):
    """Each load has buffers of its own while it runs (the kept set, or new ones while another
    load has that), so none writes where another's copy still reads."""
    import threading

    tree = _plain_tree()
    p = str(tmp_path / "t")
    treepack.save(tree, p, chunk_bytes=512)
    outs, errors = [[] for _ in range(4)], []

    def run(i):
        try:
            for _ in range(5):
                outs[i].append(treepack.load(p))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for out in (o for per in outs for o in per):
        _same(_resolve(out), tree)
    assert plain["waits"] == plain["puts"] and len(_staging._kept["cpu"]) <= staging.STAGE_COUNT


def test_a_flax_train_state_loads_plainly_through_the_buffers(tmp_path, monkeypatch):
    """A user's resume without a template (the classes trusted), with real ``device_put``
    copies: the arrays come back on the default device, and the optimizer state as its class."""
    nn = pytest.importorskip("flax.linen")
    optax = pytest.importorskip("optax")
    from flax.training import train_state

    monkeypatch.setattr(staging, "default_device", lambda: jax.devices()[0])
    monkeypatch.setattr(staging, "_put", lambda x, s: jax.device_put(np.array(x, copy=True)))
    monkeypatch.setattr(_staging, "_kept", {})
    monkeypatch.setattr(staging, "STAGE_BYTES", 64 << 10)
    given = []
    real = staging.Stager.put
    monkeypatch.setattr(staging.Stager, "put", lambda self, x: given.append(x.nbytes) or real(self, x))

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(3)(nn.relu(nn.Dense(300)(x)))

    model = MLP()
    params = model.init(jax.random.key(0), jnp.ones((1, 8)))
    state = train_state.TrainState.create(apply_fn=None, params=params, tx=optax.adam(1e-2))
    p = str(tmp_path / "ckpt")
    treepack.save({"params": state.params, "opt": state.opt_state, "step": 3}, p)
    back = treepack.load(p, trust=["optax.*"])
    assert len(given) == len(jax.tree.leaves(back)) - 1  # every array (the step is an int)
    for a, b in zip(jax.tree.leaves(back["params"]), jax.tree.leaves(state.params)):
        assert a.sharding == SingleDeviceSharding(jax.devices()[0]) and not a.committed
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert type(back["opt"]) is type(state.opt_state)
    for a, b in zip(jax.tree.leaves(back["opt"]), jax.tree.leaves(state.opt_state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_what_a_plain_load_reads_onto_an_accelerator(tmp_path, monkeypatch):
    """``prepare_load``: a mapped file and a stager only for local trees of JAX arrays alone,
    bound for an accelerator; the manifest is not read on a CPU whose devices JAX has made, and
    a tree without JAX arrays does not make JAX start its devices."""
    from treepack import _api, _encryption
    from treepack.integrations import jax as tpjax

    jtree = {"w": jnp.ones(4), "k": jax.random.key(0), "n": 3}
    mixed = {"w": jnp.ones(4), "x": np.ones(4)}
    paths = {}
    for name, t in (("jax", jtree), ("mixed", mixed), ("numpy", {"x": np.ones(4)})):
        paths[name] = str(tmp_path / name)
        treepack.save(t, paths[name])
    reads = []

    class Request(_api.LoadRequest):
        def reader(self):
            reads.append(1)
            return super().reader()

    def prepared(name, **kw):
        args = dict(storage_options=None, like=None, mmap=False, signed=None, options={}, plain=False)
        args.update(kw)
        dec = treepack._codec.Decoder((), False, False, args["options"], plain=args["plain"])
        r = Request(paths.get(name, name), args["storage_options"], None, args["like"], (), False, "error",
                    args["mmap"], True, None, dec, args["options"], args["signed"])
        reads.clear()
        finish = tpjax._prepare_load(r)
        assert (finish is not None) == (staging.OPTION in dec.options) and (finish is None or r.mmap)
        if finish is not None:
            finish(True)
        return r.mmap, len(reads)

    assert prepared("jax") == (False, 0)  # this CPU: nothing read
    monkeypatch.setattr(staging, "default_device", lambda: jax.devices()[0])
    assert prepared("jax") == (True, 1)
    assert prepared("mixed") == (False, 1)  # a numpy array would come back a view of the file
    assert prepared("numpy") == (False, 1)
    for kw in ({"like": {}}, {"storage_options": {}}, {"storage_options": _encryption.keyed(None, b"k" * 32)},
               {"options": {"dask": True}}, {"signed": object()}, {"plain": True}, {"mmap": True}):
        assert prepared("jax", **kw) == (kw.get("mmap", False), 0), kw
    assert prepared(str(tmp_path / "absent")) == (False, 0)
    assert prepared("memory://x") == (False, 0)
    # Devices not made yet: the manifest first, and JAX asked only for a tree of JAX arrays.
    monkeypatch.setattr(tpjax, "_backends_started", lambda: False)
    asked = []
    monkeypatch.setattr(staging, "default_device", lambda: asked.append(1) or jax.devices()[0])
    assert prepared("numpy") == (False, 1) and not asked
    assert prepared("jax") == (True, 1) and asked
