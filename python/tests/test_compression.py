"""save(compression=...): every form of policy, round trips of real-looking data (bf16-like
weights, int token ids, zero-heavy moments, masks, text), partial reads and mmap of compressed
arrays, the CLI's report, and bad policies refused before anything is written."""

import json
import os

import numpy as np
import pytest

import treepack
from treepack import _core


def _tree():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((512, 256)).astype(np.float32)
    return {
        "params": {"w": w, "b": np.zeros(256, np.float32)},
        "opt": {"mu": np.where(rng.random((512, 256)) < 0.9, 0, w).astype(np.float32)},
        "tokens": rng.integers(0, 1000, (64, 512)).astype(np.int64),
        "mask": rng.random((64, 512)) < 0.5,
        "notes": "a line of a log, again and again\n" * 2000,
        "step": 7,
    }


def _manifest(p):
    with open(os.path.join(p, "treepack.json"), "rb") as f:
        return json.loads(f.read())


def _codecs(node, out):
    if isinstance(node, dict):
        if "codec" in node and "blake3" in node:
            out.append(node["codec"])
        for v in node.values():
            _codecs(v, out)
    elif isinstance(node, list):
        for v in node:
            _codecs(v, out)
    return out


def _equal(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    return a == b


@pytest.mark.parametrize(
    "policy",
    ["auto", "zstd", "zstd:1", "zstd:19", "lz4",
     [{"paths": ["opt/**"], "codec": "lz4", "filter": "shuffle"}, {"dtypes": ["int*", "str"], "codec": "zstd", "level": 9}, {"codec": "none"}]],
)
def test_policies_round_trip_and_compress(tmp_path, policy):
    tree = _tree()
    p = str(tmp_path / "ckpt")
    treepack.save(tree, p, compression=policy)
    m = _manifest(p)
    assert m["version"] == [1, 4]  # codecs (1.1), dicts as objects (1.4)
    codecs = _codecs(m["root"], [])
    assert any(c != "raw" for c in codecs), codecs
    assert _equal(treepack.load(p), tree)
    assert _equal(treepack.load(p, mmap=True), tree)
    assert treepack.verify(p).ok
    # Only the chunks a slice touches are read and decoded.
    assert np.array_equal(treepack.open(p)["tokens"][3:5, 10:20], tree["tokens"][3:5, 10:20])
    # Smaller than the uncompressed save.
    q = str(tmp_path / "plain")
    treepack.save(tree, q)
    size = lambda d: sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(d) for f in fs)
    assert size(p) < size(q) * 0.8, (size(p), size(q))
    if isinstance(policy, list):
        by_path = {}
        for k, v in m["root"].items():
            by_path[k] = _codecs(v, [])
        assert set(by_path["opt"]) == {"shuffle+lz4"}
        assert set(by_path["tokens"]) == {"shuffle+zstd"}
        assert set(by_path["params"]) <= {"raw"}


def test_single_file_and_async_saves_compress_too(tmp_path):
    tree = _tree()
    p = str(tmp_path / "ckpt.tpk")
    treepack.save(tree, p, compression="zstd", blocking=False).result()
    assert _equal(treepack.load(p), tree)
    r = _core.Reader(p, None)
    assert r.kind("tokens") == "array"


@pytest.mark.parametrize(
    "policy, says",
    [
        ("brotli", "unknown codec `brotli`"),
        ("zstd:40", "out of range"),
        ("lz4:3", "only zstd has levels"),
        ([{"codec": "zstd", "levl": 3}], "unknown field `levl`"),
        ([{"codec": "zstd", "filter": "bitshuffle"}], "unknown filter"),
        ([{"codec": "zstd", "min_size": -1}], "min_size"),
    ],
)
def test_bad_policies_raise_before_anything_is_written(tmp_path, policy, says):
    p = tmp_path / "never"
    with pytest.raises(ValueError, match=says):
        treepack.save({"a": np.zeros(10)}, str(p), compression=policy)
    assert not p.exists()


def test_a_policy_of_the_wrong_type_says_what_it_takes(tmp_path):
    with pytest.raises(TypeError, match="compression= takes a str"):
        treepack.save({"a": 1}, str(tmp_path / "x"), compression=3)


def test_bf16_like_weights_gain_from_the_shuffle(tmp_path):
    """bfloat16 weights drawn from a normal distribution: the shuffle puts the exponent bytes
    together, which plain zstd cannot exploit."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal(1 << 20).astype(np.float32)
    bf16 = (w.view(np.uint32) >> 16).astype(np.uint16)  # the top half of each float32
    sizes = {}
    for name, policy in [("plain", [{"codec": "zstd", "filter": "none"}]), ("shuffled", "zstd")]:
        p = str(tmp_path / name)
        treepack.save({"w": bf16}, p, compression=policy)
        m = _manifest(p)
        sizes[name] = sum(c["length"] for c in next(iter(m["root"].values()))["chunks"])
        assert np.array_equal(treepack.load(p)["w"], bf16)
    assert sizes["shuffled"] < sizes["plain"], sizes
    assert bf16.nbytes / sizes["shuffled"] > 1.25, sizes
