//! The process's worker pools: the tokio runtime behind the blocking facade, the rayon pool that
//! hashes and copies, and the smaller pool that verifies while a load reads.
//!
//! Each is built per *process*, not per program: after `fork()` only the forking thread exists
//! in the child, so a pool inherited from the parent waits forever for workers that are not
//! there (a DataLoader worker, a gunicorn pre-fork or `multiprocessing` hung on its first save
//! after the parent saved: issue 23). The first use in a child builds fresh pools; the parent's
//! copies are leaked on purpose, since dropping them would wait for those missing threads.
//! rayon's *global* pool cannot be rebuilt, so the library never uses it: every parallel
//! iterator runs inside [`parallel`].
//!
//! The format's parallel work (big hashes and parses) runs here too: [`Pools`] is the
//! [`Exec`](crate::format::exec::Exec) the engine installs for it ([`install_exec`]) the first
//! time it starts a pool or waits for work, which every engine operation does before the
//! format needs threads.

use std::future::Future;
use std::sync::atomic::{AtomicPtr, Ordering};

/// A value built lazily once per process (see the module docs). Lock-free, so a lock held by a
/// parent thread at the moment of the fork cannot block the child.
struct PerProcess<T> {
    cur: AtomicPtr<(u32, T)>,
}

impl<T> PerProcess<T> {
    const fn new() -> Self {
        PerProcess { cur: AtomicPtr::new(std::ptr::null_mut()) }
    }

    fn get(&'static self, init: impl FnOnce() -> T) -> &'static T {
        let pid = std::process::id();
        let seen = self.cur.load(Ordering::Acquire);
        // SAFETY: a non-null pointer was made by `Box::into_raw` below and is never freed.
        if let Some((owner, v)) = unsafe { seen.as_ref() } {
            if *owner == pid {
                return v;
            }
        }
        let fresh = Box::into_raw(Box::new((pid, init())));
        match self.cur.compare_exchange(seen, fresh, Ordering::AcqRel, Ordering::Acquire) {
            // SAFETY: `fresh` is now owned by `cur`, which never frees it. The value it replaced
            // (the parent's, if any) is leaked on purpose.
            Ok(_) => unsafe { &(*fresh).1 },
            Err(won) => {
                // Another thread of this process built one first: use it, drop ours.
                // SAFETY: `fresh` was never shared; `won` is non-null (it differs from `seen`,
                // and only non-null pointers are stored) and never freed.
                drop(unsafe { Box::from_raw(fresh) });
                unsafe { &(*won).1 }
            }
        }
    }
}

thread_local! {
    /// Whether this thread does background work (see [`in_background`]).
    static BACKGROUND: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the calling thread does background work: its pools are the background ones.
pub(crate) fn is_background() -> bool {
    BACKGROUND.with(|b| b.get())
}

/// Give this thread the lowest CPU priority: Linux's idle scheduling class (`SCHED_IDLE`: it
/// runs only on a core no other thread wants, where nice 19 still takes a share of every busy
/// core from a training loop's threads), and nice 19 where that class is refused. For good: an
/// unprivileged process may not raise a thread's priority again, so only threads that do
/// nothing else are lowered.
fn lower_this_thread() {
    #[cfg(target_os = "linux")]
    // SAFETY: changes only the calling thread's nice value and scheduling class (pid 0: the
    // calling thread); failure (a sandbox forbidding it) leaves the priority as it was, which
    // is still correct, only less polite.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19);
        let param = libc::sched_param { sched_priority: 0 };
        libc::sched_setscheduler(0, libc::SCHED_IDLE, &param);
    }
}

fn mark_background_thread() {
    lower_this_thread();
    BACKGROUND.with(|b| b.set(true));
}

/// Run `f` as background work: a save the caller does not wait for (`save(blocking=False)`, a
/// checkpoint manager's), which should take only the CPU the program leaves idle. The calling
/// thread is lowered to the lowest priority for good (call it only from a thread kept for such
/// work), and every pool `f` uses — hashing, the I/O runtime and its blocking threads, the
/// threads a save starts — is a second set whose threads are lowered too, so the program's own
/// threads (a training loop) run first while the save takes what is left.
pub fn in_background<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            BACKGROUND.with(|b| b.set(self.0));
        }
    }
    let _restore = Restore(is_background());
    mark_background_thread();
    f()
}

