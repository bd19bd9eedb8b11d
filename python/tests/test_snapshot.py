"""Background saves (issue 53): ``save(blocking=False)`` and ``CheckpointManager.save`` return
once their arrays are copied — after the tree's last walk, once — so the caller may change
every array at once and the save still writes what the tree held when it was called. The copy
buffers are kept for the next save of the same arrays."""

import os

import numpy as np
import pytest

import treepack
from treepack import _core

BIG = 1 << 20  # elements: above the size copied as met (deferred, pooled copies)


def _tree(seed: int):
    rng = np.random.default_rng(seed)
    shared_plain = {"lr": 0.1, "names": ["a", "b"]}  # a plain dict met twice: the walk restarts
    big = rng.standard_normal(BIG).astype(np.float32)
    return {
        "big": big,
        "big_again": big,  # one array at two places: one copy, one object on load
        "small": np.arange(10, dtype=np.int64) + seed,
        "mid": rng.integers(0, 100, 40_000).astype(np.int32),  # 160 KB
        "cfg": shared_plain,
        "cfg2": shared_plain,
        "layers": [rng.standard_normal((256, 256)) for _ in range(3)],
    }


def _expected(tree):
    return {k: (v.copy() if isinstance(v, np.ndarray) else [a.copy() for a in v] if k == "layers" else v)
            for k, v in tree.items()}


def _scribble(tree):
    tree["big"][:] = -1
    tree["small"][:] = -1
    tree["mid"][:] = -1
    for a in tree["layers"]:
        a[:] = -1


def _check(back, want):
    assert np.array_equal(back["big"], want["big"])
    assert back["big_again"] is back["big"]
    assert np.array_equal(back["small"], want["small"])
    assert np.array_equal(back["mid"], want["mid"])
    assert back["cfg"] is back["cfg2"] and back["cfg"] == {"lr": 0.1, "names": ["a", "b"]}
    for a, b in zip(back["layers"], want["layers"]):
        assert np.array_equal(a, b)


def test_a_background_save_writes_the_tree_as_it_was_when_called(tmp_path):
    _core.release_snapshot_buffers()
    for i in range(3):  # the second and third take their buffers from the pool
        tree = _tree(i)
        want = _expected(tree)
        handle = treepack.save(tree, str(tmp_path / f"t{i}"), blocking=False)
        _scribble(tree)  # at once, while the save may still be writing
        handle.result()
        _check(treepack.load(str(tmp_path / f"t{i}")), want)
    # Once written, the copies went back to the pool for the next save: at least the big ones.
    assert _core.release_snapshot_buffers() >= BIG * 4 + 3 * 256 * 256 * 8
    assert _core.release_snapshot_buffers() == 0


def test_a_checkpoint_manager_save_snapshots_tensors_sharing_a_storage_once(tmp_path):
    torch = pytest.importorskip("torch")
    # Tied weights: the tree is walked twice (the second walk annotates the shared storage);
    # the copies are made once, after it, and the saved values are those at the call.
    emb = torch.nn.Embedding(1000, 300)
    head = torch.nn.Linear(300, 1000, bias=False)
    head.weight = emb.weight
    model = torch.nn.Sequential(emb, head)
    want = {k: v.detach().clone() for k, v in model.state_dict().items()}
    mgr = treepack.CheckpointManager(str(tmp_path / "ck"), keep_last=2)
    handle = mgr.save(1, {"model": model.state_dict()})
    with torch.no_grad():
        emb.weight.fill_(7.0)
    handle.result()
    back = treepack.load(str(tmp_path / "ck") + "@step-1")["model"]
    assert set(back) == set(want)
    for k, v in want.items():
        assert torch.equal(back[k], v), k
    assert back["0.weight"].untyped_storage().data_ptr() == back["1.weight"].untyped_storage().data_ptr()


def test_a_prepared_tree_written_without_its_snapshot_makes_the_copies_first(tmp_path):
    # A caller that writes a snapshot=True tree without snapshot() (an integration's own
    # writer) still writes the values, never the reserved buffers' old contents.
    a = np.arange(BIG, dtype=np.float64)
    prepared = _core.prepare({"a": a}, lambda o, w: None, lambda o: None, snapshot=True)
    prepared.write(str(tmp_path / "t"))
    assert np.array_equal(treepack.load(str(tmp_path / "t"))["a"], np.arange(BIG, dtype=np.float64))
    prepared2 = _core.prepare({"a": a}, lambda o, w: None, lambda o: None, snapshot=True)
    assert prepared2.snapshot() == a.nbytes and prepared2.snapshot() == 0
    a[:] = 0
    prepared2.write(str(tmp_path / "t2"))
    assert np.array_equal(treepack.load(str(tmp_path / "t2"))["a"], np.arange(BIG, dtype=np.float64))


def test_a_forked_child_saves_in_the_background_too(tmp_path):
    # The pool's lock is never waited for: a child forked while a save held it still saves.
    treepack.save(_tree(0), str(tmp_path / "warm"), blocking=False).result()
    pid = os.fork()
    if pid == 0:
        try:
            tree = _tree(5)
            want = _expected(tree)
            h = treepack.save(tree, str(tmp_path / "child"), blocking=False)
            _scribble(tree)
            h.result()
            _check(treepack.load(str(tmp_path / "child")), want)
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0


def test_a_background_save_is_written_at_the_lowest_priority_and_the_caller_keeps_its_own(tmp_path):
    # Linux's nice is per thread: the save pool's thread is lowered, the caller is not.
    before = os.getpriority(os.PRIO_PROCESS, 0)
    seen = {}

    def progress(done, total):
        seen.setdefault("nice", os.getpriority(os.PRIO_PROCESS, 0))

    treepack.save(_tree(1), str(tmp_path / "t"), blocking=False, progress=progress).result()
    assert os.getpriority(os.PRIO_PROCESS, 0) == before
    assert seen.get("nice") == 19, seen
