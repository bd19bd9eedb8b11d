"""``load(path, like=template)`` for JAX templates: the template's pytree structure, every array
on the template's sharding, each device's shard read from the chunks it covers."""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import numpy as np

from ... import _plugin
from ..._plugin import LeafInfo, StructNode
from . import staging
from .arrays import KEY as _KEY, weak
from .pytrees import _NATIVE, PYTREE, _key_text, register


def applies(like: Any) -> bool:
    """Whether ``like`` is a JAX template: JAX is loaded and it holds ``jax.Array``s,
    ``ShapeDtypeStruct``s or pytree containers other than dicts, lists, tuples and namedtuples."""
    jax = sys.modules.get("jax")
    if jax is None or like is None or isinstance(like, bool):
        return False
    import jax.tree_util as jtu

    stack = [like]
    while stack:
        # Into StructNodes too (a template built from load_structure's tree holds them).
        try:
            leaves, td = jtu.tree_flatten(stack.pop(), is_leaf=lambda x: isinstance(x, StructNode))
        except (ValueError, TypeError):
            # Not a pytree JAX can walk (a dict of keys of several types, which JAX cannot sort):
            # the generic like= takes it.
            return False
        for x in leaves:
            if isinstance(x, (jax.Array, jax.ShapeDtypeStruct, Placement)):
                return True
            if isinstance(x, StructNode):
                stack.extend(x.children.values())
        if _custom_nodes(td):
            return True
    return False


def _custom_nodes(td: Any) -> bool:
    nd = td.node_data()
    if nd is not None:
        t = nd[0]
        if t not in _NATIVE and not (issubclass(t, tuple) and hasattr(t, "_fields")) and t.__module__ != "collections":
            return True
    return any(_custom_nodes(c) for c in td.children())


def _stored_child(stored: Any, k: Any, path: str) -> Tuple[Any, str]:
    """The stored node at pytree key ``k`` below ``stored`` (a structure node) and its path."""
    import jax.tree_util as jtu

    _where, _child, _kind = _plugin.where, _plugin.child_path, _plugin.describe_stored
    if isinstance(stored, LeafInfo):
        raise ValueError(f"like=: at {_where(path)} like= has a container but the file holds {_kind(stored)}")
    if isinstance(stored, (list, tuple)):
        i = getattr(k, "idx", getattr(k, "key", None))
        if not isinstance(i, int) or not 0 <= i < len(stored):
            raise ValueError(f"like=: at {_where(path)} the file holds a {type(stored).__name__} of {len(stored)}, no item {k}")
        return stored[i], _child(path, i)
    if isinstance(k, jtu.FlattenedIndexKey) and not isinstance(stored, dict):
        kids = list(stored.children.items())
        if not 0 <= k.key < len(kids):
            raise ValueError(f"like=: at {_where(path)} the file holds {_kind(stored)} with {len(kids)} children, no child {k.key}")
        name, v = kids[k.key]
        return v, _child(path, name)
    kids = stored if isinstance(stored, dict) else stored.children
    name = _key_text(k)
    for cand in ((k.key,) if isinstance(k, jtu.DictKey) else ()) + (name,):
        try:
            if cand in kids:
                return kids[cand], (_plugin.key_child_path if isinstance(stored, dict) else _child)(path, cand)
        except TypeError:
            continue
    raise ValueError(
        f"like=: at {_where(path)} like= has the key {getattr(k, 'key', name)!r} but the file holds no such key there "
        f"({_kind(stored)} with {sorted(map(str, kids))[:5]})"
    )


def _cast(arr: np.ndarray, dtype: Any) -> np.ndarray:
    return arr if arr.dtype == dtype else arr.astype(dtype)


class Placement:
    """A template leaf of ``treepack.jax.load``, where one sharding covers a whole subtree: the
    stored array at this place, whatever its shape, on ``sharding`` (None: the default device)
    and cast to ``dtype`` (None: the stored dtype as JAX holds it, float64 as float32 unless
    x64 is on). Typed PRNG keys stay keys (a cast would make their data meaningless), and
    arrays JAX cannot hold (strings, records) load as stored."""

    __slots__ = ("sharding", "dtype")

    def __init__(self, sharding: Any = None, dtype: Any = None) -> None:
        self.sharding, self.dtype = sharding, dtype

    def __repr__(self) -> str:
        return f"Placement({self.sharding!r}, {self.dtype!r})"


