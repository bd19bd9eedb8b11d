//! Leaves (loaded values, manifest entries) and containers -> Python objects: numpy arrays
//! straight from the read buffers. The tree around them is walked by `load::LoadBuilder`.

use super::*;
use treepack::format::manifest::KeyRef;

/// How much probing a dict (or set) of keys that share Python hashes may cost (the one guard:
/// the Python decoder's sets and `py.dict` pairs come through `few_same_hashes`): the sum, over
/// its hashes, of the square of the number of its keys with that hash (the probes a dict makes
/// to insert them) may not pass `SAME_HASH_COST` times its keys plus `SAME_HASH_SLACK`. Python's
/// hashes of strings are keyed per process, but those of ints, floats and tuples of them are
/// not: a file can name thousands of keys with one hash (`i * (2**61 - 1)`), and a dict built of
/// them takes time quadratic in their number. Real keys share hashes in small groups (the float
/// powers of two, hashed modulo 2**61 - 1, fall into 61 groups): they pass.
pub(crate) const SAME_HASH_COST: u64 = 64;
pub(crate) const SAME_HASH_SLACK: u64 = 1 << 20;

/// Counts the hashes of the keys of one dict that are not strings (`check`), refusing the
/// dict once the probing they cost passes the bound above. The counts are in a std `HashMap`
/// (SipHash with a random key: the counts themselves cannot be made to collide).
#[derive(Default)]
pub(crate) struct SameHash(Option<(HashMap<isize, u64>, u64, u64)>);

impl SameHash {
    /// `key`, once its hash is counted (a ValueError once the keys cost too much).
    pub(crate) fn check<'py>(&mut self, key: Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        self.check_in(key, "a dict")
    }

    /// [`SameHash::check`] of a member of `what` (`"a set"`), which its error names.
    fn check_in<'py>(&mut self, key: Bound<'py, PyAny>, what: &str) -> PyResult<Bound<'py, PyAny>> {
        if key.is_exact_instance_of::<PyString>() {
            return Ok(key);
        }
        let h = key.hash()?;
        let (counts, keys, cost) = self.0.get_or_insert_with(|| (HashMap::new(), 0, 0));
        let n = counts.entry(h).or_insert(0);
        // (n + 1)^2 - n^2: the probes this key adds
        *cost += 2 * *n + 1;
        *n += 1;
        *keys += 1;
        if *cost > SAME_HASH_COST * *keys + SAME_HASH_SLACK {
            return Err(PyValueError::new_err(format!(
                "{what} in the file has {} members with one hash (such as {}): building it would take time \
                 quadratic in their number, so it is refused (a file made to slow the load)",
                *n,
                key.repr().map(|r| r.to_string()).unwrap_or_default().chars().take(60).collect::<String>()
            )));
        }
        Ok(key)
    }
}

/// `items` as a list, once [`SameHash`] has counted them as members of `what` (`"a set"`): the
/// guard of the sets, frozensets and `py.dict` pairs the Python decoder builds, the one the
/// extension's own dicts go through.
#[pyfunction]
pub(crate) fn few_same_hashes<'py>(items: &Bound<'py, PyAny>, what: &str) -> PyResult<Bound<'py, PyList>> {
    let py = items.py();
    let items: Vec<Bound<'py, PyAny>> = items.try_iter()?.collect::<PyResult<_>>()?;
    // Fewer than this many members cannot cost more than the slack, however they hash.
    if (items.len() as u64).saturating_mul(items.len() as u64) > SAME_HASH_SLACK {
        let mut same = SameHash::default();
        for x in &items {
            same.check_in(x.clone(), what)?;
        }
    }
    PyList::new(py, items)
}

