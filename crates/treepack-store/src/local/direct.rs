//! Reading big local ranges from the page cache when they are cached, else straight from the
//! device into the caller's buffer (`O_DIRECT`).
//!
//! Why: a cold buffered read moves every byte twice (device -> page cache -> buffer) and the
//! kernel's copy runs on the reading threads, competing with hash verification for the same
//! cores. Reading around the cache lands the bytes once, by DMA, and a cold read of big ranges
//! is faster for it (bench/RESULTS.md, "Measurements cited by code comments"). A warm load
//! must not pay a trip to the device, so a range goes direct only when the kernel says
//! (`cachestat`) that less than half of it is cached.
//!
//! Everything here is an optimisation with a plain fallback: no `/proc`, a filesystem without
//! `O_DIRECT`, a kernel without `cachestat` or an unaligned device all end in an ordinary
//! positioned read of the remaining bytes.

use bytes::Bytes;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// The alignment direct I/O needs of offsets, lengths and memory (the largest logical block
/// size in common use; 512-byte devices accept it too).
const ALIGN: usize = 4096;

/// Read exactly `len` bytes of `f` at `offset` into a fresh buffer (see the module docs). The
/// bytes start at a 4096-aligned boundary plus `offset % 4096` inside their allocation, so the
/// returned `Bytes` is a slice of a uniquely owned `Vec` (convertible to `BytesMut` without a
/// copy), and whether any of them came straight from the device.
///
/// # Errors
/// `UnexpectedEof` when the file ends before `offset + len`, `OutOfMemory` when the buffer
/// cannot be allocated, other I/O errors as the kernel reports them.
pub(crate) fn read_at(f: &File, len: usize, offset: u64) -> io::Result<(Bytes, bool)> {
    let lead = (offset % ALIGN as u64) as usize;
    let span = (lead + len).div_ceil(ALIGN) * ALIGN;
    let mut buf: Vec<u8> = Vec::new();
    buf.try_reserve_exact(span + ALIGN)
        .map_err(|_| io::Error::new(io::ErrorKind::OutOfMemory, format!("cannot allocate {len} bytes")))?;
    let base = buf.as_ptr().align_offset(ALIGN);
    if base + span > buf.capacity() {
        // align_offset may decline to compute: no direct read then.
        return finish(f, buf, 0, 0, len, offset).map(|b| (b, false));
    }
    let start = base + lead;
    // Mostly cached (or unknown): the page cache serves it.
    if cached_share(f, offset, len).is_none_or(|c| c >= 0.5) {
        return finish(f, buf, start, 0, len, offset).map(|b| (b, false));
    }
    let ptr = buf.as_mut_ptr();
    let mut done = 0usize;
    if let Some(d) = open_direct(f) {
        let mut pos = 0usize; // relative to `base`, at file offset `offset - lead + pos`
        while pos < lead + len {
            let at = offset - lead as u64 + pos as u64;
            // SAFETY: [base + pos, base + span) lies inside buf's capacity; `base + pos`, `at`
            // and `span - pos` are 4096-aligned.
            let n = unsafe { pread(&d, ptr.add(base + pos), span - pos, at) };
            #[cfg(test)]
            if matches!(n, Ok(n) if n > 0) {
                tests::DIRECT_READS.with(|c| c.set(c.get() + 1));
            }
            match n {
                Ok(n) if n > 0 && n % ALIGN == 0 => pos += n,
                // A short read at the end of the file: what it brought counts.
                Ok(n) => {
                    pos += n;
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // Not possible for this file or device (EINVAL): finish the plain way.
                Err(_) => break,
            }
        }
        done = pos.saturating_sub(lead).min(len);
    }
    finish(f, buf, start, done, len, offset).map(|b| (b, done > 0))
}

/// Read bytes `done..len` of the range the plain way into `buf` (whose data starts at index
/// `start`; the first `done` bytes are there already), and hand the buffer over.
fn finish(f: &File, mut buf: Vec<u8>, start: usize, done: usize, len: usize, offset: u64) -> io::Result<Bytes> {
    super::read::pread_into_spare(f, &mut buf, start + done, len - done, offset + done as u64)?;
    // SAFETY: the bytes before `start` are zeroed here; [start, start + len) was written.
    unsafe {
        std::ptr::write_bytes(buf.as_mut_ptr(), 0, start);
        buf.set_len(start + len);
    }
    let b = Bytes::from(buf);
    Ok(if start == 0 { b } else { b.slice(start..start + len) })
}

/// What share of the range's pages the page cache holds, without reading anything (reads,
/// even `RWF_NOWAIT` ones, start the kernel's read-ahead: the bytes would come in twice).
/// `cachestat` (Linux 6.5+); `None` where it is missing.
fn cached_share(f: &File, offset: u64, len: usize) -> Option<f64> {
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    // Syscalls added since Linux 5.1 have one number on every architecture.
    const SYS_CACHESTAT: libc::c_long = 451;
    let range = Range { off: offset, len: len as u64 };
    let mut st = Stat::default();
    let fd = libc::c_uint::try_from(f.as_raw_fd()).ok()?;
    // SAFETY: both pointers are to live, correctly laid out structs for the duration of the call.
    let r = unsafe { libc::syscall(SYS_CACHESTAT, fd, &range as *const Range, &mut st as *mut Stat, 0u32) };
    if r != 0 {
        return None;
    }
    let pages = (len as u64).div_ceil(page_size()).max(1);
    Some(st.nr_cache as f64 / pages as f64)
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
}

/// The same open file again, with `O_DIRECT`: through `/proc/self/fd`, so it is the very inode
/// already open (a path renamed or replaced since cannot redirect the read).
fn open_direct(f: &File) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(format!("/proc/self/fd/{}", f.as_raw_fd()))
        .ok()
}

