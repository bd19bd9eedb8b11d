//! Profiling aid: how much heap one manifest decode leaves live, its peak, and how many
//! allocations it makes (the parse of a 100k-leaf manifest is allocation-bound, see
//! bench/RESULTS.md). `cargo run --release --example mem_decode -- path/treepack.json`
use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
struct Counting;
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static COUNT: AtomicUsize = AtomicUsize::new(0);
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let n = LIVE.fetch_add(l.size(), Relaxed) + l.size();
        PEAK.fetch_max(n, Relaxed);
        COUNT.fetch_add(1, Relaxed);
        unsafe { mimalloc::MiMalloc.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Relaxed);
        unsafe { mimalloc::MiMalloc.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        let n = LIVE.fetch_add(new, Relaxed) + new;
        LIVE.fetch_sub(l.size(), Relaxed);
        PEAK.fetch_max(n, Relaxed);
        COUNT.fetch_add(1, Relaxed);
        unsafe { mimalloc::MiMalloc.realloc(p, l, new) }
    }
}
#[global_allocator]
static GLOBAL: Counting = Counting;
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: mem_decode path/treepack.json");
        std::process::exit(2);
    };
    let bytes = std::fs::read(&path)?;
    let (l0, c0) = (LIVE.load(Relaxed), COUNT.load(Relaxed));
    PEAK.store(l0, Relaxed);
    let m = treepack::format::manifest::decode(&bytes, &path)?;
    println!(
        "manifest {} bytes: live +{} bytes, peak +{}, {} allocations",
        bytes.len(),
        LIVE.load(Relaxed) - l0,
        PEAK.load(Relaxed) - l0,
        COUNT.load(Relaxed) - c0
    );
    drop(m);
    Ok(())
}
