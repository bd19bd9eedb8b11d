"""The room a save's walk starts with is learnt per thread (``_core.EncodeContext``), never
process-wide: saves on different threads cannot change one another's."""

import threading

import treepack
from treepack import _api, _codec, _core


def test_each_thread_saves_with_its_own_encoder_context(tmp_path):
    seen = {}

    def run(i):
        seen[i] = _api._encode_context()
        tree = {"x": list(range(1000 * (i + 1))), "name": f"run-{i}"}
        for _ in range(3):
            treepack.save(tree, tmp_path / f"t{i}", overwrite=True)
            assert treepack.load(tmp_path / f"t{i}") == tree
        assert _api._encode_context() is seen[i]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 4 and len({id(c) for c in seen.values()}) == 4
    assert _api._encode_context() is _api._encode_context()


def test_a_walk_with_or_without_a_context_writes_the_same_tree(tmp_path):
    tree = {"a": [1, 2.5, "x"], "b": {"c": None}}
    ctx = _core.EncodeContext()
    enc = lambda o, w: _codec.encode_other(o, w, False)  # noqa: E731
    for i, context in enumerate([None, ctx, ctx]):
        _core.prepare(tree, enc, _codec.encode_array, context=context).write(str(tmp_path / f"t{i}"))
    texts = {(tmp_path / f"t{i}" / "treepack.json").read_bytes() for i in range(3)}
    assert len(texts) == 1 and treepack.load(tmp_path / "t2") == tree
