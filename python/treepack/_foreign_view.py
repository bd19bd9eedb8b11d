"""``treepack.open`` and ``load_structure`` of the files other tools wrote that the Python package
reads (``.npy``, ``.npz``, Zarr, HDF5, Orbax, JAX): the file's own index read, every check its
reader makes made, and no array data read until a slice asks for it (issue 54).

The tree is read as a load reads it — the same containers, names, order and values, through the
same readers (``_convert._read_numpy``'s checks for numpy files, ``_hierarchy_map.read_tree``
for Zarr and HDF5, ``_foreign_jax._Checkpoint`` for Orbax and JAX) — with a ``_Lazy`` stand-in at
each array. ``ForeignReader`` gives ``View`` and ``LazyArray`` (``_lazy``) what a core ``Reader``
gives them, so a foreign file is browsed and sliced as a treepack tree is: each slice reads
what the format's library reads for it (a memory map's pages for ``.npy`` and stored ``.npz``
members, the chunks it touches for Zarr, HDF5 and TensorStore). A compressed ``.npz`` member has
no random access: a slice of it reads (inflates) that member whole.
"""

from __future__ import annotations

import collections
import json
import os
import zipfile
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from . import _core, _errors

Path = Tuple[Any, ...]

FORMATS = ("npy", "npz", "zarr", "hdf5", "orbax", "jax")
"""The formats this module opens (the others are read by the core, or are treepack's)."""


class _Lazy:
    """An array of the file, not read: its shape, dtype, stored chunk shape (None: unchunked)
    and how to read an index of it."""

    __slots__ = ("shape", "dtype", "chunks", "get", "kind")

    def __init__(self, shape: Tuple[int, ...], dtype: Any, get: Callable[[Any], Any],
                 chunks: Optional[Tuple[int, ...]] = None, kind: str = "array") -> None:
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.chunks = chunks
        self.get = get
        self.kind = kind  # "array", or "bytes" (a .npz member that is not an array)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        n = self.dtype.itemsize
        for d in self.shape:
            n *= d
        return n

    def __getitem__(self, idx: Any) -> np.ndarray:
        """(What ``dask.array.from_array`` reads blocks through.)"""
        return np.asarray(self.get(idx))

    def read(self) -> Any:
        return self.get(...) if self.kind == "array" else self.get(None)


class _EveryArray:
    """What ``_hierarchy_map.read_tree`` stands in for arrays with: every one a ``_Lazy``."""

    every_array = True

    def __init__(self, b: Any, src: str) -> None:
        self.b, self.src = b, src

    def array(self, a: Any, chunks: Any, view: Any) -> _Lazy:
        b, src = self.b, self.src

        def get(idx: Any) -> np.ndarray:
            try:
                out = np.asarray(a[idx])
            except (IndexError, TypeError):
                raise
            except Exception as e:  # noqa: BLE001 - damaged chunks: the library's own error types
                raise _errors.ForeignFileError(f"{src}: {b.name} array cannot be read: {type(e).__name__}: {e}") from None
            return out.view(view) if view is not None else out

        return _Lazy(a.shape, view if view is not None else a.dtype, get, tuple(chunks) if chunks else None)


