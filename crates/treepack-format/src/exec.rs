//! The parallelism the format may use, passed in by its caller (docs/design.md, decision 74).
//!
//! The format starts no thread and keeps no pool. Three of its jobs go faster on more cores:
//! hashing a big buffer, parsing the items of a big container, and parsing a big manifest on a
//! helper thread while the calling thread builds from it. They ask the [`Exec`] installed once
//! per process ([`install`]; the `treepack` engine installs its per-process pools the first time
//! it runs). With none installed, the format runs on the calling thread alone: [`parallel`]
//! returns `None` (its caller does the work sequentially), [`threads`] is 1 and
//! [`with_helper`] finds no helper.

use std::sync::atomic::{AtomicPtr, Ordering};

/// Where the format's parallel work runs. Implementations must work in a child process made by
/// `fork()` (the format may be called there as in its parent).
pub trait Exec: Sync {
    /// Run `f` to completion so that rayon's parallel iterators inside it run on this
    /// executor's pool (e.g. through `rayon::ThreadPool::install`), or inline when the calling
    /// thread already is one of a pool's threads.
    fn parallel(&self, f: &mut (dyn FnMut() + Send));

    /// How many threads [`Exec::parallel`] uses (the core count). Work split for a helper
    /// thread is only worth it with at least two.
    fn threads(&self) -> usize;

    /// Run `helper` on a thread lent to this call alone while `main` runs on the calling
    /// thread; return once both are done. `helper` must start at once (`main` may wait for what
    /// it sends). Returns `false`, having run neither, when no helper thread is free.
    fn run_with_helper(&self, helper: &mut (dyn FnMut() + Send), main: &mut dyn FnMut()) -> bool;
}

/// The installed executor: null, or a leaked `Box<&'static dyn Exec>` never freed. An atomic
/// pointer, not a lock: a child forked while a parent's thread installed can never wait on it.
static EXEC: AtomicPtr<&'static dyn Exec> = AtomicPtr::new(std::ptr::null_mut());

/// Install `exec` for this process (the first install wins). Returns whether it was installed;
/// `false` when another executor already was.
pub fn install(exec: &'static dyn Exec) -> bool {
    let fresh = Box::into_raw(Box::new(exec));
    match EXEC.compare_exchange(std::ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => true,
        Err(_) => {
            // SAFETY: `fresh` was never shared.
            drop(unsafe { Box::from_raw(fresh) });
            false
        }
    }
}

/// The installed executor, if any.
pub fn installed() -> Option<&'static dyn Exec> {
    // SAFETY: a non-null pointer was made by `Box::into_raw` in `install` and is never freed.
    unsafe { EXEC.load(Ordering::Acquire).as_ref() }.copied()
}

/// Run `f` (which may use rayon's parallel iterators) on the installed executor's pool.
/// `None`, with `f` not run, when no executor is installed: the caller then does the work on
/// this thread without rayon (whose global pool the format never starts).
pub fn parallel<R: Send>(f: impl FnOnce() -> R + Send) -> Option<R> {
    let exec = installed()?;
    let mut f = Some(f);
    let mut out = None;
    exec.parallel(&mut || {
        if let Some(f) = f.take() {
            out = Some(f());
        }
    });
    out
}

/// How many threads [`parallel`] work may use: the installed executor's, 1 with none.
pub fn threads() -> usize {
    installed().map_or(1, |e| e.threads())
}

/// Run `helper` on a helper thread while `main` runs on this one (see
/// [`Exec::run_with_helper`]). `None`, with neither run, when no executor is installed or its
/// helper is busy.
pub fn with_helper<R>(helper: impl FnOnce() + Send, main: impl FnOnce() -> R) -> Option<R> {
    let exec = installed()?;
    let (mut helper, mut main, mut out) = (Some(helper), Some(main), None);
    let ran = exec.run_with_helper(
        &mut || {
            if let Some(h) = helper.take() {
                h();
            }
        },
        &mut || {
            if let Some(m) = main.take() {
                out = Some(m());
            }
        },
    );
    if ran {
        out
    } else {
        None
    }
}

/// An executor for this crate's own tests, so that they take the parallel paths: a small pool,
/// and a helper thread started for each helped parse.
#[cfg(test)]
pub(crate) mod testing {
    use super::Exec;

    struct TestThreads {
        pool: rayon::ThreadPool,
    }

    impl Exec for TestThreads {
        fn parallel(&self, f: &mut (dyn FnMut() + Send)) {
            self.pool.install(f)
        }
        fn threads(&self) -> usize {
            self.pool.current_num_threads()
        }
        fn run_with_helper(&self, helper: &mut (dyn FnMut() + Send), main: &mut dyn FnMut()) -> bool {
            std::thread::scope(|s| {
                s.spawn(helper);
                main();
            });
            true
        }
    }

    /// Install the test executor (once; later calls do nothing).
    pub(crate) fn install() {
        static EXEC: std::sync::OnceLock<TestThreads> = std::sync::OnceLock::new();
        let e = EXEC.get_or_init(|| TestThreads {
            pool: rayon::ThreadPoolBuilder::new().num_threads(4).build().expect("the tests' pool starts"),
        });
        super::install(e);
    }
}
