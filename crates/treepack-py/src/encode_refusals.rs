//! The objects a save cannot keep (design decision 114): each refusal by kind is noted where
//! the walk meets it (an `UnsupportedObjectError` from `encode_other`, a dtype `encode_array`
//! refuses), the walk goes on past it, and `prepare` raises one error naming them all.

use super::*;

impl<'py> Encoder<'py> {
    /// Note an object the save cannot keep (an `UnsupportedObjectError`): a save that cannot
    /// keep several says so once, naming them all, not one per attempt. Past the class's
    /// `LIMIT` it stops looking (the error, with all noted so far).
    pub(crate) fn unsupported_at(&mut self, obj: &Bound<'py, PyAny>, e: PyErr) -> PyResult<()> {
        self.unsupported.push((obj.as_ptr() as usize, e));
        let limit: usize = unsupported_class(self.py)?.getattr("LIMIT")?.extract()?;
        if self.unsupported.len() >= limit {
            return Err(unsupported_error(self.py, std::mem::take(&mut self.unsupported), true));
        }
        Ok(())
    }
}

/// `treepack._errors.UnsupportedObjectError`: what `encode_other` raises for an object no
/// codec keeps (looked up only when a description failed).
pub(crate) fn unsupported_class(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    py.import("treepack._errors")?.getattr("UnsupportedObjectError")
}

/// One error for every object of a save that could not be described (`stopped`: the limit
/// was reached, more may follow), made by the class's `combine`, which the objects' addresses
/// tell what was met at two places (the objects are alive: the tree holds them).
pub(crate) fn unsupported_error(py: Python<'_>, errors: Vec<(usize, PyErr)>, stopped: bool) -> PyErr {
    let made = unsupported_class(py).and_then(|cls| {
        let values: Vec<_> = errors.iter().map(|(_, e)| e.value(py).clone()).collect();
        let ids: Vec<usize> = errors.iter().map(|(id, _)| *id).collect();
        cls.call_method1("combine", (values, stopped, ids))
    });
    match made {
        Ok(e) => PyErr::from_value(e),
        Err(e) => e,
    }
}
