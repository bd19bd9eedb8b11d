"""The built-in Python types stored as ``py.<type>`` custom nodes (sets, ranges, datetimes,
decimals, UUIDs, paths, enums, pickles…): ``encode_other`` describes them (and records) for the
Rust walker; ``Decoder`` builds them, and trusted records, back. The values of other libraries
go to the integration that serves them (``_registry``: by the value's class on save, by the node
or annotation type on load); this module knows none of them."""

from __future__ import annotations

import datetime as _dt
import decimal
import enum
import json
import pathlib
import pickle
import sys
import uuid
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .. import _registry as reg
from .. import _core
from .._core import TreepackError, datetime_general_json
from .._errors import UnsupportedObjectError
from .. import _parts
from . import everyday, files, records
from .classes import _seen_classes, check_kind, resolve_class

_PATH_CLASSES = {
    "PosixPath": pathlib.PosixPath,
    "WindowsPath": pathlib.WindowsPath,
    "PurePosixPath": pathlib.PurePosixPath,
    "PureWindowsPath": pathlib.PureWindowsPath,
}


#: Custom node types treepack builds from their data alone: its own ``py.*`` types and the
#: integrations' (``py.dataframe``, ``py.torch_sparse``…, from the table in ``_registry``).
BUILTIN_TYPES = frozenset(
    {
        "py.bytearray", "py.set", "py.frozenset", "py.range", "py.slice", "py.ellipsis",
        "py.datetime", "py.date", "py.time", "py.timedelta", "py.timezone", "py.decimal",
        "py.uuid", "py.path", "py.npscalar", "py.enum", "py.pickle", "py.file",
    }
) | everyday.NAMES | reg.NODES
#: Custom node types a partial load may build with some children None (containers: an
#: OrderedDict state_dict with one tensor selected, a pytree with some leaves). Any other custom
#: node is built whole once anything in it is selected (a DataFrame, a sparse tensor, an image,
#: a registered type cannot be built from part of its children).
PARTIAL_TYPES = frozenset(
    {"py.ordereddict", "py.counter", "py.defaultdict", "py.deque", "py.objarray", "py.mapping"}
) | reg.PARTIAL_NODES
#: Descriptions kept per save by the object's identity: file-backed objects (an image held by
#: 10 000 rows is encoded once) and, below, every custom node not of treepack's own ``py.*``.
_BY_IDENTITY = frozenset({"py.file"}) | reg.FILE_NODES
_for_type = reg.for_type
# Built-in types that `audit` accepts whatever their data says (enum and pickle name classes, and
# a defaultdict's factory may).
AUDIT_FREE = BUILTIN_TYPES - {"py.enum", "py.pickle", "py.defaultdict", "py.mapping"}


class Unloadable:
    """Placeholder for an object whose type is unknown or untrusted (``on_missing="placeholder"``)."""

    __slots__ = ("type_name", "data", "reason", "files")

    def __init__(self, type_name: str, data: Any, reason: str, files: Optional[Dict[str, bytes]] = None) -> None:
        self.type_name = type_name
        self.data = data
        self.reason = reason
        #: A file-backed object's files by name (nothing is lost when its type is missing).
        self.files = files

    def __repr__(self) -> str:
        return f"Unloadable({self.type_name!r}, reason={self.reason!r})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Unloadable)
            and (self.type_name, self.reason, self.files) == (other.type_name, other.reason, other.files)
            and _eq(self.data, other.data)
        )

    __hash__ = None  # type: ignore[assignment]


