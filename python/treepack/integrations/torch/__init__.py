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
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import numpy as np

from ... import _plugin
from . import staging
from .dtypes import DIRECT, HINTS, VIA, dtype_name, numpy_of
from .storages import STORAGES, Storages, Written, agrees_within, extent_of, self_overlapping

TENSOR = "torch.Tensor"
PARAMETER = "torch.nn.Parameter"
TYPES = (TENSOR, PARAMETER)

MapLocation = Union[None, str, Any, Dict[str, Any], Callable[[Any, Optional[str]], Any]]


def is_tensor(obj: Any) -> bool:
    """Whether ``obj`` is a torch tensor (False without importing torch when it is not loaded)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _refuse(t: Any, where: str, reason: str) -> Exception:
    """The error of a tensor a save cannot keep (the save names every such object at once)."""
    return _plugin.UnsupportedObjectError(where, _plugin.type_name(type(t)), reason)


def encode(t: Any, where: str, storages: Optional[Storages] = None) -> Tuple[str, str, str, list]:
    """``encode_other``'s description of a tensor: an ``array`` with one numpy view, annotated."""
    import torch

    if t.layout != torch.strided:
        return _encode_sparse(t, where)
    if t.is_quantized:
        raise _refuse(t, where, f"a quantized tensor ({t.dtype}); {HINTS['qint8']}")
    if getattr(t, "is_nested", False):
        raise _refuse(t, where, "a nested tensor; save t.unbind() (a list of tensors) instead")
    cls = type(t)
    if cls is torch.nn.Parameter:
        ann: Dict[str, Any] = {"type": PARAMETER, "requires_grad": bool(t.requires_grad)}
    elif cls is torch.Tensor:
        ann = {"type": TENSOR}
        if t.requires_grad:
            ann["requires_grad"] = True
    else:
        raise _refuse(
            t, where, f"a tensor of the subclass {cls.__module__}.{cls.__qualname__}; "
            "convert it with torch.Tensor(t) / t.as_subclass(torch.Tensor), or register the subclass with treepack.register(...)"
        )
    if t.__dict__:
        # Python attributes set on the tensor (torch.save keeps them): the annotation has no
        # place for them yet, and dropping them would lose them silently.
        raise _refuse(
            t, where, f"a tensor with Python attributes ({', '.join(sorted(map(str, t.__dict__))[:5])}), which treepack "
            "does not keep: save them beside it ({'tensor': t.detach(), 'attrs': vars(t)}), or save t.detach() (the "
            "tensor alone)",
        )
    dev = t.device
    if dev.type == "meta":
        raise _refuse(t, where, "a tensor on the meta device has no data (materialize it first, e.g. "
                                     "module.to_empty(device='cpu') and its initialization)")
    if storages is not None:
        shared = storages.note(t)
        if shared is not None:
            ann["storage"] = shared
    t = t.detach()
    if dev.type != "cpu":
        ann["device"] = str(dev)
        t = t.cpu()
    name = dtype_name(t.dtype)
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if not t.is_contiguous():
        t = t.contiguous()
    if name in DIRECT:
        view = t.numpy()
    elif name in VIA:
        import ml_dtypes

        via, stored = VIA[name]
        view = t.view(getattr(torch, via)).numpy().view(getattr(ml_dtypes, stored))
    else:
        hint = HINTS.get(name, "convert it to a supported dtype first (e.g. .to(torch.float32))")
        raise _refuse(t, where, f"torch dtype {name} has no treepack dtype; {hint}")
    return ("array", "", json.dumps(ann, separators=(",", ":")), [("value", view)])


#: torch's small value types, as found in configs (transformers' ``torch_dtype``/``dtype``):
#: built by treepack from their data alone (a dtype name from torch's own list, a device string,
#: a tuple of ints), so they need no trust.
VALUES = frozenset({"py.torch_dtype", "py.torch_size", "py.torch_device"})


