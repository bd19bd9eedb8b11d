//! What differs between two stored trees, from their manifests alone: key paths added, removed
//! or changed, changed dtypes and shapes, and for arrays how many chunks differ — by hash, so
//! no data is read. What `treepack diff` and `treepack.diff` report.

use crate::grid::ChunkGrid;
use crate::keypath;
use crate::manifest::{ArrayEntry, ArrayStorage, Entry, Stored};
use crate::merkle;
use crate::model::{grow, Tree};
use serde_json::{json, Value};

/// One difference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    /// The key path (escaped text, `""` for the root).
    pub path: String,
    /// `+` added in the second tree, `-` removed from it, `~` changed.
    pub op: char,
    /// The first tree's value there, described (`float32[512, 256]`, `3`, `dict (4 items)`).
    pub old: Option<String>,
    /// The second tree's.
    pub new: Option<String>,
    /// For an array whose dtype, shape and chunk grid are unchanged: (chunks that differ,
    /// chunks), compared by hash.
    pub chunks: Option<(u64, u64)>,
}

impl Difference {
    /// As JSON: `{"path", "op", "old", "new", "chunks_differ", "chunks"}` (absent members omitted).
    pub fn to_json(&self) -> Value {
        let mut v = json!({"path": self.path, "op": self.op.to_string()});
        if let Some(o) = &self.old {
            v["old"] = json!(o);
        }
        if let Some(n) = &self.new {
            v["new"] = json!(n);
        }
        if let Some((d, n)) = self.chunks {
            v["chunks_differ"] = json!(d);
            v["chunks"] = json!(n);
        }
        v
    }

    /// One line: `~ params/w: float32[512, 256]: 3 of 16 chunks differ`.
    pub fn line(&self) -> String {
        let p = if self.path.is_empty() { "(root)" } else { &self.path };
        match (self.op, &self.old, &self.new, self.chunks) {
            ('~', Some(o), _, Some((d, n))) => {
                format!("~ {p}: {o}: {d} of {n} chunk{} differ", if n == 1 { "" } else { "s" })
            }
            ('~', Some(o), Some(n), None) => format!("~ {p}: {o} -> {n}"),
            ('+', _, Some(n), _) => format!("+ {p}: {n}"),
            ('-', Some(o), _, _) => format!("- {p}: {o}"),
            (op, o, n, _) => format!("{op} {p}: {} -> {}", o.as_deref().unwrap_or("?"), n.as_deref().unwrap_or("?")),
        }
    }
}

/// The differences between trees `a` and `b`, in document order (`a`'s, then what only `b` has).
pub fn diff(a: &Tree<Entry>, b: &Tree<Entry>) -> Vec<Difference> {
    let mut out = vec![];
    walk(a, b, String::new(), &mut out);
    out
}

fn join(path: &str, seg: &str) -> String {
    if path.is_empty() {
        seg.to_string()
    } else {
        format!("{path}/{seg}")
    }
}

fn changed(path: String, old: String, new: String) -> Difference {
    Difference { path, op: '~', old: Some(old), new: Some(new), chunks: None }
}

