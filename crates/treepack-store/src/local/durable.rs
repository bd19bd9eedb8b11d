//! Local writes that survive a power cut (issue 32; the order is docs/format.md's "Commit
//! protocol"). A file is written under a staging name beside its final one (`name#PID-N`, which
//! `gc` recognises as a leftover), fsynced, renamed into place — or, for a create-only put,
//! hard-linked, which fails if the name exists — and its directory fsynced. object_store's local
//! backend writes and renames but never fsyncs: after a machine crash (not a process crash, which
//! leaves the page cache intact) a renamed manifest could point at pack bytes that never reached
//! the disk. With `durable` off the same steps run without the fsyncs.

use super::beneath::{io_error, is_refused, Dir, RootPin, Target};
use super::direct_write;
use crate::backend::maybe_spawn_blocking;
use crate::{Error, Result};
use bytes::Bytes;
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

static STAGING: AtomicU64 = AtomicU64::new(0);

/// Write `parts` to the file `name` of `dir` atomically (see the module docs). `create_only`:
/// fail with `AlreadyExists` if `name` exists, never replacing it. Every step is relative to
/// `dir` and follows no link (store/beneath.rs); the journal records the same paths as ever.
///
/// # Errors
/// The first I/O error; the staging file is removed then (if this call created it).
pub(super) fn put_file(dir: &Dir, name: &str, parts: &[Bytes], create_only: bool, durable: bool) -> io::Result<()> {
    put_file_from(dir, name, &mut parts.iter().cloned().map(Ok), create_only, durable)
}

/// [`put_file`] of the parts `parts` yields, each written (and dropped) before the next is
/// asked for: an encrypted file sealed a run of segments at a time (crypt.rs).
pub(super) fn put_file_from(
    dir: &Dir,
    name: &str,
    parts: &mut dyn Iterator<Item = io::Result<Bytes>>,
    create_only: bool,
    durable: bool,
) -> io::Result<()> {
    let staging_name = format!("{name}#{}-{}", std::process::id(), STAGING.fetch_add(1, Ordering::Relaxed));
    let (staging, path) = (dir.join(&staging_name), dir.join(name));
    let mut created = false;
    let seen = std::cell::RefCell::new(Vec::<u8>::new());
    let result = (|| {
        let f = journal::run(
            || {
                let f = dir.create_new(&staging_name)?;
                created = true;
                // What was written, for the crash-state journal of tests (failpoints) only.
                #[cfg(feature = "failpoints")]
                let mut recorded = parts.inspect(|p| {
                    if let Ok(b) = p {
                        seen.borrow_mut().extend_from_slice(b);
                    }
                });
                #[cfg(not(feature = "failpoints"))]
                let mut recorded = parts;
                write_parts(&f, &mut recorded, durable)?;
                Ok(f)
            },
            || journal::FsOp::Write { path: staging.clone(), data: seen.take() },
        )?;
        if durable {
            journal::run(|| f.sync_all(), || journal::FsOp::Fsync(staging.clone()))?;
        }
        drop(f);
        if create_only {
            if journal::run(
                || link_new(dir, &staging_name, name),
                || journal::FsOp::Link { from: staging.clone(), to: path.clone() },
            )? {
                journal::run(|| dir.unlink(&staging_name), || journal::FsOp::Unlink(staging.clone()))?;
            }
        } else {
            journal::run(
                || dir.rename(&staging_name, name),
                || journal::FsOp::Rename { from: staging.clone(), to: path.clone() },
            )?;
        }
        if durable {
            sync_dir(dir)?;
        }
        Ok(())
    })();
    // Only a staging file this call created is removed: a name that was there before (a
    // planted link) is not this save's to remove.
    if result.is_err() && created {
        let _ = dir.unlink(&staging_name);
    }
    result
}

