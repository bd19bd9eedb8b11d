"""Converting trees to and from other formats (docs/convert.md): safetensors through the Rust
core, ``.npy`` and ``.npz`` through numpy (never with pickle), Zarr and HDF5 through
zarr-python and h5py (``_hierarchy``)."""

from __future__ import annotations

import collections
import os
import struct
import zipfile
import zlib
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple, Union

import numpy as np

from . import _codec, _core, _encryption, _errors, _registry
from ._api import (
    PathLike, StorageOptions, _compression_text, _opts, _path, _progress_callback, _struct_node, load, save,
)
from ._transport import memory_location

__all__ = ["convert"]

_FORMATS = ("treepack", "safetensors", "torch", "gguf", "dcp", "npz", "npy", "zarr", "hdf5", "orbax", "jax")


def _format_of(path: str, explicit: Optional[str], read: bool) -> str:
    if explicit is not None:
        explicit = {"h5": "hdf5", "tpk": "treepack"}.get(explicit, explicit)
        if explicit not in _FORMATS:
            raise ValueError(f"unknown format {explicit!r}: one of {', '.join(_FORMATS)}")
        return explicit
    # The one detector, the CLI's too: a source by its content, a destination by its name.
    return _core.detect_format(path, read)


def load_foreign(path: str, fmt: str, load_kwargs: Dict[str, Any]) -> Any:
    """``treepack.load`` of a file another library wrote: converted into memory, then loaded
    with every ``load`` option."""
    # (Options whose result reads the location later, such as dask=, cannot use a temporary one.)
    for bad in ("storage_options", *_registry.LOCATION_OPTIONS, "mmap"):
        if load_kwargs.get(bad):
            raise TypeError(f"load() of a .{fmt} file takes no {bad}=; convert it to treepack first "
                            f"(treepack.convert({path!r}, 'x.tpk'))")
    if fmt in ("orbax", "jax"):
        # Read as a tree here (the arrays selected only, custom nodes kept as placeholders).
        from . import _foreign_jax

        return _foreign_jax.load(path, fmt, load_kwargs)
    with memory_location() as loc:
        convert(path, loc, from_format=fmt, to_format="treepack", separator=load_kwargs.pop("separator", None))
        return load(loc, **load_kwargs)


