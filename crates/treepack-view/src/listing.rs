//! The tree as the page lists it: one level at a time, paged, each row with its kind, dtype,
//! shape and the counts and bytes of its subtree; a node's details; glob search. All from the
//! manifest: nothing here reads array data.

use crate::numeric::is_numeric;
use crate::sources::{stored_size, ApiError, ApiResult, Opened, State};
use serde_json::{json, Value};
use treepack::format::diff::describe_entry;
use treepack::format::dtype::float_json;
use treepack::format::keypath::{self, Glob, Segment};
use treepack::format::manifest::Stored;
use treepack::format::manifest::{ArrayStorage, Entry};
use treepack::format::merkle::node_hash;
use treepack::format::model::{grow, Key, Step};
use treepack::Tree;

/// What the page needs first: the locations, whether there is a tree, a second tree, a
/// repository; the tree's metadata and totals.
pub(crate) fn info(s: &State) -> ApiResult<Value> {
    let mut v = json!({
        "location": s.location, "other": s.other_location, "tree": s.has_tree(),
        "repository": s.repository_display(),
    });
    if s.has_tree() {
        let o = s.tree("a")?;
        let m = o.reader.manifest();
        let sub = o.sub(o.root());
        v["metadata"] = m.metadata.clone().unwrap_or(Value::Null);
        v["read_from"] = json!(o.reader.location().read_from());
        v["format"] = json!(format!("{}.{}", m.version.0, m.version.1));
        v["writer"] = json!(m.writer);
        v["totals"] = json!({"leaves": sub.leaves, "arrays": sub.arrays, "bytes": sub.bytes,
                             "stored": m.packs.iter().map(|p| p.size).sum::<u64>(), "packs": m.packs.len()});
    }
    Ok(v)
}

/// The node at `path` (refs followed), or a 404 saying which step is missing.
pub(crate) fn node_at<'a>(o: &'a Opened, path: &str) -> ApiResult<&'a Tree<Entry>> {
    keypath::resolve(o.root(), path).map_err(|e| ApiError { status: 404, message: ApiError::from(e).message })
}

/// Children `offset..offset+limit` of the node at `path`, with how many there are in all.
pub(crate) fn children(o: &Opened, path: &str, offset: usize, limit: usize) -> ApiResult<Value> {
    let node = node_at(o, path)?;
    let kids = node.children();
    let rows: Vec<Value> =
        kids.iter().skip(offset).take(limit).map(|(step, child)| row(o, path, step, child)).collect();
    Ok(json!({"path": path, "total": kids.len(), "offset": offset, "children": rows}))
}

fn join(path: &str, seg: &str) -> String {
    if path.is_empty() {
        seg.to_string()
    } else {
        format!("{path}/{seg}")
    }
}

/// How a key reads to a person: strings as themselves, other keys as Python writes them.
fn key_label(k: &Key) -> String {
    match k {
        Key::Str(s) => s.clone(),
        Key::None => "None".into(),
        Key::Bool(b) => if *b { "True" } else { "False" }.into(),
        Key::Int(i) => i.to_string(),
        Key::Float(f) => format!("{f:?}"),
        Key::Tuple(v) => {
            let items: Vec<String> = v
                .iter()
                .map(|x| match x {
                    Key::Str(s) => format!("{s:?}"),
                    x => key_label(x),
                })
                .collect();
            format!("({}{})", items.join(", "), if v.len() == 1 { "," } else { "" })
        }
    }
}

/// One row of a listing.
fn row(o: &Opened, parent: &str, step: &Step<'_>, child: &Tree<Entry>) -> Value {
    let seg = Segment::from_step_pub(step).text();
    let label = match step {
        Step::Index(i) => i.to_string(),
        Step::Key(k) => key_label(k),
        Step::Name(n) => n.to_string(),
    };
    let mut v = json!({"name": seg, "label": label, "path": join(parent, &seg)});
    describe(o, child, &mut v);
    v
}

