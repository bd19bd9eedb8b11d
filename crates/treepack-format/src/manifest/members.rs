//! Readers of the grammar's members shared by the parsers: tags, leaves, arrays, chunks, dtypes, base64.
//!
//! Members that hold free JSON (`metadata`, `data`, `as`, `preview`, a structured dtype, a tagged
//! scalar's `v`) are read with [`BoundedValue`], never as a plain `Value`: the parsers turn
//! serde_json's recursion limit off (trees nest up to `MAX_DEPTH` nodes), so a plain `Value`
//! would recurse as deep as the text nests.

use super::types::{ArrayEntry, ArrayStorage, ChunkRef, Entry, PackInfo, Stored, FORMAT_NAME, MAX_PACKS};
use super::validate::validate_pack_path;
use crate::codec::Codec;
use crate::dtype::DType;
use crate::hash::Hash32;
use crate::json::{BoundedValue, MAX_DTYPE_JSON_DEPTH};
use crate::model::Int;
use base64::Engine;
use bytes::Bytes;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess};
use serde_json::Value;
use std::collections::HashSet;

/// One rule of the grammar as a serde seed and its visitor: the seed asks the deserializer for
/// the JSON kind the rule reads (`deserialize_str`, `_seq`, `_map`, `_any`), and the visitor names
/// what it expected, for error messages; the rest of the visitor follows. The impl's generics go
/// in brackets, `'de` first:
/// `seed_visitor! { impl['de, B: Build] ItemsSeed<'_, B> => Vec<B::Node>, deserialize_seq, "an array of nodes"; fn visit_seq... }`.
macro_rules! seed_visitor {
    (impl[$($g:tt)*] $ty:ty => $val:ty, $kind:ident, $expecting:expr; $($body:tt)*) => {
        impl<$($g)*> serde::de::DeserializeSeed<'de> for $ty {
            type Value = $val;
            fn deserialize<D: serde::de::Deserializer<'de>>(self, d: D) -> std::result::Result<$val, D::Error> {
                d.$kind(self)
            }
        }

        impl<$($g)*> serde::de::Visitor<'de> for $ty {
            type Value = $val;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str($expecting)
            }
            $($body)*
        }
    };
}
pub(super) use seed_visitor;

/// A seed reading a string to the variant of `$enum` it names (`"t" => T`), and anything else to
/// the value after `else`.
macro_rules! name_seed {
    ($seed:ident => $enum:ident, $expecting:expr; $($name:literal => $variant:ident,)* else $other:pat => $fallback:expr) => {
        seed_visitor! {
            impl['de] $seed => $enum, deserialize_str, $expecting;
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<$enum, E> {
                Ok(match v {
                    $($name => $enum::$variant,)*
                    $other => $fallback,
                })
            }
        }
    };
}

#[derive(serde::Deserialize)]
pub(super) struct RawPack {
    pub(super) path: String,
    pub(super) size: u64,
}

/// A chunk reference as written; its strings are borrowed from the input when they can be
/// (they always can in manifests we write: no escapes), so a blob costs no allocation.
#[derive(serde::Deserialize)]
pub(super) struct RawChunk<'a> {
    pub(super) pack: u32,
    pub(super) offset: u64,
    pub(super) length: u64,
    #[serde(borrow)]
    pub(super) codec: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    pub(super) blake3: std::borrow::Cow<'a, str>,
}

impl RawChunk<'_> {
    pub(super) fn into_ref<E: de::Error>(self) -> std::result::Result<ChunkRef, E> {
        let codec = Codec::from_name(&self.codec)
            .ok_or_else(|| E::custom(format!("unknown codec {:?} (written by a newer treepack?)", self.codec)))?;
        let hash =
            Hash32::from_hex(&self.blake3).ok_or_else(|| E::custom("`blake3` must be 64 lowercase hex digits"))?;
        Ok(ChunkRef { pack: self.pack, offset: self.offset, length: self.length, codec, hash })
    }
}

