//! The one-pass reader: the top-level object, nodes, items and pairs, driving a `Build`er.

use super::build::{Build, KeyRef, OwnedTree, Parsed};
use super::parse::{Ctx, PathSeg};
use super::strategy;
use super::types::{Entry, PackInfo, Stored, MAX_DEPTH};
use super::validate::first_duplicate;
use crate::manifest::members::{
    empty_pair, end_of_pair, pair_without_value, read_tagged_node, read_top_members, seed_visitor, tagged_leaf,
    NodeSink, Tag, TopSink,
};
use crate::manifest::split::{parse_items_split, parse_raws};
use crate::model::{Int, Key, Step, Tree};
use crate::refs::RefCheck;
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess};
use serde_json::Value;

pub(super) struct TopSeed<'a, B> {
    pub(super) ctx: &'a Ctx<'a>,
    pub(super) split: bool,
    pub(super) b: &'a B,
}

seed_visitor! {
    impl['de, B: Build] TopSeed<'_, B> => Parsed<B::Node>, deserialize_map, "a treepack manifest object";
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> std::result::Result<Self::Value, A::Error> {
        let t = read_top_members(map, &mut StrictTop(&self))?;
        Ok(Parsed { version: t.version, writer: t.writer, metadata: t.metadata, packs: t.packs, root: t.root })
    }
}

/// The one-pass reader's side of [`read_top_members`]: packs go to the context and the builder, the
/// root to a [`NodeSeed`].
struct StrictTop<'s, 'a, B>(&'s TopSeed<'a, B>);

impl<'de, B: Build> TopSink<'de> for StrictTop<'_, '_, B> {
    type Root = B::Node;
    fn packs(&mut self, packs: &[PackInfo]) {
        if let Some(slot) = self.0.ctx.packs {
            *slot.borrow_mut() = Some(packs.to_vec());
        }
        self.0.b.packs(packs);
    }
    fn bad_pack(&mut self) {
        self.0.ctx.path(|p| p.push(PathSeg::Text("packs".into())));
    }
    fn root<A: MapAccess<'de>>(&mut self, map: &mut A) -> std::result::Result<B::Node, A::Error> {
        let t = self.0;
        map.next_value_seed(NodeSeed { depth: 0, ctx: t.ctx, split: t.split, b: t.b })
    }
    fn root_last(&self) -> bool {
        // The one-pass parse (`build`) checks leaves inline; `decode` reads any order.
        self.0.ctx.packs.is_some()
    }
}

pub(super) struct NodeSeed<'a, B> {
    pub(super) depth: usize,
    pub(super) ctx: &'a Ctx<'a>,
    /// Parse the items of large containers near the root on several threads (see
    /// [`parse_items_split`]); only set for large manifests and parallel builders.
    pub(super) split: bool,
    pub(super) b: &'a B,
}

impl<B> Clone for NodeSeed<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<B> Copy for NodeSeed<'_, B> {}

impl<'a, B> NodeSeed<'a, B> {
    pub(super) fn child(self) -> Self {
        NodeSeed {
            depth: self.depth + 1,
            ctx: self.ctx,
            split: self.split && strategy::split_below(self.depth),
            b: self.b,
        }
    }
    /// The seed that parses a dict key (a small node, always built as an owned tree).
    pub(super) fn key_seed(self) -> NodeSeed<'a, OwnedTree> {
        NodeSeed { depth: self.depth + 1, ctx: self.ctx, split: false, b: &OwnedTree }
    }
    pub(super) fn check_depth<E: de::Error>(&self) -> std::result::Result<(), E> {
        if self.depth >= MAX_DEPTH {
            return Err(E::custom(format!("tree nested deeper than {MAX_DEPTH} levels")));
        }
        Ok(())
    }
}

impl<B: Build> NodeSeed<'_, B> {
    pub(super) fn leaf<E: de::Error>(&self, e: Entry) -> std::result::Result<B::Node, E> {
        self.ctx.check_leaf(&e)?;
        self.b.leaf(e).map_err(E::custom)
    }
}