def encode_value(obj: Any) -> Optional[Tuple[str, str, Optional[str], list]]:
    """``encode_other``'s description of a ``torch.dtype``, ``torch.Size`` or ``torch.device``,
    or None for anything else (and when torch is not loaded)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    t = type(obj)
    if t is torch.dtype:
        return ("custom", "py.torch_dtype", json.dumps(dtype_name(obj)), [])
    if t is torch.Size:
        return ("custom", "py.torch_size", None, [("dims", [int(n) for n in obj])])
    if t is torch.device:
        return ("custom", "py.torch_device", json.dumps(str(obj)), [])
    return None


def decode_value(t: str, data: Any, kids: Dict[str, Any]) -> Any:
    import torch

    if t == "py.torch_dtype":
        dt = getattr(torch, data, None) if isinstance(data, str) and data.isidentifier() else None
        if not isinstance(dt, torch.dtype):
            raise ValueError(f"py.torch_dtype: {data!r} names no torch dtype")
        return dt
    if t == "py.torch_size":
        dims = kids.get("dims")
        if not isinstance(dims, list) or not all(type(n) is int for n in dims):
            raise ValueError("py.torch_size: the dimensions must be a list of ints")
        return torch.Size(dims)
    if not isinstance(data, str):
        raise ValueError("py.torch_device: the device must be a string")
    return torch.device(data)


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
        raise _refuse(t, where, f"a {t.layout} tensor; convert it with .to_dense() or .to_sparse()")
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


# numpy dtype -> (its name, the dtype its bytes are viewed as for torch.from_numpy or None),
# filled as dtypes are met: a dtype's name is slow to ask numpy for, once a tensor.
_KINDS: Dict[Any, Tuple[str, Optional[str]]] = {}
_READ_ONLY_WARNED = False


def _from_read_only(torch: Any, base: np.ndarray) -> Any:
    """A tensor viewing the read-only array ``base`` (a view of a file's private copy-on-write
    mapping). torch warns once a process that it cannot mark tensors read-only (TORCH_WARN_ONCE);
    that warning is silenced the first time, and the other tensors of a load skip the cost of
    a warnings filter each."""
    global _READ_ONLY_WARNED
    if _READ_ONLY_WARNED:
        return torch.from_numpy(base)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        t = torch.from_numpy(base)
    _READ_ONLY_WARNED = True
    return t


class Loader:
    """Turns the numpy arrays of annotated tensor leaves into tensors, for one load.

    ``map_location`` as in ``torch.load``: ``None`` leaves tensors on the CPU; a device (or its
    name) moves every tensor there; a dict maps saved device names (``"cuda:0"``; ``"cpu"``
    for tensors saved from the CPU) to devices; a callable gets ``(tensor, saved_device)`` and
    returns the tensor to use."""

    def __init__(self, map_location: MapLocation = None, stager: Optional["staging.Stager"] = None) -> None:
        self.map_location = map_location
        # The load's copies to a device (see `staging.Stager`), or None: each tensor's copy is its own.
        self.stager = stager
        # Data pointers of mmap tensors already made: a chunk stored once for two equal tensors
        # is one mapping, so the second tensor gets its own copy (no aliasing between leaves).
        self._seen: set = set()
        # Storages shared by several tensors of the file, by their number: [storage, bytes of
        # values written into it]; with the bytes all of them take and all of their tensors hold
        # (one budget for the load, see `_in_storage`).
        self._storages: Dict[Any, List[Any]] = {}
        self._storage_bytes = 0
        self._held_bytes = 0

    def tensor(self, arr: np.ndarray, ann: Dict[str, Any]) -> Any:
        import torch

        kind = _KINDS.get(arr.dtype)
        if kind is None:
            stored = arr.dtype.name
            via = next((v for v, s in VIA.values() if s == stored), None)
            if via is None and stored not in DIRECT:
                raise ValueError(f"a {ann.get('type')} leaf holds an array of dtype {arr.dtype}, which no torch dtype holds")
            kind = _KINDS[arr.dtype] = (stored, via)
        stored, via = kind
        base = arr.view(np.dtype(via)) if via is not None else arr
        own = True  # its memory is this load's alone (see `_in_storage`)
        if base.flags.writeable:
            t = torch.from_numpy(base)
        else:
            # A read-only view of the file's private (copy-on-write) mapping: writes to the
            # tensor stay in this process, as with torch.load(mmap=True).
            ptr = base.__array_interface__["data"][0]
            if ptr in self._seen and base.nbytes and "storage" in ann:
                # A second view of a range another tensor of a shared storage views (tied
                # weights read from a checkpoint): it goes into that storage, which is that
                # range already; no copy of it is made for nothing.
                own = False
                t = _from_read_only(torch, base)
            elif ptr in self._seen and base.nbytes:
                t = torch.from_numpy(base.copy())
            else:
                self._seen.add(ptr)
                t = _from_read_only(torch, base)
        if via is not None:
            t = t.view(getattr(torch, stored))
        saved = ann.get("device")
        on_adopted = None
        if "storage" in ann:
            t, on_adopted = self._in_storage(t, ann["storage"], saved, own=own)
        else:
            t = self._place(t, saved)
        if ann.get("type") == PARAMETER:
            t = torch.nn.Parameter(t, requires_grad=bool(ann.get("requires_grad", True)))
        elif ann.get("requires_grad"):
            t.requires_grad_(True)
        if on_adopted is not None:
            on_adopted.append(t)
        return t

    def _in_storage(self, values: Any, st: Any, saved: Optional[str], own: bool = False) -> Tuple[Any, Optional[List[Any]]]:
        """A tensor holding ``values`` that lies in the storage numbered ``st["id"]`` (shared
        with other tensors of this load), at its offset and strides. The storage is made on the
        device this tensor goes to and grows to whatever its tensors reach, within
        ``Storages.RATIO`` times the bytes they hold.

        The first tensor of a storage that starts it and is laid out as its values are
        (offset 0, C order: tied weights, the base before its views) *is* the storage when
        ``own`` (its memory is this load's alone: a buffer read for it, a copy, or the first
        view of its range of a file's private copy-on-write mapping; not a second view of a
        range another tensor views) and tensors stay on the CPU: no second buffer
        of its size is allocated, zeroed and copied into. Such a storage cannot grow in place,
        so the list returned with the tensor collects the tensors made on it (the caller
        appends what it returns), to be moved onto a bigger storage if a later tensor reaches
        past it."""
        import torch

        if not isinstance(st, dict) or not isinstance(st.get("id"), int) or isinstance(st.get("id"), bool):
            raise ValueError(f"a tensor's storage annotation must name a storage by number, got {st!r}")
        offset, stride = st.get("offset"), st.get("stride")
        ok = lambda n: isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**62
        if not ok(offset) or not isinstance(stride, list) or len(stride) != values.dim() or not all(ok(x) for x in stride):
            raise ValueError(f"a tensor's storage annotation has a bad offset or strides: {st!r}")
        device = self._device(saved)
        item = values.element_size()
        extent = extent_of(offset, values.shape, stride) * item
        entry = self._storages.get(st["id"])
        grow = max(0, extent - (entry[0].nbytes() if entry else 0))
        nbytes = values.numel() * item
        # Sharing is kept while every shared storage of this load together stays within
        # `RATIO` times the bytes their tensors hold (plus one `SLACK`): a file cannot make a
        # load allocate much more than it holds, however many storages it names. A tensor that
        # would go past it (a small view met before its big base, a select of one view) is
        # loaded as its own tensor: its values are all there, only the sharing is not.
        if self._storage_bytes + grow > Storages.RATIO * (self._held_bytes + nbytes) + Storages.SLACK:
            return self._place(values if own else values.clone(), saved), None
        self._storage_bytes += grow
        self._held_bytes += nbytes
        held = (entry[1] if entry else 0) + nbytes
        footprint = (offset, tuple(values.shape), tuple(stride), item)
        if (
            entry is None
            and own
            and self.map_location is None
            and values.device.type == "cpu"
            and offset == 0
            and list(values.stride()) == stride
            and values.untyped_storage().nbytes() == extent
        ):
            # [storage, bytes held, tensors on it (None once the storage is torch's own),
            #  what the tensors put on it wrote there]
            entry = self._storages[st["id"]] = [values.untyped_storage(), held, [], Written()]
            entry[3].add(footprint)
            return values, entry[2]
        if entry is None:
            entry = self._storages[st["id"]] = [
                torch.empty(0, dtype=torch.uint8, device=device).untyped_storage(), 0, None, Written(),
            ]
        storage = entry[0]
        if storage.nbytes() < extent:
            old = storage.nbytes()
            if entry[2] is not None:
                storage = entry[0] = _regrown(storage, extent, entry[2])
                entry[2] = None
            else:
                if self.stager is not None:
                    self.stager.settle()  # (copies into the storage before it moves)
                storage.resize_(extent)
                _fill(storage, old, extent)
        entry[1] = held
        t = torch.empty(0, dtype=values.dtype, device=storage.device).set_(storage, offset, values.shape, stride)
        if storage.device.type == "meta":
            pass  # (map_location="meta": shapes without bytes, nothing to compare or copy)
        elif not (t.data_ptr() == values.data_ptr() and t.stride() == values.stride() and t.device == values.device):
            # Tensors that share a storage must agree where they overlap: a file could make a
            # later tensor overwrite an earlier one's verified values (or a sparse tensor's
            # indices after torch checked them) with other bytes.
            overlaps, inside = entry[3].meets(footprint), self_overlapping(footprint)
            if overlaps and self.stager is not None:
                self.stager.settle()  # (the earlier tensors' bytes are all there)
            if not (overlaps and entry[3].agrees(storage, footprint, values, st["id"])):
                _copy_into(t, values, self.stager)  # (a view of the very bytes it goes to needs no copy)
                if inside:
                    # Elements at one place (a zero stride) must hold one value: the copy left
                    # the last one there.
                    if self.stager is not None:
                        self.stager.settle()
                    agrees_within(storage, footprint, values, st["id"])
        entry[3].add(footprint)
        if self.map_location is not None and callable(self.map_location) and not isinstance(self.map_location, (str, dict)):
            t = self.map_location(t, saved or "cpu")
        return t, entry[2]

    def _device(self, saved: Optional[str]) -> Any:
        """Where ``_place`` puts a tensor saved on ``saved`` (the CPU for a callable, which then
        gets each tensor)."""
        m = self.map_location
        if m is None or (callable(m) and not isinstance(m, str)):
            return "cpu"
        if isinstance(m, dict):
            return m.get(saved or "cpu") or "cpu"
        return m

    def _place(self, t: Any, saved: Optional[str]) -> Any:
        m = self.map_location
        if m is None:
            return t
        if callable(m) and not isinstance(m, str):
            # torch.load passes the storage's location: "cpu" for tensors saved from the CPU.
            return m(t, saved or "cpu")
        if isinstance(m, dict):
            target = m.get(saved or "cpu")
            return t if target is None else _to(t, target, self.stager)
        return _to(t, m, self.stager)


def _to(t: Any, target: Any, stager: Optional["staging.Stager"] = None) -> Any:
    """``t.to(target)``; onto a device with staged copies (CUDA) a contiguous CPU tensor goes
    through the staging buffers (``staging.stage_into``, by the load's ``stager`` if any), not through a
    pageable copy."""
    import torch

    device = torch.device(target)
    if device.type in staging.STAGED and t.device.type == "cpu" and t.is_contiguous() and t.numel():
        out = torch.empty(t.shape, dtype=t.dtype, device=device)
        staging.stage_into(out, t, stager)
        return out
    return t.to(device)


def _regrown(storage: Any, extent: int, tensors: List[Any]) -> Any:
    """A CPU storage of ``extent`` bytes holding ``storage``'s bytes (the rest zero), with the
    ``tensors`` made on ``storage`` moved onto it (same offsets, shapes and strides): the
    storage a loaded tensor's memory became cannot be resized (see ``Loader._in_storage``)."""
    import ctypes

    import torch

    old = storage.nbytes()
    new = torch.empty(0, dtype=torch.uint8).untyped_storage()
    new.resize_(extent)
    ctypes.memmove(new.data_ptr(), storage.data_ptr(), old)
    _fill(new, old, extent)
    with torch.no_grad():
        for t in tensors:
            t.data = torch.empty(0, dtype=t.dtype).set_(new, t.storage_offset(), t.shape, t.stride())
    return new


def _fill(storage: Any, start: int, end: int) -> None:
    """Zero bytes ``start..end`` of a storage. On the CPU with a plain memset: torch's own
    kernels run on its thread pool, which hangs in a process forked after the parent used it (a
    DataLoader worker loading a checkpoint), and a storage exported with ``.numpy()`` can no
    longer grow."""
    import ctypes

    import torch

    if storage.device.type == "cpu":
        ctypes.memset(storage.data_ptr() + start, 0, end - start)
    else:
        torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)[start:end].zero_()