pub(super) fn parse_float_text<E: de::Error>(s: &str) -> std::result::Result<f64, E> {
    match s {
        "nan" => Ok(f64::NAN),
        "inf" => Ok(f64::INFINITY),
        "-inf" => Ok(f64::NEG_INFINITY),
        _ => {
            if let Some(hex) = s.strip_prefix("nan:") {
                if let Ok(bits) = u64::from_str_radix(hex, 16) {
                    let f = f64::from_bits(bits);
                    if hex.len() == 16 && f.is_nan() {
                        return Ok(f);
                    }
                }
            }
            Err(E::custom(format!("float string must be nan, inf, -inf or nan:<16 hex bits>, found {s:?}")))
        }
    }
}

pub(super) fn value_float<E: de::Error>(v: &Value) -> std::result::Result<f64, E> {
    match v {
        Value::Number(n) => n.as_f64().ok_or_else(|| E::custom("bad float")),
        Value::String(s) => parse_float_text(s),
        _ => Err(E::custom("a float is a number or a string such as \"nan\"")),
    }
}

/// The entry of a tagged leaf node (`int`, `float`, `complex`, `str`, `bytes`, `array`) whose
/// `t` member has been read; the rest of its members are read from `map`. Containers' tags are
/// not leaves and get an error.
pub(super) fn tagged_leaf<'de, A: MapAccess<'de>>(t: Tag, map: &mut A) -> std::result::Result<Entry, A::Error> {
    match t {
        Tag::Int => {
            let v = expect_one(map, "v", BoundedValue::member("v"))?;
            let i = match &v {
                Value::String(s) => Int::parse(s),
                Value::Number(n) => n.as_i64().map(Int::Small).or_else(|| n.as_u64().map(|u| Int::from_big(u.into()))),
                _ => None,
            };
            Ok(Entry::Int(i.ok_or_else(|| de::Error::custom("int `v` must be a decimal string"))?))
        }
        Tag::Float => {
            let v = expect_one(map, "v", BoundedValue::member("v"))?;
            Ok(Entry::Float(value_float(&v)?))
        }
        Tag::Complex => {
            let v = expect_one(map, "v", BoundedValue::member("v"))?;
            match v.as_array().map(Vec::as_slice) {
                Some([re, im]) => Ok(Entry::Complex(value_float(re)?, value_float(im)?)),
                _ => Err(de::Error::custom("complex `v` must be [real, imag]")),
            }
        }
        Tag::Str | Tag::Bytes => {
            let is_str = t == Tag::Str;
            let (mut size, mut blob, mut b64) = (None, None, None);
            while let Some(k) = map.next_key_seed(MemberSeed)? {
                match k {
                    Member::Size => {
                        dup(&size, "size")?;
                        size = Some(map.next_value::<u64>()?);
                    }
                    Member::Blob => {
                        dup(&blob, "blob")?;
                        blob = Some(map.next_value::<RawChunk<'de>>()?.into_ref()?);
                    }
                    Member::B64 if !is_str => {
                        dup(&b64, "b64")?;
                        b64 = Some(map.next_value_seed(Base64Seed("b64"))?);
                    }
                    _ => skip(map)?,
                }
            }
            let entry = match (b64, size, blob) {
                (Some(b), None, None) => Entry::Bytes(Stored::Inline(b)),
                (None, Some(size), Some(chunk)) if is_str => Entry::Str(Stored::Blob { size, chunk }),
                (None, Some(size), Some(chunk)) => Entry::Bytes(Stored::Blob { size, chunk }),
                _ => {
                    let name = if is_str { "str" } else { "bytes" };
                    return Err(de::Error::custom(format!("{name} node needs `size` and `blob` (or `b64` for bytes)")));
                }
            };
            Ok(entry)
        }
        Tag::Array => {
            let a = parse_array(map)?;
            Ok(Entry::Array(Box::new(a)))
        }
        other => Err(de::Error::custom(format!("{other:?} is not a leaf node type"))),
    }
}

pub(super) fn dup<T, E: de::Error>(slot: &Option<T>, name: &str) -> std::result::Result<(), E> {
    if slot.is_some() {
        return Err(E::custom(format!("duplicate member `{name}`")));
    }
    Ok(())
}

pub(super) fn skip<'de, A: MapAccess<'de>>(map: &mut A) -> std::result::Result<(), A::Error> {
    map.next_value::<IgnoredAny>()?;
    Ok(())
}

/// The value of the single member `v` of a tagged node, read with `seed` (other members are
/// ignored).
pub(super) fn expect_one<'de, A: MapAccess<'de>, S: DeserializeSeed<'de> + Copy>(
    map: &mut A,
    name: &str,
    seed: S,
) -> std::result::Result<S::Value, A::Error> {
    let mut out: Option<S::Value> = None;
    while let Some(k) = map.next_key_seed(MemberSeed)? {
        if k == Member::V {
            dup(&out, name)?;
            out = Some(map.next_value_seed(seed)?);
        } else {
            skip(map)?;
        }
    }
    out.ok_or_else(|| de::Error::custom(format!("missing `{name}`")))
}

