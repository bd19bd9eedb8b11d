//! Local files: positioned reads into fresh buffers, straight from the device when the bytes are
//! not cached (`direct`), and path normalisation.

use super::beneath::{io_error, Target};
use crate::{Error, IoStats, Result};
use bytes::Bytes;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

#[cfg(target_os = "linux")]
use super::direct;

/// Resolve `.` and `..` lexically (the path may not exist yet, so no canonicalisation).
pub(super) fn normalize_local(p: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c.as_os_str()),
        }
    }
    out
}

/// Open a pack file of a local tree, beneath its location (store/beneath.rs); a missing one
/// means the tree is incomplete.
pub(super) fn open_pack(t: &Target, location: &str, file: &str) -> Result<std::fs::File> {
    t.open_read().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            Error::missing_part(location, file)
        } else {
            io_error(t.path(), e)
        }
    })
}

pub(super) fn read_file_ranges(
    f: &std::fs::File,
    p: &Path,
    ranges: &[Range<u64>],
    stats: &IoStats,
    file: &str,
    mode: ReadMode,
) -> Result<Vec<Bytes>> {
    use rayon::prelude::*;
    let read_one = |r: &Range<u64>| {
        let len = usize::try_from(r.end - r.start).map_err(|_| Error::limit("range", u64::MAX, "too large"))?;
        let io_err = |e: std::io::Error| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => Error::OutOfBounds {
                file: file.to_string(),
                key: String::new(),
                reason: format!("bytes {}..{} lie past the end of the file (truncated?)", r.start, r.end),
            },
            std::io::ErrorKind::OutOfMemory => Error::OutOfMemory { key: file.to_string(), bytes: len as u64 },
            _ => Error::Io { path: p.to_path_buf(), source: e },
        };
        #[cfg(target_os = "linux")]
        if mode == ReadMode::CachedOrDirect && len >= DIRECT_MIN_BYTES {
            let (b, direct) = direct::read_at(f, len, r.start).map_err(io_err)?;
            stats.read(len as u64);
            if direct {
                stats.bytes_read_direct.fetch_add(len as u64, Ordering::Relaxed);
                DIRECT_HERE.with(|c| c.set(c.get() + len as u64));
            }
            return Ok(b);
        }
        #[cfg(not(target_os = "linux"))]
        let _ = mode;
        let mut buf = Vec::new();
        buf.try_reserve_exact(len).map_err(|_| Error::OutOfMemory { key: file.to_string(), bytes: len as u64 })?;
        read_exact_at_into(f, &mut buf, len, r.start).map_err(io_err)?;
        stats.read(len as u64);
        Ok(Bytes::from(buf))
    };
    // One range (a manifest, a small leaf) is read right here: no pool to wake. More go on the
    // pool the caller installed (the engine's compute pool), or one after another without one.
    if ranges.len() == 1 {
        return ranges.iter().map(read_one).collect();
    }
    treepack_format::exec::parallel(|| ranges.par_iter().map(read_one).collect())
        .unwrap_or_else(|| ranges.iter().map(read_one).collect())
}

/// Ranges shorter than this are read through the page cache even in
/// [`ReadMode::CachedOrDirect`]: the kernel's read-ahead serves small reads better, and the
/// alignment slack of a direct read would be a large share of them.
pub const DIRECT_MIN_BYTES: usize = 1 << 20;

thread_local! {
    static DIRECT_HERE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Bytes this thread has read around the page cache so far: tells a reader whether the range
/// it just read came from the device (its bytes are in no CPU cache) or from the page cache
/// (they were just copied, so hashing them at once finds them in the CPU cache).
pub fn direct_bytes_on_this_thread() -> u64 {
    DIRECT_HERE.with(|c| c.get())
}

/// How a blocking local read treats the page cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadMode {
    /// Through the page cache (small reads, and reads the kernel was told to read ahead).
    Buffered,
    /// Big ranges (1 MiB and more) straight from the device into the buffer when less than
    /// half of the range is cached (`O_DIRECT` and `cachestat` on Linux; elsewhere, or where
    /// either is missing, the same as `Buffered`). For
    /// whole loads, where each byte is read once and a second copy in the cache only costs.
    CachedOrDirect,
}

/// Read exactly `len` bytes at `offset` into the empty `buf` (capacity at least `len`). On Unix
/// the bytes land in the spare capacity directly: zero-filling first was a third pass over
/// every byte of a big load (after the kernel's page clearing, before its copy).
fn read_exact_at_into(f: &std::fs::File, buf: &mut Vec<u8>, len: usize, offset: u64) -> std::io::Result<()> {
    debug_assert!(buf.is_empty() && buf.capacity() >= len);
    #[cfg(unix)]
    {
        pread_into_spare(f, buf, 0, len, offset)?;
        // SAFETY: the first `len` bytes were written.
        unsafe { buf.set_len(len) };
        Ok(())
    }
    #[cfg(not(unix))]
    {
        use std::os::windows::fs::FileExt;
        buf.resize(len, 0);
        let mut done = 0;
        while done < len {
            match f.seek_read(&mut buf[done..], offset + done as u64)? {
                0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                n => done += n,
            }
        }
        Ok(())
    }
}

/// Write exactly `len` bytes of `f` at `offset` into `buf`'s memory at index `at`, which may lie
/// beyond `buf.len()` (spare capacity; the caller sets the length). `UnexpectedEof` if the file
/// ends first.
#[cfg(unix)]
pub(super) fn pread_into_spare(
    f: &std::fs::File,
    buf: &mut Vec<u8>,
    at: usize,
    len: usize,
    offset: u64,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    assert!(at + len <= buf.capacity(), "a read past the buffer's capacity");
    let ptr = buf.as_mut_ptr();
    let mut done = 0usize;
    while done < len {
        let pos = libc::off_t::try_from(offset + done as u64)
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "offset too large"))?;
        // SAFETY: [at + done, at + len) lies inside buf's allocation (asserted above); pread
        // writes at most `len - done` bytes there and returns how many it wrote.
        let n = unsafe { libc::pread(f.as_raw_fd(), ptr.add(at + done).cast(), len - done, pos) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        done += n as usize;
    }
    Ok(())
}