class _Keys:
    """Which stored arrays are typed PRNG keys. The structure shows a key as its ``uint32`` key
    data; the annotation saying it is a key is read from the manifest only when some array
    could be one (``uint32``, last axis 2 or 4), so most loads never read it."""

    def __init__(self, reader: Any) -> None:
        self.reader, self.paths = reader, None

    def __contains__(self, info: Any) -> bool:
        if info.dtype != "uint32" or not info.shape or info.shape[-1] not in (2, 4):
            return False
        if self.paths is None:
            self.paths = {p for t, p in self.reader.array_types() if t == _KEY}
        return info.path in self.paths


def _place(reader: Any, info: Any, pl: Placement, where: str, np_dtype: Callable[[str], Any], verify: bool,
           dec: Any, keys: _Keys) -> Any:
    """A ``Placement`` leaf: like a ``ShapeDtypeStruct`` of the stored shape (see ``_plan``)."""
    import jax

    if info.kind != "array":
        raise ValueError(f"like=: at {where} a sharding applies to an array, but the file holds {_plugin.describe_stored(info)}")
    if info in keys:
        k = reader.load(dec, np_dtype, verify=verify, subpath=info.path)
        return jax.device_put(k, pl.sharding) if pl.sharding is not None else k
    stored = _plugin.stored_dtype(info)
    if stored.kind in "OSUV" or stored.names is not None:
        return reader.load(dec, np_dtype, verify=verify, subpath=info.path)
    want = pl.dtype
    if want is None or jax.dtypes.issubdtype(want, jax.dtypes.prng_key):
        want = jax.dtypes.canonicalize_dtype(stored)
    return _plan(reader, info, jax.ShapeDtypeStruct(tuple(info.shape), want, sharding=pl.sharding), where, np_dtype, verify)


class _Sharded:
    """A stored array to read onto a sharding, checked and waiting for its reads."""

    __slots__ = ("path", "shape", "sharding", "want", "stored", "default")

    def __init__(self, path: str, shape: Tuple[int, ...], sharding: Any, want: np.dtype, stored: np.dtype,
                 default: bool = False) -> None:
        self.path, self.shape, self.sharding, self.want, self.stored = path, shape, sharding, want, stored
        # No sharding in the template: the default device's, the array left uncommitted.
        self.default = default


