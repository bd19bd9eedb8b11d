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
import dataclasses
import json
import math
import os
import shutil
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

import numpy as np

from . import _codec, _core, _like, _registry
from ._api import StorageOptions, _opts, _struct_node, load, save
from ._convert import _count, select_tree
from ._core import TreepackError
from ._errors import ForeignFileError

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
    links = False
    """Zarr has no links: an object held at several places is written at each (an array whole, a
    group as an empty group), every place after the first noting the first (``same``)."""

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

    def __init__(self) -> None:
        try:
            import h5py
        except ImportError:
            raise ImportError("HDF5 conversion needs h5py (pip install h5py)") from None
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


class _LeftOut:
    """An item of a list or tuple that ``select`` leaves out: ``None`` at its place, so the
    items kept keep their index."""

    kind = "none"

    def __init__(self, path: str) -> None:
        self.path = path


def _key_seg(key: Any) -> Optional[str]:
    """The key-path segment of a dict key (docs/format.md section 6); None for a key whose text
    is not written here (floats, tuples: no Zarr or HDF5 name anyway)."""
    if isinstance(key, str):
        return "~e" if not key else key.replace("~", "~0").replace("/", "~1").replace("*", "~2")
    if isinstance(key, bool):
        return "~true" if key else "~false"
    if isinstance(key, int):
        return f"~i{key}"
    return "~none" if key is None else None


def _join(path: str, seg: str) -> str:
    return f"{path}/{seg}" if path else seg


def _prune(node: Any, path: str, keep: Optional[Set[str]]) -> Any:
    """The structure with what a selection leaves out removed: ``keep`` holds the key paths of
    the nodes kept (``Reader.convert_keep``; None keeps everything). A dict or mapping loses
    the entries left out; an item left out of a list or tuple becomes ``_LeftOut``."""
    if keep is None:
        return node
    m = _mapping(node)
    if m is not None:
        out = {}
        for k, v in m.items():
            seg = _key_seg(k)
            if seg is None:
                out[k] = v  # kept as it is: its key is refused by _check_representable
            elif _join(path, seg) in keep:
                out[k] = _prune(v, _join(path, seg), keep)
        return out if isinstance(node, dict) else dataclasses.replace(node, children=out)
    if isinstance(node, (list, tuple)):
        items = []
        for i, v in enumerate(node):
            p = _join(path, str(i))
            items.append(_prune(v, p, keep) if p in keep else _LeftOut(p))
        return type(node)(items)
    return node


