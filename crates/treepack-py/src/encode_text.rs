//! The text walk: plain subtrees written as manifest text while the Python tree is walked
//! (`Fragment`, docs/design.md decision 59), and the containers that turn out to hold
//! something else made into nodes of their earlier children's texts. The node walk is in
//! `encode.rs`; both are one `Encoder`.

use super::*;
use treepack::format::manifest::{FragmentWriter, Mark};

/// A container begun as text ([`Encoder::open_text`]).
pub(crate) struct Opened {
    ordinal: u64,
    /// Its shared id, when a second walk knows it is shared (its text is wrapped in a shared
    /// node, or its node is).
    shared: Option<u64>,
    /// Where its children's marks begin in `Encoder::marks`.
    base: usize,
    /// Where its text begins.
    start: Mark,
    /// The parent's `text_hint`, restored at the end.
    hint: bool,
}

/// Slots of the key text cache: 2-way sets, so that two keys of every record that land in
/// one set (which a hash of a few address bits makes common) both stay, rather than each
/// evicting the other and being escaped again for every record.
const KEY_SLOTS_BITS: u32 = 9;
const KEY_SLOTS: usize = 1 << KEY_SLOTS_BITS;

impl<'py> Encoder<'py> {
    /// Write an exact None, bool, int (64-bit), float or inline str as text; false for
    /// anything else (the writer unchanged).
    fn scalar_text(&mut self, obj: &Bound<'py, PyAny>) -> bool {
        if self.restart {
            // A walk that will be walked again (a first that only looks for objects met again,
            // or a second giving way to a third): scalars are never shared, and are skipped
            // unwritten (their errors are the next walk's).
            return obj.is_none()
                || obj.is_exact_instance_of::<PyString>()
                || obj.is_exact_instance_of::<PyInt>()
                || obj.is_exact_instance_of::<PyFloat>()
                || obj.is_exact_instance_of::<PyBool>();
        }
        let inline_str = self.inline_str;
        let Some(w) = self.text.as_mut() else { return false };
        if obj.is_none() {
            w.none();
        } else if let Some(s) = exact::<PyString>(obj) {
            match s.to_str() {
                Ok(v) if v.len() <= inline_str => w.str(v),
                _ => return false,
            }
        } else if let Some(i) = exact::<PyInt>(obj) {
            match i.extract::<i64>() {
                Ok(v) => w.int(v),
                Err(_) => match int_of(obj) {
                    Ok(big) => w.big_int(&big),
                    Err(_) => return false,
                },
            }
        } else if let Some(f) = exact::<PyFloat>(obj) {
            w.float(f.value());
        } else if let Some(b) = exact::<PyBool>(obj) {
            w.bool(b.is_true());
        } else {
            return false;
        }
        true
    }

    /// `obj` (at `depth`, as [`Encoder::node`] takes it) written as text when all of it can
    /// be: `None`. Otherwise the text is as it was, and the node comes back (containers made of
    /// the texts of their plain children).
    pub(crate) fn text_or_node(
        &mut self,
        obj: &Bound<'py, PyAny>,
        depth: usize,
        fragile: bool,
    ) -> PyResult<Option<Node>> {
        if self.text.is_none() || depth >= treepack::format::manifest::MAX_DEPTH {
            self.fragile = fragile;
            return self.node(obj, depth).map(Some);
        }
        if self.scalar_text(obj) {
            return Ok(None);
        }
        // The items' iterator is made once the container is begun: it holds a reference of its
        // own, which `maybe_shared` would count (every list in a record would be kept as
        // possibly shared, for nothing).
        if let Some(l) = exact::<PyList>(obj) {
            return self.seq_text(obj, l.len(), || l.iter(), false, depth, fragile);
        }
        if let Some(t) = exact::<PyTuple>(obj) {
            return self.seq_text(obj, t.len(), || t.iter(), true, depth, fragile);
        }
        if let Some(d) = exact::<PyDict>(obj) {
            return self.dict_text(obj, d, depth, fragile);
        }
        if self.refs_as_text() {
            // An object kept as a node (an image, an array) met again: its ref is text.
            if let Some(r) = self.again_as_text(obj, fragile)? {
                return Ok(r);
            }
        }
        self.fragile = fragile;
        self.node(obj, depth).map(Some)
    }

