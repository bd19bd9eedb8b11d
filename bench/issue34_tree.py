"""The tree issue 34 was filed with, timed as a new user would: one process, warm cache,
medians of 7, the cases alternated. A dict of 100 groups x 1,000 generated keys, a third each
ints, floats and short strings (100k leaves); treepack (durable default and `durable=False`),
pickle protocol 5 and the standard library's json, each with its file write or read.

    python bench/issue34_tree.py [--runs 7]
"""

import argparse
import json
import os
import pickle
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import treepack  # noqa: E402
from alternate import alternate, print_medians  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    tree = {f"group{i}": {f"key{j}": (j if j % 3 == 0 else j * 0.5 if j % 3 == 1 else f"v{j}") for j in range(1000)}
            for i in range(100)}
    d = tempfile.mkdtemp()
    tp, tpn, pk, js = (os.path.join(d, n) for n in ("tp", "tpn", "t.pkl", "t.json"))

    def tp_save(path, durable):
        shutil.rmtree(path, ignore_errors=True)
        treepack.save(tree, path, durable=durable)

    def pk_save():
        with open(pk, "wb") as f:
            pickle.dump(tree, f, protocol=5)

    def js_save():
        with open(js, "w") as f:
            f.write(json.dumps(tree))

    def pk_load():
        with open(pk, "rb") as f:
            return pickle.load(f)

    def js_load():
        with open(js) as f:
            return json.loads(f.read())

    cases = {
        "treepack save": lambda: tp_save(tp, True),
        "treepack save, durable=False": lambda: tp_save(tpn, False),
        "pickle save": pk_save,
        "json save": js_save,
        "treepack load": lambda: treepack.load(tp),
        "pickle load": pk_load,
        "json load": js_load,
    }
    try:
        for f in cases.values():  # warm-up (and the files the loads read)
            f()
        assert treepack.load(tp) == tree
        print_medians(alternate({k: (lambda i, f=f: f()) for k, f in cases.items()}, args.runs))
    finally:
        shutil.rmtree(d)


if __name__ == "__main__":
    main()
