"""Trees as compact HTML for notebooks (``_repr_html_``), no server: ``treepack.open(...)`` views
(drawn by the extension from the manifest: ``_core.reader_html``) and ``load_structure`` results
(drawn here, the same way: collapsible ``<details>``, at most ``MAX_ROWS`` rows, each with kind,
dtype, shape and bytes; containers with their leaf count and bytes)."""

from __future__ import annotations

import html
from typing import Any, Iterator, List, Tuple

from ._structure import LeafInfo, StructNode

#: Rows drawn at most; the rest are counted.
MAX_ROWS = 300
#: Leaves counted at most for a container's totals (a walk of Python objects is not free).
MAX_COUNTED = 200_000
_STYLE = "font:12px/1.5 ui-monospace,SFMono-Regular,Menlo,monospace"
_MUTED = "color:#6b7385"


def _bytes(n: int) -> str:
    v, units = float(n), ["B", "KiB", "MiB", "GiB", "TiB"]
    u = 0
    while v >= 1024 and u < len(units) - 1:
        v, u = v / 1024, u + 1
    return f"{n} B" if u == 0 else f"{v:.1f} {units[u]}"


def _children(node: Any) -> List[Tuple[str, Any]]:
    if isinstance(node, StructNode):
        return [(str(k), v) for k, v in node.children.items()]
    if isinstance(node, dict):
        return [(k if isinstance(k, str) else repr(k), v) for k, v in node.items()]
    if isinstance(node, (list, tuple)):
        return [(str(i), v) for i, v in enumerate(node)]
    return []


def _is_container(node: Any) -> bool:
    return isinstance(node, (StructNode, dict, list, tuple))


def _leaves(node: Any, budget: List[int]) -> Iterator[Any]:
    stack = [node]
    while stack and budget[0] > 0:
        n = stack.pop()
        if _is_container(n):
            stack.extend(v for _, v in _children(n))
        else:
            budget[0] -= 1
            yield n


def _totals(node: Any) -> Tuple[int, int, bool]:
    """(leaves, bytes, complete) below ``node``, counting at most ``MAX_COUNTED`` leaves."""
    budget = [MAX_COUNTED]
    n = b = 0
    for leaf in _leaves(node, budget):
        n += 1
        b += getattr(leaf, "nbytes", 0) or 0
    return n, b, budget[0] > 0


def _kind(node: Any) -> str:
    if isinstance(node, StructNode):
        return f"{node.kind} {html.escape(node.type_name)}"
    return type(node).__name__


def _leaf(node: Any) -> str:
    if isinstance(node, LeafInfo):
        if node.kind == "array":
            shape = list(node.shape) if node.shape is not None else []
            return f"<b>{html.escape(str(node.dtype))}</b>{shape} <span style=\"{_MUTED}\">{_bytes(node.nbytes)}</span>"
        extra = _bytes(node.nbytes) if node.kind in ("str", "bytes") else ""
        return f"{html.escape(node.kind)} <span style=\"{_MUTED}\">{extra}</span>"
    text = repr(node)
    return html.escape(text if len(text) <= 80 else text[:80] + "…")


def structure_html(root: Any, title: str = "<root>", max_rows: int = MAX_ROWS) -> str:
    """``root`` (what ``load_structure`` returns, or any part of it) as an HTML fragment."""
    out: List[str] = [f'<div class="treepack-tree" style="{_STYLE}">']
    rows = [0, 0]  # drawn, left out

    def node(name: str, n: Any, depth: int) -> None:
        if rows[0] >= max_rows:
            rows[1] += 1
            return
        rows[0] += 1
        name = html.escape(name)
        if not _is_container(n):
            pad = "0" if depth == 0 else "2.2em"
            out.append(f'<div style="padding-left:{pad}">{name}: {_leaf(n)}</div>')
            return
        kids = _children(n)
        leaves, size, complete = _totals(n)
        more = "" if complete else "+"
        out.append(f'<details{" open" if depth == 0 else ""} style="padding-left:{"0" if depth == 0 else "1em"}">'
                   f'<summary>{name}: {_kind(n)}[{len(kids)}] <span style="{_MUTED}">{leaves}{more} leaves · '
                   f'{_bytes(size)}{more}</span></summary>')
        for k, v in kids:
            node(k, v, depth + 1)
        out.append("</details>")

    node(title, root, 0)
    if rows[1]:
        out.append(f'<div style="{_MUTED}">… {rows[1]} more rows not shown</div>')
    out.append("</div>")
    return "".join(out)


class HTMLTree:
    """Wraps a ``load_structure`` result (a dict, list or tuple cannot carry ``_repr_html_`` of
    its own): ``treepack.html_tree(treepack.load_structure(p))`` displays as the compact tree."""

    def __init__(self, root: Any, title: str = "<root>") -> None:
        self.root = root
        self.title = title

    def _repr_html_(self) -> str:
        return structure_html(self.root, self.title)

    def __repr__(self) -> str:
        return f"HTMLTree({self.title!r})"


def html_tree(root: Any) -> HTMLTree:
    """A ``load_structure`` result (or any part of it) as an object notebooks draw as HTML."""
    return HTMLTree(root)