def _plan(reader: Any, info: Any, target: Any, where: str, np_dtype: Callable[[str], Any], verify: bool) -> Any:
    """Check a ``like=`` JAX leaf (a ``jax.Array`` or ``ShapeDtypeStruct``) against the stored
    leaf: a ``_Sharded`` to read, or the value itself when there is nothing to shard (keys,
    scalars, no sharding)."""
    import jax

    _kind, _stored_dtype = _plugin.describe_stored, _plugin.stored_dtype
    sharding = getattr(target, "sharding", None)
    if info.kind in ("int", "float", "bool", "complex") and tuple(target.shape) == ():
        # A Python scalar saved where the template has a 0-d array (a TrainState's step).
        v = np.asarray(reader.load(lambda *a: None, np_dtype, subpath=info.path), dtype=np.dtype(target.dtype))
        return jax.device_put(v, sharding) if sharding is not None else jax.device_put(v)
    if info.kind != "array":
        raise ValueError(f"like=: at {where} like= has a JAX array but the file holds {_kind(info)}")
    shape = tuple(info.shape)
    stored = _stored_dtype(info)
    want_shape = tuple(int(n) for n in target.shape)
    if jax.dtypes.issubdtype(target.dtype, jax.dtypes.prng_key):
        # A ShapeDtypeStruct's key dtype knows its impl only privately; without it, JAX's default.
        impl = jax.random.key_impl(target) if isinstance(target, jax.Array) else getattr(target.dtype, "_impl", None)
        if shape[: len(want_shape)] != want_shape:
            raise ValueError(f"like=: at {where} the file holds key data of shape {shape}, but like= asks for keys of shape {want_shape}")
        data = jax.numpy.asarray(reader.read_array(info.path, "", np_dtype, verify))
        keys = jax.random.wrap_key_data(data, impl=impl) if impl is not None else jax.random.wrap_key_data(data)
        return jax.device_put(keys, sharding) if sharding is not None else keys
    if shape != want_shape:
        raise ValueError(
            f"like=: at {where} the file holds {stored} with shape {shape}, but like= asks for {np.dtype(target.dtype)} "
            f"with shape {want_shape}; a load can cast dtypes but not change shapes"
        )
    want = np.dtype(target.dtype)
    if stored.kind in "OSU" or want.kind in "OSU" or stored.names is not None or want.names is not None:
        raise ValueError(f"like=: at {where} the file holds {stored}, which cannot be loaded as {want}")
    default = sharding is None
    if default:
        dev = staging.default_device()  # (an accelerator: through the staging buffers)
        if dev is None or not staging.staged(jax.sharding.SingleDeviceSharding(dev), reader):
            return jax.device_put(_cast(reader.read_array(info.path, "", np_dtype, verify), want))
        sharding = jax.sharding.SingleDeviceSharding(dev)
    if not hasattr(sharding, "addressable_devices_indices_map"):
        raise TypeError(f"like=: at {where} the sharding {sharding!r} is not a jax.sharding.Sharding")
    try:  # before any read or device memory: the sharding must fit the shape
        sharding.shard_shape(shape)
    except ValueError as e:
        raise ValueError(f"like=: at {where} the sharding does not fit the stored shape {shape}: {e}") from None
    return _Sharded(info.path, shape, sharding, want, stored, default)


#: Host bytes of shards read ahead at once by a sharded load (reads in flight, their arrays
#: not yet handed to JAX): bounds the extra memory of a load to about this much.
READ_AHEAD_BYTES = 256 << 20


def _read_sharded(reader: Any, plans: List[_Sharded], np_dtype: Callable[[str], Any], verify: bool) -> List[Any]:
    """The arrays of ``plans``: those bound for an accelerator's memory through the staging
    buffers (``staging``), the others by ``_read_fresh``."""
    out: List[Any] = [None] * len(plans)
    on_device = [i for i, pl in enumerate(plans) if staging.staged(pl.sharding, reader)]
    taken = set(on_device)
    rest = [i for i in range(len(plans)) if i not in taken]
    for i, arr in zip(on_device, staging.read_staged(reader, [plans[i] for i in on_device], verify) if on_device else []):
        out[i] = arr
    for i, arr in zip(rest, _read_fresh(reader, [plans[i] for i in rest], np_dtype, verify) if rest else []):
        out[i] = arr
    return out


def _read_fresh(reader: Any, plans: List[_Sharded], np_dtype: Callable[[str], Any], verify: bool) -> List[Any]:
    """Read every addressable shard of ``plans`` (a shard several devices hold, once) into
    memory of its own, several at a time on threads (the reads release the GIL), and build the
    arrays (on the CPU, JAX holds that memory without a copy)."""
    from concurrent.futures import ThreadPoolExecutor

    import jax

    _slice_text = _plugin.slice_text

    def read(pl: _Sharded, index: Tuple[slice, ...]) -> np.ndarray:
        text = _slice_text(tuple(index), len(pl.shape)) if index else ""
        return _cast(reader.read_array(pl.path, text, np_dtype, verify), pl.want)

    out: List[Any] = []
    with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1))) as pool:
        i = 0
        while i < len(plans):
            group: List[Tuple[_Sharded, Dict[Any, Any]]] = []
            ahead = 0
            while i < len(plans) and (not group or ahead < READ_AHEAD_BYTES):
                pl = plans[i]
                futs: Dict[Any, Any] = {}
                for index in pl.sharding.addressable_devices_indices_map(pl.shape).values():
                    k = staging.index_key(index)
                    if k not in futs:
                        futs[k] = pool.submit(read, pl, index)
                        n = 1
                        for s, dim in zip(index, pl.shape):
                            n *= len(range(*s.indices(dim)))
                        ahead += n * pl.want.itemsize
                group.append((pl, futs))
                i += 1
            for pl, futs in group:
                out.append(jax.make_array_from_callback(pl.shape, pl.sharding, lambda index, f=futs: f[staging.index_key(index)].result()))
    return out


