"""JAX: ``jax.Array`` leaves, typed PRNG keys, pytree containers, loading onto shardings.

- A ``jax.Array`` is stored as an ordinary array (readable by any treepack reader) annotated
  (format 1.3, ``"as"``) ``{"type": "jax.Array"}`` plus the sharding it was saved with (mesh
  axis names and shape, ``PartitionSpec``; informational). A sharded array's chunk grid tiles its
  shards (the shard shape is the save's block hint), so every chunk lies in one shard.
- A typed PRNG key array (``jax.random.key``) is stored as its key data (``uint32``) annotated
  ``{"type": "jax.random.key", "impl": "threefry2x32"}`` and comes back as keys.
- A type registered as a JAX pytree node that treepack does not otherwise know (flax
  ``FrozenDict``, ``nnx.State`` and its ``Variable``s, optax states, ``flax.struct`` dataclasses
  such as ``TrainState``) is a ``jax.pytree`` custom node: its children (by their pytree keys) as
  subtrees, its static aux data as JSON. It is rebuilt through the registered unflatten only when
  its class is trusted; static data that JSON cannot hold (``TrainState.apply_fn``, an optax
  ``GradientTransformation``) is code, never stored: the save refuses it, or leaves it out with
  ``omit_static=True`` and the load takes it from ``like=``.
- ``load(path, like=tree)`` where ``tree`` holds ``jax.ShapeDtypeStruct``s or ``jax.Array``s
  (or any pytree containers): the result has ``tree``'s pytree structure (its containers, their
  static data) and each array leaf exactly ``like``'s sharding, each device's shard read from the
  chunks it covers; a different dtype casts. No class from the file is constructed on this path.

Nothing here imports JAX unless the process already did (``sys.modules``) or the file holds
JAX leaves.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

ARRAY = "jax.Array"
KEY = "jax.random.key"
TYPES = (ARRAY, KEY)
PYTREE = "jax.pytree"

_done = False
_lock = threading.Lock()


def register() -> None:
    """Register ``StructNode`` with JAX (once; later calls do nothing).

    ``load_structure`` returns records and custom objects as ``StructNode``s. As pytree nodes
    (their children are the pytree children, keyed by field name), a mask built with
    ``jax.tree.map(lambda leaf: ..., structure)`` reaches every field, so ``load(like=mask)`` can
    skip single fields of a record. ``LeafInfo`` stays a leaf."""
    global _done
    with _lock:
        if _done:
            return
        import jax.tree_util as jtu

        from .. import StructNode

        def aux(n: StructNode) -> Tuple[Any, ...]:
            # Hashable and comparable, as JAX wants tree definitions to be.
            return (n.kind, n.type_name, json.dumps(n.data, sort_keys=True), tuple(n.children), n.path)

        def flatten_with_keys(n: StructNode) -> Tuple[List[Tuple[Any, Any]], Tuple[Any, ...]]:
            return [(jtu.DictKey(k), v) for k, v in n.children.items()], aux(n)

        def flatten(n: StructNode) -> Tuple[List[Any], Tuple[Any, ...]]:
            return list(n.children.values()), aux(n)

        def unflatten(a: Tuple[Any, ...], children: Any) -> StructNode:
            kind, type_name, data, keys, path = a
            return StructNode(kind, type_name, json.loads(data), dict(zip(keys, children)), path)

        jtu.register_pytree_with_keys(StructNode, flatten_with_keys, unflatten, flatten)
        _done = True


# ---------------------------------------------------------------- saving


def is_array(obj: Any) -> bool:
    """Whether ``obj`` is a ``jax.Array`` (False, without importing JAX, when JAX is not loaded)."""
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(obj, jax.Array)


def _spec_entry(p: Any) -> Any:
    if p is None or isinstance(p, str):
        return p
    if isinstance(p, (tuple, list)):
        return [_spec_entry(x) for x in p]
    return str(p)  # PartitionSpec.UNCONSTRAINED and the like


def sharding_data(s: Any) -> Optional[Dict[str, Any]]:
    """The annotation's ``sharding`` member: mesh axes and ``PartitionSpec`` for a
    ``NamedSharding``, the class name for others; None for one device."""
    import jax

    if isinstance(s, jax.sharding.SingleDeviceSharding):
        return None
    if isinstance(s, jax.sharding.NamedSharding):
        mesh = s.mesh
        return {
            "mesh": {"axes": [str(a) for a in mesh.axis_names], "shape": [int(n) for n in mesh.axis_sizes]},
            "spec": [_spec_entry(p) for p in s.spec],
        }
    return {"kind": type(s).__name__}


def encode(a: Any, where: str) -> Tuple[str, str, str, list]:
    """``encode_other``'s description of a ``jax.Array``: an annotated ``array`` with its host
    values, the shard shape as the block the chunk grid tiles, and ``immutable`` (a JAX array
    cannot change, so a background save needs no copy of it). An array that spans processes,
    in a save all processes make: the blocks this process owns (``treepack.shards``)."""
    import jax

    if not a.is_fully_addressable:
        if _collective.chunk_bytes is None:
            raise TypeError(
                f"cannot save `{where}`: a jax.Array sharded over several processes, in a save this process makes "
                "alone; every process of the job must call treepack.save with the tree (docs/jax.md)"
            )
        return _shards(a, where)
    if a.is_deleted():
        raise TypeError(f"cannot save `{where}`: the jax.Array was deleted (donated to a jitted function?)")
    ann: Dict[str, Any]
    if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
        ann = {"type": KEY, "impl": str(jax.random.key_impl(a))}
        data = jax.random.key_data(a)
    else:
        ann = {"type": ARRAY}
        data = a
    sd = sharding_data(a.sharding)
    if sd is not None:
        ann["sharding"] = sd
    host = np.asarray(data)
    kids: List[Tuple[str, Any]] = [("value", host)]
    block = tuple(int(n) for n in a.sharding.shard_shape(a.shape)) if sd is not None else None
    if block is not None and block != tuple(a.shape):
        kids.append(("block", block + tuple(host.shape[a.ndim:])))
    kids.append(("immutable", True))
    return ("array", "", json.dumps(ann, separators=(",", ":"), sort_keys=True), kids)


class Piece:
    """A block (shard) of an array that spans processes: chunked on the array's grid."""

    __slots__ = ("value", "chunk_shape")

    def __init__(self, value: np.ndarray, chunk_shape: List[int]) -> None:
        self.value, self.chunk_shape = value, chunk_shape

    def describe(self) -> Tuple[str, str, None, list]:
        return ("array", "", None, [("value", self.value), ("block", tuple(self.chunk_shape)), ("immutable", True)])