    /// A child of a container being walked with text: a scalar written in place, a container
    /// one level deeper (as [`Encoder::child`] steps).
    /// `seg` makes the path step only for a child walked further (a dict key's step holds a
    /// reference to the key: taking one for every scalar cost an increment and a decrement).
    fn child_text(
        &mut self,
        seg: impl FnOnce() -> PathStep<'py>,
        v: &Bound<'py, PyAny>,
        depth: usize,
        fragile: bool,
    ) -> PyResult<Option<Node>> {
        // A value at the deepest level readers accept must be a bare JSON scalar there (a big
        // int or a NaN is a tagged object, which readers refuse at that depth).
        if (depth + 1 < treepack::format::manifest::MAX_DEPTH || bare_json_scalar(v, self.inline_str))
            && self.scalar_text(v)
        {
            return Ok(None);
        }
        self.path.push(seg());
        let r = treepack::format::model::grow_at(depth, || self.text_or_node(v, depth + 1, fragile));
        if r.is_ok() {
            self.path.pop();
        }
        r
    }

    /// A child of a container that became a node: a scalar leaf, a plain container as a
    /// fragment, anything else a node.
    pub(crate) fn child_piece(
        &mut self,
        seg: PathStep<'py>,
        v: &Bound<'py, PyAny>,
        depth: usize,
        fragile: bool,
    ) -> PyResult<Node> {
        if depth < treepack::format::manifest::MAX_DEPTH {
            if let Some(leaf) = scalar(v) {
                return Ok(Tree::Leaf(leaf));
            }
        }
        let m = match self.text.as_ref().map(FragmentWriter::mark) {
            // A first walk that will be walked again writes text wherever it can (it only
            // looks for objects met again, and text is the fastest way through).
            Some(m) if (self.text_hint || self.restart) && plain_container(v) => m,
            _ => {
                self.fragile = fragile;
                let hint = std::mem::replace(&mut self.text_hint, false);
                let r = self.child_node(seg, v, depth);
                self.text_hint = hint;
                return r;
            }
        };
        self.fragile = false;
        let before = self.shared_firsts;
        match self.child_text(|| seg, v, depth, fragile)? {
            None => Ok(self.fragment_node(m, None)),
            Some(n) => {
                self.missed(v, before);
                Ok(n)
            }
        }
    }

    /// A child that came back as a node: if it is a plain container that held something text
    /// cannot, its next siblings (records of one shape, as a list of them holds) are walked as
    /// nodes straight away, not written as text and then undone item by item. Not when what
    /// it held was the first place of a shared object (`before`: the count of those before it,
    /// see [`Encoder::wrap_shared`]): the next siblings hold refs to it, which are text.
    fn missed(&mut self, v: &Bound<'py, PyAny>, before: u64) {
        if plain_container(v) && self.shared_firsts == before {
            self.text_hint = false;
        }
    }

    /// The text written since `from` (to `to`, or to the end, which is then dropped) as a leaf.
    fn fragment_node(&mut self, from: Mark, to: Option<Mark>) -> Node {
        let Some(w) = self.text.as_mut() else { return Node::none() };
        Tree::Leaf(Leaf::Fragment(match to {
            Some(to) => w.fragment(from, to),
            None => w.split_off(from),
        }))
    }

