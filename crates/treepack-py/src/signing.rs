//! Signed trees' Rust side (docs/signing.md): sign, check, say who signed, make keys. Keys come
//! as `(label, PEM text)` pairs — the Python layer reads files and names them — and results as
//! JSON text `treepack.SignatureInfo` is built from.

use super::*;
use treepack::sign::{self as engine, Algorithm, SignedBy, SigningKey, VerifyingKey};

/// A key error naming where the key came from.
fn bad_key(label: &str, reason: String) -> PyErr {
    py_err(treepack::Error::BadKey { file: label.to_string(), reason })
}

fn signing_key(label: &str, pem: &str) -> PyResult<SigningKey> {
    SigningKey::from_pem(pem).map_err(|r| bad_key(label, r))
}

/// What a check requires: the keys, and how recent.
pub(crate) fn policy(
    keys: Vec<(String, String)>,
    min_version: Option<u64>,
    not_before_ms: Option<u64>,
) -> PyResult<SignedBy> {
    let keys = keys
        .iter()
        .map(|(label, pem)| VerifyingKey::from_pem(pem).map_err(|r| bad_key(label, r)))
        .collect::<PyResult<Vec<_>>>()?;
    let not_before = not_before_ms.map(|ms| std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms));
    Ok(SignedBy { keys, min_version, not_before })
}

/// Sign the tree at `path` with the private key `key` (`(label, PEM)`); the signature as JSON.
#[pyfunction]
#[pyo3(signature = (path, key, tree_version=None, name=None, model_signing=false, storage_options=None))]
pub(crate) fn sign(
    py: Python<'_>,
    path: &str,
    key: (String, String),
    tree_version: Option<u64>,
    name: Option<String>,
    model_signing: bool,
    storage_options: Options,
) -> PyResult<String> {
    let k = signing_key(&key.0, &key.1)?;
    let loc = location(path, storage_options)?;
    let opts = treepack::SignOptions { tree_version, name, model_signing, signed_at: None };
    let info = py.detach_releasing(|| engine::sign(loc, &k, &opts)).map_err(py_err)?;
    Ok(info.to_json().to_string())
}

/// Check that the tree at `path` is signed by one of `keys` (as recently as asked): the
/// signature as JSON, or the error saying why not. Reads the manifest and the signature only.
#[pyfunction]
#[pyo3(signature = (path, keys, min_version=None, not_before_ms=None, storage_options=None))]
pub(crate) fn verify_signature(
    py: Python<'_>,
    path: &str,
    keys: Vec<(String, String)>,
    min_version: Option<u64>,
    not_before_ms: Option<u64>,
    storage_options: Options,
) -> PyResult<String> {
    let by = policy(keys, min_version, not_before_ms)?;
    let loc = location(path, storage_options)?;
    let info = py.detach_releasing(|| engine::verify_signature(loc, &by)).map_err(py_err)?;
    Ok(info.to_json().to_string())
}

/// [`verify_signature`] against the manifest `reader` opened (what a lazy view reads through).
#[pyfunction]
#[pyo3(signature = (reader, keys, min_version=None, not_before_ms=None))]
pub(crate) fn reader_verify_signature(
    py: Python<'_>,
    reader: PyRef<'_, Reader>,
    keys: Vec<(String, String)>,
    min_version: Option<u64>,
    not_before_ms: Option<u64>,
) -> PyResult<String> {
    let by = policy(keys, min_version, not_before_ms)?;
    let r = &reader.inner;
    let info = py.detach_releasing(|| r.location().block_on(r.verify_signature_async(&by))).map_err(py_err)?;
    Ok(info.to_json().to_string())
}

/// Who signed the tree at `path`, as it says itself (nothing trusted): JSON, or `None` unsigned.
#[pyfunction]
#[pyo3(signature = (path, storage_options=None))]
pub(crate) fn signature(py: Python<'_>, path: &str, storage_options: Options) -> PyResult<Option<String>> {
    let loc = location(path, storage_options)?;
    let info = py.detach_releasing(|| engine::signature(loc)).map_err(py_err)?;
    Ok(info.map(|i| i.to_json().to_string()))
}

/// A new key pair: (private PKCS#8 PEM, public SubjectPublicKeyInfo PEM, fingerprint).
#[pyfunction]
#[pyo3(signature = (algorithm="ed25519"))]
pub(crate) fn generate_key(algorithm: &str) -> PyResult<(String, String, String)> {
    let alg = Algorithm::from_name(algorithm)
        .ok_or_else(|| PyValueError::new_err(format!("algorithm={algorithm:?}: use \"ed25519\" or \"ecdsa-p256\"")))?;
    let k = engine::generate_key(alg).map_err(py_err)?;
    let private = k.to_pem().map_err(|r| bad_key("a new key", r))?;
    let public = k.verifying_key();
    Ok((private, public.to_pem(), public.fingerprint()))
}

/// The public half of a key `(label, PEM)` (a private key's, or a public key checked): (PEM,
/// algorithm, fingerprint).
#[pyfunction]
pub(crate) fn public_key(key: (String, String)) -> PyResult<(String, String, String)> {
    let k = VerifyingKey::from_pem(&key.1).map_err(|r| bad_key(&key.0, r))?;
    Ok((k.to_pem(), k.algorithm().name().to_string(), k.fingerprint()))
}

/// Register this module's functions.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(sign, m)?)?;
    m.add_function(wrap_pyfunction!(verify_signature, m)?)?;
    m.add_function(wrap_pyfunction!(reader_verify_signature, m)?)?;
    m.add_function(wrap_pyfunction!(signature, m)?)?;
    m.add_function(wrap_pyfunction!(generate_key, m)?)?;
    m.add_function(wrap_pyfunction!(public_key, m)?)?;
    for (name, ty) in [
        ("SignatureError", m.py().get_type::<SignatureError>()),
        ("UnsignedError", m.py().get_type::<UnsignedError>()),
        ("UntrustedSignerError", m.py().get_type::<UntrustedSignerError>()),
        ("SignatureMismatchError", m.py().get_type::<SignatureMismatchError>()),
        ("InvalidSignatureError", m.py().get_type::<InvalidSignatureError>()),
        ("EncryptionError", m.py().get_type::<EncryptionError>()),
        ("EncryptedError", m.py().get_type::<EncryptedError>()),
        ("NotEncryptedError", m.py().get_type::<NotEncryptedError>()),
        ("WrongKeyError", m.py().get_type::<WrongKeyError>()),
        ("TamperedError", m.py().get_type::<TamperedError>()),
    ] {
        m.add(name, ty)?;
    }
    Ok(())
}
