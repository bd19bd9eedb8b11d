//! `Reader`: a stored tree opened for audits, whole and selective loads, slices, verify.

use super::*;

/// (kind, type name, data JSON, key path) of a record or custom node.
pub(crate) type TypeRow = (String, String, Option<String>, String);

/// A stored tree opened for reading (the manifest is parsed once).
#[pyclass(frozen)]
pub(crate) struct Reader {
    pub(crate) inner: treepack::Reader,
}

#[pymethods]
impl Reader {
    #[new]
    #[pyo3(signature = (path, storage_options=None))]
    pub(crate) fn new(py: Python<'_>, path: &str, storage_options: Options) -> PyResult<Self> {
        let loc = location(path, storage_options)?;
        let inner = py.detach_releasing(|| treepack::Reader::open(loc)).map_err(py_err)?;
        Ok(Reader { inner })
    }

    /// A reader over the tree of the local `torch.save` checkpoint at `path` in which each
    /// object its pickle builds from a global outside the allow-list is a `pickle:<module.name>`
    /// placeholder, not an error (`treepack::foreign::torch::read_placeholders`): for loads
    /// with `on_missing="placeholder"`. Nothing named by the file is imported or run.
    #[staticmethod]
    pub(crate) fn torch_placeholders(py: Python<'_>, path: &str) -> PyResult<Self> {
        let loc = py
            .detach_releasing(|| treepack::foreign::torch::open_location_placeholders(std::path::Path::new(path), path))
            .map_err(py_err)?;
        let inner = py.detach_releasing(|| treepack::Reader::open(loc)).map_err(py_err)?;
        Ok(Reader { inner })
    }

    /// Every record/custom node a load with `select`/`keep` would build: (kind, type, data JSON
    /// or None, key path), leaving out custom nodes whose type is in `skip` (types the caller
    /// accepts whatever their data, so 10k datetimes cost no rows). Constructs nothing.
    /// `partial_types` as [`LoadOptions::partial_types`]: the selection is closed as the load
    /// closes it, so the rows are exactly what it builds.
    #[pyo3(signature = (skip=None, select=None, keep=None, partial_types=None))]
    pub(crate) fn types(
        &self,
        skip: Option<HashSet<String>>,
        select: Option<Vec<String>>,
        keep: Option<HashSet<String>>,
        partial_types: Option<HashSet<String>>,
    ) -> PyResult<Vec<TypeRow>> {
        let root = &self.inner.manifest().root;
        let opts = LoadOptions { select: select.unwrap_or_default(), keep, partial_types, ..Default::default() };
        let closed = self.inner.close_selection(&opts).map_err(py_err)?;
        let unbuilt = treepack::read::unbuilt_objects(root, "", closed.as_ref().unwrap_or(&opts)).map_err(py_err)?;
        let mut out = vec![];
        walk_types(root, &mut vec![], &skip.unwrap_or_default(), &mut out);
        if !unbuilt.is_empty() {
            out.retain(|row| !unbuilt.contains(&row.3));
        }
        Ok(out)
    }

    /// The records and custom nodes a load of the subtrees at `paths` builds whole: those
    /// inside them, and inside the objects their refs name wherever those are stored (and so on,
    /// through their refs); not the objects around them, which such a load does not build (a
    /// `like=` template's own containers, a lazy view's `read` of a part). Each at the path it
    /// is met by. What the audit of such a load checks.
    #[pyo3(signature = (paths, skip=None))]
    pub(crate) fn types_within(&self, paths: Vec<String>, skip: Option<HashSet<String>>) -> PyResult<Vec<TypeRow>> {
        let root = &self.inner.manifest().root;
        let skip = skip.unwrap_or_default();
        let mut places: HashMap<u64, (String, &Tree<Entry>)> = HashMap::new();
        shared_places(root, &mut vec![], &mut places);
        let mut w = Within { skip: &skip, walked: HashSet::new(), refs: vec![], out: vec![] };
        for p in paths {
            let prefix = treepack::format::keypath::split(&p).map_err(py_err)?.join("/");
            let node = treepack::format::keypath::resolve_place(root, &p).map_err(py_err)?;
            w.walk(node, &mut vec![], &prefix);
        }
        // Each object once, wherever it is met again (a chain of objects each naming the next
        // would otherwise be walked once per ref to it: rows quadratic in its length).
        while let Some(id) = w.refs.pop() {
            if let Some((path, node)) = places.get(&id) {
                if !w.walked.contains(&id) {
                    w.walk(node, &mut vec![], path);
                }
            }
        }
        Ok(w.out)
    }

