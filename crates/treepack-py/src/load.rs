//! The one builder of loaded trees: Python objects from a manifest as it is parsed (a one-pass
//! load, see `treepack::read::one_pass`), from a reader's manifest and its fetched leaves, or
//! from a loaded `Node` (selections). Which path runs is the core's decision.

use super::*;
use treepack::format::manifest::{Build, Stored};

/// (is str, pack, offset, length) of a stored str/bytes blob.
type BlobKey = (bool, u32, u64, u64);

/// Builds a load's Python objects. Before the audit (a one-pass load) it takes only what needs
/// none: containers, leaves, and custom nodes of the built-in types in `free` (datetime and the
/// like); a record or any other custom type stops it, and the caller audits, then loads
/// through the `Reader`.
pub(crate) struct LoadBuilder<'py, 'a> {
    pub(crate) dec: std::cell::RefCell<Decoder<'py>>,
    /// Objects of the stored str/bytes already built, by (is str, pack, offset, length) of
    /// their blob: shared, as pickle's memo shares an object referenced many times.
    shared: std::cell::RefCell<HashMap<BlobKey, Py<PyAny>>>,
    /// `Some` before the audit: the custom types that may be built.
    free: Option<&'a HashSet<String>>,
    /// The first Python error met (the parse and the walks carry only its text).
    err: std::cell::RefCell<Option<PyErr>>,
}

impl<'py, 'a> LoadBuilder<'py, 'a> {
    pub(crate) fn new(dec: Decoder<'py>, free: Option<&'a HashSet<String>>) -> Self {
        LoadBuilder { dec: std::cell::RefCell::new(dec), shared: Default::default(), free, err: Default::default() }
    }

    fn py_ok<T>(&self, r: PyResult<T>) -> Result<T, String> {
        r.map_err(|e| {
            let msg = e.to_string();
            self.err.borrow_mut().get_or_insert(e);
            msg
        })
    }

    /// The Python error behind a failed build (or one made of its message).
    pub(crate) fn error(&self, msg: String) -> PyErr {
        self.err.borrow_mut().take().unwrap_or_else(|| PyValueError::new_err(msg))
    }
}

impl<'py> Build for LoadBuilder<'py, '_> {
    type Node = Bound<'py, PyAny>;
    const HELPER: bool = true;
    fn leaf_ref(&self, e: &Entry) -> Result<Self::Node, String> {
        let r = self.dec.borrow_mut().inline_entry(e);
        self.py_ok(r)
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
        let r = self.dec.borrow().sequence(items, tuple);
        self.py_ok(r)
    }
    fn dict(&self, pairs: Vec<(Key, Self::Node)>) -> Result<Self::Node, String> {
        let r = self.dec.borrow().dict_of(pairs);
        self.py_ok(r)
    }
    fn record(&self, type_name: String, fields: Vec<(String, Self::Node)>) -> Result<Self::Node, String> {
        if self.free.is_some() {
            return Err("a record: audit first".into());
        }
        self.other("record", &type_name, &serde_json::Value::Null, fields)
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
        self.other("custom", &type_name, &data, children)
    }
}

impl<'py> LoadBuilder<'py, '_> {
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
