//! Local disk: a folder (directory layout) or one file (single-file layout), every operation
//! beneath the location (`beneath.rs`), writes that survive a power cut (`durable.rs`), markers of
//! running saves that `gc` respects (`marker.rs`), positioned reads straight into the caller's
//! memory or around the page cache (`read`, `direct`), memory maps, and a single file pinned
//! open for the length of a read (`Local::pin`).
//!
//! object_store's local backend is not used: it neither fsyncs nor keeps operations beneath a
//! root, and the two fast paths that matter here — positioned reads and memory maps — are not
//! in its API.

pub(crate) mod beneath;
#[cfg(target_os = "linux")]
mod direct;
mod direct_write;
pub(crate) mod durable;
#[cfg(feature = "failpoints")]
pub(crate) mod failpoint;
mod marker;
mod read;

pub use marker::SaveMarker;
pub use read::{direct_bytes_on_this_thread, ReadMode, DIRECT_MIN_BYTES};

use crate::backend::{maybe_spawn_blocking, BoxFuture, Keep, Listed, RangeRead, Swap, Version, Write, WriteStream};
use crate::{Error, Layout, Location, Result};
use beneath::{io_error, Kind, Target};
use bytes::Bytes;
use futures::FutureExt;
use read::{normalize_local, open_pack, read_file_ranges};
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A file to read: the location's pinned file, or one opened for this read.
enum ReadFile<'a> {
    Pinned(&'a File),
    Opened(File),
}

impl std::ops::Deref for ReadFile<'_> {
    type Target = File;

    fn deref(&self) -> &File {
        match self {
            ReadFile::Pinned(f) => f,
            ReadFile::Opened(f) => f,
        }
    }
}

/// A location on local disk: the backend, and the capabilities only local files have
/// ([`Location::local`]).
#[derive(Debug, Clone)]
pub struct Local {
    /// The location's folder (directory layout) or file (single file), absolute.
    path: PathBuf,
    single: bool,
    /// The single file opened once by [`Local::pin`]: reads go through it, even if a save
    /// replaces the file (rename) under the same name meanwhile.
    pinned: Option<Arc<File>>,
    /// The root folder's identity once first opened (the folder, or a single file's parent).
    root_pin: beneath::RootPin,
}

impl Local {
    /// The backend at the absolute path `path` (given as `given`), and its layout: a single file
    /// when the path is an existing file or `given` ends in `.tpk`.
    pub(crate) fn open(path: &Path, given: &str) -> (Local, Layout) {
        let path = normalize_local(path);
        let is_file = std::fs::metadata(&path).map(|m| m.is_file()).unwrap_or(false);
        let layout = Layout::of(given, is_file);
        (Local { path, single: layout == Layout::SingleFile, pinned: None, root_pin: Default::default() }, layout)
    }

    /// The location's folder or file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where the local file `rel` lies: a directory location's folder is the root; a single
    /// file's root is its parent folder, and the file is a name in it (so the file itself is
    /// never followed if it is a link either).
    pub(crate) fn target(&self, rel: &str) -> Target {
        let whole = rel.is_empty() || rel == ".";
        if self.single && whole {
            if let (Some(parent), Some(name)) = (self.path.parent(), self.path.file_name().and_then(|n| n.to_str())) {
                return Target { root: parent.to_path_buf(), rel: name.to_string(), pin: self.root_pin.clone() };
            }
        }
        Target {
            root: self.path.clone(),
            rel: if whole { String::new() } else { rel.to_string() },
            pin: self.root_pin.clone(),
        }
    }

    fn pinned_file(&self, rel: &str) -> Option<&Arc<File>> {
        self.pinned.as_ref().filter(|_| rel == "." || rel.is_empty())
    }

