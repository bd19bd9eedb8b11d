"""The one mapping between treepack trees and hierarchies of groups (Zarr and HDF5), written
against a backend (``_hierarchy``: ``_Zarr``, ``_Hdf5``) so that neither library is named here.

Dicts (and lists, tuples) are groups, arrays are arrays (Zarr) or datasets (HDF5), and the other
leaves — None, bools, ints, floats, strings — are attributes of their group. What the mapping
needs to bring a tree back exactly (a list's or tuple's kind, key order, a dtype the target
lacks, bytes, None in HDF5, the tree's metadata) goes in one attribute named ``treepack``.
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


def write(b: Any, src: str, dst: str, fmt: str, overwrite: bool, storage_options: StorageOptions,
          progress: Any = None, select: Optional[List[str]] = None) -> Dict[str, int]:
    """Write the tree at ``src`` into a new store at ``dst`` through the backend ``b``."""
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


def refuse_url(src: str, fmt: str) -> None:
    """Zarr and HDF5 are read from local paths only (checked before the library is needed:
    refused even where it is not installed)."""
    if "://" in src:
        name = "Zarr" if fmt == "zarr" else "HDF5"
        raise ForeignFileError(f"{src}: {name} files are read from local paths only (not URLs, fsspec, N5 or "
                               "cloud stores); copy it to a local folder first")


def read_and_save(b: Any, src: str, dst: str, fmt: str, overwrite: bool, storage_options: StorageOptions,
                  select: Optional[List[str]] = None, **save_kwargs: Any) -> Dict[str, int]:
    """Read the store at ``src`` through the backend ``b`` and save it as a tree at ``dst``."""
    root = open_root(b, src)
    counts = {"tensors": 0, "bytes": 0}
    try:
        lazy = _registry.method("lazy_arrays")()  # (Dask's, when it is installed; else None)
        tree, notes = read_tree(b, root, counts, lazy)
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


def open_root(b: Any, src: str) -> Any:
    """The root group of the store at ``src``, opened through the backend ``b`` (its checks
    made): what ``read_tree`` reads, and ``b.close`` closes."""
    if not os.path.exists(src):
        raise FileNotFoundError(f"{src}: no such file or directory")
    try:
        return b.open(src)
    except TreepackError:
        raise
    except Exception as e:  # the libraries raise their own types for files that are not theirs
        raise ForeignFileError(f"{src}: not a readable {b.name} store: {e}") from None


def read_tree(b: Any, root: Any, counts: Dict[str, int], lazy: Any) -> Tuple[Any, Dict[str, Any]]:
    """The tree of the store whose root group is ``root`` and its root's notes; ``lazy`` (an
    object with ``array(a, chunks, view)``, or None) stands in for big arrays, which are then
    not read here. ``counts`` gets the arrays' count and declared bytes."""
    counts["limit"] = SPARSE_LIMIT * b.stored + (1 << 30)
    counts["stored"] = b.stored
    try:
        return _read_group(b, root, "", _Read(counts, lazy), 0)
    finally:
        del counts["limit"], counts["stored"]


def _convert_count(tree: Any) -> Dict[str, int]:
    return _count(tree)


MAX_DEPTH = 400
"""Groups nested deeper than this are refused (Python's recursion limit is not a message)."""


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
        if st.lazy is not None and a.ndim > 0 and (nbytes > BLOCK_BYTES or getattr(st.lazy, "every_array", False)):
            return st.lazy.array(a, b.chunks(a), view)
        data = np.asarray(a[...])
        return data.view(view) if view is not None else data
    except TreepackError:
        raise
    except Exception as e:  # noqa: BLE001 - damaged chunks: the library's own error types
        raise ForeignFileError(f"{b.src}: {b.label(path)} cannot be read: {type(e).__name__}: {e}") from None
