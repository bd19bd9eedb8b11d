"""Python-side encoding of the types the Rust walker does not handle itself, and decoding back.

Built-in Python types are stored as custom nodes named ``py.<type>`` (always allowed: treepack's
own decoders build them, nothing is imported). Dataclasses and namedtuples are records named
``module:qualname``; enums are ``py.enum`` nodes naming their class; both are rebuilt only when
trusted. Registered types are custom nodes named by their registration.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import decimal
import enum
import importlib
import json
import pathlib
import pickle
import sys
import uuid
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from . import _registry as reg

_PATH_CLASSES = {
    "PosixPath": pathlib.PosixPath,
    "WindowsPath": pathlib.WindowsPath,
    "PurePosixPath": pathlib.PurePosixPath,
    "PureWindowsPath": pathlib.PureWindowsPath,
}

#: Classes seen while saving in this process, by name: lets locally defined (non-importable)
#: classes be rebuilt once they are trusted.
_seen_classes: Dict[str, type] = {}

BUILTIN_TYPES = frozenset(
    {
        "py.bytearray", "py.set", "py.frozenset", "py.range", "py.slice", "py.ellipsis",
        "py.datetime", "py.date", "py.time", "py.timedelta", "py.timezone", "py.decimal",
        "py.uuid", "py.path", "py.npscalar", "py.enum", "py.pickle",
    }
)
# Built-in types that `audit` accepts whatever their data says (enum and pickle name classes).
AUDIT_FREE = BUILTIN_TYPES - {"py.enum", "py.pickle"}


class Unloadable:
    """Placeholder for an object whose type is unknown or untrusted (``on_missing="placeholder"``)."""

    __slots__ = ("type_name", "data", "reason")

    def __init__(self, type_name: str, data: Any, reason: str) -> None:
        self.type_name = type_name
        self.data = data
        self.reason = reason

    def __repr__(self) -> str:
        return f"Unloadable({self.type_name!r}, reason={self.reason!r})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Unloadable)
            and (self.type_name, self.reason) == (other.type_name, other.reason)
            and _eq(self.data, other.data)
        )

    __hash__ = None  # type: ignore[assignment]


def _eq(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # numpy arrays
        return False


def _tz_data(tz: Optional[_dt.tzinfo]) -> Any:
    if tz is None:
        return None
    key = getattr(tz, "key", None)  # zoneinfo.ZoneInfo
    if isinstance(key, str):
        return {"zone": key}
    if isinstance(tz, _dt.timezone):
        off = tz.utcoffset(None)
        return {"offset": [off.days, off.seconds, off.microseconds], "name": tz.tzname(None)}
    raise TypeError(f"cannot save timezone {tz!r}: only datetime.timezone and zoneinfo.ZoneInfo are supported")


_TZ_CACHE: Dict[Any, Optional[_dt.tzinfo]] = {}


def _tz_from(d: Any) -> Optional[_dt.tzinfo]:
    # Traced data repeats a handful of zones over thousands of datetimes: memoise.
    if d is None:
        return None
    try:
        key = (d.get("zone"), tuple(d.get("offset") or ()), d.get("name"))
    except (AttributeError, TypeError):
        key = None
    if key is not None and key in _TZ_CACHE:
        return _TZ_CACHE[key]
    tz = _tz_build(d)
    if key is not None and len(_TZ_CACHE) < 1024:
        _TZ_CACHE[key] = tz
    return tz


def _tz_build(d: Any) -> Optional[_dt.tzinfo]:
    if "zone" in d:
        import zoneinfo

        return zoneinfo.ZoneInfo(d["zone"])
    days, secs, us = d["offset"]
    off = _dt.timedelta(days=days, seconds=secs, microseconds=us)
    name = d.get("name")
    if name is None or name == _dt.timezone(off).tzname(None):
        return _dt.timezone(off)
    return _dt.timezone(off, name)


def encode_other(obj: Any, where: str, allow_pickle: bool) -> Tuple[str, str, Optional[str], List[Tuple[str, Any]]]:
    """Describe an object the Rust walker does not know: (kind, type, data JSON, children)."""
    t = type(obj)
    r = reg.lookup_class(t)
    if r is not None:
        try:
            data = r.to_data(obj)
        except Exception as e:
            raise TypeError(
                f"cannot save `{where}`: to_data of the type registered as {r.name!r} ({reg.type_name(t)}) "
                f"raised {type(e).__name__}: {e}"
            ) from e
        return ("custom", r.name, None, [("data", data)])
    if t is bytearray:
        return ("custom", "py.bytearray", None, [("data", bytes(obj))])
    if t is set or t is frozenset:
        return ("custom", "py." + t.__name__, None, [(str(i), v) for i, v in enumerate(obj)])
    if t is range:
        return ("custom", "py.range", None, [("start", obj.start), ("stop", obj.stop), ("step", obj.step)])
    if t is slice:
        return ("custom", "py.slice", None, [("start", obj.start), ("stop", obj.stop), ("step", obj.step)])
    if obj is Ellipsis:
        return ("custom", "py.ellipsis", None, [])
    if t is _dt.datetime:
        naive = obj.replace(tzinfo=None)
        if obj.fold == 0 and (obj.tzinfo is None or obj.tzinfo is _dt.timezone.utc):
            # Compact form: naive isoformat, `Z` suffix for timezone.utc (as the Rust fast path).
            return ("custom", "py.datetime", json.dumps(naive.isoformat() + ("Z" if obj.tzinfo else "")), [])
        data = {"iso": naive.isoformat(), "tz": _tz_data(obj.tzinfo), "fold": obj.fold}
        return ("custom", "py.datetime", json.dumps(data), [])
    if t is _dt.date:
        return ("custom", "py.date", json.dumps({"iso": obj.isoformat()}), [])
    if t is _dt.time:
        naive = obj.replace(tzinfo=None)
        return ("custom", "py.time", json.dumps({"iso": naive.isoformat(), "tz": _tz_data(obj.tzinfo), "fold": obj.fold}), [])
    if t is _dt.timedelta:
        return ("custom", "py.timedelta", None, [("days", obj.days), ("seconds", obj.seconds), ("microseconds", obj.microseconds)])
    if t is _dt.timezone:
        return ("custom", "py.timezone", json.dumps(_tz_data(obj)), [])
    if t is decimal.Decimal:
        return ("custom", "py.decimal", json.dumps(str(obj)), [])
    if t is uuid.UUID:
        return ("custom", "py.uuid", json.dumps(str(obj)), [])
    if isinstance(obj, pathlib.PurePath) and t.__name__ in _PATH_CLASSES:
        return ("custom", "py.path", json.dumps({"class": t.__name__, "path": str(obj)}), [])
    if isinstance(obj, enum.Enum):
        _seen_classes[reg.type_name(t)] = t
        if isinstance(obj, enum.Flag):
            # A combination (`F.A | F.B`, `F(0)`) is no member by name: rebuilt by value; the name
            # (None for a combination on some Pythons) is kept for readers of the manifest.
            return ("custom", "py.enum", json.dumps({"class": reg.type_name(t), "member": obj.name, "value": int(obj.value)}), [])
        return ("custom", "py.enum", json.dumps({"class": reg.type_name(t), "member": obj.name}), [])
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        _seen_classes[reg.type_name(t)] = t
        return ("record", reg.type_name(t), None, [(f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj)])
    if isinstance(obj, tuple) and hasattr(t, "_fields"):
        _seen_classes[reg.type_name(t)] = t
        return ("record", reg.type_name(t), None, list(zip(t._fields, obj)))
    if allow_pickle:
        data = pickle.dumps(obj, protocol=5)
        return ("custom", "py.pickle", json.dumps({"class": reg.type_name(t)}), [("data", data)])
    if isinstance(obj, np.ndarray):  # dtype=object (other arrays never get here)
        raise TypeError(
            f"cannot save `{where}`: numpy arrays of dtype {obj.dtype} hold Python objects, not array data; "
            "convert it to a list (obj.tolist()) or an array of a numeric, bytes or str dtype, "
            "or pass allow_pickle=True to store it pickled"
        )
    raise TypeError(
        f"cannot save `{where}`: objects of type {reg.type_name(t)} are not supported; "
        "register the type with treepack.register(...), make it a dataclass, or pass allow_pickle=True"
    )


# ---------------------------------------------------------------- arrays

_ML_NAMES = {
    "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3b11fnuz",
}
_SIMPLE = {
    ("b", 1): "bool", ("i", 1): "int8", ("i", 2): "int16", ("i", 4): "int32", ("i", 8): "int64",
    ("u", 1): "uint8", ("u", 2): "uint16", ("u", 4): "uint32", ("u", 8): "uint64",
    ("f", 2): "float16", ("f", 4): "float32", ("f", 8): "float64", ("c", 8): "complex64", ("c", 16): "complex128",
}


def _dtype_desc(dt: np.dtype) -> Tuple[Any, np.dtype]:
    """(treepack dtype JSON value, canonical numpy dtype: little-endian and packed)."""
    if dt.names is not None:
        fields = []
        formats = []
        for name in dt.names:
            sub = dt.fields[name][0]
            shape: Tuple[int, ...] = ()
            if sub.subdtype is not None:
                sub, shape = sub.subdtype
            desc, canon = _dtype_desc(sub)
            f: Dict[str, Any] = {"name": name, "dtype": desc}
            if shape:
                f["shape"] = list(shape)
            fields.append(f)
            formats.append((name, canon, shape) if shape else (name, canon))
        return {"struct": fields}, np.dtype(formats)
    if dt.subdtype is not None:
        raise TypeError(f"sub-array dtype {dt} is only supported inside a structured dtype")
    if dt.name in _ML_NAMES:
        return dt.name, dt
    if dt.kind == "S":
        return f"bytes:{dt.itemsize}", dt
    if dt.kind == "U":
        return f"unicode:{dt.itemsize // 4}", dt.newbyteorder("<")
    key = (dt.kind, dt.itemsize)
    if key in _SIMPLE:
        return _SIMPLE[key], dt.newbyteorder("<") if dt.itemsize > 1 else dt
    raise TypeError(f"numpy dtype {dt} (kind {dt.kind!r}) is not supported inside arrays; use a numeric, bool, bytes or str dtype")


def encode_array(a: np.ndarray) -> Tuple[np.ndarray, str]:
    """A canonical (C-contiguous, little-endian, packed) copy of ``a`` and its dtype JSON."""
    desc, canon = _dtype_desc(a.dtype)
    if a.dtype.kind == "S" and a.size and a.dtype.itemsize == 0:
        raise TypeError("zero-width byte strings are not supported")
    # (np.ascontiguousarray would turn a 0-d array into a 1-d one)
    out = a.astype(canon, copy=False)
    if not out.flags.c_contiguous:
        out = out.copy(order="C")
    return out, json.dumps(desc, separators=(",", ":"))


_dtype_cache: Dict[str, np.dtype] = {}


def np_dtype(desc_json: str) -> np.dtype:
    """The numpy dtype for a treepack dtype JSON value (ml_dtypes for bfloat16/float8)."""
    dt = _dtype_cache.get(desc_json)
    if dt is None:
        dt = _np_dtype(json.loads(desc_json))
        _dtype_cache[desc_json] = dt
    return dt


def _np_dtype(d: Any) -> np.dtype:
    if isinstance(d, dict):
        fields = []
        for f in d["struct"]:
            sub = _np_dtype(f["dtype"])
            shape = tuple(f.get("shape", ()))
            fields.append((f["name"], sub, shape) if shape else (f["name"], sub))
        return np.dtype(fields)
    if d in _ML_NAMES:
        try:
            import ml_dtypes
        except ImportError:
            raise ImportError(f"loading {d} arrays needs the ml_dtypes package (pip install ml_dtypes)") from None
        return np.dtype(getattr(ml_dtypes, d))
    if d.startswith("bytes:"):
        return np.dtype(f"S{int(d[6:])}")
    if d.startswith("unicode:"):
        return np.dtype(f"<U{int(d[8:])}")
    return np.dtype(d).newbyteorder("<") if np.dtype(d).itemsize > 1 else np.dtype(d)


# ---------------------------------------------------------------- decoding


def resolve_class(name: str) -> type:
    """Find a trusted class by ``module:qualname`` (imports its module, which was trusted)."""
    seen = _seen_classes.get(name)
    module, qual = reg.split_name(name)
    if not qual:
        raise LookupError(f"bad type name {name!r}")
    try:
        obj: Any = sys.modules.get(module) or importlib.import_module(module)
        for part in qual.split("."):
            obj = getattr(obj, part)
        if isinstance(obj, type):
            return obj
    except (ImportError, AttributeError):
        pass
    if seen is not None:
        return seen
    raise LookupError(f"class {name} cannot be found (module not importable or class renamed)")


class Decoder:
    """Builds Python objects for record/custom nodes after the audit has passed."""

    def __init__(self, trust: Tuple[str, ...], allow_pickle: bool, placeholder: bool) -> None:
        self.trust = trust
        self.allow_pickle = allow_pickle
        self.placeholder = placeholder

    def _missing(self, type_name: str, data: Any, reason: str) -> Any:
        if self.placeholder:
            return Unloadable(type_name, data, reason)
        raise LookupError(f"{type_name}: {reason}")

    def __call__(self, kind: str, type_name: str, data_json: Optional[str], children: List[Tuple[str, Any]]) -> Any:
        data = json.loads(data_json) if data_json is not None else None
        kids = dict(children)
        if kind == "record":
            if not (reg.is_trusted(type_name, self.trust) or reg.lookup_name(type_name)):
                return self._missing(type_name, kids, "type is not trusted (pass trust=[...])")
            try:
                cls = resolve_class(type_name)
            except LookupError as e:
                return self._missing(type_name, kids, str(e))
            if issubclass(cls, tuple) and hasattr(cls, "_make"):
                return cls._make(kids[f] for f in cls._fields)
            obj = cls.__new__(cls)
            for k, v in kids.items():
                object.__setattr__(obj, k, v)
            return obj
        if type_name.startswith("py."):
            return self._builtin(type_name, data, kids)
        r = reg.lookup_name(type_name)
        if r is None:
            return self._missing(type_name, kids.get("data", data), "no type is registered under this name in this process")
        return r.from_data(kids.get("data"))

    def _builtin(self, t: str, data: Any, kids: Dict[str, Any]) -> Any:
        if t == "py.bytearray":
            return bytearray(kids["data"])
        if t == "py.set":
            return set(kids.values())
        if t == "py.frozenset":
            return frozenset(kids.values())
        if t == "py.range":
            return range(kids["start"], kids["stop"], kids["step"])
        if t == "py.slice":
            return slice(kids["start"], kids["stop"], kids["step"])
        if t == "py.ellipsis":
            return Ellipsis
        if t == "py.datetime":
            if isinstance(data, str):  # compact form: naive, or `Z` for timezone.utc
                utc = data.endswith("Z")
                v = _dt.datetime.fromisoformat(data[:-1] if utc else data)
                return v.replace(tzinfo=_dt.timezone.utc) if utc else v
            v = _dt.datetime.fromisoformat(data["iso"]).replace(tzinfo=_tz_from(data["tz"]), fold=data.get("fold", 0))
            return v
        if t == "py.date":
            return _dt.date.fromisoformat(data["iso"])
        if t == "py.time":
            return _dt.time.fromisoformat(data["iso"]).replace(tzinfo=_tz_from(data["tz"]), fold=data.get("fold", 0))
        if t == "py.timedelta":
            return _dt.timedelta(days=kids["days"], seconds=kids["seconds"], microseconds=kids["microseconds"])
        if t == "py.timezone":
            return _tz_from(data)
        if t == "py.decimal":
            return decimal.Decimal(data)
        if t == "py.uuid":
            return uuid.UUID(data)
        if t == "py.path":
            return _PATH_CLASSES[data["class"]](data["path"])
        if t == "py.npscalar":
            return kids["value"][()]
        if t == "py.enum":
            name = data["class"]
            if not (reg.is_trusted(name, self.trust) or reg.lookup_name(name)):
                return self._missing(name, data, "enum type is not trusted (pass trust=[...])")
            try:
                cls = resolve_class(name)
                if "value" in data:
                    return cls(data["value"])
                return cls[data["member"]]
            except (LookupError, KeyError, ValueError) as e:
                return self._missing(name, data, f"enum member cannot be found: {e}")
        if t == "py.pickle":
            if not self.allow_pickle:
                return self._missing(data.get("class", t), None, "pickled object (pass allow_pickle=True)")
            return pickle.loads(kids["data"])
        return self._missing(t, data, "unknown built-in type (written by a newer treepack?)")


def audit(types: List[Tuple[str, str, Optional[str], str]], trust: Tuple[str, ...], allow_pickle: bool) -> Dict[str, List[str]]:
    """Every type a load would need that is not allowed: {type name: [key paths]}. Imports nothing."""
    bad: Dict[str, List[str]] = {}

    def flag(name: str, path: str) -> None:
        bad.setdefault(name, []).append(path or "<root>")

    for kind, name, data_json, path in types:
        if kind == "record":
            if not (reg.is_trusted(name, trust) or reg.lookup_name(name)):
                flag(name, path)
        elif name == "py.pickle":
            if not allow_pickle:
                cls = json.loads(data_json).get("class", "?") if data_json else "?"
                flag(f"pickle ({cls})", path)
        elif name == "py.enum":
            cls = json.loads(data_json).get("class", "?") if data_json else "?"
            if not (reg.is_trusted(cls, trust) or reg.lookup_name(cls)):
                flag(cls, path)
        elif name.startswith("py."):
            if name not in BUILTIN_TYPES:
                flag(name, path)
        elif reg.lookup_name(name) is None:
            flag(name, path)
    return bad
