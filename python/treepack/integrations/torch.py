"""PyTorch: ``torch.Tensor`` leaves without pickle.

A tensor is stored as an ordinary array (its canonical bytes, readable by any treepack reader)
whose node carries an annotation (format 1.3, ``"as"``): ``{"type": "torch.Tensor"}`` or
``"torch.nn.Parameter"``, plus ``requires_grad`` and the ``device`` it was saved from when those
are not the defaults. A reader without torch gets the numpy array; this module turns it back
into a tensor over the same memory (no copy), which for ``mmap=True`` is the file's mapping.

Nothing here imports torch: ``is_tensor`` looks at ``sys.modules``, so a process that never
imported torch never pays for it, and loading imports torch only when the file holds tensors.
"""

from __future__ import annotations

import json
import sys
import warnings
from typing import Any, Callable, Dict, Optional, Tuple, Union

import numpy as np

TENSOR = "torch.Tensor"
PARAMETER = "torch.nn.Parameter"
TYPES = (TENSOR, PARAMETER)

#: torch dtype name -> (dtype to view the tensor as for ``.numpy()``, numpy dtype name or
#: ml_dtypes name the stored array has). Views keep the bytes: bfloat16 and float8 tensors are
#: read as integers of their width and reinterpreted, since torch's ``.numpy()`` refuses them.
_VIA = {
    "bfloat16": ("int16", "bfloat16"),
    "float8_e4m3fn": ("uint8", "float8_e4m3fn"),
    "float8_e5m2": ("uint8", "float8_e5m2"),
    "float8_e4m3fnuz": ("uint8", "float8_e4m3fnuz"),
    "float8_e5m2fnuz": ("uint8", "float8_e5m2fnuz"),
}
_DIRECT = frozenset(
    "bool uint8 int8 int16 int32 int64 uint16 uint32 uint64 float16 float32 float64 complex64 complex128".split()
)
_HINTS = {
    "complex32": "convert it with .to(torch.complex64)",
    "quint8": "store .int_repr() and the quantization parameters, or .dequantize()",
    "qint8": "store .int_repr() and the quantization parameters, or .dequantize()",
    "qint32": "store .int_repr() and the quantization parameters, or .dequantize()",
    "quint4x2": "store .int_repr() and the quantization parameters, or .dequantize()",
}

MapLocation = Union[None, str, Any, Dict[str, Any], Callable[[Any, Optional[str]], Any]]


def is_tensor(obj: Any) -> bool:
    """Whether ``obj`` is a torch tensor (False without importing torch when it is not loaded)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _dtype_name(dt: Any) -> str:
    return str(dt).rpartition(".")[2]


def encode(t: Any, where: str) -> Tuple[str, str, str, list]:
    """``encode_other``'s description of a tensor: an ``array`` with one numpy view, annotated."""
    import torch

    if t.layout != torch.strided:
        return _encode_sparse(t, where)
    if t.is_quantized:
        raise TypeError(f"cannot save `{where}`: a quantized tensor ({t.dtype}); {_HINTS['qint8']}")
    if getattr(t, "is_nested", False):
        raise TypeError(f"cannot save `{where}`: a nested tensor; save t.unbind() (a list of tensors) instead")
    cls = type(t)
    if cls is torch.nn.Parameter:
        ann: Dict[str, Any] = {"type": PARAMETER, "requires_grad": bool(t.requires_grad)}
    elif cls is torch.Tensor:
        ann = {"type": TENSOR}
        if t.requires_grad:
            ann["requires_grad"] = True
    else:
        raise TypeError(
            f"cannot save `{where}`: a tensor of the subclass {cls.__module__}.{cls.__qualname__}; convert it with "
            "torch.Tensor(t) / t.as_subclass(torch.Tensor), or register the subclass with treepack.register(...)"
        )
    dev = t.device
    if dev.type == "meta":
        raise TypeError(f"cannot save `{where}`: a tensor on the meta device has no data")
    t = t.detach()
    if dev.type != "cpu":
        ann["device"] = str(dev)
        t = t.cpu()
    name = _dtype_name(t.dtype)
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if not t.is_contiguous():
        t = t.contiguous()
    if name in _DIRECT:
        view = t.numpy()
    elif name in _VIA:
        import ml_dtypes

        via, stored = _VIA[name]
        view = t.view(getattr(torch, via)).numpy().view(getattr(ml_dtypes, stored))
    else:
        hint = _HINTS.get(name, "convert it to a supported dtype first (e.g. .to(torch.float32))")
        raise TypeError(f"cannot save `{where}`: torch dtype {name} has no treepack dtype; {hint}")
    return ("array", "", json.dumps(ann, separators=(",", ":")), [("value", view)])


