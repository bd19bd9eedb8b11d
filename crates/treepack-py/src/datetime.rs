//! `py.datetime`, both ways, both forms: the compact form (a string: the naive isoformat, with
//! a trailing `Z` for UTC) of naive and UTC datetimes with fold 0, and the general form (an
//! object: `{"iso": naive isoformat, "tz": the zone, "fold": 0|1}`) of any other. The time
//! zone inside the general form is described by Python's codec (`_tz_data`, `_tz_from` in
//! `treepack._codec.builtins`), which `py.time` and `py.timezone` share: zones are objects of
//! Python libraries (zoneinfo, dateutil).

use super::*;

/// A function of the Python codec's built-in types.
fn codec_fn<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
    py.import("treepack._codec.builtins")?.getattr(name)
}

/// The general form of a datetime's `py.datetime` node, as JSON text: what `encode_other`
/// gives the walk for the datetimes it leaves to it (other time zones, and every datetime when
/// the walk's fast path is off). Raises what the codec raises for a zone it cannot describe (a
/// `TypeError`).
#[pyfunction]
pub(crate) fn datetime_general_json(d: &Bound<'_, pyo3::types::PyDateTime>) -> PyResult<String> {
    Ok(datetime_general(d.py(), d)?.to_string())
}

/// The general form of a datetime of any time zone, `{"iso", "tz", "fold"}`.
fn datetime_general(py: Python<'_>, d: &Bound<'_, pyo3::types::PyDateTime>) -> PyResult<serde_json::Value> {
    use pyo3::types::{PyDict, PyTimeAccess, PyTzInfoAccess};
    let kw = PyDict::new(py);
    kw.set_item("tzinfo", py.None())?;
    let iso: String = d.call_method("replace", (), Some(&kw))?.call_method0("isoformat")?.extract()?;
    let tz = codec_fn(py, "_tz_data")?.call1((d.get_tzinfo(),))?;
    let tz_text: String = py.import("json")?.call_method1("dumps", (tz,))?.extract()?;
    let tz: serde_json::Value = serde_json::from_str(&tz_text).map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(serde_json::json!({"iso": iso, "tz": tz, "fold": u8::from(d.get_fold())}))
}

/// The datetime of a general form the fast path leaves (zones that are not UTC or an unnamed
/// fixed offset, or data it cannot read): `datetime.fromisoformat(iso).replace(tzinfo=zone,
/// fold=fold)`; what that raises becomes the codec's `BuildError`, as for any custom node.
pub(crate) fn datetime_from_general<'py>(py: Python<'py>, data: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
    let build = || -> PyResult<Bound<'py, PyAny>> {
        let d = py.import("json")?.call_method1("loads", (data.to_string(),))?;
        let naive = py.import("datetime")?.getattr("datetime")?.call_method1("fromisoformat", (d.get_item("iso")?,))?;
        let kw = pyo3::types::PyDict::new(py);
        kw.set_item("tzinfo", codec_fn(py, "_tz_from")?.call1((d.get_item("tz")?,))?)?;
        kw.set_item("fold", d.call_method1("get", ("fold", 0))?)?;
        naive.call_method("replace", (), Some(&kw))
    };
    build().map_err(|e| {
        let made = (|| {
            let msg = format!("{}: {}", e.get_type(py).name()?, e.value(py).str()?);
            let built =
                py.import("treepack._codec")?.getattr("BuildError")?.call1(("py.datetime", msg, "py.datetime"))?;
            let err = PyErr::from_value(built);
            err.set_cause(py, Some(e.clone_ref(py)));
            Ok::<_, PyErr>(err)
        })();
        made.unwrap_or_else(|x| x)
    })
}

/// The `py.datetime` node of a naive or UTC datetime (the compact form, or the general form
/// for fold 1); `None` for other time zones and years, which `encode_other` gives the general
/// form of ([`datetime_general_json`]).
pub(crate) fn datetime_node(py: Python<'_>, d: &Bound<'_, pyo3::types::PyDateTime>) -> PyResult<Option<Node>> {
    use pyo3::types::{PyDateAccess, PyTimeAccess, PyTzInfo, PyTzInfoAccess};
    let utc = match d.get_tzinfo() {
        None => false,
        Some(t) if t.is(&*PyTzInfo::utc(py)?) => true,
        Some(_) => return Ok(None),
    };
    let year = d.get_year();
    if !(0..=9999).contains(&year) {
        return Ok(None);
    }
    // `YYYY-MM-DDTHH:MM:SS[.ffffff]`, digit by digit (this runs once per record).
    fn digits(out: &mut String, sep: Option<char>, v: u32, n: u32) {
        out.extend(sep);
        for i in (0..n).rev() {
            out.push(char::from(b'0' + ((v / 10u32.pow(i)) % 10) as u8));
        }
    }
    let mut iso = String::with_capacity(28);
    digits(&mut iso, None, year as u32, 4);
    digits(&mut iso, Some('-'), u32::from(d.get_month()), 2);
    digits(&mut iso, Some('-'), u32::from(d.get_day()), 2);
    digits(&mut iso, Some('T'), u32::from(d.get_hour()), 2);
    digits(&mut iso, Some(':'), u32::from(d.get_minute()), 2);
    digits(&mut iso, Some(':'), u32::from(d.get_second()), 2);
    if d.get_microsecond() != 0 {
        digits(&mut iso, Some('.'), d.get_microsecond(), 6);
    }
    if d.get_fold() {
        let data = datetime_general(py, d)?;
        return Ok(Some(Tree::Custom { type_name: "py.datetime".into(), data, children: vec![] }));
    }
    let data = {
        // The compact form (see `datetime_fast`): one JSON string instead of a nested object.
        if utc {
            iso.push('Z');
        }
        serde_json::Value::String(iso)
    };
    Ok(Some(Tree::Custom { type_name: "py.datetime".into(), data, children: vec![] }))
}

