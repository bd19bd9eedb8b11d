"""CheckpointManager against Orbax's CheckpointManager semantics (issue 51): max_to_keep /
keep_period (keep_last / keep_every, keep_last=0 included), save_interval_steps with
should_save and force, latest_step / all_steps, restoring a step, refusing foreign folders,
and wait_until_finished from many threads waiting, each of them, for the commit."""

import threading

import numpy as np
import pytest

import treepack


def _tree(step):
    return {"w": np.full(64, step, np.float32), "step": step}


def _saved_steps(mgr, steps, **kwargs):
    """Save each step (in the background) and return what each save() returned."""
    out = {s: mgr.save(s, _tree(s), **kwargs) for s in steps}
    mgr.wait_until_finished()
    return out


# ---------------------------------------------------------------- retention


def test_keep_last_keeps_the_newest_steps(tmp_path):
    # Orbax test_removes_old_saves: max_to_keep=2 over steps 0..4.
    with treepack.CheckpointManager(tmp_path / "run", keep_last=2) as mgr:
        _saved_steps(mgr, range(5))
        assert mgr.all_steps() == [3, 4]
        assert mgr.latest_step() == 4


def test_keep_last_zero_keeps_only_the_keep_every_multiples(tmp_path):
    # Orbax max_to_keep=0, keep_period=3 (test_max_to_keep_zero_other_conditions, without the
    # time rule): only the multiples stay, and a step that is not one goes once committed.
    with treepack.CheckpointManager(tmp_path / "run", keep_last=0, keep_every=3) as mgr:
        for step in range(9):
            mgr.save(step, _tree(step))
            mgr.wait_until_finished()
            assert mgr.all_steps() == [s for s in range(step + 1) if s % 3 == 0]
        assert mgr.all_steps() == [0, 3, 6]
        assert mgr.latest_step() == 6
        assert mgr.restore()["step"] == 6
    assert treepack.CheckpointManager(tmp_path / "run", keep_last=0, keep_every=3).all_steps() == [0, 3, 6]


def test_keep_last_and_keep_every_with_a_save_interval(tmp_path):
    # Orbax test_removes_old_saves_keep_period: max_to_keep=2, keep_period=4,
    # save_interval_steps=2 over steps 0..11 (even steps saved).
    with treepack.CheckpointManager(tmp_path / "run", keep_last=2, keep_every=4, save_interval_steps=2) as mgr:
        _saved_steps(mgr, [s for s in range(12) if s % 2 == 0])
        assert mgr.all_steps() == [0, 4, 8, 10]


def test_retention_arguments_that_make_no_sense_are_refused(tmp_path):
    with pytest.raises(ValueError, match="keep_last=0 without keep_every"):
        treepack.CheckpointManager(tmp_path / "a", keep_last=0)
    with pytest.raises(ValueError, match="keep_last"):
        treepack.CheckpointManager(tmp_path / "b", keep_last=-1)
    with pytest.raises(ValueError, match="keep_every"):
        treepack.CheckpointManager(tmp_path / "c", keep_every=0)
    with pytest.raises(ValueError, match="save_interval_steps"):
        treepack.CheckpointManager(tmp_path / "d", save_interval_steps=0)
    # keep_last=None keeps every step.
    with treepack.CheckpointManager(tmp_path / "e", keep_last=None) as mgr:
        _saved_steps(mgr, range(6))
        assert mgr.all_steps() == list(range(6))


# ---------------------------------------------------------------- save interval


def test_save_interval_skips_the_other_steps_and_returns_none(tmp_path):
    # Orbax test_save_interval and test_latest_step: save() of a step off the interval writes
    # nothing and returns a false value (None here).
    with treepack.CheckpointManager(tmp_path / "run", keep_last=None, save_interval_steps=2) as mgr:
        got = _saved_steps(mgr, range(6))
        assert [s for s, r in got.items() if r] == [0, 2, 4]
        assert all(got[s] is None for s in (1, 3, 5))
        assert mgr.all_steps() == [0, 2, 4] and mgr.latest_step() == 4
        assert sorted(t.name for t in mgr.repository.names()) == ["step-0", "step-2", "step-4"]
        # Orbax test_latest_step_restore: the latest is the last multiple.
        assert mgr.restore()["step"] == 4
        assert mgr.save(6, _tree(6), blocking=True).root
        assert mgr.latest_step() == 6


