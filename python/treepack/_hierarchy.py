"""Zarr and HDF5 <-> treepack trees (docs/convert.md, "Zarr and HDF5").

Both are hierarchies of groups holding arrays and attributes, so one mapping serves both:
dicts (and lists, tuples) are groups, arrays are arrays (Zarr) or datasets (HDF5), and the other
leaves — None, bools, ints, floats, strings — are attributes of their group. What the mapping
needs to bring a tree back exactly (a list's or tuple's kind, key order, a dtype the target
lacks, bytes, None in HDF5, the tree's metadata) goes in one attribute named ``treepack``.
zarr-python writes Zarr v3 and reads v3 and v2; h5py reads and writes HDF5 (its calls stay on
the calling thread: the C library is not thread-safe). Each library is imported only when used.
"""

from __future__ import annotations

import collections
import json
import math
import os
import shutil
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from . import _codec, _core, _like
from ._api import StorageOptions, _opts, _struct_node, load, save

RESERVED = "treepack"
"""The attribute holding the mapping's own notes; a tree key of this name is refused."""

SPARSE_LIMIT = 10_000
"""A source array may declare at most this many times the bytes its whole store holds (plus
1 GiB): more is a sparse array of fill values or a hostile shape, refused rather than expanded."""

BLOCK_BYTES = 64 << 20
"""Arrays are copied in blocks of whole chunk rows of about this many bytes (bounded memory);
sources larger than this are read as Dask arrays when Dask is installed."""

# dtypes numpy has only through ml_dtypes: stored as unsigned ints of the same width, the name
# kept in the ``treepack`` attribute.
_STAND_IN = {1: np.uint8, 2: np.uint16}


class _Zarr:
    name = "Zarr"

    def __init__(self) -> None:
        try:
            import zarr
        except ImportError:
            raise ImportError("Zarr conversion needs zarr-python 3 (pip install 'zarr>=3'; it needs Python 3.11+)") from None
        self.zarr = zarr

    # A LocalStore, not the path string: newer zarr-python reads strings as URLs.
    def create(self, path: str) -> Any:
        return self.zarr.open_group(store=self.zarr.storage.LocalStore(path), mode="w", zarr_format=3)

    def open(self, path: str) -> Any:
        return self.zarr.open_group(store=self.zarr.storage.LocalStore(path, read_only=True), mode="r")

    def group(self, parent: Any, name: str) -> Any:
        return parent.create_group(name)

    def array(self, parent: Any, name: str, shape: Tuple[int, ...], dtype: Any, chunks: Optional[Tuple[int, ...]],
              compressed: bool) -> Any:
        from zarr.codecs import ZstdCodec

        return parent.create_array(name, shape=shape, dtype=dtype, chunks=chunks or tuple(max(s, 1) for s in shape),
                                   compressors=[ZstdCodec(level=3)] if compressed else None, fill_value=0)

    def set_attrs(self, node: Any, attrs: Dict[str, Any], notes: Dict[str, Any]) -> None:
        if notes:
            attrs = {**attrs, RESERVED: notes}
        if attrs:
            node.attrs.update(attrs)

    def attrs(self, node: Any) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        a = dict(node.attrs)
        notes = a.pop(RESERVED, None)
        return a, notes if isinstance(notes, dict) else {}

    def members(self, g: Any) -> Iterator[Tuple[str, bool, Any]]:
        for name, obj in g.members():
            yield name, isinstance(obj, self.zarr.Group), obj

    def chunks(self, a: Any) -> Tuple[int, ...]:
        return tuple(a.chunks)

    def close(self, root: Any) -> None:
        pass


