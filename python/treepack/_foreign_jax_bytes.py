"""The binary encodings inside Orbax and JAX checkpoints, read with every offset, size and depth
checked and nothing of what they name imported (``_foreign_jax`` reads the checkpoints): the
FlatBuffers table JAX's ``pytreedef.json`` describes a tree with, and flax's msgpack encoding of
an older Orbax checkpoint's aggregated ``checkpoint`` file."""

from __future__ import annotations

import re
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from ._errors import ForeignFileError as RefusedError

Refuse = Callable[[str], Exception]  # the refusal of the checkpoint (naming it), for a reason
MAX_DEPTH = 400  # nesting, as the Zarr/HDF5 reader bounds it
#: Tuples (msgpack extension 4) nested in tuples: each level is another msgpack decode on the C
#: stack, a large frame (200 levels overflowed 8 MiB); flax's own are a few levels deep.
MAX_TUPLE_DEPTH = 32
#: Maps and arrays a msgpack file may hold: a byte can begin an empty one, and each costs a
#: Python object of ~60-200 bytes, so without a bound a file of S bytes could take ~200·S.
#: Real checkpoints hold far fewer (their bytes are arrays).
MAX_CONTAINERS_BASE = 1_000_000


class Flat:
    """A FlatBuffers buffer read with every offset checked (JAX's ``PyTreeDef`` tables: kind,
    children, children_names, custom_name, custom_auxdata)."""

    def __init__(self, b: bytes, refuse: Refuse) -> None:
        self.b, self.refuse = b, refuse

    def _bad(self, what: str) -> Exception:
        return self.refuse(f"`pytreedef.json`: its tree description is damaged ({what})")

    def _u(self, at: int, n: int, signed: bool = False) -> int:
        if at < 0 or at + n > len(self.b):
            raise self._bad(f"an offset {at} past its {len(self.b)} bytes")
        return int.from_bytes(self.b[at:at + n], "little", signed=signed)

    def root(self) -> Tuple[int, int, int]:
        return self.table(self._u(0, 4))

    def table(self, pos: int) -> Tuple[int, int, int]:
        vt = pos - self._u(pos, 4, signed=True)
        size = self._u(vt, 2)
        if size < 4 or size % 2 or vt + size > len(self.b):
            raise self._bad(f"a vtable of {size} bytes at {vt}")
        return pos, vt, size

    def _field(self, t: Tuple[int, int, int], slot: int) -> Optional[int]:
        pos, vt, size = t
        o = 4 + 2 * slot
        off = self._u(vt + o, 2) if o + 2 <= size else 0
        return pos + off if off else None

    def int8(self, t: Tuple[int, int, int], slot: int) -> int:
        at = self._field(t, slot)
        return 0 if at is None else self._u(at, 1, signed=True)

    def _vector(self, t: Tuple[int, int, int], slot: int, width: int) -> Tuple[int, int]:
        at = self._field(t, slot)
        if at is None:
            return 0, 0
        v = at + self._u(at, 4)
        n = self._u(v, 4)
        if v + 4 + n * width > len(self.b):
            raise self._bad(f"a vector of {n} elements past the end")
        return v + 4, n

    def tables(self, t: Tuple[int, int, int], slot: int) -> List[Tuple[int, int, int]]:
        start, n = self._vector(t, slot, 4)
        return [self.table(start + 4 * i + self._u(start + 4 * i, 4)) for i in range(n)]

    def bytes(self, t: Tuple[int, int, int], slot: int) -> bytes:
        start, n = self._vector(t, slot, 1)
        return self.b[start:start + n]

    def string(self, t: Tuple[int, int, int], slot: int) -> bytes:
        return self.bytes(t, slot)

    def strings(self, t: Tuple[int, int, int], slot: int) -> List[bytes]:
        start, n = self._vector(t, slot, 4)
        out = []
        for i in range(n):
            s = start + 4 * i + self._u(start + 4 * i, 4)
            m = self._u(s, 4)
            if s + 4 + m > len(self.b):
                raise self._bad("a string past the end")
            out.append(self.b[s + 4:s + 4 + m])
        return out


# ---------------------------------------------------------------- an older Orbax's msgpack file

