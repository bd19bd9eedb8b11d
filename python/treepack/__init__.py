"""treepack: save and load trees of data — nested dicts, lists, tuples, dataclasses and custom
objects whose leaves are numpy arrays, scalars, strings and bytes — fast, safely and partially.

Strict by default: loading never imports or runs code it was not told to trust, and never
unpickles unless ``allow_pickle=True``. See docs/python.md.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import concurrent.futures
import functools
import json
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, Generator, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _codec, _core, _like, _registry, integrations
from ._codec import Unloadable
from ._core import CorruptError, FormatError, TreepackError
from ._registry import register, registered

__version__ = _core.__version__

__all__ = [
    "save", "load", "load_structure", "open", "untrusted_types", "verify", "gc", "asave", "aload", "SaveHandle",
    "register", "registered", "LeafInfo", "StructNode", "SaveInfo", "Unloadable",
    "UntrustedTypeError", "TreepackError", "CorruptError", "FormatError", "View", "LazyArray",
]

PathLike = Union[str, "os.PathLike[str]"]
StorageOptions = Optional[Mapping[str, Any]]
"""Cloud settings for remote locations (``s3://``, ``gs://``, ``az://``, ``http(s)://``): object_store's
keys (``aws_access_key_id``, ``region``, ``endpoint``, ``google_service_account_key``, ``azure_storage_account_name``…)
and treepack's tuning keys (``max_concurrency``, ``multipart_threshold``, ``multipart_part_size``,
``max_request_bytes``, ``max_retries``, ``retry_timeout_secs``). Values override environment variables."""
Progress = Optional[Callable[[int, int], Any]]
"""Called as ``progress(bytes_done, bytes_total)`` from a background thread while data moves."""


def _opts(storage_options: StorageOptions) -> Optional[Dict[str, str]]:
    if storage_options is None:
        return None
    return {str(k): (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in storage_options.items()}


class UntrustedTypeError(TreepackError):
    """A file names types that are not allowed. ``.types`` maps each type name to its key paths."""

    def __init__(self, path: str, types: Dict[str, List[str]]) -> None:
        self.types = types
        lines = [f"  {name}: at {', '.join(paths[:5])}{' …' if len(paths) > 5 else ''}" for name, paths in sorted(types.items())]
        super().__init__(
            f"{path}: refusing to load types that are not trusted (nothing was imported or constructed):\n"
            + "\n".join(lines)
            + "\nTo load them:\n"
            + "\n".join(_untrusted_hints(types))
            + "\nor pass on_missing='placeholder' to get treepack.Unloadable objects in their place."
        )


def _untrusted_hints(types: Dict[str, List[str]]) -> List[str]:
    # Each kind of name is allowed a different way: say the one that works for each.
    classes = sorted(n for n in types if ":" in n and not n.startswith("pickle ("))
    registered = sorted(n for n in types if ":" not in n and not n.startswith(("pickle (", "py.")))
    out = []
    if classes:
        modules = sorted({n.split(":", 1)[0] for n in classes})
        out.append(f"  - dataclasses, namedtuples and enums: load(..., trust={[m + '.*' for m in modules]!r}) (imports those modules)")
    if registered:
        out.append(
            f"  - registered types ({', '.join(registered)}): call treepack.register(cls, name=..., to_data=..., "
            "from_data=...) for each in this process before loading (trust= does not apply to them)"
        )
    if any(n.startswith("pickle (") for n in types):
        out.append("  - pickled objects: allow_pickle=True (unpickling runs code from the file: only for files you trust)")
    if any(n.startswith("py.") for n in types):
        out.append("  - built-in types this treepack does not know (written by a newer version?): upgrade treepack")
    return out


LeafInfo = _core.LeafInfo
"""What ``load_structure`` puts at each leaf: ``path``, ``kind``, ``dtype``, ``shape``, ``nbytes``,
``inline`` (a Rust class: cheap to create for trees with many leaves)."""


@dataclass(frozen=True)
class StructNode:
    """A record or custom node in a structure tree (its class is not constructed)."""

    kind: str
    type_name: str
    data: Any
    children: Dict[Any, Any]
    path: str = ""


@dataclass(frozen=True)
class SaveInfo:
    leaves: int
    bytes_written: int
    location: str
    arrays: int = 0
    array_bytes: int = 0


def _path(p: PathLike) -> str:
    return os.fspath(p)


def save(
    tree: Any,
    path: PathLike,
    *,
    overwrite: bool = False,
    metadata: Optional[Any] = None,
    allow_pickle: bool = False,
    chunk_bytes: Optional[int] = None,
    storage_options: StorageOptions = None,
    progress: Progress = None,
    blocking: bool = True,
) -> Any:
    """Save ``tree`` at ``path``: a directory, a ``.tpk`` file, ``s3://…``, ``gs://…``, ``az://…``,
    ``file://…`` or ``memory://…``.

    numpy arrays are written without copying when C-contiguous and little-endian. Objects other
    than the built-in kinds must be dataclasses, namedtuples, enums or registered types; anything
    else is refused unless ``allow_pickle=True``. Raises ``FileExistsError`` if a tree is already
    there and ``overwrite`` is false.

    ``blocking=False`` returns a :class:`SaveHandle` at once: the tree is converted and its arrays
    copied (a consistent snapshot) before returning, so the caller may change them immediately;
    storage I/O runs on a background thread. With ``blocking=True`` (the default) nothing is
    copied, so do not mutate the arrays while ``save`` runs.
    """
    p = _path(path)

    def enc(obj: Any, where: str) -> Any:
        return _codec.encode_other(obj, where, allow_pickle)

    md = _metadata_json(metadata) if metadata is not None else None
    prepared = _core.prepare(
        tree, enc, _codec.encode_array, snapshot=not blocking, fast_datetime=_registry.lookup_class(_dt.datetime) is None
    )
    write = functools.partial(
        prepared.write, p, overwrite=overwrite, metadata=md, chunk_bytes=chunk_bytes,
        storage_options=_opts(storage_options), progress=progress,
    )
    if blocking:
        return SaveInfo(*write())
    return SaveHandle(_executor().submit(lambda: SaveInfo(*write())), p)


def _metadata_json(metadata: Any) -> str:
    try:
        return json.dumps(metadata, allow_nan=True)
    except (TypeError, ValueError):
        pass
    # Name the first value JSON cannot hold, and where it is.
    stack: List[Tuple[str, Any]] = [("", metadata)]
    while stack:
        where, x = stack.pop()
        if isinstance(x, dict):
            for k, v in x.items():
                if not isinstance(k, (str, int, float, bool)) and k is not None:
                    raise TypeError(f"metadata=: the key {k!r} at `{where or '<root>'}` is a {type(k).__name__}; JSON object keys must be strings")
                stack.append((f"{where}/{k}" if where else str(k), v))
        elif isinstance(x, (list, tuple)):
            stack.extend((f"{where}/{i}" if where else str(i), v) for i, v in enumerate(x))
        elif not (x is None or isinstance(x, (str, int, float, bool))):
            hint = " (convert numpy scalars with .item(), arrays with .tolist())" if isinstance(x, (np.generic, np.ndarray)) else ""
            raise TypeError(
                f"metadata=: the value at `{where or '<root>'}` is a {type(x).__module__}.{type(x).__qualname__}, which JSON "
                f"cannot hold; metadata must be JSON: dicts, lists, str, int, float, bool, None{hint}. "
                "Put arrays and other objects in the tree itself"
            )
    raise TypeError("metadata=: not JSON-serialisable (a reference cycle?)")


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
    kwargs.pop("blocking", None)
    return await save(tree, path, blocking=False, **kwargs)


async def aload(path: PathLike, **kwargs: Any) -> Any:
    """``await aload(path, ...)``: :func:`load` (same keywords) on a worker thread."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, functools.partial(load, path, **kwargs))


