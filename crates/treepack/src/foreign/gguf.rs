//! GGUF files (llama.cpp's and ggml's models) read as treepack trees (issue 54).
//!
//! The header is parsed by [`format::gguf`](crate::format::gguf), strictly and with limits; the
//! file is opened without following a link and mapped copy-on-write, and each tensor is a view
//! of its bytes in the map (read with `pread` into one buffer where the file cannot be mapped).
//! Nothing is read past the file's end: every tensor's extent was checked against its size.
//!
//! The tree is a flat dict from tensor name to array, names as stored, in file order:
//!
//! - `F32`, `F16`, `BF16`, `F64`, `I8`, `I16`, `I32` and `I64` tensors are arrays of that dtype
//!   with numpy's shape (GGUF's dims, fastest-varying first, reversed);
//! - quantized tensors (`Q4_0`, `Q8_0`, `Q4_K`, `IQ2_XXS`, …) are their raw bytes: a `uint8`
//!   array of shape `[nbytes]` annotated `{"type": "gguf.quantized", "ggml_type": "Q4_K",
//!   "shape": [...]}` ([`QUANTIZED`]; the logical shape in numpy's order). A reader that does
//!   not know the annotation gets the `uint8` array (docs/format.md, section 5), so a quantized
//!   model loads and round-trips everywhere, and the annotation tells how to dequantize it.
//!
//! The metadata key-value pairs are the tree's metadata: one JSON object, key → value
//! ([`format::gguf::Value::to_json`](crate::format::gguf::Value::to_json): integers exact, a
//! `uint64` above 2^53 too; arrays as arrays; non-finite floats as `"nan"`, `"inf"`, `"-inf"`).
//! Big-endian and version-1 files are refused with a message saying so.

use crate::format::dtype::DType;
use crate::format::gguf::{self as g, GgufError};
use crate::format::model::{ArrayData, Key, Node, Tree};
use crate::{Error, Result};
use std::path::Path;

/// The annotation `type` of a quantized tensor's bytes.
pub const QUANTIZED: &str = "gguf.quantized";

/// What the location of a GGUF file is shown as having been read from.
pub(crate) const READ_FROM: &str = "GGUF file";

/// Why a GGUF file's location refuses writes.
pub(crate) const READ_ONLY: &str = "a GGUF file is read as a tree but not written to; save to a directory or a .tpk \
                         (`treepack cp MODEL.gguf DST` stores its tree)";

/// The tree of the GGUF file at `path` as a read-only location in memory, shown as `display`:
/// every reader (load, selections, structure, `inspect`, `ls`, `cat`, verify, convert) then
/// works on it as on a treepack tree.
///
/// # Errors
/// As [`read`].
pub fn open_location(path: &Path, display: &str) -> Result<crate::Location> {
    let file = crate::store::Location::parse(&path.to_string_lossy())?;
    let (tree, metadata) = read(path)?;
    crate::Location::read_into_memory(&tree, metadata, display, READ_ONLY, READ_FROM, file)
}

/// Read a GGUF file as a tree (a flat dict of its tensors, in file order) and its metadata
/// (a JSON object of its key-value pairs; `None` when it has none). See the module's
/// documentation for the shapes and annotations.
///
/// # Errors
/// [`Error::InvalidForeign`] (format `GGUF`) for a file the header parser refuses, saying what
/// and where; [`Error::Link`] if `path` is a symbolic link; [`Error::NotFound`], [`Error::Io`],
/// [`Error::OutOfMemory`].
pub fn read(path: impl AsRef<Path>) -> Result<(Node, Option<serde_json::Value>)> {
    let path = path.as_ref();
    let shown = path.display().to_string();
    // Mapped copy-on-write, or read into one buffer where it cannot be mapped.
    let bytes = super::map_file(path, "GGUF")?;
    let header = g::parse_with(&bytes, bytes.len() as u64, &g::Limits::default()).map_err(|e| bad(&shown, &e))?;
    let mut items = Vec::with_capacity(header.tensors.len());
    for t in &header.tensors {
        let r = header.range(t);
        // Checked by the parser against the file's length, which is the buffer's.
        let data = bytes.slice(r.start as usize..r.end as usize);
        let a = match t.ggml_type.dtype() {
            Some(dtype) => ArrayData::new(dtype, t.shape(), data)?,
            None => ArrayData::new(DType::U8, vec![t.nbytes], data)?.with_annotation(Some(serde_json::json!({
                "type": QUANTIZED,
                "ggml_type": t.ggml_type.name,
                "shape": t.shape(),
            })))?,
        };
        items.push((Key::Str(t.name.clone()), Node::from(a)));
    }
    let metadata = header.metadata_json();
    Ok((Tree::Dict(items), (!metadata.is_empty()).then_some(serde_json::Value::Object(metadata))))
}

fn bad(file: &str, e: &GgufError) -> Error {
    Error::InvalidForeign { file: file.to_string(), format: "GGUF".into(), reason: e.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_and_folders_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("m.gguf");
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&[0u8; 16]);
        std::fs::write(&f, &b).unwrap();
        let (tree, md) = read(&f).unwrap();
        assert_eq!(tree, Tree::Dict(vec![]));
        assert_eq!(md, None);
        #[cfg(unix)]
        {
            let l = dir.path().join("l.gguf");
            std::os::unix::fs::symlink(&f, &l).unwrap();
            assert_eq!(read(&l).unwrap_err().kind(), "link");
        }
        assert_eq!(read(dir.path()).unwrap_err().kind(), "invalid_foreign");
        assert_eq!(read(dir.path().join("none.gguf")).unwrap_err().kind(), "not_found");
        std::fs::write(&f, b"GGUF\x01\0\0\0").unwrap();
        let e = read(&f).unwrap_err();
        assert!(e.to_string().contains("m.gguf") && e.to_string().contains("version 1"), "{e}");
    }
}
