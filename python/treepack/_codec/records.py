"""Records: dataclasses, attrs classes, namedtuples and pydantic models, saved with their whole
instance state and rebuilt as pickle rebuilds them.

A record node's children are the instance's fields (in declaration order), then every other
attribute it holds: the rest of its ``__dict__`` (``_name_or_path`` of a transformers config,
what ``__post_init__`` set) and its ``__slots__`` beyond the fields. A class with its own
``__getstate__`` is saved as that state (a dict of named values), and one with its own
``__setstate__`` gets it back through that method. pydantic models add their private
attributes and the set of fields given (``__pydantic_fields_set__``): records of a framework's
classes are described and built by its integration (``record_fields``, ``record_build``).

Loading never calls ``__init__`` or ``__post_init__`` (pickle does not either): a dataclass or
attrs instance is made with ``cls.__new__(cls)`` and its state put back, ``__dict__`` entries
straight into its ``__dict__`` and slots through ``object.__setattr__``; a namedtuple is made
from its fields; a pydantic model's fields are checked by its validators (on what the file
says), then it is made of the stored values as they are, its private attributes and fields set
put back.
"""

from __future__ import annotations

import array
import collections
import dataclasses
import sys
from typing import Any, Dict, List, Optional, Tuple

from .. import _registry as reg
from .._errors import UnsupportedObjectError

Pairs = List[Tuple[str, Any]]

#: Types outside ``builtins`` whose instances hold contents no ``__dict__`` or slot holds.
_CONTENT_TYPES = (collections.deque, array.array)


def is_attrs(cls: Any) -> bool:
    mod = sys.modules.get("attr")
    return mod is not None and isinstance(cls, type) and mod.has(cls)


def is_namedtuple(cls: type) -> bool:
    return isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields") and hasattr(cls, "_make")


def slot_names(cls: type) -> List[str]:
    """The instance slots a class and its bases declare (private names mangled), without
    ``__dict__`` and ``__weakref__``."""
    names: List[str] = []
    for c in cls.__mro__:
        slots = c.__dict__.get("__slots__")
        if slots is None:
            continue
        for n in (slots,) if isinstance(slots, str) else slots:
            if n in ("__dict__", "__weakref__"):
                continue
            if n.startswith("__") and not n.endswith("__"):
                n = f"_{c.__name__.lstrip('_')}{n}"
            if n not in names:
                names.append(n)
    return names


def _own(cls: type, method: str) -> bool:
    """Whether the class has its own ``__getstate__``/``__setstate__`` (not object's, and not
    the ones ``dataclass(slots=True)`` and attrs generate for slots, which set each attribute
    as treepack's state does)."""
    m = getattr(cls, method, None)
    if m is None or m is getattr(object, method, None):
        return False
    generated = getattr(m, "__qualname__", "").startswith("_dataclass_") or getattr(m, "__module__", "") == "attr._make"
    return not generated


def _instance_dict(obj: Any) -> Optional[Dict[str, Any]]:
    try:
        d = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        return None
    return d if isinstance(d, dict) else None


def state(obj: Any, fields: List[str], where: str) -> Pairs:
    """The record's children: its fields, then every other attribute of the instance."""
    t = type(obj)
    if _own(t, "__getstate__"):
        st = obj.__getstate__()
        if isinstance(st, tuple) and len(st) == 2 and (st[0] is None or isinstance(st[0], dict)) and isinstance(st[1], dict):
            st = {**(st[0] or {}), **st[1]}
        if not isinstance(st, dict) or not all(type(k) is str for k in st):
            raise UnsupportedObjectError(
                where, reg.type_name(t), f"{t.__module__}.{t.__qualname__}.__getstate__ returns a {type(st).__name__}, "
                "but treepack keeps an instance's state as named values (a dict with str keys); return one, "
                "register the class with treepack.register(...), or pass allow_pickle=True"
            )
        return list(st.items())
    out: Pairs = []
    seen = set()
    d = _instance_dict(obj)
    names = slot_names(t)
    slots = set(names) if d is not None and names else ()
    for name in fields:
        if d is not None and name in d:
            out.append((name, d[name]))
        elif d is not None and name not in slots:
            # Not the instance's own (a default that no __init__ set, init=False): read from
            # the class, before the save as after the load.
            continue
        else:
            try:
                out.append((name, getattr(obj, name)))
            except AttributeError:  # a field never set (init=False without a default)
                continue
        seen.add(name)
    if d:
        for k, v in d.items():
            if type(k) is not str:
                raise UnsupportedObjectError(
                    where, reg.type_name(t), f"its __dict__ holds a key that is not a str ({k!r}), which treepack does not "
                    "keep: use str attribute names, register the class with treepack.register(...), or pass allow_pickle=True")
            if k not in seen:
                out.append((k, v))
                seen.add(k)
    for k in names:
        if k in seen:
            continue
        try:
            v = object.__getattribute__(obj, k)
        except AttributeError:  # an empty slot stays empty
            continue
        out.append((k, v))
    return out


def _no_builtin_contents(t: type, where: str) -> None:
    """A dataclass or attrs class that also derives from a built-in type holding contents of its
    own (a list's items, a str's text, an int's value, a set's members, an exception's ``args``)
    is refused: a record keeps its fields and attributes, and those contents would be lost. (A
    dict subclass is saved as a mapping, its items kept.)"""
    for base in t.__mro__[1:]:
        if base is not object and (base.__module__ == "builtins" or base in _CONTENT_TYPES):
            raise UnsupportedObjectError(
                where, reg.type_name(t), f"{t.__module__}.{t.__qualname__} is a "
                f"{'dataclass' if dataclasses.is_dataclass(t) else 'attrs class'} that also derives from "
                f"{base.__qualname__}, whose contents a record does not keep (only its fields and attributes); "
                f"hold the {base.__qualname__} in a field instead, register the class with treepack.register(...), "
                "or pass allow_pickle=True"
            )


