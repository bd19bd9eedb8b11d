"""pandas DataFrames and Series (issue 26): every column dtype people use, the index kinds,
labels, time zones and missing values, exactly; strict (no dtype named by a file is parsed)."""

import datetime
import decimal
import os

import numpy as np
import pytest

import treepack

pd = pytest.importorskip("pandas", reason="pandas is in python/requirements-dev.txt")


def roundtrip(tmp_path, x):
    p = str(tmp_path / f"t{len(os.listdir(tmp_path))}")
    treepack.save({"x": x}, p)
    return treepack.load(p)["x"]


def frame():
    n = 5
    return pd.DataFrame(
        {
            "i8": np.arange(n, dtype=np.int8),
            "u64": np.arange(n, dtype=np.uint64) * 2**40,
            "f32": np.linspace(0, 1, n, dtype=np.float32),
            "c128": np.arange(n) * (1 + 2j),
            "b": [True, False, True, True, False],
            "s": ["a", None, "ccc", "", "é"],
            "obj": [1, "two", 3.0, None, decimal.Decimal("4.5")],
            "cat": pd.Categorical(["x", "y", "x", None, "z"], categories=["z", "y", "x"], ordered=True),
            "when": pd.date_range("2021-03-27", periods=n, freq="12h"),
            "when_tz": pd.date_range("2021-03-27", periods=n, freq="12h", tz="Europe/Paris"),
            "utc": pd.date_range("2021-01-01", periods=n, tz="UTC"),
            "delta": pd.to_timedelta(np.arange(n), unit="s"),
            "Int64": pd.array([1, None, 3, 4, None], dtype="Int64"),
            "boolean": pd.array([True, None, False, True, None], dtype="boolean"),
            "Float64": pd.array([1.5, None, 3.0, np.nan, 2.0], dtype="Float64"),
            "string": pd.array(["p", None, "q", "r", "s"], dtype="string"),
        },
        index=pd.Index([10, 20, 30, 40, 50], name="row"),
    )


def test_every_column_dtype_round_trips(tmp_path):
    df = frame()
    back = roundtrip(tmp_path, df)
    assert type(back) is pd.DataFrame
    pd.testing.assert_frame_equal(back, df)
    assert list(back.dtypes.astype(str)) == list(df.dtypes.astype(str))


def test_index_kinds_labels_and_series(tmp_path):
    mi = pd.MultiIndex.from_product([["a", "b"], [1, 2]], names=["letter", "n"])
    df = pd.DataFrame(np.arange(8.0).reshape(4, 2), index=mi, columns=[("m", 1), ("m", 2)])
    pd.testing.assert_frame_equal(roundtrip(tmp_path, df), df)
    ranged = pd.DataFrame({"a": [1, 2, 3]}, index=pd.RangeIndex(10, 16, 2, name="r"))
    pd.testing.assert_frame_equal(roundtrip(tmp_path, ranged), ranged)
    dated = pd.Series([1.0, 2.0], index=pd.DatetimeIndex(["2020-01-01", "2020-06-01"], tz="US/Eastern"), name=("s", 1))
    pd.testing.assert_series_equal(roundtrip(tmp_path, dated), dated)
    cat_index = pd.DataFrame({"v": [1, 2]}, index=pd.CategoricalIndex(["x", "y"], name="c"))
    pd.testing.assert_frame_equal(roundtrip(tmp_path, cat_index), cat_index)
    empty = pd.DataFrame()
    pd.testing.assert_frame_equal(roundtrip(tmp_path, empty), empty)
    int_cols = pd.DataFrame([[1, 2]], columns=[3, 4])
    pd.testing.assert_frame_equal(roundtrip(tmp_path, int_cols), int_cols)


