//! The one builder of loaded trees: Python objects from a manifest as it is parsed (a one-pass
//! load, see `treepack::read::one_pass`), from a reader's manifest and its fetched leaves, or
//! from a loaded `Node` (selections). Which path runs is the core's decision.

use super::*;
use treepack::format::manifest::{Build, KeyRef, Stored};

/// (is str, pack, offset, length) of a stored str/bytes blob.
type BlobKey = (bool, u32, u64, u64);

/// Builds a load's Python objects. Before the audit (a one-pass load) it takes only what needs
/// none: containers, leaves, and custom nodes of the built-in types in `free` (datetime and the
/// like); a record or any other custom type stops it, and the caller audits, then loads
/// through the `Reader`.
pub(crate) struct LoadBuilder<'py, 'a> {
    py: Python<'py>,
    pub(crate) dec: std::cell::RefCell<Decoder<'py>>,
    /// Objects of the stored str/bytes already built, by (is str, pack, offset, length) of
    /// their blob: shared, as pickle's memo shares an object referenced many times.
    shared: std::cell::RefCell<HashMap<BlobKey, Py<PyAny>>>,
    /// `Some` before the audit: the custom types that may be built.
    free: Option<&'a HashSet<String>>,
    /// The first Python error met (the parse and the walks carry only its text).
    err: std::cell::RefCell<Option<PyErr>>,
    /// Shared objects (format 1.2) by id, once built.
    objects: std::cell::RefCell<Vec<Option<Py<PyAny>>>>,
    /// Shared nodes begun and not yet complete, with the placeholder a ref to them (a cycle)
    /// returns, and the places that placeholder was put, patched when the object is built.
    open: std::cell::RefCell<HashMap<u64, OpenShared<'py>>>,
    refs: std::cell::RefCell<treepack::format::refs::RefCheck>,
    /// Sets and dicts built with elements or keys a cycle had not completed yet, with those
    /// elements: each must still be found in its container once every cycle is complete.
    hashed: std::cell::RefCell<Vec<HashedCheck<'py>>>,
    /// The key path of the node whose build failed, innermost step first (`failed_under`).
    failed: std::cell::RefCell<Vec<String>>,
}

/// The elements (`py.set`, `py.frozenset`: its children) or keys (`py.dict`: the first of each
/// pair of its `items`) a hashed container is built from.
fn hashed_elements<'py>(type_name: &str, children: &[(String, Bound<'py, PyAny>)]) -> PyResult<Vec<Bound<'py, PyAny>>> {
    if type_name != "py.dict" {
        return Ok(children.iter().map(|(_, v)| v.clone()).collect());
    }
    let mut out = Vec::new();
    for (_, v) in children.iter().filter(|(n, _)| n == "items") {
        for item in v.try_iter()? {
            if let Ok(pair) = item?.cast::<PyTuple>() {
                if let Ok(k) = pair.get_item(0) {
                    out.push(k);
                }
            }
        }
    }
    Ok(out)
}

/// A set or dict built before a cycle completed its elements or keys: (the container, its
/// type, those elements).
type HashedCheck<'py> = (Bound<'py, PyAny>, String, Vec<Bound<'py, PyAny>>);

/// `obj`'s instance dict as the object stores it — no `__dict__` property or `__getattr__` of
/// its class runs — or `None` when it has none.
fn instance_dict<'py>(obj: &Bound<'py, PyAny>) -> Option<Bound<'py, PyDict>> {
    // SAFETY: called with the GIL (a `Bound` proves it) on a live object; it returns a new
    // reference, or null with an exception set, which is cleared.
    let attrs = unsafe { pyo3::ffi::PyObject_GenericGetDict(obj.as_ptr(), std::ptr::null_mut()) };
    if attrs.is_null() {
        drop(PyErr::take(obj.py()));
        return None;
    }
    // SAFETY: the new reference PyObject_GenericGetDict returned.
    let attrs = unsafe { Bound::from_owned_ptr(obj.py(), attrs) };
    attrs.cast_into::<PyDict>().ok()
}

