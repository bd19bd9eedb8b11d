//! The one-pass reader: the top-level object, nodes, items and pairs, driving a `Build`er.

use super::*;

pub(super) struct TopSeed<'a, B> {
    pub(super) ctx: &'a Ctx<'a>,
    pub(super) split: bool,
    pub(super) b: &'a B,
}

impl<'de, B: Build> DeserializeSeed<'de> for TopSeed<'_, B> {
    type Value = Parsed<B::Node>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> std::result::Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, B: Build> Visitor<'de> for TopSeed<'_, B> {
    type Value = Parsed<B::Node>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a treepack manifest object")
    }
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
        self.0.ctx.path.borrow_mut().push(PathSeg::Text("packs".into()));
    }
    fn root<A: MapAccess<'de>>(&mut self, map: &mut A) -> std::result::Result<B::Node, A::Error> {
        let t = self.0;
        map.next_value_seed(NodeSeed { depth: 0, ctx: t.ctx, split: t.split, b: t.b })
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
        NodeSeed { depth: self.depth + 1, ctx: self.ctx, split: self.split && self.depth + 1 < SPLIT_DEPTH, b: self.b }
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

impl<'de, B: Build> DeserializeSeed<'de> for NodeSeed<'_, B> {
    type Value = B::Node;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> std::result::Result<B::Node, D::Error> {
        crate::format::model::grow(|| d.deserialize_any(self))
    }
}

impl<B: Build> NodeSeed<'_, B> {
    pub(super) fn leaf<E: de::Error>(&self, e: Entry) -> std::result::Result<B::Node, E> {
        self.ctx.check_leaf(&e)?;
        self.b.leaf(e).map_err(E::custom)
    }
}

