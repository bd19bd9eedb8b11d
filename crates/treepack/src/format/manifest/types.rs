//! The manifest's types (`Manifest`, `Entry`, chunk and pack references) and the format's limits.

use super::*;

/// The format's signature value (`"format": "treepack"`).
pub const FORMAT_NAME: &str = "treepack";
/// Major version this build writes and reads.
pub const VERSION_MAJOR: u16 = 1;
/// Minor version this build writes. Readers accept any minor of a known major.
pub const VERSION_MINOR: u16 = 0;
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
    pub offset: u64,
    /// Stored length in bytes.
    pub length: u64,
    pub codec: Codec,
    /// BLAKE3 of the canonical (decoded) bytes.
    pub hash: Hash32,
}

/// A string or bytes value: inline in the manifest, or a blob in a pack.
#[derive(Debug, Clone, PartialEq)]
pub enum Stored<T> {
    Inline(T),
    Blob { size: u64, chunk: ChunkRef },
}

/// How an array's bytes are stored.
#[derive(Debug, Clone, PartialEq)]
pub enum ArrayStorage {
    /// Small arrays: canonical bytes base64-encoded in the manifest.
    Inline(Bytes),
    /// On a chunk grid, chunks in C order of grid coordinates.
    Chunked { chunk_shape: Vec<u64>, chunks: Vec<ChunkRef> },
}

/// An array leaf as recorded in the manifest.
#[derive(Debug, Clone, PartialEq)]
pub struct ArrayEntry {
    pub dtype: DType,
    pub shape: Vec<u64>,
    pub storage: ArrayStorage,
    /// Informational preview (first values, min, max). Never used to reconstruct data.
    pub preview: Option<Value>,
}

impl ArrayEntry {
    /// Logical byte size (itemsize × number of elements).
    pub fn nbytes(&self) -> u64 {
        shape_len(&self.shape).unwrap_or(0).saturating_mul(self.dtype.itemsize())
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
    None,
    Bool(bool),
    Int(Int),
    Float(f64),
    Complex(f64, f64),
    Str(Stored<String>),
    Bytes(Stored<Bytes>),
    /// Boxed: arrays are the largest variant, and keeping `Entry` small keeps 100k-leaf
    /// manifest trees compact (less memory to fill and move while parsing).
    Array(Box<ArrayEntry>),
}

impl Entry {
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
    pub path: String,
    pub kind: &'static str,
    pub dtype: Option<DType>,
    pub shape: Option<Vec<u64>>,
    pub nbytes: u64,
}

/// One pack file of a location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackInfo {
    /// Path relative to the location (`packs/…​.tpp`), or `.` for the single file itself.
    pub path: String,
    pub size: u64,
}

/// A parsed manifest.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    pub version: (u16, u16),
    pub writer: String,
    pub metadata: Option<Value>,
    pub packs: Vec<PackInfo>,
    pub root: Tree<Entry>,
}

impl Manifest {
    /// The structure with a [`LeafInfo`] at each leaf.
    pub fn structure(&self) -> Tree<LeafInfo> {
        let r: std::result::Result<_, std::convert::Infallible> = self.root.map_ref_steps(&mut |p, e| {
            Ok(LeafInfo {
                path: crate::format::keypath::steps_text(p),
                kind: e.kind(),
                dtype: if let Entry::Array(a) = e { Some(a.dtype.clone()) } else { None },
                shape: if let Entry::Array(a) = e { Some(a.shape.clone()) } else { None },
                nbytes: e.nbytes(),
            })
        });
        match r {
            Ok(t) => t,
            Err(e) => match e {},
        }
    }
}

// ---------------------------------------------------------------- writing