def _copy_into(dst: Any, src: Any, stager: Optional["staging.Stager"] = None) -> None:
    """``dst[...] = src`` (same shape and dtype; ``src`` on the CPU, contiguous); onto a device
    with staged copies by ``staging.stage_into`` (by the load's ``stager`` if any). On the CPU
    through a numpy array over the storage's memory (see ``_fill``); a dtype numpy lacks
    (bfloat16, float8) as integers of its width."""
    import ctypes

    import torch

    with torch.no_grad():
        if dst.device.type in staging.STAGED and dst.is_contiguous() and src.is_contiguous() and dst.numel():
            staging.stage_into(dst, src, stager)
            return
        if dst.device.type != "cpu":
            dst.copy_(src)
            return
        values = numpy_of(torch, src)
        item = values.dtype.itemsize
        storage = dst.untyped_storage()
        memory = (ctypes.c_char * storage.nbytes()).from_address(storage.data_ptr())
        view = np.ndarray(
            tuple(dst.shape), dtype=values.dtype, buffer=memory, offset=dst.storage_offset() * item,
            strides=tuple(st * item for st in dst.stride()),
        )
        np.copyto(view, values)


def is_meta(x: Any) -> bool:
    """A tensor on the ``meta`` device: a shape and a dtype without memory."""
    return is_tensor(x) and x.device.type == "meta"