/// Run `f` as background work if `background` (a thread started by background work, which
/// inherits its priority but not its pools).
pub(crate) fn in_background_if<R>(background: bool, f: impl FnOnce() -> R) -> R {
    if background {
        in_background(f)
    } else {
        f()
    }
}

fn tokio_runtime() -> &'static tokio::runtime::Runtime {
    static RT: PerProcess<tokio::runtime::Runtime> = PerProcess::new();
    static BACKGROUND_RT: PerProcess<tokio::runtime::Runtime> = PerProcess::new();
    let background = is_background();
    (if background { &BACKGROUND_RT } else { &RT }).get(|| {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(threads().clamp(2, 8)).enable_all();
        if background {
            b.thread_name("treepack-bg-io").on_thread_start(mark_background_thread);
        } else {
            b.thread_name("treepack-io");
        }
        b.build().unwrap_or_else(|e| panic!("treepack: cannot start the I/O runtime: {e}"))
    })
}

/// Run a future to completion from synchronous code. Safe to call from inside another tokio
/// runtime (it then blocks on a helper thread instead of panicking).
pub fn block_on<F: Future + Send>(fut: F) -> F::Output
where
    F::Output: Send,
{
    install_exec();
    if tokio::runtime::Handle::try_current().is_ok() {
        let background = is_background();
        std::thread::scope(|s| {
            match s.spawn(|| in_background_if(background, || tokio_runtime().block_on(fut))).join() {
                Ok(v) => v,
                Err(p) => std::panic::resume_unwind(p),
            }
        })
    } else {
        tokio_runtime().block_on(fut)
    }
}

/// Run blocking work (a file read, a parse) from async code: on tokio's blocking pool when the
/// caller runs on a runtime, right here otherwise. So each read is written once, as async code,
/// and a local tree's future can be driven on the calling thread with no runtime at all
/// ([`block_on_here`]); object_store's `maybe_spawn_blocking` does the same.
pub(crate) async fn maybe_spawn_blocking<T: Send + 'static>(
    f: impl FnOnce() -> crate::Result<T> + Send + 'static,
) -> crate::Result<T> {
    install_exec();
    match tokio::runtime::Handle::try_current() {
        Ok(h) => h.spawn_blocking(f).await.map_err(|e| crate::Error::internal(format!("blocking task failed: {e}")))?,
        Err(_) => f(),
    }
}

/// Drive a future on this thread, with no runtime: for work whose only waits are the blocking
/// reads of [`maybe_spawn_blocking`] (a local tree). Starting the runtime's threads and I/O
/// driver would cost a process's first small load more than the load itself.
///
/// Not to be called from a future this thread is already driving here.
pub(crate) fn block_on_here<F: Future>(fut: F) -> F::Output {
    install_exec();
    futures::executor::block_on(fut)
}

/// The pool for hashing and copying: one thread per core. `None` if no thread could be started
/// (the work then runs on the calling thread).
fn compute_pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: PerProcess<Option<rayon::ThreadPool>> = PerProcess::new();
    static BACKGROUND_POOL: PerProcess<Option<rayon::ThreadPool>> = PerProcess::new();
    if is_background() {
        return BACKGROUND_POOL
            .get(|| {
                rayon::ThreadPoolBuilder::new()
                    .thread_name(|i| format!("treepack-bg-cpu-{i}"))
                    .start_handler(|_| mark_background_thread())
                    .build()
                    .ok()
            })
            .as_ref();
    }
    POOL.get(|| rayon::ThreadPoolBuilder::new().thread_name(|i| format!("treepack-cpu-{i}")).build().ok()).as_ref()
}

