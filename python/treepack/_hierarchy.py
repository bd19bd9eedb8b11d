"""Zarr and HDF5 <-> treepack trees (docs/convert.md, "Zarr and HDF5").

Both are hierarchies of groups holding arrays and attributes, so one mapping serves both:
dicts (and lists, tuples) are groups, arrays are arrays (Zarr) or datasets (HDF5), and the other
leaves — None, bools, ints, floats, strings — are attributes of their group. What the mapping
needs to bring a tree back exactly (a list's or tuple's kind, key order, a dtype the target
lacks, bytes, None in HDF5, the tree's metadata) goes in one attribute named ``treepack``.
zarr-python writes Zarr v3 and reads v3 and v2; h5py reads and writes HDF5 (its calls stay on
the calling thread: the C library is not thread-safe). Each library is imported only when used,
and only here: this module holds the two backends and the store zarr-python reads through;
the mapping they serve is ``_hierarchy_map``, the checks of a Zarr store's files
``_zarr_checks``.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from . import _hierarchy_map
from ._api import StorageOptions
from ._core import TreepackError
from ._errors import ForeignFileError
from ._hierarchy_map import RESERVED
from ._zarr_checks import _check_zarr_store


class _Zarr:
    name = "Zarr"
    links = False
    """Zarr has no links: an object held at several places is written at each (an array whole, a
    group as an empty group), every place after the first noting the first (``same``)."""

    def __init__(self, zarr: Any) -> None:
        self.zarr = zarr

    # A LocalStore, not the path string: newer zarr-python reads strings as URLs.
    def create(self, path: str) -> Any:
        return self.zarr.open_group(store=self.zarr.storage.LocalStore(path), mode="w", zarr_format=3)

    def open(self, path: str) -> Any:
        """The root group, after every file of the store was checked (``_check_zarr_store``):
        read through a store that opens nothing through a link, with each node's own metadata
        (consolidated metadata, which could describe other keys, is not used)."""
        self.src = path
        self.stored, self.nodes = _check_zarr_store(path)
        store = _confined_store_class(self.zarr)(path)
        return self.zarr.open_group(store=store, mode="r", use_consolidated=False)

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

    def attrs(self, node: Any, path: str = "") -> Tuple[Dict[str, Any], Dict[str, Any]]:
        a = dict(node.attrs)
        notes = a.pop(RESERVED, None)
        return a, notes if isinstance(notes, dict) else {}

    def object_kind(self, a: Any) -> str:
        return "an array of Python objects (variable-length strings?)"

    def label(self, path: str) -> str:
        return f"Zarr array `{path}`"

    def members(self, g: Any, path: str) -> Iterator[Tuple[str, bool, Any]]:
        # The names come from the checked listing: the folders below this group's that hold a
        # node's metadata, in name order.
        for name in self.nodes.get(path, ()):
            where = f"{path}/{name}" if path else name
            try:
                obj = g[name]
            except TreepackError:
                raise
            except Exception as e:  # noqa: BLE001 - zarr-python raises many types for bad metadata
                raise ForeignFileError(f"{self.src}: Zarr node `{where}` cannot be opened: {type(e).__name__}: {e}; "
                                       "it is damaged or uses a feature zarr-python does not read") from None
            yield name, isinstance(obj, self.zarr.Group), obj

    def chunks(self, a: Any) -> Tuple[int, ...]:
        return tuple(a.chunks)

    def identity(self, obj: Any) -> Any:
        return None  # no links: every place is its own node

    def close(self, root: Any) -> None:
        pass


class _Hdf5:
    name = "HDF5"
    links = True
    """An object held at several places is written once; the other places are hard links to it."""

    def __init__(self, h5py: Any) -> None:
        self.h5py = h5py

    def create(self, path: str) -> Any:
        return self.h5py.File(path, "w", track_order=True)

    def open(self, path: str) -> Any:
        # The sec2 driver, named: one file, whatever the environment says (HDF5_DRIVER); the
        # family, multi and split drivers read other files.
        self.src = path
        self.stored = os.path.getsize(path)
        return self.h5py.File(path, "r", driver="sec2")

    def group(self, parent: Any, name: str) -> Any:
        return parent.create_group(name, track_order=True)

    def link(self, parent: Any, name: str, obj: Any) -> None:
        parent[name] = obj  # a hard link: the same group or dataset at a second place

    def identity(self, obj: Any) -> Any:
        """The object's address in the file: the same for every hard or soft link to it."""
        info = self.h5py.h5o.get_info(obj.id)
        return (info.fileno, info.addr)

    def cycle(self, where: str, first: str) -> ForeignFileError:
        return self._refuse(where, f"leads to the group `{first}` again, which holds it (a cycle of hard or soft "
                            "links)", "A tree cannot hold itself: remove the link")

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

    def attrs(self, node: Any, path: str = "") -> Tuple[Dict[str, Any], Dict[str, Any]]:
        out: Dict[str, Any] = {}
        notes: Dict[str, Any] = {}
        try:
            items = [(k, node.attrs[k]) for k in node.attrs]
        except Exception as e:  # noqa: BLE001 - h5py's errors for attributes it cannot read
            raise ForeignFileError(f"{getattr(self, 'src', '?')}: HDF5 attributes of `/{path}` cannot be read: "
                                   f"{type(e).__name__}: {e}") from None
        for k, v in items:
            if isinstance(v, (self.h5py.Reference, self.h5py.RegionReference)) or (
                    isinstance(v, np.ndarray) and v.dtype.hasobject
                    and any(isinstance(x, (self.h5py.Reference, self.h5py.RegionReference)) for x in v.flat)):
                raise ForeignFileError(f"{self.src}: HDF5 attribute `/{path}` {k!r} holds object or region references, "
                                       "which treepack does not follow; nothing was read through them. Delete the "
                                       "attribute or store what it points to")
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

    def members(self, g: Any, path: str) -> Iterator[Tuple[str, bool, Any]]:
        """The members of a group, each link checked before it is followed: hard links, and soft
        links whose target is reached through hard links inside this file; external links and
        user-defined links are refused by name. Datasets are checked (``_check_dataset``) before
        any of their data is read. An object reached a second time is read once (``identity``,
        in ``_read_member``): every place holds the same object, and a cycle is refused."""
        h5py = self.h5py
        for name in g:  # the names, from the link table: nothing followed yet
            where = f"{path}/{name}" if path else name
            try:
                obj = self._follow(g, name, where)
            except TreepackError:
                raise
            except Exception as e:  # noqa: BLE001 - h5py's errors for links and objects it cannot open
                raise ForeignFileError(f"{self.src}: HDF5 `/{where}` cannot be opened: {type(e).__name__}: {e}") from None
            if isinstance(obj, h5py.Group):
                yield name, True, obj
            elif isinstance(obj, h5py.Dataset):
                self._check_dataset(obj, where)
                yield name, False, obj

    def _follow(self, g: Any, name: str, where: str) -> Any:
        h5py = self.h5py
        link = g.get(name, getlink=True)
        if isinstance(link, h5py.HardLink):
            return g[name]
        if isinstance(link, h5py.SoftLink):
            return g.file[self._soft_target(g.file, g.name, link.path, where, 0)]
        if isinstance(link, h5py.ExternalLink):
            raise self._refuse(where, f"is an external link to {link.path!r} in the file {link.filename!r}",
                               "treepack reads one file and follows no link out of it: copy the linked "
                               "object into this file (h5py's Group.copy) if you trust the other file")
        raise self._refuse(where, f"is a link of a kind treepack does not follow ({type(link).__name__})",
                           "Copy the object it leads to into this file")

    def _soft_target(self, f: Any, base: str, target: str, where: str, hops: int) -> str:
        """The absolute path a soft link leads to, walked one link at a time from ``base`` (the
        group holding the link): every step a hard link, or a soft link resolved the same way;
        an external link on the way, a missing step or more than 16 soft links are refused."""
        h5py = self.h5py
        if hops >= 16:
            raise self._refuse(where, "is a soft link through more than 16 soft links (a loop?)", "Remove the loop")
        cur = "/" if target.startswith("/") else base
        for seg in target.split("/"):
            if seg in ("", "."):
                continue
            grp = f[cur]
            link = grp.get(seg, getlink=True) if isinstance(grp, h5py.Group) else None
            nxt = cur.rstrip("/") + "/" + seg
            if link is None:
                raise self._refuse(where, f"is a soft link to {target!r}, which does not exist in this file "
                                   f"(no `{nxt}`)", "Remove the link or make its target")
            if isinstance(link, h5py.SoftLink):
                nxt = self._soft_target(f, cur, link.path, where, hops + 1)
            elif isinstance(link, h5py.ExternalLink):
                raise self._refuse(where, f"is a soft link to {target!r}, which leads through the external link "
                                   f"`{nxt}` to the file {link.filename!r}",
                                   "treepack follows no link out of the file; copy the linked object into this file")
            elif not isinstance(link, h5py.HardLink):
                raise self._refuse(where, f"is a soft link through `{nxt}`, a link of a kind treepack does not "
                                   "follow", "Copy the object into this file")
            cur = nxt
        return cur

    def _check_dataset(self, a: Any, where: str) -> None:
        """Refuse, before any data is read, a dataset whose bytes are not in this file (external
        raw storage, a virtual dataset) or need a filter HDF5 does not have."""
        h5py = self.h5py
        dcpl = a.id.get_create_plist()
        if dcpl.get_layout() == h5py.h5d.VIRTUAL:
            n = dcpl.get_virtual_count()
            files = sorted({dcpl.get_virtual_filename(i) for i in range(min(n, 8))})
            raise self._refuse(where, f"is a virtual dataset (VDS) mapping {n} source(s) in {files}",
                               "treepack reads the data of this file only; materialize it in h5py "
                               "(f.create_dataset(name, data=vds[...])) if you trust its sources")
        if dcpl.get_external_count() > 0:
            name = dcpl.get_external(0)[0]
            raise self._refuse(where, f"stores its raw data in {dcpl.get_external_count()} external file(s), "
                               f"the first {os.fsdecode(name)!r}",
                               "treepack reads the data of this file only; copy the data into the file in "
                               "h5py if you trust those files")
        for i in range(dcpl.get_nfilters()):
            code, _flags, _values, fname = dcpl.get_filter(i)
            if not h5py.h5z.filter_avail(code):
                label = fname.decode(errors="replace") if isinstance(fname, bytes) else str(fname)
                raise self._refuse(where, f"is compressed with HDF5 filter {code}{f' ({label})' if label else ''}, which this HDF5 "
                                   "library does not have", "Install and import the plugin (e.g. "
                                   "`pip install hdf5plugin` and `import hdf5plugin`), or re-save it with "
                                   "gzip in h5py")

    def _refuse(self, where: str, what: str, todo: str) -> ForeignFileError:
        return ForeignFileError(f"{self.src}: HDF5 `/{where}` {what}: refused, nothing of it was read. {todo}")

    def label(self, path: str) -> str:
        return f"HDF5 dataset `/{path}`"

    def chunks(self, a: Any) -> Tuple[int, ...]:
        return tuple(a.chunks) if a.chunks else tuple(max(s, 1) for s in a.shape)

    def object_kind(self, a: Any) -> str:
        ref = self.h5py.check_dtype(ref=a.dtype)
        if ref is not None:
            return f"an array of HDF5 {'region' if ref is self.h5py.RegionReference else 'object'} references"
        if self.h5py.check_dtype(vlen=a.dtype) is not None:
            return "an array of variable-length values (strings or sequences)"
        return "an array of Python objects (variable-length strings, references or a compound of them)"

    def close(self, root: Any) -> None:
        root.close()


