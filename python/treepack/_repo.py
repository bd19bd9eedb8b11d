"""Repositories (docs/repository.md): many named trees in one location sharing chunks by hash,
and the CheckpointManager built on them for training loops."""

from __future__ import annotations

import concurrent.futures
import datetime as _dt
import operator
import os
import re
import threading
from typing import Any, List, NamedTuple, Optional, Tuple

from . import _async, _core
from ._api import PathLike, StorageOptions, _opts, _path, load, load_structure, save
from ._async import SaveHandle
from ._lazy import open as open_view

__all__ = ["Repository", "TreeRef", "CheckpointManager"]


class TreeRef(NamedTuple):
    """A committed name of a repository (what ``Repository.names()`` lists)."""

    name: str
    root: str
    """The tree's root hash (``treepack.root_hash``)."""
    saved: _dt.datetime
    """When its save committed (UTC)."""
    bytes_written: int
    bytes_reused: int
    """Stored bytes the save found already in the repository (not written again)."""


class Repository:
    """Many named trees in one location (a folder or an object-store prefix) sharing chunks by
    BLAKE3 hash: a save writes only the chunks the repository does not hold yet.

    ``Repository(location, create=True)`` creates it (or opens the one there); a folder that holds
    other files is refused (``ValueError``). Every load option
    works on a tree of it (``select``, ``like``, ``mmap``, ``trust``, ...), and so does every other
    function that takes a location: ``repo.tree(name)`` is ``"LOCATION@NAME"``, which
    ``treepack.load``, ``open``, ``load_structure``, ``verify``, ``root_hash`` and the CLI accept.
    """

    def __init__(self, location: PathLike, *, storage_options: StorageOptions = None, create: bool = False) -> None:
        self.location = _path(location)
        self.storage_options = storage_options
        if create and "@" in os.path.basename(self.location) and "://" not in self.location \
                and not os.path.lexists(self.location):
            # A path with an `@` that does not exist yet reads as LOCATION@NAME (a tree of the
            # repository before the `@`): made first, the folder is this repository's.
            os.makedirs(self.location)
        self._core = _core.Repository(self.location, _opts(storage_options), create)

    def tree(self, name: str) -> str:
        """``"LOCATION@NAME"``, the location of tree ``name`` (raises ``ValueError`` for a name
        that is not 1-128 characters of ``A-Z a-z 0-9 . _ -``)."""
        return self._core.tree(name)

    def save(self, tree: Any, name: str, **save_kwargs: Any) -> Any:
        """Save ``tree`` as ``name`` (``treepack.save``'s keywords: ``overwrite``, ``blocking``,
        ``compression``, ``metadata``, ...). Returns a ``SaveInfo`` whose ``bytes_written`` and
        ``bytes_reused`` say what was new and what the repository already held, and ``root`` the
        tree's root hash. A name is committed create-only: of two savers of one name, one wins and
        the other gets ``FileExistsError``. ``overwrite=True`` replaces it with a compare-and-swap:
        if another writer replaced it while this save ran, nothing is replaced
        (``FileExistsError``)."""
        return save(tree, self.tree(name), storage_options=self.storage_options, **save_kwargs)

    def load(self, name: str, **load_kwargs: Any) -> Any:
        """Load tree ``name`` (``treepack.load``'s keywords)."""
        return load(self.tree(name), storage_options=self.storage_options, **load_kwargs)

    def load_structure(self, name: str) -> Any:
        return load_structure(self.tree(name), storage_options=self.storage_options)

    def open(self, name: str, **open_kwargs: Any) -> Any:
        """A lazy view of tree ``name`` (``treepack.open``'s keywords: ``signed_by=``, ``trust=``…)."""
        return open_view(self.tree(name), storage_options=self.storage_options, **open_kwargs)

    def names(self) -> List[TreeRef]:
        """Every committed name, sorted, with its root hash, save time and what its save wrote."""
        return [
            TreeRef(n, root, _dt.datetime.fromtimestamp(ms / 1000, _dt.timezone.utc), written, reused)
            for n, root, ms, written, reused in self._core.names()
        ]

    def root_hash(self, name: str) -> str:
        """The root hash recorded when ``name`` was saved (no manifest read)."""
        return self._core.root_hash(name)

    def delete(self, name: str) -> None:
        """Delete the name (``FileNotFoundError`` if there is none). Its chunks stay until
        ``gc`` finds no other tree uses them."""
        self._core.delete(name)

    def gc(self, grace_secs: float = 3600.0) -> int:
        """Remove packs and manifests no committed name needs and that have been unreferenced for
        ``grace_secs``; returns the bytes freed. Never removes what a save still running may
        refer to (docs/repository.md, "How gc stays safe")."""
        removed, freed, waiting, running = self._core.gc(grace_secs)
        return freed

    def verify(self) -> Any:
        """Re-hash every chunk of every tree and check every pack index; problems name the tree."""
        return self._core.verify()

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and any(t.name == name for t in self.names())

    def __repr__(self) -> str:
        return f"Repository({self.location!r})"


