//! The manifest (`treepack.json`): the tree's structure, inline values, and where every chunk
//! lives. Written as compact JSON by hand (fast, deterministic) and parsed by a strict streaming
//! visitor that bounds depth, rejects duplicates, and reports the key path of any problem.
//!
//! The normative description is docs/format.md; this module is its reference implementation.

use crate::error::{Error, Result};
use crate::format::codec::Codec;
use crate::format::dtype::DType;
use crate::format::grid::ChunkGrid;
use crate::format::hash::Hash32;
use crate::format::keypath::KeyPath;
use crate::format::model::{shape_len, Int, Key, Step, Tree};
use base64::Engine;
use bytes::Bytes;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use std::cell::RefCell;
use std::collections::HashSet;
use std::fmt::{self, Write as _};

pub mod outline;

/// The format's signature value (`"format": "treepack"`).
pub const FORMAT_NAME: &str = "treepack";
/// Major version this build writes and reads.
pub const VERSION_MAJOR: u16 = 1;
/// Minor version this build writes. Readers accept any minor of a known major.
pub const VERSION_MINOR: u16 = 0;
/// Deepest container nesting accepted (Python's default recursion limit is 1000).
pub const MAX_DEPTH: usize = 1000;
/// Largest manifest accepted, in bytes.
pub const MAX_MANIFEST_BYTES: u64 = 1 << 30;
/// Most dimensions of an array (numpy's limit is 64).
pub const MAX_NDIM: usize = 64;
/// Most packs a manifest may list.
pub const MAX_PACKS: usize = 1 << 20;

const HASH_PREFIX: &str = ",\n\"manifest_hash\":\"";
const HASH_SUFFIX: &str = "\"}\n";
/// Length of the manifest's closing member: `,\n"manifest_hash":"<64 hex>"}\n`.
pub const HASH_TRAILER_LEN: usize = HASH_PREFIX.len() + 64 + HASH_SUFFIX.len();

/// Where one chunk's stored bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkRef {
    /// Index into [`Manifest::packs`].
    pub pack: u32,
    pub offset: u64,
    /// Stored length in bytes.
    pub length: u64,
    pub codec: Codec,
    /// BLAKE3 of the canonical (decoded) bytes.
    pub hash: Hash32,
}

/// A string or bytes value: inline in the manifest, or a blob in a pack.
#[derive(Debug, Clone, PartialEq)]
pub enum Stored<T> {
    Inline(T),
    Blob { size: u64, chunk: ChunkRef },
}

/// How an array's bytes are stored.
#[derive(Debug, Clone, PartialEq)]
pub enum ArrayStorage {
    /// Small arrays: canonical bytes base64-encoded in the manifest.
    Inline(Bytes),
    /// On a chunk grid, chunks in C order of grid coordinates.
    Chunked { chunk_shape: Vec<u64>, chunks: Vec<ChunkRef> },
}

/// An array leaf as recorded in the manifest.
#[derive(Debug, Clone, PartialEq)]
pub struct ArrayEntry {
    pub dtype: DType,
    pub shape: Vec<u64>,
    pub storage: ArrayStorage,
    /// Informational preview (first values, min, max). Never used to reconstruct data.
    pub preview: Option<Value>,
}

impl ArrayEntry {
    /// Logical byte size (itemsize × number of elements).
    pub fn nbytes(&self) -> u64 {
        shape_len(&self.shape).unwrap_or(0).saturating_mul(self.dtype.itemsize())
    }
    /// The chunk grid (a single chunk covering everything for inline arrays).
    pub fn grid(&self) -> ChunkGrid {
        match &self.storage {
            ArrayStorage::Chunked { chunk_shape, .. } => {
                ChunkGrid { shape: self.shape.clone(), chunk_shape: chunk_shape.clone() }
            }
            ArrayStorage::Inline(_) => {
                ChunkGrid { shape: self.shape.clone(), chunk_shape: self.shape.iter().map(|&d| d.max(1)).collect() }
            }
        }
    }
}

/// A leaf as recorded in the manifest.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    None,
    Bool(bool),
    Int(Int),
    Float(f64),
    Complex(f64, f64),
    Str(Stored<String>),
    Bytes(Stored<Bytes>),
    /// Boxed: arrays are the largest variant, and keeping `Entry` small keeps 100k-leaf
    /// manifest trees compact (less memory to fill and move while parsing).
    Array(Box<ArrayEntry>),
}

impl Entry {
    pub fn kind(&self) -> &'static str {
        match self {
            Entry::None => "none",
            Entry::Bool(_) => "bool",
            Entry::Int(_) => "int",
            Entry::Float(_) => "float",
            Entry::Complex(..) => "complex",
            Entry::Str(_) => "str",
            Entry::Bytes(_) => "bytes",
            Entry::Array(_) => "array",
        }
    }

    /// Chunks this leaf reads from packs.
    pub fn chunks(&self) -> &[ChunkRef] {
        match self {
            Entry::Str(Stored::Blob { chunk, .. }) | Entry::Bytes(Stored::Blob { chunk, .. }) => {
                std::slice::from_ref(chunk)
            }
            Entry::Array(a) => match &a.storage {
                ArrayStorage::Chunked { chunks, .. } => chunks,
                ArrayStorage::Inline(_) => &[],
            },
            _ => &[],
        }
    }

    /// Byte size of the value (UTF-8 bytes for strings).
    pub fn nbytes(&self) -> u64 {
        match self {
            Entry::Str(Stored::Inline(s)) => s.len() as u64,
            Entry::Bytes(Stored::Inline(b)) => b.len() as u64,
            Entry::Str(Stored::Blob { size, .. }) | Entry::Bytes(Stored::Blob { size, .. }) => *size,
            Entry::Array(a) => a.nbytes(),
            _ => 0,
        }
    }
}

/// Description of one leaf, read from the manifest alone.
#[derive(Debug, Clone, PartialEq)]
pub struct LeafInfo {
    pub path: String,
    pub kind: &'static str,
    pub dtype: Option<DType>,
    pub shape: Option<Vec<u64>>,
    pub nbytes: u64,
}

/// One pack file of a location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackInfo {
    /// Path relative to the location (`packs/…​.tpp`), or `.` for the single file itself.
    pub path: String,
    pub size: u64,
}

/// A parsed manifest.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    pub version: (u16, u16),
    pub writer: String,
    pub metadata: Option<Value>,
    pub packs: Vec<PackInfo>,
    pub root: Tree<Entry>,
}

impl Manifest {
    /// The structure with a [`LeafInfo`] at each leaf.
    pub fn structure(&self) -> Tree<LeafInfo> {
        let r: std::result::Result<_, std::convert::Infallible> = self.root.map_ref_steps(&mut |p, e| {
            Ok(LeafInfo {
                path: crate::format::keypath::steps_text(p),
                kind: e.kind(),
                dtype: if let Entry::Array(a) = e { Some(a.dtype.clone()) } else { None },
                shape: if let Entry::Array(a) = e { Some(a.shape.clone()) } else { None },
                nbytes: e.nbytes(),
            })
        });
        match r {
            Ok(t) => t,
            Err(e) => match e {},
        }
    }
}

// ---------------------------------------------------------------- writing

/// Serialise a manifest to its exact on-storage bytes (including the trailing hash member).
pub fn encode(m: &Manifest, stats: &Value) -> Vec<u8> {
    // Room for ~256 bytes a leaf up front: the buffer never moves while it grows (a 4.7 MB
    // manifest grown by doubling touched ~3x its size in fresh pages), and reserved pages that
    // are never written cost nothing.
    let leaves = stats.get("leaves").and_then(Value::as_u64).unwrap_or(0).min(1 << 22) as usize;
    let mut s = String::with_capacity(4096 + leaves * 256);
    let _ = write!(s, "{{\"format\":\"{FORMAT_NAME}\",\"version\":[{},{}],\n\"writer\":", m.version.0, m.version.1);
    write_str(&mut s, &m.writer);
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
        write_str(&mut s, &p.path);
        let _ = write!(s, ",\"size\":{}}}", p.size);
    }
    s.push_str("],\n\"root\":");
    write_node(&mut s, &m.root);
    let hash = Hash32::of(s.as_bytes()).to_hex();
    s.push_str(HASH_PREFIX);
    s.push_str(&hash);
    s.push_str(HASH_SUFFIX);
    s.into_bytes()
}

fn write_str(s: &mut String, v: &str) {
    s.push('"');
    for c in v.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            '\n' => s.push_str("\\n"),
            '\r' => s.push_str("\\r"),
            '\t' => s.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(s, "\\u{:04x}", c as u32);
            }
            c => s.push(c),
        }
    }
    s.push('"');
}

fn write_float(s: &mut String, f: f64) {
    if f.is_finite() {
        let mut b = ryu::Buffer::new();
        s.push_str(b.format_finite(f));
    } else {
        write_str(s, &float_text(f));
    }
}

