//! The root hash: a Merkle hash over a tree's canonical encoding (docs/format.md section 9).
//!
//! Computed from a manifest alone — leaf data enters through the chunk hashes the manifest
//! already holds — so it is the same for a tree stored as a directory, a `.tpk`, in a
//! repository, compressed or not, and it costs no read of array data. Every container is hashed
//! on its own (its children as their hashes), so two trees that share a subtree share that
//! subtree's hash, and a diff can skip equal subtrees without looking inside.

use crate::hash::Hash32;
use crate::manifest::{ArrayStorage, Entry, Stored};
use crate::model::{grow, Int, Key, Tree};
use serde_json::Value;
use std::fmt::Write as _;

/// The root hash of a tree: [`node_hash`] of its root node.
pub fn root_hash(root: &Tree<Entry>) -> Hash32 {
    node_hash(root)
}

/// BLAKE3 of a node's canonical encoding ([`canonical`]).
pub fn node_hash(t: &Tree<Entry>) -> Hash32 {
    let mut s = String::new();
    canonical(&mut s, t);
    Hash32(*blake3::hash(s.as_bytes()).as_bytes())
}

/// Append the canonical encoding of one node to `s`: JSON with every object's members in
/// sorted key order and no whitespace, leaves written out (strings, bytes and array data as
/// their BLAKE3 and size), and each child container as the 64 hex digits of its own
/// [`node_hash`] (a child that is a leaf is written in place).
pub fn canonical(s: &mut String, t: &Tree<Entry>) {
    match t {
        Tree::Leaf(Entry::Fragment(f)) => match f.parse() {
            Ok(t) => canonical(s, &t),
            Err(_) => unparsed(s, f),
        },
        Tree::Leaf(e) => leaf(s, e),
        Tree::List(items) => {
            s.push('[');
            children(s, items.iter());
            s.push(']');
        }
        Tree::Tuple(items) => {
            s.push_str("{\"items\":[");
            children(s, items.iter());
            s.push_str("],\"t\":\"tuple\"}");
        }
        Tree::Dict(items) => {
            s.push_str("{\"items\":[");
            for (i, (k, v)) in items.iter().enumerate() {
                if i > 0 {
                    s.push(',');
                }
                s.push('[');
                key(s, k);
                s.push(',');
                child(s, v);
                s.push(']');
            }
            s.push_str("],\"t\":\"dict\"}");
        }
        Tree::Record { type_name, fields } => {
            s.push_str("{\"fields\":");
            named(s, fields);
            s.push_str(",\"t\":\"record\",\"type\":");
            string(s, type_name);
            s.push('}');
        }
        Tree::Custom { type_name, data, children } => {
            s.push('{');
            if !children.is_empty() {
                s.push_str("\"children\":");
                named(s, children);
                s.push(',');
            }
            if !data.is_null() {
                s.push_str("\"data\":");
                value(s, data);
                s.push(',');
            }
            s.push_str("\"t\":\"custom\",\"type\":");
            string(s, type_name);
            s.push('}');
        }
        Tree::Shared { id, node } => {
            let _ = write!(s, "{{\"id\":{id},\"t\":\"shared\",\"v\":");
            child(s, node);
            s.push('}');
        }
        Tree::Ref(id) => {
            let _ = write!(s, "{{\"id\":{id},\"t\":\"ref\"}}");
        }
    }
}

/// A child in its parent's encoding: a leaf in place, a container by its hash.
/// A fragment is hashed as the nodes it stands for (parsed here: a repository save of a tree
/// of plain values hashes it this way). Text that does not parse, which a fragment writer
/// never makes, is hashed as the text.
fn unparsed(s: &mut String, f: &crate::manifest::Fragment) {
    content(s, "fragment", f.text().len() as u64, &Hash32::of(f.text().as_bytes()));
}

fn child(s: &mut String, t: &Tree<Entry>) {
    match t {
        Tree::Leaf(Entry::Fragment(f)) => match f.parse() {
            Ok(t) => child(s, &t),
            Err(_) => unparsed(s, f),
        },
        Tree::Leaf(e) => leaf(s, e),
        Tree::Ref(_) => canonical(s, t),
        _ => {
            let h = grow(|| node_hash(t));
            s.push('"');
            h.push_hex(s);
            s.push('"');
        }
    }
}

fn children<'a>(s: &mut String, items: impl Iterator<Item = &'a Tree<Entry>>) {
    for (i, c) in items.enumerate() {
        if i > 0 {
            s.push(',');
        }
        child(s, c);
    }
}

fn named(s: &mut String, items: &[(String, Tree<Entry>)]) {
    s.push('[');
    for (i, (k, v)) in items.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push('[');
        string(s, k);
        s.push(',');
        child(s, v);
        s.push(']');
    }
    s.push(']');
}

fn content(s: &mut String, kind: &str, size: u64, hash: &Hash32) {
    s.push_str("{\"blake3\":\"");
    hash.push_hex(s);
    let _ = write!(s, "\",\"size\":{size},\"t\":\"{kind}\"}}");
}

