//! Array element types. Stored bytes are always little-endian, C order, packed (no padding).
//!
//! A dtype is written in the manifest as a name (`"float32"`, `"bfloat16"`, `"bytes:16"`,
//! `"unicode:8"`) or, for structured dtypes, as `{"struct": [{"name": .., "dtype": .., "shape": [..]}]}`.

use crate::error::{Error, Result};
use serde_json::{json, Value};

/// Deepest nesting accepted for structured dtypes (hostile-input guard).
pub const MAX_DTYPE_DEPTH: usize = 16;
/// Most fields accepted in one structured dtype.
pub const MAX_STRUCT_FIELDS: usize = 4096;

/// One named field of a structured (record) dtype.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Field {
    /// Field name, unique within its struct.
    pub name: String,
    /// Element type of the field (may itself be a struct).
    pub dtype: DType,
    /// Sub-array shape of the field (empty for a scalar field).
    pub shape: Vec<u64>,
}

/// The element type of an array.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DType {
    /// Boolean, one byte holding 0 or 1 (`bool`).
    Bool,
    /// Signed 8-bit integer (`int8`).
    I8,
    /// Signed 16-bit integer, two's complement LE (`int16`).
    I16,
    /// Signed 32-bit integer, two's complement LE (`int32`).
    I32,
    /// Signed 64-bit integer, two's complement LE (`int64`).
    I64,
    /// Unsigned 8-bit integer (`uint8`).
    U8,
    /// Unsigned 16-bit integer, LE (`uint16`).
    U16,
    /// Unsigned 32-bit integer, LE (`uint32`).
    U32,
    /// Unsigned 64-bit integer, LE (`uint64`).
    U64,
    /// IEEE 754 half precision (binary16), LE (`float16`).
    F16,
    /// bfloat16: the top 16 bits of a binary32, LE (`bfloat16`).
    BF16,
    /// IEEE 754 single precision (binary32), LE (`float32`).
    F32,
    /// IEEE 754 double precision (binary64), LE (`float64`).
    F64,
    /// Complex of two `float32`, real then imaginary (`complex64`).
    C64,
    /// Complex of two `float64`, real then imaginary (`complex128`).
    C128,
    /// 8-bit float, 4 exponent and 3 mantissa bits, finite only (`float8_e4m3fn`, as in ml_dtypes).
    F8E4M3FN,
    /// 8-bit float, 5 exponent and 2 mantissa bits, with infinities (`float8_e5m2`, as in ml_dtypes).
    F8E5M2,
    /// 8-bit float, 4 exponent and 3 mantissa bits, finite, no negative zero (`float8_e4m3fnuz`, as in ml_dtypes).
    F8E4M3FNUZ,
    /// 8-bit float, 5 exponent and 2 mantissa bits, finite, no negative zero (`float8_e5m2fnuz`, as in ml_dtypes).
    F8E5M2FNUZ,
    /// 8-bit float, 4 exponent and 3 mantissa bits, exponent bias 11, finite, no negative zero
    /// (`float8_e4m3b11fnuz`, as in ml_dtypes).
    F8E4M3B11FNUZ,
    /// 8-bit float, 3 exponent and 4 mantissa bits, bias 3, IEEE-like: infinities and NaNs
    /// (`float8_e3m4`, as in ml_dtypes; format 1.5).
    F8E3M4,
    /// 8-bit float, 4 exponent and 3 mantissa bits, bias 7, IEEE-like: infinities and NaNs
    /// (`float8_e4m3`, as in ml_dtypes; format 1.5).
    F8E4M3,
    /// 8-bit unsigned exponent-only float: byte `e` is 2^(e-127), 0xFF is NaN; no zero, no sign
    /// (`float8_e8m0fnu`, the MX scale type, as in ml_dtypes; format 1.5).
    F8E8M0FNU,
    /// 6-bit float, 2 exponent and 3 mantissa bits, bias 1, finite only, in the low 6 bits of a
    /// byte (`float6_e2m3fn`, as in ml_dtypes; format 1.5).
    F6E2M3FN,
    /// 6-bit float, 3 exponent and 2 mantissa bits, bias 3, finite only, in the low 6 bits of a
    /// byte (`float6_e3m2fn`, as in ml_dtypes; format 1.5).
    F6E3M2FN,
    /// 4-bit float, 2 exponent bits and 1 mantissa bit, bias 1, finite only, in the low 4 bits
    /// of a byte (`float4_e2m1fn`, as in ml_dtypes; format 1.5).
    F4E2M1FN,
    /// Signed 4-bit integer: its two's complement bits in the low 4 bits of a byte, the high bits
    /// zero (`int4`, as in ml_dtypes; format 1.5).
    I4,
    /// Unsigned 4-bit integer in the low 4 bits of a byte, the high bits zero (`uint4`; format 1.5).
    U4,
    /// Signed 2-bit integer: its two's complement bits in the low 2 bits of a byte, the high bits
    /// zero (`int2`; format 1.5).
    I2,
    /// Unsigned 2-bit integer in the low 2 bits of a byte, the high bits zero (`uint2`; format 1.5).
    U2,
    /// Signed 1-bit integer (values -1 and 0): bit 0 of a byte, the high bits zero (`int1`;
    /// format 1.5).
    I1,
    /// Unsigned 1-bit integer (values 0 and 1): bit 0 of a byte, the high bits zero (`uint1`;
    /// format 1.5).
    U1,
    /// Fixed-width byte strings of `n` bytes (numpy `S<n>`).
    Bytes(u64),
    /// Fixed-width unicode of `n` code points, UTF-32LE (numpy `<U<n>`).
    Unicode(u64),
    /// Packed structured dtype (numpy record dtype without padding).
    Struct(Vec<Field>),
}