/// Text for a non-finite float: `nan`, `inf`, `-inf`, or `nan:<16 hex bits>` for a NaN whose bits
/// are not the canonical quiet NaN 0x7ff8000000000000.
fn float_text(f: f64) -> String {
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

fn write_int(s: &mut String, i: &Int) {
    match i {
        Int::Small(v) => push_int(s, *v),
        Int::Big(b) => {
            let _ = write!(s, "{{\"t\":\"int\",\"v\":\"{b}\"}}");
        }
    }
}

fn write_key(s: &mut String, k: &Key) {
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

fn write_float_node(s: &mut String, f: f64) {
    if f.is_finite() {
        write_float(s, f);
    } else {
        s.push_str("{\"t\":\"float\",\"v\":");
        write_float(s, f);
        s.push('}');
    }
}

/// Append a decimal integer (without `fmt`'s machinery: a manifest has one per leaf or more).
fn push_int(s: &mut String, v: impl itoa::Integer) {
    s.push_str(itoa::Buffer::new().format(v));
}

fn write_chunk(s: &mut String, c: &ChunkRef) {
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

fn write_u64s(s: &mut String, v: &[u64]) {
    s.push('[');
    for (i, x) in v.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        push_int(s, *x);
    }
    s.push(']');
}

fn write_named(s: &mut String, items: &[(String, Tree<Entry>)]) {
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

fn write_node(s: &mut String, t: &Tree<Entry>) {
    crate::format::model::grow(|| write_node_inner(s, t))
}

fn write_node_inner(s: &mut String, t: &Tree<Entry>) {
    match t {
        Tree::Leaf(e) => write_entry(s, e),
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
            s.push_str("{\"t\":\"tuple\",\"items\":[");
            for (i, c) in v.iter().enumerate() {
                if i > 0 {
                    s.push(',');
                }
                write_node(s, c);
            }
            s.push_str("]}");
        }
        Tree::Dict(v) => {
            s.push_str("{\"t\":\"dict\",\"items\":[");
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
            s.push_str("]}");
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

fn write_entry(s: &mut String, e: &Entry) {
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

/// Verify the trailing hash member and parse a manifest. `file` names the source in errors.
///
/// # Errors
/// [`Error::NotTreepack`], [`Error::UnsupportedVersion`], [`Error::ManifestChecksum`] or
/// [`Error::InvalidManifest`] (with the key path of the problem).
pub fn decode(bytes: &[u8], file: &str) -> Result<Manifest> {
    check(bytes, file)?;
    parse_unchecked(bytes, file)
}

/// The checks [`decode`] makes before parsing: size limit, signature, version, trailing hash.
///
/// # Errors
/// As [`decode`], for everything but the parse.
pub fn check(bytes: &[u8], file: &str) -> Result<()> {
    if bytes.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(Error::limit("manifest size", MAX_MANIFEST_BYTES, format!("{file} is {} bytes", bytes.len())));
    }
    if !bytes.starts_with(b"{\"format\":") {
        let head = String::from_utf8_lossy(&bytes[..bytes.len().min(40)]).into_owned();
        return Err(Error::NotTreepack {
            file: file.into(),
            reason: format!("manifest must start with {{\"format\":, found {head:?}"),
        });
    }
    // Check the version before the checksum so a newer file says "upgrade", not "corrupt".
    check_version_prefix(bytes, file)?;
    if bytes.len() < HASH_TRAILER_LEN + 2 {
        return Err(Error::NotTreepack { file: file.into(), reason: "manifest is truncated".into() });
    }
    let split = bytes.len() - HASH_TRAILER_LEN;
    let (body, trailer) = bytes.split_at(split);
    let ok_shape = trailer.starts_with(HASH_PREFIX.as_bytes()) && trailer.ends_with(HASH_SUFFIX.as_bytes());
    let stored =
        std::str::from_utf8(&trailer[HASH_PREFIX.len()..HASH_PREFIX.len() + 64]).ok().and_then(Hash32::from_hex);
    let stored = match (ok_shape, stored) {
        (true, Some(h)) => h,
        _ => {
            return Err(Error::NotTreepack {
                file: file.into(),
                reason: "manifest does not end with its \"manifest_hash\" member (truncated or edited?)".into(),
            })
        }
    };
    let actual = Hash32::of(body);
    if actual != stored {
        return Err(Error::ManifestChecksum { file: file.into(), expected: stored.to_hex(), actual: actual.to_hex() });
    }
    Ok(())
}

fn check_version_prefix(bytes: &[u8], file: &str) -> Result<()> {
    let head = &bytes[..bytes.len().min(64)];
    let text = String::from_utf8_lossy(head);
    let pat = "{\"format\":\"treepack\",\"version\":[";
    let Some(rest) = text.strip_prefix(pat) else {
        return Err(Error::NotTreepack {
            file: file.into(),
            reason: "manifest must begin with {\"format\":\"treepack\",\"version\":[major,minor]".into(),
        });
    };
    let major: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let found: String = rest.chars().take_while(|&c| c != ']').take(20).collect();
    // A version that is not `[integer, integer]` is damage, not a newer format.
    let minor_ok = found
        .strip_prefix(major.as_str())
        .and_then(|r| r.strip_prefix(','))
        .is_some_and(|m| !m.is_empty() && m.chars().all(|c| c.is_ascii_digit()));
    match major.parse::<u32>() {
        Ok(m) if minor_ok && m == u32::from(VERSION_MAJOR) => Ok(()),
        Ok(_) if minor_ok => Err(Error::UnsupportedVersion { file: file.into(), found, supported: VERSION_MAJOR }),
        _ => Err(Error::manifest(file, "version", format!("`[{found}]` is not [major, minor] with integer parts"))),
    }
}

/// Parse without checking the trailing hash (used by fuzzing and by `decode`).
pub fn parse_unchecked(bytes: &[u8], file: &str) -> Result<Manifest> {
    parse_with(bytes, file, bytes.len() >= SPLIT_MIN_BYTES)
}

/// Manifests at least this large parse the items of big containers near the root in parallel.
const SPLIT_MIN_BYTES: usize = 1 << 20;
/// Containers this deep or deeper are always parsed on one thread.
const SPLIT_DEPTH: usize = 3;
/// Containers with fewer items than this are parsed on one thread.
const SPLIT_MIN_ITEMS: usize = 256;

/// Parse with or without splitting big containers across threads (the result is the same;
/// tests compare both).
fn parse_with(bytes: &[u8], file: &str, split: bool) -> Result<Manifest> {
    let p = parse_generic(bytes, file, &OwnedTree, split, false)?;
    let m = Manifest { version: p.version, writer: p.writer, metadata: p.metadata, packs: p.packs, root: p.root };
    validate(&m, file)?;
    Ok(m)
}

/// Check a manifest's size, signature, version and trailing hash, then parse it into whatever
/// `builder` builds, in one pass with no owned tree in between. Each leaf is validated as it is
/// read (the checks [`validate`] makes), which needs `packs` before `root` (as every writer puts
/// them); a manifest in another member order gets an error here and must go through [`decode`].
///
/// This is the fast path for callers that turn the tree into something else at once (the Python
/// bindings build their objects here). Its errors are terse: on any error, call [`decode`] to
/// get the full, typed one.
///
/// # Errors
/// As [`decode`], with less precise messages.
pub fn build<B: Build>(bytes: &[u8], file: &str, builder: &B) -> Result<Parsed<B::Node>> {
    check(bytes, file)?;
    // Pack paths are checked as they are read (before any builder sees them), leaves as each
    // is read: nothing is left for a `validate` pass.
    // Only the helped split: it checks every leaf inline, where the parallel split of owned
    // trees leaves the checks to `validate` (which `decode` runs and this does not).
    let split = B::HELPER && !B::PARALLEL && bytes.len() >= SPLIT_MIN_BYTES;
    parse_generic(bytes, file, builder, split, true)
}

/// [`build`] on this thread alone (tests compare it with the helped parse).
#[doc(hidden)]
pub fn build_one_thread<B: Build>(bytes: &[u8], file: &str, builder: &B) -> Result<Parsed<B::Node>> {
    check(bytes, file)?;
    parse_generic(bytes, file, builder, false, true)
}

/// A manifest's members, with its root built by a [`Build`].
#[derive(Debug)]
pub struct Parsed<N> {
    pub version: (u16, u16),
    pub writer: String,
    pub metadata: Option<Value>,
    pub packs: Vec<PackInfo>,
    pub root: N,
}

/// What the manifest parser builds from the nodes it reads, bottom-up: the owned manifest tree
/// ([`OwnedTree`]), or, in the Python bindings, Python objects with no tree in between (a
/// 100k-leaf tree costs ~20 MB and 300k allocations as an owned tree). The parser has checked
/// every node before it is handed over. An `Err` stops the parse with that message.
pub trait Build {
    type Node;
    /// Big containers are parsed on several threads, as owned trees that `owned` then converts.
    /// Only builders whose conversion is free should say yes.
    const PARALLEL: bool = false;
    /// Builders that must stay on the calling thread (Python objects) but take owned subtrees
    /// through [`replay`]: the items of a big container near the root of a large manifest are
    /// then parsed by this thread and one helper thread together (see `parse_items_helped`).
    const HELPER: bool = false;
    fn leaf(&self, e: Entry) -> std::result::Result<Self::Node, String>;
    /// A leaf of a tree being [`replay`]ed; builders that only read the entry avoid the copy.
    fn leaf_ref(&self, e: &Entry) -> std::result::Result<Self::Node, String> {
        self.leaf(e.clone())
    }
    fn list(&self, items: Vec<Self::Node>, tuple: bool) -> std::result::Result<Self::Node, String>;
    fn dict(&self, pairs: Vec<(Key, Self::Node)>) -> std::result::Result<Self::Node, String>;
    fn record(&self, type_name: String, fields: Vec<(String, Self::Node)>) -> std::result::Result<Self::Node, String>;
    fn custom(
        &self,
        type_name: String,
        data: Value,
        children: Vec<(String, Self::Node)>,
    ) -> std::result::Result<Self::Node, String>;
    /// An owned subtree from the parallel parse (only called when `PARALLEL`).
    fn owned(&self, _t: Tree<Entry>) -> std::result::Result<Self::Node, String> {
        Err("this builder does not take owned trees".into())
    }
    /// The manifest's packs, as soon as they are read (before `root` in every manifest a writer
    /// makes), for builders that read stored leaves while they build.
    fn packs(&self, _packs: &[PackInfo]) {}
    /// The parser is about to read the child reached by `step` (then calls `exit`); builders
    /// that need each node's key path keep it from these calls.
    fn enter(&self, _step: Step<'_>) {}
    fn exit(&self) {}
}

/// Hand an owned subtree to `b` node by node, bottom-up, with the same `enter`/`exit` calls the
/// parser makes: what `b` builds is what it would have built from the text. The tree is only
/// borrowed (leaves go through [`Build::leaf_ref`]), so whichever thread built it frees it.
///
/// # Errors
/// The first error `b` returns.
pub fn replay<B: Build>(b: &B, t: &Tree<Entry>) -> std::result::Result<B::Node, String> {
    crate::format::model::grow(|| match t {
        Tree::Leaf(e) => {
            #[cfg(test)]
            tests::REPLAYED.with(|n| n.set(n.get() + 1));
            b.leaf_ref(e)
        }
        Tree::List(items) => replay_items(b, items).and_then(|v| b.list(v, false)),
        Tree::Tuple(items) => replay_items(b, items).and_then(|v| b.list(v, true)),
        Tree::Dict(pairs) => {
            let mut out = Vec::with_capacity(pairs.len());
            for (k, v) in pairs {
                b.enter(Step::Key(k));
                let v = replay(b, v);
                b.exit();
                out.push((k.clone(), v?));
            }
            b.dict(out)
        }
        Tree::Record { type_name, fields } => replay_named(b, fields).and_then(|f| b.record(type_name.clone(), f)),
        Tree::Custom { type_name, data, children } => {
            replay_named(b, children).and_then(|c| b.custom(type_name.clone(), data.clone(), c))
        }
    })
}

fn replay_items<B: Build>(b: &B, items: &[Tree<Entry>]) -> std::result::Result<Vec<B::Node>, String> {
    let mut out = Vec::with_capacity(items.len());
    for (i, t) in items.iter().enumerate() {
        b.enter(Step::Index(i));
        let v = replay(b, t);
        b.exit();
        out.push(v?);
    }
    Ok(out)
}

fn replay_named<B: Build>(
    b: &B,
    named: &[(String, Tree<Entry>)],
) -> std::result::Result<Vec<(String, B::Node)>, String> {
    let mut out = Vec::with_capacity(named.len());
    for (n, t) in named {
        b.enter(Step::Name(n));
        let v = replay(b, t);
        b.exit();
        out.push((n.clone(), v?));
    }
    Ok(out)
}

/// Builds the owned [`Tree<Entry>`] of a [`Manifest`].
pub struct OwnedTree;

impl Build for OwnedTree {
    type Node = Tree<Entry>;
    const PARALLEL: bool = true;
    fn leaf(&self, e: Entry) -> std::result::Result<Tree<Entry>, String> {
        Ok(Tree::Leaf(e))
    }
    fn list(&self, items: Vec<Tree<Entry>>, tuple: bool) -> std::result::Result<Tree<Entry>, String> {
        Ok(if tuple { Tree::Tuple(items) } else { Tree::List(items) })
    }
    fn dict(&self, pairs: Vec<(Key, Tree<Entry>)>) -> std::result::Result<Tree<Entry>, String> {
        Ok(Tree::Dict(pairs))
    }
    fn record(
        &self,
        type_name: String,
        fields: Vec<(String, Tree<Entry>)>,
    ) -> std::result::Result<Tree<Entry>, String> {
        Ok(Tree::Record { type_name, fields })
    }
    fn custom(
        &self,
        type_name: String,
        data: Value,
        children: Vec<(String, Tree<Entry>)>,
    ) -> std::result::Result<Tree<Entry>, String> {
        Ok(Tree::Custom { type_name, data, children })
    }
    fn owned(&self, t: Tree<Entry>) -> std::result::Result<Tree<Entry>, String> {
        Ok(t)
    }
}

/// Parse with `builder`; `inline_checks` validates each leaf as it is read (against the packs,
/// which must come first).
fn parse_generic<B: Build>(
    bytes: &[u8],
    file: &str,
    builder: &B,
    split: bool,
    inline_checks: bool,
) -> Result<Parsed<B::Node>> {
    let path = RefCell::new(Vec::<PathSeg>::new());
    let packs = RefCell::new(None);
    let ctx = Ctx { path: &path, packs: inline_checks.then_some(&packs), file };
    let mut de = serde_json::Deserializer::from_slice(bytes);
    de.disable_recursion_limit();
    let res = TopSeed { ctx: &ctx, split: split && (B::PARALLEL || B::HELPER), b: builder }
        .deserialize(&mut de)
        .and_then(|m| de.end().map(|_| m));
    res.map_err(|e| {
        let p = path.borrow().iter().map(PathSeg::text).collect::<Vec<_>>().join("/");
        Error::manifest(file, if p.is_empty() { "<root>".to_string() } else { p }, e.to_string())
    })
}

/// What every node seed of one parse shares.
struct Ctx<'a> {
    /// The key path being parsed, to name the place of an error.
    path: &'a RefCell<Vec<PathSeg>>,
    /// With inline checks: the packs once read (`None` before `packs`).
    packs: Option<&'a RefCell<Option<Vec<PackInfo>>>>,
    file: &'a str,
}

impl Ctx<'_> {
    fn check_leaf<E: de::Error>(&self, e: &Entry) -> std::result::Result<(), E> {
        let Some(packs) = self.packs else { return Ok(()) };
        let packs = packs.borrow();
        let Some(packs) = packs.as_deref() else {
            return Err(E::custom("`packs` must come before `root` for a one-pass parse"));
        };
        validate_entry(packs, &KeyPath::root(), e, self.file).map_err(|err| E::custom(err.to_string()))
    }
}

struct TopSeed<'a, B> {
    ctx: &'a Ctx<'a>,
    split: bool,
    b: &'a B,
}

impl<'de, B: Build> DeserializeSeed<'de> for TopSeed<'_, B> {
    type Value = Parsed<B::Node>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> std::result::Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, B: Build> Visitor<'de> for TopSeed<'_, B> {
    type Value = Parsed<B::Node>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a treepack manifest object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Self::Value, A::Error> {
        let mut seen = HashSet::new();
        let (mut version, mut writer, mut metadata, mut packs, mut root) = (None, None, None, None, None);
        while let Some(k) = map.next_key::<String>()? {
            if !seen.insert(k.clone()) {
                return Err(de::Error::custom(format!("duplicate member `{k}`")));
            }
            match k.as_str() {
                "format" => {
                    let f: String = map.next_value()?;
                    if f != FORMAT_NAME {
                        return Err(de::Error::custom(format!("format is {f:?}, expected \"treepack\"")));
                    }
                }
                "version" => {
                    let v: (u16, u16) = map.next_value()?;
                    version = Some(v);
                }
                "writer" => writer = Some(map.next_value::<String>()?),
                "metadata" => metadata = Some(map.next_value::<Value>()?),
                "packs" => {
                    let list: Vec<PackInfo> = map
                        .next_value::<Vec<RawPack>>()?
                        .into_iter()
                        .map(|p| PackInfo { path: p.path, size: p.size })
                        .collect();
                    // Checked before any builder sees them: a builder may read from packs while
                    // it builds, so a path escaping the tree must never reach it.
                    for p in &list {
                        validate_pack_path(&p.path).map_err(|r| {
                            self.ctx.path.borrow_mut().push(PathSeg::Text("packs".into()));
                            de::Error::custom(r)
                        })?;
                    }
                    if let Some(slot) = self.ctx.packs {
                        *slot.borrow_mut() = Some(list.clone());
                    }
                    self.b.packs(&list);
                    packs = Some(list)
                }
                "root" => {
                    root =
                        Some(map.next_value_seed(NodeSeed { depth: 0, ctx: self.ctx, split: self.split, b: self.b })?)
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let version = version.ok_or_else(|| de::Error::custom("missing `version`"))?;
        let packs = packs.ok_or_else(|| de::Error::custom("missing `packs`"))?;
        if packs.len() > MAX_PACKS {
            return Err(de::Error::custom("too many packs"));
        }
        Ok(Parsed {
            version,
            writer: writer.unwrap_or_default(),
            metadata,
            packs,
            root: root.ok_or_else(|| de::Error::custom("missing `root`"))?,
        })
    }
}

#[derive(serde::Deserialize)]
struct RawPack {
    path: String,
    size: u64,
}

/// A chunk reference as written; its strings are borrowed from the input when they can be
/// (they always can in manifests we write: no escapes), so a blob costs no allocation.
#[derive(serde::Deserialize)]
struct RawChunk<'a> {
    pack: u32,
    offset: u64,
    length: u64,
    #[serde(borrow)]
    codec: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    blake3: std::borrow::Cow<'a, str>,
}

impl RawChunk<'_> {
    fn into_ref<E: de::Error>(self) -> std::result::Result<ChunkRef, E> {
        let codec = Codec::from_name(&self.codec)
            .ok_or_else(|| E::custom(format!("unknown codec {:?} (written by a newer treepack?)", self.codec)))?;
        let hash =
            Hash32::from_hex(&self.blake3).ok_or_else(|| E::custom("`blake3` must be 64 lowercase hex digits"))?;
        Ok(ChunkRef { pack: self.pack, offset: self.offset, length: self.length, codec, hash })
    }
}

struct NodeSeed<'a, B> {
    depth: usize,
    ctx: &'a Ctx<'a>,
    /// Parse the items of large containers near the root on several threads (see
    /// [`parse_items_split`]); only set for large manifests and parallel builders.
    split: bool,
    b: &'a B,
}

impl<B> Clone for NodeSeed<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<B> Copy for NodeSeed<'_, B> {}

impl<'a, B> NodeSeed<'a, B> {
    fn child(self) -> Self {
        NodeSeed { depth: self.depth + 1, ctx: self.ctx, split: self.split && self.depth + 1 < SPLIT_DEPTH, b: self.b }
    }
    /// The seed that parses a dict key (a small node, always built as an owned tree).
    fn key_seed(self) -> NodeSeed<'a, OwnedTree> {
        NodeSeed { depth: self.depth + 1, ctx: self.ctx, split: false, b: &OwnedTree }
    }
    fn check_depth<E: de::Error>(&self) -> std::result::Result<(), E> {
        if self.depth >= MAX_DEPTH {
            return Err(E::custom(format!("tree nested deeper than {MAX_DEPTH} levels")));
        }
        Ok(())
    }
}

impl<'de, B: Build> DeserializeSeed<'de> for NodeSeed<'_, B> {
    type Value = B::Node;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> std::result::Result<B::Node, D::Error> {
        crate::format::model::grow(|| d.deserialize_any(self))
    }
}

impl<B: Build> NodeSeed<'_, B> {
    fn leaf<E: de::Error>(&self, e: Entry) -> std::result::Result<B::Node, E> {
        self.ctx.check_leaf(&e)?;
        self.b.leaf(e).map_err(E::custom)
    }
}

