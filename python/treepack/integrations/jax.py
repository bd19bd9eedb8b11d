"""JAX: structure trees work with ``jax.tree.map`` and ``jax.tree_util``.

``load_structure`` returns records and custom objects as ``StructNode``s. Registered as pytree
nodes (their children are the pytree children, keyed by field name), a mask built with
``jax.tree.map(lambda leaf: ..., structure)`` reaches every field, so ``load(like=mask)`` can skip
single fields of a record. ``LeafInfo`` stays a leaf.
"""

from __future__ import annotations

import json
import threading
from typing import Any, List, Tuple

_done = False
_lock = threading.Lock()


def register() -> None:
    """Register ``StructNode`` with JAX (once; later calls do nothing)."""
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