pub(crate) struct Decoder<'py> {
    pub(crate) py: Python<'py>,
    pub(crate) decode_other: Option<Bound<'py, PyAny>>,
    pub(crate) np_dtype: Bound<'py, PyAny>,
    pub(crate) dtypes: HashMap<DType, Bound<'py, PyArrayDescr>>,
    pub(crate) readonly: bool,
    /// Python strings of short dict keys already seen. The keys come from the file: a keyed
    /// hash (aHash, seeded at random per process), so that no file can make them all collide
    /// and each lookup scan the whole cache (FxHash is unkeyed); aHash is about as fast.
    pub(crate) keys: std::cell::RefCell<HashMap<String, Bound<'py, PyAny>, ahash::RandomState>>,
    /// The keys a streamed parse numbered (`KeyRef::Interned`), by number: found by index,
    /// with no hash of their text (hashing each key into the cache above was a large share of
    /// the building thread's work in loads of many small records).
    /// Numbers belong to one parse, and a decoder serves one load's builder.
    key_ids: std::cell::RefCell<Vec<Bound<'py, PyAny>>>,
}

impl<'py> Decoder<'py> {
    /// `decode_other` rebuilds records/custom objects (None: structure only, none met);
    /// `np_dtype` maps dtype names to numpy dtypes (None: no arrays are built).
    pub(crate) fn new(
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
            key_ids: Default::default(),
        }
    }

    /// A list or tuple of built items (what the one-pass builders make of a sequence).
    pub(crate) fn sequence(&self, items: Vec<Bound<'py, PyAny>>, tuple: bool) -> PyResult<Bound<'py, PyAny>> {
        if tuple {
            PyTuple::new(self.py, items).map(Bound::into_any)
        } else {
            PyList::new(self.py, items).map(Bound::into_any)
        }
    }

    /// A dict of built values, keys through the key cache (string keys as the parser lends
    /// them: no copy).
    pub(crate) fn dict_of(&self, pairs: Vec<(KeyRef<'_>, Bound<'py, PyAny>)>) -> PyResult<Bound<'py, PyAny>> {
        let d = PyDict::new(self.py);
        let mut same = SameHash::default();
        for (k, v) in pairs {
            let k = match k {
                KeyRef::Str(s) => self.key_str(s),
                KeyRef::Interned(id, s) => self.key_id(id, s),
                KeyRef::Key(k) => same.check(self.key(k)?)?,
                KeyRef::Owned(k) => same.check(self.key(&k)?)?,
            };
            d.set_item(k, v)?;
        }
        Ok(d.into_any())
    }

    /// `(name, value)` tuples of a record's fields or a custom node's children.
    pub(crate) fn named(&self, kids: Vec<(String, Bound<'py, PyAny>)>) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        kids.into_iter().map(|(k, v)| PyTuple::new(self.py, [PyString::new(self.py, &k).into_any(), v])).collect()
    }

    pub(crate) fn dtype(&mut self, d: &DType) -> PyResult<Bound<'py, PyArrayDescr>> {
        if let Some(x) = self.dtypes.get(d) {
            return Ok(x.clone());
        }
        let x = self.np_dtype.call1((d.to_json().to_string(),))?.cast_into::<PyArrayDescr>()?;
        self.dtypes.insert(d.clone(), x.clone());
        Ok(x)
    }

    /// One numpy array per leaf, made with a single C-API call: writable over the loaded buffer
    /// (no copy when the buffer is uniquely owned), or a read-only view for mmap loads.
    /// An annotated array (a torch tensor's, format 1.3) goes on to the Python decoder's
    /// `array(ndarray, annotation JSON)`, which rebuilds the type it names; without a decoder
    /// (structure and slice reads) it stays a numpy array.
    pub(crate) fn array(&mut self, a: ArrayData) -> PyResult<Bound<'py, PyAny>> {
        let annotation = a.annotation().map(|v| v.to_string());
        let arr = self.numpy_array(a)?;
        self.annotated(arr, annotation)
    }

    /// The array an annotated leaf stands for (see [`Decoder::array`]).
    fn annotated(&self, arr: Bound<'py, PyAny>, annotation: Option<String>) -> PyResult<Bound<'py, PyAny>> {
        match (annotation, &self.decode_other) {
            (Some(ann), Some(f)) => f.call_method1("array", (arr, ann)),
            _ => Ok(arr),
        }
    }

    fn numpy_array(&mut self, a: ArrayData) -> PyResult<Bound<'py, PyAny>> {
        use numpy::npyffi::{self, PY_ARRAY_API};
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
        // SAFETY: `data` points to itemsize × prod(shape) bytes owned by `owner` (checked by
        // ArrayData::new); SetBaseObject steals the owner reference, so the memory lives exactly
        // as long as the array.
        unsafe {
            let arr = new_array(self.py, descr, &shape, data, flags)?;
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
    pub(crate) fn key_str(&self, s: &str) -> Bound<'py, PyAny> {
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

    /// A key a streamed parse numbered: made once (through the key cache), then found by its
    /// number.
    fn key_id(&self, id: u32, s: &str) -> Bound<'py, PyAny> {
        let mut ids = self.key_ids.borrow_mut();
        if let Some(k) = ids.get(id as usize) {
            return k.clone();
        }
        let k = self.key_str(s);
        if ids.len() == id as usize {
            ids.push(k.clone());
        }
        k
    }

    pub(crate) fn key(&self, k: &Key) -> PyResult<Bound<'py, PyAny>> {
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

    /// A loaded leaf value (arrays over their read buffers, no copy).
    /// Taken by value: an array's buffer, when unique, becomes the numpy array's memory.
    pub(crate) fn leaf(&mut self, l: Leaf) -> PyResult<Bound<'py, PyAny>> {
        let py = self.py;
        Ok(match l {
            Leaf::None => py.None().into_bound(py),
            Leaf::Bool(b) => PyBool::new(py, b).to_owned().into_any(),
            Leaf::Int(i) => int_py(py, &i)?,
            Leaf::Float(f) => PyFloat::new(py, f).into_any(),
            Leaf::Complex(a, b) => PyComplex::from_doubles(py, a, b).into_any(),
            Leaf::Str(s) => PyString::new(py, &s).into_any(),
            Leaf::Bytes(b) => PyBytes::new(py, &b).into_any(),
            Leaf::Array(a) => self.array(a)?,
            Leaf::Fragment(_) => return Err(PyValueError::new_err("treepack bug: a fragment in a loaded tree")),
        })
    }

    /// A record or custom node from its already-built children (`(name, value)` tuples).
    pub(crate) fn other_built(
        &mut self,
        kind: &str,
        type_name: &str,
        data: &serde_json::Value,
        pairs: Vec<Bound<'py, PyTuple>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if kind == "custom" && type_name == "py.datetime" {
            // (children, which no writer gives it, leave only the general reading)
            return if pairs.is_empty() { datetime_of(self.py, data) } else { datetime_from_general(self.py, data) };
        }
        let data_s = if data.is_null() { None } else { Some(data.to_string()) };
        let f = self.decode_other.as_ref().ok_or_else(|| PyValueError::new_err("no decoder for records"))?;
        f.call1((kind, type_name, data_s, PyList::new(self.py, pairs)?))
    }

    /// A numpy array that owns a copy of `data` (for arrays stored inline in the manifest: they
    /// are small, and one allocation inside numpy is cheaper than a separate owner object).
    pub(crate) fn small_array(&mut self, dtype: &DType, shape: &[u64], data: &[u8]) -> PyResult<Bound<'py, PyAny>> {
        use numpy::npyffi;
        let descr = self.dtype(dtype)?;
        let n = shape.iter().try_fold(descr.itemsize(), |acc, &d| acc.checked_mul(usize::try_from(d).ok()?));
        if n != Some(data.len()) {
            return Err(PyValueError::new_err(format!(
                "inline array has {} bytes, but its dtype and shape {shape:?} need {n:?}",
                data.len()
            )));
        }
        // SAFETY: with no data pointer numpy allocates a C-contiguous buffer of itemsize ×
        // prod(shape) bytes, which is `data.len()` (checked above).
        unsafe {
            let arr = new_array(self.py, descr, shape, std::ptr::null_mut(), 0)?;
            let obj = arr as *mut npyffi::PyArrayObject;
            std::ptr::copy_nonoverlapping(data.as_ptr(), (*obj).fields.data as *mut u8, data.len());
            if self.readonly {
                (*obj).fields.flags &= !npyffi::NPY_ARRAY_WRITEABLE;
            }
            Ok(Bound::from_owned_ptr(self.py, arr))
        }
    }

    /// A leaf stored inline in the manifest, straight from it (borrowed, nothing cloned).
    pub(crate) fn inline_entry(&mut self, e: &Entry) -> PyResult<Bound<'py, PyAny>> {
        use treepack::format::manifest::Stored;
        let py = self.py;
        Ok(match e {
            Entry::None => py.None().into_bound(py),
            Entry::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
            Entry::Int(i) => int_py(py, i)?,
            Entry::Float(f) => PyFloat::new(py, *f).into_any(),
            Entry::Complex(a, b) => PyComplex::from_doubles(py, *a, *b).into_any(),
            Entry::Str(Stored::Inline(s)) => PyString::new(py, s).into_any(),
            Entry::Bytes(Stored::Inline(b)) => PyBytes::new(py, b).into_any(),
            Entry::Array(a) => match &a.storage {
                ArrayStorage::Inline(d) => {
                    let arr = self.small_array(&a.dtype, &a.shape, d)?;
                    self.annotated(arr, a.annotation.as_ref().map(|v| v.to_string()))?
                }
                // An empty array has a chunk grid and no chunks (shape `[0, 5]`): nothing to read.
                ArrayStorage::Chunked { chunks, .. } if chunks.is_empty() && a.shape.contains(&0) => {
                    let arr = self.small_array(&a.dtype, &a.shape, &[])?;
                    self.annotated(arr, a.annotation.as_ref().map(|v| v.to_string()))?
                }
                ArrayStorage::Chunked { .. } => return Err(PyValueError::new_err("array data was not read")),
            },
            Entry::Str(Stored::Blob { .. }) | Entry::Bytes(Stored::Blob { .. }) => {
                return Err(PyValueError::new_err("blob was not read"))
            }
            Entry::Fragment(_) => return Err(PyValueError::new_err("treepack bug: a fragment in a read manifest")),
        })
    }
}