def convert(
    src: PathLike,
    dst: PathLike,
    *,
    from_format: Optional[str] = None,
    to_format: Optional[str] = None,
    separator: Optional[str] = None,
    overwrite: bool = False,
    storage_options: StorageOptions = None,
    progress: Any = None,
    select: Optional[Union[str, Sequence[str]]] = None,
    encryption: Any = None,
    dst_encryption: Any = None,
    **save_kwargs: Any,
) -> Dict[str, int]:
    """Convert ``src`` to ``dst``; formats from ``from_format``/``to_format``, else a local
    ``src`` by its content (as ``treepack convert`` tells it) and ``dst`` or a remote ``src`` by
    the extension (``.safetensors``, ``.npz``, ``.npy``, ``.zarr``, ``.h5``/``.hdf5``, anything
    else a treepack location).

    - safetensors (read and write, streamed array by array; read zero-copy from a memory map):
      names are read as stored (the flat mapping the file holds, what ``load_state_dict``
      takes) unless ``separator`` splits them into nested keys (``"."``: ``layers.0.w`` is
      ``{"layers": {"0": {"w"}}}``); a nested tree written to a flat file has its keys joined
      by ``separator``, ``"."`` where none is given. Its ``__metadata__`` is the tree's metadata.
    - ``.npz`` (read and write, the same naming) and ``.npy`` (one array): read with numpy's
      ``allow_pickle=False`` (object arrays are refused), written one array at a time.

    - ``torch.save`` checkpoints (``.pt``, ``.pth``, ``pytorch_model.bin``; known by content), read
      only, without pickle: the pickle is interpreted as data by treepack's own reader, which
      builds tensors, dicts, lists and plain values from an allow-list and refuses any other
      class or function naming it (docs/security.md). ``treepack.load``/``open`` read such a
      file directly.
    - Zarr (a ``.zarr`` folder: v3 written, v3 and v2 read, through zarr-python) and HDF5 (h5py):
      dicts, lists and tuples are groups, arrays are arrays/datasets (the chunk grid kept,
      compressed chunks written with zstd / gzip), other leaves attributes; see docs/convert.md.

    ``progress``: ``True`` for a tqdm bar, or a callback ``progress(bytes_done, bytes_total)``
    (as for :func:`save`). ``python -m treepack convert SRC DST`` is the same from a shell.

    ``select``: key-path globs, as for :func:`load` (``"params/**"``; a leading ``?`` marks a
    pattern that may match nothing, and one that matches nothing otherwise raises ``KeyError``
    naming it). Only what they select is converted; the rest is left out (an item left out of a
    list or tuple is ``None`` in a tree, Zarr or HDF5 target, so the others keep their index).
    The key paths are those of the tree: the treepack source's, or the one a foreign file reads
    as (``layers/0/w`` for the safetensors tensor ``layers.0.w``).

    What the target cannot hold (a string in safetensors, a dtype it lacks) raises
    ``ValueError`` naming the key path, before anything is written. ``save_kwargs``
    (``compression=``, ``durable=``, ...) apply when the target is treepack. Returns
    ``{"tensors": n, "bytes": n}``.

    ``encryption``: the key of an encrypted treepack source; ``dst_encryption``: a key to
    encrypt a treepack target with (docs/encryption.md).
    """
    s, d = _path(src), _path(dst)
    storage_options = (_encryption.keyed(storage_options, encryption),
                       _encryption.keyed(_encryption.unkeyed(storage_options), dst_encryption))
    sel = [select] if isinstance(select, str) else (list(select) if select is not None else None)
    if progress is None or progress is False:
        return _convert(s, d, from_format, to_format, separator, overwrite, storage_options, None, save_kwargs, sel)
    report, done = _progress_callback(progress, f"convert {os.path.basename(s.rstrip('/'))}")
    try:
        return _convert(s, d, from_format, to_format, separator, overwrite, storage_options, report, save_kwargs, sel)
    finally:
        done()


def _convert(s: str, d: str, from_format: Optional[str], to_format: Optional[str], separator: Optional[str],
             overwrite: bool, both_options: Tuple[StorageOptions, StorageOptions], report: Any,
             save_kwargs: Dict[str, Any], select: Optional[List[str]] = None) -> Dict[str, int]:
    # The source's storage options (with its key) and the target's (with its own).
    src_options, dst_options = both_options
    f, t = _format_of(s, from_format, True), _format_of(d, to_format, False)
    if f == t:
        hint = "copy it with `treepack cp`" if f == "treepack" else "nothing to convert"
        raise ValueError(f"{s} and {d} are both {f}: {hint}")
    if t == "torch":
        raise ValueError(f"{d}: treepack reads torch.save checkpoints but does not write them; convert to treepack or "
                         "safetensors, or torch.save(treepack.load(SRC), DST) with torch installed")
    if t in ("dcp", "gguf"):
        what = "torch.distributed checkpoints" if t == "dcp" else "GGUF files"
        raise ValueError(f"{d}: treepack reads {what} but does not write them; convert to treepack or safetensors")
    if t in ("orbax", "jax"):
        raise ValueError(f"{d}: treepack reads {'Orbax' if t == 'orbax' else 'JAX pytree_serialization'} checkpoints but "
                         "does not write them; convert to treepack, safetensors, Zarr or HDF5")
    if f in ("orbax", "jax") and t == "treepack":
        from . import _foreign_jax

        tree = _foreign_jax.read_tree(s, f, select)
        save(tree, d, overwrite=overwrite, storage_options=dst_options, progress=report, **save_kwargs)
        return _count(tree)
    if ("safetensors" in (f, t) and "treepack" in (f, t)) or (f in ("torch", "dcp", "gguf") and t in ("treepack", "safetensors")):
        unknown = set(save_kwargs) - {"compression", "durable"}
        if unknown:
            raise TypeError(f"convert() got unexpected keyword arguments {sorted(unknown)}")
        n, b = _core.convert(s, d, f, t, separator, overwrite, _opts(src_options),
                             _compression_text(save_kwargs.get("compression")), save_kwargs.get("durable", True), report,
                             select, _opts(dst_options))
        return {"tensors": n, "bytes": b}
    if f in ("npz", "npy") and t == "treepack":
        tree = _read_numpy(s, f, separator)
        if select:
            tree = select_tree(tree, select, s)
        save(tree, d, overwrite=overwrite, storage_options=dst_options, progress=report, **save_kwargs)
        return _count(tree)
    if f == "treepack" and t in ("npz", "npy"):
        return _write_numpy(s, d, t, separator, overwrite, src_options, report, select)
    if f == "treepack" and t in ("zarr", "hdf5"):
        from . import _hierarchy

        return _hierarchy.write(s, d, t, overwrite, src_options, report, select)
    if f in ("zarr", "hdf5") and t == "treepack":
        from . import _hierarchy

        return _hierarchy.read_and_save(s, d, f, overwrite, dst_options, select, progress=report, **save_kwargs)
    # Between two foreign formats: through a treepack tree in a temporary folder (the selection
    # made on the way in).
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        mid = os.path.join(tmp, "t")
        convert(s, mid, from_format=f, to_format="treepack", separator=separator, durable=False, select=select)
        return convert(mid, d, to_format=t, separator=separator, overwrite=overwrite, progress=report)


