//! Durable writes of big files straight to the device (`O_DIRECT`), around the page cache: the
//! strategy durable.rs takes for a file of at least [`MIN_BYTES`].
//!
//! Why: a buffered durable write moves every byte into freshly allocated page-cache pages, then
//! has the kernel's writeback threads send them to the device, then waits for them in `fsync`.
//! On a VM the page allocation alone can cost more than the device's time (memory the guest
//! freed lately is slow to touch again), the writeback competes with hashing for the CPU, and a
//! checkpoint of many GiB evicts everything else the page cache held. A direct write copies each
//! byte once into one of a few kept, page-aligned staging buffers and the device takes it from
//! there by DMA while the next run is copied (bench/RESULTS.md, "W14").
//!
//! Nothing about the file changes: its bytes, their offsets and the commit protocol around it
//! (staging name, fsync, rename or link, folder fsync) are those of a buffered write, and packs
//! need no alignment (docs/format.md, "Direct I/O"). The `fsync` after is still what makes the
//! file durable (the device's write cache, the file's size). Everything here has a plain
//! fallback: no `/proc` to reopen the file with, a file system without `O_DIRECT` (tmpfs), or a
//! direct write refused (`EINVAL`) sends the bytes through the page cache instead.

use crate::buffers;
use bytes::Bytes;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::mpsc;

/// Files at least this big are written directly: below it, a file is a manifest or a small
/// pack, whose page-cache copy costs little and may be read again soon.
pub(super) const MIN_BYTES: usize = 16 << 20;

/// Bytes copied into one staging buffer and written by one call.
const RUN: usize = 8 << 20;
/// Staging buffers per file: one being filled while the others are written.
const RUNS: usize = 3;
/// What direct I/O needs of offsets, lengths and memory (the largest logical block size in
/// common use; 512-byte devices accept it too).
const ALIGN: usize = 4096;

/// `f` opened again for direct writes, or `None` where that is not possible here.
pub(super) fn open(f: &File) -> Option<File> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(format!("/proc/self/fd/{}", f.as_raw_fd()))
        .ok()
}