fn parse_float_text<E: de::Error>(s: &str) -> std::result::Result<f64, E> {
    match s {
        "nan" => Ok(f64::NAN),
        "inf" => Ok(f64::INFINITY),
        "-inf" => Ok(f64::NEG_INFINITY),
        _ => {
            if let Some(hex) = s.strip_prefix("nan:") {
                if let Ok(bits) = u64::from_str_radix(hex, 16) {
                    let f = f64::from_bits(bits);
                    if hex.len() == 16 && f.is_nan() {
                        return Ok(f);
                    }
                }
            }
            Err(E::custom(format!("float string must be nan, inf, -inf or nan:<16 hex bits>, found {s:?}")))
        }
    }
}

fn value_float<E: de::Error>(v: &Value) -> std::result::Result<f64, E> {
    match v {
        Value::Number(n) => n.as_f64().ok_or_else(|| E::custom("bad float")),
        Value::String(s) => parse_float_text(s),
        _ => Err(E::custom("a float is a number or a string such as \"nan\"")),
    }
}

impl<'de, B: Build> Visitor<'de> for NodeSeed<'_, B> {
    type Value = B::Node;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a tree node")
    }
    fn visit_unit<E: de::Error>(self) -> std::result::Result<B::Node, E> {
        self.leaf(Entry::None)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> std::result::Result<B::Node, E> {
        self.leaf(Entry::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<B::Node, E> {
        self.leaf(Entry::Int(Int::Small(v)))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<B::Node, E> {
        self.leaf(Entry::Int(Int::from_big(v.into())))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<B::Node, E> {
        self.leaf(Entry::Float(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<B::Node, E> {
        self.leaf(Entry::Str(Stored::Inline(v.to_string())))
    }
    fn visit_string<E: de::Error>(self, v: String) -> std::result::Result<B::Node, E> {
        self.leaf(Entry::Str(Stored::Inline(v)))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> std::result::Result<B::Node, A::Error> {
        self.check_depth()?;
        let items = read_items(self, seq)?;
        self.b.list(items, false).map_err(de::Error::custom)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<B::Node, A::Error> {
        self.check_depth()?;
        if map.next_key_seed(MemberSeed)? != Some(Member::T) {
            return Err(de::Error::custom("a tagged node object must begin with its \"t\" member"));
        }
        let t = map.next_value_seed(TagSeed)?;
        match t {
            Tag::Tuple => {
                let mut items = None;
                while let Some(k) = map.next_key_seed(MemberSeed)? {
                    match k {
                        Member::Items => {
                            dup(&items, "items")?;
                            items = Some(map.next_value_seed(ItemsSeed(self))?);
                        }
                        _ => skip(&mut map)?,
                    }
                }
                let items = items.ok_or_else(|| de::Error::custom("tuple without `items`"))?;
                self.b.list(items, true).map_err(de::Error::custom)
            }
            Tag::Dict => {
                let mut items = None;
                while let Some(k) = map.next_key_seed(MemberSeed)? {
                    match k {
                        Member::Items => {
                            dup(&items, "items")?;
                            items = Some(map.next_value_seed(PairsSeed::<Key, B>::new(self))?);
                        }
                        _ => skip(&mut map)?,
                    }
                }
                let pairs = items.ok_or_else(|| de::Error::custom("dict without `items`"))?;
                self.b.dict(pairs).map_err(de::Error::custom)
            }
            Tag::Record | Tag::Custom => {
                let (mut ty, mut fields, mut data) = (None, None, None);
                let is_record = t == Tag::Record;
                let (list_member, list_name) =
                    if is_record { (Member::Fields, "fields") } else { (Member::Children, "children") };
                let name = if is_record { "record" } else { "custom" };
                while let Some(k) = map.next_key_seed(MemberSeed)? {
                    if k == Member::Type {
                        dup(&ty, "type")?;
                        ty = Some(map.next_value::<String>()?);
                    } else if k == list_member {
                        dup(&fields, list_name)?;
                        fields = Some(map.next_value_seed(PairsSeed::<String, B>::new(self))?);
                    } else if k == Member::Data && !is_record {
                        dup(&data, "data")?;
                        data = Some(map.next_value::<Value>()?);
                    } else {
                        skip(&mut map)?;
                    }
                }
                let type_name = ty.ok_or_else(|| de::Error::custom(format!("{name} without `type`")))?;
                let named: Vec<(String, B::Node)> = fields.unwrap_or_default();
                if is_record {
                    self.b.record(type_name, named).map_err(de::Error::custom)
                } else {
                    self.b.custom(type_name, data.unwrap_or(Value::Null), named).map_err(de::Error::custom)
                }
            }
            Tag::Unknown(other) => Err(de::Error::custom(format!(
                "unknown node type {other:?} (written by a newer treepack? see docs/format.md)"
            ))),
            leaf => {
                let e = tagged_leaf(leaf, &mut map)?;
                self.leaf(e)
            }
        }
    }
}

/// The entry of a tagged leaf node (`int`, `float`, `complex`, `str`, `bytes`, `array`) whose
/// `t` member has been read; the rest of its members are read from `map`. Containers' tags are
/// not leaves and get an error.
fn tagged_leaf<'de, A: MapAccess<'de>>(t: Tag, map: &mut A) -> std::result::Result<Entry, A::Error> {
    match t {
        Tag::Int => {
            let v: Value = expect_one(map, "v")?;
            let i = match &v {
                Value::String(s) => Int::parse(s),
                Value::Number(n) => n.as_i64().map(Int::Small).or_else(|| n.as_u64().map(|u| Int::from_big(u.into()))),
                _ => None,
            };
            Ok(Entry::Int(i.ok_or_else(|| de::Error::custom("int `v` must be a decimal string"))?))
        }
        Tag::Float => {
            let v: Value = expect_one(map, "v")?;
            Ok(Entry::Float(value_float(&v)?))
        }
        Tag::Complex => {
            let v: Vec<Value> = expect_one(map, "v")?;
            if v.len() != 2 {
                return Err(de::Error::custom("complex `v` must be [real, imag]"));
            }
            Ok(Entry::Complex(value_float(&v[0])?, value_float(&v[1])?))
        }
        Tag::Str | Tag::Bytes => {
            let is_str = t == Tag::Str;
            let (mut size, mut blob, mut b64) = (None, None, None);
            while let Some(k) = map.next_key_seed(MemberSeed)? {
                match k {
                    Member::Size => {
                        dup(&size, "size")?;
                        size = Some(map.next_value::<u64>()?);
                    }
                    Member::Blob => {
                        dup(&blob, "blob")?;
                        blob = Some(map.next_value::<RawChunk<'de>>()?.into_ref()?);
                    }
                    Member::B64 if !is_str => {
                        dup(&b64, "b64")?;
                        b64 = Some(map.next_value_seed(Base64Seed("b64"))?);
                    }
                    _ => skip(map)?,
                }
            }
            let entry = match (b64, size, blob) {
                (Some(b), None, None) => Entry::Bytes(Stored::Inline(b)),
                (None, Some(size), Some(chunk)) if is_str => Entry::Str(Stored::Blob { size, chunk }),
                (None, Some(size), Some(chunk)) => Entry::Bytes(Stored::Blob { size, chunk }),
                _ => {
                    let name = if is_str { "str" } else { "bytes" };
                    return Err(de::Error::custom(format!("{name} node needs `size` and `blob` (or `b64` for bytes)")));
                }
            };
            Ok(entry)
        }
        Tag::Array => {
            let a = parse_array(map)?;
            Ok(Entry::Array(Box::new(a)))
        }
        other => Err(de::Error::custom(format!("{other:?} is not a leaf node type"))),
    }
}

fn dup<T, E: de::Error>(slot: &Option<T>, name: &str) -> std::result::Result<(), E> {
    if slot.is_some() {
        return Err(E::custom(format!("duplicate member `{name}`")));
    }
    Ok(())
}

fn skip<'de, A: MapAccess<'de>>(map: &mut A) -> std::result::Result<(), A::Error> {
    map.next_value::<IgnoredAny>()?;
    Ok(())
}

/// The value of the single member `v` of a tagged node (other members are ignored).
fn expect_one<'de, A: MapAccess<'de>, T: serde::Deserialize<'de>>(
    map: &mut A,
    name: &str,
) -> std::result::Result<T, A::Error> {
    let mut out: Option<T> = None;
    while let Some(k) = map.next_key_seed(MemberSeed)? {
        if k == Member::V {
            dup(&out, name)?;
            out = Some(map.next_value()?);
        } else {
            skip(map)?;
        }
    }
    out.ok_or_else(|| de::Error::custom(format!("missing `{name}`")))
}

/// The member names of tagged node objects, matched without allocating (a 100k-leaf manifest
/// has several hundred thousand of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Member {
    T,
    Items,
    Type,
    Fields,
    Children,
    Data,
    V,
    Size,
    Blob,
    B64,
    Dtype,
    Shape,
    ChunkShape,
    Chunks,
    Preview,
    Other,
}

struct MemberSeed;

impl<'de> DeserializeSeed<'de> for MemberSeed {
    type Value = Member;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> std::result::Result<Member, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for MemberSeed {
    type Value = Member;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a member name")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Member, E> {
        Ok(match v {
            "t" => Member::T,
            "items" => Member::Items,
            "type" => Member::Type,
            "fields" => Member::Fields,
            "children" => Member::Children,
            "data" => Member::Data,
            "v" => Member::V,
            "size" => Member::Size,
            "blob" => Member::Blob,
            "b64" => Member::B64,
            "dtype" => Member::Dtype,
            "shape" => Member::Shape,
            "chunk_shape" => Member::ChunkShape,
            "chunks" => Member::Chunks,
            "preview" => Member::Preview,
            _ => Member::Other,
        })
    }
}

/// The value of a node's `t` member.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Tag {
    Tuple,
    Dict,
    Record,
    Custom,
    Int,
    Float,
    Complex,
    Str,
    Bytes,
    Array,
    Unknown(String),
}

struct TagSeed;

impl<'de> DeserializeSeed<'de> for TagSeed {
    type Value = Tag;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> std::result::Result<Tag, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for TagSeed {
    type Value = Tag;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a node type name")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Tag, E> {
        Ok(match v {
            "tuple" => Tag::Tuple,
            "dict" => Tag::Dict,
            "record" => Tag::Record,
            "custom" => Tag::Custom,
            "int" => Tag::Int,
            "float" => Tag::Float,
            "complex" => Tag::Complex,
            "str" => Tag::Str,
            "bytes" => Tag::Bytes,
            "array" => Tag::Array,
            other => Tag::Unknown(other.to_string()),
        })
    }
}

/// Base64 text decoded straight from the input (no intermediate `String`).
struct Base64Seed(&'static str);

impl<'de> DeserializeSeed<'de> for Base64Seed {
    type Value = Bytes;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> std::result::Result<Bytes, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Base64Seed {
    type Value = Bytes;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("base64 text")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Bytes, E> {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(v.as_bytes())
            .map_err(|e| E::custom(format!("bad base64 in `{}`: {e}", self.0)))?;
        Ok(Bytes::from(raw))
    }
}

/// A dtype: a name parsed straight from the input, or a structured dtype object.
struct DtypeSeed;

impl<'de> DeserializeSeed<'de> for DtypeSeed {
    type Value = DType;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> std::result::Result<DType, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for DtypeSeed {
    type Value = DType;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a dtype name or {\"struct\": [fields]}")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<DType, E> {
        DType::from_name(v).map_err(|e| E::custom(e.to_string()))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> std::result::Result<DType, A::Error> {
        let v = <Value as serde::Deserialize>::deserialize(de::value::MapAccessDeserializer::new(map))?;
        DType::from_json(&v).map_err(|e| de::Error::custom(e.to_string()))
    }
}

fn parse_array<'de, A: MapAccess<'de>>(map: &mut A) -> std::result::Result<ArrayEntry, A::Error> {
    let (mut dtype, mut shape, mut chunk_shape, mut chunks, mut data, mut preview) =
        (None, None, None, None, None, None);
    while let Some(k) = map.next_key_seed(MemberSeed)? {
        match k {
            Member::Dtype => {
                dup(&dtype, "dtype")?;
                dtype = Some(map.next_value_seed(DtypeSeed)?);
            }
            Member::Shape => {
                dup(&shape, "shape")?;
                shape = Some(map.next_value::<Vec<u64>>()?);
            }
            Member::ChunkShape => {
                dup(&chunk_shape, "chunk_shape")?;
                chunk_shape = Some(map.next_value::<Vec<u64>>()?);
            }
            Member::Chunks => {
                dup(&chunks, "chunks")?;
                let raw: Vec<RawChunk<'de>> = map.next_value()?;
                chunks = Some(raw.into_iter().map(RawChunk::into_ref).collect::<std::result::Result<Vec<_>, _>>()?);
            }
            Member::Data => {
                dup(&data, "data")?;
                data = Some(map.next_value_seed(Base64Seed("data"))?);
            }
            Member::Preview => {
                dup(&preview, "preview")?;
                preview = Some(map.next_value::<Value>()?);
            }
            _ => skip(map)?,
        }
    }
    let dtype = dtype.ok_or_else(|| de::Error::custom("array without `dtype`"))?;
    let shape = shape.ok_or_else(|| de::Error::custom("array without `shape`"))?;
    let storage = match (data, chunk_shape, chunks) {
        (Some(d), None, None) => ArrayStorage::Inline(d),
        (None, Some(cs), Some(c)) => ArrayStorage::Chunked { chunk_shape: cs, chunks: c },
        _ => return Err(de::Error::custom("array needs either `data` or both `chunk_shape` and `chunks`")),
    };
    Ok(ArrayEntry { dtype, shape, storage, preview })
}

struct ItemsSeed<'a, B>(NodeSeed<'a, B>);

impl<'de, B: Build> DeserializeSeed<'de> for ItemsSeed<'_, B> {
    type Value = Vec<B::Node>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> std::result::Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, B: Build> Visitor<'de> for ItemsSeed<'_, B> {
    type Value = Vec<B::Node>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of nodes")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> std::result::Result<Self::Value, A::Error> {
        read_items(self.0, seq)
    }
}

fn read_items<'de, A: SeqAccess<'de>, B: Build>(
    node: NodeSeed<'_, B>,
    mut seq: A,
) -> std::result::Result<Vec<B::Node>, A::Error> {
    if node.split && B::PARALLEL {
        let owned = parse_items_split(node, seq, |n, de| n.child().deserialize(de), true)?;
        return owned.into_iter().map(|t| node.b.owned(t).map_err(de::Error::custom)).collect();
    }
    if node.split {
        return parse_items_helped(
            node,
            seq,
            |i, n, de| {
                n.ctx.path.borrow_mut().push(PathSeg::Index(i));
                n.b.enter(Step::Index(i));
                let v = n.child().deserialize(de);
                n.b.exit();
                if v.is_ok() {
                    n.ctx.path.borrow_mut().pop();
                }
                v
            },
            |n, de| n.child().deserialize(de),
            |i, t: &Tree<Entry>| {
                node.b.enter(Step::Index(i));
                let v = replay(node.b, t);
                node.b.exit();
                v
            },
            true,
        );
    }
    let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
    loop {
        node.ctx.path.borrow_mut().push(PathSeg::Index(out.len()));
        node.b.enter(Step::Index(out.len()));
        let next = seq.next_element_seed(node.child());
        node.b.exit();
        match next? {
            Some(v) => {
                node.ctx.path.borrow_mut().pop();
                out.push(v)
            }
            None => {
                node.ctx.path.borrow_mut().pop();
                return Ok(out);
            }
        }
    }
}

/// Parse the items of a container: first only their extent (a fast scan that keeps borrowed
/// slices of the input), then each item on its own, in parallel when there are many. Big
/// manifests are mostly one or two huge containers near the root, so this spreads most of the
/// parse over all cores; the result is identical to the one-thread parse. An item that fails
/// reports its key path below the container (`indexed`: list items, whose index is their
/// segment; pairs name their key themselves) and the message without the item-relative line and
/// column.
fn parse_items_split<'de, A, T, F, B>(
    node: NodeSeed<'_, B>,
    mut seq: A,
    parse: F,
    indexed: bool,
) -> std::result::Result<Vec<T>, A::Error>
where
    A: SeqAccess<'de>,
    T: Send,
    F: for<'r> Fn(
            NodeSeed<'_, OwnedTree>,
            &mut serde_json::Deserializer<serde_json::de::StrRead<'r>>,
        ) -> serde_json::Result<T>
        + Sync,
{
    use rayon::prelude::*;
    // Items parsed apart build owned trees and are not checked inline (see `parse_generic`).
    debug_assert!(node.ctx.packs.is_none());
    let (depth, split, file) = (node.depth, node.split, node.ctx.file);
    let mut raws: Vec<&'de serde_json::value::RawValue> = Vec::new();
    while let Some(r) = seq.next_element::<&'de serde_json::value::RawValue>()? {
        raws.push(r);
    }
    let one = |i: usize, raw: &serde_json::value::RawValue| -> std::result::Result<T, (usize, Vec<PathSeg>, String)> {
        let path = RefCell::new(Vec::new());
        let ctx = Ctx { path: &path, packs: None, file };
        let mut de = serde_json::Deserializer::from_str(raw.get());
        de.disable_recursion_limit();
        let inner = NodeSeed { depth, ctx: &ctx, split: split && raws.len() < SPLIT_MIN_ITEMS, b: &OwnedTree };
        parse(inner, &mut de).and_then(|v| de.end().map(|_| v)).map_err(|e| (i, path.into_inner(), item_message(&e)))
    };
    let parsed: std::result::Result<Vec<T>, _> = if raws.len() >= SPLIT_MIN_ITEMS {
        crate::runtime::parallel(|| raws.par_iter().enumerate().map(|(i, r)| one(i, r)).collect())
    } else {
        raws.iter().enumerate().map(|(i, r)| one(i, r)).collect()
    };
    parsed.map_err(|(i, inner, msg)| {
        let mut p = node.ctx.path.borrow_mut();
        if indexed {
            p.push(PathSeg::Index(i));
        }
        p.extend(inner);
        de::Error::custom(msg)
    })
}

/// The message of an error in an item parsed on its own, without the item-relative line and
/// column (which would mislead: they count from the item's start).
fn item_message(e: &serde_json::Error) -> String {
    let msg = e.to_string();
    match msg.rsplit_once(" at line ") {
        Some((m, _)) => m.to_string(),
        None => msg,
    }
}

/// Items claimed at a time by either thread of a helped parse.
const HELP_BLOCK: usize = 32;

/// A block of items the helper thread parsed: its first index, and the owned items or the
/// failing item's index, key path below the container and message.
type HelpedBlock<T> = (usize, std::result::Result<Vec<T>, (usize, Vec<PathSeg>, String)>);

/// Parse the items of a container for a builder that must stay on this thread
/// ([`Build::HELPER`]: Python objects), on two cores. Once a container shows at least
/// `SPLIT_MIN_ITEMS` items, a helper thread starts; this thread goes on scanning the items'
/// extent, queueing them in blocks as it goes, and the helper parses queued blocks into owned
/// trees from the first one on. After the scan this thread takes blocks too, builds them
/// directly, and [`replay`]s the helper's blocks as they arrive (sending them back to be freed
/// where they were allocated). The builder's work (the Python objects) stays on one thread, most
/// of the parsing moves off it, and the split adapts to how slow the builder is. Every item is
/// checked exactly as in the one-thread parse (leaves inline, against the packs). Containers
/// with fewer items are parsed here item by item, with splitting allowed further down.
///
/// `direct` parses item `i` with the builder, `owned` parses an item into an owned tree,
/// `replay_one` builds item `i` from that tree; `indexed`: list items, whose index is their key
/// path segment (pairs name their key themselves).
fn parse_items_helped<'de, A, B, T, U, FD, FO, FR>(
    node: NodeSeed<'_, B>,
    mut seq: A,
    direct: FD,
    owned: FO,
    replay_one: FR,
    indexed: bool,
) -> std::result::Result<Vec<U>, A::Error>
where
    A: SeqAccess<'de>,
    B: Build,
    T: Send,
    FD: for<'r> Fn(
        usize,
        NodeSeed<'_, B>,
        &mut serde_json::Deserializer<serde_json::de::StrRead<'r>>,
    ) -> serde_json::Result<U>,
    FO: for<'r> Fn(
            NodeSeed<'_, OwnedTree>,
            &mut serde_json::Deserializer<serde_json::de::StrRead<'r>>,
        ) -> serde_json::Result<T>
        + Sync,
    FR: Fn(usize, &T) -> std::result::Result<U, String>,
{
    use serde_json::value::RawValue;
    use std::sync::{Condvar, Mutex, MutexGuard};
    let parse_here = |i: usize, raw: &RawValue, split: bool| -> std::result::Result<U, A::Error> {
        let mut de = serde_json::Deserializer::from_str(raw.get());
        de.disable_recursion_limit();
        let here = NodeSeed { depth: node.depth, ctx: node.ctx, split, b: node.b };
        direct(i, here, &mut de).and_then(|v| de.end().map(|_| v)).map_err(|e| de::Error::custom(item_message(&e)))
    };
    let mut first: Vec<&'de RawValue> = Vec::new();
    while first.len() < SPLIT_MIN_ITEMS {
        match seq.next_element::<&'de RawValue>()? {
            Some(r) => first.push(r),
            None => break,
        }
    }
    if first.len() < SPLIT_MIN_ITEMS {
        // A small container: only an item holding most of its bytes (a wrapper's payload) may
        // be split further down; scanning every mid-size item again would cost a second
        // tokenization of most of the manifest for nothing.
        let total: usize = first.iter().map(|r| r.get().len()).sum();
        return first
            .iter()
            .enumerate()
            .map(|(i, r)| parse_here(i, r, node.split && r.get().len() * 2 > total))
            .collect();
    }
    // The items of a big container are not split again (one helper per parse).
    if std::thread::available_parallelism().map_or(1, |p| p.get()) < 2 {
        let mut out = Vec::with_capacity(first.len());
        for (i, r) in first.iter().enumerate() {
            out.push(parse_here(i, r, false)?);
        }
        while let Some(r) = seq.next_element::<&'de RawValue>()? {
            out.push(parse_here(out.len(), r, false)?);
        }
        return Ok(out);
    }

    /// Blocks of scanned items waiting for a thread, by first index.
    struct Queue<'de> {
        jobs: std::collections::VecDeque<(usize, Vec<&'de RawValue>)>,
        /// The scan is over: no more jobs will come.
        scanned: bool,
        /// This thread failed: the helper stops at its next job.
        stop: bool,
        /// The helper waits for a job (only then is a push worth a wake-up call).
        waiting: bool,
    }
    let queue = Mutex::new(Queue { jobs: Default::default(), scanned: false, stop: false, waiting: false });
    let ready = Condvar::new();
    // A panicking helper is re-raised when the scope joins it; the queue stays usable until then.
    let lock = || -> MutexGuard<'_, Queue<'de>> { queue.lock().unwrap_or_else(|p| p.into_inner()) };
    let push = |start: usize, block: Vec<&'de RawValue>| {
        let mut q = lock();
        q.jobs.push_back((start, block));
        let wake = q.waiting;
        drop(q);
        if wake {
            ready.notify_one();
        }
    };
    let finish = |stop: bool| {
        let mut q = lock();
        q.scanned = true;
        q.stop |= stop;
        drop(q);
        ready.notify_all();
    };
    let (depth, file) = (node.depth, node.ctx.file);
    // The helper checks leaves against its own copy of the packs.
    let packs: Option<Option<Vec<PackInfo>>> = node.ctx.packs.map(|p| p.borrow().clone());
    /// Ends the queue when dropped: whichever way this thread leaves the scope (an error, even
    /// a panic), the helper stops waiting for jobs, so the scope can join it.
    struct EndQueue<F: Fn(bool)>(F);
    impl<F: Fn(bool)> Drop for EndQueue<F> {
        fn drop(&mut self) {
            (self.0)(true);
        }
    }
    std::thread::scope(|s| {
        let _end = EndQueue(&finish);
        let (tx, rx) = std::sync::mpsc::channel::<HelpedBlock<T>>();
        // Replayed blocks go back to be freed by the thread that allocated them (a free from
        // another thread is several times slower, and this thread is the busy one).
        let (back_tx, back_rx) = std::sync::mpsc::channel::<Vec<T>>();
        let (owned, queue, ready) = (&owned, &queue, &ready);
        let helper = move || {
            let packs = packs.map(RefCell::new);
            loop {
                while let Ok(done) = back_rx.try_recv() {
                    drop(done);
                }
                let job = {
                    let mut q = queue.lock().unwrap_or_else(|p| p.into_inner());
                    loop {
                        if q.stop {
                            break None;
                        }
                        if let Some(j) = q.jobs.pop_front() {
                            break Some(j);
                        }
                        if q.scanned {
                            break None;
                        }
                        q.waiting = true;
                        q = ready.wait(q).unwrap_or_else(|p| p.into_inner());
                        q.waiting = false;
                    }
                };
                let Some((start, raws)) = job else {
                    drop(tx);
                    for done in back_rx.iter() {
                        drop(done);
                    }
                    return;
                };
                let mut block = Vec::with_capacity(raws.len());
                for (i, raw) in (start..).zip(raws) {
                    let path = RefCell::new(Vec::new());
                    let ctx = Ctx { path: &path, packs: packs.as_ref(), file };
                    let mut de = serde_json::Deserializer::from_str(raw.get());
                    de.disable_recursion_limit();
                    let seed = NodeSeed { depth, ctx: &ctx, split: false, b: &OwnedTree };
                    match owned(seed, &mut de).and_then(|v| de.end().map(|_| v)) {
                        Ok(t) => block.push(t),
                        Err(e) => {
                            let _ = tx.send((start, Err((i, path.into_inner(), item_message(&e)))));
                            return;
                        }
                    }
                }
                if tx.send((start, Ok(block))).is_err() {
                    return;
                }
            }
        };
        // If no thread can be started, this thread takes every block itself.
        let _ = std::thread::Builder::new().name("treepack-parse".into()).spawn_scoped(s, helper);
        // Queue what is scanned so far, then the rest as it is scanned.
        let mut n = 0;
        for block in first.chunks(HELP_BLOCK) {
            push(n, block.to_vec());
            n += block.len();
        }
        let mut scan = || -> std::result::Result<(), A::Error> {
            let mut block = Vec::with_capacity(HELP_BLOCK);
            while let Some(r) = seq.next_element::<&'de RawValue>()? {
                block.push(r);
                if block.len() == HELP_BLOCK {
                    push(n, std::mem::replace(&mut block, Vec::with_capacity(HELP_BLOCK)));
                    n += HELP_BLOCK;
                }
            }
            if !block.is_empty() {
                n += block.len();
                push(n - block.len(), block);
            }
            Ok(())
        };
        let scanned = scan();
        finish(scanned.is_err());
        scanned?;
        let mut out: Vec<Option<U>> = Vec::with_capacity(n);
        out.resize_with(n, || None);
        let take = |(start, block): HelpedBlock<T>, out: &mut Vec<Option<U>>| -> std::result::Result<(), A::Error> {
            match block {
                Ok(items) => {
                    for (j, t) in items.iter().enumerate() {
                        out[start + j] = Some(replay_one(start + j, t).map_err(de::Error::custom)?);
                    }
                    let _ = back_tx.send(items);
                    Ok(())
                }
                Err((i, inner, msg)) => {
                    let mut p = node.ctx.path.borrow_mut();
                    if indexed {
                        p.push(PathSeg::Index(i));
                    }
                    p.extend(inner);
                    Err(de::Error::custom(msg))
                }
            }
        };
        let mut run = || -> std::result::Result<(), A::Error> {
            loop {
                while let Ok(b) = rx.try_recv() {
                    take(b, &mut out)?;
                }
                let Some((start, raws)) = lock().jobs.pop_front() else { break };
                for (i, raw) in (start..).zip(raws) {
                    out[i] = Some(parse_here(i, raw, false)?);
                }
            }
            // The helper's last blocks (the channel closes when it ends).
            for b in rx.iter() {
                take(b, &mut out)?;
            }
            Ok(())
        };
        let res = run();
        if res.is_err() {
            finish(true); // the helper stops at its next block
        }
        drop(back_tx);
        res?;
        out.into_iter().map(|u| u.ok_or_else(|| de::Error::custom("an item was not parsed"))).collect()
    })
}

