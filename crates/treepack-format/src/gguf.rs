//! The GGUF format (llama.cpp's and ggml's model files), with no I/O: a header parsed strictly
//! (files come from strangers), and what each tensor's bytes are.
//!
//! A GGUF file (versions 2 and 3, little-endian; ggml-org/ggml `docs/gguf.md`) is:
//!
//! ```text
//! "GGUF"  u32 version  u64 tensor_count  u64 kv_count
//! kv_count × { string key, u32 value_type, value }
//! tensor_count × { string name, u32 n_dims, n_dims × u64 dim, u32 ggml_type, u64 offset }
//! padding to general.alignment (default 32)
//! the data section: each tensor's bytes at its offset from here
//! ```
//!
//! where a string is a `u64` length and that many UTF-8 bytes, and a value is one of the types
//! 0–12 ([`ValueType`]); an array (type 9) is a `u32` element type, a `u64` count and the
//! elements, which may be arrays again. A tensor's dims are ggml's `ne`, fastest-varying first:
//! numpy's shape is them reversed ([`TensorInfo::shape`]). Its bytes are `ne / block_size ×
//! type_size` of its ggml type ([`GgmlType`]): plain element types have blocks of one element,
//! quantized ones (`Q4_0`, `Q8_0`, `Q4_K`, …) blocks of 32 to 256 elements along `ne[0]`.
//!
//! What [`parse_with`] checks, before allocating anything a count or length declares:
//!
//! - every count and length against the bytes actually there (a file declaring 2^60 key-value
//!   pairs, or a 2^40-byte string, fails at once with [`GgufError::Truncated`]), and against
//!   [`Limits`]: array nesting, metadata values in all, string and name lengths, tensors, dims;
//! - keys and tensor names non-empty UTF-8, neither repeated; string values UTF-8; booleans 0 or 1;
//! - `general.alignment`, when present, a `uint32` power of two (as ggml requires);
//! - each tensor's ggml type one this table knows ([`GgmlType::from_id`]; removed and unknown
//!   ids refused naming the id), `ne[0]` a whole number of its blocks, its element count within
//!   `i64`, its offset a multiple of the alignment, its bytes inside the file, and no two tensors'
//!   bytes overlapping. Gaps between tensors are allowed (ggml's own reader wants them packed in
//!   order with padding; nothing here needs that, and every file ggml reads passes these checks).
//!
//! Big-endian files (written for big-endian machines; their version reads as `0x03000000`) and
//! version 1 (2023's layout with 32-bit counts) are refused with [`GgufError::Version`] saying so.
//! Every failure is a [`GgufError`] naming what was wrong and where (key, tensor, byte offset);
//! nothing here panics on data.

use crate::dtype::DType;
use std::collections::HashSet;

/// The first four bytes of every GGUF file.
pub const MAGIC: &[u8; 4] = b"GGUF";

/// The alignment of the data section and of every tensor's offset when the file does not set
/// `general.alignment`.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// The metadata key that sets the alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";

/// The versions read: 2 and 3 have one layout (3 added big-endian files, which are refused).
pub const VERSIONS: [u32; 2] = [2, 3];

/// Whether `head` (a file's first bytes) starts like a GGUF file.
pub fn is_gguf(head: &[u8]) -> bool {
    head.starts_with(MAGIC)
}

/// Limits of one parse, beyond the bytes present. The defaults hold every real model file with
/// room to spare (a tokenizer's vocabulary is a few arrays of a few hundred thousand values).
#[derive(Debug, Clone)]
pub struct Limits {
    /// Arrays inside arrays: a metadata array of arrays is depth 2.
    pub max_array_depth: usize,
    /// Metadata values in all: each key's value, and each element of every array.
    pub max_values: u64,
    /// Bytes of one string value.
    pub max_string: u64,
    /// Bytes of one key or tensor name.
    pub max_name: u64,
    /// Key-value pairs.
    pub max_kv: u64,
    /// Tensors.
    pub max_tensors: u64,
    /// Dimensions of one tensor (ggml uses at most 4; treepack arrays hold up to 64).
    pub max_dims: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_array_depth: 64,
            max_values: 1 << 24,
            max_string: 1 << 30,
            max_name: 65_535,
            max_kv: 1 << 22,
            max_tensors: 1 << 22,
            max_dims: crate::manifest::MAX_NDIM as u32,
        }
    }
}

/// Why a GGUF file was refused. [`GgufError::kind`] names the kind in a word.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// The file does not start with `GGUF`.
    #[error("not a GGUF file: it starts with {found}, not the magic \"GGUF\"")]
    Magic {
        /// The first bytes, escaped.
        found: String,
    },
    /// A version this reader does not read (1, a big-endian file, or an unknown one).
    #[error("GGUF version {version}: {reason}")]
    Version {
        /// The version as read little-endian.
        version: u32,
        /// Why it is not read, and what to do.
        reason: String,
    },
    /// The file ends (or declares more than it holds) inside something.
    #[error("truncated: {what} at byte {offset} needs {needed} bytes, {left} left")]
    Truncated {
        /// What was being read, and for which key or tensor.
        what: String,
        /// Where it starts.
        offset: u64,
        /// Bytes it needs (at least).
        needed: u64,
        /// Bytes left in the header.
        left: u64,
    },
    /// A count, length or nesting past [`Limits`].
    #[error("{what} at byte {offset}: {found} exceeds the limit of {limit}")]
    Limit {
        /// What is limited, and for which key or tensor.
        what: String,
        /// Where it was read.
        offset: u64,
        /// The value found.
        found: u64,
        /// The limit.
        limit: u64,
    },
    /// A malformed value: not UTF-8, a boolean neither 0 nor 1, an unknown value type, a
    /// repeated key or tensor name, a bad alignment, a dimension out of range.
    #[error("{at}, at byte {offset}: {reason}")]
    Invalid {
        /// Where: a key (with array indexes), a tensor, the header.
        at: String,
        /// Byte offset in the file.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// A tensor's ggml type id that this reader does not know.
    #[error("tensor {tensor}, at byte {offset}: ggml type {id} {reason}")]
    UnknownType {
        /// The tensor's name, quoted.
        tensor: String,
        /// Where the type id is.
        offset: u64,
        /// The id.
        id: u32,
        /// What the id is (a type removed from ggml, or none known).
        reason: String,
    },
    /// A tensor whose bytes do not fit: blocks, alignment, extents, overlap.
    #[error("tensor {tensor}: {reason}")]
    Tensor {
        /// The tensor's name, quoted.
        tensor: String,
        /// What does not fit.
        reason: String,
    },
}

