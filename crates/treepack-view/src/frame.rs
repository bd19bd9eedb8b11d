//! pandas DataFrames and Series as tables.
//!
//! python/treepack/integrations/pandas.py stores a DataFrame as a `py.dataframe` custom node
//! (children `columns`, `index`, `values`: the column labels, the row index and one subtree per
//! column) and a Series as `py.series` (`name`, `index`, `values`). A column is a small dict
//! saying its kind (`numpy`, `masked`, `category`, `string`, `strs`, `object`, `datetimetz`,
//! `period`, `interval`, `sparse`) and holding its arrays. [`frame`] rebuilds a page of rows
//! from those arrays: only the rows asked for are read (a string column reads its one text leaf,
//! a sparse column its stored points), and nothing that file names is run or imported.
//! Anything it does not recognise shows as its kind, not as an error: the node's own subtree
//! is still there to browse.

use crate::listing::summary;
use crate::sources::{ApiError, ApiResult, Opened};
use serde_json::{json, Value};
use treepack::format::dtype::float_json;
use treepack::format::keypath::Segment;
use treepack::format::manifest::{ArrayEntry, Entry, Stored};
use treepack::format::model::{Int, Key, Step};
use treepack::{Leaf, Tree};

/// The most rows one page shows.
const ROWS_CAP: u64 = 1000;
/// The most columns one page shows.
const COLUMNS_CAP: u64 = 200;
/// The most elements read whole for one column (a sparse column's points, a category's labels).
const WHOLE_CAP: u64 = 1 << 22;
/// The largest text leaf a string column reads.
const TEXT_CAP: u64 = 64 << 20;

/// Whether a custom node of type `type_name` is shown as a table.
pub(crate) fn is_frame(type_name: &str) -> bool {
    matches!(type_name, "py.dataframe" | "py.series")
}

/// A node of the tree and its key path.
#[derive(Clone)]
struct At<'a> {
    node: &'a Tree<Entry>,
    path: String,
}

impl<'a> At<'a> {
    fn new(node: &'a Tree<Entry>, path: &str) -> At<'a> {
        At { node: node.unshared(), path: path.to_string() }
    }

    /// The child named `name` (a dict key, a field or a custom child).
    fn get(&self, name: &str) -> Option<At<'a>> {
        self.node.children().into_iter().find_map(|(step, child)| {
            let hit = match &step {
                Step::Key(Key::Str(s)) => s == name,
                Step::Name(n) => *n == name,
                _ => false,
            };
            hit.then(|| self.step(&step, child))
        })
    }

    fn step(&self, step: &Step<'_>, child: &'a Tree<Entry>) -> At<'a> {
        let seg = Segment::from_step_pub(step).text();
        let path = if self.path.is_empty() { seg } else { format!("{}/{seg}", self.path) };
        At::new(child, &path)
    }

    /// The items of a list or tuple.
    fn items(&self) -> Vec<At<'a>> {
        match self.node {
            Tree::List(_) | Tree::Tuple(_) => self.node.children().into_iter().map(|(s, c)| self.step(&s, c)).collect(),
            _ => vec![],
        }
    }

    fn entry(&self) -> Option<&'a Entry> {
        match self.node {
            Tree::Leaf(e) => Some(e),
            _ => None,
        }
    }

    fn array(&self) -> Option<&'a ArrayEntry> {
        match self.entry() {
            Some(Entry::Array(a)) if a.shape.len() == 1 => Some(a),
            _ => None,
        }
    }

    /// An inline string leaf (kinds, names of dtypes and zones are short).
    fn str(&self) -> Option<&'a str> {
        match self.entry() {
            Some(Entry::Str(Stored::Inline(s))) => Some(s),
            _ => None,
        }
    }

    fn int(&self) -> Option<i64> {
        match self.entry() {
            Some(Entry::Int(Int::Small(i))) => Some(*i),
            _ => None,
        }
    }
}

/// A leaf as the table shows it: scalars as JSON values, anything else in a few words.
fn scalar(o: &Opened, at: &At<'_>) -> Value {
    match at.entry() {
        Some(Entry::None) => Value::Null,
        Some(Entry::Bool(b)) => json!(b),
        Some(Entry::Int(Int::Small(i))) => json!(i),
        Some(Entry::Float(f)) => float_json(*f),
        Some(Entry::Str(Stored::Inline(s))) => json!(s),
        Some(e) => json!(summary(e)),
        None => match at.node {
            Tree::Ref(id) => json!(o.target(*id).map_or(format!("ref #{id}"), |p| format!("ref -> {p}"))),
            t => json!(format!("{}[{}]", t.container_kind(), t.children().len())),
        },
    }
}

