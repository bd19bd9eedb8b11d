//! A structure-only read of a manifest: the tree's shape as a flat stream of events, and what
//! each leaf is (kind, dtype, shape, size, key path) in compact tables, with no per-node
//! allocation and nothing built that a structure listing does not show.
//!
//! Why: `load_structure` of a 100k-leaf tree must build ~125k Python objects, and those can
//! only be built on the thread that holds the interpreter. The full parse (a manifest tree or
//! a [`Build`](crate::manifest::Build)er's nodes) costs about as much again on that same thread. Here
//! another thread parses and streams [`Block`]s of events while the calling thread builds, and
//! the leaves' facts stay in shared tables that the Python objects point into.
//!
//! What is accepted is exactly what the strict parser accepts: the same grammar, the same
//! depth limit, pack paths and leaves checked by the same code (tagged leaves go through the
//! strict parser's own leaf reader and `validate_entry`). The one check left to the consumer
//! is key uniqueness within a dict (a consumer building a hash map sees a repeat as a shorter
//! map and must then refuse it); record field and custom child names are checked here.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::keypath::KeyPath;
use crate::manifest::build::OwnedTree;
use crate::manifest::members::{
    empty_pair, end_of_pair, pair_without_value, read_array, read_tagged_node, read_top_members, seed_visitor,
    tagged_leaf, ArrayBufs, NodeSink, Tag, TopSink,
};
use crate::manifest::nodes::{KeySeed, NodeSeed, StrKeySeed};
use crate::manifest::parse::Ctx;
use crate::manifest::types::{ArrayEntry, ArrayStorage, Entry, PackInfo, MAX_DEPTH};
use crate::manifest::validate::{array_nbytes, check_inline_len, validate_entry};
use crate::model::{Key, Step};
use crate::refs::RefCheck;
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess};
use serde_json::Value;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

mod tree;
pub use tree::{outline_tree, tree_path_budget};

/// Events a [`Block`] holds at most before it is handed over.
pub const BLOCK_EVENTS: usize = 4096;

/// One step of a pre-order walk of the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A dict opens; its items follow, each a key event then the value's events.
    Dict,
    /// A list opens; its items follow.
    List,
    /// A tuple opens; its items follow.
    Tuple,
    /// A record or custom node opens; its type, data and path come with its [`Event::EndNamed`]
    /// (a reader may meet `fields` before `type`).
    Named,
    /// Closes the innermost open dict, list or tuple.
    End,
    /// Closes the innermost open record or custom node: [`Block::named`]`[i]`.
    EndNamed(u32),
    /// The next key of a dict, a string, or the next field/child name of a record or custom
    /// node: `Block::text[start..end]` (see [`Block::text`]).
    Key(u32, u32),
    /// The next key of a dict, of another type: [`Block::keys`]`[i]`.
    TypedKey(u32),
    /// A leaf: row `i` of [`Block::leaves`].
    Leaf(u32),
}

/// A record or custom node, complete.
#[derive(Debug, Clone, PartialEq)]
pub struct NamedNode {
    /// True for a custom node, false for a record.
    pub custom: bool,
    /// The user type the node names.
    pub type_name: String,
    /// A custom node's `data` as compact JSON text (`None` when absent or null).
    pub data: Option<String>,
    /// The node's key path.
    pub path: String,
}

/// A run of consecutive events with what they refer to.
#[derive(Debug, Default)]
pub struct Block {
    /// The events, in walk order.
    pub events: Vec<Event>,
    text: String,
    /// Non-string dict keys, indexed by [`Event::TypedKey`].
    pub keys: Vec<Key>,
    /// Completed record and custom nodes, indexed by [`Event::EndNamed`].
    pub named: Vec<NamedNode>,
    /// Shared, so that objects describing leaves can keep it rather than copies of each row.
    pub leaves: Arc<LeafTable>,
}

impl Block {
    /// This block emptied, to be filled again (its leaf table stays with whoever holds it).
    pub fn reuse(mut self) -> Block {
        self.events.clear();
        self.text.clear();
        self.keys.clear();
        self.named.clear();
        self.leaves = Arc::default();
        self
    }

