"""Root hashes and repositories (issue 27): cross-save dedup, names, LOCATION@NAME everywhere,
gc, object stores, and the CheckpointManager over a real torch training loop."""

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import treepack


def _du(p) -> int:
    return sum(f.stat().st_size for f in Path(p).rglob("*") if f.is_file())


# ---------------------------------------------------------------- root hash


def test_the_spec_example_root_and_one_root_wherever_the_tree_is(tmp_path):
    # docs/format.md section 9's worked example, saved from Python.
    treepack.save({"a": [1, 2.5], "b": "hi"}, tmp_path / "ex")
    assert treepack.root_hash(tmp_path / "ex") == "4ab370d9c54f26ec9380f75c0658f7b70a6f1e576c4be275c678a9ae224433b0"
    tree = {"w": np.arange(300_000, dtype=np.float32).reshape(600, 500), "s": "x" * 5000, "n": [1, None, b"\x00" * 300]}
    treepack.save(tree, tmp_path / "dir")
    treepack.save(tree, tmp_path / "one.tpk", compression="zstd")
    repo = treepack.Repository(tmp_path / "repo", create=True)
    info = repo.save(tree, "t")
    roots = {treepack.root_hash(tmp_path / "dir"), treepack.root_hash(tmp_path / "one.tpk"), info.root,
             treepack.root_hash(repo.tree("t")), repo.root_hash("t")}
    assert len(roots) == 1 and len(info.root) == 64
    # A subtree's hash, and a change anywhere changes the root.
    assert treepack.root_hash(tmp_path / "dir", key="n") != info.root
    tree["n"][2] = b"\x01" * 300
    treepack.save(tree, tmp_path / "changed")
    assert treepack.root_hash(tmp_path / "changed") != info.root


def test_expect_root_loads_only_that_tree(tmp_path):
    treepack.save({"x": np.ones(10)}, tmp_path / "a")
    treepack.save({"x": np.zeros(10)}, tmp_path / "b")
    ra = treepack.root_hash(tmp_path / "a")
    np.testing.assert_array_equal(treepack.load(tmp_path / "a", expect_root=ra)["x"], np.ones(10))
    with pytest.raises(treepack.RootMismatchError, match="not the tree asked for") as e:
        treepack.load(tmp_path / "b", expect_root=ra)
    assert ra in str(e.value) and isinstance(e.value, treepack.TreepackError)
    with pytest.raises(treepack.RootMismatchError):
        treepack.load(tmp_path / "b", expect_root=ra, select=["x"])
    with pytest.raises(ValueError, match="64 hex digits"):
        treepack.load(tmp_path / "a", expect_root="abc")


# ---------------------------------------------------------------- repositories


