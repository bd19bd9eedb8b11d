//! Tapes: what the parse helper hands the builder's thread. A tape is a stretch of parsed
//! manifest kept as the flat, post-order list of the [`Build`] calls it makes, with the values
//! those calls take in a few arrays, so a helper thread parses and the builder's thread only
//! builds ([`Replay::feed`]). Owned trees did the same job at a cost: an allocation per node and
//! per string on the helper, a walk that clones every dict key on the builder's thread, and a
//! free of each node; a 100k-leaf load then waited on the helper.

use super::build::{Build, KeyRef};
use super::types::{Entry, Stored};
use crate::model::{Int, Key, Step};
use serde_json::Value;
use std::cell::RefCell;

/// One builder call, in the order the parser made it (children before their container).
#[derive(Debug, Clone, Copy)]
enum Op {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    /// An inline string: the next `len` bytes of [`Tape::text`].
    Str(usize),
    /// Any other leaf: the next of [`Tape::entries`].
    Entry,
    /// A list or tuple of the last `n` nodes built.
    List(usize, bool),
    /// A dict of the last `n` nodes built, keyed by the next `n` of [`Tape::keys`].
    Dict(usize),
    /// A record or custom node: the next of [`Tape::named`], its children the last ones built.
    Named,
    SharedBegin(u64),
    Shared(u64),
    Ref(u64),
    /// `enter(Step::Index(i))` (recorded only for builders that keep key paths).
    EnterIndex(usize),
    /// `enter` of the next of [`Tape::steps`].
    Enter,
    Exit,
}

/// A record's or custom node's own values (its children are nodes on the tape).
#[derive(Debug)]
struct Named {
    custom: bool,
    type_name: String,
    data: Value,
    names: Vec<String>,
}

/// In [`Tape::keys`]: the key is the next of [`Tape::typed_keys`] (a string key of
/// [`NEW_KEY_ID`] bytes or more, whose length the other entries cannot hold, is kept there too).
const TYPED_KEY: u32 = u32::MAX;
/// In [`Tape::keys`], with the key's number in the low bits: a string key numbered earlier in
/// the parse (its text is not on the tape again).
const KEY_ID: u32 = 1 << 31;
/// In [`Tape::keys`], with the key's length in the low bits: a string key numbered here, the
/// next number of the parse; its text follows in [`Tape::text`].
const NEW_KEY_ID: u32 = 1 << 30;
/// String keys a parse numbers: at most this many, of at most [`KEY_ID_BYTES`] bytes each
/// (records repeat a few short keys; other keys go on the tape as text each time).
const KEY_IDS: usize = 4096;
/// See [`KEY_IDS`].
const KEY_ID_BYTES: usize = 64;

/// A key-path step kept for replay.
#[derive(Debug)]
enum OwnedStep {
    Key(Key),
    Name(String),
}

/// A parsed stretch of manifest (see the module doc); made by a [`TapeBuilder`].
#[derive(Debug, Default)]
pub struct Tape {
    ops: Vec<Op>,
    text: String,
    /// Dict keys: a string key is the next this-many bytes of `text` (no allocation per key),
    /// or a number ([`KEY_ID`], [`NEW_KEY_ID`]); [`TYPED_KEY`] stands for the next of
    /// `typed_keys`.
    keys: Vec<u32>,
    typed_keys: Vec<Key>,
    entries: Vec<Entry>,
    named: Vec<Named>,
    steps: Vec<OwnedStep>,
}

impl Tape {
    /// The tape emptied, its buffers kept for the next stretch.
    pub fn cleared(mut self) -> Tape {
        self.ops.clear();
        self.text.clear();
        self.keys.clear();
        self.typed_keys.clear();
        self.entries.clear();
        self.named.clear();
        self.steps.clear();
        self
    }
}

impl Tape {
    /// An empty tape with room for what `like` holds: a tape handed over is usually followed by
    /// one of about its size, and growing each from empty would copy its text over and over
    /// (when no replayed tape is back to be reused).
    pub fn sized_like(like: &Tape) -> Tape {
        Tape {
            ops: Vec::with_capacity(like.ops.len()),
            text: String::with_capacity(like.text.len()),
            keys: Vec::with_capacity(like.keys.len()),
            typed_keys: Vec::new(),
            entries: Vec::with_capacity(like.entries.len()),
            named: Vec::with_capacity(like.named.len()),
            steps: Vec::with_capacity(like.steps.len()),
        }
    }
}

