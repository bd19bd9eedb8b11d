//! Saving: turn an in-memory tree into a manifest plus pack files, and commit atomically.
//!
//! Order of work: (1) walk the tree, slicing arrays into chunks (zero-copy where a chunk is a
//! contiguous run of the array), (2) hash every chunk and compute previews in parallel,
//! (3) lay unique chunks out in packs at 64-byte alignment, (4) write packs — for big directory
//! saves, each pack as soon as it is laid out while later chunks are hashed — then (5) commit the
//! manifest last — with a create-only put unless overwriting — so a reader never sees a partial
//! tree, and (6) when overwriting, delete the packs only the old tree used.

mod buffers;
mod check;
mod commit;
mod compression;
mod packs;

pub use buffers::{drop_in_background, fragment_writer, BACKGROUND_DROP_LEAVES};
pub use compression::{Compression, Rule, AUTO_MIN_SIZE, AUTO_ZSTD_LEVEL, DEFAULT_ZSTD_LEVEL};

use crate::error::{Error, Result};
use crate::format::codec::{Codec, Encoding};
use crate::format::container;
use crate::format::dtype::DType;
use crate::format::grid::{self, ChunkGrid, DimSel};
use crate::format::hash::Hash32;
use crate::format::keypath::{self, Glob};
use crate::format::manifest::{self, ArrayEntry, ArrayStorage, ChunkRef, Entry, Manifest, PackInfo, Stored, MAX_NDIM};
use crate::format::model::{ArrayData, Leaf, Node, Step, Tree};
use crate::format::preview;
use crate::progress::Tracker;
use crate::store::{Layout, MANIFEST_NAME, PACKS_DIR};
use crate::Location;
use bytes::Bytes;
use check::check_tree;
pub(crate) use commit::Written;
use commit::{commit, old_packs, SingleStream};
pub use commit::{commit_parts_async, save_part_async};
pub(crate) use packs::Reuse;
use packs::{hash_and_layout, hash_and_write_pipelined, write_packs, PackOut};
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};

/// Options for [`crate::save()`].
#[derive(Debug, Clone)]
pub struct SaveOptions {
    /// Replace a tree already at the location (default: fail with `AlreadyExists`).
    pub overwrite: bool,
    /// Free-form JSON stored in the manifest's `metadata` member.
    pub metadata: Option<Value>,
    /// Target chunk size for arrays without an explicit chunk shape.
    pub chunk_bytes: u64,
    /// Explicit chunk shapes by key-path glob (first match wins).
    pub chunk_shapes: Vec<(String, Vec<u64>)>,
    /// Arrays and bytes of at most this many bytes are stored inline in the manifest.
    pub inline_bytes: usize,
    /// Strings of at most this many UTF-8 bytes are stored inline in the manifest.
    pub inline_str_bytes: usize,
    /// Target pack file size; a save writes several packs in parallel when larger.
    pub pack_bytes: u64,
    /// Compute the `preview` (first values, min, max) of each chunked array.
    pub preview: bool,
    /// The `writer` string recorded in the manifest.
    pub writer: String,
    /// Packs written at once.
    pub concurrency: usize,
    /// Chunk bytes hashed per batch. A directory save with more chunk bytes than this hashes on
    /// a separate thread and writes each pack as soon as it is laid out, so hashing overlaps
    /// the writes (the layout and the files are the same either way).
    pub pipeline_batch_bytes: u64,
    /// Called with (bytes written, bytes to write) as packs (or multipart parts) are stored.
    pub progress: Option<crate::progress::ProgressFn>,
    /// How chunks are compressed (default: not at all; see [`Compression::parse`]).
    pub compression: Compression,
    /// On local disk, fsync every pack before the manifest that names it is written, the
    /// manifest before it is renamed into place, and the directories after (default: true):
    /// when the save returns, the tree survives a power cut or a kernel crash, not only a
    /// killed process (docs/format.md, "Commit protocol"). `false` skips the fsyncs, for
    /// scratch data; the commit stays atomic against a killed process. Object stores are
    /// durable once a PUT succeeds, so remote saves ignore it.
    pub durable: bool,
    /// Store the manifest compressed (one zstd frame, format 1.6): `Some(true)` always,
    /// `Some(false)` never, `None` (the default) when `compression` compresses anything and the
    /// tree is a single file or a repository's — a directory's `treepack.json` stays plain
    /// JSON, readable with any tool, unless asked.
    pub manifest_compression: Option<bool>,
}

