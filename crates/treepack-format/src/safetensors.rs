//! The safetensors format (Hugging Face), with no I/O: its header read strictly (files come from
//! strangers) and written. A file is an 8-byte little-endian header length `N`, `N` bytes of
//! JSON — `{"<name>": {"dtype", "shape", "data_offsets": [begin, end]}, …, "__metadata__":
//! {"<key>": "<string>"}}`, padded with spaces — then the tensors' bytes, little-endian, C order,
//! each at its offsets from the end of the header.

use crate::dtype::DType;
use crate::model::shape_len;
use std::collections::BTreeMap;

/// Largest header accepted (the safetensors library's own limit).
pub const MAX_HEADER: u64 = 100_000_000;

/// A tensor's bytes as (begin, end) offsets from the start of the data.
pub type Span = (u64, u64);

/// One tensor of a header.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// Its name.
    pub name: String,
    /// Its element type.
    pub dtype: DType,
    /// Its shape.
    pub shape: Vec<u64>,
    /// Its bytes, as offsets from the start of the data (the end of the header).
    pub begin: u64,
    /// End offset (exclusive).
    pub end: u64,
}

/// A parsed header.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Header {
    /// The tensors, in order of their data.
    pub tensors: Vec<Tensor>,
    /// `__metadata__`, if present.
    pub metadata: Option<BTreeMap<String, String>>,
    /// Where the data starts in the file (8 + header length).
    pub data_start: u64,
}

/// The safetensors name of a dtype, if safetensors has it.
pub fn dtype_name(d: &DType) -> Option<&'static str> {
    Some(match d {
        DType::Bool => "BOOL",
        DType::I8 => "I8",
        DType::I16 => "I16",
        DType::I32 => "I32",
        DType::I64 => "I64",
        DType::U8 => "U8",
        DType::U16 => "U16",
        DType::U32 => "U32",
        DType::U64 => "U64",
        DType::F16 => "F16",
        DType::BF16 => "BF16",
        DType::F32 => "F32",
        DType::F64 => "F64",
        DType::F8E4M3FN => "F8_E4M3",
        DType::F8E5M2 => "F8_E5M2",
        // The MX scale type (torch.float8_e8m0fnu): one byte, 2^(e-127), 0xff NaN.
        DType::F8E8M0FNU => "F8_E8M0",
        _ => return None,
    })
}

fn dtype_of(name: &str) -> Option<DType> {
    Some(match name {
        "BOOL" => DType::Bool,
        "I8" => DType::I8,
        "I16" => DType::I16,
        "I32" => DType::I32,
        "I64" => DType::I64,
        "U8" => DType::U8,
        "U16" => DType::U16,
        "U32" => DType::U32,
        "U64" => DType::U64,
        "F16" => DType::F16,
        "BF16" => DType::BF16,
        "F32" => DType::F32,
        "F64" => DType::F64,
        "F8_E4M3" => DType::F8E4M3FN,
        "F8_E5M2" => DType::F8E5M2,
        "F8_E8M0" => DType::F8E8M0FNU,
        _ => return None,
    })
}

/// The header length a file declares in its first 8 bytes, checked against the file's size.
///
/// # Errors
/// What is wrong, for an error message.
pub fn header_len(first8: &[u8], file_len: u64) -> Result<u64, String> {
    let b: [u8; 8] = first8.get(..8).and_then(|s| s.try_into().ok()).ok_or("shorter than the 8-byte header length")?;
    let n = u64::from_le_bytes(b);
    if n > MAX_HEADER {
        return Err(format!("declares a {n}-byte header, more than the {MAX_HEADER} accepted"));
    }
    if n.saturating_add(8) > file_len {
        return Err(format!("declares a {n}-byte header but the file has only {file_len} bytes"));
    }
    Ok(n)
}

#[derive(serde::Deserialize)]
struct Entry {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: (u64, u64),
}

/// Parse a header (`json`: the `N` bytes after the length) of a file of `file_len` bytes.
/// Checks what the safetensors library checks: every tensor's byte count matches its dtype and
/// shape, and the tensors tile the data exactly (no gap, no overlap, nothing past the end).
///
/// # Errors
/// What is wrong and where, for an error message.
pub fn parse_header(json: &[u8], file_len: u64) -> Result<Header, String> {
    let data_start = 8 + json.len() as u64;
    let v: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(json).map_err(|e| format!("the header is not a JSON object: {e}"))?;
    let mut h = Header { data_start, ..Default::default() };
    for (name, val) in v {
        if name == "__metadata__" {
            let m: BTreeMap<String, String> =
                serde_json::from_value(val).map_err(|e| format!("__metadata__ must map strings to strings: {e}"))?;
            h.metadata = Some(m);
            continue;
        }
        let e: Entry = serde_json::from_value(val).map_err(|e| format!("tensor {name:?}: {e}"))?;
        let dtype = dtype_of(&e.dtype).ok_or_else(|| match e.dtype.as_str() {
            "F4" | "F6_E2M3" | "F6_E3M2" => format!(
                "tensor {name:?}: dtype {:?} is not supported: it packs several values into each byte, and treepack \
                 stores these types one value per byte (as ml_dtypes and JAX hold them); unpack it with its library \
                 and save the array",
                e.dtype
            ),
            _ => format!("tensor {name:?}: dtype {:?} is not supported", e.dtype),
        })?;
        if e.shape.len() > crate::manifest::MAX_NDIM {
            return Err(format!("tensor {name:?}: {} dimensions", e.shape.len()));
        }
        let (begin, end) = e.data_offsets;
        let want = shape_len(&e.shape).and_then(|n| n.checked_mul(dtype.itemsize()));
        if end < begin || want != Some(end - begin) {
            return Err(format!(
                "tensor {name:?}: offsets {begin}..{end} do not hold {:?} {} elements of shape {:?}",
                e.dtype,
                shape_len(&e.shape).map_or("too many".into(), |n| n.to_string()),
                e.shape
            ));
        }
        h.tensors.push(Tensor { name, dtype, shape: e.shape, begin, end });
    }
    h.tensors.sort_by_key(|t| (t.begin, t.end));
    let mut at = 0u64;
    for t in &h.tensors {
        if t.begin != at {
            return Err(format!(
                "tensor {:?} starts at {} where {} was expected (a gap or an overlap)",
                t.name, t.begin, at
            ));
        }
        at = t.end;
    }
    if data_start.checked_add(at) != Some(file_len) {
        return Err(format!(
            "the tensors hold {at} bytes but the file has {} after the header",
            file_len.saturating_sub(data_start)
        ));
    }
    Ok(h)
}