const SIMPLE: &[(&str, DType)] = &[
    ("bool", DType::Bool),
    ("int8", DType::I8),
    ("int16", DType::I16),
    ("int32", DType::I32),
    ("int64", DType::I64),
    ("uint8", DType::U8),
    ("uint16", DType::U16),
    ("uint32", DType::U32),
    ("uint64", DType::U64),
    ("float16", DType::F16),
    ("bfloat16", DType::BF16),
    ("float32", DType::F32),
    ("float64", DType::F64),
    ("complex64", DType::C64),
    ("complex128", DType::C128),
    ("float8_e4m3fn", DType::F8E4M3FN),
    ("float8_e5m2", DType::F8E5M2),
    ("float8_e4m3fnuz", DType::F8E4M3FNUZ),
    ("float8_e5m2fnuz", DType::F8E5M2FNUZ),
    ("float8_e4m3b11fnuz", DType::F8E4M3B11FNUZ),
    // Format 1.5: the rest of ml_dtypes' (and JAX's) types, one element per byte.
    ("float8_e3m4", DType::F8E3M4),
    ("float8_e4m3", DType::F8E4M3),
    ("float8_e8m0fnu", DType::F8E8M0FNU),
    ("float6_e2m3fn", DType::F6E2M3FN),
    ("float6_e3m2fn", DType::F6E3M2FN),
    ("float4_e2m1fn", DType::F4E2M1FN),
    ("int4", DType::I4),
    ("uint4", DType::U4),
    ("int2", DType::I2),
    ("uint2", DType::U2),
    ("int1", DType::I1),
    ("uint1", DType::U1),
];

impl DType {
    /// Every non-parametric dtype, in a stable order (used by tests and docs).
    pub fn all_simple() -> impl Iterator<Item = DType> {
        SIMPLE.iter().map(|(_, d)| d.clone())
    }

    /// Bytes per element in canonical (packed) storage.
    pub fn itemsize(&self) -> u64 {
        match self {
            DType::Bool | DType::I8 | DType::U8 => 1,
            DType::F8E4M3FN | DType::F8E5M2 | DType::F8E4M3FNUZ | DType::F8E5M2FNUZ | DType::F8E4M3B11FNUZ => 1,
            // One element per byte, as ml_dtypes holds them (docs/format.md, "Sub-byte types").
            DType::F8E3M4 | DType::F8E4M3 | DType::F8E8M0FNU | DType::F6E2M3FN | DType::F6E3M2FN => 1,
            DType::F4E2M1FN | DType::I4 | DType::U4 | DType::I2 | DType::U2 | DType::I1 | DType::U1 => 1,
            DType::I16 | DType::U16 | DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::U32 | DType::F32 => 4,
            DType::I64 | DType::U64 | DType::F64 | DType::C64 => 8,
            DType::C128 => 16,
            DType::Bytes(n) => *n,
            DType::Unicode(n) => n.saturating_mul(4),
            DType::Struct(fields) => fields
                .iter()
                .map(|f| f.dtype.itemsize().saturating_mul(f.shape.iter().product::<u64>()))
                .fold(0u64, |a, b| a.saturating_add(b)),
        }
    }