    /// Load the tree (or the subtree at `subpath`).
    #[pyo3(signature = (decode_other, np_dtype, select=None, keep=None, mmap=false, verify=true, subpath=None, progress=None, partial_types=None))]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn load<'py>(
        &self,
        py: Python<'py>,
        decode_other: Bound<'py, PyAny>,
        np_dtype: Bound<'py, PyAny>,
        select: Option<Vec<String>>,
        keep: Option<HashSet<String>>,
        mmap: bool,
        verify: bool,
        subpath: Option<String>,
        progress: Option<Py<PyAny>>,
        partial_types: Option<HashSet<String>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let opts = LoadOptions {
            select: select.unwrap_or_default(),
            keep,
            mmap,
            verify,
            progress: progress_fn(progress),
            partial_types,
            ..Default::default()
        };
        let b = LoadBuilder::new(Decoder::new(py, Some(decode_other), Some(np_dtype), mmap), None);
        if subpath.is_none() && opts.select.is_empty() && opts.keep.is_none() {
            // Whole tree: fetch the stored leaves, then build Python objects straight from the
            // manifest (no intermediate tree of owned values).
            let leaves = py
                .detach_releasing(|| self.inner.location().block_on(self.inner.fetch_stored_leaves_async(&opts)))
                .map_err(py_err)?;
            let built = without_gc(py, || Ok(self.inner.build_whole(&b, leaves)))?;
            return built.map_err(|m| b.error(m, None));
        }
        let node = py
            .detach_releasing(|| match &subpath {
                Some(p) => self.inner.location().block_on(self.inner.get_async(p, &opts)),
                None => self.inner.location().block_on(self.inner.load_async(&opts)),
            })
            .map_err(py_err)?;
        let built = without_gc(py, || Ok(treepack::format::manifest::replay_values(&b, node)))?;
        built.map_err(|m| b.error(m, subpath.as_deref()))
    }

    /// What a conversion with `select` keeps: the key paths of the nodes kept
    /// (`treepack::convert::selected_paths`), or None for an empty selection. Raises naming the
    /// patterns that match nothing, in `file` (default: this tree's location).
    /// With `closed` false, the places the patterns select themselves (not those refs lead to).
    #[pyo3(signature = (select, file=None, closed=true))]
    pub(crate) fn convert_keep(
        &self,
        select: Vec<String>,
        file: Option<String>,
        closed: bool,
    ) -> PyResult<Option<HashSet<String>>> {
        let file = file.unwrap_or_else(|| self.inner.location().display().to_string());
        treepack::convert::selected_paths_by(&self.inner.manifest().root, &select, &file, closed).map_err(py_err)
    }

    /// The structure: containers as dict/list/tuple, records/custom nodes via `make_node`,
    /// leaves as `LeafInfo`.
    pub(crate) fn structure<'py>(&self, py: Python<'py>, make_node: Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let m = self.inner.manifest();
        let file = self.inner.location().display().to_string();
        let mut failed = None;
        let run = |sink: &mut dyn FnMut(Block) -> bool| {
            let r = treepack::format::manifest::outline::outline_tree(&m.root, &m.packs, &file, sink);
            r.map_err(|e| failed = Some(e)).is_ok()
        };
        let built = without_gc(py, || structure_here(py, &make_node, true, run))?;
        match (built, failed) {
            (Some(b), _) => Ok(b),
            (None, Some(e)) => Err(py_err(e)),
            (None, None) => {
                Err(PyValueError::new_err(format!("{file}: the structure could not be built (a treepack bug)")))
            }
        }
    }

    /// Kind of the node at a key path: a container kind or a leaf kind.
    pub(crate) fn kind(&self, path: &str) -> PyResult<String> {
        let t = self.inner.entry(path).map_err(py_err)?;
        Ok(match t {
            Tree::Leaf(e) => e.kind().to_string(),
            t => t.container_kind().to_string(),
        })
    }

    /// Children of the container at `path`: (segment text, key as a Python object).
    pub(crate) fn children<'py>(&self, py: Python<'py>, path: &str) -> PyResult<Vec<(String, Bound<'py, PyAny>)>> {
        let t = self.inner.entry(path).map_err(py_err)?;
        let dec = Decoder::new(py, None, None, false);
        let mut out = vec![];
        for (step, _) in t.children() {
            if matches!(step, treepack::format::model::Step::Name(k) if treepack::read::is_attrs_child(t, k)) {
                continue; // (a mapping's attributes, not one of its keys)
            }
            let seg = treepack::format::keypath::Segment::from_step_pub(&step);
            let key = match &seg {
                treepack::format::keypath::Segment::Index(i) => i.into_pyobject(py)?.into_any(),
                treepack::format::keypath::Segment::Key(k) => dec.key(k)?,
                treepack::format::keypath::Segment::Name(n) => PyString::new(py, n).into_any(),
            };
            out.push((seg.text(), key));
        }
        Ok(out)
    }

    /// (annotation `type`, key path) of every array: torch tensors and the like by their type
    /// (for the error that names them when their library is missing), a plain array as `""`.
    pub(crate) fn array_types(&self) -> Vec<(String, String)> {
        let mut out = vec![];
        self.inner.manifest().root.for_each_leaf_steps(&mut |steps, e| {
            if let Entry::Array(a) = e {
                let t = a.annotation.as_ref().and_then(|v| v.get("type")).and_then(|t| t.as_str()).unwrap_or("");
                out.push((t.to_string(), treepack::format::keypath::steps_text(steps)));
            }
        });
        out
    }

    /// (dtype JSON, shape) of the array at `path`.
    pub(crate) fn array_info(&self, path: &str) -> PyResult<(String, Vec<u64>)> {
        match self.inner.entry(path).map_err(py_err)? {
            Tree::Leaf(Entry::Array(a)) => Ok((a.dtype.to_json().to_string(), a.shape.clone())),
            _ => Err(PyKeyError::new_err(format!("`{path}` is not an array"))),
        }
    }

    /// The chunk shape of the array at `path` (None when stored inline in the manifest).
    pub(crate) fn chunk_shape(&self, path: &str) -> PyResult<Option<Vec<u64>>> {
        match self.inner.entry(path).map_err(py_err)? {
            Tree::Leaf(Entry::Array(a)) => Ok(match &a.storage {
                treepack::format::manifest::ArrayStorage::Chunked { chunk_shape, .. } => Some(chunk_shape.clone()),
                treepack::format::manifest::ArrayStorage::Inline(_) => None,
            }),
            _ => Err(PyKeyError::new_err(format!("`{path}` is not an array"))),
        }
    }

    /// The codec names of the stored chunks of the array at `path` (empty when inline): what a
    /// conversion maps to the target's codecs.
    pub(crate) fn chunk_codecs(&self, path: &str) -> PyResult<Vec<String>> {
        match self.inner.entry(path).map_err(py_err)? {
            Tree::Leaf(e @ Entry::Array(_)) => Ok(e.chunks().iter().map(|c| c.codec.name().to_string()).collect()),
            _ => Err(PyKeyError::new_err(format!("`{path}` is not an array"))),
        }
    }

    /// Read a numpy-style slice of the array at `path` (only the chunks it touches).
    #[pyo3(signature = (path, slice, np_dtype, verify=true))]
    pub(crate) fn read_array<'py>(
        &self,
        py: Python<'py>,
        path: &str,
        slice: &str,
        np_dtype: Bound<'py, PyAny>,
        verify: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let a = py
            .detach_releasing(|| self.inner.location().block_on(self.inner.read_array_async(path, slice, verify)))
            .map_err(py_err)?;
        let mut dec = Decoder::new(py, None, Some(np_dtype), false);
        dec.array(a)
    }

    /// Read the whole array at `path` (or the numpy-style `slice` of it) into `out`, a writable
    /// C-contiguous numpy array (a view of a tensor's memory, a staging buffer) of exactly its
    /// byte size; the caller checks the dtype.
    #[pyo3(signature = (path, out, verify=true, slice=None))]
    pub(crate) fn read_into(
        &self,
        py: Python<'_>,
        path: &str,
        out: Bound<'_, PyAny>,
        verify: bool,
        slice: Option<&str>,
    ) -> PyResult<()> {
        let (ptr, len) = destination(path, &out)?;
        // SAFETY: `out` (held by the caller for the whole call) owns `len` writable bytes at
        // `ptr`; nothing else touches them while the GIL is released for the read.
        py.detach_releasing(|| {
            let buf = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len) };
            let r = &self.inner;
            r.location().block_on(async {
                match slice {
                    Some(s) => r.read_slice_into_async(path, s, buf, verify).await,
                    None => r.read_into_async(path, buf, verify).await,
                }
            })
        })
        .map_err(py_err)
    }

    /// Read the whole arrays at the paths of `items` (`(path, out)` pairs, `out` as for
    /// `read_into`) into their destinations, all at once (`Reader::read_many_into_async`), with
    /// the result of reading them one after another: destinations that are the same memory and
    /// whose paths store the very same chunks (tied weights) are read once; destinations that
    /// otherwise share bytes are read one after another, in order.
    #[pyo3(signature = (items, verify=true))]
    pub(crate) fn read_many_into(
        &self,
        py: Python<'_>,
        items: Vec<(String, Bound<'_, PyAny>)>,
        verify: bool,
    ) -> PyResult<()> {
        let mut dests: Vec<(String, usize, usize)> = Vec::with_capacity(items.len());
        for (path, out) in &items {
            let (ptr, len) = destination(path, out)?;
            dests.push((path.clone(), ptr, len));
        }
        let same_bytes = |a: &str, b: &str| match (self.inner.entry(a), self.inner.entry(b)) {
            (Ok(Tree::Leaf(Entry::Array(x))), Ok(Tree::Leaf(Entry::Array(y)))) => {
                x.dtype == y.dtype && x.shape == y.shape && x.storage == y.storage
            }
            _ => false,
        };
        let (together, in_order) = plan_destinations(dests, same_bytes);
        // SAFETY: every destination is a live numpy array that `items` holds for the whole
        // call, `len` writable bytes at `ptr`; `plan_destinations` puts only destinations that
        // share no byte in `together`, so no two of these slices alias.
        py.detach_releasing(|| {
            let r = &self.inner;
            r.location().block_on(async {
                let many = together
                    .iter()
                    .map(|(p, ptr, len)| (p.as_str(), unsafe { std::slice::from_raw_parts_mut(*ptr as *mut u8, *len) }))
                    .collect();
                r.read_many_into_async(many, verify).await?;
                for (p, ptr, len) in &in_order {
                    let buf = unsafe { std::slice::from_raw_parts_mut(*ptr as *mut u8, *len) };
                    r.read_into_async(p, buf, verify).await?;
                }
                Ok::<(), treepack::Error>(())
            })
        })
        .map_err(py_err)
    }

    /// Re-hash every chunk.
    pub(crate) fn verify(&self, py: Python<'_>) -> PyResult<VerifyReport> {
        Ok(py.detach_releasing(|| self.inner.verify()).map_err(py_err)?.into())
    }

    /// The root hash (docs/format.md section 9) in hex, or a subtree's when `key` is given.
    #[pyo3(signature = (key=None))]
    pub(crate) fn root_hash(&self, py: Python<'_>, key: Option<&str>) -> PyResult<String> {
        py.detach_releasing(|| match key {
            None => Ok(self.inner.root_hash().to_hex()),
            Some(k) => treepack::format::keypath::resolve_place(&self.inner.manifest().root, k)
                .map(|t| treepack::format::merkle::node_hash(t).to_hex()),
        })
        .map_err(py_err)
    }

    /// Raise RootMismatchError unless the root hash is `expected` (64 hex digits).
    pub(crate) fn expect_root(&self, py: Python<'_>, expected: &str) -> PyResult<()> {
        let want = root_hash_arg(expected)?;
        py.detach_releasing(|| self.inner.expect_root(want)).map_err(py_err)
    }

    /// The user metadata as JSON text (None if absent).
    pub(crate) fn metadata(&self) -> Option<String> {
        self.inner.manifest().metadata.as_ref().map(|m| m.to_string())
    }

    /// Whether the location now holds another tree than the one this reader opened (a load
    /// that found a pack missing raced an overwrite, and should start over).
    pub(crate) fn replaced(&self, py: Python<'_>) -> bool {
        py.detach_releasing(|| self.inner.replaced())
    }

    /// Bytes and requests this reader has read so far.
    pub(crate) fn io_stats(&self) -> (u64, u64) {
        let s = self.inner.location().stats();
        (s.bytes_read(), s.read_requests())
    }
}