impl SaveOptions {
    /// Whether this save stores its manifest compressed (see `manifest_compression`), as a
    /// single file or a repository's tree (`opaque`) or as a directory's `treepack.json`.
    pub(crate) fn packs_manifest(&self, opaque: bool) -> bool {
        self.manifest_compression.unwrap_or(!self.compression.is_none() && opaque)
    }
}

/// zstd's level for a compressed manifest: JSON compresses well at the default, which keeps
/// a manifest of hundreds of MB to a few seconds.
pub(crate) const MANIFEST_ZSTD_LEVEL: i32 = 3;

impl Default for SaveOptions {
    fn default() -> Self {
        SaveOptions {
            overwrite: false,
            metadata: None,
            chunk_bytes: grid::DEFAULT_CHUNK_BYTES,
            chunk_shapes: vec![],
            inline_bytes: 128,
            inline_str_bytes: 4096,
            pack_bytes: 256 << 20,
            preview: true,
            writer: concat!("treepack-rs/", env!("CARGO_PKG_VERSION")).to_string(),
            concurrency: 4,
            pipeline_batch_bytes: 64 << 20,
            durable: true,
            progress: None,
            compression: Compression::none(),
            manifest_compression: None,
        }
    }
}

/// What a save wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaveInfo {
    /// The location saved to, as displayed.
    pub location: String,
    /// Number of leaves in the tree, of every kind.
    pub leaves: usize,
    /// Number of array leaves (inline ones included).
    pub arrays: usize,
    /// Logical bytes of all arrays.
    pub array_bytes: u64,
    /// Bytes written to storage (packs + manifest, or the whole file).
    pub bytes_written: u64,
    /// Chunks to store (array chunks and string/bytes blobs), before deduplication.
    pub chunks: usize,
    /// Chunks actually stored after deduplication.
    pub unique_chunks: usize,
    /// Number of pack files the manifest lists.
    pub packs: usize,
    /// Stored bytes of chunks a repository already held, referred to instead of written
    /// (0 outside a repository).
    pub bytes_reused: u64,
    /// The tree's root hash (docs/format.md section 9), for saves into a repository (a
    /// repository records it with the name); `None` elsewhere, where
    /// [`crate::root_hash`] computes it from the location.
    pub root: Option<Hash32>,
}

/// A chunk waiting to be hashed and placed; referenced by index from the entry tree.
struct Pending {
    data: Bytes,
    /// dtype for min/max previews (None for blobs or when previews are off).
    dtype: Option<DType>,
    /// How to compress it (None: raw), and its element size (for the shuffle).
    encoding: Option<Encoding>,
    itemsize: u64,
}

/// Placeholder marker in `ChunkRef::pack` before layout.
const UNPLACED: u32 = u32::MAX;

/// Slice an array into its chunks (zero-copy for contiguous chunks).
fn array_chunks(a: &ArrayData, grid: &ChunkGrid) -> Vec<Bytes> {
    let n = grid.num_chunks().unwrap_or(0);
    let itemsize = a.dtype().itemsize();
    let data = a.bytes();
    (0..n)
        .map(|i| {
            let (origin, extent) = grid.chunk_region(i);
            let len = (extent.iter().product::<u64>() * itemsize) as usize;
            if grid::chunk_is_contiguous(grid, &extent) {
                let off = grid::c_offset(&grid.shape, &origin, itemsize) as usize;
                data.slice(off..off + len)
            } else {
                let sel: Vec<DimSel> = origin
                    .iter()
                    .zip(&extent)
                    .map(|(&o, &e)| DimSel { start: o, count: e, step: 1, keep: true })
                    .collect();
                let mut out = vec![0u8; len];
                let zeros = vec![0u64; grid.shape.len()];
                grid::copy_chunk(&mut out, &sel, &zeros, &grid.shape, data, itemsize as usize);
                Bytes::from(out)
            }
        })
        .collect()
}

