//! `Fragment`: a subtree already written as manifest JSON, and the `FragmentWriter` that writes
//! one straight from another walk of the tree (the Python encoder's).
//!
//! Why: for trees of plain values (configs, metrics, traced calls) a save that first builds a
//! `Node` for every value and then a manifest tree from it spends most of its time allocating
//! and copying; writing the text during the one walk of the caller's objects leaves only the
//! text. A fragment holds lists, tuples, dicts with string keys, and leaves stored inline
//! (None, bool, int, float, short strings): nothing that needs a pack, a chunk reference or a
//! shared id, so its text is final the moment it is written, and byte for byte what the
//! manifest writer makes of the same subtree as a tree (`write_node`).

use super::parse::parse_with_ids;
use super::text::{push_int, write_bool, write_float_node, write_int, write_str, Order, ITEMS_END, TUPLE_BEGIN};
use super::types::{Entry, Stored, FORMAT_NAME, VERSION_MAJOR};
use crate::error::{Error, Result};
use crate::model::{grow, Int, Leaf, Node, Tree};
use bytes::Bytes;
use std::fmt;
use std::sync::Arc;

/// Where a writer's text buffer goes once nothing uses it any more (the writer dropped, and the
/// last owner of the text cut from it): the hook of whoever made the writer
/// ([`FragmentWriter::with_buffer`]), which may keep the buffer for its next writer. Saves of
/// scalar trees in a loop (a metrics log) write megabytes of text each time, and a fresh buffer
/// that size is a fresh mapping whose pages the kernel faults in and zeroes on first touch.
pub type Recycle = fn(String);

/// A writer's text, handed to the writer's [`Recycle`] hook when its last owner drops it.
struct Text {
    s: String,
    recycle: Option<Recycle>,
}

impl Drop for Text {
    fn drop(&mut self) {
        if let Some(recycle) = self.recycle {
            recycle(std::mem::take(&mut self.s));
        }
    }
}

impl PartialEq for Text {
    fn eq(&self, other: &Text) -> bool {
        self.s == other.s
    }
}

impl std::ops::Deref for Text {
    type Target = String;
    fn deref(&self) -> &String {
        &self.s
    }
}

/// A subtree as its manifest text (docs/format.md section 4); see the module docs. Made only by
/// a [`FragmentWriter`], so the text is always one well-formed node. Readers never produce one:
/// it exists between a writer's walk of the caller's objects and the manifest.
#[derive(Clone, PartialEq)]
pub struct Fragment {
    /// A `String`, not `Arc<str>`: a whole writer's text becomes a fragment without a copy
    /// (and its buffer, once the last owner drops it, goes to the writer's [`Recycle`] hook).
    text: Arc<Text>,
    leaves: usize,
    containers: u64,
    longest_str: usize,
    /// The ids of the shared nodes inside, in order (consecutive: ids are numbered in
    /// document order).
    shared: std::ops::Range<u64>,
    /// Shared nodes begun before it in the whole tree (its refs may name any of them).
    shared_before: u64,
    /// Shared nodes or refs inside.
    refs: bool,
    /// Dicts inside (all written as objects, format 1.4).
    dicts: u64,
}

impl fmt::Debug for Fragment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fragment({} bytes, {} leaves)", self.text.len(), self.leaves)
    }
}