/// Compare children matched by name or key text.
fn named<'t>(
    a: impl Iterator<Item = (String, &'t Tree<Entry>)>,
    b: impl Iterator<Item = (String, &'t Tree<Entry>)>,
    path: &str,
    out: &mut Vec<Difference>,
) {
    let b: Vec<(String, &Tree<Entry>)> = b.collect();
    let index: std::collections::HashMap<&str, usize> =
        b.iter().enumerate().map(|(i, (k, _))| (k.as_str(), i)).collect();
    let mut seen = vec![false; b.len()];
    for (k, x) in a {
        let p = join(path, &k);
        match index.get(k.as_str()) {
            Some(&i) => {
                seen[i] = true;
                grow(|| walk(x, b[i].1, p, out));
            }
            None => out.push(Difference { path: p, op: '-', old: Some(describe(x)), new: None, chunks: None }),
        }
    }
    for ((k, y), s) in b.iter().zip(seen) {
        if !s {
            out.push(Difference { path: join(path, k), op: '+', old: None, new: Some(describe(y)), chunks: None });
        }
    }
}

fn indexed(a: &[Tree<Entry>], b: &[Tree<Entry>], path: &str, out: &mut Vec<Difference>) {
    named(
        a.iter().enumerate().map(|(i, x)| (i.to_string(), x)),
        b.iter().enumerate().map(|(i, x)| (i.to_string(), x)),
        path,
        out,
    );
}

fn walk(a: &Tree<Entry>, b: &Tree<Entry>, path: String, out: &mut Vec<Difference>) {
    // A shared object compares as the object; a ref by the id it names.
    let a = if let Tree::Shared { node, .. } = a { node.as_ref() } else { a };
    let b = if let Tree::Shared { node, .. } = b { node.as_ref() } else { b };
    match (a, b) {
        (Tree::Leaf(x), Tree::Leaf(y)) => leaf(x, y, path, out),
        (Tree::List(x), Tree::List(y)) | (Tree::Tuple(x), Tree::Tuple(y)) => indexed(x, y, &path, out),
        (Tree::Dict(x), Tree::Dict(y)) => named(
            x.iter().map(|(k, v)| (keypath::Segment::Key(k.clone()).text(), v)),
            y.iter().map(|(k, v)| (keypath::Segment::Key(k.clone()).text(), v)),
            &path,
            out,
        ),
        (Tree::Record { type_name: t, fields: x }, Tree::Record { type_name: u, fields: y }) if t == u => named(
            x.iter().map(|(k, v)| (keypath::Segment::Name(k.clone()).text(), v)),
            y.iter().map(|(k, v)| (keypath::Segment::Name(k.clone()).text(), v)),
            &path,
            out,
        ),
        (Tree::Custom { type_name: t, data: d, children: x }, Tree::Custom { type_name: u, data: e, children: y })
            if t == u =>
        {
            if d != e {
                out.push(changed(path.clone(), format!("{t} data {d}"), format!("{u} data {e}")));
            }
            named(
                x.iter().map(|(k, v)| (keypath::Segment::Name(k.clone()).text(), v)),
                y.iter().map(|(k, v)| (keypath::Segment::Name(k.clone()).text(), v)),
                &path,
                out,
            )
        }
        (Tree::Ref(i), Tree::Ref(j)) if i == j => {}
        _ => out.push(changed(path, describe(a), describe(b))),
    }
}

fn leaf(a: &Entry, b: &Entry, path: String, out: &mut Vec<Difference>) {
    if let (Entry::Array(x), Entry::Array(y)) = (a, b) {
        return array(x, y, path, out);
    }
    // Everything else: equal when its canonical encoding (section 9) is.
    let enc = |e: &Entry| {
        let mut s = String::new();
        merkle::canonical(&mut s, &Tree::Leaf(e.clone()));
        s
    };
    if enc(a) != enc(b) {
        out.push(changed(path, describe_entry(a), describe_entry(b)));
    }
}

/// The chunk hashes of an array on its grid (an inline array is one chunk of the whole).
fn chunk_hashes(a: &ArrayEntry) -> Vec<crate::hash::Hash32> {
    match &a.storage {
        ArrayStorage::Chunked { chunks, .. } => chunks.iter().map(|c| c.hash).collect(),
        ArrayStorage::Inline(d) if a.grid().num_chunks() == Some(1) => vec![crate::hash::Hash32::of(d)],
        ArrayStorage::Inline(_) => vec![],
    }
}

fn array(a: &ArrayEntry, b: &ArrayEntry, path: String, out: &mut Vec<Difference>) {
    let (da, db) = (describe_array(a), describe_array(b));
    if a.dtype != b.dtype || a.shape != b.shape {
        return out.push(changed(path, da, db));
    }
    if a.annotation != b.annotation {
        let show = |x: &ArrayEntry| x.annotation.as_ref().map_or("plain array".to_string(), |v| format!("as {v}"));
        out.push(changed(path.clone(), format!("{da} {}", show(a)), format!("{db} {}", show(b))));
    }
    let (ga, gb): (ChunkGrid, ChunkGrid) = (a.grid(), b.grid());
    if ga.chunk_shape != gb.chunk_shape {
        // Not comparable chunk by chunk: equal only if every byte is, which would need a read.
        return out.push(changed(
            path,
            format!("{da} on {:?} chunks", ga.chunk_shape),
            format!("{db} on {:?} chunks (values not compared)", gb.chunk_shape),
        ));
    }
    let (ha, hb) = (chunk_hashes(a), chunk_hashes(b));
    let differ = ha.iter().zip(&hb).filter(|(x, y)| x != y).count() as u64;
    if differ > 0 {
        out.push(Difference { path, op: '~', old: Some(da), new: Some(db), chunks: Some((differ, ha.len() as u64)) });
    }
}

fn describe_array(a: &ArrayEntry) -> String {
    let dims: Vec<String> = a.shape.iter().map(u64::to_string).collect();
    format!("{}[{}]", a.dtype.display(), dims.join(", "))
}

/// A short description of a leaf: its value when short, else its kind and size.
pub fn describe_entry(e: &Entry) -> String {
    const SHORT: usize = 40;
    match e {
        Entry::Array(a) => describe_array(a),
        Entry::Str(Stored::Inline(s)) if s.chars().count() <= SHORT => format!("{s:?}"),
        Entry::Str(s) => format!(
            "str ({} bytes)",
            match s {
                Stored::Inline(v) => v.len() as u64,
                Stored::Blob { size, .. } => *size,
            }
        ),
        Entry::Bytes(b) => format!(
            "bytes ({} bytes)",
            match b {
                Stored::Inline(v) => v.len() as u64,
                Stored::Blob { size, .. } => *size,
            }
        ),
        other => {
            let mut s = String::new();
            merkle::canonical(&mut s, &Tree::Leaf(other.clone()));
            s
        }
    }
}

/// A short description of any node.
pub fn describe(t: &Tree<Entry>) -> String {
    match t {
        Tree::Leaf(e) => describe_entry(e),
        Tree::List(v) => format!("list ({} items)", v.len()),
        Tree::Tuple(v) => format!("tuple ({} items)", v.len()),
        Tree::Dict(v) => format!("dict ({} items)", v.len()),
        Tree::Record { type_name, .. } => format!("record {type_name}"),
        Tree::Custom { type_name, .. } => type_name.clone(),
        Tree::Shared { node, .. } => describe(node),
        Tree::Ref(id) => format!("ref to shared object {id}"),
    }
}
