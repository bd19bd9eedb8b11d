"""The custom-type registry and trust rules.

Resolution order (documented in docs/python.md): when saving an object, treepack walks
``type(obj).__mro__`` and uses the first class that has a registration — so the *most specific*
registered base class wins, whatever the registration order. ``registered()`` lists the
handlers so that every class comes before its registered base classes, ties kept in
registration order. A class has one handler: registering it under a second name is an error.
"""

from __future__ import annotations

import fnmatch
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

__all__ = ["Registration", "register", "registered", "lookup_class", "lookup_name", "type_name", "is_trusted"]


@dataclass(frozen=True)
class Registration:
    """One handler: the class it applies to (and its subclasses without one of their own), the
    name files record, and its two functions."""

    cls: type
    name: str
    to_data: Optional[Callable[[Any], Any]] = field(default=None, repr=False)
    from_data: Optional[Callable[[Any], Any]] = field(default=None, repr=False)
    #: File-backed handlers: ``save(obj, files) -> data`` and ``load(files) -> obj``.
    save: Optional[Callable[[Any, Any], Any]] = field(default=None, repr=False)
    load: Optional[Callable[[Any], Any]] = field(default=None, repr=False)


_lock = threading.Lock()
_by_class: Dict[type, Registration] = {}
_by_name: Dict[str, Registration] = {}
_order: List[Registration] = []


def register(
    cls: type,
    *,
    name: str,
    to_data: Optional[Callable[[Any], Any]] = None,
    from_data: Optional[Callable[[Any], Any]] = None,
    save: Optional[Callable[[Any, Any], Any]] = None,
    load: Optional[Callable[[Any], Any]] = None,
) -> None:
    """Register a custom type, stored one of two ways.

    As a tree: ``to_data(obj)`` returns a tree (JSON-able values and/or arrays) saved in place of
    the object; ``from_data(tree)`` rebuilds it.

    As files (images, audio, any file formats): ``save(obj, files)`` writes named files with
    ``files.write(name, bytes_or_stream)`` and may return a tree of inline data;
    ``load(files)`` rebuilds the object from ``files.open(name)`` / ``files.read(name)`` and
    ``files.data``. The files live in the tree's packs; identical files are stored once.

    ``name`` is what the file records; it must be unique, and a class has one handler. A type
    registered in this process is trusted when loading.
    """
    if (to_data is None) != (from_data is None) or (save is None) != (load is None) or (to_data is None) == (save is None):
        raise TypeError("register() takes to_data= and from_data= (the object as a tree), or save= and load= (the object as files)")
    if not isinstance(cls, type):
        raise TypeError(f"register() needs a class, got {cls!r}")
    if not name or name.startswith("py."):
        raise ValueError(f"invalid registration name {name!r} (the `py.` prefix is reserved for built-ins)")
    reg = Registration(cls, name, to_data, from_data, save, load)
    with _lock:
        old = _by_name.get(name)
        if old is not None and type_name(old.cls) != type_name(cls):
            raise ValueError(f"name {name!r} is already registered for {type_name(old.cls)}")
        prev = _by_class.get(cls)
        if prev is not None and prev.name != name:
            raise ValueError(
                f"{type_name(cls)} is already registered as {prev.name!r}: a class has one handler "
                f"(register it again under {prev.name!r} to replace that one)"
            )
        # The same name for the same class (or the same class defined again, as a notebook cell
        # re-run does) replaces the handler.
        for r in (old, prev):
            if r is not None and r in _order:
                _order.remove(r)
                _by_class.pop(r.cls, None)
                _by_name.pop(r.name, None)
        _by_class[cls] = reg
        _by_name[name] = reg
        _order.append(reg)


def registered() -> List[Registration]:
    """The handlers in resolution order, each with the class it applies to: every class before
    its registered base classes, ties in registration order."""
    with _lock:
        regs = list(_order)
    out: List[Registration] = []
    remaining = regs[:]
    while remaining:
        for r in remaining:
            # r can go next if no remaining registration is a strict subclass of r.cls
            if not any(o is not r and issubclass(o.cls, r.cls) for o in remaining):
                out.append(r)
                remaining.remove(r)
                break
    return out


def lookup_class(cls: type) -> Optional[Registration]:
    """The registration for an object's class: the most specific registered base by MRO."""
    with _lock:
        if not _by_class:
            return None
        for base in cls.__mro__:
            r = _by_class.get(base)
            if r is not None:
                return r
    return None


def lookup_name(name: str) -> Optional[Registration]:
    with _lock:
        return _by_name.get(name)


def type_name(cls: type) -> str:
    """How a class is named in files: ``module:qualname``."""
    return f"{cls.__module__}:{cls.__qualname__}"


def is_trusted(name: str, trust: Iterable[str]) -> bool:
    """True if ``name`` (``module:qualname``) matches a trust glob.

    Globs match the name as written (``mypkg.models:Point``) or in dotted form
    (``mypkg.models.Point``), so ``"mypkg.*"`` trusts everything in ``mypkg`` and below.
    """
    dotted = name.replace(":", ".")
    for g in trust:
        if fnmatch.fnmatchcase(name, g) or fnmatch.fnmatchcase(dotted, g):
            return True
    return False


def split_name(name: str) -> Tuple[str, str]:
    module, _, qual = name.partition(":")
    return module, qual
