"""Encrypted trees (issue 55): W1 saved and loaded plain and encrypted, in the same run.
Target: encrypted save and load >= 0.7x plain (time ratio plain/encrypted).

    PYTHONPATH=<release build> .venv/bin/python bench/encryption_bench.py [--scale 1.0] [--runs 5] [--out FILE]

W1 (bench/workloads.py: ~1 GiB x scale in 200 float32 arrays) is saved as a directory and as a
`.tpk`, plain and with a 32-byte key (`encryption=`), each save and each load in a fresh process
(the child times only the call), the variants interleaved run by run, medians reported. Saves
are durable (the default: fsync), each to a fresh place after `sync` (a plain save over an
identical tree would find its content-named packs already there). Loads read from the page cache (the tree was just written):
the case where decryption is the most visible against the I/O it adds to. A passphrase save
and load is timed too (Argon2id: one derivation each), and `open(...)[leaf][slice]` — a
partial read of one row — plain and encrypted.
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
KEY = bytes(range(32))

CHILD = r"""
import sys, time, os
sys.path.insert(0, {here!r})
import treepack
from workloads import w1
op, path, enc, scale = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
key = {{"plain": None, "key": bytes(range(32)), "passphrase": treepack.Passphrase("bench passphrase")}}[enc]
if op == "save":
    tree = w1(scale)
    t = time.perf_counter()
    treepack.save(tree, path, encryption=key)
elif op == "load":
    t = time.perf_counter()
    treepack.load(path, encryption=key)
else:
    v = treepack.open(path, encryption=key)
    t = time.perf_counter()
    leaf = v
    while not hasattr(leaf, "shape"):
        leaf = leaf[next(iter(leaf.keys()))]
    leaf[3:4]
print(time.perf_counter() - t)
"""


def fresh(path: str) -> None:
    """Each save writes to a fresh place, with the disk's earlier writes flushed first: a plain
    save over the same tree finds its content-named packs there already, and dirty pages of the
    last save would be flushed by this one's fsync."""
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.remove(path)
    os.sync()


def timed(op: str, path: str, enc: str, scale: float) -> float:
    if op == "save":
        fresh(path)
    code = CHILD.format(here=HERE)
    out = subprocess.run([sys.executable, "-c", code, op, path, enc, str(scale)], capture_output=True, text=True,
                         check=True, env=os.environ)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out")
    a = ap.parse_args()
    variants = [(layout, enc) for layout in ("dir", "tpk") for enc in ("plain", "key")]
    times: dict = {}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as d:
        for run in range(a.runs):
            for op in ("save", "load", "partial"):
                order = variants if run % 2 == 0 else variants[::-1]
                for layout, enc in order:
                    p = os.path.join(d, f"{enc}.tpk" if layout == "tpk" else enc)
                    times.setdefault((op, layout, enc), []).append(timed(op, p, enc, a.scale))
        pw = os.path.join(d, "pw.tpk")
        for op in ("save", "load"):
            times[(op, "tpk", "passphrase")] = [timed(op, pw, "passphrase", a.scale) for _ in range(max(1, a.runs // 2))]
    gib = 1.0 * a.scale  # W1 is ~1 GiB x scale of array data
    rows = []
    print(f"W1 x {a.scale}: medians of {a.runs} fresh processes ({platform.node()}, {os.cpu_count()} cores)")
    print(f"{'op':8} {'layout':6} {'key':11} {'median':>10} {'GiB/s':>7} {'plain/this':>10}")
    for (op, layout, enc), ts in sorted(times.items()):
        m = statistics.median(ts)
        base = statistics.median(times[(op, layout, "plain")]) if (op, layout, "plain") in times else m
        ratio = base / m
        rate = gib / m if op != "partial" else float("nan")
        rows.append({"op": op, "layout": layout, "key": enc, "median_s": m, "runs": ts, "ratio_vs_plain": ratio})
        print(f"{op:8} {layout:6} {enc:11} {m * 1000:8.1f}ms {rate:7.2f} {ratio:10.2f}x")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"scale": a.scale, "runs": a.runs, "rows": rows, "machine": platform.node()}, f, indent=1)


if __name__ == "__main__":
    main()
