//! numpy dtypes <-> treepack dtypes. The dtype names and their manifest JSON are the core's
//! (`DType`); here, only which numpy dtype is which, both ways.

use super::*;

/// The treepack dtype of a numpy dtype, as its manifest JSON text, and the canonical numpy
/// dtype an array of it is stored as (little-endian, packed): `(text, canonical dtype)`.
/// Raises `TypeError` for dtypes arrays cannot hold.
#[pyfunction]
pub(crate) fn numpy_dtype_desc<'py>(dt: &Bound<'py, PyAny>) -> PyResult<(String, Bound<'py, PyAny>)> {
    let (d, canon) = dtype_of_numpy(dt)?;
    Ok((d.to_json().to_string(), canon))
}

fn dtype_of_numpy<'py>(dt: &Bound<'py, PyAny>) -> PyResult<(DType, Bound<'py, PyAny>)> {
    let py = dt.py();
    let np = py.import("numpy")?;
    let names = dt.getattr("names")?;
    if !names.is_none() {
        let fields_of = dt.getattr("fields")?;
        let mut fields = vec![];
        let formats = PyList::empty(py);
        for name in names.try_iter()? {
            let name = name?;
            let mut sub = fields_of.get_item(&name)?.get_item(0)?;
            let mut shape: Vec<u64> = vec![];
            let subdtype = sub.getattr("subdtype")?;
            if !subdtype.is_none() {
                shape = subdtype.get_item(1)?.extract()?;
                sub = subdtype.get_item(0)?;
            }
            let (dtype, canon) = dtype_of_numpy(&sub)?;
            if shape.is_empty() {
                formats.append((&name, canon))?;
            } else {
                formats.append((&name, canon, PyTuple::new(py, &shape)?))?;
            }
            fields.push(treepack::format::dtype::Field { name: name.extract()?, dtype, shape });
        }
        return Ok((DType::Struct(fields), np.getattr("dtype")?.call1((formats,))?));
    }
    if !dt.getattr("subdtype")?.is_none() {
        return Err(PyTypeError::new_err(format!("sub-array dtype {dt} is only supported inside a structured dtype")));
    }
    let kind: String = dt.getattr("kind")?.extract()?;
    let itemsize: usize = dt.getattr("itemsize")?.extract()?;
    let little = |dt: &Bound<'py, PyAny>| dt.call_method1("newbyteorder", ("<",));
    match kind.as_str() {
        "S" => return Ok((DType::Bytes(itemsize as u64), dt.clone())),
        "U" => return Ok((DType::Unicode(itemsize as u64 / 4), little(dt)?)),
        _ => {}
    }
    let name: String = dt.getattr("name")?.extract()?;
    let plain = kind.bytes().next().and_then(|k| DType::from_numpy_kind(k, itemsize));
    if let Some(d) = plain.or_else(|| DType::from_name(&name).ok().filter(DType::is_ml_dtypes)) {
        let canon = if d.is_ml_dtypes() || itemsize == 1 { dt.clone() } else { little(dt)? };
        return Ok((d, canon));
    }
    if matches!(kind.as_str(), "f" | "c") {
        // numpy's long double: 80-bit x87 values padded to 16 bytes here, plain float64 or
        // IEEE quad elsewhere; no layout every reader agrees on.
        return Err(PyTypeError::new_err(format!(
            "numpy dtype {dt} is numpy's long double, whose layout differs from machine to machine, so treepack \
             does not store it: convert it (.astype(np.{}), exact only within that type's precision) or keep its \
             bytes (.view(np.uint8))",
            if kind == "f" { "float64" } else { "complex128" }
        )));
    }
    Err(PyTypeError::new_err(format!(
        "numpy dtype {dt} (kind {}) is not supported; use a numeric, bool, bytes or str dtype",
        pyo3::types::PyString::new(py, &kind).repr()?
    )))
}

/// The numpy dtype of a treepack dtype given as its manifest JSON text (ml_dtypes' types for
/// bfloat16, float8, int4 and their kin: an `ImportError` without that package).
#[pyfunction]
pub(crate) fn numpy_dtype<'py>(py: Python<'py>, text: &str) -> PyResult<Bound<'py, PyAny>> {
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| PyValueError::new_err(format!("dtype {text:?}: {e}")))?;
    numpy_of(py, &DType::from_json(&v).map_err(py_err)?)
}

fn numpy_of<'py>(py: Python<'py>, d: &DType) -> PyResult<Bound<'py, PyAny>> {
    let dtype = py.import("numpy")?.getattr("dtype")?;
    match d {
        DType::Struct(fields) => {
            let list = PyList::empty(py);
            for f in fields {
                let sub = numpy_of(py, &f.dtype)?;
                if f.shape.is_empty() {
                    list.append((&f.name, sub))?;
                } else {
                    list.append((&f.name, sub, PyTuple::new(py, &f.shape)?))?;
                }
            }
            dtype.call1((list,))
        }
        DType::Bytes(n) => dtype.call1((format!("S{n}"),)),
        DType::Unicode(n) => dtype.call1((format!("<U{n}"),)),
        d => {
            let name = d.name().unwrap_or_default();
            if d.is_ml_dtypes() {
                let Ok(ml) = py.import("ml_dtypes") else {
                    return Err(pyo3::exceptions::PyImportError::new_err(format!(
                        "loading {name} arrays needs the ml_dtypes package (pip install ml_dtypes)"
                    )));
                };
                return dtype.call1((ml.getattr(name.as_str())?,));
            }
            let x = dtype.call1((name,))?;
            if d.itemsize() > 1 {
                x.call_method1("newbyteorder", ("<",))
            } else {
                Ok(x)
            }
        }
    }
}
