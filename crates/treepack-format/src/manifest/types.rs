//! The manifest's types (`Manifest`, `Entry`, chunk and pack references) and the format's limits.

use super::fragment::Fragment;
use crate::codec::Codec;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::grid::ChunkGrid;
use crate::hash::Hash32;
use crate::model::{shape_len, Int, Tree};
use bytes::Bytes;
use serde_json::Value;

/// The format's signature value (`"format": "treepack"`).
pub const FORMAT_NAME: &str = "treepack";
/// Major version this build writes and reads.
pub const VERSION_MAJOR: u16 = 1;
/// Newest minor version this build writes (1.1 adds chunk codecs, 1.2 shared nodes and refs,
/// 1.3 array annotations, 1.4 dicts written as JSON objects, 1.5 the sub-byte and remaining
/// ml_dtypes dtypes, 1.6 the manifest stored as one zstd frame; a writer writes the oldest minor
/// that holds its tree). Readers accept any minor of a known major.
pub const VERSION_MINOR: u16 = 7;
/// Deepest container nesting accepted (Python's default recursion limit is 1000).
pub const MAX_DEPTH: usize = 1000;
/// Largest manifest accepted, in bytes.
pub const MAX_MANIFEST_BYTES: u64 = 1 << 30;
/// Most dimensions of an array (numpy's limit is 64).
pub const MAX_NDIM: usize = 64;
/// Most packs a manifest may list.
pub const MAX_PACKS: usize = 1 << 20;

pub(super) const HASH_PREFIX: &str = ",\n\"manifest_hash\":\"";
pub(super) const HASH_SUFFIX: &str = "\"}\n";
/// Length of the manifest's closing member: `,\n"manifest_hash":"<64 hex>"}\n`.
pub const HASH_TRAILER_LEN: usize = HASH_PREFIX.len() + 64 + HASH_SUFFIX.len();

/// Where one chunk's stored bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkRef {
    /// Index into [`Manifest::packs`].
    pub pack: u32,
    /// Byte offset of the stored bytes inside the pack (an absolute file offset in a single file).
    pub offset: u64,
    /// Stored length in bytes.
    pub length: u64,
    /// How the stored bytes encode the canonical bytes.
    pub codec: Codec,
    /// BLAKE3 of the canonical (decoded) bytes.
    pub hash: Hash32,
}

/// A string or bytes value: inline in the manifest, or a blob in a pack.
#[derive(Debug, Clone, PartialEq)]
pub enum Stored<T> {
    /// Short values, written in the manifest itself.
    Inline(T),
    /// Long values, stored as one chunk in a pack.
    Blob {
        /// Canonical size in bytes (UTF-8 bytes for strings).
        size: u64,
        /// Where the blob's bytes are.
        chunk: ChunkRef,
    },
}

/// How an array's bytes are stored.
#[derive(Debug, Clone, PartialEq)]
pub enum ArrayStorage {
    /// Small arrays: canonical bytes base64-encoded in the manifest.
    Inline(Bytes),
    /// On a chunk grid, chunks in C order of grid coordinates.
    Chunked {
        /// Shape of one full chunk; edge chunks are cut to fit the array.
        chunk_shape: Vec<u64>,
        /// One reference per chunk of the grid.
        chunks: Vec<ChunkRef>,
    },
}

/// An array leaf as recorded in the manifest.
#[derive(Debug, Clone, PartialEq)]
pub struct ArrayEntry {
    /// Element type.
    pub dtype: DType,
    /// Shape, in elements per axis (empty for a 0-d array).
    pub shape: Vec<u64>,
    /// Where the canonical bytes are: inline or chunks in packs.
    pub storage: ArrayStorage,
    /// Informational preview (first values, min, max). Never used to reconstruct data.
    pub preview: Option<Value>,
    /// The array type the writer had (`as`, format 1.3): an object with a string `type`. Readers
    /// that do not know the type load a plain array.
    pub annotation: Option<Value>,
}

impl ArrayEntry {
    /// Logical byte size (itemsize × number of elements).
    pub fn nbytes(&self) -> u64 {
        shape_len(&self.shape).unwrap_or(0).saturating_mul(self.dtype.itemsize())
    }
    /// The canonical byte length of chunk `i` of `grid` (this array's): what its codec must
    /// decode to.
    pub fn chunk_nbytes(&self, grid: &ChunkGrid, i: usize) -> u64 {
        let (_, extent) = grid.chunk_region(i as u64);
        extent.iter().fold(self.dtype.itemsize(), |n, &d| n.saturating_mul(d))
    }
    /// The chunk grid (a single chunk covering everything for inline arrays).
    pub fn grid(&self) -> ChunkGrid {
        match &self.storage {
            ArrayStorage::Chunked { chunk_shape, .. } => {
                ChunkGrid { shape: self.shape.clone(), chunk_shape: chunk_shape.clone() }
            }
            ArrayStorage::Inline(_) => {
                ChunkGrid { shape: self.shape.clone(), chunk_shape: self.shape.iter().map(|&d| d.max(1)).collect() }
            }
        }
    }
}

