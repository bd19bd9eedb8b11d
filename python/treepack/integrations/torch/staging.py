"""Tensors bound for a device with staged copies (CUDA): filled through a few reused pinned
host buffers (``_plugin.staging.Ring``), each piece's copy to the device running while the next
is read (design decision 104)."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from ... import _plugin

class CudaCopies:
    """Host-to-device copies for the staging buffers: pinned host buffers; each copy queued on
    the device's current stream (after what is queued there, which may still be using the
    destination tensor; before whatever the caller queues next, which may use it), an event per
    copy."""

    def __init__(self, device: Any) -> None:
        import torch

        self.torch = torch
        self.device = device

    def buffer(self, n: int) -> Any:
        return self.torch.empty(n, dtype=self.torch.uint8, pin_memory=True)

    def copy(self, dst: Any, src: Any) -> Any:
        dst.copy_(src, non_blocking=True)
        event = self.torch.cuda.Event()
        event.record(self.torch.cuda.current_stream(self.device))
        return event

    def wait(self, event: Any) -> None:
        event.synchronize()


#: Device types whose tensors are filled through staged copies, and how.
STAGED: Dict[str, Callable[[Any], Any]] = {"cuda": CudaCopies}
#: Bytes of one staging buffer (small tensors are packed up to this), and how many a load cycles
#: through (kept for later loads: pinned memory is slow to allocate). A row longer than a buffer
#: gets a buffer of its size, which is not kept: what stays pinned is STAGE_COUNT * STAGE_BYTES.
STAGE_BYTES = 64 << 20
STAGE_COUNT = 3
#: Where each piece starts in a buffer.
ALIGN = 256
#: Where a load's ``Stager`` travels to its ``Loader`` (the load's decoder options, private to
#: treepack).
OPTION = "_torch_stager"


class Pinned:
    """A staging buffer (``_plugin.staging.Ring``'s): a host tensor of uint8 made by the copier."""

    __slots__ = ("tensor", "size")

    def __init__(self, tensor: Any) -> None:
        self.tensor, self.size = tensor, int(tensor.numel())

    def part(self, off: int, n: int) -> Any:
        return self.tensor[off:off + n]

    def release(self) -> None:
        """(Freed once nothing refers to it.)"""


def ring_for(device: Any) -> Tuple[Any, Any]:
    """The copier for ``device`` (a type in ``STAGED``) and the buffers a load cycles through for
    it (those kept for its kind, ``_plugin.staging.Ring``)."""
    kind = STAGED[device.type]
    copies = kind(device)
    ring = _plugin.staging.Ring(kind, lambda n: Pinned(copies.buffer(n)), copies.wait, count=STAGE_COUNT,
                         stage_bytes=STAGE_BYTES, keep_bytes=STAGE_BYTES, align=ALIGN)
    return copies, ring


class Stager:
    """One load's copies onto devices with staged copies (``map_location="cuda"``): each tensor's
    bytes (a view of the mapped file, or memory read for it) are copied into the next free bytes
    of the load's staging buffers for its device, and on to the device from there, that copy
    running while the load goes on with the next tensor; a buffer is written again only once the
    copies out of it have finished. ``finish``, which the load calls when it ends, waits for
    every copy still running: a load returns its tensors filled."""

    __slots__ = ("rings",)

    def __init__(self) -> None:
        self.rings: Dict[Any, Tuple[Any, Any]] = {}

    def put(self, dst: Any, src: Any) -> None:
        """Start ``dst[...] = src``: ``dst`` a contiguous tensor on a device with staged copies,
        ``src`` a contiguous CPU tensor of the same shape and dtype (read only now)."""
        import torch

        entry = self.rings.get(dst.device)
        if entry is None:
            entry = self.rings[dst.device] = ring_for(dst.device)
        copies, ring = entry
        raw = src.reshape(-1).view(torch.uint8)
        flat = dst.reshape(-1).view(torch.uint8)
        n = raw.numel()
        for lo in range(0, n, STAGE_BYTES):
            hi = min(n, lo + STAGE_BYTES)
            i, buf = ring.take(hi - lo)
            buf.copy_(raw[lo:hi])
            ring.copying(i, copies.copy(flat[lo:hi], buf))

    def settle(self) -> None:
        """Wait for every copy started so far (before the memory they go to is moved)."""
        for _, ring in self.rings.values():
            ring.settle()

    def finish(self, ok: bool) -> None:
        failed: Optional[BaseException] = None
        for _, ring in self.rings.values():
            try:
                ring.close(ok)
            except BaseException as e:  # noqa: BLE001 (every ring is closed first)
                failed = failed or e
        self.rings = {}
        if failed is not None:
            raise failed


def read_staged(reader: Any, items: List[Tuple[str, Any]], verify: bool) -> None:
    """Fill device tensors from the file through ``through_stages``: each piece of rows is read
    from the file straight into a staging buffer (whole chunks along the first axis where they
    fit, so each is read into place)."""
    by_device: Dict[Any, List[Tuple[Any, Any, Any]]] = {}
    for path, dst in items:
        shaped = bool(dst.shape)

        def fill(buf: Any, lo: int, hi: int, path: str = path, shaped: bool = shaped) -> None:
            reader.read_into(path, buf.numpy(), verify, slice=f"{lo}:{hi}" if shaped else "")

        by_device.setdefault(dst.device, []).append((dst, fill, reader.chunk_shape(path) if shaped else None))
    for device, leaves in by_device.items():
        through_stages(device, leaves)


def stage_into(dst: Any, src: Any, stager: Optional[Stager] = None) -> None:
    """``dst[...] = src`` for a contiguous tensor ``dst`` on a device with staged copies and a
    contiguous CPU tensor ``src`` (a view of a file's mapping, say), through the staging
    buffers, as ``torch.load(map_location=...)`` cannot from pageable memory: by the load's
    ``stager`` (the copy may still run when this returns), else by one of its own (done when
    this returns)."""
    if stager is not None:
        stager.put(dst, src)
        return
    own = Stager()
    ok = False
    try:
        own.put(dst, src)
        ok = True
    finally:
        own.finish(ok)


def through_stages(device: Any, leaves: List[Tuple[Any, Callable[[Any, int, int], None], Any]]) -> None:
    """Fill contiguous tensors on ``device`` (a type in ``STAGED``): for each ``(dst, fill,
    chunk)``, ``fill(buf, lo, hi)`` puts the bytes of rows ``lo:hi`` of its values into ``buf``,
    the next free bytes of the load's staging buffers (``ring_for``), which are then copied to the
    device asynchronously while the next piece is filled. ``chunk``: the stored chunk shape, whose
    whole rows a piece keeps to. Returns when every copy has."""
    import torch

    copies, ring = ring_for(device)
    ok = False
    try:
        for dst, fill, chunk in leaves:
            flat = dst.reshape(-1).view(torch.uint8)
            shape = tuple(dst.shape)
            rows = shape[0] if shape else 1
            row_bytes = flat.numel() // rows
            per = max(1, STAGE_BYTES // row_bytes)
            if chunk and per < rows and chunk[0] <= per:
                per -= per % chunk[0]  # whole chunks: each read straight into place
            for lo in range(0, rows, per):
                hi = min(rows, lo + per)
                i, buf = ring.take((hi - lo) * row_bytes)
                fill(buf, lo, hi)
                ring.copying(i, copies.copy(flat[lo * row_bytes:hi * row_bytes], buf))
        ok = True
    finally:
        ring.close(ok)
