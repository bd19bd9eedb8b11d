//! JSON values held in files, read with their depth bounded while they are parsed.
//!
//! A manifest nests tree nodes up to [`MAX_DEPTH`](crate::manifest::MAX_DEPTH) deep, so
//! its parsers turn serde_json's recursion limit off and count node levels themselves. Some of
//! its members are free JSON values, though (`metadata`, a custom node's `data`, an array's
//! `as` and `preview`, a structured dtype, a tagged scalar's `v`): read as `serde_json::Value`
//! they recurse once per level with no bound, and 100,000 nested `[` overflow the stack — an
//! abort no caller can catch. [`BoundedValue`] reads them instead: the same `Value`, refused with
//! an error as soon as the text nests past its limit, before the next level is entered.
//!
//! Every value [`BoundedValue`] accepts is also safe to keep: dropping, printing, hashing or
//! converting it (to Python objects) recurses at most its limit deep.

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use std::fmt;

/// How deep (arrays and objects inside one another) a JSON value held in a manifest may nest:
/// `metadata`, a custom node's `data`, an array's `as` and `preview`, a tagged scalar's `v`.
/// Above what any writer needs, and above what the Python package can write (its values pass
/// through `serde_json`'s default limit, 127), so every value it saves reads back.
pub const MAX_VALUE_DEPTH: usize = 128;

/// How deep a structured dtype's JSON may nest: each of its
/// [`MAX_DTYPE_DEPTH`](crate::dtype::MAX_DTYPE_DEPTH) + 1 struct levels is three JSON
/// levels (the dtype object, its field list, a field), plus a field's `shape`. The struct
/// levels themselves are counted by `DType::from_json` once the value is read.
pub const MAX_DTYPE_JSON_DEPTH: usize = 3 * (crate::dtype::MAX_DTYPE_DEPTH + 1) + 1;

/// A `serde_json::Value` read with its nesting bounded: `limit` levels of arrays and objects at
/// most, counted from where it starts. The error names `member` (what the value is, as the file
/// calls it) and the limit; the parser adds the file, the key path and the position.
#[derive(Debug, Clone, Copy)]
pub struct BoundedValue {
    member: &'static str,
    limit: usize,
    /// Arrays and objects entered so far.
    depth: usize,
}

impl BoundedValue {
    /// A value of the member `member`, nested at most [`MAX_VALUE_DEPTH`] deep.
    pub fn member(member: &'static str) -> Self {
        Self::with_limit(member, MAX_VALUE_DEPTH)
    }

    /// A value of the member `member`, nested at most `limit` deep.
    pub fn with_limit(member: &'static str, limit: usize) -> Self {
        BoundedValue { member, limit, depth: 0 }
    }

    /// The seed of the values inside an array or object this seed is about to read, or the
    /// error when that array or object is one level too many.
    fn enter<E: de::Error>(self) -> Result<Self, E> {
        if self.depth >= self.limit {
            return Err(E::custom(too_deep(self.member, self.limit)));
        }
        Ok(BoundedValue { depth: self.depth + 1, ..self })
    }

    /// [`Visitor::visit_map`] for a caller that has read the opening `{` itself (a structured
    /// dtype is told from a dtype name by its first token).
    pub fn read_map<'de, A: MapAccess<'de>>(self, map: A) -> Result<Value, A::Error> {
        self.visit_map(map)
    }
}

/// The message of a value nested past its limit.
pub fn too_deep(member: &str, limit: usize) -> String {
    format!("member `{member}`: JSON nested deeper than {limit} levels")
}

impl<'de> DeserializeSeed<'de> for BoundedValue {
    type Value = Value;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

// The scalars as `serde_json::Value`'s own visitor makes them.
impl<'de> Visitor<'de> for BoundedValue {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        self.deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let inner = self.enter()?;
        inner.on_stack(move || {
            let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
            while let Some(v) = seq.next_element_seed(inner)? {
                items.push(v);
            }
            Ok(Value::Array(items))
        })
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let inner = self.enter()?;
        inner.on_stack(move || {
            let mut members = Map::new();
            while let Some(k) = map.next_key::<String>()? {
                // A repeated key keeps its last value, as `Value` does.
                members.insert(k, map.next_value_seed(inner)?);
            }
            Ok(Value::Object(members))
        })
    }
}