def test_force_saves_a_step_off_the_interval(tmp_path):
    # Orbax test_save_interval_force.
    with treepack.CheckpointManager(tmp_path / "run", keep_last=None, save_interval_steps=2) as mgr:
        _saved_steps(mgr, range(6))
        assert mgr.save(5, _tree(5), force=True)
        mgr.wait_until_finished()
        assert mgr.all_steps() == [0, 2, 4, 5]
        assert mgr.restore(5)["step"] == 5


def test_should_save(tmp_path):
    with treepack.CheckpointManager(tmp_path / "run", keep_last=None, save_interval_steps=3) as mgr:
        assert [s for s in range(10) if mgr.should_save(s)] == [0, 3, 6, 9]
        mgr.save(3, _tree(3))
        # A step being saved counts, committed or not: nothing at or before it is saved again.
        assert not mgr.should_save(3) and not mgr.should_save(0)
        assert mgr.should_save(6)
        mgr.wait_until_finished()
        assert [s for s in range(10) if mgr.should_save(s)] == [6, 9]
        # With an interval, save() of a step should_save refuses is skipped (as Orbax's)...
        assert mgr.save(3, _tree(33)) is None and mgr.save(0, _tree(0)) is None
        assert mgr.restore(3)["step"] == 3 and mgr.all_steps() == [3]
        # ... and forced, a step already saved is refused, as in Orbax.
        with pytest.raises(FileExistsError):
            mgr.save(3, _tree(33), force=True, blocking=True)
    # A new manager (a resumed job) reads the latest step from the repository.
    mgr = treepack.CheckpointManager(tmp_path / "run", keep_last=None, save_interval_steps=3)
    assert not mgr.should_save(3) and mgr.should_save(6)
    # Without an interval, should_save says whether a step is newer than the latest one; save()
    # saves whatever it is given (a step already saved raises).
    plain = treepack.CheckpointManager(tmp_path / "run")
    assert plain.should_save(4) and not plain.should_save(2)
    with pytest.raises(FileExistsError):
        plain.save(3, _tree(3), blocking=True)


# ---------------------------------------------------------------- restore, reload, foreign folders


def test_restore_a_step_and_a_resumed_manager_sees_every_step(tmp_path):
    # Orbax test_all_steps_reload and test_save_restore.
    loc = tmp_path / "run"
    first = treepack.CheckpointManager(loc, keep_last=None)
    _saved_steps(first, range(2))
    second = treepack.CheckpointManager(loc, keep_last=None)
    assert second.all_steps() == [0, 1]
    _saved_steps(second, range(2, 4))
    assert first.all_steps() == second.all_steps() == [0, 1, 2, 3]
    for s in range(4):
        back = first.restore(s)
        assert back["step"] == s and back["w"].tolist() == [float(s)] * 64
    with pytest.raises(FileNotFoundError):
        first.restore(7)
    first.close()
    second.close()
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        treepack.CheckpointManager(tmp_path / "empty").restore()


def test_a_folder_holding_other_files_is_refused(tmp_path):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("not a checkpoint")
    with pytest.raises(ValueError, match="holds `notes.txt` that is not a repository's"):
        treepack.CheckpointManager(foreign)
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]  # nothing written there
    sub = tmp_path / "orbax-like"
    (sub / "0").mkdir(parents=True)
    with pytest.raises(ValueError, match="holds `0` that is not a repository's"):
        treepack.Repository(sub, create=True)
    treepack.save({"a": 1}, tmp_path / "tree")
    with pytest.raises(ValueError, match="holds a tree"):
        treepack.CheckpointManager(tmp_path / "tree")
    # An object-store prefix alike.
    treepack.save({"a": 1}, "memory://ckpt-foreign/run/other/tree")
    with pytest.raises(ValueError, match="holds `other` that is not a repository's"):
        treepack.CheckpointManager("memory://ckpt-foreign/run")
    assert treepack.CheckpointManager("memory://ckpt-foreign/fresh").save(1, _tree(1), blocking=True)
    # An empty folder, a new one and an existing repository are fine.
    (tmp_path / "empty").mkdir()
    treepack.CheckpointManager(tmp_path / "empty").save(1, _tree(1), blocking=True)
    assert treepack.CheckpointManager(tmp_path / "empty").all_steps() == [1]


# ---------------------------------------------------------------- wait_until_finished


class Slow:
    """A registered type whose to_data blocks until the test releases it: a save of a tree
    holding one is made slow deterministically."""

    entered = threading.Event()
    release = threading.Event()

    def __init__(self, v):
        self.v = v


