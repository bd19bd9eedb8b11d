//! [`Location`]: a backend rooted at one place, with what every backend shares — the layout,
//! the name shown in messages, the traffic counters and whether it may be written. Its methods
//! hand the work to the backend.

use crate::backend::{Backend, Listed, Progress, RangeRead, Swap, Version, Write, WriteStream};
use crate::local::{Local, SaveMarker};
use crate::{Error, Layout, ReadMode, RemoteTuning, Result, StorageOptions, MANIFEST_NAME};
use bytes::Bytes;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

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
    /// Count one read request of `n` bytes.
    pub fn read(&self, n: u64) {
        self.read_requests.fetch_add(1, Ordering::Relaxed);
        self.bytes_read.fetch_add(n, Ordering::Relaxed);
    }
    pub(crate) fn wrote(&self, n: u64) {
        self.write_requests.fetch_add(1, Ordering::Relaxed);
        self.bytes_written.fetch_add(n, Ordering::Relaxed);
    }
}

/// A place a tree is (or will be) stored: a [`Backend`] rooted at a folder, a file or a
/// prefix, its [`Layout`], the name it is shown by, its traffic counters, and whether it may be
/// written. Cheap to clone; clones share the counters.
#[derive(Debug, Clone)]
pub struct Location {
    backend: Arc<dyn Backend>,
    layout: Layout,
    /// The location as messages name it.
    display: Arc<str>,
    /// The name its files are shown under (`<files>/<rel>`): the display string, unless the
    /// location was [`relabeled`](Location::relabeled).
    files: Arc<str>,
    /// Why writes are refused, when they are.
    read_only: Option<Arc<str>>,
    stats: Arc<IoStats>,
    /// For an encrypted location, its backend again (`backend` is this, as a `dyn Backend`):
    /// the key and what the location learned (docs/encryption.md).
    crypt: Option<Arc<crate::crypt::Encrypted>>,
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
        if let Some(rest) = s.strip_prefix("memory://") {
            let (backend, layout) = crate::memory::open(rest).map_err(|r| bad(&r))?;
            return Ok(Self::with_backend(s, Arc::new(backend), layout));
        }
        if let Some((scheme, _)) = s.split_once("://") {
            if scheme != "file" {
                let (backend, layout) = crate::object::open(s, options).map_err(|r| bad(&r))?;
                return Ok(Self::with_backend(s, Arc::new(backend), layout));
            }
        }
        let path_str = s.strip_prefix("file://").unwrap_or(s);
        let path = std::path::absolute(Path::new(path_str)).map_err(|e| bad(&e.to_string()))?;
        let (local, layout) = Local::open(&path, path_str);
        Ok(Self::with_backend(s, Arc::new(local), layout))
    }

    /// A location on `backend`, laid out as `layout` and shown as `display`. Writes are refused
    /// when the backend says it cannot be written.
    pub fn with_backend(display: &str, backend: Arc<dyn Backend>, layout: Layout) -> Location {
        let display: Arc<str> = display.into();
        Location {
            read_only: backend.read_only().map(Arc::from),
            backend,
            layout,
            files: display.clone(),
            display,
            stats: Arc::default(),
            crypt: None,
        }
    }

    /// This location, encrypted with `source`: saves seal the tree's files (a fresh data key
    /// per save, wrapped by `source`), and reads open them, refusing a tree that is not
    /// encrypted (docs/encryption.md). Objects beside the tree (a signature) stay clear.
    pub fn with_encryption(&self, source: crate::KeySource) -> Location {
        self.encrypted_by(source, None)
    }

    /// [`with_encryption`](Self::with_encryption) with the data key and salt fixed, so that a
    /// save is byte-identical each time: for golden files only (a fixed data key reused across
    /// saves of different trees would repeat AES-GCM nonces).
    #[doc(hidden)]
    pub fn with_fixed_encryption(&self, source: crate::KeySource, data_key: [u8; 32], salt: [u8; 32]) -> Location {
        self.encrypted_by(source, Some((treepack_format::crypt::DataKey(data_key), salt)))
    }

    fn encrypted_by(
        &self,
        source: crate::KeySource,
        fixed: Option<(treepack_format::crypt::DataKey, [u8; 32])>,
    ) -> Location {
        let plain = self.plain();
        let e = Arc::new(crate::crypt::Encrypted::new(plain, source, fixed));
        Location { backend: e.clone(), crypt: Some(e), ..self.clone() }
    }

    /// The location one save writes through: for an encrypted location, the same key and what
    /// the location learned, with a data key of the save's own (two saves through one location,
    /// at once or one retried after a failure, never share one). Itself elsewhere.
    pub fn for_save(&self) -> Location {
        match &self.crypt {
            Some(e) => {
                let e = Arc::new(e.for_save());
                Location { backend: e.clone(), crypt: Some(e), ..self.clone() }
            }
            None => self.clone(),
        }
    }

    /// This location without its encryption: its files' stored bytes.
    fn plain(&self) -> Location {
        match &self.crypt {
            Some(e) => Location { crypt: None, ..e.plain().clone() }.relabeled(&self.display),
            None => self.clone(),
        }
    }

    /// The files' bytes as stored: for an encrypted location, the same location without its
    /// key (what the files hold on disk: what a digest of the files is of); itself elsewhere.
    pub fn stored(&self) -> Location {
        self.plain()
    }

    /// For an encrypted location whose tree was read, what it is encrypted with (`the 32-byte
    /// key 8d10e47c8bf2374e`, `a passphrase`, `the key provider's key "…"`).
    pub fn encrypted_with(&self) -> Option<String> {
        self.crypt.as_ref().and_then(|e| e.encrypted_with())
    }

    /// Whether the location was given a key ([`with_encryption`](Self::with_encryption)).
    pub fn is_encrypted(&self) -> bool {
        self.crypt.is_some()
    }

    /// For an encrypted location, the key the save in progress names its packs with (instead
    /// of a name derived from their content alone, which would let anyone confirm a guess of
    /// it). `None` for a plain location.
    ///
    /// # Errors
    /// A key provider that fails to wrap the save's data key; no randomness.
    pub fn pack_name_key(&self) -> Result<Option<[u8; 32]>> {
        match &self.crypt {
            Some(e) => Ok(Some(treepack_format::crypt::pack_name_key(&e.write_key()?.0))),
            None => Ok(None),
        }
    }

    /// A fresh in-memory location of its own (not reachable by a `memory://` name), shown as
    /// `display`.
    pub fn new_memory(display: &str) -> Location {
        Self::with_backend(display, Arc::new(crate::memory::fresh()), Layout::Directory)
    }

    /// This location, refusing writes from now on with [`Error::ReadOnly`] giving `reason`.
    pub fn refusing_writes(self, reason: &str) -> Location {
        Location { read_only: Some(reason.into()), ..self }
    }

    /// This location shown as `display` in messages and by [`display`](Self::display); its
    /// files keep the names they had (`<old display>/<path>`).
    pub fn relabeled(&self, display: &str) -> Location {
        Location { display: display.into(), ..self.clone() }
    }

    /// Drop the process-wide `memory://bucket` store and everything in it (its memory is
    /// freed once no location uses it). Returns whether there was one.
    pub fn forget_memory(bucket: &str) -> bool {
        crate::memory::forget(bucket)
    }

    /// The backend the location's objects are kept in.
    pub fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }

    /// The local-only capabilities, when the location is on local disk.
    pub fn local(&self) -> Option<&Local> {
        self.backend.local()
    }

    /// Whether the location is on a remote object store (S3, GCS, Azure, HTTP).
    pub fn is_remote(&self) -> bool {
        self.backend.remote().is_some()
    }

    /// For a local single file, open it now and read through that handle from then on (a
    /// no-op elsewhere). Readers pin so that a save replacing the file mid-read cannot make them
    /// mix the old manifest with the new file's bytes.
    ///
    /// # Errors
    /// [`Error::NotFound`] if the file does not exist; [`Error::Link`] if it is a symbolic link.
    pub fn pin(&self) -> Result<Location> {
        if let Some(e) = &self.crypt {
            // The stored file pinned, read with the same key and nothing learned yet.
            let plain = self.plain().pin()?;
            let e = Arc::new(e.fresh(plain));
            return Ok(Location { backend: e.clone(), crypt: Some(e), ..self.clone() });
        }
        match self.local().filter(|_| self.layout == Layout::SingleFile) {
            Some(l) => match l.pin(self)? {
                Some(pinned) => Ok(Location { backend: Arc::new(pinned), ..self.clone() }),
                None => Ok(self.clone()),
            },
            None => Ok(self.clone()),
        }
    }

    /// For a single-file location, the single file beside it named as it is plus `suffix`
    /// (`model.tpk` → `model.tpk.sig`), on the same store with the same credentials: where a
    /// single file keeps what travels with it.
    ///
    /// # Errors
    /// [`Error::BadLocation`] for a directory location, or a store that cannot name it.
    pub fn sidecar(&self, suffix: &str) -> Result<Location> {
        let backend = match self.layout {
            Layout::SingleFile => self.backend.sidecar(suffix),
            Layout::Directory => None,
        };
        let Some(backend) = backend else {
            return Err(Error::BadLocation {
                location: self.display.to_string(),
                reason: format!("has no file beside it named with `{suffix}` (not a single file)"),
            });
        };
        let display = format!("{}{suffix}", self.display);
        Ok(Location {
            read_only: self.read_only.clone(),
            backend,
            layout: Layout::SingleFile,
            files: display.as_str().into(),
            display: display.into(),
            stats: self.stats.clone(),
            // What travels beside a tree (its signature) is clear.
            crypt: None,
        })
    }

    /// Request shaping of a remote location (`None` when local or in memory).
    pub fn remote_tuning(&self) -> Option<RemoteTuning> {
        self.backend.remote()
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
    /// `None` for an encrypted location: its files hold ciphertext, read through the backend.
    pub fn local_path(&self) -> Option<&Path> {
        if self.crypt.is_some() {
            return None;
        }
        self.local().map(Local::path)
    }

    /// Display name of a file inside the location (for error messages).
    pub fn file_name(&self, rel: &str) -> String {
        match self.layout {
            Layout::SingleFile => self.display.to_string(),
            Layout::Directory => format!("{}/{}", self.files.trim_end_matches('/'), rel),
        }
    }

    /// The error for a missing object `rel` (shown as `file`): a missing manifest (or single
    /// file) means no tree here; a missing pack, an incomplete or replaced tree.
    pub fn not_found(&self, rel: &str, file: impl std::fmt::Display) -> Error {
        if rel == MANIFEST_NAME || rel == "." || rel.is_empty() {
            Error::no_tree(self.display.to_string(), file)
        } else {
            Error::missing_part(self.display.to_string(), file)
        }
    }

    /// Read a whole object, or `None` if it does not exist. `limit` caps the size accepted.
    pub async fn get_opt(&self, rel: &str, limit: u64) -> Result<Option<Bytes>> {
        Ok(self.backend.get(self, rel, limit).await?.map(|(b, _)| b))
    }

    /// Read a whole object with its version (what [`Location::replace_if_unchanged`] compares
    /// against), or `None` if it does not exist.
    ///
    /// # Errors
    /// As [`Location::get_opt`].
    pub async fn get_versioned(&self, rel: &str, limit: u64) -> Result<Option<(Bytes, Version)>> {
        self.backend.get(self, rel, limit).await
    }

    /// Whether an object exists. Remote stores answer with a one-byte ranged GET rather than a
    /// HEAD: the same single request, and it also works where HEAD is not served
    /// (gcp-storage-emulator, some static web servers).
    pub async fn exists(&self, rel: &str) -> Result<bool> {
        self.backend.exists(self, rel).await
    }

    /// Size of an object in bytes.
    pub async fn size(&self, rel: &str) -> Result<u64> {
        self.backend.size(self, rel).await
    }

    /// Read several byte ranges of one object. Local files use positioned reads in parallel
    /// (straight from the device for big uncached ranges with [`ReadMode::CachedOrDirect`]);
    /// object stores coalesce nearby ranges into few requests.
    pub async fn read_ranges(&self, rel: &str, ranges: Vec<Range<u64>>, mode: ReadMode) -> Result<Vec<Bytes>> {
        self.read_ranges_with(rel, ranges, mode, None).await
    }

    /// [`read_ranges`](Self::read_ranges), reporting the bytes to `progress` as they arrive.
    pub async fn read_ranges_with(
        &self,
        rel: &str,
        ranges: Vec<Range<u64>>,
        mode: ReadMode,
        progress: Option<&dyn Progress>,
    ) -> Result<Vec<Bytes>> {
        if ranges.is_empty() {
            return Ok(vec![]);
        }
        self.backend.read_ranges(self, rel, RangeRead { ranges, mode, progress }).await
    }

    /// Ranged reads through the page cache, reported to `progress` as they arrive. On object
    /// stores: coalesced into few requests, at most `max_concurrency` in flight, each retried
    /// with backoff by the client.
    pub async fn read_remote_ranges(
        &self,
        rel: &str,
        ranges: Vec<Range<u64>>,
        progress: Option<&dyn Progress>,
    ) -> Result<Vec<Bytes>> {
        self.read_ranges_with(rel, ranges, ReadMode::Buffered, progress).await
    }

    /// Read one byte range of an object.
    pub async fn read_range(&self, rel: &str, range: Range<u64>) -> Result<Bytes> {
        Ok(self.read_ranges(rel, vec![range], ReadMode::Buffered).await?.pop().unwrap_or_default())
    }

    /// Read the last `n` bytes of an object (all of it if smaller) in one request, returning
    /// them with the object's total size.
    pub async fn read_suffix(&self, rel: &str, n: u64) -> Result<(Bytes, u64)> {
        self.backend.read_suffix(self, rel, n).await
    }

    /// Read `out.len()` bytes of a local file at `offset` straight into `out`: one copy, from
    /// the page cache or the device, into memory the caller already has. `Ok(false)` for
    /// locations that are not local (the caller fetches instead).
    pub fn read_local_into(&self, rel: &str, offset: u64, out: &mut [u8]) -> Result<bool> {
        match self.local().filter(|_| self.crypt.is_none()) {
            Some(l) => l.read_into(self, rel, offset, out).map(|()| true),
            None => Ok(false),
        }
    }

    /// Memory-map a local file (see [`Local::mmap`]). `None` for non-local locations.
    pub fn mmap(&self, rel: &str) -> Result<Option<Bytes>> {
        self.local().filter(|_| self.crypt.is_none()).map(|l| l.mmap(rel)).transpose()
    }

    /// The size of a local file (`Ok(None)` if it does not exist; `Err` for a symlink or other
    /// failure). For non-local locations: `Ok(None)`.
    pub fn local_size(&self, rel: &str) -> Result<Option<u64>> {
        self.local().filter(|_| self.crypt.is_none()).map_or(Ok(None), |l| l.size(rel))
    }

    /// Hint that these ranges of a local file will be read next, so the kernel reads them ahead
    /// while the caller is busy (hashing the batch before). Only a hint: elsewhere, or if
    /// anything fails, nothing happens.
    pub fn will_need(&self, rel: &str, ranges: &[Range<u64>]) {
        // An encrypted file's plain offsets are not its stored ones.
        if let Some(l) = self.local().filter(|_| self.crypt.is_none()) {
            l.will_need(rel, ranges);
        }
    }

    /// Write an object atomically and durably. `create_only` fails with
    /// [`Error::AlreadyExists`] if the object exists (conditional put).
    pub async fn put(&self, rel: &str, parts: Vec<Bytes>, create_only: bool) -> Result<()> {
        self.put_tracked(rel, parts, create_only, true, None).await
    }

    /// Fail with [`Error::ReadOnly`] on locations that cannot be written (HTTP, or what the
    /// location was made read-only for).
    pub fn refuse_write(&self) -> Result<()> {
        match &self.read_only {
            Some(reason) => Err(Error::ReadOnly { location: self.display.to_string(), reason: reason.to_string() }),
            None => Ok(()),
        }
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
        progress: Option<&dyn Progress>,
    ) -> Result<()> {
        self.before_put()?;
        let n: u64 = parts.iter().map(|b| b.len() as u64).sum();
        self.backend.put(self, rel, Write { parts, create_only, durable, progress }).await?;
        self.stats.wrote(n);
        Ok(())
    }

    /// What every put checks first (and where the crash tests' failpoint stops the process).
    fn before_put(&self) -> Result<()> {
        self.refuse_write()?;
        #[cfg(feature = "failpoints")]
        crate::local::failpoint::before_put();
        Ok(())
    }

    /// [`put_tracked`](Self::put_tracked) of parts made while the object is written (each asked
    /// for once the one before is written): a single file written as its chunks are hashed. An
    /// `Err` part ends the write with nothing committed; so does a stream the caller abandons
    /// (it sends an `Err`). Local disk writes the parts as they come; other stores gather them
    /// first (`Backend::put_stream`).
    pub async fn put_stream(
        &self,
        rel: &str,
        parts: Box<dyn Iterator<Item = Result<Bytes>> + Send>,
        create_only: bool,
        durable: bool,
        progress: Option<&dyn Progress>,
    ) -> Result<()> {
        self.before_put()?;
        let (parts, n) = crate::backend::counted(parts);
        let stream = WriteStream { parts, create_only, durable, progress };
        self.backend.put_stream(self, rel, stream).await?;
        self.stats.wrote(n.load(Ordering::Relaxed));
        Ok(())
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
        let ok = self.backend.replace_if(self, rel, Swap { parts, was, durable }).await?;
        if ok {
            self.stats.wrote(n);
        }
        Ok(ok)
    }

    /// Delete an object; a missing object is not an error.
    pub async fn delete(&self, rel: &str) -> Result<()> {
        self.refuse_write()?;
        self.backend.delete(self, rel).await
    }

    /// List objects under a folder of the location, as paths relative to the location, with
    /// their sizes and last-modified times. On local disk, a symbolic link among them (or on the
    /// way to the folder) is refused ([`Error::Link`]).
    pub async fn list(&self, rel_dir: &str) -> Result<Vec<Listed>> {
        self.list_where(rel_dir, |_| true).await
    }

    /// [`list`](Self::list), of the names `keep` accepts: only those are refused for being a
    /// link (`gc` lists a folder for a few names among others).
    pub async fn list_where(&self, rel_dir: &str, keep: impl Fn(&str) -> bool + Sync) -> Result<Vec<Listed>> {
        self.backend.list(self, rel_dir, &keep).await
    }

    /// The names directly inside a directory location (files and folders, links included, not
    /// followed), at most `limit` of them; empty when the folder does not exist yet. Remote
    /// stores answer with one delimited listing (one request).
    ///
    /// # Errors
    /// Storage errors listing the folder.
    pub async fn top_entries(&self, limit: usize) -> Result<Vec<String>> {
        if self.layout != Layout::Directory {
            return Ok(vec![]);
        }
        self.backend.top_names(self, limit).await
    }

    /// Delete a local staging/leftover file by relative path (used by `gc`); a link is refused.
    pub fn remove_local(&self, rel: &str) -> Result<bool> {
        self.local().map_or(Ok(false), |l| l.remove(rel))
    }

    /// Make the names written so far in a local folder of the location durable (fsync the
    /// directory); a no-op elsewhere.
    pub async fn sync_dir(&self, rel_dir: &str) -> Result<()> {
        match self.local().filter(|_| self.layout == Layout::Directory) {
            Some(l) => l.sync_dir(rel_dir).await,
            None => Ok(()),
        }
    }

    /// Mark a local save as running until the marker is dropped (see [`SaveMarker`]): `gc`
    /// keeps what it writes meanwhile. Creates the location's directory (durably, when
    /// `durable`). `None` for object stores.
    pub fn save_marker(&self, durable: bool) -> Result<Option<SaveMarker>> {
        self.local().map_or(Ok(None), |l| l.save_marker(durable))
    }

    /// When the oldest local save still running here started, and the markers of dead saves
    /// removed (relative names), for `gc`. `(None, [])` for object stores.
    pub fn running_saves(&self) -> Result<(Option<std::time::SystemTime>, Vec<String>)> {
        self.local().map_or(Ok((None, vec![])), Local::running_saves)
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
        assert!(format!("{:?}", l.backend()).contains("some/prefix"), "{:?}", l.backend());
        assert_eq!(l.layout(), Layout::Directory);
        let l = Location::parse_with("s3://bucket/x/ckpt.tpk", &o).unwrap();
        assert_eq!(l.layout(), Layout::SingleFile);
        let l = Location::parse("http://127.0.0.1:9/bucket/tree").unwrap();
        assert_eq!(l.refuse_write().unwrap_err().kind(), "read_only");
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