    /// Size of one scalar unit that must be byte-swapped for endianness (1 = no swapping).
    pub fn swap_unit(&self) -> u64 {
        match self {
            DType::C64 => 4,
            DType::C128 => 8,
            DType::Unicode(_) => 4,
            DType::Bytes(_) | DType::Struct(_) => 1,
            d => d.itemsize(),
        }
    }

    /// The dtype of a plain numeric numpy array from numpy's kind character and item size
    /// (`b'f'`, 4 -> `F32`); `None` for anything else.
    pub fn from_numpy_kind(kind: u8, itemsize: usize) -> Option<DType> {
        Some(match (kind, itemsize) {
            (b'b', 1) => DType::Bool,
            (b'i', 1) => DType::I8,
            (b'i', 2) => DType::I16,
            (b'i', 4) => DType::I32,
            (b'i', 8) => DType::I64,
            (b'u', 1) => DType::U8,
            (b'u', 2) => DType::U16,
            (b'u', 4) => DType::U32,
            (b'u', 8) => DType::U64,
            (b'f', 2) => DType::F16,
            (b'f', 4) => DType::F32,
            (b'f', 8) => DType::F64,
            (b'c', 8) => DType::C64,
            (b'c', 16) => DType::C128,
            _ => return None,
        })
    }

    /// Whether numpy knows this dtype only through the `ml_dtypes` package (bfloat16, float8,
    /// float6, float4, int4, int2, int1 and their unsigned kin), whose dtype names are
    /// treepack's names.
    pub fn is_ml_dtypes(&self) -> bool {
        matches!(self, DType::BF16) || self.minifloat().is_some() || self.narrow_int().is_some()
    }

    /// The first format version (minor of major 1) that has this dtype: 5 for the dtypes of
    /// format 1.5 (or a struct with such a field), 0 for the others. A writer stamps a manifest
    /// with at least the largest of its arrays' (docs/format.md, "Dtypes").
    pub fn since_minor(&self) -> u16 {
        match self {
            DType::F8E3M4
            | DType::F8E4M3
            | DType::F8E8M0FNU
            | DType::F6E2M3FN
            | DType::F6E3M2FN
            | DType::F4E2M1FN
            | DType::I4
            | DType::U4
            | DType::I2
            | DType::U2
            | DType::I1
            | DType::U1 => 5,
            DType::Struct(fields) => fields.iter().map(|f| f.dtype.since_minor()).max().unwrap_or(0),
            _ => 0,
        }
    }

    /// For a float of fewer than 16 bits (float8, float6, float4): its layout.
    pub fn minifloat(&self) -> Option<Minifloat> {
        use Special::*;
        // (bits, exponent bits, mantissa bits, bias, special values)
        let (bits, eb, mb, bias, special) = match self {
            DType::F8E4M3FN => (8, 4, 3, 7, NanAtAllOnes),
            DType::F8E5M2 => (8, 5, 2, 15, Ieee),
            DType::F8E4M3FNUZ => (8, 4, 3, 8, NanAtNegativeZero),
            DType::F8E5M2FNUZ => (8, 5, 2, 16, NanAtNegativeZero),
            DType::F8E4M3B11FNUZ => (8, 4, 3, 11, NanAtNegativeZero),
            DType::F8E3M4 => (8, 3, 4, 3, Ieee),
            DType::F8E4M3 => (8, 4, 3, 7, Ieee),
            DType::F8E8M0FNU => (8, 8, 0, 127, ExponentOnly),
            DType::F6E2M3FN => (6, 2, 3, 1, Finite),
            DType::F6E3M2FN => (6, 3, 2, 3, Finite),
            DType::F4E2M1FN => (4, 2, 1, 1, Finite),
            _ => return None,
        };
        Some(Minifloat { bits, exponent_bits: eb, mantissa_bits: mb, bias, special })
    }

    /// For an integer of fewer than 8 bits: (bits, signed).
    pub fn narrow_int(&self) -> Option<(u32, bool)> {
        Some(match self {
            DType::I4 => (4, true),
            DType::U4 => (4, false),
            DType::I2 => (2, true),
            DType::U2 => (2, false),
            DType::I1 => (1, true),
            DType::U1 => (1, false),
            _ => return None,
        })
    }