_STEP = re.compile(r"^step-(\d+)$")


def _step(step: Any) -> int:
    """A step number: an int 0 or more (a numpy integer, or a 0-d integer array such as a
    TrainState's ``step``, too); anything else is refused rather than saved under a name
    ``all_steps`` would not list (``step--1``) or another step's (``7.9`` as ``step-7``)."""
    if not isinstance(step, int) or isinstance(step, bool):
        dtype = getattr(step, "dtype", None)
        try:
            # Integers alone have __index__ (numpy integers, 0-d integer numpy/JAX/torch arrays).
            n = None if isinstance(step, bool) or getattr(dtype, "kind", None) == "b" or str(dtype) == "torch.bool" \
                else operator.index(step)
        except TypeError:
            n = None
        if n is None:
            raise TypeError(f"a checkpoint step is an int, not {type(step).__name__} ({step!r})")
        step = n
    if step < 0:
        raise ValueError(f"a checkpoint step is 0 or more, not {step}")
    return int(step)


class CheckpointManager:
    """Checkpoints of a training loop in a repository: each ``save(step, tree)`` writes only the
    chunks that changed since the checkpoints still kept, keeps the last ``keep_last`` steps (and
    every step that is a multiple of ``keep_every``), deletes the rest and frees their bytes.

    - ``keep_last``: how many of the newest steps to keep; ``None`` keeps every step. ``0`` keeps
      none of them beyond what ``keep_every`` keeps (Orbax's ``max_to_keep=0,
      keep_period=N``): ``keep_last=0, keep_every=100`` keeps steps 100, 200, ... only, and a
      step that is not a multiple is deleted once it has committed. ``keep_last=0`` without
      ``keep_every`` would delete every checkpoint it saves, and is refused (``ValueError``).
    - ``keep_every``: every step that is a multiple of it is kept, whatever ``keep_last`` says.
    - ``save_interval_steps`` (Orbax's option of that name): ``save(step, ...)`` saves only
      steps that ``should_save(step)`` accepts — multiples of it newer than the latest step —
      and otherwise does nothing and returns ``None``; ``force=True`` saves any step. Without
      it (the default) every ``save`` saves.

    ``save(..., blocking=False)`` (the default) returns once the tree is snapshotted; the write,
    the retention and the gc run on a background thread, one save at a time (a new save waits
    for the previous one). ``wait_until_finished()`` waits, in every thread that calls it, until
    every save begun before the call has committed and its retention has run. Safe to resume
    after a crash: a new manager on the same location sees every committed step, and what an
    interrupted save wrote is removed by the next gc. A folder (or prefix) that holds other files
    than a repository's is refused (``ValueError``), and nothing is written to it.
    """

    def __init__(
        self,
        location: PathLike,
        *,
        keep_last: Optional[int] = 3,
        keep_every: Optional[int] = None,
        save_interval_steps: Optional[int] = None,
        storage_options: StorageOptions = None,
        gc_grace_secs: float = 0.0,
    ) -> None:
        if keep_last is not None and (not isinstance(keep_last, int) or keep_last < 0):
            raise ValueError("keep_last must be a number of steps, 0 or more (or None to keep every step)")
        if keep_every is not None and (not isinstance(keep_every, int) or keep_every < 1):
            raise ValueError("keep_every must be a positive number of steps (or None)")
        if keep_last == 0 and keep_every is None:
            raise ValueError(
                "keep_last=0 without keep_every would delete every checkpoint once saved: pass keep_every=N to "
                "keep only the multiples of N, or keep_last=None to keep every step"
            )
        if save_interval_steps is not None and (not isinstance(save_interval_steps, int) or save_interval_steps < 1):
            raise ValueError("save_interval_steps must be a positive number of steps (or None to save every step given)")
        self.repository = Repository(location, storage_options=storage_options, create=True)
        self.keep_last = keep_last
        self.keep_every = keep_every
        self.save_interval_steps = save_interval_steps
        self.gc_grace_secs = gc_grace_secs
        self._pool: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._pool_pid = 0
        self._lock = threading.Lock()  # one save() at a time
        self._reset_progress()

    def _reset_progress(self) -> None:
        # Saves are numbered as they begin (under self._lock) and end in that order (one worker
        # thread): a waiter waits until the number it saw has ended. A forked child starts
        # afresh: the parent's saves are not its own to wait for.
        self._cond = threading.Condition()
        self._begun = 0
        self._ended = 0
        self._last_step: Optional[int] = None  # the newest step this manager began to save
        # The error of the last save, with the thread that began it: every waiter raises it,
        # and it is cleared once delivered to that thread or to a later save().
        self._error: Optional[Tuple[BaseException, int]] = None
        self._progress_pid = os.getpid()

    @staticmethod
    def name(step: int) -> str:
        """The tree name of a step: ``step-<n>``."""
        return f"step-{_step(step)}"

    def all_steps(self) -> List[int]:
        """Every committed step, ascending."""
        return sorted(int(m.group(1)) for t in self.repository.names() if (m := _STEP.match(t.name)))

    def latest_step(self) -> Optional[int]:
        """The newest committed step, or ``None``."""
        steps = self.all_steps()
        return steps[-1] if steps else None

    def should_save(self, step: int) -> bool:
        """Whether ``save(step, ...)`` would save (as Orbax's ``should_save``): the step is a
        multiple of ``save_interval_steps`` (any step when it is ``None``) and newer than the
        latest step committed or being saved."""
        step = _step(step)
        if self.save_interval_steps is not None and step % self.save_interval_steps != 0:
            return False
        latest = self.latest_step()
        last = self._last_step if self._progress_pid == os.getpid() else None
        newest = max((s for s in (latest, last) if s is not None), default=None)
        return newest is None or step > newest

    def _executor(self) -> concurrent.futures.ThreadPoolExecutor:
        # One thread: saves, retention and gc run in order. A forked child starts its own.
        if self._pool is None or self._pool_pid != os.getpid():
            self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="treepack-ckpt")
            self._pool_pid = os.getpid()
        return self._pool

    def save(self, step: int, tree: Any, *, blocking: bool = False, force: bool = False, **save_kwargs: Any) -> Any:
        """Save ``tree`` as step ``step`` (``treepack.save``'s keywords). Returns the ``SaveInfo``
        when ``blocking``, else a ``SaveHandle`` whose ``result()`` is the ``SaveInfo`` once the
        save, the retention and the gc are done. Raises ``FileExistsError`` (from the handle) if
        the step was already saved, unless ``overwrite=True``.

        With ``save_interval_steps`` set, a step that ``should_save(step)`` refuses is not saved:
        nothing is written and ``None`` is returned (false, as Orbax's ``save`` returns
        ``False``); ``force=True`` saves it anyway. An error of the previous background save is
        raised here (once) before anything is saved."""
        step = _step(step)
        if self.save_interval_steps is not None and not force and not self.should_save(step):
            return None
        name = self.name(step)
        with self._lock:
            self._wait(deliver=True)
            self._check_kept(step)  # (once the saves before it ended: what they committed counts)
            with self._cond:
                self._begun += 1
                ticket = self._begun
                self._last_step = step
            try:
                # Snapshots the tree here, in the caller's thread.
                handle = self.repository.save(tree, name, blocking=False, **save_kwargs)
            except BaseException:
                self._end(ticket, None)  # raised to the caller below: nothing to keep
                raise
            owner = threading.get_ident()

            def finish() -> Any:
                try:
                    # (its error goes on to this manager's handle: not yet given to the program)
                    info = handle._future.result()
                    self._apply_retention()
                except BaseException as e:
                    self._end(ticket, (e, owner))
                    raise
                self._end(ticket, None)
                return info

            future = _async.submit(finish, self.repository.tree(name), self._executor())
        # Its error, once the handle gives it to the program, is not raised again by a later
        # save or wait.
        out = SaveHandle(future, self.repository.tree(name), delivered=self._delivered)
        return out if not blocking else out.result()

    def _check_kept(self, step: int) -> None:
        """Refuse a step the retention would delete as soon as it committed (older than the
        ``keep_last`` newest steps): the save would report success and leave nothing. (With
        ``keep_last=0`` that is what is asked for the steps ``keep_every`` does not keep.)"""
        if not self.keep_last or (self.keep_every is not None and step % self.keep_every == 0):
            return
        last = self._last_step if self._progress_pid == os.getpid() else None
        if last is not None and step > last:
            return  # the newest so far: kept (no listing for the usual save)
        newer = {s for s in self.all_steps() if s > step}  # (committed: no save is in flight now)
        if len(newer) >= self.keep_last:
            shown = sorted(newer)[-self.keep_last:]
            raise ValueError(
                f"{self.repository.location}: step {step} is older than the {self.keep_last} newest steps "
                f"({', '.join(map(str, shown))}): keep_last={self.keep_last} would delete it as soon as it was saved. "
                "Keep it with keep_last=None or keep_every, or save it to another repository"
            )

    def _delivered(self, e: BaseException) -> None:
        with self._cond:
            if self._error is not None and self._error[0] is e:
                self._error = None

    def _end(self, ticket: int, error: Optional[Tuple[BaseException, int]]) -> None:
        with self._cond:
            self._ended = max(self._ended, ticket)
            if error is not None:
                self._error = error
            self._cond.notify_all()

    def _apply_retention(self) -> None:
        steps = self.all_steps()
        if self.keep_last is None:
            keep = set(steps)
        else:
            keep = set(steps[max(0, len(steps) - self.keep_last):]) if self.keep_last else set()
        if self.keep_every is not None:
            keep |= {s for s in steps if s % self.keep_every == 0}
        for s in steps:
            if s not in keep:
                try:
                    self.repository.delete(self.name(s))
                except FileNotFoundError:
                    pass  # another manager deleted it first
        self.repository.gc(self.gc_grace_secs)

    def _wait(self, deliver: bool) -> None:
        if self._progress_pid != os.getpid():
            self._reset_progress()
        with self._cond:
            ticket = self._begun
            while self._ended < ticket:
                self._cond.wait()
            if self._error is None:
                return
            error, owner = self._error
            if deliver or owner == threading.get_ident():
                self._error = None
        _async.retrieved(error)
        raise error

    def wait_until_finished(self) -> None:
        """Wait until every save begun before this call (in any thread) has committed and its
        retention and gc have run; safe to call from several threads at once, each of which
        waits. Raises the error of a failed background save: in every thread that waits for
        it, and it is cleared once raised in the thread that began that save (or by the next
        ``save``), as Orbax does."""
        self._wait(deliver=False)

    def restore(self, step: Optional[int] = None, **load_kwargs: Any) -> Any:
        """Load step ``step`` (default: the latest) with ``treepack.load``'s keywords
        (``like=``, ``select=``, ``trust=``, ...). Waits for a save in progress first."""
        self.wait_until_finished()
        if step is None:
            step = self.latest_step()
            if step is None:
                raise FileNotFoundError(f"{self.repository.location}: no checkpoint saved yet")
        try:
            return self.repository.load(self.name(step), **load_kwargs)
        except FileNotFoundError as e:
            steps = self.all_steps()
            if _step(step) in steps:
                raise
            listed = ", ".join(map(str, steps[-10:])) if steps else "none"
            raise FileNotFoundError(
                f"{self.repository.location}: no step {step} (the steps kept: {'…, ' if len(steps) > 10 else ''}{listed})"
            ) from e

    def close(self) -> None:
        """Finish the save in progress."""
        self.wait_until_finished()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def __enter__(self) -> "CheckpointManager":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"CheckpointManager({self.repository.location!r}, keep_last={self.keep_last}, keep_every={self.keep_every}, "
            f"save_interval_steps={self.save_interval_steps})"
        )

