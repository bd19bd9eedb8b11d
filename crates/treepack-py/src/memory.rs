//! Owners that keep Python or Rust memory alive while the other side borrows it (zero-copy arrays and bytes).

use super::*;

/// Keeps a numpy array alive while its memory is borrowed as `Bytes` (zero-copy saves).
pub(crate) struct NumpyOwner {
    pub(crate) ptr: *const u8,
    pub(crate) len: usize,
    pub(crate) _obj: Py<PyAny>,
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
pub(crate) struct PyBytesOwner(#[allow(dead_code)] pub(crate) Py<PyBytes>, pub(crate) *const u8, pub(crate) usize);
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
