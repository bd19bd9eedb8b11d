//! Where trees live. Everything goes through the `object_store` crate (local disk and memory now;
//! S3, GCS, Azure and HTTP plug in as further schemes), with two local-only fast paths measured to
//! matter: positioned reads straight from the file, and memory maps.
//!
//! Every read and write is counted in [`IoStats`], which tests use to prove partial loads touch
//! only the bytes they need.

use crate::error::{Error, Result};
use bytes::Bytes;
use futures::StreamExt;
use object_store::memory::InMemory;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// File name of the manifest in a directory location.
pub const MANIFEST_NAME: &str = "treepack.json";
/// Folder of pack files in a directory location.
pub const PACKS_DIR: &str = "packs";
/// Extension that selects the single-file layout.
pub const SINGLE_FILE_EXT: &str = "tpk";

/// How a tree is laid out at its location.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// A folder (or prefix) with `treepack.json` and `packs/*.tpp`.
    Directory,
    /// One `.tpk` file: header, chunks, manifest, footer.
    SingleFile,
}

/// Counters of storage traffic, shared by clones of a [`Location`].
#[derive(Debug, Default)]
pub struct IoStats {
    pub read_requests: AtomicU64,
    pub bytes_read: AtomicU64,
    pub write_requests: AtomicU64,
    pub bytes_written: AtomicU64,
}

impl IoStats {
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read.load(Ordering::Relaxed)
    }
    pub fn read_requests(&self) -> u64 {
        self.read_requests.load(Ordering::Relaxed)
    }
    pub fn bytes_written(&self) -> u64 {
        self.bytes_written.load(Ordering::Relaxed)
    }
    pub fn write_requests(&self) -> u64 {
        self.write_requests.load(Ordering::Relaxed)
    }
    pub fn reset(&self) {
        for c in [&self.read_requests, &self.bytes_read, &self.write_requests, &self.bytes_written] {
            c.store(0, Ordering::Relaxed);
        }
    }
    fn read(&self, n: u64) {
        self.read_requests.fetch_add(1, Ordering::Relaxed);
        self.bytes_read.fetch_add(n, Ordering::Relaxed);
    }
    fn wrote(&self, n: u64) {
        self.write_requests.fetch_add(1, Ordering::Relaxed);
        self.bytes_written.fetch_add(n, Ordering::Relaxed);
    }
}

/// A place a tree is (or will be) stored.
#[derive(Debug, Clone)]
pub struct Location {
    display: String,
    store: Arc<dyn ObjectStore>,
    /// Object path of the directory (Directory) or of the file (SingleFile).
    base: ObjPath,
    layout: Layout,
    /// Filesystem path of the directory or file, for local fast paths.
    local: Option<PathBuf>,
    stats: Arc<IoStats>,
}

fn memory_stores() -> &'static Mutex<std::collections::HashMap<String, Arc<InMemory>>> {
    static M: OnceLock<Mutex<std::collections::HashMap<String, Arc<InMemory>>>> = OnceLock::new();
    M.get_or_init(Default::default)
}

impl Location {
    /// Parse a location string: a local path, `file://…`, or `memory://bucket/prefix` (a
    /// process-wide in-memory store, for tests). A path ending in `.tpk` uses the single-file
    /// layout; an existing local file is read as a single file whatever its name.
    ///
    /// # Errors
    /// [`Error::BadLocation`] for unsupported schemes or malformed strings.
    pub fn parse(s: &str) -> Result<Location> {
        let bad = |r: &str| Error::BadLocation { location: s.to_string(), reason: r.to_string() };
        if s.is_empty() {
            return Err(bad("empty location"));
        }
        let layout_for = |p: &str, is_file: bool| {
            if is_file || p.trim_end_matches('/').ends_with(&format!(".{SINGLE_FILE_EXT}")) {
                Layout::SingleFile
            } else {
                Layout::Directory
            }
        };
        if let Some(rest) = s.strip_prefix("memory://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            let store = memory_stores()
                .lock()
                .map_err(|_| bad("memory store registry poisoned"))?
                .entry(bucket.to_string())
                .or_insert_with(|| Arc::new(InMemory::new()))
                .clone();
            let base = ObjPath::parse(prefix.trim_matches('/')).map_err(|e| bad(&e.to_string()))?;
            return Ok(Location {
                display: s.to_string(),
                store,
                base,
                layout: layout_for(prefix, false),
                local: None,
                stats: Arc::default(),
            });
        }
        if let Some((scheme, _)) = s.split_once("://") {
            if scheme != "file" {
                return Err(bad(&format!(
                    "scheme `{scheme}://` is not supported by this build (supported: local paths, file://, memory://)"
                )));
            }
        }
        let path_str = s.strip_prefix("file://").unwrap_or(s);
        let path = normalize_local(&std::path::absolute(Path::new(path_str)).map_err(|e| bad(&e.to_string()))?);
        let is_file = std::fs::metadata(&path).map(|m| m.is_file()).unwrap_or(false);
        let layout = layout_for(path_str, is_file);
        let fs = object_store::local::LocalFileSystem::new();
        let base = ObjPath::from_absolute_path(&path).map_err(|e| bad(&e.to_string()))?;
        Ok(Location {
            display: s.to_string(),
            store: Arc::new(fs),
            base,
            layout,
            local: Some(path),
            stats: Arc::default(),
        })
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }
    /// The location as the user wrote it.
    pub fn display(&self) -> &str {
        &self.display
    }
    /// Traffic counters for this location (shared by clones).
    pub fn stats(&self) -> &Arc<IoStats> {
        &self.stats
    }
    /// Local filesystem path, if the location is on local disk.
    pub fn local_path(&self) -> Option<&Path> {
        self.local.as_deref()
    }