/// How deep `holds_unfinished` looks into a hashed container's elements.
const HASHED_SCAN_DEPTH: usize = 64;

/// A shared object being built: the placeholder a cycle's ref gets, and where it was put.
type OpenShared<'py> = (Py<PyAny>, Vec<Slot<'py>>);

/// Where a cycle's placeholder sits: a list's item, a dict's value, a record's field.
enum Slot<'py> {
    Item(Bound<'py, PyAny>, usize),
    Value(Bound<'py, PyAny>, Bound<'py, PyAny>),
    Field(Bound<'py, PyAny>, String),
}

impl<'py, 'a> LoadBuilder<'py, 'a> {
    pub(crate) fn new(dec: Decoder<'py>, free: Option<&'a HashSet<String>>) -> Self {
        LoadBuilder {
            py: dec.py,
            dec: std::cell::RefCell::new(dec),
            shared: Default::default(),
            free,
            err: Default::default(),
            objects: Default::default(),
            open: Default::default(),
            refs: Default::default(),
            hashed: Default::default(),
            failed: Default::default(),
        }
    }

    fn py_ok<T>(&self, r: PyResult<T>) -> Result<T, String> {
        r.map_err(|e| {
            let msg = e.to_string();
            self.err.borrow_mut().get_or_insert(e);
            msg
        })
    }

    /// The Python error behind a failed build (or one made of its message), with the key path
    /// of the node that failed as its `_treepack_at` (under `subpath` when the build was of a
    /// subtree), which `load` puts in its message.
    pub(crate) fn error(&self, msg: String, subpath: Option<&str>) -> PyErr {
        let e = self.err.borrow_mut().take().unwrap_or_else(|| PyValueError::new_err(msg));
        let steps = self.failed.borrow();
        let at = subpath.filter(|p| !p.is_empty()).into_iter().chain(steps.iter().rev().map(String::as_str));
        let at = at.collect::<Vec<_>>().join("/");
        // (an exception that takes no attribute is reported without its place)
        let _ = e.value(self.py).setattr("_treepack_at", at);
        e
    }
}

impl<'py> Build for LoadBuilder<'py, '_> {
    type Node = Bound<'py, PyAny>;
    const HELPER: bool = true;
    const PATHS: bool = false;
    fn failed_under(&self, step: treepack::format::model::Step<'_>) {
        self.failed.borrow_mut().push(treepack::format::keypath::steps_text(&[step]));
    }
    fn leaf_ref(&self, e: &Entry) -> Result<Self::Node, String> {
        let r = self.dec.borrow_mut().inline_entry(e);
        self.py_ok(r)
    }
    fn str_leaf(&self, v: &str) -> Result<Self::Node, String> {
        Ok(PyString::new(self.py, v).into_any())
    }
    fn none_leaf(&self) -> Result<Self::Node, String> {
        Ok(self.py.None().into_bound(self.py))
    }
    fn bool_leaf(&self, v: bool) -> Result<Self::Node, String> {
        Ok(PyBool::new(self.py, v).to_owned().into_any())
    }
    fn int_leaf(&self, v: i64) -> Result<Self::Node, String> {
        Ok(v.into_pyobject(self.py).map_or_else(|e| match e {}, Bound::into_any))
    }
    fn float_leaf(&self, v: f64) -> Result<Self::Node, String> {
        Ok(PyFloat::new(self.py, v).into_any())
    }
    fn value(&self, l: Leaf) -> Result<Self::Node, String> {
        let r = self.dec.borrow_mut().leaf(l);
        self.py_ok(r)
    }
    fn stored(&self, e: &Entry, fetch: &mut dyn FnMut() -> Result<Leaf, String>) -> Result<Self::Node, String> {
        let key = match e {
            Entry::Str(Stored::Blob { chunk, .. }) | Entry::Bytes(Stored::Blob { chunk, .. }) => {
                Some((matches!(e, Entry::Str(_)), chunk.pack, chunk.offset, chunk.length))
            }
            _ => None,
        };
        let Some(key) = key else { return self.value(fetch()?) };
        if let Some(v) = self.shared.borrow().get(&key) {
            return Ok(v.bind(self.dec.borrow().py).clone());
        }
        let v = self.value(fetch()?)?;
        self.shared.borrow_mut().insert(key, v.clone().unbind());
        Ok(v)
    }
    fn list(&self, items: Vec<Self::Node>, tuple: bool) -> Result<Self::Node, String> {
        let cyclic: Vec<(usize, u64)> = self.placeholders(items.iter().enumerate());
        if tuple && !cyclic.is_empty() {
            return Err("a tuple inside itself (a cycle through a tuple) cannot be rebuilt".into());
        }
        let r = self.dec.borrow().sequence(items, tuple);
        let list = self.py_ok(r)?;
        for (i, id) in cyclic {
            self.put(id, Slot::Item(list.clone(), i));
        }
        Ok(list)
    }
    fn dict(&self, pairs: Vec<(Key, Self::Node)>) -> Result<Self::Node, String> {
        self.dict_ref(pairs.into_iter().map(|(k, v)| (KeyRef::Owned(k), v)).collect())
    }
    fn dict_ref(&self, pairs: Vec<(KeyRef<'_>, Self::Node)>) -> Result<Self::Node, String> {
        self.make_dict(pairs)
    }
    fn named_begin(&self, custom: bool, type_name: &str) -> Result<(), String> {
        // Refused here, before the node's fields or children are read and built, not after
        // (a one-pass load of a small TrainState read and built all of it twice).
        match self.free {
            Some(_) if !custom => Err("a record: audit first".into()),
            Some(f) if !f.contains(type_name) => Err("a custom type that needs the audit".into()),
            _ => Ok(()),
        }
    }
    fn record(&self, type_name: String, fields: Vec<(String, Self::Node)>) -> Result<Self::Node, String> {
        if self.free.is_some() {
            return Err("a record: audit first".into());
        }
        let cyclic: Vec<(String, u64)> = self.placeholders(fields.iter().map(|(n, v)| (n.clone(), v)));
        let obj = self.other("record", &type_name, &serde_json::Value::Null, fields)?;
        for (name, id) in cyclic {
            self.put(id, Slot::Field(obj.clone(), name));
        }
        Ok(obj)
    }
    fn shared_begin(&self, id: u64) {
        let r = self.refs.borrow_mut().begin(id);
        if let Err(e) = r {
            self.err.borrow_mut().get_or_insert(PyValueError::new_err(e));
            return;
        }
        let py = self.dec.borrow().py;
        // A fresh object that stands for the one being built, where a cycle refers to it.
        let placeholder = py.get_type::<pyo3::types::PyAny>().call0().map(|o| o.unbind());
        match placeholder {
            Ok(p) => {
                self.open.borrow_mut().insert(id, (p, Vec::new()));
            }
            Err(e) => {
                self.err.borrow_mut().get_or_insert(e);
            }
        }
    }
    fn shared(&self, id: u64, node: Self::Node) -> Result<Self::Node, String> {
        if let Some(e) = self.err.borrow().as_ref() {
            return Err(e.to_string());
        }
        let Some((stand_in, slots)) = self.open.borrow_mut().remove(&id) else {
            return Err(format!("shared node {id} ends without having begun"));
        };
        for slot in slots {
            let r = match slot {
                Slot::Item(list, i) => list.set_item(i, &node),
                // A dict's own store, not a subclass's `__setitem__` (which may do more than
                // store: the value was given to it already, as the placeholder).
                Slot::Value(d, k) => match d.cast::<PyDict>() {
                    Ok(d) => d.set_item(k, &node),
                    Err(_) => d.set_item(k, &node),
                },
                Slot::Field(obj, name) => {
                    let py = node.py();
                    py.import("builtins")
                        .and_then(|b| b.getattr("object"))
                        .and_then(|o| o.call_method1("__setattr__", (&obj, name, &node)))
                        .map(drop)
                }
            };
            self.py_ok(r)?;
        }
        // Every place the stand-in was put has been given the object; one still holding it is
        // a copy made by something built inside the cycle (a deque, an object array, a
        // validated model: a file no treepack writes). Refused rather than returned corrupt.
        // SAFETY: reading the reference count of an object this builder holds, with the GIL.
        if unsafe { pyo3::ffi::Py_REFCNT(stand_in.as_ptr()) } > 1 {
            return Err(format!(
                "shared object {id} holds itself through an object built from copies of its contents \
                 (a tuple, an object array, a namedtuple, a model or a registered type): that cycle cannot \
                 be rebuilt"
            ));
        }
        if self.open.borrow().is_empty() {
            let checks = std::mem::take(&mut *self.hashed.borrow_mut());
            for (container, type_name, elems) in checks {
                for e in elems {
                    if !self.py_ok(container.contains(&e))? {
                        return Err(format!(
                            "a {type_name} whose element or key held an object a cycle completed after it was \
                             hashed: its hash changed, so the {type_name} cannot be rebuilt (no treepack writes \
                             such a cycle)"
                        ));
                    }
                }
            }
        }
        let mut objects = self.objects.borrow_mut();
        let i = usize::try_from(id).map_err(|_| format!("shared id {id} is too large"))?;
        if objects.len() <= i {
            objects.resize_with(i + 1, || None);
        }
        objects[i] = Some(node.clone().unbind());
        Ok(node)
    }
    fn reference(&self, id: u64) -> Result<Self::Node, String> {
        self.refs.borrow().reference(id)?;
        let py = self.dec.borrow().py;
        if let Some((p, _)) = self.open.borrow().get(&id) {
            // A cycle: the object is still being built.
            return Ok(p.bind(py).clone());
        }
        let objects = self.objects.borrow();
        match usize::try_from(id).ok().and_then(|i| objects.get(i)).and_then(Option::as_ref) {
            Some(o) => Ok(o.bind(py).clone()),
            None => Err(format!("ref to shared object {id}, which this load did not build")),
        }
    }
    fn custom(
        &self,
        type_name: String,
        data: serde_json::Value,
        children: Vec<(String, Self::Node)>,
    ) -> Result<Self::Node, String> {
        if self.free.is_some_and(|f| !f.contains(&type_name)) {
            return Err("a custom type that needs the audit".into());
        }
        // Elements and keys are hashed as the container is built: one holding an object that a
        // cycle's patch completes later is hashed half-built. Its hash may not depend on what
        // the patch changes (an object hashed by identity), so it is checked once every cycle
        // is complete (`shared`), and the load refused if an element is no longer found.
        let hashed =
            if matches!(type_name.as_str(), "py.set" | "py.frozenset" | "py.dict") && !self.open.borrow().is_empty() {
                let elems = self.py_ok(hashed_elements(&type_name, &children))?;
                if self.py_ok(self.holds_unfinished(elems.clone()))? {
                    Some(elems)
                } else {
                    None
                }
            } else {
                None
            };
        let patched = crate::PATCHED_AFTER.contains(&type_name.as_str());
        if !patched && !self.placeholders(children.iter().map(|(n, v)| (n.clone(), v))).is_empty() {
            return Err(format!(
                "a cycle through an object of type {type_name}: only lists, dicts, records and the \
                 containers pickle also fills after making them (OrderedDict, defaultdict, Counter, deque, \
                 dict subclasses) can be rebuilt inside themselves"
            ));
        }
        let obj = self.other("custom", &type_name, &data, children)?;
        if patched && !self.open.borrow().is_empty() {
            self.py_ok(self.note_copied(&obj))?;
        }
        if let Some(elems) = hashed {
            self.hashed.borrow_mut().push((obj.clone(), type_name, elems));
        }
        Ok(obj)
    }
}

impl<'py> LoadBuilder<'py, '_> {
    /// A dict of built values; a cycle's placeholders among the values are noted, to be
    /// patched when their object is complete.
    fn make_dict(&self, pairs: Vec<(KeyRef<'_>, Bound<'py, PyAny>)>) -> Result<Bound<'py, PyAny>, String> {
        let cyclic =
            !self.open.borrow().is_empty() && !self.placeholders(pairs.iter().map(|(_, v)| ((), v))).is_empty();
        let r = self.dec.borrow().dict_of(pairs);
        let d = self.py_ok(r)?;
        if cyclic {
            let items: Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)> =
                self.py_ok(d.cast::<PyDict>().map_err(PyErr::from).map(|d| d.iter().collect()))?;
            for (k, v) in items {
                if let Some(id) = self.placeholder_id(&v) {
                    self.put(id, Slot::Value(d.clone(), k));
                }
            }
        }
        Ok(d)
    }

    /// The places in `obj`, a container built from copies of its children (`PATCHED_AFTER`),
    /// that hold a cycle's placeholder, noted to be patched as a list's or a dict's are: its
    /// values (a dict or a dict subclass), its items (a deque), its instance attributes, its slots
    /// and a `UserDict`'s `data`. A copy kept anywhere else is found by the count of references to
    /// the placeholder when its object is complete, and refused there.
    fn note_copied(&self, obj: &Bound<'py, PyAny>) -> PyResult<()> {
        let py = obj.py();
        let mut dicts: Vec<Bound<'py, PyDict>> = Vec::new();
        if let Ok(d) = obj.cast::<PyDict>() {
            dicts.push(d.clone());
        } else if obj.is_instance(&py.import("collections")?.getattr("deque")?)? {
            for (i, v) in obj.try_iter()?.enumerate() {
                if let Some(id) = self.placeholder_id(&v?) {
                    self.put(id, Slot::Item(obj.clone(), i));
                }
            }
        }
        // No instance dict (an OrderedDict, a deque): nothing more to patch there.
        if let Some(attrs) = instance_dict(obj) {
            if obj.is_instance(&py.import("collections")?.getattr("UserDict")?)? {
                if let Some(data) = attrs.get_item("data")? {
                    if let Ok(data) = data.cast::<PyDict>() {
                        dicts.push(data.clone());
                    }
                }
            }
            dicts.push(attrs);
        }
        for d in dicts {
            for (k, v) in d.iter() {
                if let Some(id) = self.placeholder_id(&v) {
                    self.put(id, Slot::Value(d.clone().into_any(), k));
                }
            }
        }
        // Its slots (a dict subclass's `__slots__`, put back from its attributes child).
        let names = py.import("treepack._codec.records")?.getattr("slot_names")?.call1((obj.get_type(),))?;
        let getattribute = py.import("builtins")?.getattr("object")?.getattr("__getattribute__")?;
        for name in names.try_iter()? {
            let name: String = name?.extract()?;
            if let Ok(v) = getattribute.call1((obj, &name)) {
                if let Some(id) = self.placeholder_id(&v) {
                    self.put(id, Slot::Field(obj.clone(), name));
                }
            }
        }
        Ok(())
    }

    /// Whether any of `values`, or what they hold (items of lists, tuples and sets; instance
    /// attributes), is an object a pending patch will still complete (a record awaiting a
    /// cycle's field) or a cycle's placeholder itself. Only asked while a cycle is open.
    fn holds_unfinished(&self, values: Vec<Bound<'py, PyAny>>) -> PyResult<bool> {
        let open = self.open.borrow();
        let mut pending: HashSet<usize> = HashSet::new();
        for (p, slots) in open.values() {
            pending.insert(p.as_ptr() as usize);
            for slot in slots {
                if let Slot::Field(obj, _) = slot {
                    pending.insert(obj.as_ptr() as usize);
                }
            }
        }
        drop(open);
        let mut stack: Vec<(Bound<'py, PyAny>, usize)> = values.into_iter().map(|v| (v, 0)).collect();
        let mut seen: HashSet<usize> = HashSet::new();
        while let Some((v, depth)) = stack.pop() {
            let addr = v.as_ptr() as usize;
            if pending.contains(&addr) {
                return Ok(true);
            }
            if depth > HASHED_SCAN_DEPTH || !seen.insert(addr) {
                continue;
            }
            let kids: Vec<Bound<'py, PyAny>> = if let Ok(l) = v.cast::<PyList>() {
                l.iter().collect()
            } else if let Ok(t) = v.cast::<PyTuple>() {
                t.iter().collect()
            } else if let Ok(s) = v.cast::<pyo3::types::PyFrozenSet>() {
                s.iter().collect()
            } else if let Ok(s) = v.cast::<pyo3::types::PySet>() {
                s.iter().collect()
            } else {
                match instance_dict(&v) {
                    Some(d) => d.values().iter().collect(),
                    None => continue,
                }
            };
            stack.extend(kids.into_iter().map(|k| (k, depth + 1)));
        }
        Ok(false)
    }

    /// The id of the shared object `v` stands for, if `v` is a cycle's placeholder.
    fn placeholder_id(&self, v: &Bound<'py, PyAny>) -> Option<u64> {
        self.open.borrow().iter().find(|(_, (p, _))| p.as_ptr() == v.as_ptr()).map(|(id, _)| *id)
    }

    /// The children that are cycles' placeholders, with their ids (nothing to scan when no
    /// shared node is open).
    fn placeholders<'v, K>(&self, kids: impl Iterator<Item = (K, &'v Bound<'py, PyAny>)>) -> Vec<(K, u64)>
    where
        'py: 'v,
    {
        if self.open.borrow().is_empty() {
            return Vec::new();
        }
        kids.filter_map(|(k, v)| self.placeholder_id(v).map(|id| (k, id))).collect()
    }

    /// Remember that the placeholder of `id` sits at `slot`.
    fn put(&self, id: u64, slot: Slot<'py>) {
        if let Some((_, slots)) = self.open.borrow_mut().get_mut(&id) {
            slots.push(slot);
        }
    }

    fn other(
        &self,
        kind: &str,
        type_name: &str,
        data: &serde_json::Value,
        kids: Vec<(String, Bound<'py, PyAny>)>,
    ) -> Result<Bound<'py, PyAny>, String> {
        let mut dec = self.dec.borrow_mut();
        let r = dec.named(kids).and_then(|pairs| dec.other_built(kind, type_name, data, pairs));
        drop(dec);
        self.py_ok(r)
    }
}

