//! The blocking facade over the async core: one shared multi-threaded tokio runtime.

use std::future::Future;
use std::sync::OnceLock;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(2, 8))
            .thread_name("treepack-io")
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("treepack: cannot start the I/O runtime: {e}"))
    })
}

/// Run a future to completion from synchronous code. Safe to call from inside another tokio
/// runtime (it then blocks on a helper thread instead of panicking).
pub fn block_on<F: Future + Send>(fut: F) -> F::Output
where
    F::Output: Send,
{
    if tokio::runtime::Handle::try_current().is_ok() {
        std::thread::scope(|s| match s.spawn(|| runtime().block_on(fut)).join() {
            Ok(v) => v,
            Err(p) => std::panic::resume_unwind(p),
        })
    } else {
        runtime().block_on(fut)
    }
}
