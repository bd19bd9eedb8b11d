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

import bisect
import json
import sys
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import numpy as np

from .. import _plugin

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
    "float8_e8m0fnu": ("uint8", "float8_e8m0fnu"),  # format 1.5
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
    # Two float4 values in each byte: treepack's float4_e2m1fn holds one per byte (as ml_dtypes).
    "float4_e2m1fn_x2": "it packs two float4_e2m1fn values into each byte; store .view(torch.uint8) "
    "(and unpack it yourself), or unpack it into a numpy ml_dtypes.float4_e2m1fn array (one value per byte)",
}
# torch's int1-int7 and uint1-uint7 are placeholders: a byte each, with no defined value or
# conversion (torch cannot copy into or read them), so no treepack dtype is their exact match.
for _bits in range(1, 8):
    for _name in (f"int{_bits}", f"uint{_bits}"):
        _HINTS[_name] = (
            "torch's sub-byte integer dtypes hold bits without defined values; store .view(torch.uint8) "
            "with how it is packed, or a numpy ml_dtypes int4/int2/int1 (uint4/uint2/uint1) array"
        )

MapLocation = Union[None, str, Any, Dict[str, Any], Callable[[Any, Optional[str]], Any]]


def is_tensor(obj: Any) -> bool:
    """Whether ``obj`` is a torch tensor (False without importing torch when it is not loaded)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _dtype_name(dt: Any) -> str:
    return str(dt).rpartition(".")[2]


#: The key of a save's ``Storages`` in ``encode_other``'s per-save memo.
STORAGES = "torch.storages"


class Storages(_plugin.SaveState):
    """One save's view of the storages its tensors use, so that tensors sharing one (tied
    weights: GPT-2's ``lm_head.weight`` and ``wte.weight``; a tensor and a view of it) share one
    again when loaded, as ``torch.load`` gives them.

    A first walk counts the tensors of each storage. When some storage has several, the save
    walks the tree again (``second``) and each of their tensors is annotated with the storage's
    number in this save and where it lies in it (``"storage":{"id":N,"offset":O,"stride":[…]}``,
    in elements of its dtype). Each tensor still stores its own values, so it loads alone too
    (a ``select`` of one, another library): identical values are stored once, by hash."""

    #: Storages are shared again on load only while their bytes together are at most this many
    #: times the bytes of their tensors (plus ``SLACK``): a load must not allocate much more than the file
    #: holds (a few rows of a huge embedding come back as their own tensors).
    RATIO = 8
    SLACK = 1 << 20

    def __init__(self) -> None:
        self.seen: Dict[Tuple[str, int], List[Any]] = {}  # key -> [tensors, extent, bytes]
        self.shared: Dict[Tuple[str, int], int] = {}
        self.second = False

    def note(self, t: Any) -> Optional[Dict[str, Any]]:
        """Count ``t`` (first walk), or its annotation (second walk; None when unshared)."""
        st = t.untyped_storage()
        if st.nbytes() == 0 or t.numel() == 0 or t.is_conj() or t.is_neg():
            # (A conjugate or negative view is stored resolved: its values are not its storage's.)
            return None
        key = (str(t.device), st.data_ptr())
        if self.second:
            n = self.shared.get(key)
            if n is None:
                return None
            return {"id": n, "offset": int(t.storage_offset()), "stride": [int(s) for s in t.stride()]}
        rec = self.seen.setdefault(key, [0, 0, 0])
        rec[0] += 1
        rec[1] = max(rec[1], _extent(t.storage_offset(), t.shape, t.stride()) * t.element_size())
        rec[2] += t.numel() * t.element_size()
        return None

    def needs_second_walk(self) -> bool:
        """After the first walk: number the storages worth sharing; True if there are any."""
        for key, (count, extent, nbytes) in self.seen.items():
            if count > 1 and extent <= self.RATIO * nbytes + self.SLACK:
                self.shared[key] = len(self.shared)
        self.second = True
        return bool(self.shared)

    def walk_again(self) -> bool:
        return not self.second and self.needs_second_walk()


#: A tensor's place in a storage: (offset, shape, strides, element bytes), in elements.
Footprint = Tuple[int, Tuple[int, ...], Tuple[int, ...], int]


def _span(f: Footprint) -> Tuple[int, int]:
    """The bytes of the storage between a footprint's first and last element, [start, end)."""
    offset, shape, stride, item = f
    return offset * item, _extent(offset, shape, stride) * item