    /// This single file, opened now (`None` when it already is).
    pub(crate) fn pin(&self, loc: &Location) -> Result<Option<Local>> {
        if self.pinned.is_some() {
            return Ok(None);
        }
        let t = self.target(".");
        let f = t.open_read().map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                Error::no_tree(loc.display(), t.path().display())
            } else {
                io_error(t.path(), e)
            }
        })?;
        Ok(Some(Local { pinned: Some(Arc::new(f)), ..self.clone() }))
    }

    /// The path of the file `rel`, and the file to read it through: the pinned one, or opened
    /// now.
    fn open_for_read(&self, loc: &Location, rel: &str) -> Result<(std::path::PathBuf, ReadFile<'_>)> {
        let t = self.target(rel);
        let p = t.path();
        if let Some(f) = self.pinned_file(rel) {
            return Ok((p, ReadFile::Pinned(f)));
        }
        let f = t.open_read().map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => loc.not_found(rel, p.display()),
            _ => io_error(p.clone(), e),
        })?;
        Ok((p, ReadFile::Opened(f)))
    }

    /// Read `out.len()` bytes of the file `rel` at `offset` straight into `out`: one copy, from
    /// the page cache or the device, into memory the caller already has.
    ///
    /// # Errors
    /// [`Error::NotFound`], [`Error::OutOfBounds`] when the file ends first, I/O errors.
    pub fn read_into(&self, loc: &Location, rel: &str, offset: u64, out: &mut [u8]) -> Result<()> {
        use std::os::unix::fs::FileExt;
        let (p, f) = self.open_for_read(loc, rel)?;
        let f: &File = &f;
        f.read_exact_at(out, offset).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => Error::OutOfBounds {
                file: loc.file_name(rel),
                key: String::new(),
                reason: format!("the file ends before byte {}", offset + out.len() as u64),
            },
            _ => Error::Io { path: p.clone(), source: e },
        })?;
        loc.stats().read(out.len() as u64);
        Ok(())
    }

    /// Read the file `rel` from `offset` into `bufs`, one after the other, with as few
    /// `preadv` calls as the system's vector limit allows: an encrypted file's segments straight
    /// into their places in a leaf's buffer, their tags beside (crate::crypt).
    ///
    /// # Errors
    /// [`Error::NotFound`], [`Error::OutOfBounds`] when the file ends first, I/O errors.
    pub fn read_vectored_into(&self, loc: &Location, rel: &str, offset: u64, bufs: &mut [&mut [u8]]) -> Result<()> {
        use std::io::IoSliceMut;
        const MAX_IOV: usize = 1024;
        let (p, f) = self.open_for_read(loc, rel)?;
        let f: &File = &f;
        let total: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        // (buffer index, bytes of it already read)
        let (mut i, mut done_in, mut at) = (0usize, 0usize, offset);
        while i < bufs.len() {
            let mut iov: Vec<IoSliceMut<'_>> = Vec::with_capacity(MAX_IOV.min(bufs.len() - i));
            for (k, b) in bufs[i..].iter_mut().take(MAX_IOV).enumerate() {
                let skip = if k == 0 { done_in } else { 0 };
                iov.push(IoSliceMut::new(&mut b[skip..]));
            }
            let n = loop {
                match rustix::io::preadv(f, &mut iov, at) {
                    Ok(n) => break n,
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(e) => return Err(Error::Io { path: p.clone(), source: e.into() }),
                }
            };
            if n == 0 {
                return Err(Error::OutOfBounds {
                    file: loc.file_name(rel),
                    key: String::new(),
                    reason: format!("the file ends before byte {}", offset + total),
                });
            }
            at += n as u64;
            let mut left = n;
            while left > 0 && i < bufs.len() {
                let room = bufs[i].len() - done_in;
                if left >= room {
                    left -= room;
                    i += 1;
                    done_in = 0;
                } else {
                    done_in += left;
                    left = 0;
                }
            }
            while i < bufs.len() && bufs[i].is_empty() {
                i += 1;
            }
        }
        loc.stats().read(total);
        Ok(())
    }

    /// Memory-map the file `rel`.
    ///
    /// The mapping is private and copy-on-write (`MAP_PRIVATE`, as `torch.load(mmap=True)` and
    /// numpy's `mmap_mode="c"` map): the file is never written, and a framework that writes into
    /// a loaded tensor in place gets private pages instead of a crash. Where the system refuses a
    /// writable private mapping, a read-only one.
    ///
    /// # Errors
    /// I/O errors opening or mapping the file; a link is refused.
    pub fn mmap(&self, rel: &str) -> Result<Bytes> {
        let t = self.target(rel);
        let p = t.path();
        let f = match self.pinned_file(rel) {
            Some(f) => f.try_clone().map_err(|e| Error::Io { path: p.clone(), source: e })?,
            None => t.open_read().map_err(|e| io_error(p.clone(), e))?,
        };
        // SAFETY: treepack never modifies committed files in place (writes are temp + rename),
        // so the mapping stays valid; callers opt in to mmap knowing another program could
        // truncate the file underneath them.
        // Arrays are read front to back: sequential advice makes a page fault read ahead from
        // the fault instead of around it (a cold page fault of a small array in a big pack reads
        // about half as much). Only a hint; failure changes nothing.
        match unsafe { memmap2::MmapOptions::new().map_copy(&f) } {
            Ok(m) => {
                #[cfg(unix)]
                let _ = m.advise(memmap2::Advice::Sequential);
                Ok(Bytes::from_owner(m))
            }
            Err(_) => {
                let m = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| Error::Io { path: p, source: e })?;
                #[cfg(unix)]
                let _ = m.advise(memmap2::Advice::Sequential);
                Ok(Bytes::from_owner(m))
            }
        }
    }

    /// The size of the file `rel` (`None` if it does not exist).
    ///
    /// # Errors
    /// A link is refused; other I/O errors.
    pub fn size(&self, rel: &str) -> Result<Option<u64>> {
        if let Some(f) = self.pinned_file(rel) {
            return f.metadata().map(|m| Some(m.len())).map_err(|e| Error::Io { path: self.path.clone(), source: e });
        }
        let t = self.target(rel);
        t.stat().map(|m| m.map(|m| m.len)).map_err(|e| io_error(t.path(), e))
    }

    /// Hint that these ranges of the file `rel` will be read next, so the kernel reads them ahead
    /// while the caller is busy. Only a hint: if anything fails, nothing happens.
    pub fn will_need(&self, rel: &str, ranges: &[Range<u64>]) {
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            let file = match self.pinned_file(rel) {
                Some(f) => Some(f.clone()),
                None => self.target(rel).open_read().ok().map(Arc::new),
            };
            if let Some(f) = file {
                for r in ranges {
                    let (Ok(off), Ok(len)) = (libc::off_t::try_from(r.start), libc::off_t::try_from(r.end - r.start))
                    else {
                        continue;
                    };
                    // SAFETY: a plain advisory call on a file descriptor we hold open.
                    unsafe { libc::posix_fadvise(f.as_raw_fd(), off, len, libc::POSIX_FADV_WILLNEED) };
                }
            }
        }
        #[cfg(not(target_os = "linux"))]
        let _ = (rel, ranges);
    }

    /// Remove the file `rel` (a staging file or other leftover, for `gc`); `false` when it is
    /// not there.
    ///
    /// # Errors
    /// A link is refused, not removed; other I/O errors.
    pub fn remove(&self, rel: &str) -> Result<bool> {
        let t = self.target(rel);
        durable::remove_target(&t).map_err(|e| io_error(t.path(), e))
    }

    /// Make the names written so far in the folder `rel_dir` durable (fsync it).
    ///
    /// # Errors
    /// I/O errors opening or syncing the folder; a link on the way is refused.
    pub async fn sync_dir(&self, rel_dir: &str) -> Result<()> {
        durable::sync_target_dir(self.target(rel_dir)).await
    }

    /// The files beside this single file that its saves' staging left behind (`<name>#…`),
    /// with their sizes and times, for `gc`.
    ///
    /// # Errors
    /// [`Error::Link`] if one of those names is a link (before anything is done); I/O errors
    /// listing the folder.
    pub fn leftovers_beside(&self) -> Result<Vec<Listed>> {
        let t = self.target(".");
        let prefix = format!("{}#", t.rel);
        let dir = t.root().map_err(|e| io_error(t.root.clone(), e))?;
        let found: Vec<_> = dir
            .entries()
            .map_err(|e| io_error(t.root.clone(), e))?
            .into_iter()
            .filter(|(n, _)| n.starts_with(&prefix))
            .collect();
        if let Some((n, _)) = found.iter().find(|(_, m)| m.kind == Kind::Link) {
            return Err(io_error(dir.join(n), dir.refuse_link(n)));
        }
        Ok(found.into_iter().filter(|(_, m)| m.kind == Kind::File).map(|(n, m)| (n, m.len, m.modified)).collect())
    }

    /// Remove the file `name` beside this single file (a leftover [`leftovers_beside`]
    /// found); `false` when it is gone already (renamed into place by the save that owned it).
    ///
    /// # Errors
    /// A link is refused; other I/O errors.
    ///
    /// [`leftovers_beside`]: Local::leftovers_beside
    pub fn remove_beside(&self, name: &str) -> Result<bool> {
        let t = self.target(".");
        let dir = t.root().map_err(|e| io_error(t.root.clone(), e))?;
        match dir.unlink(name) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io_error(dir.join(name), e)),
        }
    }

    /// Write the location's own path as one file, streamed by `write`, atomically and durably:
    /// into a staging file beside it, fsynced, then renamed into place. Through the folder's
    /// descriptor (see `beneath.rs`): the folder is the user's path, the file a name in it, and
    /// neither the file nor its staging name is followed if it is a link. Unless `overwrite`,
    /// an existing file is [`Error::AlreadyExists`] of the location shown as `display`.
    ///
    /// # Errors
    /// What `write` returns (the staging file is removed then), I/O errors.
    pub fn write_file<T>(
        &self,
        display: &str,
        overwrite: bool,
        write: impl FnOnce(&mut StagedFile) -> Result<T>,
    ) -> Result<T> {
        let path = &self.path;
        let (Some(parent), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
            return Err(Error::BadLocation { location: display.to_string(), reason: "no file name".into() });
        };
        let dir = self.root_pin.open(parent).map_err(|e| io_error(parent, e))?;
        if dir.stat(name).map_err(|e| io_error(path, e))?.is_some() && !overwrite {
            return Err(Error::AlreadyExists { location: display.to_string() });
        }
        // Unique per call (process and a counter, as a save's staging names), created new: two
        // writes to one name never write or remove each other's staging file.
        static STAGING: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = STAGING.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let staging_name = format!("{name}#{}-{n}", std::process::id());
        let staging = dir.join(&staging_name);
        let created = dir.create_new(&staging_name).map_err(|e| io_error(&staging, e))?;
        let mut f = StagedFile { w: std::io::BufWriter::with_capacity(8 << 20, created), path: staging.clone() };
        let written = write(&mut f).and_then(|out| {
            let file = f.w.into_inner().map_err(|e| io_error(&staging, e.into_error()))?;
            file.sync_all().map_err(|e| io_error(&staging, e))?;
            Ok(out)
        });
        let out = match written {
            Ok(out) => out,
            Err(e) => {
                let _ = dir.unlink(&staging_name);
                return Err(e);
            }
        };
        dir.rename(&staging_name, name).map_err(|e| io_error(path, e))?;
        Ok(out)
    }

    async fn file_size(&self, loc: &Location, rel: &str) -> Result<u64> {
        if let Some(f) = self.pinned_file(rel) {
            return f.metadata().map(|m| m.len()).map_err(|e| Error::Io { path: self.path.clone(), source: e });
        }
        let t = self.target(rel);
        match t.stat() {
            Ok(Some(m)) => Ok(m.len),
            Ok(None) => Err(loc.not_found(rel, t.path().display())),
            Err(e) => Err(io_error(t.path(), e)),
        }
    }
}