def _check(reader: Any, p: str, trust: Tuple[str, ...], allow_pickle: bool, on_missing: str, select: Any = None, keep: Any = None) -> None:
    # Only what this load will construct is audited: records and custom objects with nothing
    # selected below them come back as None (never built), so they need no trust.
    bad = _codec.audit(reader.types(_codec.AUDIT_FREE, select, keep), trust, allow_pickle)
    if bad and on_missing == "error":
        raise UntrustedTypeError(p, bad)


def load(
    path: PathLike,
    *,
    select: Optional[Sequence[str]] = None,
    like: Any = None,
    trust: Iterable[str] = (),
    allow_pickle: bool = False,
    on_missing: str = "error",
    mmap: bool = False,
    verify: Optional[bool] = None,
    storage_options: StorageOptions = None,
    progress: Progress = None,
) -> Any:
    """Load a tree from a local path, ``.tpk`` file, ``s3://``, ``gs://``, ``az://`` or ``http(s)://`` location.

    - ``select``: key-path globs (``"params/**"``); other leaves come back as ``None``, and so do
      records and custom objects with nothing selected below them (they are not constructed, so
      they need no trust).
    - ``like``: a tree shaped like the stored one (``load_structure``'s, or an abstract tree of
      arrays / ``jax.ShapeDtypeStruct``s): ``None``/``False`` skips a leaf or subtree, ``True``,
      a ``LeafInfo`` or an array-like loads it (shape and dtype checked). A ``like`` that differs
      from the stored structure raises, naming the key path. Skipped places come back as with
      ``select``.
    - ``trust``: globs of ``module:qualname`` / ``module.qualname`` names whose dataclasses,
      namedtuples and enums may be rebuilt (their modules may then be imported).
    - ``on_missing="placeholder"``: unknown or untrusted objects become ``Unloadable``.
    - ``mmap=True``: arrays are read-only views of the (local, uncompressed) file, no copy.
    - ``verify``: check chunk hashes (default: True; False with ``mmap`` since it would read everything).
    - ``storage_options``: credentials/endpoint/tuning for remote locations; ``progress(done, total)``.

    The whole manifest is audited before any record or custom object is built: untrusted types
    raise ``UntrustedTypeError`` listing every type and key path, and nothing is imported. (A
    tree of plain containers, values and built-in types such as datetime is built in one pass
    while its manifest is read; the audit has nothing to refuse there.)
    """
    p = _path(path)
    trust_t = tuple(trust)
    if on_missing not in ("error", "placeholder"):
        raise ValueError("on_missing must be 'error' or 'placeholder'")
    opts = _opts(storage_options)
    dec = _codec.Decoder(trust_t, allow_pickle, on_missing == "placeholder")
    verify = (not mmap) if verify is None else verify
    if select is None and like is None and not mmap and progress is None:
        # Whole tree: one pass over the manifest builds the objects as it is read (its few reads
        # of stored leaves report no progress, hence not with a callback). It takes only trees
        # that need no audit (no records, only built-in custom types) and few stored leaves;
        # anything else, or any failure, goes the audited Reader path below, which fetches stored
        # leaves in parallel batches and reports errors in full.
        out = _core.load_one_pass(p, dec, _codec.np_dtype, _codec.AUDIT_FREE, verify, opts)
        if out is not None:
            return out
    r = _core.Reader(p, opts)
    sel = [select] if isinstance(select, str) else (list(select) if select is not None else None)
    keep = _like.keep_paths(like, r.structure(_struct_node)) if like is not None else None
    _check(r, p, trust_t, allow_pickle, on_missing, sel, keep)
    return r.load(
        dec,
        _codec.np_dtype,
        select=sel,
        keep=keep,
        mmap=mmap,
        verify=verify,
        progress=progress,
    )