    /// Bits of a value of a type narrower than its byte (float6, float4, int4, int2, int1 and
    /// the unsigned ones); `None` for the others. Such an element is stored in the low bits of
    /// its byte with the high bits zero (docs/format.md, "Sub-byte types").
    pub fn sub_byte_bits(&self) -> Option<u32> {
        self.narrow_int().map(|(b, _)| b).or_else(|| self.minifloat().map(|f| f.bits).filter(|&b| b < 8))
    }

    /// True for dtypes whose values are numbers (min/max previews make sense).
    pub fn is_real_number(&self) -> bool {
        !matches!(self, DType::C64 | DType::C128 | DType::Bytes(_) | DType::Unicode(_) | DType::Struct(_))
    }

    /// The manifest name of a non-struct dtype (`None` for structs).
    pub fn name(&self) -> Option<String> {
        match self {
            DType::Bytes(n) => Some(format!("bytes:{n}")),
            DType::Unicode(n) => Some(format!("unicode:{n}")),
            DType::Struct(_) => None,
            d => SIMPLE.iter().find(|(_, x)| x == d).map(|(n, _)| n.to_string()),
        }
    }

    /// Parse a dtype from its manifest name (`float32`, `bytes:16`, ...).
    ///
    /// # Errors
    /// [`Error::BadDType`] when the name is unknown or a width is invalid.
    pub fn from_name(name: &str) -> Result<DType> {
        if let Some((_, d)) = SIMPLE.iter().find(|(n, _)| *n == name) {
            return Ok(d.clone());
        }
        let parse_width = |w: &str| -> Result<u64> {
            let n: u64 = w.parse().map_err(|_| bad(name, "width must be a positive integer"))?;
            if n == 0 || n > (1 << 31) {
                return Err(bad(name, "width must be between 1 and 2^31"));
            }
            Ok(n)
        };
        if let Some(w) = name.strip_prefix("bytes:") {
            return Ok(DType::Bytes(parse_width(w)?));
        }
        if let Some(w) = name.strip_prefix("unicode:") {
            return Ok(DType::Unicode(parse_width(w)?));
        }
        let newest = crate::manifest::VERSION_MINOR;
        Err(bad(
            name,
            &format!(
                "not a dtype name of treepack format 1.0-1.{newest} (docs/format.md, section Dtypes); a file written \
                 by a newer treepack may use dtypes this one does not know: upgrade treepack to read it"
            ),
        ))
    }

    /// JSON form used in the manifest.
    pub fn to_json(&self) -> Value {
        match self {
            DType::Struct(fields) => {
                let fs: Vec<Value> = fields
                    .iter()
                    .map(|f| {
                        let mut o = json!({"name": f.name, "dtype": f.dtype.to_json()});
                        if !f.shape.is_empty() {
                            o["shape"] = json!(f.shape);
                        }
                        o
                    })
                    .collect();
                json!({ "struct": fs })
            }
            d => Value::String(d.name().unwrap_or_default()),
        }
    }

    /// Parse the manifest JSON form, validating names, widths, nesting and sizes.
    ///
    /// # Errors
    /// [`Error::BadDType`] for anything malformed.
    pub fn from_json(v: &Value) -> Result<DType> {
        Self::from_json_depth(v, 0)
    }

    fn from_json_depth(v: &Value, depth: usize) -> Result<DType> {
        if depth > MAX_DTYPE_DEPTH {
            return Err(bad(&v.to_string(), "structured dtype nested too deeply"));
        }
        match v {
            Value::String(s) => DType::from_name(s),
            Value::Object(o) => {
                let fields = o
                    .get("struct")
                    .and_then(Value::as_array)
                    .ok_or_else(|| bad(&short(v), "object dtype must be {\"struct\": [fields]}"))?;
                if fields.is_empty() || fields.len() > MAX_STRUCT_FIELDS {
                    return Err(bad(&short(v), "a struct dtype needs 1 to 4096 fields"));
                }
                let mut out = Vec::with_capacity(fields.len());
                for f in fields {
                    let name = f
                        .get("name")
                        .and_then(Value::as_str)
                        .ok_or_else(|| bad(&short(v), "struct field without a string `name`"))?;
                    if out.iter().any(|x: &Field| x.name == name) {
                        return Err(bad(&short(v), &format!("duplicate struct field `{name}`")));
                    }
                    let dt = f.get("dtype").ok_or_else(|| bad(&short(v), "struct field without `dtype`"))?;
                    let dtype = DType::from_json_depth(dt, depth + 1)?;
                    let shape = match f.get("shape") {
                        None => vec![],
                        Some(Value::Array(a)) if a.len() <= 32 => a
                            .iter()
                            .map(|x| {
                                x.as_u64().ok_or_else(|| bad(&short(v), "field shape must hold non-negative integers"))
                            })
                            .collect::<Result<Vec<u64>>>()?,
                        Some(_) => return Err(bad(&short(v), "field shape must be an array of at most 32 integers")),
                    };
                    out.push(Field { name: name.to_string(), dtype, shape });
                }
                let d = DType::Struct(out);
                let size = d.itemsize();
                if size == 0 || size > (1 << 31) {
                    return Err(bad(&short(v), "struct itemsize must be between 1 and 2^31 bytes"));
                }
                Ok(d)
            }
            _ => Err(bad(&short(v), "a dtype is a name string or a {\"struct\": ...} object")),
        }
    }