    /// The text of an [`Event::Key`].
    pub fn text(&self, start: u32, end: u32) -> Option<&str> {
        self.text.get(start as usize..end as usize)
    }
}

/// What a listing shows of a leaf, row by row.
#[derive(Debug, Default)]
pub struct LeafTable {
    rows: Vec<Row>,
    paths: String,
    dims: Vec<u64>,
    dtypes: Vec<DType>,
}

#[derive(Debug, Clone, Copy)]
struct Row {
    path_start: u32,
    path_end: u32,
    /// For a ref: where its target's key path ends in `paths` (it starts at `path_end`).
    dims_start: u32,
    /// `NO_SHAPE` for leaves that are not arrays.
    ndim: u8,
    kind: u8,
    /// 0: none; else 1 + index into `dtypes`.
    dtype: u16,
    inline: bool,
    nbytes: u64,
}

const NO_SHAPE: u8 = u8::MAX;

/// `Entry::kind` names, indexed by `Row::kind`; then `ref`, a place of a shared object (its
/// row's `nbytes` holds the object's id, and its target's key path follows its own in `paths`).
const KINDS: [&str; 9] = ["none", "bool", "int", "float", "complex", "str", "bytes", "array", "ref"];

const NONE: u8 = 0;
const BOOL: u8 = 1;
const INT: u8 = 2;
const FLOAT: u8 = 3;
const STR: u8 = 5;
const ARRAY: u8 = 7;
const REF: u8 = 8;

/// `Row::kind` of an entry (its index in `KINDS`).
fn kind_code(e: &Entry) -> u8 {
    match e {
        Entry::None => NONE,
        Entry::Bool(_) => BOOL,
        Entry::Int(_) => INT,
        Entry::Float(_) => FLOAT,
        Entry::Complex(..) => 4,
        Entry::Str(_) => STR,
        Entry::Bytes(_) => 6,
        Entry::Array(_) => ARRAY,
        // Outlines are read from manifest text, which holds no fragments.
        Entry::Fragment(_) => REF,
    }
}

/// One leaf of a [`LeafTable`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LeafView<'a> {
    /// The leaf's key path.
    pub path: &'a str,
    /// The leaf's kind, as [`Entry::kind`] names it.
    pub kind: &'static str,
    /// Element type, for arrays only.
    pub dtype: Option<&'a DType>,
    /// Shape, for arrays only.
    pub shape: Option<&'a [u64]>,
    /// Byte size of the value, as [`Entry::nbytes`] counts it.
    pub nbytes: u64,
    /// Stored in the manifest itself (no pack read needed).
    pub inline: bool,
    /// For a ref: the key path of the place that holds the shared object (`None` for other
    /// leaves, and for a ref whose object was not met before it).
    pub target: Option<&'a str>,
}

impl LeafTable {
    /// Number of leaves (rows).
    pub fn len(&self) -> usize {
        self.rows.len()
    }
    /// True if the table has no leaves.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
    /// Row `i`, if there is one.
    pub fn get(&self, i: usize) -> Option<LeafView<'_>> {
        let r = self.rows.get(i)?;
        let shape = match r.ndim {
            NO_SHAPE => None,
            n => Some(self.dims.get(r.dims_start as usize..r.dims_start as usize + n as usize)?),
        };
        let target = match r.kind {
            REF if r.dims_start > r.path_end => Some(self.paths.get(r.path_end as usize..r.dims_start as usize)?),
            _ => None,
        };
        Some(LeafView {
            target,
            path: self.paths.get(r.path_start as usize..r.path_end as usize)?,
            kind: KINDS.get(r.kind as usize).copied().unwrap_or("none"),
            dtype: if r.dtype == 0 { None } else { Some(self.dtypes.get(r.dtype as usize - 1)?) },
            shape,
            nbytes: r.nbytes,
            inline: r.inline,
        })
    }
}

