//! serde support: any `Serialize` Rust value becomes a [`Node`] and back.
//!
//! Mapping: structs → records (type name = struct name), maps → dicts, sequences → lists,
//! tuples → tuples, `Option::None`/unit → None, enums → the variant name (unit variants) or a
//! one-entry dict `{variant: content}`. `ndarray` arrays become array leaves when the field is
//! annotated `#[serde(with = "treepack::serde_tree::array")]`.
//!
//! ```
//! use ndarray::Array2;
//! #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
//! struct Dense {
//!     #[serde(with = "treepack::serde_tree::array")]
//!     kernel: Array2<f32>,
//!     name: String,
//! }
//! let d = Dense { kernel: Array2::from_elem((2, 3), 1.5), name: "fc".into() };
//! let tree = treepack::to_tree(&d)?;
//! let back: Dense = treepack::from_tree(&tree)?;
//! assert_eq!(back, d);
//! # Ok::<(), treepack::Error>(())
//! ```

use crate::error::{Error, Result};
use crate::format::dtype::DType;
use crate::format::model::{ArrayData, Int, Key, Leaf, Node, Tree};
use bytes::Bytes;
use serde::de::{self, DeserializeSeed, IntoDeserializer, Visitor};
use serde::ser::{self, Serialize};

/// Newtype-struct name that marks an array payload `(dtype, shape, bytes)`.
pub const ARRAY_TOKEN: &str = "$treepack::Array";

/// Convert a serialisable value into a tree.
///
/// # Errors
/// [`Error::Serde`] if the value cannot be represented (e.g. a map key that is a struct).
pub fn to_tree<T: Serialize + ?Sized>(value: &T) -> Result<Node> {
    value.serialize(TreeSerializer)
}

/// Rebuild a value from a tree.
///
/// # Errors
/// [`Error::Serde`] when the tree does not have the shape `T` expects.
pub fn from_tree<T: de::DeserializeOwned>(tree: &Node) -> Result<T> {
    T::deserialize(TreeDeserializer(tree))
}

pub use crate::format::element::Element;

/// `#[serde(with = "treepack::serde_tree::array")]` for `ndarray::Array<T, D>` fields.
pub mod array {
    use super::{Element, ARRAY_TOKEN};
    use crate::format::model::ArrayData;
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    struct Payload<'a>(&'a str, &'a [u64], &'a [u8]);
    impl Serialize for Payload<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeTuple;
            let mut t = s.serialize_tuple(3)?;
            t.serialize_element(self.0)?;
            t.serialize_element(self.1)?;
            t.serialize_element(&Bytes(self.2))?;
            t.end()
        }
    }
    struct Bytes<'a>(&'a [u8]);
    impl Serialize for Bytes<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(self.0)
        }
    }

    /// Serialize an ndarray as (dtype name, shape, canonical bytes) under [`ARRAY_TOKEN`], which
    /// [`to_tree`](super::to_tree) turns into an array leaf.
    pub fn serialize<T: Element, St: ndarray::Data<Elem = T>, D: ndarray::Dimension, S: Serializer>(
        a: &ndarray::ArrayBase<St, D>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let data = ArrayData::from_ndarray(a);
        let name = data.dtype().name().unwrap_or_default();
        s.serialize_newtype_struct(ARRAY_TOKEN, &Payload(&name, data.shape(), data.bytes()))
    }

    #[derive(Deserialize)]
    struct Owned(String, Vec<u64>, #[serde(with = "bytes_vec")] Vec<u8>);

    mod bytes_vec {
        pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
            struct V;
            impl<'de> serde::de::Visitor<'de> for V {
                type Value = Vec<u8>;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("bytes")
                }
                fn visit_bytes<E>(self, v: &[u8]) -> Result<Vec<u8>, E> {
                    Ok(v.to_vec())
                }
                fn visit_byte_buf<E>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
                    Ok(v)
                }
            }
            d.deserialize_bytes(V)
        }
    }

    #[derive(Deserialize)]
    #[serde(rename = "$treepack::Array")]
    struct Wrapped(Owned);

    /// Rebuild an ndarray from what `serialize` wrote (an array leaf, under
    /// [`from_tree`](super::from_tree)); fails if the dtype is not `T`'s or the rank not `D`'s.
    pub fn deserialize<'de, T: Element, D: ndarray::Dimension, De: Deserializer<'de>>(
        d: De,
    ) -> Result<ndarray::Array<T, D>, De::Error> {
        let Wrapped(Owned(name, shape, bytes)) = Wrapped::deserialize(d)?;
        let dtype = crate::DType::from_name(&name).map_err(De::Error::custom)?;
        let a = ArrayData::new(dtype, shape, bytes).map_err(De::Error::custom)?;
        let dynamic = a.to_ndarray::<T>().map_err(De::Error::custom)?;
        dynamic.into_dimensionality::<D>().map_err(De::Error::custom)
    }
}

// ------------------------------------------------------------------ Serializer

struct TreeSerializer;

fn key_of(n: Node) -> Result<Key> {
    Ok(match n {
        Tree::Leaf(Leaf::None) => Key::None,
        Tree::Leaf(Leaf::Bool(b)) => Key::Bool(b),
        Tree::Leaf(Leaf::Int(i)) => Key::Int(i),
        Tree::Leaf(Leaf::Float(f)) => Key::Float(f),
        Tree::Leaf(Leaf::Str(s)) => Key::Str(s),
        Tree::Tuple(v) => Key::Tuple(v.into_iter().map(key_of).collect::<Result<_>>()?),
        other => return Err(Error::Serde(format!("a {} cannot be a dict key", other.container_kind()))),
    })
}

struct SeqSer {
    items: Vec<Node>,
    tuple: bool,
    variant: Option<&'static str>,
}
struct MapSer {
    items: Vec<(Key, Node)>,
    key: Option<Key>,
}
struct StructSer {
    name: &'static str,
    fields: Vec<(String, Node)>,
    variant: Option<&'static str>,
}

fn wrap_variant(variant: Option<&'static str>, n: Node) -> Node {
    match variant {
        Some(v) => Tree::Dict(vec![(Key::Str(v.to_string()), n)]),
        None => n,
    }
}

/// Serializer methods whose value is a leaf of the value widened to `$via` (the leaf kinds
/// a tree holds: i64, u64 beyond it, f64).
macro_rules! serialize_as {
    ($($name:ident: $t:ty => $via:ty),* $(,)?) => {
        $(fn $name(self, v: $t) -> Result<Node> {
            Ok(Node::from(<$via>::from(v)))
        })*
    };
}

impl ser::Serializer for TreeSerializer {
    type Ok = Node;
    type Error = Error;
    type SerializeSeq = SeqSer;
    type SerializeTuple = SeqSer;
    type SerializeTupleStruct = SeqSer;
    type SerializeTupleVariant = SeqSer;
    type SerializeMap = MapSer;
    type SerializeStruct = StructSer;
    type SerializeStructVariant = StructSer;

    serialize_as! {
        serialize_bool: bool => bool,
        serialize_i8: i8 => i64,
        serialize_i16: i16 => i64,
        serialize_i32: i32 => i64,
        serialize_i64: i64 => i64,
        serialize_u8: u8 => i64,
        serialize_u16: u16 => i64,
        serialize_u32: u32 => i64,
        serialize_u64: u64 => u64,
        serialize_f32: f32 => f64,
        serialize_f64: f64 => f64,
    }
    fn serialize_i128(self, v: i128) -> Result<Node> {
        Ok(Tree::Leaf(Leaf::Int(Int::from_big(v.into()))))
    }
    fn serialize_u128(self, v: u128) -> Result<Node> {
        Ok(Tree::Leaf(Leaf::Int(Int::from_big(v.into()))))
    }
    fn serialize_char(self, v: char) -> Result<Node> {
        Ok(Node::from(v.to_string()))
    }
    fn serialize_str(self, v: &str) -> Result<Node> {
        Ok(Node::from(v))
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<Node> {
        Ok(Tree::Leaf(Leaf::Bytes(Bytes::copy_from_slice(v))))
    }
    fn serialize_none(self) -> Result<Node> {
        Ok(Node::none())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, v: &T) -> Result<Node> {
        v.serialize(self)
    }
    fn serialize_unit(self) -> Result<Node> {
        Ok(Node::none())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<Node> {
        Ok(Node::none())
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, variant: &'static str) -> Result<Node> {
        Ok(Node::from(variant))
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, name: &'static str, v: &T) -> Result<Node> {
        let inner = v.serialize(self)?;
        if name != ARRAY_TOKEN {
            return Ok(inner);
        }
        // (dtype name, shape, bytes) → array leaf
        if let Tree::Tuple(mut parts) = inner {
            if parts.len() == 3 {
                let bytes = parts.pop();
                let shape = parts.pop();
                let dtype = parts.pop();
                if let (Some(Tree::Leaf(Leaf::Str(d))), Some(Tree::List(s)), Some(Tree::Leaf(Leaf::Bytes(b)))) =
                    (dtype, shape, bytes)
                {
                    let shape: Vec<u64> = s
                        .into_iter()
                        .map(|x| match x {
                            Tree::Leaf(Leaf::Int(Int::Small(v))) if v >= 0 => Ok(v as u64),
                            _ => Err(Error::Serde("bad array shape".into())),
                        })
                        .collect::<Result<_>>()?;
                    return Ok(Node::from(ArrayData::new(DType::from_name(&d)?, shape, b)?));
                }
            }
        }
        Err(Error::Serde("malformed array payload".into()))
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        v: &T,
    ) -> Result<Node> {
        Ok(wrap_variant(Some(variant), v.serialize(self)?))
    }
    fn serialize_seq(self, len: Option<usize>) -> Result<SeqSer> {
        Ok(SeqSer { items: Vec::with_capacity(len.unwrap_or(0).min(1 << 16)), tuple: false, variant: None })
    }
    fn serialize_tuple(self, len: usize) -> Result<SeqSer> {
        Ok(SeqSer { items: Vec::with_capacity(len.min(1 << 16)), tuple: true, variant: None })
    }
    fn serialize_tuple_struct(self, _: &'static str, len: usize) -> Result<SeqSer> {
        self.serialize_tuple(len)
    }
    fn serialize_tuple_variant(self, _: &'static str, _: u32, variant: &'static str, len: usize) -> Result<SeqSer> {
        Ok(SeqSer { items: Vec::with_capacity(len.min(1 << 16)), tuple: true, variant: Some(variant) })
    }
    fn serialize_map(self, _: Option<usize>) -> Result<MapSer> {
        Ok(MapSer { items: vec![], key: None })
    }
    fn serialize_struct(self, name: &'static str, _: usize) -> Result<StructSer> {
        Ok(StructSer { name, fields: vec![], variant: None })
    }
    fn serialize_struct_variant(
        self,
        name: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<StructSer> {
        Ok(StructSer { name, fields: vec![], variant: Some(variant) })
    }
}

impl SeqSer {
    fn finish(self) -> Node {
        let n = if self.tuple { Tree::Tuple(self.items) } else { Tree::List(self.items) };
        wrap_variant(self.variant, n)
    }
}

macro_rules! seq_impl {
    ($tr:path, $m:ident) => {
        impl $tr for SeqSer {
            type Ok = Node;
            type Error = Error;
            fn $m<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<()> {
                self.items.push(v.serialize(TreeSerializer)?);
                Ok(())
            }
            fn end(self) -> Result<Node> {
                Ok(self.finish())
            }
        }
    };
}
seq_impl!(ser::SerializeSeq, serialize_element);
seq_impl!(ser::SerializeTuple, serialize_element);
seq_impl!(ser::SerializeTupleStruct, serialize_field);
seq_impl!(ser::SerializeTupleVariant, serialize_field);

impl ser::SerializeMap for MapSer {
    type Ok = Node;
    type Error = Error;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, k: &T) -> Result<()> {
        self.key = Some(key_of(k.serialize(TreeSerializer)?)?);
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<()> {
        let k = self.key.take().ok_or_else(|| Error::Serde("map value without key".into()))?;
        self.items.push((k, v.serialize(TreeSerializer)?));
        Ok(())
    }
    fn end(self) -> Result<Node> {
        Ok(Tree::Dict(self.items))
    }
}

macro_rules! struct_impl {
    ($tr:path) => {
        impl $tr for StructSer {
            type Ok = Node;
            type Error = Error;
            fn serialize_field<T: Serialize + ?Sized>(&mut self, k: &'static str, v: &T) -> Result<()> {
                self.fields.push((k.to_string(), v.serialize(TreeSerializer)?));
                Ok(())
            }
            fn end(self) -> Result<Node> {
                Ok(wrap_variant(self.variant, Tree::Record { type_name: self.name.to_string(), fields: self.fields }))
            }
        }
    };
}
struct_impl!(ser::SerializeStruct);
struct_impl!(ser::SerializeStructVariant);

// ------------------------------------------------------------------ Deserializer

struct TreeDeserializer<'a>(&'a Node);

fn key_node(k: &Key) -> Node {
    match k {
        Key::None => Node::none(),
        Key::Bool(b) => Node::from(*b),
        Key::Int(i) => Node::from(i.clone()),
        Key::Float(f) => Node::from(*f),
        Key::Str(s) => Node::from(s.as_str()),
        Key::Tuple(v) => Tree::Tuple(v.iter().map(key_node).collect()),
    }
}

struct SeqAcc<'a>(std::slice::Iter<'a, Node>);
impl<'de> de::SeqAccess<'de> for SeqAcc<'_> {
    type Error = Error;
    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>> {
        self.0.next().map(|n| seed.deserialize(TreeDeserializer(n))).transpose()
    }
}