/// Hands a full tape over and returns an empty one to go on with (an `Err` stops the parse).
pub type HandOver<'a> = dyn Fn(Tape) -> std::result::Result<Tape, String> + 'a;

/// The builder that records a [`Tape`]; `PATHS` also records `enter`/`exit` (for builders
/// whose [`Build::PATHS`] says they use them).
pub struct TapeBuilder<'a, const PATHS: bool> {
    tape: RefCell<Tape>,
    /// The string keys numbered so far in this parse (see [`KEY_IDS`]): the builder's thread
    /// then makes each once and finds it by number, instead of hashing its text at every use.
    key_ids: RefCell<std::collections::HashMap<Box<str>, u32, ahash::RandomState>>,
    /// With `hand_over`: the tape is handed over once it holds this many ops.
    full_at: usize,
    hand_over: Option<&'a HandOver<'a>>,
}

impl<'a, const PATHS: bool> TapeBuilder<'a, PATHS> {
    /// An empty tape.
    pub fn new() -> Self {
        TapeBuilder { tape: RefCell::default(), key_ids: RefCell::default(), full_at: usize::MAX, hand_over: None }
    }

    /// A tape handed to `hand_over` whenever it holds `full_at` ops (between two nodes), so
    /// another thread can replay it while the parse goes on.
    pub fn streaming(full_at: usize, hand_over: &'a HandOver<'a>) -> Self {
        TapeBuilder { tape: RefCell::default(), key_ids: RefCell::default(), full_at, hand_over: Some(hand_over) }
    }

    /// The tape recorded (since the last hand-over).
    pub fn into_tape(self) -> Tape {
        self.tape.into_inner()
    }

    fn op(&self, op: Op) {
        self.tape.borrow_mut().ops.push(op);
    }

    /// A node's op, then [`TapeBuilder::done`].
    fn node(&self, op: Op) -> std::result::Result<(), String> {
        let mut t = self.tape.borrow_mut();
        t.ops.push(op);
        self.done(t)
    }

    /// After each node, with the tape still borrowed (one borrow per node: this runs for
    /// every value of a manifest): hand the tape over if it is full.
    #[inline]
    fn done(&self, t: std::cell::RefMut<'_, Tape>) -> std::result::Result<(), String> {
        if t.ops.len() < self.full_at {
            return Ok(());
        }
        drop(t);
        let Some(hand_over) = self.hand_over else { return Ok(()) };
        let full = std::mem::take(&mut *self.tape.borrow_mut());
        *self.tape.borrow_mut() = hand_over(full)?;
        Ok(())
    }
}