class _Spans:
    """The byte spans the tensors put on one storage reach, merged and sorted: whether a new
    one meets them in log time (a flat buffer of a thousand parameters' views is common)."""

    __slots__ = ("starts", "ends", "footprints")

    def __init__(self) -> None:
        self.starts: List[int] = []
        self.ends: List[int] = []
        self.footprints: List[Footprint] = []

    def meets(self, f: Footprint) -> bool:
        a, b = _span(f)
        i = bisect.bisect_left(self.ends, a + 1)  # the first span ending after a
        return a < b and i < len(self.starts) and self.starts[i] < b

    def add(self, f: Footprint) -> None:
        self.footprints.append(f)
        a, b = _span(f)
        if a >= b:
            return
        i = bisect.bisect_left(self.ends, a)  # spans ending before a stay
        j = bisect.bisect_right(self.starts, b)  # spans starting after b stay
        if i < j:
            a, b = min(a, self.starts[i]), max(b, self.ends[j - 1])
        self.starts[i:j] = [a]
        self.ends[i:j] = [b]


def _self_overlapping(f: Footprint) -> bool:
    """Whether two elements of a footprint may lie at the same bytes (a stride too small for
    the dimensions inside it, as a zero stride is): sorted by stride, each stride must pass
    the extent of the dimensions below it."""
    _, shape, stride, item = f
    reach = 1
    for n, st in sorted(((n, st) for n, st in zip(shape, stride) if n > 1), key=lambda d: d[1]):
        if st < reach:
            return True
        reach = st * (n - 1) + reach
    return False


def _bytes_at(full: Any, f: Footprint) -> Any:
    """The bytes of a footprint in a storage's bytes ``full`` (a 1-d uint8 numpy array or
    tensor over the whole storage): shape (*shape, item)."""
    offset, shape, stride, item = f
    shape2, strides2 = (*shape, item), (*(st * item for st in stride), 1)
    if isinstance(full, np.ndarray):
        return np.lib.stride_tricks.as_strided(full[offset * item:], shape2, strides2, writeable=False)
    return full.as_strided(shape2, strides2, offset * item)


def _agrees(storage: Any, f: Footprint, earlier: List[Footprint], values: Any, sid: Any) -> bool:
    """Whether ``values`` put at footprint ``f`` of ``storage`` leave every byte the
    ``earlier`` footprints put there as it is (True: nothing to copy, ``values`` are there
    already); False when some of ``f``'s bytes were not written yet (copy ``values``); a
    ValueError when some written byte would change. On the CPU through numpy (see ``_fill``:
    torch's own kernels hang in a forked worker)."""
    import ctypes

    import torch

    shape = (*f[1], f[3])
    if storage.device.type == "cpu":
        n = storage.nbytes()
        full = np.ndarray((n,), dtype=np.uint8, buffer=(ctypes.c_char * n).from_address(storage.data_ptr())) if n else \
            np.zeros(0, np.uint8)
        new = np.ascontiguousarray(_numpy_of(torch, values.detach())).reshape(-1).view(np.uint8).reshape(shape)
        zeros = lambda: np.zeros(n, dtype=bool)
    else:
        full = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
        new = values.detach().reshape(-1).contiguous().view(torch.uint8).reshape(shape).to(storage.device)
        zeros = lambda: torch.zeros(storage.nbytes(), dtype=torch.bool, device=storage.device)
    cur = _bytes_at(full, f)
    if f in earlier or any(_covers(g, f) for g in earlier):
        written = None  # (every byte of f was written: the base before its view, tied weights)
    else:
        mask = zeros()
        for g in earlier:
            if isinstance(mask, np.ndarray):
                np.lib.stride_tricks.as_strided(mask[g[0] * g[3]:], (*g[1], g[3]),
                                                (*(st * g[3] for st in g[2]), 1))[...] = True
            else:
                _bytes_at(mask, g).fill_(True)
        written = _bytes_at(mask, f)
    differ = cur != new
    if written is not None:
        differ &= written
    if bool(differ.any()):
        raise ValueError(f"tensors stored at storage {sid} overlap with different values (one would overwrite "
                         "another's): the file is damaged or made to mislead")
    return written is None or bool(written.all())