/// Read `bytes` (a manifest; its trailing hash is not checked here, see [`check`](crate::manifest::check)) as blocks
/// of events handed to `sink` in order. `sink` returns `false` to stop the read (which then
/// fails). Returns the packs.
///
/// # Errors
/// Whatever the strict parser refuses, with terse messages: call [`decode`](crate::manifest::decode) for the full one.
pub fn outline(bytes: &[u8], file: &str, sink: &mut dyn FnMut(Block) -> bool) -> Result<Vec<PackInfo>> {
    outline_reusing(bytes, file, sink, &mut || None)
}

/// [`outline()`], filling blocks that `spare` hands back (see [`Block::reuse`]) before new ones:
/// their memory is already mapped, where fresh buffers cost a page fault per 4 KiB.
///
/// # Errors
/// As [`outline()`].
pub fn outline_reusing(
    bytes: &[u8],
    file: &str,
    sink: &mut dyn FnMut(Block) -> bool,
    spare: &mut dyn FnMut() -> Option<Block>,
) -> Result<Vec<PackInfo>> {
    let key_path = RefCell::new(Vec::new());
    let st = RefCell::new(State {
        block: Block::default(),
        table: LeafTable::default(),
        path: String::new(),
        starts: Vec::new(),
        path_budget: path_budget(bytes.len()),
        shared: HashMap::new(),
        names: Vec::new(),
        packs: None,
        scratch: ArrayBufs::default(),
        file,
        sink,
        spare,
        stopped: false,
    });
    // Shared ids are checked as the strict parser checks them (a ref to an object not begun
    // before it is refused).
    let refs = RefCell::new(RefCheck::default());
    let key_ctx = Ctx { path: Some(&key_path), packs: None, file, shared_value: Default::default(), refs: Some(&refs) };
    let top = OTop { st: &st, key_ctx: &key_ctx };
    // Text checked as UTF-8 once is read without checking each string again (checking each
    // string is a visible part of the parse). Bytes that are not UTF-8 are read as bytes: the strict parser skips some
    // strings unchecked, and what it accepts must be accepted here too.
    let res = match std::str::from_utf8(bytes) {
        Ok(text) => read_top(top, serde_json::Deserializer::from_str(text)),
        Err(_) => read_top(top, serde_json::Deserializer::from_slice(bytes)),
    };
    let mut st = st.into_inner();
    let at = if st.path.is_empty() { "<root>" } else { &st.path }; // as the strict parser names it
    let packs = res.map_err(|e| Error::manifest(file, at, e.to_string()))?;
    if !st.flush() {
        return Err(Error::manifest(file, "<root>", "the reader stopped"));
    }
    Ok(packs)
}

fn read_top<'de, R: serde_json::de::Read<'de>>(
    top: OTop<'_, '_>,
    mut de: serde_json::Deserializer<R>,
) -> std::result::Result<Vec<PackInfo>, serde_json::Error> {
    de.disable_recursion_limit();
    top.deserialize(&mut de).and_then(|p| de.end().map(|_| p))
}

struct State<'s> {
    block: Block,
    /// The current block's leaves (moved into its `Arc` when the block is handed over).
    table: LeafTable,
    /// Key path of the node being read, and where each open step began in it.
    path: String,
    starts: Vec<usize>,
    /// Bytes of key paths the tables may still take (see [`path_budget`]).
    path_budget: usize,
    /// The key path of each shared object's place, by id: what its refs stand for.
    shared: HashMap<u64, String>,
    /// Field/child names of each open record or custom node, to refuse repeats.
    names: Vec<Names>,
    packs: Option<Vec<PackInfo>>,
    /// Buffers an inline array is read into, kept from one array to the next.
    scratch: ArrayBufs,
    file: &'s str,
    sink: &'s mut dyn FnMut(Block) -> bool,
    spare: &'s mut dyn FnMut() -> Option<Block>,
    stopped: bool,
}