/// A load, as the core's policy decides (`treepack::read::one_pass::load_with`): a whole tree
/// needing no audit built in one pass over the manifest; anything else (or any failure there)
/// through `through_reader(reader)`, the Python steps of a load (integrations' hooks, the
/// audit, `Reader.load`), on the reader `open_reader()` gives (checked against `expect_root`);
/// a `FileNotFoundError` from it starts the load over when the reader's `replaced()` says the
/// tree was replaced. `select`, `like` (a template is given), `mmap`, `progress` (a callback is
/// given) and `expect_root` are what the policy reads of the load's options.
#[pyfunction]
#[pyo3(name = "load", signature = (path, decode_other, np_dtype, free_types, open_reader, through_reader, select=None, like=false, mmap=false, progress=false, verify=true, expect_root=None, storage_options=None, signed_by=None, min_version=None, not_before_ms=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn load_tree(
    py: Python<'_>,
    path: &str,
    decode_other: Py<PyAny>,
    np_dtype: Py<PyAny>,
    free_types: HashSet<String>,
    open_reader: Py<PyAny>,
    through_reader: Py<PyAny>,
    select: Option<Vec<String>>,
    like: bool,
    mmap: bool,
    progress: bool,
    verify: bool,
    expect_root: Option<&str>,
    storage_options: Options,
    signed_by: Option<Vec<(String, String)>>,
    min_version: Option<u64>,
    not_before_ms: Option<u64>,
) -> PyResult<Py<PyAny>> {
    if select.is_none() && !like && !progress && expect_root.is_none() && signed_by.is_none() {
        let plain = storage_options.as_ref().is_none_or(|o| o.key.is_none());
        if plain {
            if let Some(out) =
                load_foreign_whole(py, path, &storage_options, &decode_other, &np_dtype, &free_types, mmap)?
            {
                return Ok(out);
            }
        }
    }
    let loc = location(path, storage_options)?;
    // A signed load: the core checks the manifest it builds from (docs/signing.md); readers
    // Python opens check their own (`LoadRequest.reader`).
    let signed_by = signed_by.map(|keys| crate::signing::policy(keys, min_version, not_before_ms)).transpose()?;
    let opts = LoadOptions {
        select: select.unwrap_or_default(),
        keep: like.then(HashSet::new),
        mmap,
        verify,
        // Only whether there is one: the callback itself is Python's, given to `Reader.load`.
        progress: progress.then(|| treepack::ProgressFn::new(|_, _| {})),
        expect_root: expect_root.map(root_hash_arg).transpose()?,
        signed_by: signed_by.clone(),
        ..Default::default()
    };
    let expect_root = opts.expect_root;
    let paths =
        PyLoadPaths { decode_other, np_dtype, free_types, open_reader, through_reader, verify, expect_root, signed_by };
    // What comes back through the detached section is `Held` (an error as its exception
    // object): a `Py` or `PyErr` dropped there, a reader after its last attempt, would go to
    // pyo3's pool (design decision 101).
    match py.detach_releasing(|| treepack::read::one_pass::load_with(&loc, &opts, &paths)) {
        Ok(out) => Ok(out.bind(py).clone().unbind()),
        Err(e) => Err(PyErr::from_value(e.0.bind(py).clone())),
    }
}

