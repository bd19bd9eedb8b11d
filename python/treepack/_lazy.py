"""Lazy views of a stored tree: ``open`` returns a View; its arrays are LazyArrays that read only
the chunks a slice touches."""

from __future__ import annotations

import json
import sys
from typing import Any, Iterable, Iterator, List, Optional, Tuple, Union

import numpy as np

from . import _codec, _core, _encryption, _registry
from ._api import PathLike, StorageOptions, UntrustedTypeError, _opts, _path, _placed, _struct_node


def _slice_text(idx: Any, ndim: int) -> str:
    if not isinstance(idx, tuple):
        idx = (idx,)
    parts = []
    for x in idx:
        if x is Ellipsis:
            parts.append("...")
        elif isinstance(x, slice):
            if x.step is not None and x.step <= 0:
                raise IndexError("only positive slice steps are supported")
            parts.append(
                f"{'' if x.start is None else int(x.start)}:{'' if x.stop is None else int(x.stop)}"
                + (f":{int(x.step)}" if x.step is not None else "")
            )
        elif isinstance(x, (int, np.integer)):
            parts.append(str(int(x)))
        else:
            raise IndexError(f"unsupported index {x!r}: use integers, slices and ...")
    return ",".join(parts)


def _in_bounds(idx: Any, shape: Tuple[int, ...]) -> None:
    """numpy's IndexErrors for an index past the array's dimensions or an integer out of
    range (what else a slice may not be, the reader says)."""
    items = idx if isinstance(idx, tuple) else (idx,)
    explicit = sum(1 for x in items if x is not Ellipsis)
    if explicit > len(shape):
        raise IndexError(f"too many indices for array: array is {len(shape)}-dimensional, but {explicit} were indexed")
    axis = 0
    for x in items:
        if x is Ellipsis:
            axis += len(shape) - explicit
            continue
        if isinstance(x, (int, np.integer)) and not isinstance(x, bool) and not -shape[axis] <= int(x) < shape[axis]:
            raise IndexError(f"index {int(x)} is out of bounds for axis {axis} with size {shape[axis]}")
        axis += 1


def _is_foreign(reader: Any) -> bool:
    """Whether ``reader`` reads another tool's file (``_foreign_view``, imported only when such a
    file is opened: a reader of one exists only then)."""
    fv = sys.modules.get(f"{__package__}._foreign_view")
    return fv is not None and isinstance(reader, fv.ForeignReader)


class LazyArray:
    """An array in a stored tree; reads only the chunks a slice touches."""

    def __init__(self, reader: Any, path: str, where: Tuple[str, StorageOptions] = ("", None)) -> None:
        self._r = reader
        self.path = path
        self._where = where
        dtype_json, shape = reader.array_info(path)
        self._dtype_json = dtype_json
        self.shape: Tuple[int, ...] = tuple(shape)

    @property
    def dtype(self) -> np.dtype:
        return _codec.np_dtype(self._dtype_json)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def __getitem__(self, idx: Any) -> np.ndarray:
        _in_bounds(idx, self.shape)
        out = self._r.read_array(self.path, _slice_text(idx, self.ndim), _codec.np_dtype)
        return out

    def read(self) -> np.ndarray:
        return self._r.read_array(self.path, "", _codec.np_dtype)

    def to_dask(self, chunks: Any = None, *, verify: bool = True) -> Any:
        """This array as a Dask array: one task per block, each reading only the chunks its
        block covers (ranged reads on object stores). ``chunks`` as in ``dask.array``;
        default: the stored chunk grid. The graph holds no data, only where to read."""
        if _is_foreign(self._r):
            # Another tool's file: blocks read through its own library, as slices are.
            return self._r.to_dask(self.path, chunks)
        location, storage_options = self._where
        if not location:
            raise ValueError("to_dask needs a LazyArray from treepack.open(...)")
        stored = self._r.chunk_shape(self.path)
        to_dask = _registry.method("to_dask")  # (the Dask integration's)
        return to_dask(location, self.path, storage_options, self.shape, self.dtype, verify, chunks,
                       tuple(stored) if stored else None)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = self.read()
        return a.astype(dtype) if dtype is not None else a

    def __repr__(self) -> str:
        return f"LazyArray({self.path!r}, shape={self.shape}, dtype={self.dtype})"