/// The member names of tagged node objects, matched without allocating (a 100k-leaf manifest
/// has several hundred thousand of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Member {
    T,
    Items,
    Type,
    Fields,
    Children,
    Data,
    V,
    Id,
    Size,
    Blob,
    B64,
    Dtype,
    Shape,
    ChunkShape,
    Chunks,
    Preview,
    As,
    Other,
}

pub(super) struct MemberSeed;

name_seed! {
    MemberSeed => Member, "a member name";
    "t" => T, "items" => Items, "type" => Type, "fields" => Fields, "children" => Children,
    "data" => Data, "v" => V, "id" => Id, "size" => Size, "blob" => Blob, "b64" => B64,
    "dtype" => Dtype, "shape" => Shape, "chunk_shape" => ChunkShape, "chunks" => Chunks,
    "preview" => Preview, "as" => As,
    else _ => Member::Other
}

/// The value of a node's `t` member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Tag {
    Tuple,
    Dict,
    Record,
    Custom,
    Int,
    Float,
    Complex,
    Str,
    Bytes,
    Array,
    Shared,
    Ref,
    Unknown(String),
}

pub(super) struct TagSeed;

name_seed! {
    TagSeed => Tag, "a node type name";
    "tuple" => Tuple, "dict" => Dict, "record" => Record, "custom" => Custom, "int" => Int,
    "float" => Float, "complex" => Complex, "str" => Str, "bytes" => Bytes, "array" => Array,
    "shared" => Shared, "ref" => Ref,
    else other => Tag::Unknown(other.to_string())
}

/// Base64 text decoded straight from the input (no intermediate `String`).
pub(super) struct Base64Seed(&'static str);

seed_visitor! {
    impl['de] Base64Seed => Bytes, deserialize_str, "base64 text";
    fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Bytes, E> {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(v.as_bytes())
            .map_err(|e| E::custom(format!("bad base64 in `{}`: {e}", self.0)))?;
        Ok(Bytes::from(raw))
    }
}

/// A dtype: a name parsed straight from the input, or a structured dtype object.
pub(super) struct DtypeSeed;

seed_visitor! {
    impl['de] DtypeSeed => DType, deserialize_any, "a dtype name or {\"struct\": [fields]}";
    fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<DType, E> {
        DType::from_name(v).map_err(|e| E::custom(e.to_string()))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> std::result::Result<DType, A::Error> {
        // Bounded while it is read: its struct levels are counted only once it is a `Value`.
        let v = BoundedValue::with_limit("dtype", MAX_DTYPE_JSON_DEPTH).read_map(map)?;
        DType::from_json(&v).map_err(|e| de::Error::custom(e.to_string()))
    }
}

/// Buffers an array's shape and inline data are read into: fresh for the one-pass parser (the
/// vectors become the entry's), reused by the outline (nothing allocated per array).
#[derive(Default)]
pub(super) struct ArrayBufs {
    pub(super) dims: Vec<u64>,
    pub(super) data: Vec<u8>,
}

/// An array's members as read by [`read_array`]; its shape and inline data are in the buffers.
pub(super) struct ArrayRead {
    pub(super) dtype: DType,
    /// `Some((chunk_shape, chunks))` for a chunked array, `None` for inline data.
    pub(super) chunked: Option<(Vec<u64>, Vec<ChunkRef>)>,
    pub(super) preview: Option<Value>,
    pub(super) annotation: Option<Value>,
}

/// An array's members (after `t`), for both readers: each member at most once, `dtype` and
/// `shape` required, and either `data` or both `chunk_shape` and `chunks`. The preview is read
/// whole (so both readers refuse the same bytes) and kept only when asked.
pub(super) fn read_array<'de, A: MapAccess<'de>>(
    map: &mut A,
    bufs: &mut ArrayBufs,
    keep_preview: bool,
) -> std::result::Result<ArrayRead, A::Error> {
    let (mut dtype, mut shape, mut chunk_shape, mut chunks, mut data, mut preview) =
        (None, false, None, None, false, None);
    let mut annotation: Option<Value> = None;
    while let Some(k) = map.next_key_seed(MemberSeed)? {
        match k {
            Member::Dtype => {
                dup(&dtype, "dtype")?;
                dtype = Some(map.next_value_seed(DtypeSeed)?);
            }
            Member::Shape => {
                if shape {
                    return Err(de::Error::custom("duplicate member `shape`"));
                }
                shape = true;
                bufs.dims.clear();
                map.next_value_seed(DimsSeed(&mut bufs.dims))?;
            }
            Member::ChunkShape => {
                dup(&chunk_shape, "chunk_shape")?;
                chunk_shape = Some(map.next_value::<Vec<u64>>()?);
            }
            Member::Chunks => {
                dup(&chunks, "chunks")?;
                let raw: Vec<RawChunk<'de>> = map.next_value()?;
                chunks = Some(raw.into_iter().map(RawChunk::into_ref).collect::<std::result::Result<Vec<_>, _>>()?);
            }
            Member::Data => {
                if data {
                    return Err(de::Error::custom("duplicate member `data`"));
                }
                data = true;
                map.next_value_seed(Base64LenSeed(&mut bufs.data))?;
            }
            Member::Preview => {
                dup(&preview, "preview")?;
                let v = map.next_value_seed(BoundedValue::member("preview"))?;
                preview = Some(keep_preview.then_some(v));
            }
            Member::As => {
                dup(&annotation, "as")?;
                let v = map.next_value_seed(BoundedValue::member("as"))?;
                crate::model::check_annotation(&v).map_err(de::Error::custom)?;
                annotation = Some(v);
            }
            _ => skip(map)?,
        }
    }
    let dtype = dtype.ok_or_else(|| de::Error::custom("array without `dtype`"))?;
    if !shape {
        return Err(de::Error::custom("array without `shape`"));
    }
    let chunked = match (data, chunk_shape, chunks) {
        (true, None, None) => None,
        (false, Some(cs), Some(c)) => Some((cs, c)),
        _ => return Err(de::Error::custom("array needs either `data` or both `chunk_shape` and `chunks`")),
    };
    Ok(ArrayRead { dtype, chunked, preview: preview.flatten(), annotation })
}

/// An array entry, read by the one-pass parser (the buffers become the entry's shape and data).
pub(super) fn parse_array<'de, A: MapAccess<'de>>(map: &mut A) -> std::result::Result<ArrayEntry, A::Error> {
    let mut bufs = ArrayBufs::default();
    let r = read_array(map, &mut bufs, true)?;
    let storage = match r.chunked {
        None => ArrayStorage::Inline(Bytes::from(bufs.data)),
        Some((chunk_shape, chunks)) => ArrayStorage::Chunked { chunk_shape, chunks },
    };
    Ok(ArrayEntry { dtype: r.dtype, shape: bufs.dims, storage, preview: r.preview, annotation: r.annotation })
}

/// An array of dimensions, appended to a reused vector.
pub(super) struct DimsSeed<'v>(pub(super) &'v mut Vec<u64>);

seed_visitor! {
    impl['de] DimsSeed<'_> => (), deserialize_seq, "an array of non-negative integers";
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<(), A::Error> {
        while let Some(d) = seq.next_element::<u64>()? {
            self.0.push(d);
        }
        Ok(())
    }
}

/// Base64 text decoded into a reused buffer, cut to the decoded length (the value).
pub(super) struct Base64LenSeed<'v>(pub(super) &'v mut Vec<u8>);

seed_visitor! {
    impl['de] Base64LenSeed<'_> => u64, deserialize_str, "base64 text";
    fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<u64, E> {
        let engine = &base64::engine::general_purpose::STANDARD;
        self.0.clear();
        self.0.resize(base64::decoded_len_estimate(v.len()), 0);
        let n =
            engine.decode_slice(v.as_bytes(), self.0).map_err(|e| E::custom(format!("bad base64 in `data`: {e}")))?;
        self.0.truncate(n);
        Ok(n as u64)
    }
}

/// The top-level members, read the same way by both readers: each at most once, `format` must
/// be `treepack`, `version` two integers, `writer` a string, `metadata` any JSON nested at most
/// [`MAX_VALUE_DEPTH`](crate::json::MAX_VALUE_DEPTH) deep (read whole so both refuse the
/// same bytes), `packs` checked (paths inside the tree, at most `MAX_PACKS`) as
/// soon as they are read, unknown members skipped; `version`, `packs` and `root` required.
pub(super) trait TopSink<'de> {
    type Root;
    /// The checked packs, before `root` (a builder may read from them while it builds).
    fn packs(&mut self, packs: &[PackInfo]);
    /// A pack path was refused (the one-pass reader names `packs` in its error).
    fn bad_pack(&mut self) {}
    /// The `root` member's value.
    fn root<A: MapAccess<'de>>(&mut self, map: &mut A) -> std::result::Result<Self::Root, A::Error>;
    /// `root` must be the last member (before the trailing hash), as writers put it: the
    /// one-pass parse needs it (see `build_streamed`), whatever the manifest's size.
    fn root_last(&self) -> bool {
        false
    }
}

/// What [`read_top_members`] read.
pub(super) struct Top<R> {
    pub(super) version: (u16, u16),
    pub(super) writer: String,
    pub(super) metadata: Option<Value>,
    pub(super) packs: Vec<PackInfo>,
    pub(super) root: R,
}

pub(super) fn read_top_members<'de, A: MapAccess<'de>, S: TopSink<'de>>(
    mut map: A,
    sink: &mut S,
) -> std::result::Result<Top<S::Root>, A::Error> {
    // Hashed: a hostile manifest may hold a million unknown members.
    let mut seen: HashSet<String> = HashSet::new();
    let (mut version, mut writer, mut metadata, mut packs, mut root) = (None, None, None, None, None);
    while let Some(k) = map.next_key::<String>()? {
        if root.is_some() && k != "manifest_hash" && sink.root_last() {
            return Err(de::Error::custom(format!(
                "member `{k}` after `root`: a one-pass parse needs `root` last, as writers put it (`decode` reads any order)"
            )));
        }
        if !seen.insert(k.clone()) {
            return Err(de::Error::custom(format!("duplicate member `{k}`")));
        }
        match k.as_str() {
            "format" => {
                let f: String = map.next_value()?;
                if f != FORMAT_NAME {
                    return Err(de::Error::custom(format!("format is {f:?}, expected \"treepack\"")));
                }
            }
            "version" => version = Some(map.next_value::<(u16, u16)>()?),
            "writer" => writer = Some(map.next_value::<String>()?),
            "metadata" => metadata = Some(map.next_value_seed(BoundedValue::member("metadata"))?),
            "packs" => {
                let list: Vec<PackInfo> = map
                    .next_value::<Vec<RawPack>>()?
                    .into_iter()
                    .map(|p| PackInfo { path: p.path, size: p.size })
                    .collect();
                for p in &list {
                    if let Err(r) = validate_pack_path(&p.path) {
                        sink.bad_pack();
                        return Err(de::Error::custom(r));
                    }
                }
                if list.len() > MAX_PACKS {
                    return Err(de::Error::custom("too many packs"));
                }
                sink.packs(&list);
                packs = Some(list);
            }
            "root" => root = Some(sink.root(&mut map)?),
            _ => {
                map.next_value::<IgnoredAny>()?;
            }
        }
    }
    let version = version.ok_or_else(|| de::Error::custom("missing `version`"))?;
    let packs = packs.ok_or_else(|| de::Error::custom("missing `packs`"))?;
    let root = root.ok_or_else(|| de::Error::custom("missing `root`"))?;
    Ok(Top { version, writer: writer.unwrap_or_default(), metadata, packs, root })
}

/// What a reader of nodes does with each part of a tagged node object, met in the order the
/// text has them: both readers (the one-pass parser and the outline) read the object through
/// [`read_tagged_node`], so the grammar (which members, each at most once, which are required)
/// and its error messages exist once.
pub(super) trait NodeSink<'de> {
    type Out;
    /// The node's tag is known (before any of its other members is read).
    fn begin<E: de::Error>(&mut self, tag: &Tag) -> std::result::Result<(), E>;
    /// A leaf node (tag `array`, `int`, `str`, ...): read its members after `t`.
    fn leaf<A: MapAccess<'de>>(&mut self, tag: Tag, map: &mut A) -> std::result::Result<Self::Out, A::Error>;
    /// A tuple's or dict's `items`, the next value of `map`.
    fn items<A: MapAccess<'de>>(&mut self, map: &mut A, dict: bool) -> std::result::Result<(), A::Error>;
    /// A record's or custom node's `type`, when it comes before its `fields` or `children`.
    fn named_type<E: de::Error>(&mut self, _custom: bool, _type_name: &str) -> std::result::Result<(), E> {
        Ok(())
    }
    /// A record's `fields` or a custom node's `children`, the next value of `map`.
    fn named<A: MapAccess<'de>>(&mut self, map: &mut A) -> std::result::Result<(), A::Error>;
    /// The tuple or dict is complete.
    fn end_items<E: de::Error>(&mut self, dict: bool) -> std::result::Result<Self::Out, E>;
    /// A shared node's `id` was read (before its `v`).
    fn shared_begin<E: de::Error>(&mut self, id: u64) -> std::result::Result<(), E>;
    /// A shared node's `v`, the next value of `map`.
    fn shared_value<A: MapAccess<'de>>(&mut self, map: &mut A, id: u64) -> std::result::Result<(), A::Error>;
    /// The shared node is complete.
    fn end_shared<E: de::Error>(&mut self, id: u64) -> std::result::Result<Self::Out, E>;
    /// A ref node.
    fn reference<E: de::Error>(&mut self, id: u64) -> std::result::Result<Self::Out, E>;
    /// The record or custom node is complete (`data` is null when absent).
    fn end_named<E: de::Error>(
        &mut self,
        custom: bool,
        type_name: String,
        data: Value,
    ) -> std::result::Result<Self::Out, E>;
}

/// A tagged node object (`{"t": ..., ...}`) after its `t` key, which the caller read (to tell
/// it from a dict written as an object, format 1.4): the tag, then the members it allows, each
/// at most once, unknown members skipped.
pub(super) fn read_tagged_node<'de, A: MapAccess<'de>, S: NodeSink<'de>>(
    mut map: A,
    sink: &mut S,
) -> std::result::Result<S::Out, A::Error> {
    let tag = map.next_value_seed(TagSeed)?;
    sink.begin(&tag)?;
    match tag {
        Tag::Tuple | Tag::Dict => {
            let dict = tag == Tag::Dict;
            let mut items = false;
            while let Some(k) = map.next_key_seed(MemberSeed)? {
                if k != Member::Items {
                    skip(&mut map)?;
                    continue;
                }
                if items {
                    return Err(de::Error::custom("duplicate member `items`"));
                }
                items = true;
                sink.items(&mut map, dict)?;
            }
            if !items {
                return Err(de::Error::custom(if dict { "dict without `items`" } else { "tuple without `items`" }));
            }
            sink.end_items(dict)
        }
        Tag::Record | Tag::Custom => {
            let custom = tag == Tag::Custom;
            let (list_member, list_name) =
                if custom { (Member::Children, "children") } else { (Member::Fields, "fields") };
            let (mut ty, mut listed, mut data) = (None::<String>, false, None::<Value>);
            while let Some(k) = map.next_key_seed(MemberSeed)? {
                if k == Member::Type {
                    dup(&ty, "type")?;
                    let t = map.next_value::<String>()?;
                    if !listed {
                        sink.named_type(custom, &t)?;
                    }
                    ty = Some(t);
                } else if k == list_member {
                    if listed {
                        return Err(de::Error::custom(format!("duplicate member `{list_name}`")));
                    }
                    listed = true;
                    sink.named(&mut map)?;
                } else if k == Member::Data && custom {
                    dup(&data, "data")?;
                    data = Some(map.next_value_seed(BoundedValue::member("data"))?);
                } else {
                    skip(&mut map)?;
                }
            }
            let name = if custom { "custom" } else { "record" };
            let type_name = ty.ok_or_else(|| de::Error::custom(format!("{name} without `type`")))?;
            sink.end_named(custom, type_name, data.unwrap_or(Value::Null))
        }
        Tag::Shared => {
            // `id` first, so a reader knows the object before it reads it (refs inside it are
            // cycles); then `v`, the object.
            let (mut id, mut value) = (None::<u64>, false);
            while let Some(k) = map.next_key_seed(MemberSeed)? {
                match k {
                    Member::Id => {
                        dup(&id, "id")?;
                        let i = map.next_value::<u64>()?;
                        sink.shared_begin(i)?;
                        id = Some(i);
                    }
                    Member::V => {
                        let i = id.ok_or_else(|| de::Error::custom("a shared node's `id` must come before its `v`"))?;
                        if value {
                            return Err(de::Error::custom("duplicate member `v`"));
                        }
                        value = true;
                        sink.shared_value(&mut map, i)?;
                    }
                    _ => skip(&mut map)?,
                }
            }
            let id = id.ok_or_else(|| de::Error::custom("shared node without `id`"))?;
            if !value {
                return Err(de::Error::custom("shared node without `v`"));
            }
            sink.end_shared(id)
        }
        Tag::Ref => {
            let mut id = None::<u64>;
            while let Some(k) = map.next_key_seed(MemberSeed)? {
                if k == Member::Id {
                    dup(&id, "id")?;
                    id = Some(map.next_value::<u64>()?);
                } else {
                    skip(&mut map)?;
                }
            }
            sink.reference(id.ok_or_else(|| de::Error::custom("ref without `id`"))?)
        }
        Tag::Unknown(other) => Err(de::Error::custom(format!(
            "unknown node type {other:?} (written by a newer treepack? see docs/format.md)"
        ))),
        leaf => sink.leaf(leaf, &mut map),
    }
}

/// The shape of a `[key, node]` pair (a dict item, a record field, a custom child), for both
/// readers: a pair with no key.
pub(super) fn empty_pair<E: de::Error>(named: bool) -> E {
    E::custom(if named { "empty pair: expected [name, node]" } else { "empty pair: expected [key, node]" })
}

/// A pair with a key and nothing after it.
pub(super) fn pair_without_value<E: de::Error>() -> E {
    E::custom("pair without a value: expected [key, node]")
}

/// After a pair's key and value: nothing more.
pub(super) fn end_of_pair<'de, A: SeqAccess<'de>>(seq: &mut A) -> std::result::Result<(), A::Error> {
    if seq.next_element::<IgnoredAny>()?.is_some() {
        return Err(de::Error::custom("a pair must have exactly two items"));
    }
    Ok(())
}