fn leaf(s: &mut String, e: &Entry) {
    match e {
        Entry::None => s.push_str("null"),
        Entry::Bool(b) => s.push_str(if *b { "true" } else { "false" }),
        Entry::Int(i) => int(s, i),
        Entry::Float(f) => float_node(s, *f),
        Entry::Complex(re, im) => {
            s.push_str("{\"t\":\"complex\",\"v\":[");
            float(s, *re);
            s.push(',');
            float(s, *im);
            s.push_str("]}");
        }
        Entry::Str(Stored::Inline(v)) => content(s, "str", v.len() as u64, &Hash32::of(v.as_bytes())),
        Entry::Bytes(Stored::Inline(v)) => content(s, "bytes", v.len() as u64, &Hash32::of(v)),
        Entry::Fragment(f) => match f.parse() {
            Ok(t) => canonical(s, &t),
            Err(_) => unparsed(s, f),
        },
        Entry::Str(Stored::Blob { size, chunk }) => content(s, "str", *size, &chunk.hash),
        Entry::Bytes(Stored::Blob { size, chunk }) => content(s, "bytes", *size, &chunk.hash),
        Entry::Array(a) => {
            s.push('{');
            if let Some(v) = &a.annotation {
                s.push_str("\"as\":");
                value(s, v);
                s.push(',');
            }
            let grid = a.grid();
            s.push_str("\"chunk_shape\":");
            u64s(s, &grid.chunk_shape);
            s.push_str(",\"chunks\":[");
            match &a.storage {
                ArrayStorage::Chunked { chunks, .. } => {
                    for (i, c) in chunks.iter().enumerate() {
                        if i > 0 {
                            s.push(',');
                        }
                        s.push('"');
                        c.hash.push_hex(s);
                        s.push('"');
                    }
                }
                // Inline bytes count as the one chunk of a grid whose chunk is the whole array
                // (none for an empty array), as the default chunking stores a small array.
                ArrayStorage::Inline(data) => {
                    if grid.num_chunks() == Some(1) {
                        s.push('"');
                        Hash32::of(data).push_hex(s);
                        s.push('"');
                    }
                }
            }
            s.push_str("],\"dtype\":");
            value(s, &a.dtype.to_json());
            s.push_str(",\"shape\":");
            u64s(s, &a.shape);
            s.push_str(",\"t\":\"array\"}");
        }
    }
}

fn key(s: &mut String, k: &Key) {
    match k {
        Key::None => s.push_str("null"),
        Key::Bool(b) => s.push_str(if *b { "true" } else { "false" }),
        Key::Int(i) => int(s, i),
        Key::Float(f) => float_node(s, *f),
        Key::Str(v) => string(s, v),
        Key::Tuple(items) => {
            s.push_str("{\"items\":[");
            for (i, k) in items.iter().enumerate() {
                if i > 0 {
                    s.push(',');
                }
                key(s, k);
            }
            s.push_str("],\"t\":\"tuple\"}");
        }
    }
}

fn int(s: &mut String, i: &Int) {
    match i {
        Int::Small(v) => s.push_str(itoa::Buffer::new().format(*v)),
        Int::Big(b) => {
            let _ = write!(s, "{{\"t\":\"int\",\"v\":\"{b}\"}}");
        }
    }
}

/// A float where a node stands: a number when finite, else the tagged form.
fn float_node(s: &mut String, f: f64) {
    if f.is_finite() {
        float(s, f);
    } else {
        s.push_str("{\"t\":\"float\",\"v\":");
        float(s, f);
        s.push('}');
    }
}

/// As the manifest writes floats: shortest round-trip (Ryu), or the non-finite text.
fn float(s: &mut String, f: f64) {
    crate::manifest::write_float(s, f);
}

fn u64s(s: &mut String, v: &[u64]) {
    s.push('[');
    for (i, x) in v.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(itoa::Buffer::new().format(*x));
    }
    s.push(']');
}

fn string(s: &mut String, v: &str) {
    crate::manifest::write_str(s, v);
}

/// Canonical JSON of any value (custom data, annotations, struct dtypes): members sorted by key
/// (UTF-8 bytes), strings escaped as in the manifest, integers in decimal, other numbers as
/// Ryu prints them.
pub fn value(s: &mut String, v: &Value) {
    match v {
        Value::Null => s.push_str("null"),
        Value::Bool(b) => s.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                s.push_str(itoa::Buffer::new().format(i));
            } else if let Some(u) = n.as_u64() {
                s.push_str(itoa::Buffer::new().format(u));
            } else {
                float(s, n.as_f64().unwrap_or(f64::NAN));
            }
        }
        Value::String(v) => string(s, v),
        Value::Array(items) => {
            s.push('[');
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    s.push(',');
                }
                grow(|| value(s, x));
            }
            s.push(']');
        }
        Value::Object(m) => {
            let mut members: Vec<(&String, &Value)> = m.iter().collect();
            members.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            s.push('{');
            for (i, (k, x)) in members.into_iter().enumerate() {
                if i > 0 {
                    s.push(',');
                }
                string(s, k);
                s.push(':');
                grow(|| value(s, x));
            }
            s.push('}');
        }
    }
}