// The stack check is made where a node recurses (`visit_seq`, `visit_map`): most nodes
// are scalars, and the check costs two thread-local accesses.
seed_visitor! {
    impl['de, B: Build] NodeSeed<'_, B> => B::Node, deserialize_any, "a tree node";
    // Scalars have nothing to check against the packs (and a one-pass parse refuses a
    // manifest whose `packs` come after `root` when it meets that member, or its absence).
    fn visit_unit<E: de::Error>(self) -> std::result::Result<B::Node, E> {
        self.b.none_leaf().map_err(E::custom)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> std::result::Result<B::Node, E> {
        self.b.bool_leaf(v).map_err(E::custom)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<B::Node, E> {
        self.b.int_leaf(v).map_err(E::custom)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<B::Node, E> {
        self.leaf(Entry::Int(Int::from_big(v.into())))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<B::Node, E> {
        self.b.float_leaf(v).map_err(E::custom)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<B::Node, E> {
        // An inline string has nothing to check against the packs.
        self.b.str_leaf(v).map_err(E::custom)
    }
    fn visit_string<E: de::Error>(self, v: String) -> std::result::Result<B::Node, E> {
        self.leaf(Entry::Str(Stored::Inline(v)))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> std::result::Result<B::Node, A::Error> {
        self.check_depth()?;
        crate::model::grow(|| {
            let items = read_items(self, seq)?;
            self.b.list(items, false).map_err(de::Error::custom)
        })
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<B::Node, A::Error> {
        self.check_depth()?;
        crate::model::grow(|| match map.next_key_seed(StrKeySeed)? {
            Some(k) if k.as_str() == Some("t") => read_tagged_node(
                map,
                &mut StrictNode { node: self, items: None, pairs: None, named: None, value: None },
            ),
            first => {
                let pairs = read_object_dict(self, map, first)?;
                self.b.dict_ref(pairs).map_err(de::Error::custom)
            }
        })
    }
}

/// The pairs of a dict written as a JSON object (format 1.4: string keys, in order), whose
/// first key (`None`: the empty dict) the caller has read to tell it from a tagged node.
/// Checked as the `items` form is: unique keys, each value under its key's path.
fn read_object_dict<'de, A: MapAccess<'de>, B: Build>(
    node: NodeSeed<'_, B>,
    mut map: A,
    first: Option<KeyRef<'de>>,
) -> std::result::Result<Vec<(KeyRef<'de>, B::Node)>, A::Error> {
    let pairs = if node.split && B::PARALLEL {
        let mut keys = Vec::new();
        let mut raws: Vec<&'de serde_json::value::RawValue> = Vec::new();
        let mut key = first;
        while let Some(k) = key {
            keys.push(k);
            raws.push(map.next_value()?);
            key = map.next_key_seed(StrKeySeed)?;
        }
        let owned =
            parse_raws(node, &raws, &|n, de| n.child().deserialize(de), |i| Some(PathSeg::Text(keys[i].text())))?;
        let b = node.b;
        keys.into_iter()
            .zip(owned)
            .map(|(k, t)| b.owned(t).map(|v| (k, v)))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(de::Error::custom)?
    } else {
        // Most dicts hold a few pairs (serde_json gives no size hint).
        let mut out = Vec::with_capacity(8);
        let mut key = first;
        while let Some(k) = key {
            let v = under_key(node, &k, || map.next_value_seed(node.child()))?;
            out.push((k, v));
            key = map.next_key_seed(StrKeySeed)?;
        }
        out
    };
    check_unique(node, &pairs)?;
    Ok(pairs)
}

/// Parse a pair's value with `read`, under its key: the key path an error names ends with the
/// key (its text made only then), and builders that keep key paths enter it.
fn under_key<'de, K: PairKey<'de>, B: Build, T, E>(
    node: NodeSeed<'_, B>,
    key: &K,
    read: impl FnOnce() -> std::result::Result<T, E>,
) -> std::result::Result<T, E> {
    let mut at = 0;
    node.ctx.path(|p| {
        p.push(PathSeg::Pending);
        at = p.len() - 1;
    });
    if B::PATHS {
        key.enter(node.b);
    }
    let v = read();
    if B::PATHS {
        node.b.exit();
    }
    match v {
        Ok(v) => {
            node.ctx.path(|p| drop(p.pop()));
            Ok(v)
        }
        Err(e) => {
            node.ctx.path(|p| {
                if let Some(seg) = p.get_mut(at) {
                    *seg = PathSeg::Text(key.text());
                }
            });
            Err(e)
        }
    }
}

/// No key twice in a dict (or name in a record or custom node).
fn check_unique<'de, K: PairKey<'de>, B, V, E: de::Error>(
    node: NodeSeed<'_, B>,
    pairs: &[(K, V)],
) -> std::result::Result<(), E> {
    if let Some(i) = first_duplicate(pairs) {
        let text = pairs[i].0.text();
        let msg = format!("duplicate key `{text}`");
        node.ctx.path(|p| p.push(PathSeg::Text(text)));
        return Err(E::custom(msg));
    }
    Ok(())
}

/// The one-pass reader's side of [`read_tagged_node`]: children built by the builder as they
/// are read, the container built from them at its end.
struct StrictNode<'a, 'de, B: Build> {
    node: NodeSeed<'a, B>,
    items: Option<Vec<B::Node>>,
    pairs: Option<Vec<(KeyRef<'de>, B::Node)>>,
    named: Option<Vec<(String, B::Node)>>,
    value: Option<B::Node>,
}

/// A shared node's `v` may not be a shared node or a ref (an object is one node; a ref whose
/// target is its own value would never reach one).
pub(super) fn check_shared_value<E: de::Error>(ctx: &Ctx<'_>, depth: usize, tag: &Tag) -> std::result::Result<(), E> {
    RefCheck::value(ctx.shared_value.get() == Some(depth) && matches!(tag, Tag::Shared | Tag::Ref)).map_err(E::custom)
}

impl<'de, B: Build> NodeSink<'de> for StrictNode<'_, 'de, B> {
    type Out = B::Node;
    fn begin<E: de::Error>(&mut self, tag: &Tag) -> std::result::Result<(), E> {
        check_shared_value(self.node.ctx, self.node.depth, tag)
    }
    fn shared_begin<E: de::Error>(&mut self, id: u64) -> std::result::Result<(), E> {
        if let Some(rc) = self.node.ctx.refs {
            rc.borrow_mut().begin(id).map_err(E::custom)?;
        }
        self.node.b.shared_begin(id);
        Ok(())
    }
    fn shared_value<A: MapAccess<'de>>(&mut self, map: &mut A, _id: u64) -> std::result::Result<(), A::Error> {
        let child = self.node.child();
        let outer = self.node.ctx.shared_value.replace(Some(child.depth));
        let v = map.next_value_seed(child);
        self.node.ctx.shared_value.set(outer);
        self.value = Some(v?);
        Ok(())
    }
    fn end_shared<E: de::Error>(&mut self, id: u64) -> std::result::Result<B::Node, E> {
        let v = self.value.take().ok_or_else(|| E::custom("shared node without `v`"))?;
        self.node.b.shared(id, v).map_err(E::custom)
    }
    fn reference<E: de::Error>(&mut self, id: u64) -> std::result::Result<B::Node, E> {
        if let Some(rc) = self.node.ctx.refs {
            rc.borrow().reference(id).map_err(E::custom)?;
        }
        self.node.b.reference(id).map_err(E::custom)
    }
    fn leaf<A: MapAccess<'de>>(&mut self, tag: Tag, map: &mut A) -> std::result::Result<B::Node, A::Error> {
        let e = tagged_leaf(tag, map)?;
        self.node.leaf(e)
    }
    fn items<A: MapAccess<'de>>(&mut self, map: &mut A, dict: bool) -> std::result::Result<(), A::Error> {
        if dict {
            self.pairs = Some(map.next_value_seed(PairsSeed::<KeyRef<'de>, B>::new(self.node))?);
        } else {
            self.items = Some(map.next_value_seed(ItemsSeed(self.node))?);
        }
        Ok(())
    }
    fn named_type<E: de::Error>(&mut self, custom: bool, type_name: &str) -> std::result::Result<(), E> {
        self.node.b.named_begin(custom, type_name).map_err(E::custom)
    }
    fn named<A: MapAccess<'de>>(&mut self, map: &mut A) -> std::result::Result<(), A::Error> {
        self.named = Some(map.next_value_seed(PairsSeed::<String, B>::new(self.node))?);
        Ok(())
    }
    fn end_items<E: de::Error>(&mut self, dict: bool) -> std::result::Result<B::Node, E> {
        let b = self.node.b;
        let built = if dict {
            b.dict_ref(self.pairs.take().unwrap_or_default())
        } else {
            b.list(self.items.take().unwrap_or_default(), true)
        };
        built.map_err(E::custom)
    }
    fn end_named<E: de::Error>(
        &mut self,
        custom: bool,
        type_name: String,
        data: Value,
    ) -> std::result::Result<B::Node, E> {
        let named = self.named.take().unwrap_or_default();
        let b = self.node.b;
        let built = if custom { b.custom(type_name, data, named) } else { b.record(type_name, named) };
        built.map_err(E::custom)
    }
}

pub(super) struct ItemsSeed<'a, B>(NodeSeed<'a, B>);

seed_visitor! {
    impl['de, B: Build] ItemsSeed<'_, B> => Vec<B::Node>, deserialize_seq, "an array of nodes";
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> std::result::Result<Self::Value, A::Error> {
        read_items(self.0, seq)
    }
}

pub(super) fn read_items<'de, A: SeqAccess<'de>, B: Build>(
    node: NodeSeed<'_, B>,
    mut seq: A,
) -> std::result::Result<Vec<B::Node>, A::Error> {
    if node.split && B::PARALLEL {
        let owned = parse_items_split(node, seq, &|n, de| n.child().deserialize(de), true)?;
        return owned.into_iter().map(|t| node.b.owned(t).map_err(de::Error::custom)).collect();
    }
    let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
    loop {
        node.ctx.path(|p| p.push(PathSeg::Index(out.len())));
        if B::PATHS {
            node.b.enter(Step::Index(out.len()));
        }
        let next = seq.next_element_seed(node.child());
        if B::PATHS {
            node.b.exit();
        }
        match next? {
            Some(v) => {
                node.ctx.path(|p| drop(p.pop()));
                out.push(v)
            }
            None => {
                node.ctx.path(|p| drop(p.pop()));
                return Ok(out);
            }
        }
    }
}

/// The first item of a `[key, node]` pair: a dict key, or a record field / custom child name.
pub(super) trait PairKey<'de>: Sized + Send {
    /// Read the key as the next element of the pair.
    fn read<A: SeqAccess<'de>, B>(seq: &mut A, node: NodeSeed<'_, B>) -> std::result::Result<Self, A::Error>;
    /// The key type the parallel split parses (its items are parsed from their own texts, so
    /// their keys cannot borrow from this parse's).
    type Owned: for<'x> PairKey<'x>;
    /// This key type's value of a key parsed as [`PairKey::Owned`].
    fn from_owned(k: Self::Owned) -> Self;
    /// `b.enter` the step this key makes in a key path.
    fn enter<B: Build>(&self, b: &B);
    /// The escaped key-path segment text (only computed for errors and typed keys).
    fn text(&self) -> String;
    /// The key itself when it is a string. Two string keys name the same path exactly when the
    /// strings are equal, and never the same path as a typed key (whose text starts with `~` and
    /// a letter no escaped string uses), so duplicates can be found without escaping anything.
    fn plain(&self) -> Option<&str>;
}

impl<'de> PairKey<'de> for KeyRef<'de> {
    type Owned = Key;
    fn from_owned(k: Key) -> Self {
        KeyRef::Owned(k)
    }
    fn read<A: SeqAccess<'de>, B>(seq: &mut A, node: NodeSeed<'_, B>) -> std::result::Result<Self, A::Error> {
        let k = seq.next_element_seed(KeySeed(node.key_seed()))?.ok_or_else(|| empty_pair(false))?;
        Ok(k)
    }
    fn enter<B: Build>(&self, b: &B) {
        self.with_key(|k| b.enter(Step::Key(k)));
    }
    fn text(&self) -> String {
        self.with_key(crate::keypath::key_segment_text)
    }
    fn plain(&self) -> Option<&str> {
        self.as_str()
    }
}

impl<'de> PairKey<'de> for Key {
    type Owned = Key;
    fn from_owned(k: Key) -> Self {
        k
    }
    fn read<A: SeqAccess<'de>, B>(seq: &mut A, node: NodeSeed<'_, B>) -> std::result::Result<Self, A::Error> {
        KeyRef::read(seq, node).map(KeyRef::into_key)
    }
    fn enter<B: Build>(&self, b: &B) {
        b.enter(Step::Key(self));
    }
    fn text(&self) -> String {
        crate::keypath::key_segment_text(self)
    }
    fn plain(&self) -> Option<&str> {
        match self {
            Key::Str(s) => Some(s),
            _ => None,
        }
    }
}

impl<'de> PairKey<'de> for String {
    type Owned = String;
    fn from_owned(k: String) -> Self {
        k
    }
    fn read<A: SeqAccess<'de>, B>(seq: &mut A, _node: NodeSeed<'_, B>) -> std::result::Result<Self, A::Error> {
        seq.next_element::<String>()?.ok_or_else(|| empty_pair(true))
    }
    fn enter<B: Build>(&self, b: &B) {
        b.enter(Step::Name(self));
    }
    fn text(&self) -> String {
        crate::keypath::name_segment_text(self)
    }
    fn plain(&self) -> Option<&str> {
        Some(self)
    }
}

pub(super) struct PairsSeed<'a, K, B> {
    pub(super) node: NodeSeed<'a, B>,
    pub(super) _key: std::marker::PhantomData<K>,
}

impl<'a, K, B> PairsSeed<'a, K, B> {
    pub(super) fn new(node: NodeSeed<'a, B>) -> Self {
        PairsSeed { node, _key: std::marker::PhantomData }
    }
}

seed_visitor! {
    impl['de, K: PairKey<'de>, B: Build] PairsSeed<'_, K, B> => Vec<(K, B::Node)>, deserialize_seq, "an array of [key, node] pairs";
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Self::Value, A::Error> {
        let out: Vec<(K, B::Node)> = if self.node.split && B::PARALLEL {
            let owned = parse_items_split(
                self.node,
                seq,
                &|n, de| PairSeed::<K::Owned, OwnedTree> { node: n, _key: std::marker::PhantomData }.deserialize(de),
                // A pair that fails names its key itself (first segment of its path).
                false,
            )?;
            let b = self.node.b;
            owned
                .into_iter()
                .map(|(k, t)| b.owned(t).map(|v| (K::from_owned(k), v)))
                .collect::<std::result::Result<_, _>>()
                .map_err(de::Error::custom)?
        } else {
            // serde_json gives no size hint; most dicts hold a few pairs, and growing from
            // empty would reallocate twice for each small record.
            let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(8).min(4096));
            while let Some(pair) =
                seq.next_element_seed(PairSeed::<K, B> { node: self.node, _key: std::marker::PhantomData })?
            {
                out.push(pair);
            }
            out
        };
        check_unique(self.node, &out)?;
        Ok(out)
    }
}