impl State<'_> {
    /// Hand the current block over (if it has anything); false once the reader stopped.
    fn flush(&mut self) -> bool {
        if self.stopped {
            return false;
        }
        if self.block.events.is_empty() {
            return true;
        }
        let next = (self.spare)().unwrap_or_default();
        let mut block = std::mem::replace(&mut self.block, next);
        block.leaves = Arc::new(std::mem::take(&mut self.table));
        self.block.events.reserve(BLOCK_EVENTS);
        self.table.rows.reserve(BLOCK_EVENTS);
        if !(self.sink)(block) {
            self.stopped = true;
        }
        !self.stopped
    }

    /// Room for one more event (handing the full block over first).
    fn room<E: de::Error>(&mut self) -> std::result::Result<(), E> {
        if self.block.events.len() >= BLOCK_EVENTS && !self.flush() {
            return Err(E::custom("the reader stopped"));
        }
        if self.stopped {
            return Err(E::custom("the reader stopped"));
        }
        Ok(())
    }

    fn event<E: de::Error>(&mut self, e: Event) -> std::result::Result<(), E> {
        self.room()?;
        self.block.events.push(e);
        Ok(())
    }

    fn enter(&mut self, step: Step<'_>) {
        self.starts.push(self.path.len());
        if !self.path.is_empty() {
            self.path.push('/');
        }
        crate::keypath::push_step_text(&mut self.path, &step);
    }

    fn exit(&mut self) {
        if let Some(at) = self.starts.pop() {
            self.path.truncate(at);
        }
    }

    fn key_text<E: de::Error>(&mut self, k: &str) -> std::result::Result<(), E> {
        self.room()?;
        let start = self.block.text.len();
        self.block.text.push_str(k);
        let (start, end) = (u32_of(start)?, u32_of(self.block.text.len())?);
        self.block.events.push(Event::Key(start, end));
        Ok(())
    }

    /// Close the innermost record (`custom: false`) or custom node, at the current path.
    fn end_named<E: de::Error>(
        &mut self,
        custom: bool,
        type_name: String,
        data: Option<String>,
    ) -> std::result::Result<(), E> {
        self.charge(self.path.len())?;
        let node = NamedNode { custom, type_name, data, path: self.path.clone() };
        self.room()?;
        let i = u32_of(self.block.named.len())?;
        self.block.named.push(node);
        self.block.events.push(Event::EndNamed(i));
        Ok(())
    }

    /// The packs, which every leaf and typed key needs read first, as in the strict parser.
    fn packs_read<E: de::Error>(&self) -> std::result::Result<&[PackInfo], E> {
        self.packs.as_deref().ok_or_else(|| E::custom("`packs` must come before `root` for a one-pass parse"))
    }

    fn leaf<E: de::Error>(
        &mut self,
        kind: u8,
        dtype: Option<&DType>,
        shape: Option<&[u64]>,
        nbytes: u64,
        inline: bool,
    ) -> std::result::Result<(), E> {
        self.packs_read::<E>()?;
        self.room()?;
        self.charge(self.path.len())?;
        let t = &mut self.table;
        let path_start = u32_of(t.paths.len())?;
        t.paths.push_str(&self.path);
        let dims_start = u32_of(t.dims.len())?;
        let ndim = match shape {
            Some(s) => {
                t.dims.extend_from_slice(s);
                // At most MAX_NDIM (64), checked before any leaf gets here.
                u8::try_from(s.len()).map_err(|_| E::custom("too many dimensions"))?
            }
            None => NO_SHAPE,
        };
        let dtype = match dtype {
            None => 0,
            Some(d) => match t.dtypes.iter().position(|x| x == d) {
                Some(i) => i + 1,
                None => {
                    t.dtypes.push(d.clone());
                    t.dtypes.len()
                }
            },
        };
        let row = Row {
            path_start,
            path_end: u32_of(t.paths.len())?,
            dims_start,
            ndim,
            kind,
            dtype: u16::try_from(dtype).map_err(|_| E::custom("too many dtypes in one block"))?,
            inline,
            nbytes,
        };
        let i = u32_of(t.rows.len())?;
        t.rows.push(row);
        self.block.events.push(Event::Leaf(i));
        Ok(())
    }

    /// Take `n` bytes of key paths from the budget.
    fn charge<E: de::Error>(&mut self, n: usize) -> std::result::Result<(), E> {
        self.path_budget = self.path_budget.checked_sub(n).ok_or_else(|| E::custom(PATHS_TOO_LONG))?;
        Ok(())
    }

    /// The place of shared object `id` begins here.
    fn shared_begin<E: de::Error>(&mut self, id: u64) -> std::result::Result<(), E> {
        if !self.shared.contains_key(&id) {
            self.charge(self.path.len())?;
            self.shared.insert(id, self.path.clone());
        }
        Ok(())
    }

    /// Another place of shared object `id`: a `ref` row, its target's key path right after its
    /// own (a ref has no shape, so `dims_start` says where that path ends).
    fn reference<E: de::Error>(&mut self, id: u64) -> std::result::Result<(), E> {
        self.leaf(REF, None, None, id, true)?;
        let n = self.shared.get(&id).map_or(0, String::len);
        self.charge(n)?;
        let t = &mut self.table;
        if let Some(target) = self.shared.get(&id) {
            t.paths.push_str(target);
        }
        // No target (a ref to an object not met before it, which the strict parser refuses):
        // an empty range, never the dims index `leaf` left there.
        let end = u32_of(t.paths.len())?;
        if let Some(row) = t.rows.last_mut() {
            row.dims_start = end;
        }
        Ok(())
    }

    /// A leaf read through the strict parser: validated as it validates, then recorded.
    fn entry<E: de::Error>(&mut self, e: &Entry) -> std::result::Result<(), E> {
        let packs = self.packs_read()?;
        validate_entry(packs, &KeyPath::root(), e, self.file).map_err(|err| E::custom(err.to_string()))?;
        let (dtype, shape, inline) = match e {
            Entry::Array(a) => (Some(&a.dtype), Some(a.shape.as_slice()), matches!(a.storage, ArrayStorage::Inline(_))),
            _ => (None, None, e.chunks().is_empty()),
        };
        self.leaf(kind_code(e), dtype, shape, e.nbytes(), inline)
    }
}

