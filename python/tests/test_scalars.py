"""Scalar-heavy trees (issue 34): the paths tuned for them stay correct.

Manifests of 1 MiB or more whose containers hold 256 items or more are parsed with the help of
one kept helper thread, lent to one parse at a time (docs/design.md, decision 48). These tests
load such trees from several threads at once, after a fork, and with strings that need every
kind of JSON escape."""

import dataclasses
import os
import random
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

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


def run_script(tmp_path, text: str) -> None:
    """Run `text` in a fresh interpreter with (a scratch location, this folder) as arguments;
    it must print `ok`."""
    script = tmp_path / "script.py"
    script.write_text(text)
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "t"), here], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr


def test_a_forked_child_loads_with_its_own_parse_helper(tmp_path):
    run_script(tmp_path, FORK_SCRIPT)


# ---------------------------------------------------------------- text fragments
# A save writes plain subtrees (lists, tuples, dicts with str keys, inline scalars) as manifest
# text while it walks them (`Fragment`, docs/design.md decision 59) instead of building a node
# per value. The manifest must be byte for byte what the node path writes, for every tree.


@dataclasses.dataclass
class Rec:
    a: object
    b: object


def _random_tree(rng: random.Random, depth: int = 0):
    """Trees mixing everything the text path writes with everything it must leave to nodes."""
    scalars = [
        lambda: None, lambda: True, lambda: False, lambda: rng.randint(-10**6, 10**6), lambda: 2**64 + rng.randint(0, 9),
        lambda: -(2**70), lambda: rng.random(), lambda: float("nan"), lambda: float("-inf"), lambda: -0.0,
        lambda: rng.choice(ODD), lambda: "s" * rng.choice([0, 1, 4096, 4097]), lambda: b"bytes",
        lambda: np.arange(rng.randint(0, 40), dtype=np.float32), lambda: np.int16(7), lambda: 1 + 2j,
    ]
    if depth > 4 or rng.random() < 0.3:
        return rng.choice(scalars)()
    n = rng.randint(0, 6)
    kind = rng.random()
    kids = [_random_tree(rng, depth + 1) for _ in range(n)]
    if kind < 0.3:
        return kids
    if kind < 0.45:
        return tuple(kids)
    if kind < 0.55:
        return Rec(kids[0] if kids else 1, {"x": kids})
    keys = [rng.choice([f"k{i}", ODD[i % 6] + str(i), i, (i, "t"), None if i == 0 else f"n{i}"]) for i in range(n)]
    return dict(zip(keys, kids))


def _manifests(tree, tmp_path, name, **kw):
    """The manifest bytes of `tree` saved with text fragments and with nodes only."""
    from treepack import _api

    orig = _api._core.prepare
    out = []
    for text in (True, False):
        _api._core.prepare = lambda *a, _t=text, **k: orig(*a, text=_t, **k)
        try:
            p = tmp_path / f"{name}-{text}"
            treepack.save(tree, p, **kw)
            out.append((p / "treepack.json").read_bytes())
        finally:
            _api._core.prepare = orig
    return out


def test_text_fragments_write_the_same_manifest_as_nodes(tmp_path):
    rng = random.Random(34)
    for i in range(300):
        tree = {"t": _random_tree(rng), "i": i}
        with_text, nodes = _manifests(tree, tmp_path, str(i))
        assert with_text == nodes, f"tree {i}: {tree!r}"[:2000]
        back = treepack.load(tmp_path / f"{i}-True", trust=[f"{Rec.__module__}.Rec"])
        treepack.save(back, tmp_path / f"{i}-again")
        assert (tmp_path / f"{i}-again" / "treepack.json").read_bytes() == with_text, i