pub(super) struct PairSeed<'a, K, B> {
    pub(super) node: NodeSeed<'a, B>,
    pub(super) _key: std::marker::PhantomData<K>,
}

seed_visitor! {
    impl['de, K: PairKey<'de>, B: Build] PairSeed<'_, K, B> => (K, B::Node), deserialize_seq, "a [key, node] pair";
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Self::Value, A::Error> {
        let key = K::read(&mut seq, self.node)?;
        let v = under_key(self.node, &key, || {
            let v = seq.next_element_seed(self.node.child()).and_then(|v| v.ok_or_else(pair_without_value))?;
            end_of_pair(&mut seq)?;
            Ok(v)
        })?;
        Ok((key, v))
    }
}

/// A dict key. String keys (nearly all of them) are borrowed from the text where they have no
/// escapes; the others are read as the nodes they are written as, then converted
/// (`entry_to_key`).
pub(super) struct KeySeed<'a>(pub(super) NodeSeed<'a, OwnedTree>);

seed_visitor! {
    impl['de] KeySeed<'_> => KeyRef<'de>, deserialize_any, "a dict key";
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> std::result::Result<Self::Value, E> {
        Ok(KeyRef::Str(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Self::Value, E> {
        Ok(KeyRef::Owned(Key::Str(v.to_string())))
    }
    fn visit_string<E: de::Error>(self, v: String) -> std::result::Result<Self::Value, E> {
        Ok(KeyRef::Owned(Key::Str(v)))
    }
    fn visit_unit<E: de::Error>(self) -> std::result::Result<Self::Value, E> {
        self.0.visit_unit().and_then(entry_to_key).map(KeyRef::Owned)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> std::result::Result<Self::Value, E> {
        self.0.visit_bool(v).and_then(entry_to_key).map(KeyRef::Owned)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<Self::Value, E> {
        self.0.visit_i64(v).and_then(entry_to_key).map(KeyRef::Owned)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<Self::Value, E> {
        self.0.visit_u64(v).and_then(entry_to_key).map(KeyRef::Owned)
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<Self::Value, E> {
        self.0.visit_f64(v).and_then(entry_to_key).map(KeyRef::Owned)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> std::result::Result<Self::Value, A::Error> {
        crate::model::grow(|| self.0.visit_seq(seq)).and_then(entry_to_key).map(KeyRef::Owned)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> std::result::Result<Self::Value, A::Error> {
        crate::model::grow(|| self.0.visit_map(map)).and_then(entry_to_key).map(KeyRef::Owned)
    }
}

pub(super) fn entry_to_key<E: de::Error>(t: Tree<Entry>) -> std::result::Result<Key, E> {
    Ok(match t {
        Tree::Leaf(Entry::None) => Key::None,
        Tree::Leaf(Entry::Bool(b)) => Key::Bool(b),
        Tree::Leaf(Entry::Int(i)) => Key::Int(i),
        Tree::Leaf(Entry::Float(f)) => Key::Float(f),
        Tree::Leaf(Entry::Str(Stored::Inline(s))) => Key::Str(s),
        Tree::Tuple(items) => Key::Tuple(items.into_iter().map(entry_to_key).collect::<std::result::Result<_, E>>()?),
        other => {
            return Err(E::custom(format!(
                "a dict key must be null, bool, int, float, an inline str or a tuple of these, found {}",
                other.container_kind()
            )))
        }
    })
}

// ---------------------------------------------------------------- validation

/// A string key of an object-form dict (or a tagged node's `t`), borrowed where it can be.
pub(super) struct StrKeySeed;

seed_visitor! {
    impl['de] StrKeySeed => KeyRef<'de>, deserialize_str, "a string key";
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> std::result::Result<Self::Value, E> {
        Ok(KeyRef::Str(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Self::Value, E> {
        Ok(KeyRef::Owned(Key::Str(v.to_string())))
    }
}