def _count(tree: Any) -> Dict[str, int]:
    """Arrays (each object once) and their bytes in a tree read from a foreign file."""
    n = b = 0
    seen: Set[int] = set()
    stack = [tree]
    while stack:
        x = stack.pop()
        if isinstance(x, (dict, list, tuple)) or _is_array(x):
            if id(x) in seen:
                continue
            seen.add(id(x))
        if isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
        elif _is_array(x):
            n += 1
            b += int(x.nbytes)
    return {"tensors": n, "bytes": b}


def _is_array(x: Any) -> bool:
    """A numpy array, or a Dask array of one (what a foreign reader makes of an array)."""
    return isinstance(x, np.ndarray) or (hasattr(x, "shape") and hasattr(x, "dtype") and hasattr(x, "nbytes")
                                         and not isinstance(x, np.generic))


def selected_paths(stand_in: Any, select: List[str], src: str) -> Tuple[Optional[Set[str]], Any]:
    """The key paths ``select`` keeps of the tree ``stand_in`` (its arrays empty ones: it is
    saved in memory, so that the patterns mean what they mean for :func:`load`), None for all,
    and the structure of the stand-in. A pattern that matches nothing raises ``KeyError`` naming
    it and ``src``."""
    with memory_location() as loc:
        save(stand_in, loc)
        r = _core.Reader(loc)
        return r.convert_keep(list(select), src), r.structure(_struct_node)


def stand_in_of(tree: Any) -> Any:
    """``tree`` with every array an empty one and every bytes value empty: its shape for
    :func:`selected_paths`. The same object for the same object: sharing is kept."""
    stand_ins: Dict[int, Any] = {}

    def stand_in(x: Any) -> Any:
        if id(x) in stand_ins:
            return stand_ins[id(x)]
        if isinstance(x, dict):
            out: Any = type(x)() if type(x) in (dict, collections.OrderedDict) else {}
            stand_ins[id(x)] = out
            for k, v in x.items():
                out[k] = stand_in(v)
            return out
        if isinstance(x, (list, tuple)):
            items = [stand_in(v) for v in x]
            out = items if isinstance(x, list) else tuple(items)
        elif _is_array(x):
            out = np.zeros(0, np.uint8)
        elif isinstance(x, (bytes, bytearray)):
            return b""
        else:
            return x
        stand_ins[id(x)] = out
        return out

    return stand_in(tree)