/// An error raised by Python in a load's detached section, kept as its exception object.
struct HeldErr(Held);

impl HeldErr {
    fn new(e: PyErr) -> HeldErr {
        Python::attach(|py| HeldErr(Held::new(e.into_value(py).into_any())))
    }
}

/// A whole load of another tool's local file that the core reads (`torch.save`, safetensors,
/// GGUF, DCP, Hugging Face shards), asking for nothing a treepack tree is needed for (no
/// selection, template, progress, expected root or signature): built straight from the tree
/// the file holds (`Location::foreign_of`), with no treepack tree in memory between — no chunk
/// hashed, no copy but the one into each array. With `mmap`, arrays are read-only views of the
/// file's private mapping (nothing is read until touched); otherwise each is copied out, in
/// parallel, before anything is built. `None` when the path is not such a file, or when the
/// build needs what only the general path gives (an audit of a type): the caller then loads
/// it the general way, which reports in full.
#[allow(clippy::too_many_arguments)]
fn load_foreign_whole(
    py: Python<'_>,
    path: &str,
    storage_options: &Options,
    decode_other: &Py<PyAny>,
    np_dtype: &Py<PyAny>,
    free_types: &HashSet<String>,
    mmap: bool,
) -> PyResult<Option<Py<PyAny>>> {
    let opts: treepack::StorageOptions =
        storage_options.as_ref().map(|a| a.options.clone().into_iter().collect()).unwrap_or_default();
    let tree = py
        .detach_releasing(|| {
            let Some(found) = treepack::Location::foreign_of(path, &opts)? else { return Ok(None) };
            if mmap {
                Ok(Some(found.tree))
            } else {
                found.into_owned().map(Some)
            }
        })
        .map_err(py_err)?;
    let Some(tree) = tree else { return Ok(None) };
    let dec = Decoder::new(py, Some(decode_other.bind(py).clone()), Some(np_dtype.bind(py).clone()), mmap);
    let builder = LoadBuilder::new(dec, Some(free_types));
    let built = without_gc(py, || Ok(treepack::format::manifest::replay_values(&builder, tree)))?;
    Ok(built.ok().map(Bound::unbind))
}

