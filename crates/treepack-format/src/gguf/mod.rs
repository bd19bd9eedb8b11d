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

mod types;
use types::REMOVED_TYPES;
pub use types::{GgmlType, Value, ValueType, GGML_TYPES};

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
mod tests;
