//! A JSON Schema (2020-12) of a stored tree (docs/transport.md, "Schema"): the type of the tree
//! — its containers, key names, field names, leaf kinds, array dtypes and ranks — that
//! validates the tree's JSON transport document (section 11 of docs/format.md) and that of any
//! tree of the same type. Values are not constrained, nor are array extents (a batch of 32 and
//! one of 64 are the same type); each array's shape is given as an annotation
//! (`treepackShape`, and in its `description`).

use crate::dtype::DType;
use crate::manifest::{Entry, Manifest};
use crate::model::{Key, Tree};
use crate::transport;
use serde_json::{json, Map, Value};

/// The schema's `$schema`.
pub const DIALECT: &str = "https://json-schema.org/draft/2020-12/schema";

/// The JSON Schema of `m`'s tree (or of the subtree `root` of it), titled `title`.
pub fn schema(m: &Manifest, root: &Tree<Entry>, title: &str) -> Value {
    let node = node(root);
    json!({
        "$schema": DIALECT,
        "title": title,
        "description": "A treepack JSON transport document (docs/format.md section 11) holding a tree of this type: containers, key names, leaf kinds, array dtypes and ranks are checked; values and array extents are not.",
        "type": "object",
        "required": ["format", "version", "manifest", "encoding", "data"],
        "properties": {
            "format": {"const": transport::FORMAT_NAME},
            "version": {"type": "array", "prefixItems": [{"const": transport::VERSION.0}, {"type": "integer", "minimum": 0}], "items": false, "minItems": 2},
            "manifest": {
                "type": "object",
                "required": ["format", "version", "root", "manifest_hash"],
                "properties": {
                    "format": {"const": "treepack"},
                    "version": {"type": "array", "prefixItems": [{"const": m.version.0}, {"type": "integer", "minimum": 0}], "items": false, "minItems": 2},
                    "root": node,
                    "manifest_hash": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                },
            },
            "encoding": {"enum": ["base85", "base64"]},
            "data": {"type": "string"},
        },
        "$defs": defs(),
    })
}

/// The schemas every node schema refers to.
fn defs() -> Value {
    let tagged = |t: &str, props: Value, required: &[&str]| {
        let mut p = Map::new();
        p.insert("t".into(), json!({"const": t}));
        if let Value::Object(o) = props {
            p.extend(o);
        }
        let mut req = vec!["t"];
        req.extend_from_slice(required);
        json!({"type": "object", "required": req, "properties": p})
    };
    let nonfinite = json!({"type": "string", "pattern": "^(nan(:[0-9a-f]{16})?|inf|-inf)$"});
    json!({
        "chunkRef": {
            "type": "object",
            "required": ["pack", "offset", "length", "codec", "blake3"],
            "properties": {
                "pack": {"type": "integer", "minimum": 0},
                "offset": {"type": "integer", "minimum": 0},
                "length": {"type": "integer", "minimum": 0},
                "codec": {"type": "string"},
                "blake3": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
            },
        },
        "int": {"anyOf": [{"type": "integer"}, tagged("int", json!({"v": {"type": "string", "pattern": "^-?[0-9]+$"}}), &["v"])]},
        "float": {"anyOf": [{"type": "number"}, tagged("float", json!({"v": nonfinite}), &["v"])]},
        "complex": tagged("complex", json!({"v": {"type": "array", "items": {"anyOf": [{"type": "number"}, nonfinite]}, "minItems": 2, "maxItems": 2}}), &["v"]),
        "str": {"anyOf": [{"type": "string"}, tagged("str", json!({"size": {"type": "integer", "minimum": 0}, "blob": {"$ref": "#/$defs/chunkRef"}}), &["size", "blob"])]},
        "bytes": {"anyOf": [
            tagged("bytes", json!({"b64": {"type": "string"}}), &["b64"]),
            tagged("bytes", json!({"size": {"type": "integer", "minimum": 0}, "blob": {"$ref": "#/$defs/chunkRef"}}), &["size", "blob"]),
        ]},
        "arrayData": {"oneOf": [
            {"type": "object", "required": ["data"], "properties": {"data": {"type": "string"}}},
            {"type": "object", "required": ["chunk_shape", "chunks"], "properties": {
                "chunk_shape": {"type": "array", "items": {"type": "integer", "minimum": 1}},
                "chunks": {"type": "array", "items": {"$ref": "#/$defs/chunkRef"}},
            }},
        ]},
    })
}

fn leaf(e: &Entry) -> Value {
    match e {
        Entry::None => json!({"type": "null"}),
        Entry::Bool(_) => json!({"type": "boolean"}),
        Entry::Int(_) => json!({"$ref": "#/$defs/int"}),
        Entry::Float(_) => json!({"$ref": "#/$defs/float"}),
        Entry::Complex(..) => json!({"$ref": "#/$defs/complex"}),
        Entry::Str(_) => json!({"$ref": "#/$defs/str"}),
        Entry::Bytes(_) => json!({"$ref": "#/$defs/bytes"}),
        Entry::Array(a) => array(&a.dtype, &a.shape),
        // Schemas are made from manifests read back, which hold no fragments.
        Entry::Fragment(_) => json!({}),
    }
}

