//! Owners that keep Python or Rust memory alive while the other side borrows it (zero-copy arrays and bytes).

use super::*;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicPtr, Ordering};

/// A strong reference to a Python object that may be dropped on any thread, without ever taking
/// a lock (design decision 101).
///
/// treepack's worker threads (rayon, the I/O pool, background drops) release the arrays and
/// `bytes` a save borrowed. A `Py<T>` dropped without the GIL goes to pyo3's pending-decref pool,
/// which a global mutex guards: a `fork()` while a worker holds it leaves the child's copy locked
/// forever, and the child hangs in its first treepack call. A `Held` dropped with the GIL releases
/// its reference at once; without it, it pushes the pointer onto a lock-free stack (one atomic
/// compare-and-swap, so a fork never sees it half-done), emptied by [`release_deferred`] at
/// treepack's entry points.
pub(crate) struct Held(NonNull<pyo3::ffi::PyObject>);

// SAFETY: the pointer is a strong reference; it is only dereferenced (bound, decref'd) with the GIL.
unsafe impl Send for Held {}
unsafe impl Sync for Held {}

impl Held {
    pub(crate) fn new<T>(obj: Py<T>) -> Held {
        // SAFETY: `into_ptr` hands over a strong, non-null reference.
        Held(unsafe { NonNull::new_unchecked(obj.into_ptr()) })
    }

    pub(crate) fn bind<'py>(&self, py: Python<'py>) -> Bound<'py, PyAny> {
        // SAFETY: the reference is alive while `self` is; the GIL is held (`py`).
        unsafe { Bound::from_borrowed_ptr(py, self.0.as_ptr()) }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if attached() {
            // SAFETY: a strong reference, released once, by a thread that holds the GIL.
            unsafe { pyo3::ffi::Py_DECREF(self.0.as_ptr()) };
        } else {
            defer(self.0);
        }
    }
}

/// `Python::detach` that then releases what the detached work let go (as pyo3 does for its own
/// pool when it re-attaches). clippy's `disallowed-methods` (clippy.toml) keeps the crate on it.
pub(crate) trait DetachReleasing {
    fn detach_releasing<T, F>(self, f: F) -> T
    where
        F: pyo3::marker::Ungil + FnOnce() -> T,
        T: pyo3::marker::Ungil;
}

impl DetachReleasing for Python<'_> {
    #[allow(clippy::disallowed_methods)]
    fn detach_releasing<T, F>(self, f: F) -> T
    where
        F: pyo3::marker::Ungil + FnOnce() -> T,
        T: pyo3::marker::Ungil,
    {
        let r = self.detach(f);
        release_deferred(self);
        r
    }
}

/// Whether this thread holds the GIL, asked from any thread without taking it: the current thread
/// state is this thread's own. Before 3.12 the current thread state is one value for the whole
/// process (that of whichever thread holds the GIL), so it must be compared with this thread's;
/// `PyGILState_Check` is not used because it answers yes on every thread once a subinterpreter
/// exists. Wrong only towards "no" (a deferral), never towards a decref without the GIL.
fn attached() -> bool {
    // SAFETY: both read thread-local or runtime state and may be called without the GIL.
    let current = unsafe { pyo3::ffi::compat::PyThreadState_GetUnchecked() };
    !current.is_null() && current == unsafe { pyo3::ffi::PyGILState_GetThisThreadState() }
}

struct Deferred {
    obj: NonNull<pyo3::ffi::PyObject>,
    next: *mut Deferred,
}

/// References dropped without the GIL (a Treiber stack; emptied whole, so there is no ABA).
static DEFERRED: AtomicPtr<Deferred> = AtomicPtr::new(std::ptr::null_mut());

/// How many references were ever deferred (tests: a thread without the GIL must always defer).
pub(crate) static DEFERRED_COUNT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn defer(obj: NonNull<pyo3::ffi::PyObject>) {
    DEFERRED_COUNT.fetch_add(1, Ordering::Relaxed);
    let node = Box::into_raw(Box::new(Deferred { obj, next: std::ptr::null_mut() }));
    let mut head = DEFERRED.load(Ordering::Relaxed);
    loop {
        // SAFETY: `node` is ours until the exchange below publishes it.
        unsafe { (*node).next = head };
        match DEFERRED.compare_exchange_weak(head, node, Ordering::Release, Ordering::Relaxed) {
            Ok(_) => return,
            Err(now) => head = now,
        }
    }
}

/// Release the references worker threads dropped without the GIL; returns how many. Called at
/// treepack's entry points. A release may run Python code (`__del__`) that calls treepack again:
/// the list is taken whole first, so that call finds its own.
pub(crate) fn release_deferred(_py: Python<'_>) -> usize {
    let mut p = DEFERRED.swap(std::ptr::null_mut(), Ordering::Acquire);
    let mut n = 0;
    while !p.is_null() {
        // SAFETY: every node was made by `Box::into_raw` in `defer` and is reachable only from
        // the list just taken.
        let node = unsafe { Box::from_raw(p) };
        p = node.next;
        // SAFETY: a strong reference, released once, with the GIL (`_py`).
        unsafe { pyo3::ffi::Py_DECREF(node.obj.as_ptr()) };
        n += 1;
    }
    n
}

/// Keeps a numpy array alive while its memory is borrowed as `Bytes` (zero-copy saves).
pub(crate) struct NumpyOwner {
    pub(crate) ptr: *const u8,
    pub(crate) len: usize,
    pub(crate) _obj: Held,
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
pub(crate) enum Memory {
    /// A buffer only this array uses (kept as `BytesMut`: a leaf read around the page cache
    /// starts inside its allocation, and turning it into a `Vec` would move every byte).
    Owned(bytes::BytesMut),
    Shared(Bytes),
}

#[pyclass(frozen)]
pub(crate) struct BytesOwner(#[allow(dead_code)] pub(crate) Memory);

/// Keeps a Python `bytes` object alive while its (immutable) buffer is borrowed as `Bytes`.
pub(crate) struct PyBytesOwner(#[allow(dead_code)] pub(crate) Held, pub(crate) *const u8, pub(crate) usize);
// SAFETY: `bytes` objects never change after creation and `.0` keeps this one alive (and is
// released from any thread, see `Held`).
unsafe impl Send for PyBytesOwner {}
unsafe impl Sync for PyBytesOwner {}
impl AsRef<[u8]> for PyBytesOwner {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: pointer and length of the live object's buffer, read once under the GIL.
        unsafe { std::slice::from_raw_parts(self.1, self.2) }
    }
}