class _Collective(threading.local):
    #: Set while a save all processes make converts its tree: the save's chunk byte target.
    chunk_bytes: Optional[int] = None


_collective = _Collective()


def _shards(a: Any, where: str) -> Tuple[str, str, str, list]:
    """The blocks of a process-spanning array this process writes: its shards with
    ``replica_id == 0`` (each block of the array has exactly one such shard in the job)."""
    import jax

    from .. import _codec, _core

    ann: Dict[str, Any] = {"type": ARRAY}
    data = a
    if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
        ann = {"type": KEY, "impl": str(jax.random.key_impl(a))}
        data = jax.random.key_data(a)
    sd = sharding_data(a.sharding)
    if sd is not None:
        ann["sharding"] = sd
    dt = np.dtype(data.dtype)
    block = list(data.sharding.shard_shape(data.shape))
    cs = _core.block_chunk_shape(list(data.shape), block, dt.itemsize, _collective.chunk_bytes or None)
    mine = [sh for sh in data.addressable_shards if sh.replica_id == 0]
    origins = [[int(sl.indices(n)[0]) for sl, n in zip(sh.index, data.shape)] for sh in mine]
    desc = {
        "dtype": json.loads(_codec.encode_array(np.empty(0, dt))[1]),
        "shape": [int(n) for n in data.shape],
        "chunk_shape": cs,
        "as": ann,
        "origins": origins,
    }
    kids = [(str(i), Piece(np.asarray(sh.data), cs)) for i, sh in enumerate(mine)]
    return ("custom", "treepack.shards", json.dumps(desc, sort_keys=True), kids)


def spans_processes(tree: Any) -> bool:
    """Whether saving ``tree`` is a step of a multi-process JAX job: JAX's distributed runtime
    is up and the tree holds an array that spans processes (so every process saves it)."""
    jax = sys.modules.get("jax")
    if jax is None:
        return False
    from jax._src import distributed

    if distributed.global_state.client is None:
        return False
    try:
        leaves = jax.tree_util.tree_leaves(tree)
    except Exception:  # keys JAX cannot sort, say: walk the plain containers ourselves
        leaves, stack = [], [tree]
        while stack:
            x = stack.pop()
            if isinstance(x, dict):
                stack.extend(x.values())
            elif isinstance(x, (list, tuple)):
                stack.extend(x)
            else:
                leaves.append(x)
    return any(isinstance(x, jax.Array) and not x.is_fully_addressable for x in leaves)


