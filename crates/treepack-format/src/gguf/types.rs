//! GGUF's value types and ggml's tensor types: the tables a header is read with.

use crate::dtype::DType;

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
pub(super) const REMOVED_TYPES: &[(u32, &str)] = &[
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