/// Write `parts` to the empty file `f`: a durable file of at least [`direct_write::MIN_BYTES`]
/// straight to the device (direct_write.rs), anything else through the page cache, a durable
/// one with writeback started as it goes.
fn write_parts(f: &File, parts: &mut dyn Iterator<Item = io::Result<Bytes>>, durable: bool) -> io::Result<()> {
    let mut head = vec![];
    if durable {
        let mut len = 0;
        while len < direct_write::MIN_BYTES {
            let Some(p) = parts.next() else { break };
            let p = p?;
            len += p.len();
            head.push(p);
        }
        if len >= direct_write::MIN_BYTES {
            if let Some(direct) = direct_write::open(f) {
                return direct_write::write(f, direct, &mut head.into_iter().map(Ok).chain(parts));
            }
        }
    }
    let mut f = f;
    let (mut written, mut flushing) = (0u64, 0u64);
    for p in head.into_iter().map(Ok).chain(parts) {
        let p = p?;
        for piece in p.chunks(WRITEBACK_BYTES) {
            f.write_all(piece)?;
            written += piece.len() as u64;
            if durable && written - flushing >= WRITEBACK_BYTES as u64 {
                start_writeback(f, flushing, written - flushing);
                flushing = written;
            }
        }
    }
    Ok(())
}

/// A durable write asks the kernel to start writing each run of this many bytes to the device
/// as soon as it is in the page cache, so that the device works while later bytes are copied
/// and the final fsync has less left to wait for (bench/RESULTS.md, "Measurements cited by
/// code comments").
const WRITEBACK_BYTES: usize = 8 << 20;

/// Start writeback of `len` bytes at `offset` without waiting for it (Linux's
/// `sync_file_range(SYNC_FILE_RANGE_WRITE)`; only a hint: the fsync is what makes it durable).
fn start_writeback(f: &File, offset: u64, len: u64) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let (Ok(off), Ok(n)) = (libc::off64_t::try_from(offset), libc::off64_t::try_from(len)) else { return };
        // SAFETY: an open descriptor; the call only schedules writeback of its dirty pages.
        unsafe { libc::sync_file_range(f.as_raw_fd(), off, n, libc::SYNC_FILE_RANGE_WRITE) };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (f, offset, len);
}

/// Give `staging` the name `name` unless `name` exists: `Ok(true)` if linked (the staging name
/// is still there, to be removed), `Ok(false)` if renamed. A hard link does it atomically; on
/// file systems without hard links (some FUSE and network mounts) a rename after a check, which
/// a concurrent create can race (docs/security.md). (The journal records either as a link:
/// the tests' file systems have hard links.)
fn link_new(dir: &Dir, staging: &str, name: &str) -> io::Result<bool> {
    match dir.link(staging, name) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists || is_refused(&e) => Err(e),
        Err(e) => match dir.stat(name) {
            Ok(Some(_)) => Err(io::ErrorKind::AlreadyExists.into()),
            Ok(None) => dir.rename(staging, name).map(|()| false),
            Err(_) => Err(e),
        },
    }
}

/// fsync a folder: makes the names created, renamed or removed in it so far durable.
pub(super) fn sync_dir(dir: &Dir) -> io::Result<()> {
    journal::run(|| dir.sync(), || journal::FsOp::FsyncDir(dir.path().to_path_buf()))
}

/// fsync a folder by its path (a location's root or an ancestor of it: the user's own path).
fn sync_dir_path(dir: &Path) -> io::Result<()> {
    journal::run(|| File::open(dir)?.sync_all(), || journal::FsOp::FsyncDir(dir.to_path_buf()))
}

/// Create a location's root folder `dir` and its missing ancestors, by path: the path is the
/// user's (store/beneath.rs). When `durable`, fsync the parent of each one created, so that the
/// new names survive a crash too.
pub(super) fn create_dirs(dir: &Path, durable: bool) -> io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    let mut missing = vec![];
    let mut d = dir;
    while !d.as_os_str().is_empty() && d.symlink_metadata().is_err() {
        missing.push(d);
        match d.parent() {
            Some(p) => d = p,
            None => break,
        }
    }
    for m in missing.into_iter().rev() {
        match journal::run(|| std::fs::create_dir(m), || journal::FsOp::Mkdir(m.to_path_buf())) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && m.is_dir() => continue,
            Err(e) => return Err(e),
        }
        if durable {
            if let Some(parent) = m.parent().filter(|p| !p.as_os_str().is_empty()) {
                sync_dir_path(parent)?;
            }
        }
    }
    Ok(())
}