def unpack(data: bytes, refuse: Refuse, rel: str) -> Any:
    """The aggregated ``checkpoint`` file (flax's msgpack encoding): containers and values, numpy
    arrays from its extension types (ndarray, numpy scalar, complex, tuple); nothing else."""
    try:
        import msgpack
    except ImportError:
        raise ImportError("reading an older Orbax checkpoint (its aggregated `checkpoint` file) needs msgpack: "
                          "pip install msgpack") from None
    depth = [0]
    containers = [MAX_CONTAINERS_BASE + len(data) // 16]

    def count(x: Any) -> Any:
        if isinstance(x, dict) and not all(type(k) is str for k in x):
            # (flax writes str keys; msgpack would give bytes keys as bytes, which no key path names)
            raise refuse(f"`{rel}`: a map with a key that is not a string ({next(k for k in x if type(k) is not str)!r:.40})")
        containers[0] -= 1
        if containers[0] < 0:
            raise refuse(f"`{rel}`: more maps and arrays than a checkpoint of {len(data)} bytes holds "
                         f"({MAX_CONTAINERS_BASE + len(data) // 16}): refused, as it would take memory out of "
                         "proportion to its size")
        return x

    def ext(code: int, payload: bytes) -> Any:
        if code in (1, 3):
            a = _ext_array(msgpack, payload, refuse, rel)
            return a if code == 1 else a[()]
        if code == 2:
            c = msgpack.unpackb(payload)
            if not (isinstance(c, list) and len(c) == 2 and all(isinstance(v, (int, float)) for v in c)):
                raise refuse(f"`{rel}`: a complex number that is not two numbers")
            return complex(c[0], c[1])
        if code == 4:
            depth[0] += 1
            if depth[0] > MAX_TUPLE_DEPTH:
                raise refuse(f"`{rel}`: tuples nested more than {MAX_TUPLE_DEPTH} deep")
            try:
                return tuple(msgpack.unpackb(payload, raw=False, ext_hook=ext, object_hook=count, list_hook=count,
                                             timestamp=3))
            finally:
                depth[0] -= 1
        raise refuse(f"`{rel}`: a msgpack extension of type {code}, which flax and Orbax do not write")

    try:
        # (msgpack's own timestamps, which flax does not write, as UTC datetimes)
        return msgpack.unpackb(data, raw=False, ext_hook=ext, object_hook=count, list_hook=count, timestamp=3)
    except RefusedError:
        raise
    except Exception as e:  # msgpack's errors for damaged data are of many kinds (StackError, ValueError…)
        raise refuse(f"`{rel}` is not a readable msgpack file: {type(e).__name__}: {e}") from None


def _dtype_named(name: str) -> Optional[np.dtype]:
    """A numeric dtype by its numpy or ml_dtypes name (``float32``, ``bfloat16``), else None."""
    if not re.fullmatch(r"[a-z][a-z0-9_]{0,30}", name):
        return None
    try:
        dt = np.dtype(name)
    except TypeError:
        try:
            import ml_dtypes

            dt = np.dtype(getattr(ml_dtypes, name))
        except (ImportError, AttributeError, TypeError):
            return None
    # (not long double: no file format treepack writes holds it)
    long = (dt.kind == "f" and dt.itemsize > 8) or (dt.kind == "c" and dt.itemsize > 16)
    # (ml_dtypes' types are of kind "V" too: only numpy's raw void is refused)
    return None if dt.hasobject or dt.kind in "OUSMm" or dt.type is np.void or dt.names or long else dt


def _ext_array(msgpack: Any, payload: bytes, refuse: Refuse, rel: str) -> np.ndarray:
    try:
        t = msgpack.unpackb(payload, raw=True)
    except Exception as e:
        raise refuse(f"`{rel}`: an array that is not readable msgpack: {e}") from None
    ok = isinstance(t, list) and len(t) == 3 and isinstance(t[0], list) and isinstance(t[1], bytes) and isinstance(t[2], bytes)
    if not ok or len(t[0]) > 64 or not all(type(n) is int and n >= 0 for n in t[0]):
        raise refuse(f"`{rel}`: an array that is not (shape, dtype, bytes)")
    dt = _dtype_named(t[1].decode("ascii", "replace"))
    if dt is None:
        raise refuse(f"`{rel}`: an array of dtype {t[1][:40]!r}, which treepack does not read from msgpack")
    count = 1
    for n in t[0]:
        count *= n
    if count * dt.itemsize != len(t[2]):
        raise refuse(f"`{rel}`: an array of shape {t[0]} and {dt} with {len(t[2])} bytes")
    return np.frombuffer(t[2], dtype=dt).reshape(t[0])


def unchunk(x: Dict[str, Any], refuse: Refuse, where: str) -> np.ndarray:
    """flax's array split for msgpack (``__msgpack_chunked_array__``), joined and checked."""
    shape, chunks = x.get("shape"), x.get("chunks")
    if not (isinstance(shape, dict) and isinstance(chunks, dict)):
        raise refuse(f"{where}: a chunked array without shape and chunks")
    if len(shape) > 64:  # (numpy's limit; checked before any product of them)
        raise refuse(f"{where}: a chunked array of {len(shape)} dimensions (numpy holds at most 64)")
    dims = [shape.get(str(i)) for i in range(len(shape))]
    parts = [chunks.get(str(i)) for i in range(len(chunks))]
    if not all(type(n) is int and 0 <= n < 1 << 63 for n in dims) \
            or not all(isinstance(p, np.ndarray) and p.ndim == 1 for p in parts):
        raise refuse(f"{where}: a chunked array whose shape or chunks are not what flax writes")
    count = 1
    for n in dims:
        count *= n
    if not parts or sum(p.size for p in parts) != count or len({p.dtype for p in parts}) != 1:
        raise refuse(f"{where}: a chunked array whose chunks do not make its shape {dims}")
    try:
        return np.concatenate(parts).reshape(dims)
    except ValueError as e:  # (a shape numpy cannot make, of no elements: [0, 2**62, 2**62])
        raise refuse(f"{where}: a chunked array of shape {dims}, which numpy cannot make: {e}") from None