/// A root hash given as `expect_root` (64 hex digits, either case).
pub(crate) fn root_hash_arg(expected: &str) -> PyResult<treepack::Hash32> {
    treepack::Hash32::from_hex(&expected.to_ascii_lowercase()).ok_or_else(|| {
        PyValueError::new_err(format!(
            "expect_root must be 64 hex digits (as treepack.root_hash returns), not {expected:?}"
        ))
    })
}

/// Each shared object's place: its key path and its node, by id.
fn shared_places<'a>(
    t: &'a Tree<Entry>,
    path: &mut Vec<treepack::format::model::Step<'a>>,
    out: &mut HashMap<u64, (String, &'a Tree<Entry>)>,
) {
    if let Tree::Shared { id, .. } = t {
        out.insert(*id, (treepack::format::keypath::steps_text(path), t));
    }
    for (step, c) in t.children() {
        if matches!(c, Tree::Leaf(_) | Tree::Ref(_)) {
            continue;
        }
        path.push(step);
        treepack::format::model::grow(|| shared_places(c, path, out));
        path.pop();
    }
}

/// The walk of [`Reader::types_within`]: each shared object once (`walked`), the ids of those
/// met by a ref only queued (`refs`).
struct Within<'s> {
    skip: &'s HashSet<String>,
    walked: HashSet<u64>,
    refs: Vec<u64>,
    out: Vec<TypeRow>,
}