/// Write `parts` to the empty file `f` from offset 0, whole runs through `direct` (`f` opened
/// with [`open`]) on a writer thread while the next run is copied here, and the last partial
/// block through `f`. The caller fsyncs.
///
/// # Errors
/// The first error of a part or a write.
pub(super) fn write(f: &File, direct: File, parts: &mut dyn Iterator<Item = io::Result<Bytes>>) -> io::Result<()> {
    std::thread::scope(|s| {
        let (full_tx, full_rx) = mpsc::sync_channel::<(memmap2::MmapMut, usize, u64)>(RUNS);
        let (free_tx, free_rx) = mpsc::channel::<memmap2::MmapMut>();
        let writer = std::thread::Builder::new().name("treepack-direct".into()).spawn_scoped(s, move || {
            let mut through = &direct;
            for (buf, len, at) in full_rx {
                match through.write_all_at(&buf[..len], at) {
                    Ok(()) =>
                    {
                        #[cfg(test)]
                        if std::ptr::eq(through, &direct) {
                            tests::DIRECT_RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                    // Refused as a direct write (the file system or the device): this run and
                    // the rest go through the page cache (the whole run again: whatever part of
                    // it was written is written again with the same bytes).
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) && std::ptr::eq(through, &direct) => {
                        through = f;
                        through.write_all_at(&buf[..len], at)?;
                    }
                    Err(e) => return Err(e),
                }
                let _ = free_tx.send(buf);
            }
            Ok(())
        })?;
        let mut made = 0;
        let mut next_buffer = || -> io::Result<memmap2::MmapMut> {
            if made < RUNS {
                made += 1;
                return buffers::take(RUN, "a direct write's staging buffer")
                    .map_err(|e| io::Error::other(e.to_string()));
            }
            // The writer stopped (a failed write): its error is the one to report.
            free_rx.recv().map_err(|_| io::Error::other("the direct writer stopped"))
        };
        let filled = (|| -> io::Result<()> {
            let (mut cur, mut fill, mut at) = (None::<memmap2::MmapMut>, 0usize, 0u64);
            for p in parts {
                let p = p?;
                let mut src = &p[..];
                while !src.is_empty() {
                    let buf = match &mut cur {
                        Some(b) => b,
                        None => {
                            fill = 0;
                            cur.insert(next_buffer()?)
                        }
                    };
                    let n = (RUN - fill).min(src.len());
                    buf[fill..fill + n].copy_from_slice(&src[..n]);
                    fill += n;
                    src = &src[n..];
                    if fill == RUN {
                        let full = cur.take().ok_or_else(|| io::Error::other("no staging buffer"))?;
                        full_tx.send((full, RUN, at)).map_err(|_| io::Error::other("the direct writer stopped"))?;
                        at += RUN as u64;
                    }
                }
            }
            if let Some(buf) = cur {
                // The last partial block through the page cache (direct writes take whole
                // blocks); whole blocks before it as the rest.
                let whole = fill & !(ALIGN - 1);
                f.write_all_at(&buf[whole..fill], at + whole as u64)?;
                if whole > 0 {
                    full_tx.send((buf, whole, at)).map_err(|_| io::Error::other("the direct writer stopped"))?;
                } else {
                    buffers::give(buf);
                }
            }
            Ok(())
        })();
        drop(full_tx);
        let wrote = writer.join().unwrap_or_else(|_| Err(io::Error::other("the direct writer panicked")));
        while let Ok(b) = free_rx.try_recv() {
            buffers::give(b);
        }
        // The writer's error comes first: a part that failed to come after it is its echo.
        wrote.and(filled)
    })
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Runs written with `O_DIRECT` (by any test of this binary).
    pub(crate) static DIRECT_RUNS: AtomicUsize = AtomicUsize::new(0);

    /// Whether the folder's file system takes direct writes at all (tmpfs does not).
    fn takes_direct_writes(dir: &std::path::Path) -> bool {
        let f = File::create(dir.join("probe")).unwrap();
        let Some(d) = open(&f) else { return false };
        let mut m = memmap2::MmapMut::map_anon(ALIGN).unwrap();
        m[0] = 1;
        d.write_all_at(&m, 0).is_ok()
    }

    /// Every split of parts around runs and blocks lands its bytes where a plain write would,
    /// with the file's exact size (a tail that is no whole block included).
    #[test]
    fn direct_writes_land_every_byte() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..(2 * RUN + 3 * ALIGN + 123)).map(|i| (i * 31 % 251) as u8).collect();
        for cuts in [vec![], vec![1, ALIGN, RUN - 1, RUN + 1], vec![RUN, 2 * RUN], vec![17; 1]] {
            let path = dir.path().join(format!("f{}", cuts.len()));
            let f = File::create(&path).unwrap();
            let mut parts = vec![];
            let mut at = 0;
            for c in cuts.iter().copied().chain([data.len()]) {
                let end = (at + c).min(data.len());
                parts.push(Bytes::copy_from_slice(&data[at..end]));
                at = end;
            }
            parts.push(Bytes::copy_from_slice(&data[at..]));
            let direct = open(&f).unwrap_or_else(|| f.try_clone().unwrap());
            write(&f, direct, &mut parts.into_iter().map(Ok)).unwrap();
            drop(f);
            assert_eq!(std::fs::read(&path).unwrap(), data, "cuts {cuts:?}");
        }
        if takes_direct_writes(dir.path()) {
            assert!(DIRECT_RUNS.load(Ordering::Relaxed) >= 8, "the runs went through the page cache");
        }
    }

    /// A part that cannot be made ends the write with its error, and the writer thread stops.
    #[test]
    fn a_failed_part_is_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let f = File::create(dir.path().join("f")).unwrap();
        let direct = open(&f).unwrap_or_else(|| f.try_clone().unwrap());
        let parts = vec![Ok(Bytes::from(vec![1u8; RUN + 5])), Err(io::Error::other("no part"))];
        let e = write(&f, direct, &mut parts.into_iter()).unwrap_err();
        assert_eq!(e.to_string(), "no part");
    }
}
