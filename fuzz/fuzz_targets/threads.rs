//! Shared by the fuzz targets that exercise the format's parallel parses: the threads they ask
//! for (the engine installs its pools; these targets link the format alone).

use treepack_format::exec::Exec;

/// A small pool, and one helper thread lent to the streamed parse, kept between inputs.
struct Threads {
    pool: rayon::ThreadPool,
    helper: rayon::ThreadPool,
}

impl Exec for Threads {
    fn parallel(&self, f: &mut (dyn FnMut() + Send)) {
        self.pool.install(f)
    }
    fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }
    fn run_with_helper(&self, helper: &mut (dyn FnMut() + Send), main: &mut dyn FnMut()) -> bool {
        self.helper.in_place_scope(|s| {
            s.spawn(move |_| helper());
            main();
        });
        true
    }
}

/// Install [`Threads`] as the format's executor (once).
pub fn install() {
    static THREADS: std::sync::OnceLock<Threads> = std::sync::OnceLock::new();
    if treepack_format::exec::installed().is_none() {
        let pool = |n| rayon::ThreadPoolBuilder::new().num_threads(n).build().expect("a fuzz pool starts");
        treepack_format::exec::install(THREADS.get_or_init(|| Threads { pool: pool(2), helper: pool(1) }));
    }
}