def backend(fmt: str) -> Any:
    """The backend of ``fmt``, its library imported now (each only when used)."""
    if fmt == "zarr":
        try:
            import zarr
        except ImportError:
            raise ImportError("Zarr conversion needs zarr-python 3 (pip install 'zarr>=3'; it needs Python 3.11+)") from None
        return _Zarr(zarr)
    try:
        import h5py
    except ImportError:
        raise ImportError("HDF5 conversion needs h5py (pip install h5py)") from None
    return _Hdf5(h5py)


def write(src: str, dst: str, fmt: str, overwrite: bool, storage_options: StorageOptions,
          progress: Any = None, select: Optional[List[str]] = None) -> Dict[str, int]:
    """Convert the tree at ``src`` into a Zarr store or HDF5 file at ``dst``."""
    return _hierarchy_map.write(backend(fmt), src, dst, fmt, overwrite, storage_options, progress, select)


def read_and_save(src: str, dst: str, fmt: str, overwrite: bool, storage_options: StorageOptions,
                  select: Optional[List[str]] = None, **save_kwargs: Any) -> Dict[str, int]:
    """Convert the Zarr store or HDF5 file at ``src`` into a tree at ``dst``."""
    _hierarchy_map.refuse_url(src, fmt)
    return _hierarchy_map.read_and_save(backend(fmt), src, dst, fmt, overwrite, storage_options, select, **save_kwargs)