SPARSE = "py.torch_sparse"
#: Sparse layouts by name; compressed ones: (compressed indices, plain indices) accessors.
_COMPRESSED = {
    "csr": ("crow_indices", "col_indices"),
    "csc": ("ccol_indices", "row_indices"),
    "bsr": ("crow_indices", "col_indices"),
    "bsc": ("ccol_indices", "row_indices"),
}


def _encode_sparse(t: Any, where: str) -> Tuple[str, str, str, list]:
    """A sparse tensor as ``py.torch_sparse``: its layout and size as data, its index and value
    tensors (dense, each stored as any tensor is) as children. An uncoalesced COO tensor is kept
    as it is (duplicates included)."""
    import torch

    name = str(t.layout).rpartition("_")[2]  # torch.sparse_coo -> coo
    data: Dict[str, Any] = {"layout": name, "size": list(t.shape)}
    if t.requires_grad:
        data["requires_grad"] = True
    t = t.detach()
    if t.layout == torch.sparse_coo:
        data["coalesced"] = bool(t.is_coalesced())
        kids = [("indices", t._indices()), ("values", t._values())]
    elif name in _COMPRESSED:
        comp, plain = _COMPRESSED[name]
        kids = [("compressed_indices", getattr(t, comp)()), ("plain_indices", getattr(t, plain)()), ("values", t.values())]
    else:
        raise TypeError(f"cannot save `{where}`: a {t.layout} tensor; convert it with .to_dense() or .to_sparse()")
    return ("custom", SPARSE, json.dumps(data, separators=(",", ":")), kids)


def decode_sparse(data: Any, kids: Dict[str, Any]) -> Any:
    """The sparse tensor a ``py.torch_sparse`` node describes, its invariants checked by torch
    (indices inside the size, compressed indices ordered) before anything uses it."""
    import torch

    layout = data.get("layout") if isinstance(data, dict) else None
    size = data.get("size") if isinstance(data, dict) else None
    if not isinstance(size, list) or not all(type(n) is int and n >= 0 for n in size):
        raise ValueError(f"{SPARSE}: a sparse tensor needs a list of sizes, not {size!r}")
    tensors = [v for k, v in kids.items() if k in ("indices", "values", "compressed_indices", "plain_indices")]
    if not all(isinstance(v, torch.Tensor) for v in tensors):
        raise ValueError(f"{SPARSE}: the indices and values of a sparse tensor must be tensors")
    try:
        if layout == "coo":
            out = torch.sparse_coo_tensor(kids["indices"], kids["values"], size, check_invariants=True)
            # The file's word is not taken for it: coalescing sorts and sums, and is checked.
            if data.get("coalesced"):
                out = out.coalesce()
        elif layout in _COMPRESSED:
            out = torch.sparse_compressed_tensor(
                kids["compressed_indices"], kids["plain_indices"], kids["values"], size,
                layout=getattr(torch, f"sparse_{layout}"), check_invariants=True,
            )
        else:
            raise ValueError(f"{SPARSE}: unknown sparse layout {layout!r}")
    except (RuntimeError, KeyError, TypeError, OverflowError, ValueError) as e:
        raise ValueError(f"{SPARSE}: the stored {layout} tensor does not hold together ({e})") from None
    if data.get("requires_grad"):
        out.requires_grad_(True)
    return out