def test_shared_plain_objects_are_one_object_after_a_text_walk(tmp_path):
    # A dict of plain values written as text, then met again: the walk starts over with nodes
    # (its text carries no shared id), and the copy loads as one object.
    cfg = {"lr": 0.1, "layers": [1, 2, 3]}
    tree = {"a": cfg, "b": [cfg, cfg["layers"]], "c": (1, [cfg])}
    with_text, nodes = _manifests(tree, tmp_path, "shared")
    assert with_text == nodes and b'"t":"shared"' in with_text
    back = treepack.load(tmp_path / "shared-True")
    assert back["a"] is back["b"][0] is back["c"][1][0] and back["b"][1] is back["a"]["layers"]
    loop = [1, {"k": "v"}]
    loop.append(loop)
    with_text, nodes = _manifests({"loop": loop}, tmp_path, "cycle")
    assert with_text == nodes
    back = treepack.load(tmp_path / "cycle-True")["loop"]
    assert back[2] is back and back[1] == {"k": "v"}
    # Held only by the tree (no variable refers to them): the walk keeps out of its memo the
    # containers only their parent holds, and these are held twice.
    row = {"k": [1, 2]}
    rows = [row, {"other": row["k"]}, row]
    ring = [0]
    ring.append(ring)
    # A list and a tuple held twice by the tree only (the walk's own iterator over them must
    # not count as a holder, nor hide the second).
    tup = ("x", [9])
    tree = {"rows": rows, "ring": ring, "tups": [tup, [tup[1], tup]]}
    del row, rows, ring, tup
    with_text, nodes = _manifests(tree, tmp_path, "held")
    assert with_text == nodes
    back = treepack.load(tmp_path / "held-True")
    assert back["rows"][0] is back["rows"][2] and back["rows"][1]["other"] is back["rows"][0]["k"]
    assert back["ring"][1] is back["ring"]
    assert back["tups"][0] is back["tups"][1][1] and back["tups"][1][0] is back["tups"][0][1]
    # The first walk of such a tree skips its scalars once it knows it will be walked again: a
    # string JSON cannot hold (lone surrogates) is met by the second, which stores it (`py.str`).
    odd = {"a": cfg, "b": cfg, "rows": [{"s": "\ud800"}, {"s": "\ud800", "t": "x\udce9"}]}
    with_text, nodes = _manifests(odd, tmp_path, "odd")
    assert with_text == nodes
    back = treepack.load(tmp_path / "odd-True")
    assert back == odd and back["a"] is back["b"]


def _share_randomly(rng: random.Random, tree):
    """`tree` with some of its containers, arrays and records placed again elsewhere (and a
    few made to hold themselves): shared objects everywhere the text walk writes."""
    pool = []

    def collect(t):
        if isinstance(t, (list, dict, np.ndarray, Rec)) or (isinstance(t, tuple) and t):
            pool.append(t)
        kids = t if isinstance(t, (list, tuple)) else t.values() if isinstance(t, dict) else [t.a, t.b] if isinstance(t, Rec) else []
        for k in kids:
            collect(k)

    collect(tree)
    if not pool:
        return tree
    holders = [t for t in pool if isinstance(t, (list, dict))]
    for _ in range(rng.randint(1, 4)):
        target, holder = rng.choice(pool), rng.choice(holders) if holders else None
        if holder is None:
            break
        if isinstance(holder, list):
            holder.insert(rng.randint(0, len(holder)), target)  # may be itself: a cycle
        else:
            holder[f"again{rng.randint(0, 99)}"] = target
    return {"tree": tree, "tail": rng.choice(pool)}


def test_shared_objects_written_as_text_give_the_same_manifest_as_nodes(tmp_path):
    # A plain container met again after it was written as text: the first walk finds every
    # object met again, the second writes their shared nodes and refs as text with their final
    # ids. Byte for byte what the node path writes, and the objects load as one.
    rng = random.Random(2611)
    shared = 0
    repo = treepack.Repository(tmp_path / "repo", create=True)
    for i in range(300):
        tree = _share_randomly(rng, {"t": _random_tree(rng), "i": i})
        with_text, nodes = _manifests(tree, tmp_path, f"s{i}")
        assert with_text == nodes, f"tree {i}: {tree!r}"[:2000]
        shared += b'"t":"shared"' in with_text
        back = treepack.load(tmp_path / f"s{i}-True", trust=[f"{Rec.__module__}.Rec"])
        treepack.save(back, tmp_path / f"s{i}-again")
        assert (tmp_path / f"s{i}-again" / "treepack.json").read_bytes() == with_text, i
        if i % 10 == 0:
            # A repository hashes the tree before writing it, text included (its fragments
            # parsed knowing the shared ids before them): the root of the files it wrote.
            info = repo.save(tree, f"t{i}")
            assert info.root == treepack.root_hash(tmp_path / f"s{i}-True") == repo.root_hash(f"t{i}"), i
    assert shared > 200, shared


class Box:
    """Saved (below) by an encoder with a cache: a new list per call in the first walk, the
    same list afterwards, which the second walk did not expect to meet twice."""