impl<const PATHS: bool> Default for TapeBuilder<'_, PATHS> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const P: bool> Build for TapeBuilder<'_, P> {
    type Node = ();
    const PATHS: bool = P;
    fn leaf_ref(&self, e: &Entry) -> std::result::Result<(), String> {
        self.leaf(e.clone())
    }
    fn leaf(&self, e: Entry) -> std::result::Result<(), String> {
        let mut t = self.tape.borrow_mut();
        let op = match e {
            Entry::None => Op::None,
            Entry::Bool(v) => Op::Bool(v),
            Entry::Int(Int::Small(v)) => Op::Int(v),
            Entry::Float(v) => Op::Float(v),
            Entry::Str(Stored::Inline(s)) => {
                t.text.push_str(&s);
                Op::Str(s.len())
            }
            e => {
                t.entries.push(e);
                Op::Entry
            }
        };
        t.ops.push(op);
        self.done(t)
    }
    fn none_leaf(&self) -> std::result::Result<(), String> {
        self.node(Op::None)
    }
    fn bool_leaf(&self, v: bool) -> std::result::Result<(), String> {
        self.node(Op::Bool(v))
    }
    fn int_leaf(&self, v: i64) -> std::result::Result<(), String> {
        self.node(Op::Int(v))
    }
    fn float_leaf(&self, v: f64) -> std::result::Result<(), String> {
        self.node(Op::Float(v))
    }
    fn str_leaf(&self, v: &str) -> std::result::Result<(), String> {
        let mut t = self.tape.borrow_mut();
        t.text.push_str(v);
        t.ops.push(Op::Str(v.len()));
        self.done(t)
    }
    fn list(&self, items: Vec<()>, tuple: bool) -> std::result::Result<(), String> {
        self.node(Op::List(items.len(), tuple))
    }
    fn dict(&self, pairs: Vec<(Key, ())>) -> std::result::Result<(), String> {
        self.dict_ref(pairs.into_iter().map(|(k, ())| (KeyRef::Owned(k), ())).collect())
    }
    fn dict_ref(&self, pairs: Vec<(KeyRef<'_>, ())>) -> std::result::Result<(), String> {
        let mut t = self.tape.borrow_mut();
        let mut ids = self.key_ids.borrow_mut();
        t.ops.push(Op::Dict(pairs.len()));
        for (k, ()) in pairs {
            let typed = match k {
                KeyRef::Str(s) if s.len() <= KEY_ID_BYTES => {
                    if let Some(&id) = ids.get(s) {
                        t.keys.push(KEY_ID | id);
                    } else if ids.len() < KEY_IDS {
                        let id = ids.len() as u32;
                        ids.insert(s.into(), id);
                        t.text.push_str(s);
                        t.keys.push(NEW_KEY_ID | s.len() as u32);
                    } else {
                        t.text.push_str(s);
                        t.keys.push(s.len() as u32);
                    }
                    continue;
                }
                KeyRef::Str(s) if s.len() < NEW_KEY_ID as usize => {
                    t.text.push_str(s);
                    t.keys.push(s.len() as u32);
                    continue;
                }
                k => k.into_key(),
            };
            t.keys.push(TYPED_KEY);
            t.typed_keys.push(typed);
        }
        drop(ids);
        self.done(t)
    }
    fn record(&self, type_name: String, fields: Vec<(String, ())>) -> std::result::Result<(), String> {
        let names = fields.into_iter().map(|(n, ())| n).collect();
        let mut t = self.tape.borrow_mut();
        t.named.push(Named { custom: false, type_name, data: Value::Null, names });
        t.ops.push(Op::Named);
        self.done(t)
    }
    fn custom(&self, type_name: String, data: Value, children: Vec<(String, ())>) -> std::result::Result<(), String> {
        let names = children.into_iter().map(|(n, ())| n).collect();
        let mut t = self.tape.borrow_mut();
        t.named.push(Named { custom: true, type_name, data, names });
        t.ops.push(Op::Named);
        self.done(t)
    }
    fn shared_begin(&self, id: u64) {
        self.op(Op::SharedBegin(id));
    }
    fn shared(&self, id: u64, _node: ()) -> std::result::Result<(), String> {
        self.node(Op::Shared(id))
    }
    fn reference(&self, id: u64) -> std::result::Result<(), String> {
        self.node(Op::Ref(id))
    }
    fn enter(&self, step: Step<'_>) {
        if !P {
            return;
        }
        let mut t = self.tape.borrow_mut();
        let op = match step {
            Step::Index(i) => Op::EnterIndex(i),
            Step::Key(k) => {
                t.steps.push(OwnedStep::Key(k.clone()));
                Op::Enter
            }
            Step::Name(n) => {
                t.steps.push(OwnedStep::Name(n.to_string()));
                Op::Enter
            }
        };
        t.ops.push(op);
    }
    fn exit(&self) {
        if P {
            self.op(Op::Exit);
        }
    }
}

/// Makes a builder's nodes from tapes: the same calls, in the same order, the parse that
/// recorded them would have made of the builder (`enter`/`exit` only if recorded). A tape
/// handed over mid-parse ends between two nodes, so the nodes built so far wait here for the
/// container that takes them.
pub struct Replay<N> {
    stack: Vec<N>,
    /// The texts of the string keys the parse numbered, by number.
    key_ids: Vec<Box<str>>,
}

impl<N> Default for Replay<N> {
    fn default() -> Self {
        Replay { stack: Vec::new(), key_ids: Vec::new() }
    }
}

impl<N> Replay<N> {
    /// The nodes of the top level built so far (a whole root: one).
    pub fn finish(self) -> Vec<N> {
        self.stack
    }

