//! `Build`: what a parse produces (owned trees, or Python objects in the bindings), and `replay` of owned subtrees.

use super::types::{Entry, PackInfo, Stored};
use crate::model::{Int, Key, Step, Tree};
use serde_json::Value;

/// A manifest's members, with its root built by a [`Build`].
#[derive(Debug)]
pub struct Parsed<N> {
    /// As [`Manifest::version`](super::Manifest::version).
    pub version: (u16, u16),
    /// As [`Manifest::writer`](super::Manifest::writer).
    pub writer: String,
    /// As [`Manifest::metadata`](super::Manifest::metadata).
    pub metadata: Option<Value>,
    /// As [`Manifest::packs`](super::Manifest::packs).
    pub packs: Vec<PackInfo>,
    /// The tree, as the [`Build`] built it.
    pub root: N,
}

/// A dict key as a [`Build`]er gets it (see [`Build::dict_ref`]).
#[derive(Debug, Clone)]
pub enum KeyRef<'a> {
    /// A string key, borrowed from the manifest's text or a [`Tape`](super::Tape)'s.
    Str(&'a str),
    /// Any key, borrowed (an owned tree's, a tape's typed key).
    Key(&'a Key),
    /// Any key the parser made (typed keys; strings with escapes).
    Owned(Key),
    /// A string key a streamed parse numbered (see `Tape`): the same `id` for the same text
    /// throughout one parse, so a builder can make each distinct key once and find it by
    /// index (a log's records repeat the same few keys). Numbers are per parse: a builder
    /// that keeps them serves one parse (every load makes its own builder).
    Interned(u32, &'a str),
}

impl KeyRef<'_> {
    /// The key, owned.
    pub fn into_key(self) -> Key {
        match self {
            KeyRef::Str(s) | KeyRef::Interned(_, s) => Key::Str(s.to_string()),
            KeyRef::Key(k) => k.clone(),
            KeyRef::Owned(k) => k,
        }
    }

    /// The key when it is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            KeyRef::Str(s) | KeyRef::Interned(_, s) => Some(s),
            KeyRef::Key(Key::Str(s)) | KeyRef::Owned(Key::Str(s)) => Some(s),
            _ => None,
        }
    }

    /// Call `f` with the key as a [`Key`] (a string key is copied).
    pub fn with_key<R>(&self, f: impl FnOnce(&Key) -> R) -> R {
        match self {
            KeyRef::Str(s) | KeyRef::Interned(_, s) => f(&Key::Str(s.to_string())),
            KeyRef::Key(k) => f(k),
            KeyRef::Owned(k) => f(k),
        }
    }
}