    /// Display name of a file inside the location (for error messages).
    pub fn file_name(&self, rel: &str) -> String {
        match self.layout {
            Layout::SingleFile => self.display.clone(),
            Layout::Directory => format!("{}/{}", self.display.trim_end_matches('/'), rel),
        }
    }

    fn obj(&self, rel: &str) -> ObjPath {
        if rel == "." || rel.is_empty() {
            return self.base.clone();
        }
        rel.split('/').fold(self.base.clone(), |p, seg| p.clone().join(seg))
    }

    fn local_file(&self, rel: &str) -> Option<PathBuf> {
        let root = self.local.as_ref()?;
        if rel == "." || rel.is_empty() {
            return Some(root.clone());
        }
        Some(rel.split('/').fold(root.clone(), |p, seg| p.join(seg)))
    }

    fn store_err(&self, rel: &str, e: object_store::Error) -> Error {
        match e {
            object_store::Error::NotFound { .. } => Error::NotFound {
                location: self.display.clone(),
                detail: format!("`{}` does not exist", self.file_name(rel)),
            },
            object_store::Error::AlreadyExists { .. } => Error::AlreadyExists { location: self.display.clone() },
            e => Error::Store { location: self.file_name(rel), source: e },
        }
    }

    /// Refuse symbolic links inside a local location: a hostile tree could otherwise make the
    /// reader follow `packs/x.tpp -> /etc/shadow`.
    fn check_no_symlink(&self, rel: &str) -> Result<()> {
        let Some(root) = &self.local else { return Ok(()) };
        if rel == "." || rel.is_empty() {
            return Ok(());
        }
        let mut p = root.clone();
        for seg in rel.split('/') {
            p.push(seg);
            if let Ok(m) = std::fs::symlink_metadata(&p) {
                if m.file_type().is_symlink() {
                    return Err(Error::OutOfBounds {
                        file: p.display().to_string(),
                        key: rel.to_string(),
                        reason: "is a symbolic link; treepack does not follow links inside a tree".into(),
                    });
                }
            }
        }
        Ok(())
    }

    /// Read a whole object, or `None` if it does not exist. `limit` caps the size accepted.
    pub async fn get_opt(&self, rel: &str, limit: u64) -> Result<Option<Bytes>> {
        self.check_no_symlink(rel)?;
        if let Some(p) = self.local_file(rel) {
            let meta = match std::fs::metadata(&p) {
                Ok(m) => m,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(Error::Io { path: p, source: e }),
            };
            if meta.len() > limit {
                return Err(Error::limit("file size", limit, format!("{} is {} bytes", p.display(), meta.len())));
            }
            let data =
                tokio::task::spawn_blocking(move || std::fs::read(&p).map_err(|e| Error::Io { path: p, source: e }))
                    .await
                    .map_err(|e| Error::Serde(format!("read task failed: {e}")))??;
            self.stats.read(data.len() as u64);
            return Ok(Some(Bytes::from(data)));
        }
        match self.store.get(&self.obj(rel)).await {
            Ok(r) => {
                if r.meta.size > limit {
                    return Err(Error::limit(
                        "object size",
                        limit,
                        format!("{} is {} bytes", self.file_name(rel), r.meta.size),
                    ));
                }
                let b = r.bytes().await.map_err(|e| self.store_err(rel, e))?;
                self.stats.read(b.len() as u64);
                Ok(Some(b))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.store_err(rel, e)),
        }
    }

