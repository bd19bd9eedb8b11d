"""Dask: ``dask.array.Array`` leaves written block by block by the tasks that compute them, and
stored arrays read back as Dask arrays whose tasks read only their own chunks.

Saving (docs/dask.md): the client converts the tree; a Dask array becomes an empty
``treepack.shards`` node with an ``id`` (format: "Saves written in parts"). One task per Dask
block (``map_blocks``: the graph is built in time independent of the block count) writes that
block's chunks — on the chunk grid that tiles the blocks — into a pack of its own, and returns
its part's manifest (a few hundred bytes). The client gathers those, writes its own part (every
other leaf) and commits the merged tree once. A failed task fails the compute: nothing is
committed; packs already written are leftovers for ``treepack.gc``. A retried task writes the
same content-named pack again. Irregular chunks are made regular first (``rechunk`` to the
first block's size along each axis).

Nothing here imports Dask unless the process already did (``sys.modules``).
"""

from __future__ import annotations

import json
import sys
import threading
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .. import _plugin
from .._plugin import SHARDS, LeafInfo, Piece, StructNode, commit_parts
from . import xarray as xarrays


def is_array(obj: Any) -> bool:
    """Whether ``obj`` is a Dask array (False, without importing Dask, when it is not loaded)."""
    da = sys.modules.get("dask.array")
    return da is not None and isinstance(obj, da.Array)


class Found(_plugin.SaveState):
    """The Dask arrays one save met, in order."""

    def __init__(self, chunk_bytes: Optional[int]) -> None:
        self.chunk_bytes = chunk_bytes
        self.arrays: List[Tuple[Any, Dict[str, Any]]] = []

    def reset(self) -> None:
        # (A walk started over meets the arrays again, numbered from zero.)
        self.arrays.clear()

    def writer(self, prepared: Any, p: str, write_opts: Dict[str, Any]) -> Any:
        # Dask arrays: their blocks are written by the tasks that compute them (docs/dask.md).
        if not self.arrays:
            return None
        return lambda: save(prepared, self, p, write_opts)


#: Blocks smaller than this are merged (a Dask rechunk) into blocks of about ``MERGED_BLOCK_BYTES``
#: before writing: every block is one pack, and a million tiny packs would be a million objects.
SMALL_BLOCK_BYTES = 16 << 20
MERGED_BLOCK_BYTES = 64 << 20


