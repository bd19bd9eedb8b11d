//! Typed results handed to Python, instead of tuples unpacked by position on the other side.

use super::*;

/// What a save wrote (`treepack.SaveInfo`).
#[pyclass(frozen, eq, get_all, module = "treepack")]
#[derive(Clone, PartialEq)]
pub(crate) struct SaveInfo {
    /// Leaves in the tree.
    pub(crate) leaves: usize,
    /// Bytes written to storage (packs and manifest).
    pub(crate) bytes_written: u64,
    /// Where the tree is.
    pub(crate) location: String,
    /// Array leaves, and their bytes.
    pub(crate) arrays: usize,
    pub(crate) array_bytes: u64,
    /// Stored bytes a repository already held (not written again); 0 elsewhere.
    pub(crate) bytes_reused: u64,
    /// The root hash, for saves into a repository (`treepack.root_hash` elsewhere).
    pub(crate) root: Option<String>,
}

#[pymethods]
impl SaveInfo {
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "SaveInfo(leaves={}, bytes_written={}, location={}, arrays={}, array_bytes={}{})",
            self.leaves,
            self.bytes_written,
            PyString::new(py, &self.location).repr()?,
            self.arrays,
            self.array_bytes,
            match &self.root {
                Some(r) => format!(", bytes_reused={}, root='{r}'", self.bytes_reused),
                None => String::new(),
            }
        ))
    }
}

impl From<treepack::SaveInfo> for SaveInfo {
    fn from(i: treepack::SaveInfo) -> Self {
        SaveInfo {
            leaves: i.leaves,
            bytes_written: i.bytes_written,
            location: i.location,
            arrays: i.arrays,
            array_bytes: i.array_bytes,
            bytes_reused: i.bytes_reused,
            root: i.root.map(|h| h.to_hex()),
        }
    }
}

/// What `verify` found (`treepack.VerifyReport`): `ok`, the chunks and bytes it re-hashed, and
/// one line per problem naming the leaf, chunk and file.
#[pyclass(frozen, eq, get_all, module = "treepack")]
#[derive(Clone, PartialEq)]
pub(crate) struct VerifyReport {
    pub(crate) ok: bool,
    pub(crate) chunks_checked: usize,
    pub(crate) bytes_checked: u64,
    pub(crate) problems: Vec<String>,
}

#[pymethods]
impl VerifyReport {
    fn __repr__(&self) -> String {
        format!(
            "VerifyReport(ok={}, chunks_checked={}, bytes_checked={}, problems={:?})",
            if self.ok { "True" } else { "False" },
            self.chunks_checked,
            self.bytes_checked,
            self.problems
        )
    }
}

impl From<treepack::VerifyReport> for VerifyReport {
    fn from(r: treepack::VerifyReport) -> Self {
        let problems = r
            .problems
            .iter()
            .map(|p| match p.chunk {
                Some(c) => format!("{} chunk {c} in {}: {}", p.key, p.file, p.reason),
                None => format!("{}: {}", p.file, p.reason),
            })
            .collect();
        VerifyReport { ok: r.ok(), chunks_checked: r.chunks_checked, bytes_checked: r.bytes_checked, problems }
    }
}