/// The Python paths of [`load_tree`]; each takes the GIL back for its Python work.
struct PyLoadPaths {
    decode_other: Py<PyAny>,
    np_dtype: Py<PyAny>,
    free_types: HashSet<String>,
    open_reader: Py<PyAny>,
    through_reader: Py<PyAny>,
    verify: bool,
    expect_root: Option<treepack::Hash32>,
    signed_by: Option<treepack::SignedBy>,
}

impl treepack::read::one_pass::LoadPaths for PyLoadPaths {
    type Out = Held;
    type Err = HeldErr;
    type Reader = Held;
    fn one_pass(&self, loc: &treepack::Location, bytes: &[u8], file: &str) -> Option<Held> {
        Python::attach(|py| {
            let dec =
                Decoder::new(py, Some(self.decode_other.bind(py).clone()), Some(self.np_dtype.bind(py).clone()), false);
            let builder = LoadBuilder::new(dec, Some(&self.free_types));
            let built =
                without_gc(py, || Ok(treepack::read::one_pass::load_one_pass(loc, bytes, file, &builder, self.verify)));
            built.ok().flatten().map(|b| Held::new(b.unbind()))
        })
    }
    fn open(&self, loc: &treepack::Location, _: Option<(treepack::Location, &[u8], String)>) -> Result<Held, HeldErr> {
        self.open_py(loc).map(Held::new).map_err(HeldErr::new)
    }
    fn through_reader(&self, reader: &Held) -> Result<Held, HeldErr> {
        Python::attach(|py| self.through_reader.call1(py, (reader.bind(py),))).map(Held::new).map_err(HeldErr::new)
    }
    fn missing(&self, e: &HeldErr) -> bool {
        Python::attach(|py| e.0.bind(py).is_instance_of::<PyFileNotFoundError>())
    }
    fn replaced(&self, reader: &Held) -> bool {
        Python::attach(|py| reader.bind(py).call_method0("replaced").and_then(|b| b.extract::<bool>())).unwrap_or(false)
    }
    fn error(&self, e: treepack::Error) -> HeldErr {
        HeldErr::new(py_err(e))
    }
}

