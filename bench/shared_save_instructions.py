"""Instructions per save of W11 trees whose records share an object, counted by callgrind: the
measure behind docs/design.md decision 62 (issues 34 and 26). Timings on this shared VM swing
by half between minutes; instruction counts do not.

    python bench/shared_save_instructions.py [--leaves 100000]

Cases: `plain` (W11 as is), `dict` (each record also holds one shared config dict), `copies`
(each its own copy of that dict), `array` (one shared numpy array). Each is saved with text
(what `save` does) and as nodes only (`text=False`, the path a shared object used to send the
whole save down), with `durable=False` (no fsync). Each case runs in a fresh process under
callgrind, all threads counted, less a process that builds the same tree and saves nothing.
pickle.dumps of the same tree is given for scale. Needs valgrind.
"""

import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

CHILD = r"""
import pickle, sys, tempfile
sys.path.insert(0, sys.argv[4])
import numpy as np
from treepack import _api, _codec
from workloads import w11
case, how, leaves = sys.argv[1], sys.argv[2], int(sys.argv[3])
t = w11(leaves)
cfg, arr = {"model": "gpt", "temperature": 0.7}, np.arange(2)
tree = {"plain": lambda: t, "dict": lambda: [dict(r, config=cfg) for r in t],
        "copies": lambda: [dict(r, config=dict(cfg)) for r in t],
        "array": lambda: [dict(r, config=arr) for r in t]}[case]()
if how == "pickle":
    pickle.dumps(tree, protocol=5)
elif how != "none":
    p = _api._core.prepare(tree, _codec.encode_other, _codec.encode_array, text=how == "text")
    p.write(tempfile.mkdtemp() + "/t", durable=False)
"""


def count(case: str, how: str, leaves: int, d: str) -> int:
    out = os.path.join(d, f"cg-{case}-{how}")
    subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, "-c", CHILD, case, how,
         str(leaves), HERE],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    with open(out) as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("summary:"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--leaves", type=int, default=100_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        for case in ("plain", "dict", "copies", "array"):
            base = count(case, "none", args.leaves, d)
            got = {how: (count(case, how, args.leaves, d) - base) / 1e6 for how in ("text", "nodes", "pickle")}
            print(f"W11 {args.leaves} {case:6}  save {got['text']:6.1f} M   as nodes {got['nodes']:6.1f} M"
                  f"   pickle.dumps {got['pickle']:6.1f} M  instructions")


if __name__ == "__main__":
    main()