impl GgufError {
    /// A short, stable name of the kind: `magic`, `version`, `truncated`, `limit`, `invalid`,
    /// `unknown_type`, `tensor`.
    pub fn kind(&self) -> &'static str {
        match self {
            GgufError::Magic { .. } => "magic",
            GgufError::Version { .. } => "version",
            GgufError::Truncated { .. } => "truncated",
            GgufError::Limit { .. } => "limit",
            GgufError::Invalid { .. } => "invalid",
            GgufError::UnknownType { .. } => "unknown_type",
            GgufError::Tensor { .. } => "tensor",
        }
    }
}

/// A metadata value's type (`gguf_metadata_value_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValueType {
    /// 0: `uint8`.
    U8,
    /// 1: `int8`.
    I8,
    /// 2: `uint16`.
    U16,
    /// 3: `int16`.
    I16,
    /// 4: `uint32`.
    U32,
    /// 5: `int32`.
    I32,
    /// 6: `float32`.
    F32,
    /// 7: `bool`, one byte, 0 or 1.
    Bool,
    /// 8: `string`, a `u64` length and UTF-8 bytes.
    String,
    /// 9: `array`, a `u32` element type, a `u64` count, the elements.
    Array,
    /// 10: `uint64`.
    U64,
    /// 11: `int64`.
    I64,
    /// 12: `float64`.
    F64,
}

impl ValueType {
    /// The type of id `id` (0–12).
    pub fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Its id in files.
    pub fn id(self) -> u32 {
        use ValueType::*;
        match self {
            U8 => 0,
            I8 => 1,
            U16 => 2,
            I16 => 3,
            U32 => 4,
            I32 => 5,
            F32 => 6,
            Bool => 7,
            String => 8,
            Array => 9,
            U64 => 10,
            I64 => 11,
            F64 => 12,
        }
    }

    /// Its name in the GGUF specification (`uint8` … `float64`).
    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "uint8",
            I8 => "int8",
            U16 => "uint16",
            I16 => "int16",
            U32 => "uint32",
            I32 => "int32",
            F32 => "float32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "uint64",
            I64 => "int64",
            F64 => "float64",
        }
    }

    /// The fewest bytes one value of this type takes in a file (an empty string: its length;
    /// an empty array: its type and count): what a declared count is checked against.
    pub fn min_size(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `uint8`.
    U8(u8),
    /// `int8`.
    I8(i8),
    /// `uint16`.
    U16(u16),
    /// `int16`.
    I16(i16),
    /// `uint32`.
    U32(u32),
    /// `int32`.
    I32(i32),
    /// `float32`.
    F32(f32),
    /// `bool`.
    Bool(bool),
    /// `string`.
    String(String),
    /// `array`: its element type (kept for empty arrays) and elements.
    Array(ValueType, Vec<Value>),
    /// `uint64`.
    U64(u64),
    /// `int64`.
    I64(i64),
    /// `float64`.
    F64(f64),
}

impl Value {
    /// Its type.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(..) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// The value as JSON: integers of every width as JSON integers, exactly (a `uint64` above
    /// 2^53 too: `serde_json` and Python hold it exactly); floats as numbers (a `float32` as the
    /// `float64` of the same value), not finite ones as the strings `"nan"`, `"inf"`, `"-inf"`
    /// (as format.md's previews write them); booleans and strings as themselves; arrays as
    /// arrays. Nesting is at most the parse's array depth.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        fn float(x: f64) -> J {
            match serde_json::Number::from_f64(x) {
                Some(n) => J::Number(n),
                None if x.is_nan() => J::String("nan".into()),
                None if x > 0.0 => J::String("inf".into()),
                None => J::String("-inf".into()),
            }
        }
        match self {
            Value::U8(v) => J::from(*v),
            Value::I8(v) => J::from(*v),
            Value::U16(v) => J::from(*v),
            Value::I16(v) => J::from(*v),
            Value::U32(v) => J::from(*v),
            Value::I32(v) => J::from(*v),
            Value::U64(v) => J::from(*v),
            Value::I64(v) => J::from(*v),
            Value::F32(v) => float(f64::from(*v)),
            Value::F64(v) => float(*v),
            Value::Bool(v) => J::Bool(*v),
            Value::String(s) => J::String(s.clone()),
            Value::Array(_, items) => J::Array(items.iter().map(Value::to_json).collect()),
        }
    }
}