    /// The first `n` children of a container being written as text, as nodes (scalars as
    /// leaves, containers as fragments of their texts); `get(j)` gives child `j`'s object.
    /// The container's text, from `start`, is dropped.
    fn texts_to_nodes<T>(
        &mut self,
        start: Mark,
        base: usize,
        n: usize,
        mut get: impl FnMut(&mut Self, usize) -> PyResult<(T, Bound<'py, PyAny>)>,
    ) -> PyResult<Vec<(T, Node)>> {
        let mut out = Vec::with_capacity(n);
        for j in 0..n {
            let (k, x) = get(self, j)?;
            let node = match scalar(&x) {
                Some(leaf) => Tree::Leaf(leaf),
                None => {
                    let (from, to) = (self.marks[base + 2 * j], self.marks[base + 2 * j + 1]);
                    self.fragment_node(from, Some(to))
                }
            };
            out.push((k, node));
        }
        self.marks.truncate(base);
        if let Some(w) = self.text.as_mut() {
            w.truncate(start);
        }
        Ok(out)
    }

    /// The slot of `keys` holding the text that begins a pair with key `k`, a plain `str`
    /// (`None` for any other key). Dicts of records repeat the same key objects, so their
    /// texts are escaped once. A slot keeps its key object alive, so no other object can take
    /// its address while the text is cached.
    fn key_text(&mut self, k: &Bound<'py, PyAny>) -> Option<usize> {
        let s = exact::<PyString>(k)?;
        let addr = k.as_ptr() as usize;
        // Fibonacci hashing: the product's top bits depend on every bit of the address.
        let h = ((addr as u64 >> 4).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - KEY_SLOTS_BITS)) as usize;
        if self.keys.is_empty() {
            self.keys.resize_with(KEY_SLOTS, || None);
        }
        let (a, b) = (h & !1, h | 1);
        for slot in [a, b] {
            if matches!(&self.keys[slot], Some((o, _)) if o.as_ptr() as usize == addr) {
                return Some(slot);
            }
        }
        // A miss: the set's first way moves to its second (evicting that one's key), the new
        // key takes the first.
        let text = treepack::format::manifest::PairText::new_in(s.to_str().ok()?, &mut self.key_scratch);
        self.keys.swap(a, b);
        self.keys[a] = Some((k.clone(), text));
        Some(a)
    }

    /// Whether refs are written as text: in a second walk (their ids are final), and in a
    /// first that will be walked again (its output is dropped: it only finds what is met again,
    /// and text keeps it as fast as the second).
    fn refs_as_text(&self) -> bool {
        self.known.is_some() || self.restart
    }

    /// `obj` met again: its ref, written as text when refs are ([`Encoder::refs_as_text`]:
    /// `Some(None)`), else as a node; `None` the first time.
    fn again_as_text(&mut self, obj: &Bound<'py, PyAny>, fragile: bool) -> PyResult<Option<Option<Node>>> {
        let Some(r) = self.again(obj, fragile)? else { return Ok(None) };
        if let (Tree::Ref(id), true) = (&r, self.refs_as_text()) {
            if let Some(w) = self.text.as_mut() {
                w.reference(*id);
                return Ok(Some(None));
            }
        }
        Ok(Some(Some(r)))
    }

    /// Whether `obj`, a container met as an item of the container being walked (the walk holds
    /// it through one reference of its own), may be met again: shared objects are found by
    /// keeping every container met in `seen`, a hash insert per container of a walk of plain
    /// values. An
    /// object whose only other reference is the one its parent holds cannot be anywhere else
    /// in the tree, nor contain itself, so it is not kept. Conservative wherever the count is
    /// not the plain one: the root, and free-threaded builds (whose counts are biased).
    fn maybe_shared(&self, obj: &Bound<'py, PyAny>) -> bool {
        if !self.share {
            return false;
        }
        if !self.plain_counts || obj.as_ptr() == self.root.as_ptr() {
            return true;
        }
        // SAFETY: `obj` is a live object (we hold a reference); reading its count has no effect.
        unsafe { pyo3::ffi::Py_REFCNT(obj.as_ptr()) > 2 }
    }

    /// Begin a container as text (`begin` writes its opening): `Err` with a ref when the
    /// object was met before (only looked for when `may_share` and it may be: see
    /// [`Encoder::maybe_shared`]), `Err(None)` when that ref was written as text (its id is
    /// final: a second walk).
    fn open_text(
        &mut self,
        obj: &Bound<'py, PyAny>,
        may_share: bool,
        fragile: bool,
        begin: fn(&mut FragmentWriter),
    ) -> PyResult<std::result::Result<Opened, Option<Node>>> {
        let tracked = may_share && self.maybe_shared(obj);
        if tracked {
            if let Some(r) = self.again_as_text(obj, fragile)? {
                return Ok(Err(r));
            }
        }
        let ordinal = self.begin(tracked.then_some(obj));
        let shared = if tracked { self.shared_id(obj) } else { None };
        self.open.push(ordinal);
        let base = self.marks.len();
        let w = self.text.as_mut().ok_or_else(|| PyValueError::new_err("treepack bug: no text writer"))?;
        let start = w.mark();
        if let Some(id) = shared {
            w.shared_begin(id);
        }
        begin(w);
        let hint = std::mem::replace(&mut self.text_hint, true);
        Ok(Ok(Opened { ordinal, shared, base, start, hint }))
    }