/// The field or child names of one record or custom node read so far: a list while short,
/// hashed beyond that, so a hostile record with a million fields costs no quadratic time.
#[derive(Default)]
struct Names {
    list: Vec<String>,
    set: Option<HashSet<String>>,
}

impl Names {
    /// Add `name`; false if it was already there.
    fn insert(&mut self, name: &str) -> bool {
        if let Some(set) = &mut self.set {
            return set.insert(name.to_string());
        }
        if self.list.iter().any(|n| n == name) {
            return false;
        }
        self.list.push(name.to_string());
        if self.list.len() > 16 {
            self.set = Some(self.list.drain(..).collect());
        }
        true
    }
}

/// How many bytes of key paths an outline of a manifest of `len` bytes may copy into its tables.
/// Each leaf's row holds its whole key path, so a small hostile manifest (a list of 20k zeros
/// under 20 levels of 1000-byte keys: 61 KB) would otherwise take 390 MB; trees people save
/// take about their manifest's size or less.
pub(super) fn path_budget(len: usize) -> usize {
    (64 << 20).max(len.saturating_mul(64))
}

/// The error of a structure listing (or a selection) past its [`path_budget`].
#[doc(hidden)]
pub const PATHS_TOO_LONG: &str = "its leaves' key paths would take more memory than the manifest allows \
     (leaves nested deep under long keys): load it whole, or open() it and go down to a subtree";

fn u32_of<E: de::Error>(n: usize) -> std::result::Result<u32, E> {
    u32::try_from(n).map_err(|_| E::custom("block too large"))
}

struct OTop<'a, 's> {
    st: &'a RefCell<State<'s>>,
    key_ctx: &'a Ctx<'a>,
}