impl Within<'_> {
    fn walk<'a>(&mut self, t: &'a Tree<Entry>, path: &mut Vec<treepack::format::model::Step<'a>>, prefix: &str) {
        match t {
            Tree::Leaf(_) => return,
            Tree::Ref(id) => {
                if !self.walked.contains(id) {
                    self.refs.push(*id);
                }
                return;
            }
            Tree::Shared { id, node } => {
                if self.walked.insert(*id) {
                    treepack::format::model::grow(|| self.walk(node, path, prefix));
                }
                return;
            }
            _ => {}
        }
        if let Some(mut row) = type_row(t, path, self.skip) {
            row.3 = match (prefix.is_empty(), row.3.is_empty()) {
                (true, _) => row.3,
                (false, true) => prefix.to_string(),
                (false, false) => format!("{prefix}/{}", row.3),
            };
            self.out.push(row);
        }
        for (step, c) in t.children() {
            if matches!(c, Tree::Leaf(_)) {
                continue;
            }
            path.push(step);
            treepack::format::model::grow(|| self.walk(c, path, prefix));
            path.pop();
        }
    }
}

/// The audit row of a record or custom node (not of a custom type in `skip`).
fn type_row(t: &Tree<Entry>, path: &[treepack::format::model::Step<'_>], skip: &HashSet<String>) -> Option<TypeRow> {
    let text = || treepack::format::keypath::steps_text(path);
    match t {
        Tree::Record { type_name, .. } => Some(("record".into(), type_name.clone(), None, text())),
        Tree::Custom { type_name, .. } if skip.contains(type_name) => None,
        Tree::Custom { type_name, data, .. } => Some((
            "custom".into(),
            type_name.clone(),
            if data.is_null() { None } else { Some(data.to_string()) },
            text(),
        )),
        _ => None,
    }
}

pub(crate) fn walk_types<'a>(
    t: &'a Tree<Entry>,
    path: &mut Vec<treepack::format::model::Step<'a>>,
    skip: &HashSet<String>,
    out: &mut Vec<TypeRow>,
) {
    match t {
        Tree::Leaf(_) => return,
        // A shared object is audited at its place like any other (it was skipped: a record
        // held at two places went unaudited, and its load failed late with a LookupError).
        Tree::Shared { node, .. } => return treepack::format::model::grow(|| walk_types(node, path, skip, out)),
        _ => out.extend(type_row(t, path, skip)),
    }
    for (step, c) in t.children() {
        if matches!(c, Tree::Leaf(_)) {
            continue;
        }
        path.push(step);
        treepack::format::model::grow(|| walk_types(c, path, skip, out));
        path.pop();
    }
}