def from_meta(v: Any, like: Any, map_location: Any = None, stager: Optional["staging.Stager"] = None) -> Any:
    """The loaded leaf ``v`` for a ``like=`` tensor on the ``meta`` device: a real tensor (a
    numpy array becomes one) on ``map_location``'s device, the CPU by default; a parameter if
    ``like`` is one."""
    import torch

    if v is None:  # skipped by select
        return v
    if not isinstance(v, torch.Tensor):
        v = Loader(map_location, stager).tensor(np.asarray(v), {"type": TENSOR})
    elif map_location is None and v.device.type == "meta":
        v = v.to("cpu")
    if isinstance(like, torch.nn.Parameter) and not isinstance(v, torch.nn.Parameter):
        v = torch.nn.Parameter(v, requires_grad=like.requires_grad)
    return v


def check_like(t: Any, info: Any, where: str, stored: Optional[np.dtype]) -> None:
    """A ``like=`` tensor must match the stored array's shape and dtype (it is loaded into)."""
    name = dtype_name(t.dtype)
    if stored is None:
        raise ValueError(f"like=: at {where} like= has a torch tensor ({name}) but the file holds a {info.kind} leaf; use True to load it as stored")
    have = tuple(info.shape)
    if have != tuple(t.shape) or stored.name != name:
        raise ValueError(
            f"like=: at {where} the file holds {stored.name} with shape {have}, but the tensor to load into is "
            f"{name} with shape {tuple(t.shape)}; use True to load it as stored"
        )