def test_an_object_met_again_only_in_the_second_walk_sends_the_save_to_nodes(tmp_path):
    from treepack import _codec, _core

    calls, cached = [], [7, 8]

    def encode_other(obj, where):
        if not isinstance(obj, Box):
            return _codec.encode_other(obj, where, False)
        calls.append(where)
        return ("record", f"{Rec.__module__}:Rec", None, [("a", len(calls)), ("b", [7, 8] if len(calls) <= 2 else cached)])

    cfg = {"lr": 0.1}
    tree = {"a": cfg, "b": cfg, "boxes": [Box(), Box()]}
    _core.prepare(tree, encode_other, _codec.encode_array).write(str(tmp_path / "t"))
    assert len(calls) == 6  # three walks: text, text knowing `cfg`, nodes
    back = treepack.load(tmp_path / "t", trust=[f"{Rec.__module__}.Rec"])
    assert back["a"] is back["b"] and back["a"] == cfg
    r1, r2 = back["boxes"]
    assert (r1.a, r2.a, r1.b) == (5, 6, [7, 8]) and r1.b is r2.b
    # An encoder making a new list every time: the second walk is the last (four calls), with
    # the shared node and refs as text, byte for byte what the node path writes.
    def fresh(obj, where):
        if not isinstance(obj, Box):
            return _codec.encode_other(obj, where, False)
        calls.append(where)
        return ("record", f"{Rec.__module__}:Rec", None, [("a", 1), ("b", [7, 8])])

    calls.clear()
    _core.prepare(tree, fresh, _codec.encode_array).write(str(tmp_path / "two"))
    assert len(calls) == 4
    _core.prepare(tree, fresh, _codec.encode_array, text=False).write(str(tmp_path / "nodes"))
    assert (tmp_path / "two" / "treepack.json").read_bytes() == (tmp_path / "nodes" / "treepack.json").read_bytes()


def test_many_refs_among_few_containers_take_a_second_walk_and_few_do_not(tmp_path):
    # Records each holding a ref to one of a few objects kept as nodes (W3i's images): a first
    # walk would make every record a node; a second writes the refs as text. A big tree with
    # a few dozen refs keeps one walk. Either way the manifest is the node path's.
    import fractions

    from treepack import _codec, _core

    calls = []

    def counting(obj, where):
        calls.append(where)
        return _codec.encode_other(obj, where, False)

    few = [fractions.Fraction(i, 7) for i in range(10)]
    rows = [{"i": i, "f": few[i % 10]} for i in range(1000)]
    big = {"rows": [{"i": i, "s": "x"} for i in range(5000)], "refs": [few[i % 10] for i in range(70)]}
    for name, tree, walks in (("rows", rows, 2), ("big", big, 1)):
        calls.clear()
        _core.prepare(tree, counting, _codec.encode_array).write(str(tmp_path / name))
        assert len(calls) == 10 * walks, (name, len(calls))
        _core.prepare(tree, counting, _codec.encode_array, text=False).write(str(tmp_path / f"{name}-nodes"))
        assert (tmp_path / name / "treepack.json").read_bytes() == (tmp_path / f"{name}-nodes" / "treepack.json").read_bytes()
    back = treepack.load(tmp_path / "rows")
    assert back[0]["f"] is back[10]["f"] == fractions.Fraction(0, 7)


def test_text_walk_errors_name_the_place(tmp_path):
    with pytest.raises(TypeError, match=r"a/1`: dict key 'x\\udc80' is not valid Unicode .*os\.fsencode"):
        treepack.save({"a": [1, {"x\udc80": 1}]}, tmp_path / "s")
    with pytest.raises(TypeError, match=r"a/0/b.*not supported"):
        treepack.save({"a": [{"b": object()}]}, tmp_path / "o")
    deep: list = []
    x = deep
    for _ in range(1100):
        x.append([])
        x = x[0]
    with pytest.raises(ValueError, match="nested deeper than 1000"):
        treepack.save(deep, tmp_path / "d")
    loop: list = [1]
    loop.append({"again": loop})
    with pytest.raises(ValueError, match="reference cycle at `<root>`: it contains itself at `1/again`"):
        treepack.save(loop, tmp_path / "c", shared=False)
    assert not any(tmp_path.iterdir())


ONE_CORE_SCRIPT = textwrap.dedent(
    """
    import os, sys
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    sys.path.insert(0, sys.argv[2])
    import treepack
    from test_scalars import big_tree

    p = sys.argv[1]
    treepack.save(big_tree(5), p)
    assert os.path.getsize(os.path.join(p, "treepack.json")) > 1 << 20
    assert treepack.load(p) == big_tree(5)
    print("ok")
    """
)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux CPU affinity")
def test_a_one_core_process_parses_big_manifests_on_its_own(tmp_path):
    # One core: no parse helper, and no scan of the items ahead of parsing them.
    run_script(tmp_path, ONE_CORE_SCRIPT)