/// The data pointer and byte length of `out`, a writable C-contiguous numpy array, or the error
/// naming `path` that says why it cannot be read into.
fn destination(path: &str, out: &Bound<'_, PyAny>) -> PyResult<(usize, usize)> {
    let arr = out.cast::<PyUntypedArray>()?;
    if !arr.is_c_contiguous() {
        return Err(PyValueError::new_err(format!("`{path}`: the destination array is not C-contiguous")));
    }
    // SAFETY: reading the flags and data pointer of a live numpy array we hold.
    let (ptr, writeable) = unsafe {
        let raw = arr.as_array_ptr();
        ((*raw).fields.data as usize, (*raw).fields.flags & numpy::npyffi::NPY_ARRAY_WRITEABLE != 0)
    };
    if !writeable {
        return Err(PyValueError::new_err(format!("`{path}`: the destination array is read-only")));
    }
    Ok((ptr, arr.len() * arr.dtype().itemsize()))
}

type Dest = (String, usize, usize);

/// Split `(path, ptr, len)` destinations into those that can be written at once (no two share
/// a byte) and those to write afterwards, in their order (each shares bytes with another). Of
/// several destinations that are exactly the same memory, when `same_bytes` says every one's
/// path stores what the last one's does (the same tensor at two keys, saved once), only the
/// last is kept: its read checks what the others would; otherwise all of them are read in order.
fn plan_destinations(dests: Vec<Dest>, same_bytes: impl Fn(&str, &str) -> bool) -> (Vec<Dest>, Vec<Dest>) {
    let mut last: std::collections::HashMap<(usize, usize), usize> = std::collections::HashMap::new();
    for (i, d) in dests.iter().enumerate() {
        last.insert((d.1, d.2), i);
    }
    let kept: Vec<Dest> = dests
        .iter()
        .enumerate()
        .filter(|(i, d)| {
            let l = last[&(d.1, d.2)];
            l == *i || d.2 == 0 || !same_bytes(&d.0, &dests[l].0)
        })
        .map(|(_, d)| d.clone())
        .collect();
    let mut order: Vec<usize> = (0..kept.len()).filter(|&i| kept[i].2 > 0).collect();
    order.sort_by_key(|&i| kept[i].1);
    let mut overlaps = vec![false; kept.len()];
    let mut reach: Option<(usize, usize)> = None; // (end, index) of the furthest-reaching so far
    for &i in &order {
        let (_, ptr, len) = &kept[i];
        if let Some((end, j)) = reach {
            if *ptr < end {
                overlaps[i] = true;
                overlaps[j] = true;
            }
        }
        if reach.is_none_or(|(end, _)| ptr + len > end) {
            reach = Some((ptr + len, i));
        }
    }
    let (mut together, mut in_order) = (Vec::new(), Vec::new());
    for (i, d) in kept.into_iter().enumerate() {
        if overlaps[i] {
            in_order.push(d)
        } else {
            together.push(d)
        }
    }
    (together, in_order)
}
