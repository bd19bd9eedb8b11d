//! The root hash: a Merkle hash over a tree's canonical encoding (docs/format.md section 9).
//!
//! Computed from a manifest alone — leaf data enters through the chunk hashes the manifest
//! already holds — so it is the same for a tree stored as a directory, a `.tpk`, in a
//! repository, compressed or not, and it costs no read of array data. Every container is hashed
//! on its own (its children as their hashes), so two trees that share a subtree share that
//! subtree's hash, and a diff can skip equal subtrees without looking inside.

use crate::hash::Hash32;
use crate::manifest::text::{
    write_dtype, write_key, write_named, write_pair, write_scalar, write_seq, write_str, write_u64s, write_value, Order,
};
use crate::manifest::{ArrayStorage, Entry, Fragment, Stored};
use crate::model::{grow, Tree};
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
/// [`node_hash`] (a child that is a leaf is written in place). Written by the manifest's own
/// canonical writer (`manifest/text.rs`) with its members sorted.
pub fn canonical(s: &mut String, t: &Tree<Entry>) {
    match t {
        Tree::Leaf(e) => leaf(s, e),
        Tree::List(items) => write_seq(s, "[", items, "]", child),
        Tree::Tuple(items) => write_seq(s, ORDER.tuple_begin(), items, ORDER.tuple_end(), child),
        Tree::Dict(items) => write_seq(s, ORDER.dict_begin(), items, ORDER.dict_end(), |s, (k, v)| {
            write_pair(s, |s| write_key(s, k, ORDER), |s| child(s, v));
        }),
        Tree::Record { type_name, fields } => {
            s.push_str("{\"fields\":");
            write_named(s, fields, child);
            s.push_str(",\"t\":\"record\",\"type\":");
            write_str(s, type_name);
            s.push('}');
        }
        Tree::Custom { type_name, data, children } => {
            s.push('{');
            if !children.is_empty() {
                s.push_str("\"children\":");
                write_named(s, children, child);
                s.push(',');
            }
            if !data.is_null() {
                s.push_str("\"data\":");
                value(s, data);
                s.push(',');
            }
            s.push_str("\"t\":\"custom\",\"type\":");
            write_str(s, type_name);
            s.push('}');
        }
        Tree::Shared { id, node } => {
            ORDER.shared_begin(s, *id);
            child(s, node);
            s.push('}');
        }
        Tree::Ref(id) => ORDER.reference(s, *id),
    }
}

/// A fragment, hashed as the nodes it stands for (parsed here: a repository save of a tree of
/// plain values hashes it this way); `in_place` writes a node in place (the fragment is the
/// node hashed) or as a child. Text that does not parse, which a fragment writer never makes,
/// is hashed as the text.
fn fragment(s: &mut String, f: &Fragment, in_place: bool) {
    match f.parse() {
        Ok(t) if in_place => canonical(s, &t),
        Ok(t) => child(s, &t),
        Err(_) => content(s, "fragment", f.text().len() as u64, &Hash32::of(f.text().as_bytes())),
    }
}

/// A child in its parent's encoding: a leaf in place, a container by its hash.
fn child(s: &mut String, t: &Tree<Entry>) {
    match t {
        Tree::Leaf(Entry::Fragment(f)) => fragment(s, f, false),
        Tree::Leaf(e) => leaf(s, e),
        Tree::Ref(_) => canonical(s, t),
        _ => {
            let h = grow(|| node_hash(t));
            quoted_hash(s, &h);
        }
    }
}

fn quoted_hash(s: &mut String, h: &Hash32) {
    s.push('"');
    h.push_hex(s);
    s.push('"');
}

fn content(s: &mut String, kind: &str, size: u64, hash: &Hash32) {
    s.push_str("{\"blake3\":\"");
    hash.push_hex(s);
    let _ = write!(s, "\",\"size\":{size},\"t\":\"{kind}\"}}");
}

fn leaf(s: &mut String, e: &Entry) {
    match e {
        Entry::None | Entry::Bool(_) | Entry::Int(_) | Entry::Float(_) | Entry::Complex(..) => {
            write_scalar(s, e);
        }
        Entry::Str(Stored::Inline(v)) => content(s, "str", v.len() as u64, &Hash32::of(v.as_bytes())),
        Entry::Bytes(Stored::Inline(v)) => content(s, "bytes", v.len() as u64, &Hash32::of(v)),
        Entry::Fragment(f) => fragment(s, f, true),
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
            write_u64s(s, &grid.chunk_shape);
            match &a.storage {
                ArrayStorage::Chunked { chunks, .. } => {
                    write_seq(s, ",\"chunks\":[", chunks, "]", |s, c| quoted_hash(s, &c.hash));
                }
                // Inline bytes count as the one chunk of a grid whose chunk is the whole array
                // (none for an empty array), as the default chunking stores a small array.
                ArrayStorage::Inline(data) => {
                    let one = (grid.num_chunks() == Some(1)).then(|| Hash32::of(data));
                    write_seq(s, ",\"chunks\":[", one.iter(), "]", quoted_hash);
                }
            }
            s.push_str(",\"dtype\":");
            write_dtype(s, &a.dtype, ORDER);
            s.push_str(",\"shape\":");
            write_u64s(s, &a.shape);
            s.push_str(",\"t\":\"array\"}");
        }
    }
}

/// The member order of the root hash's encoding.
const ORDER: Order = Order::Sorted;

/// Canonical JSON of any value (custom data, annotations, struct dtypes): members sorted by key
/// (UTF-8 bytes), strings escaped as in the manifest, integers in decimal, other numbers as
/// Ryu prints them.
pub fn value(s: &mut String, v: &Value) {
    write_value(s, v, ORDER);
}
