//! Writing a manifest: `encode` (deterministic JSON, fast paths for the common nodes) and `seal` (the hash trailer).

use super::text::{
    write_blob, write_chunk, write_dtype, write_key, write_named, write_pair, write_scalar, write_seq, write_str,
    write_u64s, write_value, Order,
};
use super::types::{ArrayStorage, Entry, Manifest, Stored, FORMAT_NAME, HASH_PREFIX, HASH_SUFFIX, HASH_TRAILER_LEN};
use crate::hash::Hash32;
use crate::model::{Key, Tree};
use base64::Engine;
use bytes::Bytes;
use serde_json::Value;
use std::fmt::Write as _;

/// Serialise a manifest to its exact on-storage bytes (including the trailing hash member).
pub fn encode(m: &Manifest, stats: &Value) -> Vec<u8> {
    let parts = encode_parts(m, stats);
    if parts.len() == 1 {
        return parts.into_iter().next().map(Vec::from).unwrap_or_default();
    }
    parts.concat()
}

/// [`encode`] as the parts to write one after the other: a tree that is one [`Fragment`](super::Fragment) (a
/// tree of plain values the caller's walk wrote as text) is not copied into the manifest, but
/// written from the fragment's own buffer (megabytes for a big tree of plain values).
pub fn encode_parts(m: &Manifest, stats: &Value) -> Vec<Bytes> {
    let Tree::Leaf(Entry::Fragment(root)) = &m.root else { return vec![Bytes::from(encode_one(m, stats))] };
    let mut head = String::with_capacity(4096);
    write_head(&mut head, m, stats);
    let body = root.bytes();
    let mut h = blake3::Hasher::new();
    h.update(head.as_bytes());
    // As `Hash32::of`: a big text is hashed on every core.
    if body.len() < 1 << 20
        || crate::exec::parallel(|| {
            h.update_rayon(&body);
        })
        .is_none()
    {
        h.update(&body);
    }
    let mut tail = String::with_capacity(HASH_TRAILER_LEN);
    tail.push_str(HASH_PREFIX);
    tail.push_str(&Hash32(*h.finalize().as_bytes()).to_hex());
    tail.push_str(HASH_SUFFIX);
    vec![Bytes::from(head), body, Bytes::from(tail)]
}

fn encode_one(m: &Manifest, stats: &Value) -> Vec<u8> {
    // Room for ~256 bytes a leaf up front: the buffer never moves while it grows (growing by
    // doubling touches several times the manifest's size in fresh pages), and reserved pages
    // that are never written cost nothing.
    let leaves = stats.get("leaves").and_then(Value::as_u64).unwrap_or(0).min(1 << 22) as usize;
    let mut s = String::with_capacity(4096 + leaves * 256);
    write_head(&mut s, m, stats);
    write_node(&mut s, &m.root);
    let hash = Hash32::of(s.as_bytes()).to_hex();
    s.push_str(HASH_PREFIX);
    s.push_str(&hash);
    s.push_str(HASH_SUFFIX);
    s.into_bytes()
}

/// Every member before the root's node, up to `"root":`.
fn write_head(s: &mut String, m: &Manifest, stats: &Value) {
    let _ = write!(s, "{{\"format\":\"{FORMAT_NAME}\",\"version\":[{},{}],\n\"writer\":", m.version.0, m.version.1);
    write_str(s, &m.writer);
    if let Some(md) = &m.metadata {
        s.push_str(",\n\"metadata\":");
        s.push_str(&md.to_string());
    }
    s.push_str(",\n\"stats\":");
    s.push_str(&stats.to_string());
    s.push_str(",\n\"packs\":[");
    for (i, p) in m.packs.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str("{\"path\":");
        write_str(s, &p.path);
        let _ = write!(s, ",\"size\":{}}}", p.size);
    }
    s.push_str("],\n\"root\":");
}

/// Whether a dict is written as a JSON object (format 1.4): every key a string, the first not
/// `"t"` (an object whose first member is `t` is a tagged node). Other dicts keep the `items`
/// form. Objects are smaller than `[key, value]` pairs and parse faster.
pub fn object_form<V>(pairs: &[(Key, V)]) -> bool {
    pairs.first().is_none_or(|(k, _)| !matches!(k, Key::Str(s) if s == "t"))
        && pairs.iter().all(|(k, _)| matches!(k, Key::Str(_)))
}

/// Whether a tree holds a dict written as an object, which only format 1.4 readers read.
pub fn has_object_dicts(t: &Tree<Entry>) -> bool {
    match t {
        Tree::Leaf(Entry::Fragment(f)) => f.has_dicts(),
        Tree::Leaf(_) | Tree::Ref(_) => false,
        _ => crate::model::grow(|| match t {
            Tree::Dict(v) => object_form(v) || v.iter().any(|(_, c)| has_object_dicts(c)),
            Tree::List(v) | Tree::Tuple(v) => v.iter().any(has_object_dicts),
            Tree::Record { fields: v, .. } | Tree::Custom { children: v, .. } => {
                v.iter().any(|(_, c)| has_object_dicts(c))
            }
            Tree::Shared { node, .. } => has_object_dicts(node),
            Tree::Leaf(_) | Tree::Ref(_) => false,
        }),
    }
}