impl Fragment {
    /// The node's manifest JSON.
    pub fn text(&self) -> &str {
        &self.text
    }
    /// The text as bytes that share the fragment's buffer (no copy).
    pub fn bytes(&self) -> Bytes {
        /// Lends the text's bytes to `Bytes`.
        struct Lent(Arc<Text>);
        impl AsRef<[u8]> for Lent {
            fn as_ref(&self) -> &[u8] {
                self.0.as_bytes()
            }
        }
        Bytes::from_owner(Lent(self.text.clone()))
    }
    /// Leaves inside (what a save's `leaves` statistic counts).
    pub fn leaves(&self) -> usize {
        self.leaves
    }
    /// Lists, tuples and dicts inside, the node itself included: the nodes a writer numbering
    /// shared objects in document order counts here.
    pub fn containers(&self) -> u64 {
        self.containers
    }
    /// The ids of the shared nodes inside (empty for most fragments).
    pub fn shared_ids(&self) -> std::ops::Range<u64> {
        self.shared.clone()
    }
    /// Whether shared nodes or refs are inside (the manifest is then at least version 1.2).
    pub fn has_refs(&self) -> bool {
        self.refs
    }
    /// Whether dicts are inside: a fragment writes every dict as an object (the manifest is
    /// then version 1.4).
    pub fn has_dicts(&self) -> bool {
        self.dicts > 0
    }
    /// UTF-8 bytes of the longest string value inside (keys are always inline): a writer whose inline limit
    /// is lower must store the subtree as a tree instead ([`Fragment::parse`]).
    pub fn longest_str(&self) -> usize {
        self.longest_str
    }

    /// The subtree as a manifest tree, through the manifest parser (for the rare consumers
    /// that need the nodes: a repository's root hash, a lower inline limit).
    ///
    /// # Errors
    /// [`Error::InvalidManifest`] if the text is not one node, which a [`FragmentWriter`]
    /// never makes.
    pub fn parse(&self) -> Result<Tree<Entry>> {
        let doc = format!(
            "{{\"format\":\"{FORMAT_NAME}\",\"version\":[{VERSION_MAJOR},{}],\"writer\":\"\",\"packs\":[],\"root\":{}}}",
            if self.refs { 2 } else { 0 },
            self.text.s
        );
        // Its refs may name shared nodes before it: ids are checked from there on.
        parse_with_ids(doc.as_bytes(), "<fragment>", false, self.shared_before).map(|m| m.root)
    }

    /// The subtree as in-memory nodes (every leaf of a fragment is inline).
    ///
    /// # Errors
    /// As [`Fragment::parse`].
    pub fn to_node(&self) -> Result<Node> {
        self.parse()?.try_map(&mut |path, e| {
            Ok(match e {
                Entry::None => Leaf::None,
                Entry::Bool(b) => Leaf::Bool(b),
                Entry::Int(i) => Leaf::Int(i),
                Entry::Float(f) => Leaf::Float(f),
                Entry::Complex(a, b) => Leaf::Complex(a, b),
                Entry::Str(Stored::Inline(s)) => Leaf::Str(s),
                other => {
                    return Err(Error::manifest("<fragment>", path.to_string(), format!("a {} leaf", other.kind())))
                }
            })
        })
    }
}

impl Node {
    /// The tree with every [`Leaf::Fragment`] replaced by the nodes its text stands for.
    ///
    /// # Errors
    /// A fragment whose text does not parse (a fragment writer's misuse).
    pub fn expand_fragments(&self) -> crate::error::Result<Node> {
        let named = |v: &[(String, Node)]| -> crate::error::Result<Vec<(String, Node)>> {
            v.iter().map(|(k, c)| Ok((k.clone(), grow(|| c.expand_fragments())?))).collect()
        };
        let seq = |v: &[Node]| -> crate::error::Result<Vec<Node>> {
            v.iter().map(|c| grow(|| c.expand_fragments())).collect()
        };
        Ok(match self {
            Tree::Leaf(Leaf::Fragment(f)) => f.to_node()?,
            Tree::Leaf(l) => Tree::Leaf(l.clone()),
            Tree::List(v) => Tree::List(seq(v)?),
            Tree::Tuple(v) => Tree::Tuple(seq(v)?),
            Tree::Dict(v) => Tree::Dict(
                v.iter()
                    .map(|(k, c)| Ok((k.clone(), grow(|| c.expand_fragments())?)))
                    .collect::<crate::error::Result<_>>()?,
            ),
            Tree::Record { type_name, fields } => Tree::Record { type_name: type_name.clone(), fields: named(fields)? },
            Tree::Custom { type_name, data, children } => {
                Tree::Custom { type_name: type_name.clone(), data: data.clone(), children: named(children)? }
            }
            Tree::Shared { id, node } => Tree::Shared { id: *id, node: Box::new(node.expand_fragments()?) },
            Tree::Ref(id) => Tree::Ref(*id),
        })
    }
}