/// The format minor a writer stamps a manifest with: the oldest that holds its tree, so a tree
/// that needs nothing newer is written byte-identical to what older writers made, and older
/// readers read it. 1.0 when every chunk is raw; 1.1 adds codecs; 1.2 shared nodes and refs;
/// 1.3 array annotations (`as`); 1.4 dicts written as JSON objects; 1.5 the dtypes of 1.5
/// (`dtype_minor`: the largest [`DType::since_minor`] of the tree's arrays).
pub(crate) fn oldest_minor(dtype_minor: u16, object_dicts: bool, annotated: bool, refs: bool, compressed: bool) -> u16 {
    let features = [(object_dicts, 4), (annotated, 3), (refs, 2), (compressed, 1)];
    features.iter().filter(|(used, _)| *used).map(|(_, m)| *m).fold(dtype_minor, u16::max)
}

struct Planner<'o> {
    opts: &'o SaveOptions,
    globs: Vec<(Glob, Vec<u64>)>,
    pending: Vec<Pending>,
    arrays: usize,
    array_bytes: u64,
    /// Whether some array carries an annotation (`as`, format 1.3).
    annotated: bool,
    /// The newest format minor an array's dtype needs (5 for the dtypes of format 1.5).
    dtype_minor: u16,
    /// (address, length, dtype) of buffers already pending → their index. `Bytes` are
    /// immutable and all kept alive by `pending`, so equal addresses mean equal contents.
    same_buffer: HashMap<(usize, usize, Option<DType>), usize>,
}

fn placeholder(i: usize) -> ChunkRef {
    ChunkRef { pack: UNPLACED, offset: i as u64, length: 0, codec: Codec::Raw, hash: Hash32([0; 32]) }
}

