"""The walk of a save (`prepare`: Python tree -> what the writer writes) with text fragments and
with nodes only, and whole saves against pickle, alternated in one process (minimum and median
of N runs each): the A/B behind bench/RESULTS.md's session 24 table (issue 34).

    python bench/w11_walk.py [--leaves 100000] [--runs 30]
"""

import argparse
import os
import pickle
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from alternate import alternate, print_medians  # noqa: E402
from workloads import w2, w11  # noqa: E402

import treepack  # noqa: E402
from treepack import _codec, _core  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--leaves", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    enc = lambda o, w: _codec.encode_other(o, w, False, {}, False, False)  # noqa: E731
    d = tempfile.mkdtemp()
    try:
        for name, tree in ((f"W11 {args.leaves}", w11(args.leaves)), ("W2", w2(1.0))):
            cases = {
                "walk, text": lambda i: _core.prepare(tree, enc, _codec.encode_array, text=True),
                "walk, nodes": lambda i: _core.prepare(tree, enc, _codec.encode_array, text=False),
                "save, durable=False": lambda i: treepack.save(tree, os.path.join(d, f"s{i}"), durable=False, overwrite=True),
                "pickle.dumps + write": lambda i: open(os.path.join(d, "p"), "wb").write(pickle.dumps(tree, protocol=5)),
            }
            print_medians(alternate({k: (lambda i, f=f: f(i % 4)) for k, f in cases.items()}, args.runs), f"{name:10} ")
    finally:
        shutil.rmtree(d)


if __name__ == "__main__":
    main()