def _mask(node: Any, keep: Optional[Set[str]]) -> Any:
    """``like=`` for the leaves that become attributes (everything but arrays and refs), and
    only those ``keep`` keeps."""
    if _mapping(node) is not None:
        node = _mapping(node)
    if isinstance(node, dict):
        return {k: _mask(v, keep) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return type(node)(_mask(v, keep) for v in node)
    return getattr(node, "kind", None) not in ("array", "ref", None) and (keep is None or node.path in keep)


def _leaves(node: Any) -> Iterator[Any]:
    """The leaves of a structure (``LeafInfo``, records, ``_LeftOut``), in document order."""
    if _mapping(node) is not None:
        node = _mapping(node)
    if isinstance(node, dict):
        node = list(node.values())
    if isinstance(node, (list, tuple)):
        for v in node:
            yield from _leaves(v)
    else:
        yield node


def write(src: str, dst: str, fmt: str, overwrite: bool, storage_options: StorageOptions,
          progress: Any = None, select: Optional[List[str]] = None) -> Dict[str, int]:
    b = backend(fmt)
    if os.path.exists(dst) and not overwrite:
        raise FileExistsError(f"{dst}: exists; pass overwrite=True to replace it")
    if os.path.lexists(dst) and not _is_store_of(dst, fmt):
        # overwrite= replaces what an earlier convert wrote, never a folder or file of anything else.
        raise FileExistsError(
            f"{dst}: exists and is not a{' Zarr store' if fmt == 'zarr' else 'n HDF5 file'}; refusing to replace it "
            "(overwrite= replaces only what a convert wrote there): remove it yourself or pick another name")
    r = _core.Reader(src, _opts(storage_options))
    structure = r.structure(_struct_node)
    if not isinstance(structure, (dict, list, tuple)) and _mapping(structure) is None:
        raise ValueError(f"{src}: the tree is a single {getattr(structure, 'kind', 'value')}; "
                         f"{b.name} holds a group of arrays: save it in a dict")
    keep = r.convert_keep(list(select)) if select else None
    plan = _prune(structure, "", keep)
    _check_representable(plan, b.name)
    leaves = list(_leaves(plan))
    arrays = {x.path: x for x in leaves if getattr(x, "kind", None) == "array"}
    refs = [x for x in leaves if getattr(x, "kind", None) == "ref"]
    # An object held at several places: the first place writes it, the others link to it
    # (HDF5) or write it again (Zarr: an array whole, its bytes once more per place).
    total = sum(int(a.nbytes) for a in arrays.values())
    if not b.links:
        total += sum(int(arrays[x.target].nbytes) for x in refs if x.target in arrays)
    shared: Dict[str, Any] = {x.target or "": None for x in refs}
    values = load(src, like=_mask(structure, keep), storage_options=storage_options)
    tmp = dst.rstrip("/") + f".partial-{os.getpid()}"
    _remove(tmp)
    root = b.create(tmp)
    counts: Dict[str, Any] = {"tensors": 0, "bytes": 0, "total": total, "progress": progress}
    try:
        notes: Dict[str, Any] = {}
        md = r.metadata()
        if md is not None:
            notes["metadata"] = json.loads(md)
        _write_group(b, r, root, plan, values, notes, counts, "", "", shared)
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


def _is_store_of(p: str, fmt: str) -> bool:
    """Whether ``p`` (not a link) is a Zarr store or an HDF5 file, as ``fmt`` says."""
    if os.path.islink(p):
        return False
    if fmt == "zarr":
        return os.path.isdir(p) and any(os.path.isfile(os.path.join(p, m)) for m in ("zarr.json", ".zgroup", ".zarray"))
    try:
        with open(p, "rb") as f:
            return f.read(8) == b"\x89HDF\r\n\x1a\n"
    except OSError:
        return False


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
                         "convert its fields as a dict, or leave it out (select)")
    elif node.kind == "complex":
        raise ValueError(f"`{node.path}`: a complex number cannot be a {target} attribute; store it as an array, "
                         "or leave it out (select)")
    elif node.kind == "ref" and (not node.target or node.path.startswith(node.target + "/")):
        # A ref names an earlier place in document order (its target; None for the root): an
        # ancestor (a cycle) or a subtree before it. Groups hold their members; none can hold
        # itself.
        raise ValueError(f"`{node.path}`: holds `{node.target or '<the root>'}` again, an object it is inside of "
                         f"(a cycle); {target} cannot hold an object inside itself: break the cycle, or leave "
                         "this place out (select)")


def _write_group(b: Any, r: Any, g: Any, structure: Any, values: Any, notes: Dict[str, Any],
                 counts: Dict[str, int], path: str, where: str, shared: Dict[str, Any]) -> None:
    """Write ``structure`` (at key path ``path``) into the group ``g`` (at ``where`` in the
    store). ``shared``: the key paths of objects held at several places, each with
    (node written, its place in the store, its structure) once written."""
    mapping = _mapping(structure)
    if mapping is not None:
        items = [(k, _join(path, _key_seg(k) or ""), v) for k, v in mapping.items()]
        # A subtree with nothing but arrays below it is not built by the load (None).
        vals = [values[k] if values is not None else None for k, _, _ in items]
        notes = {**notes, "order": [k for k, _, _ in items]}
        if structure.__class__ is not dict and structure.type_name == "py.ordereddict":
            notes["kind"] = "ordereddict"
    else:
        items = [(str(i), _join(path, str(i)), v) for i, v in enumerate(structure)]
        vals = list(values) if values is not None else [None] * len(items)
        notes = {**notes, "kind": "tuple" if isinstance(structure, tuple) else "list"}
    attrs: Dict[str, Any] = {}
    for (name, p, st), v in zip(items, vals):
        w = _join(where, name)
        if isinstance(st, (dict, list, tuple)) or _mapping(st) is not None:
            obj = b.group(g, name)
            _write_group(b, r, obj, st, v, {}, counts, p, w, shared)
        elif st.kind == "array":
            obj = _write_array(b, r, g, name, st.path, counts)
        elif st.kind == "ref":
            _write_ref(b, r, g, name, st, shared, counts)
            continue
        elif st.kind == "bytes":
            a = b.array(g, name, (len(v),), np.uint8, None, False)
            a[...] = np.frombuffer(v, np.uint8)
            b.set_attrs(a, {}, {"kind": "bytes"})
            continue
        else:
            attrs[name] = None if isinstance(st, _LeftOut) else v
            continue
        if p in shared:
            shared[p] = (obj, w, st)
    b.set_attrs(g, attrs, notes)


