//! `treepack.view()`'s Rust side: the viewer's server (crates/treepack-view) started from
//! Python, and the HTML a notebook shows for `treepack.open(...)`.

use super::*;
use std::sync::Mutex;

/// A running viewer (`treepack.view` wraps it): `url`, `open_browser()`, `close()`.
#[pyclass(frozen, module = "treepack._core")]
pub(crate) struct ViewServer {
    url: String,
    inner: Mutex<Option<treepack_view::Server>>,
}

#[pymethods]
impl ViewServer {
    /// Open `path` (and `other`) and serve the viewer for them on 127.0.0.1 (`port` 0: one
    /// the system picks). The server runs on threads of its own; the GIL is not needed.
    #[new]
    #[pyo3(signature = (path, other=None, port=0, storage_options=None))]
    fn new(py: Python<'_>, path: &str, other: Option<&str>, port: u16, storage_options: Options) -> PyResult<Self> {
        let storage: treepack::StorageOptions = storage_options.unwrap_or_default().options.into_iter().collect();
        let opts = treepack_view::ViewOptions { port, storage };
        let server = py.detach_releasing(|| treepack_view::start(path, other, &opts)).map_err(py_err)?;
        Ok(ViewServer { url: server.url().to_string(), inner: Mutex::new(Some(server)) })
    }

    /// The page's address, with its token.
    #[getter]
    fn url(&self) -> &str {
        &self.url
    }

    /// Whether the server still serves.
    #[getter]
    fn running(&self) -> bool {
        self.inner.lock().map(|s| s.is_some()).unwrap_or(false)
    }

    /// Open the page in the browser (through a private redirect file: the token stays off
    /// command lines).
    fn open_browser(&self) -> PyResult<()> {
        let mut g = self.inner.lock().map_err(|_| PyValueError::new_err("the viewer's lock is poisoned"))?;
        match g.as_mut() {
            Some(s) => s.open_browser().map_err(|e| PyOSError::new_err(e.to_string())),
            None => Err(PyValueError::new_err("the viewer is closed")),
        }
    }

    /// Stop serving (harmless when already stopped).
    fn close(&self, py: Python<'_>) {
        let server = self.inner.lock().ok().and_then(|mut g| g.take());
        if let Some(mut s) = server {
            py.detach_releasing(move || s.close());
        }
    }
}

/// The subtree at `path` of `reader`'s tree as compact HTML, at most `max_rows` rows.
#[pyfunction]
#[pyo3(signature = (reader, path="", max_rows=300))]
pub(crate) fn reader_html(reader: PyRef<'_, Reader>, path: &str, max_rows: usize) -> PyResult<String> {
    treepack_view::reader_html(&reader.inner, path, max_rows).map_err(py_err)
}
