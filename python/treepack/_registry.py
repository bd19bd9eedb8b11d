"""The custom-type registry and trust rules, and the registry of framework integrations.

Resolution order (documented in docs/python.md): when saving an object, treepack walks
``type(obj).__mro__`` and uses the first class that has a registration — so the *most specific*
registered base class wins, whatever the registration order. ``registered()`` lists the
handlers so that every class comes before its registered base classes, ties kept in
registration order. A class has one handler: registering it under a second name is an error.
"""

from __future__ import annotations

import fnmatch
import importlib
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple

__all__ = ["Registration", "register", "registered", "lookup_class", "lookup_name", "type_name", "is_trusted", "trust_globs"]


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


def trust_globs(trust: Any) -> Tuple[str, ...]:
    """``trust=`` as the tuple of globs it names: one string is one glob (``trust="mypkg.*"``,
    not the characters of it, each of which would be a glob: ``"*"`` trusts every class); any
    other iterable gives its strings. Anything else is a TypeError saying what trust= takes."""
    if isinstance(trust, str):
        return (trust,)
    if isinstance(trust, (bytes, bytearray)) or not isinstance(trust, Iterable):
        raise TypeError(f"trust= takes class names or globs as strings (trust=['mypkg.*']), not {type(trust).__name__}")
    out = tuple(trust)
    for g in out:
        if not isinstance(g, str):
            raise TypeError(f"trust= takes class names or globs as strings (trust=['mypkg.*']); one is a "
                            f"{type(g).__name__}: {g!r} (for a class, give its name: cls.__module__ + '.' + cls.__qualname__)")
    return out


def is_trusted(name: str, trust: Iterable[str]) -> bool:
    """True if ``name`` (``module:qualname``) matches a trust glob.

    Globs match the name as written (``mypkg.models:Point``) or in dotted form
    (``mypkg.models.Point``), so ``"mypkg.*"`` trusts everything in ``mypkg`` and below.
    """
    dotted = name.replace(":", ".")
    for g in trust_globs(trust) if isinstance(trust, str) else trust:
        if fnmatch.fnmatchcase(name, g) or fnmatch.fnmatchcase(dotted, g):
            return True
    return False


def split_name(name: str) -> Tuple[str, str]:
    module, _, qual = name.partition(":")
    return module, qual


# ---------------------------------------------------------------- integrations
#
# Framework integrations (treepack/integrations/*) plug in here; the generic layer (_api, _codec,
# _like, _lazy, ...) never imports them. The table below is all it knows of them before they are
# imported: which module serves which names. An integration module registers its functions with
# `integrate` when it is imported, and it is imported the first time one of its names is met:
#
# - saving, a value whose class (or a base class) is defined in one of its `frameworks`
#   (`type(obj).__mro__`, by each class's top-level module name);
# - loading, a custom node type or an array annotation type of the file, a `load()` keyword,
#   or a method the generic layer offers for it (`LazyArray.to_dask`);
# - whenever its `gate` framework is imported (`sys.modules`), for the hooks that must see
#   every value or every call (JAX pytree nodes are classes of any module registered with JAX).


@dataclass(frozen=True)
class Integration:
    """One integration as the generic layer knows it before importing it: its module and the
    names that lead to it."""

    module: str
    #: Top-level module names of the classes whose values it saves (or explains, see `hint`).
    frameworks: Tuple[str, ...] = ()
    #: Custom node types it builds from their data alone (always allowed, like ``py.*``).
    nodes: Tuple[str, ...] = ()
    #: Custom node types whose data names a class (``"class"``): built only when it is trusted.
    class_nodes: Tuple[str, ...] = ()
    #: Custom node types a partial load may build with some children None (containers).
    partial_nodes: Tuple[str, ...] = ()
    #: Nodes of file-backed objects: described once per object per save (by identity).
    file_nodes: Tuple[str, ...] = ()
    #: Annotation types (``"as": {"type": ...}``) of the arrays it builds.
    arrays: Tuple[str, ...] = ()
    #: ``load()`` keywords it takes.
    options: Tuple[str, ...] = ()
    #: Of those, the ones whose result reads the location after ``load`` returned (refused
    #: where the location is a temporary one: ``loads``, foreign files).
    location_options: Tuple[str, ...] = ()
    #: Named services it offers the generic layer.
    methods: Tuple[str, ...] = ()
    #: A framework whose import makes this integration consulted for its gated hooks
    #: (``fallback``, ``like``, ``save``, ``structure``, ``prepare_load``).
    gate: Optional[str] = None


