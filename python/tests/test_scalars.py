"""Scalar-heavy trees (issue 34): the paths tuned for them stay correct.

Manifests of 1 MiB or more whose containers hold 256 items or more are parsed with the help of
one kept helper thread, lent to one parse at a time (docs/design.md, decision 48). These tests
load such trees from several threads at once, after a fork, and with strings that need every
kind of JSON escape."""

import os
import subprocess
import sys
import textwrap
import threading

import treepack

ODD = ["", "plain", 'q"uote\\back', "\n\r\t\x01\x1f\x7f ctl", 'é✓😀 "é" \x00', "x" * 300]


def big_tree(seed: int):
    """~1.5 MiB of manifest: 60 dicts of 400 keys (ints, floats, strings with escapes), and a
    list of 2,000 small records."""
    groups = {
        f"g{g}": {f"k{k}": (k * seed if k % 3 == 0 else k / (seed + 1) if k % 3 == 1 else ODD[k % 6] + str(k)) for k in range(400)}
        for g in range(60)
    }
    groups[ODD[3]] = {ODD[i]: ODD[(i + 1) % 6] for i in range(6)}
    calls = [{"id": f"call-{i}", "n": i, "ok": i % 2 == 0, "p": None, "tags": [ODD[i % 6], "t"]} for i in range(2000)]
    return {"groups": groups, "calls": calls, "seed": seed}


def test_concurrent_loads_of_big_scalar_trees(tmp_path):
    paths = []
    for s in range(4):
        p = tmp_path / f"t{s}"
        treepack.save(big_tree(s), p)
        paths.append(p)
    assert os.path.getsize(paths[0] / "treepack.json") > 1 << 20
    errors, done = [], []

    def worker(s):
        try:
            for _ in range(3):
                assert treepack.load(paths[s]) == big_tree(s)
            done.append(s)
        except BaseException as e:  # reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a concurrent load hung"
    assert not errors, errors
    assert sorted(done) == [0, 1, 2, 3]


def test_escaped_strings_round_trip_in_keys_and_values(tmp_path):
    tree = {k: [k, {k: k}] for k in ODD}
    treepack.save(tree, tmp_path / "t")
    assert treepack.load(tmp_path / "t") == tree
    treepack.save(tree, tmp_path / "t.tpk")
    assert treepack.load(tmp_path / "t.tpk") == tree


FORK_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, sys.argv[2])
    import treepack
    from test_scalars import big_tree

    p = sys.argv[1]
    treepack.save(big_tree(7), p)
    assert treepack.load(p) == big_tree(7)  # the parent's helper thread exists now
    pid = os.fork()
    if pid == 0:
        signal.alarm(60)  # a hang fails the test instead of stalling the suite
        ok = treepack.load(p) == big_tree(7)
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child status {status}"
    print("ok")
    """
)


def test_a_forked_child_loads_with_its_own_parse_helper(tmp_path):
    script = tmp_path / "fork.py"
    script.write_text(FORK_SCRIPT)
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "t"), here], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr
