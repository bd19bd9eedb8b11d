//! Big read buffers with their pages mapped in at allocation ("prefaulted").
//!
//! A load writes every byte of each leaf's buffer once, right after allocating it. The kernel
//! then maps the buffer's fresh pages one fault at a time as the read copies into them; on the
//! virtual machines this library is measured on, that first touch costs ~3.7 µs per 4 KiB page
//! (more than the copy), while mapping the same pages up front with `mmap(MAP_POPULATE)` costs
//! ~1.9 µs per page: a 256 MiB read into a fresh buffer took 240 ms the first way and 166 ms
//! the second (bench/RESULTS.md, session 11).
//!
//! Allocation goes through Rust's global allocator, so this is a wrapper for it:
//! [`Prefaulting`] passes every allocation to the allocator it wraps, except big ones made
//! inside [`prefaulted`] (which the read path uses around the one allocation whose bytes it
//! is about to write in full); those get their own populated mapping. Binaries and extension
//! modules opt in by installing the wrapper (`#[global_allocator]`); without it, [`prefaulted`]
//! changes nothing. Only Linux populates; elsewhere the wrapper only passes through.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;

/// Allocations at least this big made inside [`prefaulted`] get a populated mapping. Smaller
/// ones gain little (a mapping costs two system calls) and go to the wrapped allocator.
pub const MIN_BYTES: usize = 1 << 20;

thread_local! {
    static WANTED: Cell<bool> = const { Cell::new(false) };
}

/// Run `f` (which should make one big allocation whose every byte is written next) with
/// prefaulting asked for on this thread. Nests; a no-op where [`Prefaulting`] is not the global
/// allocator.
pub fn prefaulted<T>(f: impl FnOnce() -> T) -> T {
    /// Puts the previous request back however `f` ends (a panic included).
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            WANTED.with(|w| w.set(self.0));
        }
    }
    let _restore = Restore(WANTED.with(|w| w.replace(true)));
    f()
}

/// A global allocator that gives big allocations made inside [`prefaulted`] a mapping of their
/// own with every page already present, and passes everything else to `A`.
///
/// ```ignore
/// #[global_allocator]
/// static GLOBAL: treepack::prefault::Prefaulting<mimalloc::MiMalloc> =
///     treepack::prefault::Prefaulting(mimalloc::MiMalloc);
/// ```
pub struct Prefaulting<A>(pub A);

#[cfg(target_os = "linux")]
mod mapped {
    //! The populated mappings, and a fixed table of their addresses: `dealloc` is told only a
    //! pointer and a layout, and a big layout may also have come from the wrapped allocator.
    use std::sync::atomic::{AtomicUsize, Ordering};

    const SLOTS: usize = 4096;
    pub(super) static LIVE: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];

    /// A populated, private, anonymous mapping of `len` bytes, registered; `None` if the
    /// kernel refuses or the table is full (the caller then asks the wrapped allocator).
    pub(super) fn map(len: usize) -> Option<*mut u8> {
        // SAFETY: a fresh anonymous mapping; no existing memory is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        for slot in &LIVE {
            if slot.compare_exchange(0, p as usize, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                return Some(p.cast());
            }
        }
        // SAFETY: the mapping made above, never handed out.
        unsafe { libc::munmap(p, len) };
        None
    }

    /// Unmap `p` if it is one of ours (and say so); otherwise leave it to the caller.
    pub(super) fn unmap(p: *mut u8, len: usize) -> bool {
        let addr = p as usize;
        for slot in &LIVE {
            if slot.load(Ordering::Acquire) == addr
                && slot.compare_exchange(addr, 0, Ordering::AcqRel, Ordering::Relaxed).is_ok()
            {
                // SAFETY: `p` is the start of a live mapping of `len` bytes made by `map` (the
                // layout the allocation was made with), now dropped from the table.
                unsafe { libc::munmap(p.cast(), len) };
                return true;
            }
        }
        false
    }
}

