//! Whole loads of small trees in one pass over the manifest (hands over to `Reader` otherwise).

use super::*;

/// Builds a whole-tree `load`'s Python objects while the manifest is parsed (see
/// [`StructBuilder`]). It takes only what needs no audit and no pack read: containers, inline
/// leaves, and custom nodes of the built-in types in `free` (datetime and the like). A record,
/// any other custom type or a stored leaf stops it, and the caller falls back to
/// audit-then-load.
pub(crate) struct LoadBuilder<'py, 'a> {
    pub(crate) dec: std::cell::RefCell<Decoder<'py>>,
    /// Objects of the stored str/bytes already read, shared as the Reader path shares them.
    pub(crate) stored: std::cell::RefCell<StoredLeaves>,
    pub(crate) free: &'a HashSet<String>,
    /// Where stored leaves are read from (local trees only), the packs, and how many distinct
    /// stored leaves are still allowed: a few (a blob shared by 10k records, one big array next
    /// to many small values) are read on the spot; more go the Reader's batched path.
    pub(crate) loc: Option<treepack::Location>,
    pub(crate) file: &'a str,
    /// The packs, once read and found to fit the layout (a single file's only pack is itself).
    pub(crate) packs: std::cell::RefCell<Option<Vec<treepack::format::manifest::PackInfo>>>,
    pub(crate) layout: treepack::Layout,
    pub(crate) fetches_left: std::cell::Cell<usize>,
    pub(crate) verify: bool,
}

/// Distinct stored leaves a one-pass load reads on the spot before it hands over to the Reader.
pub(crate) const ONE_PASS_FETCHES: usize = 16;

/// A one-pass load reads stored leaves on the spot only from packs holding at most this much
/// in all. Handing over to the Reader discards what was read, and the Reader reads big trees
/// in parallel batches with read-ahead: a checkpoint's first 16 arrays read one by one, then
/// again, cost a cold W1 load a quarter of its time.
pub(crate) const ONE_PASS_PACK_BYTES: u64 = 16 << 20;

impl LoadBuilder<'_, '_> {
    /// Read one stored leaf (verified) through a one-leaf manifest.
    pub(crate) fn fetch(&self, e: Entry) -> Result<Leaf, String> {
        let Some(loc) = &self.loc else { return Err("a stored leaf of a remote tree".into()) };
        let left = self.fetches_left.get();
        if left == 0 {
            return Err("many stored leaves: load through the Reader".into());
        }
        self.fetches_left.set(left - 1);
        let Some(packs) = self.packs.borrow().clone() else { return Err("packs not read or not valid here".into()) };
        let m = treepack::Manifest {
            version: (treepack::format::manifest::VERSION_MAJOR, treepack::format::manifest::VERSION_MINOR),
            writer: String::new(),
            metadata: None,
            packs,
            root: Tree::Leaf(e),
        };
        let reader = treepack::Reader::from_parts(loc.clone(), m, self.file.to_string());
        let opts = LoadOptions { verify: self.verify, ..Default::default() };
        let got = loc.block_on(reader.fetch_stored_leaves_async(&opts));
        let mut got = got.map_err(|e| e.to_string())?;
        got.pop().map(|(_, l)| l).ok_or_else(|| "stored leaf not read".to_string())
    }
}

impl<'py> treepack::format::manifest::Build for LoadBuilder<'py, '_> {
    type Node = Bound<'py, PyAny>;
    const HELPER: bool = true;
    fn leaf_ref(&self, e: &Entry) -> Result<Self::Node, String> {
        use treepack::format::manifest::Stored;
        let mut dec = self.dec.borrow_mut();
        if e.chunks().is_empty() {
            return dec.entry_leaf(e, &mut self.stored.borrow_mut()).map_err(|e| e.to_string());
        }
        // A stored str/bytes read before is the same object again (as in the Reader path).
        let shared = match e {
            Entry::Str(Stored::Blob { chunk, .. }) | Entry::Bytes(Stored::Blob { chunk, .. }) => {
                Some((matches!(e, Entry::Str(_)), chunk.pack, chunk.offset, chunk.length))
            }
            _ => None,
        };
        if let Some(v) = shared.and_then(|k| self.stored.borrow().shared.get(&k).map(|v| v.bind(dec.py).clone())) {
            return Ok(v);
        }
        let leaf = self.fetch(e.clone())?;
        let v = dec.node_inner(Tree::Leaf(leaf)).map_err(|e| e.to_string())?;
        if let Some(k) = shared {
            self.stored.borrow_mut().shared.insert(k, v.clone().unbind());
        }
        Ok(v)
    }
    fn packs(&self, packs: &[treepack::format::manifest::PackInfo]) {
        if packs.iter().map(|p| p.size).fold(0u64, u64::saturating_add) > ONE_PASS_PACK_BYTES {
            self.fetches_left.set(0);
        }
        if packs.iter().all(|p| self.layout.allows_pack(&p.path)) {
            *self.packs.borrow_mut() = Some(packs.to_vec());
        }
    }
    fn list(&self, items: Vec<Self::Node>, tuple: bool) -> Result<Self::Node, String> {
        self.dec.borrow().sequence(items, tuple).map_err(|e| e.to_string())
    }
    fn dict(&self, pairs: Vec<(Key, Self::Node)>) -> Result<Self::Node, String> {
        self.dec.borrow().dict_of(pairs).map_err(|e| e.to_string())
    }
    fn record(&self, _type_name: String, _fields: Vec<(String, Self::Node)>) -> Result<Self::Node, String> {
        Err("a record: audit first".into())
    }
    fn custom(
        &self,
        type_name: String,
        data: serde_json::Value,
        children: Vec<(String, Self::Node)>,
    ) -> Result<Self::Node, String> {
        if !self.free.contains(&type_name) {
            return Err("a custom type that needs the audit".into());
        }
        let mut dec = self.dec.borrow_mut();
        let pairs = dec.named(children).map_err(|e| e.to_string())?;
        dec.other_built("custom", &type_name, &data, pairs).map_err(|e| e.to_string())
    }
}

/// A whole-tree `load` in one pass over the manifest, with no manifest tree, for trees whose
/// leaves are all inline (many small values: the case where the manifest is most of the work).
/// Returns `None` whenever that path does not apply (a stored leaf, a record or custom type
/// that needs the audit) or anything fails; the caller then audits and loads through the
/// `Reader`, which fetches stored leaves in parallel batches and reports errors in full.
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
    let layout = loc.layout();
    let builder = LoadBuilder {
        dec: std::cell::RefCell::new(Decoder::new(py, Some(decode_other), Some(np_dtype), false)),
        stored: std::cell::RefCell::new(StoredLeaves {
            leaves: Vec::new().into_iter().peekable(),
            next_id: 0,
            shared: Default::default(),
        }),
        free: &free_types,
        loc: loc.local_path().is_some().then(|| loc.clone()),
        file: &file,
        packs: Default::default(),
        layout,
        fetches_left: std::cell::Cell::new(ONE_PASS_FETCHES),
        verify,
    };
    match without_gc(py, || Ok(treepack::format::manifest::build(&bytes, &file, &builder)))? {
        Ok(p) if p.packs.iter().all(|pk| layout.allows_pack(&pk.path)) => Ok(Some(p.root)),
        _ => Ok(None),
    }
}