/// What the manifest parser builds from the nodes it reads, bottom-up: the owned manifest tree
/// ([`OwnedTree`]), or, in the Python bindings, Python objects with no tree in between (a
/// 100k-leaf tree costs ~20 MB and 300k allocations as an owned tree). The parser has checked
/// every node before it is handed over. An `Err` stops the parse with that message.
pub trait Build {
    /// What the builder makes of each node (and of the whole tree).
    type Node;
    /// Big containers are parsed on several threads, as owned trees that `owned` then converts.
    /// Only builders whose conversion is free should say yes.
    const PARALLEL: bool = false;
    /// Builders that must stay on the calling thread (Python objects): a big manifest is then
    /// parsed on a helper thread onto [`Tape`](super::Tape)s this thread replays as they come (see
    /// `build_streamed`).
    const HELPER: bool = false;
    /// The builder uses [`Build::enter`]/[`Build::exit`] (key paths): only then does the
    /// parser make those calls (a string key's step costs a copy of the key) and a streamed
    /// parse record them.
    const PATHS: bool = false;
    /// A leaf, borrowed: builders that only read the entry (Python objects) need no copy, and
    /// leaves of a tree being [`replay`]ed are lent.
    fn leaf_ref(&self, e: &Entry) -> std::result::Result<Self::Node, String>;
    /// A leaf the parser owns; builders that keep the entry (owned trees) take it without a copy.
    fn leaf(&self, e: Entry) -> std::result::Result<Self::Node, String> {
        self.leaf_ref(&e)
    }
    /// A None leaf from a [`Tape`](super::Tape) (as [`Build::leaf_ref`] of [`Entry::None`]): builders that
    /// make values straight from scalars (Python objects) skip the entry (None is common in
    /// trees of records).
    fn none_leaf(&self) -> std::result::Result<Self::Node, String> {
        self.leaf_ref(&Entry::None)
    }
    /// A bool leaf from a [`Tape`](super::Tape) (see [`Build::none_leaf`]).
    fn bool_leaf(&self, v: bool) -> std::result::Result<Self::Node, String> {
        self.leaf_ref(&Entry::Bool(v))
    }
    /// An int leaf of 64 bits from a [`Tape`](super::Tape) (see [`Build::none_leaf`]).
    fn int_leaf(&self, v: i64) -> std::result::Result<Self::Node, String> {
        self.leaf_ref(&Entry::Int(Int::Small(v)))
    }
    /// A float leaf from a [`Tape`](super::Tape) (see [`Build::none_leaf`]).
    fn float_leaf(&self, v: f64) -> std::result::Result<Self::Node, String> {
        self.leaf_ref(&Entry::Float(v))
    }
    /// An inline string leaf, borrowed from the manifest text: builders that copy it anyway
    /// (Python strings) skip the owned copy the parser would otherwise make for each.
    fn str_leaf(&self, v: &str) -> std::result::Result<Self::Node, String> {
        self.leaf(Entry::Str(Stored::Inline(v.to_string())))
    }
    /// A list, or a tuple when `tuple`, of already built items.
    fn list(&self, items: Vec<Self::Node>, tuple: bool) -> std::result::Result<Self::Node, String>;
    /// A dict of built values, pairs in stored (insertion) order.
    fn dict(&self, pairs: Vec<(Key, Self::Node)>) -> std::result::Result<Self::Node, String>;
    /// [`Build::dict`] as the parser, a [`Tape`](super::Tape) or [`replay`] calls it: string keys borrowed
    /// from the text (nearly every key), others as they come. Builders that only read the keys
    /// (Python objects, tapes) override it and copy none.
    fn dict_ref(&self, pairs: Vec<(KeyRef<'_>, Self::Node)>) -> std::result::Result<Self::Node, String> {
        self.dict(pairs.into_iter().map(|(k, v)| (k.into_key(), v)).collect())
    }
    /// A record of the named type, fields in stored order.
    fn record(&self, type_name: String, fields: Vec<(String, Self::Node)>) -> std::result::Result<Self::Node, String>;
    /// A record's (`custom` false) or custom node's type, read before its fields or children
    /// (treepack's writers put `type` first): an error stops the build there, before anything
    /// under the node is built or read. A builder that would refuse the node at [`Build::record`]
    /// or [`Build::custom`] anyway says so here; the default takes every type.
    fn named_begin(&self, _custom: bool, _type_name: &str) -> std::result::Result<(), String> {
        Ok(())
    }
    /// A custom node of the named type, with its JSON `data` (null when absent) and named children
    /// in stored order.
    fn custom(
        &self,
        type_name: String,
        data: Value,
        children: Vec<(String, Self::Node)>,
    ) -> std::result::Result<Self::Node, String>;
    /// A leaf value loaded from packs (or from a loaded [`Node`](crate::model::Node), see
    /// [`replay_values`]), for builders that make loaded trees.
    fn value(&self, _l: crate::model::Leaf) -> std::result::Result<Self::Node, String> {
        Err("this builder does not take loaded values".into())
    }
    /// A leaf whose bytes live in packs, whose value `fetch` reads (verified). Builders that
    /// share one object between leaves of the same stored bytes (as pickle's memo does) may
    /// answer without calling it, and a one-pass load then reads those bytes once.
    fn stored(
        &self,
        _e: &Entry,
        fetch: &mut dyn FnMut() -> std::result::Result<crate::model::Leaf, String>,
    ) -> std::result::Result<Self::Node, String> {
        self.value(fetch()?)
    }
    /// A shared node `id` begins: its object follows, and refs to `id` met inside it are
    /// cycles (builders that make live objects create the object first; see
    /// [`Build::reference`]).
    fn shared_begin(&self, _id: u64) {}
    /// Shared node `id` is complete, its object built as `node`.
    fn shared(&self, id: u64, node: Self::Node) -> std::result::Result<Self::Node, String> {
        let _ = node;
        Err(format!("shared node {id}: this builder does not take shared references"))
    }
    /// A ref to shared node `id` (begun earlier, perhaps not complete: a cycle).
    fn reference(&self, id: u64) -> std::result::Result<Self::Node, String> {
        Err(format!("ref to {id}: this builder does not take shared references"))
    }
    /// An owned subtree from the parallel parse (only called when `PARALLEL`).
    fn owned(&self, _t: Tree<Entry>) -> std::result::Result<Self::Node, String> {
        Err("this builder does not take owned trees".into())
    }
    /// The manifest's packs, as soon as they are read (before `root` in every manifest a writer
    /// makes), for builders that read stored leaves while they build.
    fn packs(&self, _packs: &[PackInfo]) {}
    /// The parser is about to read the child reached by `step` (then calls `exit`); builders
    /// that need each node's key path keep it from these calls.
    fn enter(&self, _step: Step<'_>) {}
    /// The parser has finished the child announced by the matching `enter`.
    fn exit(&self) {}
    /// The child reached by `step` failed to build, its error on the way out: called by
    /// [`replay`] from the failing node outward, so that a builder keeping no key paths as it
    /// builds can still say where it failed (nothing is called while building succeeds).
    fn failed_under(&self, _step: Step<'_>) {}
}

/// Hand an owned subtree to `b` node by node, bottom-up, with the same `enter`/`exit` calls the
/// parser makes: what `b` builds is what it would have built from the text. The tree is only
/// borrowed (leaves go through [`Build::leaf_ref`]), so whichever thread built it frees it.
///
/// # Errors
/// The first error `b` returns.
pub fn replay<B: Build>(b: &B, t: &Tree<Entry>) -> std::result::Result<B::Node, String> {
    replay_with(b, t, &mut |b, e| {
        #[cfg(test)]
        super::tests::REPLAYED.with(|n| n.set(n.get() + 1));
        b.leaf_ref(e)
    })
}

/// [`replay`] of a tree with leaves of any type, each built by `leaf`: one walk for every tree
/// already in memory (a manifest a reader holds, a loaded [`Node`](crate::model::Node)), so a builder's
/// containers are made by the same code whichever source drives it.
///
/// # Errors
/// The first error `b` or `leaf` returns.
pub fn replay_with<B: Build, T>(
    b: &B,
    t: &Tree<T>,
    leaf: &mut LeafFn<'_, B, T>,
) -> std::result::Result<B::Node, String> {
    if let Tree::Leaf(e) = t {
        // Leaves recurse no further: no stack check for most nodes.
        return leaf(b, e);
    }
    crate::model::grow(|| match t {
        Tree::Leaf(e) => leaf(b, e),
        Tree::List(items) | Tree::Tuple(items) => {
            let steps = items.iter().enumerate().map(|(i, c)| (Step::Index(i), c));
            replay_each(b, steps, leaf).and_then(|v| b.list(v, matches!(t, Tree::Tuple(_))))
        }
        Tree::Dict(pairs) => {
            let built = replay_each(b, pairs.iter().map(|(k, c)| (Step::Key(k), c)), leaf)?;
            b.dict_ref(pairs.iter().map(|(k, _)| KeyRef::Key(k)).zip(built).collect())
        }
        Tree::Record { type_name, fields: named } | Tree::Custom { type_name, children: named, .. } => {
            b.named_begin(matches!(t, Tree::Custom { .. }), type_name)?;
            let built = replay_each(b, named.iter().map(|(n, c)| (Step::Name(n), c)), leaf)?;
            let named = named.iter().map(|(n, _)| n.clone()).zip(built).collect();
            match t {
                Tree::Custom { data, .. } => b.custom(type_name.clone(), data.clone(), named),
                _ => b.record(type_name.clone(), named),
            }
        }
        Tree::Shared { id, node } => {
            b.shared_begin(*id);
            let built = replay_with(b, node, leaf)?;
            b.shared(*id, built)
        }
        Tree::Ref(id) => b.reference(*id),
    })
}

/// [`replay`] of a loaded tree, consumed: each leaf value is moved into [`Build::value`], so an
/// array's buffer reaches the builder still unique (a builder may then take it without a copy).
///
/// # Errors
/// The first error `b` returns.
pub fn replay_values<B: Build>(b: &B, mut t: crate::model::Node) -> std::result::Result<B::Node, String> {
    use crate::model::Leaf;
    let mut leaves = Vec::new();
    t.for_each_leaf_mut(&mut |l| leaves.push(std::mem::replace(l, Leaf::None)));
    let mut leaves = leaves.into_iter();
    replay_with(b, &t, &mut |b, _| b.value(leaves.next().ok_or("a leaf went missing")?))
}

/// How [`replay_with`] builds one leaf.
pub type LeafFn<'f, B, T> = dyn FnMut(&B, &T) -> std::result::Result<<B as Build>::Node, String> + 'f;

/// The children of one container, each under its step (the `enter`/`exit` calls of the parser).
fn replay_each<'t, B: Build, T: 't>(
    b: &B,
    kids: impl ExactSizeIterator<Item = (Step<'t>, &'t Tree<T>)>,
    leaf: &mut LeafFn<'_, B, T>,
) -> std::result::Result<Vec<B::Node>, String> {
    let mut out = Vec::with_capacity(kids.len());
    for (step, c) in kids {
        b.enter(step.clone());
        let v = replay_with(b, c, leaf);
        b.exit();
        match v {
            Ok(v) => out.push(v),
            Err(e) => {
                b.failed_under(step);
                return Err(e);
            }
        }
    }
    Ok(out)
}

/// Builds the owned [`Tree<Entry>`] of a [`Manifest`](super::Manifest).
pub struct OwnedTree;

impl Build for OwnedTree {
    type Node = Tree<Entry>;
    const PARALLEL: bool = true;
    fn leaf(&self, e: Entry) -> std::result::Result<Tree<Entry>, String> {
        Ok(Tree::Leaf(e))
    }
    fn leaf_ref(&self, e: &Entry) -> std::result::Result<Tree<Entry>, String> {
        Ok(Tree::Leaf(e.clone()))
    }
    fn list(&self, items: Vec<Tree<Entry>>, tuple: bool) -> std::result::Result<Tree<Entry>, String> {
        Ok(if tuple { Tree::Tuple(items) } else { Tree::List(items) })
    }
    fn dict(&self, pairs: Vec<(Key, Tree<Entry>)>) -> std::result::Result<Tree<Entry>, String> {
        Ok(Tree::Dict(pairs))
    }
    fn record(
        &self,
        type_name: String,
        fields: Vec<(String, Tree<Entry>)>,
    ) -> std::result::Result<Tree<Entry>, String> {
        Ok(Tree::Record { type_name, fields })
    }
    fn custom(
        &self,
        type_name: String,
        data: Value,
        children: Vec<(String, Tree<Entry>)>,
    ) -> std::result::Result<Tree<Entry>, String> {
        Ok(Tree::Custom { type_name, data, children })
    }
    fn owned(&self, t: Tree<Entry>) -> std::result::Result<Tree<Entry>, String> {
        Ok(t)
    }
    // Ids are checked on the whole tree once it is parsed (`refs::check_refs`): parts of a big
    // manifest are parsed on several threads.
    fn shared(&self, id: u64, node: Tree<Entry>) -> std::result::Result<Tree<Entry>, String> {
        Ok(Tree::Shared { id, node: Box::new(node) })
    }
    fn reference(&self, id: u64) -> std::result::Result<Tree<Entry>, String> {
        Ok(Tree::Ref(id))
    }
}