def _slow_to_data(x):
    Slow.entered.set()
    assert Slow.release.wait(60), "the test never released the save"
    return {"v": x.v}


treepack.register(Slow, name="tests.ckpt.Slow", to_data=_slow_to_data, from_data=lambda d: Slow(d["v"]))


def _waiters(mgr, step, released, n=11):
    """n threads that call wait_until_finished() at once and, as soon as it returns, record
    whether the save had been released, whether the step is listed and what loading it gives
    (or the error the wait raised)."""
    barrier = threading.Barrier(n + 1)
    seen = [None] * n

    def waiter(i):
        barrier.wait()
        try:
            mgr.wait_until_finished()
            seen[i] = (released.is_set(), step in mgr.all_steps(),
                       treepack.load(mgr.repository.tree(mgr.name(step)))["step"])
        except BaseException as e:  # recorded, asserted below
            seen[i] = e

    threads = [threading.Thread(target=waiter, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    barrier.wait()
    return threads, seen


_released = threading.Event()


def _check_waiters(threads, seen):
    # The save cannot commit before it is released: any waiter that has returned by now
    # returned too early (a broken wait gets its chance to show here; a right one always passes).
    for t in threads:
        t.join(0.2)
    assert [t.is_alive() for t in threads] == [True] * len(threads), seen


def test_wait_until_finished_waits_in_every_thread_for_a_slow_snapshot(tmp_path):
    mgr = treepack.CheckpointManager(tmp_path / "run")
    Slow.entered.clear()
    Slow.release.clear()
    saver = threading.Thread(target=mgr.save, args=(5, {"slow": Slow(1), "step": 5}))
    saver.start()
    assert Slow.entered.wait(60)  # the save has begun: it is in to_data
    threads, seen = _waiters(mgr, 5, Slow.release)
    _check_waiters(threads, seen)
    Slow.release.set()
    for t in threads:
        t.join(60)
    saver.join(60)
    assert seen == [(True, True, 5)] * 11, seen
    assert mgr.restore(5)["slow"].v == 1
    mgr.close()


def test_wait_until_finished_waits_in_every_thread_for_a_slow_write(tmp_path):
    # The tester's case: the save is snapshotted and writing in the background when 11 threads
    # wait (10 of them used to return at once). The write is held before it commits by a
    # progress callback that blocks.
    mgr = treepack.CheckpointManager(tmp_path / "run")
    writing = threading.Event()
    _released.clear()

    def hold(done, total):
        writing.set()
        assert _released.wait(60)

    handle = mgr.save(7, {"w": np.zeros(200_000), "step": 7}, progress=hold)
    assert writing.wait(60)
    assert not handle.done() and mgr.all_steps() == []
    threads, seen = _waiters(mgr, 7, _released)
    _check_waiters(threads, seen)
    _released.set()
    for t in threads:
        t.join(60)
    assert seen == [(True, True, 7)] * 11, seen
    assert handle.result().root == mgr.repository.root_hash("step-7")
    mgr.close()


def test_a_failed_background_save_is_raised_in_every_waiter_and_cleared_once(tmp_path):
    # Orbax test_async_error_wait_until_finished / test_async_error_subsequent_save: waiters in
    # other threads all get the error and do not clear it; the thread that began the save gets
    # it once (its wait, or any next save) and later waits succeed.
    mgr = treepack.CheckpointManager(tmp_path / "run", keep_last=None)
    mgr.save(1, _tree(1), blocking=True)
    for clear_with in ("wait", "save"):
        _released.clear()
        mgr.save(1, _tree(1), progress=lambda d, t: _released.wait(60))  # commits nothing: step 1 exists
        threads, seen = _waiters(mgr, 1, _released)
        _released.set()
        for t in threads:
            t.join(60)
        assert all(isinstance(e, FileExistsError) for e in seen), seen
        with pytest.raises(FileExistsError):  # still there for the thread that began the save
            if clear_with == "wait":
                mgr.wait_until_finished()
            else:
                mgr.save(2, _tree(2))
        mgr.wait_until_finished()  # cleared
        threads, seen = _waiters(mgr, 1, _released)
        for t in threads:
            t.join(60)
        assert seen == [(True, True, 1)] * 11, seen
    assert mgr.all_steps() == [1]
    # A blocking save delivers its own error: nothing is left to raise.
    with pytest.raises(FileExistsError):
        mgr.save(1, _tree(1), blocking=True)
    mgr.wait_until_finished()
    mgr.close()
