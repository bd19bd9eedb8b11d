"""Orbax checkpoints and JAX ``pytree_serialization`` checkpoints read as trees, without Orbax's
or JAX's code (issue 54; docs/convert.md, "Orbax and JAX checkpoints").

Both keep a tree's structure in JSON files and its arrays as Zarr arrays, most often inside one
OCDBT key-value store (``manifest.ocdbt`` and ``d/``). The structure is read here with the json
module (an older Orbax checkpoint's aggregated ``checkpoint`` file with msgpack, under limits);
the arrays through TensorStore, the library both write them with. Nothing a checkpoint names is
imported or called: a JAX custom pytree node becomes a plain dict where its field names are in
the file, and any other is refused, naming it and its key path (or, with
``on_missing="placeholder"``, an ``Unloadable`` holding its children), as treepack's own trees do.

A checkpoint's folder is the only place read. It is walked first without following links (a
link, FIFO or device anywhere in it is refused); the JSON files are opened one path segment at a
time with ``O_NOFOLLOW``; an array's name must be one path segment, and TensorStore's file store
refuses keys with ``..`` (OCDBT's data file paths are such keys); after the arrays are read the
folder is walked again and a change (a link swapped in meanwhile) is refused.
"""

from __future__ import annotations

import base64
import binascii
import collections
import contextlib
import errno
import json
import os
import re
import stat
import sys
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

from . import _core, _registry
from ._errors import ForeignFileError
from ._foreign_jax_bytes import MAX_DEPTH as _MAX_DEPTH, Flat, unchunk, unpack

Path = Tuple[Any, ...]  # a place in the tree: dict keys (str) and list/tuple indices (int)

_MAX_ENTRIES = 1_000_000  # files and folders in one checkpoint folder
_MAX_FOLDER_DEPTH = 32
_MAX_JSON = 1 << 30  # bytes of one metadata file
# Arrays may declare more bytes than are stored (JAX omits chunks equal to the fill value; zstd's
# RLE blocks expand about 32 768:1), but not without bound: a hostile shape would be allocated.
_FILL_RATIO = 1 << 16
_FILL_SLACK = 1 << 30
_READ_BATCH = 1 << 30  # bytes read from TensorStore at once

_JAX_REPR, _JAX_IDS = "__jax_pytreedef_repr", "__jax_leaf_ids"
_ARRAY_DESC = re.compile(r"Array\(([a-zA-Z0-9_]+)\[([0-9, ]*)\]\)")
_ORBAX_KINDS = {"jax.Array": "jax", "np.ndarray": "np", "scalar": "scalar"}
# Orbax's empty values, as Orbax restores them from its default metadata (an empty namedtuple: None).
_EMPTY: Dict[str, Callable[[], Any]] = {"Dict": dict, "List": list, "Tuple": tuple, "NamedTuple": lambda: None,
                                        "None": lambda: None}
_PLACEHOLDER = "PLACEHOLDER://"  # an older Orbax aggregated file's stand-in for a stored array
_TMP = ".orbax-checkpoint-tmp"  # an unfinished Orbax save