def _eq(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # numpy arrays
        return False


def _tz_data(tz: Optional[_dt.tzinfo]) -> Any:
    """The zone ``tz`` as the manifest holds it (a JSON object; None for a naive value); a
    TypeError for a zone that cannot be kept."""
    if tz is None:
        return None
    d = _dateutil_tz(tz)  # (dateutil 3's zones have a `key` too: told apart by their type)
    if d is not None:
        return d
    key = getattr(tz, "key", None)  # zoneinfo.ZoneInfo
    if isinstance(key, str):
        return {"zone": key}
    if isinstance(tz, _dt.timezone):
        off = tz.utcoffset(None)
        return {"offset": [off.days, off.seconds, off.microseconds], "name": tz.tzname(None)}
    raise _UnkeptZone(
        f"timezone {tz!r} cannot be kept (datetime.timezone, zoneinfo.ZoneInfo and dateutil's tzutc, tzoffset, "
        "tzlocal and gettz zones can): convert it first, e.g. x.astimezone(datetime.timezone.utc), or use a "
        "zoneinfo.ZoneInfo of the same zone"
    )


class _UnkeptZone(TypeError):
    """A time zone of a class treepack does not keep (``_tz_data``); ``encode_other`` says
    where, as an ``UnsupportedObjectError``."""


def _dateutil_tz(tz: Any) -> Optional[Dict[str, Any]]:
    """dateutil's zones: by what makes them again (``tzutc()``, ``tzoffset(name, seconds)``,
    ``tzlocal()``, ``gettz(name)``)."""
    mod = sys.modules.get("dateutil.tz")
    if mod is None:
        return None
    if type(tz) is mod.tzutc:
        return {"dateutil": "tzutc"}
    if type(tz) is mod.tzlocal:
        return {"dateutil": "tzlocal"}
    if type(tz) is mod.tzoffset:
        off = tz.utcoffset(None)
        return {"dateutil": "tzoffset", "name": tz.tzname(None), "seconds": int(off.total_seconds())}
    if not isinstance(tz, mod.tzfile):
        return None
    # The zone's IANA key where it has one (dateutil 3), else its file's name below the time
    # zone folder (dateutil 2 keeps the file's path): a key reads the same on every machine.
    name = getattr(tz, "key", None)
    if not isinstance(name, str):
        name = getattr(tz, "_filename", None)
        for root in getattr(mod, "TZPATHS", ()):
            if isinstance(name, str) and name.startswith(root.rstrip("/") + "/"):
                name = name[len(root.rstrip("/")) + 1:]
                break
    if isinstance(name, str) and zone_key(name) and mod.gettz(name) == tz:
        return {"dateutil": "gettz", "name": name}
    return None


def zone_key(name: str) -> bool:
    """Whether ``name`` is a time zone's key (``Europe/Paris``, ``Etc/GMT+5``): names below the
    time zone folder, never a path (dateutil's ``gettz`` opens an absolute path as it is, and
    joins a relative one onto its folder, ``..`` and all: a file's zone name could make a load
    read any file)."""
    parts = name.split("/")
    return 0 < len(name) <= 255 and all(
        p not in ("", ".", "..") and all(c.isascii() and (c.isalnum() or c in "_+-") for c in p) for p in parts
    )


_TZ_CACHE: Dict[Any, Optional[_dt.tzinfo]] = {}


def _tz_from(d: Any) -> Optional[_dt.tzinfo]:
    # Traced data repeats a handful of zones over thousands of datetimes: memoise.
    if d is None:
        return None
    try:
        key = (d.get("zone"), tuple(d.get("offset") or ()), d.get("name"), d.get("dateutil"), d.get("seconds"))
    except (AttributeError, TypeError):
        key = None
    if key is not None and key in _TZ_CACHE:
        return _TZ_CACHE[key]
    tz = _tz_build(d)
    if key is not None and len(_TZ_CACHE) < 1024:
        _TZ_CACHE[key] = tz
    return tz


def _tz_build(d: Any) -> Optional[_dt.tzinfo]:
    if "dateutil" in d:
        from dateutil import tz

        kind = d["dateutil"]
        if kind == "tzutc":
            return tz.tzutc()
        if kind == "tzlocal":
            return tz.tzlocal()
        if kind == "tzoffset" and isinstance(d.get("seconds"), int):
            return tz.tzoffset(d.get("name"), d["seconds"])
        if kind == "gettz" and isinstance(d.get("name"), str):
            if not zone_key(d["name"]):
                raise ValueError(f"time zone {d['name']!r} is not a zone's name (such as 'Europe/Paris'): a path or "
                                 "other name is refused, since it would make the load read a file outside the tree")
            zone = tz.gettz(d["name"])
            if zone is None:
                raise ValueError(f"time zone {d['name']!r} is not known on this machine")
            return zone
        raise ValueError(f"unknown dateutil time zone {d!r}")
    if "zone" in d:
        import zoneinfo

        return zoneinfo.ZoneInfo(d["zone"])
    days, secs, us = d["offset"]
    off = _dt.timedelta(days=days, seconds=secs, microseconds=us)
    name = d.get("name")
    if name is None or name == _dt.timezone(off).tzname(None):
        return _dt.timezone(off)
    return _dt.timezone(off, name)


def encode_other(
    obj: Any, where: str, allow_pickle: bool, memo: Optional[Dict[int, Any]] = None, embed: bool = False,
    omit_static: bool = False,
) -> Tuple[str, str, Optional[str], List[Tuple[str, Any]]]:
    """Describe an object the Rust walker does not know: (kind, type, data JSON, children).

    ``memo`` (one per save) keeps the descriptions of registered objects and images by identity:
    a dataset whose 10 000 rows hold 100 image objects encodes 100 PNGs, not 10 000."""
    if memo is not None:
        hit = memo.get(id(obj))
        if hit is not None and hit[0] is obj:
            return hit[1]
    if embed and isinstance(obj, pathlib.Path) and obj.is_file():
        obj = files.File(obj)
    try:
        d = _describe(obj, where, allow_pickle, omit_static, memo)
    except _UnkeptZone as e:
        raise UnsupportedObjectError(where, reg.type_name(type(obj)), str(e)) from None
    if memo is not None and (d[1] in _BY_IDENTITY or not d[1].startswith("py.")) and d[0] == "custom" \
            and d[1] != _parts.SHARDS:  # (a shards node stands for one place's blocks, written by the save)
        memo[id(obj)] = (obj, d)  # the object is kept alive, so its id is not reused meanwhile
    return d


def _describe(
    obj: Any, where: str, allow_pickle: bool, omit_static: bool = False, memo: Optional[Dict[Any, Any]] = None
) -> Tuple[str, str, Optional[str], List[Tuple[str, Any]]]:
    t = type(obj)
    r = reg.lookup_class(t)
    if r is not None and r.save is not None:
        sink = files.FileSink(where)
        try:
            data = r.save(obj, sink)
        except Exception as e:
            raise TypeError(
                f"cannot save `{where}`: save of the type registered as {r.name!r} ({reg.type_name(t)}) "
                f"raised {type(e).__name__}: {e}"
            ) from e
        return files.describe(r.name, data, sink)
    if r is not None:
        try:
            data = r.to_data(obj)
        except Exception as e:
            raise TypeError(
                f"cannot save `{where}`: to_data of the type registered as {r.name!r} ({reg.type_name(t)}) "
                f"raised {type(e).__name__}: {e}"
            ) from e
        return ("custom", r.name, None, [("data", data)])
    h = _for_type(t)
    if h is not None and h.encode is not None:
        # A value of a framework an integration serves (a tensor, a DataFrame, an image…).
        d = h.encode(obj, where, memo, omit_static)
        if d is not None:
            return d
    if t is _parts.Piece:
        return obj.describe()
    d = everyday.encode(obj, t, where)
    if d is not None:
        return d
    if t is files.File:
        try:
            content = obj.data
        except OSError as e:
            raise TypeError(f"cannot save `{where}`: {obj.path} cannot be read ({e})") from None
        return ("custom", "py.file", json.dumps({"name": obj.name, "path": obj.path}), [("files", {"content": content})])
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
        # py.datetime is the extension's (datetime.rs, which asks _tz_data for the zone): its
        # general form, for the datetimes the walk leaves here (other zones; all without its
        # fast path).
        return ("custom", "py.datetime", datetime_general_json(obj), [])
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
    # What an integration recognises by its framework's registrations rather than by class
    # (JAX pytree nodes: FrozenDict, nnx.State, a flax.struct TrainState, rebuilt through JAX's
    # unflatten), before dataclasses, which some are. Such an object is named by its class.
    for fallback in reg.gated("fallback"):
        d = fallback(obj, where, memo, omit_static, reg.type_name(t))
        if d is not None:
            _seen_classes[reg.type_name(t)] = t
            return d
    d = records.describe(obj, t, where, reg.type_name(t))
    if d is not None:
        _seen_classes[reg.type_name(t)] = t
        return d
    if allow_pickle:
        data = pickle.dumps(obj, protocol=5)
        return ("custom", "py.pickle", json.dumps({"class": reg.type_name(t)}), [("data", data)])
    # (The save's walker gathers these, and raises one error for all of them.)
    if isinstance(obj, np.ndarray) and obj.dtype != object:  # a subclass not known here
        raise UnsupportedObjectError(
            where, reg.type_name(t), f"{t.__module__}.{t.__qualname__} is a subclass of numpy.ndarray that treepack "
            "does not know; save np.asarray(x) (its values), register the class, or pass allow_pickle=True"
        )
    if isinstance(obj, np.ndarray):  # dtype=object (plain arrays of numbers never get here)
        raise UnsupportedObjectError(
            where, "numpy.ndarray", f"numpy arrays of dtype {obj.dtype} hold Python objects, not array data; "
            "convert it to a list (obj.tolist()) or an array of a numeric, bytes or str dtype, "
            "or pass allow_pickle=True to store it pickled"
        )
    hint = _unsupported_hint(obj)
    raise UnsupportedObjectError(
        where, reg.type_name(t), f"objects of type {reg.type_name(t)} are not supported; "
        + (hint or "register the type with treepack.register(...), make it a dataclass, or pass allow_pickle=True")
    )


def _unsupported_hint(obj: Any) -> Optional[str]:
    """What to do instead, for objects people try to save that treepack does not keep whole (a
    torch module, a scikit-learn estimator: said by the integration of their framework)."""
    h = reg.for_type(type(obj))
    hint = h.hint(obj) if h is not None and h.hint is not None else None
    if hint is None and isinstance(obj, BaseException):
        # (a traced call's error: its traceback holds frames, code state no file keeps)
        hint = ("an exception holds a traceback of live frames: save what it says instead, e.g. {'type': "
                "type(e).__qualname__, 'args': e.args, 'traceback': traceback.format_exception(e)}; or register "
                "the exception class with treepack.register(cls, name=..., to_data=..., from_data=...), or pass "
                "allow_pickle=True")
    if hint is None and callable(getattr(type(obj), "to_dict", None)):
        # (transformers' GenerationConfig, and many a library's settings object)
        name = type(obj).__qualname__
        again = f"{name}.from_dict(...)" if callable(getattr(type(obj), "from_dict", None)) else f"{name}(**...)"
        hint = (f"it offers to_dict(): save obj.to_dict() and rebuild it with {again} after loading; or register the "
                "type with treepack.register(...), or pass allow_pickle=True")
    return hint


# ---------------------------------------------------------------- decoding


class MissingFramework(ImportError):
    """An annotated array (a torch tensor) whose library cannot be imported; ``load`` re-raises
    it naming every such leaf, with ``message(paths)`` (the integration's words)."""

    def __init__(self, type_name: str, message: Any = None) -> None:
        super().__init__(f"loading {type_name} leaves needs a library that cannot be imported")
        self.type_name = type_name
        self.message = message or (lambda paths: f"loading {type_name} leaves ({len(paths)}) needs a library that cannot be imported")


class BuildError(TreepackError, LookupError, ValueError):
    """A record or custom object of the file that could not be built: its class is not found,
    is not what its node says, or refused the stored data. ``load`` adds the file and the key
    paths where the object stands (``.paths``); also a ``LookupError`` and a ``ValueError``, the
    errors such failures raised before."""

    def __init__(self, type_name: str, reason: str, node_type: Optional[str] = None) -> None:
        super().__init__(f"{type_name}: {reason}")
        self.type_name = type_name
        self.reason = reason
        #: The node's own type (``py.enum`` for an enum member), to find where it stands.
        self.node_type = node_type or type_name
        self.paths: List[str] = []

    def located(self, file: str, paths: List[str]) -> "BuildError":
        """The same error, its message naming the file and the key paths."""
        e = BuildError(self.type_name, self.reason, self.node_type)
        e.paths = paths
        where = ", ".join(f"`{p or '<root>'}`" for p in paths[:5]) + (" …" if len(paths) > 5 else "")
        at = f" at {where}" if paths else ""
        hint = _DATA_HINT if self.node_type.startswith("py.") and self.node_type not in _NAMED else _CLASS_HINT
        e.args = (f"{file}: cannot build {self.type_name}{at}: {self.reason}. {hint}",)
        return e


#: Built-in node types whose class is named by the file (the rest are built from data alone).
_NAMED = frozenset({"py.enum", "py.mapping", "py.defaultdict"})
_CLASS_HINT = (
    "Load the rest with on_missing='placeholder' (treepack.Unloadable in its place), leave it out "
    "with select=, or make the class importable as it was saved"
)
_DATA_HINT = (
    "The stored data does not make one; load the rest with on_missing='placeholder' (treepack.Unloadable "
    "in its place, keeping its bytes) or leave it out with select="
)


class Decoder:
    """Builds Python objects for record/custom nodes after the audit has passed, and the arrays
    of other libraries (torch tensors) from their annotated numpy arrays.

    ``options``: the integrations' load options (``map_location``…), which their builders read.
    ``plain``: every annotated array comes back as the numpy array it is stored as."""

    def __init__(self, trust: Tuple[str, ...], allow_pickle: bool, placeholder: bool,
                 options: Optional[Dict[str, Any]] = None, plain: bool = False) -> None:
        self.trust = trust
        self.plain = plain
        self.allow_pickle = allow_pickle
        self.placeholder = placeholder
        self.options: Dict[str, Any] = dict(options or {})
        # Annotation type -> its builder for this load; integration -> its builder (one per
        # load: torch's storages shared by several tensors, say).
        self._arrays: Dict[str, Any] = {}
        self._builders: Dict[str, Any] = {}
        self._anns: Dict[str, Any] = {}

    def array(self, arr: np.ndarray, annotation: str) -> Any:
        """An annotated array: a tensor for the torch types, a ``jax.Array`` (or typed keys) for
        the JAX ones (each built by its integration), the array itself for types this version
        does not know (the annotation only says what the writer had)."""
        if self.plain:
            return arr
        # Many leaves of a file carry the same annotation text (every tensor of a safetensors
        # file, say): each is parsed once a load. Builders only read the dict they are given.
        ann = self._anns.get(annotation)
        if ann is None:
            ann = json.loads(annotation)
            if len(self._anns) < 4096:
                self._anns[annotation] = ann
        t = ann.get("type")
        build = self._arrays.get(t) if type(t) is str else _as_stored
        if build is None:
            build = self._array_builder(t)
        return build(arr, ann)

    def _array_builder(self, t: str) -> Any:
        h = reg.array_handlers(t)
        if h is None:
            build = _as_stored
        else:
            build = self._builders.get(id(h))
            if build is None:
                try:
                    build = h.arrays(self.options)
                except ImportError:
                    if not self.placeholder:
                        raise MissingFramework(t, h.missing) from None
                    build = _as_stored
                self._builders[id(h)] = build
        self._arrays[t] = build
        return build

    def trusted(self, name: str) -> bool:
        """Whether the class ``name`` (``module:qualname``) may be built: trusted or registered."""
        return reg.is_trusted(name, self.trust) or reg.lookup_name(name) is not None

    def missing(self, type_name: str, data: Any, reason: str, files: Optional[Dict[str, bytes]] = None) -> Any:
        """What stands for an object that cannot be built: an ``Unloadable`` with
        ``on_missing="placeholder"``, else a ``BuildError``."""
        return self._missing(type_name, data, reason, files)

    def _missing(self, type_name: str, data: Any, reason: str, files: Optional[Dict[str, bytes]] = None) -> Any:
        if self.placeholder:
            return Unloadable(type_name, data, reason, files)
        raise BuildError(type_name, reason, self._node_type)

    _node_type: Optional[str] = None

    def __call__(self, kind: str, type_name: str, data_json: Optional[str], children: List[Tuple[str, Any]]) -> Any:
        self._node_type = type_name
        try:
            return self._build(kind, type_name, data_json, children)
        except (BuildError, MissingFramework):
            raise
        except Exception as e:
            # What the object's own code or a library raised about the stored data: the same
            # error, said with the object's type (and, by load, its file and key path).
            name = type_name
            if (type_name == "py.enum" or type_name in reg.CLASS_NODES) and isinstance(data_json, str):
                try:
                    name = json.loads(data_json).get("class") or type_name
                except (ValueError, AttributeError, RecursionError):
                    pass
            if self.placeholder:
                # (on_missing="placeholder" covers objects that cannot be built from what the file
                # holds as well as classes that cannot be found: the error's hint says so)
                return Unloadable(name, dict(children), f"{type(e).__name__}: {e}")
            raise BuildError(name, f"{type(e).__name__}: {e}", type_name) from e

    def _build(self, kind: str, type_name: str, data_json: Optional[str], children: List[Tuple[str, Any]]) -> Any:
        data = json.loads(data_json) if data_json is not None else None
        kids = dict(children)
        if kind == "record":
            if not (reg.is_trusted(type_name, self.trust) or reg.lookup_name(type_name)):
                return self._missing(type_name, kids, "type is not trusted (pass trust=[...])")
            try:
                cls = resolve_class(type_name)
                check_kind(cls, type_name, "record")
            except LookupError as e:
                return self._missing(type_name, kids, str(e))
            return records.build(cls, kids)
        if type_name.startswith("pickle:"):
            # An object a torch checkpoint's pickle builds from a global outside the reader's
            # allow-list (read with on_missing="placeholder"): never built, whatever is trusted.
            reason = data.get("reason") if isinstance(data, dict) else None
            return self._missing(type_name[len("pickle:"):], None,
                                 reason if isinstance(reason, str) else "refused by treepack's pickle reader")
        if type_name.startswith("py."):
            return self._builtin(type_name, data, kids)
        build = reg.node_decoder(type_name)
        if build is not None:  # an integration's (jax.pytree)
            return build(self, type_name, data, kids)
        r = reg.lookup_name(type_name)
        found = files.files_of(kids)
        if r is None:
            return self._missing(
                type_name, kids.get("data", data), "no type is registered under this name in this process", found
            )
        if r.load is not None:
            if found is None:
                raise ValueError(f"{type_name}: the stored object has no files, but its registration loads files")
            return r.load(files.Files(found, kids.get("data")))
        return r.from_data(kids.get("data"))

    def _builtin(self, t: str, data: Any, kids: Dict[str, Any]) -> Any:
        if t in everyday.NAMES:
            trusted = lambda name: reg.is_trusted(name, self.trust) or reg.lookup_name(name) is not None
            return everyday.decode(t, data, kids, trusted, self._missing)
        if t == "py.bytearray":
            # Bytes, as saved: given a number, bytearray(n) would allocate n zero bytes.
            if not isinstance(kids.get("data"), bytes):
                raise ValueError("py.bytearray: its data must be a bytes leaf")
            return bytearray(kids["data"])
        if t == "py.set":
            return set(_core.few_same_hashes(kids.values(), "a set"))
        if t == "py.frozenset":
            return frozenset(_core.few_same_hashes(kids.values(), "a frozenset"))
        if t == "py.range":
            return range(kids["start"], kids["stop"], kids["step"])
        if t == "py.slice":
            return slice(kids["start"], kids["stop"], kids["step"])
        if t == "py.ellipsis":
            return Ellipsis
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
                check_kind(cls, name, "enum")
                if "value" in data:
                    return cls(data["value"])
                return cls[data["member"]]
            except (LookupError, KeyError, ValueError) as e:
                return self._missing(name, data, f"enum member cannot be found: {e}")
        if t == "py.file":
            found = files.files_of(kids)
            if found is None or "content" not in found or not isinstance(data, dict) or not isinstance(data.get("name"), str):
                raise ValueError("py.file: the node has no content or name")
            files.check_file_name(data["name"])
            f = files.File(data=found["content"], name=data["name"])
            f.path = data.get("path") if isinstance(data.get("path"), str) else None
            return f
        if t == "py.pickle":
            if not self.allow_pickle:
                cls = data.get("class") if isinstance(data, dict) else None
                return self._missing(cls if isinstance(cls, str) else t, None, "pickled object (pass allow_pickle=True)")
            return pickle.loads(kids["data"])
        build = reg.node_decoder(t)
        if build is not None:  # an integration's (py.dataframe, py.image, py.torch_sparse…)
            return build(self, t, data, kids)
        return self._missing(t, data, "unknown built-in type (written by a newer treepack?)")


def _as_stored(arr: np.ndarray, ann: Dict[str, Any]) -> np.ndarray:
    """An annotated array no integration builds (or whose framework is missing, with
    ``on_missing="placeholder"``): the array as stored."""
    return arr
