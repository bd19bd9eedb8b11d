"""Background saves and checkpoint managers as a new user met them (session 45)."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import treepack


def _run(code: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("target", ["t.tpk", "t"])
def test_background_saves_of_one_place_commit_in_the_order_they_were_called(tmp_path, target):
    # On a pool of 4 threads a small save called after a big one finished first, and the big
    # one, committing last, won: the file held step 1 after step 2 was saved (18 of 20 runs).
    loc = str(tmp_path / target)
    big = np.random.default_rng(0).random(3_000_000)
    for trial in range(3):
        handles = []
        for step in range(1, 6):
            tree = {"w": big if step % 2 else np.zeros(3), "step": step}
            handles.append(treepack.save(tree, loc, overwrite=True, blocking=False))
        infos = [h.result() for h in handles]
        assert len(infos) == 5 and treepack.load(loc)["step"] == 5, trial
    # A blocking save called after background ones writes after them too.
    treepack.save({"w": big, "step": 6}, loc, overwrite=True, blocking=False)
    treepack.save({"step": 7}, loc, overwrite=True)
    assert treepack.load(loc) == {"step": 7}


def test_an_error_raised_by_a_handle_is_not_raised_again_by_the_next_save(tmp_path):
    # It was: the next save() raised step 10's FileExistsError, and step 11 was not saved.
    mgr = treepack.CheckpointManager(tmp_path / "run")
    mgr.save(10, {"x": 1}, blocking=True)
    h = mgr.save(10, {"x": 2})
    with pytest.raises(FileExistsError, match="step-10"):
        h.result()
    mgr.save(11, {"x": 3}).result()
    assert mgr.all_steps() == [10, 11] and mgr.restore()["x"] == 3
    # Not raised through the handle: the next save raises it, once.
    mgr.save(11, {"x": 4})
    with pytest.raises(FileExistsError, match="step-11"):
        mgr.save(12, {"x": 5})
    mgr.save(12, {"x": 5}, blocking=True)
    assert mgr.all_steps() == [10, 11, 12]
    mgr.close()


@pytest.mark.parametrize("step, error", [(7.9, TypeError), (-1, ValueError), ("8", TypeError), (True, TypeError)])
def test_a_checkpoint_step_is_an_int_0_or_more(tmp_path, step, error):
    # 7.9 was saved as step-7 (restore(7) gave it back), -1 as step--1, which all_steps never
    # listed and retention never deleted.
    mgr = treepack.CheckpointManager(tmp_path / "run")
    with pytest.raises(error, match="step"):
        mgr.save(step, {"x": 1})
    with pytest.raises(error):
        mgr.restore(step)
    mgr.save(np.int64(3), {"x": 1}, blocking=True)
    assert mgr.all_steps() == [3] and os.listdir(tmp_path / "run" / "refs") == ["step-3.json"]
    mgr.close()


def test_a_repository_location_is_never_cut_at_an_at_sign(tmp_path):
    # `exp@lr0.001` and `exp@lr0.01` (not existing yet) both opened the repository `exp`:
    # one run's retention would have deleted the other's checkpoints.
    first = treepack.CheckpointManager(tmp_path / "sweep" / "exp@lr0.001")  # (its parent made too)
    second = treepack.CheckpointManager(tmp_path / "exp@lr0.01")
    first.save(1, {"x": 1}, blocking=True)
    second.save(1, {"x": 2}, blocking=True)
    assert first.restore() == {"x": 1} and second.restore() == {"x": 2}
    assert not (tmp_path / "exp").exists() and not (tmp_path / "sweep" / "exp").exists()
    # Opened without create, such a location is refused rather than read as another's tree.
    with pytest.raises(ValueError, match=r"reads as tree `b` of a repository at `.*other`.*create its folder first"):
        treepack.Repository(tmp_path / "other@b")
    assert not (tmp_path / "other").exists()
    # A plain save to a path read as LOCATION@NAME says so.
    with pytest.raises(FileNotFoundError, match=r"`.*model@v2` was read as tree `v2` of a repository at `.*model`"):
        treepack.save({"x": 1}, tmp_path / "model@v2")


def test_a_failed_background_save_nobody_asked_about_is_reported_at_exit(tmp_path):
    r = _run(f"""
        import os, treepack
        os.makedirs("loc"); os.symlink({str(tmp_path)!r}, "loc/packs")
        treepack.save({{"w": bytes(1 << 20)}}, "loc", overwrite=True, blocking=False)
        mgr = treepack.CheckpointManager("run")
        mgr.save(1, {{"x": 1}}, blocking=True)
        mgr.save(1, {{"x": 2}})
        # Retrieved: not reported.
        h = treepack.save({{"w": bytes(1 << 20)}}, "loc", overwrite=True, blocking=False)
        assert h.exception() is not None
    """, tmp_path)
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith("treepack: a background save")]
    assert len(lines) == 2, r.stderr
    assert any("loc failed" in line and "link" in line for line in lines), r.stderr
    assert any("run@step-1 failed" in line and "FileExistsError" in line for line in lines), r.stderr


def test_a_save_begun_while_the_interpreter_exits_is_written(tmp_path):
    # A save from an atexit handler raised concurrent.futures' "cannot schedule new futures
    # after interpreter shutdown" and wrote nothing.
    r = _run("""
        import atexit, treepack
        def last():
            treepack.save({"x": 1}, "a", blocking=False)
            mgr = treepack.CheckpointManager("run")
            mgr.save(5, {"y": 2})
            mgr.wait_until_finished()
        atexit.register(last)
    """, tmp_path)
    assert r.returncode == 0, r.stderr
    assert treepack.load(tmp_path / "a") == {"x": 1}
    assert treepack.CheckpointManager(tmp_path / "run").restore() == {"y": 2}


def test_map_location_meta_with_tied_weights(tmp_path):
    torch = pytest.importorskip("torch")
    # It raised "Tensor.item() cannot be called on meta tensors" from the overlap check.
    w = torch.randn(8, 4)
    treepack.save({"wte": w, "lm_head": w.view(8, 4)}, tmp_path / "t")
    back = treepack.load(tmp_path / "t", map_location="meta")
    assert {k: (v.device.type, tuple(v.shape)) for k, v in back.items()} == {"wte": ("meta", (8, 4)),
                                                                          "lm_head": ("meta", (8, 4))}


@pytest.mark.parametrize("keep_last", [1, 2, 3, 5])
def test_keep_last_keeps_every_step_while_there_are_fewer(tmp_path, keep_last):
    # keep_last=3 with two steps saved deleted the first: steps[len - keep_last:] with a
    # negative start kept only the newest.
    mgr = treepack.CheckpointManager(tmp_path / "run", keep_last=keep_last)
    for step in range(1, 7):
        mgr.save(step, {"step": step}, blocking=True)
        assert mgr.all_steps() == list(range(max(1, step - keep_last + 1), step + 1)), step
    mgr.close()