/// One step of the key path being parsed, kept only to name the place of an error (indices are
/// not formatted unless an error happens).
enum PathSeg {
    Index(usize),
    Text(String),
    /// A pair's key whose text is filled in only if an error happens below it.
    Pending,
}

impl PathSeg {
    fn text(&self) -> String {
        match self {
            PathSeg::Index(i) => i.to_string(),
            PathSeg::Text(t) => t.clone(),
            PathSeg::Pending => "?".into(),
        }
    }
}

/// The first item of a `[key, node]` pair: a dict key, or a record field / custom child name.
trait PairKey: Sized + Send + Clone {
    /// Read the key as the next element of the pair.
    fn read<'de, A: SeqAccess<'de>, B>(seq: &mut A, node: NodeSeed<'_, B>) -> std::result::Result<Self, A::Error>;
    /// The step this key makes in a key path.
    fn step(&self) -> Step<'_>;
    /// The escaped key-path segment text (only computed for errors and typed keys).
    fn text(&self) -> String;
    /// The key itself when it is a string. Two string keys name the same path exactly when the
    /// strings are equal, and never the same path as a typed key (whose text starts with `~` and
    /// a letter no escaped string uses), so duplicates can be found without escaping anything.
    fn plain(&self) -> Option<&str>;
}

impl PairKey for Key {
    fn read<'de, A: SeqAccess<'de>, B>(seq: &mut A, node: NodeSeed<'_, B>) -> std::result::Result<Self, A::Error> {
        let k = seq
            .next_element_seed(KeySeed(node.key_seed()))?
            .ok_or_else(|| de::Error::custom("empty pair: expected [key, node]"))?;
        Ok(k)
    }
    fn step(&self) -> Step<'_> {
        Step::Key(self)
    }
    fn text(&self) -> String {
        crate::format::keypath::key_segment_text(self)
    }
    fn plain(&self) -> Option<&str> {
        match self {
            Key::Str(s) => Some(s),
            _ => None,
        }
    }
}