/// A position in a [`FragmentWriter`]'s text, to cut fragments at or go back to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    pos: usize,
    leaves: usize,
    containers: u64,
    dicts: u64,
    /// The next shared id in the whole tree at this point: the shared nodes of a fragment cut
    /// between two marks are those the ids between them were given to (nodes kept out of the
    /// text are never inside a fragment).
    next_id: u64,
}

/// Writes nodes as manifest JSON, exactly as the manifest writer does. The caller walks its
/// tree and calls the methods in document order; it places the commas ([`FragmentWriter::comma`])
/// and closes what it opens. Text can be cut into [`Fragment`]s at [`Mark`]s, or dropped back
/// to a mark (a subtree that turned out to hold something a fragment cannot).
#[derive(Debug, Default)]
pub struct FragmentWriter {
    buf: String,
    leaves: usize,
    containers: u64,
    dicts: u64,
    longest_str: usize,
    /// A shared node or a ref was written: fragments cut from now on say they may hold refs
    /// (an over-approximation only in trees that have refs).
    wrote_refs: bool,
    /// The next shared id in document order, counting shared nodes kept out of the text
    /// ([`FragmentWriter::shared_elsewhere`]). Never rolled back: ids given stay given.
    next_id: u64,
    /// Where the text buffer goes when done with ([`FragmentWriter::with_buffer`]).
    recycle: Option<Recycle>,
}

impl Drop for FragmentWriter {
    fn drop(&mut self) {
        if let Some(recycle) = self.recycle {
            recycle(std::mem::take(&mut self.buf));
        }
    }
}

