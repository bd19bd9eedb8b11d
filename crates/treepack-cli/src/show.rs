//! Human-readable rendering: sizes, leaf summaries, numpy-style arrays.

use serde_json::Value;
use treepack::format::manifest::{ArrayStorage, Entry, Stored};
use treepack::{ArrayData, DType, Leaf, Node, Tree};

/// Sizes as people read them (`1.5 MiB`): the viewer's wording, one implementation.
pub use treepack_view::html::human_bytes;

fn shape_text(shape: &[u64]) -> String {
    format!("[{}]", shape.iter().map(u64::to_string).collect::<Vec<_>>().join(", "))
}

fn clip(s: &str, n: usize) -> String {
    if s.chars().count() > n {
        format!("{}…", s.chars().take(n).collect::<String>())
    } else {
        s.to_string()
    }
}

fn json_val(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}

/// One-line summary of a stored leaf.
/// `  zstd 3.10x` for compressed chunks (the codecs used, and canonical / stored bytes);
/// nothing when every chunk is raw.
pub fn codec_summary(chunks: &[treepack::format::manifest::ChunkRef], nbytes: u64) -> String {
    if chunks.iter().all(|c| c.codec.is_identity()) {
        return String::new();
    }
    let mut names: Vec<&str> = chunks.iter().map(|c| c.codec.name()).collect();
    names.sort_unstable();
    names.dedup();
    let stored: u64 = chunks.iter().map(|c| c.length).sum();
    format!("  {} {}", names.join("/"), ratio(nbytes, stored))
}

/// Canonical over stored bytes, as `2.41x`.
pub fn ratio(nbytes: u64, stored: u64) -> String {
    if stored == 0 {
        return "-".into();
    }
    format!("{:.2}x", nbytes as f64 / stored as f64)
}

pub fn entry_summary(e: &Entry) -> String {
    match e {
        Entry::None => "None".into(),
        Entry::Bool(b) => format!("bool {}", if *b { "True" } else { "False" }),
        Entry::Int(i) => format!("int {}", clip(&i.to_string(), 40)),
        Entry::Float(f) => format!("float {}", fmt_float(*f)),
        Entry::Complex(a, b) => {
            format!("complex ({}{}{}j)", fmt_float(*a), if *b < 0.0 { "" } else { "+" }, fmt_float(*b))
        }
        Entry::Str(Stored::Inline(s)) => format!("str {}", clip(&format!("{s:?}"), 60)),
        Entry::Str(Stored::Blob { size, chunk }) => {
            format!("str ({}, in pack{})", human_bytes(*size), codec_summary(std::slice::from_ref(chunk), *size))
        }
        Entry::Bytes(Stored::Inline(b)) => format!("bytes ({} B)", b.len()),
        Entry::Fragment(f) => format!("subtree ({} leaves)", f.leaves()),
        Entry::Bytes(Stored::Blob { size, chunk }) => {
            format!("bytes ({}, in pack{})", human_bytes(*size), codec_summary(std::slice::from_ref(chunk), *size))
        }
        Entry::Array(a) => {
            let mut s = format!("{}{}  {}", a.dtype.display(), shape_text(&a.shape), human_bytes(a.nbytes()));
            if let Some(t) = a.annotation.as_ref().and_then(|v| v.get("type")).and_then(|t| t.as_str()) {
                // What the writer had (format 1.3): `torch.nn.Parameter`, say.
                s.push_str(&format!("  {t}"));
            }
            match &a.storage {
                ArrayStorage::Inline(_) => s.push_str("  inline"),
                ArrayStorage::Chunked { chunks, .. } => {
                    s.push_str(&format!("  {} chunk{}", chunks.len(), if chunks.len() == 1 { "" } else { "s" }));
                    s.push_str(&codec_summary(chunks, a.nbytes()));
                }
            }
            if let Some(p) = &a.preview {
                let text = treepack::format::preview::text(p, 60);
                if !text.is_empty() {
                    s.push_str("  ");
                    s.push_str(&text);
                }
            }
            s
        }
    }
}

pub fn fmt_float(f: f64) -> String {
    if f.is_nan() {
        "nan".into()
    } else if f.is_infinite() {
        if f > 0.0 { "inf" } else { "-inf" }.into()
    } else {
        let mut b = ryu_like(f);
        if !b.contains('.') && !b.contains('e') && !b.contains("inf") {
            b.push_str(".0");
        }
        b
    }
}

fn ryu_like(f: f64) -> String {
    serde_json::Number::from_f64(f).map_or_else(|| f.to_string(), |n| n.to_string())
}

/// Render an array numpy-style, eliding the middle of long axes.
pub fn format_array(a: &ArrayData) -> String {
    let dtype = a.dtype();
    let n = a.len() as usize;
    let summarize = n > 1000;
    let mut out = String::new();
    let shape: Vec<usize> = a.shape().iter().map(|&d| d as usize).collect();
    if shape.is_empty() {
        return elem(dtype, a, 0);
    }
    rec(dtype, a, &shape, 0, 0, summarize, &mut out);
    out
}

