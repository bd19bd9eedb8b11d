//! Loading: open a manifest, then fetch only the chunks that selected leaves (or a slice of one
//! array) need, verify their BLAKE3 hashes, and assemble values.
//!
//! Memory stays bounded: leaves are processed in batches of at most `batch_bytes` of chunk data,
//! and a chunk buffer is dropped as soon as its leaf is assembled. Single-chunk arrays use the
//! read buffer itself (no second copy); with `mmap`, contiguous arrays are views of the file.

mod assemble;
mod fetch;
mod manifest_io;
pub mod one_pass;
mod select;
mod slices;
pub mod structure;

pub use manifest_io::*;
pub use select::*;
pub use slices::READ_INTO_BATCH;

use crate::error::{Error, Result};
use crate::format::container;
use crate::format::grid::{self, ChunkGrid};
use crate::format::hash::Hash32;
use crate::format::keypath::{self, Selection};
use crate::format::manifest::{self, ArrayEntry, ArrayStorage, ChunkRef, Entry, LeafInfo, Manifest, Stored};
use crate::format::model::{ArrayData, Leaf, Node, Step, Tree};
use crate::progress::Tracker;
use crate::store::{Layout, ReadMode, DIRECT_MIN_BYTES, MANIFEST_NAME};
use crate::Location;
use bytes::Bytes;
use rayon::prelude::*;
use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::{Arc, Mutex};

/// Options for [`crate::load`] and [`Reader::load`].
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Key-path globs; only matching leaves (and everything below matching nodes) are read.
    /// Unselected leaves come back as `None`. Empty = everything.
    pub select: Vec<String>,
    /// If set, only leaves whose key path is in this set are read (others come back as `None`).
    /// This is how a masked structure (`like=` in Python) selects leaves exactly.
    pub keep: Option<std::collections::HashSet<String>>,
    /// Check every chunk's BLAKE3 hash (default true).
    pub verify: bool,
    /// Return arrays as read-only views of a memory-mapped local file where possible.
    pub mmap: bool,
    /// Most chunk bytes held in flight at once.
    pub batch_bytes: u64,
    /// Called with (bytes read, bytes to read) as chunks arrive.
    pub progress: Option<crate::progress::ProgressFn>,
    /// If set, the load fails with [`Error::RootMismatch`] unless the tree's root hash
    /// (docs/format.md section 9) is this one, checked from the manifest before any data is read.
    pub expect_root: Option<crate::format::hash::Hash32>,
    /// With `Some`, a partial load builds a custom node whole once anything in it is selected,
    /// unless its type is in this set (types that may come back with some children `None`, as
    /// an `OrderedDict` of tensors may; a DataFrame cannot). `None` (the default): custom nodes
    /// are data, and may come back in part. A child named [`PARTIAL_ATTRS`] of a node built in
    /// part comes whenever the node does. See [`close_selection`].
    pub partial_types: Option<std::collections::HashSet<String>>,
    /// If set, the load fails unless the tree is signed by one of these keys (and as recently
    /// as asked), checked from the manifest and the signature before any data is read
    /// ([`Reader::verify_signature_async`], docs/signing.md).
    pub signed_by: Option<crate::sign::SignedBy>,
}

/// The child of a custom node that holds the node's own attributes rather than its contents
/// (the Python package's mappings: an `OrderedDict`'s `__dict__`, where torch keeps a
/// `state_dict()`'s `_metadata`): a node of [`LoadOptions::partial_types`] built in part still
/// gets it whole.
pub const PARTIAL_ATTRS: &str = "__dict__";

/// Whether `name` is the [`PARTIAL_ATTRS`] child of `node` that holds the node's attributes (a
/// custom node whose data says `"attrs": true`), not one of its contents.
pub fn is_attrs_child<L>(node: &Tree<L>, name: &str) -> bool {
    match node {
        Tree::Shared { node, .. } => is_attrs_child(node, name),
        Tree::Custom { data, .. } => name == PARTIAL_ATTRS && data.get("attrs") == Some(&serde_json::Value::Bool(true)),
        _ => false,
    }
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            select: vec![],
            keep: None,
            verify: true,
            mmap: false,
            batch_bytes: 64 << 20,
            progress: None,
            expect_root: None,
            partial_types: None,
            signed_by: None,
        }
    }
}

