//! The extension's global allocator: mimalloc for everything but big buffers, which get a
//! private mapping of their own that may be backed by transparent huge pages.
//!
//! Why (design decision 39): a whole load reads big leaves with `O_DIRECT` straight into
//! their buffers. The device takes at most 254 memory segments per request here (virtio-blk;
//! NVMe has a similar limit), so a 4 MiB read into 4 KiB pages goes out as four ~1 MiB
//! requests; into 2 MiB pages it is one. The kernel also faults a huge page in once instead of
//! 512 times. mimalloc's own arenas stay on 4 KiB pages (decision 28: huge pages there made
//! small allocations stall now and then), so only allocations of `BIG` bytes or more take this
//! path, each mapped alone and unmapped when freed: no huge page is ever reused for small
//! objects. Where the kernel has no transparent huge pages, the `madvise` fails harmlessly and
//! the mapping is an ordinary one.

use std::alloc::{GlobalAlloc, Layout};

/// Allocations of at least this many bytes get a mapping of their own.
const BIG: usize = 2 << 20;
const PAGE: usize = 4096;

pub struct Alloc;

fn is_big(l: &Layout) -> bool {
    l.size() >= BIG && l.align() <= PAGE
}

fn mapped_len(size: usize) -> usize {
    size.div_ceil(PAGE) * PAGE
}

/// A fresh private anonymous mapping of `size` bytes (zeroed), or null.
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
    // SAFETY: [p, p + len) is the mapping just made. Advice only: failure changes nothing.
    unsafe { libc::madvise(p, len, libc::MADV_HUGEPAGE) };
    p.cast()
}

// SAFETY: big blocks come from `map` and go back through `munmap` with the length they were
// mapped with (the layout's size, which `GlobalAlloc` callers must pass back unchanged); all
// other blocks are mimalloc's, allocated and freed by mimalloc.
unsafe impl GlobalAlloc for Alloc {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if is_big(&l) {
            map(l.size())
        } else {
            // SAFETY: forwarded with the caller's layout.
            unsafe { mimalloc::MiMalloc.alloc(l) }
        }
    }

    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        if is_big(&l) {
            map(l.size()) // anonymous mappings are zeroed
        } else {
            // SAFETY: forwarded with the caller's layout.
            unsafe { mimalloc::MiMalloc.alloc_zeroed(l) }
        }
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        if is_big(&l) {
            // SAFETY: `p` was mapped by `map(l.size())`.
            unsafe { libc::munmap(p.cast(), mapped_len(l.size())) };
        } else {
            // SAFETY: `p` is mimalloc's, with this layout.
            unsafe { mimalloc::MiMalloc.dealloc(p, l) }
        }
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller guarantees `new_size` with `l.align()` is a valid layout.
        let nl = unsafe { Layout::from_size_align_unchecked(new_size, l.align()) };
        match (is_big(&l), is_big(&nl)) {
            // SAFETY: forwarded with the caller's arguments.
            (false, false) => unsafe { mimalloc::MiMalloc.realloc(p, l, new_size) },
            (true, true) => {
                // SAFETY: `p` is a mapping of `mapped_len(l.size())` bytes; mremap moves or
                // resizes it as a whole.
                let q =
                    unsafe { libc::mremap(p.cast(), mapped_len(l.size()), mapped_len(new_size), libc::MREMAP_MAYMOVE) };
                if q == libc::MAP_FAILED {
                    std::ptr::null_mut()
                } else {
                    q.cast()
                }
            }
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