@contextlib.contextmanager
def _deep() -> Iterator[None]:
    """Room for trees nested up to ``_MAX_DEPTH``: walked recursively, a level may take two
    frames (a function and its comprehension, before Python 3.12), under whatever stack the
    caller already has."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 4 * _MAX_DEPTH + 1000))
    try:
        yield
    finally:
        sys.setrecursionlimit(limit)


def _tensorstore() -> Any:
    try:
        import tensorstore
    except ImportError:
        raise ImportError(
            "reading Orbax and JAX checkpoints needs TensorStore, which they store their arrays with: "
            "pip install tensorstore (orbax-checkpoint brings it)"
        ) from None
    return tensorstore


def _keypath(path: Path) -> str:
    """``path`` as a treepack key path (docs/format.md section 6), for messages and structures."""
    from ._convert import _seg

    return "/".join(_seg(k) if isinstance(k, str) else str(k) for k in path)


def _where(path: Path) -> str:
    return f"`{_keypath(path)}`" if path else "the root"


class _Array:
    """An array of the checkpoint, in the tree until it is read: its store and name, what it was
    when saved (``kind``: ``jax`` a jax.Array, ``np`` a numpy array, ``scalar`` a Python number),
    and, once opened, its shape and dtype."""

    __slots__ = ("store", "name", "kind", "path", "declared", "shape", "dtype", "handle")

    def __init__(self, store: "_Store", name: str, kind: str, path: Path,
                 declared: Optional[Tuple[str, Tuple[int, ...]]] = None) -> None:
        self.store, self.name, self.kind, self.path, self.declared = store, name, kind, path, declared
        self.shape: Tuple[int, ...] = ()
        self.dtype: np.dtype = np.dtype("uint8")
        self.handle: Any = None

    @property
    def nbytes(self) -> int:
        n = self.dtype.itemsize
        for d in self.shape:
            n *= d
        return n


class _Custom:
    """A node only its own code builds: its name, auxiliary bytes and why it is not read."""

    __slots__ = ("type_name", "aux", "reason")

    def __init__(self, type_name: str, aux: bytes, reason: str) -> None:
        self.type_name, self.aux, self.reason = type_name, aux, reason


class _Folder:
    """The checkpoint's folder, walked without following links: every entry's kind, and the
    bytes its files hold."""

    def __init__(self, root: str, where: str) -> None:
        self.root, self.where = os.path.abspath(root), where
        # A file of its own (flax.serialization's msgpack, `model.msgpack`): read as the one
        # aggregated `checkpoint` file of an older Orbax checkpoint, and nothing beside it.
        self.single = stat.S_ISREG(os.lstat(self.root).st_mode) if os.path.lexists(self.root) else False
        if os.path.islink(self.root) and os.path.isfile(self.root):
            raise self.refuse(f"is a symbolic link (to `{os.readlink(self.root)}`): a checkpoint file is read only "
                              "where it is, no link is followed; pass the file it names")
        self.snapshot, self.bytes = self._walk()

    def refuse(self, what: str) -> ForeignFileError:
        if self.single:
            # (the reasons name the aggregated file of a folder; here that is the file itself)
            what = what.replace("`checkpoint`: ", "").replace("`checkpoint`", "it")
        return ForeignFileError(f"{self.where}: {what}")

    def _walk(self) -> Tuple[Dict[str, Tuple[str, int, int]], int]:
        if self.single:
            try:
                st = os.lstat(self.root)
            except OSError as e:
                raise self.refuse(f"cannot be read: {e.strerror}") from None
            if not stat.S_ISREG(st.st_mode):
                raise self.refuse("is no longer a regular file")
            return {"checkpoint": ("f", st.st_dev, st.st_ino)}, st.st_size
        snap: Dict[str, Tuple[str, int, int]] = {}
        total = 0
        stack = [("", 0)]
        while stack:
            rel, depth = stack.pop()
            try:
                with os.scandir(os.path.join(self.root, rel) if rel else self.root) as it:
                    entries = list(it)
            except OSError as e:
                raise self.refuse(f"`{rel or '.'}` cannot be listed: {e.strerror}") from None
            for e in entries:
                r = f"{rel}/{e.name}" if rel else e.name
                st = e.stat(follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    try:
                        target = os.readlink(e.path)
                    except OSError:
                        target = "?"
                    raise self.refuse(
                        f"`{r}` is a symbolic link (to `{target}`): a checkpoint is read from its own folder only, no link "
                        "in it is followed; replace the link by a copy (cp -L) if you trust it")
                if stat.S_ISDIR(st.st_mode):
                    if depth + 1 > _MAX_FOLDER_DEPTH:
                        raise self.refuse(f"`{r}`: folders nested more than {_MAX_FOLDER_DEPTH} deep")
                    stack.append((r, depth + 1))
                    kind = "d"
                elif stat.S_ISREG(st.st_mode):
                    total += st.st_size
                    kind = "f"
                else:
                    raise self.refuse(f"`{r}` is not a regular file or folder (a FIFO, socket or device); nothing was read")
                snap[r] = (kind, st.st_dev, st.st_ino)
                if len(snap) > _MAX_ENTRIES:
                    raise self.refuse(f"holds more than {_MAX_ENTRIES} files and folders")
        return snap, total

    def unchanged(self) -> None:
        """Refuse a folder whose entries changed since it was walked (a link swapped in while
        TensorStore read it: it opens the files itself)."""
        if self._walk()[0] != self.snapshot:
            raise self.refuse("changed while it was read (files replaced, added or removed); read it again when no one "
                              "writes to it")

    def kind(self, rel: str) -> Optional[str]:
        return self.snapshot.get(rel, (None,))[0]

    def children(self, rel: str) -> List[str]:
        pre = f"{rel}/" if rel else ""
        return sorted(r[len(pre):] for r in self.snapshot if r.startswith(pre) and "/" not in r[len(pre):])

    def _open_in(self, rel: str) -> int:
        """A descriptor of the file ``rel``, opened one segment at a time with ``O_NOFOLLOW``."""
        parts = rel.split("/")
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for part in parts[:-1]:
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                os.close(fd)
                fd = nxt
            return os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                raise self.refuse(f"`{rel}` passes a symbolic link; no link in a checkpoint is followed") from None
            raise self.refuse(f"`{rel}` cannot be opened: {e.strerror}") from None
        finally:
            os.close(fd)

    def read(self, rel: str, limit: int = _MAX_JSON) -> bytes:
        """The bytes of the file ``rel``, opened one segment at a time with ``O_NOFOLLOW``."""
        if self.single:
            if rel != "checkpoint":
                raise self.refuse(f"`{rel}`: a msgpack file holds no other file")
            try:
                f = os.open(self.root, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError as e:
                raise self.refuse(f"cannot be opened: {e.strerror}") from None
        else:
            f = self._open_in(rel)
        with os.fdopen(f, "rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise self.refuse(f"`{rel}` is not a regular file")
            if st.st_size > limit:
                raise self.refuse(f"`{rel}` holds {st.st_size} bytes, more than the {limit} a metadata file may")
            try:
                data = fh.read(st.st_size + 1)  # (a buffer of what is there, not of the limit)
            except MemoryError:
                raise self.refuse(f"`{rel}` holds {st.st_size} bytes, more than this process can read into "
                                  "memory (the format is read whole)") from None
            if len(data) > limit:
                raise self.refuse(f"`{rel}` grew past the {limit} bytes a metadata file may hold while it was read")
            return data

    def json(self, rel: str) -> Any:
        try:
            return json.loads(self.read(rel))
        except RecursionError:
            raise self.refuse(f"`{rel}`: JSON nested too deep to read") from None
        except (ValueError, UnicodeDecodeError) as e:
            raise self.refuse(f"`{rel}` is not valid JSON: {e}") from None


def _segment(name: Any, what: str, folder: _Folder) -> str:
    """``name``, checked to be one path segment: an array's name becomes a key of a store, or a
    folder of the checkpoint."""
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise folder.refuse(f"{what} {name!r} is not one path segment (`..`, `/` and absolute paths are refused: a "
                            "checkpoint is read from its own folder only)")
    return name


class _Store:
    """The Zarr arrays of one item: keys of its OCDBT store, or a folder each."""

    def __init__(self, ck: "_Checkpoint", rel: str, ocdbt: bool, fill_missing: bool) -> None:
        self.ck, self.rel, self.ocdbt, self.fill_missing = ck, rel, ocdbt, fill_missing
        self.base = os.path.join(ck.folder.root, rel) if rel else ck.folder.root
        self._drivers: Optional[Dict[str, str]] = None

    def drivers(self) -> Dict[str, str]:
        """Each array's name and its Zarr driver (``zarr``: a ``.zarray``; ``zarr3``: a ``zarr.json``)."""
        if self._drivers is None:
            out: Dict[str, str] = {}
            if self.ocdbt:
                ts = self.ck.ts
                try:
                    kv = ts.KvStore.open({"driver": "ocdbt", "base": {"driver": "file", "path": self.base + "/"}},
                                         context=self.ck.context).result()
                    keys = [k.decode("utf-8", "replace") for k in kv.list().result()]
                except Exception as e:  # TensorStore's errors for a damaged store are ValueErrors and more
                    raise self.ck.folder.refuse(f"`{self.rel or '.'}`: not a readable OCDBT store: {e}") from None
            else:
                pre = f"{self.rel}/" if self.rel else ""
                keys = [r[len(pre):] for r, v in self.ck.folder.snapshot.items() if r.startswith(pre) and v[0] == "f"]
            for k in keys:
                name, _, rest = k.rpartition("/")
                if name and "/" not in name and rest in (".zarray", "zarr.json"):
                    out[name] = "zarr" if rest == ".zarray" else "zarr3"
            self._drivers = out
        return self._drivers

    def spec(self, a: _Array) -> Dict[str, Any]:
        driver = self.drivers().get(a.name)
        if driver is None:
            raise self.ck.folder.refuse(f"{_where(a.path)}: its array `{a.name}` is not in the checkpoint "
                                        f"(`{self.rel or '.'}`)")
        if self.ocdbt:
            kv = {"driver": "ocdbt", "base": {"driver": "file", "path": self.base + "/"}, "path": a.name + "/"}
        else:
            kv = {"driver": "file", "path": os.path.join(self.base, a.name) + "/"}
        return {"driver": driver, "kvstore": kv, "recheck_cached_data": False, "recheck_cached_metadata": False,
                "fill_missing_data_reads": self.fill_missing}


