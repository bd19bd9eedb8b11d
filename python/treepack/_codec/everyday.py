"""The everyday types pickle handles that are not plain trees: ``collections`` mappings and
deques, fractions, memoryviews and numpy's datetime64/timedelta64 arrays, masked arrays, dtype
objects and object arrays (their shape and their elements as tree values). Each is a ``py.<name>`` custom node built from data alone: no code named by the file
runs (a ``defaultdict`` whose factory is a class needs that class trusted)."""

from __future__ import annotations

import collections
import json
import re
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from .. import _core
from .. import _registry as reg
from .._errors import UnsupportedObjectError
from . import records
from .classes import check_kind, resolve_class
from .dtypes import _dtype_desc, np_dtype

Description = Tuple[str, str, Optional[str], List[Tuple[str, Any]]]

#: ``defaultdict`` factories stored by name and rebuilt without trust.
FACTORIES: Dict[str, type] = {
    t.__name__: t for t in (list, dict, set, frozenset, tuple, int, float, complex, str, bytes, bytearray, bool)
}
_FACTORY_NAMES = {t: n for n, t in FACTORIES.items()}

NAMES = frozenset(
    {"py.ordereddict", "py.counter", "py.defaultdict", "py.deque", "py.fraction", "py.datetime64",
     "py.masked", "py.npdtype", "py.objarray", "py.str", "py.dict", "py.mapping", "py.np_generator",
     "py.np_random_state"}
)

#: numpy's bit generators, by name: a ``py.np_generator`` node names one of these.
_BIT_GENERATORS = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")

_UNITS = frozenset({"Y", "M", "W", "D", "h", "m", "s", "ms", "us", "ns", "ps", "fs", "as", "generic"})
_TIME_DTYPE = re.compile(r"^[<>=|]?[Mm]8(\[[0-9]*[A-Za-z]+\])?$")


def _mapping(obj: Dict[Any, Any], data: Dict[str, Any]) -> Tuple[Optional[str], List[Tuple[str, Any]]]:
    """An OrderedDict's, Counter's or defaultdict's data and children (``_mapping_kids``)."""
    kids = _mapping_kids(obj, _attrs(obj), data)
    return json.dumps(data) if data else None, kids


def _mapping_kids(items: Dict[Any, Any], attrs: Dict[str, Any], data: Dict[str, Any]) -> List[Tuple[str, Any]]:
    """A mapping's children: its items by key when every key is a string and none is
    ``__dict__`` (so key paths read as the dict's own: ``sd/layer1.weight``), else one ``items``
    child holding a plain dict; then its attributes (``_attrs``) as a ``__dict__`` child, each a
    value of the tree like any other (torch's ``state_dict()._metadata``, an OrderedDict, comes
    back one, in its order). Files of before session 44 hold an OrderedDict's, Counter's or
    defaultdict's attributes as JSON in the node's data (``_set_attrs`` reads them)."""
    if all(type(k) is str for k in items) and "__dict__" not in items:
        kids = list(items.items())
    else:
        data["items"] = True
        kids = [("items", dict(items))]
    if attrs:
        data["attrs"] = True
        kids.append(("__dict__", attrs))
    return kids


def _attrs(obj: Any, skip: Tuple[str, ...] = ()) -> Dict[str, Any]:
    """The attributes an instance holds: its ``__dict__`` (less ``skip``), then its slots."""
    d = records._instance_dict(obj) or {}
    out = {k: v for k, v in d.items() if k not in skip}
    if not all(type(k) is str for k in out):
        raise TypeError("its __dict__ holds a key that is not a str")
    for k in records.slot_names(type(obj)):
        if k not in out:
            try:
                out[k] = object.__getattribute__(obj, k)
            except AttributeError:  # an empty slot stays empty
                continue
    return out


def _split_attrs(data: Optional[Dict[str, Any]], kids: Dict[str, Any]) -> Tuple[Dict[Any, Any], Dict[str, Any]]:
    """A mapping node's items and attributes (a ``__dict__`` child, or JSON in the data of an
    older file)."""
    data = data or {}
    attrs: Any = data.get("attrs")
    if attrs is True:
        kids = dict(kids)
        attrs = kids.pop("__dict__", None)
    items = kids.get("items") if data.get("items") else kids
    if not isinstance(items, dict) or not isinstance(attrs or {}, dict):
        raise ValueError("a mapping's items and attributes must be dicts")
    return items, attrs or {}