/// Write a header for tensors laid out in the order given: the bytes to put before the data
/// (length, JSON, space padding to a multiple of 8) and each tensor's offsets.
///
/// # Errors
/// A dtype safetensors does not have, or a size that overflows.
pub fn write_header(
    tensors: &[(String, DType, Vec<u64>)],
    metadata: Option<&BTreeMap<String, String>>,
) -> Result<(Vec<u8>, Vec<Span>), String> {
    let mut obj = serde_json::Map::new();
    if let Some(m) = metadata {
        obj.insert("__metadata__".into(), serde_json::json!(m));
    }
    let mut offsets = Vec::with_capacity(tensors.len());
    let mut at = 0u64;
    for (name, dtype, shape) in tensors {
        let d = dtype_name(dtype).ok_or_else(|| format!("`{name}`: safetensors has no {} dtype", dtype.display()))?;
        let n = shape_len(shape)
            .and_then(|n| n.checked_mul(dtype.itemsize()))
            .ok_or_else(|| format!("`{name}`: too large"))?;
        let end = at.checked_add(n).ok_or_else(|| format!("`{name}`: too large"))?;
        obj.insert(name.clone(), serde_json::json!({"dtype": d, "shape": shape, "data_offsets": [at, end]}));
        offsets.push((at, end));
        at = end;
    }
    let mut json = serde_json::to_vec(&obj).map_err(|e| e.to_string())?;
    while (8 + json.len()) % 8 != 0 {
        json.push(b' ');
    }
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&json);
    Ok((out, offsets))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_hostile_ones_are_refused() {
        let t = vec![("a".to_string(), DType::F32, vec![2, 3]), ("b".to_string(), DType::BF16, vec![4])];
        let md: BTreeMap<String, String> = [("format".to_string(), "pt".to_string())].into();
        let (head, offs) = write_header(&t, Some(&md)).unwrap();
        assert_eq!(head.len() % 8, 0);
        assert_eq!(offs, vec![(0, 24), (24, 32)]);
        let n = header_len(&head, head.len() as u64 + 32).unwrap();
        let h = parse_header(&head[8..8 + n as usize], head.len() as u64 + 32).unwrap();
        assert_eq!(h.tensors.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(h.metadata, Some(md));
        for (bad, why) in [
            (r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,9]}}"#, "offsets"),
            (r#"{"a":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}}"#, "offsets"),
            (r#"{"a":{"dtype":"C64","shape":[1],"data_offsets":[0,8]}}"#, "not supported"),
            (r#"{"a":{"dtype":"F4","shape":[8],"data_offsets":[0,4]}}"#, "one value per byte"),
            (r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}"#, "gap"),
            (r#"{"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}}"#, "the file has"),
            (r#"{"__metadata__":{"x":1}}"#, "strings"),
            ("[]", "JSON object"),
        ] {
            let e = parse_header(bad.as_bytes(), 8 + bad.len() as u64 + 4).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
        assert!(header_len(&u64::MAX.to_le_bytes(), 100).unwrap_err().contains("accepted"));
        assert!(header_len(&50u64.to_le_bytes(), 20).unwrap_err().contains("only 20"));
        assert!(header_len(b"abc", 3).is_err());
    }

    /// `F8_E8M0` is `float8_e8m0fnu` both ways; treepack's sub-byte types have no safetensors
    /// name (safetensors' `F4`/`F6_*` pack values), nor do the other 1.5 float8 types.
    #[test]
    fn float8_e8m0_maps_and_packed_types_do_not() {
        assert_eq!(dtype_name(&DType::F8E8M0FNU), Some("F8_E8M0"));
        assert_eq!(dtype_of("F8_E8M0"), Some(DType::F8E8M0FNU));
        for d in DType::all_simple().filter(|d| d.since_minor() == 5 && *d != DType::F8E8M0FNU) {
            assert_eq!(dtype_name(&d), None, "{d:?}");
        }
        let t = vec![("s".to_string(), DType::F8E8M0FNU, vec![3])];
        let (head, _) = write_header(&t, None).unwrap();
        let h = parse_header(&head[8..], head.len() as u64 + 3).unwrap();
        assert_eq!(h.tensors[0].dtype, DType::F8E8M0FNU);
    }
}
