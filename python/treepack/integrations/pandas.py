"""pandas DataFrames and Series as built-in ``py.dataframe`` / ``py.series`` nodes: each column a
numpy array where it has one (numbers, bools, datetime64 and timedelta64), categoricals as codes
and categories, time zones as zone names, nullable columns (``Int64``, ``boolean``, strings) as
values plus a mask, periods as ordinals and their frequency, intervals as their two bounds,
sparse columns as their stored points, the index (a range, any index, a MultiIndex, with a date
range's frequency), the labels and ``attrs`` kept. Nothing a
file names is imported or evaluated: dtypes are rebuilt from a fixed list. Used only when pandas
is already imported (saving) or installed (loading): ``import treepack`` never imports it."""

from __future__ import annotations

import sys
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .. import _plugin

Description = Tuple[str, str, Optional[str], List[Tuple[str, Any]]]

#: Nullable extension dtypes stored as values + mask, by name; their numpy value dtype.
_MASKED = {
    **{f"Int{b}": f"int{b}" for b in (8, 16, 32, 64)},
    **{f"UInt{b}": f"uint{b}" for b in (8, 16, 32, 64)},
    "Float32": "float32", "Float64": "float64", "boolean": "bool",
}
#: String dtypes: (name as pandas prints it) -> how to rebuild it.
_STRINGS = ("str", "string")


def _pd() -> Any:
    return sys.modules.get("pandas")


def is_frame(obj: Any) -> bool:
    pd = _pd()
    return pd is not None and type(obj) in (pd.DataFrame, pd.Series)


def encode(obj: Any) -> Description:
    pd = _pd()
    if type(obj) is pd.Series:
        kids = [("name", obj.name), ("index", _index(obj.index)), ("values", _column(obj))]
        return ("custom", "py.series", None, kids + _attrs(obj))
    cols = list(obj.columns)
    kids = [
        ("columns", _index(obj.columns)),
        ("index", _index(obj.index)),
        ("values", [_column(obj.iloc[:, i]) for i in range(len(cols))]),
    ]
    return ("custom", "py.dataframe", None, kids + _attrs(obj))


def _attrs(obj: Any) -> List[Tuple[str, Any]]:
    """`obj.attrs` (pandas' per-object metadata dict, which pickle keeps), as a child only
    when there is any: frames without it are stored as before."""
    out = [("attrs", dict(obj.attrs))] if obj.attrs else []
    if not obj.flags.allows_duplicate_labels:
        out.append(("flags", {"allows_duplicate_labels": False}))  # (set_flags; pickle keeps it)
    return out


def _column(s: Any) -> Dict[str, Any]:
    """One column (a Series or an Index) as a tree."""
    pd = _pd()
    dt = s.dtype
    if isinstance(dt, pd.CategoricalDtype):
        cat = s.array if hasattr(s, "array") else s
        return {"kind": "category", "codes": np.asarray(cat.codes), "categories": _index(cat.categories), "ordered": bool(dt.ordered)}
    if isinstance(dt, pd.DatetimeTZDtype):
        utc = s.dt.tz_convert(None) if isinstance(s, pd.Series) else s.tz_convert(None)
        return {"kind": "datetimetz", "values": np.asarray(utc.to_numpy()), "tz": _zone_data(dt.tz)}
    if isinstance(dt, pd.PeriodDtype):
        # Ordinals since the epoch in the period's unit (NaT the int64 minimum, as pandas keeps
        # them); the unit is the alias pandas prints, `period[<freq>]`.
        arr = s.array
        return {"kind": "period", "freq": str(dt)[len("period["):-1], "ordinals": np.asarray(arr.asi8)}
    if isinstance(dt, pd.IntervalDtype):
        arr = s.array
        return {"kind": "interval", "closed": arr.closed, "left": _column(arr.left), "right": _column(arr.right)}
    if isinstance(dt, pd.SparseDtype):
        # The stored points and where they are; the fill value is everywhere else.
        arr = s.array
        return {
            "kind": "sparse", "length": len(arr), "fill": arr.fill_value,
            "indices": np.asarray(arr.sp_index.indices, dtype=np.int64), "values": np.asarray(arr.sp_values),
        }
    name = str(dt)
    if name in _MASKED:
        mask = np.asarray(s.isna())
        values = s.to_numpy(dtype=_MASKED[name], na_value=0)
        return {"kind": "masked", "dtype": name, "values": values, "mask": mask}
    if isinstance(dt, pd.StringDtype):
        mask = np.asarray(s.isna())
        values = ["" if m else v for v, m in zip(s.tolist(), mask)]
        na = "nan" if dt.na_value is not pd.NA else "NA"
        return {"kind": "string", "storage": dt.storage, "na": na, "mask": mask, **_joined(values)}
    if isinstance(dt, np.dtype) and dt.kind != "O":
        return {"kind": "numpy", "values": np.asarray(s.to_numpy())}
    if isinstance(dt, np.dtype):
        values = s.tolist()
        if values and all(type(v) is str for v in values):
            return {"kind": "strs", **_joined(values)}
        return {"kind": "object", "values": values}
    raise TypeError(f"pandas columns of dtype {dt} are not supported yet; convert the column (astype) first")