    /// Finish a container that ended as text (`end` writes its closing).
    fn close_text(&mut self, c: Opened, end: fn(&mut FragmentWriter)) {
        if let Some(w) = self.text.as_mut() {
            end(w);
            if c.shared.is_some() {
                w.shared_end();
            }
        }
        self.marks.truncate(c.base);
        self.open.pop();
        if let Some(t) = self.texted.get_mut(c.ordinal as usize) {
            *t = true;
        }
        self.text_hint = c.hint;
    }

    /// Finish a container begun as text that became node `n` (its text, the shared node's
    /// opening included, was dropped).
    fn close_node(&mut self, c: Opened, n: Node) -> Node {
        self.open.pop();
        self.text_hint = c.hint;
        match c.shared {
            Some(id) => {
                self.shared_firsts += 1;
                Tree::Shared { id, node: Box::new(n) }
            }
            None => n,
        }
    }

    fn seq_text<I: Iterator<Item = Bound<'py, PyAny>>>(
        &mut self,
        obj: &Bound<'py, PyAny>,
        len: usize,
        items: impl FnOnce() -> I,
        tuple: bool,
        depth: usize,
        fragile: bool,
    ) -> PyResult<Option<Node>> {
        // The empty tuple is one object in CPython and holds nothing: never a shared node.
        let begin = if tuple { FragmentWriter::tuple_begin } else { FragmentWriter::list_begin };
        let c = match self.open_text(obj, !(tuple && len == 0), fragile, begin)? {
            Ok(c) => c,
            Err(r) => return Ok(r),
        };
        let (base, start) = (c.base, c.start);
        let mut nodes: Option<Vec<Node>> = None;
        for (i, x) in items().enumerate() {
            if let Some(nodes) = nodes.as_mut() {
                nodes.push(self.child_piece(PathStep::Index(i), &x, depth, tuple)?);
                continue;
            }
            let w = self.text.as_mut().map(|w| {
                if i > 0 {
                    w.comma();
                }
                w.mark()
            });
            if let Some(m) = w {
                self.marks.push(m);
            }
            let before = self.shared_firsts;
            match self.child_text(|| PathStep::Index(i), &x, depth, tuple)? {
                None => {
                    if let Some(end) = self.text.as_ref().map(FragmentWriter::mark) {
                        self.marks.push(end);
                    }
                }
                Some(node) => {
                    self.marks.pop();
                    self.missed(&x, before);
                    let mut done = self.texts_to_nodes(start, base, i, |_, j| Ok(((), obj.get_item(j)?)))?;
                    let mut v: Vec<Node> = done.drain(..).map(|(_, n)| n).collect();
                    v.reserve(len.saturating_sub(i));
                    v.push(node);
                    nodes = Some(v);
                }
            }
        }
        match nodes {
            None => {
                self.close_text(c, if tuple { FragmentWriter::items_end } else { FragmentWriter::list_end });
                Ok(None)
            }
            Some(v) => Ok(Some(self.close_node(c, if tuple { Tree::Tuple(v) } else { Tree::List(v) }))),
        }
    }

    fn dict_text(
        &mut self,
        obj: &Bound<'py, PyAny>,
        d: &Bound<'py, PyDict>,
        depth: usize,
        fragile: bool,
    ) -> PyResult<Option<Node>> {
        let c = match self.open_text(obj, true, fragile, FragmentWriter::dict_begin)? {
            Ok(c) => c,
            Err(r) => return Ok(r),
        };
        let (base, start) = (c.base, c.start);
        let mut pairs: Option<Vec<(Key, Node)>> = None;
        for (i, (k, v)) in d.iter().enumerate() {
            if let Some(pairs) = pairs.as_mut() {
                let key = self.key(&k)?;
                pairs.push((key, self.child_piece(PathStep::Key(k), &v, depth, false)?));
                continue;
            }
            if i == 0 && (self.scan_keys || !k.is_exact_instance_of::<PyString>()) && needs_py_dict(d, self.scan_keys) {
                // Keys that are values (numpy scalars, enum members): a `py.dict` node, which
                // text cannot be. Rare: the walk starts over without text (see `prepare`)
                // rather than every dict's first key being looked up before its text begins.
                self.restart = true;
                return Err(PyValueError::new_err("treepack: a dict keyed by values met in text; starting over"));
            }
            // A dict whose first key is "t" cannot be an object (it would read as a tagged
            // node): it stays a node, written in the `items` form.
            let slot = if i == 0 && is_t(&k) { None } else { self.key_text(&k) };
            let r = match (slot, self.text.as_mut()) {
                (Some(slot), Some(w)) => {
                    if i > 0 {
                        w.comma();
                    }
                    if let Some((_, text)) = &self.keys[slot] {
                        w.pair_begin_with(text);
                    }
                    self.marks.push(w.mark());
                    let before = self.shared_firsts;
                    match self.child_text(|| PathStep::Key(k.clone()), &v, depth, false)? {
                        None => {
                            if let Some(w) = self.text.as_mut() {
                                self.marks.push(w.mark());
                            }
                            continue;
                        }
                        Some(node) => {
                            self.marks.pop();
                            self.missed(&v, before);
                            Some(node)
                        }
                    }
                }
                // A key that is not a plain str: the dict is a node.
                _ => None,
            };
            let firsts: Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)> = d.iter().take(i).collect();
            let mut done = self.texts_to_nodes(start, base, i, |enc, j| {
                let (k, v) = &firsts[j];
                Ok((enc.key(k)?, v.clone()))
            })?;
            let key = self.key(&k)?;
            let node = match r {
                Some(node) => node,
                None => self.child_piece(PathStep::Key(k), &v, depth, false)?,
            };
            done.reserve(d.len().saturating_sub(i));
            done.push((key, node));
            pairs = Some(done);
        }
        match pairs {
            None => {
                self.close_text(c, FragmentWriter::dict_end);
                Ok(None)
            }
            Some(p) => Ok(Some(self.close_node(c, Tree::Dict(p)))),
        }
    }

    /// The whole tree: text where it can be (a fragment), nodes elsewhere.
    pub(crate) fn top(&mut self, tree: &Bound<'py, PyAny>) -> PyResult<Node> {
        let Some(m) = self.text.as_ref().map(FragmentWriter::mark) else { return self.node(tree, 0) };
        match self.text_or_node(tree, 0, false)? {
            None => Ok(self.fragment_node(m, None)),
            Some(n) => Ok(n),
        }
    }
}

/// Whether `k` is the str `"t"`.
/// A value written as a bare JSON scalar (not a tagged object): None, a bool, an int of 64
/// bits, a finite float, a string of at most `inline_str` bytes (longer ones are blobs).
pub(crate) fn bare_json_scalar(v: &Bound<'_, PyAny>, inline_str: usize) -> bool {
    v.is_none()
        || v.is_exact_instance_of::<PyBool>()
        || (v.is_exact_instance_of::<PyInt>() && v.extract::<i64>().is_ok())
        || (v.is_exact_instance_of::<PyFloat>() && v.extract::<f64>().is_ok_and(f64::is_finite))
        || exact::<PyString>(v).is_some_and(|s| s.to_str().is_ok_and(|t| t.len() <= inline_str))
}

fn is_t(k: &Bound<'_, PyAny>) -> bool {
    exact::<PyString>(k).is_some_and(|s| s.to_str().ok() == Some("t"))
}

/// An exact dict, list or tuple: what may be written as text.
pub(crate) fn plain_container(v: &Bound<'_, PyAny>) -> bool {
    v.is_exact_instance_of::<PyDict>() || v.is_exact_instance_of::<PyList>() || v.is_exact_instance_of::<PyTuple>()
}