class Loader:
    """Turns the numpy arrays of annotated tensor leaves into tensors, for one load.

    ``map_location`` as in ``torch.load``: ``None`` leaves tensors on the CPU; a device (or its
    name) moves every tensor there; a dict maps saved device names (``"cuda:0"``; ``"cpu"``
    for tensors saved from the CPU) to devices; a callable gets ``(tensor, saved_device)`` and
    returns the tensor to use."""

    def __init__(self, map_location: MapLocation = None) -> None:
        self.map_location = map_location
        # Data pointers of mmap tensors already made: a chunk stored once for two equal tensors
        # is one mapping, so the second tensor gets its own copy (no aliasing between leaves).
        self._seen: set = set()

    def tensor(self, arr: np.ndarray, ann: Dict[str, Any]) -> Any:
        import torch

        stored = arr.dtype.name
        via = next((v for v, s in _VIA.values() if s == stored), None)
        if via is None and stored not in _DIRECT:
            raise ValueError(f"a {ann.get('type')} leaf holds an array of dtype {arr.dtype}, which no torch dtype holds")
        base = arr.view(np.dtype(via)) if via is not None else arr
        if base.flags.writeable:
            t = torch.from_numpy(base)
        else:
            # A read-only view of the file's private (copy-on-write) mapping: writes to the
            # tensor stay in this process, as with torch.load(mmap=True).
            ptr = base.__array_interface__["data"][0]
            if ptr in self._seen and base.nbytes:
                t = torch.from_numpy(base.copy())
            else:
                self._seen.add(ptr)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)
                    t = torch.from_numpy(base)
        if via is not None:
            t = t.view(getattr(torch, stored))
        saved = ann.get("device")
        t = self._place(t, saved)
        if ann.get("type") == PARAMETER:
            return torch.nn.Parameter(t, requires_grad=bool(ann.get("requires_grad", True)))
        if ann.get("requires_grad"):
            t.requires_grad_(True)
        return t

    def _place(self, t: Any, saved: Optional[str]) -> Any:
        m = self.map_location
        if m is None:
            return t
        if callable(m) and not isinstance(m, str):
            return m(t, saved)
        if isinstance(m, dict):
            target = m.get(saved or "cpu")
            return t if target is None else t.to(target)
        return t.to(m)


def check_like(t: Any, info: Any, where: str, stored: Optional[np.dtype]) -> None:
    """A ``like=`` tensor must match the stored array's shape and dtype (it is loaded into)."""
    name = _dtype_name(t.dtype)
    if stored is None:
        raise ValueError(f"like=: at {where} like= has a torch tensor ({name}) but the file holds a {info.kind} leaf; use True to load it as stored")
    have = tuple(info.shape)
    if have != tuple(t.shape) or stored.name != name:
        raise ValueError(
            f"like=: at {where} the file holds {stored.name} with shape {have}, but the tensor to load into is "
            f"{name} with shape {tuple(t.shape)}; use True to load it as stored"
        )


def read_into(reader: Any, path: str, t: Any, verify: bool = True) -> None:
    """Read the stored array at ``path`` into tensor ``t`` in place: straight into its memory
    when it is a contiguous CPU tensor, else through one CPU buffer of its size."""
    import torch

    with torch.no_grad():
        dst = t.detach()
        direct = dst.device.type == "cpu" and dst.is_contiguous() and not dst.is_conj() and not dst.is_neg()
        buf = dst if direct else torch.empty(dst.shape, dtype=dst.dtype)
        name = _dtype_name(buf.dtype)
        view = buf.view(getattr(torch, _VIA[name][0])) if name in _VIA else buf
        reader.read_into(path, view.numpy(), verify)
        if not direct:
            dst.copy_(buf)


def missing_message(paths: list) -> str:
    shown = ", ".join(f"`{p or '<root>'}`" for p in paths[:5])
    more = f" and {len(paths) - 5} more" if len(paths) > 5 else ""
    return (
        f"this tree holds {len(paths)} torch tensor(s) ({shown}{more}) but torch cannot be imported: "
        "install it (pip install torch, or pip install 'treepack[torch]'), or pass on_missing='placeholder' "
        "to load them as numpy arrays"
    )