/// A leaf as recorded in the manifest.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    /// The none value (Python `None`, Rust `()` or `None`).
    None,
    /// A boolean.
    Bool(bool),
    /// An integer of any size.
    Int(Int),
    /// A 64-bit float (NaN payloads and signed zeros kept).
    Float(f64),
    /// A complex number: real part, imaginary part.
    Complex(f64, f64),
    /// A UTF-8 string, inline or in a pack.
    Str(Stored<String>),
    /// A byte string, inline or in a pack.
    Bytes(Stored<Bytes>),
    /// Boxed: arrays are the largest variant, and keeping `Entry` small keeps 100k-leaf
    /// manifest trees compact (less memory to fill and move while parsing).
    Array(Box<ArrayEntry>),
    /// A subtree already written as manifest text: only in trees a writer builds, between its
    /// walk of the caller's objects and the manifest; parsing never makes one ([`Fragment`]).
    Fragment(Fragment),
}

impl Entry {
    /// The leaf's kind as a short stable name: `none`, `bool`, `int`, `float`, `complex`, `str`,
    /// `bytes` or `array`.
    pub fn kind(&self) -> &'static str {
        match self {
            Entry::None => "none",
            Entry::Bool(_) => "bool",
            Entry::Int(_) => "int",
            Entry::Float(_) => "float",
            Entry::Complex(..) => "complex",
            Entry::Str(_) => "str",
            Entry::Bytes(_) => "bytes",
            Entry::Array(_) => "array",
            Entry::Fragment(_) => "fragment",
        }
    }

    /// Chunks this leaf reads from packs.
    pub fn chunks(&self) -> &[ChunkRef] {
        match self {
            Entry::Str(Stored::Blob { chunk, .. }) | Entry::Bytes(Stored::Blob { chunk, .. }) => {
                std::slice::from_ref(chunk)
            }
            Entry::Array(a) => match &a.storage {
                ArrayStorage::Chunked { chunks, .. } => chunks,
                ArrayStorage::Inline(_) => &[],
            },
            _ => &[],
        }
    }

    /// Canonical byte length and element size of stored chunk `i` (what its codec decodes to,
    /// and the element size its shuffle uses).
    pub fn chunk_canonical(&self, i: usize) -> (u64, u64) {
        match self {
            Entry::Array(a) => (a.chunk_nbytes(&a.grid(), i), a.dtype.itemsize()),
            e => (e.nbytes(), 1),
        }
    }

    /// Byte size of the value (UTF-8 bytes for strings).
    pub fn nbytes(&self) -> u64 {
        match self {
            Entry::Str(Stored::Inline(s)) => s.len() as u64,
            Entry::Bytes(Stored::Inline(b)) => b.len() as u64,
            Entry::Str(Stored::Blob { size, .. }) | Entry::Bytes(Stored::Blob { size, .. }) => *size,
            Entry::Array(a) => a.nbytes(),
            _ => 0,
        }
    }
}

/// Description of one leaf, read from the manifest alone.
#[derive(Debug, Clone, PartialEq)]
pub struct LeafInfo {
    /// The leaf's key path, escaped as in docs/format.md.
    pub path: String,
    /// The leaf's kind, as [`Entry::kind`] names it.
    pub kind: &'static str,
    /// Element type, for arrays only.
    pub dtype: Option<DType>,
    /// Shape, for arrays only.
    pub shape: Option<Vec<u64>>,
    /// Byte size of the value, as [`Entry::nbytes`] counts it.
    pub nbytes: u64,
}

/// One pack file of a location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackInfo {
    /// Path relative to the location (`packs/…​.tpp`), or `.` for the single file itself.
    pub path: String,
    /// Size in bytes: the pack file's length, or for the single file the end of its chunk region.
    pub size: u64,
}

/// A parsed manifest.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    /// Format version as (major, minor).
    pub version: (u16, u16),
    /// Free text naming the program that wrote the tree, e.g. `treepack-rs/0.2.0`.
    pub writer: String,
    /// Any JSON value the user attached when saving.
    pub metadata: Option<Value>,
    /// The pack files that chunk references index into.
    pub packs: Vec<PackInfo>,
    /// The tree, with an [`Entry`] at every leaf.
    pub root: Tree<Entry>,
}

impl Manifest {
    /// The structure with a [`LeafInfo`] at each leaf.
    ///
    /// # Errors
    /// [`Error::InvalidManifest`] when the leaves' key paths would take far more memory than
    /// the tree (each leaf holds its whole path: a small hostile manifest nesting a long list
    /// under long keys would otherwise take gigabytes; see `outline::path_budget`).
    pub fn structure(&self) -> Result<Tree<LeafInfo>> {
        let mut budget = super::outline::tree_path_budget(&self.root);
        self.root.map_ref_steps(&mut |p, e| {
            let path = crate::keypath::steps_text(p);
            budget = budget
                .checked_sub(path.len())
                .ok_or_else(|| Error::manifest("", path.as_str(), super::outline::PATHS_TOO_LONG))?;
            Ok(LeafInfo {
                path,
                kind: e.kind(),
                dtype: if let Entry::Array(a) = e { Some(a.dtype.clone()) } else { None },
                shape: if let Entry::Array(a) = e { Some(a.shape.clone()) } else { None },
                nbytes: e.nbytes(),
            })
        })
    }
}

// ---------------------------------------------------------------- writing