/// Fill `v` with what a row and a node's details share: kind, type, dtype, shape, counts.
fn describe(o: &Opened, node: &Tree<Entry>, v: &mut Value) {
    let (node, shared) = match node {
        Tree::Shared { id, node } => (node.as_ref(), Some(*id)),
        n => (n, None),
    };
    if let Some(id) = shared {
        v["shared"] = json!(id);
    }
    match node {
        Tree::Leaf(e) => {
            v["kind"] = json!(e.kind());
            v["summary"] = json!(summary(e));
            v["bytes"] = json!(e.nbytes());
            if let Entry::Array(a) = e {
                v["dtype"] = json!(a.dtype.display());
                v["shape"] = json!(a.shape);
                v["numeric"] = json!(is_numeric(&a.dtype));
            }
        }
        Tree::Ref(id) => {
            v["kind"] = json!("ref");
            v["ref"] = json!(id);
            let target = o.target(*id);
            v["summary"] = json!(match &target {
                Some(p) => format!("ref -> {p}"),
                None => format!("ref #{id}"),
            });
            v["target"] = json!(target);
        }
        t => {
            let sub = o.sub(t);
            v["kind"] = json!(t.container_kind());
            v["children"] = json!(t.children().len());
            v["leaves"] = json!(sub.leaves);
            v["arrays"] = json!(sub.arrays);
            v["bytes"] = json!(sub.bytes);
            if let Tree::Record { type_name, .. } | Tree::Custom { type_name, .. } = t {
                v["type"] = json!(type_name);
            }
        }
    }
}

/// A leaf in a few words, as Python would show a scalar: `1000`, `0.0003`, `nan`, `(1.5-2j)`,
/// `"gelu"`, `bytes (9 B)`; arrays as `float32[512, 256]`.
pub(crate) fn summary(e: &Entry) -> String {
    fn clip(s: &str, n: usize) -> String {
        if s.chars().count() > n {
            format!("{}…", s.chars().take(n).collect::<String>())
        } else {
            s.to_string()
        }
    }
    fn float(f: f64) -> String {
        match float_json(f) {
            Value::String(s) => s,
            v => v.to_string(),
        }
    }
    match e {
        Entry::None => "None".into(),
        Entry::Bool(b) => if *b { "True" } else { "False" }.into(),
        Entry::Int(i) => clip(&i.to_string(), 40),
        Entry::Float(f) => float(*f),
        Entry::Complex(re, im) => format!("({}{}{}j)", float(*re), if *im < 0.0 { "" } else { "+" }, float(*im)),
        Entry::Str(Stored::Inline(s)) => clip(&format!("{s:?}"), 80),
        Entry::Str(Stored::Blob { size, .. }) => format!("str ({size} bytes)"),
        Entry::Bytes(b) => format!("bytes ({} B)", stored_size(b).0),
        e => describe_entry(e),
    }
}

/// Everything the manifest says of the node at `path`: for an array its chunk grid, codecs,
/// chunk hashes, annotation and preview; for a string or bytes where it is stored; for a
/// scalar its value; for any node its Merkle hash (docs/format.md section 9) unless `hashed`
/// is false (the tree list's root row, which needs its counts only: a first paint of a big
/// tree does not wait for the walk its hash is).
pub(crate) fn details(o: &Opened, path: &str, hashed: bool) -> ApiResult<Value> {
    let node = node_at(o, path)?;
    // A subtree's hash is a walk of all of it: the root's is the reader's (computed once),
    // a big subtree's is left to `treepack hash --key` rather than slow every click.
    let hash = if !hashed {
        None
    } else if path.is_empty() {
        Some(o.root_hash())
    } else if o.sub(node).leaves <= HASHED_LEAVES {
        Some(node_hash(node).to_hex())
    } else {
        None
    };
    let mut v = json!({"path": path, "hash": hash});
    describe(o, node, &mut v);
    let inner = node.unshared();
    if let Tree::Custom { type_name, .. } = inner {
        if crate::frame::is_frame(type_name) {
            v["views"] = json!(["frame"]);
        }
    }
    match inner {
        Tree::Custom { data, .. } if !data.is_null() => v["data"] = data.clone(),
        Tree::Leaf(e) => leaf_details(e, &mut v),
        _ => {}
    }
    Ok(v)
}

/// The largest subtree (in leaves) whose hash the details compute.
const HASHED_LEAVES: u64 = 100_000;

/// How many chunk hashes the details list (a leaf may have millions of chunks).
const HASHES_SHOWN: usize = 64;