/// Map access over (key node, value node) pairs.
struct MapAcc<'a> {
    items: Vec<(Node, &'a Node)>,
    pos: usize,
}
impl<'de> de::MapAccess<'de> for MapAcc<'_> {
    type Error = Error;
    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>> {
        match self.items.get(self.pos) {
            Some((k, _)) => seed.deserialize(TreeDeserializer(k)).map(Some),
            None => Ok(None),
        }
    }
    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value> {
        let v = self.items.get(self.pos).map(|x| x.1).ok_or_else(|| Error::Serde("value without key".into()))?;
        self.pos += 1;
        seed.deserialize(TreeDeserializer(v))
    }
}

struct EnumAcc<'a> {
    variant: String,
    content: Option<&'a Node>,
}
impl<'de, 'a> de::EnumAccess<'de> for EnumAcc<'a> {
    type Error = Error;
    type Variant = Self;
    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self)> {
        let v = seed.deserialize(self.variant.clone().into_deserializer())?;
        Ok((v, self))
    }
}
impl<'de> de::VariantAccess<'de> for EnumAcc<'_> {
    type Error = Error;
    fn unit_variant(self) -> Result<()> {
        Ok(())
    }
    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value> {
        seed.deserialize(TreeDeserializer(self.content.ok_or_else(|| Error::Serde("variant without content".into()))?))
    }
    fn tuple_variant<V: Visitor<'de>>(self, _: usize, visitor: V) -> Result<V::Value> {
        de::Deserializer::deserialize_any(
            TreeDeserializer(self.content.ok_or_else(|| Error::Serde("variant without content".into()))?),
            visitor,
        )
    }
    fn struct_variant<V: Visitor<'de>>(self, _: &'static [&'static str], visitor: V) -> Result<V::Value> {
        de::Deserializer::deserialize_any(
            TreeDeserializer(self.content.ok_or_else(|| Error::Serde("variant without content".into()))?),
            visitor,
        )
    }
}