def _model_state(seed: int):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.Linear(512, 10))
    # Fine-tuning the head only: the body's bytes never change between checkpoints.
    for p in model[0].parameters():
        p.requires_grad_(False)
    for p in model[2].parameters():
        p.requires_grad_(False)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    for step in range(seed):
        loss = model(torch.randn(8, 256)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.state_dict()


def test_a_fine_tuning_run_stores_the_frozen_body_once(tmp_path):
    torch = pytest.importorskip("torch")
    repo = treepack.Repository(tmp_path / "ckpts", create=True)
    first = repo.save(_model_state(1), "step-1")
    assert first.bytes_reused == 0 and first.bytes_written > 1_000_000
    second = repo.save(_model_state(2), "step-2")
    body = (256 * 512 + 512 + 512 * 512 + 512) * 4
    assert second.bytes_reused >= body, second
    assert second.bytes_written < 512 * 10 * 4 + 64 * 1024, second
    assert "bytes_reused=" in repr(second) and second.root in repr(second)
    # Both come back exactly, through every reader.
    for step in (1, 2):
        want = _model_state(step)
        got = repo.load(f"step-{step}")
        assert list(got) == list(want)
        for k in want:
            assert torch.equal(got[k], want[k]), k
    lazy = repo.open("step-2")
    np.testing.assert_array_equal(lazy["3.weight"][0:2], _model_state(2)["3.weight"][0:2].numpy())
    head = treepack.load(repo.tree("step-2"), select=["3.*"])
    assert head["0.weight"] is None and head["3.bias"].shape == (10,)
    st = repo.load_structure("step-1")
    assert st.children["2.weight"].shape == (512, 512)  # an OrderedDict: a struct node
    assert treepack.verify(repo.tree("step-1")).ok and repo.verify().ok
    names = repo.names()
    assert [t.name for t in names] == ["step-1", "step-2"]
    assert names[1].bytes_reused == second.bytes_reused and names[1].root == second.root
    assert names[0].saved <= names[1].saved and names[0].saved.tzinfo is not None
    assert "step-1" in repo and "step-9" not in repo


def test_names_commit_create_only_even_between_threads(tmp_path):
    repo = treepack.Repository(tmp_path / "r", create=True)
    results = []

    def writer(i: int) -> None:
        try:
            repo.save({"i": i, "w": np.full(100_000, i, np.float32)}, "latest")
            results.append(("ok", i))
        except FileExistsError as e:
            results.append(("exists", str(e)))

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    won = [i for kind, i in results if kind == "ok"]
    assert len(won) == 1 and len(results) == 6
    assert all("@latest" in msg for kind, msg in results if kind == "exists")
    assert repo.load("latest")["i"] == won[0]
    repo.save({"i": -1}, "latest", overwrite=True)
    assert repo.load("latest") == {"i": -1}


def test_delete_and_gc_free_what_expired(tmp_path):
    repo = treepack.Repository(tmp_path / "r", create=True)
    a = {"w": np.random.default_rng(0).random(500_000)}
    repo.save(a, "a")
    repo.save({"w": a["w"], "extra": np.ones(200_000)}, "b")
    before = _du(tmp_path / "r")
    assert repo.gc(grace_secs=0) == 0  # nothing deleted, nothing to free
    repo.delete("b")
    with pytest.raises(FileNotFoundError, match="no tree named"):
        repo.delete("b")
    assert repo.gc(grace_secs=3600) == 0  # condemned, but within the grace period
    freed = repo.gc(grace_secs=0)
    assert freed >= 1_600_000 and _du(tmp_path / "r") <= before - freed
    np.testing.assert_array_equal(repo.load("a")["w"], a["w"])
    with pytest.raises(FileNotFoundError, match="no tree named .b."):
        repo.load("b")


def test_errors_say_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="create=True"):
        treepack.Repository(tmp_path / "none")
    repo = treepack.Repository(tmp_path / "r", create=True)
    with pytest.raises(ValueError, match="not allowed"):
        repo.save({"a": 1}, "a/b")
    treepack.save({"a": 1}, tmp_path / "plain")
    with pytest.raises(ValueError, match="holds a tree"):
        treepack.Repository(tmp_path / "plain", create=True)


def test_a_repository_on_s3_shares_chunks_and_commits_names_create_only(s3):
    repo = treepack.Repository("s3://bucket/repo-test", storage_options=s3, create=True)
    w = np.random.default_rng(1).random((512, 512))
    first = repo.save({"w": w, "step": 1}, "s1")
    second = repo.save({"w": w, "step": 2}, "s2")
    assert second.bytes_reused == w.nbytes and second.bytes_written < 64 * 1024
    with pytest.raises(FileExistsError):
        repo.save({"w": w}, "s1")
    got = treepack.load("s3://bucket/repo-test@s2", storage_options=s3)
    np.testing.assert_array_equal(got["w"], w)
    assert got["step"] == 2 and first.root != second.root
    repo.delete("s1")
    repo.gc(grace_secs=0)
    assert [t.name for t in repo.names()] == ["s2"] and repo.verify().ok


# ---------------------------------------------------------------- checkpoint manager


