//! Python exception classes and the mapping of treepack's errors onto them.

use super::*;

pyo3::create_exception!(_core, TreepackError, pyo3::exceptions::PyException, "Base class of treepack errors.");
pyo3::create_exception!(_core, CorruptError, TreepackError, "Stored bytes do not match their recorded hash or layout.");
pyo3::create_exception!(
    _core,
    RootMismatchError,
    TreepackError,
    "The tree's root hash is not the one asked for (load's expect_root=)."
);
pyo3::create_exception!(_core, FormatError, TreepackError, "The location is not a valid treepack tree.");
pyo3::create_exception!(_core, SignatureError, TreepackError, "The tree is not signed as load's signed_by= asks.");
pyo3::create_exception!(_core, UnsignedError, SignatureError, "The tree has no signature.");
pyo3::create_exception!(_core, UntrustedSignerError, SignatureError, "The tree is signed by none of the keys trusted.");
pyo3::create_exception!(
    _core,
    SignatureMismatchError,
    SignatureError,
    "A trusted key's signature that does not hold for this tree (modified, another tree's, or too old)."
);
pyo3::create_exception!(_core, InvalidSignatureError, SignatureError, "The signature file is malformed or altered.");
pyo3::create_exception!(_core, EncryptionError, TreepackError, "An encrypted tree cannot be opened as asked.");
pyo3::create_exception!(_core, EncryptedError, EncryptionError, "The tree is encrypted and no key was given.");
pyo3::create_exception!(
    _core,
    NotEncryptedError,
    EncryptionError,
    "A key was given and the tree is not encrypted (it may have been put in place of the encrypted one)."
);
pyo3::create_exception!(_core, WrongKeyError, EncryptionError, "The key given does not open the tree.");
pyo3::create_exception!(
    _core,
    TamperedError,
    CorruptError,
    "Encrypted bytes that do not authenticate: modified, moved, cut short or from another save."
);

/// Map a core error to the most fitting Python exception (message keeps file and key path).
pub(crate) fn py_err(e: treepack::Error) -> PyErr {
    use treepack::Error as E;
    let msg = match e.hint() {
        Some(hint) => format!("{e}; {hint}"),
        None => e.to_string(),
    };
    match e {
        E::NotFound { .. } => PyFileNotFoundError::new_err(msg),
        E::AlreadyExists { .. } | E::Conflict { .. } => PyFileExistsError::new_err(msg),
        E::KeyNotFound { .. } => PyKeyError::new_err(msg),
        E::BadKeyPath { .. }
        | E::BadSlice { .. }
        | E::InvalidTree { .. }
        | E::Parts { .. }
        | E::BadDType { .. }
        | E::BadLocation { .. }
        | E::InvalidCompression { .. } => PyValueError::new_err(msg),
        E::ChunkCorrupt { .. } | E::BadChunk { .. } | E::ManifestChecksum { .. } | E::OutOfBounds { .. } => {
            CorruptError::new_err(msg)
        }
        // With the OS error number, so that Python picks the subclass (PermissionError…) and
        // `e.errno` tells a full disk (ENOSPC) from a read-only one (EROFS).
        E::Io { ref source, .. } => match source.raw_os_error() {
            Some(errno) => PyOSError::new_err((errno, msg)),
            None => PyIOError::new_err(msg),
        },
        E::Store { .. } => PyIOError::new_err(msg),
        E::RootMismatch { .. } => RootMismatchError::new_err(msg),
        E::Unsigned { .. } => UnsignedError::new_err(msg),
        E::UntrustedSigner { .. } => UntrustedSignerError::new_err(msg),
        E::SignatureMismatch { .. } => SignatureMismatchError::new_err(msg),
        E::InvalidSignature { .. } => InvalidSignatureError::new_err(msg),
        E::BadKey { .. } => PyValueError::new_err(msg),
        E::Encrypted { .. } => EncryptedError::new_err(msg),
        E::NotEncrypted { .. } => NotEncryptedError::new_err(msg),
        E::WrongKey { .. } => WrongKeyError::new_err(msg),
        E::Tampered { .. } => TamperedError::new_err(msg),
        E::ReadOnly { .. } => PyPermissionError::new_err(msg),
        // A symbolic link inside a location: not a treepack location as treepack reads and
        // writes them (the message names the link and says what to do).
        E::Link { .. } => FormatError::new_err(msg),
        _ => FormatError::new_err(msg),
    }
}
