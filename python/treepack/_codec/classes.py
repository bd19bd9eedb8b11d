"""The classes a file names (records, enums, mappings, defaultdict factories, pytree nodes): found
by ``resolve_class`` — the class defined where the name says, nothing else — and checked by
``check_kind`` before anything of them is called."""

from __future__ import annotations

import collections
import enum
import importlib
import re
import sys
from typing import Any, Dict

from .. import _registry as reg
from . import records

#: Classes seen while saving in this process, by name: lets locally defined (non-importable)
#: classes be rebuilt once they are trusted.
_seen_classes: Dict[str, type] = {}


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _bad_name(name: str, why: str) -> LookupError:
    return LookupError(f"class {name} cannot be used: {why}")


#: A class's own namespace, module and qualified name, read through ``type``'s descriptors:
#: nothing the object or its metaclass defines runs.
_CLASS_DICT = type.__dict__["__dict__"].__get__
_CLASS_MODULE = type.__dict__["__module__"].__get__
_CLASS_QUALNAME = type.__dict__["__qualname__"].__get__


def _is_class(obj: Any) -> bool:
    """Whether ``obj`` is a class, asked of its type alone: ``isinstance(obj, type)`` reads
    ``obj.__class__``, which a lazy proxy (django's settings, werkzeug's ``LocalProxy``,
    ``lazy_object_proxy``) answers by running its factory."""
    return issubclass(type(obj), type)


def resolve_class(name: str) -> type:
    """The class a trusted ``module:qualname`` names: the class **defined** there, nothing else.

    The module is imported by its own name (it was trusted) and the qualified name is looked up
    in the module's namespace and then in each enclosing class's own namespace — never by
    attribute access through another module or an instance, and without running any
    ``__getattr__`` or descriptor. The object found must be a class whose ``__module__`` and
    ``__qualname__`` are the stored name's. So ``trust=["mypkg.*"]`` reaches the classes defined
    in ``mypkg`` and its submodules, not ``subprocess.Popen`` because ``mypkg`` imports
    ``subprocess`` (``mypkg:subprocess.Popen`` is refused). A class defined in a function (or
    otherwise not importable) is found only if this process saved one of that name."""
    module, qual = reg.split_name(name)
    parts = qual.split(".")
    if not module or not qual or not all(_IDENT.match(p) for p in module.split(".")):
        raise _bad_name(name, "not a `module:qualname` name of Python identifiers")
    seen = _seen_classes.get(name)
    if not all(_IDENT.match(p) for p in parts):
        if seen is not None:  # `f.<locals>.C`, saved by this process
            return seen
        raise _bad_name(name, "the class is defined inside a function and was not saved by this process")
    obj: Any = sys.modules.get(module)
    if obj is None and any(p.startswith("__") and p.endswith("__") for p in module.split(".")):
        # Importing `pkg.__main__` runs a program; a script's own `__main__` is always loaded.
        raise _bad_name(name, f"a load never imports a module named like {module}")
    try:
        if obj is None:
            # Each enclosing package first, and only a package: Python's import asks a parent
            # for its `__path__`, which in a plain module runs the module's `__getattr__`.
            steps = module.split(".")
            for i in range(1, len(steps)):
                parent = ".".join(steps[:i])
                outer = sys.modules.get(parent) or importlib.import_module(parent)
                if "__path__" not in vars(outer):
                    raise _bad_name(name, f"{parent} is a module, not a package, so it has no module {steps[i]}")
            obj = importlib.import_module(module)
    except ImportError as e:
        if seen is not None:
            return seen
        raise LookupError(f"class {name} cannot be found: module {module} cannot be imported ({e})") from None
    namespace, where = vars(obj), module
    for i, part in enumerate(parts):
        obj = namespace.get(part)
        if obj is None:
            if seen is not None:
                return seen
            raise LookupError(f"class {name} cannot be found: {where} defines no {part} (renamed or removed?)")
        where = f"{module}:{'.'.join(parts[: i + 1])}"
        if i + 1 < len(parts):
            if not _is_class(obj):
                raise _bad_name(name, f"{where} is a {type(obj).__name__}, not a class, so {qual} is not defined in {module}")
            namespace = _CLASS_DICT(obj)
    if not _is_class(obj):
        raise _bad_name(name, f"it is a {type(obj).__name__}, not a class")
    found_module, found_qual = _CLASS_MODULE(obj), _CLASS_QUALNAME(obj)
    if found_module != module or found_qual != qual:
        raise _bad_name(
            name,
            f"the name leads to {found_module}:{found_qual}, which is defined elsewhere (a name only "
            "reaches the class defined where it says)",
        )
    return obj


def check_kind(cls: type, name: str, kind: str) -> None:
    """Refuse a class that is not the kind of object its node builds, before anything of it is
    called: an enum node's class must be an ``Enum``, a record's a dataclass, a namedtuple or
    a pydantic model, a defaultdict's factory a class."""
    if kind == "enum":
        ok, what = _is_class(cls) and issubclass(cls, enum.Enum), "an Enum"
    elif kind == "mapping":
        ok, what = _is_class(cls) and issubclass(cls, (dict, collections.UserDict)), "a dict or UserDict subclass"
    elif kind == "record":
        ok, what = records.is_record_class(cls), "a dataclass, an attrs class, a namedtuple or a pydantic model"
    else:
        ok, what = _is_class(cls), "a class"
    if not ok:
        raise _bad_name(name, f"a {kind} node builds {what}, and this class is not one")