def _read_target(reader: Any, info: Any, target: Any, where: str, np_dtype: Callable[[str], Any], verify: bool = True) -> Any:
    """One stored array read onto ``target``'s sharding (see ``load_like``)."""
    p = _plan(reader, info, target, where, np_dtype, verify)
    return _read_sharded(reader, [p], np_dtype, verify)[0] if isinstance(p, _Sharded) else p


def _class_of_stored(stored: Any) -> str:
    if isinstance(stored, (dict, list, tuple)):
        return type(stored).__name__
    if stored.type_name == PYTREE:
        return str((stored.data or {}).get("class"))
    return stored.type_name


def _class_of(node: Any) -> str:
    t = type(node)
    return t.__name__ if t in (dict, list, tuple) else f"{t.__module__}:{t.__qualname__}"


def _describe(stored: Any) -> str:
    if isinstance(stored, (list, tuple)):
        return f"a {type(stored).__name__} of {len(stored)} items"
    if isinstance(stored, dict):
        return "a dict"
    if isinstance(stored, LeafInfo):
        return _plugin.describe_stored(stored)
    if stored.type_name == PYTREE:
        return f"a JAX pytree node {_class_of_stored(stored)}"
    return _plugin.describe_stored(stored)


def _have(node: Any) -> str:
    if isinstance(node, StructNode):
        return f"{node.kind} {node.type_name}"
    return f"a {type(node).__name__}" if type(node) in (dict, list, tuple) else _class_of(node)


def _same_shape(node: Any, n: int, stored: Any, where: str) -> None:
    """A template container (of ``n`` children) against the stored one, before their children
    are matched: a stored list or tuple is met by a list or tuple (a namedtuple too) of as many
    items; a stored dict by anything keyed (its keys must be the template's, checked as the
    children are matched), or by a list or tuple where its keys are "0", "1", ... (flax's
    msgpack writes sequences so); a ``StructNode`` of ``load_structure``'s by a node of its kind
    and type. A template's class may differ from the stored one's where the keys are the same:
    its pytree rebuilds its own (a FrozenDict saved, a dict asked for; an Orbax dict, a
    TrainState asked for)."""
    if isinstance(stored, (list, tuple)):
        if not isinstance(node, (list, tuple)):
            raise ValueError(f"like=: at {where} the file holds {_describe(stored)} but like= has {_have(node)}")
        if n != len(stored):
            raise ValueError(f"like=: at {where} the file holds {_describe(stored)} but like= has {n}")
    elif isinstance(stored, dict):
        if isinstance(node, (list, tuple)) and not hasattr(node, "_fields") \
                and list(stored) != [str(i) for i in range(len(stored))]:
            raise ValueError(f"like=: at {where} the file holds a dict but like= has {_have(node)}")
    elif isinstance(node, StructNode) and (node.kind, node.type_name) != (stored.kind, stored.type_name):
        raise ValueError(f"like=: at {where} the file holds {_describe(stored)} but like= has {_have(node)}")


def _any_kept(stored: Any, keep: Set[str]) -> bool:
    stack = [stored]
    while stack:
        s = stack.pop()
        if isinstance(s, dict):
            stack.extend(s.values())
        elif isinstance(s, (list, tuple)):
            stack.extend(s)
        elif isinstance(s, LeafInfo) or not s.children:
            if s.path in keep:
                return True
        else:
            stack.extend(s.children.values())
    return False