class _Hdf5:
    name = "HDF5"

    def __init__(self) -> None:
        try:
            import h5py
        except ImportError:
            raise ImportError("HDF5 conversion needs h5py (pip install h5py)") from None
        self.h5py = h5py

    def create(self, path: str) -> Any:
        return self.h5py.File(path, "w", track_order=True)

    def open(self, path: str) -> Any:
        return self.h5py.File(path, "r")

    def group(self, parent: Any, name: str) -> Any:
        return parent.create_group(name, track_order=True)

    def array(self, parent: Any, name: str, shape: Tuple[int, ...], dtype: Any, chunks: Optional[Tuple[int, ...]],
              compressed: bool) -> Any:
        chunked = chunks if chunks and all(shape) else None
        return parent.create_dataset(name, shape=shape, dtype=dtype, chunks=chunked,
                                     compression="gzip" if compressed and chunked else None,
                                     shuffle=bool(compressed and chunked))

    def set_attrs(self, node: Any, attrs: Dict[str, Any], notes: Dict[str, Any]) -> None:
        nones = [k for k, v in attrs.items() if v is None]
        if nones:
            notes = {**notes, "none": nones}
        for k, v in attrs.items():
            if v is not None:
                node.attrs[k] = v
        if notes:
            node.attrs[RESERVED] = json.dumps(notes)

    def attrs(self, node: Any) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        out: Dict[str, Any] = {}
        notes: Dict[str, Any] = {}
        for k, v in node.attrs.items():
            if k == RESERVED:
                try:
                    notes = json.loads(v)
                except (TypeError, ValueError):
                    notes = {}
                continue
            if isinstance(v, np.generic):
                v = v.item()
            elif isinstance(v, np.ndarray) and v.dtype.kind == "O":
                v = [x.decode() if isinstance(x, bytes) else x for x in v.tolist()]
            out[k] = v
        for k in notes.get("none", []) if isinstance(notes, dict) else []:
            out[k] = None
        return out, notes if isinstance(notes, dict) else {}

    def members(self, g: Any) -> Iterator[Tuple[str, bool, Any]]:
        for name in g:
            obj = g[name]
            if isinstance(obj, (self.h5py.Group, self.h5py.Dataset)):
                yield name, isinstance(obj, self.h5py.Group), obj

    def chunks(self, a: Any) -> Tuple[int, ...]:
        return tuple(a.chunks) if a.chunks else tuple(max(s, 1) for s in a.shape)

    def close(self, root: Any) -> None:
        root.close()


def backend(fmt: str) -> Any:
    return _Zarr() if fmt == "zarr" else _Hdf5()


# ---------------------------------------------------------------- treepack -> Zarr / HDF5


def _mapping(node: Any) -> Optional[Dict[Any, Any]]:
    """The items of a stored mapping: a dict, or an OrderedDict / Counter / defaultdict with
    string keys (a torch ``state_dict()``), which are groups like a dict."""
    if isinstance(node, dict):
        return node
    if getattr(node, "type_name", None) in _like._MAPPINGS and not (node.data or {}).get("items"):
        return node.children
    return None