class View:
    """A lazy view of a stored tree: index it like the tree; arrays come back as ``LazyArray``."""

    def __init__(self, reader: Any, path: str = "", *, trust: Tuple[str, ...] = (), allow_pickle: bool = False, on_missing: str = "error",
                 where: Tuple[str, StorageOptions] = ("", None)) -> None:
        self._r = reader
        self.path = path
        self._opts = (trust, allow_pickle, on_missing)
        self._where = where

    @property
    def kind(self) -> str:
        return self._r.kind(self.path)

    def _children(self) -> List[Tuple[str, Any]]:
        return self._r.children(self.path)

    def keys(self) -> List[Any]:
        return [k for _, k in self._children()]

    def __len__(self) -> int:
        return len(self._children())

    def __iter__(self) -> Iterator[Any]:
        return iter(self.keys())

    def __contains__(self, key: Any) -> bool:
        return any(_same_key(k, key) for _, k in self._children())

    def __getitem__(self, key: Any) -> Any:
        kind = self.kind
        children = self._children()
        if kind in ("list", "tuple"):
            # Python's rules: negative indexes count from the end; out of range is an IndexError.
            if isinstance(key, bool) or not isinstance(key, (int, np.integer)):
                raise TypeError(f"`{self.path or '<root>'}` is a {kind}: index it with an integer, not {type(key).__name__}")
            i = int(key) + len(children) if key < 0 else int(key)
            if not 0 <= i < len(children):
                raise IndexError(f"index {int(key)} is out of range for `{self.path or '<root>'}` ({kind} of {len(children)})")
            seg = children[i][0]
        else:
            found = [seg for seg, k in children if _same_key(k, key)]
            if not found:
                keys = [k for _, k in children]
                shown = ", ".join(repr(k) for k in keys[:10]) + (f", … ({len(keys)} in all)" if len(keys) > 10 else "")
                more = (" (its children as stored; .read() builds the object)" if kind in ("custom", "record") else "")
                raise KeyError(f"{key!r} not found in `{self.path or '<root>'}` ({kind}); its keys: {shown or 'none'}{more}")
            seg = found[0]
        child = f"{self.path}/{seg}" if self.path else seg
        ck = self._r.kind(child)
        if ck == "array":
            return LazyArray(self._r, child, self._where)
        if ck == "custom":
            lazy = self._lazy_node(child)
            if lazy is not None:
                return lazy
        if ck in ("dict", "list", "tuple", "record", "custom"):
            return View(self._r, child, trust=self._opts[0], allow_pickle=self._opts[1], on_missing=self._opts[2], where=self._where)
        return self._read(child)

    def _lazy_node(self, path: str) -> Any:
        """What the integration of the custom node at ``path`` gives for it (an Awkward Array
        reading only the buffers its operations need); None for a View."""
        rows = [row for row in self._r.types(None) if row[3] == path]
        view = _registry.node_view(rows[0][1]) if rows else None
        if view is None:
            return None
        data = json.loads(rows[0][2]) if rows[0][2] else None
        return view(self._r, path, data, self._where)

    def _read(self, path: str) -> Any:
        trust, allow_pickle, on_missing = self._opts
        # What the read builds: the subtree, and the objects its refs name wherever they are.
        bad = _codec.audit(self._r.types_within([path], _codec.AUDIT_FREE), trust, allow_pickle)
        if bad and on_missing == "error":
            raise UntrustedTypeError((self._where[0] if self._where else "") or path, bad, call="open")
        dec = _codec.Decoder(trust, allow_pickle, on_missing == "placeholder")
        try:
            return self._r.load(dec, _codec.np_dtype, subpath=path)
        except (_codec.BuildError, ValueError, TypeError, OverflowError) as e:
            placed = _placed(e, str(self._where[0] or "the tree"))
            if placed is None:
                raise
            raise placed from e

    def read(self) -> Any:
        """Load this subtree (trust rules apply)."""
        return self._read(self.path)

    def structure(self) -> Any:
        for hook in _registry.gated("structure"):
            hook()  # (JAX: StructNode as a pytree node)
        return self._r.structure(_struct_node)

    @property
    def metadata(self) -> Any:
        m = self._r.metadata()
        return json.loads(m) if m is not None else None

    def __repr__(self) -> str:
        return f"View({self.path or '<root>'!r}, {self.kind}, {len(self)} children)"

    def _repr_html_(self) -> str:
        """Notebooks: the subtree as a compact HTML tree, from the manifest alone (no server)."""
        if _is_foreign(self._r):
            return self._r.html(self.path)
        return _core.reader_html(self._r, self.path)