def _stored_keys(stored: Any) -> List[Any]:
    if isinstance(stored, dict):
        return list(stored)
    if isinstance(stored, (list, tuple)):
        return list(range(len(stored)))
    return list(stored.children)


def _is_template_leaf(x: Any) -> bool:
    return isinstance(x, StructNode) and not x.children


def _plan_tree(like: Any, structure: Any, keep: Optional[Set[str]], asked: Optional[Set[str]] = None) -> List[Tuple[str, Any, Any]]:
    """(key path, stored node, template leaf) for every leaf of ``like`` in pytree order, the
    template checked against the file node by node first: every container must be the stored
    one's class with the same keys or items (a key the file holds that the template lacks is
    refused unless ``select`` leaves it out, ``keep``), so that nothing stored is silently
    dropped or rebuilt as another class. A template leaf outside ``keep`` is skipped (False)."""
    import jax.tree_util as jtu

    _where, deref = _plugin.where, _plugin.deref
    plan: List[Tuple[str, Any, Any]] = []

    def walk(node: Any, stored: Any, path: str) -> None:
        if node is None:
            return  # (no leaves: a skipped subtree, as a mask's None)
        stored = deref(stored, structure)[0]
        kids = [] if _is_template_leaf(node) else jtu.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)[0]
        if _is_template_leaf(node) or (len(kids) == 1 and kids[0][0] == ()):
            if keep is not None and not _any_kept(stored, keep):
                node = False  # (left out by select)
            elif isinstance(node, _jax_leaf_types()) and not isinstance(stored, LeafInfo):
                raise ValueError(f"like=: at {_where(path)} like= has a JAX array but the file holds {_describe(stored)}")
            plan.append((path, stored, node))
            return
        if isinstance(stored, LeafInfo):
            if not kids and stored.kind == "none":
                return  # (an empty state, EmptyState(): Orbax writes None for it; nothing to load)
            raise ValueError(f"like=: at {_where(path)} like= has {_class_of(node)} but the file holds {_plugin.describe_stored(stored)}")
        _same_shape(node, len(kids), stored, _where(path))
        names = _stored_keys(stored)
        used = set()
        for i, (keys, child) in enumerate(kids):
            if isinstance(stored, (list, tuple)):
                # By position, whatever the template's keys (a namedtuple's are its field names).
                s, p = stored[i], _plugin.child_path(path, i)
            else:
                s, p = _stored_child(stored, keys[0], path)
            used.add(p)
            walk(child, s, p)
        step = _plugin.key_child_path if isinstance(stored, dict) else _plugin.child_path
        left = [n for n in names if step(path, n) not in used]
        if asked is not None:
            kids_of = stored if isinstance(stored, (dict, list, tuple)) else stored.children
            left = [n for n in left if _any_kept(kids_of[n], asked)]
        if left:
            # (another class than the stored one's, with other keys: said, as the likely cause)
            theirs = "" if isinstance(stored, (dict, list, tuple)) or _class_of(node) == _class_of_stored(stored) \
                else f" ({_have(node)}; the file holds {_describe(stored)})"
            raise ValueError(
                f"like=: at {_where(path)} like={theirs} has no key {left[0]!r}, which the file holds"
                + (f" (and {len(left) - 1} more)" if len(left) > 1 else "")
                + "; set it to None in like= to skip it, or leave it out with select="
            )

    walk(like, structure, "")
    return plan


def _jax_leaf_types() -> Tuple[type, ...]:
    """The template leaves read onto a device: arrays, their shapes, placements."""
    import jax

    return (jax.Array, jax.ShapeDtypeStruct, Placement)


def load_like(reader: Any, like: Any, structure: Any, dec: Any, np_dtype: Callable[[str], Any],
              audit: Callable[[List[str], List[Tuple[str, str, Optional[str], str]]], None], mmap: bool, verify: bool,
              select: Optional[List[str]] = None) -> Any:
    """``load(path, like=template)`` for JAX templates (see the module docstring). ``audit(paths,
    nodes)`` checks trust for the stored subtrees loaded whole and the ``StructNode``s built;
    ``select`` (key path patterns) leaves the template's other leaves out (None)."""
    try:
        return _load_like(reader, like, structure, dec, np_dtype, audit, mmap, verify, select)
    finally:
        _plugin.forget_places()  # (the index of the structure's places its refs were found by)