def _confined_store_class(zarr: Any) -> Any:
    """A read-only ``LocalStore`` that opens every key one path segment at a time relative to
    the store's folder, never through a symbolic link (``O_NOFOLLOW``), and refuses keys with
    empty, ``.`` or ``..`` segments: the check of ``_check_zarr_store`` holds even if the folder
    changes while it is read, and no key zarr-python builds from metadata leaves the folder."""
    global _CONFINED
    if _CONFINED is not None:
        return _CONFINED
    import asyncio
    import errno
    import stat

    from zarr.storage import LocalStore

    nofollow = getattr(os, "O_NOFOLLOW", 0)
    cloexec = getattr(os, "O_CLOEXEC", 0)
    by_fd = os.open in os.supports_dir_fd and nofollow != 0

    class ConfinedStore(LocalStore):
        def __init__(self, root: Any, *, read_only: bool = True) -> None:
            super().__init__(root, read_only=True)

        def with_read_only(self, read_only: bool = False) -> Any:
            return type(self)(self.root)

        def _tp_refuse(self, key: str, what: str) -> ForeignFileError:
            return ForeignFileError(f"{self.root}: Zarr store key `{key}` {what}; nothing was read through it. A store is "
                                    "read without following links, which could lead out of it")

        def _tp_parts(self, key: str) -> List[str]:
            parts = key.split("/") if key else []
            if any(p in ("", ".", "..") or "\\" in p or "\0" in p for p in parts):
                raise self._tp_refuse(key, "has an empty, '.' or '..' segment")
            return parts

        def _tp_open(self, key: str, directory: bool = False) -> Optional[int]:
            """A file descriptor for ``key`` (a regular file, or a folder), or None if missing."""
            parts = self._tp_parts(key)
            if not by_fd:  # no openat: check each step with lstat, then open the path
                p = str(self.root)
                for i, seg in enumerate(parts):
                    p = os.path.join(p, seg)
                    try:
                        st = os.lstat(p)
                    except (FileNotFoundError, NotADirectoryError):
                        return None
                    if stat.S_ISLNK(st.st_mode):
                        raise self._tp_refuse(key, f"leads through the symbolic link `{'/'.join(parts[:i + 1])}`")
                try:
                    fd = os.open(p, os.O_RDONLY | getattr(os, "O_BINARY", 0))
                except (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError):
                    return None
                return self._tp_checked(fd, key, directory)
            dfd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | cloexec)
            try:
                for i, seg in enumerate(parts):
                    last = i == len(parts) - 1
                    flags = os.O_RDONLY | nofollow | cloexec
                    flags |= os.O_NONBLOCK if last and not directory else os.O_DIRECTORY
                    try:
                        fd = os.open(seg, flags, dir_fd=dfd)
                    except OSError as e:
                        try:
                            link = stat.S_ISLNK(os.stat(seg, dir_fd=dfd, follow_symlinks=False).st_mode)
                        except OSError:
                            link = False
                        if link or e.errno == errno.ELOOP:
                            raise self._tp_refuse(key, f"leads through the symbolic link `{'/'.join(parts[:i + 1])}`") from None
                        if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.EISDIR):
                            return None
                        raise
                    os.close(dfd)
                    dfd = fd
                fd, dfd = dfd, -1
            finally:
                if dfd >= 0:
                    os.close(dfd)
            return self._tp_checked(fd, key, directory)

        def _tp_checked(self, fd: int, key: str, directory: bool) -> Optional[int]:
            mode = os.fstat(fd).st_mode
            if stat.S_ISDIR(mode) if directory else stat.S_ISREG(mode):
                return fd
            os.close(fd)
            if stat.S_ISDIR(mode) or stat.S_ISREG(mode):
                return None
            raise self._tp_refuse(key, "is not a regular file (a FIFO, socket or device)")

        def _tp_read(self, key: str, prototype: Any, byte_range: Any) -> Any:
            from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest
            from zarr.core.buffer.core import default_buffer_prototype

            prototype = prototype or default_buffer_prototype()
            fd = self._tp_open(key)
            if fd is None:
                return None
            with os.fdopen(fd, "rb") as f:
                if byte_range is None:
                    return prototype.buffer.from_bytes(f.read())
                size = f.seek(0, os.SEEK_END)
                if isinstance(byte_range, RangeByteRequest):
                    f.seek(byte_range.start)
                    return prototype.buffer.from_bytes(f.read(max(0, byte_range.end - byte_range.start)))
                if isinstance(byte_range, OffsetByteRequest):
                    f.seek(byte_range.offset)
                elif isinstance(byte_range, SuffixByteRequest):
                    f.seek(max(0, size - byte_range.suffix))
                else:
                    raise TypeError(f"unexpected byte range {byte_range!r}")
                return prototype.buffer.from_bytes(f.read())

        def get_sync(self, key: str, *, prototype: Any = None, byte_range: Any = None) -> Any:
            return self._tp_read(key, prototype, byte_range)

        async def get(self, key: str, prototype: Any = None, byte_range: Any = None) -> Any:
            return await asyncio.to_thread(self._tp_read, key, prototype, byte_range)

        async def get_partial_values(self, prototype: Any, key_ranges: Any) -> List[Any]:
            return list(await asyncio.gather(*(self.get(k, prototype, r) for k, r in key_ranges)))

        async def exists(self, key: str) -> bool:
            fd = self._tp_open(key)
            if fd is None:
                return False
            os.close(fd)
            return True

        async def getsize(self, key: str) -> int:
            fd = self._tp_open(key)
            if fd is None:
                raise FileNotFoundError(key)
            try:
                return os.fstat(fd).st_size
            finally:
                os.close(fd)

        def _tp_names(self, prefix: str) -> List[Tuple[str, bool]]:
            fd = self._tp_open(prefix.strip("/"), directory=True)
            if fd is None:
                return []
            try:
                names = sorted(os.listdir(fd)) if by_fd else sorted(os.listdir(os.path.join(self.root, prefix)))
            finally:
                os.close(fd)
            out = []
            for n in names:
                sub = f"{prefix.strip('/')}/{n}" if prefix.strip("/") else n
                kid = self._tp_open(sub, directory=True)
                if kid is not None:
                    os.close(kid)
                out.append((n, kid is not None))
            return out

        async def list_dir(self, prefix: str) -> Any:
            for n, _ in self._tp_names(prefix):
                yield n

        async def list_prefix(self, prefix: str) -> Any:
            stack = [prefix.strip("/")]
            while stack:
                d = stack.pop()
                for n, is_dir in self._tp_names(d):
                    sub = f"{d}/{n}" if d else n
                    if is_dir:
                        stack.append(sub)
                    else:
                        yield sub

        async def list(self) -> Any:
            async for k in self.list_prefix(""):
                yield k

    _CONFINED = ConfinedStore
    return ConfinedStore


_CONFINED: Any = None
