"""Saving in the background and from asyncio: SaveHandle (what ``save(..., blocking=False)``
returns), the save thread pool (started afresh in a forked child), asave and aload."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import os
import threading
from typing import TYPE_CHECKING, Any, Callable, Generator, Optional

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


def _after_fork_in_child() -> None:
    # The parent's save threads do not exist in a forked child: a pool inherited from it would
    # queue work nobody runs. The child starts its own on first use (the Rust pools do the same).
    global _EXECUTOR, _EXECUTOR_LOCK
    _EXECUTOR = None
    _EXECUTOR_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class SaveHandle:
    """A save running in the background (from ``save(..., blocking=False)``).

    ``result(timeout=None)`` waits and returns the :class:`SaveInfo` (or raises the save's error),
    ``done()`` says whether it finished, and the handle can be awaited in asyncio code.
    """

    def __init__(self, future: "concurrent.futures.Future[SaveInfo]", location: str) -> None:
        self._future = future
        self.location = location

    def done(self) -> bool:
        return self._future.done()

    def result(self, timeout: Optional[float] = None) -> SaveInfo:
        return self._future.result(timeout)

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        return self._future.exception(timeout)

    def add_done_callback(self, fn: Callable[["SaveHandle"], Any]) -> None:
        self._future.add_done_callback(lambda _f: fn(self))

    def __await__(self) -> Generator[Any, None, SaveInfo]:
        return asyncio.wrap_future(self._future).__await__()

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