def read_into(reader: Any, items: List[Tuple[str, Any]], verify: bool = True) -> None:
    """Read the stored arrays at the paths of ``items`` into their tensors in place: a
    contiguous CPU tensor straight into its memory; a contiguous tensor on a device with staged
    copies (CUDA) through a few reused pinned host buffers, each piece's copy to the device
    overlapping the read of the next (``staging.read_staged``); anything else through one CPU buffer of
    its size."""
    import torch

    staged: List[Tuple[str, Any]] = []
    # Contiguous CPU tensors are read all at once: the reader reads and hashes their chunks side
    # by side, the small tensors' too (tied ones, the same memory twice, once).
    direct: List[Tuple[str, Any]] = []
    with torch.no_grad():
        for path, t in items:
            dst = t.detach()
            plain = dst.is_contiguous() and not dst.is_conj() and not dst.is_neg()
            if plain and dst.device.type in staging.STAGED and dst.numel():
                staged.append((path, dst))
            elif plain and dst.device.type == "cpu":
                direct.append((path, numpy_of(torch, dst)))
            else:
                # (Those before it first: a view here may share their memory, and comes later.)
                if direct:
                    reader.read_many_into(direct, verify)
                    direct = []
                if staged:
                    staging.read_staged(reader, staged, verify)
                    staged = []
                buf = torch.empty(dst.shape, dtype=dst.dtype)
                reader.read_into(path, numpy_of(torch, buf), verify)
                dst.copy_(buf)
        if direct:
            reader.read_many_into(direct, verify)
        if staged:
            staging.read_staged(reader, staged, verify)


