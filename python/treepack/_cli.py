"""``python -m treepack inspect | ls | cat``: browsing the files whose formats the Python package
reads (``.npy``, ``.npz``, Zarr, HDF5, Orbax and JAX checkpoints) as the Rust ``treepack``
command browses a tree — the same lines, key paths and slices. The Rust command runs these for
such files (design decision 98); any other location it reads itself.

Everything here reads what ``treepack.open`` reads: the file's index, and only the array
elements a ``cat`` slice names."""

from __future__ import annotations

import json
import sys
from typing import Any, Iterator, List, Optional, Tuple

import numpy as np

from . import _core
from ._convert import _seg, selected_paths, stand_in_of
from ._errors import ForeignFileError

# The formats the Python package owns (design decisions 56 and 58); the Rust core reads the rest.
FORMATS = ("npy", "npz", "zarr", "hdf5", "orbax", "jax")


def human_bytes(n: int) -> str:
    """Sizes as the Rust command prints them: ``8 B``, ``9.0 KiB``, ``474.7 MiB``."""
    if n < 1024:
        return f"{n} B"
    size = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        size /= 1024
        if size < 1024 or unit == "PiB":
            return f"{size:.1f} {unit}"
    return f"{n} B"  # (unreachable)


def _reader(path: str) -> Any:
    from . import _foreign_view

    fmt = _core.detect_format(path, True)
    if fmt not in FORMATS:
        raise ForeignFileError(f"{path}: a {fmt} location, which the Rust `treepack` command reads itself; "
                               f"this command browses {', '.join(FORMATS)} files")
    return _foreign_view.open_reader(path, fmt)


def _unescape(seg: str) -> str:
    return "" if seg == "~e" else seg.replace("~1", "/").replace("~2", "*").replace("~0", "~")


def _child(node: Any, seg: str, where: str) -> Any:
    """The child of a structure node at the key-path segment ``seg``."""
    kids = getattr(node, "children", node)
    if isinstance(kids, dict):
        key: Any = _unescape(seg)
        if key not in kids and seg.lstrip("-").isdigit() and int(seg) in kids:
            key = int(seg)
        if key in kids:
            return kids[key]
        shown = ", ".join(str(k) for k in list(kids)[:12]) + (", …" if len(kids) > 12 else "")
        raise KeyError(f"key path `{where}` not found: `{where.rsplit('/', 1)[0] if '/' in where else '<root>'}` "
                       f"has no child `{seg}`; it has: {shown or 'nothing'}")
    if isinstance(kids, (list, tuple)) and seg.isdigit() and int(seg) < len(kids):
        return kids[int(seg)]
    raise KeyError(f"key path `{where}` not found: `{seg}` is not an item of a {type(kids).__name__} of {len(kids)}")


def _at(structure: Any, key: str) -> Any:
    node, done = structure, []
    for seg in [s for s in key.split("/") if s] if key else []:
        done.append(seg)
        node = _child(node, seg, "/".join(done))
    return node


def _items(node: Any) -> Optional[List[Tuple[Any, Any]]]:
    kids = getattr(node, "children", node)
    if isinstance(kids, dict):
        return list(kids.items())
    if isinstance(kids, (list, tuple)):
        return list(enumerate(kids))
    return None


def _is_leaf(x: Any) -> bool:
    return isinstance(x, _core.LeafInfo)


def _container(node: Any) -> str:
    kids = _items(node) or []
    if hasattr(node, "type_name"):
        return f"{node.type_name}[{len(kids)}]"
    return f"{type(node).__name__}[{len(kids)}]"


def _leaf_text(r: Any, p: str, x: Any, width: int) -> str:
    """A leaf's line: an array's dtype, shape and size; another value's kind and the value (a
    foreign reader holds every value that is not an array as it is)."""
    if x.dtype is not None and x.shape is not None:
        return f"{x.dtype}[{', '.join(str(d) for d in x.shape)}]  {human_bytes(int(x.nbytes))}"
    value = r._node(p)[0]
    text = "" if value is None else " " + (repr(value) if isinstance(value, (str, bytes)) else str(value))
    if width and len(text) > width:
        text = text[:width] + "…"
    return f"{x.kind}{text}"


def _leaves(node: Any, path: str = "") -> Iterator[Tuple[str, Any]]:
    kids = _items(node)
    if kids is None:
        yield path, node
        return
    for k, v in kids:
        p = f"{path}/{_seg(k) if isinstance(k, str) else k}" if path else (_seg(k) if isinstance(k, str) else str(k))
        yield from _leaves(v, p)


