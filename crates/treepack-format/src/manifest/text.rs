//! The one canonical JSON writer: the text of every string, number, key, chunk reference and
//! node opening the format writes. The manifest writer (`write.rs`), the fragment writer
//! (`fragment.rs`) and the root hash ([`crate::merkle`]) all write through these functions, so
//! the same value is the same bytes wherever it is written and the three cannot drift apart.
//! Only the order of a node object's members differs between them, and it is a parameter
//! ([`Order`]): the manifest writes `"t"` first (a reader knows a node's kind from its first
//! member), the root hash sorts members by name (docs/format.md section 9).

use super::types::{ChunkRef, Entry};
use crate::dtype::DType;
use crate::model::{grow, Int, Key};
use serde_json::Value;
use std::fmt::Write as _;

/// The member order of a node object as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Order {
    /// The manifest's (docs/format.md section 4): `"t"` first, then the node's other members.
    Manifest,
    /// The root hash's canonical encoding (docs/format.md section 9): members sorted by name.
    Sorted,
}

/// The opening of a tuple node in the manifest, up to its first item.
pub(crate) const TUPLE_BEGIN: &str = "{\"t\":\"tuple\",\"items\":[";
/// The opening of a dict node in the manifest's `items` form, up to its first pair.
pub(crate) const DICT_BEGIN: &str = "{\"t\":\"dict\",\"items\":[";
/// The end of a tuple or a dict node in the manifest.
pub(crate) const ITEMS_END: &str = "]}";

impl Order {
    /// The opening of a tuple (node or key), up to its first item.
    pub(crate) fn tuple_begin(self) -> &'static str {
        match self {
            Order::Manifest => TUPLE_BEGIN,
            Order::Sorted => "{\"items\":[",
        }
    }
    /// The end of a tuple (node or key).
    pub(crate) fn tuple_end(self) -> &'static str {
        match self {
            Order::Manifest => ITEMS_END,
            Order::Sorted => "],\"t\":\"tuple\"}",
        }
    }
    /// The opening of a dict node in the `items` form, up to its first pair.
    pub(crate) fn dict_begin(self) -> &'static str {
        match self {
            Order::Manifest => DICT_BEGIN,
            Order::Sorted => "{\"items\":[",
        }
    }
    /// The end of a dict node in the `items` form.
    pub(crate) fn dict_end(self) -> &'static str {
        match self {
            Order::Manifest => ITEMS_END,
            Order::Sorted => "],\"t\":\"dict\"}",
        }
    }
    /// The opening of shared node `id`, up to its value (`}` closes it).
    pub(crate) fn shared_begin(self, s: &mut String, id: u64) {
        let _ = match self {
            Order::Manifest => write!(s, "{{\"t\":\"shared\",\"id\":{id},\"v\":"),
            Order::Sorted => write!(s, "{{\"id\":{id},\"t\":\"shared\",\"v\":"),
        };
    }
    /// A ref to shared node `id`.
    pub(crate) fn reference(self, s: &mut String, id: u64) {
        let _ = match self {
            Order::Manifest => write!(s, "{{\"t\":\"ref\",\"id\":{id}}}"),
            Order::Sorted => write!(s, "{{\"id\":{id},\"t\":\"ref\"}}"),
        };
    }
}

/// `open`, then each of `items` written by `item` with a comma between two, then `close`: a
/// list, a tuple's or a dict's items, a shape, chunk references.
#[inline]
pub(crate) fn write_seq<T>(
    s: &mut String,
    open: &str,
    items: impl IntoIterator<Item = T>,
    close: &str,
    mut item: impl FnMut(&mut String, T),
) {
    s.push_str(open);
    for (i, x) in items.into_iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        item(s, x);
    }
    s.push_str(close);
}

/// A `[key, value]` pair: `key` and `value` write the two.
#[inline]
pub(crate) fn write_pair(s: &mut String, key: impl FnOnce(&mut String), value: impl FnOnce(&mut String)) {
    s.push('[');
    key(s);
    s.push(',');
    value(s);
    s.push(']');
}

/// A bool leaf or key.
#[inline]
pub(crate) fn write_bool(s: &mut String, v: bool) {
    s.push_str(if v { "true" } else { "false" });
}