INTEGRATIONS: Tuple[Integration, ...] = (
    Integration(
        "treepack.integrations.torch", frameworks=("torch",),
        nodes=("py.torch_sparse", "py.torch_dtype", "py.torch_size", "py.torch_device"),
        arrays=("torch.Tensor", "torch.nn.Parameter"), options=("map_location",),
    ),
    Integration(
        "treepack.integrations.jax", frameworks=("jax", "jaxlib"), class_nodes=("jax.pytree",),
        partial_nodes=("jax.pytree",), arrays=("jax.Array", "jax.random.key"), gate="jax",
        # treepack.jax, JAX's pytree_serialization calls on treepack trees.
        methods=("jax_save", "jax_load", "jax_load_pytreedef", "jax_nonblocking_save", "jax_nonblocking_load"),
    ),
    Integration(
        "treepack.integrations.dask", frameworks=("dask",), options=("dask",), location_options=("dask",),
        methods=("to_dask", "lazy_arrays"),
    ),
    Integration("treepack.integrations.xarray", frameworks=("xarray",), nodes=("py.xr.dataset", "py.xr.dataarray")),
    Integration("treepack.integrations.pandas", frameworks=("pandas",), nodes=("py.dataframe", "py.series")),
    Integration("treepack.integrations.awkward", frameworks=("awkward",), nodes=("py.awkward",)),
    Integration("treepack.integrations.pillow", frameworks=("PIL",), nodes=("py.image",), file_nodes=("py.image",)),
    Integration("treepack.integrations.audio", frameworks=("wave",), nodes=("py.audio",), file_nodes=("py.audio",)),
    Integration("treepack.integrations.pydantic", frameworks=("pydantic",)),
    Integration("treepack.integrations.sklearn", frameworks=("sklearn",)),
)

_BY_MODULE = {e.module: e for e in INTEGRATIONS}
_BY_FRAMEWORK = {f: e for e in INTEGRATIONS for f in e.frameworks}
_BY_NODE = {n: e for e in INTEGRATIONS for n in e.nodes + e.class_nodes}
_BY_ARRAY = {a: e for e in INTEGRATIONS for a in e.arrays}
_BY_OPTION = {o: e for e in INTEGRATIONS for o in e.options}
_BY_METHOD = {m: e for e in INTEGRATIONS for m in e.methods}
_GATED = tuple(e for e in INTEGRATIONS if e.gate)

#: Custom node types the integrations build from data alone: always allowed, as ``py.*`` are.
NODES = frozenset(n for e in INTEGRATIONS for n in e.nodes)
#: Custom node types naming a class in their data, which must be trusted.
CLASS_NODES = frozenset(n for e in INTEGRATIONS for n in e.class_nodes)
PARTIAL_NODES = frozenset(n for e in INTEGRATIONS for n in e.partial_nodes)
FILE_NODES = frozenset(n for e in INTEGRATIONS for n in e.file_nodes)
LOCATION_OPTIONS = tuple(o for e in INTEGRATIONS for o in e.location_options)

#: What a hook returns when the call is not its business.
DECLINE: Any = type("Decline", (), {"__repr__": lambda self: "DECLINE", "__slots__": ()})()