def _numpy_tree(path: str, fmt: str) -> Any:
    """The ``.npy`` file's array, or the ``.npz`` archive's members by name, each a ``_Lazy``.
    Every header is read and checked as a load checks it (object dtypes and sizes the bytes
    cannot hold are refused); nothing else is read."""
    from ._convert import _MAX_NPY_HEADER, _ZIP_RATIO, _OTHER_RATIO, _check_npy_header, _npy_layout

    if fmt == "npy":
        with open(path, "rb") as f:
            _check_npy_header(f, os.fstat(f.fileno()).st_size, path, "")
        m = np.load(path, mmap_mode="r", allow_pickle=False, max_header_size=_MAX_NPY_HEADER)
        return _Lazy(m.shape, m.dtype, lambda idx: np.array(m[idx]))
    size = os.path.getsize(path)
    flat: Dict[str, Any] = {}
    try:
        z = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise _errors.ForeignFileError(f"{path}: not a readable .npz file: {type(e).__name__}: {e}") from None
    with z:
        for info in z.infolist():
            name = info.filename
            if not name:
                raise _errors.ForeignFileError(f"{path}: holds a member with an empty name; not a readable .npz file")
            if info.is_dir():
                continue
            ratio = _ZIP_RATIO.get(info.compress_type, _OTHER_RATIO)
            if info.compress_size > size or info.file_size > ratio * max(info.compress_size, 1):
                raise _errors.ForeignFileError(
                    f"{path}: member {name!r} declares {info.file_size} bytes from {info.compress_size} compressed "
                    f"bytes (the archive has {size}): a damaged or hostile zip directory (a zip bomb?); nothing of it "
                    "was read")
            key = name[:-4] if name.endswith(".npy") else name
            try:
                with z.open(info) as fp:
                    is_array = fp.read(6) == b"\x93NUMPY"
                    fp.seek(0)
                    if is_array:
                        _check_npy_header(fp, info.file_size, path, name)
                        fp.seek(0)
                        shape, fortran, dtype, header = _npy_layout(fp)
            except _errors.ForeignFileError:
                raise
            except (OSError, EOFError, zipfile.BadZipFile, RuntimeError, NotImplementedError, ValueError) as e:
                raise _errors.ForeignFileError(f"{path}: member {name!r} cannot be read ({type(e).__name__}: {e}): a "
                                               "damaged or truncated zip; nothing of it was read") from None
            if not is_array:
                flat[key] = _Lazy((info.file_size,), np.uint8, _member_bytes(path, name), kind="bytes")
            elif info.compress_type == zipfile.ZIP_STORED and not info.flag_bits & 1:
                flat[key] = _Lazy(shape, dtype, _stored_member(path, info, header, shape, dtype, fortran))
            else:
                flat[key] = _Lazy(shape, dtype, _inflated_member(path, name))
    return flat


def _member_bytes(path: str, name: str) -> Callable[[Any], bytes]:
    def get(_: Any) -> bytes:
        with zipfile.ZipFile(path) as z:
            return z.read(name)

    return get


def _inflated_member(path: str, name: str) -> Callable[[Any], np.ndarray]:
    """A compressed member's reader: no random access into deflate, so each read inflates the
    member whole (checked again, as a load reads it) and indexes it."""
    from ._convert import _read_member

    def get(idx: Any) -> np.ndarray:
        with zipfile.ZipFile(path) as z:
            a = _read_member(z, z.getinfo(name), os.path.getsize(path), path)
        return np.array(a[idx])

    return get


def _stored_member(path: str, info: Any, header: int, shape: Tuple[int, ...], dtype: np.dtype,
                   fortran: bool) -> Callable[[Any], np.ndarray]:
    """A stored (uncompressed) member's reader: a read-only memory map of its data, where its
    local header says the member's bytes begin (checked to lie inside the file)."""
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        local = f.read(30)
        size = os.fstat(f.fileno()).st_size
    if len(local) != 30 or local[:4] != b"PK\x03\x04":
        raise _errors.ForeignFileError(f"{path}: member {info.filename!r}: no local header where the directory says; "
                                       "a damaged zip")
    start = info.header_offset + 30 + int.from_bytes(local[26:28], "little") + int.from_bytes(local[28:30], "little")
    count = 1
    for d in shape:
        count *= int(d)
    if start + header + count * dtype.itemsize > size or header > info.file_size:
        raise _errors.ForeignFileError(f"{path}: member {info.filename!r}: its data would end past the end of the file; "
                                       "a damaged or hostile zip; nothing of it was read")
    m: List[Any] = []

    def get(idx: Any) -> np.ndarray:
        if not m:
            if count == 0:
                m.append(np.zeros(shape, dtype, order="F" if fortran else "C"))
            else:
                m.append(np.memmap(path, dtype=dtype, mode="r", offset=start + header, shape=shape,
                                   order="F" if fortran else "C"))
        return np.array(m[0][idx])

    return get