    /// Human-readable form (`float32`, `struct{x: float32, y: int64[3]}`).
    pub fn display(&self) -> String {
        match self {
            DType::Struct(fields) => {
                let parts: Vec<String> = fields
                    .iter()
                    .map(|f| {
                        if f.shape.is_empty() {
                            format!("{}: {}", f.name, f.dtype.display())
                        } else {
                            format!("{}: {}{:?}", f.name, f.dtype.display(), f.shape)
                        }
                    })
                    .collect();
                format!("struct{{{}}}", parts.join(", "))
            }
            d => d.name().unwrap_or_default(),
        }
    }

    /// Decode element `i` of canonical bytes into a JSON value (for previews and `treepack cat`).
    /// Returns `None` if out of range. Non-finite floats become strings ("nan", "inf", "-inf").
    pub fn element_json(&self, bytes: &[u8], i: usize) -> Option<Value> {
        let size = usize::try_from(self.itemsize()).ok()?;
        let start = i.checked_mul(size)?;
        let b = bytes.get(start..start.checked_add(size)?)?;
        Some(self.decode_json(b))
    }

    fn decode_json(&self, b: &[u8]) -> Value {
        macro_rules! le {
            ($t:ty) => {{
                let mut a = [0u8; std::mem::size_of::<$t>()];
                a.copy_from_slice(&b[..std::mem::size_of::<$t>()]);
                <$t>::from_le_bytes(a)
            }};
        }
        match self {
            DType::Bool => Value::Bool(b[0] != 0),
            DType::I8 => json!(b[0] as i8),
            DType::U8 => json!(b[0]),
            DType::I16 => json!(le!(i16)),
            DType::U16 => json!(le!(u16)),
            DType::I32 => json!(le!(i32)),
            DType::U32 => json!(le!(u32)),
            DType::I64 => json!(le!(i64)),
            DType::U64 => json!(le!(u64)),
            DType::F16 => float32_json(half::f16::from_bits(le!(u16)).to_f32()),
            DType::BF16 => float32_json(half::bf16::from_bits(le!(u16)).to_f32()),
            DType::F32 => float32_json(le!(f32)),
            DType::F64 => float_json(le!(f64)),
            DType::C64 => {
                let re = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                let im = f32::from_le_bytes([b[4], b[5], b[6], b[7]]);
                json!([float32_json(re), float32_json(im)])
            }
            DType::C128 => {
                let mut r = [0u8; 8];
                let mut m = [0u8; 8];
                r.copy_from_slice(&b[0..8]);
                m.copy_from_slice(&b[8..16]);
                json!([float_json(f64::from_le_bytes(r)), float_json(f64::from_le_bytes(m))])
            }
            // Sub-byte types: a byte that is not canonical (high bits set) has no value: null.
            DType::I4 | DType::U4 | DType::I2 | DType::U2 | DType::I1 | DType::U1 => {
                narrow_int_value(self, b[0]).map_or(Value::Null, |v| json!(v))
            }
            DType::F8E4M3FN
            | DType::F8E5M2
            | DType::F8E4M3FNUZ
            | DType::F8E5M2FNUZ
            | DType::F8E4M3B11FNUZ
            | DType::F8E3M4
            | DType::F8E4M3
            | DType::F8E8M0FNU
            | DType::F6E2M3FN
            | DType::F6E3M2FN
            | DType::F4E2M1FN => minifloat_to_f64(self, b[0]).map_or(Value::Null, float_json),
            DType::Bytes(_) => {
                let end = b.iter().rposition(|&c| c != 0).map_or(0, |p| p + 1);
                Value::String(String::from_utf8_lossy(&b[..end]).into_owned())
            }
            DType::Unicode(_) => {
                let mut s = String::new();
                for cp in b.chunks_exact(4) {
                    let c = u32::from_le_bytes([cp[0], cp[1], cp[2], cp[3]]);
                    if c == 0 {
                        break;
                    }
                    s.push(char::from_u32(c).unwrap_or('\u{FFFD}'));
                }
                Value::String(s)
            }
            DType::Struct(fields) => {
                let mut o = serde_json::Map::new();
                let mut off = 0usize;
                for f in fields {
                    let n: u64 = f.shape.iter().product();
                    let fsize = (f.dtype.itemsize() * n) as usize;
                    let part = &b[off..off + fsize];
                    let v = if f.shape.is_empty() {
                        f.dtype.decode_json(part)
                    } else {
                        let k = f.dtype.itemsize() as usize;
                        Value::Array(part.chunks_exact(k.max(1)).take(8).map(|e| f.dtype.decode_json(e)).collect())
                    };
                    o.insert(f.name.clone(), v);
                    off += fsize;
                }
                Value::Object(o)
            }
        }
    }