fn elem(dtype: &DType, a: &ArrayData, i: usize) -> String {
    match dtype.element_json(a.bytes(), i) {
        Some(Value::Number(n)) if n.is_f64() => fmt_float(n.as_f64().unwrap_or(f64::NAN)),
        Some(Value::String(s)) if matches!(dtype, DType::Bytes(_) | DType::Unicode(_)) => format!("{s:?}"),
        Some(Value::String(s)) => s,
        Some(Value::Bool(b)) => if b { "True" } else { "False" }.into(),
        Some(Value::Array(v)) if v.len() == 2 && matches!(dtype, DType::C64 | DType::C128) => {
            let re = json_val(&v[0]);
            let im = json_val(&v[1]);
            format!("{re}{}{im}j", if im.starts_with('-') { "" } else { "+" })
        }
        Some(v) => v.to_string(),
        None => "?".into(),
    }
}

fn rec(dtype: &DType, a: &ArrayData, shape: &[usize], axis: usize, base: usize, summarize: bool, out: &mut String) {
    let len = shape[axis];
    let stride: usize = shape[axis + 1..].iter().product();
    let idx: Vec<Option<usize>> = if summarize && len > 6 {
        (0..3).map(Some).chain([None]).chain((len - 3..len).map(Some)).collect()
    } else {
        (0..len).map(Some).collect()
    };
    out.push('[');
    for (k, i) in idx.iter().enumerate() {
        if k > 0 {
            if axis + 1 == shape.len() {
                out.push_str(", ");
            } else {
                out.push_str(",\n");
                out.push_str(&" ".repeat(axis + 1));
            }
        }
        match i {
            None => out.push_str("..."),
            Some(i) => {
                if axis + 1 == shape.len() {
                    out.push_str(&elem(dtype, a, base + i));
                } else {
                    rec(dtype, a, shape, axis + 1, base + i * stride, summarize, out);
                }
            }
        }
    }
    out.push(']');
}

/// Render a loaded (sub)tree: arrays numpy-style, other leaves as Python-like literals.
pub fn format_node(n: &Node, indent: usize) -> String {
    let pad = " ".repeat(indent);
    match n {
        // One object at several places: shown where it is stored (`cat` of a ref place brings
        // it there), and at a place that refers to it again, as that.
        Tree::Shared { node, .. } => format_node(node, indent),
        Tree::Ref(id) => format!("ref to shared object #{id} (shown where it is stored)"),
        Tree::Leaf(Leaf::Array(a)) => {
            format!("{}{} =\n{}", a.dtype().display(), shape_text(a.shape()), format_array(a))
        }
        Tree::Leaf(Leaf::None) => "None".into(),
        Tree::Leaf(Leaf::Bool(b)) => if *b { "True" } else { "False" }.into(),
        Tree::Leaf(Leaf::Int(i)) => i.to_string(),
        Tree::Leaf(Leaf::Float(f)) => fmt_float(*f),
        Tree::Leaf(Leaf::Complex(a, b)) => {
            format!("({}{}{}j)", fmt_float(*a), if *b < 0.0 { "" } else { "+" }, fmt_float(*b))
        }
        Tree::Leaf(Leaf::Str(s)) => format!("{s:?}"),
        Tree::Leaf(Leaf::Bytes(b)) => {
            let shown: String =
                b.iter().take(64).flat_map(|&c| std::ascii::escape_default(c)).map(char::from).collect();
            format!("b\"{shown}{}\" ({} bytes)", if b.len() > 64 { "…" } else { "" }, b.len())
        }
        Tree::Custom { type_name, data, children } if children.is_empty() => {
            // A value stored in its data alone (a datetime, a uuid, an enum member): show it.
            if data.is_null() {
                format!("custom {type_name}")
            } else {
                format!("custom {type_name} {}", json_val(data))
            }
        }
        t => {
            let mut s = match t {
                Tree::Record { type_name, .. } => format!("record {type_name}:\n"),
                Tree::Custom { type_name, data, .. } if !data.is_null() => {
                    format!("custom {type_name} {}:\n", json_val(data))
                }
                Tree::Custom { type_name, .. } => format!("custom {type_name}:\n"),
                t => format!("{}:\n", t.container_kind()),
            };
            for (step, child) in t.children() {
                let name = treepack::format::keypath::Segment::from_step_pub(&step).text();
                s.push_str(&format!("{pad}  {name}: {}\n", format_node(child, indent + 2)));
            }
            s.trim_end().to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 23: a value held in a custom node's data alone (a datetime) is printed, not an
    /// empty `custom:`.
    #[test]
    fn custom_values_are_printed() {
        let when: Node = Tree::Custom {
            type_name: "py.datetime".into(),
            data: serde_json::json!("2026-11-22T00:00:00Z"),
            children: vec![],
        };
        assert_eq!(format_node(&when, 0), "custom py.datetime 2026-11-22T00:00:00Z");
        let tree = Node::dict([("when", when)]);
        assert_eq!(format_node(&tree, 0), "dict:\n  when: custom py.datetime 2026-11-22T00:00:00Z");
    }
}

/// `YYYY-MM-DD HH:MM:SS UTC` for milliseconds since the Unix epoch: the format crate's civil
/// time (signatures' `signedAt`), worded for people.
pub fn utc_time(ms: u64) -> String {
    let t = treepack::format::signature::time::format_utc(ms);
    format!("{} UTC", t.trim_end_matches('Z').replacen('T', " ", 1))
}

#[cfg(test)]
mod time_tests {
    #[test]
    fn utc_time_formats_known_instants() {
        assert_eq!(super::utc_time(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(super::utc_time(1_795_600_000_000), "2026-11-25 09:46:40 UTC");
        assert_eq!(super::utc_time(951_782_400_000), "2000-02-29 00:00:00 UTC");
    }
}
