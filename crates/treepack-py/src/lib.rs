//! `treepack._core`: the Rust side of the Python package.
//!
//! Python trees are walked here with exact-type fast paths (None, bool, int, float, complex, str,
//! bytes, list, tuple, dict, numpy arrays and scalars); any other object is handed to a Python
//! callback (`encode_other`) that returns a record or custom node description. Loading builds
//! numpy arrays directly from the read buffers (no copy), and read-only views for mmap loads.
//! The GIL is released for all storage I/O and hashing.

use bytes::Bytes;
use numpy::{PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::{
    PyFileExistsError, PyFileNotFoundError, PyIOError, PyKeyError, PyPermissionError, PyTypeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyComplex, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use treepack::format::manifest::outline::{Block, Event, LeafTable};
use treepack::format::manifest::{ArrayStorage, Entry};
use treepack::format::model::shape_len;
use treepack::{ArrayData, DType, Int, Key, Leaf, LoadOptions, Node, SaveOptions, Tree};

/// mimalloc: trees of many small leaves are allocation-bound; measured on the 100k-leaf
/// workload (crates/treepack/examples/profile_small_leaves.rs) it cut building the structure
/// view from ~47 ms to ~28 ms against glibc malloc.
/// Big buffers (2 MiB and more) get huge-page mappings of their own (`treepack::alloc`).
#[global_allocator]
static GLOBAL: treepack_alloc::BigMapped<mimalloc::MiMalloc> = treepack_alloc::BigMapped(mimalloc::MiMalloc);

pyo3::create_exception!(_core, TreepackError, pyo3::exceptions::PyException, "Base class of treepack errors.");
pyo3::create_exception!(_core, CorruptError, TreepackError, "Stored bytes do not match their recorded hash or layout.");
pyo3::create_exception!(_core, FormatError, TreepackError, "The location is not a valid treepack tree.");

/// Map a core error to the most fitting Python exception (message keeps file and key path).
fn py_err(e: treepack::Error) -> PyErr {
    use treepack::Error as E;
    let msg = e.to_string();
    match e {
        E::NotFound { .. } => PyFileNotFoundError::new_err(msg),
        E::AlreadyExists { .. } => PyFileExistsError::new_err(msg),
        E::KeyNotFound { .. } => PyKeyError::new_err(msg),
        E::BadKeyPath { .. }
        | E::BadSlice { .. }
        | E::InvalidTree { .. }
        | E::BadDType { .. }
        | E::BadLocation { .. } => PyValueError::new_err(msg),
        E::ChunkCorrupt { .. } | E::ManifestChecksum { .. } | E::OutOfBounds { .. } => CorruptError::new_err(msg),
        E::Io { .. } | E::Store { .. } => PyIOError::new_err(msg),
        E::ReadOnly { .. } => PyPermissionError::new_err(msg),
        _ => FormatError::new_err(msg),
    }
}

/// Keeps a numpy array alive while its memory is borrowed as `Bytes` (zero-copy saves).
struct NumpyOwner {
    ptr: *const u8,
    len: usize,
    _obj: Py<PyAny>,
}
// SAFETY: the array object is kept alive by `_obj`; the memory is only read, and the Python API
// contract says arrays must not be mutated while a blocking save runs.
unsafe impl Send for NumpyOwner {}
unsafe impl Sync for NumpyOwner {}
impl AsRef<[u8]> for NumpyOwner {
    fn as_ref(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: ptr/len describe the live, contiguous buffer of the array held by `_obj`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// Owns the memory behind a numpy array made by treepack: the loaded buffer itself (writable
/// arrays, no copy) or shared/mmap'd bytes (read-only views). Only held to keep memory alive.
#[allow(dead_code)]
enum Memory {
    /// A buffer only this array uses (kept as `BytesMut`: a leaf read around the page cache
    /// starts inside its allocation, and turning it into a `Vec` would move every byte).
    Owned(bytes::BytesMut),
    Shared(Bytes),
}

#[pyclass(frozen)]
struct BytesOwner(#[allow(dead_code)] Memory);

/// What `load_structure` puts at each leaf: its own fields, or (from the structure-only read
/// of a big manifest) a row of a table shared by a block of leaves, which keeps each object
/// small and builds nothing but the object itself on the thread that holds the interpreter.
#[pyclass(frozen, eq, module = "treepack")]
struct LeafInfo(LeafRepr);

enum LeafRepr {
    Own(Box<OwnLeaf>),
    /// A row that exists (checked when the object is made).
    Row(Arc<LeafTable>, u32),
}

struct OwnLeaf {
    path: String,
    kind: Cow<'static, str>,
    dtype: Option<String>,
    shape: Option<Vec<u64>>,
    nbytes: u64,
    inline: bool,
}

/// The fields of a `LeafInfo`, whichever way it holds them.
#[derive(PartialEq)]
struct LeafFields<'a> {
    path: &'a str,
    kind: &'a str,
    dtype: Option<Cow<'a, str>>,
    shape: Option<&'a [u64]>,
    nbytes: u64,
    inline: bool,
}

impl PartialEq for LeafInfo {
    fn eq(&self, other: &Self) -> bool {
        self.fields() == other.fields()
    }
}

impl LeafInfo {
    /// What `load_structure` shows of a manifest leaf at `path`.
    fn of(path: &str, e: &Entry) -> LeafInfo {
        let (dtype, shape) = match e {
            Entry::Array(a) => (Some(dtype_text(&a.dtype)), Some(a.shape.clone())),
            _ => (None, None),
        };
        let inline = match e {
            Entry::Array(a) => matches!(a.storage, ArrayStorage::Inline(_)),
            _ => e.chunks().is_empty(),
        };
        LeafInfo(LeafRepr::Own(Box::new(OwnLeaf {
            path: path.to_string(),
            kind: Cow::Borrowed(e.kind()),
            dtype,
            shape,
            nbytes: e.nbytes(),
            inline,
        })))
    }

    /// Row `i` of `table`, if there is one.
    fn row(table: &Arc<LeafTable>, i: u32) -> Option<LeafInfo> {
        if i as usize >= table.len() {
            return None;
        }
        Some(LeafInfo(LeafRepr::Row(table.clone(), i)))
    }

    fn fields(&self) -> LeafFields<'_> {
        match &self.0 {
            LeafRepr::Own(o) => LeafFields {
                path: &o.path,
                kind: &o.kind,
                dtype: o.dtype.as_deref().map(Cow::Borrowed),
                shape: o.shape.as_deref(),
                nbytes: o.nbytes,
                inline: o.inline,
            },
            LeafRepr::Row(t, i) => match t.get(*i as usize) {
                Some(v) => LeafFields {
                    path: v.path,
                    kind: v.kind,
                    dtype: v.dtype.map(|d| Cow::Owned(dtype_text(d))),
                    shape: v.shape,
                    nbytes: v.nbytes,
                    inline: v.inline,
                },
                // Never: rows are checked when the object is made.
                None => LeafFields { path: "", kind: "none", dtype: None, shape: None, nbytes: 0, inline: true },
            },
        }
    }
}

#[pymethods]
impl LeafInfo {
    #[new]
    #[pyo3(signature = (path, kind, dtype=None, shape=None, nbytes=0, inline=true))]
    fn new(
        path: String,
        kind: String,
        dtype: Option<String>,
        shape: Option<Vec<u64>>,
        nbytes: u64,
        inline: bool,
    ) -> Self {
        LeafInfo(LeafRepr::Own(Box::new(OwnLeaf { path, kind: Cow::Owned(kind), dtype, shape, nbytes, inline })))
    }
    /// The leaf's key path.
    #[getter]
    fn path(&self) -> &str {
        self.fields().path
    }
    /// none, bool, int, float, complex, str, bytes or array.
    #[getter]
    fn kind(&self) -> &str {
        self.fields().kind
    }
    /// The array's dtype name (None for non-array leaves).
    #[getter]
    fn dtype(&self) -> Option<String> {
        self.fields().dtype.map(Cow::into_owned)
    }
    /// Array shape as a tuple (None for non-array leaves).
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        self.fields().shape.map(|s| PyTuple::new(py, s.iter().copied())).transpose()
    }
    /// Bytes of the value (UTF-8 bytes for strings).
    #[getter]
    fn nbytes(&self) -> u64 {
        self.fields().nbytes
    }
    /// Held in the manifest itself (no pack read needed).
    #[getter]
    fn inline(&self) -> bool {
        self.fields().inline
    }
    /// Python's own reprs of the fields, so the text evaluates back to an equal `LeafInfo`.
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let repr = |o: Option<Bound<'_, PyAny>>| -> PyResult<String> {
            Ok(match o {
                Some(o) => o.repr()?.to_string(),
                None => "None".to_string(),
            })
        };
        let text = |s: &str| Some(PyString::new(py, s).into_any());
        let f = self.fields();
        Ok(format!(
            "LeafInfo(path={}, kind={}, dtype={}, shape={}, nbytes={}, inline={})",
            repr(text(f.path))?,
            repr(text(f.kind))?,
            repr(f.dtype.as_deref().and_then(text))?,
            repr(self.shape(py)?.map(Bound::into_any))?,
            f.nbytes,
            if f.inline { "True" } else { "False" }
        ))
    }
}

/// What `encode_other` returns: (kind, type name, data JSON, named children).
type NodeDescription<'py> = (String, String, Option<String>, Vec<(String, Bound<'py, PyAny>)>);

/// (kind, type name, data JSON, key path) of a record or custom node.
type TypeRow = (String, String, Option<String>, String);