/// One problem found by [`Reader::verify`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The file the problem is in: a pack, or the single file.
    pub file: String,
    /// Key path of the leaf affected (empty for a problem with a whole file).
    pub key: String,
    /// Index of the chunk within the leaf's chunk list, if the problem is one chunk.
    pub chunk: Option<usize>,
    /// What is wrong, as an error message.
    pub reason: String,
}

/// Result of a full verification.
#[derive(Debug, Clone, Default)]
pub struct VerifyReport {
    /// Chunks read and re-hashed (chunks in packs found too short are skipped).
    pub chunks_checked: usize,
    /// Stored bytes of those chunks.
    pub bytes_checked: u64,
    /// Everything found wrong; empty if the tree is intact.
    pub problems: Vec<Problem>,
}

impl VerifyReport {
    /// True if no problems were found.
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// A lazy view of a stored tree: the manifest is read once, data on demand.
#[derive(Debug)]
pub struct Reader {
    loc: Location,
    manifest: Arc<Manifest>,
    manifest_file: String,
    /// Size of the manifest text, a cheap measure of how long freeing its tree takes.
    manifest_len: usize,
    mmaps: Mutex<HashMap<u32, Bytes>>,
}

/// Manifests at least this large are freed on a background thread when their reader goes.
const BACKGROUND_DROP_BYTES: usize = 1 << 20;

impl Drop for Reader {
    /// Freeing a 100k-leaf manifest tree takes milliseconds that a caller who has finished
    /// loading should not wait for: large ones are dropped on a short-lived thread instead.
    fn drop(&mut self) {
        if self.manifest_len < BACKGROUND_DROP_BYTES || Arc::strong_count(&self.manifest) > 1 {
            return;
        }
        let empty = Manifest {
            version: self.manifest.version,
            writer: String::new(),
            metadata: None,
            packs: vec![],
            root: Tree::List(vec![]),
        };
        crate::save::drop_in_background(std::mem::replace(&mut self.manifest, Arc::new(empty)));
    }
}

type ChunkKey = (u32, u64, u64);

/// A leaf scheduled for materialisation.
struct Job<'m> {
    id: usize,
    path: String,
    entry: &'m Entry,
}

const TAIL_READ: u64 = 64 << 10;

/// Batches with less chunk data than this are assembled on the calling thread.
const PARALLEL_MIN_BYTES: u64 = 4 << 20;
/// Threads one whole local load reads with (see [`Reader::fetch_local_whole`]): twice the
/// cores, at least 16 (a device serves more requests in flight faster, even on few cores;
/// beyond 32 nothing was gained: bench/RESULTS.md, "Measurements cited by code comments"), at
/// most 32. Readers mostly wait on the device, and each holds only the leaf it reads.
const MIN_READ_THREADS: usize = 16;
const MAX_READ_THREADS: usize = 32;
/// Batches a local load asks the kernel to read ahead (with `batch_bytes` of 64 MiB: 256 MiB).
const READ_AHEAD_BATCHES: u64 = 4;

impl Reader {
    /// Open the tree at a location (one request for a directory's manifest; one ranged read of
    /// the tail for a single file, plus one more if its manifest is larger than 64 KiB).
    ///
    /// # Errors
    /// [`Error::NotFound`] if no tree is there; format errors for damaged manifests.
    pub async fn open_async(loc: Location) -> Result<Reader> {
        let loc = loc.pin()?;
        let (bytes, file) = manifest_bytes(&loc).await?;
        let parse_file = file.clone();
        let manifest_len = bytes.len();
        let m = crate::runtime::maybe_spawn_blocking(move || manifest::decode(&bytes, &parse_file)).await?;
        Self::checked(loc, m, file, manifest_len)
    }

