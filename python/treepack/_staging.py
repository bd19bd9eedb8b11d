"""The few reused host buffers a load copies through onto an accelerator (issue 53), for every
framework: JAX's (``integrations.jax.staging``) and torch's (``integrations.torch``) loads cycle
them through one ``Ring``.

A copy from host memory to a device runs while the host goes on, but only from memory the device
may read directly (pinned or registered memory; other memory is copied once more, through the
runtime's own staging, or waited for). Such memory is slow to allocate, so a load takes a set of
``count`` buffers kept from the last load, copies each array (or piece of one) into the next free
bytes of a buffer, starts its copy to the device, and goes on with the next; a buffer is written
again from its start only once every copy out of it has finished. When the load ends it waits for
its copies still running and puts the buffers back. The framework says how a buffer is made, how a
copy is waited for, and which buffers are kept.

Nothing here imports a framework.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

# Buffers kept between loads, by the key of the framework and device kind (no copy out of them
# running): a load takes the set out (a load on another thread at the same time makes its own)
# and puts it back, less any buffer bigger than what its framework keeps, once every copy out of
# them has finished.
_kept: Dict[Any, List[Any]] = {}

# Buffers whose copies could not all be waited for (the wait itself failed or was interrupted):
# never freed, since a copy may still read them.
_abandoned: List[Any] = []
_lock = threading.Lock()


class Ring:
    """The ``count`` buffers one load cycles through: the kept set of ``key``, taken when first
    needed and put back by ``close``. ``take(n)`` hands out ``n`` free bytes: right after the last
    ones when they fit in that buffer, else from the start of the next buffer, once every copy out
    of it (each recorded with ``copying``) has finished.

    A buffer is made by ``new(n)`` (at least ``stage_bytes``): it has ``size`` (bytes),
    ``part(offset, n)`` (a view of those bytes) and ``release()``. ``wait(handle)`` returns once
    the copy ``handle`` has finished (with what the copy made). Each piece starts at a multiple
    of ``align`` bytes."""

    __slots__ = ("key", "new", "wait", "count", "stage_bytes", "keep_bytes", "align", "buffers", "busy", "at", "taken")

    def __init__(self, key: Any, new: Callable[[int], Any], wait: Callable[[Any], Any], *, count: int,
                 stage_bytes: int, keep_bytes: int, align: int) -> None:
        self.key, self.new, self.wait = key, new, wait
        self.count, self.stage_bytes, self.keep_bytes, self.align = count, stage_bytes, keep_bytes, align
        self.buffers: List[Optional[Any]] = [None] * count
        # Per buffer: (copy handle, what to do with its result once it has finished).
        self.busy: List[List[Tuple[Any, Any]]] = [[] for _ in range(count)]
        self.at = (0, 0)  # (buffer index, offset) of the next bytes handed out
        self.taken = False

    def take(self, n: int) -> Tuple[int, Any]:
        """``n`` free bytes (the buffer's ``part``) and the index of the buffer they are in."""
        if not self.taken:
            with _lock:
                kept = list(_kept.pop(self.key, []))[:self.count]
            self.buffers[:len(kept)] = kept
            self.taken = True
        i, off = self.at
        b = self.buffers[i]
        if b is None or off + n > b.size:
            if b is not None:
                i = (i + 1) % self.count
            off = 0
            self._settle(i)
            b = self.buffers[i]
            if b is None or b.size < n:
                if b is not None:
                    b.release()
                self.buffers[i] = None  # (freed before its successor is allocated)
                b = self.buffers[i] = self.new(max(n, self.stage_bytes))
        self.at = (i, off + -(-n // self.align) * self.align)
        return i, b.part(off, n)

    def copying(self, i: int, handle: Any, done: Optional[Callable[[Any], None]] = None) -> None:
        """A copy out of buffer ``i`` started; ``done(result)`` once it has finished."""
        self.busy[i].append((handle, done))

    def _settle(self, i: int) -> None:
        pending = self.busy[i]
        while pending:
            h, done = pending[0]
            out = self.wait(h)
            if done is not None:
                done(out)
            pending.pop(0)

    def settle(self) -> None:
        """Wait for every copy started so far (the buffers stay this load's)."""
        for i in range(self.count):
            self._settle(i)

    def close(self, ok: bool) -> None:
        """The load ended (``ok``: without an error): wait for every copy still running, then put
        the buffers back for the next load. A copy's failure is raised when the load itself
        succeeded (otherwise the load's own error stands); buffers whose copies could not all be
        waited for are never freed."""
        failed: Optional[BaseException] = None
        lost = False
        for i in range(self.count):
            try:
                self._settle(i)
            except BaseException as e:  # noqa: BLE001 (an interrupt too: the buffers must outlive the copies)
                failed = failed or e
                lost = True
                self.busy[i].clear()
        if self.taken:
            put_back(self.key, self.buffers, lost, self.keep_bytes)
            self.taken = False
            self.buffers = [None] * self.count
        if failed is not None and ok:
            raise failed


def put_back(key: Any, buffers: List[Optional[Any]], lost: bool, keep_bytes: int) -> None:
    """Keep a load's buffers, every copy out of them finished, for the next one (those of at most
    ``keep_bytes``, unless another load put its own back first), release the others; or, when
    copies out of them may still run (``lost``), hold on to all of them for good."""
    held = [b for b in buffers if b is not None]
    with _lock:
        if lost:
            _abandoned.extend(held)
            return
        keep = key not in _kept
        if keep:
            _kept[key] = [b for b in held if b.size <= keep_bytes]
    for b in held:
        if not keep or b.size > keep_bytes:
            b.release()