struct Encoder<'py> {
    py: Python<'py>,
    ndarray: Bound<'py, PyAny>,
    generic: Bound<'py, PyAny>,
    encode_other: Bound<'py, PyAny>,
    encode_array: Bound<'py, PyAny>,
    /// Steps to the node being encoded, formatted only when an error (or `encode_other`) needs
    /// the key path: formatting a segment per node cost ~15 % of a 10k-record `prepare`.
    path: Vec<PathStep<'py>>,
    /// Copy array bytes instead of borrowing them, so the caller may mutate its arrays as soon
    /// as `prepare` returns (non-blocking saves).
    snapshot: bool,
    /// Encode naive and UTC `datetime`s here rather than through `encode_other` (off when the
    /// user registered a custom codec for `datetime`).
    fast_datetime: bool,
    /// Large `bytes` objects already met, by identity (they stay alive: the tree holds them).
    seen_bytes: HashMap<usize, Bytes>,
    /// The tree being encoded (to name a reference cycle's place once the depth limit is hit).
    root: Bound<'py, PyAny>,
}

/// One step of the key path [`Encoder`] is at.
enum PathStep<'py> {
    Index(usize),
    /// The dict key object itself (a reference, not a converted copy).
    Key(Bound<'py, PyAny>),
    Name(String),
}

/// Keeps a Python `bytes` object alive while its (immutable) buffer is borrowed as `Bytes`.
struct PyBytesOwner(#[allow(dead_code)] Py<PyBytes>, *const u8, usize);
// SAFETY: `bytes` objects never change after creation and `.0` keeps this one alive; the
// reference is released through pyo3 (deferred until the GIL is next held when dropped without it).
unsafe impl Send for PyBytesOwner {}
unsafe impl Sync for PyBytesOwner {}
impl AsRef<[u8]> for PyBytesOwner {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: pointer and length of the live object's buffer, read once under the GIL.
        unsafe { std::slice::from_raw_parts(self.1, self.2) }
    }
}

impl<'py> Encoder<'py> {
    /// The bytes of a `bytes` object: small ones copied, large ones borrowed (immutable, so no
    /// snapshot is needed), and the same object met again (one image shared by 10k records)
    /// reuses the first `Bytes`, which also lets the writer hash it once.
    fn bytes(&mut self, b: &Bound<'py, PyBytes>) -> Bytes {
        let data = b.as_bytes();
        if data.len() < 1024 {
            return Bytes::copy_from_slice(data);
        }
        let id = b.as_ptr() as usize;
        if let Some(x) = self.seen_bytes.get(&id) {
            return x.clone();
        }
        let x = Bytes::from_owner(PyBytesOwner(b.clone().unbind(), data.as_ptr(), data.len()));
        self.seen_bytes.insert(id, x.clone());
        x
    }
}

fn simple_dtype(kind: u8, size: usize) -> Option<DType> {
    Some(match (kind, size) {
        (b'b', 1) => DType::Bool,
        (b'i', 1) => DType::I8,
        (b'i', 2) => DType::I16,
        (b'i', 4) => DType::I32,
        (b'i', 8) => DType::I64,
        (b'u', 1) => DType::U8,
        (b'u', 2) => DType::U16,
        (b'u', 4) => DType::U32,
        (b'u', 8) => DType::U64,
        (b'f', 2) => DType::F16,
        (b'f', 4) => DType::F32,
        (b'f', 8) => DType::F64,
        (b'c', 8) => DType::C64,
        (b'c', 16) => DType::C128,
        _ => return None,
    })
}

impl<'py> Encoder<'py> {
    fn here(&self) -> String {
        self.text_of(&self.path)
    }

