//! The copies a background save takes of its arrays (`save(..., blocking=False)`,
//! `CheckpointManager.save`): the caller waits only for these, so they are made once, at
//! memory speed, into buffers kept from the save before.
//!
//! A walk of the tree reserves a buffer for each array and notes the copy to make
//! ([`Pending`]); the copies are made once the tree's last walk is done
//! (`Prepared.snapshot`), on several threads: a tree walked twice (tensors sharing a storage
//! are only known after a first walk; text met again restarts it) copies its bytes once. A
//! buffer whose save is written goes back to a pool, by length, for the next save of the same
//! arrays (a training loop's checkpoints): a fresh buffer is mapped and faulted in page by
//! page, a kept one is only written. The pool holds at most the bytes of the largest snapshot
//! taken, and `release()` empties it.

use bytes::Bytes;
use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::memory::NumpyOwner;

/// Arrays smaller than this are copied as they are met: a pooled buffer and a deferred copy
/// cost more than the copy.
pub(crate) const DEFERRED_MIN: usize = 64 << 10;

struct Pool {
    free: BTreeMap<usize, Vec<Box<[u8]>>>,
    held: usize,
    /// The most bytes kept: the largest snapshot taken so far.
    cap: usize,
}

static POOL: Mutex<Pool> = Mutex::new(Pool { free: BTreeMap::new(), held: 0, cap: 0 });

/// A buffer of the pool's (or a fresh one) that a save's `Bytes` own; it goes back to the pool
/// when the save is done with it.
struct Buffer {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is written once, by `Pending::run`, before any reader is given its bytes
// (the save starts after the snapshot), and only read afterwards.
unsafe impl Send for Buffer {}
unsafe impl Sync for Buffer {}

impl AsRef<[u8]> for Buffer {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `ptr`/`len` are the boxed slice `take` leaked, alive until `drop`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: the boxed slice `take` leaked; nothing else holds it once its Bytes are gone.
        let b = unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.len)) };
        // `try_lock`: a child forked while another thread held the lock must not wait for it.
        if let Ok(mut pool) = POOL.try_lock() {
            if pool.held + b.len() <= pool.cap {
                pool.held += b.len();
                pool.free.entry(b.len()).or_default().push(b);
            }
        }
    }
}

fn take(len: usize) -> Buffer {
    let kept = POOL.try_lock().ok().and_then(|mut pool| {
        let b = pool.free.get_mut(&len)?.pop()?;
        pool.held -= len;
        Some(b)
    });
    // A fresh buffer need not be zeroed (it is written whole before it is read), but zeroed
    // pages are what the allocator's own mappings give for free, faulted in by the copy.
    let b = kept.unwrap_or_else(|| vec![0u8; len].into_boxed_slice());
    let len = b.len();
    Buffer { ptr: Box::into_raw(b).cast::<u8>(), len }
}

/// A copy to make: an array's bytes into the buffer its snapshot's `Bytes` own.
pub(crate) struct Pending {
    src: NumpyOwner,
    dst: *mut u8,
    /// Keeps `dst` alive (its `Bytes` may be dropped before the copy: a walk thrown away).
    _keep: Bytes,
}

// SAFETY: `dst` is the buffer `_keep` owns, written only by `run` (see `Buffer`); `src` is
// read-only (`NumpyOwner`). `run` hands each `Pending` to one thread only (disjoint groups),
// so no two threads write one `dst`.
unsafe impl Send for Pending {}
unsafe impl Sync for Pending {}

impl Pending {
    fn len(&self) -> usize {
        self.src.len
    }

    fn run(&self) {
        let src = self.src.as_ref();
        // SAFETY: `dst` holds `src.len()` bytes (reserved for this array), no reader sees them
        // until the snapshot is done, and the two buffers are distinct allocations.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.dst, src.len()) };
    }
}

/// The bytes of `src` for a background save: copied now when small, else a buffer reserved
/// for the copy `Pending` makes later.
pub(crate) fn reserve(src: NumpyOwner) -> (Bytes, Option<Pending>) {
    if src.len < DEFERRED_MIN {
        return (Bytes::copy_from_slice(src.as_ref()), None);
    }
    let buf = take(src.len);
    let dst = buf.ptr;
    let bytes = Bytes::from_owner(buf);
    (bytes.clone(), Some(Pending { src, dst, _keep: bytes }))
}

/// Make every copy, on up to four threads (each its share of the bytes), with the GIL held by
/// the caller: no Python thread changes an array meanwhile. Returns the bytes copied.
pub(crate) fn run(pending: Vec<Pending>) -> usize {
    let total: usize = pending.iter().map(Pending::len).sum();
    if let Ok(mut pool) = POOL.try_lock() {
        pool.cap = pool.cap.max(total);
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(4);
    if threads <= 1 || total < (8 << 20) {
        pending.iter().for_each(Pending::run);
        return total;
    }
    // Contiguous runs of about equal bytes; an array is never split (most are far smaller
    // than a share, and one big array alone still copies at memory speed).
    let share = total.div_ceil(threads);
    let mut groups: Vec<&[Pending]> = Vec::with_capacity(threads);
    let (mut start, mut acc) = (0, 0);
    for (i, p) in pending.iter().enumerate() {
        acc += p.len();
        if acc >= share {
            groups.push(&pending[start..=i]);
            (start, acc) = (i + 1, 0);
        }
    }
    if start < pending.len() {
        groups.push(&pending[start..]);
    }
    std::thread::scope(|s| {
        let mut groups = groups.into_iter();
        let first = groups.next();
        for g in groups {
            s.spawn(move || g.iter().for_each(Pending::run));
        }
        if let Some(g) = first {
            g.iter().for_each(Pending::run);
        }
    });
    total
}

/// Free the buffers kept for the next background save; returns their bytes.
pub(crate) fn release() -> usize {
    match POOL.lock() {
        Ok(mut pool) => {
            let held = pool.held;
            pool.free.clear();
            pool.held = 0;
            pool.cap = 0;
            held
        }
        Err(_) => 0,
    }
}
