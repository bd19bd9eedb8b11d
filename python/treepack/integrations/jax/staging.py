"""Loading shards onto an accelerator's memory through a few reused host buffers (issue 53).

A load onto CPU devices reads each shard into memory of its own, which JAX then holds without a
copy (``like._read_sharded``). For an accelerator, memory read into only to be copied to the
device and dropped is waste: each shard is read from the file straight into one of
``STAGE_COUNT`` reused host buffers and handed to ``jax.device_put``, whose copy to the device
runs while the next buffer is read into; a buffer is read into again only once every copy out
of it has finished. Small shards are packed into one buffer and read together (one parallel
pass over their chunks, ``Reader.read_many_into``).

The buffers are page-aligned memory registered with the device's runtime for DMA
(``Client.dma_map``, where the backend offers it: XLA's GPU clients copy from registered memory
directly, and stage any other host memory through pinned buffers of their own first, one more
copy). Host memory stays at ``STAGE_COUNT`` buffers of ``STAGE_BYTES``, or of the largest shard
when that is bigger, whatever the size of the tree; buffers of at most ``KEEP_BYTES`` are kept for
the process's next load (registering memory takes time).

A plain load (no template) onto an accelerator default device goes through the same buffers
(``Stager``): the load maps the file (the JAX integration's ``prepare_load``), so its arrays are
views of the page cache, not memory of their own; each is copied into the next free stretch of a
buffer and put from there, its copy to the device running while the load goes on. The load waits
for its last copies when it ends (``Stager.finish``). Both kinds of load cycle the buffers through
one ``_plugin.staging.Ring`` (``_ring``).

``_put``, ``_wait`` and ``_array`` are the calls that touch the device: tests on a CPU replace
them with copies that happen only when waited for, so that a buffer reused too early shows.
"""

from __future__ import annotations

import mmap
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ... import _plugin

#: Bytes of one staging buffer (shards are packed up to this), how many a load cycles through,
#: and the biggest buffer kept for the next load (one grown for a bigger shard up to this size).
STAGE_BYTES = 64 << 20
STAGE_COUNT = 3
KEEP_BYTES = 256 << 20
#: Where each shard starts in a buffer (a multiple of every dtype's alignment, and of what DMA
#: engines and XLA's zero-copy checks want).
ALIGN = 256

def staged(sharding: Any, reader: Any) -> bool:
    """Whether the shards of an array on ``sharding`` go through the staging buffers: every
    device it places shards on is an accelerator, into its own memory (a ``pinned_host`` or
    CPU sharding keeps each shard's own buffer, which JAX holds without copying), read by a
    treepack reader (another tool's file is read as it is)."""
    devices = sharding.addressable_devices
    return (
        bool(devices)
        and getattr(sharding, "memory_kind", None) in (None, "device")
        and all(d.platform != "cpu" for d in devices)
        and hasattr(reader, "read_many_into")
    )


def default_device() -> Any:
    """Where ``jax.device_put(x)`` puts an array of a template with no sharding (this process's
    first device), when that is an accelerator: its arrays then go through the buffers too; None
    on the CPU or when a default device is configured (``jax_default_device``: left to
    ``device_put``)."""
    import jax

    if getattr(jax.config, "jax_default_device", None) is not None:
        return None
    dev = jax.local_devices()[0]
    return None if dev.platform == "cpu" else dev