def test_a_checkpoint_manager_keeps_what_it_should_and_resumes(tmp_path):
    torch = pytest.importorskip("torch")
    loc = tmp_path / "run"
    with treepack.CheckpointManager(loc, keep_last=2, keep_every=4) as mgr:
        handles = []
        for step in range(1, 10):
            state = {"model": _model_state(step), "step": step}
            handles.append(mgr.save(step, state))  # in the background
        assert handles[-1].result().root
        assert mgr.all_steps() == [4, 8, 9] and mgr.latest_step() == 9
    # A new manager (a resumed job) sees the same steps and restores them.
    mgr = treepack.CheckpointManager(loc, keep_last=2, keep_every=4)
    back = mgr.restore()
    assert back["step"] == 9 and torch.equal(back["model"]["3.weight"], _model_state(9)["3.weight"])
    assert mgr.restore(4)["step"] == 4
    # Deleted steps' bytes are gone: the frozen body is stored once, heads 3 times.
    body = (256 * 512 + 512 + 512 * 512 + 512) * 4
    head = (512 * 10 + 10) * 4
    assert _du(loc) < body + 4 * head + 200_000, _du(loc)
    with pytest.raises(FileExistsError):
        mgr.save(9, {"step": 9}, blocking=True)
    mgr.close()


def test_a_save_killed_midway_loses_no_committed_step(tmp_path):
    loc = tmp_path / "run"
    mgr = treepack.CheckpointManager(loc, keep_last=5)
    base = np.random.default_rng(2).random(2_000_000)
    mgr.save(1, {"w": base}, blocking=True)
    # A child saves a big step and is killed while writing it.
    code = f"""
import numpy as np, os, sys, treepack
mgr = treepack.CheckpointManager({str(loc)!r}, keep_last=5)
big = {{"w": np.random.default_rng(3).random(40_000_000)}}
print("saving", flush=True)
mgr.save(2, big, blocking=True)
"""
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "saving"
    lease_dir = loc / "leases"
    packs_before = set(os.listdir(loc / "packs"))
    for _ in range(4000):  # until the child has written pack bytes of step 2
        if set(os.listdir(loc / "packs")) - packs_before:
            break
        threading.Event().wait(0.005)
    else:
        raise AssertionError("the child never started writing")
    assert any(lease_dir.iterdir()), "a save in progress holds a lease"
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert mgr.all_steps() == [1]
    # The next save's gc finds the dead process's lease and removes what it left.
    mgr.save(3, {"w": base}, blocking=True)
    assert mgr.all_steps() == [1, 3]
    assert not any(lease_dir.iterdir())
    assert _du(loc / "packs") < base.nbytes + 100_000, _du(loc / "packs")
    np.testing.assert_array_equal(mgr.restore(1)["w"], base)
    assert mgr.repository.verify().ok


def test_a_checkpoint_manager_restores_a_jax_state_onto_a_template(tmp_path):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:4]), ("x",))
    sharded = NamedSharding(mesh, P("x"))
    state = {"w": jax.device_put(jnp.arange(64.0).reshape(16, 4), sharded), "step": 3}
    mgr = treepack.CheckpointManager(tmp_path / "run", keep_last=1)
    mgr.save(3, state)
    template = {"w": jax.ShapeDtypeStruct((16, 4), jnp.float32, sharding=sharded), "step": 0}
    back = mgr.restore(like=template)
    assert back["w"].sharding == sharded and back["step"] == 3
    np.testing.assert_array_equal(np.asarray(back["w"]), np.arange(64.0).reshape(16, 4))
    mgr.close()


def test_diff_reports_what_changed_between_checkpoints(tmp_path):
    repo = treepack.Repository(tmp_path / "r", create=True)
    w = np.arange(2_000_000, dtype=np.float32)
    repo.save({"w": w, "lr": 0.1, "tags": ["a"]}, "v1")
    w2 = w.copy()
    w2[-1] = 0
    repo.save({"w": w2, "lr": 0.05, "extra": None}, "v2")
    d = treepack.diff(repo.tree("v1"), repo.tree("v2"))
    assert d == [
        {"path": "w", "op": "~", "old": "float32[2000000]", "new": "float32[2000000]", "chunks_differ": 1, "chunks": 2},
        {"path": "lr", "op": "~", "old": "0.1", "new": "0.05"},
        {"path": "tags", "op": "-", "old": "list (1 items)"},
        {"path": "extra", "op": "+", "new": "null"},
    ]
    assert treepack.diff(repo.tree("v1"), repo.tree("v1")) == []
