//! Python tree -> `Node`: the walker with exact-type fast paths (plain subtrees become text in
//! `encode_text.rs`); anything else goes to Python's `encode_other`.

use super::*;
use crate::encode_refusals::{unsupported_class, unsupported_error};
use crate::encode_text::bare_json_scalar;
use treepack::format::manifest::{FragmentWriter, Mark};

/// What `encode_other` returns: (kind, type name, data JSON, named children).
pub(crate) type NodeDescription<'py> = (String, String, Option<String>, Vec<(String, Bound<'py, PyAny>)>);

pub(crate) struct Encoder<'py> {
    pub(crate) py: Python<'py>,
    pub(crate) ndarray: Bound<'py, PyAny>,
    pub(crate) generic: Bound<'py, PyAny>,
    pub(crate) encode_other: Bound<'py, PyAny>,
    pub(crate) encode_array: Bound<'py, PyAny>,
    /// Steps to the node being encoded, formatted only when an error (or `encode_other`) needs
    /// the key path: formatting a segment for every node would be a large part of a walk of
    /// small values.
    pub(crate) path: Vec<PathStep<'py>>,
    /// Copy array bytes instead of borrowing them, so the caller may mutate its arrays as soon
    /// as `prepare` returns (non-blocking saves).
    pub(crate) snapshot: bool,
    /// The snapshot's copies still to make, once the last walk is done (`snapshot::run`).
    pub(crate) pending: Vec<crate::snapshot::Pending>,
    /// Encode naive and UTC `datetime`s here rather than through `encode_other` (off when the
    /// user registered a custom codec for `datetime`).
    pub(crate) fast_datetime: bool,
    /// Large `bytes` objects already met, by identity (they stay alive: the tree holds them).
    pub(crate) seen_bytes: HashMap<usize, Bytes>,
    /// The tree being encoded (to name a reference cycle's place once the depth limit is hit).
    pub(crate) root: Bound<'py, PyAny>,
    /// Shared references (format 1.2): lists, dicts, arrays and objects met again become refs
    /// to their first place. Off (`save(..., shared=False)`): copies, and cycles are errors.
    pub(crate) share: bool,
    /// Nodes begun so far, counted in document order (see [`share_refs`]).
    pub(crate) ordinal: u64,
    /// Objects met, by address: their node's ordinal (the object is kept alive, so its address
    /// is not reused by another object meanwhile). FxHash: one insert per container, and the
    /// keys are addresses, not data.
    pub(crate) seen: rustc_hash::FxHashMap<usize, (u64, Bound<'py, PyAny>)>,
    /// Ordinals of the nodes a ref points at.
    pub(crate) refd: rustc_hash::FxHashSet<u64>,
    /// Objects met more than once in this walk, by address: what a second walk must know
    /// when this one met again an object it had written as text (see `prepare`).
    pub(crate) again_met: rustc_hash::FxHashSet<usize>,
    /// In a second walk, the objects the first met more than once: each is given its shared
    /// id (`ids`) as it begins, so the ids are final as they are written, text included.
    pub(crate) known: Option<rustc_hash::FxHashSet<usize>>,
    /// In a second walk, the shared ids given so far (0, 1, 2, ... in document order).
    pub(crate) ids: rustc_hash::FxHashMap<usize, u64>,
    /// Refs made so far by a first walk writing text (see `encode_shared::TEXT_REFS`).
    pub(crate) text_refs: usize,
    /// Shared objects a second walk made nodes at their first place (an image, an array).
    pub(crate) shared_firsts: u64,
    /// Ordinals of the objects being encoded, outermost first (a ref to one of them is a cycle):
    /// the containers on the current path, so a stack.
    pub(crate) open: Vec<u64>,
    /// The node about to be encoded is a direct child of a tuple or of a custom node: a cycle
    /// may not close there (a loader cannot put the object into a tuple or a custom type's
    /// data before it exists).
    pub(crate) fragile: bool,
    /// Positions in `open` of the objects being walked that a loader builds from copies of
    /// their children, after them (custom types, pydantic models, namedtuples): a cycle
    /// closing at or above such an object cannot be rebuilt (the copy would keep the loader's
    /// stand-in), so a ref there is refused with the path.
    pub(crate) copying: Vec<(usize, String)>,
    /// Plain subtrees (lists, tuples, dicts with str keys, inline scalars) are written here as
    /// manifest text while they are walked, with no `Node` per value (see `Fragment`: a second
    /// tree cost more than the text for trees of plain values). `None`: nodes only.
    pub(crate) text: Option<FragmentWriter>,
    /// Strings of at most this many UTF-8 bytes are written as text (the writer's inline limit).
    pub(crate) inline_str: usize,
    /// Where each child of the containers being written as text begins and ends, so that a
    /// container holding something text cannot (an array) becomes a node made of its earlier
    /// children's texts.
    pub(crate) marks: Vec<Mark>,
    /// Per ordinal: that node ended as text. A second reference to it cannot become a ref (its
    /// text has no shared id), so the walk starts over without text (`restart`).
    pub(crate) texted: Vec<bool>,
    pub(crate) restart: bool,
    /// Try text for the next container child of the container being walked; false after a
    /// sibling container had to become a node (see [`Encoder::missed`]). Each container's
    /// walk starts with it true and restores its parent's value.
    pub(crate) text_hint: bool,
    /// Reference counts are exact (not a free-threaded build, whose counts are biased).
    pub(crate) plain_counts: bool,
    /// Texts of recent dict keys (see [`Encoder::key_text`]), `KEY_SLOTS` slots by address.
    pub(crate) keys: Vec<Option<(Bound<'py, PyAny>, treepack::format::manifest::PairText)>>,
    /// Where a missed key's text is made ([`treepack::format::manifest::PairText::new_in`]).
    pub(crate) key_scratch: String,
    /// The objects `encode_other` could not describe (`UnsupportedObjectError`s), in tree order:
    /// the walk goes on past each, so that one error names them all (see `prepare`).
    /// (each with the object's address: one object met at two places is one object).
    pub(crate) unsupported: Vec<(usize, PyErr)>,
    /// Look at every key of a dict to tell whether it is a `py.dict` (keys that are values),
    /// not only its first (see `prepare`: a walk that meets such a key late starts over so).
    pub(crate) scan_keys: bool,
    /// This walk met such a key in a dict it took for one of plain keys.
    pub(crate) key_restart: std::cell::Cell<bool>,
}

/// One step of the key path [`Encoder`] is at.
pub(crate) enum PathStep<'py> {
    Index(usize),
    /// The dict key object itself (a reference, not a converted copy).
    Key(Bound<'py, PyAny>),
    Name(String),
}

impl<'py> Encoder<'py> {
    /// The bytes of a `bytes` object: small ones copied, large ones borrowed (immutable, so no
    /// snapshot is needed), and the same object met again (one image shared by 10k records)
    /// reuses the first `Bytes`, which also lets the writer hash it once.
    pub(crate) fn bytes(&mut self, b: &Bound<'py, PyBytes>) -> Bytes {
        let data = b.as_bytes();
        if data.len() < 1024 {
            return Bytes::copy_from_slice(data);
        }
        let id = b.as_ptr() as usize;
        if let Some(x) = self.seen_bytes.get(&id) {
            return x.clone();
        }
        let x = Bytes::from_owner(PyBytesOwner(Held::new(b.clone().unbind()), data.as_ptr(), data.len()));
        self.seen_bytes.insert(id, x.clone());
        x
    }
}

impl<'py> Encoder<'py> {
    pub(crate) fn here(&self) -> String {
        self.text_of(&self.path)
    }

    /// The first object on the current path that is reached again further down: `(i, j)` such
    /// that the steps `path[..i]` and `path[..j]` lead to the same object. Found by walking the
    /// path again from the root (only after the depth limit was hit); `None` when a step cannot
    /// be followed (a registered type's `to_data` result).
    pub(crate) fn cycle(&self) -> Option<(usize, usize)> {
        let mut obj = self.root.clone();
        let mut seen: HashMap<usize, usize> = HashMap::from([(obj.as_ptr() as usize, 0)]);
        for (n, step) in self.path.iter().enumerate() {
            obj = match step {
                PathStep::Index(i) => obj.get_item(*i).ok()?,
                PathStep::Key(k) => obj.get_item(k).ok()?,
                PathStep::Name(name) => obj.getattr(name.as_str()).ok()?,
            };
            if let Some(&first) = seen.get(&(obj.as_ptr() as usize)) {
                return Some((first, n + 1));
            }
            seen.insert(obj.as_ptr() as usize, n + 1);
        }
        None
    }

    pub(crate) fn text_of(&self, path: &[PathStep<'py>]) -> String {
        use treepack::format::keypath::Segment;
        if path.is_empty() {
            return "<root>".into();
        }
        let texts: Vec<String> = path
            .iter()
            .map(|step| match step {
                PathStep::Index(i) => i.to_string(),
                PathStep::Key(k) => match self.key(k) {
                    Ok(key) => Segment::Key(key).text(),
                    Err(_) => k.repr().map(|r| r.to_string()).unwrap_or_default(),
                },
                PathStep::Name(n) => Segment::Name(n.clone()).text(),
            })
            .collect();
        texts.join("/")
    }

    pub(crate) fn err(&self, msg: impl std::fmt::Display) -> PyErr {
        PyTypeError::new_err(format!("cannot save `{}`: {msg}", self.here()))
    }

    pub(crate) fn key(&self, k: &Bound<'py, PyAny>) -> PyResult<Key> {
        key_of(k).map_err(|e| match e {
            NoKey::NotUnicode(k) => self.err(format!(
                "dict key {} is not valid Unicode (it holds lone surrogates, as os.fsdecode makes of file \
                 names that are not UTF-8), and keys are stored as JSON strings: re-encode it \
                 (os.fsencode(key).decode('latin-1')), or keep such names in values, where they are kept",
                k.repr().map(|r| r.to_string()).unwrap_or_default()
            )),
            NoKey::Unsupported(_) if !self.scan_keys => {
                self.key_restart.set(true);
                PyValueError::new_err("treepack: a dict key that is a value met after a str key; starting over")
            }
            NoKey::Unsupported(k) => self.err(format!(
                "dict key {} of type {} is not supported in a dict whose first key is a str (keys may be str, int, \
                 float, bool, None or tuples of these; a dict whose first key is another value, such as a numpy \
                 integer or an enum member, is stored with its keys as values)",
                k.repr().map(|r| r.to_string()).unwrap_or_default(),
                k.get_type().name().map(|n| n.to_string()).unwrap_or_default()
            )),
            NoKey::Failed(e) => e,
        })
    }

    pub(crate) fn child(&mut self, seg: PathStep<'py>, v: &Bound<'py, PyAny>, depth: usize) -> PyResult<Node> {
        if self.text.is_some() && (self.text_hint || self.restart) {
            // Plain containers anywhere (a record's dict field too) become text.
            let fragile = self.fragile;
            return self.child_piece(seg, v, depth, fragile);
        }
        self.child_node(seg, v, depth)
    }

    /// A child as a node (a scalar as a leaf), whatever the text hint says.
    pub(crate) fn child_node(&mut self, seg: PathStep<'py>, v: &Bound<'py, PyAny>, depth: usize) -> PyResult<Node> {
        if depth < treepack::format::manifest::MAX_DEPTH {
            if let Some(leaf) = scalar(v) {
                // Most nodes of a big tree: no key path step, no stack check (a leaf recurses
                // no further). Anything unusual (a string with lone surrogates) takes the
                // general path below, which reports it.
                self.fragile = false;
                return Ok(Tree::Leaf(leaf));
            }
        }
        self.path.push(seg);
        // Deep (or cyclic, until the depth limit) trees recurse up to MAX_DEPTH levels.
        let r = treepack::format::model::grow_at(depth, || self.node(v, depth + 1));
        if r.is_ok() {
            self.path.pop();
        }
        r
    }

    pub(crate) fn node(&mut self, obj: &Bound<'py, PyAny>, depth: usize) -> PyResult<Node> {
        // Readers refuse a JSON object or array at the deepest level (`bare_json_scalar`).
        let max = treepack::format::manifest::MAX_DEPTH;
        if depth > max || (depth == max && !bare_json_scalar(obj, self.inline_str)) {
            if let Some((outer, inner)) = self.cycle() {
                return Err(PyValueError::new_err(format!(
                    "cannot save: reference cycle at `{}`: it contains itself at `{}`. With shared=False treepack \
                     saves plain trees: break the cycle, or save with shared=True (the default) to keep it",
                    self.text_of(&self.path[..outer]),
                    self.text_of(&self.path[..inner]),
                )));
            }
            return Err(PyValueError::new_err(format!(
                "cannot save `{}`: nested deeper than {} levels",
                self.here(),
                treepack::format::manifest::MAX_DEPTH
            )));
        }
        let fragile = std::mem::take(&mut self.fragile);
        if obj.is_none() {
            return Ok(Node::none());
        }
        if obj.is_exact_instance_of::<PyBool>() {
            return Ok(Node::from(obj.extract::<bool>()?));
        }
        if obj.is_exact_instance_of::<PyInt>() {
            return Ok(Tree::Leaf(Leaf::Int(int_of(obj)?)));
        }
        if obj.is_exact_instance_of::<PyFloat>() {
            return Ok(Node::from(obj.extract::<f64>()?));
        }
        if let Some(c) = exact::<PyComplex>(obj) {
            return Ok(Tree::Leaf(Leaf::Complex(c.real(), c.imag())));
        }
        if obj.is_exact_instance_of::<PyString>() {
            return match obj.extract::<String>() {
                Ok(s) => Ok(Node::from(s)),
                // Lone surrogates (`os.fsdecode` of a file name that is not UTF-8): described
                // by `encode_other` (a `py.str` of its surrogatepass bytes), each place its own
                // node, as strings are values.
                Err(_) => self.other_new(obj, depth),
            };
        }
        if let Some(b) = exact::<PyBytes>(obj) {
            return Ok(Tree::Leaf(Leaf::Bytes(self.bytes(b))));
        }
        if let Some(l) = exact::<PyList>(obj) {
            if let Some(r) = self.again(obj, fragile)? {
                return Ok(r);
            }
            let o = self.begin(Some(obj));
            self.open.push(o);
            let mut out = Vec::with_capacity(l.len());
            let hint = std::mem::replace(&mut self.text_hint, true);
            for (i, x) in l.iter().enumerate() {
                out.push(self.child(PathStep::Index(i), &x, depth)?);
            }
            self.text_hint = hint;
            self.open.pop();
            return Ok(self.wrap_shared(obj, Tree::List(out)));
        }
        if let Some(t) = exact::<PyTuple>(obj) {
            // The empty tuple is one object in CPython and holds nothing: never a shared node.
            if !t.is_empty() {
                if let Some(r) = self.again(obj, fragile)? {
                    return Ok(r);
                }
            }
            let o = self.begin((!t.is_empty()).then_some(obj));
            self.open.push(o);
            let mut out = Vec::with_capacity(t.len());
            let hint = std::mem::replace(&mut self.text_hint, true);
            for (i, x) in t.iter().enumerate() {
                self.fragile = true;
                out.push(self.child(PathStep::Index(i), &x, depth)?);
            }
            self.text_hint = hint;
            self.open.pop();
            return Ok(self.wrap_shared(obj, Tree::Tuple(out)));
        }
        if let Some(d) = exact::<PyDict>(obj) {
            if needs_py_dict(d, self.scan_keys) {
                return self.other(obj, depth, fragile);
            }
            if let Some(r) = self.again(obj, fragile)? {
                return Ok(r);
            }
            let o = self.begin(Some(obj));
            self.open.push(o);
            let mut out = Vec::with_capacity(d.len());
            let hint = std::mem::replace(&mut self.text_hint, true);
            for (k, v) in d.iter() {
                let key = self.key(&k)?;
                out.push((key, self.child(PathStep::Key(k), &v, depth)?));
            }
            self.text_hint = hint;
            self.open.pop();
            return Ok(self.wrap_shared(obj, Tree::Dict(out)));
        }
        if obj.get_type().is(&self.ndarray) {
            if matches!(obj.cast::<PyUntypedArray>()?.dtype().kind(), b'O' | b'M' | b'm') {
                // Python objects, not array data: pickled with `allow_pickle`, else refused.
                // datetime64/timedelta64: a `py.datetime64` node (int64 values and the unit).
                return self.other(obj, depth, fragile);
            }
            if let Some(r) = self.again(obj, false)? {
                return Ok(r);
            }
            self.begin(Some(obj));
            let a = self.array(obj)?;
            return Ok(self.wrap_shared(obj, Node::from(a)));
        }
        if self.fast_datetime {
            if let Some(d) = exact::<pyo3::types::PyDateTime>(obj) {
                if let Some(n) = datetime_node(self.py, d)? {
                    self.begin(None);
                    return Ok(n);
                }
            }
        }
        if obj.is_instance(&self.generic)? {
            // numpy scalar: keep its dtype as a 0-d array inside a `py.npscalar` node.
            let np = self.py.import("numpy")?;
            let a = np.call_method1("asarray", (obj,))?;
            if matches!(a.cast::<PyUntypedArray>()?.dtype().kind(), b'M' | b'm' | b'O') {
                return self.other(obj, depth, fragile);
            }
            // The custom node, then its array.
            self.begin(None);
            self.begin(None);
            let arr = self.array(&a)?;
            return Ok(Tree::Custom {
                type_name: "py.npscalar".into(),
                data: serde_json::Value::Null,
                children: vec![("value".into(), Node::from(arr))],
            });
        }
        self.other(obj, depth, fragile)
    }

    pub(crate) fn array(&mut self, obj: &Bound<'py, PyAny>) -> PyResult<ArrayData> {
        let arr = obj.cast::<PyUntypedArray>()?;
        let descr = arr.dtype();
        let kind = descr.kind();
        let native_le = matches!(descr.byteorder(), b'=' | b'<' | b'|') && cfg!(target_endian = "little");
        let fast = if arr.is_c_contiguous() && native_le && !descr.has_fields() && !descr.has_subarray() {
            DType::from_numpy_kind(kind, descr.itemsize())
        } else {
            None
        };
        // A dtype with metadata takes the slow path, which refuses it (it would be dropped).
        let fast = match fast {
            Some(d) if descr.getattr(pyo3::intern!(obj.py(), "metadata"))?.is_none() => Some(d),
            _ => None,
        };
        let (canon, dtype) = match fast {
            Some(d) => (obj.clone(), d),
            None => {
                // Slow path (big-endian, strided, structured, strings, ml_dtypes): Python makes a
                // canonical copy and describes its dtype.
                // A TypeError of the helper is a dtype treepack does not keep (it says which and
                // what to do): noted like an object `encode_other` refuses, where it stands, and
                // the walk goes on with an empty array in its place (never written).
                let r = match self.encode_array.call1((obj,)) {
                    Ok(r) => r,
                    Err(e) if e.is_instance_of::<PyTypeError>(self.py) => {
                        let reason = e.value(self.py).str()?;
                        let cls = obj.get_type();
                        let type_name = format!("{}:{}", cls.module()?, cls.qualname()?);
                        let e =
                            PyErr::from_value(unsupported_class(self.py)?.call1((self.here(), type_name, reason))?);
                        self.unsupported_at(obj, e)?;
                        return ArrayData::new(DType::U8, vec![0], Bytes::new()).map_err(|e| self.err(e));
                    }
                    Err(e) => return Err(self.err(e)),
                };
                let (c, dj): (Bound<'py, PyAny>, String) = r.extract()?;
                let v: serde_json::Value = serde_json::from_str(&dj).map_err(|e| self.err(e))?;
                (c, DType::from_json(&v).map_err(|e| self.err(e))?)
            }
        };
        let carr = canon.cast::<PyUntypedArray>()?;
        let shape: Vec<u64> = carr.shape().iter().map(|&d| d as u64).collect();
        let nbytes = shape_len(&shape).unwrap_or(0) * dtype.itemsize();
        // SAFETY: `canon` is C-contiguous with exactly `nbytes` bytes (checked by numpy / Python helper).
        let ptr = unsafe { (*carr.as_array_ptr()).fields.data } as *const u8;
        let owner = NumpyOwner { ptr, len: nbytes as usize, _obj: Held::new(canon.clone().unbind()) };
        let data = if self.snapshot {
            let (bytes, copy) = crate::snapshot::reserve(owner);
            self.pending.extend(copy);
            bytes
        } else {
            Bytes::from_owner(owner)
        };
        ArrayData::new(dtype, shape, data).map_err(|e| self.err(e))
    }

    pub(crate) fn other(&mut self, obj: &Bound<'py, PyAny>, depth: usize, fragile: bool) -> PyResult<Node> {
        if let Some(r) = self.again(obj, fragile)? {
            return Ok(r);
        }
        let n = self.other_new(obj, depth)?;
        Ok(self.wrap_shared(obj, n))
    }

    /// An object of another kind met for the first time: described by `encode_other`.
    fn other_new(&mut self, obj: &Bound<'py, PyAny>, depth: usize) -> PyResult<Node> {
        let here = self.here();
        let desc = match self.encode_other.call1((obj, here)) {
            Ok(d) => d,
            Err(e) if e.is_instance(self.py, &unsupported_class(self.py)?) => {
                // Noted, and the walk goes on with None in its place (the tree is not written).
                self.unsupported_at(obj, e)?;
                return Ok(Node::none());
            }
            Err(e) if e.is_instance_of::<PyTypeError>(self.py) => return Err(e),
            Err(e) => return Err(self.err(e)),
        };
        let (kind, type_name, data, children): NodeDescription<'py> = desc.extract()?;
        if kind == "array" {
            // An array of another library (a torch tensor, a JAX array): its canonical numpy
            // view, annotated with the type and attributes it is rebuilt from. The object
            // itself is the shared one (a tensor at two places is one tensor). Optional
            // children: `block` (the shard shape the chunk grid tiles) and `immutable` (the
            // view cannot change, a JAX array's: no snapshot copy for background saves).
            let mut it = children.into_iter();
            let view = match it.next() {
                Some((name, v)) if name == "value" => v,
                _ => return Err(self.err("encode_other returned an array whose first child is not its `value`")),
            };
            let mut block = None;
            let mut immutable = false;
            for (name, v) in it {
                match name.as_str() {
                    "block" => block = Some(v.extract::<Vec<u64>>()?),
                    "immutable" => immutable = v.is_truthy()?,
                    other => {
                        return Err(self.err(format!("encode_other returned an array with an unknown child `{other}`")))
                    }
                }
            }
            let annotation = match data {
                Some(s) => Some(serde_json::from_str(&s).map_err(|e| self.err(e))?),
                None => None,
            };
            self.begin(Some(obj));
            let snapshot = self.snapshot;
            self.snapshot = snapshot && !immutable;
            let a = self.array(&view);
            self.snapshot = snapshot;
            let a = a?.with_annotation(annotation).and_then(|a| a.with_block(block)).map_err(|e| self.err(e))?;
            return Ok(Node::from(a));
        }
        let o = (kind != "value").then(|| self.begin(Some(obj)));
        // Records of classes that exist before their fields are set (dataclasses, attrs) can
        // be rebuilt inside themselves; the rest are built from their children's values, and
        // of those a loader patches the copies only in the containers of `PATCHED_AFTER`.
        let copying =
            (kind == "custom" && !crate::PATCHED_AFTER.contains(&type_name.as_str())) || kind == "record_built";
        if let Some(o) = o {
            self.open.push(o);
            if copying {
                self.copying.push((self.open.len() - 1, type_name.clone()));
            }
        }
        let mut kids = Vec::with_capacity(children.len());
        let hint = std::mem::replace(&mut self.text_hint, true);
        for (name, v) in children {
            let step = PathStep::Name(name.clone());
            // A record's fields are set on the object after it exists; a custom type's data
            // goes to its `from_data`, which needs it whole.
            self.fragile = copying;
            kids.push((name, self.child(step, &v, depth)?));
        }
        self.text_hint = hint;
        self.fragile = false;
        if o.is_some() {
            if copying {
                self.copying.pop();
            }
            self.open.pop();
        }
        match kind.as_str() {
            "record" | "record_built" => Ok(Tree::Record { type_name, fields: kids }),
            "custom" => {
                let data = match data {
                    Some(s) => serde_json::from_str(&s).map_err(|e| self.err(e))?,
                    None => serde_json::Value::Null,
                };
                Ok(Tree::Custom { type_name, data, children: kids })
            }
            // A stand-in saved as is (a memoryview's bytes).
            "value" if kids.len() == 1 => Ok(kids.remove(0).1),
            k => Err(self.err(format!("encode_other returned unknown kind {k:?}"))),
        }
    }
}

/// Whether a dict's keys are not all keys the format has (str, int, float, bool, None and
/// tuples of these): numpy scalars from a pandas groupby, enum members. Such a dict is a
/// `py.dict` node whose items are tree values (keys included), made by `encode_other`. Only a
/// dict whose first key is not a str is looked at whole; the first key is read without a
/// reference, so the dicts of str keys that trees are made of cost one type check.
/// Whether `d` is a `py.dict` (a key is not a format key). A dict whose first key is a str is
/// taken for one of format keys (the walk looks no further) unless `scan_all`.
pub(crate) fn needs_py_dict(d: &Bound<'_, PyDict>, scan_all: bool) -> bool {
    let (mut pos, mut k, mut v) = (0isize, std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: a dict we hold; PyDict_Next lends its first key without a new reference.
    let first_is_str = unsafe {
        if pyo3::ffi::PyDict_Next(d.as_ptr(), &mut pos, &mut k, &mut v) == 0 {
            return false;
        }
        pyo3::ffi::PyUnicode_CheckExact(k) != 0
    };
    (scan_all || !first_is_str) && d.keys().iter().any(|k| !format_key(&k))
}

fn format_key(k: &Bound<'_, PyAny>) -> bool {
    k.is_exact_instance_of::<PyString>()
        || k.is_none()
        || k.is_exact_instance_of::<PyBool>()
        || k.is_exact_instance_of::<PyInt>()
        || k.is_exact_instance_of::<PyFloat>()
        || exact::<PyTuple>(k).is_some_and(|t| t.iter().all(|x| format_key(&x)))
}

pub(crate) fn int_of(obj: &Bound<'_, PyAny>) -> PyResult<Int> {
    if let Ok(v) = obj.extract::<i64>() {
        return Ok(Int::Small(v));
    }
    Ok(Int::from_big(obj.extract::<num_bigint::BigInt>()?))
}

/// The leaf of an exact `None`, `bool`, `int`, `float` or `str`, when it converts as is.
pub(crate) fn scalar(obj: &Bound<'_, PyAny>) -> Option<Leaf> {
    if obj.is_none() {
        return Some(Leaf::None);
    }
    if obj.is_exact_instance_of::<PyString>() {
        return obj.extract::<String>().ok().map(Leaf::Str);
    }
    if obj.is_exact_instance_of::<PyInt>() {
        return int_of(obj).ok().map(Leaf::Int);
    }
    if obj.is_exact_instance_of::<PyFloat>() {
        return obj.extract::<f64>().ok().map(Leaf::Float);
    }
    if obj.is_exact_instance_of::<PyBool>() {
        return obj.extract::<bool>().ok().map(Leaf::Bool);
    }
    None
}

/// Whether this interpreter is a free-threaded build (`sys.abiflags` holds `t`).
fn free_threaded(py: Python<'_>) -> bool {
    static FREE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FREE.get_or_init(|| {
        py.import("sys")
            .and_then(|s| s.getattr("abiflags"))
            .and_then(|f| f.extract::<String>())
            .map_or(true, |f| f.contains('t'))
    })
}

/// Room an encoder starts with, learned from the saves made before with the same context (a
/// logging loop saves trees of one shape): an encoder that starts small grows its text and its
/// per-node vectors by doubling, copying everything each time. Each thread saving from Python
/// keeps its own context (`_api.py`), so saves on other threads never change it; a walk with no
/// context starts from the defaults.
#[pyclass(frozen)]
pub(crate) struct EncodeContext {
    hints: std::sync::Mutex<Hints>,
}

/// What [`EncodeContext`] remembers: the text writer's room (about the size of the last tree
/// that was all text) and the room of the walk's marks and per-container flags (what the last
/// walk used).
#[derive(Clone, Copy)]
struct Hints {
    text: usize,
    marks: usize,
    texted: usize,
}

impl Default for Hints {
    fn default() -> Self {
        Hints { text: 64 << 10, marks: 0, texted: 0 }
    }
}

#[pymethods]
impl EncodeContext {
    #[new]
    fn new() -> Self {
        EncodeContext { hints: std::sync::Mutex::new(Hints::default()) }
    }
}

/// The most either vector hint asks for (entries).
const VEC_HINT_MAX: usize = 1 << 21;

/// A Python tree converted to treepack's model, ready to be written (possibly on another thread).
#[pyclass(frozen)]
pub(crate) struct Prepared {
    pub(crate) node: std::sync::Mutex<Option<Node>>,
    /// A background save's copies not made yet: `snapshot()` makes them (the caller's thread,
    /// before it goes on), else the write does, before anything reads the bytes.
    pub(crate) pending: std::sync::Mutex<Vec<crate::snapshot::Pending>>,
}

/// Convert a Python tree (with the GIL held). With `snapshot`, array bytes are copied.
/// `text=False` builds a node for every value (tests compare the two ways' manifests). `reset`
/// is called before the tree is walked a second time (see below): what `encode_other` gathered
/// in order during the first walk (a save's Dask arrays) must be forgotten. `context` sizes the
/// encoder's buffers from the saves before (see [`EncodeContext`]) and learns from this one.
#[pyfunction]
#[pyo3(signature = (tree, encode_other, encode_array, snapshot=false, fast_datetime=false, shared=true, text=true, reset=None, context=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn prepare(
    py: Python<'_>,
    tree: &Bound<'_, PyAny>,
    encode_other: Bound<'_, PyAny>,
    encode_array: Bound<'_, PyAny>,
    snapshot: bool,
    fast_datetime: bool,
    shared: bool,
    text: bool,
    reset: Option<Bound<'_, PyAny>>,
    context: Option<Bound<'_, EncodeContext>>,
) -> PyResult<Prepared> {
    release_deferred(py);
    let hints =
        context.as_ref().map_or_else(Hints::default, |c| *c.get().hints.lock().unwrap_or_else(|p| p.into_inner()));
    let np = py.import("numpy")?;
    let (ndarray, generic) = (np.getattr("ndarray")?, np.getattr("generic")?);
    let plain_counts = !free_threaded(py);
    let scan_keys = std::cell::Cell::new(false);
    let new = |text: bool| Encoder {
        py,
        ndarray: ndarray.clone(),
        generic: generic.clone(),
        encode_other: encode_other.clone(),
        encode_array: encode_array.clone(),
        path: vec![],
        snapshot,
        pending: Vec::new(),
        fast_datetime,
        seen_bytes: HashMap::new(),
        root: tree.clone(),
        share: shared,
        ordinal: 0,
        seen: Default::default(),
        refd: Default::default(),
        again_met: Default::default(),
        known: None,
        ids: Default::default(),
        text_refs: 0,
        shared_firsts: 0,
        open: Default::default(),
        copying: Vec::new(),
        fragile: false,
        text: text.then(|| treepack::save::fragment_writer(hints.text)),
        inline_str: SaveOptions::default().inline_str_bytes,
        marks: Vec::with_capacity(hints.marks),
        texted: Vec::with_capacity(hints.texted),
        restart: false,
        keys: Vec::new(),
        key_scratch: String::new(),
        plain_counts,
        text_hint: true,
        unsupported: Vec::new(),
        scan_keys: scan_keys.get(),
        key_restart: Default::default(),
    };
    let forget = || reset.as_ref().map_or(Ok(()), |r| r.call0().map(drop));
    let mut enc = new(text);
    let mut first = enc.top(tree);
    if enc.key_restart.get() {
        // A dict whose first key is a str holds a key that is a value (a numpy integer, an enum
        // member): the walk, which took the first key's word for the rest, starts over looking
        // at every key of every dict, and such a dict becomes a `py.dict` node (pairs).
        drop(first);
        forget()?;
        scan_keys.set(true);
        enc = new(text);
        first = enc.top(tree);
    }
    let mut node = if !enc.restart {
        first?
    } else {
        // An object written as text was met again (a shared dict of plain values): its text
        // has no shared id; or many refs were made as nodes (`TEXT_REFS`). The first walk
        // went on to the end to find every object met again; the second gives each its id
        // as it begins (document order), so shared nodes and refs are written as text too.
        // Should it meet anything else again (an object made by `encode_other` during the
        // walk), the tree is walked a third time as nodes.
        drop(first);
        let known = std::mem::take(&mut enc.again_met);
        forget()?;
        enc = new(text);
        enc.known = Some(known);
        match enc.top(tree) {
            Err(_) if enc.restart => {
                forget()?;
                enc = new(false);
                enc.top(tree)?
            }
            r => r?,
        }
    };
    if !enc.unsupported.is_empty() {
        return Err(unsupported_error(py, std::mem::take(&mut enc.unsupported), false));
    }
    if let Some(c) = &context {
        let mut h = c.get().hints.lock().unwrap_or_else(|p| p.into_inner());
        h.marks = enc.marks.capacity().min(VEC_HINT_MAX);
        h.texted = enc.texted.capacity().min(VEC_HINT_MAX);
        if let Tree::Leaf(Leaf::Fragment(f)) = &node {
            // The next save of a tree like this one starts with room for its text.
            h.text = (f.text().len() + f.text().len() / 8).min(256 << 20);
        }
    }
    let pending = std::mem::take(&mut enc.pending);
    if !enc.refd.is_empty() {
        let refd = std::mem::take(&mut enc.refd);
        drop(enc);
        node = share_refs(node, &refd)?;
    }
    Ok(Prepared { node: std::sync::Mutex::new(Some(node)), pending: std::sync::Mutex::new(pending) })
}

#[pymethods]
impl Prepared {
    /// Make the copies of a background save's arrays (see `snapshot`), with the GIL held:
    /// once this returns the caller may change them. Returns the bytes copied (0 the second
    /// time, and for a save that copies nothing).
    pub(crate) fn snapshot(&self) -> PyResult<usize> {
        let pending =
            std::mem::take(&mut *self.pending.lock().map_err(|_| PyValueError::new_err("prepared tree is poisoned"))?);
        Ok(if pending.is_empty() { 0 } else { crate::snapshot::run(pending) })
    }

    /// Write the tree (GIL released).
    /// A prepared tree is written once; its memory is freed afterwards. `background`: a save
    /// nobody waits for, written at the lowest CPU priority by this thread and pools of their
    /// own (`treepack::in_background`: call it so only from a thread kept for such saves).
    #[pyo3(signature = (path, overwrite=false, metadata=None, chunk_bytes=None, storage_options=None, progress=None, compression=None, durable=true, background=false, compress_manifest=None))]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn write(
        &self,
        py: Python<'_>,
        path: &str,
        overwrite: bool,
        metadata: Option<String>,
        chunk_bytes: Option<u64>,
        storage_options: Options,
        progress: Option<Py<PyAny>>,
        compression: Option<String>,
        durable: bool,
        background: bool,
        compress_manifest: Option<bool>,
    ) -> PyResult<SaveInfo> {
        self.snapshot()?;
        let node = self.take()?;
        let mut opts = save_options(overwrite, metadata, chunk_bytes, progress, compression, durable)?;
        opts.manifest_compression = compress_manifest;
        let loc = location(path, storage_options)?;
        let info = py.detach_releasing(|| {
            let save = || treepack::block_on(treepack::save_async(&node, &loc, &opts));
            let r = if background { treepack::in_background(save) } else { save() };
            if r.as_ref().is_ok_and(|i| i.leaves >= treepack::save::BACKGROUND_DROP_LEAVES) {
                treepack::save::drop_in_background(node);
            } else {
                drop(node);
            }
            r
        });
        Ok(info.map_err(py_err)?.into())
    }

    /// Write this process's part of a save shared by processes (packs only): returns the
    /// part's manifest (bytes, for `commit_parts`) and what was written.
    #[pyo3(signature = (path, overwrite=false, metadata=None, chunk_bytes=None, storage_options=None, compression=None, durable=true, compress_manifest=None))]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn write_part<'py>(
        &self,
        py: Python<'py>,
        path: &str,
        overwrite: bool,
        metadata: Option<String>,
        chunk_bytes: Option<u64>,
        storage_options: Options,
        compression: Option<String>,
        durable: bool,
        compress_manifest: Option<bool>,
    ) -> PyResult<(Bound<'py, PyBytes>, SaveInfo)> {
        self.snapshot()?;
        let node = self.take()?;
        let mut opts = save_options(overwrite, metadata, chunk_bytes, None, compression, durable)?;
        opts.manifest_compression = compress_manifest;
        let loc = location(path, storage_options)?;
        let (bytes, info) = py
            .detach_releasing(|| treepack::block_on(treepack::save::save_part_async(&node, &loc, &opts)))
            .map_err(py_err)?;
        Ok((PyBytes::new(py, &bytes), info.into()))
    }
}

impl Prepared {
    fn take(&self) -> PyResult<Node> {
        self.node
            .lock()
            .map_err(|_| PyValueError::new_err("prepared tree is poisoned"))?
            .take()
            .ok_or_else(|| PyValueError::new_err("this prepared tree was already written"))
    }
}

fn save_options(
    overwrite: bool,
    metadata: Option<String>,
    chunk_bytes: Option<u64>,
    progress: Option<Py<PyAny>>,
    compression: Option<String>,
    durable: bool,
) -> PyResult<SaveOptions> {
    let mut opts = SaveOptions { overwrite, durable, progress: progress_fn(progress), ..Default::default() };
    if let Some(m) = metadata {
        opts.metadata = Some(serde_json::from_str(&m).map_err(|e| PyValueError::new_err(format!("metadata: {e}")))?);
    }
    if let Some(c) = chunk_bytes {
        opts.chunk_bytes = c.max(1);
    }
    if let Some(c) = compression {
        opts.compression = treepack::save::Compression::parse(&c).map_err(py_err)?;
    }
    Ok(opts)
}

/// Free the buffers background saves keep for the next one (`snapshot`); the bytes freed.
#[pyfunction]
pub(crate) fn release_snapshot_buffers() -> usize {
    crate::snapshot::release()
}

/// Commit a save written in parts (each part's manifest from `Prepared.write_part`, the
/// committer's own first): merged into one tree, committed atomically.
#[pyfunction]
#[pyo3(signature = (path, parts, overwrite=false, storage_options=None, durable=true, compress_manifest=None))]
pub(crate) fn commit_parts(
    py: Python<'_>,
    path: &str,
    parts: Vec<Vec<u8>>,
    overwrite: bool,
    storage_options: Options,
    durable: bool,
    compress_manifest: Option<bool>,
) -> PyResult<SaveInfo> {
    let opts = SaveOptions { overwrite, durable, manifest_compression: compress_manifest, ..Default::default() };
    let loc = location(path, storage_options)?;
    let info = py.detach_releasing(|| treepack::block_on(treepack::save::commit_parts_async(&loc, &parts, &opts)));
    Ok(info.map_err(py_err)?.into())
}

/// The chunk shape the writer gives an array of `shape` held in blocks of `block` (shards):
/// chunks tile every block (format::grid::block_chunk_shape). `target`: chunk bytes, default
/// the writer's.
#[pyfunction]
#[pyo3(signature = (shape, block, itemsize, target=None))]
pub(crate) fn block_chunk_shape(
    shape: Vec<u64>,
    block: Vec<u64>,
    itemsize: u64,
    target: Option<u64>,
) -> PyResult<Vec<u64>> {
    if block.len() != shape.len() || block.contains(&0) {
        return Err(PyValueError::new_err(format!("block {block:?} does not fit shape {shape:?}")));
    }
    let target = target.unwrap_or_else(|| SaveOptions::default().chunk_bytes).max(1);
    Ok(treepack::format::grid::block_chunk_shape(&shape, &block, itemsize, target))
}

/// Check a compression policy (`save(compression=...)`, as text) before anything is converted
/// or written; raises `ValueError` saying what is wrong.
#[pyfunction]
pub(crate) fn check_compression(policy: &str) -> PyResult<()> {
    treepack::save::Compression::parse(policy).map(drop).map_err(py_err)
}

/// Why a dict key has no [`Key`], with the (innermost) Python value at fault.
pub(crate) enum NoKey<'py> {
    /// A str with lone surrogates: keys are JSON strings.
    NotUnicode(Bound<'py, PyAny>),
    /// Not a str, int, float, bool, None or a tuple of these (subclasses included).
    Unsupported(Bound<'py, PyAny>),
    Failed(PyErr),
}

/// The one conversion of a Python dict key to the file's [`Key`]: the encoder stores it, and
/// error messages print a key path with it (`structure.rs`), so both spell a key alike.
#[inline]
pub(crate) fn key_of<'py>(k: &Bound<'py, PyAny>) -> Result<Key, NoKey<'py>> {
    // Nearly every key is a str: checked first.
    if let Some(s) = exact::<PyString>(k) {
        return match s.to_str() {
            Ok(v) => Ok(Key::Str(v.to_owned())),
            Err(_) => Err(NoKey::NotUnicode(k.clone())),
        };
    }
    if k.is_none() {
        return Ok(Key::None);
    }
    if k.is_exact_instance_of::<PyBool>() {
        return k.extract().map(Key::Bool).map_err(NoKey::Failed);
    }
    if k.is_exact_instance_of::<PyInt>() {
        return int_of(k).map(Key::Int).map_err(NoKey::Failed);
    }
    if k.is_exact_instance_of::<PyFloat>() {
        return k.extract().map(Key::Float).map_err(NoKey::Failed);
    }
    if let Some(t) = exact::<PyTuple>(k) {
        return t.iter().map(|x| key_of(&x)).collect::<Result<_, _>>().map(Key::Tuple);
    }
    Err(NoKey::Unsupported(k.clone()))
}
