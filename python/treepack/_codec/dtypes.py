"""numpy dtypes: the treepack dtype JSON for an array (and its canonical little-endian, packed
copy), and the numpy dtype for a stored one (ml_dtypes for bfloat16, float8, float6, float4 and
int4/int2/int1 and their unsigned kin, whose names are treepack's; which ones is the Rust core's
table, ``DType::is_ml_dtypes``)."""

from __future__ import annotations

import json
from typing import Any, Dict, Tuple

import numpy as np

from .. import _core

def _dtype_desc(dt: np.dtype) -> Tuple[Any, np.dtype]:
    """(treepack dtype JSON value, canonical numpy dtype: little-endian and packed)."""
    if dt.names is not None:
        fields = []
        formats = []
        for name in dt.names:
            sub = dt.fields[name][0]
            shape: Tuple[int, ...] = ()
            if sub.subdtype is not None:
                sub, shape = sub.subdtype
            desc, canon = _dtype_desc(sub)
            f: Dict[str, Any] = {"name": name, "dtype": desc}
            if shape:
                f["shape"] = list(shape)
            fields.append(f)
            formats.append((name, canon, shape) if shape else (name, canon))
        return {"struct": fields}, np.dtype(formats)
    if dt.subdtype is not None:
        raise TypeError(f"sub-array dtype {dt} is only supported inside a structured dtype")
    if dt.kind == "S":
        return f"bytes:{dt.itemsize}", dt
    if dt.kind == "U":
        return f"unicode:{dt.itemsize // 4}", dt.newbyteorder("<")
    # Numbers and ml_dtypes types: the name table is the Rust core's.
    known = _core.numpy_dtype_name(dt.kind, dt.itemsize, dt.name)
    if known is not None:
        name, ml = known
        return name, dt if ml or dt.itemsize == 1 else dt.newbyteorder("<")
    raise TypeError(f"numpy dtype {dt} (kind {dt.kind!r}) is not supported inside arrays; use a numeric, bool, bytes or str dtype")


def encode_array(a: np.ndarray) -> Tuple[np.ndarray, str]:
    """A canonical (C-contiguous, little-endian, packed) copy of ``a`` and its dtype JSON."""
    desc, canon = _dtype_desc(a.dtype)
    if a.dtype.kind == "S" and a.size and a.dtype.itemsize == 0:
        raise TypeError("zero-width byte strings are not supported")
    # (np.ascontiguousarray would turn a 0-d array into a 1-d one)
    out = a.astype(canon, copy=False)
    if not out.flags.c_contiguous:
        out = out.copy(order="C")
    return out, json.dumps(desc, separators=(",", ":"))


_dtype_cache: Dict[str, np.dtype] = {}


def np_dtype(desc_json: str) -> np.dtype:
    """The numpy dtype for a treepack dtype JSON value (ml_dtypes for bfloat16, float8, int4, ...)."""
    dt = _dtype_cache.get(desc_json)
    if dt is None:
        dt = _np_dtype(json.loads(desc_json))
        _dtype_cache[desc_json] = dt
    return dt


def _np_dtype(d: Any) -> np.dtype:
    if isinstance(d, dict):
        fields = []
        for f in d["struct"]:
            sub = _np_dtype(f["dtype"])
            shape = tuple(f.get("shape", ()))
            fields.append((f["name"], sub, shape) if shape else (f["name"], sub))
        return np.dtype(fields)
    if _core.dtype_needs_ml_dtypes(d):
        try:
            import ml_dtypes
        except ImportError:
            raise ImportError(f"loading {d} arrays needs the ml_dtypes package (pip install ml_dtypes)") from None
        return np.dtype(getattr(ml_dtypes, d))
    if d.startswith("bytes:"):
        return np.dtype(f"S{int(d[6:])}")
    if d.startswith("unicode:"):
        return np.dtype(f"<U{int(d[8:])}")
    return np.dtype(d).newbyteorder("<") if np.dtype(d).itemsize > 1 else np.dtype(d)