#: Seconds a process of a multi-process save waits for the others (their parts, the commit)
#: before giving up with an error; nothing is committed then. ``TREEPACK_BARRIER_TIMEOUT``
#: overrides it.
TIMEOUT_S = 600.0

_saves = 0
_saves_lock = threading.Lock()


def _timeout_ms() -> int:
    import os

    return int(float(os.environ.get("TREEPACK_BARRIER_TIMEOUT", TIMEOUT_S)) * 1000)


def save_collective(tree: Any, p: str, prepare: Callable[[Any], Any], write_opts: Dict[str, Any],
                    chunk_bytes: Optional[int]) -> Callable[[], Any]:
    """A save every process of a JAX job makes together (docs/jax.md, "Multi-process saves"):
    each writes the blocks it owns of the process-spanning arrays (process 0 also everything
    else) as its *part*, hands the part's manifest to process 0 through JAX's distributed
    key-value store, and process 0 merges and commits them once all arrived. Converts the tree
    now; returns the function that writes, exchanges and commits (run it on any thread)."""
    import jax
    from jax._src import distributed

    global _saves
    client = distributed.global_state.client
    pid, n = jax.process_index(), jax.process_count()
    with _saves_lock:
        _saves += 1
        sid = f"treepack/save/{_saves}"
    if pid != 0:
        # Process 0 writes what is not sharded across processes; the others only their blocks.
        tree = jax.tree_util.tree_map(lambda x: x if isinstance(x, jax.Array) and not x.is_fully_addressable else None, tree)
    _collective.chunk_bytes = chunk_bytes or 0
    try:
        prepared = prepare(tree)
    finally:
        _collective.chunk_bytes = None

    def run() -> Any:
        timeout = _timeout_ms()
        try:
            part, info = prepared.write_part(p, **write_opts)
        except BaseException as e:
            client.key_value_set_bytes(f"{sid}/part/{pid}", b"ERR " + f"{type(e).__name__}: {e}".encode())
            raise
        client.key_value_set_bytes(f"{sid}/part/{pid}", part)
        if pid == 0:
            parts = [part]
            status = "ok"
            try:
                for i in range(1, n):
                    got = _wait(client, f"{sid}/part/{i}", timeout, p, f"process {i}'s part")
                    if got.startswith(b"ERR "):
                        raise RuntimeError(f"treepack.save({p!r}): process {i} failed to write its part: {got[4:].decode()}; nothing was committed")
                    parts.append(got)
                info = _core_commit(p, parts, write_opts)
            except BaseException as e:
                status = f"{type(e).__name__}: {e}"
                raise
            finally:
                client.key_value_set(f"{sid}/done", status)
                for i in range(1, n):
                    try:
                        client.key_value_delete(f"{sid}/part/{i}")
                    except Exception:
                        pass
            return info
        status = _wait(client, f"{sid}/done", timeout, p, "process 0's commit").decode()
        if status != "ok":
            raise RuntimeError(f"treepack.save({p!r}): process 0 did not commit the save: {status}")
        return info

    return run


def _core_commit(p: str, parts: List[bytes], write_opts: Dict[str, Any]) -> Any:
    from .. import _core

    return _core.commit_parts(p, parts, overwrite=write_opts.get("overwrite", False),
                              storage_options=write_opts.get("storage_options"), durable=write_opts.get("durable", True))


