"""Saving in the background and from asyncio: SaveHandle (what ``save(..., blocking=False)``
returns), the save thread pool (started afresh in a forked child), asave and aload."""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import functools
import os
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, Generator, Optional, Tuple

if TYPE_CHECKING:
    from ._api import PathLike, SaveInfo

_EXECUTOR: Optional[concurrent.futures.ThreadPoolExecutor] = None
_EXECUTOR_LOCK = threading.Lock()


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    # Saves run with the GIL released, so a few threads overlap I/O; pending saves are finished
    # (not dropped) when the interpreter exits.
    global _EXECUTOR
    with _EXECUTOR_LOCK:
        if _EXECUTOR is None:
            _EXECUTOR = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="treepack-save")
        return _EXECUTOR


#: The last background save begun to each location (by `_key`), until it ends: a later save
#: there, background or not, writes after it, so that the last call wins.
_LAST: Dict[str, "concurrent.futures.Future[Any]"] = {}
#: Background saves that failed, by id of their error, until something raises or returns that
#: error to the program (`retrieved`); said on stderr at exit otherwise.
_FAILED: Dict[int, Tuple[str, BaseException]] = {}
_STATE_LOCK = threading.Lock()


def _key(location: str) -> str:
    return location if "://" in location else os.path.abspath(location)


#: The location a save thread is writing (a save its progress callback begins there must not
#: wait for the save that called it).
_WRITING = threading.local()


def after_earlier(location: str) -> None:
    """Wait until the background saves to ``location`` begun before have ended (their errors
    stay theirs): a blocking save then writes after them."""
    key = _key(location)
    if getattr(_WRITING, "key", None) == key:
        return
    with _STATE_LOCK:
        prev = _LAST.get(key)
    if prev is not None:
        concurrent.futures.wait([prev])


def submit(fn: Callable[[], Any], location: str, pool: Optional[concurrent.futures.Executor] = None) -> "concurrent.futures.Future[Any]":
    """Run ``fn`` (a save's writing) on ``pool`` (the save pool by default), after the
    background saves to ``location`` begun before it: two saves of one place commit in the
    order they were called, whatever their sizes. In a process whose interpreter is shutting
    down (a save begun from an ``atexit`` handler, or by a thread the main thread did not wait
    for), where no thread can be started, it runs here, before returning."""
    key = _key(location)
    with _STATE_LOCK:
        prev = _LAST.get(key)

        def run() -> Any:
            if prev is not None and getattr(_WRITING, "key", None) != key:
                concurrent.futures.wait([prev])
            outer = getattr(_WRITING, "key", None)
            _WRITING.key = key
            try:
                return fn()
            finally:
                _WRITING.key = outer

        inline = False
        try:
            fut = (pool or _executor()).submit(run)
        except RuntimeError as e:
            if "shutdown" not in str(e):
                raise
            fut, inline = concurrent.futures.Future(), True
        _LAST[key] = fut
    if inline:
        # (here, outside the lock: the save's progress callback may begin another)
        fut.set_running_or_notify_cancel()
        try:
            fut.set_result(run())
        except BaseException as err:  # noqa: BLE001 (the handle raises it)
            fut.set_exception(err)

    def ended(f: "concurrent.futures.Future[Any]") -> None:
        with _STATE_LOCK:
            if _LAST.get(key) is f:
                del _LAST[key]

    fut.add_done_callback(ended)
    return fut


def retrieved(e: Optional[BaseException]) -> None:
    """The error ``e`` of a background save reached the program (raised or returned to it)."""
    if e is not None:
        with _STATE_LOCK:
            _FAILED.pop(id(e), None)
            try:
                e._treepack_retrieved = True  # type: ignore[union-attr]  (a failure noted later stays retrieved)
            except AttributeError:
                pass


def _note_failure(location: str, f: "concurrent.futures.Future[Any]") -> None:
    if f.cancelled():
        return
    e = f.exception()
    if e is not None:
        with _STATE_LOCK:
            # (a future's callbacks run after its waiters wake: the error may be raised already)
            if not getattr(e, "_treepack_retrieved", False):
                _FAILED[id(e)] = (location, e)


@atexit.register
def _unretrieved_failures() -> None:
    # (atexit runs after the interpreter has waited for the save threads: every save has ended)
    with _STATE_LOCK:
        failed = list(_FAILED.values())
        _FAILED.clear()
    for location, e in failed:
        print(f"treepack: a background save of {location} failed, and nothing asked for its result: "
              f"{type(e).__name__}: {e}", file=sys.stderr)


def _after_fork_in_child() -> None:
    # The parent's save threads do not exist in a forked child: a pool inherited from it would
    # queue work nobody runs. The child starts its own on first use (the Rust pools do the same),
    # and the parent's saves are not its own to wait for or report.
    global _EXECUTOR, _EXECUTOR_LOCK, _STATE_LOCK
    _EXECUTOR = None
    _EXECUTOR_LOCK = threading.Lock()
    _STATE_LOCK = threading.Lock()
    _LAST.clear()
    _FAILED.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class SaveHandle:
    """A save running in the background (from ``save(..., blocking=False)``).

    ``result(timeout=None)`` waits and returns the :class:`SaveInfo` (or raises the save's error),
    ``done()`` says whether it finished, and the handle can be awaited in asyncio code.
    """

    def __init__(self, future: "concurrent.futures.Future[SaveInfo]", location: str,
                 delivered: Optional[Callable[[BaseException], None]] = None) -> None:
        self._future = future
        self.location = location
        # Told when the save's error reaches the program through this handle.
        self._delivered = delivered
        future.add_done_callback(functools.partial(_note_failure, location))

    def _reached(self, e: Optional[BaseException]) -> None:
        if e is None or not self._future.done() or self._future.cancelled() or self._future.exception() is not e:
            return
        retrieved(e)
        if self._delivered is not None:
            self._delivered(e)

    def done(self) -> bool:
        return self._future.done()

    def result(self, timeout: Optional[float] = None) -> SaveInfo:
        try:
            return self._future.result(timeout)
        except BaseException as e:
            self._reached(e)
            raise

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        e = self._future.exception(timeout)
        self._reached(e)
        return e

    def add_done_callback(self, fn: Callable[["SaveHandle"], Any]) -> None:
        self._future.add_done_callback(lambda _f: fn(self))

    def __await__(self) -> Generator[Any, None, SaveInfo]:
        try:
            return (yield from asyncio.wrap_future(self._future).__await__())
        except BaseException as e:
            self._reached(e)
            raise

    def __repr__(self) -> str:
        state = "done" if self.done() else "running"
        return f"SaveHandle({self.location!r}, {state})"


async def asave(tree: Any, path: PathLike, **kwargs: Any) -> SaveInfo:
    """``await asave(tree, path, ...)``: like :func:`save` (same keywords), without blocking the event
    loop during I/O. The tree is snapshotted before the first ``await`` yields."""
    from ._api import save  # here, not at the top: _api imports this module

    kwargs.pop("blocking", None)
    return await save(tree, path, blocking=False, **kwargs)


async def aload(path: PathLike, **kwargs: Any) -> Any:
    """``await aload(path, ...)``: :func:`load` (same keywords) on a worker thread."""
    from ._api import load  # here, not at the top: _api imports this module

    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, functools.partial(load, path, **kwargs))
