"""Signatures (issue 55): checking the signature of a 100k-leaf tree. Target: < 50 ms.

    .venv/bin/python bench/signing_bench.py [--runs 9] [--out bench/results/signing-….json]

Run with a release build (bench/setup.sh, or any venv with a release wheel). The tree is W2
(bench/workloads.py: 100k small leaves — ints, floats, strings, tiny arrays), saved as a
directory and as a `.tpk`, signed with Ed25519 and with ECDSA P-256. Timed in this process,
page cache warm, median of `--runs` after one warm-up:

- `verify_signature`: `treepack.verify_signature(path, public_key)` — everything a check costs:
  the manifest read and parsed, the root hash computed from it, the signature file read, one
  signature verified, the statement compared. The target is on this.
- `root_hash`: `treepack.root_hash(path)` — the same without the signature (manifest, root):
  what the signature itself adds is the difference.
- `load` / `load signed_by`: a whole load without and with `signed_by=` (the signed load checks,
  then loads requiring the signed root).
- `sign`: `treepack.sign(path, key)` (reads the manifest, computes the root, writes the file).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import treepack  # noqa: E402
from workloads import w2  # noqa: E402

TARGET_MS = 50.0


def timed(fn, runs: int) -> float:
    """Median milliseconds of `runs` calls after one warm-up."""
    fn()
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--out")
    a = ap.parse_args()
    tree = w2(1.0)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        keys = {}
        for alg in ("ed25519", "ecdsa-p256"):
            k = os.path.join(d, f"{alg}.pem")
            treepack.generate_key(k, algorithm=alg)
            keys[alg] = (k, k[:-4] + ".pub.pem")
        for layout, name in (("directory", "w2"), ("single file", "w2.tpk")):
            path = os.path.join(d, name)
            treepack.save(tree, path, durable=False)
            leaves = len(treepack.load_structure(path)["opt"]) * 4
            for alg, (priv, pub) in keys.items():
                sign_ms = timed(lambda: treepack.sign(path, priv), a.runs)
                row = {
                    "layout": layout, "algorithm": alg, "leaves": leaves,
                    "manifest_bytes": os.path.getsize(os.path.join(path, "treepack.json")) if os.path.isdir(path)
                    else os.path.getsize(path),
                    "verify_signature_ms": timed(lambda: treepack.verify_signature(path, pub), a.runs),
                    "root_hash_ms": timed(lambda: treepack.root_hash(path), a.runs),
                    "load_ms": timed(lambda: treepack.load(path), max(3, a.runs // 3)),
                    "load_signed_ms": timed(lambda: treepack.load(path, signed_by=pub), max(3, a.runs // 3)),
                    "sign_ms": sign_ms,
                }
                row["signature_only_ms"] = row["verify_signature_ms"] - row["root_hash_ms"]
                row["target_met"] = row["verify_signature_ms"] < TARGET_MS
                rows.append(row)
                print(f"{layout:12} {alg:11} {leaves} leaves: verify_signature {row['verify_signature_ms']:.1f} ms "
                      f"(root_hash alone {row['root_hash_ms']:.1f} ms, signature +{row['signature_only_ms']:.1f} ms); "
                      f"load {row['load_ms']:.0f} ms, with signed_by {row['load_signed_ms']:.0f} ms; "
                      f"sign {row['sign_ms']:.1f} ms; target < {TARGET_MS:.0f} ms: "
                      f"{'met' if row['target_met'] else 'MISSED'}")
    if a.out:
        meta = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
                "treepack": treepack.__version__, "runs": a.runs}
        with open(a.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