/// A leaf written the same way in the manifest and in the root hash's encoding (None, bool,
/// int, float, complex); `false`, with nothing written, for any other.
#[inline]
pub(crate) fn write_scalar(s: &mut String, e: &Entry) -> bool {
    match e {
        Entry::None => s.push_str("null"),
        Entry::Bool(b) => write_bool(s, *b),
        Entry::Int(i) => write_int(s, i),
        Entry::Float(f) => write_float_node(s, *f),
        Entry::Complex(re, im) => {
            s.push_str("{\"t\":\"complex\",\"v\":[");
            write_float(s, *re);
            s.push(',');
            write_float(s, *im);
            s.push_str("]}");
        }
        _ => return false,
    }
    true
}

/// A dtype's manifest name (docs/format.md section 5): a name, or a struct dtype's object.
pub(crate) fn write_dtype(s: &mut String, d: &DType, order: Order) {
    write_value(s, &d.to_json(), order);
}

/// A free JSON value (custom data, annotations, previews, dtypes): as serde_json writes it in
/// the manifest; in the root hash's canonical form with members sorted by key (UTF-8 bytes),
/// strings escaped as in the manifest, integers in decimal, other numbers as Ryu prints them.
pub(crate) fn write_value(s: &mut String, v: &Value, order: Order) {
    match (order, v) {
        (Order::Manifest, _) => s.push_str(&v.to_string()),
        (Order::Sorted, Value::Null) => s.push_str("null"),
        (Order::Sorted, Value::Bool(b)) => write_bool(s, *b),
        (Order::Sorted, Value::Number(n)) => {
            if let Some(i) = n.as_i64() {
                push_int(s, i);
            } else if let Some(u) = n.as_u64() {
                push_int(s, u);
            } else {
                write_float(s, n.as_f64().unwrap_or(f64::NAN));
            }
        }
        (Order::Sorted, Value::String(v)) => write_str(s, v),
        (Order::Sorted, Value::Array(items)) => {
            write_seq(s, "[", items, "]", |s, x| grow(|| write_value(s, x, order)));
        }
        (Order::Sorted, Value::Object(m)) => {
            let mut members: Vec<(&String, &Value)> = m.iter().collect();
            members.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            write_seq(s, "{", members, "}", |s, (k, x)| {
                write_str(s, k);
                s.push(':');
                grow(|| write_value(s, x, order));
            });
        }
    }
}

/// A string, escaped as the format escapes strings (docs/format.md section 4).
pub(crate) fn write_str(s: &mut String, v: &str) {
    s.reserve(v.len() + 2);
    s.push('"');
    // The run of bytes that need no escape (all of most strings) is scanned and copied in one
    // pass, sixteen bytes at a time ([`copy_plain`]): a scan then a `push_str` would pay a
    // `memcpy` call per string, which dominates writing short strings.
    let bytes = v.as_bytes();
    let mut start = copy_plain(s, bytes);
    // Every byte that needs an escape is ASCII, so splitting the `str` at it never cuts a
    // character.
    while let Some(&b) = bytes.get(start) {
        match b {
            b'"' => s.push_str("\\\""),
            b'\\' => s.push_str("\\\\"),
            b'\n' => s.push_str("\\n"),
            b'\r' => s.push_str("\\r"),
            b'\t' => s.push_str("\\t"),
            _ => {
                let _ = write!(s, "\\u{:04x}", b);
            }
        }
        let i = next_escape(bytes, start + 1);
        s.push_str(&v[start + 1..i]);
        start = i;
    }
    s.push('"');
}

/// Append the bytes of `b` up to the first that needs an escape ([`needs_escape`]) to `s`,
/// whose spare capacity must hold all of `b`; the count appended.
#[inline]
fn copy_plain(s: &mut String, b: &[u8]) -> usize {
    let len = s.len();
    assert!(s.capacity() - len >= b.len(), "copy_plain: no room reserved");
    // SAFETY: the bytes kept (set_len) are `b[..i]`, none of which needs an escape, and `b`
    // is the start of a `str` cut only before an ASCII byte (or at its end): `s` stays UTF-8.
    let out = unsafe { s.as_mut_vec() };
    // SAFETY: `dst` has room for all of `b` (asserted above); `plain_run` wrote `dst[..i]`.
    unsafe {
        let i = plain_run(b, 0, Some(out.as_mut_ptr().add(len)));
        out.set_len(len + i);
        i
    }
}

/// The index of the first byte of `b` at or after `i` that needs an escape ([`needs_escape`]),
/// or `b.len()`.
#[inline]
fn next_escape(b: &[u8], i: usize) -> usize {
    // SAFETY: nothing is written.
    unsafe { plain_run(b, i, None) }
}