def _covers(g: Footprint, f: Footprint) -> bool:
    """Whether footprint ``g`` is a C-contiguous run of bytes holding all of ``f``'s span."""
    offset, shape, stride, item = g
    expect = 1
    for n, st in zip(reversed(shape), reversed(stride)):
        if n > 1 and st != expect:
            return False
        expect *= n
    s, e = _span(g)
    a, b = _span(f)
    return s <= a and b <= e


def _extent(offset: int, shape: Any, stride: Any) -> int:
    """Elements of a storage a strided view reaches: one past its last element."""
    if any(n == 0 for n in shape):
        return offset
    return offset + sum((n - 1) * s for n, s in zip(shape, stride)) + 1


def encode(t: Any, where: str, storages: Optional[Storages] = None) -> Tuple[str, str, str, list]:
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
    if storages is not None:
        shared = storages.note(t)
        if shared is not None:
            ann["storage"] = shared
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
        return ("custom", "py.torch_dtype", json.dumps(_dtype_name(obj)), [])
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

    def __init__(self, map_location: MapLocation = None, stager: Optional["Stager"] = None) -> None:
        self.map_location = map_location
        # The load's copies to a device (see `Stager`), or None: each tensor's copy is its own.
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
            via = next((v for v, s in _VIA.values() if s == stored), None)
            if via is None and stored not in _DIRECT:
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
        extent = _extent(offset, values.shape, stride) * item
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
            #  the footprints of the tensors put on it]
            entry = self._storages[st["id"]] = [values.untyped_storage(), held, [], _Spans()]
            entry[3].add(footprint)
            return values, entry[2]
        if entry is None:
            entry = self._storages[st["id"]] = [
                torch.empty(0, dtype=torch.uint8, device=device).untyped_storage(), 0, None, _Spans(),
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
        if not (t.data_ptr() == values.data_ptr() and t.stride() == values.stride() and t.device == values.device):
            # Tensors that share a storage must agree where they overlap: a file could make a
            # later tensor overwrite an earlier one's verified values (or a sparse tensor's
            # indices after torch checked them) with other bytes.
            overlaps, inside = entry[3].meets(footprint), _self_overlapping(footprint)
            if overlaps and self.stager is not None:
                self.stager.settle()  # (the earlier tensors' bytes are all there)
            if not (overlaps and _agrees(storage, footprint, entry[3].footprints, values, st["id"])):
                _copy_into(t, values, self.stager)  # (a view of the very bytes it goes to needs no copy)
                if inside:
                    # Elements at one place (a zero stride) must hold one value: the copy left
                    # the last one there.
                    if self.stager is not None:
                        self.stager.settle()
                    _agrees(storage, footprint, [footprint], values, st["id"])
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


def _to(t: Any, target: Any, stager: Optional["Stager"] = None) -> Any:
    """``t.to(target)``; onto a device with staged copies (CUDA) a contiguous CPU tensor goes
    through the staging buffers (``_stage_into``, by the load's ``stager`` if any), not through a
    pageable copy."""
    import torch

    device = torch.device(target)
    if device.type in STAGED and t.device.type == "cpu" and t.is_contiguous() and t.numel():
        out = torch.empty(t.shape, dtype=t.dtype, device=device)
        _stage_into(out, t, stager)
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


def _copy_into(dst: Any, src: Any, stager: Optional["Stager"] = None) -> None:
    """``dst[...] = src`` (same shape and dtype; ``src`` on the CPU, contiguous); onto a device
    with staged copies by ``_stage_into`` (by the load's ``stager`` if any). On the CPU
    through a numpy array over the storage's memory (see ``_fill``); a dtype numpy lacks
    (bfloat16, float8) as integers of its width."""
    import ctypes

    import torch

    with torch.no_grad():
        if dst.device.type in STAGED and dst.is_contiguous() and src.is_contiguous() and dst.numel():
            _stage_into(dst, src, stager)
            return
        if dst.device.type != "cpu":
            dst.copy_(src)
            return
        values = _numpy_of(torch, src)
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


def from_meta(v: Any, like: Any, map_location: Any = None, stager: Optional["Stager"] = None) -> Any:
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
    name = _dtype_name(t.dtype)
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
    overlapping the read of the next (``_read_staged``); anything else through one CPU buffer of
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
            if plain and dst.device.type in STAGED and dst.numel():
                staged.append((path, dst))
            elif plain and dst.device.type == "cpu":
                direct.append((path, _numpy_of(torch, dst)))
            else:
                # (Those before it first: a view here may share their memory, and comes later.)
                if direct:
                    reader.read_many_into(direct, verify)
                    direct = []
                if staged:
                    _read_staged(reader, staged, verify)
                    staged = []
                buf = torch.empty(dst.shape, dtype=dst.dtype)
                reader.read_into(path, _numpy_of(torch, buf), verify)
                dst.copy_(buf)
        if direct:
            reader.read_many_into(direct, verify)
        if staged:
            _read_staged(reader, staged, verify)


def _numpy_of(torch: Any, t: Any) -> np.ndarray:
    """A numpy view of the CPU tensor ``t``'s memory (bf16 and the like as the integer type of
    their size, which the reader fills byte for byte)."""
    name = _dtype_name(t.dtype)
    return (t.view(getattr(torch, _VIA[name][0])) if name in _VIA else t).numpy()


class CudaCopies:
    """Host-to-device copies for the staging buffers: pinned host buffers; each copy queued on
    the device's current stream (after what is queued there, which may still be using the
    destination tensor; before whatever the caller queues next, which may use it), an event per
    copy."""

    def __init__(self, device: Any) -> None:
        import torch

        self.torch = torch
        self.device = device

    def buffer(self, n: int) -> Any:
        return self.torch.empty(n, dtype=self.torch.uint8, pin_memory=True)

    def copy(self, dst: Any, src: Any) -> Any:
        dst.copy_(src, non_blocking=True)
        event = self.torch.cuda.Event()
        event.record(self.torch.cuda.current_stream(self.device))
        return event

    def wait(self, event: Any) -> None:
        event.synchronize()


#: Device types whose tensors are filled through staged copies, and how.
STAGED: Dict[str, Callable[[Any], Any]] = {"cuda": CudaCopies}
#: Bytes of one staging buffer (small tensors are packed up to this), and how many a load cycles
#: through (kept for later loads: pinned memory is slow to allocate). A row longer than a buffer
#: gets a buffer of its size, which is not kept: what stays pinned is STAGE_COUNT * STAGE_BYTES.
STAGE_BYTES = 64 << 20
STAGE_COUNT = 3
#: Where each piece starts in a buffer.
ALIGN = 256
#: Where a load's ``Stager`` travels to its ``Loader`` (the load's decoder options, private to
#: treepack).
OPTION = "_torch_stager"


class _Pinned:
    """A staging buffer (``_plugin.staging.Ring``'s): a host tensor of uint8 made by the copier."""

    __slots__ = ("tensor", "size")

    def __init__(self, tensor: Any) -> None:
        self.tensor, self.size = tensor, int(tensor.numel())

    def part(self, off: int, n: int) -> Any:
        return self.tensor[off:off + n]

    def release(self) -> None:
        """(Freed once nothing refers to it.)"""


def _ring(device: Any) -> Tuple[Any, Any]:
    """The copier for ``device`` (a type in ``STAGED``) and the buffers a load cycles through for
    it (those kept for its kind, ``_plugin.staging.Ring``)."""
    kind = STAGED[device.type]
    copies = kind(device)
    ring = _plugin.staging.Ring(kind, lambda n: _Pinned(copies.buffer(n)), copies.wait, count=STAGE_COUNT,
                         stage_bytes=STAGE_BYTES, keep_bytes=STAGE_BYTES, align=ALIGN)
    return copies, ring


class Stager:
    """One load's copies onto devices with staged copies (``map_location="cuda"``): each tensor's
    bytes (a view of the mapped file, or memory read for it) are copied into the next free bytes
    of the load's staging buffers for its device, and on to the device from there, that copy
    running while the load goes on with the next tensor; a buffer is written again only once the
    copies out of it have finished. ``finish``, which the load calls when it ends, waits for
    every copy still running: a load returns its tensors filled."""

    __slots__ = ("rings",)

    def __init__(self) -> None:
        self.rings: Dict[Any, Tuple[Any, Any]] = {}

    def put(self, dst: Any, src: Any) -> None:
        """Start ``dst[...] = src``: ``dst`` a contiguous tensor on a device with staged copies,
        ``src`` a contiguous CPU tensor of the same shape and dtype (read only now)."""
        import torch

        entry = self.rings.get(dst.device)
        if entry is None:
            entry = self.rings[dst.device] = _ring(dst.device)
        copies, ring = entry
        raw = src.reshape(-1).view(torch.uint8)
        flat = dst.reshape(-1).view(torch.uint8)
        n = raw.numel()
        for lo in range(0, n, STAGE_BYTES):
            hi = min(n, lo + STAGE_BYTES)
            i, buf = ring.take(hi - lo)
            buf.copy_(raw[lo:hi])
            ring.copying(i, copies.copy(flat[lo:hi], buf))

    def settle(self) -> None:
        """Wait for every copy started so far (before the memory they go to is moved)."""
        for _, ring in self.rings.values():
            ring.settle()

    def finish(self, ok: bool) -> None:
        failed: Optional[BaseException] = None
        for _, ring in self.rings.values():
            try:
                ring.close(ok)
            except BaseException as e:  # noqa: BLE001 (every ring is closed first)
                failed = failed or e
        self.rings = {}
        if failed is not None:
            raise failed


def _read_staged(reader: Any, items: List[Tuple[str, Any]], verify: bool) -> None:
    """Fill device tensors from the file through ``_through_stages``: each piece of rows is read
    from the file straight into a staging buffer (whole chunks along the first axis where they
    fit, so each is read into place)."""
    by_device: Dict[Any, List[Tuple[Any, Any, Any]]] = {}
    for path, dst in items:
        shaped = bool(dst.shape)

        def fill(buf: Any, lo: int, hi: int, path: str = path, shaped: bool = shaped) -> None:
            reader.read_into(path, buf.numpy(), verify, slice=f"{lo}:{hi}" if shaped else "")

        by_device.setdefault(dst.device, []).append((dst, fill, reader.chunk_shape(path) if shaped else None))
    for device, leaves in by_device.items():
        _through_stages(device, leaves)


def _stage_into(dst: Any, src: Any, stager: Optional[Stager] = None) -> None:
    """``dst[...] = src`` for a contiguous tensor ``dst`` on a device with staged copies and a
    contiguous CPU tensor ``src`` (a view of a file's mapping, say), through the staging
    buffers, as ``torch.load(map_location=...)`` cannot from pageable memory: by the load's
    ``stager`` (the copy may still run when this returns), else by one of its own (done when
    this returns)."""
    if stager is not None:
        stager.put(dst, src)
        return
    own = Stager()
    ok = False
    try:
        own.put(dst, src)
        ok = True
    finally:
        own.finish(ok)


def _through_stages(device: Any, leaves: List[Tuple[Any, Callable[[Any, int, int], None], Any]]) -> None:
    """Fill contiguous tensors on ``device`` (a type in ``STAGED``): for each ``(dst, fill,
    chunk)``, ``fill(buf, lo, hi)`` puts the bytes of rows ``lo:hi`` of its values into ``buf``,
    the next free bytes of the load's staging buffers (``_ring``), which are then copied to the
    device asynchronously while the next piece is filled. ``chunk``: the stored chunk shape, whose
    whole rows a piece keeps to. Returns when every copy has."""
    import torch

    copies, ring = _ring(device)
    ok = False
    try:
        for dst, fill, chunk in leaves:
            flat = dst.reshape(-1).view(torch.uint8)
            shape = tuple(dst.shape)
            rows = shape[0] if shape else 1
            row_bytes = flat.numel() // rows
            per = max(1, STAGE_BYTES // row_bytes)
            if chunk and per < rows and chunk[0] <= per:
                per -= per % chunk[0]  # whole chunks: each read straight into place
            for lo in range(0, rows, per):
                hi = min(rows, lo + per)
                i, buf = ring.take((hi - lo) * row_bytes)
                fill(buf, lo, hi)
                ring.copying(i, copies.copy(flat[lo * row_bytes:hi * row_bytes], buf))
        ok = True
    finally:
        ring.close(ok)


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

    return Loader(options.get("map_location"), options.get(OPTION)).tensor


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
    tensors go to it through one ``Stager`` (its ``finish`` called when the load ends), each
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
    if not any(kind(t) in STAGED for t in targets):
        return _plugin.DECLINE
    stager = Stager()
    request.decoder.options[OPTION] = stager
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
        return from_meta(out, like, options.get("map_location"), options.get(OPTION))
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