    /// The reader over manifest bytes already fetched from `loc` (decoded and checked here).
    pub(crate) fn from_bytes(loc: Location, bytes: &[u8], file: String) -> Result<Reader> {
        let m = manifest::decode(bytes, &file)?;
        Self::checked(loc, m, file, bytes.len())
    }

    /// The reader over a decoded manifest, once its packs are found to fit the layout.
    fn checked(loc: Location, m: Manifest, file: String, manifest_len: usize) -> Result<Reader> {
        for p in &m.packs {
            if !loc.layout().allows_pack(&p.path) {
                return Err(Error::manifest(
                    &file,
                    "packs",
                    format!("pack `{}` is not allowed in this layout", p.path),
                ));
            }
        }
        Ok(Reader { loc, manifest: Arc::new(m), manifest_file: file, manifest_len, mmaps: Mutex::default() })
    }

    /// A reader over a manifest parsed and checked already (with [`manifest::build`], which
    /// validates each leaf as it is read): a one-pass load reads its few stored leaves through
    /// a reader over the packs of the manifest it is parsing.
    pub(crate) fn from_parts(loc: Location, manifest: Manifest, manifest_file: String) -> Reader {
        Reader { loc, manifest: Arc::new(manifest), manifest_file, manifest_len: 0, mmaps: Mutex::default() }
    }

    /// Blocking [`Reader::open_async`].
    ///
    /// # Errors
    /// As [`Reader::open_async`].
    pub fn open(loc: Location) -> Result<Reader> {
        loc.clone().block_on(Self::open_async(loc))
    }

    /// Whether the location now holds another tree than the one this reader opened (a manifest
    /// naming other packs). An overwrite removes the packs only the replaced tree used, so a
    /// load that finds one of its packs missing may have raced one: it should read the new
    /// tree rather than fail (docs/security.md, "Readers racing an overwrite"). A single file
    /// is pinned when opened, so it is never replaced under its reader.
    pub async fn replaced_async(&self) -> bool {
        if self.loc.layout() == Layout::SingleFile {
            return false;
        }
        match manifest_bytes(&self.loc).await.and_then(|(b, f)| manifest::decode(&b, &f)) {
            Ok(now) => {
                now.packs.len() != self.manifest.packs.len()
                    || now.packs.iter().zip(&self.manifest.packs).any(|(a, b)| a.path != b.path || a.size != b.size)
            }
            Err(_) => false,
        }
    }

    /// Blocking [`Reader::replaced_async`].
    pub fn replaced(&self) -> bool {
        self.loc.block_on(self.replaced_async())
    }

    /// The location the tree is read from.
    pub fn location(&self) -> &Location {
        &self.loc
    }
    /// The manifest, as read when the reader was opened.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The tree's root hash (docs/format.md section 9), from the manifest alone.
    pub fn root_hash(&self) -> crate::format::hash::Hash32 {
        crate::format::merkle::root_hash(&self.manifest.root)
    }

    /// [`Error::RootMismatch`] unless the root hash is `opts.expect_root` (when set).
    fn check_root(&self, opts: &LoadOptions) -> Result<()> {
        opts.expect_root.map_or(Ok(()), |want| self.expect_root(want))
    }

    /// The signature check `opts.signed_by` asks for (when it does).
    async fn check_signed(&self, opts: &LoadOptions) -> Result<()> {
        match &opts.signed_by {
            Some(by) => self.verify_signature_async(by).await.map(drop),
            None => Ok(()),
        }
    }

    /// Check the tree's root hash against `want`, from the manifest alone.
    ///
    /// # Errors
    /// [`Error::RootMismatch`] naming both hashes when they differ.
    pub fn expect_root(&self, want: crate::format::hash::Hash32) -> Result<()> {
        let got = self.root_hash();
        if got == want {
            return Ok(());
        }
        Err(Error::RootMismatch {
            location: self.loc.display().to_string(),
            expected: want.to_hex(),
            actual: got.to_hex(),
        })
    }
    /// The tree with a [`LeafInfo`] at each leaf (no data read).
    ///
    /// # Errors
    /// [`Error::InvalidManifest`] when the leaves' key paths would take far more memory than
    /// the manifest (see [`Manifest::structure`](crate::format::manifest::Manifest::structure)).
    pub fn structure(&self) -> Result<Tree<LeafInfo>> {
        self.manifest.structure().map_err(|e| self.in_file(e))
    }