class _Jax:
    """An Orbax or JAX checkpoint's tree, its arrays opened through TensorStore, not read."""

    def __init__(self, path: str, fmt: str) -> None:
        from . import _foreign_jax as fj

        self.fj = fj
        with fj._deep():
            self.ck = fj._Checkpoint(path, fmt)
        self.tree = fj._walk(self.ck.tree, (), lambda x, _p: self._lazy(x) if isinstance(x, fj._Array) else x)

    def _lazy(self, a: Any) -> Any:
        ck = self.ck

        def get(idx: Any) -> Any:
            box, rest = _box(a.shape, idx)
            try:
                v = np.asarray(a.handle[box].translate_to[0].read().result())[rest]
            except (IndexError, TypeError):
                raise
            except Exception as e:  # noqa: BLE001 - TensorStore's errors for damaged chunks
                raise ck.refuse(f"{self.fj._where(a.path)}: its array `{a.name}` cannot be read: {e}") from None
            ck.folder.unchanged()
            return v

        if a.kind == "scalar":
            return get(...).item()
        return _Lazy(a.shape, a.dtype, get)


class ForeignReader:
    """What ``View`` and ``LazyArray`` read through, over a foreign file's tree of ``_Lazy``
    stand-ins (``_core.Reader``'s methods they use, with the same key paths)."""

    def __init__(self, path: str, fmt: str, tree: Any, metadata: Any = None, customs: Any = None,
                 keep: Any = None) -> None:
        self.path, self.fmt, self.tree = path, fmt, tree
        self._metadata = metadata
        self._customs = customs or {}
        self._keep = keep  # what must live as long as the tree (an open HDF5 file)
        self._nodes: Dict[str, Tuple[Any, Path]] = {}
        self._index(tree, "", (), 0)

    def _index(self, x: Any, path: str, p: Path, depth: int) -> None:
        from ._convert import _seg

        if depth > 1000:
            raise _errors.ForeignFileError(f"{self.path}: nested more than 1000 levels deep")
        self._nodes[path] = (x, p)
        if isinstance(x, dict) and p not in self._customs:
            items = [(_seg(k) if isinstance(k, str) else str(k), k) for k in x]
        elif isinstance(x, (list, tuple)):
            items = [(str(i), i) for i in range(len(x))]
        else:
            return
        for seg, k in items:
            self._index(x[k], f"{path}/{seg}" if path else seg, p + (k,), depth + 1)

    def _node(self, path: str) -> Tuple[Any, Path]:
        try:
            return self._nodes[path]
        except KeyError:
            raise KeyError(f"`{path}` not found in {self.path}") from None

    def kind(self, path: str) -> str:
        x, p = self._node(path)
        if p in self._customs or isinstance(x, collections.OrderedDict):
            return "custom"
        if isinstance(x, _Lazy):
            return x.kind
        if isinstance(x, dict):
            return "dict"
        if isinstance(x, tuple):
            return "tuple"
        if isinstance(x, list):
            return "list"
        if isinstance(x, np.ndarray) or isinstance(x, np.generic):
            return "array"
        return {bool: "bool", int: "int", float: "float", complex: "complex", str: "str", bytes: "bytes"}.get(
            type(x), "none")

    def children(self, path: str) -> List[Tuple[str, Any]]:
        from ._convert import _seg

        x, _ = self._node(path)
        if isinstance(x, dict):
            return [(_seg(k) if isinstance(k, str) else str(k), k) for k in x]
        if isinstance(x, (list, tuple)):
            return [(str(i), i) for i in range(len(x))]
        return []

    def _array(self, path: str) -> Any:
        x, _ = self._node(path)
        if isinstance(x, (_Lazy, np.ndarray, np.generic)) and getattr(x, "kind", "array") == "array":
            return x
        raise TypeError(f"`{path}` is a {self.kind(path)}, not an array")

    def array_info(self, path: str) -> Tuple[str, List[int]]:
        a = self._array(path)
        return _core.numpy_dtype_desc(np.dtype(a.dtype))[0], list(a.shape)

    def chunk_shape(self, path: str) -> Optional[List[int]]:
        a = self._array(path)
        chunks = getattr(a, "chunks", None)
        return list(chunks) if isinstance(a, _Lazy) and chunks else None

    def read_array(self, path: str, slice: str, np_dtype: Any = None, verify: bool = True) -> np.ndarray:
        a = self._array(path)
        idx = _parse_slice(slice)
        if isinstance(a, _Lazy):
            return a[idx]
        return np.array(np.asarray(a)[idx])

    def to_dask(self, path: str, chunks: Any = None) -> Any:
        from . import _registry

        lazy = _registry.method("lazy_arrays")()  # (the Dask integration's; None without Dask)
        if lazy is None:
            raise ImportError("to_dask needs Dask (pip install 'dask[array]')")
        a = self._array(path)
        return lazy.array(a, chunks if chunks is not None else (getattr(a, "chunks", None) or "auto"), None)

    def types(self, *_: Any, **__: Any) -> List[Tuple[str, str, Optional[str], str]]:
        return []

    def types_within(self, *_: Any, **__: Any) -> List[Tuple[str, str, Optional[str], str]]:
        return []  # (another tool's file: nothing in it is built from a class)

    def metadata(self) -> Optional[str]:
        return json.dumps(self._metadata) if self._metadata is not None else None

    def load(self, dec: Any = None, np_dtype: Any = None, *, subpath: Optional[str] = None, **_: Any) -> Any:
        """The subtree at ``subpath`` (or the whole tree) as ``treepack.load`` gives it."""
        x, p = self._node(subpath or "")
        if self.fmt in ("orbax", "jax"):
            # Their loads make custom nodes placeholders and saved jax.Arrays jax.Arrays: that very load.
            from . import _foreign_jax

            on_missing = "placeholder" if getattr(dec, "placeholder", False) else "error"
            out = _foreign_jax.load(self.path, self.fmt, {"select": [subpath] if subpath else None,
                                                          "on_missing": on_missing})
            for k in p:
                out = out[k]
            return out
        return _materialise(x)

    def structure(self, make_node: Any = None) -> Any:
        if self.fmt in ("orbax", "jax"):
            from . import _foreign_jax

            return _foreign_jax.structure(self.path, self.fmt)
        return structure_of(self.tree)

    def html(self, path: str) -> str:
        """The subtree at ``path`` as the compact HTML tree of its structure (nothing read)."""
        from ._html import structure_html

        x, p = self._node(path)
        return structure_html(structure_of(x, {q[len(p):]: c for q, c in self._customs.items() if q[:len(p)] == p}),
                              path or "<root>")