def select_tree(tree: Any, select: List[str], src: str) -> Any:
    """``tree`` (read from the foreign file ``src``) with only what ``select`` selects: treepack
    makes the selection on the tree's structure (a stand-in of the tree, every array an empty
    one, saved in memory), so the patterns mean what they mean for :func:`load` — a place of an
    object held at several places, once kept, keeps that object — and one that matches nothing
    raises ``KeyError`` naming it. Dict entries left out are dropped, list and tuple items left
    out are ``None``; nothing of the arrays is read."""
    keep, structure = selected_paths(stand_in_of(tree), select, src)
    done: Dict[str, Any] = {}

    def prune(x: Any, st: Any, path: str) -> Any:
        if getattr(st, "kind", None) == "ref":
            return done.get(st.target or "", x)  # the object as kept at its first place (kept whole)
        children = getattr(st, "children", st)
        if isinstance(x, dict) and isinstance(children, dict):
            out = type(x)() if type(x) in (dict, collections.OrderedDict) else {}
            for k, v in x.items():
                p = f"{path}/{_seg(k)}" if path else _seg(k)
                if p in keep:
                    out[k] = prune(v, children[k], p)
        elif isinstance(x, (list, tuple)) and isinstance(st, (list, tuple)):
            items = []
            for i, v in enumerate(x):
                p = f"{path}/{i}" if path else str(i)
                items.append(prune(v, st[i], p) if p in keep else None)
            out = items if isinstance(x, list) else tuple(items)
        else:
            out = x
        done[path] = out
        return out

    if keep is None:
        return tree
    if "" not in keep and not isinstance(tree, (dict, list, tuple)):
        return None
    return prune(tree, structure, "")


def _seg(key: str) -> str:
    """A string key's key-path segment (docs/format.md section 6)."""
    return "~e" if not key else key.replace("~", "~0").replace("/", "~1").replace("*", "~2")


def _nest(flat: Dict[str, Any], separator: Optional[str]) -> Dict[str, Any]:
    if not separator:
        return dict(flat)
    out: Dict[str, Any] = {}
    for name, value in flat.items():
        parts = name.split(separator)
        node = out
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ValueError(f"{name!r}: a value and a group at once when split at {separator!r}; "
                                 "convert with separator=None")
        if parts[-1] in node:
            raise ValueError(f"{name!r}: a value and a group at once when split at {separator!r}; "
                             "convert with separator=None")
        node[parts[-1]] = value
    return out


# How many times its compressed size a zip member may expand to: deflate's most (about 1032:1),
# stored members not at all; other methods (bzip2, lzma: numpy never writes them) get the
# bound the Zarr/HDF5 reader uses for sparse arrays.
_ZIP_RATIO = {zipfile.ZIP_STORED: 1, zipfile.ZIP_DEFLATED: 1032}
_OTHER_RATIO = 10_000
_MAX_NPY_HEADER = 10_000  # numpy's own default limit


def _read_numpy(path: str, fmt: str, separator: Optional[str]) -> Any:
    """An ``.npy`` file (memory-mapped) or the members of an ``.npz`` archive, never unpickled.
    Every array's header is read and checked first: an object dtype is refused (it needs
    pickle), and the bytes its shape and dtype declare must be there (in the file, or in the
    member, whose size is bounded by what its compressed bytes can expand to) — a hostile
    header is refused before anything of its size is allocated."""
    try:
        if fmt == "npy":
            with open(path, "rb") as f:
                _check_npy_header(f, os.fstat(f.fileno()).st_size, path, "")
            return np.load(path, mmap_mode="r", allow_pickle=False)
        archive = os.path.getsize(path)
        flat: Dict[str, Any] = {}
        with zipfile.ZipFile(path) as z:
            for info in z.infolist():
                name = info.filename
                if not name:  # (zipfile's is_dir() fails on an empty name)
                    raise _errors.ForeignFileError(f"{path}: holds a member with an empty name; not a readable .npz file")
                if info.is_dir():
                    continue
                flat[name[:-4] if name.endswith(".npy") else name] = _read_member(z, info, archive, path)
        return _nest(flat, separator)
    except _errors.ForeignFileError:
        raise
    except ValueError as e:
        if any(m in str(e) for m in ("allow_pickle", "Object arrays", "Python objects")):
            raise _errors.ForeignFileError(f"{path}: holds object arrays, which need pickle; treepack never unpickles "
                                           "(load it with numpy yourself if you trust it)") from None
        raise _errors.ForeignFileError(f"{path}: not a readable .{fmt} file: {e}") from None
    except (OSError, EOFError, zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, RuntimeError,
            zlib.error, struct.error, IndexError, KeyError, OverflowError, TypeError) as e:
        # (What zipfile and zlib raise for a damaged archive.)
        if isinstance(e, FileNotFoundError):
            raise
        raise _errors.ForeignFileError(f"{path}: not a readable .{fmt} file: {type(e).__name__}: {e}") from None