/// The datetime of a `py.datetime` node. Built here, not through the Python decoder (one per
/// record in traced data, so a JSON round trip through Python each would dominate their load):
/// the compact form always; the general form directly for naive, UTC and unnamed fixed-offset
/// zones, and with the codec's zone ([`datetime_from_general`]) for any other.
pub(crate) fn datetime_of<'py>(py: Python<'py>, data: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
    match datetime_fast(py, data)? {
        Some(dt) => Ok(dt),
        None => datetime_from_general(py, data),
    }
}

/// [`datetime_of`] where it needs no Python call: `None` for the general form's other zones.
fn datetime_fast<'py>(py: Python<'py>, data: &serde_json::Value) -> PyResult<Option<Bound<'py, PyAny>>> {
    use pyo3::types::{PyDateTime, PyDelta, PyTzInfo};
    if let Some(text) = data.as_str() {
        // Compact form: naive isoformat, or with a trailing `Z` for `timezone.utc` (fold 0).
        let (iso, utc) = match text.strip_suffix('Z') {
            Some(t) => (t, true),
            None => (text, false),
        };
        // The compact form is this module's alone: text it cannot read is an error here.
        let Some((y, mo, d, h, mi, sec, us)) = parse_iso_datetime(iso) else {
            return Err(PyValueError::new_err(format!(
                "py.datetime {text:?} is not YYYY-MM-DDTHH:MM:SS[.ffffff], with `Z` for UTC"
            )));
        };
        let tz = if utc { Some(PyTzInfo::utc(py)?.to_owned()) } else { None };
        return Ok(Some(PyDateTime::new_with_fold(py, y, mo, d, h, mi, sec, us, tz.as_ref(), false)?.into_any()));
    }
    let Some(obj) = data.as_object() else { return Ok(None) };
    if obj.len() > 3 {
        return Ok(None);
    }
    let Some(iso) = obj.get("iso").and_then(|v| v.as_str()) else { return Ok(None) };
    let fold = match obj.get("fold").map(|v| v.as_u64()) {
        None | Some(Some(0)) => false,
        Some(Some(1)) => true,
        _ => return Ok(None),
    };
    let Some((y, mo, d, h, mi, sec, us)) = parse_iso_datetime(iso) else { return Ok(None) };
    let tz: Option<Bound<'py, PyTzInfo>> = match obj.get("tz") {
        None | Some(serde_json::Value::Null) => None,
        Some(t) => {
            let Some(t) = t.as_object() else { return Ok(None) };
            let Some(off) = t.get("offset").and_then(|o| o.as_array()) else { return Ok(None) };
            let off: Vec<i64> = off.iter().filter_map(serde_json::Value::as_i64).collect();
            if off.len() != 3 || t.len() > 2 {
                return Ok(None);
            }
            let name = t.get("name");
            let (days, secs, micros) = (off[0], off[1], off[2]);
            if days == 0 && secs == 0 && micros == 0 && matches!(name.and_then(|n| n.as_str()), None | Some("UTC")) {
                Some(PyTzInfo::utc(py)?.to_owned())
            } else if name.is_none_or(serde_json::Value::is_null) {
                let (Ok(days), Ok(secs), Ok(micros)) =
                    (i32::try_from(days), i32::try_from(secs), i32::try_from(micros))
                else {
                    return Ok(None);
                };
                let delta = PyDelta::new(py, days, secs, micros, true)?;
                Some(PyTzInfo::fixed_offset(py, delta)?)
            } else {
                return Ok(None);
            }
        }
    };
    let dt = PyDateTime::new_with_fold(py, y, mo, d, h, mi, sec, us, tz.as_ref(), fold)?;
    Ok(Some(dt.into_any()))
}

/// Parse `YYYY-MM-DDTHH:MM:SS[.ffffff]` (what `datetime.isoformat()` writes for naive values).
pub(crate) fn parse_iso_datetime(s: &str) -> Option<(i32, u8, u8, u8, u8, u8, u32)> {
    let b = s.as_bytes();
    if !(b.len() == 19 || b.len() == 26)
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b'T'
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<u32> {
        let t = &s[r];
        if t.bytes().all(|c| c.is_ascii_digit()) {
            t.parse().ok()
        } else {
            None
        }
    };
    let us = if b.len() == 26 {
        if b[19] != b'.' {
            return None;
        }
        num(20..26)?
    } else {
        0
    };
    Some((
        i32::try_from(num(0..4)?).ok()?,
        u8::try_from(num(5..7)?).ok()?,
        u8::try_from(num(8..10)?).ok()?,
        u8::try_from(num(11..13)?).ok()?,
        u8::try_from(num(14..16)?).ok()?,
        u8::try_from(num(17..19)?).ok()?,
        us,
    ))
}
