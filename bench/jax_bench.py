"""W9: a sharded JAX train state saved and restored by a 2-process job (issue 28) — treepack
against Orbax's StandardCheckpointer and jax.experimental.array_serialization (TensorStore).

    .venv/bin/python bench/jax_bench.py [--quick] [--runs N] [--out bench/results/jax-….json]

The state: params of 12 layers (a (2048, 3648) float32 weight sharded by rows over 4 CPU
devices, a replicated bias) and Adam's two moments of the same shapes, plus a step counter:
~1 GiB (--quick: 1/16 of it). Two processes (`jax.distributed` on 127.0.0.1, 2 CPU devices
each) hold it; every measurement is a fresh 2-process job, page cache warm, medians of the runs.
Per operation: wall time (the slower process, between two barriers), and each process's peak
host RSS above what it held before (its half of the state).

- save: treepack (durable: every file fsynced), treepack-nosync (durable=False, like the peers,
  which do not fsync), orbax (StandardCheckpointer, waited for), tensorstore
  (array_serialization.run_serialization, zarr driver);
- restore onto the same sharding from an abstract state: treepack (like=), orbax (restore with
  the abstract state), tensorstore (run_deserialization); checked equal once per peer;
- step-during-save: the time of a jitted training step (an Adam-like update of every leaf)
  alone, and while a `treepack.save(..., blocking=False)` of the state runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import report
from procmem import peak, rss

LAYERS, ROWS, COLS = 12, 2048, 3648


def worker(pid: int, nproc: int, port: int, peer: str, op: str, path: str, flags: str) -> None:
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    import jax
    import jax.numpy as jnp
    import numpy as np

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=nproc, process_id=pid)
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    quick = "q" in flags
    rows = ROWS // 4 if quick else ROWS
    cols = COLS // 4 if quick else COLS
    mesh = Mesh(np.array(jax.devices()), ("d",))
    rowwise, rep = NamedSharding(mesh, P("d")), NamedSharding(mesh, P())

    def values(layer: int, which: int, idx, shape):
        r = np.arange(shape[0])[idx[0]] if len(shape) == 2 else None
        c = np.arange(shape[-1])[idx[-1]]
        base = (layer * 7 + which * 3) % 11
        if r is None:
            return ((c % 97) * 0.01 + base).astype(np.float32)
        return (((r[:, None] * 31 + c[None, :]) % 1009) * 0.001 + base).astype(np.float32)

    def build(abstract: bool):
        def arr(layer, which, shape, s):
            if abstract:
                return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=s)
            return jax.make_array_from_callback(shape, s, lambda idx: values(layer, which, idx, shape))

        def tree(which):
            return {f"layer{i}": {"w": arr(i, which, (rows, cols), rowwise), "b": arr(i, which, (cols,), rep)} for i in range(LAYERS)}

        step = jax.ShapeDtypeStruct((), jnp.int32, sharding=rep) if abstract else jax.device_put(jnp.int32(100), rep)
        return {"params": tree(0), "opt": {"mu": tree(1), "nu": tree(2)}, "step": step}

    state = build(False) if op in ("save", "step") else None
    abstract = build(True)
    total = sum(int(np.prod(x.shape)) * 4 for x in jax.tree.leaves(abstract))
    own = sum(int(np.prod(s.data.shape)) * 4 for x in jax.tree.leaves(state) for s in x.addressable_shards) if state else None
    import treepack

    res: dict = {"pid": pid, "bytes": total}
    multihost_utils.sync_global_devices("start")
    base = rss()
    t0 = time.perf_counter()
    out = None
    if op == "save":
        if peer.startswith("treepack"):
            treepack.save(state, path, durable=peer != "treepack-nosync")
        elif peer == "orbax":
            import orbax.checkpoint as ocp

            ck = ocp.StandardCheckpointer()
            ck.save(path, state)
            ck.wait_until_finished()
        elif peer == "tensorstore":
            from jax.experimental.array_serialization import serialization as ser

            leaves, _ = jax.tree_util.tree_flatten_with_path(state)
            specs = [ser.get_tensorstore_spec(os.path.join(path, jax.tree_util.keystr(k).replace("'", "").replace("[", "").replace("]", "_")))
                     for k, _ in leaves]
            ser.run_serialization([v for _, v in leaves], specs)
    elif op == "restore":
        if peer.startswith("treepack"):
            out = treepack.load(path, like=abstract)
        elif peer == "orbax":
            import orbax.checkpoint as ocp

            out = ocp.StandardCheckpointer().restore(path, abstract)
        elif peer == "tensorstore":
            from jax.experimental.array_serialization import serialization as ser

            leaves, td = jax.tree_util.tree_flatten_with_path(abstract)
            specs = [ser.get_tensorstore_spec(os.path.join(path, jax.tree_util.keystr(k).replace("'", "").replace("[", "").replace("]", "_")))
                     for k, _ in leaves]
            got = ser.run_deserialization([v.sharding for _, v in leaves], specs, [v.shape for _, v in leaves],
                                          [v.dtype for _, v in leaves])
            out = jax.tree_util.tree_unflatten(td, got)
        jax.block_until_ready(out)
    elif op == "step":
        @jax.jit
        def train_step(s):
            p, mu, nu = s["params"], s["opt"]["mu"], s["opt"]["nu"]
            mu = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, mu, p)
            nu = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, nu, p)
            p = jax.tree.map(lambda x, m, v: x - 1e-3 * m / (jnp.sqrt(v) + 1e-8), p, mu, nu)
            return {"params": p, "opt": {"mu": mu, "nu": nu}, "step": s["step"] + 1}

        s = jax.block_until_ready(train_step(state))  # compile
        times = []
        for _ in range(6):
            t = time.perf_counter()
            s = jax.block_until_ready(train_step(s))
            times.append(time.perf_counter() - t)
        res["step_alone"] = statistics.median(times)
        multihost_utils.sync_global_devices("save")
        t = time.perf_counter()
        h = treepack.save(s, path, durable=False, blocking=False)
        res["save_return"] = time.perf_counter() - t
        during = []
        while not h.done() or len(during) < 3:
            t = time.perf_counter()
            s = jax.block_until_ready(train_step(s))
            during.append(time.perf_counter() - t)
        h.result()
        res["step_during_save"] = statistics.median(during)
        res["steps_during_save"] = len(during)
    wall = time.perf_counter() - t0
    multihost_utils.sync_global_devices("end")
    res.update({"wall": wall, "rss_peak_extra": max(0, peak() - base), "own_bytes": own})
    if out is not None and "c" in flags:
        ok = True
        flat = jax.tree_util.tree_flatten_with_path(out)[0]
        for (k, a), want in zip(flat, jax.tree.leaves(abstract)):
            ok &= a.sharding == want.sharding and a.shape == want.shape and a.dtype == want.dtype
            names = [str(getattr(e, "key", "")) for e in k]
            if a.ndim:
                which = 0 if names[0] == "params" else (1 if names[1] == "mu" else 2)
                layer = int(next(n for n in names if n.startswith("layer"))[5:])
                sh = a.addressable_shards[0]
                ok &= bool(np.array_equal(np.asarray(sh.data), values(layer, which, sh.index, a.shape)))
            else:
                ok &= int(a) == 100
        res["equal"] = bool(ok)
    print("RESULT " + json.dumps(res), flush=True)
    jax.distributed.shutdown()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job(peer: str, op: str, path: str, flags: str) -> list:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", str(i), "2", str(port), peer, op, path, flags],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for i in range(2)]
    out = []
    for p in procs:
        so, se = p.communicate(timeout=900)
        if p.returncode != 0:
            for q in procs:
                q.kill()
            raise SystemExit(f"{op} {peer} failed:\n{se[-3000:]}")
        out.append(json.loads(next(ln for ln in so.splitlines() if ln.startswith("RESULT "))[7:]))
    return out


PLAN = [
    ("save", ["treepack", "treepack-nosync", "orbax", "tensorstore"]),
    ("restore", ["treepack", "orbax", "tensorstore"]),
    ("step", ["treepack"]),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int, default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--worker", nargs=7, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        pid, n, port, peer, op, path, flags = args.worker
        worker(int(pid), int(n), int(port), peer, op, path, flags)
        return
    runs = args.runs or (1 if args.quick else 3)
    d = tempfile.mkdtemp(prefix="treepack-jax-bench-")
    results = []
    try:
        for op, peers in PLAN:
            samples = {p: [] for p in peers}
            notes: dict = {}
            for r in range(runs + 1):  # run 0: warm-up (and the equality check)
                for peer in peers:
                    base = {"treepack-nosync": "treepack"}.get(peer, peer)
                    path = os.path.join(d, f"{base}-{op}" if op == "step" else base)
                    if op in ("save", "step"):
                        shutil.rmtree(path, ignore_errors=True)
                    flags = ("q" if args.quick else "") + ("c" if r == 0 and op == "restore" else "") + "-"
                    got = job(peer, op, path, flags)
                    if r == 0:
                        if op == "restore":
                            notes[peer] = {"equal": all(g.get("equal") for g in got)}
                            if not notes[peer]["equal"]:
                                raise SystemExit(f"restore {peer}: the restored state differs from the saved one")
                    else:
                        samples[peer].append(got)
            for peer in peers:
                s = samples[peer]
                row = {
                    "op": op, "peer": peer, "runs": len(s),
                    "wall_median_s": statistics.median(max(g["wall"] for g in run) for run in s),
                    "rss_peak_extra_median": statistics.median(max(g["rss_peak_extra"] for g in run) for run in s),
                    "bytes": s[0][0]["bytes"], **notes.get(peer, {}),
                }
                if op == "step":
                    for k in ("step_alone", "step_during_save", "save_return", "steps_during_save"):
                        row[k] = statistics.median(max(g[k] for g in run) for run in s)
                results.append(row)
                extra = {k: round(row[k] * 1000, 1) for k in ("step_alone", "step_during_save", "save_return") if k in row}
                print(f"{op:8s} {peer:16s} {row['wall_median_s']*1000:9.1f} ms  peak +{row['rss_peak_extra_median']/2**20:8.1f} MiB/process "
                      f"{notes.get(peer, '')} {extra or ''}", flush=True)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    import jax

    try:
        import orbax.checkpoint as ocp

        orbax_version = getattr(ocp, "__version__", "?")
    except ImportError:
        orbax_version = None
    report.write("jax", args, runs, results, jax=jax.__version__, orbax=orbax_version, processes=2, devices=4,
                 state_bytes=results[0]["bytes"] if results else None)


if __name__ == "__main__":
    main()