/// How many threads the compute pool has (the core count), without starting it. Asked once
/// per process: the answer comes from reading cgroup files, and a manifest parse asks for
/// every big container.
pub(crate) fn threads() -> usize {
    install_exec();
    static CORES: PerProcess<usize> = PerProcess::new();
    *CORES.get(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Run `f` (which may use rayon's parallel iterators) on this process's compute pool, or inline
/// when already on a rayon thread (one of ours, or a pool the caller chose by `install`).
pub(crate) fn parallel<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    install_exec();
    match compute_pool() {
        Some(pool) if rayon::current_thread_index().is_none() => pool.install(f),
        _ => f(),
    }
}

/// The threads that verify the leaves a whole load read from the device: half the cores, at
/// least one. One core hashes BLAKE3 faster than the devices it waits on deliver, and hashing
/// on every core starves the reads themselves, so a cold load of big leaves is slower with the
/// whole pool verifying than with half of it (bench/RESULTS.md, "Measurements cited by code
/// comments"). `None` if no thread could be started (the calling thread and the compute pool
/// then verify).
pub(crate) fn verify_pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: PerProcess<Option<rayon::ThreadPool>> = PerProcess::new();
    POOL.get(|| {
        let cores = threads();
        rayon::ThreadPoolBuilder::new()
            .num_threads((cores / 2).max(1))
            .thread_name(|i| format!("treepack-verify-{i}"))
            .build()
            .ok()
    })
    .as_ref()
}

/// The thread that helps manifest parses whose builder must stay on the calling thread (the
/// format's `exec::with_helper`, through `Exec::run_with_helper` below): one per process, kept
/// (a thread started per big container costs more than its help is worth on a manifest of
/// many mid-sized containers), and lent to one parse at a time. `None` while another parse
/// holds it, or if it could not be started: the caller then parses alone.
pub(crate) fn parse_helper() -> Option<HelperLease> {
    struct Helper {
        pool: Option<rayon::ThreadPool>,
        busy: std::sync::atomic::AtomicBool,
    }
    static HELPER: PerProcess<Helper> = PerProcess::new();
    let h = HELPER.get(|| Helper {
        pool: rayon::ThreadPoolBuilder::new().num_threads(1).thread_name(|_| "treepack-parse".into()).build().ok(),
        busy: false.into(),
    });
    let pool = h.pool.as_ref()?;
    h.busy.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire).ok()?;
    Some(HelperLease { pool, busy: &h.busy })
}

/// The parse helper, lent until dropped (see [`parse_helper`]).
pub(crate) struct HelperLease {
    pool: &'static rayon::ThreadPool,
    busy: &'static std::sync::atomic::AtomicBool,
}

impl HelperLease {
    /// Run `helper` on the helper thread while `main` runs on this one; returns when both are
    /// done. The helper thread is this parse's alone, so `helper` starts at once and may wait
    /// for work that `main` hands it (it must stop once `main` returns).
    pub(crate) fn run<'s, R>(&self, helper: impl FnOnce() + Send + 's, main: impl FnOnce() -> R) -> R {
        self.pool.in_place_scope(|s| {
            s.spawn(move |_| helper());
            main()
        })
    }
}

impl Drop for HelperLease {
    fn drop(&mut self) {
        self.busy.store(false, Ordering::Release);
    }
}

/// The engine's pools as the format's executor: its parallel work on the compute pool, its
/// parse helper lent as [`parse_helper`] lends it. Every call goes through the per-process
/// values above, so a forked child gets its own pools.
struct Pools;

impl crate::format::exec::Exec for Pools {
    fn parallel(&self, f: &mut (dyn FnMut() + Send)) {
        parallel(f)
    }
    fn threads(&self) -> usize {
        threads()
    }
    fn run_with_helper(&self, helper: &mut (dyn FnMut() + Send), main: &mut dyn FnMut()) -> bool {
        match parse_helper() {
            Some(lease) => {
                lease.run(helper, main);
                true
            }
            None => false,
        }
    }
}

