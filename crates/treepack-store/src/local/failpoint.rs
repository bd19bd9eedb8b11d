//! Crash-test failpoints, compiled only with the `failpoints` feature (the crash tests turn it
//! on; release builds do not have it).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Crash-test failpoint: when `TREEPACK_FAILPOINT_ABORT_BEFORE_PUT=N` is set, the process aborts
/// (like a SIGKILL: no cleanup, no unwinding) just before its N-th storage write (1-based). The
/// crash tests sweep N over every write of a save to prove each intermediate state is safe.
pub(crate) fn before_put() {
    static LIMIT: OnceLock<Option<u64>> = OnceLock::new();
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let limit =
        LIMIT.get_or_init(|| std::env::var("TREEPACK_FAILPOINT_ABORT_BEFORE_PUT").ok().and_then(|v| v.parse().ok()));
    if let Some(n) = *limit {
        if COUNT.fetch_add(1, Ordering::SeqCst) + 1 >= n {
            std::process::abort();
        }
    }
}