seed_visitor! {
    impl['de] OTop<'_, '_> => Vec<PackInfo>, deserialize_map, "a treepack manifest object";
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> std::result::Result<Self::Value, A::Error> {
        let mut sink = self;
        read_top_members(map, &mut sink).map(|t| t.packs)
    }
}

/// The outline's side of [`read_top_members`]: packs go to the state, the root to an [`ONode`].
impl<'de> TopSink<'de> for OTop<'_, '_> {
    type Root = ();
    fn packs(&mut self, packs: &[PackInfo]) {
        self.st.borrow_mut().packs = Some(packs.to_vec());
    }
    fn root<A: MapAccess<'de>>(&mut self, map: &mut A) -> std::result::Result<(), A::Error> {
        map.next_value_seed(ONode { depth: 0, st: self.st, key_ctx: self.key_ctx })
    }
}

#[derive(Clone, Copy)]
struct ONode<'a, 's> {
    depth: usize,
    st: &'a RefCell<State<'s>>,
    key_ctx: &'a Ctx<'a>,
}

impl<'a, 's> ONode<'a, 's> {
    fn child(self) -> Self {
        ONode { depth: self.depth + 1, ..self }
    }
    fn check_depth<E: de::Error>(&self) -> std::result::Result<(), E> {
        if self.depth >= MAX_DEPTH {
            return Err(E::custom(format!("tree nested deeper than {MAX_DEPTH} levels")));
        }
        Ok(())
    }
    fn scalar<E: de::Error>(&self, kind: u8, nbytes: u64) -> std::result::Result<(), E> {
        self.st.borrow_mut().leaf(kind, None, None, nbytes, true)
    }
    /// An array's members (after `t`), read by the one-pass parser's own [`read_array`] into
    /// reused buffers: an inline array (most arrays of a big manifest) allocates nothing, its
    /// data decoded only to be checked. Chunked arrays go through `validate_entry` itself.
    fn array<'de, A: MapAccess<'de>>(self, map: &mut A) -> std::result::Result<(), A::Error> {
        let mut bufs = std::mem::take(&mut self.st.borrow_mut().scratch);
        let r = read_array(map, &mut bufs, false).and_then(|a| match a.chunked {
            None => {
                let nbytes = array_nbytes(&a.dtype, &bufs.dims)
                    .and_then(|n| check_inline_len(bufs.data.len() as u64, n).map(|()| n))
                    .map_err(de::Error::custom)?;
                self.st.borrow_mut().leaf(ARRAY, Some(&a.dtype), Some(&bufs.dims), nbytes, true)
            }
            Some((chunk_shape, chunks)) => {
                let e = ArrayEntry {
                    dtype: a.dtype,
                    shape: bufs.dims.clone(),
                    storage: ArrayStorage::Chunked { chunk_shape, chunks },
                    preview: None,
                    annotation: None,
                };
                self.st.borrow_mut().entry(&Entry::Array(Box::new(e)))
            }
        });
        self.st.borrow_mut().scratch = bufs;
        r
    }

    /// Items of a list or tuple, each under its index.
    fn items<'de, A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<(), A::Error> {
        let mut i = 0usize;
        loop {
            self.st.borrow_mut().enter(Step::Index(i));
            let more = seq.next_element_seed(self.child())?;
            self.st.borrow_mut().exit();
            if more.is_none() {
                return Ok(());
            }
            i += 1;
        }
    }
}