/// How elements of a time column read: numpy's datetime64 (`M`) and timedelta64 (`m`), in
/// `unit`s since 1970-01-01 (NaT is the int64 minimum).
#[derive(Clone)]
struct Time {
    delta: bool,
    unit: String,
}

impl Time {
    fn show(&self, v: i64) -> Value {
        if v == i64::MIN {
            return json!("NaT");
        }
        if self.delta {
            return json!(format!("{v} {}", self.unit));
        }
        let per_second: i64 = match self.unit.as_str() {
            "s" => 1,
            "ms" => 1_000,
            "us" => 1_000_000,
            "ns" => 1_000_000_000,
            "D" => return json!(civil(v)),
            _ => return json!(format!("{v} {} since 1970", self.unit)),
        };
        let (secs, frac) = (v.div_euclid(per_second), v.rem_euclid(per_second));
        let (days, s) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
        let mut out = format!("{} {:02}:{:02}:{:02}", civil(days), s / 3600, s / 60 % 60, s % 60);
        if frac != 0 {
            let digits = per_second.ilog10() as usize;
            out.push_str(&format!(".{frac:0digits$}"));
        }
        json!(out)
    }
}

/// The date `days` after 1970-01-01, proleptic Gregorian (Howard Hinnant's `civil_from_days`).
fn civil(days: i64) -> String {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// One column (or index) of a frame, as its stored arrays.
enum Col<'a> {
    /// A 1-D array; `mask` marks missing rows (nullable dtypes), `time` reads int64 as times.
    Array {
        at: At<'a>,
        a: &'a ArrayEntry,
        dtype: String,
        mask: Option<At<'a>>,
        time: Option<Time>,
    },
    /// Codes into the categories (−1: missing).
    Category {
        codes: At<'a>,
        categories: Box<Col<'a>>,
        ordered: bool,
    },
    /// Strings as one text and the code-point offsets where each ends.
    Strings {
        text: At<'a>,
        ends: At<'a>,
        len: u64,
        mask: Option<At<'a>>,
        dtype: String,
    },
    /// Python objects, one leaf each.
    Object {
        items: Vec<At<'a>>,
    },
    Interval {
        left: Box<Col<'a>>,
        right: Box<Col<'a>>,
        closed: String,
    },
    Sparse {
        len: u64,
        fill: Value,
        indices: At<'a>,
        values: At<'a>,
        dtype: String,
    },
    Range {
        start: i64,
        step: i64,
        len: u64,
    },
    Multi {
        levels: Vec<Col<'a>>,
        codes: Vec<At<'a>>,
    },
    /// A kind this viewer does not know: its rows are not shown.
    Unknown {
        kind: String,
        len: u64,
    },
}

fn unknown<'a>(kind: &str) -> Col<'a> {
    Col::Unknown { kind: kind.to_string(), len: 0 }
}

