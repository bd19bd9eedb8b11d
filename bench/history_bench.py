"""W8 "checkpoint history" (issue 27): 10 successive saves of a ~256 MiB model where ~10 % of
the arrays change between saves — a treepack repository against separate saves.

    .venv/bin/python bench/history_bench.py [--quick] [--rounds N] [--out bench/results/history-….json]

The model: 64 float32 arrays of 1024 x 1024 (4 MiB each, 256 MiB), made deterministically
before any clock starts. Step k (1..10) changes arrays i with (i + k) % 10 == 0 (6 or 7 of them,
~10 %) by adding k. Each peer saves the 10 steps in order into a fresh folder, in a fresh
process, page cache warm; then the latest step is loaded (median of 3). Peers:

- `treepack-repo`: `Repository.save(tree, "step-k", durable=False)` — only changed chunks written;
- `treepack`: a separate `treepack.save(tree, dir/step-k, durable=False)` per step;
- `orbax`: `orbax.checkpoint.CheckpointManager` with `StandardSave` (waited for each step);
- `safetensors`: `safetensors.numpy.save_file` per step.

None of the peers fsyncs (treepack's durable default would add the same fsync cost to both
treepack peers). Targets (issue 27): total stored ≤ 1.25 x (first save + changed bytes); every
incremental repository save ≤ 0.25 x a full save's time (the `treepack` peer's median save of
the same tree); loading the latest step from the repository within 10 % of loading it as a
plain tree. `--rounds` repeats the whole comparison (peers interleaved) for medians.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

MiB = 1 << 20
STEPS = 10


def model(step: int, n: int, side: int):
    import numpy as np

    rng = np.random.default_rng(0)
    base = [rng.standard_normal((side, side), dtype=np.float32) for _ in range(n)]
    tree = {}
    for i, a in enumerate(base):
        # The value at step k: the base plus every change made up to k.
        bump = sum(k for k in range(1, step + 1) if (i + k) % 10 == 0)
        tree[f"layer{i:02d}"] = a + np.float32(bump) if bump else a
    return tree


def changed_bytes(n: int, side: int) -> int:
    return sum(side * side * 4 for k in range(2, STEPS + 1) for i in range(n) if (i + k) % 10 == 0)


def du(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            total += os.path.getsize(os.path.join(root, f))
    return total


def child(peer: str, where: str, n: int, side: int) -> dict:
    """Run in a fresh process: save the 10 steps, then load the latest 3 times."""
    import numpy as np

    trees = [model(k, n, side) for k in range(1, STEPS + 1)]
    saves = []
    if peer == "treepack-repo":
        import treepack

        repo = treepack.Repository(os.path.join(where, "repo"), create=True)
        reused = []
        for k, t in enumerate(trees, 1):
            t0 = time.perf_counter()
            info = repo.save(t, f"step-{k}", durable=False)
            saves.append(time.perf_counter() - t0)
            reused.append(info.bytes_reused)

        def load_latest():
            return repo.load(f"step-{STEPS}")
    elif peer == "treepack":
        import treepack

        for k, t in enumerate(trees, 1):
            t0 = time.perf_counter()
            treepack.save(t, os.path.join(where, f"step-{k}"), durable=False)
            saves.append(time.perf_counter() - t0)

        def load_latest():
            return treepack.load(os.path.join(where, f"step-{STEPS}"))
    elif peer == "orbax":
        import orbax.checkpoint as ocp

        mgr = ocp.CheckpointManager(os.path.join(where, "orbax"), options=ocp.CheckpointManagerOptions(max_to_keep=None))
        for k, t in enumerate(trees, 1):
            t0 = time.perf_counter()
            mgr.save(k, args=ocp.args.StandardSave(t))
            mgr.wait_until_finished()
            saves.append(time.perf_counter() - t0)

        def load_latest():
            return mgr.restore(STEPS, args=ocp.args.StandardRestore())
    elif peer == "safetensors":
        from safetensors.numpy import load_file, save_file

        for k, t in enumerate(trees, 1):
            t0 = time.perf_counter()
            save_file(t, os.path.join(where, f"step-{k}.safetensors"))
            saves.append(time.perf_counter() - t0)

        def load_latest():
            return load_file(os.path.join(where, f"step-{STEPS}.safetensors"))
    else:
        raise SystemExit(f"unknown peer {peer}")
    stored = du(where)
    loads = []
    out = None
    for _ in range(3):
        t0 = time.perf_counter()
        out = load_latest()
        loads.append(time.perf_counter() - t0)
    want = trees[-1]
    assert all(np.array_equal(np.asarray(out[k]), want[k]) for k in want), f"{peer}: the latest step differs"
    res = {"saves_s": saves, "stored_bytes": stored, "load_s": statistics.median(loads)}
    if peer == "treepack-repo":
        res["bytes_reused"] = reused
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="16 arrays of 1 MiB (a smoke test)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--peers", default="treepack-repo,treepack,orbax,safetensors")
    ap.add_argument("--out")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        peer, where, n, side = a.child
        print(json.dumps(child(peer, where, int(n), int(side))))
        return
    n, side = (16, 512) if a.quick else (64, 1024)
    peers = a.peers.split(",")
    runs: dict = {p: [] for p in peers}
    for _ in range(1 if a.quick else a.rounds):
        for p in peers:
            where = tempfile.mkdtemp(prefix="w8-")
            try:
                r = subprocess.run([sys.executable, __file__, "--child", p, where, str(n), str(side)],
                                   capture_output=True, text=True, check=False)
                if r.returncode != 0:
                    print(f"{p}: failed: {r.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
                    continue
                runs[p].append(json.loads(r.stdout.strip().splitlines()[-1]))
            finally:
                shutil.rmtree(where, ignore_errors=True)
    first = n * side * side * 4
    changed = changed_bytes(n, side)
    table = {}
    for p, rs in runs.items():
        if not rs:
            continue
        table[p] = {
            "total_save_s": statistics.median(sum(r["saves_s"]) for r in rs),
            "first_save_s": statistics.median(r["saves_s"][0] for r in rs),
            "incremental_save_s_median": statistics.median(statistics.median(r["saves_s"][1:]) for r in rs),
            "incremental_save_s_max": statistics.median(max(r["saves_s"][1:]) for r in rs),
            "stored_bytes": statistics.median(r["stored_bytes"] for r in rs),
            "load_latest_s": statistics.median(r["load_s"] for r in rs),
        }
    print(f"W8 checkpoint history: {STEPS} saves of {first / MiB:.0f} MiB ({n} arrays), "
          f"{changed / MiB:.0f} MiB changed in all; ideal storage {(first + changed) / MiB:.0f} MiB")
    print(f"{'peer':<15}{'total save':>12}{'first':>10}{'incr. med':>11}{'incr. max':>11}{'stored':>12}{'load latest':>13}")
    for p, t in table.items():
        print(f"{p:<15}{t['total_save_s']:>11.2f}s{t['first_save_s']:>9.3f}s{t['incremental_save_s_median']:>10.3f}s"
              f"{t['incremental_save_s_max']:>10.3f}s{t['stored_bytes'] / MiB:>10.0f}MiB{t['load_latest_s']:>12.3f}s")
    targets = {}
    if "treepack-repo" in table:
        r = table["treepack-repo"]
        targets["stored <= 1.25 x (first + changed)"] = {
            "measured": r["stored_bytes"] / (first + changed), "met": r["stored_bytes"] <= 1.25 * (first + changed)}
        if "treepack" in table:
            full = statistics.median(statistics.median(x["saves_s"]) for x in runs["treepack"])
            targets["incremental save <= 0.25 x full save (max over steps)"] = {
                "measured": r["incremental_save_s_max"] / full, "met": r["incremental_save_s_max"] <= 0.25 * full}
            targets["load latest within 10% of a plain tree"] = {
                "measured": r["load_latest_s"] / table["treepack"]["load_latest_s"],
                "met": r["load_latest_s"] <= 1.10 * table["treepack"]["load_latest_s"]}
    for k, v in targets.items():
        print(f"  {k}: {v['measured']:.3f} -> {'met' if v['met'] else 'MISSED'}")
    if a.out:
        import numpy

        meta = {"python": platform.python_version(), "numpy": numpy.__version__, "cpus": os.cpu_count(),
                "arrays": n, "side": side, "steps": STEPS, "rounds": 1 if a.quick else a.rounds}
        with open(a.out, "w") as f:
            json.dump({"meta": meta, "peers": table, "runs": runs, "targets": targets}, f, indent=1)


if __name__ == "__main__":
    main()