# A value's description for the Rust walker: (kind, type, data JSON, children).
Description = Tuple[str, str, Optional[str], List[Tuple[Any, Any]]]


@dataclass(frozen=True, eq=False)
class Handlers:
    """What an integration plugs in (each optional; see docs/architecture.md)."""

    #: Saving: ``encode(obj, where, memo, omit_static)`` -> a Description, or None when the
    #: value (whose class is of one of its frameworks) is not one it saves. ``memo`` is the
    #: save's (None outside a save): see `save_state`.
    encode: Optional[Callable[[Any, str, Optional[Dict[Any, Any]], bool], Optional[Description]]] = None
    #: Gated: ``fallback(obj, where, memo, omit_static, type_name)`` for values nothing else
    #: claimed, before records and pickle (JAX pytree nodes). Its objects are named by class.
    fallback: Optional[Callable[..., Optional[Description]]] = None
    #: Loading: node type -> ``decode(decoder, type, data, children)`` (``decoder.missing``,
    #: ``decoder.trusted``).
    nodes: Mapping[str, Callable[[Any, str, Any, Dict[str, Any]], Any]] = field(default_factory=dict)
    #: Node type -> ``view(reader, path, data, where)``: what ``open()[...]`` gives at such a
    #: node instead of a View (None: a View).
    views: Mapping[str, Callable[..., Any]] = field(default_factory=dict)
    #: ``arrays(options)`` -> ``build(array, annotation)`` for one load's annotated arrays;
    #: raises ImportError when its framework cannot be imported.
    arrays: Optional[Callable[[Mapping[str, Any]], Callable[[Any, Dict[str, Any]], Any]]] = None
    #: ``missing(paths)``: the ImportError message when its framework cannot be imported.
    missing: Optional[Callable[[List[str]], str]] = None
    #: Records of its classes: ``record_fields(obj, where)`` (None: not one),
    #: ``record_class(cls)``, ``record_build(cls, children)``.
    record_fields: Optional[Callable[[Any, str], Optional[List[Tuple[str, Any]]]]] = None
    record_class: Optional[Callable[[type], bool]] = None
    record_build: Optional[Callable[[type, Dict[str, Any]], Any]] = None
    #: ``hint(obj)``: what to do instead, for a value of its frameworks that cannot be saved.
    hint: Optional[Callable[[Any], Optional[str]]] = None
    #: ``like=`` leaves of its classes: ``like_leaf(like, stored, where)`` -> ``"into"`` (read
    #: into ``like`` in place: ``read_into(reader, [(path, like), ...], verify)`` once a load with
    #: every such leaf of the integration's, so that it can overlap them), ``"keep"`` (load
    #: the leaf), or None (not one); ``like_graft(loaded, like, options)`` -> what the load puts
    #: at such a place, or DECLINE.
    like_leaf: Optional[Callable[[Any, Any, str], Optional[str]]] = None
    read_into: Optional[Callable[[Any, List[Tuple[str, Any]], bool], None]] = None
    like_graft: Optional[Callable[[Any, Any, Mapping[str, Any]], Any]] = None
    #: ``load(request)`` when one of its options is given: the result, or DECLINE.
    load: Optional[Callable[[Any], Any]] = None
    #: ``check_options(options, path)`` when one of its options is given, before anything of
    #: ``path`` is read (or converted): raises naming the file for an option that cannot apply.
    check_options: Optional[Callable[[Mapping[str, Any], str], None]] = None
    #: Gated: ``like(request, reader, like, structure)`` -> the result, or DECLINE.
    like: Optional[Callable[..., Any]] = None
    #: Gated: ``save(tree, location, prepare, write_opts, chunk_bytes)`` -> a function that
    #: writes the save (all of it), or None.
    save: Optional[Callable[..., Optional[Callable[[], Any]]]] = None
    #: Gated: called before a structure is built (``load_structure``).
    structure: Optional[Callable[[], None]] = None
    #: Gated: ``prepare_load(request)`` before a load (after the option hooks declined): may
    #: pick how it reads (JAX: a mapped file, for arrays bound for an accelerator); returns None
    #: or ``finish(ok)``, which the load calls when it ends (``ok``: without an error).
    prepare_load: Optional[Callable[[Any], Optional[Callable[[bool], None]]]] = None
    #: Named services (see `Integration.methods`).
    methods: Mapping[str, Callable[..., Any]] = field(default_factory=dict)