fn leaf_details(e: &Entry, v: &mut Value) {
    match e {
        Entry::Array(a) => {
            v["dtype_json"] = a.dtype.to_json();
            v["nbytes"] = json!(a.nbytes());
            v["annotation"] = a.annotation.clone().unwrap_or(Value::Null);
            v["preview"] = a.preview.clone().unwrap_or(Value::Null);
            match &a.storage {
                ArrayStorage::Inline(_) => v["storage"] = json!({"inline": true}),
                ArrayStorage::Chunked { chunk_shape, chunks } => {
                    let mut codecs: Vec<&str> = chunks.iter().map(|c| c.codec.name()).collect();
                    codecs.sort_unstable();
                    codecs.dedup();
                    let hashes: Vec<String> = chunks.iter().take(HASHES_SHOWN).map(|c| c.hash.to_hex()).collect();
                    v["storage"] = json!({
                        "inline": false, "chunk_shape": chunk_shape, "grid": a.grid().grid_shape(),
                        "chunks": chunks.len(), "codecs": codecs,
                        "stored_bytes": chunks.iter().map(|c| c.length).sum::<u64>(),
                        "chunk_hashes": hashes,
                    });
                }
            }
            v["views"] = json!(views(a));
        }
        Entry::Str(s) => stored(v, stored_size(s), e),
        Entry::Bytes(b) => stored(v, stored_size(b), e),
        Entry::None => v["value"] = Value::Null,
        Entry::Bool(b) => v["value"] = json!(b),
        Entry::Int(i) => v["value"] = json!(i.to_string()),
        Entry::Float(f) => v["value"] = float_json(*f),
        Entry::Complex(re, im) => v["value"] = json!([float_json(*re), float_json(*im)]),
        Entry::Fragment(_) => {}
    }
}

fn stored(v: &mut Value, (size, inline): (u64, bool), e: &Entry) {
    v["size"] = json!(size);
    v["inline"] = json!(inline);
    if let Some(c) = e.chunks().first() {
        v["storage"] = json!({"codec": c.codec.name(), "stored_bytes": c.length, "chunk_hashes": [c.hash.to_hex()]});
    }
}

/// The views of an array the page offers, best first.
fn views(a: &treepack::format::manifest::ArrayEntry) -> Vec<&'static str> {
    if !is_numeric(&a.dtype) {
        return vec!["table"];
    }
    let mut v = match a.shape.len() {
        0 => vec!["table"],
        1 => vec!["line", "histogram", "table"],
        _ => vec!["heatmap", "histogram", "table"],
    };
    if crate::data::image_like(a) {
        // Bytes of these shapes are most likely pixels, and so are floats all in 0–1 (as the
        // preview's range says) with colour channels: the image first; other floats may be
        // pixels too, after their heatmap.
        let colour = a.shape.last().is_some_and(|&c| c == 3 || c == 4) && a.shape.len() >= 3;
        let unit = |k: &str| a.preview.as_ref().and_then(|p| p.get(k)).and_then(Value::as_f64);
        let in_unit = matches!((unit("min"), unit("max")), (Some(lo), Some(hi)) if lo >= 0.0 && hi <= 1.0);
        let first = a.dtype == treepack::DType::U8 || (colour && in_unit);
        v.insert(usize::from(!first), "image");
    }
    v
}

/// Nodes whose key path `pattern` matches (docs/format.md's globs: `*` within a segment,
/// `**` across segments; a pattern without `/` is looked for at any depth), in document order,
/// at most `limit` of them, and how many match in all.
pub(crate) fn search(o: &Opened, pattern: &str, limit: usize) -> ApiResult<Value> {
    let pattern = pattern.trim();
    if pattern.is_empty() {
        return Err(ApiError::bad("empty search pattern"));
    }
    let effective =
        if pattern.contains('/') || pattern.starts_with("**") { pattern.to_string() } else { format!("**/{pattern}") };
    let glob = Glob::new(&effective)?;
    let mut found = vec![];
    let mut total = 0usize;
    let mut segs: Vec<String> = vec![];
    walk(o.root(), &mut segs, &mut |segs, node| {
        if glob.matches(segs) {
            total += 1;
            if found.len() < limit {
                let path = segs.join("/");
                let mut v =
                    json!({"path": path, "name": segs.last(), "label": segs.last().map(|s| keypath::unescape(s))});
                describe(o, node, &mut v);
                found.push(v);
            }
        }
    });
    Ok(json!({"pattern": effective, "total": total, "matches": found}))
}

/// Every node below the root with its path as segment texts (refs not followed).
fn walk(t: &Tree<Entry>, segs: &mut Vec<String>, f: &mut impl FnMut(&[String], &Tree<Entry>)) {
    for (step, child) in t.children() {
        segs.push(Segment::from_step_pub(&step).text());
        f(segs, child);
        grow(|| walk(child, segs, f));
        segs.pop();
    }
}
