//! A global-allocator wrapper for the binaries (the Python extension, the CLI): the inner
//! allocator for everything but big buffers, which get a private mapping of their own, given
//! back to the system when freed. The library itself sets no global allocator.
//!
//! Why (design decisions 39 and 96): only allocations of `BIG` bytes or more take this path,
//! each mapped alone and unmapped when freed, so a load's buffers never stay in the inner
//! allocator's arenas (mimalloc's, in the binaries, on 4 KiB pages: decision 28). Such mappings
//! were advised `MADV_HUGEPAGE` (decision 39: a 4 MiB `O_DIRECT` read into 2 MiB pages leaves
//! as one request where the device takes 254 segments); measured again (decision 96), fresh
//! huge pages made loads in new processes 1.3-2.4 times slower on the benchmark VM, so that
//! advice is now opt-in: `TREEPACK_HUGE_PAGES=1`. Off Linux everything goes to the inner
//! allocator.

use std::alloc::{GlobalAlloc, Layout};

/// Allocations of at least this many bytes get a mapping of their own.
const BIG: usize = 2 << 20;
const PAGE: usize = 4096;

/// Wraps the allocator `A` (see the module docs): `static GLOBAL: BigMapped<MiMalloc> =
/// BigMapped(MiMalloc);`.
pub struct BigMapped<A>(pub A);

fn is_big(l: &Layout) -> bool {
    cfg!(target_os = "linux") && l.size() >= BIG && l.align() <= PAGE
}

fn mapped_len(size: usize) -> usize {
    size.div_ceil(PAGE) * PAGE
}

/// A fresh private anonymous mapping of `size` bytes (zeroed), or null.
#[cfg(target_os = "linux")]
fn map(size: usize) -> *mut u8 {
    let len = mapped_len(size);
    // SAFETY: a new anonymous mapping; no existing memory is touched.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return std::ptr::null_mut();
    }
    if huge_pages() {
        // SAFETY: [p, p + len) is the mapping just made. Advice only: failure changes nothing.
        unsafe { libc::madvise(p, len, libc::MADV_HUGEPAGE) };
    }
    p.cast()
}

/// Whether big mappings are advised `MADV_HUGEPAGE`: only when `TREEPACK_HUGE_PAGES=1` is set
/// (design decision 96: on the benchmark VM, fresh huge pages cost 1.3-2.4 times the time of
/// 4 KiB ones in a new process's loads). Read once, with `getenv` (which allocates nothing:
/// this runs inside the allocator).
#[cfg(target_os = "linux")]
fn huge_pages() -> bool {
    use std::sync::atomic::{AtomicU8, Ordering};
    static STATE: AtomicU8 = AtomicU8::new(0); // 0: not read yet, 1: off, 2: on
    match STATE.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            // SAFETY: a NUL-terminated name; the value, if any, is read before anything else
            // could change the environment on this thread.
            let v = unsafe { libc::getenv(c"TREEPACK_HUGE_PAGES".as_ptr()) };
            // SAFETY: getenv returns null or a NUL-terminated string.
            let on = !v.is_null() && unsafe { std::ffi::CStr::from_ptr(v) }.to_bytes() == b"1";
            STATE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
            on
        }
    }
}

#[cfg(target_os = "linux")]
fn unmap(p: *mut u8, size: usize) {
    // SAFETY: the caller passes a block `map(size)` returned.
    unsafe { libc::munmap(p.cast(), mapped_len(size)) };
}

#[cfg(target_os = "linux")]
fn remap(p: *mut u8, old: usize, new: usize) -> *mut u8 {
    // SAFETY: the caller passes a block `map(old)` returned; mremap moves or resizes it whole.
    let q = unsafe { libc::mremap(p.cast(), mapped_len(old), mapped_len(new), libc::MREMAP_MAYMOVE) };
    if q == libc::MAP_FAILED {
        std::ptr::null_mut()
    } else {
        q.cast()
    }
}

// Never called off Linux (`is_big` is false there).
#[cfg(not(target_os = "linux"))]
fn map(_: usize) -> *mut u8 {
    std::ptr::null_mut()
}
#[cfg(not(target_os = "linux"))]
fn unmap(_: *mut u8, _: usize) {}
#[cfg(not(target_os = "linux"))]
fn remap(_: *mut u8, _: usize, _: usize) -> *mut u8 {
    std::ptr::null_mut()
}

