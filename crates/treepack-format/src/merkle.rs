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
use rayon::prelude::*;
use serde_json::Value;
use std::fmt::Write as _;

/// A container with this many children or more hashes its container children on the installed
/// pool ([`crate::exec`]), each on its own, then writes its encoding in order from their hashes:
/// the result is the same, only where the children's hashes are computed changes. A 100k-leaf
/// tree's root took ~31 ms on one thread (a signature check is mostly this; bench/RESULTS.md,
/// "Signatures"). Below it, the children are hashed as they are written (no list, no pool).
const PARALLEL_CHILDREN: usize = 512;

/// The hashes of `kids`' container children (`None` for leaves and refs, written in place),
/// computed on the installed pool when there are [`PARALLEL_CHILDREN`] or more of them; `None`
/// when there are fewer, or no pool to compute them on.
fn pre_hashed<'a, K: Sync + 'a>(
    kids: &'a [K],
    node_of: impl Fn(&'a K) -> &'a Tree<Entry> + Sync,
) -> Option<std::vec::IntoIter<Option<Hash32>>> {
    if kids.len() < PARALLEL_CHILDREN || crate::exec::threads() < 2 {
        return None;
    }
    let hashes: Vec<Option<Hash32>> = crate::exec::parallel(|| {
        kids.par_iter()
            .map(|k| match node_of(k) {
                Tree::Leaf(_) | Tree::Ref(_) => None,
                t => Some(grow(|| node_hash(t))),
            })
            .collect()
    })?;
    Some(hashes.into_iter())
}

/// [`child`], or the child's hash when [`pre_hashed`] computed it.
fn child_from(s: &mut String, t: &Tree<Entry>, pre: &mut Option<std::vec::IntoIter<Option<Hash32>>>) {
    match pre.as_mut().and_then(Iterator::next).flatten() {
        Some(h) => quoted_hash(s, &h),
        None => child(s, t),
    }
}

/// The root hash of a tree: [`node_hash`] of its root node.
pub fn root_hash(root: &Tree<Entry>) -> Hash32 {
    node_hash(root)
}

/// BLAKE3 of a node's canonical encoding ([`canonical`]).
pub fn node_hash(t: &Tree<Entry>) -> Hash32 {
    // Room for a small container's encoding at once (growing from empty took ~7 reallocations).
    let mut s = String::with_capacity(256);
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
        Tree::List(items) => {
            let mut pre = pre_hashed(items, |t| t);
            write_seq(s, "[", items, "]", |s, t| child_from(s, t, &mut pre));
        }
        Tree::Tuple(items) => {
            let mut pre = pre_hashed(items, |t| t);
            write_seq(s, ORDER.tuple_begin(), items, ORDER.tuple_end(), |s, t| child_from(s, t, &mut pre));
        }
        Tree::Dict(items) => {
            let mut pre = pre_hashed(items, |(_, v)| v);
            write_seq(s, ORDER.dict_begin(), items, ORDER.dict_end(), |s, (k, v)| {
                write_pair(s, |s| write_key(s, k, ORDER), |s| child_from(s, v, &mut pre));
            })
        }
        Tree::Record { type_name, fields } => {
            s.push_str("{\"fields\":");
            let mut pre = pre_hashed(fields, |(_, v)| v);
            write_named(s, fields, |s, t| child_from(s, t, &mut pre));
            s.push_str(",\"t\":\"record\",\"type\":");
            write_str(s, type_name);
            s.push('}');
        }
        Tree::Custom { type_name, data, children } => {
            s.push('{');
            if !children.is_empty() {
                s.push_str("\"children\":");
                let mut pre = pre_hashed(children, |(_, v)| v);
                write_named(s, children, |s, t| child_from(s, t, &mut pre));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Int;

    /// A container of many children is hashed with its container children computed on the pool
    /// ([`PARALLEL_CHILDREN`]): the result is the encoding written from each child's own hash,
    /// leaves in place, in order — what one thread computes.
    #[test]
    fn big_containers_hash_their_children_in_parallel_to_the_same_root() {
        crate::exec::testing::install();
        let small = |i: i64| Tree::List(vec![Tree::Leaf(Entry::Int(Int::Small(i))), Tree::List(vec![])]);
        let items: Vec<Tree<Entry>> =
            (0..2000).map(|i| if i % 3 == 0 { Tree::Leaf(Entry::Int(Int::Small(i))) } else { small(i) }).collect();
        let mut want = String::from("[");
        for (i, t) in items.iter().enumerate() {
            if i > 0 {
                want.push(',');
            }
            match t {
                Tree::Leaf(_) => want.push_str(&i.to_string()),
                t => {
                    want.push('"');
                    node_hash(t).push_hex(&mut want);
                    want.push('"');
                }
            }
        }
        want.push(']');
        let list = Tree::List(items);
        assert_eq!(root_hash(&list), Hash32(*blake3::hash(want.as_bytes()).as_bytes()));
        // The same children under a dict and a record: one hash each way, whatever the pool.
        let Tree::List(items) = list else { unreachable!() };
        let fields: Vec<(String, Tree<Entry>)> =
            items.into_iter().enumerate().map(|(i, t)| (format!("f{i}"), t)).collect();
        let rec = Tree::Record { type_name: "R".into(), fields: fields.clone() };
        let seq: String = {
            let mut s = String::from("{\"fields\":[");
            for (i, (k, t)) in fields.iter().enumerate() {
                if i > 0 {
                    s.push(',');
                }
                s.push_str(&format!("[\"{k}\","));
                child(&mut s, t);
                s.push(']');
            }
            s.push_str("],\"t\":\"record\",\"type\":\"R\"}");
            s
        };
        assert_eq!(root_hash(&rec), Hash32(*blake3::hash(seq.as_bytes()).as_bytes()));
    }
}
