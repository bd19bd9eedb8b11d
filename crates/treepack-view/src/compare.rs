//! Two trees compared, and a repository's trees over time.
//!
//! What differs comes from the manifests alone (`treepack diff`'s [`diff`]: paths, dtypes,
//! chunks by hash). How much an array changed needs its data: [`norm`] reads both arrays block
//! by block, and only for the arrays the page asks about, so opening a diff of two big
//! checkpoints reads no array data.

use crate::data::{array_at, comparable, zip_blocks};
use crate::sources::{ApiError, ApiResult, Opened, State};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use treepack::format::diff::diff;
use treepack::format::keypath;
use treepack::format::manifest::{ArrayStorage, Entry};
use treepack::Tree;

/// The most changed rows one diff answer lists (with the totals of all).
const DIFF_ROWS: usize = 20_000;
/// The most elements a change norm reads from each tree.
const NORM_CAP: u64 = 1 << 27;
/// The most arrays a history follows (those that changed most often).
const HISTORY_ARRAYS: usize = 2_000;

/// The differences between trees `x` and `y` (source ids), with totals by kind; rows of arrays
/// whose norms can be asked for are marked `norm`.
pub(crate) fn tree_diff(s: &State, x: &str, y: &str) -> ApiResult<Value> {
    let (a, b) = (s.tree(x)?, s.tree(y)?);
    let d = diff(a.root(), b.root());
    let count = |op: char| d.iter().filter(|x| x.op == op).count();
    let rows: Vec<Value> = d
        .iter()
        .take(DIFF_ROWS)
        .map(|x| {
            let mut v = x.to_json();
            v["norm"] = json!(x.op == '~' && same_numeric_array(&a, &b, &x.path));
            v
        })
        .collect();
    Ok(json!({
        "a": a.display, "b": b.display, "identical": d.is_empty(),
        "added": count('+'), "removed": count('-'), "changed": count('~'),
        "total": d.len(), "rows": rows,
    }))
}

/// Whether `path` is a numeric array of the same dtype and shape in both trees.
fn same_numeric_array(a: &Opened, b: &Opened, path: &str) -> bool {
    match (keypath::resolve(a.root(), path), keypath::resolve(b.root(), path)) {
        (Ok(Tree::Leaf(Entry::Array(x))), Ok(Tree::Leaf(Entry::Array(y)))) => {
            x.dtype == y.dtype && x.shape == y.shape && comparable(x)
        }
        _ => false,
    }
}

/// How much the array at `path` changed from tree `x` to tree `y`: the L2 norm of the
/// difference, its largest element, the L2 norm of `x`'s array, their ratio (the relative
/// change) and how many elements differ.
pub(crate) fn norm(x: &Opened, y: &Opened, path: &str) -> ApiResult<Value> {
    let (a, b) = (array_at(x, path)?, array_at(y, path)?);
    if a.dtype != b.dtype || a.shape != b.shape {
        return Err(ApiError::bad(format!(
            "`{path}` changed from {}{:?} to {}{:?}: no element-wise change to measure",
            a.dtype.display(),
            a.shape,
            b.dtype.display(),
            b.shape
        )));
    }
    if !comparable(a) {
        return Err(ApiError::bad(format!("`{path}` holds {} elements: not numbers", a.dtype.display())));
    }
    let n: u64 = a.shape.iter().product();
    if n > NORM_CAP {
        return Err(ApiError::bad(format!(
            "`{path}` has {n} elements; change norms read at most {NORM_CAP} from each tree"
        )));
    }
    // Identical chunks (by hash, on the same grid) or inline bytes need no read.
    let same = match (&a.storage, &b.storage) {
        (ArrayStorage::Chunked { chunk_shape: g, chunks: c }, ArrayStorage::Chunked { chunk_shape: h, chunks: d }) => {
            g == h && c.iter().zip(d).all(|(p, q)| p.hash == q.hash)
        }
        (ArrayStorage::Inline(x), ArrayStorage::Inline(y)) => x == y,
        _ => false,
    };
    if same {
        return Ok(
            json!({"path": path, "l2": 0.0, "linf": 0.0, "rel": 0.0, "changed": 0, "elements": n, "read": false}),
        );
    }
    let (mut d2, mut a2, mut linf, mut changed) = (0f64, 0f64, 0f64, 0u64);
    zip_blocks(x, y, path, a, |u, v| {
        for (&p, &q) in u.iter().zip(v) {
            let same = p == q || (p.is_nan() && q.is_nan());
            if !same {
                changed += 1;
            }
            if p.is_finite() {
                a2 += p * p;
            }
            let dd = q - p;
            if dd.is_finite() {
                d2 += dd * dd;
                linf = linf.max(dd.abs());
            }
        }
    })?;
    let (l2, an) = (d2.sqrt(), a2.sqrt());
    let rel = if an > 0.0 { json!(l2 / an) } else { Value::Null };
    Ok(
        json!({"path": path, "l2": l2, "linf": linf, "norm_a": an, "rel": rel, "changed": changed, "elements": n, "read": true}),
    )
}

