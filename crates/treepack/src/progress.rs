//! Progress reporting for long transfers. A save or load calls the callback with the bytes moved
//! so far and the total it expects; the CLI draws a bar with it, Python passes a callable.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A progress callback: `(bytes_done, bytes_total)`. Called from I/O tasks, possibly from several
/// threads, so it must be cheap and thread-safe; `bytes_done` never decreases.
#[derive(Clone)]
pub struct ProgressFn(pub Arc<dyn Fn(u64, u64) + Send + Sync>);

impl ProgressFn {
    /// Wrap a closure taking `(bytes_done, bytes_total)`.
    pub fn new(f: impl Fn(u64, u64) + Send + Sync + 'static) -> Self {
        ProgressFn(Arc::new(f))
    }
}

impl std::fmt::Debug for ProgressFn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProgressFn(..)")
    }
}

/// Counts bytes for one operation and forwards the running total to a [`ProgressFn`].
#[derive(Debug)]
pub struct Tracker {
    cb: Option<ProgressFn>,
    done: AtomicU64,
    total: AtomicU64,
}

impl Tracker {
    /// A tracker expecting `total` bytes; reports `(0, total)` to `cb` at once.
    pub fn new(cb: Option<ProgressFn>, total: u64) -> Self {
        let t = Tracker { cb, done: AtomicU64::new(0), total: AtomicU64::new(total) };
        t.advance(0);
        t
    }

    /// Record `n` more bytes moved.
    pub fn advance(&self, n: u64) {
        let done = self.done.fetch_add(n, Ordering::Relaxed) + n;
        if let Some(cb) = &self.cb {
            let total = self.total.load(Ordering::Relaxed);
            (cb.0)(done.min(total), total);
        }
    }

    /// Replace the total once it is known exactly (a pipelined save starts from an estimate).
    pub fn set_total(&self, total: u64) {
        self.total.store(total, Ordering::Relaxed);
    }
}

/// The store reports the bytes it moves to the tracker of the operation.
impl crate::store::Progress for Tracker {
    fn advance(&self, bytes: u64) {
        Tracker::advance(self, bytes);
    }
}