def _materialise(x: Any) -> Any:
    """``x`` with every ``_Lazy`` read (containers rebuilt as the same types)."""
    if isinstance(x, _Lazy):
        return x.read()
    if isinstance(x, collections.OrderedDict):
        return collections.OrderedDict((k, _materialise(v)) for k, v in x.items())
    if isinstance(x, dict):
        return {k: _materialise(v) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(_materialise(v) for v in x)
    if isinstance(x, list):
        return [_materialise(v) for v in x]
    return x


def dtype_name(dt: np.dtype) -> str:
    """A dtype's name as ``LeafInfo`` gives it (treepack's name where it has one)."""
    text = json.loads(_core.numpy_dtype_desc(dt)[0])
    return text if isinstance(text, str) else str(dt)


def structure_of(tree: Any, customs: Any = None, leaf: Optional[Callable[[Any, str], Any]] = None) -> Any:
    """``load_structure`` of a tree of values and ``_Lazy`` stand-ins: ``LeafInfo`` at the leaves
    (shapes and dtypes from the stand-ins, nothing read), ``StructNode`` at ``OrderedDict``s and
    at the custom nodes ``customs`` holds by place (a node's children a list, each with
    ``type_name``). ``leaf(x, key_path)`` gives the ``LeafInfo`` of a stand-in of another
    reader's (None: not one)."""
    from ._convert import _seg
    from ._structure import LeafInfo, StructNode

    customs = customs or {}

    def kp(p: Path) -> str:
        return "/".join(_seg(k) if isinstance(k, str) else str(k) for k in p)

    def node(x: Any, p: Path) -> Any:
        if p in customs:
            kids = {i: node(v, p + (i,)) for i, v in enumerate(x)}
            return StructNode("custom", customs[p].type_name, None, kids, kp(p))
        own = leaf(x, kp(p)) if leaf is not None else None
        if own is not None:
            return own
        if isinstance(x, collections.OrderedDict):
            return StructNode("custom", "py.ordereddict", None, {k: node(v, p + (k,)) for k, v in x.items()}, kp(p))
        if isinstance(x, dict):
            return {k: node(v, p + (k,)) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            items = [node(v, p + (i,)) for i, v in enumerate(x)]
            return tuple(items) if isinstance(x, tuple) else items
        if isinstance(x, _Lazy):
            if x.kind == "bytes":
                return LeafInfo(kp(p), "bytes", None, None, x.shape[0], False)
            return LeafInfo(kp(p), "array", dtype_name(x.dtype), x.shape, x.nbytes, False)
        if isinstance(x, (np.ndarray, np.generic)):
            return LeafInfo(kp(p), "array", dtype_name(x.dtype), tuple(np.shape(x)), int(x.nbytes), True)
        kind = {bool: "bool", int: "int", float: "float", complex: "complex", str: "str", bytes: "bytes"}.get(
            type(x), "none")
        n = len(x.encode()) if isinstance(x, str) else (len(x) if isinstance(x, bytes) else 0)
        return LeafInfo(kp(p), kind, None, None, n)

    return node(tree, ())


def _box(shape: Tuple[int, ...], idx: Any) -> Tuple[Tuple[slice, ...], Tuple[Any, ...]]:
    """numpy's basic index ``idx`` into an array of ``shape`` as the box of elements it touches
    (unit-step slices in bounds, what TensorStore reads) and the index that takes the result out
    of that box (steps, and integers that drop their axis). numpy's rules: negative positions
    count from the end, slices clip, an integer out of range is an ``IndexError``."""
    idx = idx if isinstance(idx, tuple) else (idx,)
    if sum(1 for x in idx if x is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if Ellipsis in idx:
        at = idx.index(Ellipsis)
        idx = idx[:at] + (slice(None),) * (len(shape) - len(idx) + 1) + idx[at + 1:]
    if len(idx) > len(shape):
        raise IndexError(f"too many indices: {len(idx)} for an array of {len(shape)} dimensions")
    idx = idx + (slice(None),) * (len(shape) - len(idx))
    box, rest = [], []
    for x, n in zip(idx, shape):
        if isinstance(x, slice):
            start, stop, step = x.indices(n)
            if step <= 0:
                raise IndexError("only positive slice steps are supported")
            stop = max(start, stop)
            box.append(slice(start, stop))
            rest.append(slice(None, None, step))
        else:
            i = int(x)
            if not -n <= i < n:
                raise IndexError(f"index {i} is out of bounds for an axis of size {n}")
            i %= n
            box.append(slice(i, i + 1))
            rest.append(0)
    return tuple(box), tuple(rest)


def _parse_slice(text: str) -> Any:
    """The index ``_lazy._slice_text`` wrote as ``text`` ("" is the whole array)."""
    if not text:
        return ...
    out: List[Any] = []
    for part in text.split(","):
        if part == "...":
            out.append(...)
        elif ":" in part:
            bits = [int(b) if b else None for b in part.split(":")]
            out.append(slice(*bits))
        else:
            out.append(int(part))
    return tuple(out)


def open_reader(path: str, fmt: str) -> ForeignReader:
    """A ``ForeignReader`` over the local file or folder ``path`` of format ``fmt``."""
    if fmt in ("npy", "npz"):
        return ForeignReader(path, fmt, _numpy_tree(path, fmt))
    if fmt in ("zarr", "hdf5"):
        from . import _hierarchy, _hierarchy_map

        _hierarchy_map.refuse_url(path, fmt)
        b = _hierarchy.backend(fmt)
        root = _hierarchy_map.open_root(b, path)
        try:
            tree, notes = _hierarchy_map.read_tree(b, root, {"tensors": 0, "bytes": 0}, _EveryArray(b, path))
        except BaseException:
            b.close(root)
            raise
        return ForeignReader(path, fmt, tree, notes.get("metadata"), keep=root)
    if fmt in ("orbax", "jax"):
        j = _Jax(path, fmt)
        return ForeignReader(path, fmt, j.tree, customs=j.ck.customs, keep=j)
    raise ValueError(f"{path}: a {fmt} file is not opened here")


def structure(path: str, fmt: str) -> Any:
    """``load_structure`` of the foreign file ``path``: nothing of its arrays read."""
    if fmt in ("orbax", "jax"):
        from . import _foreign_jax

        return _foreign_jax.structure(path, fmt)
    return open_reader(path, fmt).structure()