/// The column stored at `at` (a column dict of pandas.py).
fn column<'a>(at: &At<'a>) -> Col<'a> {
    let kind = at.get("kind").and_then(|k| k.str()).unwrap_or("?");
    let array = |name: &str| at.get(name);
    match kind {
        "numpy" | "datetimetz" => match array("values").map(|v| plain(&v)) {
            Some(Col::Array { at: v, a, dtype, time, .. }) => {
                let dtype = match (kind, at.get("tz").and_then(|t| t.str())) {
                    // pandas.py stores such a column in UTC: said, rather than converted here.
                    ("datetimetz", Some(tz)) => format!("{}, {tz}] (shown in UTC)", dtype.trim_end_matches(']')),
                    _ => dtype,
                };
                Col::Array { at: v, a, dtype, mask: None, time }
            }
            Some(c) => c,
            None => unknown(kind),
        },
        "masked" => match (array("values").map(|v| plain(&v)), array("mask")) {
            (Some(Col::Array { at: v, a, time, .. }), Some(m)) => {
                let dtype = at.get("dtype").and_then(|d| d.str()).unwrap_or("masked").to_string();
                Col::Array { at: v, a, dtype, mask: Some(m), time }
            }
            _ => unknown(kind),
        },
        "category" => match (array("codes"), at.get("categories")) {
            (Some(codes), Some(cats)) if codes.array().is_some() => Col::Category {
                codes,
                categories: Box::new(index(&cats)),
                ordered: matches!(at.get("ordered").and_then(|o| o.entry()), Some(Entry::Bool(true))),
            },
            _ => unknown(kind),
        },
        "string" | "strs" => match (array("text"), array("ends")) {
            (Some(text), Some(ends)) => match ends.array() {
                Some(e) => Col::Strings {
                    len: e.shape[0],
                    text,
                    ends,
                    mask: if kind == "string" { array("mask") } else { None },
                    // As pandas prints them: `str` (pandas 3's default, NaN for missing),
                    // `string` (pd.NA), `object` (Python strings).
                    dtype: match (kind, at.get("na").and_then(|n| n.str())) {
                        ("string", Some("nan")) => "str".into(),
                        ("string", _) => "string".into(),
                        _ => "object".into(),
                    },
                },
                None => unknown(kind),
            },
            _ => unknown(kind),
        },
        "object" => Col::Object { items: array("values").map(|v| v.items()).unwrap_or_default() },
        "period" => match (array("ordinals").map(|v| plain(&v)), at.get("freq").and_then(|f| f.str())) {
            (Some(Col::Array { at: v, a, .. }), Some(freq)) => {
                Col::Array { at: v, a, dtype: format!("period[{freq}] (ordinals)"), mask: None, time: None }
            }
            _ => unknown(kind),
        },
        "interval" => match (at.get("left"), at.get("right")) {
            (Some(l), Some(r)) => Col::Interval {
                left: Box::new(column(&l)),
                right: Box::new(column(&r)),
                closed: at.get("closed").and_then(|c| c.str()).unwrap_or("right").to_string(),
            },
            _ => unknown(kind),
        },
        "sparse" => match (at.get("length").and_then(|l| l.int()), array("indices"), array("values")) {
            (Some(len), Some(indices), Some(values)) if indices.array().is_some() && values.array().is_some() => {
                let dtype = values.array().map_or(String::new(), |a| format!("Sparse[{}]", a.dtype.display()));
                let fill = at.get("fill").map_or(Value::Null, |f| scalar_plain(&f));
                Col::Sparse { len: u64::try_from(len).unwrap_or(0), fill, indices, values, dtype }
            }
            _ => unknown(kind),
        },
        k => unknown(k),
    }
}

/// A leaf's value without a reader (inline scalars).
fn scalar_plain(at: &At<'_>) -> Value {
    match at.entry() {
        Some(Entry::None) | None => Value::Null,
        Some(Entry::Bool(b)) => json!(b),
        Some(Entry::Int(Int::Small(i))) => json!(i),
        Some(Entry::Float(f)) => float_json(*f),
        Some(Entry::Str(Stored::Inline(s))) => json!(s),
        Some(e) => json!(summary(e)),
    }
}

/// A 1-D array, or numpy's datetime64/timedelta64 (a `py.datetime64` node around int64s).
fn plain<'a>(at: &At<'a>) -> Col<'a> {
    if let Some(a) = at.array() {
        return Col::Array { at: at.clone(), a, dtype: a.dtype.display(), mask: None, time: None };
    }
    if let Tree::Custom { type_name, data, .. } = at.node {
        if type_name == "py.datetime64" {
            if let Some(v) = at.get("values") {
                if let Some(a) = v.array() {
                    let delta = data.get("kind").and_then(Value::as_str) == Some("m");
                    let unit = data.get("unit").and_then(Value::as_str).unwrap_or("?").to_string();
                    let dtype = format!("{}[{unit}]", if delta { "timedelta64" } else { "datetime64" });
                    return Col::Array { at: v, a, dtype, mask: None, time: Some(Time { delta, unit }) };
                }
            }
        }
    }
    unknown("array")
}

/// An index dict of pandas.py: a range, an index of one column, or a MultiIndex.
fn index<'a>(at: &At<'a>) -> Col<'a> {
    match at.get("kind").and_then(|k| k.str()) {
        Some("range") => {
            let n = |k: &str| at.get(k).and_then(|x| x.int());
            match (n("start"), n("stop"), n("step")) {
                (Some(start), Some(stop), Some(step)) if step != 0 => {
                    let span = i128::from(stop) - i128::from(start);
                    let len = if (span > 0) == (step > 0) && span != 0 {
                        (span.unsigned_abs()).div_ceil(i128::from(step).unsigned_abs())
                    } else {
                        0
                    };
                    Col::Range { start, step, len: u64::try_from(len).unwrap_or(0) }
                }
                _ => unknown("range"),
            }
        }
        Some("index") => at.get("values").map_or_else(|| unknown("index"), |v| column(&v)),
        Some("multi") => {
            let levels = at.get("levels").map(|l| l.items()).unwrap_or_default();
            let codes = at.get("codes").map(|c| c.items()).unwrap_or_default();
            if levels.len() != codes.len() || codes.iter().any(|c| c.array().is_none()) {
                return unknown("multi");
            }
            Col::Multi { levels: levels.iter().map(index).collect(), codes }
        }
        k => unknown(k.unwrap_or("?")),
    }
}

