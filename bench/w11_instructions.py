"""Instructions per load of a W11 tree, per thread, counted by callgrind: the measure behind
bench/RESULTS.md's session 26 table (issue 34). Timings on this shared VM swing by half between
minutes; instruction counts do not, and the split between the calling thread (which builds the
Python objects) and the parse helper shows which one sets a load's pace.

    python bench/w11_instructions.py [--leaves 100000] [--loads 2]

Needs valgrind. Each case runs in a fresh process under callgrind, and a process that only
imports treepack (and reads the files) is subtracted, so what is printed is per load.
"""

import argparse
import glob
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

CHILD = r"""
import pickle, sys
import treepack
case, tree_dir, pickle_path, loads = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
blob = open(pickle_path, "rb").read()
for _ in range(loads if case != "none" else 0):
    out = treepack.load(tree_dir) if case == "treepack" else pickle.loads(blob)
    del out
"""


def per_thread(case: str, d: str, loads: int) -> list:
    """Instructions of each thread (the calling thread first) of one callgrind run."""
    out = os.path.join(d, f"cg-{case}")
    for f in glob.glob(out + "*"):
        os.remove(f)
    subprocess.run(
        ["valgrind", "--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={out}.%p",
         sys.executable, "-c", CHILD, case, os.path.join(d, "tree"), os.path.join(d, "tree.pkl"), str(loads)],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    counts = []
    for f in sorted(glob.glob(out + ".*-*")):
        with open(f) as fh:
            counts.append(next(int(line.split()[1]) for line in fh if line.startswith("summary:")))
    return counts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--leaves", type=int, default=100_000)
    ap.add_argument("--loads", type=int, default=2)
    args = ap.parse_args()
    sys.path.insert(0, HERE)
    import pickle

    import treepack
    from workloads import w11

    with tempfile.TemporaryDirectory() as d:
        tree = w11(args.leaves)
        treepack.save(tree, os.path.join(d, "tree"), durable=False)
        with open(os.path.join(d, "tree.pkl"), "wb") as f:
            f.write(pickle.dumps(tree, protocol=5))
        base = per_thread("none", d, args.loads)[0]
        for case in ("treepack", "pickle"):
            counts = per_thread(case, d, args.loads)
            main_thread = (counts[0] - base) / args.loads
            # Threads other than the calling one: the parse helper is the busiest (the others
            # are the pools' threads, idle in a load of plain values).
            helper = max(counts[1:], default=0) / args.loads if case == "treepack" else 0
            print(f"W11 {args.leaves} {case:8} calling thread {main_thread / 1e6:7.1f} M"
                  + (f"   busiest other thread {helper / 1e6:7.1f} M" if helper else "") + "  instructions per load")


if __name__ == "__main__":
    main()