    /// Size of an object in bytes.
    pub async fn size(&self, rel: &str) -> Result<u64> {
        self.check_no_symlink(rel)?;
        if let Some(p) = self.local_file(rel) {
            return std::fs::metadata(&p).map(|m| m.len()).map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    Error::NotFound {
                        location: self.display.clone(),
                        detail: format!("`{}` does not exist", p.display()),
                    }
                } else {
                    Error::Io { path: p, source: e }
                }
            });
        }
        let m = self.store.head(&self.obj(rel)).await.map_err(|e| self.store_err(rel, e))?;
        self.stats.read(0);
        Ok(m.size)
    }

    /// Read several byte ranges of one object. Local files use positioned reads in parallel;
    /// object stores coalesce nearby ranges into few requests.
    pub async fn read_ranges(&self, rel: &str, ranges: Vec<Range<u64>>) -> Result<Vec<Bytes>> {
        if ranges.is_empty() {
            return Ok(vec![]);
        }
        self.check_no_symlink(rel)?;
        if let Some(p) = self.local_file(rel) {
            let stats = self.stats.clone();
            let file = self.file_name(rel);
            return tokio::task::spawn_blocking(move || read_local_ranges(&p, &ranges, &stats, &file))
                .await
                .map_err(|e| Error::Serde(format!("read task failed: {e}")))?;
        }
        let total: u64 = ranges.iter().map(|r| r.end - r.start).sum();
        let out = self.store.get_ranges(&self.obj(rel), &ranges).await.map_err(|e| self.store_err(rel, e))?;
        self.stats.read(total);
        Ok(out)
    }

    /// Read the last `n` bytes of an object (all of it if smaller) in one request, returning
    /// them with the object's total size.
    pub async fn read_suffix(&self, rel: &str, n: u64) -> Result<(Bytes, u64)> {
        if self.local.is_some() {
            let size = self.size(rel).await?;
            let start = size.saturating_sub(n);
            return Ok((self.read_range(rel, start..size).await?, size));
        }
        let opts = object_store::GetOptions { range: Some(object_store::GetRange::Suffix(n)), ..Default::default() };
        let r = self.store.get_opts(&self.obj(rel), opts).await.map_err(|e| self.store_err(rel, e))?;
        let size = r.meta.size;
        let b = r.bytes().await.map_err(|e| self.store_err(rel, e))?;
        self.stats.read(b.len() as u64);
        Ok((b, size))
    }

    /// Read one byte range of an object.
    pub async fn read_range(&self, rel: &str, range: Range<u64>) -> Result<Bytes> {
        Ok(self.read_ranges(rel, vec![range]).await?.pop().unwrap_or_default())
    }

    /// Memory-map a local file (read-only). `None` for non-local locations.
    pub fn mmap(&self, rel: &str) -> Result<Option<Bytes>> {
        self.check_no_symlink(rel)?;
        let Some(p) = self.local_file(rel) else { return Ok(None) };
        let f = std::fs::File::open(&p).map_err(|e| Error::Io { path: p.clone(), source: e })?;
        // SAFETY: treepack never modifies committed files in place (writes are temp + rename),
        // so the mapping stays valid; callers opt in to mmap knowing another program could
        // truncate the file underneath them.
        let m = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| Error::Io { path: p, source: e })?;
        Ok(Some(Bytes::from_owner(m)))
    }

    /// Write an object atomically. `create_only` fails with [`Error::AlreadyExists`] if the
    /// object exists (conditional put).
    pub async fn put(&self, rel: &str, parts: Vec<Bytes>, create_only: bool) -> Result<()> {
        failpoint_before_put();
        let n: u64 = parts.iter().map(|b| b.len() as u64).sum();
        if let (Some(dir), Layout::Directory) = (&self.local, self.layout) {
            let parent =
                self.local_file(rel).and_then(|p| p.parent().map(Path::to_path_buf)).unwrap_or_else(|| dir.clone());
            std::fs::create_dir_all(&parent).map_err(|e| Error::Io { path: parent, source: e })?;
        }
        if let (Some(file), Layout::SingleFile) = (&self.local, self.layout) {
            if let Some(parent) = file.parent() {
                std::fs::create_dir_all(parent).map_err(|e| Error::Io { path: parent.to_path_buf(), source: e })?;
            }
        }
        let payload: PutPayload = parts.into_iter().collect();
        let mode = if create_only { PutMode::Create } else { PutMode::Overwrite };
        self.store
            .put_opts(&self.obj(rel), payload, PutOptions { mode, ..Default::default() })
            .await
            .map_err(|e| self.store_err(rel, e))?;
        self.stats.wrote(n);
        Ok(())
    }

    /// Delete an object; a missing object is not an error.
    pub async fn delete(&self, rel: &str) -> Result<()> {
        match self.store.delete(&self.obj(rel)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.store_err(rel, e)),
        }
    }

    /// List objects under a folder of the location, as paths relative to the location, with
    /// their sizes and last-modified times.
    pub async fn list(&self, rel_dir: &str) -> Result<Vec<(String, u64, std::time::SystemTime)>> {
        let prefix = self.obj(rel_dir);
        if let Some(dir) = self.local_file(rel_dir) {
            // object_store hides staging files (`name#N`); list the folder directly so `gc` sees them.
            let mut out = vec![];
            let rd = match std::fs::read_dir(&dir) {
                Ok(r) => r,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
                Err(e) => return Err(Error::Io { path: dir, source: e }),
            };
            for ent in rd.flatten() {
                if let (Ok(m), Some(name)) = (ent.metadata(), ent.file_name().to_str()) {
                    if m.is_file() {
                        out.push((format!("{rel_dir}/{name}"), m.len(), m.modified().unwrap_or(std::time::UNIX_EPOCH)));
                    }
                }
            }
            out.sort();
            return Ok(out);
        }
        let mut s = self.store.list(Some(&prefix));
        let mut out = vec![];
        let base_len = self.base.parts().count();
        while let Some(m) = s.next().await {
            let m = m.map_err(|e| self.store_err(rel_dir, e))?;
            let rel: Vec<String> = m.location.parts().skip(base_len).map(|p| p.as_ref().to_string()).collect();
            out.push((rel.join("/"), m.size, std::time::SystemTime::from(m.last_modified)));
        }
        out.sort();
        Ok(out)
    }

    /// Delete a local staging/leftover file by relative path (used by `gc`).
    pub fn remove_local(&self, rel: &str) -> Result<bool> {
        match self.local_file(rel) {
            Some(p) => match std::fs::remove_file(&p) {
                Ok(()) => Ok(true),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
                Err(e) => Err(Error::Io { path: p, source: e }),
            },
            None => Ok(false),
        }
    }
}

