//! How the Python package says where a tree is and with what key: storage options (a dict of
//! strings) and, for an encrypted tree, the key (docs/encryption.md). The package passes
//! `storage_options` as the dict, or as `(dict or None, key)` when it was given `encryption=`;
//! every function of the module that opens a location takes either.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use std::collections::HashMap;
use std::sync::Arc;

/// Storage options and an optional key.
#[derive(Default, Clone)]
pub(crate) struct Access {
    pub(crate) options: HashMap<String, String>,
    pub(crate) key: Option<treepack::KeySource>,
}

impl<'a, 'py> FromPyObject<'a, 'py> for Access {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        if let Ok(t) = obj.cast::<PyTuple>() {
            let options: Option<HashMap<String, String>> = t.get_item(0)?.extract()?;
            let key = key_source(&t.get_item(1)?)?;
            return Ok(Access { options: options.unwrap_or_default(), key: Some(key) });
        }
        Ok(Access { options: obj.extract()?, key: None })
    }
}

/// `("key", bytes)`, `("passphrase", str)` or `("provider", object)`, as the package's
/// `_encryption.normalize` makes it.
fn key_source(k: &Bound<'_, PyAny>) -> PyResult<treepack::KeySource> {
    let (kind, value): (String, Bound<'_, PyAny>) = k.extract()?;
    Ok(match kind.as_str() {
        "key" => {
            let b = value.cast::<PyBytes>()?.as_bytes();
            let k: [u8; 32] = b.try_into().map_err(|_| {
                pyo3::exceptions::PyValueError::new_err(format!(
                    "an encryption key is 32 bytes, and {} were given (derive one from a passphrase with \
                     treepack.Passphrase(...))",
                    b.len()
                ))
            })?;
            treepack::KeySource::Key(k)
        }
        "passphrase" => treepack::KeySource::Passphrase(value.extract()?),
        "provider" => treepack::KeySource::Provider(Arc::new(PyProvider(crate::memory::Held::new(value.unbind())))),
        other => return Err(pyo3::exceptions::PyValueError::new_err(format!("unknown key kind {other:?}"))),
    })
}

/// A Python key provider: an object with `wrap_key(data_key) -> (key_id, wrapped)` and
/// `unwrap_key(key_id, wrapped) -> data_key`, called with the GIL from whichever thread the
/// store reads on (and dropped from whichever drops the location last: `Held`).
struct PyProvider(crate::memory::Held);

impl treepack::KeyProvider for PyProvider {
    fn wrap(&self, data_key: &[u8; 32]) -> Result<(String, Vec<u8>), String> {
        Python::attach(|py| {
            let r =
                self.0.bind(py).call_method1("wrap_key", (PyBytes::new(py, data_key),)).map_err(|e| e.to_string())?;
            let (id, wrapped): (String, Vec<u8>) =
                r.extract().map_err(|e: PyErr| format!("wrap_key must return (key_id: str, wrapped: bytes): {e}"))?;
            Ok((id, wrapped))
        })
    }

    fn unwrap(&self, key_id: &str, wrapped: &[u8]) -> Result<Vec<u8>, String> {
        Python::attach(|py| {
            let r = self
                .0
                .bind(py)
                .call_method1("unwrap_key", (key_id, PyBytes::new(py, wrapped)))
                .map_err(|e| e.to_string())?;
            r.extract::<Vec<u8>>().map_err(|e| format!("unwrap_key must return the 32-byte data key as bytes: {e}"))
        })
    }
}