def _write_ref(b: Any, r: Any, g: Any, name: str, st: Any, shared: Dict[str, Any], counts: Dict[str, int]) -> None:
    """A place holding an object written before (``st.target``, earlier in document order):
    an HDF5 hard link to it; in Zarr an array written again, or an empty group, noting the
    first place (``same``) so a reader gives back one object."""
    hit = shared.get(st.target or "")
    if hit is None:
        raise ValueError(f"`{st.path}`: holds the object at `{st.target}` again, which {b.name} did not write "
                         "before it; leave one of the two places out (select)")
    obj, first, target = hit
    if b.links:
        b.link(g, name, obj)
    elif getattr(target, "kind", None) == "array":
        _write_array(b, r, g, name, target.path, counts, same="/" + first)
    else:
        b.set_attrs(b.group(g, name), {}, {"same": "/" + first})


def _write_array(b: Any, r: Any, g: Any, name: str, path: str, counts: Dict[str, int],
                 same: Optional[str] = None) -> Any:
    dtype_json, shape = r.array_info(path)
    dtype = _codec.np_dtype(dtype_json)
    notes: Dict[str, Any] = {}
    target = dtype
    if dtype.kind == "V" and dtype.names is None and dtype.itemsize in _STAND_IN:
        notes["dtype"] = json.loads(dtype_json)  # bfloat16, float8_*: raw bits as uintN
        target = np.dtype(_STAND_IN[dtype.itemsize])
    if same is not None:
        notes["same"] = same
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
    return a


def _report(counts: Dict[str, Any], n: int) -> None:
    counts["bytes"] += n
    cb = counts["progress"]
    if cb is not None:
        cb(counts["bytes"], counts["total"])


# ---------------------------------------------------------------- Zarr / HDF5 -> treepack


def read_and_save(src: str, dst: str, fmt: str, overwrite: bool, storage_options: StorageOptions,
                  select: Optional[List[str]] = None, **save_kwargs: Any) -> Dict[str, int]:
    if "://" in src:  # (before the library is needed: refused even where it is not installed)
        name = "Zarr" if fmt == "zarr" else "HDF5"
        raise ForeignFileError(f"{src}: {name} files are read from local paths only (not URLs, fsspec, N5 or "
                               "cloud stores); copy it to a local folder first")
    b = backend(fmt)
    if not os.path.exists(src):
        raise FileNotFoundError(f"{src}: no such file or directory")
    try:
        root = b.open(src)
    except TreepackError:
        raise
    except Exception as e:  # the libraries raise their own types for files that are not theirs
        raise ForeignFileError(f"{src}: not a readable {b.name} store: {e}") from None
    counts = {"tensors": 0, "bytes": 0}
    try:
        lazy = _registry.method("lazy_arrays")()  # (Dask's, when it is installed; else None)
        counts["limit"] = SPARSE_LIMIT * b.stored + (1 << 30)
        counts["stored"] = b.stored
        tree, notes = _read_group(b, root, "", _Read(counts, lazy), 0)
        del counts["limit"], counts["stored"]
        if select:
            tree = select_tree(tree, select, src)
            counts = _convert_count(tree)
        kwargs = dict(save_kwargs)
        if "metadata" in notes and "metadata" not in kwargs:
            kwargs["metadata"] = notes["metadata"]
        if fmt == "hdf5" and lazy is not None:
            # Lazily read datasets are read by the saving tasks: on this thread only.
            with lazy.on_this_thread():
                save(tree, dst, overwrite=overwrite, storage_options=storage_options, **kwargs)
        else:
            save(tree, dst, overwrite=overwrite, storage_options=storage_options, **kwargs)
    finally:
        b.close(root)
    return counts


def _convert_count(tree: Any) -> Dict[str, int]:
    return _count(tree)


MAX_DEPTH = 400
"""Groups nested deeper than this are refused (Python's recursion limit is not a message)."""

MAX_METADATA = 64 << 20
"""A Zarr metadata file (``zarr.json``, ``.zarray``, ...) larger than this is refused."""