/// A ggml tensor type: its name, and how many bytes hold how many elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GgmlType {
    /// Its id in files (`enum ggml_type`).
    pub id: u32,
    /// Its name as gguf-py's `GGMLQuantizationType` spells it (`F32`, `Q4_K`, `IQ2_XXS`).
    pub name: &'static str,
    /// Elements per block (1 for plain element types).
    pub block_size: u64,
    /// Bytes per block.
    pub type_size: u64,
}

const fn t(id: u32, name: &'static str, block_size: u64, type_size: u64) -> GgmlType {
    GgmlType { id, name, block_size, type_size }
}

/// Every ggml type a GGUF file may hold, by id: block and type sizes from ggml's `type_traits`
/// (`src/ggml.c`) and block structs (`src/ggml-common.h`, `QK_K` = 256).
pub const GGML_TYPES: &[GgmlType] = &[
    t(0, "F32", 1, 4),
    t(1, "F16", 1, 2),
    t(2, "Q4_0", 32, 18),
    t(3, "Q4_1", 32, 20),
    t(6, "Q5_0", 32, 22),
    t(7, "Q5_1", 32, 24),
    t(8, "Q8_0", 32, 34),
    t(9, "Q8_1", 32, 36),
    t(10, "Q2_K", 256, 84),
    t(11, "Q3_K", 256, 110),
    t(12, "Q4_K", 256, 144),
    t(13, "Q5_K", 256, 176),
    t(14, "Q6_K", 256, 210),
    t(15, "Q8_K", 256, 292),
    t(16, "IQ2_XXS", 256, 66),
    t(17, "IQ2_XS", 256, 74),
    t(18, "IQ3_XXS", 256, 98),
    t(19, "IQ1_S", 256, 50),
    t(20, "IQ4_NL", 32, 18),
    t(21, "IQ3_S", 256, 110),
    t(22, "IQ2_S", 256, 82),
    t(23, "IQ4_XS", 256, 136),
    t(24, "I8", 1, 1),
    t(25, "I16", 1, 2),
    t(26, "I32", 1, 4),
    t(27, "I64", 1, 8),
    t(28, "F64", 1, 8),
    t(29, "IQ1_M", 256, 56),
    t(30, "BF16", 1, 2),
    t(34, "TQ1_0", 256, 54),
    t(35, "TQ2_0", 256, 66),
    t(39, "MXFP4", 32, 17),
    t(40, "NVFP4", 64, 36),
    t(41, "Q1_0", 128, 18),
    t(42, "Q2_0", 64, 18),
];

/// Ids ggml once had and removed, and their names (files holding them are refused saying so).
const REMOVED_TYPES: &[(u32, &str)] = &[
    (4, "Q4_2"),
    (5, "Q4_3"),
    (31, "Q4_0_4_4"),
    (32, "Q4_0_4_8"),
    (33, "Q4_0_8_8"),
    (36, "IQ4_NL_4_4"),
    (37, "IQ4_NL_4_8"),
    (38, "IQ4_NL_8_8"),
];

impl GgmlType {
    /// The type of id `id`, if this table knows it.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        GGML_TYPES.iter().find(|t| t.id == id).copied()
    }

    /// The type named `name` (as [`GgmlType::name`]).
    pub fn from_name(name: &str) -> Option<GgmlType> {
        GGML_TYPES.iter().find(|t| t.name == name).copied()
    }

    /// The treepack dtype of a plain element type (`F32`, `F16`, `BF16`, `F64`, `I8`, `I16`,
    /// `I32`, `I64`); `None` for quantized types, whose bytes are blocks.
    pub fn dtype(&self) -> Option<DType> {
        Some(match self.name {
            "F32" => DType::F32,
            "F16" => DType::F16,
            "BF16" => DType::BF16,
            "F64" => DType::F64,
            "I8" => DType::I8,
            "I16" => DType::I16,
            "I32" => DType::I32,
            "I64" => DType::I64,
            _ => return None,
        })
    }

    /// Whether its bytes are blocks of quantized values (no treepack dtype).
    pub fn is_quantized(&self) -> bool {
        self.dtype().is_none()
    }

    /// The bytes of `elements` elements whose rows (`ne[0]`) hold `row` elements: `None`
    /// when the rows are not whole blocks or the size overflows.
    pub fn nbytes(&self, row: u64, elements: u64) -> Option<u64> {
        if self.block_size == 0 || !row.is_multiple_of(self.block_size) {
            // (Every type of the table has blocks of at least one element.)
            return None;
        }
        (elements / self.block_size).checked_mul(self.type_size)
    }
}

/// One tensor's description.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// Its name, as stored.
    pub name: String,
    /// Its dimensions as stored: ggml's `ne`, fastest-varying first.
    pub dims: Vec<u64>,
    /// Its ggml type.
    pub ggml_type: GgmlType,
    /// Where its bytes start, from the start of the data section.
    pub offset: u64,
    /// How many bytes it has.
    pub nbytes: u64,
}

impl TensorInfo {
    /// Its shape in numpy's order (C order, slowest-varying first): the dims reversed.
    pub fn shape(&self) -> Vec<u64> {
        self.dims.iter().rev().copied().collect()
    }

    /// Its number of elements.
    pub fn elements(&self) -> u64 {
        // Checked when parsed: the product fits in an i64.
        self.dims.iter().product()
    }
}

/// A parsed header.
#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    /// The file's version (2 or 3).
    pub version: u32,
    /// The metadata, in file order.
    pub metadata: Vec<(String, Value)>,
    /// The tensors, in file order.
    pub tensors: Vec<TensorInfo>,
    /// The alignment of the data section and of the tensors' offsets.
    pub alignment: u64,
    /// Where the data section starts in the file: the end of the tensor infos, aligned.
    pub data_start: u64,
}