impl PyLoadPaths {
    fn open_py(&self, loc: &treepack::Location) -> PyResult<Py<PyAny>> {
        if loc.read_from().is_some() || loc.is_encrypted() {
            // A tree read from another tool's file (a torch.save checkpoint) when its location
            // was parsed: the reader is over that tree, not over a second reading of the file.
            // An encrypted tree's: over the location that opened its envelope already (a second
            // location would run Argon2id, or call the key provider, again).
            let inner = treepack::Reader::open(loc.clone()).map_err(py_err)?;
            if let Some(want) = self.expect_root {
                inner.expect_root(want).map_err(py_err)?;
            }
            if let Some(by) = &self.signed_by {
                inner.location().block_on(inner.verify_signature_async(by)).map_err(py_err)?;
            }
            return Python::attach(|py| Ok(Py::new(py, crate::reader::Reader { inner })?.into_any()));
        }
        // Python opens its reader as its load hooks do (`LoadRequest.reader`).
        Python::attach(|py| self.open_reader.call0(py))
    }
}

/// A whole-tree `load` in one pass over the manifest when the core's policy says so
/// (`treepack::read::one_pass`), for trees that need no audit. Returns `None` whenever that
/// path does not apply (many stored leaves, a record or custom type that needs the audit) or
/// anything fails; the caller then audits and loads through the `Reader`, which fetches stored
/// leaves in parallel batches and reports errors in full.
#[pyfunction]
#[pyo3(signature = (path, decode_other, np_dtype, free_types, verify=true, storage_options=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn load_one_pass<'py>(
    py: Python<'py>,
    path: &str,
    decode_other: Bound<'py, PyAny>,
    np_dtype: Bound<'py, PyAny>,
    free_types: HashSet<String>,
    verify: bool,
    storage_options: Options,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let Some((loc, bytes, file)) = manifest_of(py, path, storage_options)? else { return Ok(None) };
    let builder = LoadBuilder::new(Decoder::new(py, Some(decode_other), Some(np_dtype), false), Some(&free_types));
    without_gc(py, || Ok(treepack::read::one_pass::load_one_pass(&loc, &bytes, &file, &builder, verify)))
}
