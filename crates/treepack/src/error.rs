//! Typed errors. Every variant says what was wrong, where (file and key path), and what to do.

use std::path::PathBuf;

/// Result alias used throughout treepack.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while saving, loading or inspecting a tree.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Nothing readable exists at the location.
    #[error("{location}: no treepack tree found ({detail}); check the path, or save a tree there first")]
    NotFound { location: String, detail: String },

    /// A tree is already stored at the location and overwrite was not requested.
    #[error("{location}: a tree already exists here; pass overwrite (CLI: --overwrite) to replace it")]
    AlreadyExists { location: String },

    /// The file was written by a format version this build cannot read.
    #[error("{file}: format version {found} is not supported (this treepack reads major version {supported}); upgrade treepack")]
    UnsupportedVersion { file: String, found: String, supported: u16 },

    /// The bytes are not a treepack file at all (bad magic, truncated header/footer).
    #[error("{file}: not a treepack file: {reason}")]
    NotTreepack { file: String, reason: String },

    /// The manifest is structurally invalid (bad JSON, wrong field types, inconsistent sizes).
    #[error("{file}: invalid manifest at `{key}`: {reason}")]
    InvalidManifest { file: String, key: String, reason: String },

    /// The manifest's own checksum does not match its bytes: it was modified or truncated.
    #[error(
        "{file}: manifest checksum mismatch (stored {expected}, computed {actual}); the file was modified or truncated"
    )]
    ManifestChecksum { file: String, expected: String, actual: String },

    /// A chunk's bytes do not hash to the value recorded in the manifest.
    #[error("{file}: chunk {chunk} of `{key}` is corrupt: BLAKE3 {actual} but the manifest records {expected}")]
    ChunkCorrupt { file: String, key: String, chunk: usize, expected: String, actual: String },

    /// A chunk points outside its pack, or a pack is shorter than the manifest says.
    #[error("{file}: `{key}`: {reason}")]
    OutOfBounds { file: String, key: String, reason: String },

    /// A key path does not name anything in the tree.
    #[error("key path `{path}` not found: {reason}")]
    KeyNotFound { path: String, reason: String },

    /// A key path or glob could not be parsed.
    #[error("invalid key path `{path}`: {reason}")]
    BadKeyPath { path: String, reason: String },

    /// A slice expression does not fit the array.
    #[error("invalid slice `{spec}` for shape {shape:?}: {reason}")]
    BadSlice { spec: String, shape: Vec<u64>, reason: String },

    /// An in-memory tree cannot be saved as given (e.g. array bytes don't match dtype × shape).
    #[error("cannot save `{key}`: {reason}")]
    InvalidTree { key: String, reason: String },

    /// A dtype name or description is not understood.
    #[error("unknown or invalid dtype `{dtype}`: {reason}")]
    BadDType { dtype: String, reason: String },

    /// A safety limit (depth, size, count) was exceeded.
    #[error("{what} exceeds the limit of {limit}: {detail}")]
    LimitExceeded { what: String, limit: u64, detail: String },

    /// A buffer of the requested size could not be allocated.
    #[error("cannot allocate {bytes} bytes for `{key}`: out of memory")]
    OutOfMemory { key: String, bytes: u64 },

    /// The location string could not be understood.
    #[error("invalid location `{location}`: {reason}")]
    BadLocation { location: String, reason: String },

    /// The location can be read but not written (HTTP).
    #[error("{location}: read-only location: {reason}")]
    ReadOnly { location: String, reason: String },

    /// The object store (local disk, memory, S3, GCS, Azure, HTTP) reported an error (after retries).
    #[error("{location}: storage error: {source}")]
    Store {
        location: String,
        #[source]
        source: object_store::Error,
    },

    /// A local file operation failed.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// Conversion between a Rust value and a tree failed (serde support).
    #[error("serde conversion: {0}")]
    Serde(String),

    /// A bug in treepack, not in the input: a worker task died or an invariant did not hold.
    #[error("internal error in treepack: {0}; please report it with the command or code that caused it")]
    Internal(String),
}

impl Error {
    pub(crate) fn manifest(file: &str, key: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::InvalidManifest { file: file.to_string(), key: key.into(), reason: reason.into() }
    }

    pub(crate) fn invalid_tree(key: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::InvalidTree { key: key.into(), reason: reason.into() }
    }

    pub(crate) fn internal(what: impl Into<String>) -> Self {
        Error::Internal(what.into())
    }

    pub(crate) fn limit(what: impl Into<String>, limit: u64, detail: impl Into<String>) -> Self {
        Error::LimitExceeded { what: what.into(), limit, detail: detail.into() }
    }

    /// A short, stable name for the kind of error (used by the CLI's `--json` output and tests).
    pub fn kind(&self) -> &'static str {
        match self {
            Error::NotFound { .. } => "not_found",
            Error::AlreadyExists { .. } => "already_exists",
            Error::UnsupportedVersion { .. } => "unsupported_version",
            Error::NotTreepack { .. } => "not_treepack",
            Error::InvalidManifest { .. } => "invalid_manifest",
            Error::ManifestChecksum { .. } => "manifest_checksum",
            Error::ChunkCorrupt { .. } => "chunk_corrupt",
            Error::OutOfBounds { .. } => "out_of_bounds",
            Error::KeyNotFound { .. } => "key_not_found",
            Error::BadKeyPath { .. } => "bad_key_path",
            Error::BadSlice { .. } => "bad_slice",
            Error::InvalidTree { .. } => "invalid_tree",
            Error::BadDType { .. } => "bad_dtype",
            Error::LimitExceeded { .. } => "limit_exceeded",
            Error::OutOfMemory { .. } => "out_of_memory",
            Error::BadLocation { .. } => "bad_location",
            Error::ReadOnly { .. } => "read_only",
            Error::Store { .. } => "store",
            Error::Io { .. } => "io",
            Error::Serde(_) => "serde",
            Error::Internal(_) => "internal",
        }
    }
}