/// Install [`Pools`] as the format's executor, once per process (a load and a branch after
/// that). An executor the program installed before keeps its place.
pub(crate) fn install_exec() {
    if crate::format::exec::installed().is_none() {
        crate::format::exec::install(&Pools);
    }
}

#[cfg(all(test, unix))]
mod tests {
    use rayon::prelude::*;

    /// The calling thread's nice value, plus 1000 in the idle scheduling class.
    #[cfg(target_os = "linux")]
    fn nice_of_this_thread() -> i32 {
        // SAFETY: reads the calling thread's nice value and scheduling class.
        let (nice, class) = unsafe {
            (libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t), libc::sched_getscheduler(0))
        };
        nice + if class == libc::SCHED_IDLE { 1000 } else { 0 }
    }

    /// Background work runs lowered (nice 19 in the idle class), on pools of its own; other
    /// work keeps its priority.
    #[cfg(target_os = "linux")]
    #[test]
    fn background_work_runs_at_the_lowest_priority_on_its_own_pools() {
        let base = std::thread::spawn(nice_of_this_thread).join().unwrap_or(-100);
        let (caller, pool, io, blocking, hash_thread) = std::thread::spawn(|| {
            super::in_background(|| {
                let pool = super::parallel(|| (0..4).into_par_iter().map(|_| nice_of_this_thread()).max());
                let (io, blocking) = super::block_on(async {
                    let io = tokio::spawn(async { nice_of_this_thread() }).await.unwrap_or(-100);
                    let blocking = super::maybe_spawn_blocking(|| Ok(nice_of_this_thread())).await.unwrap_or(-100);
                    (io, blocking)
                });
                let background = super::is_background();
                let hash_thread = std::thread::spawn(move || {
                    super::in_background_if(background, || super::parallel(nice_of_this_thread))
                })
                .join()
                .unwrap_or(-100);
                (nice_of_this_thread(), pool, io, blocking, hash_thread)
            })
        })
        .join()
        .expect("background thread");
        assert_eq!((caller, pool, io, blocking, hash_thread), (1019, Some(1019), 1019, 1019, 1019));
        // The foreground pools were not lowered.
        let fg = std::thread::spawn(|| super::parallel(|| (0..4).into_par_iter().map(|_| nice_of_this_thread()).max()))
            .join()
            .unwrap_or(None);
        assert_eq!(fg, Some(base));
        assert!(!std::thread::spawn(super::is_background).join().unwrap_or(true));
    }

    /// A pool used before `fork()` works in the child (it used to hang forever).
    #[test]
    fn pools_work_in_a_forked_child() {
        let sum: u64 = super::parallel(|| (0..1000u64).into_par_iter().sum());
        assert_eq!(sum, 499_500);
        assert_eq!(super::block_on(async { 7 }), 7);
        // SAFETY: the child only runs our pools, then leaves with `_exit` (no destructors).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let sum: u64 = super::parallel(|| (0..1000u64).into_par_iter().sum());
            let io = super::block_on(async { tokio::task::spawn_blocking(|| 5).await.unwrap_or(0) });
            // The format's parallel work, on the pools installed for it (the child's own).
            let format: Option<u64> = crate::format::exec::parallel(|| (0..1000u64).into_par_iter().sum());
            let ok = sum == 499_500 && io == 5 && format == Some(499_500);
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let status = super::wait_for_child(pid, "the forked child hung using the pools");
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child failed: status {status}");
    }
}

/// For tests that fork: wait for child `pid` (at most 60 s, then kill it and panic with
/// `hung`) and return its wait status.
#[cfg(all(test, unix))]
pub(crate) fn wait_for_child(pid: libc::pid_t, hung: &str) -> libc::c_int {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut status = 0;
    loop {
        // SAFETY: plain waitpid on our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return status;
        }
        if std::time::Instant::now() > deadline {
            // SAFETY: our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("{hung}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