def _set_attrs(obj: Any, attrs: Dict[str, Any]) -> Any:
    """Put ``attrs`` back: slots through ``object.__setattr__``, the rest into the instance's
    ``__dict__`` (no class's own ``__setattr__`` runs)."""
    if attrs:
        slots = set(records.slot_names(type(obj)))
        d = records._instance_dict(obj)
        for k, v in attrs.items():
            if k in slots:
                object.__setattr__(obj, k, v)
            elif d is not None and type(k) is str:
                d[k] = v
            else:
                raise ValueError(f"{type(obj).__qualname__} instances hold no attribute {k!r:.60}, but the file gives one")
    return obj


def _factory_name(f: Any) -> Optional[str]:
    """A defaultdict's ``default_factory`` by name (None for none)."""
    if f is None:
        return None
    if isinstance(f, type) and f in _FACTORY_NAMES:
        return _FACTORY_NAMES[f]
    if isinstance(f, type) and "<locals>" not in f.__qualname__:
        return reg.type_name(f)
    raise TypeError(
        f"its default_factory {f!r} is neither a built-in type nor an importable class; use one "
        "(list, int, a class), or convert it with dict(obj)"
    )


def _factory(name: Any, trusted: Callable[[str], bool]) -> Tuple[Any, Optional[str]]:
    """The default_factory ``name`` stands for, or (None, why it cannot be had)."""
    if name is None:
        return None, None
    if name in FACTORIES:
        return FACTORIES[name], None
    if not isinstance(name, str) or not trusted(name):
        return None, "defaultdict factory type is not trusted (pass trust=[...])"
    try:
        factory = resolve_class(name)
        check_kind(factory, name, "defaultdict factory")
    except LookupError as e:
        return None, str(e)
    return factory, None


def _time_dtype(kind: str, unit: str, count: int) -> np.dtype:
    if kind not in ("M", "m") or unit not in _UNITS or not isinstance(count, int) or not 1 <= count < 2**31:
        raise ValueError(f"bad datetime64/timedelta64 description {(kind, unit, count)!r}")
    return np.dtype(f"<{kind}8[{count}{unit}]" if unit != "generic" else f"<{kind}8")


def encode(obj: Any, t: type, where: str) -> Optional[Description]:
    """The description of `obj` if it is one of these types, else None."""
    try:
        return _encode(obj, t)
    except TypeError as e:
        # (refused by what it is: named with the save's other refusals)
        raise UnsupportedObjectError(where, reg.type_name(t), f"a {reg.type_name(t)}: {e}") from None


def _encode(obj: Any, t: type) -> Optional[Description]:
    if t is str:
        # Only strings JSON cannot hold reach here: lone surrogates, as `os.fsdecode` makes of
        # file names that are not UTF-8 (pickle keeps them too). Their surrogatepass bytes.
        return ("custom", "py.str", None, [("utf8", obj.encode("utf-8", "surrogatepass"))])
    if t is collections.OrderedDict:
        return ("custom", "py.ordereddict", *_mapping(obj, {}))
    if t is collections.Counter:
        return ("custom", "py.counter", *_mapping(obj, {}))
    if t is collections.defaultdict:
        return ("custom", "py.defaultdict", *_mapping(obj, {"factory": _factory_name(obj.default_factory)}))
    if t is dict:
        # Keys that are no format keys (numpy scalars, enum members): the items as pairs of
        # tree values, so each key keeps its type.
        return ("custom", "py.dict", None, [("items", [(k, v) for k, v in obj.items()])])
    if t is np.random.Generator:
        bg = obj.bit_generator
        name = type(bg).__name__
        if name not in _BIT_GENERATORS or type(bg) is not getattr(np.random, name):
            raise TypeError(f"its bit generator {type(bg).__qualname__} is not one of numpy's ({', '.join(_BIT_GENERATORS)})")
        return ("custom", "py.np_generator", json.dumps({"bit_generator": name}), [("state", bg.state)])
    if t is np.random.RandomState:
        return ("custom", "py.np_random_state", None, [("state", obj.get_state(legacy=False))])
    if t is collections.deque:
        return ("custom", "py.deque", json.dumps({"maxlen": obj.maxlen}), [("items", list(obj))])
    # A Fraction exists only once `fractions` is imported: a save never imports it to ask.
    if t is getattr(sys.modules.get("fractions"), "Fraction", None):
        return ("custom", "py.fraction", None, [("numerator", obj.numerator), ("denominator", obj.denominator)])
    if t is memoryview:
        return ("value", "", None, [("value", obj.tobytes())])
    if isinstance(obj, np.dtype):
        if obj.kind in "Mm":
            return ("custom", "py.npdtype", json.dumps({"time": obj.str}), [])
        return ("custom", "py.npdtype", json.dumps({"dtype": _dtype_desc(obj)[0]}), [])
    if t is np.memmap:
        # A memory-mapped array is its values (no copy: the save reads the mapped pages).
        return ("value", "", None, [("value", np.asarray(obj))])
    if isinstance(obj, np.ma.MaskedArray):
        if t is not np.ma.MaskedArray:
            return None
        mask = np.ma.getmask(obj)
        kids: List[Tuple[str, Any]] = [("data", np.asarray(obj.data))]
        kids.append(("mask", np.ma.getmaskarray(obj) if mask is not np.ma.nomask else False))
        kids.append(("fill_value", obj.fill_value))
        return ("custom", "py.masked", json.dumps({"hard_mask": bool(obj.hardmask)}), kids)
    if t is np.ndarray and obj.dtype == object:
        # Each element is a value of the tree like any other (strict: no pickle), in C order.
        return ("custom", "py.objarray", json.dumps({"shape": list(obj.shape)}), [("items", obj.ravel().tolist())])
    if isinstance(obj, (dict, collections.UserDict)) and t not in (collections.OrderedDict, collections.Counter, collections.defaultdict):
        return _mapping_subclass(obj, t)
    if isinstance(obj, (np.ndarray, np.datetime64, np.timedelta64)) and obj.dtype.kind in "Mm":
        if isinstance(obj, np.ndarray) and t is not np.ndarray:
            return None
        unit, count = np.datetime_data(obj.dtype)
        a = np.asarray(obj).astype(_time_dtype(obj.dtype.kind, unit, count), copy=False)
        values = np.ascontiguousarray(a).view("<i8") if a.ndim else a.reshape(1).view("<i8").reshape(())
        data = {"kind": obj.dtype.kind, "unit": unit, "count": count}
        if isinstance(obj, np.generic):
            data["scalar"] = True
        return ("custom", "py.datetime64", json.dumps(data), [("values", values)])
    return None