# Codecs a Zarr array may use: they decode bytes to bytes or fixed-size numbers. Object codecs
# (pickle, msgpack, JSON, categorize) and anything else are refused by name before a chunk is read.
_V2_CODECS = frozenset({"zlib", "gzip", "bz2", "lzma", "blosc", "zstd", "lz4", "shuffle", "delta",
                        "fixedscaleoffset", "quantize", "bitround", "packbits", "astype", "crc32",
                        "crc32c", "adler32", "fletcher32", "jenkins_lookup3"})
_V3_CODECS = frozenset({"bytes", "endian", "transpose", "gzip", "zstd", "blosc", "crc32c", "sharding_indexed",
                        # variable-length strings: decoded without pickle, then refused as object arrays
                        "vlen-utf8", "vlen-bytes"}) | {f"numcodecs.{c}" for c in _V2_CODECS}
_NODE_FILES = ("zarr.json", ".zarray", ".zgroup")


def _check_zarr_store(root: str) -> Tuple[int, Dict[str, List[str]]]:
    """Walk a Zarr folder without following links and check every entry before zarr-python
    reads any: a symbolic link anywhere (to a chunk, a metadata file or a folder) and anything
    but folders and regular files (FIFOs, devices, sockets) are refused, naming the entry; every
    array's metadata is checked (``_check_zarr_metadata``). Returns the bytes stored and, for
    each folder (``""`` the root), the names of its sub-folders that hold a node's metadata."""
    if not os.path.isdir(root):
        raise ForeignFileError(f"{root}: not a readable Zarr store: not a folder (Zarr zip stores are not read; "
                               "unzip it first)")
    stored = 0
    nodes: Dict[str, List[str]] = {}
    stack = [""]
    while stack:
        rel = stack.pop()
        here = os.path.join(root, rel) if rel else root
        kids = []
        with os.scandir(here) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            sub = f"{rel}/{e.name}" if rel else e.name
            if e.is_symlink():
                try:
                    to = os.readlink(e.path)
                except OSError:
                    to = "?"
                raise ForeignFileError(
                    f"{root}: Zarr store entry `{sub}` is a symbolic link (to {to!r}); nothing was read: a store is "
                    "read without following links, which could lead out of it. Replace the link by a copy of "
                    "what it points to (cp -L) if you trust it")
            if e.is_dir(follow_symlinks=False):
                stack.append(sub)
                if any(os.path.isfile(os.path.join(e.path, m)) and not os.path.islink(os.path.join(e.path, m))
                       for m in _NODE_FILES):
                    kids.append(e.name)
            elif e.is_file(follow_symlinks=False):
                st = e.stat(follow_symlinks=False)
                stored += st.st_size
                if e.name in ("zarr.json", ".zarray"):
                    _check_zarr_metadata(root, sub, st.st_size)
            else:
                raise ForeignFileError(f"{root}: Zarr store entry `{sub}` is not a regular file or folder (a FIFO, "
                                       "socket or device); nothing was read. Remove it")
        nodes[rel] = kids
    return stored, nodes