    /// [`close_selection`] of the whole tree, errors naming this tree's manifest: what a load
    /// with `opts` reads and builds (bindings audit exactly that).
    ///
    /// # Errors
    /// As [`close_selection`].
    pub fn close_selection(&self, opts: &LoadOptions) -> Result<Option<LoadOptions>> {
        close_selection(&self.manifest.root, "", opts).map_err(|e| self.in_file(e))
    }

    /// An error about this tree's manifest found without its file name, given it.
    fn in_file(&self, e: Error) -> Error {
        match e {
            Error::InvalidManifest { file, key, reason } if file.is_empty() => {
                Error::InvalidManifest { file: self.loc.display().to_string(), key, reason }
            }
            e => e,
        }
    }
    /// The stored node at a key path.
    ///
    /// # Errors
    /// [`Error::KeyNotFound`] / [`Error::BadKeyPath`].
    pub fn entry(&self, path: &str) -> Result<&Tree<Entry>> {
        keypath::resolve(&self.manifest.root, path)
    }

    fn pack_file(&self, pack: u32) -> String {
        self.manifest.packs.get(pack as usize).map_or_else(|| "?".into(), |p| self.loc.file_name(&p.path))
    }

    /// Load the whole tree (or the selected leaves).
    ///
    /// # Errors
    /// Storage errors, [`Error::ChunkCorrupt`] when a hash does not match, [`Error::OutOfMemory`].
    pub async fn load_async(&self, opts: &LoadOptions) -> Result<Node> {
        self.check_root(opts)?;
        self.check_signed(opts).await?;
        self.materialize(&self.manifest.root, String::new(), opts).await
    }

    /// Load the subtree at `path` (selection globs apply relative to the whole tree).
    ///
    /// # Errors
    /// As [`Reader::load_async`], plus [`Error::KeyNotFound`].
    pub async fn get_async(&self, path: &str, opts: &LoadOptions) -> Result<Node> {
        self.check_root(opts)?;
        self.check_signed(opts).await?;
        let place = keypath::resolve_place(&self.manifest.root, path)?;
        let prefix = keypath::split(path)?.join("/");
        if place.has_refs() {
            // Self-contained, with the objects it refers to (format 1.2).
            let local = localize(&self.manifest.root, place);
            return self.materialize(&local, prefix, opts).await;
        }
        self.materialize(place, prefix, opts).await
    }

    async fn materialize(&self, subtree: &Tree<Entry>, prefix: String, opts: &LoadOptions) -> Result<Node> {
        let unmatched = unmatched_patterns(subtree, &prefix, &opts.select).map_err(|e| self.in_file(e))?;
        if !unmatched.is_empty() {
            return Err(Error::KeyNotFound {
                path: unmatched.join("`, `"),
                reason: format!(
                    "select matches nothing in {} (`treepack ls` or Python's `treepack.load_structure` lists its key paths; a pattern that may \
                     match nothing is written with a leading `?`, e.g. `?ema/**`)",
                    self.loc.display()
                ),
            });
        }
        let closed = close_selection(subtree, &prefix, opts).map_err(|e| self.in_file(e))?;
        let opts = closed.as_ref().unwrap_or(opts);
        let sel = Selection::new(&opts.select)?;
        let everything = sel.is_all() && opts.keep.is_none();
        let mut stored = self.fetch_stored(subtree, &prefix, &sel, opts).await?.into_iter().peekable();
        let mut counter = 0usize;
        let unbuilt = unbuilt_objects(subtree, &prefix, opts)?;
        let r: Result<Node> = subtree.map_ref_steps(&mut |p, e| {
            let i = counter;
            counter += 1;
            if let Some((_, l)) = stored.next_if(|(j, _)| *j == i) {
                return Ok(l);
            }
            if !everything {
                let full = join_path(&prefix, &keypath::steps_text(p));
                if !is_selected(&sel, opts, &full) {
                    return Ok(Leaf::None);
                }
            }
            if !e.chunks().is_empty() {
                // Selected chunked leaves were materialised above; reaching here means a bug.
                return Err(Error::manifest(&self.manifest_file, keypath::steps_text(p), "leaf data was not read"));
            }
            inline_leaf_ref(e, &self.manifest_file, &|| join_path(&prefix, &keypath::steps_text(p)))
        });
        if unbuilt.is_empty() {
            return r;
        }
        Ok(prune(r?, &mut prefix.clone(), &unbuilt))
    }