class _Checkpoint:
    """One checkpoint's tree, read from its metadata: containers, values, ``_Array`` stand-ins
    (opened: shape and dtype known, nothing read), and at each custom node the list of its
    children, the node itself in ``customs`` by its place."""

    def __init__(self, path: str, fmt: str) -> None:
        self.path, self.fmt = path, fmt
        self.ts = _tensorstore()
        self.context = self.ts.Context({"cache_pool": {"total_bytes_limit": 64 << 20}})
        self.folder = _Folder(path, path)
        self.arrays: List[_Array] = []
        self.customs: Dict[Path, _Custom] = {}
        self._nodes = 0
        self.tree = self._jax() if fmt == "jax" else self._orbax_dir("", (), 0)
        self._open()

    def refuse(self, what: str) -> ForeignFileError:
        return self.folder.refuse(what)

    def _custom(self, path: Path, type_name: str, aux: bytes, reason: str, children: List[Any]) -> List[Any]:
        self.customs[path] = _Custom(type_name, aux, reason)
        return children

    def _array(self, store: _Store, name: str, kind: str, path: Path,
               declared: Optional[Tuple[str, Tuple[int, ...]]] = None) -> _Array:
        a = _Array(store, _segment(name, f"{_where(path)}: the array name", self.folder), kind, path, declared)
        self.arrays.append(a)
        return a

    def _depth(self, path: Path) -> None:
        if len(path) > _MAX_DEPTH:
            raise self.refuse(f"{_where(path[:8])}…: nested more than {_MAX_DEPTH} deep")

    # ---------------------------------------------------------------- JAX pytree_serialization

    def _jax(self) -> Any:
        meta = self.folder.json("pytreedef.json")
        if not (isinstance(meta, dict) and isinstance(meta.get(_JAX_REPR), str) and isinstance(meta.get(_JAX_IDS), list)):
            raise self.refuse(f"`pytreedef.json` is not JAX's pytree description (a JSON object with {_JAX_REPR} and "
                              f"{_JAX_IDS})")
        try:
            buf = base64.b64decode(meta[_JAX_REPR], validate=True)
        except (ValueError, binascii.Error) as e:
            raise self.refuse(f"`pytreedef.json`: {_JAX_REPR} is not base64: {e}") from None
        ids = meta[_JAX_IDS]
        fb = Flat(buf, self.folder.refuse)
        store = _Store(self, "array_store", ocdbt=True, fill_missing=True)  # JAX omits chunks of fill values
        leaves = [0]
        tree = self._jax_node(fb, fb.root(), (), ids, leaves, store)
        if leaves[0] != len(ids):
            raise self.refuse(f"`pytreedef.json`: the tree has {leaves[0]} leaves and {_JAX_IDS} describes {len(ids)}")
        return tree

    def _jax_node(self, fb: Flat, t: Tuple[int, int, int], path: Path, ids: List[Any], leaves: List[int],
                  store: _Store) -> Any:
        self._depth(path)
        self._nodes += 1
        if self._nodes > len(fb.b) // 4 + 1:  # every node is a table of its own, unless subtables are shared
            raise self.refuse("`pytreedef.json`: its tree description reaches more nodes than it holds (shared "
                              "subtables: a hostile file)")
        kind = fb.int8(t, 0)
        kids = fb.tables(t, 1)
        if kind == 0:  # a leaf: an array, or None
            if kids:
                raise self.refuse(f"`pytreedef.json`: the leaf at {_where(path)} has children")
            i = leaves[0]
            leaves[0] += 1
            if i >= len(ids):
                raise self.refuse(f"`pytreedef.json`: more leaves than the {len(ids)} {_JAX_IDS} describes")
            desc = ids[i]
            if desc is None:
                return None
            m = _ARRAY_DESC.fullmatch(desc) if isinstance(desc, str) else None
            if m is None:
                raise self.refuse(f"`pytreedef.json`: leaf {i} (at {_where(path)}) is {str(desc)[:100]!r}, not an array "
                                  "or null")
            shape = tuple(int(x) for x in m.group(2).split(",") if x.strip())
            return self._array(store, str(i), "jax", path, (m.group(1), shape))
        if kind == 1:
            return None
        if kind in (2, 3):
            out = [self._jax_node(fb, k, path + (i,), ids, leaves, store) for i, k in enumerate(kids)]
            return tuple(out) if kind == 2 else out
        if kind == 4:
            names = [s.decode("utf-8", "replace") for s in fb.strings(t, 2)]
            if len(names) != len(kids) or len(set(names)) != len(names):
                raise self.refuse(f"`pytreedef.json`: the dict at {_where(path)} has {len(kids)} children and "
                                  f"{len(names)} distinct keys")
            return {n: self._jax_node(fb, k, path + (n,), ids, leaves, store) for n, k in zip(names, kids)}
        if kind == 5:
            name = fb.string(t, 3).decode("utf-8", "replace")
            aux = fb.bytes(t, 4)
            fields = _field_names(aux, len(kids))
            if fields is not None:
                # OrderedDict and register_namedtuple_serialization store their keys as JSON:
                # the node is its fields by name, and nothing of its class is needed.
                out_d = {f: self._jax_node(fb, k, path + (f,), ids, leaves, store) for f, k in zip(fields, kids)}
                return collections.OrderedDict(out_d) if name == "collections.OrderedDict" else out_d
            children = [self._jax_node(fb, k, path + (i,), ids, leaves, store) for i, k in enumerate(kids)]
            return self._custom(path, name, aux, "a custom pytree node whose auxiliary data only its own code reads "
                                "(registered with jax.export.register_pytree_node_serialization)", children)
        raise self.refuse(f"`pytreedef.json`: the node at {_where(path)} is of unknown kind {kind}")

    # ---------------------------------------------------------------- Orbax

    def _orbax_dir(self, rel: str, path: Path, level: int) -> Any:
        """A folder: an item (``_METADATA`` or an aggregated ``checkpoint`` file), or a step of a
        CheckpointManager (items by ``_CHECKPOINT_METADATA``), or a folder of steps."""
        f = self.folder
        if f.kind(_join(rel, "_METADATA")) == "f" or f.kind(_join(rel, "checkpoint")) == "f":
            return self._orbax_item(rel, path)
        handlers: Any = None
        if f.kind(_join(rel, "_CHECKPOINT_METADATA")) == "f":
            cm = f.json(_join(rel, "_CHECKPOINT_METADATA"))
            handlers = cm.get("item_handlers") if isinstance(cm, dict) else None
        if isinstance(handlers, dict):
            names = list(handlers)
        else:
            names = [n for n in f.children(rel) if f.kind(_join(rel, n)) == "d" and _TMP not in n and _is_orbax(f, _join(rel, n))]
            if all(n.isascii() and n.isdigit() and len(n) < 19 for n in names):  # steps in their order
                names.sort(key=int)
        if not names or level > 2:
            raise self.refuse(f"`{rel or '.'}`: not an Orbax checkpoint (no _METADATA, no checkpoint file, no items)")
        items: Dict[str, Any] = {}
        alone = names == ["default"]  # a CheckpointManager's single unnamed item: the tree, as its restore gives it
        for n in names:
            sub, at = _join(rel, _segment(n, "the item name", f)), path if alone else path + (n,)
            if f.kind(sub) != "d":
                raise self.refuse(f"`{rel or '.'}/_CHECKPOINT_METADATA` names the item `{n}`, which is not a folder here")
            handler = handlers.get(n) if isinstance(handlers, dict) else None
            if isinstance(handler, str) and handler.endswith("JsonCheckpointHandler") and f.kind(_join(sub, "metadata")) == "f":
                items[n] = self._json_value(f.json(_join(sub, "metadata")), at)
            elif _is_orbax(f, sub):
                items[n] = self._orbax_dir(sub, at, level + 1)
            else:
                items[n] = self._custom(at, f"Orbax item ({handler})", b"", "an Orbax item of a handler treepack does not "
                                        "read", [])
        return items["default"] if alone else items

    def _orbax_item(self, rel: str, base: Path) -> Any:
        f = self.folder
        meta = f.json(_join(rel, "_METADATA")) if f.kind(_join(rel, "_METADATA")) == "f" else None
        agg = unpack(f.read(_join(rel, "checkpoint"), 1 << 40), f.refuse, _join(rel, "checkpoint")) \
            if f.kind(_join(rel, "checkpoint")) == "f" else None
        if meta is not None and not (isinstance(meta, dict) and isinstance(meta.get("tree_metadata"), dict)):
            raise self.refuse(f"`{_join(rel, '_METADATA')}` is not Orbax's tree metadata (no tree_metadata object)")
        ocdbt = meta.get("use_ocdbt") if meta is not None else None
        if not isinstance(ocdbt, bool):
            ocdbt = f.kind(_join(rel, "manifest.ocdbt")) == "f"
        # Orbax stores every chunk (then a missing one is damage, not a fill value to allocate).
        every_chunk = meta is not None and meta.get("store_array_data_equal_to_fill_value") is True
        store = _Store(self, rel, ocdbt, fill_missing=not every_chunk)
        strings: List[Any] = []

        def string(name: str, path: Path) -> str:
            if not strings:
                strings.append(f.json(_join(rel, "_strings.json")) if f.kind(_join(rel, "_strings.json")) == "f" else {})
            s = strings[0].get(name) if isinstance(strings[0], dict) else None
            if not isinstance(s, str):
                raise self.refuse(f"{_where(path)}: its string `{name}` is not in `{_join(rel, '_strings.json')}`")
            return s

        flat_agg = _flatten(agg, ()) if agg is not None and meta is not None else {}

        def leaf(path: Path, vm: Any) -> Any:
            keys = tuple(str(k) for k in path[len(base):])
            vt = vm.get("value_type") if isinstance(vm, dict) else None
            if not isinstance(vt, str):
                raise self.refuse(f"{_where(path)}: its value metadata has no value_type")
            if vt in _EMPTY:
                return _EMPTY[vt]()
            name = ".".join(keys)
            if keys in flat_agg and not _is_placeholder(flat_agg[keys]):
                return self._agg_value(flat_agg[keys], path, store)
            if vt == "string":
                return string(name, path)
            kind = _ORBAX_KINDS.get(vt)
            if kind is None:
                return self._custom(path, vt, b"", "a value of an Orbax TypeHandler treepack does not read", [])
            return self._array(store, name, kind, path)

        if meta is None:
            return self._agg_value(agg, base, store)
        rich = meta.get("value_metadata_tree")
        if isinstance(rich, str):
            try:
                tree = json.loads(rich)
            except RecursionError:
                raise self.refuse(f"`{_join(rel, '_METADATA')}`: value_metadata_tree nested too deep") from None
            except ValueError as e:
                raise self.refuse(f"`{_join(rel, '_METADATA')}`: value_metadata_tree is not JSON: {e}") from None
            return self._rich(tree, base, leaf)
        return self._from_entries(meta["tree_metadata"], base, leaf, _join(rel, "_METADATA"))

    def _from_entries(self, entries: Dict[str, Any], base: Path, leaf: Callable[[Path, Any], Any], where: str) -> Any:
        """The tree of ``_METADATA``'s flat entries: each a key path (names, and whether each is
        a dict key or a sequence index) and the value's metadata."""
        flat: Dict[Path, Tuple[Tuple[bool, ...], Any]] = {}
        for entry in entries.values():
            km = entry.get("key_metadata") if isinstance(entry, dict) else None
            if not isinstance(km, list) or not km:
                raise self.refuse(f"`{where}`: an entry without key_metadata")
            keys: List[Any] = []
            seq: List[bool] = []
            for k in km:
                name, kt = (k.get("key"), k.get("key_type")) if isinstance(k, dict) else (None, None)
                if not isinstance(name, str) or kt not in (1, 2):
                    raise self.refuse(f"`{where}`: a key of {keys!r} is not a name with key_type 1 or 2")
                if kt == 1 and not (name.isascii() and name.isdigit() and len(name) < 10):
                    raise self.refuse(f"`{where}`: the sequence index {name[:40]!r} at {_where(base + tuple(keys))}")
                keys.append(int(name) if kt == 1 else name)
                seq.append(kt == 1)
            self._depth(base + tuple(keys))
            flat[tuple(keys)] = (tuple(seq), entry.get("value_metadata"))
        # An empty container saved before its contents were (a partial save): the contents win,
        # as Orbax decides.
        prefixes = {k[:i] for k in flat for i in range(1, len(k))}
        root: Dict[Any, Any] = {}
        kinds: Dict[Path, bool] = {}
        # Keys in order, as Orbax sorts them when it restores (its entries are in flattening order).
        for keys, (seq, vm) in sorted(flat.items(), key=lambda e: tuple((type(k) is str, k) for k in e[0])):
            if keys in prefixes:
                continue
            node = root
            for i, k in enumerate(keys):
                if kinds.setdefault(keys[:i], seq[i]) != seq[i]:
                    raise self.refuse(f"`{where}`: {_where(base + keys[:i])} is both a dict and a sequence")
                if i == len(keys) - 1:
                    node[k] = leaf(base + keys, vm)
                else:
                    node = node.setdefault(k, {})
        return self._finish(root, (), kinds, base, where)

    def _finish(self, node: Dict[Any, Any], at: Path, kinds: Dict[Path, bool], base: Path, where: str) -> Any:
        if not node and at not in kinds:
            return {}  # no entries at all
        if at in kinds and not kinds[at]:
            return {k: (self._finish(v, at + (k,), kinds, base, where) if at + (k,) in kinds else v) for k, v in node.items()}
        if sorted(node) != list(range(len(node))):
            raise self.refuse(f"`{where}`: the sequence at {_where(base + at)} has indices other than 0 to {len(node) - 1}")
        return [self._finish(node[i], at + (i,), kinds, base, where) if at + (i,) in kinds else node[i]
                for i in range(len(node))]

    def _rich(self, node: Any, path: Path, leaf: Callable[[Path, Any], Any]) -> Any:
        """Orbax's rich value-metadata tree (tuples and namedtuples kept; a namedtuple is a dict of
        its fields here, its module and class never looked at)."""
        self._depth(path)
        if isinstance(node, list):
            return [self._rich(v, path + (i,), leaf) for i, v in enumerate(node)]
        if not isinstance(node, dict):
            raise self.refuse(f"value_metadata_tree: {_where(path)} is a {type(node).__name__}")
        cat = node.get("category")
        if cat == "custom" and node.get("clazz") == "ValueMetadataEntry":
            return leaf(path, node.get("data"))
        entries = node.get("entries")
        if cat == "custom" and node.get("clazz") == "tuple" and isinstance(entries, list):
            return tuple(self._rich(v, path + (i,), leaf) for i, v in enumerate(entries))
        if cat == "namedtuple" and isinstance(entries, list):
            if not all(isinstance(e, dict) and isinstance(e.get("key"), str) for e in entries):
                raise self.refuse(f"value_metadata_tree: the namedtuple at {_where(path)} has unnamed fields")
            return {e["key"]: self._rich(e.get("value"), path + (e["key"],), leaf) for e in entries}
        if cat is not None:
            raise self.refuse(f"value_metadata_tree: {_where(path)} is of category {str(cat)[:60]!r}")
        return {k: self._rich(v, path + (k,), leaf) for k, v in node.items()}

    def _agg_value(self, x: Any, path: Path, store: _Store) -> Any:
        """A value of an older Orbax checkpoint's aggregated file: containers, Python and numpy
        values, flax's chunked arrays, and ``PLACEHOLDER://name`` for an array stored apart."""
        self._depth(path)
        if isinstance(x, dict):
            if "__msgpack_chunked_array__" in x:
                return unchunk(x, self.refuse, _where(path))
            return {k: self._agg_value(v, path + (k,), store) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            out = [self._agg_value(v, path + (i,), store) for i, v in enumerate(x)]
            return tuple(out) if isinstance(x, tuple) else out
        if _is_placeholder(x):
            return self._array(store, x[len(_PLACEHOLDER):], "np", path)
        return x

    def _json_value(self, x: Any, path: Path) -> Any:
        """An Orbax JSON item: the JSON tree as it is (its depth checked)."""
        self._depth(path)
        if isinstance(x, dict):
            for k, v in x.items():
                self._json_value(v, path + (k,))
        elif isinstance(x, list):
            for i, v in enumerate(x):
                self._json_value(v, path + (i,))
        return x

    # ---------------------------------------------------------------- arrays

    def _open(self) -> None:
        """Open every array (its Zarr metadata read, no data): its shape and dtype, checked against
        what the checkpoint declares and against the bytes the folder holds."""
        futures = []
        for a in self.arrays:
            futures.append(self.ts.open(a.store.spec(a), read=True, open=True, context=self.context))
        budget = _FILL_RATIO * self.folder.bytes + _FILL_SLACK
        total = 0
        for a, fut in zip(self.arrays, futures):
            try:
                a.handle = fut.result()
                a.dtype = np.dtype(a.handle.dtype.numpy_dtype)
                a.shape = tuple(int(n) for n in a.handle.shape)
            except Exception as e:  # TensorStore's errors for a damaged array are ValueErrors and more
                raise self.refuse(f"{_where(a.path)}: its array `{a.name}` cannot be opened: {e}") from None
            if a.dtype.hasobject or a.dtype.kind in "OUS" or a.dtype.names:
                raise self.refuse(f"{_where(a.path)}: its array `{a.name}` holds {a.handle.dtype.name} values, not numbers")
            if a.declared is not None and (a.declared[0], a.declared[1]) != (a.handle.dtype.name, a.shape):
                raise self.refuse(f"{_where(a.path)}: declared {a.declared[0]}{list(a.declared[1])}, but its array "
                                  f"`{a.name}` is {a.handle.dtype.name}{list(a.shape)}")
            if a.kind == "scalar" and a.shape != ():
                raise self.refuse(f"{_where(a.path)}: a scalar whose array `{a.name}` has shape {list(a.shape)}")
            total += a.nbytes
            if total > budget:
                raise self.refuse(
                    f"{_where(a.path)}: its array `{a.name}` declares shape {list(a.shape)} of {a.dtype} ({a.nbytes} "
                    f"bytes), and the arrays so far {total} bytes, far more than the {self.folder.bytes} bytes stored "
                    f"could hold ({_FILL_RATIO} times them and 1 GiB): a hostile shape; nothing was read")

    def read(self, wanted: List[_Array]) -> Dict[int, Any]:
        """The values of the arrays ``wanted``, by ``id`` (a scalar as a Python number)."""
        out: Dict[int, Any] = {}
        i = 0
        while i < len(wanted):
            batch, size = [], 0
            while i < len(wanted) and (not batch or size + wanted[i].nbytes <= _READ_BATCH):
                batch.append(wanted[i])
                size += wanted[i].nbytes
                i += 1
            reads = [(a, a.handle.read()) for a in batch]
            for a, fut in reads:
                try:
                    v = np.asarray(fut.result())
                except Exception as e:
                    raise self.refuse(f"{_where(a.path)}: its array `{a.name}` cannot be read: {e}") from None
                out[id(a)] = v.item() if a.kind == "scalar" else v
        self.folder.unchanged()
        return out


def _join(rel: str, name: str) -> str:
    return f"{rel}/{name}" if rel else name


def _is_orbax(f: _Folder, rel: str) -> bool:
    return any(f.kind(_join(rel, n)) == "f" for n in ("_METADATA", "checkpoint", "_CHECKPOINT_METADATA", "manifest.ocdbt"))


def _is_placeholder(x: Any) -> bool:
    return isinstance(x, str) and x.startswith(_PLACEHOLDER)


def _field_names(aux: bytes, n: int) -> Optional[List[str]]:
    """The node's field names, where its auxiliary data is a JSON list of ``n`` distinct names."""
    try:
        names = json.loads(aux.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    ok = isinstance(names, list) and len(names) == n and all(isinstance(x, str) for x in names)
    return names if ok and len(set(names)) == n else None


def _flatten(x: Any, path: Tuple[str, ...], out: Optional[Dict[Tuple[str, ...], Any]] = None) -> Dict[Tuple[str, ...], Any]:
    """An aggregated tree's leaves by their Orbax key names."""
    out = {} if out is None else out
    if len(path) > _MAX_DEPTH:
        return out
    if isinstance(x, dict) and "__msgpack_chunked_array__" not in x:
        for k, v in x.items():
            _flatten(v, path + (str(k),), out)
    elif isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            _flatten(v, path + (str(i),), out)
    else:
        out[path] = x
    return out


# ---------------------------------------------------------------- what treepack calls

def _walk(x: Any, path: Path, fn: Callable[[Any, Path], Any]) -> Any:
    """``x`` rebuilt with ``fn(leaf, path)`` at every leaf (containers of the same types)."""
    if isinstance(x, dict):
        out = type(x)() if type(x) in (dict, collections.OrderedDict) else {}
        for k, v in x.items():
            out[k] = _walk(v, path + (k,), fn)
        return out
    if isinstance(x, (list, tuple)):
        items = [_walk(v, path + (i,), fn) for i, v in enumerate(x)]
        if isinstance(x, tuple):
            # (a like= template's namedtuples stay namedtuples)
            return type(x)._make(items) if hasattr(type(x), "_make") else tuple(items)
        return items
    return fn(x, path)


def _at(tree: Any, path: Path) -> Tuple[bool, Any]:
    """Whether ``path`` is in ``tree``, and what is there."""
    for k in path:
        if isinstance(tree, dict) and k in tree:
            tree = tree[k]
        elif isinstance(tree, (list, tuple)) and isinstance(k, int) and k < len(tree):
            tree = tree[k]
        else:
            return False, None
    return True, tree


def _live_customs(ck: _Checkpoint, tree: Any) -> Dict[Path, _Custom]:
    """The custom nodes of ``ck`` still in ``tree`` (one selected below, or kept whole)."""
    out = {}
    for path, c in ck.customs.items():
        found, v = _at(tree, path)
        if found and v is not None:
            out[path] = c
    return out


def _arrays_in(tree: Any) -> List[_Array]:
    found: List[_Array] = []
    _walk(tree, (), lambda x, _p: found.append(x) if isinstance(x, _Array) else None)
    return found


def _refusal(path: str, live: Dict[Path, _Custom], convert: bool) -> Exception:
    from ._api import UntrustedTypeError

    types: Dict[str, List[str]] = {}
    reasons: Dict[str, str] = {}
    for p, c in live.items():
        types.setdefault(c.type_name, []).append(_keypath(p))
        reasons[c.type_name] = c.reason
    e = UntrustedTypeError(path, types)
    lines = [f"  {name}: at {', '.join(f'`{p}`' for p in ps[:5])}{' …' if len(ps) > 5 else ''} ({reasons[name]})"
             for name, ps in sorted(types.items())]
    todo = ("leave them out with select= (a converted tree cannot hold a placeholder)" if convert else
            "load the rest with on_missing='placeholder' (a treepack.Unloadable in each place, holding its children "
            "and auxiliary bytes) or leave them out with select=")
    e.args = (f"{path}: refusing to build nodes that only their own code can read (nothing was imported or run; "
              f"treepack never imports what a checkpoint names):\n" + "\n".join(lines) +
              f"\nTo read the rest: {todo}; if you trust the checkpoint and have that code, read it with the library "
              "that wrote it",)
    return e


def read_tree(path: str, fmt: str, select: Optional[List[str]] = None) -> Any:
    """The tree of the checkpoint at ``path`` for ``convert``: arrays as numpy arrays, only what
    ``select`` selects (dict entries left out, list and tuple items ``None``)."""
    from ._convert import select_tree

    with _deep():
        ck = _Checkpoint(path, fmt)
        tree = select_tree(ck.tree, select, path) if select else ck.tree
        live = _live_customs(ck, tree)
        if live:
            raise _refusal(path, live, convert=True)
        values = ck.read(_arrays_in(tree))
        return _walk(tree, (), lambda x, _p: values[id(x)] if isinstance(x, _Array) else x)


def load(path: str, fmt: str, kwargs: Dict[str, Any]) -> Any:
    """``treepack.load`` of the checkpoint at ``path``, with every ``load`` option: the tree is
    saved in memory (only the selected arrays read; the others empty there, and ``None`` once
    loaded) and loaded from there; then custom nodes become ``Unloadable`` placeholders and, with
    JAX installed and without ``numpy=True``, the arrays saved as jax.Arrays come back as such."""
    with _deep():
        return _load(path, fmt, kwargs)


def _load(path: str, fmt: str, kwargs: Dict[str, Any]) -> Any:
    from . import _api
    from ._codec import Unloadable
    from ._convert import select_tree
    from ._transport import memory_location

    if kwargs.pop("separator", None) is not None:
        raise TypeError(f"load() of {path}: separator= applies to files of flat names (safetensors, npz), not to this")
    on_missing = kwargs.get("on_missing", "error")
    if on_missing not in ("error", "placeholder"):
        raise ValueError("on_missing must be 'error' or 'placeholder'")
    select = kwargs.get("select")
    sel = [select] if isinstance(select, str) else (list(select) if select is not None else None)
    ck = _Checkpoint(path, fmt)
    kept = select_tree(ck.tree, sel, path) if sel else ck.tree
    live = _live_customs(ck, kept)
    if live and on_missing == "error":
        raise _refusal(path, live, convert=False)
    values = ck.read(_arrays_in(kept))
    if set(kwargs) <= _PLAIN_OPTIONS and not any(kwargs.get(k) for k in ("like", "progress", "expect_root")):
        # The tree as a load of it gives it, built here: a treepack tree in memory would cost a
        # copy and a hash of every array for nothing (no like= to match, no progress to report).
        out = _pick(ck.tree, (), _present(kept) if sel else None, values)
    else:
        # An array not selected is an empty stand-in, which the load's own select= makes None.
        full = _walk(ck.tree, (), lambda x, _p: (values.get(id(x), np.zeros(0, x.dtype)) if isinstance(x, _Array) else x))
        with memory_location() as loc:
            _api.save(full, loc, durable=False)
            try:
                out = _api.load(loc, **kwargs)
            except (ValueError, TypeError, KeyError) as e:
                # (a like= or select= that does not fit: said of the checkpoint, not of the copy)
                first = e.args[0] if e.args and isinstance(e.args[0], str) else None
                if first is None or str(loc) not in first:
                    raise
                raise type(e)(first.replace(str(loc), path)) from None
    # Saved jax.Arrays come back as jax.Arrays where JAX is installed, as torch tensors do where
    # torch is: built by the integration that builds treepack's own (the generic layer imports
    # no framework).
    build = None
    jax_paths = {a.path for a in ck.arrays if a.kind == "jax"}
    handler = _registry.array_handlers("jax.Array") if jax_paths and not kwargs.get("numpy") else None
    if handler is not None:
        try:
            build = handler.arrays({})
        except ImportError:
            build = None
    as_jax = {"type": "jax.Array"}

    def finish(x: Any, p: Path) -> Any:
        if build is not None and p in jax_paths and isinstance(x, np.ndarray):
            return build(x, as_jax)
        return x

    out = _walk(out, (), finish) if build is not None else out
    for p, c in sorted(ck.customs.items(), key=lambda pc: -len(pc[0])):  # inner nodes first
        found, v = _at(out, p)
        if found and v is not None:
            # A node with nothing selected below it is None, as treepack's own custom nodes are.
            out = _put(out, p, Unloadable(c.type_name, {"children": v, "auxdata": c.aux}, c.reason) if p in live else None)
    return out


# The load options a tree built here honours as a load of a treepack tree would (the others,
# like= above all, go through one).
_PLAIN_OPTIONS = frozenset({"select", "like", "trust", "allow_pickle", "on_missing", "mmap", "verify", "storage_options",
                            "progress", "numpy", "expect_root"})


def _present(tree: Any) -> set:
    """The places of every node of a tree ``select_tree`` kept."""
    out: set = set()

    def visit(x: Any, p: Path) -> None:
        if x is None:
            return
        out.add(p)
        if isinstance(x, dict):
            for k, v in x.items():
                visit(v, p + (k,))
        elif isinstance(x, (list, tuple)):
            for i, v in enumerate(x):
                visit(v, p + (i,))

    visit(tree, ())
    return out


def _pick(x: Any, p: Path, keep: Optional[set], values: Dict[int, Any]) -> Any:
    """The tree a load with ``select=`` gives (``keep``: the places kept; None, all): leaves not
    kept ``None``, containers kept with them, an ``OrderedDict`` (a custom node to treepack)
    with nothing kept below it ``None``."""
    if isinstance(x, collections.OrderedDict) and keep is not None and p not in keep:
        return None
    if isinstance(x, dict):
        out = type(x)() if type(x) in (dict, collections.OrderedDict) else {}
        for k, v in x.items():
            out[k] = _pick(v, p + (k,), keep, values)
        return out
    if isinstance(x, (list, tuple)):
        items = [_pick(v, p + (i,), keep, values) for i, v in enumerate(x)]
        return tuple(items) if isinstance(x, tuple) else items
    if keep is not None and p not in keep:
        return None
    return values[id(x)] if isinstance(x, _Array) else x


def _put(tree: Any, path: Path, value: Any) -> Any:
    """``tree`` with ``value`` at ``path`` (tuples on the way rebuilt)."""
    if not path:
        return value
    k, rest = path[0], path[1:]
    if isinstance(tree, tuple):
        items = list(tree)
        items[k] = _put(items[k], rest, value)
        return tuple(items)
    tree[k] = _put(tree[k], rest, value)
    return tree


def structure(path: str, fmt: str) -> Any:
    """``load_structure`` of the checkpoint: ``LeafInfo`` at every leaf (shapes and dtypes from
    the arrays' Zarr metadata, no data read), ``StructNode`` at custom nodes and ``OrderedDict``s."""
    with _deep():
        return _structure(path, fmt)


def _structure(path: str, fmt: str) -> Any:
    from ._foreign_view import dtype_name, structure_of
    from ._structure import LeafInfo

    ck = _Checkpoint(path, fmt)

    def leaf(x: Any, kp: str) -> Any:
        if not isinstance(x, _Array):
            return None
        if x.kind == "scalar":
            return LeafInfo(kp, {"b": "bool", "f": "float", "c": "complex"}.get(x.dtype.kind, "int"))
        return LeafInfo(kp, "array", dtype_name(x.dtype), x.shape, x.nbytes, False)

    return structure_of(ck.tree, ck.customs, leaf)
