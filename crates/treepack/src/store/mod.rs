//! Where trees live. Everything goes through the `object_store` crate — local disk, memory, S3,
//! GCS, Azure and (read-only) HTTP — with two local-only fast paths measured to matter: positioned
//! reads straight from the file, and memory maps.
//!
//! Remote stores get: credentials/region/endpoint from each cloud's usual environment variables
//! plus explicit [`StorageOptions`]; bounded request concurrency; retries with exponential backoff
//! (object_store's retry layer); multipart uploads with parallel parts for large objects; and
//! ranged reads that coalesce neighbouring chunks into few requests.
//!
//! Every read and write is counted in [`IoStats`], which tests use to prove partial loads touch
//! only the bytes they need.

pub(crate) mod beneath;
mod cloud;
#[cfg(target_os = "linux")]
mod direct;
mod durable;
#[cfg(feature = "failpoints")]
mod failpoint;
mod local;
mod marker;
mod multipart;
mod plan;
mod probe;

use beneath::{io_error, Kind};
use cloud::remote_store;
pub(crate) use cloud::store_error;
pub use cloud::{RemoteTuning, TUNING_KEYS};
pub use durable::journal;
pub use local::ReadMode;
pub(crate) use local::{direct_bytes_on_this_thread, DIRECT_MIN_BYTES};
use local::{normalize_local, open_pack, read_file_ranges};
pub use marker::SaveMarker;
use plan::plan_requests;

use crate::error::{Error, Result};
use crate::progress::Tracker;
use crate::runtime::maybe_spawn_blocking;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::memory::InMemory;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, WriteMultipart};
use std::collections::BTreeMap;
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

impl Layout {
    /// Whether a manifest in this layout may name this pack: a single file's only pack is
    /// itself (`.`), and a directory's packs are files inside it.
    pub fn allows_pack(self, pack_path: &str) -> bool {
        (pack_path == ".") == (self == Layout::SingleFile)
    }
}

/// Counters of storage traffic, shared by clones of a [`Location`].
#[derive(Debug, Default)]
pub struct IoStats {
    /// Read requests made (ranged GETs and file reads; remote existence and size checks count too).
    pub read_requests: AtomicU64,
    /// Bytes those reads returned.
    pub bytes_read: AtomicU64,
    /// Objects written (a multipart upload counts once).
    pub write_requests: AtomicU64,
    /// Bytes written by those requests.
    pub bytes_written: AtomicU64,
    /// Of `bytes_read`, those read straight from the device around the page cache
    /// ([`ReadMode::CachedOrDirect`]).
    pub bytes_read_direct: AtomicU64,
}

