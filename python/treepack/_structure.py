"""What ``load_structure`` returns: ``LeafInfo`` at the leaves, ``StructNode`` for records and
custom objects (their classes never constructed)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, ItemsView, Iterator, KeysView, List, Optional, Tuple, ValuesView

from . import _core

LeafInfo = _core.LeafInfo
"""What ``load_structure`` puts at each leaf: ``path``, ``kind``, ``dtype``, ``shape``, ``nbytes``,
``inline`` (a Rust class: cheap to create for trees with many leaves)."""


@dataclass(frozen=True)
class StructNode:
    """A record or custom node in a structure tree (its class is not constructed).

    It reads like a mapping of its children, as the loaded tree reads: ``node["lm_head.weight"]``
    (an ``OrderedDict`` state_dict is a ``py.ordereddict`` custom node), ``key in node``,
    ``len(node)``, ``iter(node)`` / ``keys()`` (child keys, in stored order), ``values()``,
    ``items()`` and ``get(key, default)``. ``children`` is that mapping, ``data`` the node's own
    JSON data and ``type_name`` its type. A node is always true, even with no children (it is a
    node, not an empty container).
    """

    kind: str
    type_name: str
    data: Any
    children: Dict[Any, Any]
    path: str = ""

    def __getitem__(self, key: Any) -> Any:
        try:
            return self.children[key]
        except KeyError:
            keys = list(self.children)
            shown = ", ".join(repr(k) for k in keys[:8]) + (f", … ({len(keys)} in all)" if len(keys) > 8 else "")
            where = f"at `{self.path}`" if self.path else "at the root"
            raise KeyError(
                f"{key!r}: the {self.kind} node {self.type_name} {where} has no child of that key "
                f"(its children: {shown or 'none'})"
            ) from None
        except TypeError:
            raise KeyError(f"{key!r}: not a child key of the {self.kind} node {self.type_name}") from None

    def __contains__(self, key: object) -> bool:
        try:
            return key in self.children
        except TypeError:  # an unhashable key is no child's
            return False

    def __iter__(self) -> Iterator[Any]:
        return iter(self.children)

    def __len__(self) -> int:
        return len(self.children)

    def __bool__(self) -> bool:
        return True

    def keys(self) -> KeysView[Any]:
        return self.children.keys()

    def values(self) -> ValuesView[Any]:
        return self.children.values()

    def items(self) -> ItemsView[Any, Any]:
        return self.children.items()

    def get(self, key: Any, default: Any = None) -> Any:
        return self.children.get(key, default) if key in self else default

    def _repr_html_(self) -> str:
        """Notebooks: this node and what is below it as a compact HTML tree (no server)."""
        from ._html import structure_html

        return structure_html(self, self.path or "<root>")


def _struct_node(kind: str, type_name: str, data: Optional[str], children: List[Tuple[Any, Any]], path: str) -> StructNode:
    return StructNode(kind, type_name, json.loads(data) if data else None, dict(children), path)