impl FragmentWriter {
    /// An empty writer.
    pub fn new() -> Self {
        Self::default()
    }
    /// An empty writer with room for `bytes` of text (a caller that saves trees of the same
    /// size again and again avoids growing the buffer each time).
    pub fn with_capacity(bytes: usize) -> Self {
        FragmentWriter { buf: String::with_capacity(bytes), ..Self::default() }
    }
    /// An empty writer that writes into `buf` (cleared first), and hands its text buffer to
    /// `recycle` once nothing uses it: when the writer is dropped, and when the last owner of a
    /// [`Fragment`] cut from it drops that (the whole text split off, or a copy). A caller that
    /// writes big texts again and again keeps one buffer this way (`treepack::save::fragment_writer`).
    pub fn with_buffer(mut buf: String, recycle: Option<Recycle>) -> Self {
        buf.clear();
        FragmentWriter { buf, recycle, ..Self::default() }
    }
    /// Where the text is now.
    pub fn mark(&self) -> Mark {
        Mark {
            pos: self.buf.len(),
            leaves: self.leaves,
            containers: self.containers,
            dicts: self.dicts,
            next_id: self.next_id,
        }
    }
    /// Drop everything written after `m`. Shared ids given after it stay given (they may live
    /// on in fragments cut before): cut no fragment across a truncation.
    pub fn truncate(&mut self, m: Mark) {
        self.buf.truncate(m.pos);
        self.leaves = m.leaves;
        self.containers = m.containers;
        self.dicts = m.dicts;
    }
    /// The text from `m` to the end as a fragment, removed from the writer. The caller must
    /// have written exactly one node since `m`.
    pub fn split_off(&mut self, m: Mark) -> Fragment {
        let end = self.mark();
        if m.pos == 0 {
            // All of the text (a tree that is one fragment): moved, not copied.
            let text = std::mem::take(&mut self.buf);
            self.truncate(m);
            return Fragment {
                text: Arc::new(Text { s: text, recycle: self.recycle }),
                leaves: end.leaves - m.leaves,
                containers: end.containers - m.containers,
                longest_str: self.longest_str,
                shared: m.next_id..end.next_id,
                shared_before: m.next_id,
                refs: self.wrote_refs,
                dicts: end.dicts - m.dicts,
            };
        }
        let f = self.fragment(m, end);
        self.truncate(m);
        f
    }
    /// A copy of the text between two marks as a fragment (exactly one node between them).
    pub fn fragment(&self, from: Mark, to: Mark) -> Fragment {
        Fragment {
            text: Arc::new(Text { s: self.buf[from.pos..to.pos].to_string(), recycle: self.recycle }),
            leaves: to.leaves - from.leaves,
            containers: to.containers - from.containers,
            // Not tracked per range: the longest of the writer's life is an upper bound.
            longest_str: self.longest_str,
            shared: from.next_id..to.next_id,
            shared_before: from.next_id,
            refs: self.wrote_refs,
            dicts: to.dicts - from.dicts,
        }
    }
    /// Shared node `id` begins outside the text (a node the caller keeps: an array, an
    /// image), so that fragments cut after it know their refs may name it.
    pub fn shared_elsewhere(&mut self, id: u64) {
        self.next_id = self.next_id.max(id + 1);
    }
    /// The opening of shared node `id` (the next in document order); its object follows, then
    /// [`FragmentWriter::shared_end`].
    pub fn shared_begin(&mut self, id: u64) {
        self.wrote_refs = true;
        self.next_id = self.next_id.max(id + 1);
        Order::Manifest.shared_begin(&mut self.buf, id);
    }
    /// The end of a shared node.
    pub fn shared_end(&mut self) {
        self.buf.push('}');
    }
    /// A ref to shared node `id`.
    pub fn reference(&mut self, id: u64) {
        self.wrote_refs = true;
        Order::Manifest.reference(&mut self.buf, id);
    }
    /// The separator before every item but the first.
    pub fn comma(&mut self) {
        self.buf.push(',');
    }
    /// A None leaf.
    pub fn none(&mut self) {
        self.leaves += 1;
        self.buf.push_str("null");
    }
    /// A bool leaf.
    pub fn bool(&mut self, v: bool) {
        self.leaves += 1;
        write_bool(&mut self.buf, v);
    }
    /// An int leaf.
    pub fn int(&mut self, v: i64) {
        self.leaves += 1;
        push_int(&mut self.buf, v);
    }
    /// An int leaf of any size.
    pub fn big_int(&mut self, v: &Int) {
        self.leaves += 1;
        write_int(&mut self.buf, v);
    }
    /// A float leaf.
    pub fn float(&mut self, v: f64) {
        self.leaves += 1;
        write_float_node(&mut self.buf, v);
    }
    /// An inline string leaf (the caller keeps it within its inline limit).
    pub fn str(&mut self, v: &str) {
        self.leaves += 1;
        self.longest_str = self.longest_str.max(v.len());
        write_str(&mut self.buf, v);
    }
    /// `[` of a list.
    pub fn list_begin(&mut self) {
        self.containers += 1;
        self.buf.push('[');
    }
    /// `]` of a list.
    pub fn list_end(&mut self) {
        self.buf.push(']');
    }
    /// The opening of a tuple.
    pub fn tuple_begin(&mut self) {
        self.containers += 1;
        self.buf.push_str(TUPLE_BEGIN);
    }
    /// The opening of a dict, written as a JSON object (format 1.4, see [`object_form`](super::object_form)):
    /// its keys are strings, the first not `"t"` (the caller keeps any other dict as a node).
    pub fn dict_begin(&mut self) {
        self.containers += 1;
        self.dicts += 1;
        self.buf.push('{');
    }
    /// The end of a dict.
    pub fn dict_end(&mut self) {
        self.buf.push('}');
    }
    /// The end of a tuple.
    pub fn items_end(&mut self) {
        self.buf.push_str(ITEMS_END);
    }
    /// The key of a dict's next item (the value follows).
    pub fn pair_begin(&mut self, key: &str) {
        write_str(&mut self.buf, key);
        self.buf.push(':');
    }
    /// What [`FragmentWriter::pair_begin`] writes for `key`, for callers that keep it for keys
    /// they meet again and again (the same few keys in every record of a log).
    pub fn pair_begin_text(key: &str) -> PairText {
        PairText::new_in(key, &mut String::with_capacity(key.len() + 3))
    }
    /// [`FragmentWriter::pair_begin`] with its text made by [`FragmentWriter::pair_begin_text`].
    pub fn pair_begin_with(&mut self, text: &PairText) {
        match &text.0 {
            PairRepr::Short { len, bytes } => {
                self.buf.reserve(PAIR_SHORT);
                // SAFETY: the room for all `PAIR_SHORT` bytes was reserved; the bytes kept
                // (`len`) are a `str`'s (`pair_begin_text`), those past them are not kept.
                unsafe {
                    let v = self.buf.as_mut_vec();
                    let at = v.len();
                    std::ptr::write_unaligned(v.as_mut_ptr().add(at).cast::<[u8; PAIR_SHORT]>(), *bytes);
                    v.set_len(at + *len as usize);
                }
            }
            PairRepr::Long(s) => self.buf.push_str(s),
        }
    }
}