fn off_t(at: u64) -> io::Result<libc::off_t> {
    libc::off_t::try_from(at).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))
}

/// # Safety
/// `dst` must be valid for writes of `len` bytes.
unsafe fn pread(f: &File, dst: *mut u8, len: usize, at: u64) -> io::Result<usize> {
    let n = unsafe { libc::pread(f.as_raw_fd(), dst.cast(), len, off_t(at)?) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::DIRECT_MIN_BYTES;
    use std::cell::Cell;
    use std::io::Write;

    thread_local! {
        /// Direct reads that brought bytes, on this thread.
        pub static DIRECT_READS: Cell<usize> = const { Cell::new(0) };
    }

    /// A file on the disk the tests build on (not a tmpfs /tmp, where nothing is uncached).
    fn file_of(n: usize) -> (tempfile::TempDir, File, Vec<u8>) {
        let dir = tempfile::tempdir_in(concat!(env!("CARGO_MANIFEST_DIR"), "/../../target")).unwrap();
        let p = dir.path().join("f");
        let data: Vec<u8> = (0..n).map(|i| (i * 7 + i / 4096) as u8).collect();
        std::fs::File::create(&p).unwrap().write_all(&data).unwrap();
        (dir, File::open(&p).unwrap(), data)
    }

    #[test]
    fn reads_equal_the_file_at_any_alignment() {
        let (_d, f, data) = file_of(3 * DIRECT_MIN_BYTES + 1234);
        for (off, len) in [
            (0, DIRECT_MIN_BYTES),
            (64, DIRECT_MIN_BYTES + 4096),
            (4095, 2 * DIRECT_MIN_BYTES),
            (100, 3 * DIRECT_MIN_BYTES + 1134),
        ] {
            let (b, _) = read_at(&f, len, off as u64).unwrap();
            assert_eq!(&b[..], &data[off..off + len], "offset {off}, length {len}");
            assert_eq!(b.as_ptr() as usize % ALIGN, off % ALIGN, "data starts at the file offset's alignment");
        }
    }

    #[test]
    fn uncached_bytes_come_from_the_device_and_equal_the_file() {
        let (_d, f, data) = file_of(2 * DIRECT_MIN_BYTES + 77);
        f.sync_all().unwrap();
        // Evict the file's clean pages, so RWF_NOWAIT finds nothing and the direct path runs.
        // SAFETY: an advisory call on an open descriptor.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        let before = DIRECT_READS.with(Cell::get);
        let known = cached_share(&f, 77, 2 * DIRECT_MIN_BYTES);
        let (b, direct) = read_at(&f, 2 * DIRECT_MIN_BYTES, 77).unwrap();
        assert_eq!(&b[..], &data[77..77 + 2 * DIRECT_MIN_BYTES]);
        // (Where the kernel can tell what is cached and the filesystem takes O_DIRECT.)
        if known.is_some() && open_direct(&f).is_some() {
            assert!(known.is_some_and(|c| c < 0.5), "evicted, yet {known:?} cached");
            assert!(DIRECT_READS.with(Cell::get) > before, "uncached bytes were read around the cache");
            assert!(direct);
        }
        // Up to the very end of the file (the direct read comes back short there).
        let (b, _) = read_at(&f, DIRECT_MIN_BYTES + 77, DIRECT_MIN_BYTES as u64).unwrap();
        assert_eq!(&b[..], &data[DIRECT_MIN_BYTES..]);
    }

    #[test]
    fn cached_bytes_are_read_from_the_cache() {
        let (_d, f, data) = file_of(2 * DIRECT_MIN_BYTES);
        let mut all = Vec::new();
        std::io::Read::read_to_end(&mut &f, &mut all).unwrap();
        let before = DIRECT_READS.with(Cell::get);
        let (b, direct) = read_at(&f, DIRECT_MIN_BYTES, 4096).unwrap();
        assert_eq!(&b[..], &data[4096..4096 + DIRECT_MIN_BYTES]);
        if cached_share(&f, 4096, DIRECT_MIN_BYTES).is_some() {
            assert_eq!(DIRECT_READS.with(Cell::get), before, "a cached range never goes to the device");
            assert!(!direct);
        }
    }

    #[test]
    fn a_range_past_the_end_is_an_eof_error() {
        let (_d, f, _) = file_of(DIRECT_MIN_BYTES + 10);
        // SAFETY: as above.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        let e = read_at(&f, DIRECT_MIN_BYTES, 11).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        let e = read_at(&f, DIRECT_MIN_BYTES, 1 << 30).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn the_buffer_converts_to_a_mutable_one_without_a_copy() {
        let (_d, f, _) = file_of(DIRECT_MIN_BYTES + 200);
        let (b, _) = read_at(&f, DIRECT_MIN_BYTES, 192).unwrap();
        let p = b.as_ptr();
        let m = b.try_into_mut().expect("uniquely owned");
        assert_eq!(m.as_ptr(), p);
    }
}