fn array(dtype: &DType, shape: &[u64]) -> Value {
    let dims = shape.len();
    let d = dtype.to_json();
    let text = dtype.name().unwrap_or_else(|| d.to_string());
    json!({
        "description": format!("{text} array of shape {shape:?}"),
        "treepackShape": shape,
        "type": "object",
        "required": ["t", "dtype", "shape"],
        "properties": {
            "t": {"const": "array"},
            "dtype": {"const": d},
            "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": dims, "maxItems": dims},
        },
        "$ref": "#/$defs/arrayData",
    })
}

/// `[[name, node], …]` pairs with these names in this order.
fn pairs(names: Vec<Value>, nodes: Vec<Value>) -> Value {
    let n = names.len();
    let items: Vec<Value> = names
        .into_iter()
        .zip(nodes)
        .map(|(k, v)| json!({"type": "array", "prefixItems": [{"const": k}, v], "items": false, "minItems": 2}))
        .collect();
    json!({"type": "array", "prefixItems": items, "items": false, "minItems": n})
}

fn sequence(items: Vec<Value>) -> Value {
    let n = items.len();
    json!({"type": "array", "prefixItems": items, "items": false, "minItems": n})
}

fn tagged(t: &str, members: Vec<(&str, Value)>, described: Option<String>) -> Value {
    let mut props = Map::new();
    props.insert("t".into(), json!({"const": t}));
    let mut required = vec![json!("t")];
    for (k, v) in members {
        required.push(json!(k));
        props.insert(k.into(), v);
    }
    let mut o = Map::new();
    if let Some(d) = described {
        o.insert("description".into(), json!(d));
    }
    o.insert("type".into(), json!("object"));
    o.insert("required".into(), Value::Array(required));
    o.insert("properties".into(), Value::Object(props));
    Value::Object(o)
}

fn key_json(k: &Key) -> Value {
    let mut s = String::new();
    crate::manifest::text::write_key(&mut s, k, crate::manifest::text::Order::Manifest);
    serde_json::from_str(&s).unwrap_or(Value::Null)
}

fn children(kids: &[(String, Tree<Entry>)]) -> Value {
    pairs(kids.iter().map(|(k, _)| json!(k)).collect(), kids.iter().map(|(_, v)| node(v)).collect())
}

fn node(t: &Tree<Entry>) -> Value {
    crate::model::grow(|| match t {
        Tree::Leaf(e) => leaf(e),
        Tree::List(items) => sequence(items.iter().map(node).collect()),
        Tree::Tuple(items) => tagged("tuple", vec![("items", sequence(items.iter().map(node).collect()))], None),
        Tree::Dict(kv) => {
            let values: Vec<Value> = kv.iter().map(|(_, v)| node(v)).collect();
            let items = tagged(
                "dict",
                vec![("items", pairs(kv.iter().map(|(k, _)| key_json(k)).collect(), values.clone()))],
                None,
            );
            if !crate::manifest::object_form(kv) {
                return items;
            }
            // Written as an object since format 1.4; documents of earlier writers have `items`.
            let mut props = Map::new();
            for ((k, _), v) in kv.iter().zip(values) {
                if let Key::Str(k) = k {
                    props.insert(k.clone(), v);
                }
            }
            let keys: Vec<Value> = props.keys().map(|k| json!(k)).collect();
            let object =
                json!({"type": "object", "required": keys, "properties": props, "additionalProperties": false});
            json!({"anyOf": [object, items]})
        }
        Tree::Record { type_name, fields } => tagged(
            "record",
            vec![("type", json!({"const": type_name})), ("fields", children(fields))],
            Some(format!("record {type_name}")),
        ),
        Tree::Custom { type_name, children: kids, .. } => {
            let mut members = vec![("type", json!({"const": type_name}))];
            if !kids.is_empty() {
                members.push(("children", children(kids)));
            }
            tagged("custom", members, Some(format!("custom object {type_name}")))
        }
        Tree::Shared { id, node: inner } => tagged(
            "shared",
            vec![("id", json!({"const": id})), ("v", node(inner))],
            Some(format!("shared object {id}")),
        ),
        Tree::Ref(id) => {
            tagged("ref", vec![("id", json!({"const": id}))], Some(format!("another place of shared object {id}")))
        }
    })
}

/// [`schema`] as pretty-printed JSON text, built on a stack with room for the deepest trees
/// (the schema nests a few levels per container of a tree up to 1000 deep).
pub fn schema_text(m: &Manifest, root: &Tree<Entry>, title: &str) -> String {
    stacker::grow(256 << 20, || serde_json::to_string_pretty(&schema(m, root, title)).unwrap_or_default())
}