/// Longest pair opening kept inline in a [`PairText`].
const PAIR_SHORT: usize = 32;

/// A dict key's pair opening (`"key":`) made once by [`FragmentWriter::pair_begin_text`]. A
/// short one is copied as one fixed-size block: a log of records writes the same few keys in
/// every record, and a `memcpy` call per key is a visible part of such a walk.
#[derive(Debug, Clone)]
pub struct PairText(PairRepr);

impl PairText {
    /// What [`FragmentWriter::pair_begin`] writes for `key`, made in `scratch` (cleared first):
    /// a caller that meets many distinct key objects (a dict of 100k generated keys) makes
    /// each without allocating (an allocation would cost more than the key's text).
    pub fn new_in(key: &str, scratch: &mut String) -> PairText {
        scratch.clear();
        write_str(scratch, key);
        scratch.push(':');
        if scratch.len() <= PAIR_SHORT {
            let mut bytes = [0u8; PAIR_SHORT];
            bytes[..scratch.len()].copy_from_slice(scratch.as_bytes());
            PairText(PairRepr::Short { len: scratch.len() as u8, bytes })
        } else {
            PairText(PairRepr::Long(scratch.clone()))
        }
    }
}

#[derive(Debug, Clone)]
enum PairRepr {
    /// The text is `bytes[..len]`; the rest are zeros.
    Short {
        len: u8,
        bytes: [u8; PAIR_SHORT],
    },
    Long(String),
}

#[cfg(test)]
mod tests {
    use super::super::parse::parse_with;
    use super::super::write::write_node;
    use super::*;

    /// The escape rule written plainly, one char at a time.
    fn reference_str(v: &str) -> String {
        let mut s = String::from("\"");
        for c in v.chars() {
            match c {
                '"' => s.push_str("\\\""),
                '\\' => s.push_str("\\\\"),
                '\n' => s.push_str("\\n"),
                '\r' => s.push_str("\\r"),
                '\t' => s.push_str("\\t"),
                c if (c as u32) < 0x20 || c as u32 == 0x7f => s.push_str(&format!("\\u{:04x}", c as u32)),
                c => s.push(c),
            }
        }
        s.push('"');
        s
    }

    #[test]
    fn strings_are_escaped_as_the_plain_rule_says_at_every_position() {
        let pieces =
            ["a", "\"", "\\", "\n", "\r", "\t", "\u{1}", "\u{1f}", "\u{7f}", " ", "é", "✓", "😀", "\u{80}", "~"];
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for len in 0..48 {
            for _ in 0..40 {
                let v: String = (0..len)
                    .map(|_| {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        // Mostly plain letters, so escapes land at every offset of a word.
                        if seed.is_multiple_of(5) {
                            pieces[(seed >> 8) as usize % pieces.len()]
                        } else {
                            "x"
                        }
                    })
                    .collect();
                let mut s = String::new();
                write_str(&mut s, &v);
                assert_eq!(s, reference_str(&v), "{v:?}");
                // After text already there, in a buffer with no room to spare.
                let mut s = String::from("[1,");
                s.shrink_to_fit();
                write_str(&mut s, &v);
                assert_eq!(s, format!("[1,{}", reference_str(&v)), "{v:?}");
            }
        }
    }