def _joined(values: List[str]) -> Dict[str, Any]:
    """Many strings as one string and the code-point offsets where each ends: a million short
    strings are two leaves, not a million (and slicing one str back is fast)."""
    ends = np.cumsum(np.fromiter((len(v) for v in values), dtype=np.int64, count=len(values)))
    return {"text": "".join(values), "ends": ends}


def _split(c: Dict[str, Any]) -> List[str]:
    text, ends = c["text"], c["ends"]
    if not isinstance(text, str) or not isinstance(ends, np.ndarray) or ends.dtype != np.int64 or ends.ndim != 1:
        raise ValueError("py.dataframe: a string column needs `text` and int64 `ends`")
    if len(ends) and (ends[-1] != len(text) or (np.diff(ends) < 0).any() or ends[0] < 0):
        raise ValueError("py.dataframe: string column offsets do not fit its text")
    e = ends.tolist()
    return [text[a:b] for a, b in zip([0] + e[:-1], e)]


def _index(idx: Any) -> Dict[str, Any]:
    pd = _pd()
    if type(idx) is pd.RangeIndex:
        return {"kind": "range", "start": idx.start, "stop": idx.stop, "step": idx.step, "name": idx.name}
    if isinstance(idx, pd.MultiIndex):
        return {
            "kind": "multi",
            "levels": [_index(level) for level in idx.levels],
            "codes": [np.asarray(c) for c in idx.codes],
            "names": list(idx.names),
        }
    out = {"kind": "index", "values": _column(idx), "name": idx.name}
    if isinstance(idx, (pd.DatetimeIndex, pd.TimedeltaIndex)) and idx.freq is not None:
        # The frequency of a date_range/timedelta_range index (pickle keeps it; the values
        # alone do not say it): its pandas alias, checked against the values when loaded.
        out["freq"] = idx.freqstr
    return out


# ---------------------------------------------------------------- loading


def decode(t: str, kids: Dict[str, Any]) -> Any:
    try:
        import pandas as pd
    except ImportError:
        raise LookupError("loading pandas objects needs pandas (pip install pandas)") from None
    if t == "py.series":
        s = pd.Series(_array(pd, kids["values"]), index=_index_back(pd, kids["index"]), name=kids["name"], copy=False,
                      dtype=_dtype_of(kids["values"]))
        return _attrs_back(s, kids)
    columns = _index_back(pd, kids["columns"])
    values = kids["values"]
    if not isinstance(values, list) or len(values) != len(columns):
        raise ValueError(f"py.dataframe: {len(columns)} column labels but {len(values)} columns")
    index = _index_back(pd, kids["index"])
    data = {
        # (an object column as a Series of that dtype, on the frame's own index: given as an
        # array, pandas would infer another dtype from its values)
        i: _array(pd, v) if _dtype_of(v) is None else pd.Series(_array(pd, v), index=index, dtype=object, copy=False)
        for i, v in enumerate(values)
    }
    df = pd.DataFrame(data, index=index, copy=False) if data else pd.DataFrame(index=index)
    df.columns = columns
    return _attrs_back(df, kids)


def _attrs_back(obj: Any, kids: Dict[str, Any]) -> Any:
    flags = kids.get("flags")
    if flags is not None:
        if not isinstance(flags, dict) or set(flags) - {"allows_duplicate_labels"} or \
                not all(type(v) is bool for v in flags.values()):
            raise ValueError(f"py.dataframe: `flags` must be a dict of allows_duplicate_labels, not {flags!r:.60}")
        obj = obj.set_flags(**flags)
    attrs = kids.get("attrs")
    if attrs is not None:
        if not isinstance(attrs, dict):
            raise ValueError(f"py.dataframe: `attrs` must be a dict, not {type(attrs).__name__}")
        obj.attrs.update(attrs)
    return obj


