//! Page-aligned buffers kept between writes: the sealed files of encrypted trees (crypt.rs) and
//! the staging buffers of direct writes (local/direct_write.rs).
//!
//! Why kept: a fresh buffer costs the kernel's zeroing of its pages, about as much as filling
//! it, and on the VMs these saves run on, memory the guest has not touched lately costs several
//! times more the first time (bench/RESULTS.md, "Encrypted trees" and "W14"). Anonymous mappings
//! of their own, page-aligned (what `O_DIRECT` needs of memory), without the huge pages the
//! extension's allocator asks for big buffers: their bytes are written once, and faulting huge
//! pages in (compacting memory full of page cache) held a fresh process's 1 GiB save up for
//! seconds.

use crate::{Error, Result};
use std::sync::Mutex;

/// At most this many bytes of buffers are kept, each at most [`KEEP_BUFFER_BYTES`] (a
/// directory's encrypted packs, a direct write's staging runs; a big single file's sealed copy
/// is unmapped).
const KEEP_TOTAL_BYTES: usize = 160 << 20;
const KEEP_BUFFER_BYTES: usize = 80 << 20;

static BUFFERS: Mutex<Vec<memmap2::MmapMut>> = Mutex::new(Vec::new());

/// A page-aligned buffer of at least `len` bytes (of any content), kept or fresh. `what` names
/// it in an out-of-memory error.
pub(crate) fn take(len: usize, what: &str) -> Result<memmap2::MmapMut> {
    let kept = {
        let mut pool = lock(&BUFFERS);
        let best = pool.iter().enumerate().filter(|(_, b)| b.len() >= len).min_by_key(|(_, b)| b.len());
        best.map(|(i, _)| i).map(|i| pool.swap_remove(i))
    };
    match kept {
        Some(b) => Ok(b),
        None => memmap2::MmapMut::map_anon(len.max(1))
            .map_err(|_| Error::OutOfMemory { key: what.into(), bytes: len as u64 }),
    }
}

/// Hand a buffer back for a later [`take`] (or unmap it, past the limits).
pub(crate) fn give(m: memmap2::MmapMut) {
    if m.len() <= KEEP_BUFFER_BYTES {
        let mut pool = lock(&BUFFERS);
        if pool.iter().map(|b| b.len()).sum::<usize>() + m.len() <= KEEP_TOTAL_BYTES {
            pool.push(m);
        }
    }
}

/// The first `len` bytes of a buffer, as the owner of a `Bytes`; the buffer goes back to the
/// pool when the last `Bytes` of it is dropped.
pub(crate) struct Pooled(Option<memmap2::MmapMut>, usize);

impl Pooled {
    pub(crate) fn new(m: memmap2::MmapMut, len: usize) -> Pooled {
        let len = len.min(m.len());
        Pooled(Some(m), len)
    }
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        self.0.as_ref().map_or(&[], |m| &m[..self.1])
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if let Some(m) = self.0.take() {
            give(m);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