impl PairKey for String {
    fn read<'de, A: SeqAccess<'de>, B>(seq: &mut A, _node: NodeSeed<'_, B>) -> std::result::Result<Self, A::Error> {
        seq.next_element::<String>()?.ok_or_else(|| de::Error::custom("empty pair: expected [name, node]"))
    }
    fn step(&self) -> Step<'_> {
        Step::Name(self)
    }
    fn text(&self) -> String {
        crate::format::keypath::name_segment_text(self)
    }
    fn plain(&self) -> Option<&str> {
        Some(self)
    }
}

struct PairsSeed<'a, K, B> {
    node: NodeSeed<'a, B>,
    _key: std::marker::PhantomData<K>,
}

impl<'a, K, B> PairsSeed<'a, K, B> {
    fn new(node: NodeSeed<'a, B>) -> Self {
        PairsSeed { node, _key: std::marker::PhantomData }
    }
}

impl<'de, K: PairKey, B: Build> DeserializeSeed<'de> for PairsSeed<'_, K, B> {
    type Value = Vec<(K, B::Node)>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> std::result::Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, K: PairKey, B: Build> Visitor<'de> for PairsSeed<'_, K, B> {
    type Value = Vec<(K, B::Node)>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of [key, node] pairs")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Self::Value, A::Error> {
        // A dict at the root is read directly, its members' containers being the ones worth
        // splitting: roots are mostly a few named parts (`params`, `opt_state`, `step`), and
        // scanning one first would tokenize the whole manifest twice.
        let helped = self.node.split && !B::PARALLEL && self.node.depth > 0;
        let out: Vec<(K, B::Node)> = if helped {
            let b = self.node.b;
            parse_items_helped(
                self.node,
                seq,
                |_, n, de| PairSeed::<K, B> { node: n, _key: std::marker::PhantomData }.deserialize(de),
                |n, de| PairSeed::<K, OwnedTree> { node: n, _key: std::marker::PhantomData }.deserialize(de),
                |_, (k, t): &(K, Tree<Entry>)| {
                    b.enter(k.step());
                    let v = replay(b, t);
                    b.exit();
                    v.map(|v| (k.clone(), v))
                },
                false,
            )?
        } else if self.node.split && B::PARALLEL {
            let owned = parse_items_split(
                self.node,
                seq,
                |n, de| PairSeed::<K, OwnedTree> { node: n, _key: std::marker::PhantomData }.deserialize(de),
                // A pair that fails names its key itself (first segment of its path).
                false,
            )?;
            let b = self.node.b;
            owned
                .into_iter()
                .map(|(k, t)| b.owned(t).map(|v| (k, v)))
                .collect::<std::result::Result<_, _>>()
                .map_err(de::Error::custom)?
        } else {
            let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
            while let Some(pair) =
                seq.next_element_seed(PairSeed::<K, B> { node: self.node, _key: std::marker::PhantomData })?
            {
                out.push(pair);
            }
            out
        };
        if let Some(i) = first_duplicate(&out) {
            let text = out[i].0.text();
            let msg = format!("duplicate key `{text}`");
            self.node.ctx.path.borrow_mut().push(PathSeg::Text(text));
            return Err(de::Error::custom(msg));
        }
        Ok(out)
    }
}

