"""Compressed manifests (issue 53, format 1.6): a tree of many small values is mostly manifest;
with compression on, a single file or a repository's tree stores it as one zstd frame (a
directory's treepack.json only when asked), so a log of traced calls is no bigger than pickle's."""

import datetime
import os
import pickle
import random

import pytest

import treepack


def _calls(n=10_000):
    rng = random.Random(0)
    t0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    out = []
    for i in range(n):
        out.append({
            "id": f"call-{i:06d}",
            "op": rng.choice(["predict", "embed", "score", "retrieve"]),
            "inputs": {"prompt": f"question {i} about {rng.choice(['cats', 'dogs', 'llamas'])}",
                       "temperature": round(rng.random(), 3), "max_tokens": rng.choice([64, 128, 256])},
            "output": {"text": " ".join(rng.choice(["alpha", "beta", "the", "a", "model"]) for _ in range(12)),
                       "tokens": rng.randint(5, 256)},
            "started_at": t0 + datetime.timedelta(seconds=i),
            "exception": None if rng.random() > 0.05 else f"ValueError: bad input at step {i}",
        })
    return out


def _size(p):
    if os.path.isfile(p):
        return os.path.getsize(p)
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(p) for f in fs)


def test_a_log_of_traced_calls_is_no_bigger_than_pickle_with_compression_on(tmp_path):
    calls = _calls()
    pickled = len(pickle.dumps(calls, protocol=pickle.HIGHEST_PROTOCOL))
    plain = str(tmp_path / "plain.tpk")
    treepack.save(calls, plain)
    for name, kw in [("zstd.tpk", {"compression": "zstd"}), ("auto.tpk", {"compression": "auto"}),
                     ("dir", {"compression": "zstd", "compress_manifest": True})]:
        p = str(tmp_path / name)
        treepack.save(calls, p, **kw)
        assert treepack.load(p) == calls
        assert _size(p) < pickled, (name, _size(p), pickled)
        assert _size(p) * 4 < _size(plain), (name, _size(p), _size(plain))
        # Read as usual: lazily, by key path, structure only.
        assert treepack.open(p)[17]["inputs"]["prompt"] == calls[17]["inputs"]["prompt"]
        assert len(treepack.load_structure(p)) == len(calls)


def test_a_directory_keeps_a_plain_treepack_json_unless_asked(tmp_path):
    tree = {"a": list(range(100)), "s": "x" * 1000}
    treepack.save(tree, str(tmp_path / "d"), compression="zstd")
    assert (tmp_path / "d" / "treepack.json").read_bytes().startswith(b'{"format":"treepack"')
    treepack.save(tree, str(tmp_path / "e"), compress_manifest=True)
    raw = (tmp_path / "e" / "treepack.json").read_bytes()
    assert raw[:4] == b"\x28\xb5\x2f\xfd"
    assert treepack.load(str(tmp_path / "e")) == tree
    treepack.save(tree, str(tmp_path / "f.tpk"), compression="zstd", compress_manifest=False)
    assert treepack.load(str(tmp_path / "f.tpk")) == tree


def test_a_repository_stores_its_manifests_compressed_with_compression_on(tmp_path):
    repo = treepack.Repository(str(tmp_path / "r"), create=True)
    calls = _calls(2000)
    repo.save(calls, "plain")
    repo.save(calls, "packed", compression="zstd")
    trees = sorted((tmp_path / "r" / "trees").iterdir(), key=lambda p: p.stat().st_size)
    assert len(trees) == 2 and trees[0].read_bytes()[:4] == b"\x28\xb5\x2f\xfd"
    assert trees[1].read_bytes().startswith(b'{"format":"treepack"')
    assert repo.load("packed") == calls == repo.load("plain")


def test_compress_manifest_takes_a_bool(tmp_path):
    with pytest.raises(TypeError, match="compress_manifest"):
        treepack.save({"a": 1}, str(tmp_path / "t"), compress_manifest="yes")