/// Open the folder `rel` beneath `root`, creating the root (by its path) and every missing
/// folder beneath it (`mkdirat`, no link followed), each made durable in its parent when
/// `durable` — the same operations, in the same order, as creating the whole path at once.
pub(super) fn create_beneath(root: &Path, pin: &RootPin, rel: &str, durable: bool) -> io::Result<Dir> {
    create_dirs(root, durable)?;
    pin.open(root)?.sub_creating(rel, |parent, name| {
        journal::run(|| parent.mkdir(name), || journal::FsOp::Mkdir(parent.join(name)))?;
        if durable {
            sync_dir(parent)?;
        }
        Ok(())
    })
}

/// Remove the file `name` of `dir`; a missing one is not an error, a link is refused. Not
/// fsynced: only files no committed tree references are removed, and if a crash undoes the
/// removal, `gc` removes them again.
pub(super) fn remove(dir: &Dir, name: &str) -> io::Result<bool> {
    match journal::run(|| dir.unlink(name), || journal::FsOp::Unlink(dir.join(name))) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Remove the local file `t`; a missing one (or a missing folder on its way) is not an error.
pub(super) fn remove_target(t: &Target) -> io::Result<bool> {
    match t.parent() {
        Ok((dir, name)) => remove(&dir, name),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// The folder part of a target's path and its file name (for a put).
fn split_target(t: &Target) -> io::Result<(&str, &str)> {
    t.split().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))
}

/// Write the local file `t` with [`put_file`], creating its folders first (on a blocking
/// thread when inside a runtime). An existing file under `create_only` is
/// [`Error::AlreadyExists`] of the location shown as `display`.
pub(super) async fn put_target(
    t: Target,
    parts: Vec<Bytes>,
    create_only: bool,
    durable: bool,
    display: String,
) -> Result<()> {
    put_target_from(t, Box::new(parts.into_iter().map(Ok)), create_only, durable, display).await
}

/// [`put_target`] of the parts `parts` yields ([`put_file_from`]).
pub(super) async fn put_target_from(
    t: Target,
    mut parts: Box<dyn Iterator<Item = Result<Bytes>> + Send>,
    create_only: bool,
    durable: bool,
    display: String,
) -> Result<()> {
    maybe_spawn_blocking(move || {
        let (folder, name) = split_target(&t).map_err(|e| io_error(t.path(), e))?;
        let dir = create_beneath(&t.root, &t.pin, folder, durable).map_err(|e| io_error(t.path(), e))?;
        // A part that could not be made ends the write with its own error.
        let failed = std::cell::RefCell::new(None);
        let mut io_parts = parts.by_ref().map_while(|r| match r {
            Ok(b) => Some(Ok(b)),
            Err(e) => {
                *failed.borrow_mut() = Some(e);
                Some(Err(io::Error::other("a part of the file could not be made")))
            }
        });
        let r = put_file_from(&dir, name, &mut io_parts, create_only, durable);
        if let Some(e) = failed.take() {
            return Err(e);
        }
        r.map_err(|e| match e.kind() {
            io::ErrorKind::AlreadyExists => Error::AlreadyExists { location: display },
            _ => io_error(t.path(), e),
        })
    })
    .await
}

/// Replace the local file `t` only if it still holds `expected` (or, for `None`, does not
/// exist): the read, the comparison and the replace happen under an exclusive `flock` of a
/// lock file beside it (`<name>.lock`), which every conditional replace of that file takes.
pub(super) async fn replace_target_if(
    t: Target,
    parts: Vec<Bytes>,
    expected: Option<Bytes>,
    durable: bool,
) -> Result<bool> {
    maybe_spawn_blocking(move || {
        let path = t.path();
        let io = |e: io::Error| io_error(path.clone(), e);
        let (folder, name) = split_target(&t).map_err(io)?;
        let dir = create_beneath(&t.root, &t.pin, folder, durable).map_err(io)?;
        let lock_name = format!("{name}.lock");
        let lock = dir.open_or_create(&lock_name).map_err(|e| io_error(dir.join(&lock_name), e))?;
        lock_exclusive(&lock).map_err(|e| io_error(dir.join(&lock_name), e))?;
        let now = match dir.open_read(name) {
            Ok(mut f) => {
                let mut b = vec![];
                f.read_to_end(&mut b).map_err(io)?;
                Some(b)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(io(e)),
        };
        if now.as_deref() != expected.as_deref() {
            return Ok(false);
        }
        put_file(&dir, name, &parts, expected.is_none(), durable).map_err(io)?;
        Ok(true)
        // The lock is released when `lock` is closed here.
    })
    .await
}

/// Make the names written so far in the local folder `t` durable (fsync it).
pub(super) async fn sync_target_dir(t: Target) -> Result<()> {
    maybe_spawn_blocking(move || t.dir().and_then(|d| sync_dir(&d)).map_err(|e| io_error(t.path(), e))).await
}

/// A record of the file-system operations local writes perform, for the crash-state tests
/// (`tests/crash_states.rs`), which replay every state a crash could leave. Compiled only with
/// the `failpoints` feature; elsewhere `run` only runs the operation.
pub mod journal {
    use std::path::PathBuf;

    /// One file-system operation, as performed (in program order).
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum FsOp {
        /// A directory created.
        Mkdir(PathBuf),
        /// A new file created with these bytes (written, not yet fsynced).
        Write {
            /// The file.
            path: PathBuf,
            /// Its whole content.
            data: Vec<u8>,
        },
        /// A file's data and size made durable.
        Fsync(PathBuf),
        /// The entries of a directory made durable.
        FsyncDir(PathBuf),
        /// `from` renamed to `to`, replacing `to` (same directory).
        Rename {
            /// Old name.
            from: PathBuf,
            /// New name.
            to: PathBuf,
        },
        /// A second name `to` for the file `from` (same directory).
        Link {
            /// Existing name.
            from: PathBuf,
            /// New name.
            to: PathBuf,
        },
        /// A name removed.
        Unlink(PathBuf),
    }

    #[cfg(feature = "failpoints")]
    static JOURNAL: std::sync::Mutex<Option<Vec<FsOp>>> = std::sync::Mutex::new(None);

    /// Start recording (clearing what was recorded).
    #[cfg(feature = "failpoints")]
    pub fn start() {
        *JOURNAL.lock().unwrap_or_else(|e| e.into_inner()) = Some(vec![]);
    }

    /// Stop recording and return what was recorded.
    #[cfg(feature = "failpoints")]
    pub fn take() -> Vec<FsOp> {
        JOURNAL.lock().unwrap_or_else(|e| e.into_inner()).take().unwrap_or_default()
    }

    /// Perform `f` and, if it succeeds while recording, record `op()`: one at a time, so that
    /// the journal's order is the order the operations happened in.
    #[cfg(feature = "failpoints")]
    pub(crate) fn run<T>(f: impl FnOnce() -> std::io::Result<T>, op: impl FnOnce() -> FsOp) -> std::io::Result<T> {
        let mut j = JOURNAL.lock().unwrap_or_else(|e| e.into_inner());
        let out = f()?;
        if let Some(j) = j.as_mut() {
            j.push(op());
        }
        Ok(out)
    }

    /// Perform `f` (nothing is recorded without the `failpoints` feature).
    #[cfg(not(feature = "failpoints"))]
    #[inline(always)]
    pub(crate) fn run<T>(f: impl FnOnce() -> std::io::Result<T>, _op: impl FnOnce() -> FsOp) -> std::io::Result<T> {
        f()
    }
}

/// Take an exclusive `flock` on `f`, waiting for other holders (no-op off Unix).
fn lock_exclusive(f: &File) -> io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: a valid open descriptor; flock only changes the lock on its open file description.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    let _ = f;
    Ok(())
}