def _read_member(z: Any, info: Any, archive: int, path: str) -> Any:
    """One member of an ``.npz``: an array (its header checked first), or the member's bytes."""
    name = info.filename
    ratio = _ZIP_RATIO.get(info.compress_type, _OTHER_RATIO)
    if info.compress_size > archive or info.file_size > ratio * max(info.compress_size, 1):
        raise _errors.ForeignFileError(
            f"{path}: member {name!r} declares {info.file_size} bytes from {info.compress_size} compressed bytes "
            f"(the archive has {archive}): a damaged or hostile zip directory (a zip bomb?); nothing of it was read")
    try:
        with z.open(info) as fp:
            if fp.read(6) != b"\x93NUMPY":
                fp.seek(0)
                return fp.read()
            fp.seek(0)
            _check_npy_header(fp, info.file_size, path, name)
            fp.seek(0)
            return np.lib.format.read_array(fp, allow_pickle=False, max_header_size=_MAX_NPY_HEADER)
    except _errors.ForeignFileError:
        raise
    except ValueError as e:
        if any(m in str(e) for m in ("allow_pickle", "Object arrays", "Python objects")):
            raise
        raise _errors.ForeignFileError(f"{path}: member {name!r} is not a readable .npy array: {e}") from None
    except (OSError, EOFError, zipfile.BadZipFile, RuntimeError, NotImplementedError) as e:
        raise _errors.ForeignFileError(f"{path}: member {name!r} cannot be read: {type(e).__name__}: {e}") from None


def _npy_header(fp: Any) -> Tuple[Tuple[int, ...], np.dtype]:
    """An ``.npy`` header's shape and dtype (``_npy_layout``)."""
    shape, _fortran, dtype, _ = _npy_layout(fp)
    return shape, dtype


def _npy_layout(fp: Any) -> Tuple[Tuple[int, ...], bool, np.dtype, int]:
    """An ``.npy`` header's shape, Fortran order, dtype and length (where its data begins), read
    from ``fp`` at the array's start through numpy's public readers (format 3.0 is 2.0's layout
    with UTF-8 text: read here with the same literal-only parse)."""
    import ast

    version = np.lib.format.read_magic(fp)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(fp, max_header_size=_MAX_NPY_HEADER)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(fp, max_header_size=_MAX_NPY_HEADER)
    elif version == (3, 0):
        (length,) = struct.unpack("<I", fp.read(4))
        if length > _MAX_NPY_HEADER:
            raise ValueError(f"a header of {length} bytes")
        d = ast.literal_eval(fp.read(length).decode("utf-8"))
        if not isinstance(d, dict) or not {"descr", "fortran_order", "shape"} <= set(d):
            raise ValueError("the header is not a dict of descr, fortran_order and shape")
        shape, fortran, dtype = d["shape"], d["fortran_order"], np.lib.format.descr_to_dtype(d["descr"])
    else:
        raise ValueError(f"unknown .npy format version {version}")
    if not isinstance(shape, tuple) or not all(type(n) is int and n >= 0 for n in shape):
        raise ValueError(f"bad shape {shape!r}")
    return shape, bool(fortran), dtype, fp.tell()