def _regular(arr: Any) -> Any:
    """``arr`` with regular chunks (every block along an axis the size of the first, the last
    possibly smaller: the stored chunk grid must tile the blocks), small blocks merged into
    bigger ones (whole multiples of the first block along the leading axes)."""
    fix = {}
    for axis, c in enumerate(arr.chunks):
        if len(c) > 1 and (any(n != c[0] for n in c[:-1]) or c[-1] > c[0]):
            fix[axis] = max(c)
    block = [fix.get(a, c[0]) for a, c in enumerate(arr.chunks)]
    size = int(np.prod(block, dtype=np.int64)) * arr.dtype.itemsize
    if 0 < size < SMALL_BLOCK_BYTES and arr.npartitions > 1:
        for axis, n in enumerate(arr.shape):
            if size >= MERGED_BLOCK_BYTES or block[axis] >= n:
                continue
            k = -(-MERGED_BLOCK_BYTES // size)  # ceil
            grown = min(n, block[axis] * k)
            size = size // block[axis] * grown
            block[axis] = fix[axis] = grown
    return arr.rechunk(fix) if fix else arr


def placeholder(arr: Any, where: str, found: Found) -> Tuple[str, str, str, list]:
    """``encode_other``'s description of a Dask array in a save: an empty ``treepack.shards``
    node naming it, whose blocks the save's tasks will write."""
    if arr.dtype == object:
        raise TypeError(f"cannot save `{where}`: a Dask array of dtype object holds Python objects, not array data")
    if any(np.isnan(n) for c in arr.chunks for n in c):
        raise TypeError(
            f"cannot save `{where}`: a Dask array with unknown chunk sizes; call .compute_chunk_sizes() first"
        )
    arr = _regular(arr)
    dt = np.dtype(arr.dtype)
    shape = [int(n) for n in arr.shape]
    block = [max(1, int(c[0])) for c in arr.chunks]
    data = {
        "id": str(len(found.arrays)),
        "dtype": json.loads(_plugin.encode_array(np.empty(0, dt))[1]),
        "shape": shape,
        "chunk_shape": _plugin.core.block_chunk_shape(shape, block, dt.itemsize, found.chunk_bytes or None) if shape else [],
        "origins": [],
    }
    found.arrays.append((arr, data))
    return ("custom", SHARDS, json.dumps(data, sort_keys=True), [])


class _Block:
    """One Dask block in a task's part: a ``treepack.shards`` node holding it."""

    __slots__ = ("data", "value")

    def __init__(self, data: Dict[str, Any], value: np.ndarray) -> None:
        self.data, self.value = data, value


def _encode(obj: Any, where: str) -> Any:
    if type(obj) is _Block:
        return ("custom", SHARDS, json.dumps(obj.data, sort_keys=True), [("0", Piece(obj.value, obj.data["chunk_shape"]))])
    return _plugin.encode_other(obj, where, False)


def write_block(block: np.ndarray, block_info: Any = None, *, location: str, data: Dict[str, Any],
                write_opts: Dict[str, Any]) -> np.ndarray:
    """The task for one block: write its chunks (one pack), return its part's manifest."""
    loc = block_info[0]["array-location"] if block_info else []
    d = dict(data, origins=[[int(start) for start, _ in loc]])
    value = np.ascontiguousarray(block)
    prepared = _plugin.core.prepare([_Block(d, value)], _encode, _plugin.encode_array)
    part, _ = prepared.write_part(location, **write_opts)
    out = np.empty((1,) * block.ndim, dtype=object)
    out.flat[0] = part
    return out


def graphs(found: Found, p: str, write_opts: Dict[str, Any]) -> List[Any]:
    """For each Dask array met, the array of its blocks' part manifests: one task per block
    (``map_blocks``, a single Blockwise layer: built in constant time, not per block)."""
    import dask

    return [
        arr.map_blocks(
            write_block, dtype=object, chunks=tuple((1,) * len(c) for c in arr.chunks),
            meta=np.empty((0,) * arr.ndim, dtype=object), location=p, data=data, write_opts=write_opts,
            name=f"treepack-write-{dask.base.tokenize(arr.name, p, data)}",
        )
        for arr, data in found.arrays
    ]


def save(prepared: Any, found: Found, p: str, write_opts: Dict[str, Any]) -> Any:
    """Run the blocks' tasks (on the current Dask scheduler: a ``distributed.Client`` if one is
    active, else threads), then write the client's part and commit the merged tree."""
    import dask

    results = dask.compute(*graphs(found, p, write_opts))
    parts = [b for r in results for b in np.asarray(r, dtype=object).reshape(-1)]
    own, _ = prepared.write_part(p, **write_opts)
    return commit_parts(p, [own, *parts], write_opts)


# ---------------------------------------------------------------- reading into Dask


_readers: "OrderedDict[Tuple[str, str], Any]" = OrderedDict()
_readers_lock = threading.Lock()


def _reader(location: str, storage_options: Optional[Dict[str, Any]]) -> Any:
    """A Reader per (location, options) per process, kept for the tasks that follow."""
    key = (location, json.dumps(storage_options, sort_keys=True, default=str))
    with _readers_lock:
        r = _readers.get(key)
        if r is not None:
            _readers.move_to_end(key)
            return r
    r = _plugin.core.Reader(location, _plugin.storage_options(storage_options))
    with _readers_lock:
        _readers[key] = r
        while len(_readers) > 16:
            _readers.popitem(last=False)
    return r


class Source:
    """What a Dask task reads from: a stored array by location and key path (picklable and
    small; the reader is opened in the process that runs the task)."""

    def __init__(self, location: str, path: str, storage_options: Optional[Dict[str, Any]], shape: Tuple[int, ...],
                 dtype: np.dtype, verify: bool = True) -> None:
        self.location, self.path, self.storage_options = location, path, storage_options
        self.shape, self.dtype, self.ndim, self.verify = shape, dtype, len(shape), verify

    def __getitem__(self, index: Any) -> np.ndarray:
        text = _plugin.slice_text(index, self.ndim) if index != () else ""
        return _reader(self.location, self.storage_options).read_array(self.path, text, _plugin.np_dtype, self.verify)


def to_dask(source: Source, chunks: Any, stored_chunks: Optional[Tuple[int, ...]]) -> Any:
    """A Dask array over ``source``: one task per block, each reading only the chunks its block
    covers. ``chunks`` defaults to the stored chunk grid."""
    import dask
    import dask.array as da

    if chunks is None:
        chunks = stored_chunks or source.shape or ()
    name = "treepack-" + dask.base.tokenize(source.location, source.path, source.shape, str(source.dtype), chunks)
    return da.from_array(source, chunks=chunks, name=name, lock=False, asarray=False,
                         meta=np.empty((0,) * source.ndim, dtype=source.dtype))


class _Raw:
    """A node left unbuilt until its lazy arrays are in place (an xarray Dataset)."""

    __slots__ = ("kind", "type_name", "data_json", "children")

    def __init__(self, kind: str, type_name: str, data_json: Optional[str], children: List[Tuple[str, Any]]) -> None:
        self.kind, self.type_name, self.data_json, self.children = kind, type_name, data_json, children


class _Deferring:
    """A decoder that leaves the nodes whose arrays may be lazy (xarray's) unbuilt."""

    def __init__(self, dec: Any, names: Any) -> None:
        self.dec, self.names = dec, names

    def array(self, arr: np.ndarray, annotation: str) -> Any:
        return self.dec.array(arr, annotation)

    def __call__(self, kind: str, type_name: str, data_json: Optional[str], children: List[Tuple[str, Any]]) -> Any:
        if type_name in self.names:
            return _Raw(kind, type_name, data_json, children)
        return self.dec(kind, type_name, data_json, children)


def load_lazy(reader: Any, location: str, storage_options: Any, structure: Any, dec: Any, load_rest: Any, verify: bool) -> Any:
    """``load(path, dask=True)``: chunked arrays reachable through dicts, lists, tuples and
    xarray objects come back as Dask arrays (nothing read yet); everything else is loaded as
    usual by ``load_rest(keep, decoder)``, which reads only the leaves in ``keep``. Arrays
    inside other records and custom objects load eagerly (those objects are built from their
    fields)."""
    transparent = xarrays.NAMES
    lazy: Dict[str, Any] = {}
    keep: set = set()
    stack = [structure]
    while stack:
        s = stack.pop()
        if isinstance(s, LeafInfo):
            if s.kind == "array" and not s.inline:
                lazy[s.path] = s
            else:
                keep.add(s.path)
        elif isinstance(s, dict):
            stack.extend(s.values())
        elif isinstance(s, (list, tuple)):
            stack.extend(s)
        elif isinstance(s, StructNode) and s.type_name in transparent:
            stack.extend(s.children.values())
        else:
            _plugin.take_all(s, keep)
    out = load_rest(keep, _Deferring(dec, transparent))

    def array(info: Any) -> Any:
        stored = reader.chunk_shape(info.path)
        src = Source(location, info.path, storage_options, tuple(info.shape), _plugin.stored_dtype(info), verify)
        return to_dask(src, None, tuple(stored) if stored else None)

    def put(o: Any, s: Any) -> Any:
        if isinstance(s, LeafInfo):
            return array(s) if s.path in lazy else o
        if isinstance(o, _Raw) and isinstance(s, StructNode):
            kids = dict(o.children)
            for k, v in s.children.items():
                kids[k] = put(kids.get(k), v)
            return dec(o.kind, o.type_name, o.data_json, list(kids.items()))
        if isinstance(s, dict) and isinstance(o, dict):
            for k, v in s.items():
                o[k] = put(o[k], v)
            return o
        if isinstance(s, (list, tuple)) and isinstance(o, (list, tuple)):
            items = [put(a, b) for a, b in zip(o, s)]
            if isinstance(o, list):
                o[:] = items
                return o
            return type(o)._make(items) if hasattr(type(o), "_make") else type(o)(items)
        return o

    return put(out, structure)


# ---------------------------------------------------------------- Zarr / HDF5 arrays read lazily


class LazyArrays:
    """Foreign arrays (h5py datasets, Zarr arrays) as Dask arrays read block by block, for the
    converters (``treepack._hierarchy``): a save then writes them block by block too."""

    def array(self, a: Any, chunks: Any, view: Optional[np.dtype]) -> Any:
        import dask.array as da

        x = da.from_array(a, chunks=chunks, lock=False, asarray=True)
        return x.map_blocks(lambda blk: blk.view(view), dtype=view) if view is not None else x

    def on_this_thread(self) -> Any:
        """A context in which Dask computes on the calling thread only (HDF5 reads)."""
        import dask

        return dask.config.set(scheduler="synchronous")


def lazy_arrays() -> Optional[LazyArrays]:
    """`LazyArrays`, or None when Dask is not installed."""
    try:
        import dask.array  # noqa: F401
    except ImportError:
        return None
    return LazyArrays()


# ---------------------------------------------------------------- the plug-in


def _encode_array(obj: Any, where: str, memo: Any, omit_static: bool) -> Any:
    # Outside a save (no memo of one), a Dask array is nothing treepack stores.
    found = _plugin.save_state(memo, "dask.arrays", _found) if is_array(obj) else None
    return placeholder(obj, where, found) if found is not None else None


def _found(run: Any) -> Found:
    return Found(run.chunk_bytes)


def _load(request: Any) -> Any:
    """``load(path, dask=True)``: see `load_lazy`."""
    if not request.options.get("dask"):
        return _plugin.DECLINE
    if request.select is not None or request.like is not None or request.mmap:
        raise ValueError("load(dask=True) takes no select=, like= or mmap=: slice the Dask arrays instead")
    r = request.reader()
    return load_lazy(r, request.path, request.storage_options, request.structure(r), request.decoder,
                     lambda keep, decoder: request.load_kept(r, keep, decoder), request.verify)


def _to_dask(location: str, path: str, storage_options: Any, shape: Tuple[int, ...], dtype: np.dtype, verify: bool,
             chunks: Any, stored_chunks: Optional[Tuple[int, ...]]) -> Any:
    """``LazyArray.to_dask``."""
    return to_dask(Source(location, path, storage_options, shape, dtype, verify), chunks, stored_chunks)


_plugin.integrate(__name__, encode=_encode_array, load=_load, methods={"to_dask": _to_dask, "lazy_arrays": lazy_arrays})