def inspect(path: str, as_json: bool = False, key: Optional[str] = None, depth: Optional[int] = None,
            max_lines: int = 200, width: int = 120) -> int:
    r = _reader(path)
    node = _at(r.structure(), key or "")
    leaves = list(_leaves(node, key or ""))
    arrays = [x for _, x in leaves if _is_leaf(x) and x.shape is not None]
    array_bytes = sum(int(x.nbytes) for x in arrays)
    md = r.metadata()
    md = json.loads(md) if md is not None else None
    if as_json:
        out = []
        for p, x in leaves:
            o: dict = {"path": p or "<root>", "kind": x.kind, "nbytes": int(x.nbytes or 0)}
            if x.shape is not None:
                o["dtype"], o["shape"] = str(x.dtype), list(x.shape)
            out.append(o)
        print(json.dumps({"location": path, "read_from": f"{r.fmt} {'folder' if r.fmt in ('zarr', 'orbax', 'jax') else 'file'}",
                          "metadata": md, "leaves": out,
                          "totals": {"leaves": len(leaves), "arrays": len(arrays), "array_bytes": array_bytes}}, indent=2))
        return 0
    what = "folder" if r.fmt in ("zarr", "orbax", "jax") else "file"
    print(f"{path}  ({r.fmt} {what}, read as a tree by the Python package, no array data read)")
    if md is not None:
        text = json.dumps(md, separators=(",", ":"))
        print(f"metadata: {text[:width] + '…' if width and len(text) > width else text}")
    lines: List[str] = []

    def walk(x: Any, name: str, prefix: str, last: bool, level: int, root: bool) -> None:
        branch = "" if root else ("└── " if last else "├── ")
        kids = _items(x)
        text = _container(x) if kids is not None else _leaf_text(r, path_of[id(x)], x, width)
        lines.append(f"{prefix}{branch}{name}: {text}")
        if kids is None or (depth is not None and level >= depth):
            return
        below = prefix + ("" if root else ("    " if last else "│   "))
        for i, (k, v) in enumerate(kids):
            walk(v, str(k), below, i == len(kids) - 1, level + 1, False)

    path_of = {id(x): p for p, x in leaves}
    walk(node, key or "<root>", "", True, 0, True)
    shown = lines if not max_lines or len(lines) <= max_lines else lines[:max_lines]
    for line in shown:
        print(line)
    if len(shown) < len(lines):
        print(f"… {len(lines) - len(shown)} more lines (--max-lines 0 shows all)")
    print(f"totals: {len(leaves)} leaves, {len(arrays)} arrays, {human_bytes(array_bytes)} of array data")
    return 0


def ls(path: str, patterns: List[str]) -> int:
    r = _reader(path)
    keep = selected_paths(stand_in_of(r.tree), patterns, path)[0] if patterns else None
    n = 0
    for p, x in _leaves(r.structure()):
        if keep is None or p in keep:
            n += 1
            print(f"{p or '<root>'}\t{_leaf_text(r, p, x, 120)}")
    return 0


def _index(text: str) -> Tuple[Any, ...]:
    """numpy's index of the slice text ``0:2, :, -1, ...`` (what ``cat`` takes)."""
    out: List[Any] = []
    for part in [p.strip() for p in text.split(",")] if text.strip() else []:
        try:
            if part == "...":
                out.append(Ellipsis)
            elif ":" in part:
                bits = [b.strip() for b in part.split(":")]
                if len(bits) > 3:
                    raise ValueError
                out.append(slice(*(int(b) if b else None for b in bits)))
            else:
                out.append(int(part))
        except ValueError:
            raise ValueError(f"`{part}` in `[{text}]` is not an index: integers, start:stop:step slices and ... "
                             "separated by commas") from None
    return tuple(out)


def cat(path: str, key: str) -> int:
    from ._lazy import LazyArray, View, open as open_view

    slice_text = None
    if key.endswith("]") and "[" in key:
        key, slice_text = key[:key.rindex("[")], key[key.rindex("[") + 1:-1]
    _reader(path)  # (the format check, with its message)
    node: Any = open_view(path)
    done: List[str] = []
    for seg in [s for s in key.split("/") if s]:
        done.append(seg)
        if not isinstance(node, View):
            raise KeyError(f"key path `{'/'.join(done)}` not found: `{'/'.join(done[:-1]) or '<root>'}` is not a container")
        name: Any = _unescape(seg)
        if node.kind in ("list", "tuple") or (name not in node and seg.lstrip("-").isdigit()):
            name = int(seg)
        try:
            node = node[name]
        except (KeyError, IndexError, TypeError):
            shown = ", ".join(str(k) for k in node.keys()[:12])
            raise KeyError(f"key path `{'/'.join(done)}` not found: `{'/'.join(done[:-1]) or '<root>'}` "
                           f"({node.kind}) has no child `{seg}`; it has: {shown or 'nothing'}") from None
    if slice_text is not None:
        if not isinstance(node, LazyArray):
            raise ValueError(f"`{key or '<root>'}` is not an array: a [slice] applies to arrays")
        a = np.asarray(node[_index(slice_text)])
        print(f"{a.dtype}{list(a.shape)} =\n{np.array2string(a, threshold=1000)}")
        return 0
    value = node.read() if isinstance(node, (View, LazyArray)) else node
    print(np.array2string(value, threshold=1000) if isinstance(value, np.ndarray) else repr(value))
    return 0


def main(command: str, a: Any) -> int:
    try:
        if command == "inspect":
            return inspect(a.path, a.json, a.key, a.depth, a.max_lines, a.width)
        if command == "ls":
            return ls(a.path, a.patterns)
        return cat(a.path, a.key)
    except (ValueError, TypeError, OSError, ImportError, KeyError, IndexError, _core.TreepackError) as e:
        print(f"treepack: error: {e.args[0] if isinstance(e, KeyError) and e.args else e}", file=sys.stderr)
        return 2