impl<'de> de::Deserializer<'de> for TreeDeserializer<'_> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.0 {
            Tree::Shared { node, .. } => TreeDeserializer(node).deserialize_any(visitor),
            Tree::Ref(id) => Err(Error::Serde(format!(
                "a ref to shared object {id}: a tree with shared references (format 1.2) has no plain \
                 Rust value; load it as a `Node`"
            ))),
            Tree::Leaf(Leaf::None) => visitor.visit_unit(),
            Tree::Leaf(Leaf::Bool(b)) => visitor.visit_bool(*b),
            Tree::Leaf(Leaf::Int(Int::Small(i))) => visitor.visit_i64(*i),
            Tree::Leaf(Leaf::Int(Int::Big(b))) => match i128::try_from(b) {
                Ok(v) => visitor.visit_i128(v),
                Err(_) => match u128::try_from(b) {
                    Ok(v) => visitor.visit_u128(v),
                    Err(_) => Err(Error::Serde(format!("integer {b} does not fit 128 bits"))),
                },
            },
            Tree::Leaf(Leaf::Float(f)) => visitor.visit_f64(*f),
            Tree::Leaf(Leaf::Complex(a, b)) => {
                visitor.visit_seq(SeqAcc([Node::from(*a), Node::from(*b)].to_vec().iter()))
            }
            Tree::Leaf(Leaf::Str(s)) => visitor.visit_str(s),
            Tree::Leaf(Leaf::Bytes(b)) => visitor.visit_bytes(b),
            Tree::Leaf(Leaf::Array(_)) => Err(Error::Serde(
                "an array leaf needs a field annotated #[serde(with = \"treepack::serde_tree::array\")]".into(),
            )),
            Tree::Leaf(Leaf::Fragment(_)) => {
                Err(Error::Serde("a fragment: call `Node::expand_fragments` on the tree first".into()))
            }
            Tree::List(v) | Tree::Tuple(v) => visitor.visit_seq(SeqAcc(v.iter())),
            Tree::Dict(items) => {
                visitor.visit_map(MapAcc { items: items.iter().map(|(k, v)| (key_node(k), v)).collect(), pos: 0 })
            }
            Tree::Record { fields, .. } | Tree::Custom { children: fields, .. } => visitor
                .visit_map(MapAcc { items: fields.iter().map(|(k, v)| (Node::from(k.as_str()), v)).collect(), pos: 0 }),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.0 {
            Tree::Leaf(Leaf::None) => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(self, name: &'static str, visitor: V) -> Result<V::Value> {
        if name == ARRAY_TOKEN {
            let Tree::Leaf(Leaf::Array(a)) = self.0 else {
                return Err(Error::Serde(format!("expected an array leaf, found {}", describe(self.0))));
            };
            let dname =
                a.dtype().name().ok_or_else(|| Error::Serde("struct dtypes cannot become ndarray elements".into()))?;
            let payload = Tree::Tuple(vec![
                Node::from(dname),
                Tree::List(a.shape().iter().map(|&d| Node::from(d)).collect()),
                Tree::Leaf(Leaf::Bytes(a.bytes().clone())),
            ]);
            return visitor.visit_newtype_struct(TreeDeserializerOwned(payload));
        }
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value> {
        match self.0 {
            Tree::Leaf(Leaf::Str(s)) => visitor.visit_enum(EnumAcc { variant: s.clone(), content: None }),
            Tree::Dict(items) if items.len() == 1 => match &items[0] {
                (Key::Str(k), v) => visitor.visit_enum(EnumAcc { variant: k.clone(), content: Some(v) }),
                _ => Err(Error::Serde("enum dict key must be a string".into())),
            },
            other => {
                Err(Error::Serde(format!("expected an enum (string or one-entry dict), found {}", describe(other))))
            }
        }
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct seq tuple tuple_struct map struct identifier ignored_any
    }
}

fn describe(n: &Node) -> &'static str {
    match n {
        Tree::Leaf(l) => l.kind(),
        t => t.container_kind(),
    }
}

/// Owning variant used for synthetic payload nodes.
struct TreeDeserializerOwned(Node);

impl<'de> de::Deserializer<'de> for TreeDeserializerOwned {
    type Error = Error;
    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        TreeDeserializer(&self.0).deserialize_any(visitor)
    }
    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map struct enum identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{Array1, Array2};
    use std::collections::BTreeMap;

    #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
    enum Act {
        Relu,
        Leaky(f64),
        Custom { slope: f32 },
    }

    #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
    struct Layer {
        #[serde(with = "crate::serde_tree::array")]
        w: Array2<f32>,
        #[serde(with = "crate::serde_tree::array")]
        b: Array1<half::bf16>,
        act: Act,
        acts: Vec<Act>,
        tag: Option<String>,
        meta: BTreeMap<u32, (bool, String)>,
    }

    #[test]
    fn structs_with_ndarrays_round_trip() {
        let l = Layer {
            w: Array2::from_shape_fn((3, 4), |(i, j)| (i * 4 + j) as f32),
            b: Array1::from_elem(4, half::bf16::from_f32(0.5)),
            act: Act::Custom { slope: 0.1 },
            acts: vec![Act::Relu, Act::Leaky(0.2)],
            tag: None,
            meta: [(1, (true, "x".to_string()))].into_iter().collect(),
        };
        let t = to_tree(&l).unwrap();
        match &t {
            Tree::Record { type_name, fields } => {
                assert_eq!(type_name, "Layer");
                assert_eq!(fields[0].1.as_array().unwrap().shape(), &[3, 4]);
            }
            other => panic!("{other:?}"),
        }
        let back: Layer = from_tree(&t).unwrap();
        assert_eq!(back, l);
    }

    #[test]
    fn non_contiguous_ndarray_is_made_canonical() {
        let a = Array2::from_shape_fn((2, 3), |(i, j)| (i * 3 + j) as i32);
        let t = a.t();
        let d = ArrayData::from_ndarray(&t);
        assert_eq!(d.shape(), &[3, 2]);
        assert_eq!(d.to_ndarray::<i32>().unwrap().into_dimensionality::<ndarray::Ix2>().unwrap(), t.to_owned());
    }
}