def _mapping_subclass(obj: Any, t: type) -> Description:
    """A dict subclass (scikit-learn's ``Bunch``) or a ``collections.UserDict`` (transformers'
    ``BatchEncoding``) as ``py.mapping``: its class by name (rebuilt when trusted), its items as
    children (by key when every key is a str, so key paths read as the dict's own; else one
    ``items`` child holding a plain dict), and its other attributes as a ``__dict__`` child."""
    if "<locals>" in t.__qualname__:
        raise TypeError("it is a mapping class defined inside a function, which a load cannot find; use a module-level class or dict(obj)")
    user = isinstance(obj, collections.UserDict)
    items = obj.data if user else dict.copy(obj)
    data: Dict[str, Any] = {"class": reg.type_name(t)}
    if isinstance(obj, collections.defaultdict):
        data["factory"] = _factory_name(obj.default_factory)
    kids = _mapping_kids(items, _attrs(obj, ("data",) if user else ()), data)
    return ("custom", "py.mapping", json.dumps(data), kids)


def _mapping_build(cls: type, data: Dict[str, Any], kids: Dict[str, Any], factory: Any) -> Any:
    """A ``py.mapping``'s instance, made with ``cls.__new__`` and filled through the base
    type's own store (an OrderedDict's keeps its order list; no subclass's ``__setitem__`` runs)."""
    items, attrs = _split_attrs(data, kids)
    obj = cls.__new__(cls)
    if issubclass(cls, collections.OrderedDict):
        for k, v in items.items():
            collections.OrderedDict.__setitem__(obj, k, v)
    elif issubclass(cls, dict):
        dict.update(obj, items)
    else:
        object.__getattribute__(obj, "__dict__")["data"] = dict(items)
    if issubclass(cls, collections.defaultdict):
        collections.defaultdict.default_factory.__set__(obj, factory)
    return _set_attrs(obj, attrs)