def _dtype_of(c: Any) -> Any:
    """``object`` for a column stored as Python objects (an object column, strings included),
    else None. pandas infers a dtype from an object array it is given (pandas 3 makes strings
    its ``str`` dtype and ``None`` NaN; every version makes datetimes ``datetime64``), so such a
    column is rebuilt with its dtype said."""
    return object if isinstance(c, dict) and c.get("kind") in ("object", "strs") else None


def _array(pd: Any, c: Dict[str, Any]) -> Any:
    kind = c.get("kind") if isinstance(c, dict) else None
    if kind == "numpy":
        return c["values"]
    if kind == "object":
        return np.array(c["values"] + [None], dtype=object)[:-1]  # a 1-d object array even of tuples
    if kind == "category":
        return pd.Categorical.from_codes(c["codes"], categories=_index_back(pd, c["categories"]), ordered=bool(c["ordered"]))
    if kind == "datetimetz":
        return pd.DatetimeIndex(c["values"]).tz_localize("UTC").tz_convert(_zone(c["tz"])).array
    if kind == "masked":
        name = c["dtype"]
        if name not in _MASKED:
            raise ValueError(f"py.dataframe: unknown nullable dtype {name!r}")
        arr = pd.array(c["values"], dtype=name)
        arr[np.asarray(c["mask"], dtype=bool)] = pd.NA
        return arr
    if kind == "strs":
        return np.array(_split(c) + [None], dtype=object)[:-1]
    if kind == "string":
        if c.get("storage") not in ("python", "pyarrow") or c.get("na") not in ("nan", "NA"):
            raise ValueError(f"py.dataframe: unknown string dtype {c.get('storage')!r}/{c.get('na')!r}")
        na = np.nan if c["na"] == "nan" else pd.NA
        values = _split(c)
        mask = np.asarray(c["mask"], dtype=bool)
        if len(mask) != len(values):
            raise ValueError("py.dataframe: a string column's mask and values differ in length")
        for i in np.flatnonzero(mask).tolist():
            values[i] = None
        return pd.array(values, dtype=pd.StringDtype(c["storage"], na_value=na))
    if kind == "period":
        freq, ordinals = c["freq"], c["ordinals"]
        if not isinstance(freq, str) or not isinstance(ordinals, np.ndarray) or ordinals.dtype != np.int64:
            raise ValueError("py.dataframe: a period column needs a str `freq` and int64 `ordinals`")
        try:
            dtype = pd.PeriodDtype(freq)
        except (ValueError, TypeError) as e:
            raise ValueError(f"py.dataframe: bad period frequency {freq!r} ({e})") from None
        return pd.arrays.PeriodArray(ordinals, dtype=dtype)
    if kind == "interval":
        closed = c["closed"]
        if closed not in ("left", "right", "both", "neither"):
            raise ValueError(f"py.dataframe: bad interval side {closed!r}")
        left, right = _array(pd, c["left"]), _array(pd, c["right"])
        try:
            return pd.arrays.IntervalArray.from_arrays(left, right, closed=closed)
        except (ValueError, TypeError) as e:
            raise ValueError(f"py.dataframe: an interval column's bounds do not fit ({e})") from None
    if kind == "sparse":
        n, idx, vals, fill = c["length"], c["indices"], c["values"], c["fill"]
        ok = isinstance(n, int) and 0 <= n and isinstance(idx, np.ndarray) and idx.dtype == np.int64
        ok = ok and isinstance(vals, np.ndarray) and idx.shape == vals.shape and vals.ndim == 1
        if not ok or (len(idx) and (idx.min() < 0 or idx.max() >= n or (np.diff(idx) <= 0).any())):
            raise ValueError("py.dataframe: a sparse column's points do not fit its length")
        if len(idx) and idx.max() >= 2**31:
            raise ValueError("py.dataframe: a sparse column's points are past what pandas indexes (2**31)")
        # Built from its points, never as a dense array (a file's length costs nothing here).
        dtype = pd.SparseDtype(vals.dtype, fill)
        SparseArray = pd.arrays.SparseArray
        if hasattr(SparseArray, "from_indices"):  # pandas >= 3.1
            return SparseArray.from_indices(vals, idx, n, fill_value=fill, dtype=vals.dtype)
        from pandas._libs.sparse import IntIndex

        return SparseArray(vals, sparse_index=IntIndex(n, idx.astype(np.int32)), fill_value=fill, dtype=dtype)
    raise ValueError(f"py.dataframe: unknown column kind {kind!r}")