    /// Decode element `i` as an f64 for min/max (None for non-numeric dtypes or out of range).
    pub fn element_f64(&self, bytes: &[u8], i: usize) -> Option<f64> {
        if !self.is_real_number() {
            return None;
        }
        match self.element_json(bytes, i)? {
            Value::Bool(b) => Some(if b { 1.0 } else { 0.0 }),
            Value::Number(n) => n.as_f64(),
            _ => None, // non-finite: skipped for min/max
        }
    }
}

fn bad(dtype: &str, reason: &str) -> Error {
    Error::BadDType { dtype: dtype.to_string(), reason: reason.to_string() }
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 80 {
        let mut end = 80;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &s[..end])
    } else {
        s
    }
}

/// A float as JSON: finite values as numbers, others as "nan" / "inf" / "-inf".
pub fn float_json(x: f64) -> Value {
    if x.is_nan() {
        Value::String("nan".into())
    } else if x.is_infinite() {
        Value::String(if x > 0.0 { "inf" } else { "-inf" }.into())
    } else {
        serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number)
    }
}

/// A 32-bit float as JSON using its own shortest representation (0.3f32 prints as 0.3, not as
/// the widened 0.30000001192092896).
pub fn float32_json(x: f32) -> Value {
    if !x.is_finite() {
        return float_json(f64::from(x));
    }
    let mut b = ryu::Buffer::new();
    let short: f64 = b.format_finite(x).parse().unwrap_or(f64::from(x));
    float_json(short)
}

/// How a small float spends its top exponent (and its negative zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Special {
    /// IEEE 754-like: the all-ones exponent is infinity (mantissa zero) or NaN.
    Ieee,
    /// `fn`: only the all-ones exponent and mantissa is NaN (no infinities).
    NanAtAllOnes,
    /// `fnuz`: the negative zero bit pattern is the only NaN; no infinities, no -0.
    NanAtNegativeZero,
    /// No infinities, no NaN: every bit pattern is a finite number (float6, float4).
    Finite,
    /// No sign, no mantissa: `e` is 2^(e - bias), all ones is NaN (`float8_e8m0fnu`).
    ExponentOnly,
}

/// The layout of a float narrower than 16 bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Minifloat {
    /// Bits of a value (8, 6 or 4), in the low bits of its byte.
    pub bits: u32,
    /// Exponent bits.
    pub exponent_bits: u32,
    /// Mantissa bits.
    pub mantissa_bits: u32,
    /// Exponent bias.
    pub bias: i32,
    /// Infinities and NaNs.
    pub special: Special,
}