def missing_message(paths: list) -> str:
    shown = ", ".join(f"`{p or '<root>'}`" for p in paths[:5])
    more = f" and {len(paths) - 5} more" if len(paths) > 5 else ""
    return (
        f"this tree holds {len(paths)} torch tensor(s) ({shown}{more}) but torch cannot be imported: "
        "install it (pip install torch, or pip install 'treepack[torch]'), or pass on_missing='placeholder' "
        "to load them as numpy arrays"
    )


# ---------------------------------------------------------------- the plug-in


def _encode(obj: Any, where: str, memo: Any, omit_static: bool) -> Optional[Tuple[str, str, Optional[str], list]]:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        storages = memo.get(STORAGES) if memo is not None else None  # (the save's, once made)
        if storages is None:
            storages = _plugin.save_state(memo, STORAGES, _storages)
        return encode(obj, where, storages)
    return encode_value(obj)


def _storages(run: Any) -> Storages:
    return Storages()


def _hint(obj: Any) -> Optional[str]:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    if isinstance(obj, torch.nn.Module):
        return (
            "a torch module holds code as well as data: save model.state_dict() (and the arguments that "
            "build the model), then model.load_state_dict(treepack.load(...)), as torch recommends"
        )
    if isinstance(obj, torch.optim.Optimizer):
        return "save optimizer.state_dict(), and load it with optimizer.load_state_dict(treepack.load(...))"
    if isinstance(obj, getattr(torch.optim.lr_scheduler, "LRScheduler", ())):
        return "save scheduler.state_dict(), and load it with scheduler.load_state_dict(...)"
    if isinstance(obj, torch.Generator):
        return "save generator.get_state() (a tensor), and load it with generator.set_state(...)"
    return None


def _tensors(options: Dict[str, Any]) -> Callable[[np.ndarray, Dict[str, Any]], Any]:
    import torch  # noqa: F401  (an ImportError here: the load's tensors cannot be made)

    return Loader(options.get("map_location"), options.get(staging.OPTION)).tensor


def _decode_sparse(dec: Any, t: str, data: Any, kids: Dict[str, Any]) -> Any:
    return decode_sparse(data, kids)


def _decode_value(dec: Any, t: str, data: Any, kids: Dict[str, Any]) -> Any:
    return decode_value(t, data, kids)