    /// The first object on the current path that is reached again further down: `(i, j)` such
    /// that the steps `path[..i]` and `path[..j]` lead to the same object. Found by walking the
    /// path again from the root (only after the depth limit was hit); `None` when a step cannot
    /// be followed (a registered type's `to_data` result).
    fn cycle(&self) -> Option<(usize, usize)> {
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

    fn text_of(&self, path: &[PathStep<'py>]) -> String {
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

    fn err(&self, msg: impl std::fmt::Display) -> PyErr {
        PyTypeError::new_err(format!("cannot save `{}`: {msg}", self.here()))
    }

    fn key(&self, k: &Bound<'py, PyAny>) -> PyResult<Key> {
        if k.is_none() {
            return Ok(Key::None);
        }
        if k.is_exact_instance_of::<PyBool>() {
            return Ok(Key::Bool(k.extract()?));
        }
        if k.is_exact_instance_of::<PyInt>() {
            return Ok(Key::Int(int_of(k)?));
        }
        if k.is_exact_instance_of::<PyFloat>() {
            return Ok(Key::Float(k.extract()?));
        }
        if k.is_exact_instance_of::<PyString>() {
            return Ok(Key::Str(k.extract()?));
        }
        if let Ok(t) = k.cast_exact::<PyTuple>() {
            return Ok(Key::Tuple(t.iter().map(|x| self.key(&x)).collect::<PyResult<_>>()?));
        }
        Err(self.err(format!(
            "dict key {} of type {} is not supported (keys may be str, int, float, bool, None or tuples of these)",
            k.repr().map(|r| r.to_string()).unwrap_or_default(),
            k.get_type().name().map(|n| n.to_string()).unwrap_or_default()
        )))
    }

    fn child(&mut self, seg: PathStep<'py>, v: &Bound<'py, PyAny>, depth: usize) -> PyResult<Node> {
        self.path.push(seg);
        // Deep (or cyclic, until the depth limit) trees recurse up to MAX_DEPTH levels.
        let r = treepack::format::model::grow(|| self.node(v, depth + 1));
        if r.is_ok() {
            self.path.pop();
        }
        r
    }

    fn node(&mut self, obj: &Bound<'py, PyAny>, depth: usize) -> PyResult<Node> {
        if depth > treepack::format::manifest::MAX_DEPTH {
            if let Some((outer, inner)) = self.cycle() {
                return Err(PyValueError::new_err(format!(
                    "cannot save: reference cycle at `{}`: it contains itself at `{}`. treepack saves trees; \
                     break the cycle (store an index or a key instead of the object)",
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
        if let Ok(c) = obj.cast_exact::<PyComplex>() {
            return Ok(Tree::Leaf(Leaf::Complex(c.real(), c.imag())));
        }
        if obj.is_exact_instance_of::<PyString>() {
            let s: String =
                obj.extract().map_err(|_| self.err("string is not valid Unicode (it contains lone surrogates)"))?;
            return Ok(Node::from(s));
        }
        if let Ok(b) = obj.cast_exact::<PyBytes>() {
            return Ok(Tree::Leaf(Leaf::Bytes(self.bytes(b))));
        }
        if let Ok(l) = obj.cast_exact::<PyList>() {
            let mut out = Vec::with_capacity(l.len());
            for (i, x) in l.iter().enumerate() {
                out.push(self.child(PathStep::Index(i), &x, depth)?);
            }
            return Ok(Tree::List(out));
        }
        if let Ok(t) = obj.cast_exact::<PyTuple>() {
            let mut out = Vec::with_capacity(t.len());
            for (i, x) in t.iter().enumerate() {
                out.push(self.child(PathStep::Index(i), &x, depth)?);
            }
            return Ok(Tree::Tuple(out));
        }
        if let Ok(d) = obj.cast_exact::<PyDict>() {
            let mut out = Vec::with_capacity(d.len());
            for (k, v) in d.iter() {
                let key = self.key(&k)?;
                out.push((key, self.child(PathStep::Key(k), &v, depth)?));
            }
            return Ok(Tree::Dict(out));
        }
        if obj.get_type().is(&self.ndarray) {
            if obj.cast::<PyUntypedArray>()?.dtype().kind() == b'O' {
                // Python objects, not array data: pickled with `allow_pickle`, else refused.
                return self.other(obj, depth);
            }
            return self.array(obj).map(Node::from);
        }
        if self.fast_datetime {
            if let Ok(d) = obj.cast_exact::<pyo3::types::PyDateTime>() {
                if let Some(n) = datetime_node(self.py, d)? {
                    return Ok(n);
                }
            }
        }
        if obj.is_instance(&self.generic)? {
            // numpy scalar: keep its dtype as a 0-d array inside a `py.npscalar` node.
            let np = self.py.import("numpy")?;
            let a = np.call_method1("asarray", (obj,))?;
            let arr = self.array(&a)?;
            return Ok(Tree::Custom {
                type_name: "py.npscalar".into(),
                data: serde_json::Value::Null,
                children: vec![("value".into(), Node::from(arr))],
            });
        }
        self.other(obj, depth)
    }

    fn array(&mut self, obj: &Bound<'py, PyAny>) -> PyResult<ArrayData> {
        let arr = obj.cast::<PyUntypedArray>()?;
        let descr = arr.dtype();
        let kind = descr.kind();
        let native_le = matches!(descr.byteorder(), b'=' | b'<' | b'|') && cfg!(target_endian = "little");
        let fast = if arr.is_c_contiguous() && native_le && !descr.has_fields() && !descr.has_subarray() {
            simple_dtype(kind, descr.itemsize())
        } else {
            None
        };
        let (canon, dtype) = match fast {
            Some(d) => (obj.clone(), d),
            None => {
                // Slow path (big-endian, strided, structured, strings, ml_dtypes): Python makes a
                // canonical copy and describes its dtype.
                let r = self.encode_array.call1((obj,)).map_err(|e| self.err(e))?;
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
        let owner = NumpyOwner { ptr, len: nbytes as usize, _obj: canon.clone().unbind() };
        let data = if self.snapshot { Bytes::copy_from_slice(owner.as_ref()) } else { Bytes::from_owner(owner) };
        ArrayData::new(dtype, shape, data).map_err(|e| self.err(e))
    }

    fn other(&mut self, obj: &Bound<'py, PyAny>, depth: usize) -> PyResult<Node> {
        let here = self.here();
        let desc = self.encode_other.call1((obj, here)).map_err(|e| {
            if e.is_instance_of::<PyTypeError>(self.py) {
                e
            } else {
                self.err(e)
            }
        })?;
        let (kind, type_name, data, children): NodeDescription<'py> = desc.extract()?;
        let mut kids = Vec::with_capacity(children.len());
        for (name, v) in children {
            let step = PathStep::Name(name.clone());
            kids.push((name, self.child(step, &v, depth)?));
        }
        match kind.as_str() {
            "record" => Ok(Tree::Record { type_name, fields: kids }),
            "custom" => {
                let data = match data {
                    Some(s) => serde_json::from_str(&s).map_err(|e| self.err(e))?,
                    None => serde_json::Value::Null,
                };
                Ok(Tree::Custom { type_name, data, children: kids })
            }
            k => Err(self.err(format!("encode_other returned unknown kind {k:?}"))),
        }
    }
}

fn int_of(obj: &Bound<'_, PyAny>) -> PyResult<Int> {
    if let Ok(v) = obj.extract::<i64>() {
        return Ok(Int::Small(v));
    }
    Ok(Int::from_big(obj.extract::<num_bigint::BigInt>()?))
}

type Options = Option<HashMap<String, String>>;

/// Parse a location with optional storage options (credentials, endpoint, tuning).
fn location(path: &str, storage_options: Options) -> PyResult<treepack::Location> {
    let opts: treepack::StorageOptions = storage_options.unwrap_or_default().into_iter().collect();
    treepack::Location::parse_with(path, &opts).map_err(py_err)
}

/// Wrap a Python callable `(done, total)` as a progress callback; its errors are reported as
/// unraisable (a broken progress bar must not fail a save).
fn progress_fn(cb: Option<Py<PyAny>>) -> Option<treepack::ProgressFn> {
    cb.map(|cb| {
        treepack::ProgressFn::new(move |done, total| {
            Python::attach(|py| {
                if let Err(e) = cb.call1(py, (done, total)) {
                    e.write_unraisable(py, None);
                }
            })
        })
    })
}

/// A Python tree converted to treepack's model, ready to be written (possibly on another thread).
#[pyclass(frozen)]
struct Prepared {
    node: std::sync::Mutex<Option<Node>>,
}

/// Convert a Python tree (with the GIL held). With `snapshot`, array bytes are copied.
#[pyfunction]
#[pyo3(signature = (tree, encode_other, encode_array, snapshot=false, fast_datetime=false))]
fn prepare(
    py: Python<'_>,
    tree: &Bound<'_, PyAny>,
    encode_other: Bound<'_, PyAny>,
    encode_array: Bound<'_, PyAny>,
    snapshot: bool,
    fast_datetime: bool,
) -> PyResult<Prepared> {
    let np = py.import("numpy")?;
    let mut enc = Encoder {
        py,
        ndarray: np.getattr("ndarray")?,
        generic: np.getattr("generic")?,
        encode_other,
        encode_array,
        path: vec![],
        snapshot,
        fast_datetime,
        seen_bytes: HashMap::new(),
        root: tree.clone(),
    };
    let node = enc.node(tree, 0)?;
    Ok(Prepared { node: std::sync::Mutex::new(Some(node)) })
}

#[pymethods]
impl Prepared {
    /// Write the tree (GIL released). Returns (leaves, bytes_written, location, arrays, array_bytes).
    /// A prepared tree is written once; its memory is freed afterwards.
    #[pyo3(signature = (path, overwrite=false, metadata=None, chunk_bytes=None, storage_options=None, progress=None))]
    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        py: Python<'_>,
        path: &str,
        overwrite: bool,
        metadata: Option<String>,
        chunk_bytes: Option<u64>,
        storage_options: Options,
        progress: Option<Py<PyAny>>,
    ) -> PyResult<(usize, u64, String, usize, u64)> {
        let node = self
            .node
            .lock()
            .map_err(|_| PyValueError::new_err("prepared tree is poisoned"))?
            .take()
            .ok_or_else(|| PyValueError::new_err("this prepared tree was already written"))?;
        let mut opts = SaveOptions { overwrite, progress: progress_fn(progress), ..Default::default() };
        if let Some(m) = metadata {
            opts.metadata =
                Some(serde_json::from_str(&m).map_err(|e| PyValueError::new_err(format!("metadata: {e}")))?);
        }
        if let Some(c) = chunk_bytes {
            opts.chunk_bytes = c.max(1);
        }
        let loc = location(path, storage_options)?;
        let info = py.detach(|| {
            let r = treepack::block_on(treepack::save::save_async(&node, &loc, &opts));
            if r.as_ref().is_ok_and(|i| i.leaves >= treepack::save::BACKGROUND_DROP_LEAVES) {
                treepack::format::model::drop_in_background(node);
            } else {
                drop(node);
            }
            r
        });
        let info = info.map_err(py_err)?;
        Ok((info.leaves, info.bytes_written, info.location, info.arrays, info.array_bytes))
    }
}

/// A stored tree opened for reading (the manifest is parsed once).
#[pyclass(frozen)]
struct Reader {
    inner: treepack::Reader,
}

struct Decoder<'py> {
    py: Python<'py>,
    decode_other: Option<Bound<'py, PyAny>>,
    np_dtype: Bound<'py, PyAny>,
    dtypes: HashMap<DType, Bound<'py, PyArrayDescr>>,
    readonly: bool,
    /// Python strings of short dict keys already seen (FxHash: these lookups are per node).
    keys: std::cell::RefCell<rustc_hash::FxHashMap<String, Bound<'py, PyAny>>>,
}

impl<'py> Decoder<'py> {
    /// `decode_other` rebuilds records/custom objects (None: structure only, none met);
    /// `np_dtype` maps dtype names to numpy dtypes (None: no arrays are built).
    fn new(
        py: Python<'py>,
        decode_other: Option<Bound<'py, PyAny>>,
        np_dtype: Option<Bound<'py, PyAny>>,
        readonly: bool,
    ) -> Self {
        Decoder {
            py,
            decode_other,
            np_dtype: np_dtype.unwrap_or_else(|| py.None().into_bound(py)),
            dtypes: HashMap::new(),
            readonly,
            keys: Default::default(),
        }
    }

    /// A list or tuple of built items (what the one-pass builders make of a sequence).
    fn sequence(&self, items: Vec<Bound<'py, PyAny>>, tuple: bool) -> PyResult<Bound<'py, PyAny>> {
        if tuple {
            PyTuple::new(self.py, items).map(Bound::into_any)
        } else {
            PyList::new(self.py, items).map(Bound::into_any)
        }
    }

    /// A dict of built values, keys through the key cache.
    fn dict_of(&self, pairs: Vec<(Key, Bound<'py, PyAny>)>) -> PyResult<Bound<'py, PyAny>> {
        let d = PyDict::new(self.py);
        for (k, v) in pairs {
            d.set_item(self.key(&k)?, v)?;
        }
        Ok(d.into_any())
    }

    /// `(name, value)` tuples of a record's fields or a custom node's children.
    fn named(&self, kids: Vec<(String, Bound<'py, PyAny>)>) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        kids.into_iter().map(|(k, v)| PyTuple::new(self.py, [PyString::new(self.py, &k).into_any(), v])).collect()
    }

    fn dtype(&mut self, d: &DType) -> PyResult<Bound<'py, PyArrayDescr>> {
        if let Some(x) = self.dtypes.get(d) {
            return Ok(x.clone());
        }
        let x = self.np_dtype.call1((d.to_json().to_string(),))?.cast_into::<PyArrayDescr>()?;
        self.dtypes.insert(d.clone(), x.clone());
        Ok(x)
    }

    /// One numpy array per leaf, made with a single C-API call: writable over the loaded buffer
    /// (no copy when the buffer is uniquely owned), or a read-only view for mmap loads.
    fn array(&mut self, a: ArrayData) -> PyResult<Bound<'py, PyAny>> {
        use numpy::npyffi::{self, npy_intp, PY_ARRAY_API};
        let (dtype, shape, bytes) = a.into_parts();
        let descr = self.dtype(&dtype)?;
        let (owner, data, flags) = if self.readonly {
            let ptr = bytes.as_ptr() as *mut u8;
            (BytesOwner(Memory::Shared(bytes)), ptr, 0)
        } else {
            let mut boxed = match bytes.try_into_mut() {
                Ok(m) => m,
                Err(b) => bytes::BytesMut::from(&b[..]),
            };
            let ptr = boxed.as_mut_ptr();
            (BytesOwner(Memory::Owned(boxed)), ptr, npyffi::NPY_ARRAY_WRITEABLE)
        };
        let owner = Bound::new(self.py, owner)?;
        let mut dims: Vec<npy_intp> = shape.iter().map(|&d| d as npy_intp).collect();
        // SAFETY: `data` points to itemsize × prod(shape) bytes owned by `owner` (checked by
        // ArrayData::new); NewFromDescr steals the descr reference we pass, SetBaseObject steals
        // the owner reference, so the memory lives exactly as long as the array.
        unsafe {
            let arr = PY_ARRAY_API.PyArray_NewFromDescr(
                self.py,
                npyffi::get_type_object(self.py, npyffi::NpyTypes::PyArray_Type),
                descr.into_ptr() as *mut npyffi::PyArray_Descr,
                dims.len() as std::os::raw::c_int,
                dims.as_mut_ptr(),
                std::ptr::null_mut(),
                data as *mut std::os::raw::c_void,
                flags,
                std::ptr::null_mut(),
            );
            if arr.is_null() {
                return Err(PyErr::fetch(self.py));
            }
            if PY_ARRAY_API.PyArray_SetBaseObject(self.py, arr as *mut npyffi::PyArrayObject, owner.into_ptr()) != 0 {
                pyo3::ffi::Py_DECREF(arr);
                return Err(PyErr::fetch(self.py));
            }
            Ok(Bound::from_owned_ptr(self.py, arr))
        }
    }

    /// A dict key string, shared between dicts: trees of records repeat the same few keys
    /// thousands of times, and a shared string is created and hashed once (pickle's memo does
    /// the same). Only short keys are cached, and at most `KEY_CACHE` of them.
    fn key_str(&self, s: &str) -> Bound<'py, PyAny> {
        const KEY_CACHE: usize = 4096;
        if s.len() > 64 {
            return PyString::new(self.py, s).into_any();
        }
        let mut cache = self.keys.borrow_mut();
        if let Some(k) = cache.get(s) {
            return k.clone();
        }
        let k = PyString::new(self.py, s).into_any();
        if cache.len() < KEY_CACHE {
            cache.insert(s.to_string(), k.clone());
        }
        k
    }

    fn key(&self, k: &Key) -> PyResult<Bound<'py, PyAny>> {
        Ok(match k {
            Key::None => self.py.None().into_bound(self.py),
            Key::Bool(b) => PyBool::new(self.py, *b).to_owned().into_any(),
            Key::Int(i) => int_py(self.py, i)?,
            Key::Float(f) => PyFloat::new(self.py, *f).into_any(),
            Key::Str(s) => self.key_str(s),
            Key::Tuple(v) => {
                PyTuple::new(self.py, v.iter().map(|k| self.key(k)).collect::<PyResult<Vec<_>>>()?)?.into_any()
            }
        })
    }

    fn node(&mut self, n: Node) -> PyResult<Bound<'py, PyAny>> {
        treepack::format::model::grow(|| self.node_inner(n))
    }

    fn node_inner(&mut self, n: Node) -> PyResult<Bound<'py, PyAny>> {
        let py = self.py;
        Ok(match n {
            Tree::Leaf(l) => match l {
                Leaf::None => py.None().into_bound(py),
                Leaf::Bool(b) => PyBool::new(py, b).to_owned().into_any(),
                Leaf::Int(i) => int_py(py, &i)?,
                Leaf::Float(f) => PyFloat::new(py, f).into_any(),
                Leaf::Complex(a, b) => PyComplex::from_doubles(py, a, b).into_any(),
                Leaf::Str(s) => PyString::new(py, &s).into_any(),
                Leaf::Bytes(b) => PyBytes::new(py, &b).into_any(),
                Leaf::Array(a) => self.array(a)?,
            },
            Tree::List(v) => {
                let items = v.into_iter().map(|c| self.node(c)).collect::<PyResult<Vec<_>>>()?;
                PyList::new(py, items)?.into_any()
            }
            Tree::Tuple(v) => {
                let items = v.into_iter().map(|c| self.node(c)).collect::<PyResult<Vec<_>>>()?;
                PyTuple::new(py, items)?.into_any()
            }
            Tree::Dict(v) => {
                let d = PyDict::new(py);
                for (k, c) in v {
                    let key = self.key(&k)?;
                    d.set_item(key, self.node(c)?)?;
                }
                d.into_any()
            }
            Tree::Record { type_name, fields } => self.other("record", type_name, serde_json::Value::Null, fields)?,
            Tree::Custom { type_name, data, children } => self.other("custom", type_name, data, children)?,
        })
    }

    fn other(
        &mut self,
        kind: &str,
        type_name: String,
        data: serde_json::Value,
        kids: Vec<(String, Node)>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let mut pairs = Vec::with_capacity(kids.len());
        for (k, c) in kids {
            pairs.push(PyTuple::new(self.py, [PyString::new(self.py, &k).into_any(), self.node(c)?])?);
        }
        self.other_built(kind, &type_name, &data, pairs)
    }

    /// A record or custom node from its already-built children (`(name, value)` tuples).
    fn other_built(
        &mut self,
        kind: &str,
        type_name: &str,
        data: &serde_json::Value,
        pairs: Vec<Bound<'py, PyTuple>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if kind == "custom" && type_name == "py.datetime" && pairs.is_empty() {
            if let Some(dt) = datetime_fast(self.py, data)? {
                return Ok(dt);
            }
        }
        let data_s = if data.is_null() { None } else { Some(data.to_string()) };
        let f = self.decode_other.as_ref().ok_or_else(|| PyValueError::new_err("no decoder for records"))?;
        f.call1((kind, type_name, data_s, PyList::new(self.py, pairs)?))
    }

    /// A numpy array that owns a copy of `data` (for arrays stored inline in the manifest: they
    /// are small, and one allocation inside numpy is cheaper than a separate owner object).
    fn small_array(&mut self, dtype: &DType, shape: &[u64], data: &[u8]) -> PyResult<Bound<'py, PyAny>> {
        use numpy::npyffi::{self, npy_intp, PY_ARRAY_API};
        let descr = self.dtype(dtype)?;
        let n = shape.iter().try_fold(descr.itemsize(), |acc, &d| acc.checked_mul(usize::try_from(d).ok()?));
        if n != Some(data.len()) {
            return Err(PyValueError::new_err(format!(
                "inline array has {} bytes, but its dtype and shape {shape:?} need {n:?}",
                data.len()
            )));
        }
        let mut dims: Vec<npy_intp> = shape.iter().map(|&d| d as npy_intp).collect();
        // SAFETY: NewFromDescr steals the descr reference and allocates a C-contiguous buffer of
        // itemsize × prod(shape) bytes, which the manifest validation guarantees `data` has.
        unsafe {
            let arr = PY_ARRAY_API.PyArray_NewFromDescr(
                self.py,
                npyffi::get_type_object(self.py, npyffi::NpyTypes::PyArray_Type),
                descr.into_ptr() as *mut npyffi::PyArray_Descr,
                dims.len() as std::os::raw::c_int,
                dims.as_mut_ptr(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
                std::ptr::null_mut(),
            );
            if arr.is_null() {
                return Err(PyErr::fetch(self.py));
            }
            let obj = arr as *mut npyffi::PyArrayObject;
            std::ptr::copy_nonoverlapping(data.as_ptr(), (*obj).fields.data as *mut u8, data.len());
            if self.readonly {
                (*obj).fields.flags &= !npyffi::NPY_ARRAY_WRITEABLE;
            }
            Ok(Bound::from_owned_ptr(self.py, arr))
        }
    }

    /// Build the Python tree straight from the manifest tree: inline leaves are read from the
    /// manifest (borrowed, nothing cloned), stored leaves are taken in order from `stored`.
    fn entry_tree(&mut self, t: &Tree<Entry>, stored: &mut StoredLeaves) -> PyResult<Bound<'py, PyAny>> {
        treepack::format::model::grow(|| self.entry_tree_inner(t, stored))
    }

    fn entry_tree_inner(&mut self, t: &Tree<Entry>, stored: &mut StoredLeaves) -> PyResult<Bound<'py, PyAny>> {
        let py = self.py;
        Ok(match t {
            Tree::Leaf(e) => self.entry_leaf(e, stored)?,
            Tree::List(v) => {
                let items = v.iter().map(|c| self.entry_tree(c, stored)).collect::<PyResult<Vec<_>>>()?;
                PyList::new(py, items)?.into_any()
            }
            Tree::Tuple(v) => {
                let items = v.iter().map(|c| self.entry_tree(c, stored)).collect::<PyResult<Vec<_>>>()?;
                PyTuple::new(py, items)?.into_any()
            }
            Tree::Dict(v) => {
                let d = PyDict::new(py);
                for (k, c) in v {
                    let key = self.key(k)?;
                    d.set_item(key, self.entry_tree(c, stored)?)?;
                }
                d.into_any()
            }
            Tree::Record { type_name, fields } => {
                let pairs = self.entry_pairs(fields, stored)?;
                self.other_built("record", type_name, &serde_json::Value::Null, pairs)?
            }
            Tree::Custom { type_name, data, children } => {
                let pairs = self.entry_pairs(children, stored)?;
                self.other_built("custom", type_name, data, pairs)?
            }
        })
    }

    /// One manifest leaf: inline values straight from the manifest (borrowed, nothing cloned),
    /// stored ones taken in order from `stored`.
    fn entry_leaf(&mut self, e: &Entry, stored: &mut StoredLeaves) -> PyResult<Bound<'py, PyAny>> {
        use treepack::format::manifest::Stored;
        let py = self.py;
        let id = stored.next_id;
        stored.next_id += 1;
        if let Some((_, l)) = stored.leaves.next_if(|(j, _)| *j == id) {
            // Immutable values stored once (deduplicated) come back as one shared object,
            // as pickle's memo does for an object referenced many times.
            let shared = match e {
                Entry::Str(Stored::Blob { chunk, .. }) | Entry::Bytes(Stored::Blob { chunk, .. }) => {
                    Some((matches!(e, Entry::Str(_)), chunk.pack, chunk.offset, chunk.length))
                }
                _ => None,
            };
            if let Some(k) = shared {
                if let Some(v) = stored.shared.get(&k) {
                    return Ok(v.bind(py).clone());
                }
                let v = self.node_inner(Tree::Leaf(l))?;
                stored.shared.insert(k, v.clone().unbind());
                return Ok(v);
            }
            return self.node_inner(Tree::Leaf(l));
        }
        Ok(match e {
            Entry::None => py.None().into_bound(py),
            Entry::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
            Entry::Int(i) => int_py(py, i)?,
            Entry::Float(f) => PyFloat::new(py, *f).into_any(),
            Entry::Complex(a, b) => PyComplex::from_doubles(py, *a, *b).into_any(),
            Entry::Str(Stored::Inline(s)) => PyString::new(py, s).into_any(),
            Entry::Bytes(Stored::Inline(b)) => PyBytes::new(py, b).into_any(),
            Entry::Array(a) => match &a.storage {
                ArrayStorage::Inline(d) => self.small_array(&a.dtype, &a.shape, d)?,
                ArrayStorage::Chunked { .. } => return Err(PyValueError::new_err("array data was not read")),
            },
            Entry::Str(Stored::Blob { .. }) | Entry::Bytes(Stored::Blob { .. }) => {
                return Err(PyValueError::new_err("blob was not read"))
            }
        })
    }

    fn entry_pairs(
        &mut self,
        kids: &[(String, Tree<Entry>)],
        stored: &mut StoredLeaves,
    ) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        let mut pairs = Vec::with_capacity(kids.len());
        for (k, c) in kids {
            pairs.push(PyTuple::new(self.py, [PyString::new(self.py, k).into_any(), self.entry_tree(c, stored)?])?);
        }
        Ok(pairs)
    }
}

/// The leaves a whole-tree load read from packs, consumed in tree order while the Python tree
/// is built from the manifest.
struct StoredLeaves {
    leaves: std::iter::Peekable<std::vec::IntoIter<(usize, Leaf)>>,
    next_id: usize,
    /// str/bytes objects already built, by (is str, pack, offset, length) of their blob.
    shared: HashMap<(bool, u32, u64, u64), Py<PyAny>>,
}

/// The `py.datetime` node of a naive or UTC datetime, exactly as the Python encoder writes it
/// (`{"iso": naive isoformat, "tz": null | {"offset": [0,0,0], "name": "UTC"}, "fold": 0|1}`);
/// `None` for other time zones, which the Python encoder handles.
fn datetime_node(py: Python<'_>, d: &Bound<'_, pyo3::types::PyDateTime>) -> PyResult<Option<Node>> {
    use pyo3::types::{PyDateAccess, PyTimeAccess, PyTzInfo, PyTzInfoAccess};
    let utc = match d.get_tzinfo() {
        None => false,
        Some(t) if t.is(&*PyTzInfo::utc(py)?) => true,
        Some(_) => return Ok(None),
    };
    let year = d.get_year();
    if !(0..=9999).contains(&year) {
        return Ok(None);
    }
    // `YYYY-MM-DDTHH:MM:SS[.ffffff]`, digit by digit (this runs once per record).
    fn digits(out: &mut String, sep: Option<char>, v: u32, n: u32) {
        out.extend(sep);
        for i in (0..n).rev() {
            out.push(char::from(b'0' + ((v / 10u32.pow(i)) % 10) as u8));
        }
    }
    let mut iso = String::with_capacity(28);
    digits(&mut iso, None, year as u32, 4);
    digits(&mut iso, Some('-'), u32::from(d.get_month()), 2);
    digits(&mut iso, Some('-'), u32::from(d.get_day()), 2);
    digits(&mut iso, Some('T'), u32::from(d.get_hour()), 2);
    digits(&mut iso, Some(':'), u32::from(d.get_minute()), 2);
    digits(&mut iso, Some(':'), u32::from(d.get_second()), 2);
    if d.get_microsecond() != 0 {
        digits(&mut iso, Some('.'), d.get_microsecond(), 6);
    }
    let data = if d.get_fold() {
        let tz = if utc { serde_json::json!({"offset": [0, 0, 0], "name": "UTC"}) } else { serde_json::Value::Null };
        serde_json::json!({"iso": iso, "tz": tz, "fold": 1})
    } else {
        // The compact form (see `datetime_fast`): one JSON string instead of a nested object.
        if utc {
            iso.push('Z');
        }
        serde_json::Value::String(iso)
    };
    Ok(Some(Tree::Custom { type_name: "py.datetime".into(), data, children: vec![] }))
}

/// Fast path for `py.datetime` nodes (one per record in traced data): build the datetime in Rust
/// instead of sending JSON text through the Python decoder (~10 µs -> ~1 µs each). Handles naive,
/// UTC and unnamed fixed-offset datetimes; anything else (zoneinfo zones, named offsets, odd
/// text) returns `None` and takes the general Python path, which defines the semantics.
fn datetime_fast<'py>(py: Python<'py>, data: &serde_json::Value) -> PyResult<Option<Bound<'py, PyAny>>> {
    use pyo3::types::{PyDateTime, PyDelta, PyTzInfo};
    if let Some(text) = data.as_str() {
        // Compact form: naive isoformat, or with a trailing `Z` for `timezone.utc` (fold 0).
        let (iso, utc) = match text.strip_suffix('Z') {
            Some(t) => (t, true),
            None => (text, false),
        };
        let Some((y, mo, d, h, mi, sec, us)) = parse_iso_datetime(iso) else { return Ok(None) };
        let tz = if utc { Some(PyTzInfo::utc(py)?.to_owned()) } else { None };
        return Ok(Some(PyDateTime::new_with_fold(py, y, mo, d, h, mi, sec, us, tz.as_ref(), false)?.into_any()));
    }
    let Some(obj) = data.as_object() else { return Ok(None) };
    if obj.len() > 3 {
        return Ok(None);
    }
    let Some(iso) = obj.get("iso").and_then(|v| v.as_str()) else { return Ok(None) };
    let fold = match obj.get("fold").map(|v| v.as_u64()) {
        None | Some(Some(0)) => false,
        Some(Some(1)) => true,
        _ => return Ok(None),
    };
    let Some((y, mo, d, h, mi, sec, us)) = parse_iso_datetime(iso) else { return Ok(None) };
    let tz: Option<Bound<'py, PyTzInfo>> = match obj.get("tz") {
        None | Some(serde_json::Value::Null) => None,
        Some(t) => {
            let Some(t) = t.as_object() else { return Ok(None) };
            let Some(off) = t.get("offset").and_then(|o| o.as_array()) else { return Ok(None) };
            let off: Vec<i64> = off.iter().filter_map(serde_json::Value::as_i64).collect();
            if off.len() != 3 || t.len() > 2 {
                return Ok(None);
            }
            let name = t.get("name");
            let (days, secs, micros) = (off[0], off[1], off[2]);
            if days == 0 && secs == 0 && micros == 0 && matches!(name.and_then(|n| n.as_str()), None | Some("UTC")) {
                Some(PyTzInfo::utc(py)?.to_owned())
            } else if name.is_none_or(serde_json::Value::is_null) {
                let (Ok(days), Ok(secs), Ok(micros)) =
                    (i32::try_from(days), i32::try_from(secs), i32::try_from(micros))
                else {
                    return Ok(None);
                };
                let delta = PyDelta::new(py, days, secs, micros, true)?;
                Some(PyTzInfo::fixed_offset(py, delta)?)
            } else {
                return Ok(None);
            }
        }
    };
    let dt = PyDateTime::new_with_fold(py, y, mo, d, h, mi, sec, us, tz.as_ref(), fold)?;
    Ok(Some(dt.into_any()))
}

