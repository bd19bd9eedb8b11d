"""``treepack.jax``: the calls of ``jax.experimental.array_serialization.pytree_serialization``
(``save``, ``load``, ``load_pytreedef``, ``nonblocking_save``, ``nonblocking_load``) made on
treepack trees, so that a program switches by changing one import (docs/jax.md, "Switching from
jax.experimental.array_serialization").

Every call goes through ``treepack.save`` / ``treepack.load`` / ``treepack.load_structure``: a
checkpoint JAX's own ``save`` wrote is read wherever those read it, and a treepack tree saved
here is an ordinary tree for every other reader. ``load`` turns JAX's ``shardings`` and ``mask``
prefix trees into one ``like=`` template built from the stored structure, so masked-out leaves
are never read and each device reads only its shards.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import re
import shutil
from typing import Any, Dict, Iterable, List, Optional, Tuple

from ... import _plugin
from ..._plugin import LeafInfo, StructNode
from .like import Placement
from .pytrees import _key_text

#: What JAX's ``save`` writes in its directory (``pytree_serialization._PYTREEDEF_FILE``, ...).
JAX_FILES = ("pytreedef.json", "archive.zip", "array_store")


class CheckpointExistsError(FileExistsError, ValueError):
    """``save(..., overwrite=False)`` where files already are. A ``ValueError`` as JAX raises it,
    and a ``FileExistsError`` as ``treepack.save`` raises it."""


class NotACheckpointError(RuntimeError, ValueError):
    """``save`` into a directory that holds files of neither a treepack tree nor a JAX checkpoint.
    A ``RuntimeError`` as JAX raises it, and a ``ValueError`` as ``treepack.save`` raises it."""


class PyTreeFuture(concurrent.futures.Future):  # type: ignore[type-arg]
    """What ``nonblocking_save`` and ``nonblocking_load`` return, as JAX's ``PyTreeFuture``:
    ``result(timeout=None)``, ``done()``, ``await``-able, and ``pytree``, the tree of
    ``jax.ShapeDtypeStruct``s being saved or loaded. A real ``concurrent.futures.Future``
    (``exception()``, ``add_done_callback`` and ``concurrent.futures.wait`` work on it)."""

    def __init__(self) -> None:
        super().__init__()
        self.pytree: Any = None
        # Running from the start: the work it stands for cannot be called off.
        self.set_running_or_notify_cancel()

    def __await__(self) -> Any:
        return asyncio.wrap_future(self).__await__()

    def __repr__(self) -> str:
        return f"PyTreeFuture(done={self.done()}, pytree={self.pytree})"


def _settle(fut: PyTreeFuture, src: Any) -> None:
    error = src.exception()
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(src.result())


def _no_ts_specs(ts_specs: Any, call: str) -> None:
    if ts_specs is not None:
        raise TypeError(
            f"treepack.jax.{call}: ts_specs= (tensorstore specs) do not apply to treepack, which stores arrays in its "
            "own chunked format; leave it out (treepack.save's chunk_bytes= and compression= tune the storage)"
        )


def _location(directory: Any) -> str:
    p = os.fspath(directory)
    return p if "://" in p else os.path.expanduser(p)


# ---------------------------------------------------------------- save


def _treepack_file(name: str) -> bool:
    # The manifest, its staging copies of an interrupted save, the packs folder.
    return name in ("treepack.json", "packs") or name.startswith("treepack.json#")


def _prepare(p: str, overwrite: bool) -> None:
    """JAX's rules for the directory, before anything is written: ``overwrite=False`` refuses a
    non-empty directory; ``overwrite=True`` replaces a checkpoint (a treepack tree, replaced
    atomically by the save; one of JAX's, removed first as JAX removes it) and refuses a
    directory that holds anything else, so that no file of the user's is ever removed."""
    if "://" in p or not os.path.isdir(p):
        return  # an object store or a .tpk file: treepack.save's own rules (no replace without overwrite)
    names = sorted(os.listdir(p))
    if not names:
        return
    if not overwrite:
        raise CheckpointExistsError(
            f"Files already exist at path: `{p}`, but you specified `overwrite=False` (treepack.jax.save): pass "
            "overwrite=True to replace the checkpoint there, or save to a new or empty directory"
        )
    extra = [n for n in names if not _treepack_file(n) and n not in JAX_FILES]
    if extra:
        raise NotACheckpointError(
            f"Refusing to work on a directory that is not a previous checkpoint. `{p}` holds {extra}, which are "
            "neither a treepack tree's files (treepack.json, packs/) nor a JAX checkpoint's (pytreedef.json, "
            "array_store/, archive.zip). Remove them yourself if you are sure this is the checkpoint directory, or "
            "save to a new or empty directory"
        )
    jax_files = [n for n in JAX_FILES if n in names]
    if jax_files:
        _remove_jax_checkpoint(p, jax_files)


def _remove_jax_checkpoint(p: str, names: List[str]) -> None:
    """Remove what JAX's ``save`` wrote in ``p``, as its own overwrite does (not atomic: the
    tree saved next is written after). Links are removed, never followed."""
    import jax

    if jax.process_count() > 1:
        # Every process would check and remove it; one that looks after another removed it
        # sees a different directory and the processes would disagree about the save.
        raise NotACheckpointError(
            f"`{p}` holds a checkpoint jax.experimental.array_serialization wrote; in a multi-process job treepack.jax "
            "does not remove it: remove it before the save, or save to a new directory"
        )
    for name in names:  # pytreedef.json first: a half-removed folder no longer reads as a checkpoint
        q = os.path.join(p, name)
        if os.path.isdir(q) and not os.path.islink(q):
            shutil.rmtree(q)
        else:
            os.remove(q)


def save(data: Any, directory: Any, *, overwrite: bool = True, ts_specs: Any = None, **options: Any) -> Any:
    _no_ts_specs(ts_specs, "save")
    p = _location(directory)
    _prepare(p, overwrite)
    try:
        return _plugin.save(data, p, overwrite=overwrite, **options)
    except FileExistsError as e:
        if isinstance(e, CheckpointExistsError):
            raise
        # (A tree committed there since the check, or an existing .tpk file.)
        raise CheckpointExistsError(
            f"Files already exist at path: `{p}`, but you specified `overwrite=False` (treepack.jax.save): pass "
            "overwrite=True to replace them, or save to a new location"
        ) from None


def _abstract_of(data: Any) -> Any:
    import jax
    import numpy as np

    def one(x: Any) -> Any:
        return jax.ShapeDtypeStruct(x.shape, x.dtype) if isinstance(x, (jax.Array, np.ndarray)) else x

    try:
        return jax.tree.map(one, data)
    except Exception:  # keys JAX cannot sort, say: the stub is only for show
        return None


def nonblocking_save(data: Any, directory: Any, *, overwrite: bool = True, ts_specs: Any = None,
                     **options: Any) -> PyTreeFuture:
    fut = PyTreeFuture()
    fut.pytree = _abstract_of(data)
    options.pop("blocking", None)
    try:
        # The tree is converted here (JAX arrays are held, not copied); hashing and writing
        # run in the background.
        handle = save(data, directory, overwrite=overwrite, ts_specs=ts_specs, blocking=False, **options)
    except BaseException as e:
        # As JAX's: every error of the save is the future's.
        fut.set_exception(e)
        return fut
    handle.add_done_callback(lambda h: _settle(fut, h))
    return fut


# ---------------------------------------------------------------- load


def _jax_registered() -> Tuple[str, ...]:
    """The classes registered for JAX's own pytree serialization
    (``jax.export.register_pytree_node_serialization``): registering one is how a JAX program
    says it may be rebuilt from a checkpoint, so ``load`` trusts them as ``trust=`` would."""
    try:
        from jax._src.export import _export

        classes = list(_export.serialization_registry)
    except Exception:  # (a JAX without that registry: trust= alone)
        return ()
    # JAX registers a few classes of its own (OrderedDict, an internal error class): those are no
    # statement of the program's, so only classes of other modules count. Exact names: a glob
    # character in a qualname matches itself only.
    return tuple(
        re.sub(r"([*?\[])", r"[\1]", f"{c.__module__}:{c.__qualname__}")
        for c in classes
        if isinstance(c, type) and c.__module__.partition(".")[0] not in ("jax", "jaxlib", "collections", "builtins")
    )


class _Shardings:
    """What ``shardings`` leaves may be, checked as they are met."""

    def __init__(self) -> None:
        import jax

        self.jax = jax
        try:
            from jax.experimental.layout import Format
        except ImportError:  # pragma: no cover - a JAX before Format (it had no such leaves)
            Format = ()  # type: ignore[assignment,misc]
        self.format = Format

    def leaf(self, x: Any) -> bool:
        jax = self.jax
        return x is None or isinstance(x, (jax.sharding.Sharding, jax.ShapeDtypeStruct, jax.Array)) or (
            bool(self.format) and isinstance(x, self.format))

    def check(self, x: Any, where: str) -> None:
        if self.format and isinstance(x, self.format):
            raise NotImplementedError(
                "Deserialization with `Format` instead of `Sharding` is not currently supported. Pass "
                f"ShapeDtypeStruct(shape, dtype, sharding=format) instead (treepack.jax.load, shardings at {where})"
            )
        if not self.leaf(x):
            raise TypeError(
                f"treepack.jax.load: shardings at {where} is a {type(x).__module__}.{type(x).__qualname__}; each leaf "
                "must be a jax.sharding.Sharding, a jax.ShapeDtypeStruct (its dtype casts, its sharding places), a "
                "jax.Array (its sharding and dtype) or None (the default device)"
            )


def _node(x: Any, leaf: Any) -> Optional[Tuple[Any, List[Tuple[Any, Any]]]]:
    """A pytree node of the user's (shardings, mask) one level down: its tree definition and
    its (key, child) pairs; None for a leaf."""
    import jax.tree_util as jtu

    if leaf(x):
        return None
    kids, td = jtu.tree_flatten_with_path(x, is_leaf=lambda y: y is not x)
    if td.node_data() is None:
        return None
    return td, [(kp[0], c) for kp, c in kids]


def _stored_children(stored: Any) -> Optional[List[Tuple[Any, Any]]]:
    if isinstance(stored, dict):
        return list(stored.items())
    if isinstance(stored, (list, tuple)):
        return list(enumerate(stored))
    if isinstance(stored, StructNode):
        return list(stored.children.items())
    return None


def _describe(stored: Any) -> str:
    if isinstance(stored, LeafInfo):
        return _plugin.describe_stored(stored)
    if isinstance(stored, StructNode):
        return f"a {stored.type_name} ({stored.kind})"
    return f"a {type(stored).__name__} of {len(stored)}"


def _match(what: str, td: Any, kids: List[Tuple[Any, Any]], stored: Any, path: str) -> List[Tuple[Any, Any, str]]:
    """(child, stored child, its path) for each (key, child) of a node of the user's (``what``:
    shardings or mask; ``td`` its tree definition), as JAX's prefix rule wants them: the same
    kind of container with the same keys. Keys are compared as text, as the stored tree names
    them (a dict's int key 0 and a pytree node's flattened index 0 are its child "0")."""
    where = _plugin.where(path)
    have = _stored_children(stored)
    t = td.node_data()[0]
    same_kind = (
        (t is dict and isinstance(stored, dict))
        or (t in (list, tuple) and type(stored) is t)
        or (t not in (dict, list, tuple) and isinstance(stored, (StructNode, dict)))
    )
    if have is None or not same_kind:
        raise ValueError(
            f"treepack.jax.load: {what} has a {t.__name__} at {where}, but the checkpoint holds {_describe(stored)} "
            f"there; {what} must be a prefix of the saved tree (load_pytreedef shows it)"
        )
    want = sorted(_key_text(k) for k, _ in kids)
    by_text = {str(k): (k, v) for k, v in have}
    if want != sorted(by_text) or len(have) != len(by_text):
        raise ValueError(
            f"treepack.jax.load: {what} at {where} has the keys {want}, but the checkpoint holds {sorted(by_text)} "
            f"there; {what} must be a prefix of the saved tree (load_pytreedef shows it)"
        )
    out = []
    for key, child in kids:
        sk, sv = by_text[_key_text(key)]
        out.append((child, sv, (_plugin.key_child_path if isinstance(stored, dict) else _plugin.child_path)(path, sk)))
    return out


class _Template:
    """The ``like=`` template of one ``load``: the shardings tree where it is a tree, the
    stored structure below its leaves, ``Placement``s at the stored arrays, ``None`` where the
    mask (or the file) has nothing to read."""

    def __init__(self, root: Any) -> None:
        self.root, self.shardings = root, _Shardings()
        self.active: set = set()

    def deref(self, stored: Any) -> Any:
        return _plugin.deref(stored, self.root)[0]

    def build(self, stored: Any, path: str, shard: Any, mask: Any, exact: bool) -> Any:
        """``exact``: ``shard`` was given for this very place (not for a subtree above it)."""
        return self._build(self.deref(stored), path, shard, mask, exact)

    def _build(self, stored: Any, path: str, shard: Any, mask: Any, exact: bool) -> Any:
        s_node = _node(shard, self.shardings.leaf)
        m_node = _node(mask, lambda x: x is None)
        if s_node is not None:
            td, kids = s_node
            pairs = _match("shardings", td, kids, stored, path)
            masks = self._masks(m_node, mask, stored, path, [p for _, _, p in pairs])
            return td.unflatten([self.build(sv, p, c, m, True) for (c, sv, p), m in zip(pairs, masks)])
        self.shardings.check(shard, _plugin.where(path))
        if m_node is not None:
            td, kids = m_node
            by_path = {p: m for m, _, p in _match("mask", td, kids, stored, path)}
            return self._rebuild(stored, path, lambda v, p: self.build(v, p, shard, by_path[p], False))
        if not mask:  # (JAX's test, `not m`: None inside a mask masks too)
            return self.nothing(stored, path)
        return self.fill(stored, path, shard, exact)

    def _masks(self, m_node: Any, mask: Any, stored: Any, path: str, paths: List[str]) -> List[Any]:
        if m_node is None:
            return [mask] * len(paths)
        td, kids = m_node
        by_path = {p: m for m, _, p in _match("mask", td, kids, stored, path)}
        return [by_path[p] for p in paths]

    def _rebuild(self, stored: Any, path: str, child: Any) -> Any:
        """``stored``'s container (a ``StructNode`` for records and custom nodes: built by the
        load, when trusted) with ``child(stored_child, path)`` for each child."""
        if id(stored) in self.active:
            # (A ref place naming a container it is inside of: JAX trees have no cycles.)
            raise ValueError(
                f"treepack.jax: the checkpoint's tree contains itself at {_plugin.where(path)} (a cycle); load it "
                "with treepack.load"
            )
        self.active.add(id(stored))
        try:
            if isinstance(stored, dict):
                return {k: child(v, _plugin.key_child_path(path, k)) for k, v in stored.items()}
            if isinstance(stored, (list, tuple)):
                items = [child(v, _plugin.child_path(path, i)) for i, v in enumerate(stored)]
                return items if isinstance(stored, list) else tuple(items)
            kids = {k: child(v, _plugin.child_path(path, k)) for k, v in stored.children.items()}
            return StructNode(stored.kind, stored.type_name, stored.data, kids, stored.path)
        finally:
            self.active.discard(id(stored))

    def nothing(self, stored: Any, path: str) -> Any:
        """A masked-out subtree: its plain containers with ``None`` leaves. A record or custom
        node with nothing loaded below it is ``None`` itself, as in any treepack load: it is
        not built, so it needs no trust."""
        stored = self.deref(stored)
        if isinstance(stored, (LeafInfo, StructNode)):
            return None
        return self._rebuild(stored, path, self.nothing)

    def fill(self, stored: Any, path: str, shard: Any, exact: bool = False) -> Any:
        """The subtree loaded onto ``shard`` (a leaf of shardings): every stored array placed."""
        jax = self.shardings.jax
        stored = self.deref(stored)
        if isinstance(stored, LeafInfo):
            if stored.kind == "none":
                return None
            if stored.kind != "array":
                return True  # a scalar, a string, an object without children: loaded as stored
            if exact and isinstance(shard, (jax.ShapeDtypeStruct, jax.Array)):
                # At the array itself a template's shape is checked and its dtype cast, as in
                # any treepack.load(like=...).
                return shard
            if isinstance(shard, (jax.ShapeDtypeStruct, jax.Array)):
                return Placement(shard.sharding, shard.dtype)
            return Placement(shard, None)
        return self._rebuild(stored, path, lambda v, p: self.fill(v, p, shard))


def _nothing_to_read(template: Any) -> bool:
    import jax

    return not jax.tree_util.tree_leaves(template, is_leaf=lambda x: isinstance(x, StructNode))


def load(directory: Any, shardings: Any, *, mask: Any = None, ts_specs: Any = None, trust: Iterable[str] = (),
         **options: Any) -> Any:
    _no_ts_specs(ts_specs, "load")
    for bad in ("like", "select"):
        if bad in options:
            raise TypeError(f"treepack.jax.load takes no {bad}=: shardings and mask say what is read (or use treepack.load)")
    p = _location(directory)
    structure = _plugin.load_structure(p, storage_options=options.get("storage_options"))
    try:
        template = _Template(structure).build(structure, "", shardings, True if mask is None else mask, True)
    finally:
        _plugin.forget_places()  # (the index of the structure its refs were found by)
    if _nothing_to_read(template):
        return template  # (everything masked out: nothing is read, as with JAX)
    try:
        return _plugin.load(p, like=template, trust=(*_plugin.trust_globs(trust), *_jax_registered()), **options)
    except (ValueError, TypeError) as e:
        # The like= checks speak of like=; here the template is what shardings asked for.
        # (`load` puts the file's name first: "<file>: like=: ...")
        head, sep, rest = str(e).partition("like=: ")
        if type(e) not in (ValueError, TypeError) or not sep or not (head == "" or head.endswith(": ")):
            raise
        raise type(e)("treepack.jax.load: " + rest.replace("like= ", "shardings ")) from None


def nonblocking_load(directory: Any, shardings: Any, *, mask: Any = None, ts_specs: Any = None,
                     **options: Any) -> PyTreeFuture:
    _no_ts_specs(ts_specs, "nonblocking_load")
    fut = PyTreeFuture()
    # As JAX's: the structure is read now (a missing checkpoint raises here), the arrays later.
    fut.pytree = load_pytreedef(directory, storage_options=options.get("storage_options"))
    work = _plugin.executor().submit(load, directory, shardings, mask=mask, **options)
    work.add_done_callback(lambda w: _settle(fut, w))
    return fut


# ---------------------------------------------------------------- load_pytreedef


def _key_struct(shape: Tuple[int, ...]) -> Any:
    """The ``ShapeDtypeStruct`` of typed keys whose key data has ``shape``. The structure holds
    the key data, not the impl: 2 words are ``threefry2x32``'s, 4 ``rbg``'s (``unsafe_rbg``
    keys, also 4 words, are described as ``rbg``; ``load`` gives them back as they were)."""
    import jax
    import jax.numpy as jnp

    impl = "threefry2x32" if shape[-1] == 2 else "rbg"
    return jax.eval_shape(lambda: jax.random.wrap_key_data(jnp.zeros(shape, jnp.uint32), impl=impl))


def load_pytreedef(directory: Any, *, storage_options: Any = None) -> Any:
    import jax

    p = _location(directory)
    structure = _plugin.load_structure(p, storage_options=storage_options)
    keys: Optional[set] = None

    def is_key(info: Any) -> bool:
        nonlocal keys
        if info.dtype != "uint32" or not info.shape or info.shape[-1] not in (2, 4):
            return False
        if keys is None:
            try:
                keys = {q for t, q in _plugin.core.Reader(p, _plugin.storage_options(storage_options)).array_types()
                        if t == "jax.random.key"}
            except Exception:  # a checkpoint read through a converter (JAX's own): it holds no typed keys
                keys = set()
        return info.path in keys

    t = _Template(structure)

    def one(stored: Any, path: str) -> Any:
        stored = t.deref(stored)
        if isinstance(stored, LeafInfo):
            if stored.kind == "none":
                return None
            if stored.kind != "array":
                return stored  # a scalar, a string...: its LeafInfo says what it is
            if is_key(stored):
                return _key_struct(tuple(stored.shape))
            return jax.ShapeDtypeStruct(tuple(stored.shape), _plugin.stored_dtype(stored))
        return t._rebuild(stored, path, one)

    try:
        return one(structure, "")
    finally:
        _plugin.forget_places()


# ---------------------------------------------------------------- the face's services

METHODS: Dict[str, Any] = {
    "jax_save": save,
    "jax_load": load,
    "jax_load_pytreedef": load_pytreedef,
    "jax_nonblocking_save": nonblocking_save,
    "jax_nonblocking_load": nonblocking_load,
}

__all__ = ["CheckpointExistsError", "JAX_FILES", "METHODS", "NotACheckpointError", "PyTreeFuture", "load",
           "load_pytreedef", "nonblocking_load", "nonblocking_save", "save"]