    /// `{"a": [1, 2.5, None, True, "x\n"], "t": (), "big": 2**70, "d": {"k": [[]]}}`, written
    /// by the fragment writer.
    fn sample(w: &mut FragmentWriter) {
        w.dict_begin();
        w.pair_begin("a");
        w.list_begin();
        w.int(1);
        w.comma();
        w.float(2.5);
        w.comma();
        w.none();
        w.comma();
        w.bool(true);
        w.comma();
        w.str("x\n");
        w.list_end();
        w.comma();
        w.pair_begin("t");
        w.tuple_begin();
        w.items_end();
        w.comma();
        w.pair_begin("big");
        w.big_int(&Int::parse("1180591620717411303424").unwrap_or(Int::Small(0)));
        w.comma();
        w.pair_begin("d");
        w.dict_begin();
        w.pair_begin("k");
        w.list_begin();
        w.list_begin();
        w.list_end();
        w.list_end();
        w.dict_end();
        w.dict_end();
    }

    fn sample_node() -> Node {
        Node::dict([
            ("a", Node::list([Node::from(1i64), Node::from(2.5), Node::none(), Node::from(true), Node::from("x\n")])),
            ("t", Node::tuple([])),
            ("big", Tree::Leaf(Leaf::Int(Int::parse("1180591620717411303424").unwrap_or(Int::Small(0))))),
            ("d", Node::dict([("k", Node::list([Node::list([])]))])),
        ])
    }

    #[test]
    fn fragments_are_the_text_the_manifest_writer_makes() {
        let mut w = FragmentWriter::new();
        w.list_begin();
        let m = w.mark();
        sample(&mut w);
        let f = w.fragment(m, w.mark());
        w.list_end();
        assert_eq!((f.leaves(), f.containers(), f.longest_str(), f.has_dicts()), (6, 6, 2, true));
        let tree = f.parse().expect("fragment parses");
        let mut s = String::new();
        write_node(&mut s, &tree);
        assert_eq!(s, f.text());
        assert!(f.to_node().expect("to node").exact_eq(&sample_node()));
        // Cut out of a longer text, or the whole text moved out: the same fragment.
        let whole = w.split_off(Mark { pos: 0, leaves: 0, containers: 0, dicts: 0, next_id: 0 });
        assert_eq!(whole.text(), format!("[{}]", f.text()));
        assert_eq!(w.mark(), Mark { pos: 0, leaves: 0, containers: 0, dicts: 0, next_id: 0 });
        // Dropping back to a mark forgets what came after.
        w.list_begin();
        let m = w.mark();
        w.int(5);
        w.truncate(m);
        w.list_end();
        assert_eq!(w.split_off(Mark { pos: 0, leaves: 0, containers: 0, dicts: 0, next_id: 0 }).text(), "[]");
    }