def test_columns_are_arrays_in_the_tree_and_unsupported_dtypes_say_so(tmp_path):
    p = str(tmp_path / "f")
    treepack.save({"df": pd.DataFrame({"w": np.arange(1000.0)})}, p)
    s = treepack.load_structure(p)["df"]
    assert s.type_name == "py.dataframe"
    col = s.children["values"][0]["values"]
    assert col.dtype == "float64" and col.shape == (1000,)
    ext = pytest.importorskip("pandas.tests.extension.decimal", reason="pandas ships its test extension arrays")
    odd = pd.DataFrame({"d": ext.DecimalArray([decimal.Decimal("1.5")])})
    with pytest.raises(TypeError, match=r"cannot save `x`: pandas columns of dtype decimal are not supported"):
        treepack.save({"x": odd}, str(tmp_path / "g"))


def test_period_interval_and_sparse_columns_and_indexes(tmp_path):
    per = pd.Series(pd.period_range("2020-01", periods=4, freq="M"))
    per[1] = pd.NaT
    df = pd.DataFrame(
        {
            "month": per,
            "quarter": pd.period_range("2020", periods=4, freq="Q-NOV"),
            "span": pd.arrays.IntervalArray.from_arrays([0.0, np.nan, 2.0, 3.0], [1.0, np.nan, 3.0, 4.5], closed="left"),
            "ints": pd.arrays.IntervalArray.from_breaks([0, 1, 2, 3, 4], closed="both"),
            "days": pd.interval_range(pd.Timestamp("2020-01-01", tz="UTC"), periods=4, freq="D"),
            "sparse": pd.arrays.SparseArray([0, 0, 7, 0], fill_value=0),
            "sparse_nan": pd.arrays.SparseArray([np.nan, 1.5, np.nan, np.nan]),
            "sparse_bool": pd.arrays.SparseArray([False, True, False, False], fill_value=False),
        },
        index=pd.period_range("2021-01-01", periods=4, freq="D", name="day"),
    )
    back = roundtrip(tmp_path, df)
    pd.testing.assert_frame_equal(back, df)
    assert list(back.dtypes.astype(str)) == list(df.dtypes.astype(str))
    assert back["sparse"].array.sp_values.tolist() == [7]  # stored and loaded as points
    by_interval = pd.DataFrame({"a": [1, 2]}, index=pd.IntervalIndex.from_breaks([0, 1, 2], name="bin"))
    pd.testing.assert_frame_equal(roundtrip(tmp_path, by_interval), by_interval)


def test_date_range_frequencies_and_attrs_are_kept(tmp_path):
    # pickle keeps both; the values alone do not say an index's frequency.
    s = pd.Series([1.0, 2.0, 3.0], index=pd.date_range("2020-01-31", periods=3, freq="ME"), name="s")
    s.attrs["unit"] = "m/s"
    back = roundtrip(tmp_path, s)
    pd.testing.assert_series_equal(back, s)
    assert back.index.freq == s.index.freq and back.index.freqstr == "ME"
    assert back.attrs == {"unit": "m/s"}
    df = pd.DataFrame({"v": [1, 2]}, index=pd.timedelta_range("1s", periods=2, freq="s"))
    df.attrs["source"] = {"sensor": 3, "gain": np.float32(0.5)}
    back = roundtrip(tmp_path, df)
    assert back.index.freq == df.index.freq and back.attrs == df.attrs
    tz = pd.Series([1, 2], index=pd.date_range("2020", periods=2, freq="h", tz="Europe/Paris"))
    assert roundtrip(tmp_path, tz).index.freq == tz.index.freq
    irregular = pd.Series([1, 2], index=pd.DatetimeIndex(["2020-01-01", "2020-01-05"]))
    assert roundtrip(tmp_path, irregular).index.freq is None