def _mask(node: Any) -> Any:
    """``like=`` for the leaves that become attributes (everything but arrays)."""
    if _mapping(node) is not None:
        node = _mapping(node)
    if isinstance(node, dict):
        return {k: _mask(v) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return type(node)(_mask(v) for v in node)
    return getattr(node, "kind", None) not in ("array", None)


def write(src: str, dst: str, fmt: str, overwrite: bool, storage_options: StorageOptions,
          progress: Any = None) -> Dict[str, int]:
    b = backend(fmt)
    if os.path.exists(dst) and not overwrite:
        raise FileExistsError(f"{dst}: exists; pass overwrite=True to replace it")
    r = _core.Reader(src, _opts(storage_options))
    structure = r.structure(_struct_node)
    if not isinstance(structure, (dict, list, tuple)) and _mapping(structure) is None:
        raise ValueError(f"{src}: the tree is a single {getattr(structure, 'kind', 'value')}; "
                         f"{b.name} holds a group of arrays: save it in a dict")
    _check_representable(structure, b.name)
    values = load(src, like=_mask(structure), storage_options=storage_options)
    tmp = dst.rstrip("/") + f".partial-{os.getpid()}"
    _remove(tmp)
    root = b.create(tmp)
    counts: Dict[str, Any] = {"tensors": 0, "bytes": 0, "total": _array_bytes(structure), "progress": progress}
    try:
        notes: Dict[str, Any] = {}
        md = r.metadata()
        if md is not None:
            notes["metadata"] = json.loads(md)
        _write_group(b, r, root, structure, values, notes, counts)
    finally:
        b.close(root)
    del counts["total"], counts["progress"]
    try:
        if os.path.exists(dst):
            _remove(dst)
        os.replace(tmp, dst)
    finally:
        _remove(tmp)
    return counts


def _array_bytes(node: Any) -> int:
    if isinstance(node, dict):
        return sum(_array_bytes(v) for v in node.values())
    if isinstance(node, (list, tuple)):
        return sum(_array_bytes(v) for v in node)
    return int(getattr(node, "nbytes", 0)) if getattr(node, "kind", None) == "array" else 0


def _remove(p: str) -> None:
    if os.path.isdir(p):
        shutil.rmtree(p)
    elif os.path.exists(p):
        os.remove(p)


def _check_representable(node: Any, target: str) -> None:
    """Refuse what the target cannot hold before anything is written, naming the key path."""
    if _mapping(node) is not None:
        node = _mapping(node)
    if isinstance(node, dict):
        for k, v in node.items():
            where = getattr(v, "path", None) or f"{k}"
            if not isinstance(k, str):
                raise ValueError(f"`{where}`: the key {k!r} is not a string; {target} names are strings")
            if not k or "/" in k or k in (".", ".."):
                raise ValueError(f"`{where}`: the key {k!r} cannot be a {target} name (empty, '.', '..' or with '/')")
            if k == RESERVED and getattr(v, "kind", "array") != "array":
                raise ValueError(f"`{where}`: the key {RESERVED!r} is reserved for the mapping's own attribute")
        for v in node.values():
            _check_representable(v, target)
    elif isinstance(node, (list, tuple)):
        for v in node:
            _check_representable(v, target)
    elif hasattr(node, "children") and not hasattr(node, "nbytes"):
        raise ValueError(f"`{node.path}`: a {node.kind} ({node.type_name}) cannot be stored in {target}; "
                         "convert its fields as a dict")
    elif node.kind == "complex":
        raise ValueError(f"`{node.path}`: a complex number cannot be a {target} attribute; store it as an array")


def _write_group(b: Any, r: Any, g: Any, structure: Any, values: Any, notes: Dict[str, Any],
                 counts: Dict[str, int]) -> None:
    mapping = _mapping(structure)
    if mapping is not None:
        items = list(mapping.items())
        # A subtree with nothing but arrays below it is not built by the load (None).
        vals = [values[k] if values is not None else None for k, _ in items]
        notes = {**notes, "order": [k for k, _ in items]}
        if structure.__class__ is not dict and structure.type_name == "py.ordereddict":
            notes["kind"] = "ordereddict"
    else:
        items = [(str(i), v) for i, v in enumerate(structure)]
        vals = list(values) if values is not None else [None] * len(items)
        notes = {**notes, "kind": "tuple" if isinstance(structure, tuple) else "list"}
    attrs: Dict[str, Any] = {}
    for (name, st), v in zip(items, vals):
        if isinstance(st, (dict, list, tuple)) or _mapping(st) is not None:
            _write_group(b, r, b.group(g, name), st, v, {}, counts)
        elif st.kind == "array":
            _write_array(b, r, g, name, st.path, counts)
        elif st.kind == "bytes":
            a = b.array(g, name, (len(v),), np.uint8, None, False)
            a[...] = np.frombuffer(v, np.uint8)
            b.set_attrs(a, {}, {"kind": "bytes"})
        else:
            attrs[name] = v
    b.set_attrs(g, attrs, notes)


def _write_array(b: Any, r: Any, g: Any, name: str, path: str, counts: Dict[str, int]) -> None:
    dtype_json, shape = r.array_info(path)
    dtype = _codec.np_dtype(dtype_json)
    notes: Dict[str, Any] = {}
    target = dtype
    if dtype.kind == "V" and dtype.names is None and dtype.itemsize in _STAND_IN:
        notes["dtype"] = json.loads(dtype_json)  # bfloat16, float8_*: raw bits as uintN
        target = np.dtype(_STAND_IN[dtype.itemsize])
    chunks = r.chunk_shape(path)
    codecs = set(r.chunk_codecs(path))
    shape = tuple(shape)
    try:
        a = b.array(g, name, shape, target, tuple(chunks) if chunks else None, bool(codecs - {"raw"}))
    except (TypeError, ValueError) as e:
        raise ValueError(f"`{path}`: {b.name} cannot hold a {dtype_json} array: {e}") from None
    itemsize = max(dtype.itemsize, 1)
    if len(shape) == 0 or not all(shape):
        data = r.read_array(path, "", _codec.np_dtype)
        a[...] = data.view(target) if target is not dtype else data
        _report(counts, data.nbytes)
    else:
        row = int(np.prod(shape[1:], dtype=np.int64)) * itemsize
        step = max(1, BLOCK_BYTES // max(row, 1))
        c0 = (chunks or shape)[0]
        step = max(c0, step // c0 * c0)
        for start in range(0, shape[0], step):
            stop = min(shape[0], start + step)
            block = r.read_array(path, f"{start}:{stop}", _codec.np_dtype)
            a[start:stop] = block.view(target) if target is not dtype else block
            _report(counts, block.nbytes)
    if notes:
        b.set_attrs(a, {}, notes)
    counts["tensors"] += 1


def _report(counts: Dict[str, Any], n: int) -> None:
    counts["bytes"] += n
    cb = counts["progress"]
    if cb is not None:
        cb(counts["bytes"], counts["total"])


# ---------------------------------------------------------------- Zarr / HDF5 -> treepack


def read_and_save(src: str, dst: str, fmt: str, overwrite: bool, storage_options: StorageOptions,
                  **save_kwargs: Any) -> Dict[str, int]:
    b = backend(fmt)
    if not os.path.exists(src):
        raise FileNotFoundError(f"{src}: no such file or directory")
    try:
        root = b.open(src)
    except Exception as e:  # the libraries raise their own types for files that are not theirs
        raise ValueError(f"{src}: not a readable {b.name} store: {e}") from None
    counts = {"tensors": 0, "bytes": 0}
    try:
        lazy = _dask_available()
        stored = _stored_bytes(src)
        counts["limit"] = SPARSE_LIMIT * stored + (1 << 30)
        counts["stored"] = stored
        tree, notes = _read_group(b, root, "", counts, lazy)
        del counts["limit"], counts["stored"]
        kwargs = dict(save_kwargs)
        if "metadata" in notes and "metadata" not in kwargs:
            kwargs["metadata"] = notes["metadata"]
        if fmt == "hdf5" and lazy:
            import dask

            # Dask-backed datasets are read by the saving tasks: on this thread only.
            with dask.config.set(scheduler="synchronous"):
                save(tree, dst, overwrite=overwrite, storage_options=storage_options, **kwargs)
        else:
            save(tree, dst, overwrite=overwrite, storage_options=storage_options, **kwargs)
    finally:
        b.close(root)
    return counts


def _stored_bytes(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def _dask_available() -> bool:
    try:
        import dask.array  # noqa: F401
    except ImportError:
        return False
    return True


def _read_group(b: Any, g: Any, path: str, counts: Dict[str, int], lazy: bool) -> Tuple[Any, Dict[str, Any]]:
    attrs, notes = b.attrs(g)
    kids: Dict[str, Any] = {}
    for name, is_group, obj in b.members(g):
        where = f"{path}/{name}" if path else name
        kids[name] = _read_group(b, obj, where, counts, lazy)[0] if is_group else _read_array(b, obj, where, counts, lazy)
    for k, v in attrs.items():
        if k in kids:
            raise ValueError(f"`{path}/{k}`: both an attribute and a member of the group; rename one")
        kids[k] = v
    kind = notes.get("kind")
    if kind in ("list", "tuple") and all(str(i) in kids for i in range(len(kids))):
        seq = [kids[str(i)] for i in range(len(kids))]
        return (tuple(seq) if kind == "tuple" else seq), notes
    order = notes.get("order")
    if isinstance(order, list) and sorted(map(str, order)) == sorted(kids):
        kids = {k: kids[k] for k in order}
    if kind == "ordereddict":
        return collections.OrderedDict(kids), notes
    return kids, notes


def _read_array(b: Any, a: Any, path: str, counts: Dict[str, int], lazy: bool) -> Any:
    _, notes = b.attrs(a)
    dtype = np.dtype(a.dtype)
    if dtype.kind in "OT":  # object arrays, numpy 2's variable-width StringDType
        raise ValueError(f"`{path}`: an array of Python objects (variable-length strings?) has no fixed "
                         "dtype; treepack stores fixed-size dtypes (convert it to fixed-width strings first)")
    counts["tensors"] += 1
    counts["bytes"] += math.prod(int(d) for d in a.shape) * dtype.itemsize
    if counts["bytes"] > counts.get("limit", counts["bytes"]):
        raise ValueError(f"`{path}`: the arrays up to here declare {counts['bytes']} bytes but the whole store "
                         f"holds {counts['stored']}: a sparse array of fill values or a damaged shape; "
                         f"read the parts you need with {b.name}'s library yourself")
    if notes.get("kind") == "bytes":
        return np.asarray(a[...], np.uint8).tobytes()
    view = _codec.np_dtype(json.dumps(notes["dtype"])) if "dtype" in notes else None
    nbytes = math.prod(int(d) for d in a.shape) * dtype.itemsize
    if lazy and nbytes > BLOCK_BYTES and a.ndim > 0:
        import dask.array as da

        x = da.from_array(a, chunks=b.chunks(a), lock=False, asarray=True)
        return x.map_blocks(lambda blk: blk.view(view), dtype=view) if view is not None else x
    data = np.asarray(a[...])
    return data.view(view) if view is not None else data
