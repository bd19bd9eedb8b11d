"""``load(..., like=...)``: the stored leaves a mask or an abstract tree asks for.

``like`` mirrors the stored tree (as ``load_structure`` returns it). At each place:

- ``None`` or ``False``: skip this leaf or subtree;
- ``True``: load this leaf or the whole subtree;
- a ``LeafInfo``, or anything with ``shape`` and ``dtype`` (a numpy array, a
  ``jax.ShapeDtypeStruct``, a ``jax.Array``, a torch tensor): load this leaf, which must be an array
  of that shape and dtype (a ``LeafInfo`` must describe the stored leaf exactly);
- an ``int``, ``float``, ``complex``, ``str`` or ``bytes`` (an example tree used as a template):
  load this leaf, which must be a stored scalar of that kind;
- a container (dict or other mapping, list, tuple, a ``StructNode``, a dataclass or namedtuple):
  the stored node must be the same kind with the same keys or fields, and each child follows
  these rules; an object of a registered or built-in custom type (a datetime, say) loads the
  stored object.

Anything else is a ``TypeError`` and any difference in structure a ``ValueError``, each naming the
key path: a wrong ``like`` never silently loads nothing.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Dict, List, Mapping, Optional, Set, Tuple
from collections.abc import MutableMapping

import numpy as np

from . import _codec, _core
from ._codec import records
from ._registry import DECLINE, for_type, lookup_class, type_name
from ._structure import StructNode

LeafInfo = _core.LeafInfo


def keep_paths(like: Any, structure: Any, into: Optional[Dict[str, Any]] = None) -> Set[str]:
    """The key paths to read: stored leaves, and custom objects that have no children.

    With ``into`` (a dict), the places where ``like`` holds an object an integration reads into
    in place (a torch tensor with memory) are not kept but collected there, key path ->
    (object, the integration's ``read_into``): the caller reads them. (A tensor on
    the ``meta`` device, a model built without memory, has nothing to read into: its leaf is
    loaded, and the integration makes it a tensor in ``graft``.)"""
    keep: Set[str] = set()
    try:
        _walk(like, structure, "", keep, into, structure)
    finally:
        forget_places()
    return keep


def deref(stored: Any, root: Any) -> Tuple[Any, Optional[str]]:
    """``stored``, or, for a ref place (one object stored at two places: JAX's test trees hold
    an array twice), the stored node of the object it names, with the ref place's path."""
    if isinstance(stored, LeafInfo) and stored.kind == "ref" and root is not None and stored.target is not None:
        target = _find(root, stored.target)
        if target is not None:
            return target, stored.path
    return stored, None