/// Parse `YYYY-MM-DDTHH:MM:SS[.ffffff]` (what `datetime.isoformat()` writes for naive values).
fn parse_iso_datetime(s: &str) -> Option<(i32, u8, u8, u8, u8, u8, u32)> {
    let b = s.as_bytes();
    if !(b.len() == 19 || b.len() == 26)
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b'T'
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<u32> {
        let t = &s[r];
        if t.bytes().all(|c| c.is_ascii_digit()) {
            t.parse().ok()
        } else {
            None
        }
    };
    let us = if b.len() == 26 {
        if b[19] != b'.' {
            return None;
        }
        num(20..26)?
    } else {
        0
    };
    Some((
        i32::try_from(num(0..4)?).ok()?,
        u8::try_from(num(5..7)?).ok()?,
        u8::try_from(num(8..10)?).ok()?,
        u8::try_from(num(11..13)?).ok()?,
        u8::try_from(num(14..16)?).ok()?,
        u8::try_from(num(17..19)?).ok()?,
        us,
    ))
}

fn int_py<'py>(py: Python<'py>, i: &Int) -> PyResult<Bound<'py, PyAny>> {
    Ok(match i {
        Int::Small(v) => v.into_pyobject(py)?.into_any(),
        Int::Big(b) => b.into_pyobject(py)?.into_any(),
    })
}

