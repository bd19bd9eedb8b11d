//! `treepack._core`: the Rust side of the Python package.
//!
//! Python trees are walked here with exact-type fast paths (None, bool, int, float, complex, str,
//! bytes, list, tuple, dict, numpy arrays and scalars); any other object is handed to a Python
//! callback (`encode_other`) that returns a record or custom node description. Loading builds
//! numpy arrays directly from the read buffers (no copy), and read-only views for mmap loads.
//! The GIL is released for all storage I/O and hashing.
//!
//! One concern per module: `errors`, `memory` (owners behind zero-copy buffers), `leaf_info`,
//! `encode` (Python -> tree; `encode_text` its text walk, `encode_shared` shared objects),
//! `decode` (tree -> Python), `datetime`, `load` (whole loads), `reader` (the `Reader` class),
//! `repo` (repositories), `results` (typed results), `structure` (`load_structure`'s builders),
//! `image` (PNG of images made in memory) and `view` (the viewer's server, notebooks' HTML).
//! They share the imports below through `use super::*`.

mod access;
mod datetime;
mod decode;
mod dtypes;
mod encode;
mod encode_refusals;
mod encode_shared;
mod encode_text;
mod errors;
mod image;
mod leaf_info;
mod load;
mod memory;
mod reader;
mod repo;
mod results;
mod signing;
mod snapshot;
mod structure;
mod view;

