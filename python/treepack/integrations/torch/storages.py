"""Tensors that share one storage (tied weights, views): found when saved (``Storages``), and
checked when loaded, where a file could make tensors overlap (``Written``; design decision
108)."""

from __future__ import annotations

import bisect
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ... import _plugin
from .dtypes import numpy_of

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
        rec[1] = max(rec[1], extent_of(t.storage_offset(), t.shape, t.stride()) * t.element_size())
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


def span(f: Footprint) -> Tuple[int, int]:
    """The bytes of the storage between a footprint's first and last element, [start, end)."""
    offset, shape, stride, item = f
    return offset * item, extent_of(offset, shape, stride) * item


class Spans:
    """Byte spans, merged (touching ones too) and sorted: whether a new span meets them, or lies
    within one of them, in log time (a flat buffer of a thousand parameters' views is common)."""

    __slots__ = ("starts", "ends")

    def __init__(self) -> None:
        self.starts: List[int] = []
        self.ends: List[int] = []

    def meets(self, f: Footprint) -> bool:
        a, b = span(f)
        i = bisect.bisect_left(self.ends, a + 1)  # the first span ending after a
        return a < b and i < len(self.starts) and self.starts[i] < b

    def holds(self, f: Footprint) -> bool:
        """Whether ``f``'s whole span lies within one merged span."""
        a, b = span(f)
        i = bisect.bisect_right(self.starts, a) - 1
        return i >= 0 and self.ends[i] >= b

    def add(self, f: Footprint) -> None:
        a, b = span(f)
        if a >= b:
            return
        i = bisect.bisect_left(self.ends, a)  # spans ending before a stay
        j = bisect.bisect_right(self.starts, b)  # spans starting after b stay
        if i < j:
            a, b = min(a, self.starts[i]), max(b, self.ends[j - 1])
        self.starts[i:j] = [a]
        self.ends[i:j] = [b]


def contiguous(f: Footprint) -> bool:
    """Whether a footprint is a C-contiguous run of bytes (every byte of its span its own)."""
    _, shape, stride, _ = f
    expect = 1
    for n, st in zip(reversed(shape), reversed(stride)):
        if n > 1 and st != expect:
            return False
        expect *= n
    return True


class Written:
    """What the tensors put on one storage so far have written there: the spans they reach
    (whether a new tensor meets them), the spans of the C-contiguous ones (every byte of those
    written: tied weights, a base before its views), and, made the first time a tensor meets
    them otherwise and kept up to date after, a mask of the bytes written. Checking T tensors
    takes O(T log T) and the bytes of those that meet others: never T², whatever the file."""

    __slots__ = ("spans", "dense", "pending", "mask")

    def __init__(self) -> None:
        self.spans = Spans()
        self.dense = Spans()
        self.pending: List[Footprint] = []  # (footprints not yet in the mask, until it is made)
        self.mask: Any = None

    def meets(self, f: Footprint) -> bool:
        return self.spans.meets(f)

    def add(self, f: Footprint) -> None:
        self.spans.add(f)
        if contiguous(f):
            self.dense.add(f)
        if self.mask is None:
            self.pending.append(f)
        else:
            self.mask = _marked(self.mask, f)

    def agrees(self, storage: Any, f: Footprint, values: Any, sid: Any) -> bool:
        """Whether ``values`` put at footprint ``f`` of ``storage`` leave every byte the tensors
        before put there as it is (True: nothing to copy, ``values`` are there already); False
        when some of ``f``'s bytes were not written yet (copy ``values``); a ValueError when
        some written byte would change."""
        full, new = _bytes_and_values(storage, f, values)
        if self.dense.holds(f):
            written = None  # (every byte of f was written)
        else:
            if self.mask is None:
                self.mask = _zeros_like(full)
                for g in self.pending:
                    self.mask = _marked(self.mask, g)
                self.pending = []
            self.mask = _grown(self.mask, len(full))
            written = bytes_at(self.mask, f)
        return _compare(bytes_at(full, f), new, written, sid)


def agrees_within(storage: Any, f: Footprint, values: Any, sid: Any) -> None:
    """``values``, just copied to footprint ``f`` whose elements share bytes (a zero stride),
    must all have landed as they are: elements at one place must hold one value."""
    full, new = _bytes_and_values(storage, f, values)
    _compare(bytes_at(full, f), new, None, sid)


def _bytes_and_values(storage: Any, f: Footprint, values: Any) -> Tuple[Any, Any]:
    """The storage's bytes (1-d uint8), and ``values`` as bytes of footprint ``f``'s shape. On
    the CPU through numpy (see ``_fill``: torch's own kernels hang in a forked worker)."""
    import ctypes

    import torch

    shape = (*f[1], f[3])
    if storage.device.type == "cpu":
        n = storage.nbytes()
        full = np.ndarray((n,), dtype=np.uint8, buffer=(ctypes.c_char * n).from_address(storage.data_ptr())) if n else \
            np.zeros(0, np.uint8)
        new = np.ascontiguousarray(numpy_of(torch, values.detach())).reshape(-1).view(np.uint8).reshape(shape)
    else:
        full = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
        new = values.detach().reshape(-1).contiguous().view(torch.uint8).reshape(shape).to(storage.device)
    return full, new


def _compare(cur: Any, new: Any, written: Any, sid: Any) -> bool:
    differ = cur != new
    if written is not None:
        differ &= written
    if bool(differ.any()):
        raise ValueError(f"tensors stored at storage {sid} overlap with different values (one would overwrite "
                         "another's): the file is damaged or made to mislead")
    return written is None or bool(written.all())


def _zeros_like(full: Any) -> Any:
    if isinstance(full, np.ndarray):
        return np.zeros(len(full), dtype=bool)
    import torch

    return torch.zeros(len(full), dtype=torch.bool, device=full.device)


def _grown(mask: Any, n: int) -> Any:
    """``mask`` over a storage grown to ``n`` bytes (the new bytes not written)."""
    if len(mask) >= n:
        return mask
    if isinstance(mask, np.ndarray):
        return np.concatenate([mask, np.zeros(n - len(mask), dtype=bool)])
    import torch

    return torch.cat([mask, torch.zeros(n - len(mask), dtype=torch.bool, device=mask.device)])


def _marked(mask: Any, f: Footprint) -> Any:
    """``mask`` with footprint ``f``'s bytes marked written (grown to reach them)."""
    mask = _grown(mask, span(f)[1])
    if span(f)[0] >= span(f)[1]:
        return mask
    if isinstance(mask, np.ndarray):
        offset, shape, stride, item = f
        np.lib.stride_tricks.as_strided(mask[offset * item:], (*shape, item), (*(st * item for st in stride), 1))[...] = True
    else:
        bytes_at(mask, f).fill_(True)
    return mask


def self_overlapping(f: Footprint) -> bool:
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


def bytes_at(full: Any, f: Footprint) -> Any:
    """The bytes of a footprint in a storage's bytes ``full`` (a 1-d uint8 numpy array or
    tensor over the whole storage): shape (*shape, item)."""
    offset, shape, stride, item = f
    shape2, strides2 = (*shape, item), (*(st * item for st in stride), 1)
    if isinstance(full, np.ndarray):
        return np.lib.stride_tricks.as_strided(full[offset * item:], shape2, strides2, writeable=False)
    return full.as_strided(shape2, strides2, offset * item)


def extent_of(offset: int, shape: Any, stride: Any) -> int:
    """Elements of a storage a strided view reaches: one past its last element."""
    if any(n == 0 for n in shape):
        return offset
    return offset + sum((n - 1) * s for n, s in zip(shape, stride)) + 1