/// Index of the first dict item whose key names the same path as an earlier one (writers check
/// with this what readers refuse).
pub(crate) fn first_duplicate_key<V>(pairs: &[(Key, V)]) -> Option<usize> {
    first_duplicate(pairs)
}

/// Index of the first record field or custom child whose name repeats an earlier one.
pub(crate) fn first_duplicate_name<V>(named: &[(String, V)]) -> Option<usize> {
    first_duplicate(named)
}

/// Index of the first pair whose key names the same path as an earlier one. Small containers
/// (the common case) are compared pairwise; large ones through a hash set of borrowed keys.
fn first_duplicate<K: PairKey, V>(pairs: &[(K, V)]) -> Option<usize> {
    if pairs.len() < 2 {
        return None;
    }
    if pairs.len() <= 16 {
        // All string keys (the usual case): compare them in place, allocating nothing.
        let mut plain = [""; 16];
        if pairs.iter().zip(plain.iter_mut()).all(|((k, _), slot)| k.plain().map(|p| *slot = p).is_some()) {
            let plain = &plain[..pairs.len()];
            return (1..plain.len()).find(|&i| plain[..i].contains(&plain[i]));
        }
        let texts: Vec<std::borrow::Cow<'_, str>> = pairs
            .iter()
            .map(|(k, _)| k.plain().map_or_else(|| std::borrow::Cow::Owned(k.text()), std::borrow::Cow::Borrowed))
            .collect();
        return (1..texts.len()).find(|&i| texts[..i].contains(&texts[i]));
    }
    // SipHash with a random key: keys come from untrusted files, so no hash flooding.
    let mut plain: HashSet<&str> = HashSet::with_capacity(pairs.len());
    let mut typed: HashSet<String> = HashSet::new();
    pairs.iter().position(|(k, _)| match k.plain() {
        Some(p) => !plain.insert(p),
        None => !typed.insert(k.text()),
    })
}

struct PairSeed<'a, K, B> {
    node: NodeSeed<'a, B>,
    _key: std::marker::PhantomData<K>,
}

impl<'de, K: PairKey, B: Build> DeserializeSeed<'de> for PairSeed<'_, K, B> {
    type Value = (K, B::Node);
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> std::result::Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, K: PairKey, B: Build> Visitor<'de> for PairSeed<'_, K, B> {
    type Value = (K, B::Node);
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a [key, node] pair")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Self::Value, A::Error> {
        let key = K::read(&mut seq, self.node)?;
        // The key's path text is only formatted if parsing the value fails.
        let at = {
            let mut p = self.node.ctx.path.borrow_mut();
            p.push(PathSeg::Pending);
            p.len() - 1
        };
        let name_here = |e: A::Error| {
            if let Some(seg) = self.node.ctx.path.borrow_mut().get_mut(at) {
                *seg = PathSeg::Text(key.text());
            }
            e
        };
        self.node.b.enter(key.step());
        let v = seq.next_element_seed(self.node.child());
        self.node.b.exit();
        let v = v
            .and_then(|v| v.ok_or_else(|| de::Error::custom("pair without a value: expected [key, node]")))
            .map_err(name_here)?;
        if seq.next_element::<IgnoredAny>().map_err(name_here)?.is_some() {
            return Err(name_here(de::Error::custom("a pair must have exactly two items")));
        }
        self.node.ctx.path.borrow_mut().pop();
        Ok((key, v))
    }
}

/// A dict key. String keys (nearly all of them) become `Key::Str` straight from the text; the
/// others are read as the nodes they are written as, then converted (`entry_to_key`).
struct KeySeed<'a>(NodeSeed<'a, OwnedTree>);

impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
    type Value = Key;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> std::result::Result<Key, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for KeySeed<'_> {
    type Value = Key;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a dict key")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Key, E> {
        Ok(Key::Str(v.to_string()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> std::result::Result<Key, E> {
        Ok(Key::Str(v))
    }
    fn visit_unit<E: de::Error>(self) -> std::result::Result<Key, E> {
        self.0.visit_unit().and_then(entry_to_key)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> std::result::Result<Key, E> {
        self.0.visit_bool(v).and_then(entry_to_key)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<Key, E> {
        self.0.visit_i64(v).and_then(entry_to_key)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<Key, E> {
        self.0.visit_u64(v).and_then(entry_to_key)
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<Key, E> {
        self.0.visit_f64(v).and_then(entry_to_key)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> std::result::Result<Key, A::Error> {
        crate::format::model::grow(|| self.0.visit_seq(seq)).and_then(entry_to_key)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> std::result::Result<Key, A::Error> {
        crate::format::model::grow(|| self.0.visit_map(map)).and_then(entry_to_key)
    }
}

fn entry_to_key<E: de::Error>(t: Tree<Entry>) -> std::result::Result<Key, E> {
    Ok(match t {
        Tree::Leaf(Entry::None) => Key::None,
        Tree::Leaf(Entry::Bool(b)) => Key::Bool(b),
        Tree::Leaf(Entry::Int(i)) => Key::Int(i),
        Tree::Leaf(Entry::Float(f)) => Key::Float(f),
        Tree::Leaf(Entry::Str(Stored::Inline(s))) => Key::Str(s),
        Tree::Tuple(items) => Key::Tuple(items.into_iter().map(entry_to_key).collect::<std::result::Result<_, E>>()?),
        other => {
            return Err(E::custom(format!(
                "a dict key must be null, bool, int, float, an inline str or a tuple of these, found {}",
                other.container_kind()
            )))
        }
    })
}

// ---------------------------------------------------------------- validation

/// Check everything the parser cannot: pack names, chunk bounds, sizes and grid consistency.
///
/// # Errors
/// [`Error::InvalidManifest`] or [`Error::OutOfBounds`] naming the key path.
pub fn validate(m: &Manifest, file: &str) -> Result<()> {
    if m.version.0 != VERSION_MAJOR {
        return Err(Error::UnsupportedVersion {
            file: file.into(),
            found: format!("{}.{}", m.version.0, m.version.1),
            supported: VERSION_MAJOR,
        });
    }
    for p in &m.packs {
        validate_pack_path(&p.path).map_err(|r| Error::manifest(file, "packs", r))?;
    }
    // Fast pass without key paths (building a path per leaf costs more than the checks); only if
    // it finds a problem does the second pass run with paths, to name where the problem is.
    let root_path = KeyPath::root();
    let mut bad = false;
    m.root.for_each_leaf_unpathed(&mut |e| {
        if !bad && validate_entry(&m.packs, &root_path, e, file).is_err() {
            bad = true;
        }
    });
    if !bad {
        return Ok(());
    }
    let mut err: Option<Error> = None;
    m.root.for_each_leaf(&mut |path, e| {
        if err.is_none() {
            if let Err(e) = validate_entry(&m.packs, path, e, file) {
                err = Some(e);
            }
        }
    });
    match err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Pack paths are relative, `/`-separated, made of `[A-Za-z0-9._-]`, with no `.`/`..` segments,
/// or exactly `.` (the single file itself).
pub fn validate_pack_path(p: &str) -> std::result::Result<(), String> {
    if p == "." {
        return Ok(());
    }
    let ok = !p.is_empty()
        && p.len() <= 512
        && p.split('/').all(|seg| {
            !seg.is_empty()
                && seg != "."
                && seg != ".."
                && seg.bytes().all(|c| c.is_ascii_alphanumeric() || b"._-".contains(&c))
        });
    if ok {
        Ok(())
    } else {
        Err(format!("pack path {p:?} is not a safe relative path (letters, digits, `._-`, `/`; no `..`)"))
    }
}

fn validate_chunk(
    packs: &[PackInfo],
    c: &ChunkRef,
    expect_len: u64,
    path: &KeyPath,
    i: usize,
    file: &str,
) -> Result<()> {
    let key = || path.to_string();
    let pack = packs.get(c.pack as usize).ok_or_else(|| Error::OutOfBounds {
        file: file.into(),
        key: key(),
        reason: format!("chunk {i} names pack {} but the manifest lists {} packs", c.pack, packs.len()),
    })?;
    let end = c.offset.checked_add(c.length);
    if end.is_none_or(|e| e > pack.size) {
        return Err(Error::OutOfBounds {
            file: file.into(),
            key: key(),
            reason: format!(
                "chunk {i} spans bytes {}..+{} but pack `{}` has {} bytes",
                c.offset, c.length, pack.path, pack.size
            ),
        });
    }
    if c.codec == Codec::Raw && c.length != expect_len {
        return Err(Error::manifest(
            file,
            key(),
            format!("chunk {i} stores {} bytes but its region needs {expect_len} (shape × itemsize)", c.length),
        ));
    }
    Ok(())
}

fn validate_entry(packs: &[PackInfo], path: &KeyPath, e: &Entry, file: &str) -> Result<()> {
    let key = || path.to_string();
    match e {
        Entry::Str(Stored::Blob { size, chunk }) | Entry::Bytes(Stored::Blob { size, chunk }) => {
            validate_chunk(packs, chunk, *size, path, 0, file)
        }
        Entry::Array(a) => {
            if a.shape.len() > MAX_NDIM {
                return Err(Error::manifest(file, key(), format!("{} dimensions (limit {MAX_NDIM})", a.shape.len())));
            }
            let nbytes = shape_len(&a.shape).and_then(|n| n.checked_mul(a.dtype.itemsize()));
            let Some(nbytes) = nbytes else {
                return Err(Error::manifest(file, key(), format!("shape {:?} overflows 64-bit byte counts", a.shape)));
            };
            match &a.storage {
                ArrayStorage::Inline(d) => {
                    if d.len() as u64 != nbytes {
                        return Err(Error::manifest(
                            file,
                            key(),
                            format!("inline data has {} bytes but dtype × shape needs {nbytes}", d.len()),
                        ));
                    }
                }
                ArrayStorage::Chunked { chunk_shape, chunks } => {
                    let grid = ChunkGrid::new(a.shape.clone(), chunk_shape.clone())
                        .map_err(|r| Error::manifest(file, key(), r))?;
                    let n = grid.num_chunks();
                    if n != Some(chunks.len() as u64) {
                        return Err(Error::manifest(
                            file,
                            key(),
                            format!(
                                "the chunk grid has {} chunks but {} are listed",
                                n.map_or("2^64+".into(), |n| n.to_string()),
                                chunks.len()
                            ),
                        ));
                    }
                    for (i, c) in chunks.iter().enumerate() {
                        let (_, extent) = grid.chunk_region(i as u64);
                        let len = shape_len(&extent).unwrap_or(u64::MAX).saturating_mul(a.dtype.itemsize());
                        validate_chunk(packs, c, len, path, i, file)?;
                    }
                }
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn sample() -> Manifest {
        let chunk = ChunkRef { pack: 0, offset: 0, length: 8, codec: Codec::Raw, hash: Hash32::of(&[0u8; 8]) };
        Manifest {
            version: (1, 0),
            writer: "test".into(),
            metadata: Some(serde_json::json!({"step": 3})),
            packs: vec![PackInfo { path: "packs/a-0.tpp".into(), size: 64 }],
            root: Tree::Dict(vec![
                (Key::Str("a".into()), Tree::Leaf(Entry::Int(Int::Small(1)))),
                (
                    Key::Int(Int::Small(7)),
                    Tree::List(vec![Tree::Leaf(Entry::Float(-0.0)), Tree::Leaf(Entry::Float(f64::NAN))]),
                ),
                (
                    Key::Tuple(vec![Key::None, Key::Bool(true)]),
                    Tree::Tuple(vec![Tree::Leaf(Entry::Str(Stored::Inline("x\"\n".into())))]),
                ),
                (
                    Key::Str("w".into()),
                    Tree::Leaf(Entry::Array(Box::new(ArrayEntry {
                        dtype: DType::F32,
                        shape: vec![2],
                        storage: ArrayStorage::Chunked { chunk_shape: vec![2], chunks: vec![chunk] },
                        preview: None,
                    }))),
                ),
            ]),
        }
    }

    /// A manifest over 1 MiB: a root list of many records whose second level holds a big dict,
    /// so both list and dict items take the split (parallel) parse.
    pub(super) fn big(keyed: bool) -> Manifest {
        let mut m = sample();
        let one = m.root.clone();
        let items: Vec<Tree<Entry>> = (0..3300)
            .map(|i| match i {
                7 => Tree::Dict(
                    (0..2000).map(|j| (Key::Str(format!("k{j}")), Tree::Leaf(Entry::Int(Int::Small(j))))).collect(),
                ),
                _ => one.clone(),
            })
            .collect();
        m.root = if keyed {
            // W2's shape: a root dict with one member holding a big dict.
            let named = items.into_iter().enumerate().map(|(i, t)| (Key::Str(format!("p{i}")), t)).collect();
            Tree::Dict(vec![(Key::Str("opt".into()), Tree::Dict(named))])
        } else {
            Tree::List(items)
        };
        m
    }

    /// The spec gives the trailer's length; it said 88 bytes until session 12 (it is 86).
    #[test]
    fn the_spec_states_the_hash_trailer_length() {
        assert_eq!(HASH_TRAILER_LEN, 86);
        let spec = include_str!("../../../../../docs/format.md");
        assert!(spec.contains("(86 bytes in all)") && spec.contains("last 86 bytes"));
        let sealed = seal(b"{}");
        assert_eq!(sealed.len() - 2, HASH_TRAILER_LEN);
    }

    #[test]
    fn one_pass_build_equals_decode_and_checks_every_leaf() {
        for keyed in [false, true] {
            let bytes = encode(&big(keyed), &serde_json::json!({}));
            let p = build(&bytes, "t", &OwnedTree).unwrap();
            let m =
                Manifest { version: p.version, writer: p.writer, metadata: p.metadata, packs: p.packs, root: p.root };
            // Compared as encoded bytes: the sample holds a NaN, which `==` never equals.
            assert!(encode(&m, &serde_json::json!({})) == bytes, "one-pass parse differs");
        }
        // A chunk past the end of its pack: `decode` finds it in its validation pass, `build`
        // while reading the leaf.
        let mut m = sample();
        m.packs[0].size = 4;
        let bytes = encode(&m, &serde_json::json!({}));
        assert!(matches!(decode(&bytes, "t"), Err(Error::OutOfBounds { .. })));
        let e = build(&bytes, "t", &OwnedTree).unwrap_err().to_string();
        assert!(e.contains("spans bytes"), "{e}");
    }

    /// A builder that must never be shown the packs it is given.
    struct NoPacks;
    impl Build for NoPacks {
        type Node = ();
        fn leaf(&self, _e: Entry) -> std::result::Result<(), String> {
            Ok(())
        }
        fn list(&self, _i: Vec<()>, _t: bool) -> std::result::Result<(), String> {
            Ok(())
        }
        fn dict(&self, _p: Vec<(Key, ())>) -> std::result::Result<(), String> {
            Ok(())
        }
        fn record(&self, _n: String, _f: Vec<(String, ())>) -> std::result::Result<(), String> {
            Ok(())
        }
        fn custom(&self, _n: String, _d: Value, _c: Vec<(String, ())>) -> std::result::Result<(), String> {
            Ok(())
        }
        fn packs(&self, packs: &[PackInfo]) {
            panic!("a builder was shown unchecked packs: {packs:?}");
        }
    }

    #[test]
    fn builders_never_see_a_pack_path_that_escapes_the_tree() {
        let mut m = sample();
        m.packs[0].path = "../../etc/passwd".into();
        let bytes = encode(&m, &serde_json::json!({}));
        match build(&bytes, "t", &NoPacks) {
            Err(Error::InvalidManifest { key, reason, .. }) => {
                assert_eq!(key, "packs");
                assert!(reason.contains("not a safe relative path"), "{reason}");
            }
            other => panic!("expected InvalidManifest, got {other:?}"),
        }
    }

    #[test]
    fn split_parse_equals_the_one_thread_parse() {
        for keyed in [false, true] {
            let bytes = encode(&big(keyed), &serde_json::json!({}));
            assert!(bytes.len() >= SPLIT_MIN_BYTES, "{}", bytes.len());
            let a = parse_with(&bytes, "t", true).unwrap();
            let b = parse_with(&bytes, "t", false).unwrap();
            assert_eq!(encode(&a, &serde_json::json!({})), bytes);
            assert_eq!(encode(&b, &serde_json::json!({})), bytes);
        }
    }

    thread_local! {
        /// Leaves handed over by `replay` on this thread (shows a helped parse really helped).
        pub(super) static REPLAYED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    /// A builder that must stay on its thread ([`Build::HELPER`]); it builds the owned tree and
    /// notes each leaf's key path as `enter`/`exit` give it.
    struct Helped {
        thread: std::thread::ThreadId,
        path: RefCell<Vec<String>>,
        leaves: RefCell<Vec<String>>,
    }
    impl Helped {
        fn new() -> Helped {
            Helped { thread: std::thread::current().id(), path: RefCell::default(), leaves: RefCell::default() }
        }
        fn here(&self) {
            assert_eq!(std::thread::current().id(), self.thread, "a HELPER builder was called off its thread");
        }
    }
    impl Build for Helped {
        type Node = Tree<Entry>;
        const HELPER: bool = true;
        fn leaf(&self, e: Entry) -> std::result::Result<Tree<Entry>, String> {
            self.here();
            self.leaves.borrow_mut().push(self.path.borrow().join("/"));
            OwnedTree.leaf(e)
        }
        fn list(&self, items: Vec<Tree<Entry>>, tuple: bool) -> std::result::Result<Tree<Entry>, String> {
            self.here();
            OwnedTree.list(items, tuple)
        }
        fn dict(&self, pairs: Vec<(Key, Tree<Entry>)>) -> std::result::Result<Tree<Entry>, String> {
            self.here();
            OwnedTree.dict(pairs)
        }
        fn record(&self, n: String, f: Vec<(String, Tree<Entry>)>) -> std::result::Result<Tree<Entry>, String> {
            self.here();
            OwnedTree.record(n, f)
        }
        fn custom(
            &self,
            n: String,
            d: Value,
            c: Vec<(String, Tree<Entry>)>,
        ) -> std::result::Result<Tree<Entry>, String> {
            self.here();
            OwnedTree.custom(n, d, c)
        }
        fn enter(&self, step: Step<'_>) {
            let mut t = String::new();
            crate::format::keypath::push_step_text(&mut t, &step);
            self.path.borrow_mut().push(t);
        }
        fn exit(&self) {
            self.path.borrow_mut().pop();
        }
    }

    /// `text` (an edited manifest) with its trailing hash made right again.
    fn rehash(text: &[u8]) -> Vec<u8> {
        let body = &text[..text.len() - HASH_TRAILER_LEN];
        let mut out = body.to_vec();
        out.extend_from_slice(format!("{HASH_PREFIX}{}{HASH_SUFFIX}", Hash32::of(body).to_hex()).as_bytes());
        out
    }

    #[test]
    fn helped_build_equals_the_one_thread_build() {
        // The big container at the root, one level down in a root dict, and as the dominant
        // item of a small root list (the only item of a small container that is split further).
        let mut wrapped = big(true);
        let Tree::Dict(mut opt) = wrapped.root else { unreachable!("big(true) is a dict") };
        let payload = opt.pop().map(|(_, t)| t).unwrap_or(Tree::Leaf(Entry::None));
        wrapped.root = Tree::List(vec![Tree::Leaf(Entry::Int(Int::Small(1))), payload]);
        for m in [big(false), big(true), wrapped] {
            let bytes = encode(&m, &serde_json::json!({}));
            assert!(bytes.len() >= SPLIT_MIN_BYTES, "{}", bytes.len());
            let (one, helped) = (Helped::new(), Helped::new());
            let a = build_one_thread(&bytes, "t", &one).unwrap();
            let before = REPLAYED.with(|n| n.get());
            let b = build(&bytes, "t", &helped).unwrap();
            if std::thread::available_parallelism().map_or(1, |p| p.get()) > 1 {
                assert!(REPLAYED.with(|n| n.get()) > before, "the helper thread parsed nothing");
            }
            for p in [a, b] {
                let m = Manifest {
                    version: p.version,
                    writer: p.writer,
                    metadata: p.metadata,
                    packs: p.packs,
                    root: p.root,
                };
                assert!(encode(&m, &serde_json::json!({})) == bytes, "helped parse differs");
            }
            // The same key paths, each seen once (blocks may be built out of order).
            let (mut x, mut y) = (one.leaves.into_inner(), helped.leaves.into_inner());
            assert!(x.len() > 10_000 && x.iter().any(|p| p.contains("/k1999")), "{}", x.len());
            x.sort();
            y.sort();
            assert_eq!(x, y);
        }
    }

    #[test]
    fn helped_build_refuses_what_the_one_thread_build_refuses() {
        for keyed in [false, true] {
            let text = String::from_utf8(encode(&big(keyed), &serde_json::json!({}))).unwrap();
            let damaged = [
                // a bad dtype deep inside a late item
                (text.rmatch_indices("\"float32\"").nth(100).map(|(i, _)| i), "\"float32\"", "\"float33\""),
                // a bad int inside the big dict (item 7, key k1500)
                (text.find("[\"k1500\",1500]"), "[\"k1500\",1500]", "[\"k1500\",{\"t\":\"int\",\"v\":\"x\"}]"),
                // a duplicate key in the big dict
                (text.find("[\"k1501\",1501]"), "[\"k1501\",1501]", "[\"k1500\",1501]"),
                // a bad node in an early and in a late item of the big container
                (text.find("{\"t\":\"tuple\""), "{\"t\":\"tuple\"", "{\"t\":\"tupel\""),
                (text.rfind("{\"t\":\"tuple\""), "{\"t\":\"tuple\"", "{\"t\":\"tupel\""),
                // a chunk past the end of its pack (a check made only inline by `build`)
                (text.rfind("\"length\":"), "\"length\":", "\"length\":9"),
            ];
            for (at, from, to) in damaged {
                let at = at.expect("pattern present");
                let bad = format!("{}{}{}", &text[..at], to, &text[at + from.len()..]);
                let with_hash = rehash(bad.as_bytes());
                assert!(decode(&with_hash, "t").is_err(), "{to}: decode accepts it");
                let errs: Vec<(String, String)> = [true, false]
                    .iter()
                    .map(|&helped| {
                        let r = if helped {
                            build(&with_hash, "t", &Helped::new())
                        } else {
                            build_one_thread(&with_hash, "t", &Helped::new())
                        };
                        match r {
                            Err(Error::InvalidManifest { key, reason, .. }) => {
                                (key, reason.split(" at line ").next().unwrap_or_default().to_string())
                            }
                            other => panic!("{to}: expected InvalidManifest, got {other:?}"),
                        }
                    })
                    .collect();
                assert_eq!(errs[0], errs[1], "{to}");
            }
        }
    }

    #[test]
    fn split_parse_names_the_same_key_path_on_errors() {
        for keyed in [false, true] {
            split_errors_match(String::from_utf8(encode(&big(keyed), &serde_json::json!({}))).unwrap());
        }
    }

    fn split_errors_match(text: String) {
        let damaged = [
            // a bad dtype deep inside list item 2500
            (text.rmatch_indices("\"float32\"").nth(100).map(|(i, _)| i), "\"float32\"", "\"float33\""),
            // a bad int inside the big dict (item 7, key k1500)
            (text.find("[\"k1500\",1500]"), "[\"k1500\",1500]", "[\"k1500\",{\"t\":\"int\",\"v\":\"x\"}]"),
            // a duplicate key in the big dict
            (text.find("[\"k1501\",1501]"), "[\"k1501\",1501]", "[\"k1500\",1501]"),
            // a bad node in a late item of the root container
            (text.rfind("{\"t\":\"dict\""), "{\"t\":\"dict\"", "{\"t\":\"dikt\""),
        ];
        for (at, from, to) in damaged {
            let at = at.expect("pattern present");
            let bad = format!("{}{}{}", &text[..at], to, &text[at + from.len()..]);
            let errs: Vec<(String, String)> = [true, false]
                .iter()
                .map(|&split| match parse_with(bad.as_bytes(), "t", split) {
                    Err(Error::InvalidManifest { key, reason, .. }) => {
                        (key, reason.split(" at line ").next().unwrap_or_default().to_string())
                    }
                    other => panic!("expected InvalidManifest, got {other:?}"),
                })
                .collect();
            assert_eq!(errs[0], errs[1], "{to}");
        }
    }

    #[test]
    fn encode_decode_round_trip() {
        let m = sample();
        let bytes = encode(&m, &serde_json::json!({}));
        let back = decode(&bytes, "t").unwrap();
        assert_eq!(back.packs, m.packs);
        assert_eq!(back.metadata, m.metadata);
        // NaN != NaN, so compare the re-encoding instead
        assert_eq!(encode(&back, &serde_json::json!({})), bytes);
        // still plain JSON for other tools
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["format"], "treepack");
    }

    #[test]
    fn detects_flips_and_truncation() {
        let bytes = encode(&sample(), &serde_json::json!({}));
        let mut flipped = bytes.clone();
        flipped[60] ^= 1;
        assert!(decode(&flipped, "t").is_err());
        assert!(matches!(decode(&bytes[..bytes.len() - 5], "t"), Err(Error::NotTreepack { .. })));
    }

    fn with_root(root: &str) -> Vec<u8> {
        let body = format!("{{\"format\":\"treepack\",\"version\":[1,0],\n\"packs\":[],\n\"root\":{root}");
        let h = Hash32::of(body.as_bytes());
        format!("{body}{HASH_PREFIX}{}{HASH_SUFFIX}", h.to_hex()).into_bytes()
    }

    #[test]
    fn rejects_hostile_roots() {
        let cases = [
            ("{\"t\":\"dict\",\"items\":[[\"a\",1],[\"a\",2]]}", "duplicate key"),
            ("{\"items\":[],\"t\":\"tuple\"}", "must begin"),
            ("{\"t\":\"array\",\"dtype\":\"float32\",\"shape\":[2],\"data\":\"AAAA\"}", "inline data"),
            ("{\"t\":\"wat\"}", "unknown node type"),
            ("{\"t\":\"dict\",\"items\":[[[1],2]]}", "dict key"),
            ("{\"t\":\"float\",\"v\":\"NaN\"}", "float string"),
        ];
        for (root, needle) in cases {
            let err = decode(&with_root(root), "t").unwrap_err().to_string();
            assert!(err.contains(needle), "{root}: {err}");
        }
        let deep = "[".repeat(MAX_DEPTH + 5) + &"]".repeat(MAX_DEPTH + 5);
        assert!(decode(&with_root(&deep), "t").unwrap_err().to_string().contains("deeper"));
        let ok = "[".repeat(MAX_DEPTH - 1) + &"]".repeat(MAX_DEPTH - 1);
        decode(&with_root(&ok), "t").unwrap();
    }

    #[test]
    fn dict_keys_of_every_kind_parse_and_escaped_duplicates_are_found() {
        // String keys take `KeySeed`'s direct path (borrowed and unescaped); the others are
        // read as nodes and converted. Both must give the keys the writer meant.
        let root = r#"{"t":"dict","items":[["plain",1],["esc\"aped\n",2],[7,3],[1.5,4],[true,5],[null,6],
            [{"t":"tuple","items":[1,"x"]},7],[{"t":"int","v":"123456789012345678901234567890"},8]]}"#;
        let m = decode(&with_root(root), "t").unwrap();
        let Tree::Dict(pairs) = &m.root else { panic!("not a dict") };
        let keys: Vec<&Key> = pairs.iter().map(|(k, _)| k).collect();
        let big = Int::parse("123456789012345678901234567890").unwrap();
        let want = [
            Key::Str("plain".into()),
            Key::Str("esc\"aped\n".into()),
            Key::Int(Int::Small(7)),
            Key::Float(1.5),
            Key::Bool(true),
            Key::None,
            Key::Tuple(vec![Key::Int(Int::Small(1)), Key::Str("x".into())]),
            Key::Int(big),
        ];
        assert_eq!(keys, want.iter().collect::<Vec<_>>());
        // "a" written escaped is still "a": a duplicate, in small dicts and big ones.
        let small = r#"{"t":"dict","items":[["a",1],["\u0061",2]]}"#;
        let big_items: Vec<String> = (0..40).map(|i| format!("[\"k{i}\",{i}]")).collect();
        let big = format!(r#"{{"t":"dict","items":[{},["\u006b7",0]]}}"#, big_items.join(","));
        for root in [small.to_string(), big] {
            let err = decode(&with_root(&root), "t").unwrap_err().to_string();
            assert!(err.contains("duplicate key"), "{err}");
        }
    }

    #[test]
    fn error_names_the_key_path() {
        let err = decode(&with_root("{\"t\":\"dict\",\"items\":[[\"params\",[1,{\"t\":\"zzz\"}]]]}"), "f").unwrap_err();
        match err {
            Error::InvalidManifest { key, .. } => assert_eq!(key, "params/1"),
            e => panic!("{e}"),
        }
    }

    #[test]
    fn future_major_version_says_upgrade() {
        let body = "{\"format\":\"treepack\",\"version\":[2,0],\"packs\":[],\"root\":null}";
        assert!(matches!(decode(body.as_bytes(), "f"), Err(Error::UnsupportedVersion { .. })));
    }
}