impl<'de, B: Build> Visitor<'de> for NodeSeed<'_, B> {
    type Value = B::Node;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a tree node")
    }
    fn visit_unit<E: de::Error>(self) -> std::result::Result<B::Node, E> {
        self.leaf(Entry::None)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> std::result::Result<B::Node, E> {
        self.leaf(Entry::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<B::Node, E> {
        self.leaf(Entry::Int(Int::Small(v)))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<B::Node, E> {
        self.leaf(Entry::Int(Int::from_big(v.into())))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<B::Node, E> {
        self.leaf(Entry::Float(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<B::Node, E> {
        self.leaf(Entry::Str(Stored::Inline(v.to_string())))
    }
    fn visit_string<E: de::Error>(self, v: String) -> std::result::Result<B::Node, E> {
        self.leaf(Entry::Str(Stored::Inline(v)))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> std::result::Result<B::Node, A::Error> {
        self.check_depth()?;
        let items = read_items(self, seq)?;
        self.b.list(items, false).map_err(de::Error::custom)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<B::Node, A::Error> {
        self.check_depth()?;
        if map.next_key_seed(MemberSeed)? != Some(Member::T) {
            return Err(de::Error::custom("a tagged node object must begin with its \"t\" member"));
        }
        let t = map.next_value_seed(TagSeed)?;
        match t {
            Tag::Tuple => {
                let mut items = None;
                while let Some(k) = map.next_key_seed(MemberSeed)? {
                    match k {
                        Member::Items => {
                            dup(&items, "items")?;
                            items = Some(map.next_value_seed(ItemsSeed(self))?);
                        }
                        _ => skip(&mut map)?,
                    }
                }
                let items = items.ok_or_else(|| de::Error::custom("tuple without `items`"))?;
                self.b.list(items, true).map_err(de::Error::custom)
            }
            Tag::Dict => {
                let mut items = None;
                while let Some(k) = map.next_key_seed(MemberSeed)? {
                    match k {
                        Member::Items => {
                            dup(&items, "items")?;
                            items = Some(map.next_value_seed(PairsSeed::<Key, B>::new(self))?);
                        }
                        _ => skip(&mut map)?,
                    }
                }
                let pairs = items.ok_or_else(|| de::Error::custom("dict without `items`"))?;
                self.b.dict(pairs).map_err(de::Error::custom)
            }
            Tag::Record | Tag::Custom => {
                let (mut ty, mut fields, mut data) = (None, None, None);
                let is_record = t == Tag::Record;
                let (list_member, list_name) =
                    if is_record { (Member::Fields, "fields") } else { (Member::Children, "children") };
                let name = if is_record { "record" } else { "custom" };
                while let Some(k) = map.next_key_seed(MemberSeed)? {
                    if k == Member::Type {
                        dup(&ty, "type")?;
                        ty = Some(map.next_value::<String>()?);
                    } else if k == list_member {
                        dup(&fields, list_name)?;
                        fields = Some(map.next_value_seed(PairsSeed::<String, B>::new(self))?);
                    } else if k == Member::Data && !is_record {
                        dup(&data, "data")?;
                        data = Some(map.next_value::<Value>()?);
                    } else {
                        skip(&mut map)?;
                    }
                }
                let type_name = ty.ok_or_else(|| de::Error::custom(format!("{name} without `type`")))?;
                let named: Vec<(String, B::Node)> = fields.unwrap_or_default();
                if is_record {
                    self.b.record(type_name, named).map_err(de::Error::custom)
                } else {
                    self.b.custom(type_name, data.unwrap_or(Value::Null), named).map_err(de::Error::custom)
                }
            }
            Tag::Unknown(other) => Err(de::Error::custom(format!(
                "unknown node type {other:?} (written by a newer treepack? see docs/format.md)"
            ))),
            leaf => {
                let e = tagged_leaf(leaf, &mut map)?;
                self.leaf(e)
            }
        }
    }
}

pub(super) struct ItemsSeed<'a, B>(NodeSeed<'a, B>);

impl<'de, B: Build> DeserializeSeed<'de> for ItemsSeed<'_, B> {
    type Value = Vec<B::Node>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> std::result::Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, B: Build> Visitor<'de> for ItemsSeed<'_, B> {
    type Value = Vec<B::Node>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of nodes")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> std::result::Result<Self::Value, A::Error> {
        read_items(self.0, seq)
    }
}

pub(super) fn read_items<'de, A: SeqAccess<'de>, B: Build>(
    node: NodeSeed<'_, B>,
    mut seq: A,
) -> std::result::Result<Vec<B::Node>, A::Error> {
    if node.split && B::PARALLEL {
        let owned = parse_items_split(node, seq, |n, de| n.child().deserialize(de), true)?;
        return owned.into_iter().map(|t| node.b.owned(t).map_err(de::Error::custom)).collect();
    }
    if node.split {
        return parse_items_helped(
            node,
            seq,
            |i, n, de| {
                n.ctx.path.borrow_mut().push(PathSeg::Index(i));
                n.b.enter(Step::Index(i));
                let v = n.child().deserialize(de);
                n.b.exit();
                if v.is_ok() {
                    n.ctx.path.borrow_mut().pop();
                }
                v
            },
            |n, de| n.child().deserialize(de),
            |i, t: &Tree<Entry>| {
                node.b.enter(Step::Index(i));
                let v = replay(node.b, t);
                node.b.exit();
                v
            },
            true,
        );
    }
    let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
    loop {
        node.ctx.path.borrow_mut().push(PathSeg::Index(out.len()));
        node.b.enter(Step::Index(out.len()));
        let next = seq.next_element_seed(node.child());
        node.b.exit();
        match next? {
            Some(v) => {
                node.ctx.path.borrow_mut().pop();
                out.push(v)
            }
            None => {
                node.ctx.path.borrow_mut().pop();
                return Ok(out);
            }
        }
    }
}

/// The first item of a `[key, node]` pair: a dict key, or a record field / custom child name.
pub(super) trait PairKey: Sized + Send + Clone {
    /// Read the key as the next element of the pair.
    fn read<'de, A: SeqAccess<'de>, B>(seq: &mut A, node: NodeSeed<'_, B>) -> std::result::Result<Self, A::Error>;
    /// The step this key makes in a key path.
    fn step(&self) -> Step<'_>;
    /// The escaped key-path segment text (only computed for errors and typed keys).
    fn text(&self) -> String;
    /// The key itself when it is a string. Two string keys name the same path exactly when the
    /// strings are equal, and never the same path as a typed key (whose text starts with `~` and
    /// a letter no escaped string uses), so duplicates can be found without escaping anything.
    fn plain(&self) -> Option<&str>;
}

impl PairKey for Key {
    fn read<'de, A: SeqAccess<'de>, B>(seq: &mut A, node: NodeSeed<'_, B>) -> std::result::Result<Self, A::Error> {
        let k = seq
            .next_element_seed(KeySeed(node.key_seed()))?
            .ok_or_else(|| de::Error::custom("empty pair: expected [key, node]"))?;
        Ok(k)
    }
    fn step(&self) -> Step<'_> {
        Step::Key(self)
    }
    fn text(&self) -> String {
        crate::format::keypath::key_segment_text(self)
    }
    fn plain(&self) -> Option<&str> {
        match self {
            Key::Str(s) => Some(s),
            _ => None,
        }
    }
}

impl PairKey for String {
    fn read<'de, A: SeqAccess<'de>, B>(seq: &mut A, _node: NodeSeed<'_, B>) -> std::result::Result<Self, A::Error> {
        seq.next_element::<String>()?.ok_or_else(|| de::Error::custom("empty pair: expected [name, node]"))
    }
    fn step(&self) -> Step<'_> {
        Step::Name(self)
    }
    fn text(&self) -> String {
        crate::format::keypath::name_segment_text(self)
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

impl<'de, K: PairKey, B: Build> DeserializeSeed<'de> for PairsSeed<'_, K, B> {
    type Value = Vec<(K, B::Node)>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> std::result::Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, K: PairKey, B: Build> Visitor<'de> for PairsSeed<'_, K, B> {
    type Value = Vec<(K, B::Node)>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of [key, node] pairs")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Self::Value, A::Error> {
        // A dict at the root is read directly, its members' containers being the ones worth
        // splitting: roots are mostly a few named parts (`params`, `opt_state`, `step`), and
        // scanning one first would tokenize the whole manifest twice.
        let helped = self.node.split && !B::PARALLEL && self.node.depth > 0;
        let out: Vec<(K, B::Node)> = if helped {
            let b = self.node.b;
            parse_items_helped(
                self.node,
                seq,
                |_, n, de| PairSeed::<K, B> { node: n, _key: std::marker::PhantomData }.deserialize(de),
                |n, de| PairSeed::<K, OwnedTree> { node: n, _key: std::marker::PhantomData }.deserialize(de),
                |_, (k, t): &(K, Tree<Entry>)| {
                    b.enter(k.step());
                    let v = replay(b, t);
                    b.exit();
                    v.map(|v| (k.clone(), v))
                },
                false,
            )?
        } else if self.node.split && B::PARALLEL {
            let owned = parse_items_split(
                self.node,
                seq,
                |n, de| PairSeed::<K, OwnedTree> { node: n, _key: std::marker::PhantomData }.deserialize(de),
                // A pair that fails names its key itself (first segment of its path).
                false,
            )?;
            let b = self.node.b;
            owned
                .into_iter()
                .map(|(k, t)| b.owned(t).map(|v| (k, v)))
                .collect::<std::result::Result<_, _>>()
                .map_err(de::Error::custom)?
        } else {
            let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
            while let Some(pair) =
                seq.next_element_seed(PairSeed::<K, B> { node: self.node, _key: std::marker::PhantomData })?
            {
                out.push(pair);
            }
            out
        };
        if let Some(i) = first_duplicate(&out) {
            let text = out[i].0.text();
            let msg = format!("duplicate key `{text}`");
            self.node.ctx.path.borrow_mut().push(PathSeg::Text(text));
            return Err(de::Error::custom(msg));
        }
        Ok(out)
    }
}

pub(super) struct PairSeed<'a, K, B> {
    pub(super) node: NodeSeed<'a, B>,
    pub(super) _key: std::marker::PhantomData<K>,
}

impl<'de, K: PairKey, B: Build> DeserializeSeed<'de> for PairSeed<'_, K, B> {
    type Value = (K, B::Node);
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> std::result::Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, K: PairKey, B: Build> Visitor<'de> for PairSeed<'_, K, B> {
    type Value = (K, B::Node);
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a [key, node] pair")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Self::Value, A::Error> {
        let key = K::read(&mut seq, self.node)?;
        // The key's path text is only formatted if parsing the value fails.
        let at = {
            let mut p = self.node.ctx.path.borrow_mut();
            p.push(PathSeg::Pending);
            p.len() - 1
        };
        let name_here = |e: A::Error| {
            if let Some(seg) = self.node.ctx.path.borrow_mut().get_mut(at) {
                *seg = PathSeg::Text(key.text());
            }
            e
        };
        self.node.b.enter(key.step());
        let v = seq.next_element_seed(self.node.child());
        self.node.b.exit();
        let v = v
            .and_then(|v| v.ok_or_else(|| de::Error::custom("pair without a value: expected [key, node]")))
            .map_err(name_here)?;
        if seq.next_element::<IgnoredAny>().map_err(name_here)?.is_some() {
            return Err(name_here(de::Error::custom("a pair must have exactly two items")));
        }
        self.node.ctx.path.borrow_mut().pop();
        Ok((key, v))
    }
}

/// A dict key. String keys (nearly all of them) become `Key::Str` straight from the text; the
/// others are read as the nodes they are written as, then converted (`entry_to_key`).
pub(super) struct KeySeed<'a>(pub(super) NodeSeed<'a, OwnedTree>);

impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
    type Value = Key;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> std::result::Result<Key, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for KeySeed<'_> {
    type Value = Key;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a dict key")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Key, E> {
        Ok(Key::Str(v.to_string()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> std::result::Result<Key, E> {
        Ok(Key::Str(v))
    }
    fn visit_unit<E: de::Error>(self) -> std::result::Result<Key, E> {
        self.0.visit_unit().and_then(entry_to_key)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> std::result::Result<Key, E> {
        self.0.visit_bool(v).and_then(entry_to_key)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<Key, E> {
        self.0.visit_i64(v).and_then(entry_to_key)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<Key, E> {
        self.0.visit_u64(v).and_then(entry_to_key)
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<Key, E> {
        self.0.visit_f64(v).and_then(entry_to_key)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> std::result::Result<Key, A::Error> {
        crate::format::model::grow(|| self.0.visit_seq(seq)).and_then(entry_to_key)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> std::result::Result<Key, A::Error> {
        crate::format::model::grow(|| self.0.visit_map(map)).and_then(entry_to_key)
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