class _Places:
    """The stored nodes of one structure by key path, found one segment at a time: a list's
    item by its index, a dict's entry or an object's child by the key-path text of its key
    (each container's keys indexed once, when first gone through). A ref's object is found in
    time linear in its path, however many refs a load meets (walking from the root each time
    made 8000 refs take 50 s)."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self.keys: Dict[int, Tuple[Any, Dict[str, Any]]] = {}  # id -> (the container: kept alive, its index)

    def find(self, path: str) -> Any:
        node = self.root
        for seg in path.split("/") if path else ():
            if isinstance(node, (list, tuple)):
                if not (seg.isascii() and seg.isdigit()) or int(seg) >= len(node):
                    return None
                node = node[int(seg)]
                continue
            if isinstance(node, LeafInfo):
                return None
            entry = self.keys.get(id(node))
            if entry is None:
                items = node.items() if isinstance(node, dict) else getattr(node, "children", {}).items()
                entry = self.keys[id(node)] = (node, {_core.key_text(k): v for k, v in items})
            if seg not in entry[1]:
                return None
            node = entry[1][seg]
        return node


_PLACES = threading.local()


def forget_places() -> None:
    """Let go of the index of the last structure (a load's ``like=`` checks are done)."""
    _PLACES.last = None


def _find(root: Any, path: str) -> Any:
    """The stored node at the key path ``path`` of the structure ``root`` (None if not found)."""
    places = getattr(_PLACES, "last", None)
    if places is None or places.root is not root:
        places = _PLACES.last = _Places(root)
    return places.find(path)


def graft(out: Any, like: Any, stored: Any, done: Set[int], options: Optional[Dict[str, Any]] = None) -> Any:
    """``out`` with the objects of ``like`` whose ids are in ``done`` put back at their places
    (loaded in place, they came back as None, and so did a state_dict whose every leaf was a
    tensor: rebuilt here from ``stored``, the structure). At a leaf of a framework's class, its
    integration says what goes there (``like_graft``: a ``meta`` tensor's place gets a real
    tensor of its kind on ``map_location``'s device, the CPU by default: what
    ``load_state_dict(..., assign=True)`` takes); ``options`` are the load's."""
    if id(like) in done:
        return like
    h = for_type(type(like))
    if h is not None and h.like_graft is not None:
        v = h.like_graft(out, like, options or {})
        if v is not DECLINE:
            return v
    if isinstance(like, Mapping) and out is None:
        if isinstance(stored, dict):
            out = {k: None for k in stored}
        elif getattr(stored, "type_name", None) == "py.ordereddict" and not (stored.data or {}).get("items"):
            import collections

            attrs = (stored.data or {}).get("attrs")
            out = collections.OrderedDict((k, None) for k in stored.children if not (attrs is True and k == "__dict__"))
            for k, v in (attrs if isinstance(attrs, dict) else {}).items():
                setattr(out, k, v)  # (a file of before session 44: its attributes in the data)
    if isinstance(like, Mapping) and out is not None:
        kids = stored if isinstance(stored, dict) else getattr(stored, "children", {})
        for k in like:
            v = graft(out[k], like[k], kids.get(k), done, options)
            if v is not out[k]:
                out[k] = v
        return out
    if isinstance(like, (list, tuple)) and isinstance(out, (list, tuple)):
        items = [graft(o, l, s, done, options) for o, l, s in zip(out, like, stored if isinstance(stored, (list, tuple)) else [None] * len(out))]
        if isinstance(out, list):
            out[:] = items
            return out
        return type(out)._make(items) if hasattr(type(out), "_make") else type(out)(items)
    if _is_struct_node(like):
        # A node of load_structure's (a mask): its children are the record's fields, or the
        # keys of a mapping-like custom object (an OrderedDict state_dict).
        if isinstance(out, MutableMapping):
            # The mapping's keys: its children, or those of its `items` child (keys that are no
            # names, or one named `__dict__`); its attributes (`__dict__`) are no key.
            data = like.data if isinstance(like.data, dict) else {}
            kids, stored_kids = like.children, getattr(stored, "children", {})
            if data.get("items") is True and isinstance(kids.get("items"), Mapping):
                kids, stored_kids = kids["items"], stored_kids.get("items") if isinstance(stored_kids.get("items"), Mapping) else {}
            elif data.get("attrs") is True:
                kids = {k: v for k, v in kids.items() if k != "__dict__"}
            for k, l in kids.items():
                if k in out:
                    v = graft(out[k], l, stored_kids.get(k), done, options)
                    if v is not out[k]:
                        out[k] = v
            return out
        fields = like.children if like.kind == "record" else None
    else:
        fields = _fields_of(like)
    if fields is not None and out is not None and not isinstance(out, tuple):
        for k, l in fields.items():
            v = graft(getattr(out, k), l, getattr(stored, "children", {}).get(k), done, options)
            if v is not getattr(out, k):
                object.__setattr__(out, k, v)
    return out


def _where(path: str) -> str:
    return f"`{path}`" if path else "the root"


def _child(path: str, key: Any) -> str:
    """The key path of a list or tuple item (``key``: its index) or of a record field or custom
    node's child (``key``: its name), as the core writes it (``_core.key_text``)."""
    seg = str(key) if type(key) is int else _core.key_text(key)
    return f"{path}/{seg}" if path else seg


def _key_child(path: str, key: Any) -> str:
    """The key path of a dict entry: its key of any type (the int key 1 is ``~i1``, where the
    item 1 of a list is ``1``)."""
    seg = _core.key_text(key)
    return f"{path}/{seg}" if path else seg


def _a(word: str) -> str:
    return ("an " if word[:1] in "aeiou" else "a ") + word


def _kind(stored: Any) -> str:
    if isinstance(stored, LeafInfo):
        return f"{_a(stored.kind)} leaf"
    if hasattr(stored, "type_name") and hasattr(stored, "children"):
        return f"a {stored.kind} of type {stored.type_name}"
    return f"a {type(stored).__name__}"


def _take_all(stored: Any, keep: Set[str], path: Optional[str] = None) -> None:
    """Keep the whole stored subtree ``stored`` (at ``path``; default: its own ``path``): its
    leaves, its objects without children, and its empty lists and dicts, places of their own (a
    record whose fields are ``[]`` is built from them)."""
    if path is None:
        path = getattr(stored, "path", None)
    stack = [(stored, path)]
    while stack:
        s, p = stack.pop()
        if isinstance(s, LeafInfo):
            keep.add(s.path)
        elif isinstance(s, dict):
            if not s and p is not None:
                keep.add(p)
            # (paths only for what may be an empty container: leaves and objects hold theirs)
            stack.extend((v, _key_child(p, k) if p is not None and isinstance(v, (dict, list, tuple)) else None)
                         for k, v in s.items())
        elif isinstance(s, (list, tuple)):
            if not s and p is not None:
                keep.add(p)
            stack.extend((v, _child(p, i) if p is not None and isinstance(v, (dict, list, tuple)) else None)
                         for i, v in enumerate(s))
        elif not s.children:
            keep.add(s.path)
        else:
            stack.extend((v, _child(s.path, k) if isinstance(v, (dict, list, tuple)) else None)
                         for k, v in s.children.items())


def _stored_dtype(info: Any) -> np.dtype:
    d = info.dtype
    return _codec.np_dtype(d if d.startswith(("{", "[")) else json.dumps(d))


def _check_leaf(like: Any, info: Any, path: str) -> None:
    if isinstance(like, LeafInfo):
        if (like.kind, like.dtype, like.shape) != (info.kind, info.dtype, info.shape):
            raise ValueError(f"like=: at {_where(path)} the LeafInfo describes {like!r}, but the file holds {info!r}")
        return
    try:
        want_dtype = np.dtype(like.dtype)
        want_shape = tuple(int(n) for n in like.shape)
    except TypeError as e:
        raise TypeError(f"like=: at {_where(path)}, {type(like).__name__} has a shape and dtype numpy cannot read: {e}") from None
    if info.kind != "array":
        raise ValueError(
            f"like=: at {_where(path)} like= has an array ({want_dtype}, shape {want_shape}) but the file holds "
            f"{_kind(info)}; use True (or a LeafInfo) to load it as it is"
        )
    have_shape, have_dtype = tuple(info.shape), _stored_dtype(info)
    if have_shape != want_shape or have_dtype != want_dtype:
        raise ValueError(
            f"like=: at {_where(path)} the file holds {have_dtype} with shape {have_shape}, but like= asks for "
            f"{want_dtype} with shape {want_shape}; use True to load it as stored"
        )


#: Python scalars a like tree may hold in place of a stored scalar of the same kind (an example
#: tree used as the template): they load it.
_SCALAR_KINDS = {int: "int", float: "float", complex: "complex", str: "str", bytes: "bytes"}


def _is_array_like(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, type)


#: Built-in custom types that hold a mapping's items as their children (key paths read as the
#: dict's own): a like mapping walks into them as into a dict (a state_dict's OrderedDict).
_MAPPINGS = frozenset({"py.ordereddict", "py.counter", "py.defaultdict"})


def _walk(like: Any, stored: Any, path: str, keep: Set[str], into: Optional[Dict[str, Any]] = None, root: Any = None) -> None:
    if like is None or like is False:
        return
    if like is True:
        _take_all(stored, keep, path)
        return
    stored, ref_place = deref(stored, root)
    if ref_place is not None:
        # Loading the ref place loads the object it names (whole, at its own place too); the
        # template is checked against that object. `load_structure`'s own row for a ref place
        # (a LeafInfo of kind "ref", the usual start of a mask) asks for it as stored.
        keep.add(ref_place)
        if isinstance(like, LeafInfo) and like.kind == "ref":
            if like.path != ref_place:
                raise ValueError(f"like=: at {_where(path)} like= has load_structure's row of `{like.path}`, "
                                 f"a shared object's other place; use True to load it")
            return
        _walk(like, stored, path, set(), None, root)
        return
    if isinstance(stored, LeafInfo):
        h = for_type(type(like))
        if h is not None and h.like_leaf is not None:
            # A leaf of a framework's class (a torch tensor): its integration checks it against
            # the stored leaf, and may read into it in place.
            how = h.like_leaf(like, stored, _where(path))
            if how is not None:
                if how == "into" and into is not None:
                    into[stored.path] = (like, h.read_into)
                else:
                    keep.add(stored.path)
                return
        if isinstance(like, LeafInfo) or _is_array_like(like):
            _check_leaf(like, stored, path)
            keep.add(stored.path)
            return
        scalar = _SCALAR_KINDS.get(type(like))
        if scalar is not None:
            if scalar != stored.kind:
                raise ValueError(
                    f"like=: at {_where(path)} like= has {_a(type(like).__name__)} but the file holds {_kind(stored)}; "
                    "use True to load it as stored"
                )
            keep.add(stored.path)
            return
        if isinstance(like, (Mapping, list, tuple)) or _fields_of(like) is not None:
            raise ValueError(f"like=: at {_where(path)} like= has a {type(like).__name__} but the file holds {_kind(stored)}")
        raise TypeError(
            f"like=: at {_where(path)} got {type(like).__name__} {_short(like)}; a like leaf must be None or False (skip), "
            "True (load), a LeafInfo, an array-like with shape and dtype (numpy array, jax.ShapeDtypeStruct), "
            "or a value of the stored scalar's type (int, float, complex, str, bytes)"
        )
    if isinstance(stored, dict):
        if not isinstance(like, Mapping):
            raise ValueError(f"like=: at {_where(path)} the file holds a dict but like= has {_short_type(like)}")
        _same_keys(list(stored), list(like.keys()), path)
        if not stored:
            keep.add(path)  # (an empty dict is a place of its own, as a leaf)
        for k, v in stored.items():
            _walk(like[k], v, _key_child(path, k), keep, into, root)
        return
    if isinstance(stored, (list, tuple)):
        if not isinstance(like, type(stored)):
            raise ValueError(
                f"like=: at {_where(path)} the file holds a {type(stored).__name__} of {len(stored)} but like= has {_short_type(like)}"
            )
        if len(like) != len(stored):
            raise ValueError(
                f"like=: at {_where(path)} the file holds a {type(stored).__name__} of {len(stored)} items but like= has {len(like)}"
            )
        if not stored:
            keep.add(path)
        for i, (l, s) in enumerate(zip(like, stored)):
            _walk(l, s, _child(path, i), keep, into, root)
        return
    # A record or custom object (StructNode).
    if _is_struct_node(like):
        if (like.kind, like.type_name) != (stored.kind, stored.type_name):
            raise ValueError(f"like=: at {_where(path)} the file holds {_kind(stored)} but like= has {_kind(like)}")
        like_children = like.children
    elif stored.type_name in _MAPPINGS and isinstance(like, Mapping) and not (stored.data or {}).get("items"):
        like_children = like
        if (stored.data or {}).get("attrs") is True and "__dict__" in stored.children:
            # The mapping's own attributes (a state_dict's `_metadata`): loaded whole, whatever
            # the template holds.
            _take_all(stored.children["__dict__"], keep, _child(path, "__dict__"))
            attrs_only = {k: v for k, v in stored.children.items() if k != "__dict__"}
            _same_keys(list(attrs_only), list(like_children), path)
            for k, v in attrs_only.items():
                _walk(like_children[k], v, _child(path, k), keep, into, root)
            return
    else:
        like_children = _fields_of(like) if stored.kind == "record" else None
        if like_children is None:
            if stored.kind == "custom" and _custom_name(like) == stored.type_name:
                _take_all(stored, keep)  # an object of the stored type: load it
                return
            raise ValueError(f"like=: at {_where(path)} the file holds {_kind(stored)} but like= has {_short_type(like)}")
        if type_name(type(like)) != stored.type_name:
            raise ValueError(f"like=: at {_where(path)} the file holds {_kind(stored)} but like= has a {type_name(type(like))}")
    if not stored.children:
        keep.add(stored.path)
        return
    _same_keys(list(stored.children), list(like_children), path)
    for k, v in stored.children.items():
        _walk(like_children[k], v, _child(path, k), keep, into, root)


def _is_struct_node(x: Any) -> bool:
    return isinstance(x, StructNode)


def _fields_of(x: Any) -> Any:
    """A record's children as a save writes them (its fields, then the rest of its state), or
    None for anything that is not a record."""
    if isinstance(x, type) or isinstance(x, (dict, list)):
        return None
    try:
        d = records.describe(x, type(x), "", "")
    except TypeError:
        return None
    return dict(d[3]) if d is not None else None


def _custom_name(x: Any) -> Any:
    r = lookup_class(type(x))
    if r is not None:
        return r.name
    try:
        return _codec.encode_other(x, "", False)[1]
    except TypeError:
        return None


def _same_keys(stored: List[Any], like: List[Any], path: str) -> None:
    like_set, stored_set = set(like), set(stored)
    missing = [k for k in stored if k not in like_set]
    extra = [k for k in like if k not in stored_set]
    if missing:
        raise ValueError(
            f"like=: at {_where(path)} like= has no key {missing[0]!r}, which the file holds"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
            + "; set it to None to skip it"
        )
    if extra:
        raise ValueError(
            f"like=: at {_where(path)} like= has a key {extra[0]!r} that the file does not hold"
            + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else "")
            + "; leave it out of like= to load what the file holds (a model's tied weights or buffers a "
            "checkpoint left out: like={k: v for k, v in sd.items() if k in names}, then "
            "load_state_dict(..., strict=False))"
        )


def _short(x: Any) -> str:
    r = repr(x)
    return r if len(r) <= 60 else r[:57] + "..."


def _short_type(x: Any) -> str:
    if isinstance(x, (list, tuple)):
        return f"a {type(x).__name__} of {len(x)}"
    return f"a {type(x).__name__}"



# The helpers integrations use (through treepack._plugin).
where = _where
child_path = _child
key_child_path = _key_child
describe_stored = _kind
stored_dtype = _stored_dtype
take_all = _take_all


def check_subtree(like: Any, stored: Any, path: str, root: Any) -> None:
    """Check the ``like`` subtree at ``path`` against the stored one (``root``: the whole
    structure, for refs), as ``load(like=...)`` does; raises as it does."""
    _walk(like, stored, path, set(), None, root)