impl IoStats {
    /// Current value of [`IoStats::bytes_read`].
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read.load(Ordering::Relaxed)
    }
    /// Current value of [`IoStats::read_requests`].
    pub fn read_requests(&self) -> u64 {
        self.read_requests.load(Ordering::Relaxed)
    }
    /// Current value of [`IoStats::bytes_written`].
    pub fn bytes_written(&self) -> u64 {
        self.bytes_written.load(Ordering::Relaxed)
    }
    /// Current value of [`IoStats::write_requests`].
    pub fn write_requests(&self) -> u64 {
        self.write_requests.load(Ordering::Relaxed)
    }
    /// Current value of [`IoStats::bytes_read_direct`].
    pub fn bytes_read_direct(&self) -> u64 {
        self.bytes_read_direct.load(Ordering::Relaxed)
    }
    /// Set every counter back to zero.
    pub fn reset(&self) {
        for c in
            [&self.read_requests, &self.bytes_read, &self.write_requests, &self.bytes_written, &self.bytes_read_direct]
        {
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

/// Settings for a remote location, as `key -> value` strings: the keys of object_store's
/// builders (`aws_access_key_id`, `region`, `endpoint`, `google_service_account_key`,
/// `azure_storage_account_name`, `allow_http`, …) plus treepack's own [`TUNING_KEYS`].
/// Values given here override the environment.
pub type StorageOptions = BTreeMap<String, String>;

/// An object's version as read: what a compare-and-swap replace checks is still there.
#[derive(Debug, Clone)]
pub struct Version {
    e_tag: Option<String>,
    version: Option<String>,
    /// The bytes read (local files are compared by content).
    bytes: Bytes,
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
    /// Set for HTTP(S) locations, which can be read but not written.
    read_only: bool,
    /// Request shaping for remote stores (`None` for local disk and memory).
    remote: Option<RemoteTuning>,
    /// A local single file opened once by [`Location::pin`]: readers keep reading the file they
    /// opened even if a concurrent save replaces it (rename) under the same name.
    pinned: Option<Arc<std::fs::File>>,
    stats: Arc<IoStats>,
    /// A tree of the repository at this location (`LOCATION@NAME`, crate::repo): its manifest
    /// is found through the name's ref instead of `treepack.json`.
    tree: Option<Arc<str>>,
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
        Self::parse_with(s, &StorageOptions::new())
    }

    /// Parse a location with explicit [`StorageOptions`]. Besides local paths, `file://` and
    /// `memory://`, this accepts `s3://bucket/prefix` (also `s3a://`), `gs://bucket/prefix`,
    /// `az://container/prefix` (also `azure://`, `abfs[s]://container@account.dfs.core.windows.net/…`)
    /// and `http(s)://host/prefix` (read-only). Cloud settings come from the usual environment
    /// variables (`AWS_*`, `GOOGLE_*`, `AZURE_*`), overridden by `options`. An `endpoint` that
    /// starts with `http://` turns on plain-HTTP access (for local servers such as MinIO or moto).
    ///
    /// # Errors
    /// [`Error::BadLocation`] for unsupported schemes, malformed strings, unknown option keys
    /// and cloud clients that cannot be configured (e.g. no bucket).
    pub fn parse_with(s: &str, options: &StorageOptions) -> Result<Location> {
        let bad = |r: &str| Error::BadLocation { location: s.to_string(), reason: r.to_string() };
        if s.is_empty() {
            return Err(bad("empty location"));
        }
        if let Some((repo, name)) = Self::split_tree(s) {
            return Self::parse_with(repo, options)?.with_tree(name);
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
            return Ok(Self::in_memory(s, store, base, layout_for(prefix, false)));
        }
        if let Some((scheme, _)) = s.split_once("://") {
            if scheme != "file" {
                let (store, base, read_only, tuning) = remote_store(s, options).map_err(|r| bad(&r))?;
                return Ok(Location {
                    display: s.to_string(),
                    store,
                    layout: layout_for(base.as_ref(), false),
                    base,
                    local: None,
                    read_only,
                    remote: Some(tuning),
                    pinned: None,
                    stats: Arc::default(),
                    tree: None,
                });
            }
        }
        let path_str = s.strip_prefix("file://").unwrap_or(s);
        let path = normalize_local(&std::path::absolute(Path::new(path_str)).map_err(|e| bad(&e.to_string()))?);
        let is_file = std::fs::metadata(&path).map(|m| m.is_file()).unwrap_or(false);
        if is_file && crate::transport::is_document_file(&path) {
            return crate::transport::read_document_file(&path, s);
        }
        let layout = layout_for(path_str, is_file);
        let fs = object_store::local::LocalFileSystem::new();
        let base = ObjPath::from_absolute_path(&path).map_err(|e| bad(&e.to_string()))?;
        Ok(Location {
            display: s.to_string(),
            store: Arc::new(fs),
            base,
            layout,
            local: Some(path),
            read_only: false,
            remote: None,
            pinned: None,
            stats: Arc::default(),
            tree: None,
        })
    }

    /// A fresh in-memory location of its own (not reachable by a `memory://` name), shown as
    /// `display`: where a transport document is unpacked to be read.
    pub(crate) fn new_memory(display: &str) -> Location {
        Self::in_memory(display, Arc::new(InMemory::new()), ObjPath::default(), Layout::Directory)
    }

    fn in_memory(display: &str, store: Arc<InMemory>, base: ObjPath, layout: Layout) -> Location {
        Location {
            display: display.to_string(),
            store,
            base,
            layout,
            local: None,
            read_only: false,
            remote: None,
            pinned: None,
            stats: Arc::default(),
            tree: None,
        }
    }

    /// This location, refusing writes from now on (a transport document's, once unpacked).
    pub(crate) fn into_read_only(self) -> Location {
        Location { read_only: true, ..self }
    }

    /// Drop the process-wide `memory://bucket` store and everything in it (its memory is
    /// freed once no location uses it). Returns whether there was one.
    pub fn forget_memory(bucket: &str) -> bool {
        memory_stores().lock().map(|mut m| m.remove(bucket).is_some()).unwrap_or(false)
    }

    /// `LOCATION@NAME` names the tree `NAME` of the repository at `LOCATION`
    /// (docs/repository.md): split there when the text after the last `@` is a valid tree
    /// name, it lies in the path (not in a URL's `user@host`), and — for a local path — the
    /// whole text is not itself an existing file or folder.
    fn split_tree(s: &str) -> Option<(&str, &str)> {
        let (loc, name) = s.rsplit_once('@')?;
        if loc.is_empty() || crate::format::repo::validate_name(name).is_err() {
            return None;
        }
        if let Some((scheme, rest)) = loc.split_once("://") {
            // The `@` must come after the authority (the first `/` after `scheme://`).
            if !rest.contains('/') && scheme != "file" && scheme != "memory" {
                return None;
            }
        } else if Path::new(s).exists() {
            return None;
        }
        Some((loc, name))
    }

    /// The tree name of a `LOCATION@NAME` location.
    pub fn tree_name(&self) -> Option<&str> {
        self.tree.as_deref()
    }

    /// The repository of a `LOCATION@NAME` location (itself otherwise).
    pub fn repository(&self) -> Location {
        let Some(name) = &self.tree else { return self.clone() };
        let display = self.display[..self.display.len() - name.len() - 1].to_string();
        Location { display, tree: None, ..self.clone() }
    }

    /// The tree `name` of the repository at this location.
    ///
    /// # Errors
    /// [`Error::BadLocation`] for an invalid name or a single-file location.
    pub fn with_tree(&self, name: &str) -> Result<Location> {
        let bad = |r: String| Error::BadLocation { location: format!("{}@{name}", self.display), reason: r };
        crate::format::repo::validate_name(name).map_err(bad)?;
        if self.layout == Layout::SingleFile {
            return Err(bad("a repository is a folder or an object-store prefix, not a single file".into()));
        }
        let base = self.repository();
        Ok(Location { display: format!("{}@{name}", base.display), tree: Some(name.into()), ..base })
    }

    /// Whether the location is on a remote object store (S3, GCS, Azure, HTTP).
    pub fn is_remote(&self) -> bool {
        self.remote.is_some()
    }

    /// Run a read of this location to completion from synchronous code: a local tree's on the
    /// calling thread (its file reads run inline), anything else on the I/O runtime. Every
    /// blocking entry point of the library goes through here, so a local load never starts the
    /// runtime's threads.
    pub fn block_on<F: std::future::Future + Send>(&self, fut: F) -> F::Output
    where
        F::Output: Send,
    {
        if self.local.is_some() && tokio::runtime::Handle::try_current().is_err() {
            crate::runtime::block_on_here(fut)
        } else {
            crate::runtime::block_on(fut)
        }
    }

    /// For a local single file, open it now and read through that handle from then on (a
    /// no-op elsewhere). Readers pin so that a save replacing the file mid-read cannot make them
    /// mix the old manifest with the new file's bytes.
    ///
    /// # Errors
    /// [`Error::NotFound`] if the file does not exist; [`Error::Link`] if it is a symbolic link.
    pub fn pin(&self) -> Result<Location> {
        let (Some(t), Layout::SingleFile, None) = (self.target("."), self.layout, &self.pinned) else {
            return Ok(self.clone());
        };
        let f = t.open_read().map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                Error::no_tree(self.display.clone(), t.path().display())
            } else {
                io_error(t.path(), e)
            }
        })?;
        Ok(Location { pinned: Some(Arc::new(f)), ..self.clone() })
    }

    fn pinned_file(&self, rel: &str) -> Option<&Arc<std::fs::File>> {
        self.pinned.as_ref().filter(|_| rel == "." || rel.is_empty())
    }

    /// Request shaping of a remote location (`None` when local or in memory).
    pub fn remote_tuning(&self) -> Option<RemoteTuning> {
        self.remote
    }

    /// Whether the tree here is a directory or a single file.
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
        match (self.layout, &self.tree) {
            (Layout::SingleFile, _) => self.display.clone(),
            (Layout::Directory, None) => format!("{}/{}", self.display.trim_end_matches('/'), rel),
            (Layout::Directory, Some(_)) => self.repository().file_name(rel),
        }
    }

    fn obj(&self, rel: &str) -> ObjPath {
        if rel == "." || rel.is_empty() {
            return self.base.clone();
        }
        rel.split('/').fold(self.base.clone(), |p, seg| p.clone().join(seg))
    }

    /// A read's error: a missing manifest (or single file) means no tree; a missing pack, an
    /// incomplete or replaced one.
    fn store_err(&self, rel: &str, e: object_store::Error) -> Error {
        match e {
            object_store::Error::NotFound { .. } => self.not_found(rel, self.file_name(rel)),
            object_store::Error::AlreadyExists { .. } => Error::AlreadyExists { location: self.display.clone() },
            e => store_error(self.file_name(rel), e),
        }
    }

    /// A write's error: a 404 there means a missing bucket or container, not a missing tree.
    fn store_write_err(&self, rel: &str, e: object_store::Error) -> Error {
        match e {
            object_store::Error::AlreadyExists { .. } => Error::AlreadyExists { location: self.display.clone() },
            e => store_error(self.file_name(rel), e),
        }
    }

    fn not_found(&self, rel: &str, file: impl std::fmt::Display) -> Error {
        if rel == MANIFEST_NAME || rel == "." || rel.is_empty() {
            Error::no_tree(self.display.clone(), file)
        } else {
            Error::missing_part(self.display.clone(), file)
        }
    }

    /// Read a whole object, or `None` if it does not exist. `limit` caps the size accepted.
    pub async fn get_opt(&self, rel: &str, limit: u64) -> Result<Option<Bytes>> {
        if let Some(t) = self.target(rel) {
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
            self.stats.read(data.as_ref().map_or(0, |d| d.len() as u64));
            return Ok(data.map(Bytes::from));
        }
        Ok(self.get_remote(rel, limit).await?.map(|(b, _)| b))
    }

    /// Read a whole remote object and its metadata (ETag, version), or `None` if it does not
    /// exist. `limit` caps the size accepted.
    async fn get_remote(&self, rel: &str, limit: u64) -> Result<Option<(Bytes, object_store::ObjectMeta)>> {
        match self.store.get(&self.obj(rel)).await {
            Ok(r) => {
                if r.meta.size > limit {
                    return Err(Error::limit(
                        "object size",
                        limit,
                        format!("{} is {} bytes", self.file_name(rel), r.meta.size),
                    ));
                }
                let meta = r.meta.clone();
                let b = r.bytes().await.map_err(|e| self.store_err(rel, e))?;
                self.stats.read(b.len() as u64);
                Ok(Some((b, meta)))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.store_err(rel, e)),
        }
    }

    /// Whether an object exists. Remote stores answer with a one-byte ranged GET rather than a
    /// HEAD: the same single request, and it also works where HEAD is not served
    /// (gcp-storage-emulator, some static web servers).
    pub async fn exists(&self, rel: &str) -> Result<bool> {
        if self.remote.is_none() {
            return match self.size(rel).await {
                Ok(_) => Ok(true),
                Err(Error::NotFound { .. }) => Ok(false),
                Err(e) => Err(e),
            };
        }
        let opts = object_store::GetOptions { range: Some((0..1).into()), ..Default::default() };
        match self.store.get_opts(&self.obj(rel), opts).await {
            Ok(r) => {
                self.stats.read(0);
                drop(r);
                Ok(true)
            }
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            // An empty object cannot serve byte 0, but it exists.
            Err(e) if e.to_string().contains("416") => Ok(true),
            Err(e) => Err(self.store_err(rel, e)),
        }
    }

    /// Size of an object in bytes.
    pub async fn size(&self, rel: &str) -> Result<u64> {
        if let Some(f) = self.pinned_file(rel) {
            let p = self.local.clone().unwrap_or_default();
            return f.metadata().map(|m| m.len()).map_err(|e| Error::Io { path: p, source: e });
        }
        if let Some(t) = self.target(rel) {
            return match t.stat() {
                Ok(Some(m)) => Ok(m.len),
                Ok(None) => Err(self.not_found(rel, t.path().display())),
                Err(e) => Err(io_error(t.path(), e)),
            };
        }
        let m = self.store.head(&self.obj(rel)).await.map_err(|e| self.store_err(rel, e))?;
        self.stats.read(0);
        Ok(m.size)
    }

    /// Read several byte ranges of one object. Local files use positioned reads in parallel
    /// (straight from the device for big uncached ranges with [`ReadMode::CachedOrDirect`]);
    /// object stores coalesce nearby ranges into few requests.
    pub async fn read_ranges(&self, rel: &str, ranges: Vec<Range<u64>>, mode: ReadMode) -> Result<Vec<Bytes>> {
        if ranges.is_empty() {
            return Ok(vec![]);
        }
        let (stats, file) = (self.stats.clone(), self.file_name(rel));
        if let Some(f) = self.pinned_file(rel).cloned() {
            let p = self.local.clone().unwrap_or_default();
            return maybe_spawn_blocking(move || read_file_ranges(&f, &p, &ranges, &stats, &file, mode)).await;
        }
        if let Some(t) = self.target(rel) {
            let location = self.display.clone();
            return maybe_spawn_blocking(move || {
                read_file_ranges(&open_pack(&t, &location, &file)?, &t.path(), &ranges, &stats, &file, mode)
            })
            .await;
        }
        self.read_remote_ranges(rel, ranges, None).await
    }

    /// The size of a local file (`Ok(None)` if it does not exist; `Err` for a symlink or other
    /// failure). For non-local locations: `Ok(None)`.
    pub fn local_size(&self, rel: &str) -> Result<Option<u64>> {
        if let Some(f) = self.pinned_file(rel) {
            let p = self.local.clone().unwrap_or_default();
            return f.metadata().map(|m| Some(m.len())).map_err(|e| Error::Io { path: p, source: e });
        }
        let Some(t) = self.target(rel) else { return Ok(None) };
        t.stat().map(|m| m.map(|m| m.len)).map_err(|e| io_error(t.path(), e))
    }

    /// Hint that these ranges of a local file will be read next, so the kernel reads them ahead
    /// while the caller is busy (hashing the batch before). Only a hint: elsewhere, or if
    /// anything fails, nothing happens.
    pub fn will_need(&self, rel: &str, ranges: &[Range<u64>]) {
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            let file = match self.pinned_file(rel) {
                Some(f) => Some(f.clone()),
                None => self.target(rel).and_then(|t| t.open_read().ok()).map(Arc::new),
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

    /// Ranged reads against an object store: coalesced into few requests (see `plan_requests`),
    /// at most `max_concurrency` in flight, each retried with backoff by the client.
    pub async fn read_remote_ranges(
        &self,
        rel: &str,
        ranges: Vec<Range<u64>>,
        progress: Option<&Tracker>,
    ) -> Result<Vec<Bytes>> {
        let tuning = self.remote.unwrap_or_default();
        let path = self.obj(rel);
        let plan = plan_requests(&ranges, tuning.max_request_bytes);
        let fetched: Vec<(Range<u64>, Vec<usize>, Bytes)> =
            futures::stream::iter(plan.into_iter().map(|(req, members)| {
                let path = &path;
                async move {
                    let b = self.store.get_range(path, req.clone()).await.map_err(|e| self.store_err(rel, e))?;
                    if (b.len() as u64) != req.end - req.start {
                        return Err(Error::OutOfBounds {
                            file: self.file_name(rel),
                            key: String::new(),
                            reason: format!(
                                "asked for bytes {}..{}, got {} bytes (truncated?)",
                                req.start,
                                req.end,
                                b.len()
                            ),
                        });
                    }
                    self.stats.read(b.len() as u64);
                    if let Some(t) = progress {
                        t.advance(b.len() as u64);
                    }
                    Ok((req, members, b))
                }
            }))
            .buffer_unordered(tuning.max_concurrency)
            .try_collect()
            .await?;
        let mut out = vec![Bytes::new(); ranges.len()];
        for (req, members, b) in fetched {
            for i in members {
                let r = &ranges[i];
                out[i] = b.slice((r.start - req.start) as usize..(r.end - req.start) as usize);
            }
        }
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
        let r = match self.store.get_opts(&self.obj(rel), opts).await {
            Ok(r) => r,
            // Azure has no suffix ranges: ask for the size, then read the tail (two requests).
            Err(object_store::Error::NotSupported { .. }) => {
                let size = self.size(rel).await?;
                let start = size.saturating_sub(n);
                return Ok((self.read_range(rel, start..size).await?, size));
            }
            Err(e) => return Err(self.store_err(rel, e)),
        };
        let size = r.meta.size;
        let b = r.bytes().await.map_err(|e| self.store_err(rel, e))?;
        self.stats.read(b.len() as u64);
        Ok((b, size))
    }

    /// Read one byte range of an object.
    pub async fn read_range(&self, rel: &str, range: Range<u64>) -> Result<Bytes> {
        Ok(self.read_ranges(rel, vec![range], ReadMode::Buffered).await?.pop().unwrap_or_default())
    }

    /// Read `out.len()` bytes of a local file at `offset` straight into `out`: one copy, from
    /// the page cache or the device, into memory the caller already has. `Ok(false)` for
    /// locations that are not local (the caller fetches instead).
    pub fn read_local_into(&self, rel: &str, offset: u64, out: &mut [u8]) -> Result<bool> {
        use std::os::unix::fs::FileExt;
        let Some(t) = self.target(rel) else { return Ok(false) };
        let p = t.path();
        let opened;
        let f = match self.pinned_file(rel) {
            Some(f) => f.as_ref(),
            None => {
                opened = t.open_read().map_err(|e| match e.kind() {
                    std::io::ErrorKind::NotFound => self.not_found(rel, p.display()),
                    _ => io_error(p.clone(), e),
                })?;
                &opened
            }
        };
        f.read_exact_at(out, offset).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => Error::OutOfBounds {
                file: self.file_name(rel),
                key: String::new(),
                reason: format!("the file ends before byte {}", offset + out.len() as u64),
            },
            _ => Error::Io { path: p.clone(), source: e },
        })?;
        self.stats.read(out.len() as u64);
        Ok(true)
    }

    /// Memory-map a local file. `None` for non-local locations.
    ///
    /// The mapping is private and copy-on-write (`MAP_PRIVATE`, as `torch.load(mmap=True)` and
    /// numpy's `mmap_mode="c"` map): the file is never written, and a framework that writes into
    /// a loaded tensor in place gets private pages instead of a crash. Where the system refuses a
    /// writable private mapping, a read-only one.
    pub fn mmap(&self, rel: &str) -> Result<Option<Bytes>> {
        let Some(t) = self.target(rel) else { return Ok(None) };
        let p = t.path();
        let f = match self.pinned_file(rel) {
            Some(f) => f.try_clone().map_err(|e| Error::Io { path: p.clone(), source: e })?,
            None => t.open_read().map_err(|e| io_error(p.clone(), e))?,
        };
        // SAFETY: treepack never modifies committed files in place (writes are temp + rename),
        // so the mapping stays valid; callers opt in to mmap knowing another program could
        // truncate the file underneath them.
        // Arrays are read front to back: sequential advice makes a page fault read ahead from
        // the fault instead of around it (measured on a cold cache, touching a 540 KiB array of
        // a 250 MiB pack: 7-8 ms -> ~4 ms). Only a hint; failure changes nothing.
        match unsafe { memmap2::MmapOptions::new().map_copy(&f) } {
            Ok(m) => {
                #[cfg(unix)]
                let _ = m.advise(memmap2::Advice::Sequential);
                Ok(Some(Bytes::from_owner(m)))
            }
            Err(_) => {
                let m = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| Error::Io { path: p, source: e })?;
                #[cfg(unix)]
                let _ = m.advise(memmap2::Advice::Sequential);
                Ok(Some(Bytes::from_owner(m)))
            }
        }
    }

    /// Write an object atomically and durably. `create_only` fails with
    /// [`Error::AlreadyExists`] if the object exists (conditional put).
    pub async fn put(&self, rel: &str, parts: Vec<Bytes>, create_only: bool) -> Result<()> {
        self.put_tracked(rel, parts, create_only, true, None).await
    }

    /// Fail with [`Error::ReadOnly`] on locations that cannot be written (HTTP).
    pub fn refuse_write(&self) -> Result<()> {
        if self.read_only {
            return Err(Error::ReadOnly {
                location: self.display.clone(),
                reason: if self.remote.is_some() {
                    "HTTP(S) locations can only be read; save to s3://, gs://, az:// or a local path".into()
                } else {
                    "a JSON transport document is read as a tree but not written to; save to a directory or a .tpk (`treepack import DOC DST` stores the document's tree)".into()
                },
            });
        }
        Ok(())
    }

    /// [`put`](Self::put), reporting bytes written to `progress`. On remote stores, objects of at
    /// least `multipart_threshold` bytes go up as a multipart upload with parallel parts (an
    /// upload is invisible until it completes, and is aborted on error). On local disk the file
    /// is fsynced before it is renamed into place, and its directory after, unless `durable` is
    /// false (an object store's successful PUT is durable either way).
    pub async fn put_tracked(
        &self,
        rel: &str,
        parts: Vec<Bytes>,
        create_only: bool,
        durable: bool,
        progress: Option<&Tracker>,
    ) -> Result<()> {
        self.refuse_write()?;
        #[cfg(feature = "failpoints")]
        failpoint::before_put();
        let n: u64 = parts.iter().map(|b| b.len() as u64).sum();
        // Conditional create needs a single PUT; manifests are always far below the threshold, and
        // a large single-file object was checked for existence when the save began.
        if let Some(t) = self.remote.filter(|t| n >= t.multipart_threshold) {
            self.put_multipart(rel, parts, t, progress).await?;
            self.stats.wrote(n);
            return Ok(());
        }
        if let Some(t) = self.target(rel) {
            self.put_local(t, parts, create_only, durable).await?;
            self.stats.wrote(n);
            if let Some(t) = progress {
                t.advance(n);
            }
            return Ok(());
        }
        let payload: PutPayload = parts.into_iter().collect();
        let mode = if create_only { PutMode::Create } else { PutMode::Overwrite };
        self.store
            .put_opts(&self.obj(rel), payload, PutOptions { mode, ..Default::default() })
            .await
            .map_err(|e| self.store_write_err(rel, e))?;
        self.stats.wrote(n);
        if let Some(t) = progress {
            t.advance(n);
        }
        Ok(())
    }

    /// Read a whole object with its version (what [`Location::replace_if_unchanged`] compares
    /// against), or `None` if it does not exist.
    ///
    /// # Errors
    /// As [`Location::get_opt`].
    pub async fn get_versioned(&self, rel: &str, limit: u64) -> Result<Option<(Bytes, Version)>> {
        if self.local.is_some() {
            let got = self.get_opt(rel, limit).await?;
            return Ok(got.map(|b| (b.clone(), Version { e_tag: None, version: None, bytes: b })));
        }
        Ok(self
            .get_remote(rel, limit)
            .await?
            .map(|(b, m)| (b.clone(), Version { e_tag: m.e_tag, version: m.version, bytes: b })))
    }

    /// Replace an object only if it is still the version `was` (read by
    /// [`Location::get_versioned`]; `None`: only if it still does not exist) — a
    /// compare-and-swap: object stores' conditional put (`If-Match` on the ETag), a locked
    /// compare-then-rename on local disk. Returns `false`, writing nothing, when another writer
    /// changed it first.
    ///
    /// # Errors
    /// Storage errors; [`Error::BadLocation`] on a store without conditional updates.
    pub async fn replace_if_unchanged(
        &self,
        rel: &str,
        parts: Vec<Bytes>,
        was: Option<&Version>,
        durable: bool,
    ) -> Result<bool> {
        self.refuse_write()?;
        let n: u64 = parts.iter().map(|b| b.len() as u64).sum();
        if let Some(t) = self.target(rel) {
            let ok = self.replace_local_if(t, parts, was.map(|v| v.bytes.clone()), durable).await?;
            if ok {
                self.stats.wrote(n);
            }
            return Ok(ok);
        }
        let mode = match was {
            None => PutMode::Create,
            Some(v) => {
                PutMode::Update(object_store::UpdateVersion { e_tag: v.e_tag.clone(), version: v.version.clone() })
            }
        };
        let payload: PutPayload = parts.into_iter().collect();
        match self.store.put_opts(&self.obj(rel), payload, PutOptions { mode, ..Default::default() }).await {
            Ok(_) => {
                self.stats.wrote(n);
                Ok(true)
            }
            Err(object_store::Error::Precondition { .. } | object_store::Error::AlreadyExists { .. }) => Ok(false),
            Err(object_store::Error::NotImplemented { .. }) => Err(Error::BadLocation {
                location: self.display.clone(),
                reason: "this store cannot replace an object conditionally (S3: set the storage option \
                         conditional_put=etag)"
                    .into(),
            }),
            Err(e) => Err(self.store_write_err(rel, e)),
        }
    }

    /// Delete an object; a missing object is not an error.
    pub async fn delete(&self, rel: &str) -> Result<()> {
        self.refuse_write()?;
        if let Some(t) = self.target(rel) {
            return durable::remove_target(&t).map(drop).map_err(|e| io_error(t.path(), e));
        }
        match self.store.delete(&self.obj(rel)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.store_write_err(rel, e)),
        }
    }

    /// List objects under a folder of the location, as paths relative to the location, with
    /// their sizes and last-modified times. On local disk, a symbolic link among them (or on the
    /// way to the folder) is refused ([`Error::Link`]).
    pub async fn list(&self, rel_dir: &str) -> Result<Vec<(String, u64, std::time::SystemTime)>> {
        self.list_where(rel_dir, |_| true).await
    }

    /// [`list`](Self::list), of the names `keep` accepts: only those are refused for being a
    /// link (`gc` lists a folder for a few names among others).
    pub(crate) async fn list_where(
        &self,
        rel_dir: &str,
        keep: impl Fn(&str) -> bool,
    ) -> Result<Vec<(String, u64, std::time::SystemTime)>> {
        let prefix = self.obj(rel_dir);
        if let Some(t) = self.target(rel_dir) {
            // object_store hides staging files (`name#N`); list the folder directly so `gc` sees them.
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
            return Ok(out);
        }
        let mut s = self.store.list(Some(&prefix));
        let mut out = vec![];
        let base_len = self.base.parts().count();
        while let Some(m) = s.next().await {
            let m = m.map_err(|e| self.store_err(rel_dir, e))?;
            let rel: Vec<String> = m.location.parts().skip(base_len).map(|p| p.as_ref().to_string()).collect();
            if keep(rel.last().map_or("", String::as_str)) {
                out.push((rel.join("/"), m.size, std::time::SystemTime::from(m.last_modified)));
            }
        }
        out.sort();
        Ok(out)
    }

    /// Delete a local staging/leftover file by relative path (used by `gc`); a link is refused.
    pub fn remove_local(&self, rel: &str) -> Result<bool> {
        match self.target(rel) {
            Some(t) => durable::remove_target(&t).map_err(|e| io_error(t.path(), e)),
            None => Ok(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_schemes_parse_and_bad_ones_are_refused() {
        let mut o = StorageOptions::new();
        o.insert("region".into(), "us-east-1".into());
        o.insert("endpoint".into(), "http://127.0.0.1:9".into());
        let l = Location::parse_with("s3://bucket/some/prefix", &o).unwrap();
        assert!(l.is_remote());
        assert_eq!(l.base.as_ref(), "some/prefix");
        assert_eq!(l.layout(), Layout::Directory);
        let l = Location::parse_with("s3://bucket/x/ckpt.tpk", &o).unwrap();
        assert_eq!(l.layout(), Layout::SingleFile);
        let l = Location::parse("http://127.0.0.1:9/bucket/tree").unwrap();
        assert!(l.read_only);
        o.insert("no_such_option".into(), "1".into());
        let e = Location::parse_with("s3://bucket/p", &o).unwrap_err();
        assert_eq!(e.kind(), "bad_location");
        assert!(e.to_string().contains("no_such_option"), "{e}");
        let e = Location::parse("ftp://host/x").unwrap_err();
        assert!(e.to_string().contains("not supported"), "{e}");
        let mut o = StorageOptions::new();
        o.insert("max_concurrency".into(), "many".into());
        assert!(Location::parse_with("s3://b/p", &o).unwrap_err().to_string().contains("whole number"));
    }
}