/// The end of the run of bytes of `b` from `i` that need no escape (the index of the first
/// that does, or `b.len()`), each copied to `dst` at its own index as it is scanned when `dst`
/// is given: scanning and copying in one pass spares a `memcpy` call per string (which
/// dominates writing short strings). Sixteen bytes a step with SSE2 (part of every x86-64;
/// a block is stored whole before it is checked, and what lands past the run is not kept),
/// eight elsewhere: string values are most of a manifest of records.
///
/// # Safety
/// `dst`, when given, must be valid for writes of `b.len()` bytes.
#[inline(always)]
unsafe fn plain_run(b: &[u8], mut i: usize, dst: Option<*mut u8>) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::*;
        // SAFETY: SSE2 is in the x86-64 baseline; each load reads `b[i..i + 16]` and each
        // store writes `dst[i..i + 16]`, inside `b`'s length as the loop condition keeps.
        unsafe {
            while i + 16 <= b.len() {
                let x = _mm_loadu_si128(b.as_ptr().add(i).cast::<__m128i>());
                if let Some(d) = dst {
                    _mm_storeu_si128(d.add(i).cast::<__m128i>(), x);
                }
                let mask = escape_mask(x);
                if mask != 0 {
                    return i + mask.trailing_zeros() as usize;
                }
                i += 16;
            }
        }
    }
    while i + 8 <= b.len() {
        let mut word = [0u8; 8];
        word.copy_from_slice(&b[i..i + 8]);
        if word_needs_escape(u64::from_le_bytes(word)) {
            break;
        }
        if let Some(d) = dst {
            // SAFETY: `dst[i..i + 8]` is inside the room the caller gives.
            unsafe { std::ptr::write_unaligned(d.add(i).cast::<[u8; 8]>(), word) };
        }
        i += 8;
    }
    while let Some(&c) = b.get(i).filter(|&&c| !needs_escape(c)) {
        if let Some(d) = dst {
            // SAFETY: as above.
            unsafe { d.add(i).write(c) };
        }
        i += 1;
    }
    i
}

/// Bit `k` set where byte `k` of `x` needs an escape ([`needs_escape`]), with SSE2.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn escape_mask(x: std::arch::x86_64::__m128i) -> u32 {
    use std::arch::x86_64::*;
    // SAFETY: SSE2 is in the x86-64 baseline; these only compute on registers.
    unsafe {
        // A byte below 0x20 is its own unsigned minimum with 0x1f.
        let control = _mm_cmpeq_epi8(_mm_min_epu8(x, _mm_set1_epi8(0x1f)), x);
        let quote = _mm_cmpeq_epi8(x, _mm_set1_epi8(b'"' as i8));
        let backslash = _mm_cmpeq_epi8(x, _mm_set1_epi8(b'\\' as i8));
        let del = _mm_cmpeq_epi8(x, _mm_set1_epi8(0x7f));
        _mm_movemask_epi8(_mm_or_si128(_mm_or_si128(control, quote), _mm_or_si128(backslash, del))) as u32
    }
}

/// Whether the writer escapes this byte in a JSON string: below 0x20, `"`, `\\` or 0x7f.
#[inline]
fn needs_escape(b: u8) -> bool {
    matches!(b, 0..0x20 | b'"' | b'\\' | 0x7f)
}

/// Whether any of the eight bytes of `w` needs an escape in a JSON string as the writer
/// escapes them: below 0x20, `"`, `\\` or 0x7f (SWAR: a zero byte of `w ^ c` is a byte equal to
/// `c`; `(x - 0x01..) & !x & 0x80..` is non-zero exactly when `x` has a zero byte, and with
/// 0x20 in place of 0x01 when it has a byte below 0x20).
#[inline]
fn word_needs_escape(w: u64) -> bool {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    let zero = |x: u64| x.wrapping_sub(LO) & !x & HI;
    let control = w.wrapping_sub(LO * 0x20) & !w & HI;
    (control | zero(w ^ (LO * b'"' as u64)) | zero(w ^ (LO * b'\\' as u64)) | zero(w ^ (LO * 0x7f))) != 0
}

/// A float inside a complex or a tagged float: its shortest text when finite, else the
/// non-finite text as a string.
pub(crate) fn write_float(s: &mut String, f: f64) {
    if f.is_finite() {
        push_finite_float(s, f);
    } else {
        write_str(s, &float_text(f));
    }
}