impl Planner<'_> {
    fn push(&mut self, data: Bytes, dtype: Option<DType>, encoding: Option<Encoding>, itemsize: u64) -> ChunkRef {
        // The same buffer reached twice (one object shared by many leaves) is planned once:
        // hashed once, then deduplicated like any repeated content.
        let id = (data.as_ptr() as usize, data.len(), dtype.clone());
        if !data.is_empty() {
            if let Some(&i) = self.same_buffer.get(&id) {
                return placeholder(i);
            }
        }
        self.pending.push(Pending { data, dtype, encoding, itemsize });
        let i = self.pending.len() - 1;
        self.same_buffer.insert(id, i);
        placeholder(i)
    }

    /// The compression policy's encoding for a stored leaf (key-path texts only computed when
    /// a rule looks at them).
    fn encoding(&self, path: &[Step<'_>], dtype: Option<&DType>, is_str: bool, nbytes: u64) -> Option<Encoding> {
        let c = &self.opts.compression;
        if c.is_none() {
            return None;
        }
        let texts = if c.needs_paths() { keypath::steps_texts(path) } else { vec![] };
        c.encoding_for(&texts, dtype, is_str, nbytes)
    }

    fn leaf(&mut self, path: &[Step<'_>], leaf: &Leaf) -> Result<Entry> {
        Ok(match leaf {
            Leaf::None => Entry::None,
            Leaf::Bool(b) => Entry::Bool(*b),
            Leaf::Int(i) => Entry::Int(i.clone()),
            Leaf::Float(f) => Entry::Float(*f),
            Leaf::Complex(a, b) => Entry::Complex(*a, *b),
            Leaf::Str(s) if s.len() <= self.opts.inline_str_bytes => Entry::Str(Stored::Inline(s.clone())),
            Leaf::Str(s) => {
                let enc = self.encoding(path, None, true, s.len() as u64);
                let chunk = self.push(Bytes::copy_from_slice(s.as_bytes()), None, enc, 1);
                Entry::Str(Stored::Blob { size: s.len() as u64, chunk })
            }
            Leaf::Bytes(b) if b.len() <= self.opts.inline_bytes => Entry::Bytes(Stored::Inline(b.clone())),
            Leaf::Bytes(b) => {
                let enc = self.encoding(path, None, false, b.len() as u64);
                let chunk = self.push(b.clone(), None, enc, 1);
                Entry::Bytes(Stored::Blob { size: b.len() as u64, chunk })
            }
            Leaf::Array(a) => self.array(path, a)?,
            // `write_data` expanded any fragment whose strings this save would not inline.
            Leaf::Fragment(f) => Entry::Fragment(f.clone()),
        })
    }

    fn array(&mut self, path: &[Step<'_>], a: &ArrayData) -> Result<Entry> {
        let path_text = || keypath::steps_text(path);
        let dtype = a.dtype().clone();
        let shape = a.shape().to_vec();
        if shape.len() > MAX_NDIM {
            return Err(Error::invalid_tree(path_text(), format!("{} dimensions (limit {MAX_NDIM})", shape.len())));
        }
        self.arrays += 1;
        self.annotated |= a.annotation().is_some();
        self.dtype_minor = self.dtype_minor.max(a.dtype().since_minor());
        self.array_bytes += a.nbytes();
        // A block of a sharded array (a part of a save shared by processes) is always chunked:
        // the committer puts its chunks on the whole array's grid.
        if a.nbytes() as usize <= self.opts.inline_bytes && a.block().is_none() {
            return Ok(Entry::Array(Box::new(ArrayEntry {
                dtype,
                shape,
                storage: ArrayStorage::Inline(a.bytes().clone()),
                preview: None,
                annotation: a.annotation().cloned(),
            })));
        }
        // Key-path texts are only needed to match `chunk_shapes` patterns.
        let texts = if self.globs.is_empty() { vec![] } else { keypath::steps_texts(path) };
        let chunk_shape = match self.globs.iter().find(|(g, _)| g.matches(&texts)) {
            Some((g, cs)) => {
                if cs.len() != shape.len() || cs.contains(&0) {
                    return Err(Error::invalid_tree(
                        path_text(),
                        format!("chunk shape {cs:?} (from pattern `{}`) does not fit shape {shape:?}", g.source()),
                    ));
                }
                cs.clone()
            }
            None => match (a.chunk_shape_hint(), a.block()) {
                (Some(c), _) => c.to_vec(),
                (None, Some(b)) => grid::block_chunk_shape(&shape, b, dtype.itemsize(), self.opts.chunk_bytes),
                (None, None) => grid::default_chunk_shape(&shape, dtype.itemsize(), self.opts.chunk_bytes),
            },
        };
        let grid =
            ChunkGrid::new(shape.clone(), chunk_shape.clone()).map_err(|r| Error::invalid_tree(path_text(), r))?;
        let mm_dtype = if self.opts.preview { Some(dtype.clone()) } else { None };
        let enc = self.encoding(path, Some(&dtype), false, a.nbytes());
        let itemsize = dtype.itemsize();
        let chunks: Vec<ChunkRef> =
            array_chunks(a, &grid).into_iter().map(|c| self.push(c, mm_dtype.clone(), enc, itemsize)).collect();
        let preview = if self.opts.preview { Some(preview::head(&dtype, a.bytes())) } else { None };
        Ok(Entry::Array(Box::new(ArrayEntry {
            dtype,
            shape,
            storage: ArrayStorage::Chunked { chunk_shape, chunks },
            preview,
            annotation: a.annotation().cloned(),
        })))
    }
}

/// Give every array of `node` that `stored` (the manifest tree it was loaded from) keeps on a
/// chunk grid that grid as its save hint ([`ArrayData::with_chunk_shape`]): saving the loaded
/// tree again then writes the same chunks, and the copy has the same root hash. Places where
/// the two trees differ (a partial load) are left alone.
pub fn keep_chunk_shapes(node: &mut Node, stored: &Tree<Entry>) {
    match (node, stored) {
        (Tree::Leaf(Leaf::Array(a)), Tree::Leaf(Entry::Array(e))) => {
            if let ArrayStorage::Chunked { chunk_shape, .. } = &e.storage {
                if let Ok(with) = a.clone().with_chunk_shape(Some(chunk_shape.clone())) {
                    *a = with;
                }
            }
        }
        (Tree::List(a), Tree::List(b)) | (Tree::Tuple(a), Tree::Tuple(b)) => {
            a.iter_mut().zip(b).for_each(|(x, y)| crate::format::model::grow(|| keep_chunk_shapes(x, y)))
        }
        (Tree::Dict(a), Tree::Dict(b)) => {
            a.iter_mut().zip(b).for_each(|((_, x), (_, y))| crate::format::model::grow(|| keep_chunk_shapes(x, y)))
        }
        (Tree::Record { fields: a, .. }, Tree::Record { fields: b, .. })
        | (Tree::Custom { children: a, .. }, Tree::Custom { children: b, .. }) => {
            a.iter_mut().zip(b).for_each(|((_, x), (_, y))| crate::format::model::grow(|| keep_chunk_shapes(x, y)))
        }
        (Tree::Shared { node: a, .. }, Tree::Shared { node: b, .. }) => keep_chunk_shapes(a, b),
        _ => {}
    }
}

/// Whether `tree` holds a fragment that a save with this inline limit must turn into nodes.
fn needs_expansion(tree: &Node, inline_str_bytes: usize) -> bool {
    let mut found = false;
    tree.for_each_leaf_unpathed(&mut |l| {
        if let Leaf::Fragment(f) = l {
            found |= f.longest_str() > inline_str_bytes;
        }
    });
    found
}

/// Save `tree` at `loc` (a place, not a tree of a repository: [`crate::save_async`] sends
/// those to the repository).
///
/// # Errors
/// [`Error::AlreadyExists`] unless overwriting, [`Error::InvalidTree`] for unsaveable trees,
/// storage errors.
pub async fn save_async(tree: &Node, loc: &Location, opts: &SaveOptions) -> Result<SaveInfo> {
    if loc.tree_name().is_some() {
        // A tree of a repository is saved by the repository (crate::save_async decides).
        return Err(Error::BadLocation {
            location: loc.display().to_string(),
            reason: "a tree of a repository is saved through the repository (treepack::save, or the repository's save)"
                .into(),
        });
    }
    // Its own data key when encrypted: a key left by a failed save, or another save's through
    // a clone of `loc`, is never used again.
    let loc = &loc.for_save();
    let w = write_data(tree, loc, opts, None).await?;
    commit(loc, w, opts).await
}

/// A save into a folder that holds other files and no tree is refused, with or without
/// overwrite (as JAX's saver refuses "a directory that is not a previous checkpoint"): writing
/// a tree among a user's files mixes them, and a later overwrite or gc of the tree would be
/// working in someone else's folder. What treepack itself leaves there (packs and staging
/// files of a save that died, markers of running saves) is not foreign. Local folders only: on
/// an object store a prefix is not a folder anyone works in, and the check would cost every
/// save a listing request (docs/design.md).
async fn refuse_foreign_folder(loc: &Location) -> Result<()> {
    const SHOWN: usize = 5;
    let entries = loc.top_entries(64).await?;
    if entries.iter().any(|n| n == crate::format::repo::MARKER) {
        return Err(Error::BadLocation {
            location: loc.display().to_string(),
            reason: "this folder is a treepack repository, not a tree: save into it as LOCATION@NAME".into(),
        });
    }
    let own = |n: &str| {
        n == MANIFEST_NAME
            || n == crate::sign::DIR_SIGNATURE
            || n == crate::store::PACKS_DIR
            || n.starts_with(&format!("{MANIFEST_NAME}#"))
            || n.starts_with(&format!("{MANIFEST_NAME}.lock"))
            || n.starts_with(".saving-")
    };
    let foreign: Vec<&String> = entries.iter().filter(|n| !own(n)).collect();
    if foreign.is_empty() {
        return Ok(());
    }
    let mut names: Vec<&str> = foreign.iter().take(SHOWN).map(|s| s.as_str()).collect();
    names.sort_unstable();
    let more = if foreign.len() > SHOWN { " …" } else { "" };
    Err(Error::BadLocation {
        location: loc.display().to_string(),
        reason: format!(
            "refusing to save into a folder that holds other files and no treepack tree ({}{more}); save to a new \
             or empty folder (overwrite= replaces a tree, never other files)",
            names.join(", ")
        ),
    })
}

/// The pack size target of an encrypted directory save (docs/encryption.md, Performance).
const ENCRYPTED_PACK_BYTES: u64 = 64 << 20;

/// Hash, lay out and write the packs of `tree`; build (not write) its manifest. With `reuse`
/// (a save into a repository), chunks it knows are referred to, not written, and the caller
/// checks and commits the name.
pub(crate) async fn write_data(
    tree: &Node,
    loc: &Location,
    opts: &SaveOptions,
    reuse: Option<std::sync::Arc<Reuse>>,
) -> Result<Written> {
    loc.refuse_write()?;
    // Fragments (subtrees written as text by the caller's walk) are saved as they are, unless
    // this save inlines fewer string bytes than they do: then they become nodes first. (A
    // repository's root hash parses them, merkle.rs.)
    let expanded;
    let tree = if needs_expansion(tree, opts.inline_str_bytes) {
        expanded = tree.expand_fragments()?;
        &expanded
    } else {
        tree
    };
    let has_refs = check_tree(tree, opts.inline_str_bytes)?;
    check::check_metadata(opts.metadata.as_ref())?;
    let single = loc.layout() == Layout::SingleFile;
    // In a repository, the name (not a manifest here) is checked and committed by the caller.
    let (marker, previous) = if reuse.is_some() {
        (None, None)
    } else {
        let manifest_rel = if single { "." } else { MANIFEST_NAME };
        let exists = loc.exists(manifest_rel).await?;
        if exists && !opts.overwrite {
            return Err(Error::AlreadyExists { location: loc.display().to_string() });
        }
        if !exists && !single && loc.local().is_some() {
            refuse_foreign_folder(loc).await?;
        }
        let marker = loc.save_marker(opts.durable)?;
        let previous = if exists && !single { old_packs(loc).await } else { None };
        (marker, previous)
    };

    let globs = opts.chunk_shapes.iter().map(|(p, cs)| Ok((Glob::new(p)?, cs.clone()))).collect::<Result<Vec<_>>>()?;
    let mut planner = Planner {
        opts,
        globs,
        pending: vec![],
        arrays: 0,
        array_bytes: 0,
        annotated: false,
        dtype_minor: 0,
        same_buffer: HashMap::new(),
    };
    let entries: Tree<Entry> = {
        let r: Result<Tree<Entry>> = tree.map_ref_steps(&mut |p, l| planner.leaf(p, l));
        r?
    };

    // Hash (and min/max) every chunk, lay unique chunks out in packs and write the packs. Big
    // directory saves write each pack as soon as it is laid out, while the next chunks are
    // hashed on another thread: on few cores, hashing and the kernel's copy into the page
    // cache then overlap instead of adding up.
    let chunks_total = planner.pending.len();
    let pending = std::mem::take(&mut planner.pending);
    let pending_bytes: u64 = pending.iter().map(|p| p.data.len() as u64).sum();
    let before = loc.stats().bytes_written();
    // The exact total (after deduplication, with the manifest) is set once known.
    let tracker = Tracker::new(opts.progress.clone(), pending_bytes);
    let concurrency = opts.concurrency.max(1);
    let batch = opts.pipeline_batch_bytes.max(1);
    // An encrypted pack is sealed into a buffer of its own before it is written: smaller packs
    // keep those buffers few and reused (store crypt.rs), not one per 256 MiB.
    let pack_bytes = if loc.is_encrypted() { opts.pack_bytes.min(ENCRYPTED_PACK_BYTES) } else { opts.pack_bytes };
    // An encrypted tree's packs are named by a key of the save's, not by their content alone.
    let name_key = loc.pack_name_key()?;
    // The format version a manifest of this tree is stamped with, given whether any chunk
    // ended up compressed (known only after hashing).
    let object_dicts = manifest::has_object_dicts(&entries);
    let packed = opts.packs_manifest(single || reuse.is_some());
    let stamp = |compressed: bool| {
        let minor = oldest_minor(planner.dtype_minor, object_dicts, planner.annotated, has_refs, compressed);
        let minor = if packed { minor.max(manifest::PACKED_MINOR) } else { minor };
        if loc.is_encrypted() {
            minor.max(crate::format::crypt::ENCRYPTED_MINOR)
        } else {
            minor
        }
    };
    let mut single_stream = None;
    let (hashed, pack_list, single_parts) = if single || pending_bytes <= batch {
        // A big single file on local disk is written while its chunks are hashed, when its
        // header (which holds the format version) is known before: no chunk is compressed.
        let streams = single
            && pending_bytes > batch
            && reuse.is_none()
            && loc.local().is_some()
            && !loc.is_encrypted()
            && pending.iter().all(|p| p.encoding.is_none());
        let mut packs: Vec<PackOut> = vec![];
        let push = |p| {
            packs.push(p);
            true
        };
        let hashed = if streams {
            let s = single_stream.insert(SingleStream::start(loc, stamp(false), !opts.overwrite, opts.durable)?);
            let mut send = |b: Bytes| {
                tracker.advance(b.len() as u64);
                s.send(b)
            };
            hash_and_layout(&pending, true, pack_bytes, batch, None, name_key, push, Some(&mut send))
        } else {
            hash_and_layout(&pending, single, pack_bytes, u64::MAX, reuse.clone(), name_key, push, None)
        };
        let hashed = match (hashed, single_stream.as_mut()) {
            (Some(h), _) => h,
            // The writer stopped: its error says why.
            (None, Some(s)) => return Err(s.failed()),
            (None, None) => return Err(Error::internal("layout stopped without a reason")),
        };
        let list: Vec<(String, u64)> = packs.iter().map(|(n, _, s)| (n.clone(), *s)).collect();
        if single {
            (hashed, list, packs.into_iter().next())
        } else {
            tracker.set_total(list.iter().map(|p| p.1).sum());
            write_packs(loc, futures::stream::iter(packs), concurrency, opts.durable, reuse.is_some(), &tracker)
                .await?;
            (hashed, list, None)
        }
    } else {
        let (hashed, list) = hash_and_write_pipelined(
            loc,
            pending,
            reuse.clone(),
            name_key,
            pack_bytes,
            batch,
            concurrency,
            opts.durable,
            &tracker,
        )
        .await?;
        (hashed, list, None)
    };

    // Patch placeholders with final refs, and finish previews with min/max.
    let mut root = entries;
    let mut leaves = 0usize;
    root.for_each_leaf_mut(&mut |e| {
        leaves += match e {
            Entry::Fragment(f) => f.leaves(),
            _ => 1,
        };
        match e {
            Entry::Str(Stored::Blob { chunk, .. }) | Entry::Bytes(Stored::Blob { chunk, .. }) => {
                *chunk = hashed.refs[chunk.offset as usize].clone();
            }
            Entry::Array(a) => {
                if let ArrayStorage::Chunked { chunks, .. } = &mut a.storage {
                    let mut mm = None;
                    for c in chunks.iter_mut() {
                        let i = c.offset as usize;
                        mm = preview::combine(mm, hashed.min_max[i]);
                        *c = hashed.refs[i].clone();
                    }
                    if let Some(head) = a.preview.take() {
                        a.preview = Some(preview::to_json(&a.dtype, head, mm));
                    }
                }
            }
            _ => {}
        }
    });
    let stored: u64 = pack_list.iter().map(|p| p.1).sum();
    // Packs of a repository that known chunks are in follow the new ones (their refs were
    // renumbered so).
    let mut pack_list = pack_list;
    let new_pack_names: HashSet<String> = pack_list.iter().map(|p| p.0.clone()).collect();
    if let Some(r) = &reuse {
        pack_list.extend(hashed.known_packs.iter().filter_map(|&i| r.packs.get(i as usize).cloned()));
    }
    let compressed = hashed.refs.iter().any(|r| !r.codec.is_identity());
    let minor = stamp(compressed);
    let manifest = Manifest {
        version: (manifest::VERSION_MAJOR, minor),
        writer: opts.writer.clone(),
        metadata: opts.metadata.clone(),
        packs: pack_list.iter().map(|(name, size)| PackInfo { path: name.clone(), size: *size }).collect(),
        root,
    };
    let stats = json!({
        "leaves": leaves, "arrays": planner.arrays, "array_bytes": planner.array_bytes,
        "chunks": chunks_total, "unique_chunks": hashed.unique, "stored_bytes": stored,
    });
    let info = SaveInfo {
        location: loc.display().to_string(),
        leaves,
        arrays: planner.arrays,
        array_bytes: planner.array_bytes,
        bytes_written: loc.stats().bytes_written() - before,
        chunks: chunks_total,
        unique_chunks: hashed.unique - hashed.reused_chunks,
        bytes_reused: hashed.reused_bytes,
        root: None,
        packs: manifest.packs.len(),
    };
    Ok(Written {
        manifest,
        packed,
        stats,
        previous,
        single_parts,
        single_stream,
        new_names: new_pack_names,
        stored,
        tracker,
        before,
        info,
        _marker: marker,
    })
}