fn dtype_text(d: &DType) -> String {
    d.name().unwrap_or_else(|| d.to_json().to_string())
}

#[pymethods]
impl Reader {
    #[new]
    #[pyo3(signature = (path, storage_options=None))]
    fn new(py: Python<'_>, path: &str, storage_options: Options) -> PyResult<Self> {
        let loc = location(path, storage_options)?;
        let inner = py.detach(|| treepack::Reader::open(loc)).map_err(py_err)?;
        Ok(Reader { inner })
    }

    /// Every record/custom node a load with `select`/`keep` would build: (kind, type, data JSON
    /// or None, key path), leaving out custom nodes whose type is in `skip` (types the caller
    /// accepts whatever their data, so 10k datetimes cost no rows). Constructs nothing.
    #[pyo3(signature = (skip=None, select=None, keep=None))]
    fn types(
        &self,
        skip: Option<HashSet<String>>,
        select: Option<Vec<String>>,
        keep: Option<HashSet<String>>,
    ) -> PyResult<Vec<TypeRow>> {
        let root = &self.inner.manifest().root;
        let opts = LoadOptions { select: select.unwrap_or_default(), keep, ..Default::default() };
        let unbuilt = treepack::read::unbuilt_objects(root, "", &opts).map_err(py_err)?;
        let mut out = vec![];
        walk_types(root, &mut vec![], &skip.unwrap_or_default(), &mut out);
        if !unbuilt.is_empty() {
            out.retain(|row| !unbuilt.contains(&row.3));
        }
        Ok(out)
    }