/// Crash-test failpoint: when `TREEPACK_FAILPOINT_ABORT_BEFORE_PUT=N` is set, the process aborts
/// (like a SIGKILL: no cleanup, no unwinding) just before its N-th storage write (1-based). The
/// crash tests sweep N over every write of a save to prove each intermediate state is safe.
fn failpoint_before_put() {
    static LIMIT: OnceLock<Option<u64>> = OnceLock::new();
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let limit =
        LIMIT.get_or_init(|| std::env::var("TREEPACK_FAILPOINT_ABORT_BEFORE_PUT").ok().and_then(|v| v.parse().ok()));
    if let Some(n) = *limit {
        if COUNT.fetch_add(1, Ordering::SeqCst) + 1 >= n {
            std::process::abort();
        }
    }
}

/// Resolve `.` and `..` lexically (the path may not exist yet, so no canonicalisation).
fn normalize_local(p: &Path) -> PathBuf {
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

fn read_local_ranges(p: &Path, ranges: &[Range<u64>], stats: &IoStats, file: &str) -> Result<Vec<Bytes>> {
    use rayon::prelude::*;
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(p).map_err(|e| Error::Io { path: p.to_path_buf(), source: e })?;
    ranges
        .par_iter()
        .map(|r| {
            let len = usize::try_from(r.end - r.start).map_err(|_| Error::limit("range", u64::MAX, "too large"))?;
            let mut buf = Vec::new();
            buf.try_reserve_exact(len).map_err(|_| Error::OutOfMemory { key: file.to_string(), bytes: len as u64 })?;
            buf.resize(len, 0);
            f.read_exact_at(&mut buf, r.start).map_err(|e| {
                if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    Error::OutOfBounds {
                        file: file.to_string(),
                        key: String::new(),
                        reason: format!("bytes {}..{} lie past the end of the file (truncated?)", r.start, r.end),
                    }
                } else {
                    Error::Io { path: p.to_path_buf(), source: e }
                }
            })?;
            stats.read(len as u64);
            Ok(Bytes::from(buf))
        })
        .collect()
}
