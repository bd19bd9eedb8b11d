//! Writing a manifest: `encode` (deterministic JSON, fast paths for the common nodes) and `seal` (the hash trailer).

use super::*;

/// Serialise a manifest to its exact on-storage bytes (including the trailing hash member).
pub fn encode(m: &Manifest, stats: &Value) -> Vec<u8> {
    let parts = encode_parts(m, stats);
    if parts.len() == 1 {
        return parts.into_iter().next().map(Vec::from).unwrap_or_default();
    }
    parts.concat()
}

/// [`encode`] as the parts to write one after the other: a tree that is one [`Fragment`] (a
/// tree of plain values the caller's walk wrote as text) is not copied into the manifest, but
/// written from the fragment's own buffer (megabytes for a big tree of plain values).
pub fn encode_parts(m: &Manifest, stats: &Value) -> Vec<Bytes> {
    let Tree::Leaf(Entry::Fragment(root)) = &m.root else { return vec![Bytes::from(encode_one(m, stats))] };
    let mut head = String::with_capacity(4096);
    write_head(&mut head, m, stats);
    let body = root.bytes();
    let mut h = blake3::Hasher::new();
    h.update(head.as_bytes());
    // As `Hash32::of`: a big text is hashed on every core.
    if body.len() < 1 << 20
        || crate::exec::parallel(|| {
            h.update_rayon(&body);
        })
        .is_none()
    {
        h.update(&body);
    }
    let mut tail = String::with_capacity(HASH_TRAILER_LEN);
    tail.push_str(HASH_PREFIX);
    tail.push_str(&Hash32(*h.finalize().as_bytes()).to_hex());
    tail.push_str(HASH_SUFFIX);
    vec![Bytes::from(head), body, Bytes::from(tail)]
}

fn encode_one(m: &Manifest, stats: &Value) -> Vec<u8> {
    // Room for ~256 bytes a leaf up front: the buffer never moves while it grows (a 4.7 MB
    // manifest grown by doubling touched ~3x its size in fresh pages), and reserved pages that
    // are never written cost nothing.
    let leaves = stats.get("leaves").and_then(Value::as_u64).unwrap_or(0).min(1 << 22) as usize;
    let mut s = String::with_capacity(4096 + leaves * 256);
    write_head(&mut s, m, stats);
    write_node(&mut s, &m.root);
    let hash = Hash32::of(s.as_bytes()).to_hex();
    s.push_str(HASH_PREFIX);
    s.push_str(&hash);
    s.push_str(HASH_SUFFIX);
    s.into_bytes()
}

/// Every member before the root's node, up to `"root":`.
fn write_head(s: &mut String, m: &Manifest, stats: &Value) {
    let _ = write!(s, "{{\"format\":\"{FORMAT_NAME}\",\"version\":[{},{}],\n\"writer\":", m.version.0, m.version.1);
    write_str(s, &m.writer);
    if let Some(md) = &m.metadata {
        s.push_str(",\n\"metadata\":");
        s.push_str(&md.to_string());
    }
    s.push_str(",\n\"stats\":");
    s.push_str(&stats.to_string());
    s.push_str(",\n\"packs\":[");
    for (i, p) in m.packs.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str("{\"path\":");
        write_str(s, &p.path);
        let _ = write!(s, ",\"size\":{}}}", p.size);
    }
    s.push_str("],\n\"root\":");
}