    /// Load the tree (or the subtree at `subpath`).
    #[pyo3(signature = (decode_other, np_dtype, select=None, keep=None, mmap=false, verify=true, subpath=None, progress=None))]
    #[allow(clippy::too_many_arguments)]
    fn load<'py>(
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
    ) -> PyResult<Bound<'py, PyAny>> {
        let opts = LoadOptions {
            select: select.unwrap_or_default(),
            keep,
            mmap,
            verify,
            progress: progress_fn(progress),
            ..Default::default()
        };
        let mut dec = Decoder::new(py, Some(decode_other), Some(np_dtype), mmap);
        if subpath.is_none() && opts.select.is_empty() && opts.keep.is_none() {
            // Whole tree: fetch the stored leaves, then build Python objects straight from the
            // manifest (no intermediate tree of owned values).
            let leaves = py
                .detach(|| match self.inner.fetch_stored_leaves_mapped(&opts) {
                    Some(done) => done,
                    None => treepack::block_on(self.inner.fetch_stored_leaves_async(&opts)),
                })
                .map_err(py_err)?;
            let mut stored =
                StoredLeaves { leaves: leaves.into_iter().peekable(), next_id: 0, shared: Default::default() };
            return without_gc(py, || dec.entry_tree(&self.inner.manifest().root, &mut stored));
        }
        let node = py
            .detach(|| match &subpath {
                Some(p) => treepack::block_on(self.inner.get_async(p, &opts)),
                None => treepack::block_on(self.inner.load_async(&opts)),
            })
            .map_err(py_err)?;
        without_gc(py, || dec.node(node))
    }

    /// The structure: containers as dict/list/tuple, records/custom nodes via `make_node`,
    /// leaves as `LeafInfo`.
    fn structure<'py>(&self, py: Python<'py>, make_node: Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let dec = Decoder::new(py, None, None, false);
        without_gc(py, || structure(&dec, &self.inner.manifest().root, &mut String::new(), &make_node))
    }

    /// Kind of the node at a key path: a container kind or a leaf kind.
    fn kind(&self, path: &str) -> PyResult<String> {
        let t = self.inner.entry(path).map_err(py_err)?;
        Ok(match t {
            Tree::Leaf(e) => e.kind().to_string(),
            t => t.container_kind().to_string(),
        })
    }

    /// Children of the container at `path`: (segment text, key as a Python object).
    fn children<'py>(&self, py: Python<'py>, path: &str) -> PyResult<Vec<(String, Bound<'py, PyAny>)>> {
        let t = self.inner.entry(path).map_err(py_err)?;
        let dec = Decoder::new(py, None, None, false);
        let mut out = vec![];
        for (step, _) in t.children() {
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

    /// (dtype JSON, shape) of the array at `path`.
    fn array_info(&self, path: &str) -> PyResult<(String, Vec<u64>)> {
        match self.inner.entry(path).map_err(py_err)? {
            Tree::Leaf(Entry::Array(a)) => Ok((a.dtype.to_json().to_string(), a.shape.clone())),
            _ => Err(PyKeyError::new_err(format!("`{path}` is not an array"))),
        }
    }

    /// Read a numpy-style slice of the array at `path` (only the chunks it touches).
    fn read_array<'py>(
        &self,
        py: Python<'py>,
        path: &str,
        slice: &str,
        np_dtype: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let a = py.detach(|| treepack::block_on(self.inner.read_array_async(path, slice, true))).map_err(py_err)?;
        let mut dec = Decoder::new(py, None, Some(np_dtype), false);
        dec.array(a)
    }

    /// Re-hash every chunk: (ok, chunks checked, bytes checked, problems as strings).
    fn verify(&self, py: Python<'_>) -> PyResult<(bool, usize, u64, Vec<String>)> {
        let r = py.detach(|| self.inner.verify()).map_err(py_err)?;
        let probs = r
            .problems
            .iter()
            .map(|p| match p.chunk {
                Some(c) => format!("{} chunk {c} in {}: {}", p.key, p.file, p.reason),
                None => format!("{}: {}", p.file, p.reason),
            })
            .collect();
        Ok((r.ok(), r.chunks_checked, r.bytes_checked, probs))
    }

    /// The user metadata as JSON text (None if absent).
    fn metadata(&self) -> Option<String> {
        self.inner.manifest().metadata.as_ref().map(|m| m.to_string())
    }

    /// Bytes and requests this reader has read so far.
    fn io_stats(&self) -> (u64, u64) {
        let s = self.inner.location().stats();
        (s.bytes_read(), s.read_requests())
    }
}