class _Buffer:
    """``n`` writable bytes of page-aligned host memory (``view``), registered for DMA with the
    client of ``device`` when it can be."""

    __slots__ = ("memory", "view", "client", "size")

    def __init__(self, device: Any, n: int) -> None:
        # Whole pages, all of them registered (a runtime may want page-sized ranges).
        pages = -(-max(n, 1) // mmap.PAGESIZE) * mmap.PAGESIZE
        self.memory = mmap.mmap(-1, pages)
        self.view = np.frombuffer(self.memory, dtype=np.uint8, count=n)
        self.size = n
        self.client = None
        client = getattr(device, "client", None)
        if n and client is not None and hasattr(client, "dma_map"):
            try:
                client.dma_map(self.view.ctypes.data, pages)
                self.client = client
            except Exception:  # noqa: BLE001 (UNIMPLEMENTED on the CPU and some backends: copied through the runtime's staging)
                pass

    def part(self, off: int, n: int) -> np.ndarray:
        return self.view[off:off + n]

    def release(self) -> None:
        """Unregister the memory (it is unmapped once nothing refers to it)."""
        if self.client is not None:
            client, self.client = self.client, None
            try:
                client.dma_unmap(self.view.ctypes.data)
            except Exception:  # noqa: BLE001 (a client already shut down)
                pass


def _put(x: np.ndarray, device: Any) -> Any:
    """Start copying ``x`` (in a staging buffer) onto ``device`` (a single-device sharding; None:
    the default device, leaving the array uncommitted as ``device_put(x)`` does)."""
    import jax

    return jax.device_put(x) if device is None else jax.device_put(x, device)


def _wait(handle: Any) -> Any:
    """The array ``_put`` started, once its copy has finished (its buffer free again)."""
    return handle.block_until_ready()


def _array(handle: Any) -> Any:
    """The array ``_put`` started, at once (a ``jax.Array`` whose copy may still run)."""
    return handle


#: Where a prepared plain load's ``Stager`` travels to ``arrays.Loader`` (the load's decoder
#: options, private to treepack).
OPTION = "_jax_stager"


def _ring(device: Any) -> Any:
    """The buffers one load onto ``device``'s platform cycles through (``_plugin.staging.Ring``)."""
    return _plugin.staging.Ring(device.platform, lambda n: _Buffer(device, n), lambda h: _wait(h), count=STAGE_COUNT,
                         stage_bytes=STAGE_BYTES, keep_bytes=KEEP_BYTES, align=ALIGN)


class Stager:
    """One plain load's puts onto the default device ``device`` (an accelerator): each array (a
    view of the mapped file) is copied into the next free bytes of the load's ring (``_ring``) and put
    from there, its copy to the device running while the load goes on. ``finish``, which the load
    calls when it ends, waits for every copy still running: nothing of a load outlives it (an
    array the caller deletes or donates later is never waited for). An empty array, or one bigger
    than ``KEEP_BYTES``, goes to ``jax.device_put`` as it is."""

    __slots__ = ("ring",)

    def __init__(self, device: Any) -> None:
        self.ring = _ring(device)

    def put(self, x: np.ndarray) -> Any:
        import jax

        n = int(x.nbytes)
        if not 0 < n <= KEEP_BYTES:
            return jax.device_put(x)
        i, raw = self.ring.take(n)
        v = raw.view(x.dtype).reshape(x.shape)
        np.copyto(v, x, casting="no")
        h = _put(v, None)
        self.ring.copying(i, h)
        return _array(h)

    def finish(self, ok: bool) -> None:
        self.ring.close(ok)


class _Shard:
    """One read: the part of a planned array at ``index``, for the devices that hold it."""

    __slots__ = ("plan", "text", "shape", "nbytes", "devices", "arrays")

    def __init__(self, plan: Any, text: str, shape: Tuple[int, ...], nbytes: int) -> None:
        self.plan, self.text, self.shape, self.nbytes = plan, text, shape, nbytes
        self.devices: List[Any] = []
        self.arrays: Dict[Any, Any] = {}


def index_key(index: Tuple[slice, ...]) -> Tuple[Any, ...]:
    """A shard's index (a tuple of slices) as a dict key."""
    return tuple((s.start, s.stop, s.step) for s in index)


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def read_staged(reader: Any, plans: List[Any], verify: bool) -> List[Any]:
    """The arrays of ``plans`` (``like._Sharded``s whose shardings are ``staged``), each device's
    shard read through the staging buffers (see the module docstring). A plan with ``default``
    set (a template leaf without a sharding) comes back as ``device_put(x)`` gives it:
    uncommitted, on the default device."""
    import jax

    _slice_text = _plugin.slice_text
    shards: List[_Shard] = []
    layout: List[List[Tuple[Any, _Shard]]] = []  # per plan: (device, its shard), in the sharding's order
    for pl in plans:
        by_index: Dict[Tuple[Any, ...], _Shard] = {}
        placed: List[Tuple[Any, _Shard]] = []
        for dev, index in pl.sharding.addressable_devices_indices_map(pl.shape).items():
            key = index_key(index)
            sh = by_index.get(key)
            if sh is None:
                shape = tuple(len(range(*s.indices(dim))) for s, dim in zip(index, pl.shape))
                whole = shape == tuple(pl.shape)
                text = "" if whole else _slice_text(tuple(index), len(pl.shape))
                sh = by_index[key] = _Shard(pl, text, shape, int(np.prod(shape, dtype=np.int64)) * pl.stored.itemsize)
                shards.append(sh)
            sh.devices.append(dev)
            placed.append((dev, sh))
        layout.append(placed)
    # Shards in the order of the plans (the tree's), packed into batches of at most a buffer.
    batches: List[List[_Shard]] = []
    size = 0
    for sh in shards:
        if not batches or size + _align(sh.nbytes) > STAGE_BYTES:
            batches.append([])
            size = 0
        batches[-1].append(sh)
        size += _align(sh.nbytes)
    if batches:
        _through_buffers(reader, plans[0].sharding.addressable_devices, batches, verify)
    out = []
    for pl, placed in zip(plans, layout):
        if pl.default:
            ((dev, sh),) = placed
            out.append(sh.arrays[dev])
        else:
            out.append(jax.make_array_from_single_device_arrays(pl.shape, pl.sharding, [sh.arrays[dev] for dev, sh in placed]))
    return out


def _through_buffers(reader: Any, devices: Any, batches: List[List[_Shard]], verify: bool) -> None:
    """Read each batch into the next free bytes of the load's ring (``_ring``) and start its shards'
    copies to their devices; a buffer is read into again only once the copies out of it have
    finished. When a read fails, the copies already started are waited for (their own errors
    give way to the read's) before the buffers go back."""
    from jax.sharding import SingleDeviceSharding as single

    ring = _ring(next(iter(devices)))
    ok = False
    try:
        for batch in batches:
            i, raw = ring.take(sum(_align(sh.nbytes) for sh in batch))
            views: List[np.ndarray] = []
            whole: List[Tuple[str, np.ndarray]] = []
            off = 0
            for sh in batch:
                v = raw[off:off + sh.nbytes].view(sh.plan.stored).reshape(sh.shape)
                off += _align(sh.nbytes)
                views.append(v)
                if not sh.nbytes:
                    continue
                if sh.text:
                    reader.read_into(sh.plan.path, v, verify, slice=sh.text)
                else:
                    whole.append((sh.plan.path, v))
            if whole:
                reader.read_many_into(whole, verify)
            for sh, v in zip(batch, views):
                x = v if v.dtype == sh.plan.want else v.astype(sh.plan.want)
                kind = getattr(sh.plan.sharding, "memory_kind", None)
                for dev in sh.devices:
                    h = _put(x, None if sh.plan.default else single(dev, memory_kind=kind))
                    ring.copying(i, h, lambda arr, sh=sh, dev=dev: sh.arrays.__setitem__(dev, arr))
        ok = True
    finally:
        ring.close(ok)


def _put_back(platform: str, buffers: List[Optional[_Buffer]], lost: bool) -> None:
    """``_plugin.staging.put_back`` for JAX's buffers of ``platform``."""
    _plugin.staging.put_back(platform, buffers, lost, KEEP_BYTES)