impl BoundedValue {
    /// Run `read` (the contents of an array or object at this seed's depth) with stack to spare:
    /// a value may sit under a thousand tree levels, each of which leaves
    /// [`grow`](crate::model::grow)'s red zone and no more. Every 16th level makes sure
    /// of it, so the shallow values nearly all are (an array's preview, its `as`) check nothing.
    fn on_stack<R>(self, read: impl FnOnce() -> R) -> R {
        if self.depth.is_multiple_of(16) {
            crate::model::grow(read)
        } else {
            read()
        }
    }
}

/// Parse `text` (JSON this crate wrote or accepted before, e.g. a custom node's `data` kept as
/// text by the structure reader) as one value of `member`, nested at most `limit` deep.
///
/// # Errors
/// serde_json's error for text that is not one JSON value or nests past `limit`.
pub fn from_str(text: &str, member: &'static str, limit: usize) -> serde_json::Result<Value> {
    let mut de = serde_json::Deserializer::from_str(text);
    // The bound is this seed's; serde_json's own (128) would refuse a value at the limit.
    de.disable_recursion_limit();
    let v = BoundedValue::with_limit(member, limit).deserialize(&mut de)?;
    de.end()?;
    Ok(v)
}

/// Whether `v` nests arrays and objects more than `limit` deep. It descends at most `limit` + 1
/// levels, whatever the depth of `v` (a save's metadata may be nested any depth), and
/// allocates nothing (a save checks every custom node's `data`).
pub fn deeper_than(v: &Value, limit: usize) -> bool {
    match v {
        Value::Array(a) => limit == 0 || a.iter().any(|c| deeper_than(c, limit - 1)),
        Value::Object(o) => limit == 0 || o.values().any(|c| deeper_than(c, limit - 1)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(depth: usize) -> String {
        "[".repeat(depth) + &"]".repeat(depth)
    }

    #[test]
    fn values_are_read_as_serde_json_reads_them() {
        for text in [
            r#"{"a":[1,-2,3.5,1e300,"x",null,true,false,{}],"b":{"c":[]},"a":7}"#,
            "18446744073709551615",
            "-9223372036854775808",
            r#""\u00e9\n""#,
            "[[[[]]]]",
        ] {
            let ours = from_str(text, "m", MAX_VALUE_DEPTH).unwrap();
            let theirs: Value = serde_json::from_str(text).unwrap();
            assert_eq!(ours, theirs, "{text}");
        }
    }

    #[test]
    fn the_limit_is_applied_while_parsing() {
        assert!(from_str(&nested(MAX_VALUE_DEPTH), "m", MAX_VALUE_DEPTH).is_ok());
        let e = from_str(&nested(MAX_VALUE_DEPTH + 1), "metadata", MAX_VALUE_DEPTH).unwrap_err();
        assert!(e.to_string().contains("member `metadata`: JSON nested deeper than 128 levels"), "{e}");
        // Far past the limit: refused at the limit, not after reading (or overflowing on) the rest.
        let deep = "{\"a\":".repeat(100_000) + "1" + &"}".repeat(100_000);
        let e = from_str(&deep, "data", 5).unwrap_err();
        assert!(e.to_string().contains("member `data`: JSON nested deeper than 5 levels at line 1"), "{e}");
    }

    #[test]
    fn deeper_than_counts_arrays_and_objects() {
        let v: Value = serde_json::from_str(&nested(10)).unwrap();
        assert!(!deeper_than(&v, 10));
        assert!(deeper_than(&v, 9));
        assert!(!deeper_than(&Value::from(3), 0));
        assert!(deeper_than(&serde_json::json!({"a": 1}), 0));
        assert!(!deeper_than(&serde_json::json!([1, {"a": [2]}]), 3));
        assert!(deeper_than(&serde_json::json!([1, {"a": [2]}]), 2));
        // A value built in memory any depth deep is measured descending no deeper than the limit.
        let mut deep = Value::Null;
        for _ in 0..100_000 {
            deep = Value::Array(vec![deep]);
        }
        assert!(deeper_than(&deep, MAX_VALUE_DEPTH));
        // (Dropping it recurses; forget it rather than overflow this test's stack.)
        std::mem::forget(deep);
    }
}