/// The shortest text that reads back as `f` (finite), as Ryu writes it: the format's float
/// text (docs/format.md section 4) and key paths' `~f`. Made by zmij, which finds the same
/// digits faster than Ryu (floats are a large part of a tree of metrics) but writes a positive
/// exponent as `e+16` where Ryu writes `e16`; the `+` is dropped, so the bytes are Ryu's
/// (checked against Ryu by a test, and by the golden files).
pub(crate) fn push_finite_float(s: &mut String, f: f64) {
    let mut b = zmij::Buffer::new();
    let t = b.format_finite(f);
    // A `+` is only ever the exponent's sign, followed by its one to three digits: only the
    // last four bytes are looked at (a float's text is short, and scanning all of it shows).
    let n = t.len();
    match (n.saturating_sub(4)..n).find(|&i| t.as_bytes()[i] == b'+') {
        Some(i) => {
            s.push_str(&t[..i]);
            s.push_str(&t[i + 1..]);
        }
        None => s.push_str(t),
    }
}

/// Text for a non-finite float: `nan`, `inf`, `-inf`, or `nan:<16 hex bits>` for a NaN whose bits
/// are not the canonical quiet NaN 0x7ff8000000000000.
pub(crate) fn float_text(f: f64) -> String {
    if f.is_nan() {
        if f.to_bits() == 0x7ff8_0000_0000_0000 {
            "nan".into()
        } else {
            format!("nan:{:016x}", f.to_bits())
        }
    } else if f > 0.0 {
        "inf".into()
    } else {
        "-inf".into()
    }
}

/// An int leaf or key: a number, or the tagged form of one that does not fit 64 bits.
pub(crate) fn write_int(s: &mut String, i: &Int) {
    match i {
        Int::Small(v) => push_int(s, *v),
        Int::Big(b) => {
            let _ = write!(s, "{{\"t\":\"int\",\"v\":\"{b}\"}}");
        }
    }
}

/// A dict key (docs/format.md section 4), tuples with their members in `order`.
pub(crate) fn write_key(s: &mut String, k: &Key, order: Order) {
    match k {
        Key::None => s.push_str("null"),
        Key::Bool(b) => write_bool(s, *b),
        Key::Int(i) => write_int(s, i),
        Key::Float(f) => write_float_node(s, *f),
        Key::Str(v) => write_str(s, v),
        Key::Tuple(items) => write_seq(s, order.tuple_begin(), items, order.tuple_end(), |s, k| write_key(s, k, order)),
    }
}

/// A float where a node stands: a number when finite, else the tagged form.
pub(crate) fn write_float_node(s: &mut String, f: f64) {
    if f.is_finite() {
        write_float(s, f);
    } else {
        s.push_str("{\"t\":\"float\",\"v\":");
        write_float(s, f);
        s.push('}');
    }
}

/// Append a decimal integer (without `fmt`'s machinery: a manifest has one per leaf or more).
pub(crate) fn push_int(s: &mut String, v: impl itoa::Integer) {
    s.push_str(itoa::Buffer::new().format(v));
}

/// A chunk reference as the manifest holds it.
pub(crate) fn write_chunk(s: &mut String, c: &ChunkRef) {
    s.push_str("{\"pack\":");
    push_int(s, c.pack);
    s.push_str(",\"offset\":");
    push_int(s, c.offset);
    s.push_str(",\"length\":");
    push_int(s, c.length);
    s.push_str(",\"codec\":\"");
    s.push_str(c.codec.name());
    s.push_str("\",\"blake3\":\"");
    c.hash.push_hex(s);
    s.push_str("\"}");
}

/// A shape or a chunk shape.
pub(crate) fn write_u64s(s: &mut String, v: &[u64]) {
    write_seq(s, "[", v, "]", |s, x| push_int(s, *x));
}

/// The `[[name, node], ...]` of a record's fields or a custom node's children, each node
/// written by `node`.
pub(crate) fn write_named<N>(s: &mut String, items: &[(String, N)], mut node: impl FnMut(&mut String, &N)) {
    write_seq(s, "[", items, "]", |s, (k, v)| write_pair(s, |s| write_str(s, k), |s| node(s, v)));
}

/// A string or bytes leaf stored in a pack: `kind` is `str` or `bytes`.
pub(crate) fn write_blob(s: &mut String, kind: &str, size: u64, chunk: &ChunkRef) {
    s.push_str("{\"t\":\"");
    s.push_str(kind);
    s.push_str("\",\"size\":");
    push_int(s, size);
    s.push_str(",\"blob\":");
    write_chunk(s, chunk);
    s.push('}');
}