def _zone_data(tz: Any) -> Any:
    """A column's zone as stored: its name where pandas makes the same zone from it again (a
    zoneinfo or pytz zone, UTC, a fixed offset), else as a datetime's zone is stored (dateutil's
    zones, whose names pandas prints as ``tzfile('/usr/share/zoneinfo/...')``); a TypeError for a
    zone neither keeps."""
    if type(tz).__module__.partition(".")[0] == "dateutil":
        return _plugin.tz_data(tz)
    return str(tz)


def _zone(stored: Any) -> Any:
    """The zone of a stored column: a name, which pandas turns into its own default zone object
    (pytz under pandas 2, zoneinfo under pandas 3), the one it made when the frame was built from
    the same name; or a zone stored as a datetime's. A name pandas would hand to dateutil
    (``dateutil/<name>``) must be a zone's key: dateutil opens a path as it is."""
    if isinstance(stored, dict):
        return _plugin.tz_from(stored)
    if not isinstance(stored, str):
        raise ValueError(f"py.dataframe: bad time zone {stored!r}")
    if stored.startswith("dateutil/") and not _plugin.zone_key(stored[len("dateutil/"):]):
        raise ValueError(f"py.dataframe: time zone {stored!r} is not a zone's name (such as 'dateutil/Europe/Paris'): "
                         "a path is refused, since it would make the load read a file outside the tree")
    return stored


def _index_back(pd: Any, d: Dict[str, Any]) -> Any:
    kind = d.get("kind") if isinstance(d, dict) else None
    if kind == "range":
        return pd.RangeIndex(d["start"], d["stop"], d["step"], name=d["name"])
    if kind == "multi":
        levels = [_index_back(pd, level) for level in d["levels"]]
        return pd.MultiIndex(levels=levels, codes=d["codes"], names=d["names"])
    if kind == "index":
        idx = pd.Index(_array(pd, d["values"]), name=d["name"], copy=False, dtype=_dtype_of(d["values"]))
        freq = d.get("freq")
        if freq is None:
            return idx
        if not isinstance(freq, str) or not isinstance(idx, (pd.DatetimeIndex, pd.TimedeltaIndex)):
            raise ValueError(f"py.dataframe: a `freq` of {freq!r} on an index of {idx.dtype}")
        try:
            return type(idx)(idx, freq=freq, name=d["name"])
        except (ValueError, TypeError) as e:
            raise ValueError(f"py.dataframe: the index's freq {freq!r} does not fit its values ({e})") from None
    raise ValueError(f"py.dataframe: unknown index kind {kind!r}")


# ---------------------------------------------------------------- the plug-in


NAMES = ("py.dataframe", "py.series")


def _hint(obj: Any) -> Optional[str]:
    """What to do with a pandas object a save refuses: the ones that are not frames or series."""
    pd = sys.modules.get("pandas")
    if pd is None or not type(obj).__module__.startswith("pandas"):
        return None
    name = type(obj).__name__
    if isinstance(obj, pd.Timestamp):
        return ("a pandas Timestamp is kept in a Series or a DataFrame column; alone, convert it: "
                "ts.to_datetime64() keeps the nanoseconds (ts.tz, if any, beside it), ts.to_pydatetime() keeps the "
                "zone to the microsecond")
    if isinstance(obj, pd.Timedelta):
        return "a pandas Timedelta is kept in a Series; alone, convert it: td.to_timedelta64() (or td.to_pytimedelta())"
    if obj is pd.NaT or obj is pd.NA:
        what = "NaT" if obj is pd.NaT else "NA"
        typed = "a datetime or timedelta column" if obj is pd.NaT else "a column of a nullable dtype (Int64, boolean, string…)"
        return (f"pd.{what} is kept as a missing value of {typed}; in an object column or alone, store None, or "
                "give the column such a dtype (s.astype(...))")
    if isinstance(obj, pd.Index):
        return (f"a pandas {name} is kept as a Series' or a DataFrame's index; alone, store it as one "
                "(pd.Series(index=idx, dtype=object), or idx.to_frame())")
    if isinstance(obj, (pd.Period, pd.Interval, pd.Categorical)) or hasattr(obj, "__array__") and name.endswith("Array"):
        return f"a pandas {name} is kept in a Series (pd.Series([value]) or pd.Series(array)); store that"
    if isinstance(obj, pd.offsets.BaseOffset):
        return f"a pandas offset ({obj!r:.40}) is kept as its name: store obj.freqstr and rebuild it with pd.tseries.frequencies.to_offset"
    return None


_plugin.integrate_nodes(__name__, is_frame, encode, decode, NAMES, hint=_hint)