/// A file being written by [`Local::write_file`].
#[derive(Debug)]
pub struct StagedFile {
    w: std::io::BufWriter<File>,
    path: PathBuf,
}

impl StagedFile {
    /// Append `bytes`.
    ///
    /// # Errors
    /// [`Error::Io`] naming the staging file.
    pub fn write_all(&mut self, bytes: &[u8]) -> Result<()> {
        use std::io::Write;
        self.w.write_all(bytes).map_err(|e| io_error(&self.path, e))
    }
}

impl crate::Backend for Local {
    fn get<'a>(&'a self, loc: &'a Location, rel: &'a str, limit: u64) -> BoxFuture<'a, Option<(Bytes, Version)>> {
        async move {
            let t = self.target(rel);
            let data = maybe_spawn_blocking(move || {
                use std::io::Read;
                let p = t.path();
                let f = match t.open_read() {
                    Ok(f) => f,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                    Err(e) => return Err(io_error(p, e)),
                };
                let len = f.metadata().map_err(|e| io_error(p.clone(), e))?.len();
                if len > limit {
                    return Err(Error::limit("file size", limit, format!("{} is {len} bytes", p.display())));
                }
                // Read through the descriptor just opened, no further than the limit even if
                // the file grows meanwhile.
                let mut d = Vec::new();
                d.try_reserve_exact(len as usize)
                    .map_err(|_| Error::OutOfMemory { key: p.display().to_string(), bytes: len })?;
                (&f).take(limit.saturating_add(1)).read_to_end(&mut d).map_err(|e| io_error(p.clone(), e))?;
                if d.len() as u64 > limit {
                    return Err(Error::limit("file size", limit, format!("{} grew past it while read", p.display())));
                }
                Ok(Some(d))
            })
            .await?;
            loc.stats().read(data.as_ref().map_or(0, |d| d.len() as u64));
            // A local file's version is its content: a replace compares the bytes under a lock.
            Ok(data.map(|d| {
                let b = Bytes::from(d);
                (b.clone(), Version { e_tag: None, version: None, bytes: b })
            }))
        }
        .boxed()
    }

    fn read_ranges<'a>(&'a self, loc: &'a Location, rel: &'a str, read: RangeRead<'a>) -> BoxFuture<'a, Vec<Bytes>> {
        let RangeRead { ranges, mode, progress } = read;
        async move {
            let (stats, file) = (loc.stats().clone(), loc.file_name(rel));
            let got = match self.pinned_file(rel).cloned() {
                Some(f) => {
                    let p = self.path.clone();
                    maybe_spawn_blocking(move || read_file_ranges(&f, &p, &ranges, &stats, &file, mode)).await?
                }
                None => {
                    let (t, location) = (self.target(rel), loc.display().to_string());
                    maybe_spawn_blocking(move || {
                        read_file_ranges(&open_pack(&t, &location, &file)?, &t.path(), &ranges, &stats, &file, mode)
                    })
                    .await?
                }
            };
            if let Some(p) = progress {
                p.advance(got.iter().map(|b| b.len() as u64).sum());
            }
            Ok(got)
        }
        .boxed()
    }

    fn read_suffix<'a>(&'a self, loc: &'a Location, rel: &'a str, n: u64) -> BoxFuture<'a, (Bytes, u64)> {
        async move {
            let size = self.file_size(loc, rel).await?;
            let start = size.saturating_sub(n);
            Ok((loc.read_range(rel, start..size).await?, size))
        }
        .boxed()
    }

    fn size<'a>(&'a self, loc: &'a Location, rel: &'a str) -> BoxFuture<'a, u64> {
        self.file_size(loc, rel).boxed()
    }

    fn exists<'a>(&'a self, loc: &'a Location, rel: &'a str) -> BoxFuture<'a, bool> {
        async move {
            match self.file_size(loc, rel).await {
                Ok(_) => Ok(true),
                Err(Error::NotFound { .. }) => Ok(false),
                Err(e) => Err(e),
            }
        }
        .boxed()
    }

    fn put<'a>(&'a self, loc: &'a Location, rel: &'a str, write: Write<'a>) -> BoxFuture<'a, ()> {
        let Write { parts, create_only, durable, progress } = write;
        let n: u64 = parts.iter().map(|b| b.len() as u64).sum();
        let put = durable::put_target(self.target(rel), parts, create_only, durable, loc.display().to_string());
        async move {
            put.await?;
            if let Some(p) = progress {
                p.advance(n);
            }
            Ok(())
        }
        .boxed()
    }

    fn put_stream<'a>(&'a self, loc: &'a Location, rel: &'a str, write: WriteStream<'a>) -> BoxFuture<'a, ()> {
        let WriteStream { parts, create_only, durable, progress } = write;
        let (counted, n) = crate::backend::counted(parts);
        let put = durable::put_target_from(self.target(rel), counted, create_only, durable, loc.display().to_string());
        async move {
            put.await?;
            if let Some(p) = progress {
                p.advance(n.load(std::sync::atomic::Ordering::Relaxed));
            }
            Ok(())
        }
        .boxed()
    }

    fn replace_if<'a>(&'a self, _loc: &'a Location, rel: &'a str, swap: Swap<'a>) -> BoxFuture<'a, bool> {
        let Swap { parts, was, durable } = swap;
        durable::replace_target_if(self.target(rel), parts, was.map(|v| v.bytes.clone()), durable).boxed()
    }

    fn delete<'a>(&'a self, _loc: &'a Location, rel: &'a str) -> BoxFuture<'a, ()> {
        let t = self.target(rel);
        let r = durable::remove_target(&t).map(drop).map_err(|e| io_error(t.path(), e));
        futures::future::ready(r).boxed()
    }

    fn list<'a>(&'a self, _loc: &'a Location, rel_dir: &'a str, keep: &'a Keep<'a>) -> BoxFuture<'a, Vec<Listed>> {
        async move {
            // Listed from the folder itself (not through object_store, which hides staging files
            // `name#N`), so `gc` sees them.
            let t = self.target(rel_dir);
            let mut out = vec![];
            let entries = match t.dir().and_then(|d| d.entries().map(|e| (d, e))) {
                Ok(x) => x,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
                Err(e) => return Err(io_error(t.path(), e)),
            };
            let (dir, entries) = entries;
            for (name, m) in entries.into_iter().filter(|(n, _)| keep(n)) {
                let rel = if t.rel.is_empty() { name.clone() } else { format!("{}/{name}", t.rel) };
                match m.kind {
                    Kind::File => out.push((rel, m.len, m.modified)),
                    // `stat` refuses it, naming it.
                    Kind::Link => return Err(io_error(dir.join(&name), dir.refuse_link(&name))),
                    Kind::Folder | Kind::Other => {}
                }
            }
            out.sort();
            Ok(out)
        }
        .boxed()
    }

    fn top_names<'a>(&'a self, _loc: &'a Location, limit: usize) -> BoxFuture<'a, Vec<String>> {
        let top = || {
            let rd = match std::fs::read_dir(&self.path) {
                Ok(rd) => rd,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
                // A file where the folder should be: the save's own error says so.
                Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => return Ok(vec![]),
                Err(e) => return Err(Error::Io { path: self.path.clone(), source: e }),
            };
            Ok(rd.flatten().take(limit).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        };
        futures::future::ready(top()).boxed()
    }

    fn local(&self) -> Option<&Local> {
        Some(self)
    }

    fn sidecar(&self, suffix: &str) -> Option<Arc<dyn crate::Backend>> {
        // A name in the same folder, reached beneath it as the file itself is (never pinned:
        // it is read and written whole).
        let mut name = self.path.file_name()?.to_os_string();
        name.push(suffix);
        // (Its folder is a single file's root: the same pin; a folder location's parent is not.)
        let root_pin = if self.single { self.root_pin.clone() } else { Default::default() };
        Some(Arc::new(Local { path: self.path.with_file_name(name), single: true, pinned: None, root_pin }))
    }
}