// The stack check is made where a node recurses (as in the manifest parser).
seed_visitor! {
    impl['de] ONode<'_, '_> => (), deserialize_any, "a tree node";
    fn visit_unit<E: de::Error>(self) -> std::result::Result<(), E> {
        self.scalar(NONE, 0)
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> std::result::Result<(), E> {
        self.scalar(BOOL, 0)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> std::result::Result<(), E> {
        self.scalar(INT, 0)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> std::result::Result<(), E> {
        self.scalar(INT, 0)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> std::result::Result<(), E> {
        self.scalar(FLOAT, 0)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<(), E> {
        self.scalar(STR, v.len() as u64)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> std::result::Result<(), A::Error> {
        self.check_depth()?;
        crate::model::grow(|| {
            self.st.borrow_mut().event(Event::List)?;
            self.items(seq)?;
            self.st.borrow_mut().event(Event::End)
        })
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<(), A::Error> {
        self.check_depth()?;
        crate::model::grow(|| match map.next_key_seed(StrKeySeed)? {
            Some(k) if k.as_str() == Some("t") => read_tagged_node(map, &mut OSink(self)),
            first => {
                // A dict written as an object (format 1.4): string keys, as `OKey` records them.
                self.st.borrow_mut().event(Event::Dict)?;
                let mut key = first;
                while let Some(k) = key {
                    let k = k.as_str().unwrap_or_default();
                    let mut s = self.st.borrow_mut();
                    s.key_text(k)?;
                    s.enter(Step::Name(k));
                    drop(s);
                    map.next_value_seed(self.child())?;
                    self.st.borrow_mut().exit();
                    key = map.next_key_seed(StrKeySeed)?;
                }
                self.st.borrow_mut().event(Event::End)
            }
        })
    }
}

/// The outline's side of [`read_tagged_node`]: events as the parts are met.
struct OSink<'a, 's>(ONode<'a, 's>);

impl<'de> NodeSink<'de> for OSink<'_, '_> {
    type Out = ();
    fn begin<E: de::Error>(&mut self, tag: &Tag) -> std::result::Result<(), E> {
        crate::manifest::nodes::check_shared_value(self.0.key_ctx, self.0.depth, tag)?;
        let mut st = self.0.st.borrow_mut();
        match tag {
            Tag::Tuple => st.event(Event::Tuple),
            Tag::Dict => st.event(Event::Dict),
            Tag::Record | Tag::Custom => {
                st.event(Event::Named)?;
                st.names.push(Names::default());
                Ok(())
            }
            _ => Ok(()),
        }
    }
    fn shared_begin<E: de::Error>(&mut self, id: u64) -> std::result::Result<(), E> {
        if let Some(rc) = self.0.key_ctx.refs {
            rc.borrow_mut().begin(id).map_err(E::custom)?;
        }
        self.0.st.borrow_mut().shared_begin(id)
    }
    fn shared_value<A: MapAccess<'de>>(&mut self, map: &mut A, _id: u64) -> std::result::Result<(), A::Error> {
        // The object, at this place: the shared wrapper is no place of its own.
        let ctx = self.0.key_ctx;
        let outer = ctx.shared_value.replace(Some(self.0.depth + 1));
        let v = map.next_value_seed(self.0.child());
        ctx.shared_value.set(outer);
        v
    }
    fn end_shared<E: de::Error>(&mut self, _id: u64) -> std::result::Result<(), E> {
        Ok(())
    }
    fn reference<E: de::Error>(&mut self, id: u64) -> std::result::Result<(), E> {
        if let Some(rc) = self.0.key_ctx.refs {
            rc.borrow().reference(id).map_err(E::custom)?;
        }
        self.0.st.borrow_mut().reference(id)
    }
    fn leaf<A: MapAccess<'de>>(&mut self, tag: Tag, map: &mut A) -> std::result::Result<(), A::Error> {
        if tag == Tag::Array {
            return self.0.array(map);
        }
        let e = tagged_leaf(tag, map)?;
        self.0.st.borrow_mut().entry(&e)
    }
    fn items<A: MapAccess<'de>>(&mut self, map: &mut A, dict: bool) -> std::result::Result<(), A::Error> {
        if dict {
            map.next_value_seed(OPairs(OPair { node: self.0, named: false }))
        } else {
            map.next_value_seed(OItems(self.0))
        }
    }
    fn named<A: MapAccess<'de>>(&mut self, map: &mut A) -> std::result::Result<(), A::Error> {
        map.next_value_seed(OPairs(OPair { node: self.0, named: true }))
    }
    fn end_items<E: de::Error>(&mut self, _dict: bool) -> std::result::Result<(), E> {
        self.0.st.borrow_mut().event(Event::End)
    }
    fn end_named<E: de::Error>(&mut self, custom: bool, type_name: String, data: Value) -> std::result::Result<(), E> {
        let mut st = self.0.st.borrow_mut();
        st.names.pop();
        st.end_named(custom, type_name, (!data.is_null()).then(|| data.to_string()))
    }
}

struct OItems<'a, 's>(ONode<'a, 's>);

seed_visitor! {
    impl['de] OItems<'_, '_> => (), deserialize_seq, "an array of nodes";
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> std::result::Result<(), A::Error> {
        self.0.items(seq)
    }
}

/// The `[key, node]` pairs of a dict (`named: false`) or a record/custom node's names.
struct OPairs<'a, 's>(OPair<'a, 's>);

seed_visitor! {
    impl['de] OPairs<'_, '_> => (), deserialize_seq, "an array of [key, node] pairs";
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<(), A::Error> {
        while seq.next_element_seed(self.0)?.is_some() {}
        Ok(())
    }
}

/// One `[key, node]` pair of them.
#[derive(Clone, Copy)]
struct OPair<'a, 's> {
    node: ONode<'a, 's>,
    named: bool,
}

seed_visitor! {
    impl['de] OPair<'_, '_> => (), deserialize_seq, "a [key, node] pair";
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<(), A::Error> {
        let st = self.node.st;
        if self.named {
            let name: std::borrow::Cow<'de, str> = seq.next_element()?.ok_or_else(|| empty_pair(true))?;
            let mut s = st.borrow_mut();
            if s.names.last_mut().is_some_and(|names| !names.insert(&name)) {
                let text = crate::keypath::name_segment_text(&name);
                return Err(de::Error::custom(format!("duplicate key `{text}`")));
            }
            s.key_text(&name)?;
            s.enter(Step::Name(&name));
        } else {
            let key = seq.next_element_seed(OKey(self.node))?.ok_or_else(|| empty_pair(false))?;
            let mut s = st.borrow_mut();
            // A string key was recorded by `OKey` itself.
            if let Some(k) = key {
                s.packs_read()?;
                s.room()?;
                let i = u32_of(s.block.keys.len())?;
                s.enter(Step::Key(&k));
                s.block.keys.push(k);
                s.block.events.push(Event::TypedKey(i));
            }
        }
        let v = seq.next_element_seed(self.node.child())?;
        st.borrow_mut().exit();
        if v.is_none() {
            return Err(pair_without_value());
        }
        end_of_pair(&mut seq)?;
        Ok(())
    }
}

/// A dict key: a string key is recorded (event and path step) at once, with no allocation;
/// other keys are read as the strict parser reads them and returned.
struct OKey<'a, 's>(ONode<'a, 's>);

impl<'a> OKey<'a, '_> {
    fn strict(&self) -> KeySeed<'a> {
        KeySeed(NodeSeed { depth: self.0.depth + 1, ctx: self.0.key_ctx, split: false, b: &OwnedTree })
    }
}

seed_visitor! {
    impl['de] OKey<'_, '_> => Option<Key>, deserialize_any, "a dict key";
    fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Self::Value, E> {
        let mut s = self.0.st.borrow_mut();
        s.key_text(v)?;
        s.enter(Step::Name(v));
        Ok(None)
    }
    fn visit_unit<E: de::Error>(self) -> std::result::Result<Self::Value, E> {
        self.strict().visit_unit().map(|k| Some(k.into_key()))
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> std::result::Result<Self::Value, E> {
        self.strict().visit_bool(v).map(|k| Some(k.into_key()))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<Self::Value, E> {
        self.strict().visit_i64(v).map(|k| Some(k.into_key()))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<Self::Value, E> {
        self.strict().visit_u64(v).map(|k| Some(k.into_key()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<Self::Value, E> {
        self.strict().visit_f64(v).map(|k| Some(k.into_key()))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> std::result::Result<Self::Value, A::Error> {
        self.strict().visit_seq(seq).map(|k| Some(k.into_key()))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> std::result::Result<Self::Value, A::Error> {
        self.strict().visit_map(map).map(|k| Some(k.into_key()))
    }
}

#[cfg(test)]
mod tests;