def test_a_big_list_root_loads_shared_objects_cycles_and_stored_strings(tmp_path):
    # A root list of records over 128 KiB is parsed by this thread and the helper together
    # (split.rs, parse_items_helped), the helper's items built here from owned trees: shared
    # ids, cycles and strings stored in packs must come out as from the one-thread parse.
    shared = {"cfg": [1, 2, 3]}
    ring: list = [0]
    ring.append(ring)
    rows = [
        {"i": i, "s": ODD[i % 6] + str(i), "cfg": shared, "ring": ring if i % 50 == 0 else None,
         "long": "L" * 5000 + str(i) if i % 400 == 0 else "short", "f": i / 3}
        for i in range(3000)
    ]
    p = tmp_path / "rows"
    treepack.save(rows, p)
    assert os.path.getsize(p / "treepack.json") > 128 << 10
    back = treepack.load(p)
    assert len(back) == 3000 and back[0]["cfg"] is back[2999]["cfg"] and back[0]["cfg"] == shared
    assert back[50]["ring"] is back[0]["ring"] and back[0]["ring"][1] is back[0]["ring"]
    plain = lambda rs: [{k: v for k, v in r.items() if k not in ("ring", "cfg")} for r in rs]  # noqa: E731
    assert plain(back) == plain(rows)
    # The same through the Reader (a selection of everything takes that path).
    assert plain(treepack.load(p, select=["**"])) == plain(rows)


def test_a_damaged_item_of_a_big_list_root_is_named(tmp_path):
    import blake3

    rows = [{"i": i, "s": "x" * 40} for i in range(4000)]
    p = tmp_path / "rows"
    treepack.save(rows, p)
    m = p / "treepack.json"
    text = m.read_text()
    body = text[: text.rindex(',\n"manifest_hash":')]
    bad = body.replace('{"i":2718,', '{"i":{"t":"bogus"},', 1)
    assert bad != body
    m.write_text(bad + ',\n"manifest_hash":"' + blake3.blake3(bad.encode()).hexdigest() + '"}\n')
    with pytest.raises(treepack.FormatError, match=r"invalid manifest at `2718/i`: unknown node type \"bogus\""):
        treepack.load(p)


def test_format_1_4_writes_string_keyed_dicts_as_objects_and_reads_every_form(tmp_path):
    """Format 1.4: a dict of string keys is a JSON object; a dict whose first key is "t" (an
    object beginning with "t" is a tagged node) or with another key type keeps the items form.
    Every form loads back, in whole, in part and as a structure listing."""
    import json

    tree = {
        "rec": {"u": 1, "t": "later t is a plain member", "esc\"/~*": [1.5, None], "": {}},
        "tfirst": {"t": 1, "u": 2},
        "typed": {7: "int key", (1, "a"): "tuple key"},
        "empty": {},
    }
    p = str(tmp_path / "f")
    treepack.save(tree, p)
    text = open(os.path.join(p, "treepack.json")).read()
    m = json.loads(text)
    assert m["version"] == [1, 4]
    root = m["root"]
    assert root["rec"] == {"u": 1, "t": "later t is a plain member", "esc\"/~*": [1.5, None], "": {}}
    assert root["tfirst"] == {"t": "dict", "items": [["t", 1], ["u", 2]]}
    assert root["typed"]["t"] == "dict" and root["typed"]["items"][0] == [7, "int key"]
    assert root["empty"] == {} and list(root) == ["rec", "tfirst", "typed", "empty"]
    assert treepack.load(p) == tree
    assert treepack.load(p, select=["rec/esc\"~1~0~2"]) == {
        "rec": {"u": None, "t": None, "esc\"/~*": [1.5, None], "": {}},
        "tfirst": {"t": None, "u": None}, "typed": {7: None, (1, "a"): None}, "empty": {},
    }
    s = treepack.load_structure(p)
    assert s["rec"]["esc\"/~*"][0].path == "rec/esc\"~1~0~2/0" and s["tfirst"]["t"].kind == "int"


def test_many_distinct_and_long_keys_load_through_the_numbered_key_path(tmp_path):
    """The parse helper numbers at most 4096 keys of at most 64 bytes; keys past either limit
    go as text. A big manifest (the streamed parse) with 6000 distinct keys, long keys and keys
    repeated across records loads exactly."""
    rows = [
        {f"k{i % 6000}": i, "same": i, ("long-" * 20) + str(i % 3): float(i), f"k{(i * 7) % 6000}x": "v" * (i % 5)}
        for i in range(24000)
    ]
    p = str(tmp_path / "keys")
    treepack.save(rows, p)
    assert os.path.getsize(os.path.join(p, "treepack.json")) > 1 << 20
    back = treepack.load(p)
    assert back == rows
    # Equal short keys are one object, as pickle's memo makes them.
    assert list(back[1])[1] is list(back[2])[1] is list(back[23999])[1]
