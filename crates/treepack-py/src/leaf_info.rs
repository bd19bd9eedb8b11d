//! `LeafInfo`: what `load_structure` puts at each leaf (a handle into a shared table for big manifests).

use super::*;

/// What `load_structure` puts at each leaf: its own fields, or (from the structure-only read
/// of a big manifest) a row of a table shared by a block of leaves, which keeps each object
/// small and builds nothing but the object itself on the thread that holds the interpreter.
#[pyclass(frozen, eq, module = "treepack")]
pub(crate) struct LeafInfo(LeafRepr);

pub(crate) enum LeafRepr {
    Own(Box<OwnLeaf>),
    /// A row that exists (checked when the object is made).
    Row(Arc<LeafTable>, u32),
}

pub(crate) struct OwnLeaf {
    pub(crate) path: String,
    pub(crate) kind: Cow<'static, str>,
    pub(crate) dtype: Option<String>,
    pub(crate) shape: Option<Vec<u64>>,
    pub(crate) nbytes: u64,
    pub(crate) inline: bool,
    pub(crate) target: Option<String>,
}

/// The fields of a `LeafInfo`, whichever way it holds them.
#[derive(PartialEq)]
pub(crate) struct LeafFields<'a> {
    pub(crate) path: &'a str,
    pub(crate) kind: &'a str,
    pub(crate) dtype: Option<Cow<'a, str>>,
    pub(crate) shape: Option<&'a [u64]>,
    pub(crate) nbytes: u64,
    pub(crate) inline: bool,
    pub(crate) target: Option<&'a str>,
}

impl PartialEq for LeafInfo {
    fn eq(&self, other: &Self) -> bool {
        self.fields() == other.fields()
    }
}

impl LeafInfo {
    /// Row `i` of `table`, if there is one.
    pub(crate) fn row(table: &Arc<LeafTable>, i: u32) -> Option<LeafInfo> {
        if i as usize >= table.len() {
            return None;
        }
        Some(LeafInfo(LeafRepr::Row(table.clone(), i)))
    }

    pub(crate) fn fields(&self) -> LeafFields<'_> {
        match &self.0 {
            LeafRepr::Own(o) => LeafFields {
                path: &o.path,
                kind: &o.kind,
                dtype: o.dtype.as_deref().map(Cow::Borrowed),
                shape: o.shape.as_deref(),
                nbytes: o.nbytes,
                inline: o.inline,
                target: o.target.as_deref(),
            },
            LeafRepr::Row(t, i) => match t.get(*i as usize) {
                Some(v) => LeafFields {
                    path: v.path,
                    kind: v.kind,
                    dtype: v.dtype.map(|d| Cow::Owned(dtype_text(d))),
                    shape: v.shape,
                    nbytes: v.nbytes,
                    inline: v.inline,
                    target: v.target,
                },
                // Never: rows are checked when the object is made.
                None => LeafFields {
                    path: "",
                    kind: "none",
                    dtype: None,
                    shape: None,
                    nbytes: 0,
                    inline: true,
                    target: None,
                },
            },
        }
    }
}

#[pymethods]
impl LeafInfo {
    #[new]
    #[pyo3(signature = (path, kind, dtype=None, shape=None, nbytes=0, inline=true, target=None))]
    pub(crate) fn new(
        path: String,
        kind: String,
        dtype: Option<String>,
        shape: Option<Vec<u64>>,
        nbytes: u64,
        inline: bool,
        target: Option<String>,
    ) -> Self {
        LeafInfo(LeafRepr::Own(Box::new(OwnLeaf {
            path,
            kind: Cow::Owned(kind),
            dtype,
            shape,
            nbytes,
            inline,
            target,
        })))
    }
    /// The leaf's key path.
    #[getter]
    pub(crate) fn path(&self) -> &str {
        self.fields().path
    }
    /// none, bool, int, float, complex, str, bytes or array.
    #[getter]
    pub(crate) fn kind(&self) -> &str {
        self.fields().kind
    }
    /// The array's dtype name (None for non-array leaves).
    #[getter]
    pub(crate) fn dtype(&self) -> Option<String> {
        self.fields().dtype.map(Cow::into_owned)
    }
    /// Array shape as a tuple (None for non-array leaves).
    #[getter]
    pub(crate) fn shape<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        self.fields().shape.map(|s| PyTuple::new(py, s.iter().copied())).transpose()
    }
    /// For a `ref` (another place of a shared object): the key path of the place that holds
    /// the object. None for other leaves.
    #[getter]
    pub(crate) fn target(&self) -> Option<&str> {
        self.fields().target
    }
    /// Bytes of the value (UTF-8 bytes for strings; a `ref`'s shared object id).
    #[getter]
    pub(crate) fn nbytes(&self) -> u64 {
        self.fields().nbytes
    }
    /// Held in the manifest itself (no pack read needed).
    #[getter]
    pub(crate) fn inline(&self) -> bool {
        self.fields().inline
    }
    /// Python's own reprs of the fields, so the text evaluates back to an equal `LeafInfo`.
    pub(crate) fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let repr = |o: Option<Bound<'_, PyAny>>| -> PyResult<String> {
            Ok(match o {
                Some(o) => o.repr()?.to_string(),
                None => "None".to_string(),
            })
        };
        let text = |s: &str| Some(PyString::new(py, s).into_any());
        let f = self.fields();
        // Only refs have a target: other leaves' reprs are as they were.
        let target = match f.target {
            Some(t) => format!(", target={}", repr(text(t))?),
            None => String::new(),
        };
        Ok(format!(
            "LeafInfo(path={}, kind={}, dtype={}, shape={}, nbytes={}, inline={}{target})",
            repr(text(f.path))?,
            repr(text(f.kind))?,
            repr(f.dtype.as_deref().and_then(text))?,
            repr(self.shape(py)?.map(Bound::into_any))?,
            f.nbytes,
            if f.inline { "True" } else { "False" }
        ))
    }
}

/// A new `LeafInfo`, not tracked by Python's cycle collector: it holds no Python objects, so
/// it can be part of no cycle, and a big structure of tracked leaves (with the dicts holding
/// them) would leave a full collection to the caller's next allocation after
/// `load_structure` returned.
pub(crate) fn leaf_info<'py>(py: Python<'py>, info: LeafInfo) -> PyResult<Bound<'py, PyAny>> {
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
pub(crate) fn untrack_if_leaves<'py>(leaves_only: bool, container: Bound<'py, PyAny>) -> Bound<'py, PyAny> {
    if leaves_only && (container.is_exact_instance_of::<PyDict>() || container.is_exact_instance_of::<PyTuple>()) {
        // SAFETY: a live container of a GC type, untracked once (see above).
        unsafe { pyo3::ffi::PyObject_GC_UnTrack(container.as_ptr().cast()) };
    }
    container
}
