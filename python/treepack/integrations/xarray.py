"""xarray Datasets and DataArrays as built-in ``py.xr.dataset`` / ``py.xr.dataarray`` nodes.

Each variable (data variables and coordinates) is a subtree ``{"dims": [...], "data": array,
"attrs": {...}}``: its data an ordinary array (a Dask-backed variable is a Dask array, written
block by block by the tasks that compute it), so key paths read ``ds/data_vars/temp/data``,
partial reads and ``open()`` slices reach every variable, and ``load(dask=True)`` gives the
variables back as lazy Dask arrays. Dataset attributes are a child dict (numpy values allowed);
the plain entries of each variable's ``encoding`` and the Dataset's are kept (not codec objects
of the file the data was read from), and so are its indexes (``indexes``: a
multi-index, an index on a coordinate that is no dimension, a dimension coordinate left without
one).
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


def _variable(v: Any, index: bool = False) -> Dict[str, Any]:
    """A variable's subtree. An index coordinate's strings (pandas keeps them as an object
    array) are stored as a str array, which xarray indexes the same; any other object array is
    kept as it is. ``encoding`` (how the variable was or is to be written to disk) is kept when
    there is one."""
    data = v.data
    if isinstance(data, np.ndarray) and data.dtype == object:
        if index and all(isinstance(x, str) for x in data.reshape(-1)):
            data = data.astype(str)
    elif not isinstance(data, np.ndarray) and type(data).__module__.split(".")[0] != "dask":
        data = np.asarray(v.values)
    out = {"dims": [_name(d, "dimension") for d in v.dims], "data": data, "attrs": dict(v.attrs)}
    encoding = _plain(v.encoding)
    if encoding:
        out["encoding"] = encoding
    return out


def _plain(encoding: Dict[Any, Any]) -> Dict[str, Any]:
    """The entries of an ``encoding`` that are plain values (names, numbers, dtypes, tuples and
    sets of them: ``dtype``, ``scale_factor``, ``chunksizes``, ``unlimited_dims``). The others,
    codec objects of the file the data was read from (zarr's ``compressors``), are how that file
    stored it, not the data: not kept (docs/python.md)."""
    def plain(x: Any) -> bool:
        if x is None or isinstance(x, (str, bool, int, float, np.dtype, np.generic)):
            return True
        if isinstance(x, dict):
            return all(isinstance(k, str) and plain(y) for k, y in x.items())
        return isinstance(x, (tuple, list, set, frozenset)) and all(plain(y) for y in x)

    return {k: v for k, v in encoding.items() if isinstance(k, str) and plain(v)}


def _indexes(obj: Any) -> Tuple[List[Dict[str, Any]], List[str]]:
    """What xarray would not make again by itself from the coordinates: (the indexes to set,
    the coordinates whose index is a multi-index's own tuples, left out). A dimension
    coordinate gets an index by default, so one is written only when it has none (dropped);
    a multi-index as its dimension and levels; an index on another coordinate
    (``set_xindex``) by that coordinate's name. An index of any other kind is refused."""
    xr = sys.modules["xarray"]
    indexed: set = set()
    out: List[Dict[str, Any]] = []
    skip: List[str] = []
    for index, variables in obj.xindexes.group_by_index():
        names = list(variables)
        indexed.update(names)
        if type(index) is xr.indexes.PandasMultiIndex:
            out.append({"multi": index.dim, "levels": [_name(n, "index level") for n in index.index.names]})
            skip.append(index.dim)
        elif type(index) is xr.indexes.PandasIndex:
            (name,) = names
            if name != index.dim:
                out.append({"coord": name})
        else:
            raise TypeError(f"the coordinate(s) {names} have an index of type {type(index).__qualname__}, which treepack "
                            "does not store; drop it (.drop_indexes(...)) and set it again after loading")
    for name in obj.coords:
        if name in obj.dims and name not in indexed:
            out.append({"none": name})
    return out, skip


def encode(obj: Any) -> Description:
    xr = sys.modules["xarray"]
    indexes, skip = _indexes(obj)
    coords = {_name(n, "coordinate"): _variable(c.variable, n in obj.xindexes)
              for n, c in obj.coords.items() if n not in skip}
    kids: List[Tuple[str, Any]]
    if type(obj) is xr.DataArray:
        name = obj.name
        if name is not None and not isinstance(name, str):
            raise TypeError(f"the DataArray name {name!r} is a {type(name).__name__}; only string names can be stored")
        kids = [("name", name), ("variable", _variable(obj.variable)), ("coords", coords)]
    else:
        data_vars = {_name(n, "data variable"): _variable(v.variable) for n, v in obj.data_vars.items()}
        kids = [("data_vars", data_vars), ("coords", coords), ("attrs", dict(obj.attrs))]
    if indexes:
        kids.append(("indexes", indexes))
    if type(obj) is not xr.DataArray and _plain(obj.encoding):
        kids.append(("encoding", _plain(obj.encoding)))  # (a DataArray's is its variable's)
    return ("custom", DATAARRAY if type(obj) is xr.DataArray else DATASET, None, kids)


def _build(xr: Any, v: Dict[str, Any]) -> Any:
    return xr.Variable(tuple(v["dims"]), v["data"], v.get("attrs") or None, encoding=v.get("encoding") or None)


def _reindexed(obj: Any, indexes: Any) -> Any:
    """``obj`` with the indexes ``_indexes`` wrote down set again (files of before session 44
    have none: xarray's default indexes)."""
    if indexes is None:
        return obj
    if not isinstance(indexes, list) or not all(isinstance(i, dict) for i in indexes):
        raise ValueError("the stored indexes must be a list of objects")
    for i in indexes:
        if "none" in i:
            obj = obj.drop_indexes(i["none"])
        elif "coord" in i:
            obj = obj.set_xindex(i["coord"])
        elif "multi" in i and isinstance(i.get("levels"), list):
            obj = obj.set_index({i["multi"]: i["levels"]})
        else:
            raise ValueError(f"unknown stored index {i!r:.80}")
    return obj


def decode(t: str, kids: Dict[str, Any]) -> Any:
    try:
        import xarray as xr
    except ImportError:
        raise LookupError(f"{t}: loading xarray objects needs xarray (pip install xarray)") from None
    coords = {n: _build(xr, v) for n, v in (kids.get("coords") or {}).items()}
    if t == DATAARRAY:
        var = _build(xr, kids["variable"])
        out = xr.DataArray(var, coords=coords, name=kids.get("name"), fastpath=False)
        out.encoding = dict(var.encoding)  # (not taken from the variable by the constructor)
    else:
        data_vars = {n: _build(xr, v) for n, v in (kids.get("data_vars") or {}).items()}
        out = xr.Dataset(data_vars=data_vars, coords=coords, attrs=kids.get("attrs") or None)
    out = _reindexed(out, kids.get("indexes"))
    if t == DATASET and kids.get("encoding"):
        out.encoding = dict(kids["encoding"])
    return out


# ---------------------------------------------------------------- the plug-in


_plugin.integrate_nodes(__name__, is_xarray, encode, decode, NAMES)