    #[test]
    fn fragments_with_shared_nodes_know_their_ids_and_parse_after_earlier_ones() {
        // [ {"t":"shared","id":3,"v":[1]}, {"t":"ref","id":3}, {"t":"ref","id":0} ] where ids
        // 0-2 began before this text.
        let mut w = FragmentWriter::new();
        w.shared_elsewhere(2); // ids 0-2 given to nodes kept out of the text
        let begin = w.mark();
        w.list_begin();
        let from = w.mark();
        w.shared_begin(3);
        w.list_begin();
        w.int(1);
        w.list_end();
        w.shared_end();
        let mid = w.mark();
        w.comma();
        w.reference(3);
        w.comma();
        let before_ref = w.mark();
        w.reference(0);
        let after_ref = w.mark();
        w.list_end();
        let to = w.mark();
        let inner = w.fragment(from, mid);
        assert_eq!(inner.text(), r#"{"t":"shared","id":3,"v":[1]}"#);
        assert_eq!((inner.shared_ids(), inner.has_refs()), (3..4, true));
        let whole = w.fragment(begin, to);
        assert_eq!((whole.shared_ids(), whole.has_refs()), (3..4, true));
        // A ref alone, to an id given before it: parsed knowing the ids before it.
        let last = w.fragment(before_ref, after_ref);
        assert!(last.has_refs() && last.shared_ids().is_empty());
        assert!(matches!(last.parse().expect("a ref to an earlier id"), Tree::Ref(0)));
        assert!(matches!(w.fragment(from, mid).parse().expect("parses"), Tree::Shared { id: 3, .. }));
        let tree = whole.parse().expect("parses with ids from 3 on");
        let mut s = String::new();
        write_node(&mut s, &tree);
        assert_eq!(s, whole.text());
        // Dropping back to a mark keeps the ids given (they may live on in fragments cut
        // before): text written after it holds none of them. A writer that wrote refs says its
        // fragments may hold some; one that did not, that they hold none.
        w.truncate(from);
        let again = w.mark();
        w.int(2);
        let plain = w.fragment(again, w.mark());
        assert!(plain.shared_ids().is_empty() && plain.has_refs());
        let mut fresh = FragmentWriter::new();
        let m = fresh.mark();
        fresh.int(2);
        let f = fresh.fragment(m, fresh.mark());
        assert!(f.shared_ids().is_empty() && !f.has_refs());
        // Read as a whole manifest (ids from 0), the same text is refused: 3 is out of order.
        let doc = format!(
            "{{\"format\":\"{FORMAT_NAME}\",\"version\":[1,2],\"writer\":\"\",\"packs\":[],\"root\":{}}}",
            whole.text()
        );
        let e = parse_with(doc.as_bytes(), "<doc>", false).expect_err("ids must start at 0");
        assert!(e.to_string().contains("out of order"), "{e}");
    }

    /// A writer's buffer goes to its hook once its fragment and the bytes lent from it are
    /// dropped (the whole text split off), or when the writer is (what it kept); copies cut
    /// from it go there too. (The pool the engine keeps with it is tested in the engine.)
    #[test]
    fn a_dropped_text_buffer_goes_to_the_writers_hook() {
        static GIVEN: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());
        fn recycle(s: String) {
            GIVEN.lock().unwrap().push(s.capacity());
        }
        let given = || std::mem::take(&mut *GIVEN.lock().unwrap());
        let mut w = FragmentWriter::with_buffer(String::with_capacity(3 << 20), Some(recycle));
        w.list_begin();
        for i in 0..200_000 {
            if i > 0 {
                w.comma();
            }
            w.int(i);
        }
        w.list_end();
        let copy = w.fragment(Mark { pos: 0, leaves: 0, containers: 0, dicts: 0, next_id: 0 }, w.mark());
        let f = w.split_off(Mark { pos: 0, leaves: 0, containers: 0, dicts: 0, next_id: 0 });
        let bytes = f.bytes();
        let at = f.text().as_ptr();
        drop(f);
        // Still lent out as bytes: not given back yet.
        assert_eq!(bytes.as_ptr(), at);
        assert_eq!(given(), Vec::<usize>::new());
        drop(bytes);
        assert_eq!(given(), vec![3 << 20]);
        drop(copy);
        assert_eq!(given().len(), 1);
        // The writer gives back what it holds (here the empty rest), and a writer made
        // without a hook gives nothing.
        drop(w);
        assert_eq!(given(), vec![0]);
        drop(FragmentWriter::with_capacity(1 << 20));
        assert_eq!(given(), Vec::<usize>::new());
        let reused = FragmentWriter::with_buffer("old text".to_string(), None);
        assert!(reused.buf.is_empty());
    }

    /// A kept pair opening writes what `pair_begin` writes, short (one block) or long, at
    /// the end of text already there.
    #[test]
    fn kept_pair_openings_write_what_pair_begin_writes() {
        for key in
            ["", "a", "loss", "quo\"te", "é✓😀", &"k".repeat(29), &"k".repeat(30), &"k".repeat(31), &"x\n".repeat(40)]
        {
            let (mut kept, mut plain) = (FragmentWriter::new(), FragmentWriter::new());
            for w in [&mut kept, &mut plain] {
                w.dict_begin();
                w.none();
            }
            kept.pair_begin_with(&FragmentWriter::pair_begin_text(key));
            plain.pair_begin(key);
            assert_eq!(kept.buf, plain.buf, "{key:?}");
        }
    }
}
