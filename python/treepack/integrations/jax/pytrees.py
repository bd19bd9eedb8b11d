"""Registered JAX pytree nodes (flax, optax, ``flax.struct``) as ``jax.pytree`` nodes, and
``StructNode`` as a pytree node for masks built with ``jax.tree.map``."""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
from typing import Any, Dict, List, Optional, Tuple


from ..._plugin import StructNode
from .arrays import is_array


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
    if not kids and aux is obj:
        # jax.tree_util.register_static: the object is its own static data, opaque to JAX.
        # Saved as what it is (a dataclass as a record, say), not as a node of itself.
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
