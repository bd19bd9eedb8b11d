//! `treepack.Repository`'s Rust side: names, delete, gc, verify. Saves and loads go through
//! `save`/`load` with `LOCATION@NAME` locations, so every option applies unchanged.

use super::*;

/// One committed name as `names` hands it over: (name, root hex, saved ms, bytes written,
/// bytes reused).
type NameRow = (String, String, u64, u64, u64);

/// A repository of trees sharing chunks (`treepack.Repository` wraps it).
#[pyclass(frozen, module = "treepack._core")]
pub(crate) struct Repository {
    inner: treepack::Repository,
}

#[pymethods]
impl Repository {
    /// Open the repository at `path`, creating it first when `create`.
    #[new]
    #[pyo3(signature = (path, storage_options=None, create=false))]
    fn new(py: Python<'_>, path: &str, storage_options: Options, create: bool) -> PyResult<Self> {
        let loc = location(path, storage_options)?;
        let inner = py
            .detach_releasing(
                || if create { treepack::Repository::create(loc) } else { treepack::Repository::open(loc) },
            )
            .map_err(py_err)?;
        Ok(Repository { inner })
    }

    /// `LOCATION@NAME`: the location of tree `name` (checks the name).
    fn tree(&self, name: &str) -> PyResult<String> {
        Ok(self.inner.tree(name).map_err(py_err)?.display().to_string())
    }

    /// Every name: (name, root hex, saved ms, bytes written, bytes reused), sorted by name.
    fn names(&self, py: Python<'_>) -> PyResult<Vec<NameRow>> {
        let v = py.detach_releasing(|| self.inner.names()).map_err(py_err)?;
        Ok(v.into_iter().map(|t| (t.name, t.root.to_hex(), t.saved_ms, t.bytes_written, t.bytes_reused)).collect())
    }

    /// The root hash recorded for `name`.
    fn root_hash(&self, py: Python<'_>, name: &str) -> PyResult<String> {
        let loc = self.inner.location().clone();
        py.detach_releasing(|| loc.block_on(self.inner.root_hash(name))).map(|h| h.to_hex()).map_err(py_err)
    }

    fn delete(&self, py: Python<'_>, name: &str) -> PyResult<()> {
        py.detach_releasing(|| self.inner.delete(name)).map_err(py_err)
    }

    /// (removed paths, bytes freed, waiting paths, saves running).
    fn gc(&self, py: Python<'_>, grace_secs: f64) -> PyResult<(Vec<String>, u64, Vec<String>, usize)> {
        let grace = std::time::Duration::from_secs_f64(grace_secs.max(0.0));
        let r = py.detach_releasing(|| self.inner.gc(grace)).map_err(py_err)?;
        Ok((r.removed, r.bytes_freed, r.waiting, r.saves_running))
    }

    fn verify(&self, py: Python<'_>) -> PyResult<VerifyReport> {
        Ok(py.detach_releasing(|| self.inner.verify()).map_err(py_err)?.into())
    }
}