/// The repository's names in the order their trees were saved (oldest first), with when and
/// their root hashes: what the page's tree picker lists (no manifest read).
pub(crate) fn names(s: &State) -> ApiResult<Value> {
    let Some(repo) = s.repository() else { return Ok(json!({"repository": null, "names": []})) };
    let mut names = repo.names()?;
    names.sort_by(|a, b| a.saved_ms.cmp(&b.saved_ms).then_with(|| a.name.cmp(&b.name)));
    let rows: Vec<Value> =
        names.iter().map(|t| json!({"name": t.name, "root": t.root.to_hex(), "saved_ms": t.saved_ms})).collect();
    Ok(json!({"repository": s.repository_display(), "names": rows}))
}

/// The repository's trees in the order they were saved, and for each consecutive pair what
/// changed (from the manifests): counts, and per array the fraction of its chunks that
/// changed. Computed once per server, when first asked.
pub(crate) fn history(s: &State) -> ApiResult<Arc<Value>> {
    let mut cache = s.history.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(h) = cache.as_ref() {
        return Ok(h.clone());
    }
    let Some(repo) = s.repository() else {
        return Err(ApiError::bad(format!(
            "{} is not a repository (nor a tree of one): it has no history",
            s.location
        )));
    };
    let mut names = repo.names()?;
    names.sort_by(|a, b| a.saved_ms.cmp(&b.saved_ms).then_with(|| a.name.cmp(&b.name)));
    let mut trees = vec![];
    // Per array path: the chunk fraction changed at each step (None where absent or not comparable).
    let mut arrays: BTreeMap<String, Vec<Option<f64>>> = BTreeMap::new();
    let mut prev: Option<Arc<Opened>> = None;
    for (i, t) in names.iter().enumerate() {
        let cur = s.tree(&format!("@{}", t.name))?;
        let sub = cur.sub(cur.root());
        let mut row = json!({
            "name": t.name, "root": t.root.to_hex(), "saved_ms": t.saved_ms,
            "bytes_written": t.bytes_written, "bytes_reused": t.bytes_reused,
            "leaves": sub.leaves, "bytes": sub.bytes,
        });
        if let Some(p) = &prev {
            let d = diff(p.root(), cur.root());
            let count = |op: char| d.iter().filter(|x| x.op == op).count();
            row["added"] = json!(count('+'));
            row["removed"] = json!(count('-'));
            row["changed"] = json!(count('~'));
            for x in d.iter().filter(|x| x.op == '~') {
                if let Some((k, n)) = x.chunks {
                    let series = arrays.entry(x.path.clone()).or_insert_with(|| vec![None; names.len()]);
                    series[i] = Some(if n == 0 { 0.0 } else { k as f64 / n as f64 });
                }
            }
        }
        trees.push(row);
        prev = Some(cur);
    }
    // The arrays that changed most often first.
    let mut series: Vec<(String, Vec<Option<f64>>)> = arrays.into_iter().collect();
    series.sort_by_key(|(_, v)| std::cmp::Reverse(v.iter().filter(|x| x.is_some_and(|f| f > 0.0)).count()));
    let total = series.len();
    let shown: Vec<Value> =
        series.into_iter().take(HISTORY_ARRAYS).map(|(p, v)| json!({"path": p, "chunks_changed": v})).collect();
    let h = Arc::new(json!({
        "repository": s.repository_display(), "trees": trees, "arrays": shown, "arrays_total": total,
    }));
    *cache = Some(h.clone());
    Ok(h)
}

/// The change norm of the array at `path` between each pair of consecutive trees of the
/// history (null, with the reason, where it cannot be measured).
pub(crate) fn history_norms(s: &State, path: &str) -> ApiResult<Value> {
    let h = history(s)?;
    let names: Vec<String> = h["trees"]
        .as_array()
        .map(|t| t.iter().filter_map(|r| r["name"].as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    let mut out = vec![Value::Null];
    for w in names.windows(2) {
        let (x, y) = (s.tree(&format!("@{}", w[0]))?, s.tree(&format!("@{}", w[1]))?);
        out.push(match norm(&x, &y, path) {
            Ok(v) => v,
            Err(e) => json!({"error": e.message}),
        });
    }
    Ok(json!({"path": path, "names": names, "steps": out}))
}