def _wait(client: Any, key: str, timeout_ms: int, p: str, what: str) -> bytes:
    try:
        return client.blocking_key_value_get_bytes(key, timeout_ms)
    except Exception as e:  # jaxlib's error for a deadline or a lost coordinator
        raise TimeoutError(
            f"treepack.save({p!r}): waited {timeout_ms / 1000:.0f} s for {what} of this multi-process save and it did "
            f"not arrive (did that process fail, or not call save with the same trees in the same order?); nothing "
            f"was committed. ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        ) from None


class _NotData(Exception):
    pass


def _aux_json(x: Any) -> Any:
    """Static aux data as JSON, tuples and dicts tagged so that they come back as they were
    (JAX compares tree definitions by their aux data)."""
    if x is None or isinstance(x, (bool, int, float, str)) and type(x) in (bool, int, float, str):
        return x
    if type(x) is tuple:
        return {"tuple": [_aux_json(v) for v in x]}
    if type(x) is list:
        return [_aux_json(v) for v in x]
    if type(x) is dict and all(type(k) is str for k in x):
        return {"dict": {k: _aux_json(v) for k, v in x.items()}}
    raise _NotData(x)


def _aux_from(d: Any) -> Any:
    if isinstance(d, list):
        return [_aux_from(v) for v in d]
    if isinstance(d, dict):
        if "tuple" in d:
            return tuple(_aux_from(v) for v in d["tuple"])
        if "dict" in d:
            return {k: _aux_from(v) for k, v in d["dict"].items()}
        raise ValueError(f"jax.pytree: malformed static data {d!r}")
    return d


def _key_text(k: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


#: Types the tree walker or treepack's own encoders handle (never saved as ``jax.pytree``).
_NATIVE = (dict, list, tuple, type(None))
_node_types: Dict[type, bool] = {}


def _describe_value(x: Any) -> str:
    t = type(x)
    if callable(x) and hasattr(x, "__self__"):
        return f"a bound method {getattr(x, '__qualname__', '?')}"
    if callable(x) and hasattr(x, "__qualname__") and not isinstance(x, type):
        return f"a function {x.__qualname__}"
    return f"a {t.__module__}.{t.__qualname__}"


def _static_fields(t: type, aux: Any) -> List[str]:
    """Names of the static fields whose values are not data, for a dataclass pytree
    (``flax.struct``: fields with ``pytree_node=False``)."""
    if not dataclasses.is_dataclass(t):
        return []
    static = [f.name for f in dataclasses.fields(t) if f.metadata.get("pytree_node", True) is False]
    if not isinstance(aux, tuple) or len(aux) != len(static):
        return []
    bad = []
    for name, v in zip(static, aux):
        try:
            _aux_json(v)
        except _NotData:
            bad.append(f"{name} ({_describe_value(v)})")
    return bad


def pytree(obj: Any, where: str, omit_static: bool, type_name: str) -> Optional[Tuple[str, str, str, list]]:
    """``encode_other``'s description of a registered JAX pytree node, or None when ``obj`` is
    not one (or JAX is not loaded)."""
    if "jax" not in sys.modules:
        return None
    t = type(obj)
    if t in _NATIVE or (isinstance(obj, tuple) and hasattr(t, "_fields")) or is_array(obj):
        return None
    import jax.tree_util as jtu

    known = _node_types.get(t)
    if known is False:
        return None
    # (jax.tree_util gained flatten_one_level_with_keys after 0.6; the registry had it before.)
    flatten = getattr(jtu, "flatten_one_level_with_keys", None) or jtu.default_registry.flatten_one_level_with_keys
    try:
        kids, aux = flatten(obj)
    except Exception:  # not a registered node (ValueError), or a version without the API
        _node_types[t] = False
        return None
    _node_types[t] = True
    data: Dict[str, Any] = {"class": type_name}
    try:
        data["aux"] = _aux_json(aux)
    except _NotData as e:
        if not omit_static:
            fields = _static_fields(t, aux)
            what = ", ".join(fields) if fields else _describe_value(e.args[0])
            raise TypeError(
                f"cannot save `{where}`: the static (non-pytree) data of {type_name} holds code or objects JSON "
                f"cannot hold: {what}. treepack stores data, never code: pass omit_static=True to save(...) to leave "
                f"it out, and load with like=<a {t.__name__}> to take it from there"
            ) from None
        data["static"] = "omitted"
    return ("custom", PYTREE, json.dumps(data), [(_key_text(k), v) for k, v in kids])


# ---------------------------------------------------------------- loading


class Loader:
    """Turns annotated arrays into ``jax.Array``s (on the default device) and typed keys."""

    def __init__(self) -> None:
        import jax

        self.jax = jax

    def array(self, arr: np.ndarray, ann: Dict[str, Any]) -> Any:
        jax = self.jax
        if ann.get("type") == KEY:
            impl = ann.get("impl")
            if not isinstance(impl, str):
                raise ValueError("a jax.random.key leaf has no `impl` name")
            try:
                return jax.random.wrap_key_data(jax.numpy.asarray(arr), impl=impl)
            except (ValueError, TypeError) as e:
                raise ValueError(f"jax.random.key leaf: key data of shape {arr.shape} with impl {impl!r}: {e}") from None
        return jax.device_put(arr)


def pytree_build(cls: type, data: Dict[str, Any], children: List[Any]) -> Any:
    """Rebuild a ``jax.pytree`` node through its registered unflatten."""
    import jax.tree_util as jtu

    aux = _aux_from(data.get("aux"))
    leaf = jtu.tree_structure(0)
    try:
        make = getattr(jtu.PyTreeDef, "from_node_data_and_children", None)
        if make is not None:
            td = make(jtu.default_registry, (cls, aux), [leaf] * len(children))
            return jtu.tree_unflatten(td, children)
        # Older jax (0.6): the registry's entry for the class.
        from jax._src import tree_util as internal

        entry = getattr(internal, "_registry", {}).get(cls)
        if entry is None:
            raise ValueError("not registered as a pytree node in this process (or this jax is too old to rebuild it)")
        return entry.from_iter(aux, children)
    except Exception as e:  # jaxlib raises RuntimeError for an unregistered type; unflatten anything
        raise LookupError(f"{cls.__module__}:{cls.__qualname__} cannot be rebuilt as a JAX pytree node: {e}") from None


def missing_message(paths: List[str]) -> str:
    shown = ", ".join(f"`{p or '<root>'}`" for p in paths[:5])
    more = f" and {len(paths) - 5} more" if len(paths) > 5 else ""
    return (
        f"this tree holds {len(paths)} JAX array(s) ({shown}{more}) but jax cannot be imported: install it "
        "(pip install jax, or pip install 'treepack[jax]'), or pass on_missing='placeholder' to load them as numpy arrays"
    )


# ---------------------------------------------------------------- like= templates


def applies(like: Any) -> bool:
    """Whether ``like`` is a JAX template: JAX is loaded and it holds ``jax.Array``s,
    ``ShapeDtypeStruct``s or pytree containers other than dicts, lists, tuples and namedtuples."""
    jax = sys.modules.get("jax")
    if jax is None or like is None or isinstance(like, bool):
        return False
    import jax.tree_util as jtu

    from .. import StructNode

    leaves, td = jtu.tree_flatten(like, is_leaf=lambda x: isinstance(x, StructNode))
    if any(isinstance(x, (jax.Array, jax.ShapeDtypeStruct)) for x in leaves):
        return True
    return _custom_nodes(td)


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

    from .._like import LeafInfo, _child, _kind, _where

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
                return kids[cand], _child(path, cand)
        except TypeError:
            continue
    raise ValueError(
        f"like=: at {_where(path)} like= has the key {getattr(k, 'key', name)!r} but the file holds no such key there "
        f"({_kind(stored)} with {sorted(map(str, kids))[:5]})"
    )


def _cast(arr: np.ndarray, dtype: Any) -> np.ndarray:
    return arr if arr.dtype == dtype else arr.astype(dtype)


class _Sharded:
    """A stored array to read onto a sharding, checked and waiting for its reads."""

    __slots__ = ("path", "shape", "sharding", "want")

    def __init__(self, path: str, shape: Tuple[int, ...], sharding: Any, want: np.dtype) -> None:
        self.path, self.shape, self.sharding, self.want = path, shape, sharding, want


def _plan(reader: Any, info: Any, target: Any, where: str, np_dtype: Callable[[str], Any], verify: bool) -> Any:
    """Check a ``like=`` JAX leaf (a ``jax.Array`` or ``ShapeDtypeStruct``) against the stored
    leaf: a ``_Sharded`` to read, or the value itself when there is nothing to shard (keys,
    scalars, no sharding)."""
    import jax

    from .._like import _kind, _stored_dtype

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
        impl = jax.random.key_impl(target) if isinstance(target, jax.Array) else None
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
    if sharding is None:
        return jax.device_put(_cast(reader.read_array(info.path, "", np_dtype, verify), want))
    if not hasattr(sharding, "addressable_devices_indices_map"):
        raise TypeError(f"like=: at {where} the sharding {sharding!r} is not a jax.sharding.Sharding")
    try:  # before any read or device memory: the sharding must fit the shape
        sharding.shard_shape(shape)
    except ValueError as e:
        raise ValueError(f"like=: at {where} the sharding does not fit the stored shape {shape}: {e}") from None
    return _Sharded(info.path, shape, sharding, want)


#: Host bytes of shards read ahead at once by a sharded load (reads in flight, their arrays
#: not yet handed to JAX): bounds the extra memory of a load to about this much.
READ_AHEAD_BYTES = 256 << 20


def _index_key(index: Tuple[slice, ...]) -> Tuple[Any, ...]:
    return tuple((s.start, s.stop, s.step) for s in index)


def _read_sharded(reader: Any, plans: List[_Sharded], np_dtype: Callable[[str], Any], verify: bool) -> List[Any]:
    """Read every addressable shard of ``plans`` (a shard several devices hold, once), several
    at a time on threads (the reads release the GIL), and build the arrays."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    import jax

    from .._lazy import _slice_text

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
                    k = _index_key(index)
                    if k not in futs:
                        futs[k] = pool.submit(read, pl, index)
                        n = 1
                        for s, dim in zip(index, pl.shape):
                            n *= len(range(*s.indices(dim)))
                        ahead += n * pl.want.itemsize
                group.append((pl, futs))
                i += 1
            for pl, futs in group:
                out.append(jax.make_array_from_callback(pl.shape, pl.sharding, lambda index, f=futs: f[_index_key(index)].result()))
    return out


def _read_target(reader: Any, info: Any, target: Any, where: str, np_dtype: Callable[[str], Any], verify: bool = True) -> Any:
    """One stored array read onto ``target``'s sharding (see ``load_like``)."""
    p = _plan(reader, info, target, where, np_dtype, verify)
    return _read_sharded(reader, [p], np_dtype, verify)[0] if isinstance(p, _Sharded) else p


def load_like(reader: Any, like: Any, structure: Any, dec: Any, np_dtype: Callable[[str], Any],
              audit: Callable[[List[str], List[Tuple[str, str, Optional[str], str]]], None], mmap: bool, verify: bool) -> Any:
    """``load(path, like=template)`` for JAX templates (see the module docstring). ``audit(paths,
    nodes)`` checks trust for the stored subtrees loaded whole and the ``StructNode``s built."""
    import jax
    import jax.tree_util as jtu

    from .. import StructNode
    from .._like import _walk, _where

    register()
    nodes: List[Tuple[str, str, Optional[str], str]] = []
    stack = [like]
    while stack:
        for n in jtu.tree_leaves(stack.pop(), is_leaf=lambda n: isinstance(n, StructNode)):
            if isinstance(n, StructNode):
                nodes.append((n.kind, n.type_name, json.dumps(n.data) if n.data is not None else None, n.path))
                stack.extend(n.children.values())
    flat, treedef = jtu.tree_flatten_with_path(like, is_leaf=lambda x: isinstance(x, StructNode) and not x.children)
    # Find every like leaf's stored node first: a wrong template fails before anything is read.
    plan: List[Tuple[str, Any, Any]] = []
    for keys, leaf in flat:
        stored, path = structure, ""
        for k in keys:
            stored, path = _stored_child(stored, k, path)
        plan.append((path, stored, leaf))
    subtrees: List[str] = []
    for path, stored, leaf in plan:
        if not isinstance(leaf, (jax.Array, jax.ShapeDtypeStruct)) and leaf is not None and leaf is not False:
            # A Python number where a 0-d array is stored (a TrainState's step: 0 in a fresh
            # state, a JAX scalar once trained) loads the stored value; anything else gets the
            # usual checks (numpy arrays, scalars, True).
            if not (type(leaf) in (int, float, bool, complex) and getattr(stored, "kind", None) == "array" and not stored.shape):
                _walk(leaf, stored, path, set())
            subtrees.append(path)
    audit(subtrees, nodes)
    values: List[Any] = []
    sharded: List[Tuple[int, _Sharded]] = []
    for path, stored, leaf in plan:
        if isinstance(leaf, (jax.Array, jax.ShapeDtypeStruct)):
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
    out = jtu.tree_unflatten(treedef, values)
    return _finish(out, dec)


def _finish(x: Any, dec: Any) -> Any:
    """Build the stored objects that ``like`` named by ``StructNode``s (records, custom objects),
    innermost first, from their loaded children."""
    import jax.tree_util as jtu

    from .. import StructNode

    def one(n: Any) -> Any:
        if not isinstance(n, StructNode):
            return n
        kids = [(k, _finish(v, dec)) for k, v in n.children.items()]
        return dec(n.kind, n.type_name, json.dumps(n.data) if n.data is not None else None, kids)

    return jtu.tree_map(one, x, is_leaf=lambda n: isinstance(n, StructNode))