def test_hostile_frequencies_and_sparse_points_are_refused(tmp_path, edits_refused):
    p = str(tmp_path / "f")
    treepack.save({"x": pd.Series([1, 2, 3], index=pd.date_range("2020", periods=3, freq="D"))}, p)
    edits_refused(p, [(b'"freq":"D"', b'"freq":"2D"', "freq '2D' does not fit its values"),
                      (b'"freq":"2D"', b'"freq":"__import__"', "does not fit its values")])
    p = str(tmp_path / "g")
    treepack.save({"x": pd.Series(pd.period_range("2020", periods=2, freq="M"))}, p)
    edits_refused(p, [(b'"freq":"M"', b'"freq":"bogus"', "bad period frequency 'bogus'")])
    p = str(tmp_path / "h")
    treepack.save({"x": pd.Series(pd.arrays.SparseArray([0, 5, 0], fill_value=0))}, p)
    edits_refused(p, [(b'"length":3', b'"length":1', "sparse column's points do not fit its length")])


def test_a_file_cannot_name_other_dtypes(tmp_path, rewrite_manifest):
    p = str(tmp_path / "h")
    treepack.save({"x": pd.DataFrame({"n": pd.array([1, None], dtype="Int64")})}, p)
    rewrite_manifest(p, b'"Int64"', b'"object"')
    with pytest.raises(ValueError, match="unknown nullable dtype 'object'"):
        treepack.load(p)


def test_object_columns_indexes_and_categories_stay_object(tmp_path):
    # pandas infers a dtype from an object array it is given: pandas 3 made strings its `str`
    # dtype (None became NaN), every version made datetimes datetime64. What was object comes
    # back object, holding the same objects (session 47, a new user's report).
    p = str(tmp_path / "t")
    when = datetime.datetime(2020, 1, 1, 12)
    df = pd.DataFrame(
        {
            "s": pd.Series(["a", None], dtype=object),
            "t": pd.Series([when, None], dtype=object),
            "d": pd.Series([datetime.timedelta(3), np.datetime64("2020-01-02")], dtype=object),
            "n": [1, 2],
        },
    )
    df.index = pd.Index(["x", None], dtype=object, name="k")
    df.columns = pd.Index(list(df.columns), dtype=object)
    series = pd.Series(["a", None, "c"], dtype=object, name="s", index=pd.Index([when, when, when], dtype=object))
    cat = pd.Series(pd.Categorical(["a", "b"], categories=pd.Index(["a", "b", "z"], dtype=object)))
    levels = pd.DataFrame({"v": [1, 2]}, index=pd.MultiIndex(
        levels=[pd.Index(["a", "b"], dtype=object), [1, 2]], codes=[[0, 1], [0, 1]]))
    treepack.save({"df": df, "series": series, "cat": cat, "levels": levels}, p)
    back = treepack.load(p)
    pd.testing.assert_frame_equal(back["df"], df)
    assert [str(t) for t in back["df"].dtypes] == ["object", "object", "object", "int64"]
    assert back["df"]["s"].tolist() == ["a", None] and back["df"]["t"].tolist() == [when, None]
    assert [type(v) for v in back["df"]["d"]] == [datetime.timedelta, np.datetime64]
    assert back["df"].index.dtype == object and back["df"].index.tolist() == ["x", None]
    assert back["df"].columns.dtype == object
    pd.testing.assert_series_equal(back["series"], series)
    assert back["series"].dtype == object and back["series"].index.dtype == object
    assert back["series"].index[0] is not None and type(back["series"].index[0]) is datetime.datetime
    assert back["cat"].cat.categories.dtype == object
    assert back["levels"].index.levels[0].dtype == object


def test_pd_na_in_an_object_column_says_what_keeps_it(tmp_path):
    with pytest.raises(treepack.UnsupportedObjectError, match=r"cannot save `s/values/values/1`: .*pd.NA is kept as a "
                       r"missing value of a column of a nullable dtype .*; in an object column or alone, store None"):
        treepack.save({"s": pd.Series(["a", pd.NA], dtype=object)}, str(tmp_path / "t"))
    s = pd.Series(["a", pd.NA], dtype="string")
    treepack.save({"s": s}, str(tmp_path / "u"))
    pd.testing.assert_series_equal(treepack.load(str(tmp_path / "u"))["s"], s)