use bytes::Bytes;
use datetime::*;
use decode::*;
use dtypes::*;
use encode::*;
use encode_shared::share_refs;
use errors::*;
use image::encode_png;
use leaf_info::*;
use load::*;
use memory::*;
use numpy::{PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::{
    PyFileExistsError, PyFileNotFoundError, PyIOError, PyKeyError, PyOSError, PyPermissionError, PyTypeError,
    PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyComplex, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use reader::*;
use repo::*;
use results::*;
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use structure::*;
use treepack::format::manifest::outline::{Block, Event, LeafTable};
use treepack::format::manifest::{ArrayStorage, Entry};

/// The containers of the Python codec that a load builds from copies of their children and
/// can still rebuild inside themselves (a cycle through them), as pickle does: each is a dict,
/// a dict subclass or a deque whose copies of a cycle's placeholder the loader finds and
/// patches (`LoadBuilder::note_copied`). A save refuses a cycle through any other container
/// built from copies (a tuple, a namedtuple, an object array, a dict keyed by numpy scalars).
pub(crate) const PATCHED_AFTER: &[&str] = &["py.ordereddict", "py.counter", "py.defaultdict", "py.deque", "py.mapping"];
use treepack::format::model::shape_len;
use treepack::{ArrayData, DType, Int, Key, Leaf, LoadOptions, Node, SaveOptions, Tree};
use view::*;

/// mimalloc: trees of many small leaves are allocation-bound, and it builds them markedly
/// faster than glibc malloc (crates/treepack/examples/profile_small_leaves.rs; bench/RESULTS.md).
/// Big buffers (2 MiB and more) get huge-page mappings of their own (`treepack_alloc`).
#[global_allocator]
static GLOBAL: treepack_alloc::BigMapped<mimalloc::MiMalloc> = treepack_alloc::BigMapped(mimalloc::MiMalloc);

/// Storage options, with the key of an encrypted tree when one was given (access.rs).
type Options = Option<access::Access>;

/// `obj` as an exact `T`, or `None`. Not `cast_exact(..).ok()`: a failed cast builds an error
/// holding a new reference to `T`'s type object, and the save's walk tries several types per
/// value (an int after a failed str cast, a container after four failed scalar casts), each
/// failure paying for that error's reference counts.
#[inline]
pub(crate) fn exact<'a, 'py, T: pyo3::PyTypeInfo>(obj: &'a Bound<'py, PyAny>) -> Option<&'a Bound<'py, T>> {
    // SAFETY: `is_exact_instance_of` has just checked the type.
    obj.is_exact_instance_of::<T>().then(|| unsafe { obj.cast_unchecked::<T>() })
}

/// Parse a location with optional storage options (credentials, endpoint, tuning).
fn location(path: &str, storage_options: Options) -> PyResult<treepack::Location> {
    // Every call that opens a location passes here with the GIL: release what worker threads let go.
    Python::attach(release_deferred);
    let access = storage_options.unwrap_or_default();
    let opts: treepack::StorageOptions = access.options.into_iter().collect();
    let loc = treepack::Location::parse_with(path, &opts).map_err(py_err)?;
    match access.key {
        Some(key) => loc.with_encryption(key).map_err(py_err),
        None => Ok(loc),
    }
}

/// Wrap a Python callable `(done, total)` as a progress callback; its errors are reported as
/// unraisable (a broken progress bar must not fail a save).
fn progress_fn(cb: Option<Py<PyAny>>) -> Option<treepack::ProgressFn> {
    cb.map(|cb| {
        let cb = Held::new(cb);
        treepack::ProgressFn::new(move |done, total| {
            Python::attach(|py| {
                if let Err(e) = cb.bind(py).call1((done, total)) {
                    e.write_unraisable(py, None);
                }
            })
        })
    })
}

/// The (pinned) location and its manifest's unchecked bytes for a one-pass read; `None` if they
/// cannot be read (the Reader path then reports why).
fn manifest_of(
    py: Python<'_>,
    path: &str,
    storage_options: Options,
) -> PyResult<Option<(treepack::Location, Bytes, String)>> {
    let loc = location(path, storage_options)?;
    let fetched = py.detach_releasing(|| {
        let loc = loc.pin()?;
        let (bytes, file) = loc.block_on(treepack::read::manifest_bytes(&loc))?;
        Ok::<_, treepack::Error>((loc, bytes, file))
    });
    Ok(fetched.ok())
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

/// Remove leftovers of interrupted saves; returns removed paths.
#[pyfunction]
#[pyo3(signature = (path, grace_secs=3600.0, storage_options=None))]
fn gc(py: Python<'_>, path: &str, grace_secs: f64, storage_options: Options) -> PyResult<Vec<String>> {
    let loc = location(path, storage_options)?;
    let r = py
        .detach_releasing(|| treepack::gc(loc, std::time::Duration::from_secs_f64(grace_secs.max(0.0))))
        .map_err(py_err)?;
    Ok(r.removed)
}

/// What differs between two trees, as JSON text: `[{"path", "op", "old", "new", "chunks_differ",
/// "chunks"}, …]`.
#[pyfunction]
#[pyo3(signature = (a, b, storage_options=None))]
fn diff(py: Python<'_>, a: &str, b: &str, storage_options: Options) -> PyResult<String> {
    let (la, lb) = (location(a, storage_options.clone())?, location(b, storage_options)?);
    let d = py.detach_releasing(|| treepack::diff(la, lb)).map_err(py_err)?;
    Ok(serde_json::Value::Array(d.iter().map(|x| x.to_json()).collect()).to_string())
}

/// The format of what is at `path` (`treepack::convert::detect_format`, as the CLI's
/// `convert` tells it): read from a local file or folder's content when `read` (a source),
/// else named by its extension.
#[pyfunction]
#[pyo3(signature = (path, read=true))]
pub(crate) fn detect_format(path: &str, read: bool) -> &'static str {
    treepack::convert::detect_format(path, read)
}

/// Convert between treepack and safetensors (`from`/`to`: "treepack" or "safetensors"):
/// (tensors, bytes).
#[pyfunction]
#[pyo3(signature = (src, dst, from_format, to_format, separator=None, overwrite=false, storage_options=None, compression=None, durable=true, progress=None, select=None, dst_options=None))]
#[allow(clippy::too_many_arguments)]
fn convert(
    py: Python<'_>,
    src: &str,
    dst: &str,
    from_format: &str,
    to_format: &str,
    separator: Option<String>,
    overwrite: bool,
    storage_options: Options,
    compression: Option<String>,
    durable: bool,
    progress: Option<Py<PyAny>>,
    select: Option<Vec<String>>,
    dst_options: Options,
) -> PyResult<(usize, u64)> {
    use treepack::convert::{ConvertOptions, Format};
    let (f, t) =
        (Format::of_source(src, Some(from_format)).map_err(py_err)?, Format::of(dst, Some(to_format)).map_err(py_err)?);
    // The destination's own key, if any (`dst_options`); the source's key opens the source only.
    let dst_options = dst_options.or_else(|| storage_options.clone().map(|a| access::Access { key: None, ..a }));
    let (s, d) = (location(src, storage_options)?, location(dst, dst_options)?);
    let mut save = SaveOptions { overwrite, durable, progress: progress_fn(progress), ..Default::default() };
    if let Some(c) = compression {
        save.compression = treepack::save::Compression::parse(&c).map_err(py_err)?;
    }
    let opts = ConvertOptions { separator, select: select.unwrap_or_default(), save };
    let info = py.detach_releasing(|| treepack::convert::convert(&s, &d, f, t, &opts)).map_err(py_err)?;
    Ok((info.tensors, info.bytes))
}

/// The tree at `path` as one JSON transport document (docs/transport.md).
#[pyfunction]
#[pyo3(signature = (path, encoding="base85", compression=None, storage_options=None))]
fn export_json(
    py: Python<'_>,
    path: &str,
    encoding: &str,
    compression: Option<String>,
    storage_options: Options,
) -> PyResult<String> {
    use treepack::transport::{Encoding, ExportOptions};
    let encoding = Encoding::from_name(encoding).ok_or_else(|| {
        pyo3::exceptions::PyValueError::new_err(format!("unknown encoding {encoding:?}: use \"base85\" or \"base64\""))
    })?;
    let compression = compression.map(|c| treepack::save::Compression::parse(&c)).transpose().map_err(py_err)?;
    let loc = location(path, storage_options)?;
    py.detach_releasing(|| treepack::transport::export(loc, &ExportOptions { encoding, compression })).map_err(py_err)
}

/// Put a transport document's tree at `location` (a `memory://` directory) to be read there.
#[pyfunction]
fn unpack_json(py: Python<'_>, doc: &[u8], path: &str) -> PyResult<()> {
    let loc = location(path, None)?;
    py.detach_releasing(|| loc.block_on(treepack::transport::unpack_async(doc, &loc, "the JSON document")))
        .map_err(py_err)
}

/// Drop the `memory://bucket` store (a document unpacked for one load).
#[pyfunction]
fn forget_memory(bucket: &str) -> bool {
    treepack::Location::forget_memory(bucket)
}

/// The JSON Schema (2020-12) of the tree at `path`, as JSON text.
#[pyfunction]
#[pyo3(signature = (path, storage_options=None))]
fn schema(py: Python<'_>, path: &str, storage_options: Options) -> PyResult<String> {
    let loc = location(path, storage_options)?;
    py.detach_releasing(|| treepack::transport::schema(loc)).map_err(py_err)
}

/// Release the Python references treepack's threads dropped without the GIL now, and say how
/// many that was and how many were ever deferred (tests: they are otherwise released at
/// treepack's next call).
#[pyfunction]
fn _release_deferred(py: Python<'_>) -> (usize, usize) {
    let n = release_deferred(py);
    (n, memory::DEFERRED_COUNT.load(std::sync::atomic::Ordering::Relaxed))
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(few_same_hashes, m)?)?;
    m.add_function(wrap_pyfunction!(structure::key_text, m)?)?;
    m.add_function(wrap_pyfunction!(prepare, m)?)?;
    m.add_function(wrap_pyfunction!(commit_parts, m)?)?;
    m.add_function(wrap_pyfunction!(release_snapshot_buffers, m)?)?;
    m.add_function(wrap_pyfunction!(block_chunk_shape, m)?)?;
    m.add_class::<Prepared>()?;
    m.add_class::<EncodeContext>()?;
    m.add_function(wrap_pyfunction!(gc, m)?)?;
    m.add_function(wrap_pyfunction!(diff, m)?)?;
    m.add_function(wrap_pyfunction!(convert, m)?)?;
    m.add_function(wrap_pyfunction!(detect_format, m)?)?;
    m.add_function(wrap_pyfunction!(export_json, m)?)?;
    m.add_function(wrap_pyfunction!(unpack_json, m)?)?;
    m.add_function(wrap_pyfunction!(forget_memory, m)?)?;
    m.add_function(wrap_pyfunction!(schema, m)?)?;
    m.add_function(wrap_pyfunction!(numpy_dtype_desc, m)?)?;
    m.add_function(wrap_pyfunction!(numpy_dtype, m)?)?;
    m.add_function(wrap_pyfunction!(datetime_general_json, m)?)?;
    m.add_function(wrap_pyfunction!(structure_one_pass, m)?)?;
    m.add_function(wrap_pyfunction!(load_one_pass, m)?)?;
    m.add_function(wrap_pyfunction!(load_tree, m)?)?;
    m.add_function(wrap_pyfunction!(encode_png, m)?)?;
    m.add_function(wrap_pyfunction!(check_compression, m)?)?;
    signing::register(m)?;
    m.add_class::<Reader>()?;
    m.add_class::<ViewServer>()?;
    m.add_function(wrap_pyfunction!(reader_html, m)?)?;
    m.add_class::<Repository>()?;
    m.add_class::<BytesOwner>()?;
    m.add_class::<LeafInfo>()?;
    m.add_class::<SaveInfo>()?;
    m.add_class::<VerifyReport>()?;
    m.add_function(wrap_pyfunction!(_outline_builds, m)?)?;
    m.add_function(wrap_pyfunction!(_release_deferred, m)?)?;
    m.add("TreepackError", m.py().get_type::<TreepackError>())?;
    m.add("CorruptError", m.py().get_type::<CorruptError>())?;
    m.add("RootMismatchError", m.py().get_type::<RootMismatchError>())?;
    m.add("FormatError", m.py().get_type::<FormatError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