def _same_key(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def open(
    path: PathLike,
    *,
    trust: Iterable[str] = (),
    allow_pickle: bool = False,
    on_missing: str = "error",
    storage_options: StorageOptions = None,
    signed_by: Any = None,
    min_version: Optional[int] = None,
    not_before: Any = None,
    encryption: Any = None,
) -> Union[View, LazyArray]:
    """Open a stored tree lazily: ``open(p)["params"]["w"][0:2]`` reads only the chunks it needs
    (on object stores: one GET for the manifest, then ranged GETs). ``signed_by`` (and
    ``min_version``, ``not_before``) as ``load``'s: the signature is checked against the
    manifest the view reads through, before the view is returned; every chunk read is then
    hash-checked against it. ``encryption``: the key of an encrypted tree (docs/encryption.md);
    each read decrypts only the segments it touches. Files of other tools open as the tree a
    load gives: ``.npy`` (as a ``LazyArray``), ``.npz``, Zarr, HDF5, Orbax and JAX through their
    own libraries (their index read at open, each slice reading only what it touches)."""
    p = _path(path)
    storage_options = _encryption.keyed(storage_options, encryption)
    try:
        reader = _core.Reader(p, _opts(storage_options))
    except (_core.TreepackError, FileNotFoundError):
        # Files the Python package reads for another tool (npy, npz, Zarr, HDF5, Orbax, JAX):
        # their own index read here, their arrays read by the slices taken.
        from . import _foreign_view

        fmt = _core.detect_format(p, True) if "://" not in p else None
        if fmt not in _foreign_view.FORMATS:
            raise
        if encryption is not None:
            raise _core.NotEncryptedError(f"{p}: a {fmt} file is not encrypted, and encryption= was given: open it "
                                          "without a key") from None
        if signed_by is not None:
            raise _core.UnsignedError(f"{p}: a {fmt} file holds no treepack signature, and signed_by= asks for one: "
                                      "store it as a treepack tree (treepack.convert), sign that, and open it") from None
        foreign = _foreign_view.open_reader(p, fmt)
        if foreign.kind("") == "array":
            return LazyArray(foreign, "", (p, None))  # (an .npy holds one array)
        return View(foreign, "", trust=_registry.trust_globs(trust), allow_pickle=allow_pickle, on_missing=on_missing, where=(p, None))
    if signed_by is not None or min_version is not None or not_before is not None:
        from . import _signing

        if signed_by is not None:
            _signing.check_reader(reader, signed_by, min_version, not_before)
        else:
            _signing.no_policy_without_keys(min_version, not_before)
    return View(reader, "", trust=_registry.trust_globs(trust), allow_pickle=allow_pickle, on_missing=on_missing, where=(p, storage_options))


# For integrations (through treepack._plugin): an index as the reader's slice text.
slice_text = _slice_text