/// Elements `off..off + n` of a 1-D array as JSON.
fn read_rows(o: &Opened, at: &At<'_>, a: &ArrayEntry, off: u64, n: u64) -> ApiResult<Vec<Value>> {
    if n == 0 {
        return Ok(vec![]);
    }
    let arr = o.reader.read_array(&at.path, &format!("{off}:{}", off + n))?;
    Ok((0..n as usize).map(|i| a.dtype.element_json(arr.bytes(), i).unwrap_or(Value::Null)).collect())
}

fn as_i64(v: &Value) -> Option<i64> {
    v.as_i64().or_else(|| v.as_u64().and_then(|u| i64::try_from(u).ok()))
}

impl Col<'_> {
    fn len(&self) -> u64 {
        match self {
            Col::Array { a, .. } => a.shape[0],
            Col::Category { codes, .. } => codes.array().map_or(0, |a| a.shape[0]),
            Col::Strings { len, .. } | Col::Sparse { len, .. } | Col::Range { len, .. } | Col::Unknown { len, .. } => {
                *len
            }
            Col::Object { items } => items.len() as u64,
            Col::Interval { left, .. } => left.len(),
            Col::Multi { codes, .. } => codes.first().and_then(|c| c.array()).map_or(0, |a| a.shape[0]),
        }
    }

    fn dtype(&self) -> String {
        match self {
            Col::Array { dtype, .. } | Col::Strings { dtype, .. } | Col::Sparse { dtype, .. } => dtype.clone(),
            Col::Category { ordered, .. } => if *ordered { "category (ordered)" } else { "category" }.into(),
            Col::Object { .. } => "object".into(),
            Col::Interval { left, closed, .. } => format!("interval[{}, {closed}]", left.dtype()),
            Col::Range { .. } => "range".into(),
            Col::Multi { levels, .. } => format!("multi ({} levels)", levels.len()),
            Col::Unknown { kind, .. } => format!("{kind} (not shown)"),
        }
    }

    /// Rows `off..off + n` (clipped to the column) as JSON values; null where missing.
    fn rows(&self, o: &Opened, off: u64, n: u64) -> ApiResult<Vec<Value>> {
        let n = n.min(self.len().saturating_sub(off));
        Ok(match self {
            Col::Array { at, a, mask, time, .. } => {
                let mut v = read_rows(o, at, a, off, n)?;
                if let Some(t) = time {
                    v = v.iter().map(|x| as_i64(x).map_or(Value::Null, |i| t.show(i))).collect();
                }
                if let Some(m) = mask.as_ref().and_then(|m| m.array().map(|ma| (m, ma))) {
                    let missing = read_rows(o, m.0, m.1, off, n)?;
                    for (x, miss) in v.iter_mut().zip(missing) {
                        if miss == Value::Bool(true) {
                            *x = Value::Null;
                        }
                    }
                }
                v
            }
            Col::Category { codes, categories, .. } => by_codes(o, codes, categories, off, n)?,
            Col::Strings { text, ends, mask, .. } => {
                if n == 0 {
                    return Ok(vec![]);
                }
                let Some(ea) = ends.array() else { return Ok(vec![]) };
                // The end before the first row is where the first row starts.
                let from = off.saturating_sub(1);
                let e: Vec<Option<i64>> = read_rows(o, ends, ea, from, off + n - from)?.iter().map(as_i64).collect();
                let (starts, stops) = if off == 0 { (vec![Some(0)], &e[..]) } else { (vec![e[0]], &e[1..]) };
                let s = read_text(o, text)?;
                // Code-point offsets to byte offsets, in one pass up to the last end.
                let last = stops.iter().flatten().copied().max().unwrap_or(0).max(0) as usize;
                let bytes_at: Vec<usize> = s.char_indices().map(|(b, _)| b).take(last + 1).chain([s.len()]).collect();
                let at = |cp: i64| usize::try_from(cp).ok().and_then(|c| bytes_at.get(c).copied());
                let mut prev = starts[0];
                let mut out = Vec::with_capacity(n as usize);
                for stop in stops {
                    out.push(match (prev.and_then(at), stop.and_then(at)) {
                        (Some(a), Some(b)) if a <= b => json!(&s[a..b]),
                        _ => Value::Null,
                    });
                    prev = *stop;
                }
                if let Some((m, ma)) = mask.as_ref().and_then(|m| m.array().map(|ma| (m, ma))) {
                    for (x, miss) in out.iter_mut().zip(read_rows(o, m, ma, off, n)?) {
                        if miss == Value::Bool(true) {
                            *x = Value::Null;
                        }
                    }
                }
                out
            }
            Col::Object { items } => items.iter().skip(off as usize).take(n as usize).map(|i| scalar(o, i)).collect(),
            Col::Interval { left, right, closed } => {
                let (l, r) = (left.rows(o, off, n)?, right.rows(o, off, n)?);
                let (open, close) = match closed.as_str() {
                    "left" => ("[", ")"),
                    "both" => ("[", "]"),
                    "neither" => ("(", ")"),
                    _ => ("(", "]"),
                };
                let show = |v: &Value| match v {
                    Value::String(s) => s.clone(),
                    v => v.to_string(),
                };
                l.iter()
                    .zip(&r)
                    .map(|(a, b)| {
                        if a.is_null() || b.is_null() {
                            Value::Null
                        } else {
                            json!(format!("{open}{}, {}{close}", show(a), show(b)))
                        }
                    })
                    .collect()
            }
            Col::Sparse { fill, indices, values, .. } => {
                let (Some(ia), Some(va)) = (indices.array(), values.array()) else { return Ok(vec![]) };
                let points = ia.shape[0];
                if points > WHOLE_CAP || va.shape[0] != points {
                    return Ok(vec![json!("sparse column too big to show"); n as usize]);
                }
                let idx: Vec<Option<i64>> = read_rows(o, indices, ia, 0, points)?.iter().map(as_i64).collect();
                let mut out = vec![fill.clone(); n as usize];
                let first = idx.partition_point(|i| i.is_some_and(|i| i < off as i64));
                let last = idx.partition_point(|i| i.is_some_and(|i| i < (off + n) as i64));
                if last > first {
                    let vals = read_rows(o, values, va, first as u64, (last - first) as u64)?;
                    for (k, v) in (first..last).zip(vals) {
                        if let Some(row) = idx[k].and_then(|i| usize::try_from(i - off as i64).ok()) {
                            if let Some(slot) = out.get_mut(row) {
                                *slot = v;
                            }
                        }
                    }
                }
                out
            }
            Col::Range { start, step, .. } => (off..off + n)
                .map(|i| {
                    i64::try_from(i)
                        .ok()
                        .and_then(|i| i.checked_mul(*step))
                        .and_then(|x| x.checked_add(*start))
                        .map_or(Value::Null, |x| json!(x))
                })
                .collect(),
            Col::Multi { levels, codes } => {
                let mut parts: Vec<Vec<Value>> = vec![];
                for (level, c) in levels.iter().zip(codes) {
                    parts.push(by_codes(o, c, level, off, n)?);
                }
                (0..n as usize)
                    .map(|i| Value::Array(parts.iter().map(|p| p.get(i).cloned().unwrap_or(Value::Null)).collect()))
                    .collect()
            }
            Col::Unknown { .. } => vec![Value::Null; n as usize],
        })
    }
}

