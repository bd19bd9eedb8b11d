"""numpy dtypes: the treepack dtype JSON for an array (and its canonical little-endian, packed
copy), and the numpy dtype for a stored one (ml_dtypes for bfloat16, float8, float6, float4 and
int4/int2/int1 and their unsigned kin). The dtype names and their JSON are the Rust core's
(``DType``), asked through ``_core.numpy_dtype_desc`` and ``_core.numpy_dtype``; this module
only keeps a cache of the numpy dtypes met."""

from __future__ import annotations

import json
from typing import Any, Dict, Tuple

import numpy as np

from .. import _core

def _dtype_desc(dt: np.dtype) -> Tuple[Any, np.dtype]:
    """(treepack dtype JSON value, canonical numpy dtype: little-endian and packed)."""
    _nothing_dropped(dt)
    text, canon = _core.numpy_dtype_desc(dt)
    return json.loads(text), canon


#: h5py's tags on the dtypes of the arrays it reads (how HDF5 stored a string): not kept, as
#: docs/python.md says; the bytes are.
_H5PY_TAGS = frozenset({"h5py_encoding"})


def _nothing_dropped(dt: np.dtype) -> None:
    """Refuse a dtype with parts the format's dtypes do not hold, which a save would drop
    silently: ``metadata`` (``np.dtype("i4", metadata={...})``) and structured fields' titles
    (``[(("Title", "a"), "<i4")]``). (Byte order and padding are not parts: values are stored
    little-endian and packed, as docs/python.md says.)"""
    if dt.metadata and set(dt.metadata) - _H5PY_TAGS:
        raise TypeError(f"numpy dtype {dt} carries metadata {dict(dt.metadata)!r:.80}, which treepack does not keep; "
                        "save the array with the metadata dropped (a.astype(np.dtype(a.dtype.str))) and keep it beside")
    if dt.names is not None:
        for name in dt.names:
            field = dt.fields[name]
            if len(field) > 2:
                raise TypeError(f"numpy dtype {dt}: field {name!r} has a title ({field[2]!r:.40}), which treepack does "
                                "not keep; save the array with a dtype without titles and keep the titles beside")
            _nothing_dropped(field[0])
    elif dt.subdtype is not None:
        _nothing_dropped(dt.subdtype[0])


def encode_array(a: np.ndarray) -> Tuple[np.ndarray, str]:
    """A canonical (C-contiguous, little-endian, packed) copy of ``a`` and its dtype JSON."""
    _nothing_dropped(a.dtype)
    text, canon = _core.numpy_dtype_desc(a.dtype)
    if a.dtype.kind == "S" and a.size and a.dtype.itemsize == 0:
        raise TypeError("zero-width byte strings are not supported")
    # (np.ascontiguousarray would turn a 0-d array into a 1-d one)
    out = a.astype(canon, copy=False)
    if not out.flags.c_contiguous:
        out = out.copy(order="C")
    return out, text


_dtype_cache: Dict[str, np.dtype] = {}


def np_dtype(desc_json: str) -> np.dtype:
    """The numpy dtype for a treepack dtype JSON value (ml_dtypes for bfloat16, float8, int4, ...)."""
    dt = _dtype_cache.get(desc_json)
    if dt is None:
        dt = _core.numpy_dtype(desc_json)
        _dtype_cache[desc_json] = dt
    return dt


def _np_dtype(d: Any) -> np.dtype:
    return _core.numpy_dtype(json.dumps(d))