def _struct_node(kind: str, type_name: str, data: Optional[str], children: List[Tuple[Any, Any]], path: str) -> StructNode:
    return StructNode(kind, type_name, json.loads(data) if data else None, dict(children), path)


def load_structure(path: PathLike, *, storage_options: StorageOptions = None) -> Any:
    """The tree with a ``LeafInfo`` at every leaf, reading only the manifest.

    Containers come back as dict/list/tuple; records and custom objects as ``StructNode`` (their
    classes are never constructed or imported). When JAX is imported, ``StructNode`` is a pytree
    node, so ``jax.tree.map`` over the structure reaches the fields of records.
    """
    p, opts = _path(path), _opts(storage_options)
    integrations.register_loaded()  # StructNode as a JAX pytree node, when JAX is in use
    # One pass over the manifest, building these objects as it is read; whenever that path does
    # not apply (or fails), the Reader path below gives the result or the full error.
    fast = _core.structure_one_pass(p, _struct_node, opts)
    if fast is not None:
        return fast
    return _core.Reader(p, opts).structure(_struct_node)


def untrusted_types(
    path: PathLike, trust: Iterable[str] = (), allow_pickle: bool = False, *, storage_options: StorageOptions = None
) -> Dict[str, List[str]]:
    """What loading ``path`` would need trusted: {type name: [key paths]}. Constructs nothing."""
    return _codec.audit(
        _core.Reader(_path(path), _opts(storage_options)).types(_codec.AUDIT_FREE), tuple(trust), allow_pickle
    )