/// A node of the manifest's tree; a fragment is its text.
pub(super) fn write_node(s: &mut String, t: &Tree<Entry>) {
    match t {
        // Leaves recurse no further: no stack check for most nodes.
        Tree::Leaf(e) => write_entry(s, e),
        _ => crate::model::grow(|| write_node_inner(s, t)),
    }
}

fn write_node_inner(s: &mut String, t: &Tree<Entry>) {
    const ORDER: Order = Order::Manifest;
    match t {
        Tree::Leaf(e) => write_entry(s, e),
        Tree::Shared { id, node } => {
            ORDER.shared_begin(s, *id);
            write_node(s, node);
            s.push('}');
        }
        Tree::Ref(id) => ORDER.reference(s, *id),
        Tree::List(v) => write_seq(s, "[", v, "]", write_node),
        Tree::Tuple(v) => write_seq(s, ORDER.tuple_begin(), v, ORDER.tuple_end(), write_node),
        Tree::Dict(v) if object_form(v) => write_seq(s, "{", v, "}", |s, (k, c)| {
            if let Key::Str(k) = k {
                write_str(s, k);
            }
            s.push(':');
            write_node(s, c);
        }),
        Tree::Dict(v) => write_seq(s, ORDER.dict_begin(), v, ORDER.dict_end(), |s, (k, c)| {
            write_pair(s, |s| write_key(s, k, ORDER), |s| write_node(s, c));
        }),
        Tree::Record { type_name, fields } => {
            s.push_str("{\"t\":\"record\",\"type\":");
            write_str(s, type_name);
            s.push_str(",\"fields\":");
            write_named(s, fields, write_node);
            s.push('}');
        }
        Tree::Custom { type_name, data, children } => {
            s.push_str("{\"t\":\"custom\",\"type\":");
            write_str(s, type_name);
            if !data.is_null() {
                s.push_str(",\"data\":");
                write_value(s, data, ORDER);
            }
            if !children.is_empty() {
                s.push_str(",\"children\":");
                write_named(s, children, write_node);
            }
            s.push('}');
        }
    }
}

/// A leaf of the manifest's tree.
fn write_entry(s: &mut String, e: &Entry) {
    let b64 = &base64::engine::general_purpose::STANDARD;
    match e {
        Entry::None | Entry::Bool(_) | Entry::Int(_) | Entry::Float(_) | Entry::Complex(..) => {
            write_scalar(s, e);
        }
        Entry::Str(Stored::Inline(v)) => write_str(s, v),
        Entry::Fragment(f) => s.push_str(f.text()),
        Entry::Str(Stored::Blob { size, chunk }) => write_blob(s, "str", *size, chunk),
        Entry::Bytes(Stored::Inline(v)) => {
            s.push_str("{\"t\":\"bytes\",\"b64\":\"");
            s.push_str(&b64.encode(v));
            s.push_str("\"}");
        }
        Entry::Bytes(Stored::Blob { size, chunk }) => write_blob(s, "bytes", *size, chunk),
        Entry::Array(a) => {
            s.push_str("{\"t\":\"array\",\"dtype\":");
            write_dtype(s, &a.dtype, Order::Manifest);
            s.push_str(",\"shape\":");
            write_u64s(s, &a.shape);
            if let Some(v) = &a.annotation {
                s.push_str(",\"as\":");
                write_value(s, v, Order::Manifest);
            }
            match &a.storage {
                ArrayStorage::Inline(data) => {
                    s.push_str(",\"data\":\"");
                    s.push_str(&b64.encode(data));
                    s.push('"');
                }
                ArrayStorage::Chunked { chunk_shape, chunks } => {
                    s.push_str(",\"chunk_shape\":");
                    write_u64s(s, chunk_shape);
                    write_seq(s, ",\"chunks\":[", chunks, "]", write_chunk);
                }
            }
            if let Some(p) = &a.preview {
                s.push_str(",\"preview\":");
                write_value(s, p, Order::Manifest);
            }
            s.push('}');
        }
    }
}

/// Append the `manifest_hash` trailer to a manifest body (everything up to, not including, the
/// final `,\n"manifest_hash":…` member). Used by the writer, by tests that craft manifests, and
/// by other implementations as the reference for the checksum rule.
pub fn seal(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + HASH_TRAILER_LEN);
    out.extend_from_slice(body);
    out.extend_from_slice(HASH_PREFIX.as_bytes());
    out.extend_from_slice(Hash32::of(body).to_hex().as_bytes());
    out.extend_from_slice(HASH_SUFFIX.as_bytes());
    out
}