_loaded: Dict[str, Handlers] = {}
_node_fns: Dict[str, Callable[..., Any]] = {}
_view_fns: Dict[str, Callable[..., Any]] = {}
_GATED_HOOKS = ("fallback", "like", "save", "structure", "prepare_load")


def integrate(module: str, **handlers: Any) -> Handlers:
    """Register the integration ``module`` (called by it as it is imported). What it registers
    must be what the table says it serves: a name in one and not the other is an error."""
    e = _BY_MODULE.get(module)
    if e is None:
        raise ValueError(f"{module} is not an integration of treepack._registry.INTEGRATIONS")
    h = Handlers(**handlers)
    problems = []
    if set(h.nodes) != set(e.nodes + e.class_nodes):
        problems.append(f"decodes {sorted(h.nodes)}, the table says {sorted(e.nodes + e.class_nodes)}")
    if not set(h.views) <= set(h.nodes):
        problems.append(f"views {sorted(h.views)} of nodes it does not decode")
    if (h.arrays is None) != (not e.arrays) or (h.arrays is not None and h.missing is None):
        problems.append("array annotations: its arrays= and missing= and the table's arrays disagree")
    if set(h.methods) != set(e.methods):
        problems.append(f"offers {sorted(h.methods)}, the table says {sorted(e.methods)}")
    if e.gate is None and any(getattr(h, k) is not None for k in _GATED_HOOKS):
        problems.append(f"gated hooks ({', '.join(_GATED_HOOKS)}) without a gate framework")
    if problems:
        raise ValueError(f"{module}: " + "; ".join(problems))
    with _lock:
        _node_fns.update(h.nodes)
        _view_fns.update(h.views)
        _loaded[module] = h
    return h


def handlers(e: Integration) -> Handlers:
    """The integration's handlers, importing its module the first time."""
    h = _loaded.get(e.module)
    if h is None:
        importlib.import_module(e.module)
        h = _loaded.get(e.module)
        if h is None:
            raise RuntimeError(f"{e.module} did not register itself (treepack._registry.integrate)")
    return h


_UNSEEN: Any = object()
_by_type: Dict[type, Optional[Handlers]] = {}


def for_type(t: type) -> Optional[Handlers]:
    """The integration whose framework defines ``t`` or its nearest such base class (``__mro__``,
    by top-level module name), imported the first time; None for every other class."""
    try:
        h = _by_type.get(t, _UNSEEN)
    except TypeError:  # a class its metaclass makes unhashable: looked up each time
        return _find_for_type(t)
    if h is _UNSEEN:
        h = _find_for_type(t)
        if len(_by_type) >= 4096:  # classes made at run time (namedtuple factories): bounded
            _by_type.clear()
        _by_type[t] = h
    return h


def _find_for_type(t: type) -> Optional[Handlers]:
    for base in getattr(t, "__mro__", None) or (t,):
        mod = getattr(base, "__module__", None)
        e = _BY_FRAMEWORK.get(mod.partition(".")[0]) if isinstance(mod, str) else None
        if e is not None:
            return handlers(e)
    return None


def node_decoder(name: str) -> Optional[Callable[..., Any]]:
    """The function an integration builds custom nodes of type ``name`` with (None: no
    integration's)."""
    fn = _node_fns.get(name)
    if fn is None:
        e = _BY_NODE.get(name)
        if e is not None:
            fn = handlers(e).nodes.get(name)
    return fn