/// The value of a byte of a float type narrower than 16 bits (float8, float6, float4, as
/// ml_dtypes reads them); `None` for a byte whose high bits are not zero for a float6 or
/// float4 (not canonical: docs/format.md, "Sub-byte types") and for other dtypes.
pub fn minifloat_to_f64(d: &DType, byte: u8) -> Option<f64> {
    let f = d.minifloat()?;
    let bits = u32::from(byte);
    if f.bits < 8 && bits >> f.bits != 0 {
        return None;
    }
    let mantissa_mask = (1u32 << f.mantissa_bits) - 1;
    let exponent_mask = (1u32 << f.exponent_bits) - 1;
    let m = f64::from(bits & mantissa_mask);
    let e = (bits >> f.mantissa_bits) & exponent_mask;
    if f.special == Special::ExponentOnly {
        return Some(if e == exponent_mask { f64::NAN } else { 2f64.powi(e as i32 - f.bias) });
    }
    let negative = bits >> (f.bits - 1) & 1 == 1;
    let sign = if negative { -1.0 } else { 1.0 };
    match f.special {
        Special::NanAtNegativeZero if negative && e == 0 && m == 0.0 => return Some(f64::NAN),
        Special::Ieee if e == exponent_mask => {
            return Some(if m == 0.0 { sign * f64::INFINITY } else { f64::NAN });
        }
        Special::NanAtAllOnes if e == exponent_mask && bits & mantissa_mask == mantissa_mask => return Some(f64::NAN),
        _ => {}
    }
    let scale = f64::from(1u32 << f.mantissa_bits);
    Some(if e == 0 {
        sign * (m / scale) * 2f64.powi(1 - f.bias)
    } else {
        sign * (1.0 + m / scale) * 2f64.powi(e as i32 - f.bias)
    })
}

/// Decode an 8-bit float of one of the ml_dtypes formats (NaN for other dtypes).
pub fn f8_to_f64(d: &DType, bits: u8) -> f64 {
    minifloat_to_f64(d, bits).unwrap_or(f64::NAN)
}