fn walk_types<'a>(
    t: &'a Tree<Entry>,
    path: &mut Vec<treepack::format::model::Step<'a>>,
    skip: &HashSet<String>,
    out: &mut Vec<TypeRow>,
) {
    let text = |path: &[treepack::format::model::Step<'_>]| treepack::format::keypath::steps_text(path);
    match t {
        Tree::Leaf(_) => return,
        Tree::Record { type_name, .. } => out.push(("record".into(), type_name.clone(), None, text(path))),
        Tree::Custom { type_name, .. } if skip.contains(type_name) => {}
        Tree::Custom { type_name, data, .. } => out.push((
            "custom".into(),
            type_name.clone(),
            if data.is_null() { None } else { Some(data.to_string()) },
            text(path),
        )),
        _ => {}
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

fn structure<'py>(
    dec: &Decoder<'py>,
    t: &Tree<Entry>,
    path: &mut String,
    make_node: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = dec.py;
    let mut kids = vec![];
    for (step, c) in t.children() {
        let here = path.len();
        if here > 0 {
            path.push('/');
        }
        treepack::format::keypath::push_step_text(path, &step);
        let v = treepack::format::model::grow(|| structure(dec, c, path, make_node))?;
        path.truncate(here);
        let k = match step {
            treepack::format::model::Step::Index(i) => i.into_pyobject(py)?.into_any(),
            treepack::format::model::Step::Key(k) => dec.key(k)?,
            treepack::format::model::Step::Name(n) => PyString::new(py, n).into_any(),
        };
        kids.push((k, v));
    }
    let leaves_only = kids.iter().all(|(_, v)| v.is_exact_instance_of::<LeafInfo>());
    Ok(match t {
        Tree::Leaf(e) => leaf_info(py, LeafInfo::of(path, e))?,
        Tree::List(_) => PyList::new(py, kids.into_iter().map(|(_, v)| v))?.into_any(),
        Tree::Tuple(_) => {
            untrack_if_leaves(leaves_only, PyTuple::new(py, kids.into_iter().map(|(_, v)| v))?.into_any())
        }
        Tree::Dict(_) => {
            let d = PyDict::new(py);
            for (k, v) in kids {
                d.set_item(k, v)?;
            }
            untrack_if_leaves(leaves_only, d.into_any())
        }
        Tree::Record { type_name, .. } => {
            let pairs = PyList::new(
                py,
                kids.into_iter().map(|(k, v)| PyTuple::new(py, [k, v])).collect::<PyResult<Vec<_>>>()?,
            )?;
            make_node.call1(("record", type_name, py.None(), pairs, path.as_str()))?
        }
        Tree::Custom { type_name, data, .. } => {
            let pairs = PyList::new(
                py,
                kids.into_iter().map(|(k, v)| PyTuple::new(py, [k, v])).collect::<PyResult<Vec<_>>>()?,
            )?;
            let d = if data.is_null() { None } else { Some(data.to_string()) };
            make_node.call1(("custom", type_name, d, pairs, path.as_str()))?
        }
    })
}

/// Builds `load_structure`'s Python objects while the manifest is parsed, with no manifest tree
/// in between (see `treepack::format::manifest::Build`): on a 100k-leaf manifest that tree alone is
/// ~20 MB in 300k allocations, more than half of the whole call's time.
struct StructBuilder<'py, 'm> {
    dec: Decoder<'py>,
    make_node: &'m Bound<'py, PyAny>,
    /// Key path of the node being read, and where each open step began in it.
    path: std::cell::RefCell<(String, Vec<usize>)>,
}

impl<'py> StructBuilder<'py, '_> {
    /// A Python error stops the parse; the caller's fallback raises it again, in context.
    fn py_ok<T>(&self, r: PyResult<T>) -> Result<T, String> {
        r.map_err(|e| e.to_string())
    }
    fn other(
        &self,
        kind: &str,
        type_name: String,
        data: Option<String>,
        kids: Vec<(String, Bound<'py, PyAny>)>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = self.dec.py;
        let pairs = self.dec.named(kids)?;
        let path = self.path.borrow();
        self.make_node.call1((kind, type_name, data, PyList::new(py, pairs)?, path.0.as_str()))
    }
}

impl<'py> treepack::format::manifest::Build for StructBuilder<'py, '_> {
    type Node = Bound<'py, PyAny>;
    const HELPER: bool = true;
    fn leaf(&self, e: Entry) -> Result<Self::Node, String> {
        self.leaf_ref(&e)
    }
    fn leaf_ref(&self, e: &Entry) -> Result<Self::Node, String> {
        let info = LeafInfo::of(&self.path.borrow().0, e);
        self.py_ok(leaf_info(self.dec.py, info))
    }
    fn list(&self, items: Vec<Self::Node>, tuple: bool) -> Result<Self::Node, String> {
        let leaves_only = items.iter().all(|v| v.is_exact_instance_of::<LeafInfo>());
        self.py_ok(self.dec.sequence(items, tuple)).map(|c| untrack_if_leaves(leaves_only, c))
    }
    fn dict(&self, pairs: Vec<(Key, Self::Node)>) -> Result<Self::Node, String> {
        let leaves_only = pairs.iter().all(|(_, v)| v.is_exact_instance_of::<LeafInfo>());
        self.py_ok(self.dec.dict_of(pairs)).map(|c| untrack_if_leaves(leaves_only, c))
    }
    fn record(&self, type_name: String, fields: Vec<(String, Self::Node)>) -> Result<Self::Node, String> {
        self.py_ok(self.other("record", type_name, None, fields))
    }
    fn custom(
        &self,
        type_name: String,
        data: serde_json::Value,
        children: Vec<(String, Self::Node)>,
    ) -> Result<Self::Node, String> {
        let data = if data.is_null() { None } else { Some(data.to_string()) };
        self.py_ok(self.other("custom", type_name, data, children))
    }
    fn enter(&self, step: treepack::format::model::Step<'_>) {
        let mut p = self.path.borrow_mut();
        let (text, starts) = &mut *p;
        starts.push(text.len());
        if !text.is_empty() {
            text.push('/');
        }
        treepack::format::keypath::push_step_text(text, &step);
    }
    fn exit(&self) {
        let mut p = self.path.borrow_mut();
        let (text, starts) = &mut *p;
        if let Some(at) = starts.pop() {
            text.truncate(at);
        }
    }
}

/// Manifests at least this large are read for `load_structure` by a helper thread's
/// structure-only parse while this thread builds (below that, a thread costs more than it saves).
const OUTLINE_MIN_BYTES: usize = 256 << 10;

/// `load_structure` from a structure-only read of the manifest (`treepack::format::manifest::outline`)
/// on a helper thread, streamed in blocks while this thread builds the Python objects: the
/// parse, the leaves' facts and their key paths all cost this thread nothing, and each leaf
/// object is a small handle into its block's table. `None` whenever anything is off (a bad
/// seal or parse, a repeated dict key, a Python error, a pack the layout forbids): the caller
/// then takes the one-pass parse, which gives the result or the full error.
fn structure_outline<'py>(
    py: Python<'py>,
    bytes: &[u8],
    file: &str,
    layout: treepack::Layout,
    make_node: &Bound<'py, PyAny>,
) -> Option<Bound<'py, PyAny>> {
    let (tx, mut rx) = std::sync::mpsc::channel::<Block>();
    // Blocks built go back to be filled again.
    let (back_tx, back_rx) = std::sync::mpsc::channel::<Block>();
    std::thread::scope(|s| {
        let helper = std::thread::Builder::new()
            .name("treepack-outline".into())
            .spawn_scoped(s, move || {
                treepack::format::manifest::outline::outline_reusing(
                    bytes,
                    file,
                    &mut |b| tx.send(b).is_ok(),
                    &mut || back_rx.try_recv().ok(),
                )
            })
            .ok()?;
        // The seal is checked here while the helper parses.
        let mut built = treepack::format::manifest::check(bytes, file).ok().map(|_| OutlineBuilder::new(py, make_node));
        if let Some(b) = &mut built {
            loop {
                let block = match rx.try_recv() {
                    Ok(block) => block,
                    Err(std::sync::mpsc::TryRecvError::Empty) => {
                        // Wait without the interpreter (the receiver goes with the wait and back).
                        let (got, back) = py.detach(move || (rx.recv(), rx));
                        rx = back;
                        match got {
                            Ok(block) => block,
                            Err(_) => break,
                        }
                    }
                    Err(std::sync::mpsc::TryRecvError::Disconnected) => break,
                };
                if b.feed(&block).is_none() {
                    built = None;
                    break;
                }
                let _ = back_tx.send(block.reuse());
            }
        }
        // A helper still reading stops at its next block.
        drop(rx);
        let packs = helper.join().ok()?.ok()?;
        if !packs.iter().all(|p| layout.allows_pack(&p.path)) {
            return None;
        }
        let tree = built?.finish()?;
        OUTLINE_BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Some(tree)
    })
}

/// Structures built by [`structure_outline`] in this process (tests check which path ran).
static OUTLINE_BUILDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many `load_structure` calls were answered by the structure-only read (for tests).
#[pyfunction]
fn _outline_builds() -> u64 {
    OUTLINE_BUILDS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Builds `load_structure`'s objects from outline events (pre-order), one container frame per
/// open node.
struct OutlineBuilder<'py, 'm> {
    dec: Decoder<'py>,
    make_node: &'m Bound<'py, PyAny>,
    stack: Vec<Frame<'py>>,
    root: Option<Bound<'py, PyAny>>,
    /// Slots of (length, text, string): the text kept inline, so a hit costs one compare.
    keys: Vec<Option<KeySlot<'py>>>,
}

/// (length, text, the string) of a key `OutlineBuilder` met.
type KeySlot<'py> = (u8, [u8; KEY_INLINE], Bound<'py, PyString>);

/// Slots of `OutlineBuilder`'s key cache.
const KEY_SLOTS: usize = 512;
/// Longest key `OutlineBuilder`'s cache keeps.
const KEY_INLINE: usize = 22;

enum Frame<'py> {
    /// `n` items set so far: a dict with fewer entries repeated a key.
    Dict {
        d: Bound<'py, PyDict>,
        key: Option<Bound<'py, PyAny>>,
        n: usize,
        leaves_only: bool,
    },
    Seq {
        items: Vec<Bound<'py, PyAny>>,
        tuple: bool,
        leaves_only: bool,
    },
    Named {
        name: Option<Bound<'py, PyAny>>,
        kids: Vec<Bound<'py, PyAny>>,
    },
}

impl<'py, 'm> OutlineBuilder<'py, 'm> {
    fn new(py: Python<'py>, make_node: &'m Bound<'py, PyAny>) -> Self {
        OutlineBuilder {
            dec: Decoder::new(py, None, None, false),
            make_node,
            stack: Vec::new(),
            root: None,
            keys: vec![None; KEY_SLOTS],
        }
    }

    /// Build what `block` describes; `None` on anything unexpected or any Python error.
    fn feed(&mut self, block: &Block) -> Option<()> {
        let py = self.dec.py;
        for e in &block.events {
            match *e {
                Event::Dict => self.stack.push(Frame::Dict { d: PyDict::new(py), key: None, n: 0, leaves_only: true }),
                Event::List | Event::Tuple => {
                    self.stack.push(Frame::Seq { items: Vec::new(), tuple: *e == Event::Tuple, leaves_only: true })
                }
                Event::Named => self.stack.push(Frame::Named { name: None, kids: Vec::new() }),
                Event::Key(a, b) => {
                    let k = self.key_str(block.text(a, b)?);
                    self.key(k)?;
                }
                Event::TypedKey(i) => {
                    let k = self.dec.key(block.keys.get(i as usize)?).ok()?;
                    self.key(k)?;
                }
                Event::Leaf(i) => {
                    let info = LeafInfo::row(&block.leaves, i)?;
                    let obj = leaf_info(py, info).ok()?;
                    self.add(obj, true)?;
                }
                Event::End => {
                    let v = match self.stack.pop()? {
                        Frame::Dict { d, n, leaves_only, .. } => {
                            if d.len() != n {
                                return None;
                            }
                            untrack_if_leaves(leaves_only, d.into_any())
                        }
                        Frame::Seq { items, tuple, leaves_only } => {
                            untrack_if_leaves(leaves_only, self.dec.sequence(items, tuple).ok()?)
                        }
                        Frame::Named { .. } => return None,
                    };
                    self.add(v, false)?;
                }
                Event::EndNamed(i) => {
                    let Frame::Named { kids, .. } = self.stack.pop()? else { return None };
                    let n = block.named.get(i as usize)?;
                    let kind = if n.custom { "custom" } else { "record" };
                    let kids = PyList::new(py, kids).ok()?;
                    let v = self.make_node.call1((kind, &n.type_name, n.data.as_deref(), kids, &n.path)).ok()?;
                    self.add(v, false)?;
                }
            }
        }
        Some(())
    }