    /// Verify, once each, the single chunks that more than one leaf of `batch` points at (same
    /// range, same expected hash); returns those that passed. A mismatch is reported for the
    /// first leaf that uses the chunk.
    fn verify_shared(
        &self,
        batch: &[Job<'_>],
        fetched: &HashMap<ChunkKey, Bytes>,
    ) -> Result<HashSet<(u32, u64, u64, Hash32)>> {
        let mut uses: HashMap<(u32, u64, u64, Hash32), (usize, usize)> = HashMap::new();
        for (n, j) in batch.iter().enumerate() {
            if let [c] = j.entry.chunks() {
                uses.entry((c.pack, c.offset, c.length, c.hash)).or_insert((n, 0)).1 += 1;
            }
        }
        let mut out = HashSet::new();
        for (k, (first, count)) in uses {
            if count < 2 {
                continue;
            }
            let job = &batch[first];
            if let [c] = job.entry.chunks() {
                self.chunk_bytes(&job.path, 0, c, fetched, job.entry.chunk_canonical(0), true)?;
                out.insert(k);
            }
        }
        Ok(out)
    }

    /// Every stored chunk of the tree once, in the order first referenced (depth-first), with
    /// its stored bytes, each decoded and checked against its hash: what an export copies.
    pub(crate) async fn stored_chunks_async(&self) -> Result<Vec<(ChunkKey, Bytes)>> {
        let mut seen = HashSet::new();
        let mut order = Vec::new();
        self.manifest.root.for_each_leaf(&mut |path, e| {
            for (i, c) in e.chunks().iter().enumerate() {
                if seen.insert((c.pack, c.offset, c.length)) {
                    order.push((path.to_string(), i, c.clone(), e.chunk_canonical(i)));
                }
            }
        });
        let keys = order.iter().map(|(_, _, c, _)| (c.pack, c.offset, c.length)).collect();
        let fetched = self.fetch_keys(keys, false, None, ReadMode::Buffered).await?;
        order
            .into_iter()
            .map(|(path, i, c, canonical)| {
                let key = (c.pack, c.offset, c.length);
                // chunk_bytes decodes and verifies; the stored bytes are what travels.
                self.chunk_bytes(&path, i, &c, &fetched, canonical, true)?;
                let stored = fetched.get(&key).cloned().unwrap_or_default();
                Ok((key, stored))
            })
            .collect()
    }

    /// Fetch the stored bytes of chunks, grouped by pack (mmap views when asked and local).
    async fn fetch(&self, refs: &[ChunkRef], mmap: bool) -> Result<HashMap<ChunkKey, Bytes>> {
        let keys = refs.iter().map(|r| (r.pack, r.offset, r.length)).collect();
        self.fetch_keys(keys, mmap, None, ReadMode::Buffered).await
    }

    /// Fetch byte ranges `(pack, offset, length)`, grouped by pack: mmap views when asked and
    /// local, local reads in `mode`.
    async fn fetch_keys(
        &self,
        keys: Vec<ChunkKey>,
        mmap: bool,
        progress: Option<&Tracker>,
        mode: ReadMode,
    ) -> Result<HashMap<ChunkKey, Bytes>> {
        let mut by_pack: HashMap<u32, Vec<(u64, u64)>> = HashMap::new();
        for (pack, off, len) in keys {
            by_pack.entry(pack).or_default().push((off, len));
        }
        let mut out = HashMap::new();
        let mut futs = Vec::new();
        for (pack, mut ranges) in by_pack {
            ranges.sort_unstable();
            ranges.dedup();
            let rel = self.manifest.packs[pack as usize].path.clone();
            if mmap {
                if let Some(map) = self.mmap_pack(pack, &rel)? {
                    for (off, len) in ranges {
                        let got = match self.map_range(pack, &map, off, len) {
                            Ok(b) => b,
                            Err(e) => {
                                let at = off..off + len;
                                return Err(self.name_leaf(e, pack, std::slice::from_ref(&at), Some(map.len() as u64)));
                            }
                        };
                        out.insert((pack, off, len), got);
                    }
                    continue;
                }
            }
            futs.push(async move {
                let want: Vec<Range<u64>> = ranges.iter().map(|&(o, l)| o..o + l).collect();
                let read = self.loc.read_ranges_with(&rel, want, mode, progress.map(|t| t as _)).await;
                let got = match read {
                    Ok(got) => got,
                    Err(e @ (Error::OutOfBounds { .. } | Error::Tampered { .. })) => {
                        // The store knows the file, not the leaves: name the leaf here.
                        let size = self.loc.size(&rel).await.ok();
                        let want: Vec<Range<u64>> = ranges.iter().map(|&(o, l)| o..o + l).collect();
                        return Err(self.name_leaf(e, pack, &want, size));
                    }
                    Err(e) => return Err(e),
                };
                Ok::<_, Error>(
                    ranges.into_iter().zip(got).map(move |((o, l), b)| ((pack, o, l), b)).collect::<Vec<_>>(),
                )
            });
        }
        for part in futures::future::try_join_all(futs).await? {
            out.extend(part);
        }
        Ok(out)
    }

    /// `e` (a read past the end of pack `pack`, which the store reports naming no leaf) naming
    /// the leaf it hit: the first, in tree order, with a chunk among `ranges` that ends past the
    /// file's `size` (or, the size unknown, that lies in them). Other errors come back as is.
    pub(crate) fn name_leaf(&self, e: Error, pack: u32, ranges: &[Range<u64>], size: Option<u64>) -> Error {
        if let Error::Tampered { file, key, start, end, reason } = e {
            // The segment that failed, named by the first leaf with bytes in it.
            let key = if key.is_empty() { self.leaf_at(pack, std::slice::from_ref(&(start..end)), None) } else { key };
            return Error::Tampered { file, key, start, end, reason };
        }
        let Error::OutOfBounds { file, key, reason } = e else { return e };
        if !key.is_empty() {
            return Error::OutOfBounds { file, key, reason };
        }
        Error::OutOfBounds { file, key: self.leaf_at(pack, ranges, size), reason }
    }

    /// The first leaf, in tree order, with a chunk of pack `pack` among `ranges` that ends past
    /// `size` (or, the size unknown, that lies in them); empty when none.
    fn leaf_at(&self, pack: u32, ranges: &[Range<u64>], size: Option<u64>) -> String {
        let mut hit: Option<String> = None;
        self.manifest.root.for_each_leaf(&mut |p, entry| {
            if hit.is_some() {
                return;
            }
            let bad = entry.chunks().iter().any(|c| {
                let end = c.offset.saturating_add(c.length);
                c.pack == pack
                    && ranges.iter().any(|r| c.offset < r.end && end > r.start)
                    && size.is_none_or(|size| end > size)
            });
            if bad {
                hit = Some(if p.is_root() { "<root>".to_string() } else { p.to_string() });
            }
        });
        hit.unwrap_or_default()
    }

    fn mmap_pack(&self, pack: u32, rel: &str) -> Result<Option<Bytes>> {
        let mut cache = self.mmaps.lock().map_err(|_| Error::internal("mmap cache poisoned"))?;
        if let Some(m) = cache.get(&pack) {
            return Ok(Some(m.clone()));
        }
        let m = self.loc.mmap(rel)?;
        if let Some(m) = &m {
            cache.insert(pack, m.clone());
        }
        Ok(m)
    }

    /// Re-hash every chunk and check every pack, collecting all problems instead of stopping
    /// at the first.
    ///
    /// # Errors
    /// Only for failures that prevent verification as a whole.
    pub async fn verify_async(&self) -> Result<VerifyReport> {
        let mut report = VerifyReport::default();
        if self.loc.layout() == Layout::SingleFile {
            let h = self.loc.read_range(".", 0..container::HEADER_LEN).await?;
            if let Err(e) = container::check_header(&h, self.loc.display()) {
                report.problems.push(Problem {
                    file: self.loc.display().into(),
                    key: String::new(),
                    chunk: None,
                    reason: e.to_string(),
                });
            }
        }
        let mut bad_packs = vec![false; self.manifest.packs.len()];
        for (i, p) in self.manifest.packs.iter().enumerate() {
            let problem = match self.loc.size(&p.path).await {
                Ok(actual) if actual >= p.size => continue,
                Ok(actual) => format!("pack has {actual} bytes, the manifest says {}", p.size),
                Err(e) => e.to_string(),
            };
            bad_packs[i] = true;
            report.problems.push(Problem {
                file: self.loc.file_name(&p.path),
                key: String::new(),
                chunk: None,
                reason: problem,
            });
        }
        // (key path, chunk index, chunk, canonical (length, element size)) of every stored chunk.
        type Check = (String, usize, ChunkRef, (u64, u64));
        let mut all: Vec<Check> = vec![];
        self.manifest.root.for_each_leaf_steps(&mut |p, e| {
            if e.chunks().is_empty() {
                return;
            }
            let path = keypath::steps_text(p);
            let grid = if let Entry::Array(a) = e { Some((a, a.grid())) } else { None };
            for (i, c) in e.chunks().iter().enumerate() {
                if bad_packs[c.pack as usize] {
                    continue;
                }
                let canonical = match &grid {
                    Some((a, g)) => (a.chunk_nbytes(g, i), a.dtype.itemsize()),
                    None => (e.nbytes(), 1),
                };
                all.push((path.clone(), i, c.clone(), canonical));
            }
        });
        let mut batch: Vec<Check> = vec![];
        let mut bytes = 0u64;
        let n = all.len();
        for (k, item) in all.into_iter().enumerate() {
            bytes += item.2.length;
            batch.push(item);
            if bytes >= (64 << 20) || k + 1 == n {
                let refs: Vec<ChunkRef> = batch.iter().map(|b| b.2.clone()).collect();
                let fetched = self.fetch(&refs, false).await?;
                let check = |(p, i, r, canonical): &Check| match self.chunk_bytes(p, *i, r, &fetched, *canonical, true)
                {
                    Ok(_) => None,
                    Err(e) => Some(Problem {
                        file: self.pack_file(r.pack),
                        key: p.clone(),
                        chunk: Some(*i),
                        reason: e.to_string(),
                    }),
                };
                let problems: Vec<Problem> = crate::runtime::parallel(|| batch.par_iter().filter_map(check).collect());
                report.chunks_checked += batch.len();
                report.bytes_checked += bytes;
                report.problems.extend(problems);
                batch.clear();
                bytes = 0;
            }
        }
        Ok(report)
    }

    // ---- blocking facade ----

    /// Blocking [`Reader::load_async`].
    ///
    /// # Errors
    /// As [`Reader::load_async`].
    pub fn load(&self, opts: &LoadOptions) -> Result<Node> {
        self.loc.block_on(self.load_async(opts))
    }
    /// Blocking [`Reader::get_async`].
    ///
    /// # Errors
    /// As [`Reader::get_async`].
    pub fn get(&self, path: &str) -> Result<Node> {
        self.loc.block_on(self.get_async(path, &LoadOptions::default()))
    }
    /// Blocking [`Reader::read_array_async`] (hashes verified).
    ///
    /// # Errors
    /// As [`Reader::read_array_async`].
    pub fn read_array(&self, path: &str, slice: &str) -> Result<ArrayData> {
        self.loc.block_on(self.read_array_async(path, slice, true))
    }
    /// Blocking [`Reader::read_into_async`] (chunk hashes verified).
    ///
    /// # Errors
    /// As [`Reader::read_into_async`].
    pub fn read_into(&self, path: &str, out: &mut [u8]) -> Result<()> {
        self.loc.block_on(self.read_into_async(path, out, true))
    }
    /// Blocking [`Reader::verify_async`].
    ///
    /// # Errors
    /// As [`Reader::verify_async`].
    pub fn verify(&self) -> Result<VerifyReport> {
        self.loc.block_on(self.verify_async())
    }
}

/// A leaf's zeroed output buffer, zeroed by the allocator (fresh pages for a big one, faulted in
/// by the threads that fill it) rather than by a memset on this thread.
fn alloc(n: u64, key: &str) -> Result<Vec<u8>> {
    crate::format::codec::zeroed(n).map_err(|_| Error::OutOfMemory { key: key.into(), bytes: n })
}

/// The single byte range covering all chunks of a raw multi-chunk array laid out contiguously,
/// in C order, in one pack (the default layout), if it is one.
fn span_of_array(a: &ArrayEntry) -> Option<ChunkKey> {
    let ArrayStorage::Chunked { chunks, .. } = &a.storage else { return None };
    if chunks.len() < 2 || chunks.iter().any(|c| !c.codec.is_identity()) || !contiguous_in_pack(&a.grid(), chunks) {
        return None;
    }
    let first = &chunks[0];
    Some((first.pack, first.offset, chunks.iter().map(|c| c.length).sum()))
}

fn span_of(e: &Entry) -> Option<ChunkKey> {
    match e {
        Entry::Array(a) => span_of_array(a),
        _ => None,
    }
}

fn contiguous_in_pack(grid: &ChunkGrid, chunks: &[ChunkRef]) -> bool {
    let n = chunks.len();
    (0..n).all(|i| grid::chunk_is_contiguous(grid, &grid.chunk_region(i as u64).1))
        && chunks.windows(2).all(|w| w[0].pack == w[1].pack && w[0].offset + w[0].length == w[1].offset)
}

fn inline_array(a: &ArrayEntry, file: &str, path: &str) -> Result<ArrayData> {
    match &a.storage {
        ArrayStorage::Inline(d) => ArrayData::new(a.dtype.clone(), a.shape.clone(), d.clone())
            .map(|d| d.annotated(a.annotation.as_ref()))
            .map_err(|e| Error::manifest(file, path, e.to_string())),
        // An empty array has a chunk grid and no chunks (shape `[0, 5]`): nothing to read.
        ArrayStorage::Chunked { chunks, .. } if chunks.is_empty() && a.shape.contains(&0) => {
            ArrayData::new(a.dtype.clone(), a.shape.clone(), Vec::new())
                .map(|d| d.annotated(a.annotation.as_ref()))
                .map_err(|e| Error::manifest(file, path, e.to_string()))
        }
        ArrayStorage::Chunked { .. } => Err(Error::manifest(file, path, "array data was not read")),
    }
}

/// The value of a leaf stored inline in the manifest. `path` names it in errors (built lazily:
/// this runs once per leaf of large trees).
fn inline_leaf_ref(e: &Entry, file: &str, path: &dyn Fn() -> String) -> Result<Leaf> {
    Ok(match e {
        Entry::None => Leaf::None,
        Entry::Bool(b) => Leaf::Bool(*b),
        Entry::Int(i) => Leaf::Int(i.clone()),
        Entry::Float(f) => Leaf::Float(*f),
        Entry::Complex(a, b) => Leaf::Complex(*a, *b),
        Entry::Str(Stored::Inline(s)) => Leaf::Str(s.clone()),
        Entry::Bytes(Stored::Inline(b)) => Leaf::Bytes(b.clone()),
        Entry::Array(a) => Leaf::Array(inline_array(a, file, &path())?),
        Entry::Str(Stored::Blob { .. }) | Entry::Bytes(Stored::Blob { .. }) => {
            return Err(Error::manifest(file, path(), "blob was not read"))
        }
        Entry::Fragment(f) => Leaf::Fragment(f.clone()),
    })
}
