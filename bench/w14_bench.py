"""W14 (issue 53): big trees at the storage limit. A tree of N GiB of float32 in 64 arrays saved
(durable and not) and loaded cold, beside safetensors and torch.save, with fio's bandwidth of the
same disk measured in the same run as the limit.

    PYTHONPATH=<release build> .venv/bin/python bench/w14_bench.py [--gib 4] [--runs 3] [--out FILE]

Every case runs in a fresh process that times only the call and reports its peak RSS. Saves go
to a fresh place after `sync` (earlier dirty pages are not this save's to flush); saves and
loads alike start with the page cache dropped (`/proc/sys/vm/drop_caches`, so run as root). On
a VM, memory the guest freed lately (as dropping the cache does) is several times slower to
touch again than pages it still holds, so a buffered save right after a dropped cache is slower
than one after another save: every case starts from the same state, or the order of the cases
decides the result. Cases are interleaved
round by round and medians reported. The arrays' bytes are all distinct (consecutive uint32
values viewed as float32), so nothing deduplicates, and they are made at memory speed.

Limits, from fio in the same run (1 MiB blocks, queue depth 16, libaio, one file of the tree's
size): O_DIRECT sequential write (with an fsync at the end), buffered sequential write with an
fsync at the end, O_DIRECT and buffered sequential read. Targets (issue 53): durable save >= 75 %
of O_DIRECT write; `durable=False` save and every load >= 1.2x safetensors; load RSS <= 1.1x
the data; a verified load within 1.15x of `verify=False` (`treepack-noverify`, the directory
tree loaded again).

safetensors would need more memory than the machine has above `--peer-gib` (`save_file` builds
the whole file in memory, and a load of it holds the file's mapping and a copy): it is left out
there.
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

HERE = os.path.dirname(os.path.abspath(__file__))
ARRAYS = 64

CHILD = r"""
import sys, time, os, resource
import numpy as np
sys.path.insert(0, {here!r})
from case import _fsync
op, peer, path, gib = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
ARRAYS = {arrays}

def tree():
    n = int(gib * (1 << 30)) // 4 // ARRAYS
    return {{f"layer{{i:02d}}": np.arange(i * n, (i + 1) * n, dtype=np.uint32).view(np.float32) for i in range(ARRAYS)}}

if op == "save":
    t0 = tree()
    if peer.startswith("torch"):
        import torch
        t0 = {{k: torch.from_numpy(v) for k, v in t0.items()}}
    if peer.startswith("safetensors"):
        import safetensors.numpy
    if peer.startswith("treepack"):
        import treepack
    t = time.perf_counter()
    if peer == "treepack":
        treepack.save(t0, path)
    elif peer == "treepack-tpk":
        treepack.save(t0, path)
    elif peer == "treepack-nosync":
        treepack.save(t0, path, durable=False)
    elif peer == "safetensors":
        safetensors.numpy.save_file(t0, path)
    elif peer == "safetensors-fsync":
        safetensors.numpy.save_file(t0, path)
        _fsync(path)
    elif peer == "torch":
        torch.save(t0, path)
    else:
        raise SystemExit("unknown peer " + peer)
else:
    if peer.startswith("treepack"):
        import treepack
        t = time.perf_counter()
        out = treepack.load(path, verify=peer != "treepack-noverify")
    elif peer.startswith("safetensors"):
        import safetensors.numpy
        t = time.perf_counter()
        out = safetensors.numpy.load_file(path)
        # load_file maps the file: touch every page so the bytes are read, as a load must.
        s = 0
        for v in out.values():
            s += int(v.view(np.uint8)[::4096].sum())
    elif peer == "torch":
        import torch
        t = time.perf_counter()
        out = torch.load(path, weights_only=True)
    else:
        raise SystemExit("unknown peer " + peer)