#[cfg(not(target_os = "linux"))]
mod mapped {
    pub(super) fn map(_len: usize) -> Option<*mut u8> {
        None
    }
    pub(super) fn unmap(_p: *mut u8, _len: usize) -> bool {
        false
    }
}

/// Whether an allocation of this layout, made now on this thread, should be prefaulted. A
/// mapping is page-aligned, which covers every alignment up to 4096.
fn wanted(l: Layout) -> bool {
    l.size() >= MIN_BYTES && l.align() <= 4096 && WANTED.with(|w| w.get())
}

/// Whether this layout could be one of our mappings (only big ones are ever looked up).
fn maybe_mapped(l: Layout) -> bool {
    cfg!(target_os = "linux") && l.size() >= MIN_BYTES && l.align() <= 4096
}

// SAFETY: every pointer handed out is either the wrapped allocator's (and goes back to it) or a
// fresh mapping of at least `layout.size()` bytes, page-aligned, that `dealloc` unmaps.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Prefaulting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if wanted(layout) {
            if let Some(p) = mapped::map(layout.size()) {
                return p;
            }
        }
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { self.0.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if wanted(layout) {
            // Anonymous mappings start zeroed.
            if let Some(p) = mapped::map(layout.size()) {
                return p;
            }
        }
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { self.0.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if maybe_mapped(layout) && mapped::unmap(ptr, layout.size()) {
            return;
        }
        // SAFETY: not one of ours, so the wrapped allocator made it with this layout.
        unsafe { self.0.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !maybe_mapped(layout) {
            // SAFETY: small, so the wrapped allocator's; forwarded with the caller's guarantees.
            return unsafe { self.0.realloc(ptr, layout, new_size) };
        }
        // Possibly ours (read buffers are never resized, so this is rare): move it by hand.
        // SAFETY: `new_size` with the old alignment is a valid layout (the caller guarantees it).
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        // SAFETY: a non-zero size (the caller guarantees it).
        let new = unsafe { self.alloc(new_layout) };
        if !new.is_null() {
            // SAFETY: both blocks are live and distinct, each at least this long.
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
        }
        new
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wrapper over the system allocator, called directly (tests cannot swap the global
    /// allocator): prefaulted blocks are usable, zeroed, resizable and freed; others pass through.
    #[test]
    fn prefaulted_blocks_work_like_any_other() {
        let a = Prefaulting(std::alloc::System);
        let big = Layout::from_size_align(3 * MIN_BYTES + 123, 64).unwrap();
        unsafe {
            let p = prefaulted(|| a.alloc_zeroed(big));
            assert!(!p.is_null());
            assert!(std::slice::from_raw_parts(p, big.size()).iter().all(|&b| b == 0));
            std::ptr::write_bytes(p, 7, big.size());
            #[cfg(target_os = "linux")]
            assert!(mapped_here(p), "a prefaulted block is not a mapping of its own");
            // Grow, then shrink below the threshold: the bytes move along.
            let q = a.realloc(p, big, big.size() * 2);
            assert_eq!(*q.add(big.size() - 1), 7);
            let l2 = Layout::from_size_align(big.size() * 2, 64).unwrap();
            let r = a.realloc(q, l2, 100);
            assert_eq!(*r.add(99), 7);
            a.dealloc(r, Layout::from_size_align(100, 64).unwrap());
            // Outside `prefaulted`, a big block is the wrapped allocator's.
            let s = a.alloc(big);
            #[cfg(target_os = "linux")]
            assert!(!mapped_here(s));
            a.dealloc(s, big);
        }
        assert!(!WANTED.with(|w| w.get()), "prefaulted() left the request set");
    }

    #[cfg(target_os = "linux")]
    fn mapped_here(p: *mut u8) -> bool {
        use std::sync::atomic::Ordering;
        mapped::LIVE.iter().any(|s| s.load(Ordering::Relaxed) == p as usize)
    }
}