// SAFETY: big blocks come from `map` and go back through `munmap` with the length they were
// mapped with (the layout's size, which `GlobalAlloc` callers must pass back unchanged); all
// other blocks are the inner allocator's, allocated and freed by it.
unsafe impl<A: GlobalAlloc> GlobalAlloc for BigMapped<A> {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if is_big(&l) {
            map(l.size())
        } else {
            // SAFETY: forwarded with the caller's layout.
            unsafe { self.0.alloc(l) }
        }
    }

    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        if is_big(&l) {
            map(l.size()) // anonymous mappings are zeroed
        } else {
            // SAFETY: forwarded with the caller's layout.
            unsafe { self.0.alloc_zeroed(l) }
        }
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        if is_big(&l) {
            unmap(p, l.size());
        } else {
            // SAFETY: `p` is mimalloc's, with this layout.
            unsafe { self.0.dealloc(p, l) }
        }
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller guarantees `new_size` with `l.align()` is a valid layout.
        let nl = unsafe { Layout::from_size_align_unchecked(new_size, l.align()) };
        match (is_big(&l), is_big(&nl)) {
            // SAFETY: forwarded with the caller's arguments.
            (false, false) => unsafe { self.0.realloc(p, l, new_size) },
            (true, true) => remap(p, l.size(), new_size),
            _ => {
                // SAFETY: a fresh block of the new layout; the old one stays valid until freed.
                let q = unsafe { self.alloc(nl) };
                if !q.is_null() {
                    // SAFETY: both blocks hold at least min(old, new) bytes and do not overlap.
                    unsafe {
                        std::ptr::copy_nonoverlapping(p, q, l.size().min(new_size));
                        self.dealloc(p, l);
                    }
                }
                q
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::System;

    const A: BigMapped<System> = BigMapped(System);

    /// This crate's unit tests run on the wrapper too (the binaries use it over mimalloc).
    #[global_allocator]
    static TEST_ALLOC: BigMapped<System> = BigMapped(System);

    fn fill(p: *mut u8, n: usize, seed: u8) {
        for i in (0..n).step_by(4093) {
            // SAFETY: i < n, inside the block.
            unsafe { *p.add(i) = seed.wrapping_add(i as u8) };
        }
    }

    fn check(p: *const u8, n: usize, seed: u8) {
        for i in (0..n).step_by(4093) {
            // SAFETY: i < n, inside the block.
            assert_eq!(unsafe { *p.add(i) }, seed.wrapping_add(i as u8), "byte {i}");
        }
    }

    #[test]
    fn blocks_keep_their_bytes_across_every_kind_of_resize() {
        // small -> big -> bigger -> smaller big -> small -> freed: the bytes in common survive.
        let sizes = [1000, 3 << 20, 9 << 20, (2 << 20) + 5, 4000];
        let mut l = Layout::from_size_align(sizes[0], 8).unwrap();
        // SAFETY: non-zero layout; every later call passes back the current block and layout.
        unsafe {
            let mut p = A.alloc(l);
            assert!(!p.is_null());
            fill(p, l.size(), 7);
            for &n in &sizes[1..] {
                let q = A.realloc(p, l, n);
                assert!(!q.is_null(), "resize {} -> {n}", l.size());
                check(q, l.size().min(n), 7);
                l = Layout::from_size_align(n, 8).unwrap();
                fill(q, n, 7);
                p = q;
            }
            A.dealloc(p, l);
        }
    }

    /// Big mappings are not advised `MADV_HUGEPAGE` unless `TREEPACK_HUGE_PAGES=1` (decision
    /// 96): the mapping's `VmFlags` in /proc/self/smaps have no `hg`.
    #[test]
    #[cfg(target_os = "linux")]
    fn big_mappings_are_not_advised_huge_pages_by_default() {
        if std::env::var_os("TREEPACK_HUGE_PAGES").is_some() {
            return; // (the advice was asked for: nothing to check)
        }
        let l = Layout::from_size_align(6 << 20, 64).unwrap();
        // SAFETY: non-zero layout, freed with the same layout.
        unsafe {
            let p = A.alloc(l);
            assert!(!p.is_null());
            let start = p as usize;
            let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
            let mut inside = false;
            let mut flags = None;
            for line in smaps.lines() {
                if let Some((range, _)) = line.split_once(' ') {
                    if let Some((a, b)) = range.split_once('-') {
                        if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                            inside = a <= start && start < b;
                            continue;
                        }
                    }
                }
                if inside {
                    if let Some(f) = line.strip_prefix("VmFlags:") {
                        flags = Some(f.split_whitespace().map(str::to_string).collect::<Vec<_>>());
                    }
                }
            }
            A.dealloc(p, l);
            let flags = flags.expect("the big block's mapping is in /proc/self/smaps");
            assert!(!flags.iter().any(|f| f == "hg"), "advised MADV_HUGEPAGE: {flags:?}");
        }
    }

    #[test]
    fn big_zeroed_blocks_are_zero_and_page_aligned() {
        let l = Layout::from_size_align(5 << 20, 64).unwrap();
        // SAFETY: non-zero layout, freed with the same layout.
        unsafe {
            let p = A.alloc_zeroed(l);
            assert!(!p.is_null());
            if cfg!(target_os = "linux") {
                assert_eq!(p as usize % PAGE, 0);
            }
            assert!(std::slice::from_raw_parts(p, l.size()).iter().all(|&b| b == 0));
            A.dealloc(p, l);
        }
    }

    #[test]
    fn a_vec_grows_through_the_big_threshold() {
        // Through the global allocator (this test binary's is the wrapper).
        let mut v: Vec<u8> = Vec::new();
        for i in 0..(6usize << 20) {
            v.push(i as u8);
        }
        assert!(v.iter().enumerate().step_by(997).all(|(i, &b)| b == i as u8));
    }
}