@dataclass(frozen=True)
class VerifyReport:
    ok: bool
    chunks_checked: int
    bytes_checked: int
    problems: List[str]


def verify(path: PathLike, *, storage_options: StorageOptions = None) -> VerifyReport:
    """Re-hash every chunk; the report names corrupt chunks."""
    return VerifyReport(*_core.Reader(_path(path), _opts(storage_options)).verify())


def gc(path: PathLike, grace_secs: float = 3600.0, *, storage_options: StorageOptions = None) -> List[str]:
    """Remove leftovers of interrupted saves older than ``grace_secs``; returns what was removed."""
    return _core.gc(_path(path), grace_secs, _opts(storage_options))


# ---------------------------------------------------------------- lazy views


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


class LazyArray:
    """An array in a stored tree; reads only the chunks a slice touches."""

    def __init__(self, reader: Any, path: str) -> None:
        self._r = reader
        self.path = path
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
        out = self._r.read_array(self.path, _slice_text(idx, self.ndim), _codec.np_dtype)
        return out

    def read(self) -> np.ndarray:
        return self._r.read_array(self.path, "", _codec.np_dtype)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = self.read()
        return a.astype(dtype) if dtype is not None else a

    def __repr__(self) -> str:
        return f"LazyArray({self.path!r}, shape={self.shape}, dtype={self.dtype})"


class View:
    """A lazy view of a stored tree: index it like the tree; arrays come back as ``LazyArray``."""

    def __init__(self, reader: Any, path: str = "", *, trust: Tuple[str, ...] = (), allow_pickle: bool = False, on_missing: str = "error") -> None:
        self._r = reader
        self.path = path
        self._opts = (trust, allow_pickle, on_missing)

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
                raise KeyError(f"{key!r} not found in `{self.path or '<root>'}` ({kind})")
            seg = found[0]
        child = f"{self.path}/{seg}" if self.path else seg
        ck = self._r.kind(child)
        if ck == "array":
            return LazyArray(self._r, child)
        if ck in ("dict", "list", "tuple", "record", "custom"):
            return View(self._r, child, trust=self._opts[0], allow_pickle=self._opts[1], on_missing=self._opts[2])
        return self._read(child)

    def _read(self, path: str) -> Any:
        trust, allow_pickle, on_missing = self._opts
        bad = _codec.audit([t for t in self._r.types(_codec.AUDIT_FREE) if t[3] == path or t[3].startswith(path + "/") or not path], trust, allow_pickle)
        if bad and on_missing == "error":
            raise UntrustedTypeError(path, bad)
        dec = _codec.Decoder(trust, allow_pickle, on_missing == "placeholder")
        return self._r.load(dec, _codec.np_dtype, subpath=path)

    def read(self) -> Any:
        """Load this subtree (trust rules apply)."""
        return self._read(self.path)

    def structure(self) -> Any:
        integrations.register_loaded()
        return self._r.structure(_struct_node)

    @property
    def metadata(self) -> Any:
        m = self._r.metadata()
        return json.loads(m) if m is not None else None

    def __repr__(self) -> str:
        return f"View({self.path or '<root>'!r}, {self.kind}, {len(self)} children)"


def _same_key(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def open(
    path: PathLike,
    *,
    trust: Iterable[str] = (),
    allow_pickle: bool = False,
    on_missing: str = "error",
    storage_options: StorageOptions = None,
) -> View:
    """Open a stored tree lazily: ``open(p)["params"]["w"][0:2]`` reads only the chunks it needs
    (on object stores: one GET for the manifest, then ranged GETs)."""
    reader = _core.Reader(_path(path), _opts(storage_options))
    return View(reader, "", trust=tuple(trust), allow_pickle=allow_pickle, on_missing=on_missing)