pub(crate) fn write_str(s: &mut String, v: &str) {
    s.reserve(v.len() + 2);
    s.push('"');
    // The run of bytes that need no escape (all of most strings) is scanned and copied in one
    // pass, sixteen bytes at a time ([`copy_plain`]): a scan then a `push_str` paid a `memcpy`
    // call per string, a fifth of writing a record's short strings.
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
/// is given: scanning and copying in one pass spares a `memcpy` call per string (a fifth of
/// writing a record's short strings). Sixteen bytes a step with SSE2 (part of every x86-64;
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

pub(crate) fn write_float(s: &mut String, f: f64) {
    if f.is_finite() {
        push_finite_float(s, f);
    } else {
        write_str(s, &float_text(f));
    }
}

/// The shortest text that reads back as `f` (finite), as Ryu writes it: the format's float
/// text (docs/format.md section 4) and key paths' `~f`. Made by zmij, which finds the same
/// digits at about 2.4x Ryu's speed (a tenth of a W11 save went to Ryu) but writes a positive
/// exponent as `e+16` where Ryu writes `e16`; the `+` is dropped, so the bytes are Ryu's
/// (checked against Ryu on 8M doubles, and by the golden files).
pub(crate) fn push_finite_float(s: &mut String, f: f64) {
    let mut b = zmij::Buffer::new();
    let t = b.format_finite(f);
    // A `+` is only ever the exponent's sign, followed by its one to three digits: only the
    // last four bytes are looked at (a scan of the whole text was a sixth of a float's cost).
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
pub(super) fn float_text(f: f64) -> String {
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

pub(super) fn write_int(s: &mut String, i: &Int) {
    match i {
        Int::Small(v) => push_int(s, *v),
        Int::Big(b) => {
            let _ = write!(s, "{{\"t\":\"int\",\"v\":\"{b}\"}}");
        }
    }
}

pub(crate) fn write_key(s: &mut String, k: &Key) {
    match k {
        Key::None => s.push_str("null"),
        Key::Bool(b) => s.push_str(if *b { "true" } else { "false" }),
        Key::Int(i) => write_int(s, i),
        Key::Float(f) => write_float_node(s, *f),
        Key::Str(v) => write_str(s, v),
        Key::Tuple(items) => {
            s.push_str("{\"t\":\"tuple\",\"items\":[");
            for (i, k) in items.iter().enumerate() {
                if i > 0 {
                    s.push(',');
                }
                write_key(s, k);
            }
            s.push_str("]}");
        }
    }
}

pub(super) fn write_float_node(s: &mut String, f: f64) {
    if f.is_finite() {
        write_float(s, f);
    } else {
        s.push_str("{\"t\":\"float\",\"v\":");
        write_float(s, f);
        s.push('}');
    }
}

/// Append a decimal integer (without `fmt`'s machinery: a manifest has one per leaf or more).
pub(super) fn push_int(s: &mut String, v: impl itoa::Integer) {
    s.push_str(itoa::Buffer::new().format(v));
}

pub(super) fn write_chunk(s: &mut String, c: &ChunkRef) {
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

pub(super) fn write_u64s(s: &mut String, v: &[u64]) {
    s.push('[');
    for (i, x) in v.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        push_int(s, *x);
    }
    s.push(']');
}

pub(super) fn write_named(s: &mut String, items: &[(String, Tree<Entry>)]) {
    s.push('[');
    for (i, (k, v)) in items.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push('[');
        write_str(s, k);
        s.push(',');
        write_node(s, v);
        s.push(']');
    }
    s.push(']');
}

/// Whether a dict is written as a JSON object (format 1.4): every key a string, the first not
/// `"t"` (an object whose first member is `t` is a tagged node). Other dicts keep the `items`
/// form. Objects are a fifth smaller than `[key, value]` pairs and parse in about half the time.
pub fn object_form<V>(pairs: &[(Key, V)]) -> bool {
    pairs.first().is_none_or(|(k, _)| !matches!(k, Key::Str(s) if s == "t"))
        && pairs.iter().all(|(k, _)| matches!(k, Key::Str(_)))
}

/// Whether a tree holds a dict written as an object, which only format 1.4 readers read.
pub fn has_object_dicts(t: &Tree<Entry>) -> bool {
    match t {
        Tree::Leaf(Entry::Fragment(f)) => f.has_dicts(),
        Tree::Leaf(_) | Tree::Ref(_) => false,
        _ => crate::model::grow(|| match t {
            Tree::Dict(v) => object_form(v) || v.iter().any(|(_, c)| has_object_dicts(c)),
            Tree::List(v) | Tree::Tuple(v) => v.iter().any(has_object_dicts),
            Tree::Record { fields: v, .. } | Tree::Custom { children: v, .. } => {
                v.iter().any(|(_, c)| has_object_dicts(c))
            }
            Tree::Shared { node, .. } => has_object_dicts(node),
            Tree::Leaf(_) | Tree::Ref(_) => false,
        }),
    }
}

/// The opening of a tuple node, up to its first item.
pub(super) const TUPLE_BEGIN: &str = "{\"t\":\"tuple\",\"items\":[";
/// The opening of a dict node in the `items` form, up to its first pair.
pub(super) const DICT_BEGIN: &str = "{\"t\":\"dict\",\"items\":[";
/// The end of a tuple or a dict node.
pub(super) const ITEMS_END: &str = "]}";

pub(super) fn write_node(s: &mut String, t: &Tree<Entry>) {
    match t {
        // Leaves recurse no further: no stack check for most nodes.
        Tree::Leaf(e) => write_entry(s, e),
        _ => crate::model::grow(|| write_node_inner(s, t)),
    }
}

pub(super) fn write_node_inner(s: &mut String, t: &Tree<Entry>) {
    match t {
        Tree::Leaf(e) => write_entry(s, e),
        Tree::Shared { id, node } => {
            let _ = write!(s, "{{\"t\":\"shared\",\"id\":{id},\"v\":");
            write_node(s, node);
            s.push('}');
        }
        Tree::Ref(id) => {
            let _ = write!(s, "{{\"t\":\"ref\",\"id\":{id}}}");
        }
        Tree::List(v) => {
            s.push('[');
            for (i, c) in v.iter().enumerate() {
                if i > 0 {
                    s.push(',');
                }
                write_node(s, c);
            }
            s.push(']');
        }
        Tree::Tuple(v) => {
            s.push_str(TUPLE_BEGIN);
            for (i, c) in v.iter().enumerate() {
                if i > 0 {
                    s.push(',');
                }
                write_node(s, c);
            }
            s.push_str(ITEMS_END);
        }
        Tree::Dict(v) if object_form(v) => {
            s.push('{');
            for (i, (k, c)) in v.iter().enumerate() {
                if i > 0 {
                    s.push(',');
                }
                if let Key::Str(k) = k {
                    write_str(s, k);
                }
                s.push(':');
                write_node(s, c);
            }
            s.push('}');
        }
        Tree::Dict(v) => {
            s.push_str(DICT_BEGIN);
            for (i, (k, c)) in v.iter().enumerate() {
                if i > 0 {
                    s.push(',');
                }
                s.push('[');
                write_key(s, k);
                s.push(',');
                write_node(s, c);
                s.push(']');
            }
            s.push_str(ITEMS_END);
        }
        Tree::Record { type_name, fields } => {
            s.push_str("{\"t\":\"record\",\"type\":");
            write_str(s, type_name);
            s.push_str(",\"fields\":");
            write_named(s, fields);
            s.push('}');
        }
        Tree::Custom { type_name, data, children } => {
            s.push_str("{\"t\":\"custom\",\"type\":");
            write_str(s, type_name);
            if !data.is_null() {
                s.push_str(",\"data\":");
                s.push_str(&data.to_string());
            }
            if !children.is_empty() {
                s.push_str(",\"children\":");
                write_named(s, children);
            }
            s.push('}');
        }
    }
}

pub(super) fn write_entry(s: &mut String, e: &Entry) {
    let b64 = &base64::engine::general_purpose::STANDARD;
    match e {
        Entry::None => s.push_str("null"),
        Entry::Bool(b) => s.push_str(if *b { "true" } else { "false" }),
        Entry::Int(i) => write_int(s, i),
        Entry::Float(f) => write_float_node(s, *f),
        Entry::Complex(re, im) => {
            s.push_str("{\"t\":\"complex\",\"v\":[");
            write_float(s, *re);
            s.push(',');
            write_float(s, *im);
            s.push_str("]}");
        }
        Entry::Str(Stored::Inline(v)) => write_str(s, v),
        Entry::Fragment(f) => s.push_str(f.text()),
        Entry::Str(Stored::Blob { size, chunk }) => {
            s.push_str("{\"t\":\"str\",\"size\":");
            push_int(s, *size);
            s.push_str(",\"blob\":");
            write_chunk(s, chunk);
            s.push('}');
        }
        Entry::Bytes(Stored::Inline(v)) => {
            s.push_str("{\"t\":\"bytes\",\"b64\":\"");
            s.push_str(&b64.encode(v));
            s.push_str("\"}");
        }
        Entry::Bytes(Stored::Blob { size, chunk }) => {
            s.push_str("{\"t\":\"bytes\",\"size\":");
            push_int(s, *size);
            s.push_str(",\"blob\":");
            write_chunk(s, chunk);
            s.push('}');
        }
        Entry::Array(a) => {
            s.push_str("{\"t\":\"array\",\"dtype\":");
            s.push_str(&a.dtype.to_json().to_string());
            s.push_str(",\"shape\":");
            write_u64s(s, &a.shape);
            if let Some(v) = &a.annotation {
                s.push_str(",\"as\":");
                s.push_str(&v.to_string());
            }
            match &a.storage {
                ArrayStorage::Inline(data) => {
                    s.push_str(",\"data\":\"");
                    s.push_str(&b64.encode(data));
                    s.push('"');
                }
                ArrayStorage::Chunked { chunk_shape, chunks } => {
                    s.push_str(",\"chunk_shape\":");
                    write_u64s(s, chunk_shape);
                    s.push_str(",\"chunks\":[");
                    for (i, c) in chunks.iter().enumerate() {
                        if i > 0 {
                            s.push(',');
                        }
                        write_chunk(s, c);
                    }
                    s.push(']');
                }
            }
            if let Some(p) = &a.preview {
                s.push_str(",\"preview\":");
                s.push_str(&p.to_string());
            }
            s.push('}');
        }
    }
}

/// Append the `manifest_hash` trailer to a manifest body (everything up to, not including, the
/// final `,\n"manifest_hash":…` member). Used by the writer, by tests that craft manifests, and
/// by other implementations as the reference for the checksum rule.
pub fn seal(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + HASH_TRAILER_LEN);
    out.extend_from_slice(body);
    out.extend_from_slice(HASH_PREFIX.as_bytes());
    out.extend_from_slice(Hash32::of(body).to_hex().as_bytes());
    out.extend_from_slice(HASH_SUFFIX.as_bytes());
    out
}

// ---------------------------------------------------------------- reading