pub(crate) fn int_py<'py>(py: Python<'py>, i: &Int) -> PyResult<Bound<'py, PyAny>> {
    Ok(match i {
        Int::Small(v) => v.into_pyobject(py)?.into_any(),
        Int::Big(b) => b.into_pyobject(py)?.into_any(),
    })
}

pub(crate) fn dtype_text(d: &DType) -> String {
    d.name().unwrap_or_else(|| d.to_json().to_string())
}

/// A new numpy array of `descr` and `shape` over `data` (null: numpy allocates the buffer), as
/// an owned pointer. Steals the `descr` reference.
///
/// # Safety
/// A non-null `data` must point to itemsize × prod(shape) bytes that outlive the array.
unsafe fn new_array(
    py: Python<'_>,
    descr: Bound<'_, PyArrayDescr>,
    shape: &[u64],
    data: *mut u8,
    flags: std::os::raw::c_int,
) -> PyResult<*mut pyo3::ffi::PyObject> {
    use numpy::npyffi::{self, npy_intp, PY_ARRAY_API};
    let mut dims: Vec<npy_intp> = shape.iter().map(|&d| d as npy_intp).collect();
    // SAFETY: the caller's contract; NewFromDescr steals the descr reference passed.
    let arr = unsafe {
        PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            npyffi::get_type_object(py, npyffi::NpyTypes::PyArray_Type),
            descr.into_ptr() as *mut npyffi::PyArray_Descr,
            dims.len() as std::os::raw::c_int,
            dims.as_mut_ptr(),
            std::ptr::null_mut(),
            data as *mut std::os::raw::c_void,
            flags,
            std::ptr::null_mut(),
        )
    };
    if arr.is_null() {
        return Err(PyErr::fetch(py));
    }
    Ok(arr)
}