def decode(t: str, data: Any, kids: Dict[str, Any], trusted: Callable[[str], bool], missing: Callable[..., Any]) -> Any:
    """Rebuild a ``py.<name>`` node of this module (`t` in NAMES)."""
    if t == "py.dict":
        items = kids.get("items")
        if not isinstance(items, list) or not all(isinstance(p, tuple) and len(p) == 2 for p in items):
            raise ValueError("py.dict: the items must be a list of (key, value) pairs")
        _core.few_same_hashes([k for k, _ in items], "a dict")
        out = dict(items)
        if len(out) != len(items):
            raise ValueError("py.dict: two items have equal keys")
        return out
    if t == "py.mapping":
        name = (data or {}).get("class")
        if not isinstance(name, str):
            raise ValueError("py.mapping: the node names no class")
        if not trusted(name):
            return missing(name, kids, "mapping type is not trusted (pass trust=[...])")
        try:
            cls = resolve_class(name)
            check_kind(cls, name, "mapping")
        except LookupError as e:
            return missing(name, kids, str(e))
        factory, why = _factory((data or {}).get("factory"), trusted)
        if why is not None:
            return missing(data["factory"], kids, why)
        return _mapping_build(cls, data, kids, factory)
    if t == "py.np_generator":
        name = (data or {}).get("bit_generator")
        if name not in _BIT_GENERATORS:
            raise ValueError(f"py.np_generator: unknown bit generator {name!r}")
        bg = getattr(np.random, name)()
        bg.state = kids["state"]
        return np.random.Generator(bg)
    if t == "py.np_random_state":
        rs = np.random.RandomState()
        rs.set_state(kids["state"])
        return rs
    if t == "py.ordereddict":
        items, attrs = _split_attrs(data, kids)
        return _set_attrs(collections.OrderedDict(items), attrs)
    if t == "py.counter":
        items, attrs = _split_attrs(data, kids)
        return _set_attrs(collections.Counter(items), attrs)
    if t == "py.defaultdict":
        items, attrs = _split_attrs(data, kids)
        factory, why = _factory((data or {}).get("factory"), trusted)
        if why is not None:
            return missing(data["factory"], items, why)
        return _set_attrs(collections.defaultdict(factory, items), attrs)
    if t == "py.deque":
        maxlen = data.get("maxlen") if isinstance(data, dict) else None
        if not isinstance(kids.get("items"), list) or not (maxlen is None or (type(maxlen) is int and maxlen >= 0)):
            raise ValueError("py.deque: the items must be a list and maxlen a count or null")
        return collections.deque(kids["items"], maxlen)
    if t == "py.fraction":
        import fractions

        # Two integers, as saved. Given a string, Fraction parses it: "1e999999999" would be
        # a power of ten computed digit by digit for hours, from a few bytes of manifest.
        num, den = kids.get("numerator"), kids.get("denominator")
        if type(num) is not int or type(den) is not int or den <= 0:
            raise ValueError(f"py.fraction: the numerator and denominator must be integers, the denominator "
                             f"positive; the file holds {num!r:.40} and {den!r:.40}")
        return fractions.Fraction(num, den)
    if t == "py.npdtype":
        if "time" in data:
            if not isinstance(data["time"], str) or not _TIME_DTYPE.match(data["time"]):
                raise ValueError(f"bad numpy time dtype {data['time']!r}")
            return np.dtype(data["time"])
        return np_dtype(json.dumps(data["dtype"], separators=(",", ":")))
    if t == "py.masked":
        return np.ma.MaskedArray(kids["data"], mask=kids["mask"], fill_value=kids["fill_value"], hard_mask=data["hard_mask"])
    if t == "py.str":
        b = kids.get("utf8")
        if not isinstance(b, bytes):
            raise ValueError("py.str: the string's bytes must be a bytes leaf")
        try:
            return b.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError as e:
            raise ValueError(f"py.str: the bytes are not UTF-8, even with lone surrogates ({e})") from None
    if t == "py.objarray":
        shape, items = data.get("shape") if isinstance(data, dict) else None, kids.get("items")
        if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape) or not isinstance(items, list):
            raise ValueError("an object array needs a list of dimensions and a list of items")
        n = 0 if 0 in shape else 1
        for d in shape if len(shape) <= 64 else [-1]:  # numpy's limit is 64 dimensions
            n = n * d if 0 < n <= len(items) else n  # stops growing once too big: no huge products
        if n != len(items):
            raise ValueError(f"an object array of shape {tuple(shape[:65])} cannot hold {len(items)} items")
        out = np.empty(len(items), dtype=object)
        for i, v in enumerate(items):  # one by one: a list item must stay one element
            out[i] = v
        return out.reshape(shape)
    if t == "py.datetime64":
        dt = _time_dtype(data["kind"], data["unit"], data["count"])
        values = kids["values"]
        if not isinstance(values, np.ndarray) or values.dtype != np.dtype("<i8"):
            raise ValueError("datetime64 values must be an int64 array")
        out = values.view(dt)
        return out[()] if data.get("scalar") else out
    raise AssertionError(t)