def node_view(name: str) -> Optional[Callable[..., Any]]:
    """What ``open()`` gives at a custom node of type ``name`` (None: a View)."""
    e = _BY_NODE.get(name)
    return handlers(e).views.get(name) if e is not None else None


def array_handlers(annotation_type: str) -> Optional[Handlers]:
    """The integration building arrays annotated ``annotation_type`` (None: none does; the
    array is loaded as stored)."""
    e = _BY_ARRAY.get(annotation_type)
    return handlers(e) if e is not None else None


def load_hooks(options: Mapping[str, Any], path: str) -> List[Callable[[Any], Any]]:
    """The ``load`` hooks of the integrations taking ``options`` (imported now), once each has
    checked them for a load of ``path``; an option no integration takes is a TypeError naming
    it."""
    hooks: List[Callable[[Any], Any]] = []
    checked: List[Handlers] = []
    for name in options:
        e = _BY_OPTION.get(name)
        if e is None:
            raise TypeError(f"load() got an unexpected keyword argument {name!r}")
        h = handlers(e)
        if h.check_options is not None and h not in checked:
            checked.append(h)
            h.check_options(options, path)
        if h.load is not None and h.load not in hooks:
            hooks.append(h.load)
    return hooks


def gated(kind: str) -> List[Callable[..., Any]]:
    """The hooks ``kind`` (``fallback``, ``like``, ``save``, ``structure``, ``prepare_load``) of the integrations
    whose gate framework this process has imported (those integrations are imported now)."""
    out = []
    for e in _GATED:
        if e.gate in sys.modules:
            fn = getattr(handlers(e), kind)
            if fn is not None:
                out.append(fn)
    return out


def method(name: str) -> Callable[..., Any]:
    """The service ``name`` of the integration that offers it (imported now)."""
    return handlers(_BY_METHOD[name]).methods[name]


# ---------------------------------------------------------------- one save, as integrations see it

#: The key of the save's `SaveRun` in ``encode_other``'s memo.
SAVE = "treepack.save"


class SaveState:
    """What an integration keeps for one save (`save_state` makes it at the first value it
    meets). The save calls these after the walks of its tree."""

    def reset(self) -> None:
        """The walk starts over (its values are met again): forget what depends on them."""

    def walk_again(self) -> bool:
        """After the first walk: True to walk the tree once more (annotations the first walk
        could not know)."""
        return False

    def writer(self, prepared: Any, location: str, write_opts: Dict[str, Any]) -> Optional[Callable[[], Any]]:
        """A function that writes the save in place of ``prepared.write`` (None: the usual write)."""
        return None


class SaveRun:
    """One save while its tree is walked: its chunk byte target and the integrations' states."""

    __slots__ = ("chunk_bytes", "states")

    def __init__(self, chunk_bytes: Optional[int]) -> None:
        self.chunk_bytes = chunk_bytes
        self.states: Dict[str, SaveState] = {}

    def reset(self) -> None:
        for s in list(self.states.values()):
            s.reset()

    def walk_again(self) -> bool:
        again = False
        for s in list(self.states.values()):
            again = s.walk_again() or again
        return again

    def writer(self, prepared: Any, location: str, write_opts: Dict[str, Any]) -> Optional[Callable[[], Any]]:
        for s in list(self.states.values()):
            w = s.writer(prepared, location, write_opts)
            if w is not None:
                return w
        return None


def save_state(memo: Optional[Dict[Any, Any]], key: str, make: Callable[[SaveRun], SaveState]) -> Optional[SaveState]:
    """The state ``key`` of the save whose memo this is (made by ``make(run)`` the first time);
    None outside a save."""
    if memo is None:
        return None
    s = memo.get(key)  # (kept in the memo too: one lookup per value met)
    if s is None:
        run = memo.get(SAVE)
        if run is None:
            return None
        s = memo[key] = run.states[key] = make(run)
    return s