def describe(obj: Any, t: type, where: str, name: str) -> Optional[Tuple[str, str, None, Pairs]]:
    """``encode_other``'s description of a record, or None when ``obj`` is none.

    Kind ``record``: rebuilt as an empty instance first, then filled (a cycle through it can be
    rebuilt). Kind ``record_built``: made from its children's values (namedtuples, pydantic
    models), so a cycle through it is refused at save."""
    # A class with its own `__setstate__` gets a copy of its state, so a cycle through it could
    # not be rebuilt: it is made from its children, as a namedtuple is.
    kind = "record_built" if _own(t, "__setstate__") else "record"
    if (dataclasses.is_dataclass(obj) and not isinstance(obj, type)) or is_attrs(t):
        _no_builtin_contents(t, where)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return (kind, name, None, state(obj, [f.name for f in dataclasses.fields(obj)], where))
    if is_attrs(t):
        import attr

        return (kind, name, None, state(obj, [a.name for a in attr.fields(t)], where))
    h = reg.for_type(t)
    if h is not None and h.record_fields is not None:
        kids = h.record_fields(obj, where)  # (a pydantic model: made from its fields, validated)
        if kids is not None:
            return ("record_built", name, None, kids)
    if isinstance(obj, tuple) and hasattr(t, "_fields"):
        kids: Pairs = list(zip(t._fields, obj))
        d = _instance_dict(obj)
        if d:
            kids += [(k, v) for k, v in d.items() if k not in t._fields]
        return ("record_built", name, None, kids)
    return None


def _integration_record(cls: type) -> Any:
    """The integration whose framework's records ``cls`` makes (a pydantic model), or None."""
    h = reg.for_type(cls) if isinstance(cls, type) else None
    return h if h is not None and h.record_class is not None and h.record_class(cls) else None


def is_record_class(cls: type) -> bool:
    return dataclasses.is_dataclass(cls) or is_namedtuple(cls) or _integration_record(cls) is not None or is_attrs(cls)


#: ``_declared`` by class (a class is looked at once, not per record loaded).
_DECLARED: Dict[type, Tuple[Tuple[str, ...], frozenset]] = {}


def _declared(cls: type) -> Tuple[Tuple[str, ...], frozenset]:
    """(the fields a dataclass or attrs class declares, those of them a stored record must
    hold): once per class, not per record loaded. A field may be missing where the class itself
    holds its default (a plain default of a field that is no slot, which reads as that
    default), or where ``__init__`` does not set it (``init=False``: the saved instance may
    never have had it)."""
    if dataclasses.is_dataclass(cls):
        slots = set(slot_names(cls))
        fields = [(f.name, f.init and (f.default is dataclasses.MISSING or f.name in slots))
                  for f in dataclasses.fields(cls)]
    elif is_attrs(cls):
        import attr

        fields = [(a.name, a.init) for a in attr.fields(cls)]
    else:
        fields = []
    out = _DECLARED[cls] = (tuple(n for n, _ in fields), frozenset(n for n, needed in fields if needed))
    return out


def _lacking_fields(cls: type, kids: Dict[str, Any], declared: Tuple[str, ...], needed: frozenset) -> ValueError:
    """The refusal of a stored dataclass or attrs record that lacks a field the class declares
    and the instance could not do without: the class changed since the save (a field renamed
    or added; see ``_declared``)."""
    missing = [name for name in declared if name in needed and name not in kids]
    others = sorted(k for k in kids if k not in declared)
    return ValueError(
        f"the stored record lacks the fields {missing} of {cls.__qualname__}"
        + (f" and holds {others[:5]} it does not declare" if others else "")
        + ": the class changed since the save (a field renamed, or added without a plain default)"
    )


def build(cls: type, kids: Dict[str, Any]) -> Any:
    """The instance a record node stands for (see the module's docs)."""
    if is_namedtuple(cls):
        missing = [f for f in cls._fields if f not in kids]
        if missing:
            raise ValueError(f"the stored record lacks the fields {missing} of {cls.__qualname__}")
        obj = cls._make(kids[f] for f in cls._fields)
        extra = {k: v for k, v in kids.items() if k not in cls._fields}
        if extra:
            d = _instance_dict(obj)
            if d is None:
                raise ValueError(f"{cls.__qualname__} instances hold no attributes, but the file gives {sorted(extra)}")
            d.update(extra)
        return obj
    h = _integration_record(cls)
    if h is not None:
        return h.record_build(cls, kids)
    obj = cls.__new__(cls)
    if _own(cls, "__setstate__"):
        obj.__setstate__(dict(kids))
        return obj
    declared, needed = _DECLARED.get(cls) or _declared(cls)
    if not kids.keys() >= needed:
        raise _lacking_fields(cls, kids, declared, needed)
    slots = set(slot_names(cls))
    d = _instance_dict(obj)
    for k, v in kids.items():
        if k in slots:
            object.__setattr__(obj, k, v)
        elif d is not None:
            d[k] = v
        else:
            raise ValueError(f"{cls.__qualname__} has no slot {k!r} and no __dict__ to hold it")
    return obj