impl Header {
    /// The value of metadata key `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The metadata as one JSON object, key → [`Value::to_json`].
    pub fn metadata_json(&self) -> serde_json::Map<String, serde_json::Value> {
        self.metadata.iter().map(|(k, v)| (k.clone(), v.to_json())).collect()
    }

    /// Where tensor `t`'s bytes are in the file (checked when parsed to lie inside it).
    pub fn range(&self, t: &TensorInfo) -> std::ops::Range<u64> {
        let start = self.data_start + t.offset;
        start..start + t.nbytes
    }
}

/// Parse a whole file's bytes with the default [`Limits`].
///
/// # Errors
/// What is wrong and where ([`GgufError`]).
pub fn parse(file: &[u8]) -> Result<Header, GgufError> {
    parse_with(file, file.len() as u64, &Limits::default())
}

/// Parse the header of a file of `file_len` bytes whose first bytes are `head` (at least the
/// whole header: up to the data section; the whole file does). Tensors' extents are checked
/// against `file_len`.
///
/// # Errors
/// What is wrong and where ([`GgufError`]); a header longer than `head` is
/// [`GgufError::Truncated`].
pub fn parse_with(head: &[u8], file_len: u64, limits: &Limits) -> Result<Header, GgufError> {
    let head = &head[..head.len().min(usize::try_from(file_len).unwrap_or(usize::MAX))];
    let mut r = Reader { buf: head, pos: 0, limits, values: 0, key: String::new(), index: Vec::new() };
    // Magic and version.
    if !head.starts_with(MAGIC) {
        if MAGIC.starts_with(head) {
            return Err(r.truncated("the magic \"GGUF\"", 4));
        }
        let found: String = head.iter().take(4).flat_map(|b| std::ascii::escape_default(*b)).map(char::from).collect();
        return Err(GgufError::Magic { found: format!("\"{found}\"") });
    }
    r.pos = 4;
    let version = r.u32(|_| "the version".into())?;
    check_version(version)?;
    let tensor_count = r.u64(|_| "the tensor count".into())?;
    let kv_count = r.u64(|_| "the key-value count".into())?;
    r.limit("tensor count", 8, tensor_count, limits.max_tensors)?;
    r.limit("key-value count", 16, kv_count, limits.max_kv)?;
    // Each pair takes at least 14 bytes (a one-byte key, a type, a one-byte value), each tensor
    // info 25 (a one-byte name, no dims, a type, an offset): what is declared must fit.
    let need = kv_count.checked_mul(14).and_then(|a| a.checked_add(tensor_count.checked_mul(25)?));
    let left = r.left();
    if need.is_none_or(|n| n > left) {
        return Err(GgufError::Truncated {
            what: format!("{kv_count} key-value pairs and {tensor_count} tensor infos"),
            offset: r.pos as u64,
            needed: need.unwrap_or(u64::MAX),
            left,
        });
    }

    // Metadata.
    let mut metadata = Vec::with_capacity(kv_count as usize);
    let mut keys: HashSet<String> = HashSet::with_capacity(kv_count as usize);
    let mut alignment_at = 0;
    for i in 0..kv_count {
        r.key = format!("key #{i}");
        let at = r.pos as u64;
        let key = r.name(&format!("key #{i}"), "key")?;
        r.key = format!("key {}", shown(&key));
        if !keys.insert(key.clone()) {
            return Err(r.invalid(at, "this key appears twice".into()));
        }
        let ty_at = r.pos as u64;
        let id = r.u32(|_| format!("the value type of {}", shown(&key)))?;
        let ty = ValueType::from_id(id)
            .ok_or_else(|| r.invalid(ty_at, format!("value type {id} is not a GGUF value type (0 to 12)")))?;
        if key == ALIGNMENT_KEY {
            alignment_at = r.pos as u64;
        }
        let v = r.value(ty, 0)?;
        metadata.push((key, v));
    }
    r.key.clear();

    // The alignment.
    let alignment = match metadata.iter().find(|(k, _)| k == ALIGNMENT_KEY) {
        None => DEFAULT_ALIGNMENT,
        Some((_, Value::U32(a))) if a.is_power_of_two() => u64::from(*a),
        Some((_, v)) => {
            let what = match v {
                Value::U32(a) => format!("{a}, not a power of two"),
                other => format!("of type {}, not uint32", other.value_type().name()),
            };
            return Err(GgufError::Invalid {
                at: format!("key {}", shown(ALIGNMENT_KEY)),
                offset: alignment_at,
                reason: format!("the alignment is {what}"),
            });
        }
    };

    // Tensor infos.
    let mut tensors: Vec<TensorInfo> = Vec::with_capacity(tensor_count as usize);
    let mut names: HashSet<String> = HashSet::with_capacity(tensor_count as usize);
    for i in 0..tensor_count {
        let at = r.pos as u64;
        let name = r.name(&format!("tensor #{i}"), "tensor name")?;
        let tn = shown(&name);
        r.key = format!("tensor {tn}");
        if !names.insert(name.clone()) {
            return Err(r.invalid(at, "this tensor name appears twice".into()));
        }
        let nd_at = r.pos as u64;
        let n_dims = r.u32(|_| format!("the dimension count of tensor {tn}"))?;
        if n_dims > limits.max_dims {
            return Err(GgufError::Limit {
                what: format!("dimensions of tensor {tn}"),
                offset: nd_at,
                found: n_dims.into(),
                limit: limits.max_dims.into(),
            });
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        let mut elements: u64 = 1;
        for j in 0..n_dims {
            let d_at = r.pos as u64;
            let d = r.u64(|_| format!("dimension {j} of tensor {tn}"))?;
            elements = match elements.checked_mul(d) {
                Some(e) if e <= i64::MAX as u64 && d <= i64::MAX as u64 => e,
                _ => {
                    return Err(
                        r.invalid(d_at, format!("dimension {j} ({d}) makes more elements than ggml counts (2^63 - 1)"))
                    )
                }
            };
            dims.push(d);
        }
        let ty_at = r.pos as u64;
        let id = r.u32(|_| format!("the ggml type of tensor {tn}"))?;
        let ggml_type = GgmlType::from_id(id).ok_or_else(|| GgufError::UnknownType {
            tensor: tn.clone(),
            offset: ty_at,
            id,
            reason: match REMOVED_TYPES.iter().find(|(rid, _)| *rid == id) {
                Some((_, old)) => format!("({old}) was removed from ggml and is not read"),
                None => format!(
                    "is not a ggml type this reader knows (it knows {})",
                    GGML_TYPES.iter().map(|t| t.name).collect::<Vec<_>>().join(", ")
                ),
            },
        })?;
        let row = dims.first().copied().unwrap_or(1);
        if !row.is_multiple_of(ggml_type.block_size) {
            return Err(GgufError::Tensor {
                tensor: tn,
                reason: format!(
                    "its rows of {row} elements (dimension 0) are not whole {} blocks of {} elements",
                    ggml_type.name, ggml_type.block_size
                ),
            });
        }
        let nbytes = ggml_type.nbytes(row, elements).ok_or_else(|| GgufError::Tensor {
            tensor: tn.clone(),
            reason: format!("its {elements} {} elements take more than 2^64 bytes", ggml_type.name),
        })?;
        let offset = r.u64(|_| format!("the data offset of tensor {tn}"))?;
        if !offset.is_multiple_of(alignment) {
            return Err(GgufError::Tensor {
                tensor: tn,
                reason: format!("its data offset {offset} is not a multiple of the alignment {alignment}"),
            });
        }
        tensors.push(TensorInfo { name, dims, ggml_type, offset, nbytes });
    }
    let end = r.pos as u64;
    let data_start = end.checked_next_multiple_of(alignment).ok_or_else(|| GgufError::Invalid {
        at: "the header".into(),
        offset: end,
        reason: "too long".into(),
    })?;

    // Extents: inside the file, no two overlapping.
    for t in &tensors {
        let start = data_start.checked_add(t.offset);
        if start.and_then(|s| s.checked_add(t.nbytes)).is_none_or(|e| e > file_len) {
            return Err(GgufError::Tensor {
                tensor: shown(&t.name),
                reason: format!(
                    "its {} bytes at data offset {} (byte {} of the file) end past the end of the file ({file_len} bytes)",
                    t.nbytes,
                    t.offset,
                    start.map_or_else(|| "past 2^64".into(), |s| s.to_string()),
                ),
            });
        }
    }
    let mut order: Vec<&TensorInfo> = tensors.iter().filter(|t| t.nbytes > 0).collect();
    order.sort_by_key(|t| t.offset);
    for w in order.windows(2) {
        if w[1].offset < w[0].offset + w[0].nbytes {
            return Err(GgufError::Tensor {
                tensor: shown(&w[1].name),
                reason: format!(
                    "its bytes (data offset {}) overlap those of tensor {} (data offsets {} to {})",
                    w[1].offset,
                    shown(&w[0].name),
                    w[0].offset,
                    w[0].offset + w[0].nbytes
                ),
            });
        }
    }
    Ok(Header { version, metadata, tensors, alignment, data_start })
}

fn check_version(version: u32) -> Result<(), GgufError> {
    if VERSIONS.contains(&version) {
        return Ok(());
    }
    let reason = if version == 1 {
        "2023's first layout (32-bit counts and lengths) is not read; convert the model again with a current \
         llama.cpp (its convert scripts write version 3)"
            .to_string()
    } else if version & 0xFFFF == 0 && VERSIONS.contains(&version.swap_bytes()) {
        format!(
            "a big-endian GGUF file (its version reads {} big-endian): treepack reads little-endian GGUF only; \
             convert it with gguf-py's gguf_convert_endian.py",
            version.swap_bytes()
        )
    } else {
        format!("not a version this reader reads (it reads {VERSIONS:?})")
    };
    Err(GgufError::Version { version, reason })
}

/// A name for messages: quoted and escaped, its middle cut when very long.
fn shown(name: &str) -> String {
    const KEEP: usize = 100;
    if name.len() <= 2 * KEEP {
        return format!("{name:?}");
    }
    let head = (0..=KEEP).rev().find(|&i| name.is_char_boundary(i)).unwrap_or(0);
    let tail = (name.len() - KEEP..=name.len()).find(|&i| name.is_char_boundary(i)).unwrap_or(name.len());
    format!("{:?}…({} bytes)…{:?}", &name[..head], name.len(), &name[tail..])
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    limits: &'a Limits,
    /// Metadata values read so far.
    values: u64,
    /// What is being read, for messages: `key "name"` or `tensor "name"`.
    key: String,
    /// Indexes of the arrays being read, outermost first.
    index: Vec<u64>,
}

impl<'a> Reader<'a> {
    fn left(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    /// Where we are: the key or tensor, with array indexes.
    fn at(&self) -> String {
        let mut s = self.key.clone();
        let n = self.index.len();
        for (d, i) in self.index.iter().enumerate() {
            if n > 8 && d == 4 {
                s.push_str(&format!("…({} levels)…", n - 8));
            }
            if n <= 8 || !(4..n - 4).contains(&d) {
                s.push_str(&format!("[{i}]"));
            }
        }
        s
    }

    fn truncated(&self, what: impl Into<String>, needed: u64) -> GgufError {
        GgufError::Truncated { what: what.into(), offset: self.pos as u64, needed, left: self.left() }
    }

    fn invalid(&self, offset: u64, reason: String) -> GgufError {
        GgufError::Invalid { at: self.at(), offset, reason }
    }

    fn limit(&self, what: &str, offset: u64, found: u64, limit: u64) -> Result<(), GgufError> {
        if found > limit {
            return Err(GgufError::Limit { what: what.to_string(), offset, found, limit });
        }
        Ok(())
    }

    fn take(&mut self, n: u64, what: impl FnOnce(&Self) -> String) -> Result<&'a [u8], GgufError> {
        if n > self.left() {
            return Err(self.truncated(what(self), n));
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: impl FnOnce(&Self) -> String) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: impl FnOnce(&Self) -> String) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: impl FnOnce(&Self) -> String) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A string of at most `max` bytes, UTF-8; `what` names it in messages.
    fn string(&mut self, what: &dyn Fn(&Self) -> String, max: u64, limit_what: &str) -> Result<String, GgufError> {
        let at = self.pos as u64;
        let len = self.u64(|r| format!("the length of {}", what(r)))?;
        if len > max {
            return Err(GgufError::Limit {
                what: format!("{limit_what} length of {}", what(self)),
                offset: at,
                found: len,
                limit: max,
            });
        }
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_string()),
            Err(e) => Err(GgufError::Invalid {
                at: what(self),
                offset: at + 8 + e.valid_up_to() as u64,
                reason: format!("not UTF-8 (a GGUF string is UTF-8): bad byte at {} of its {len}", e.valid_up_to()),
            }),
        }
    }

    /// A key or tensor name: non-empty, at most `max_name` bytes, UTF-8.
    fn name(&mut self, what: &str, kind: &str) -> Result<String, GgufError> {
        let at = self.pos as u64;
        let s = self.string(&|_| what.to_string(), self.limits.max_name, kind)?;
        if s.is_empty() {
            return Err(GgufError::Invalid { at: what.to_string(), offset: at, reason: format!("an empty {kind}") });
        }
        Ok(s)
    }

    fn count_values(&mut self, n: u64, offset: u64) -> Result<(), GgufError> {
        self.values = self.values.saturating_add(n);
        if self.values > self.limits.max_values {
            return Err(GgufError::Limit {
                what: format!("metadata values in all (at {})", self.at()),
                offset,
                found: self.values,
                limit: self.limits.max_values,
            });
        }
        Ok(())
    }

    /// One value of type `ty`, inside `depth` arrays.
    fn value(&mut self, ty: ValueType, depth: usize) -> Result<Value, GgufError> {
        if depth == 0 {
            self.count_values(1, self.pos as u64)?;
        }
        let what = |r: &Self| format!("a {} value of {}", ty.name(), r.at());
        let at = self.pos as u64;
        Ok(match ty {
            ValueType::U8 => Value::U8(u8::from_le_bytes(self.array(what)?)),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.array(what)?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.array(what)?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.array(what)?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            ValueType::Bool => match self.array::<1>(what)? {
                [0] => Value::Bool(false),
                [1] => Value::Bool(true),
                [b] => return Err(self.invalid(at, format!("a bool of byte {b}, neither 0 nor 1"))),
            },
            ValueType::String => Value::String(self.string(&Self::at, self.limits.max_string, "string")?),
            ValueType::Array => {
                let id = self.u32(|r| format!("the element type of the array {}", r.at()))?;
                let et = ValueType::from_id(id).ok_or_else(|| {
                    self.invalid(at, format!("an array of value type {id}, not a GGUF value type (0 to 12)"))
                })?;
                let n_at = self.pos as u64;
                let n = self.u64(|r| format!("the length of the array {}", r.at()))?;
                if depth + 1 > self.limits.max_array_depth {
                    return Err(GgufError::Limit {
                        what: format!("array nesting (at {})", self.at()),
                        offset: at,
                        found: depth as u64 + 1,
                        limit: self.limits.max_array_depth as u64,
                    });
                }
                let need = n.checked_mul(et.min_size());
                if need.is_none_or(|b| b > self.left()) {
                    return Err(GgufError::Truncated {
                        what: format!("an array of {n} {} values of {}", et.name(), self.at()),
                        offset: self.pos as u64,
                        needed: need.unwrap_or(u64::MAX),
                        left: self.left(),
                    });
                }
                self.count_values(n, n_at)?;
                // Both checks above bound n: by the bytes left, and by the values allowed.
                let mut items = Vec::with_capacity(n as usize);
                for i in 0..n {
                    self.index.push(i);
                    let v = self.value(et, depth + 1)?;
                    self.index.pop();
                    items.push(v);
                }
                Value::Array(et, items)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GGUF file written byte by byte.
    #[derive(Default)]
    struct W {
        b: Vec<u8>,
    }

    impl W {
        fn new(version: u32, tensors: u64, kvs: u64) -> W {
            let mut w = W::default();
            w.b.extend_from_slice(b"GGUF");
            w.u32(version).u64(tensors).u64(kvs);
            w
        }
        fn u32(&mut self, v: u32) -> &mut Self {
            self.b.extend_from_slice(&v.to_le_bytes());
            self
        }
        fn u64(&mut self, v: u64) -> &mut Self {
            self.b.extend_from_slice(&v.to_le_bytes());
            self
        }
        fn bytes(&mut self, v: &[u8]) -> &mut Self {
            self.b.extend_from_slice(v);
            self
        }
        fn str(&mut self, s: &str) -> &mut Self {
            self.u64(s.len() as u64).bytes(s.as_bytes())
        }
        fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> &mut Self {
            self.str(name).u32(dims.len() as u32);
            for d in dims {
                self.u64(*d);
            }
            self.u32(ty).u64(offset)
        }
        fn pad(&mut self, a: usize) -> &mut Self {
            while !self.b.len().is_multiple_of(a) {
                self.b.push(0);
            }
            self
        }
    }

    fn small() -> Vec<u8> {
        let mut w = W::new(3, 2, 4);
        w.str("general.architecture").u32(8).str("llama");
        w.str("a.u64").u32(10).u64(u64::MAX);
        w.str("a.f32").u32(6).bytes(&f32::NAN.to_le_bytes());
        w.str("a.nested").u32(9).u32(9).u64(2);
        w.u32(5).u64(2).bytes(&1i32.to_le_bytes()).bytes(&(-2i32).to_le_bytes());
        w.u32(7).u64(1).bytes(&[1]);
        w.tensor("w", &[3, 2], 0, 0);
        w.tensor("q", &[64], 8, 32);
        w.pad(32);
        w.bytes(&[0u8; 24]).pad(32).bytes(&[7u8; 68]);
        w.b
    }

    #[test]
    fn a_small_file_parses() {
        let f = small();
        let h = parse(&f).unwrap();
        assert_eq!(h.version, 3);
        assert_eq!(h.alignment, 32);
        assert_eq!(h.get("general.architecture"), Some(&Value::String("llama".into())));
        let j = serde_json::Value::Object(h.metadata_json());
        assert_eq!(j["a.u64"], serde_json::json!(u64::MAX));
        assert_eq!(j["a.f32"], "nan");
        assert_eq!(j["a.nested"], serde_json::json!([[1, -2], [true]]));
        assert_eq!(h.tensors[0].shape(), vec![2, 3]);
        assert_eq!(h.tensors[0].nbytes, 24);
        assert_eq!(h.tensors[1].ggml_type.name, "Q8_0");
        assert_eq!(h.tensors[1].nbytes, 68);
        assert_eq!(h.range(&h.tensors[1]), h.data_start + 32..f.len() as u64);
    }

    #[test]
    fn every_truncation_is_an_error() {
        let f = small();
        for n in 0..f.len() {
            assert!(parse(&f[..n]).is_err(), "truncated at {n}");
        }
    }

    #[test]
    fn the_type_table_matches_ggml() {
        // Spot checks against gguf-py's GGML_QUANT_SIZES.
        for (name, bs, ts) in [
            ("Q4_0", 32, 18),
            ("Q8_0", 32, 34),
            ("Q4_K", 256, 144),
            ("Q6_K", 256, 210),
            ("IQ4_XS", 256, 136),
            ("TQ1_0", 256, 54),
            ("MXFP4", 32, 17),
            ("BF16", 1, 2),
        ] {
            let t = GgmlType::from_name(name).unwrap();
            assert_eq!((t.block_size, t.type_size), (bs, ts), "{name}");
        }
        let ids: HashSet<u32> = GGML_TYPES.iter().map(|t| t.id).collect();
        assert_eq!(ids.len(), GGML_TYPES.len());
        assert!(REMOVED_TYPES.iter().all(|(id, _)| !ids.contains(id)));
    }

    fn err(f: &[u8]) -> GgufError {
        parse(f).unwrap_err()
    }

    #[test]
    fn hostile_headers_are_refused_with_what_and_where() {
        // Counts far beyond the bytes.
        let e = err(&W::new(3, 0, 1 << 60).b);
        assert_eq!(e.kind(), "limit", "{e}");
        let e = err(&W::new(3, 0, 1000).b);
        assert_eq!(e.kind(), "truncated", "{e}");
        assert!(e.to_string().contains("1000 key-value pairs"), "{e}");
        // A 2^40-byte string.
        let mut w = W::new(3, 0, 1);
        w.str("k").u32(8).u64(1 << 40).bytes(b"abc");
        let e = err(&w.b);
        assert_eq!(e.kind(), "limit", "{e}");
        let mut w = W::new(3, 0, 1);
        w.str("k").u32(8).u64(1 << 20).bytes(b"abc");
        let e = err(&w.b);
        assert!(matches!(e, GgufError::Truncated { needed: 1048576, left: 3, .. }), "{e}");
        assert!(e.to_string().contains("key \"k\""), "{e}");
        // An array declaring 2^61 u64s.
        let mut w = W::new(3, 0, 1);
        w.str("k").u32(9).u32(10).u64(1 << 61);
        assert_eq!(err(&w.b).kind(), "truncated");
        // Arrays nested past the limit.
        let mut w = W::new(3, 0, 1);
        w.str("deep").u32(9);
        for _ in 0..100 {
            w.u32(9).u64(1);
        }
        let e = err(&w.b);
        assert_eq!(e.kind(), "limit", "{e}");
        assert!(e.to_string().contains("array nesting"), "{e}");
        // An unknown value type, a bad bool, bad UTF-8, a duplicate key, an empty key.
        let mut w = W::new(3, 0, 1);
        w.str("k").u32(13).u32(0);
        assert!(err(&w.b).to_string().contains("value type 13"));
        let mut w = W::new(3, 0, 1);
        w.str("k").u32(7).bytes(&[2]);
        assert!(err(&w.b).to_string().contains("neither 0 nor 1"));
        let mut w = W::new(3, 0, 1);
        w.str("k").u32(9).u32(8).u64(2).str("ok").u64(1).bytes(&[0xff]);
        let e = err(&w.b);
        assert!(e.to_string().contains("key \"k\"[1]") && e.to_string().contains("UTF-8"), "{e}");
        let mut w = W::new(3, 0, 2);
        w.str("k").u32(0).bytes(&[1]).str("k").u32(0).bytes(&[1]);
        assert!(err(&w.b).to_string().contains("twice"));
        let mut w = W::new(3, 0, 1);
        w.str("").u32(0).bytes(&[1, 0, 0, 0]);
        assert!(err(&w.b).to_string().contains("empty key"));
        // Versions.
        assert!(err(&W::new(1, 0, 0).b).to_string().contains("version 1"));
        assert!(err(&W::new(3u32.swap_bytes(), 0, 0).b).to_string().contains("big-endian"));
        assert_eq!(err(&W::new(4, 0, 0).b).kind(), "version");
        assert_eq!(err(b"GGML\x03\0\0\0").kind(), "magic");
        // Alignment.
        let mut w = W::new(3, 0, 1);
        w.str(ALIGNMENT_KEY).u32(4).u32(24);
        assert!(err(&w.b).to_string().contains("not a power of two"));
        let mut w = W::new(3, 0, 1);
        w.str(ALIGNMENT_KEY).u32(10).u64(32);
        assert!(err(&w.b).to_string().contains("not uint32"));
    }

    #[test]
    fn hostile_tensors_are_refused() {
        let one = |name: &str, dims: &[u64], ty: u32, offset: u64, data: usize| {
            let mut w = W::new(3, 1, 0);
            w.tensor(name, dims, ty, offset).pad(32).bytes(&vec![0u8; data]);
            parse(&w.b)
        };
        assert!(one("t", &[4], 0, 0, 16).is_ok());
        let e = one("t", &[4], 99, 0, 16).unwrap_err();
        assert!(matches!(e, GgufError::UnknownType { id: 99, .. }), "{e}");
        assert!(e.to_string().contains("tensor \"t\""), "{e}");
        assert!(one("t", &[4], 4, 0, 16).unwrap_err().to_string().contains("Q4_2"));
        assert!(one("t", &[4], 0, 0, 15).unwrap_err().to_string().contains("past the end"));
        assert!(one("t", &[4], 0, 32, 16).unwrap_err().to_string().contains("past the end"));
        assert!(one("t", &[4], 0, 8, 64).unwrap_err().to_string().contains("not a multiple"));
        assert!(one("t", &[4], 0, u64::MAX - 31, 64).unwrap_err().to_string().contains("past the end"));
        assert!(one("t", &[33], 8, 0, 64).unwrap_err().to_string().contains("whole Q8_0 blocks"));
        assert!(one("t", &[1 << 32, 1 << 32], 0, 0, 64).unwrap_err().to_string().contains("2^63"));
        assert!(one("t", &[u64::MAX], 0, 0, 64).is_err());
        assert!(one("t", &[0, 5], 0, 0, 0).is_ok());
        assert!(one("", &[4], 0, 0, 16).unwrap_err().to_string().contains("empty tensor name"));
        let mut w = W::new(3, 1, 0);
        w.str("t").u32(65).bytes(&[0; 64]);
        assert_eq!(err(&w.b).kind(), "limit");
        // Overlap and duplicates.
        let mut w = W::new(3, 2, 0);
        w.tensor("a", &[16], 0, 0).tensor("b", &[8], 0, 32).pad(32).bytes(&[0u8; 64]);
        assert!(err(&w.b).to_string().contains("overlap"));
        let mut w = W::new(3, 2, 0);
        w.tensor("a", &[8], 0, 0).tensor("a", &[8], 0, 32).pad(32).bytes(&[0u8; 64]);
        assert!(err(&w.b).to_string().contains("twice"));
    }

    /// A small fuzz, every run: each byte of a valid file set to a few values; never a panic,
    /// and what parses still has its tensors inside the file.
    #[test]
    fn every_byte_mutated_is_an_error_or_a_sound_header() {
        let f = small();
        for i in 0..f.len() {
            for b in [0u8, 1, 2, 0x7f, 0x80, 0xff, f[i] ^ 1, f[i].wrapping_add(32)] {
                let mut g = f.clone();
                g[i] = b;
                if let Ok(h) = parse(&g) {
                    for t in &h.tensors {
                        assert!(h.range(t).end <= g.len() as u64);
                    }
                }
            }
        }
    }

    #[test]
    fn a_prefix_holding_the_header_is_enough() {
        let f = small();
        let h = parse(&f).unwrap();
        let head = &f[..h.data_start as usize];
        // (Debug, not ==: the header holds a NaN.)
        let again = parse_with(head, f.len() as u64, &Limits::default()).unwrap();
        assert_eq!(format!("{again:?}"), format!("{h:?}"));
        assert_eq!(parse_with(&f[..20], f.len() as u64, &Limits::default()).unwrap_err().kind(), "truncated");
    }
}