elapsed = time.perf_counter() - t
print(elapsed, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""

SAVE_PEERS = ["treepack", "treepack-tpk", "treepack-nosync", "safetensors", "safetensors-fsync", "torch"]
# What each load reads (the file a save peer wrote).
LOAD_PEERS = {"treepack": "treepack", "treepack-tpk": "treepack-tpk", "safetensors": "safetensors", "torch": "torch"}


def drop_caches() -> None:
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        # Not root (or no /proc): the page cache stays, and the loads read from it.
        pass


def clean(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.remove(path)
    os.sync()


def run_child(op: str, peer: str, path: str, gib: float) -> tuple[float, int]:
    code = CHILD.format(arrays=ARRAYS, here=HERE)
    out = subprocess.run([sys.executable, "-c", code, op, peer, path, str(gib)], capture_output=True, text=True,
                         env=os.environ)
    if out.returncode != 0:
        raise RuntimeError(f"{op} {peer}: {out.stderr[-2000:]}")
    t, rss = out.stdout.strip().splitlines()[-1].split()
    return float(t), int(rss)


def fio(kind: str, path: str, gib: float) -> float:
    """fio's bandwidth in GiB/s for one sequential pass over a file of the tree's size."""
    rw, direct = {"write-direct": ("write", 1), "write-buffered-fsync": ("write", 0), "read-direct": ("read", 1),
                  "read-buffered": ("read", 0)}[kind]
    size = f"{max(1, int(gib * 1024))}M"
    args = ["fio", "--name=w14", f"--filename={path}", f"--rw={rw}", "--bs=1M", f"--size={size}",
            f"--direct={direct}", "--output-format=json", "--group_reporting"]
    args += ["--ioengine=libaio", "--iodepth=16"] if direct else ["--ioengine=psync"]
    if rw == "write":
        args.append("--end_fsync=1")
        clean(path)
    else:
        drop_caches()
    out = subprocess.run(args, capture_output=True, text=True, check=True)
    j = json.loads(out.stdout[out.stdout.index("{"):])
    job = j["jobs"][0]
    side = job[rw]
    # bw_bytes counts the transfer; with end_fsync the wall-clock (job_runtime) holds the fsync.
    seconds = job["job_runtime"] / 1000.0
    moved = side["io_bytes"]
    return moved / seconds / (1 << 30) if seconds > 0 else side["bw_bytes"] / (1 << 30)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--peers", default=",".join(SAVE_PEERS))
    ap.add_argument("--peer-gib", type=float, default=6.0,
                    help="leave out the peers that hold the tree twice above this size")
    ap.add_argument("--no-fio", action="store_true")
    ap.add_argument("--out")
    a = ap.parse_args()
    peers = [p for p in a.peers.split(",") if p]
    if a.gib > a.peer_gib:
        peers = [p for p in peers if not p.startswith("safetensors")]
    times: dict = {}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR", "/var/tmp")) as d:
        for run in range(a.runs):
            if not a.no_fio and shutil.which("fio"):
                f = os.path.join(d, "fio.dat")
                for kind in ("write-direct", "write-buffered-fsync", "read-direct", "read-buffered"):
                    times.setdefault(("fio", kind), []).append((fio(kind, f, a.gib), 0))
                clean(f)
            order = peers if run % 2 == 0 else peers[::-1]
            for peer in order:
                p = os.path.join(d, peer + (".tpk" if peer == "treepack-tpk" else ""))
                clean(p)
                drop_caches()
                times.setdefault(("save", peer), []).append(run_child("save", peer, p, a.gib))
                loads = [peer] if peer in LOAD_PEERS else []
                if peer == "treepack":
                    # The same tree loaded without checking its hashes (what verification costs),
                    # before or after the verified load by turns.
                    loads = [peer, "treepack-noverify"][:: 1 if run % 2 == 0 else -1]
                for case in loads:
                    drop_caches()
                    times.setdefault(("load", case), []).append(run_child("load", case, p, a.gib))
                clean(p)
    data = a.gib
    print(f"W14 {a.gib} GiB in {ARRAYS} float32 arrays: medians of {a.runs} ({platform.node()}, {os.cpu_count()} cores)")
    rows = []
    med = {k: statistics.median(t for t, _ in v) for k, v in times.items()}
    for (op, peer), v in times.items():
        if op == "fio":
            rate = med[(op, peer)]
            print(f"fio   {peer:22} {rate:6.2f} GiB/s  runs {[round(t, 2) for t, _ in v]}")
            rows.append({"op": op, "case": peer, "gib_s": rate, "runs": [t for t, _ in v]})
            continue
        m = med[(op, peer)]
        rss = statistics.median(r for _, r in v) / (1 << 30)
        st = med.get((op, "safetensors"))
        vs = f"{st / m:5.2f}x safetensors" if st else ""
        print(f"{op:5} {peer:22} {m * 1000:8.0f} ms {data / m:6.2f} GiB/s  RSS {rss / data:4.2f}x data  {vs}"
              f"  runs {[round(t * 1000) for t, _ in v]}")
        rows.append({"op": op, "case": peer, "median_s": m, "gib_s": data / m, "rss_bytes": [r for _, r in v],
                     "runs": [t for t, _ in v]})
    if ("load", "treepack-noverify") in med:
        print(f"verified load / verify=False: {med[('load', 'treepack')] / med[('load', 'treepack-noverify')]:.2f}x")
    wd = med.get(("fio", "write-direct"))
    if wd:
        for peer in ("treepack", "treepack-tpk"):
            if ("save", peer) in med:
                print(f"durable save {peer}: {data / med[('save', peer)] / wd * 100:.0f} % of fio O_DIRECT write")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"gib": a.gib, "runs": a.runs, "rows": rows, "machine": platform.node()}, f, indent=1)


if __name__ == "__main__":
    main()