/// Rows `off..off + n` of the codes at `codes`, as the labels of `categories` they stand for
/// (a negative code is missing: null). The labels between the smallest and largest code are
/// read at once.
fn by_codes(o: &Opened, codes: &At<'_>, categories: &Col<'_>, off: u64, n: u64) -> ApiResult<Vec<Value>> {
    let Some(ca) = codes.array() else { return Ok(vec![Value::Null; n as usize]) };
    let n = n.min(ca.shape[0].saturating_sub(off));
    let codes: Vec<Option<u64>> =
        read_rows(o, codes, ca, off, n)?.iter().map(|c| as_i64(c).and_then(|c| u64::try_from(c).ok())).collect();
    let valid = codes.iter().flatten();
    Ok(match (valid.clone().min(), valid.max()) {
        (Some(&lo), Some(&hi)) if hi - lo < WHOLE_CAP => {
            let labels = categories.rows(o, lo, hi - lo + 1)?;
            codes
                .iter()
                .map(|c| c.and_then(|c| labels.get((c - lo) as usize).cloned()).unwrap_or(Value::Null))
                .collect()
        }
        _ => codes.iter().map(|c| c.map_or(Value::Null, |c| json!(c))).collect(),
    })
}

/// A string leaf whole (a string column's text).
fn read_text(o: &Opened, at: &At<'_>) -> ApiResult<String> {
    let size = match at.entry() {
        Some(Entry::Str(s)) => crate::sources::stored_size(s).0,
        _ => return Err(ApiError::bad(format!("`{}` is not a string leaf", at.path))),
    };
    if size > TEXT_CAP {
        return Err(ApiError::bad(format!(
            "`{}` is {size} bytes of text; a table reads at most {TEXT_CAP} of a string column",
            at.path
        )));
    }
    match o.reader.get(&at.path)? {
        Tree::Leaf(Leaf::Str(s)) => Ok(s),
        _ => Err(ApiError::bad(format!("`{}` is not a string leaf", at.path))),
    }
}