def _check_npy_header(fp: Any, size: int, path: str, member: str) -> None:
    """Read an ``.npy`` header from ``fp`` and refuse what treepack will not read: an object
    dtype, or a shape and dtype declaring more bytes than the ``size`` bytes there are."""
    where = f"{path}: member {member!r}" if member else path
    try:
        shape, dtype = _npy_header(fp)
    except Exception as e:  # numpy's parser of hostile header text fails every which way
        what = ".npy member" if member else ".npy file"
        raise _errors.ForeignFileError(
            f"{where}: not a readable {what}: its header cannot be parsed ({type(e).__name__}: {e}); "
            "nothing was read") from None
    if dtype.hasobject:
        raise _errors.ForeignFileError(
            f"{where}: holds an array of Python objects ({dtype}), which needs pickle; treepack never unpickles "
            "(load it with numpy yourself if you trust it); nothing was read")
    count = 1
    for d in shape:
        count *= int(d)
    declared = count * dtype.itemsize
    data = size - fp.tell()
    if declared > data:
        what = ".npy member" if member else ".npy file"
        raise _errors.ForeignFileError(
            f"{where}: not a readable {what}: its header declares shape {tuple(shape)} of {dtype} ({declared} bytes), "
            f"but only {max(data, 0)} bytes of data follow: truncated or a hostile header; nothing was allocated")


def _write_numpy(src: str, dst: str, fmt: str, separator: Optional[str], overwrite: bool,
                 storage_options: StorageOptions, progress: Any = None,
                 select: Optional[List[str]] = None) -> Dict[str, int]:
    if os.path.exists(dst) and not overwrite:
        raise FileExistsError(f"{dst}: exists; pass overwrite=True to replace it")
    r = _core.Reader(src, _opts(storage_options))
    keep = r.convert_keep(select) if select else None
    leaves: List[Tuple[str, List[str]]] = []
    arrays: Set[str] = set()

    def walk(node: Any, names: List[str]) -> None:
        if isinstance(node, dict):
            items = node.items()
        elif isinstance(node, (list, tuple)):
            items = enumerate(node)
        elif hasattr(node, "children") and not hasattr(node, "nbytes"):
            # Records and custom nodes: their named children, less a mapping's attributes (a
            # state dict's `_metadata`, which no flat file holds: torch's own writers drop it).
            attrs = isinstance(node.data, dict) and node.data.get("attrs") is True
            items = [(k, v) for k, v in node.children.items() if not (attrs and k == "__dict__")]
        else:
            if keep is not None and node.path not in keep:
                return
            if node.kind == "ref" and node.target in arrays:
                # An array held at several places: its bytes again under each name (no links
                # in .npz; an array at n places costs n times its bytes, no more).
                leaves.append((node.target, names))
                return
            if node.kind == "ref":
                raise ValueError(f"`{node.path}`: holds the object at `{node.target or '<the root>'}` again; .{fmt} has "
                                 "no links and "
                                 "holds arrays only: leave one of the two places out (select)")
            if getattr(node, "kind", None) != "array":
                raise ValueError(f"`{node.path}`: a {node.kind} cannot be stored in .{fmt}, which holds arrays only; "
                                 "leave it out (select)")
            arrays.add(node.path)
            leaves.append((node.path, names))
            return
        for k, v in items:
            walk(v, names + [str(k)])

    walk(r.structure(_struct_node), [])

    def read(path: str) -> Any:  # one array in memory at a time, hashes checked
        return r.read_array(path, "", _codec.np_dtype)

    if fmt == "npy":
        if len(leaves) != 1:
            raise ValueError(f"{dst}: a .npy file holds one array and this tree has {len(leaves)}; use .npz")
        a = read(leaves[0][0])
        np.save(dst, a, allow_pickle=False)
        return {"tensors": 1, "bytes": int(a.nbytes)}
    tmp = dst + f"#{os.getpid()}"
    total = 0
    everything = sum(int(np.prod(r.array_info(path)[1], dtype=np.int64)) * _codec.np_dtype(r.array_info(path)[0]).itemsize
                     for path, _ in leaves)
    try:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
            names = set()
            for path, segs in leaves:
                # A nested tree needs its names joined somehow: "." where no separator is given.
                name = (separator or ".").join(segs)
                if name in names:
                    raise ValueError(f"`{path}`: another leaf gets the name {name!r}; convert with another separator")
                names.add(name)
                a = read(path)
                with z.open(name + ".npy", "w", force_zip64=True) as f:
                    np.lib.format.write_array(f, np.ascontiguousarray(a), allow_pickle=False)
                total += a.nbytes
                if progress is not None:
                    progress(total, everything)
        os.replace(tmp, dst)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return {"tensors": len(leaves), "bytes": int(total)}
