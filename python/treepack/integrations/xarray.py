"""xarray Datasets and DataArrays as built-in ``py.xr.dataset`` / ``py.xr.dataarray`` nodes.

Each variable (data variables and coordinates) is a subtree ``{"dims": [...], "data": array,
"attrs": {...}}``: its data an ordinary array (a Dask-backed variable is a Dask array, written
block by block by the tasks that compute it), so key paths read ``ds/data_vars/temp/data``,
partial reads and ``open()`` slices reach every variable, and ``load(dask=True)`` gives the
variables back as lazy Dask arrays. Dataset attributes are a child dict (numpy values allowed).
Nothing a file names is imported or evaluated; xarray is imported only to rebuild these nodes.
"""

from __future__ import annotations

import sys
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .. import _plugin

DATASET = "py.xr.dataset"
DATAARRAY = "py.xr.dataarray"
NAMES = frozenset({DATASET, DATAARRAY})

Description = Tuple[str, str, Optional[str], List[Tuple[str, Any]]]


def is_xarray(obj: Any) -> bool:
    xr = sys.modules.get("xarray")
    return xr is not None and type(obj) in (xr.Dataset, xr.DataArray)


def _name(n: Any, what: str) -> str:
    if not isinstance(n, str):
        raise TypeError(f"the {what} name {n!r} is a {type(n).__name__}; only string names can be stored")
    return n


def _variable(v: Any) -> Dict[str, Any]:
    data = v.data
    if isinstance(data, np.ndarray) and data.dtype == object:
        # pandas-backed string coordinates come out as object arrays of str.
        if all(isinstance(x, str) for x in data.reshape(-1)):
            data = data.astype(str)
    elif not isinstance(data, np.ndarray) and type(data).__module__.split(".")[0] != "dask":
        data = np.asarray(v.values)
    return {"dims": [_name(d, "dimension") for d in v.dims], "data": data, "attrs": dict(v.attrs)}


def encode(obj: Any) -> Description:
    xr = sys.modules["xarray"]
    coords = {_name(n, "coordinate"): _variable(c.variable) for n, c in obj.coords.items()}
    if type(obj) is xr.DataArray:
        name = obj.name
        if name is not None and not isinstance(name, str):
            raise TypeError(f"the DataArray name {name!r} is a {type(name).__name__}; only string names can be stored")
        return ("custom", DATAARRAY, None, [("name", name), ("variable", _variable(obj.variable)), ("coords", coords)])
    data_vars = {_name(n, "data variable"): _variable(v.variable) for n, v in obj.data_vars.items()}
    return ("custom", DATASET, None, [("data_vars", data_vars), ("coords", coords), ("attrs", dict(obj.attrs))])


def _build(xr: Any, v: Dict[str, Any]) -> Any:
    return xr.Variable(tuple(v["dims"]), v["data"], v.get("attrs") or None)


def decode(t: str, kids: Dict[str, Any]) -> Any:
    try:
        import xarray as xr
    except ImportError:
        raise LookupError(f"{t}: loading xarray objects needs xarray (pip install xarray)") from None
    coords = {n: _build(xr, v) for n, v in (kids.get("coords") or {}).items()}
    if t == DATAARRAY:
        var = _build(xr, kids["variable"])
        return xr.DataArray(var, coords=coords, name=kids.get("name"), fastpath=False)
    data_vars = {n: _build(xr, v) for n, v in (kids.get("data_vars") or {}).items()}
    return xr.Dataset(data_vars=data_vars, coords=coords, attrs=kids.get("attrs") or None)


# ---------------------------------------------------------------- the plug-in


_plugin.integrate_nodes(__name__, is_xarray, encode, decode, NAMES)