/// Rows `offset..offset + limit` and columns `coffset..coffset + climit` of the DataFrame or
/// Series at `path`: column labels, dtypes and values, the index's name and values.
pub(crate) fn frame(o: &Opened, path: &str, offset: u64, limit: u64, coffset: u64, climit: u64) -> ApiResult<Value> {
    let at = At::new(crate::listing::node_at(o, path)?, path);
    let type_name = match at.node {
        Tree::Custom { type_name, .. } if is_frame(type_name) => type_name.as_str(),
        _ => return Err(ApiError::bad(format!("`{path}` is not a pandas DataFrame or Series"))),
    };
    let idx_at = at.get("index");
    let idx = idx_at.as_ref().map_or_else(|| unknown("index"), index);
    let index_name = idx_at.as_ref().and_then(|i| i.get("name").or_else(|| i.get("names"))).map_or(Value::Null, |n| {
        let items = n.items();
        if items.is_empty() {
            scalar(o, &n)
        } else {
            Value::Array(items.iter().map(|x| scalar(o, x)).collect())
        }
    });
    let climit = climit.clamp(1, COLUMNS_CAP);
    let (labels, cols, total_cols) = if type_name == "py.series" {
        let values = at.get("values");
        let label = at.get("name").map_or(Value::Null, |n| scalar(o, &n));
        let cols: Vec<(Col<'_>, String)> = values.iter().map(|v| (column(v), v.path.clone())).collect();
        (vec![label], cols, 1)
    } else {
        let items = at.get("values").map(|v| v.items()).unwrap_or_default();
        let shown: Vec<&At<'_>> = items.iter().skip(coffset as usize).take(climit as usize).collect();
        let labels = match at.get("columns") {
            Some(c) => index(&c).rows(o, coffset, shown.len() as u64)?,
            None => vec![],
        };
        (labels, shown.iter().map(|v| (column(v), v.path.clone())).collect(), items.len() as u64)
    };
    let rows = match idx {
        Col::Unknown { .. } => cols.first().map_or(0, |(c, _)| c.len()),
        ref i => i.len(),
    };
    let offset = offset.min(rows);
    let n = limit.clamp(1, ROWS_CAP).min(rows - offset);
    let mut columns = vec![];
    for (i, (c, p)) in cols.iter().enumerate() {
        columns.push(json!({
            "label": labels.get(i).cloned().unwrap_or(Value::Null), "dtype": c.dtype(), "path": p,
            "values": c.rows(o, offset, n)?,
        }));
    }
    Ok(json!({
        "type": type_name, "rows": rows, "offset": offset, "count": n,
        "columns_total": total_cols, "columns_offset": coffset.min(total_cols),
        "index": {"name": index_name, "dtype": idx.dtype(), "values": idx.rows(o, offset, n)?},
        "columns": columns,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_read_as_numpy_prints_them() {
        let t = |unit: &str| Time { delta: false, unit: unit.into() };
        assert_eq!(t("D").show(0), json!("1970-01-01"));
        assert_eq!(t("s").show(951_782_400), json!("2000-02-29 00:00:00"));
        assert_eq!(t("us").show(-1), json!("1969-12-31 23:59:59.999999"));
        assert_eq!(t("ns").show(i64::MIN), json!("NaT"));
        assert_eq!(Time { delta: true, unit: "ms".into() }.show(5), json!("5 ms"));
    }
}