def _like_leaf(like: Any, stored: Any, where: str) -> Optional[str]:
    """A tensor of ``like=`` at a stored leaf: checked, then read into in place (``"into"``), or
    loaded as a new tensor when it is on the ``meta`` device (``"keep"``)."""
    if not is_tensor(like):
        return None
    check_like(like, stored, where, _plugin.stored_dtype(stored) if stored.kind == "array" else None)
    return "keep" if is_meta(like) else "into"


def _check_options(options: Dict[str, Any], path: str) -> None:
    """A device ``map_location`` names (a string, a ``torch.device``, a dict's values) must be one
    torch has here: checked before anything is read (or another tool's file converted), the
    error naming the file and the device."""
    m = options.get("map_location")
    if m is None or (callable(m) and not isinstance(m, str)):
        return
    torch = sys.modules.get("torch")
    if torch is None:
        return  # (a tree of tensors imports it, and then says what is wrong; one without needs none)
    targets = list(m.values()) if isinstance(m, dict) else [m]

    for t in targets:
        if t is None:
            continue
        try:
            dev = torch.device(t)
        except (RuntimeError, TypeError, ValueError) as e:
            raise ValueError(f"load of {path}: map_location={t!r} is not a torch device ({e})") from None
        mod = getattr(torch, dev.type, None) if dev.type != "cpu" else None
        available = getattr(mod, "is_available", None)
        if available is not None and not available():
            raise ValueError(f"load of {path}: map_location={t!r} names a {dev.type} device, but torch has none here "
                             f"(torch.{dev.type}.is_available() is False); load onto the CPU with map_location='cpu'")
        count = getattr(mod, "device_count", None)
        if dev.index is not None and count is not None and dev.index >= count():
            raise ValueError(f"load of {path}: map_location={t!r}, but this machine has {count()} {dev.type} device(s)")


def _load(request: Any) -> Any:
    """``load(path, map_location=...)`` naming a device with staged copies (CUDA): the load's
    tensors go to it through one ``staging.Stager`` (its ``finish`` called when the load ends), each
    tensor's copy to the device running while the next is read. And for a local tree whose
    arrays are all tensors, loaded onto one such device, the tensors are read as views of the
    file (``mmap``, hashes checked as the load asks), so that each goes to the device from the
    file's pages, and no copy of the whole tree is made in host memory first. Nothing else
    changes: every array becomes a tensor on the device (a tree with a numpy array, which would
    come back as a read-only view, is read as before; so is a load asking for numpy arrays, or
    made through Dask). Always declines: the load itself is the usual one."""
    m = request.options.get("map_location")
    torch = sys.modules.get("torch")  # (a torch.device given means torch is imported)

    def kind(target: Any) -> Optional[str]:
        if isinstance(target, str):
            return target.partition(":")[0]
        return target.type if torch is not None and isinstance(target, torch.device) else None

    targets = list(m.values()) if isinstance(m, dict) else [m]
    if not any(kind(t) in staging.STAGED for t in targets):
        return _plugin.DECLINE
    stager = staging.Stager()
    request.decoder.options[staging.OPTION] = stager
    request.finishing.append(stager.finish)
    if isinstance(m, dict) or not request.may_map("map_location"):
        return _plugin.DECLINE
    try:
        types = request.reader().array_types()
    except Exception:  # (the load itself reports what is wrong with the tree)
        return _plugin.DECLINE
    if types and all(t in (TENSOR, PARAMETER) for t, _ in types):
        request.mmap = True
    return _plugin.DECLINE


def _like_graft(out: Any, like: Any, options: Dict[str, Any]) -> Any:
    if is_meta(like):
        return from_meta(out, like, options.get("map_location"), options.get(staging.OPTION))
    return _plugin.DECLINE


_plugin.integrate(
    __name__,
    encode=_encode,
    hint=_hint,
    nodes={SPARSE: _decode_sparse, **{name: _decode_value for name in VALUES}},
    arrays=_tensors,
    missing=lambda paths: missing_message(paths),
    like_leaf=_like_leaf,
    read_into=lambda reader, items, verify: read_into(reader, items, verify),
    load=_load,
    check_options=_check_options,
    like_graft=_like_graft,
)