/// The value of a byte of `int4`/`uint4`/`int2`/`uint2`/`int1`/`uint1`; `None` when its high
/// bits are not zero (not canonical) or for other dtypes.
pub fn narrow_int_value(d: &DType, byte: u8) -> Option<i64> {
    let (bits, signed) = d.narrow_int()?;
    if u32::from(byte) >> bits != 0 {
        return None;
    }
    let v = i64::from(byte);
    Some(if signed && v >> (bits - 1) == 1 { v - (1 << bits) } else { v })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in DType::all_simple().chain([DType::Bytes(7), DType::Unicode(3)]) {
            assert_eq!(DType::from_json(&d.to_json()).unwrap(), d);
        }
        let s = DType::Struct(vec![
            Field { name: "x".into(), dtype: DType::F32, shape: vec![] },
            Field { name: "v".into(), dtype: DType::I16, shape: vec![3] },
        ]);
        assert_eq!(s.itemsize(), 10);
        assert_eq!(DType::from_json(&s.to_json()).unwrap(), s);
    }

    #[test]
    fn rejects_bad_dtypes() {
        for v in [json!("float128"), json!("bytes:0"), json!("bytes:x"), json!(3), json!({"struct": []})] {
            assert!(matches!(DType::from_json(&v), Err(Error::BadDType { .. })), "{v}");
        }
        let dup = json!({"struct": [{"name": "a", "dtype": "int8"}, {"name": "a", "dtype": "int8"}]});
        assert!(DType::from_json(&dup).is_err());
        let mut deep = json!("int8");
        for _ in 0..40 {
            deep = json!({"struct": [{"name": "a", "dtype": deep}]});
        }
        assert!(DType::from_json(&deep).is_err());
    }

    #[test]
    fn float8_decoding() {
        assert_eq!(f8_to_f64(&DType::F8E4M3FN, 0x38), 1.0);
        assert!(f8_to_f64(&DType::F8E4M3FN, 0x7f).is_nan());
        assert_eq!(f8_to_f64(&DType::F8E4M3FN, 0x7e), 448.0);
        assert_eq!(f8_to_f64(&DType::F8E5M2, 0x3c), 1.0);
        assert_eq!(f8_to_f64(&DType::F8E5M2, 0x7c), f64::INFINITY);
        assert!(f8_to_f64(&DType::F8E4M3FNUZ, 0x80).is_nan());
    }

    /// A byte's value as f64 for the one-byte number types (None: not canonical).
    fn byte_value(d: &DType, b: u8) -> Option<f64> {
        minifloat_to_f64(d, b).or_else(|| narrow_int_value(d, b).map(|v| v as f64))
    }

    /// Every canonical byte of every one-byte ml_dtypes type decodes to the value ml_dtypes gives
    /// it, the sign of zero and NaN included (`crates/treepack/tests/data/ml_dtypes_values.txt`, written from
    /// ml_dtypes by python/tests/test_dtypes_1_5.py, which checks it stays so); a sub-byte
    /// type's other bytes (high bits set) have no value.
    #[test]
    fn small_types_decode_as_ml_dtypes_does() {
        let table = include_str!("../../treepack/tests/data/ml_dtypes_values.txt");
        let mut covered = vec![];
        for line in table.lines().filter(|l| !l.starts_with('#')) {
            let mut tokens = line.split(' ');
            let name = tokens.next().unwrap();
            let d = DType::from_name(name).unwrap();
            let want: Vec<f64> = tokens.map(|t| t.parse().unwrap()).collect();
            let bits = d.sub_byte_bits().unwrap_or(8);
            assert_eq!(want.len(), 1 << bits, "{name}: one value per canonical byte");
            for b in 0..=255u8 {
                let got = byte_value(&d, b);
                match want.get(b as usize) {
                    None => {
                        assert_eq!(got, None, "{name} {b:#04x}: not canonical");
                        assert_eq!(d.element_json(&[b], 0), Some(Value::Null), "{name} {b:#04x}");
                    }
                    Some(w) if w.is_nan() => assert!(got.is_some_and(f64::is_nan), "{name} {b:#04x}: {got:?}"),
                    Some(w) => assert_eq!(got.map(f64::to_bits), Some(w.to_bits()), "{name} {b:#04x}: {got:?} vs {w}"),
                }
            }
            covered.push(d);
        }
        let sub_byte_and_f8: Vec<DType> =
            DType::all_simple().filter(|d| d.is_ml_dtypes() && *d != DType::BF16).collect();
        assert_eq!(covered, sub_byte_and_f8, "the table covers every one-byte ml_dtypes type");
    }

    /// Every dtype name is in the spec's Dtypes table (docs/format.md section 5), as `name`.
    #[test]
    fn the_spec_lists_every_dtype() {
        let spec = include_str!("../../../docs/format.md");
        let table = &spec[spec.find("### Dtypes").unwrap()..spec.find("## 6. Key paths").unwrap()];
        for d in DType::all_simple() {
            let name = d.name().unwrap();
            assert!(table.contains(&format!("`{name}`")), "docs/format.md's Dtypes table lacks `{name}`");
        }
    }

    /// The dtypes of format 1.5: ml_dtypes' names, one byte per element, format 1.5 (a struct
    /// with such a field too), previews with integers for the integer types.
    #[test]
    fn format_1_5_dtypes() {
        let new: Vec<DType> = DType::all_simple().filter(|d| d.since_minor() == 5).collect();
        let names: Vec<String> = new.iter().filter_map(DType::name).collect();
        assert_eq!(
            names,
            [
                "float8_e3m4",
                "float8_e4m3",
                "float8_e8m0fnu",
                "float6_e2m3fn",
                "float6_e3m2fn",
                "float4_e2m1fn",
                "int4",
                "uint4",
                "int2",
                "uint2",
                "int1",
                "uint1"
            ]
        );
        for d in &new {
            assert_eq!((d.itemsize(), d.swap_unit()), (1, 1), "{d:?}");
            assert!(d.is_ml_dtypes() && d.is_real_number(), "{d:?}");
        }
        assert!(DType::all_simple().filter(|d| d.since_minor() != 5).all(|d| d.since_minor() == 0));
        let s = DType::Struct(vec![Field { name: "q".into(), dtype: DType::I4, shape: vec![2] }]);
        assert_eq!((s.since_minor(), s.itemsize()), (5, 2));
        assert_eq!(DType::I4.element_json(&[0x0f], 0), Some(json!(-1)));
        assert_eq!(DType::I4.element_json(&[0x08], 0), Some(json!(-8)));
        assert_eq!(DType::U4.element_json(&[0x0f], 0), Some(json!(15)));
        assert_eq!(DType::I1.element_json(&[0x01], 0), Some(json!(-1)));
        assert_eq!(DType::F8E8M0FNU.element_json(&[0x7f, 0xff], 1), Some(json!("nan")));
        assert_eq!(DType::F8E8M0FNU.element_json(&[0x7f], 0), Some(json!(1.0)));
        assert_eq!(DType::F8E4M3.element_json(&[0x78], 0), Some(json!("inf")));
        assert_eq!(DType::F8E3M4.element_json(&[0xf0], 0), Some(json!("-inf")));
        assert_eq!(DType::F4E2M1FN.element_json(&[0x0f], 0), Some(json!(-6.0)));
    }
}