    /// A str key through a small direct-mapped cache: the same few keys repeat in every dict
    /// of a big tree, and a miss costs only the string the cache did not have.
    fn key_str(&mut self, s: &str) -> Bound<'py, PyAny> {
        let bytes = s.as_bytes();
        if bytes.len() > KEY_INLINE {
            return PyString::new(self.dec.py, s).into_any();
        }
        // FNV-1a over the key's bytes picks the slot.
        let h = bytes.iter().fold(0x811c_9dc5u32, |h, &b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193));
        let slot = &mut self.keys[h as usize % KEY_SLOTS];
        if let Some((len, text, k)) = slot {
            if text.get(..*len as usize) == Some(bytes) {
                return k.clone().into_any();
            }
        }
        let k = PyString::new(self.dec.py, s);
        let mut text = [0u8; KEY_INLINE];
        text[..bytes.len()].copy_from_slice(bytes);
        *slot = Some((bytes.len() as u8, text, k.clone()));
        k.into_any()
    }

    fn key(&mut self, k: Bound<'py, PyAny>) -> Option<()> {
        match self.stack.last_mut()? {
            Frame::Dict { key, .. } | Frame::Named { name: key, .. } => *key = Some(k),
            Frame::Seq { .. } => return None,
        }
        Some(())
    }

    fn add(&mut self, v: Bound<'py, PyAny>, leaf: bool) -> Option<()> {
        match self.stack.last_mut() {
            None => {
                if self.root.replace(v).is_some() {
                    return None;
                }
            }
            Some(Frame::Dict { d, key, n, leaves_only }) => {
                d.set_item(key.take()?, v).ok()?;
                *n += 1;
                *leaves_only &= leaf;
            }
            Some(Frame::Seq { items, leaves_only, .. }) => {
                items.push(v);
                *leaves_only &= leaf;
            }
            Some(Frame::Named { name, kids }) => {
                kids.push(PyTuple::new(self.dec.py, [name.take()?, v]).ok()?.into_any());
            }
        }
        Some(())
    }

    fn finish(self) -> Option<Bound<'py, PyAny>> {
        if !self.stack.is_empty() {
            return None;
        }
        self.root
    }
}

/// The (pinned) location and its manifest's unchecked bytes for a one-pass read; `None` if they
/// cannot be read (the Reader path then reports why).
fn manifest_of(
    py: Python<'_>,
    path: &str,
    storage_options: Options,
) -> PyResult<Option<(treepack::Location, Bytes, String)>> {
    let loc = location(path, storage_options)?;
    let fetched = py.detach(|| {
        let loc = loc.pin()?;
        // Local trees are read on this thread (no async runtime to start for them).
        if let Some(r) = treepack::read::manifest_bytes_local(&loc) {
            return r.map(|(bytes, file)| (loc, bytes, file));
        }
        treepack::block_on(async {
            let (bytes, file) = treepack::read::manifest_bytes(&loc).await?;
            Ok::<_, treepack::Error>((loc, bytes, file))
        })
    });
    Ok(fetched.ok())
}

/// `load_structure` in one pass over the manifest (no `Reader`, no manifest tree). Returns
/// `None` whenever that path does not apply or anything fails, and the caller then takes the
/// `Reader` path, which reports the error in full.
#[pyfunction]
#[pyo3(signature = (path, make_node, storage_options=None))]
fn structure_one_pass<'py>(
    py: Python<'py>,
    path: &str,
    make_node: Bound<'py, PyAny>,
    storage_options: Options,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let Some((loc, bytes, file)) = manifest_of(py, path, storage_options)? else { return Ok(None) };
    let layout = loc.layout();
    if bytes.len() >= OUTLINE_MIN_BYTES {
        if let Some(tree) = without_gc(py, || Ok(structure_outline(py, &bytes, &file, layout, &make_node)))? {
            return Ok(Some(tree));
        }
    }
    let builder =
        StructBuilder { dec: Decoder::new(py, None, None, false), make_node: &make_node, path: Default::default() };
    let parsed = without_gc(py, || Ok(treepack::format::manifest::build(&bytes, &file, &builder)))?;
    let Ok(parsed) = parsed else { return Ok(None) };
    // The layout rule `Reader::open` enforces.
    if !parsed.packs.iter().all(|p| layout.allows_pack(&p.path)) {
        return Ok(None);
    }
    Ok(Some(parsed.root))
}

/// Builds a whole-tree `load`'s Python objects while the manifest is parsed (see
/// [`StructBuilder`]). It takes only what needs no audit and no pack read: containers, inline
/// leaves, and custom nodes of the built-in types in `free` (datetime and the like). A record,
/// any other custom type or a stored leaf stops it, and the caller falls back to
/// audit-then-load.
struct LoadBuilder<'py, 'a> {
    dec: std::cell::RefCell<Decoder<'py>>,
    /// Objects of the stored str/bytes already read, shared as the Reader path shares them.
    stored: std::cell::RefCell<StoredLeaves>,
    free: &'a HashSet<String>,
    /// Where stored leaves are read from (local trees only), the packs, and how many distinct
    /// stored leaves are still allowed: a few (a blob shared by 10k records, one big array next
    /// to many small values) are read on the spot; more go the Reader's batched path.
    loc: Option<treepack::Location>,
    file: &'a str,
    /// The packs, once read and found to fit the layout (a single file's only pack is itself).
    packs: std::cell::RefCell<Option<Vec<treepack::format::manifest::PackInfo>>>,
    layout: treepack::Layout,
    fetches_left: std::cell::Cell<usize>,
    verify: bool,
}

/// Distinct stored leaves a one-pass load reads on the spot before it hands over to the Reader.
const ONE_PASS_FETCHES: usize = 16;

/// A one-pass load reads stored leaves on the spot only from packs holding at most this much
/// in all. Handing over to the Reader discards what was read, and the Reader reads big trees
/// in parallel batches with read-ahead: a checkpoint's first 16 arrays read one by one, then
/// again, cost a cold W1 load a quarter of its time.
const ONE_PASS_PACK_BYTES: u64 = 16 << 20;

impl LoadBuilder<'_, '_> {
    /// Read one stored leaf (verified) through a one-leaf manifest.
    fn fetch(&self, e: Entry) -> Result<Leaf, String> {
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
        let got = match reader.fetch_stored_leaves_local(&opts) {
            Some(r) => r,
            None => treepack::block_on(reader.fetch_stored_leaves_async(&opts)),
        };
        let mut got = got.map_err(|e| e.to_string())?;
        got.pop().map(|(_, l)| l).ok_or_else(|| "stored leaf not read".to_string())
    }
}

impl<'py> treepack::format::manifest::Build for LoadBuilder<'py, '_> {
    type Node = Bound<'py, PyAny>;
    const HELPER: bool = true;
    fn leaf(&self, e: Entry) -> Result<Self::Node, String> {
        self.leaf_ref(&e)
    }
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
fn load_one_pass<'py>(
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

/// Run `f` with Python's cyclic garbage collector paused. Building a tree allocates one
/// container per node and none of them can form a cycle yet, so the collections that the
/// allocation count would trigger (a full pass over all young objects every 700 containers)
/// are pure overhead; pickle and json loads pay them, we do not. The previous state is restored
/// even if `f` fails.
/// (Through the C API, not the `gc` module: a refused load must leave `sys.modules` as it was.)
fn without_gc<'py, T>(_py: Python<'py>, f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    // SAFETY: called with the GIL held (the `Python` token proves it).
    let was_enabled = unsafe { pyo3::ffi::PyGC_Disable() } == 1;
    let out = f();
    if was_enabled {
        // SAFETY: as above.
        unsafe { pyo3::ffi::PyGC_Enable() };
    }
    out
}

/// A new `LeafInfo`, not tracked by Python's cycle collector: it holds no Python objects, so
/// it can be part of no cycle, and 100k tracked leaves (with the dicts holding them) left a
/// ~40 ms collection for the caller's next allocation after `load_structure` returned.
fn leaf_info<'py>(py: Python<'py>, info: LeafInfo) -> PyResult<Bound<'py, PyAny>> {
    let obj = Bound::new(py, info)?.into_any();
    // SAFETY: a live object of a GC type (every pyclass is), untracked once; its dealloc
    // untracks again, which is allowed.
    unsafe { pyo3::ffi::PyObject_GC_UnTrack(obj.as_ptr().cast()) };
    Ok(obj)
}

/// A dict or tuple just built, untracked if `leaves_only` (its values are all `LeafInfo`s; its
/// keys are atomic or tuples of atomics), as CPython itself untracks containers of atomic
/// values: nothing reachable from it can lead back to it. A dict tracks itself again when a
/// value that could is stored in it; a tuple cannot change. Lists are left alone (CPython never
/// untracks them: they do not track themselves again).
fn untrack_if_leaves<'py>(leaves_only: bool, container: Bound<'py, PyAny>) -> Bound<'py, PyAny> {
    if leaves_only && (container.is_exact_instance_of::<PyDict>() || container.is_exact_instance_of::<PyTuple>()) {
        // SAFETY: a live container of a GC type, untracked once (see above).
        unsafe { pyo3::ffi::PyObject_GC_UnTrack(container.as_ptr().cast()) };
    }
    container
}

/// Remove leftovers of interrupted saves; returns removed paths.
#[pyfunction]
#[pyo3(signature = (path, grace_secs=3600.0, storage_options=None))]
fn gc(py: Python<'_>, path: &str, grace_secs: f64, storage_options: Options) -> PyResult<Vec<String>> {
    let loc = location(path, storage_options)?;
    let r = py.detach(|| treepack::gc(loc, std::time::Duration::from_secs_f64(grace_secs.max(0.0)))).map_err(py_err)?;
    Ok(r.removed)
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(prepare, m)?)?;
    m.add_class::<Prepared>()?;
    m.add_function(wrap_pyfunction!(gc, m)?)?;
    m.add_function(wrap_pyfunction!(structure_one_pass, m)?)?;
    m.add_function(wrap_pyfunction!(load_one_pass, m)?)?;
    m.add_class::<Reader>()?;
    m.add_class::<BytesOwner>()?;
    m.add_class::<LeafInfo>()?;
    m.add_function(wrap_pyfunction!(_outline_builds, m)?)?;
    m.add("TreepackError", m.py().get_type::<TreepackError>())?;
    m.add("CorruptError", m.py().get_type::<CorruptError>())?;
    m.add("FormatError", m.py().get_type::<FormatError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