def _load_like(reader: Any, like: Any, structure: Any, dec: Any, np_dtype: Callable[[str], Any],
               audit: Callable[[List[str], List[Tuple[str, str, Optional[str], str]]], None], mmap: bool,
               verify: bool, select: Optional[List[str]]) -> Any:
    import jax
    import jax.tree_util as jtu

    _where = _plugin.where
    register()
    nodes: List[Tuple[str, str, Optional[str], str]] = []
    stack = [like]
    while stack:
        for n in jtu.tree_leaves(stack.pop(), is_leaf=lambda n: isinstance(n, StructNode)):
            if isinstance(n, StructNode):
                nodes.append((n.kind, n.type_name, json.dumps(n.data) if n.data is not None else None, n.path))
                stack.extend(n.children.values())
    _, treedef = jtu.tree_flatten(like, is_leaf=_is_template_leaf)
    # Find every like leaf's stored node first: a wrong template fails before anything is read.
    keep = reader.convert_keep(list(select)) if select else None
    # (whether the user selected a stored key the template lacks: the patterns alone, not the
    # objects the refs of what they select bring, which come at their own places unasked)
    asked = reader.convert_keep(list(select), None, False) if select else None
    plan = _plan_tree(like, structure, keep, asked)
    device_leaf = _jax_leaf_types()
    subtrees: List[str] = []
    for path, stored, leaf in plan:
        if not isinstance(leaf, device_leaf) and leaf is not None and leaf is not False:
            # A Python number where a 0-d array is stored (a TrainState's step: 0 in a fresh
            # state, a JAX scalar once trained) loads the stored value; anything else gets the
            # usual checks (numpy arrays, scalars, True).
            if not (type(leaf) in (int, float, bool, complex) and getattr(stored, "kind", None) == "array" and not stored.shape):
                _plugin.check_subtree(leaf, stored, path, structure)
            subtrees.append(path)
    audit(subtrees, nodes)
    values: List[Any] = []
    sharded: List[Tuple[int, _Sharded]] = []
    keys = _Keys(reader)
    for path, stored, leaf in plan:
        if isinstance(leaf, device_leaf):
            if isinstance(leaf, Placement):
                p = _place(reader, stored, leaf, _where(path), np_dtype, verify, dec, keys)
            else:
                p = _plan(reader, stored, leaf, _where(path), np_dtype, verify)
            if isinstance(p, _Sharded):
                sharded.append((len(values), p))
                p = None
            values.append(p)
        elif leaf is None or leaf is False:
            values.append(None)
        else:
            values.append(reader.load(dec, np_dtype, mmap=mmap, verify=verify, subpath=path))
    for (i, _), arr in zip(sharded, _read_sharded(reader, [p for _, p in sharded], np_dtype, verify)):
        values[i] = arr
    for i, (_, _, leaf) in enumerate(plan):
        # A template leaf weakly typed (a scalar of `jnp.asarray(0.5)`, or its ShapeDtypeStruct):
        # so is what is loaded there.
        if getattr(leaf, "weak_type", False) and isinstance(values[i], jax.Array) and not values[i].weak_type:
            values[i] = weak(values[i])
    out = jtu.tree_unflatten(treedef, values)
    return _finish(out, dec)


def _finish(x: Any, dec: Any) -> Any:
    """Build the stored objects that ``like`` named by ``StructNode``s (records, custom objects),
    innermost first, from their loaded children."""
    import jax.tree_util as jtu

    def one(n: Any) -> Any:
        if not isinstance(n, StructNode):
            return n
        kids = [(k, _finish(v, dec)) for k, v in n.children.items()]
        return dec(n.kind, n.type_name, json.dumps(n.data) if n.data is not None else None, kids)

    return jtu.tree_map(one, x, is_leaf=lambda n: isinstance(n, StructNode))
