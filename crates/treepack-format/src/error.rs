//! Typed errors. Every variant says what was wrong, where (file and key path), and what to do.

use std::path::PathBuf;

/// Result alias used throughout treepack.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while saving, loading or inspecting a tree.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Nothing readable exists at the location ("no treepack tree found"), or a file its
    /// manifest names is missing (an incomplete tree, or one replaced while it was read).
    #[error("{location}: {detail}")]
    NotFound {
        /// The location, or the missing file within it, as shown to the user.
        location: String,
        /// What exactly is missing (e.g. the manifest or a pack file).
        detail: String,
    },

    /// A tree is already stored at the location and overwrite was not requested.
    #[error("{location}: a tree already exists here; pass overwrite (CLI: --overwrite) to replace it")]
    AlreadyExists {
        /// The location that already holds a tree.
        location: String,
    },

    /// The file was written by a format version this build cannot read.
    #[error("{file}: format version {found} is not supported (this treepack reads major version {supported}); upgrade treepack")]
    UnsupportedVersion {
        /// The file (manifest or single-file container) that carries the version.
        file: String,
        /// The version as found in the file, e.g. `2.0`.
        found: String,
        /// The one major version this build reads.
        supported: u16,
    },

    /// An overwrite found the name replaced by another writer since it began (a
    /// compare-and-swap failed): nothing was replaced.
    #[error("{location}: another writer replaced it while this save ran; nothing was replaced (the other tree stays); save again to replace it")]
    Conflict {
        /// The name (`LOCATION@NAME`) or location overwritten.
        location: String,
    },

    /// The bytes are not a treepack file at all (bad magic, truncated header/footer).
    #[error("{file}: not a treepack file: {reason}")]
    NotTreepack {
        /// The file that is not a treepack file.
        file: String,
        /// What check failed (magic, truncation, reserved bytes).
        reason: String,
    },

    /// A file of another format (a safetensors file being converted or loaded) is damaged or
    /// hostile: the format, and what is wrong.
    #[error("{file}: not a valid {format} file: {reason}")]
    InvalidForeign {
        /// The file read.
        file: String,
        /// Its format, e.g. `safetensors`.
        format: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A pickle (a PyTorch checkpoint's `data.pkl`) that the never-executing reader refuses:
    /// a global outside its allow-list, a malformed or truncated stream, a limit (issue 54).
    #[error("{file}: {source}")]
    Pickle {
        /// The file read (and the pickle inside it).
        file: String,
        /// What was refused, and where.
        #[source]
        source: crate::pickle::PickleError,
    },

    /// A repository's own bookkeeping file (the gc state, `gc.json`) cannot be parsed.
    #[error("invalid {what} {file}: {reason}; {fix}")]
    InvalidRepoFile {
        /// What the file is, e.g. `gc state file`.
        what: String,
        /// The file.
        file: String,
        /// What is wrong with it.
        reason: String,
        /// What to do about it.
        fix: String,
    },

    /// The manifest is structurally invalid (bad JSON, wrong field types, inconsistent sizes).
    #[error("{file}: invalid manifest at `{key}`: {reason}")]
    InvalidManifest {
        /// The manifest file (or single file) the problem was found in.
        file: String,
        /// Key path of the offending node, or the name of the top-level manifest field.
        key: String,
        /// What is wrong there.
        reason: String,
    },

    /// The manifest's own checksum does not match its bytes: it was modified or truncated.
    #[error(
        "{file}: manifest checksum mismatch (stored {expected}, computed {actual}); the file was modified or truncated"
    )]
    ManifestChecksum {
        /// The manifest file (or single file) whose checksum failed.
        file: String,
        /// The checksum stored with the manifest, in hex.
        expected: String,
        /// The checksum computed over the bytes read, in hex.
        actual: String,
    },

    /// The tree's root hash is not the one the caller expected (`expect_root`): another tree is
    /// stored there, or it was changed.
    #[error("{location}: root hash is {actual}, but {expected} was expected: this is not the tree asked for (another save, or a modified one); load without expect_root to look at it")]
    RootMismatch {
        /// The location loaded.
        location: String,
        /// The root hash asked for, in hex.
        expected: String,
        /// The tree's root hash, in hex.
        actual: String,
    },

    /// A signed tree was asked for (`signed_by`) and the tree has no signature.
    #[error("{location}: the tree is not signed (no signature at {file}), and a signature by {trusted} was asked for: sign it (`treepack sign LOCATION --key KEY.pem`), or copy it with its signature (`treepack cp` carries it)")]
    Unsigned {
        /// The location loaded.
        location: String,
        /// Where its signature would be.
        file: String,
        /// The trusted keys, as fingerprints.
        trusted: String,
    },

    /// The tree is signed, but by none of the keys trusted (`signed_by`): it may have been
    /// re-signed by someone else.
    #[error("{location}: signed by {signers}, not by a trusted key ({trusted}): refusing it; if you trust that signer, pass its public key to signed_by (--signed-by)")]
    UntrustedSigner {
        /// The location loaded.
        location: String,
        /// Who the signature says signed it (unauthenticated key ids), or `an unknown key`.
        signers: String,
        /// The trusted keys, as fingerprints.
        trusted: String,
    },

    /// A trusted key's valid signature that does not hold for this tree: the tree (its root
    /// hash, format version or metadata) was modified, the signature is another tree's, or it
    /// is older than the caller accepts (`min_version`, `not_before`).
    #[error("{location}: signature by {signer} does not match the tree: {reason}")]
    SignatureMismatch {
        /// The location loaded.
        location: String,
        /// The trusted key that signed, as `algorithm fingerprint`.
        signer: String,
        /// What differs, and what to do.
        reason: String,
    },

    /// A signature file that cannot be read as one (malformed envelope, wrong payload type,
    /// bad base64, too big), or whose signature by a trusted key does not verify (altered).
    #[error("{file}: invalid signature: {reason}; sign the tree again (`treepack sign`) or get its signature from the signer")]
    InvalidSignature {
        /// The signature file.
        file: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A key file (or key bytes) that is not a key treepack signs or verifies with.
    #[error("{file}: {reason}")]
    BadKey {
        /// The key file, or `key bytes`.
        file: String,
        /// What is wrong, and what works.
        reason: String,
    },

    /// The tree is encrypted and no key was given.
    #[error("{location}: the tree is encrypted ({with}); pass its key: Python `encryption=` (32 bytes, treepack.Passphrase(...) or a key provider), CLI --encryption-key FILE or --passphrase-env VAR")]
    Encrypted {
        /// The location read.
        location: String,
        /// What it was encrypted with, as its envelope says.
        with: String,
    },

    /// A key was given, and the tree is not encrypted: a plain tree where an encrypted one was
    /// expected may have been put there by someone else.
    #[error("{location}: the tree is not encrypted, but a key was given: refusing it (a plain tree where an encrypted one was expected may have been put there by someone else); read it without a key if a plain tree is expected")]
    NotEncrypted {
        /// The location read.
        location: String,
    },

    /// The key given does not open the tree (another key, another kind of key, a key provider
    /// that refused), or the tree's envelope cannot be read.
    #[error("{location}: {reason}")]
    WrongKey {
        /// The location read.
        location: String,
        /// Which key the tree wants and what was given, or what is wrong with the envelope.
        reason: String,
    },

    /// Encrypted bytes that do not authenticate: modified, moved within or between files, cut
    /// short, or taken from another save.
    #[error("{file}: {}the encrypted bytes at {start}..{end} do not authenticate ({reason}): they were modified, moved, cut short or come from another save; restore the file from a good copy", key_prefix(key))]
    Tampered {
        /// The file read.
        file: String,
        /// Key path of the leaf whose bytes these are (empty when not known).
        key: String,
        /// The plain byte range of the segment that failed.
        start: u64,
        /// Its end.
        end: u64,
        /// Which segment, or what else is wrong.
        reason: String,
    },

    /// A chunk's bytes do not hash to the value recorded in the manifest.
    #[error("{file}: chunk {chunk} of `{key}` is corrupt: BLAKE3 {actual} but the manifest records {expected}")]
    ChunkCorrupt {
        /// The pack file the chunk was read from.
        file: String,
        /// Key path of the leaf the chunk belongs to.
        key: String,
        /// Index of the chunk within the leaf's chunk list.
        chunk: usize,
        /// The BLAKE3 hash the manifest records, in hex.
        expected: String,
        /// The BLAKE3 hash of the bytes read, in hex.
        actual: String,
    },

    /// A chunk's stored bytes cannot be decoded by its codec into its canonical length (a
    /// damaged or hostile frame, one that decodes to more or fewer bytes than declared).
    #[error("{file}: chunk {chunk} of `{key}` cannot be decoded ({codec}): {reason}")]
    BadChunk {
        /// The pack file the chunk was read from.
        file: String,
        /// Key path of the leaf the chunk belongs to.
        key: String,
        /// Index of the chunk within the leaf's chunk list.
        chunk: usize,
        /// The chunk's codec name.
        codec: String,
        /// What the decoder found.
        reason: String,
    },

    /// A compression policy cannot be used as written.
    #[error("bad compression policy {policy:?}: {reason}")]
    InvalidCompression {
        /// The policy as given.
        policy: String,
        /// What is wrong, and the accepted forms.
        reason: String,
    },

    /// A chunk points outside its pack, or a pack is shorter than the manifest says.
    #[error("{file}: `{key}`: {reason}")]
    OutOfBounds {
        /// The pack file read, or the manifest file when the manifest's references were checked.
        file: String,
        /// Key path of the leaf whose chunk is affected (empty when not known).
        key: String,
        /// What does not fit (offsets, lengths, a chunk that could not be read or decoded).
        reason: String,
    },

    /// A symbolic link inside a local location. treepack reads, writes and deletes only
    /// beneath a location and follows no link there (the location's own path is resolved as
    /// the operating system resolves it: it is the user's).
    #[error("{}: is a symbolic link; treepack does not follow links inside a location ({fix}); nothing was read, written or deleted through it", path.display())]
    Link {
        /// The link: the location's path joined with the link's path inside it.
        path: PathBuf,
        /// What to do about it.
        fix: String,
    },

    /// A key path does not name anything in the tree.
    #[error("key path `{path}` not found: {reason}")]
    KeyNotFound {
        /// The key path as given.
        path: String,
        /// Where the walk stopped, or what the path names instead of what was asked for.
        reason: String,
    },

    /// A key path or glob could not be parsed.
    #[error("invalid key path `{path}`: {reason}")]
    BadKeyPath {
        /// The key path or glob as given.
        path: String,
        /// What could not be parsed.
        reason: String,
    },

    /// A slice expression does not fit the array.
    #[error("invalid slice `{spec}` for shape {shape:?}: {reason}")]
    BadSlice {
        /// The slice expression as given, e.g. `0, :`.
        spec: String,
        /// Shape of the array being sliced (empty when the expression failed to parse).
        shape: Vec<u64>,
        /// What is wrong with the expression.
        reason: String,
    },

    /// An in-memory tree cannot be saved as given (e.g. array bytes don't match dtype × shape).
    #[error("cannot save `{key}`: {reason}")]
    InvalidTree {
        /// Key path of the offending node.
        key: String,
        /// Why it cannot be saved.
        reason: String,
    },

    /// The parts of a save written by many processes do not make one tree (format::parts).
    #[error("cannot commit the save written in parts: `{key}`: {reason}")]
    Parts {
        /// Key path of the sharded array (or node) at fault.
        key: String,
        /// What does not fit.
        reason: String,
    },

    /// A dtype name or description is not understood.
    #[error("unknown or invalid dtype `{dtype}`: {reason}")]
    BadDType {
        /// The dtype name or description as given.
        dtype: String,
        /// Why it was rejected.
        reason: String,
    },

    /// A safety limit (depth, size, count) was exceeded.
    #[error("{what} exceeds the limit of {limit}: {detail}")]
    LimitExceeded {
        /// The limited quantity, e.g. `manifest size` or `tree depth`.
        what: String,
        /// The limit, in that quantity's unit (bytes, levels, …).
        limit: u64,
        /// The offending value or a hint on what to change.
        detail: String,
    },

    /// A buffer of the requested size could not be allocated.
    #[error("cannot allocate {bytes} bytes for `{key}`: out of memory")]
    OutOfMemory {
        /// Key path of the leaf, or the file, the buffer was for.
        key: String,
        /// Size of the buffer requested, in bytes.
        bytes: u64,
    },

    /// The location string could not be understood.
    #[error("invalid location `{location}`: {reason}")]
    BadLocation {
        /// The location string as given.
        location: String,
        /// Why it could not be understood.
        reason: String,
    },

    /// The location can be read but not written (HTTP).
    #[error("{location}: read-only location: {reason}")]
    ReadOnly {
        /// The location that was to be written.
        location: String,
        /// Why it cannot be written and where to save instead.
        reason: String,
    },

    /// The object store (local disk, memory, S3, GCS, Azure, HTTP) reported an error (after retries).
    #[error("{location}: storage error: {source}{hint}")]
    Store {
        /// The file or location the failed request was for.
        location: String,
        /// The object store's error, its text holding its causes (from `treepack-store`; it
        /// wraps an `object_store::Error`).
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
        /// What to do about it where the store's own words do not say: empty, or text that
        /// starts with a space (e.g. ` (does the bucket or container exist?)`).
        hint: &'static str,
    },

    /// A local file operation failed.
    #[error("{}: {source}{}", path.display(), io_hint(source))]
    Io {
        /// The local path the operation was on.
        path: PathBuf,
        /// The operating system's error.
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

/// What to do about a local I/O error, for the ones a save or load meets in practice.
fn io_hint(e: &std::io::Error) -> &'static str {
    match e.kind() {
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded => {
            " (free some space and save again; the tree that was there is intact, and `treepack gc` removes what the failed save left)"
        }
        std::io::ErrorKind::ReadOnlyFilesystem => " (the file system is mounted read-only: save elsewhere)",
        std::io::ErrorKind::PermissionDenied => " (this process may not access it: check the owner and mode)",
        _ => "",
    }
}

impl Error {
    /// No tree at `location`: `file` (its manifest, or the single file) does not exist.
    pub fn no_tree(location: impl Into<String>, file: impl std::fmt::Display) -> Self {
        Error::NotFound {
            location: location.into(),
            detail: format!(
                "no treepack tree found (`{file}` does not exist); check the path, or save a tree there first"
            ),
        }
    }

    /// A file the tree's manifest names (a pack) does not exist.
    pub fn missing_part(location: impl Into<String>, file: impl std::fmt::Display) -> Self {
        let (location, file) = (location.into(), file.to_string());
        let what = if file == location { "this file".to_string() } else { format!("`{file}`") };
        Error::NotFound {
            location,
            detail: format!(
                "{what}, which the manifest names, is missing: the tree is incomplete (deleted, or not fully copied), \
                 or it was replaced while this reader read it (load it again); `treepack verify` checks a tree"
            ),
        }
    }

    /// [`Error::InvalidManifest`] in `file` at `key` (a key path or a top-level member's name,
    /// shortened in its middle when very long: a hostile manifest's paths can be huge).
    pub fn manifest(file: &str, key: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::InvalidManifest { file: file.to_string(), key: shortened(key.into()), reason: reason.into() }
    }

    /// A repository's gc state (`gc.json`) that cannot be parsed. gc and saves refuse to run
    /// over it (so that damage never makes gc delete live data), and the message says how to
    /// start over.
    pub fn gc_state(file: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::InvalidRepoFile {
            what: "gc state file".into(),
            file: file.into(),
            reason: reason.into(),
            fix: "gc and saves into this repository refuse to run over it, so that damage never makes gc delete \
                  live data; when no gc is running, delete the file: the next gc condemns the unreferenced files \
                  again and deletes them only after its grace period"
                .into(),
        }
    }

    /// [`Error::InvalidTree`]: the node at `key` cannot be saved, for `reason`.
    pub fn invalid_tree(key: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::InvalidTree { key: key.into(), reason: reason.into() }
    }

    /// [`Error::Internal`]: a bug in treepack, not in the input.
    pub fn internal(what: impl Into<String>) -> Self {
        Error::Internal(what.into())
    }

    /// [`Error::LimitExceeded`]: `what` exceeds `limit` (`detail`: the value, or what to change).
    pub fn limit(what: impl Into<String>, limit: u64, detail: impl Into<String>) -> Self {
        Error::LimitExceeded { what: what.into(), limit, detail: detail.into() }
    }

    /// What to do, for the errors a load reports that their own message leaves it out of
    /// (damaged chunks: `treepack verify` reports each with the message alone). The Python
    /// binding and the CLI add it to what a failed load says.
    pub fn hint(&self) -> Option<&'static str> {
        match self {
            Error::ChunkCorrupt { .. } | Error::BadChunk { .. } => Some(
                "the stored bytes changed since they were written (a damaged disk, file or copy): `treepack verify` \
                 (Python: `treepack.verify`) lists every damaged leaf; load the rest with select=, or restore the \
                 tree from a copy",
            ),
            _ => None,
        }
    }

    /// A short, stable name for the kind of error (used by the CLI's `--json` output and tests).
    pub fn kind(&self) -> &'static str {
        match self {
            Error::NotFound { .. } => "not_found",
            Error::AlreadyExists { .. } => "already_exists",
            Error::Conflict { .. } => "conflict",
            Error::UnsupportedVersion { .. } => "unsupported_version",
            Error::NotTreepack { .. } => "not_treepack",
            Error::InvalidForeign { .. } => "invalid_foreign",
            Error::Pickle { .. } => "pickle",
            Error::InvalidRepoFile { .. } => "invalid_repo_file",
            Error::InvalidManifest { .. } => "invalid_manifest",
            Error::ManifestChecksum { .. } => "manifest_checksum",
            Error::ChunkCorrupt { .. } => "chunk_corrupt",
            Error::Encrypted { .. } => "encrypted",
            Error::NotEncrypted { .. } => "not_encrypted",
            Error::WrongKey { .. } => "wrong_key",
            Error::Tampered { .. } => "tampered",
            Error::RootMismatch { .. } => "root_mismatch",
            Error::Unsigned { .. } => "unsigned",
            Error::UntrustedSigner { .. } => "untrusted_signer",
            Error::SignatureMismatch { .. } => "signature_mismatch",
            Error::InvalidSignature { .. } => "invalid_signature",
            Error::BadKey { .. } => "bad_key",
            Error::OutOfBounds { .. } => "out_of_bounds",
            Error::Link { .. } => "link",
            Error::BadChunk { .. } => "bad_chunk",
            Error::InvalidCompression { .. } => "invalid_compression",
            Error::KeyNotFound { .. } => "key_not_found",
            Error::BadKeyPath { .. } => "bad_key_path",
            Error::BadSlice { .. } => "bad_slice",
            Error::InvalidTree { .. } => "invalid_tree",
            Error::Parts { .. } => "parts",
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

/// Errors of the serde conversion between Rust values and trees (`treepack::serde_tree`).
impl serde::ser::Error for Error {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        Error::Serde(msg.to_string())
    }
}
impl serde::de::Error for Error {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        Error::Serde(msg.to_string())
    }
}

/// A key path to show in an error, cut in its middle when it is very long: a hostile manifest
/// can nest a thousand levels of long keys, and a message should stay a message.
fn shortened(key: String) -> String {
    const KEEP: usize = 200;
    if key.len() <= 2 * KEEP {
        return key;
    }
    let head = key.char_indices().map(|(i, _)| i).take_while(|&i| i <= KEEP).last().unwrap_or(0);
    let tail = key.char_indices().map(|(i, _)| i).find(|&i| i >= key.len() - KEEP).unwrap_or(key.len());
    format!("{}…({} bytes)…{}", &key[..head], tail - head, &key[tail..])
}

/// `` `key`: `` before a message about a leaf's bytes, nothing when the leaf is not known.
fn key_prefix(key: &str) -> String {
    if key.is_empty() {
        String::new()
    } else {
        format!("`{key}`: ")
    }
}
