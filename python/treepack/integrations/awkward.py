"""Awkward Arrays as built-in ``py.awkward`` nodes (docs/python.md, "Awkward Arrays"): the
array's *form* (Awkward's own JSON description of its layout: ragged lists, records, options,
unions, strings) and length as the node's data, and the flat buffers of ``ak.to_buffers`` as
numpy arrays under ``buffers`` — so the data lies in packs like any array, deduplicated and
compressible, and a lazy view reads only the buffers of the fields it touches.

Strict: a form is data (``ak.forms.from_dict``); rebuilding runs ``ak.from_buffers``, which
imports nothing and calls nothing the file names (behaviors are looked up by name among those
this process registered). Used only when awkward is already imported (saving) or installed
(loading): ``import treepack`` never imports it."""

from __future__ import annotations

import json
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from .. import _plugin

NAME = "py.awkward"

Description = Tuple[str, str, Optional[str], List[Tuple[str, Any]]]


def _ak() -> Any:
    return sys.modules.get("awkward")


def is_array(obj: Any) -> bool:
    ak = _ak()
    return ak is not None and type(obj) is ak.Array


def encode(obj: Any) -> Description:
    ak = _ak()
    form, length, container = ak.to_buffers(obj)
    data = {"form": form.to_dict(), "length": int(length)}
    buffers = {key: np.asarray(buf) for key, buf in container.items()}
    return ("custom", NAME, json.dumps(data), [("buffers", buffers)])


def _awkward() -> Any:
    try:
        import awkward
    except ImportError:
        raise LookupError("awkward is not installed (pip install awkward)") from None
    return awkward


def _rebuild(data: Any, container: Dict[str, Any]) -> Any:
    ak = _awkward()
    if not isinstance(data, dict) or not isinstance(data.get("form"), dict) or not isinstance(data.get("length"), int) \
            or data["length"] < 0:
        raise ValueError(f"{NAME}: the node's data is not {{'form': {{...}}, 'length': n}}")
    try:
        form = ak.forms.from_dict(data["form"])
        out = ak.from_buffers(form, data["length"], container)
    except Exception as e:  # awkward raises many types for a form or buffers that do not fit
        raise ValueError(f"{NAME}: the stored form and buffers do not make an array: {e}") from None
    return out


def _valid(ak: Any, form: Any, length: int, container: Dict[str, Any]) -> None:
    """Refuse buffers that index outside what they index into (offsets below 0 or past the
    content, an index out of range...): awkward's kernels trust them, and read memory they do
    not own (a crash, or other memory's bytes as values). Checked by awkward's own
    ``validity_error`` over ``container`` (what each buffer holds, or for a data buffer only
    its length: its values index nothing)."""
    try:
        err = ak.validity_error(ak.from_buffers(form, length, container))
    except Exception as e:  # noqa: BLE001 (awkward raises many types for buffers that do not fit)
        err = str(e)
    if err:
        raise ValueError(f"{NAME}: the stored buffers do not make a valid array (they would make awkward read outside "
                         f"them): {err:.300}")


def _zero_strided(a: Any) -> np.ndarray:
    """A data buffer's stand-in for ``_valid`` (``a`` has ``shape`` and ``dtype``): its length and
    dtype, no memory."""
    return np.lib.stride_tricks.as_strided(np.zeros(1, a.dtype), shape=tuple(a.shape), strides=(0,) * len(a.shape))


def decode(data: Any, kids: Dict[str, Any]) -> Any:
    buffers = kids.get("buffers")
    if not isinstance(buffers, dict) or not all(isinstance(v, np.ndarray) for v in buffers.values()):
        raise ValueError(f"{NAME}: the node's buffers are not a dict of arrays")
    out = _rebuild(data, buffers)
    ak = _awkward()
    _valid(ak, ak.forms.from_dict(data["form"]), data["length"], buffers)
    return out


def lazy(data: Any, read: Callable[[str], np.ndarray], keys: List[str]) -> Any:
    """An array whose buffers are read (by ``read(key)``) only when an operation needs them:
    ``arr["x"]`` then computing with it reads the buffers of field ``x`` alone (Awkward's
    virtual arrays)."""
    container = {k: (lambda k=k: read(k)) for k in keys}
    out = _rebuild(data, container)
    return out


# ---------------------------------------------------------------- the plug-in


def _encode(obj: Any, where: str, memo: Any, omit_static: bool) -> Optional[Description]:
    return encode(obj) if is_array(obj) else None


def _decode(dec: Any, t: str, data: Any, kids: Dict[str, Any]) -> Any:
    try:
        return decode(data, kids)
    except LookupError as e:
        return dec.missing(t, data, str(e))


def _view(reader: Any, path: str, data: Any, where: Any) -> Any:
    """``open(path)[...]`` at an Awkward Array: a lazy array reading only the buffers its
    operations need; None (a View) when awkward is not installed."""
    try:
        import awkward  # noqa: F401
    except ImportError:
        return None
    base = f"{path}/buffers"
    keys = [k for _, k in reader.children(base)]
    segs = {k: seg for seg, k in reader.children(base)}
    buffer = lambda k: _plugin.LazyArray(reader, f"{base}/{segs[k]}", where)
    out = lazy(data, lambda k: buffer(k).read(), keys)
    # Checked now, from the buffers that index (read) and the lengths of those that hold data
    # (not read): a lazy array is as safe to compute with as a loaded one.
    ak = _awkward()
    _valid(ak, ak.forms.from_dict(data["form"]), data["length"],
           {k: _zero_strided(buffer(k)) if k.endswith("-data") else buffer(k).read() for k in keys})
    return out


_plugin.integrate(__name__, encode=_encode, nodes={NAME: _decode}, views={NAME: _view})