def _check_zarr_metadata(root: str, rel: str, size: int) -> None:
    """Refuse an array whose chunks would be decoded into Python objects (an object dtype:
    pickle, msgpack, JSON codecs) or through a codec not known to be safe, naming the array."""
    array = rel.rpartition("/")[0] or "<root>"

    def refuse(what: str, todo: str) -> ForeignFileError:
        return ForeignFileError(f"{root}: Zarr array `{array}` ({rel}) {what}; none of its chunks was read. {todo}")

    if size > MAX_METADATA:
        raise refuse(f"has a metadata file of {size} bytes (more than {MAX_METADATA})", "Check where it came from")
    try:
        with open(os.path.join(root, rel), "rb") as f:
            doc = json.loads(f.read(MAX_METADATA + 1))
    except (ValueError, RecursionError) as e:
        raise ForeignFileError(f"{root}: not a readable Zarr store: `{rel}` is not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ForeignFileError(f"{root}: not a readable Zarr store: `{rel}` is not a JSON object")
    if rel.endswith(".zarray"):
        dtype = doc.get("dtype")
        if _v2_dtype_has_object(dtype):
            codec = (doc.get("filters") or [{}])[0] if isinstance(doc.get("filters"), list) else {}
            cid = codec.get("id") if isinstance(codec, dict) else None
            raise refuse(f"has the object dtype {json.dumps(dtype)[:200]}, whose chunks are Python objects encoded by "
                         f"the {cid or 'object'!r} codec (pickle-like)",
                         "treepack never decodes Python objects from a file; convert the array to a fixed-size "
                         "dtype with zarr-python if you trust the file")
        codecs = [doc.get("compressor")] + (doc.get("filters") or [] if isinstance(doc.get("filters"), list) else [])
        for c in codecs:
            if c is None:
                continue
            cid = c.get("id") if isinstance(c, dict) else None
            if cid not in _V2_CODECS:
                raise refuse(f"uses the codec {json.dumps(cid if cid is not None else c)[:100]}, which treepack does "
                             "not decode", f"treepack reads Zarr v2 arrays with {', '.join(sorted(_V2_CODECS))}; "
                             "re-encode it with zarr-python if you trust the file")
        return
    if doc.get("node_type") != "array":
        return
    if doc.get("storage_transformers"):
        raise refuse("uses storage transformers", "treepack reads arrays stored as plain chunks only")

    def check(codecs: Any) -> None:
        for c in codecs if isinstance(codecs, list) else []:
            name = c.get("name") if isinstance(c, dict) else c
            if name not in _V3_CODECS:
                raise refuse(f"uses the codec {json.dumps(name)[:100]}, which treepack does not decode",
                             f"treepack reads Zarr v3 arrays with {', '.join(sorted(_V3_CODECS))}; re-encode it "
                             "with zarr-python if you trust the file")
            cfg = c.get("configuration") if isinstance(c, dict) else None
            if name == "sharding_indexed" and isinstance(cfg, dict):
                check(cfg.get("codecs"))
                check(cfg.get("index_codecs"))

    check(doc.get("codecs"))


def _v2_dtype_has_object(spec: Any) -> bool:
    """Whether a Zarr v2 dtype (a numpy type string, or a list of fields) holds Python objects."""
    if isinstance(spec, str):
        return "O" in spec.lstrip("<>|=")[:1]
    if isinstance(spec, list):
        return any(isinstance(f, list) and len(f) >= 2 and _v2_dtype_has_object(f[1]) for f in spec)
    return False


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


class _Read:
    """What one read of a Zarr or HDF5 store keeps: the byte counts, what makes big arrays lazy
    (the Dask integration's ``lazy_arrays``; None: read whole), the objects read by their
    identity in the file (HDF5: every link to a group or dataset leads to one object), and every
    place read (for Zarr's ``same`` notes)."""

    _OPEN = object()

    def __init__(self, counts: Dict[str, int], lazy: Any) -> None:
        self.counts = counts
        self.lazy = lazy
        self.objects: Dict[Any, Tuple[str, Any]] = {}
        self.places: Dict[str, Any] = {}


def _doc_order(members: Iterator[Tuple[str, bool, Any]], notes: Dict[str, Any]) -> Iterator[Tuple[str, bool, Any]]:
    """A group's members in the order the writer wrote them (a list's by index, a dict's by its
    ``order`` note): an object held at several places is read first at its first place. Other
    groups' members as the library lists them, each followed as it is reached."""
    if notes.get("kind") in ("list", "tuple"):
        return iter(sorted(members, key=lambda m: int(m[0]) if m[0].isascii() and m[0].isdigit() else math.inf))
    order = notes.get("order")
    if isinstance(order, list):
        pos = {str(n): i for i, n in enumerate(order)}
        return iter(sorted(members, key=lambda m: pos.get(m[0], len(pos))))
    return members


def _read_member(b: Any, obj: Any, is_group: bool, where: str, st: _Read, depth: int) -> Any:
    """The value at ``where``: a group or array read once however many links lead to it (a
    link to a group being read, one that holds it, is a cycle: refused)."""
    key = b.identity(obj)
    if key is not None:
        hit = st.objects.get(key)
        if hit is not None:
            first, value = hit
            if value is _Read._OPEN:
                raise b.cycle(where, first)
            st.places[f"/{where}"] = value
            return value
        st.objects[key] = (f"/{where}", _Read._OPEN)
    value = _read_group(b, obj, where, st, depth)[0] if is_group else _read_array(b, obj, where, st)
    if key is not None:
        st.objects[key] = (f"/{where}", value)
    st.places[f"/{where}"] = value
    return value


def _same(b: Any, where: str, notes: Dict[str, Any], st: _Read, group: bool) -> Any:
    """The object a Zarr place written as a second place of a shared object names (its
    ``same`` note): read before it, at its first place."""
    first = notes["same"]
    value = st.places.get(first) if isinstance(first, str) else None
    what = "group" if group else "array"
    if value is None:
        raise ForeignFileError(f"{b.src}: {b.name} {what} `{where}` says it is the object at {first!r} (its "
                               f"`{RESERVED}` attribute), which was not read before it: a damaged or edited store; "
                               f"nothing was read through it. Remove the attribute's \"same\" entry")
    if group != isinstance(value, (dict, list, tuple)) or not (group or hasattr(value, "shape")):
        raise ForeignFileError(f"{b.src}: {b.name} {what} `{where}` says it is the object at {first!r}, which is not "
                               f"a{'' if group else 'n'} {what}: a damaged or edited store; nothing was read through it")
    return value


def _read_group(b: Any, g: Any, path: str, st: _Read, depth: int) -> Tuple[Any, Dict[str, Any]]:
    if depth > MAX_DEPTH:
        raise ForeignFileError(f"{b.src}: {b.name} group `{path}` is nested {depth} levels deep, more than treepack "
                               f"reads ({MAX_DEPTH})")
    attrs, notes = b.attrs(g, path)
    members = _doc_order(b.members(g, path), notes)
    if "same" in notes:
        if next(members, None) is not None or attrs:
            raise ForeignFileError(f"{b.src}: {b.name} group `{path}` says it is the object at {notes['same']!r} (its "
                                   f"`{RESERVED}` attribute) but holds members or attributes of its own: a damaged or "
                                   "edited store; nothing of it was read")
        return _same(b, path, notes, st, True), notes
    kids: Dict[str, Any] = {}
    for name, is_group, obj in members:
        where = f"{path}/{name}" if path else name
        kids[name] = _read_member(b, obj, is_group, where, st, depth + 1)
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


def _read_array(b: Any, a: Any, path: str, st: _Read) -> Any:
    _, notes = b.attrs(a, path)
    dtype = np.dtype(a.dtype)
    if dtype.hasobject or dtype.kind == "T":  # object arrays, numpy 2's variable-width StringDType
        raise ForeignFileError(f"{b.src}: {b.label(path)}: {b.object_kind(a)} has no fixed dtype; treepack "
                               "stores fixed-size dtypes (convert it to fixed-width strings or numbers first)")
    if "same" in notes:
        value = _same(b, path, notes, st, False)
        view = _codec.np_dtype(json.dumps(notes["dtype"])) if "dtype" in notes else dtype
        if tuple(value.shape) != tuple(a.shape) or np.dtype(value.dtype) != view:
            raise ForeignFileError(f"{b.src}: {b.label(path)} says it is the array at {notes['same']!r}, but that one "
                                   f"is {value.dtype} {tuple(value.shape)} and this one {view} {tuple(a.shape)}: an "
                                   "edited store; nothing of it was read. Remove its \"same\" note to read it as "
                                   "its own array")
        return value
    counts = st.counts
    counts["tensors"] += 1
    nbytes = math.prod(int(d) for d in a.shape) * dtype.itemsize
    counts["bytes"] += nbytes
    if counts["bytes"] > counts.get("limit", counts["bytes"]):
        raise ForeignFileError(f"{b.src}: {b.label(path)}: the arrays up to here declare {counts['bytes']} "
                               f"bytes but the whole store holds {counts['stored']}: a sparse array of fill values or "
                               f"a damaged shape; nothing was read. Read the parts you need with {b.name}'s library "
                               "yourself")
    try:
        if notes.get("kind") == "bytes":
            return np.asarray(a[...], np.uint8).tobytes()
        view = _codec.np_dtype(json.dumps(notes["dtype"])) if "dtype" in notes else None
        if st.lazy is not None and nbytes > BLOCK_BYTES and a.ndim > 0:
            return st.lazy.array(a, b.chunks(a), view)
        data = np.asarray(a[...])
        return data.view(view) if view is not None else data
    except TreepackError:
        raise
    except Exception as e:  # noqa: BLE001 - damaged chunks: the library's own error types
        raise ForeignFileError(f"{b.src}: {b.label(path)} cannot be read: {type(e).__name__}: {e}") from None
