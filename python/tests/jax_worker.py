"""One process of a multi-process JAX job for test_jax.py (not a test module).

    python jax_worker.py PID NPROC PORT LOCATION MODE

Starts JAX's distributed runtime (coordinator on 127.0.0.1:PORT, 2 CPU devices per process),
builds the global arrays of `expected()` sharded over all processes' devices, and:
- MODE save: saves them with treepack.save (every process; with TREEPACK_TEST_BACKGROUND set,
  blocking=False), then loads them back onto another mesh and checks this process's shards.
  LOCATION may be s3://… (credentials and endpoint from AWS_* variables);
- MODE die: saves with process 1 killing itself while writing its part (nothing may be
  committed: the others must fail with a timeout, not hang);
- MODE load: loads a tree saved by a single process onto the global mesh.
"""

import os
import sys

pid, nproc, port, loc, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"

import jax  # noqa: E402
import numpy as np  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=nproc, process_id=pid,
                           initialization_timeout=60)

import treepack  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402


def expected():
    n = jax.device_count()
    return {
        "w": np.arange(n * 8 * 6, dtype=np.float32).reshape(n * 8, 6),
        "m": (np.arange(n * 4 * 8, dtype=np.int32).reshape(n * 4, 8) * 3),
        "r": np.linspace(0, 1, 10, dtype=np.float32),
        "bf": np.arange(16 * n, dtype=np.float32).astype(jax.numpy.bfloat16).reshape(n, 16),
    }


def global_arrays(e):
    devs = np.array(jax.devices())
    m1 = Mesh(devs, ("d",))
    m2 = Mesh(devs.reshape(2, -1), ("a", "b"))
    specs = {"w": NamedSharding(m1, P("d")), "m": NamedSharding(m2, P("b", "a")), "r": NamedSharding(m1, P()),
             "bf": NamedSharding(m2, P(("a", "b")))}
    return {k: jax.make_array_from_callback(v.shape, specs[k], lambda idx, v=v: v[idx]) for k, v in e.items()}


e = expected()
if mode in ("save", "die"):
    arrays = global_arrays(e)
    assert not arrays["w"].is_fully_addressable
    tree = {"params": {"w": arrays["w"], "m": arrays["m"]}, "r": arrays["r"], "bf": arrays["bf"], "step": 7, "name": "run"}
    if mode == "die" and pid == 1:
        # Die instead of writing this process's part (after the tree was converted).
        import treepack.integrations.jax as tj

        real = tj.save_collective

        def dying(*args, **kwargs):
            real(*args, **kwargs)
            return lambda: os._exit(9)

        tj.save_collective = dying
    try:
        if os.environ.get("TREEPACK_TEST_BACKGROUND"):
            h = treepack.save(tree, loc, blocking=False)  # returns at once; the exchange runs on a thread
            info = h.result()
        else:
            info = treepack.save(tree, loc)
    except TimeoutError as err:
        print("TIMEOUT", err, flush=True)
        os._exit(3)  # (a clean exit would wait for JAX's shutdown barrier, which the dead process never reaches)
    print("SAVED", pid, info.arrays, flush=True)
    # Load onto another mesh: each process reads only what its devices hold.
    devs = np.array(jax.devices())
    other = Mesh(devs[::-1].reshape(-1, 2), ("x", "y"))
    like = {
        "params": {"w": jax.ShapeDtypeStruct(e["w"].shape, np.float32, sharding=NamedSharding(other, P("x", "y"))),
                   "m": jax.ShapeDtypeStruct(e["m"].shape, np.float32, sharding=NamedSharding(other, P(None, "x")))},
        "r": jax.ShapeDtypeStruct((10,), np.float32, sharding=NamedSharding(other, P())),
        "bf": jax.ShapeDtypeStruct(e["bf"].shape, jax.numpy.bfloat16, sharding=NamedSharding(other, P("x"))),
        "step": True,
        "name": None,
    }
    out = treepack.load(loc, like=like)
    got_like = (("w", out["params"]["w"], like["params"]["w"]), ("m", out["params"]["m"], like["params"]["m"]),
                ("r", out["r"], like["r"]), ("bf", out["bf"], like["bf"]))
    for k, arr, want_like in got_like:
        want = e[k].astype(np.float32) if k == "m" else e[k]
        assert arr.sharding == want_like.sharding, k
        for sh in arr.addressable_shards:
            got = np.asarray(sh.data)
            assert got.dtype == want.dtype and np.array_equal(got, want[sh.index]), (k, sh.index)
    assert out["step"] == 7 and out["name"] is None
    print("LOADED", pid, flush=True)
elif mode == "load":
    devs = np.array(jax.devices())
    mesh = Mesh(devs, ("d",))
    s = NamedSharding(mesh, P("d"))
    r = treepack.open(loc)._r
    before = r.io_stats()[0]
    from treepack._api import _struct_node
    from treepack import _codec
    from treepack.integrations import jax as tj

    st = r.structure(_struct_node)
    arr = tj._read_target(r, st["w"], jax.ShapeDtypeStruct(e["w"].shape, np.float32, sharding=s), "`w`", _codec.np_dtype)
    read = r.io_stats()[0] - before
    for sh in arr.addressable_shards:
        assert np.array_equal(np.asarray(sh.data), e["w"][sh.index])
    print("READ", pid, read, e["w"].nbytes, flush=True)
jax.distributed.shutdown()