    /// Build what `t` records with `b`.
    ///
    /// # Errors
    /// The first error `b` returns, or a tape that does not hold together (never one a
    /// [`TapeBuilder`] recorded).
    pub fn feed<B: Build<Node = N>>(&mut self, b: &B, t: &Tape) -> std::result::Result<(), String> {
        fn next<'t, T>(xs: &'t [T], at: &mut usize) -> std::result::Result<&'t T, String> {
            let x = xs.get(*at).ok_or("a tape ends early")?;
            *at += 1;
            Ok(x)
        }
        fn top<N>(stack: &mut Vec<N>, n: usize) -> std::result::Result<Vec<N>, String> {
            let at = stack.len().checked_sub(n).ok_or("a tape's container has more items than were built")?;
            Ok(stack.split_off(at))
        }
        #[cfg(test)]
        super::tests::REPLAYED.with(|n| n.set(n.get() + 1));
        let (stack, key_ids) = (&mut self.stack, &mut self.key_ids);
        let (mut text, mut keys, mut typed_keys, mut entries, mut named, mut steps) = (0, 0, 0, 0, 0, 0);
        for op in &t.ops {
            let node = match *op {
                Op::None => b.none_leaf()?,
                Op::Bool(v) => b.bool_leaf(v)?,
                Op::Int(v) => b.int_leaf(v)?,
                Op::Float(v) => b.float_leaf(v)?,
                Op::Str(n) => {
                    let s = t.text.get(text..text + n).ok_or("a tape's string ends early")?;
                    text += n;
                    b.str_leaf(s)?
                }
                Op::Entry => b.leaf_ref(next(&t.entries, &mut entries)?)?,
                Op::List(n, tuple) => {
                    let items = top(stack, n)?;
                    b.list(items, tuple)?
                }
                Op::Dict(n) => {
                    let at = stack.len().checked_sub(n).ok_or("a tape's dict has more items than were built")?;
                    let ks = t.keys.get(keys..keys + n).ok_or("a tape's keys end early")?;
                    keys += n;
                    // Keys numbered here are noted first: the pairs then borrow every key's text.
                    let first_new = key_ids.len();
                    let mut at_text = text;
                    for &k in ks {
                        if k != TYPED_KEY && k & KEY_ID == 0 {
                            let len = (k & !NEW_KEY_ID) as usize;
                            if k & NEW_KEY_ID != 0 {
                                key_ids
                                    .push(t.text.get(at_text..at_text + len).ok_or("a tape's key ends early")?.into());
                            }
                            at_text += len;
                        }
                    }
                    let mut new = first_new;
                    // The values move straight into the pairs (no Vec of their own).
                    let mut pairs = Vec::with_capacity(n);
                    for (&k, v) in ks.iter().zip(stack.drain(at..)) {
                        let k = if k == TYPED_KEY {
                            KeyRef::Key(next(&t.typed_keys, &mut typed_keys)?)
                        } else if k & KEY_ID != 0 {
                            let id = k & !KEY_ID;
                            let s = key_ids.get(id as usize).ok_or("a tape's key number was never given")?;
                            KeyRef::Interned(id, s)
                        } else {
                            let len = (k & !NEW_KEY_ID) as usize;
                            let s = t.text.get(text..text + len).ok_or("a tape's key ends early")?;
                            text += len;
                            if k & NEW_KEY_ID != 0 {
                                new += 1;
                                KeyRef::Interned((new - 1) as u32, s)
                            } else {
                                KeyRef::Str(s)
                            }
                        };
                        pairs.push((k, v));
                    }
                    b.dict_ref(pairs)?
                }
                Op::Named => {
                    let nm = next(&t.named, &mut named)?;
                    let kids = top(stack, nm.names.len())?;
                    let kids = nm.names.iter().cloned().zip(kids).collect();
                    if nm.custom {
                        b.custom(nm.type_name.clone(), nm.data.clone(), kids)?
                    } else {
                        b.record(nm.type_name.clone(), kids)?
                    }
                }
                Op::SharedBegin(id) => {
                    b.shared_begin(id);
                    continue;
                }
                Op::Shared(id) => {
                    let v = stack.pop().ok_or("a tape's shared node has no value")?;
                    b.shared(id, v)?
                }
                Op::Ref(id) => b.reference(id)?,
                Op::EnterIndex(i) => {
                    b.enter(Step::Index(i));
                    continue;
                }
                Op::Enter => {
                    match next(&t.steps, &mut steps)? {
                        OwnedStep::Key(k) => b.enter(Step::Key(k)),
                        OwnedStep::Name(n) => b.enter(Step::Name(n)),
                    }
                    continue;
                }
                Op::Exit => {
                    b.exit();
                    continue;
                }
            };
            stack.push(node);
        }
        Ok(())
    }
}
