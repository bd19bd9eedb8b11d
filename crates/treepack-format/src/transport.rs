//! JSON transport documents (docs/format.md section 11): one tree — its manifest and its chunk
//! bytes — as one self-contained JSON text, for a message, a database column or an HTTP body
//! where a directory or a `.tpk` cannot go.
//!
//! The manifest is embedded byte for byte, so its checksum still holds and a reader checks it
//! exactly as it checks a stored one (one parser for both); the stored chunk bytes follow as one
//! base85 or base64 string, back to back (the 64-byte alignment gaps of a pack are implied by
//! the layout rule, not sent). This module frames and unframes; the engine's `transport` reads and
//! writes locations.

use crate::error::{Error, Result};
use crate::manifest::{Entry, Manifest, HASH_TRAILER_LEN};
use base64::Engine;

/// The document's signature value (`"format": "treepack-json"`).
pub const FORMAT_NAME: &str = "treepack-json";
/// Version (major, minor) this build writes; readers accept any minor of major 1.
pub const VERSION: (u16, u16) = (1, 0);
/// The one pack a transport manifest may list: the chunk bytes of the document.
pub const PACK_PATH: &str = "packs/transport.tpp";
/// Largest document accepted by [`read`]: the manifest limit plus the same again of data.
pub const MAX_DOCUMENT_BYTES: u64 = 1 << 34;

const HASH_MEMBER: &str = ",\n\"manifest_hash\":\"";

/// How the chunk bytes are written as text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Encoding {
    /// Base85 with the RFC 1924 alphabet (Python's `base64.b85encode`, git's): 5 characters per
    /// 4 bytes, none of which JSON escapes (25 % larger than the bytes).
    #[default]
    Base85,
    /// Standard base64 with padding (RFC 4648): 4 characters per 3 bytes (33 % larger), for
    /// tools that only know base64.
    Base64,
}

impl Encoding {
    /// The name written in the document (`"base85"`, `"base64"`).
    pub fn name(self) -> &'static str {
        match self {
            Encoding::Base85 => "base85",
            Encoding::Base64 => "base64",
        }
    }

    /// The encoding called `name`, if any.
    pub fn from_name(name: &str) -> Option<Encoding> {
        match name {
            "base85" | "b85" => Some(Encoding::Base85),
            "base64" | "b64" => Some(Encoding::Base64),
            _ => None,
        }
    }

    fn encode(self, data: &[u8]) -> String {
        match self {
            Encoding::Base85 => b85_encode(data),
            Encoding::Base64 => base64::engine::general_purpose::STANDARD.encode(data),
        }
    }

    fn decode(self, text: &str) -> std::result::Result<Vec<u8>, String> {
        match self {
            Encoding::Base85 => b85_decode(text),
            Encoding::Base64 => base64::engine::general_purpose::STANDARD.decode(text).map_err(|e| e.to_string()),
        }
    }
}

/// Where the chunks of a transport pack go: each chunk (by its first reference, in order of
/// appearance) at the next multiple of 64 after the previous one, the first at 0; returns the
/// offsets and the pack's size.
pub fn layout(lengths: impl IntoIterator<Item = u64>) -> (Vec<u64>, u64) {
    let mut end = 0u64;
    let offsets = lengths
        .into_iter()
        .map(|len| {
            let at = end.div_ceil(64).saturating_mul(64);
            end = at.saturating_add(len);
            at
        })
        .collect();
    (offsets, end)
}

/// The document for a manifest (its exact bytes, as [`crate::manifest::encode`] wrote
/// them, naming at most the one pack [`PACK_PATH`]) and `data`, the stored bytes of its chunks
/// back to back in pack order.
pub fn write(manifest: &[u8], data: &[u8], encoding: Encoding) -> String {
    let manifest = manifest.strip_suffix(b"\n").unwrap_or(manifest);
    let text = encoding.encode(data);
    let mut s = String::with_capacity(manifest.len() + text.len() + 128);
    s.push_str(&format!("{{\"format\":\"{FORMAT_NAME}\",\"version\":[{},{}],\n\"manifest\":", VERSION.0, VERSION.1));
    // The manifest is JSON (UTF-8) by construction: it was written by the manifest encoder.
    s.push_str(&String::from_utf8_lossy(manifest));
    s.push_str(",\n\"encoding\":\"");
    s.push_str(encoding.name());
    s.push_str("\",\n\"data\":\"");
    s.push_str(&text);
    s.push_str("\"}\n");
    s
}

/// A document taken apart: the manifest's exact bytes (with its final newline, as stored) and
/// the decoded chunk bytes.
#[derive(Debug)]
pub struct Document {
    /// The manifest, byte for byte as in a `treepack.json`.
    pub manifest: Vec<u8>,
    /// The stored bytes of the chunks, back to back in pack order.
    pub data: Vec<u8>,
}

#[derive(serde::Deserialize)]
struct Tail {
    encoding: String,
    data: String,
}

/// Take a document apart. The manifest is not checked here: [`expand`] and the manifest reader
/// do that.
///
/// # Errors
/// [`Error::NotTreepack`] for text that is not a transport document (it names what is wrong),
/// [`Error::UnsupportedVersion`] for a major version other than 1, [`Error::LimitExceeded`]
/// for a document beyond [`MAX_DOCUMENT_BYTES`].
pub fn read(doc: &[u8], file: &str) -> Result<Document> {
    let bad = |reason: &str| Error::NotTreepack { file: file.to_string(), reason: reason.to_string() };
    if doc.len() as u64 > MAX_DOCUMENT_BYTES {
        return Err(Error::limit("transport document", MAX_DOCUMENT_BYTES, format!("{file} is {} bytes", doc.len())));
    }
    let doc = trim_ascii(doc);
    if doc.is_empty() {
        return Err(bad("the document is empty"));
    }
    let prefix = format!("{{\"format\":\"{FORMAT_NAME}\",\"version\":[");
    let Some(rest) = doc.strip_prefix(prefix.as_bytes()) else {
        let hint = if doc.starts_with(&prefix.as_bytes()[..25]) || prefix.as_bytes().starts_with(doc) {
            "the document is cut short or malformed before its version (it should begin {\"format\":\"treepack-json\",\"version\":[1,0])"
        } else if doc.starts_with(b"{\"format\":\"treepack\"") {
            "this is a manifest (treepack.json), not a transport document; load its directory instead"
        } else {
            "a treepack JSON transport document begins with {\"format\":\"treepack-json\",\"version\":[ (write one with treepack.dumps or `treepack export`)"
        };
        return Err(bad(hint));
    };
    let close = rest.iter().position(|&b| b == b']').filter(|&i| i <= 16).ok_or_else(|| bad("malformed version"))?;
    let version = std::str::from_utf8(&rest[..close]).map_err(|_| bad("malformed version"))?;
    let (major, _minor) = version.split_once(',').ok_or_else(|| bad("malformed version"))?;
    let major: u16 = major.trim().parse().map_err(|_| bad("malformed version"))?;
    if major != VERSION.0 {
        return Err(Error::UnsupportedVersion {
            file: file.to_string(),
            found: version.replace(',', "."),
            supported: VERSION.0,
        });
    }
    let rest = &rest[close + 1..];
    let rest = rest
        .strip_prefix(b",\n\"manifest\":")
        .ok_or_else(|| bad("expected the \"manifest\" member after the version"))?;
    // A raw newline appears in a manifest only at its fixed line breaks (newlines in strings are
    // escaped), so the first `,\n"manifest_hash":"` is the manifest's last member.
    let at =
        find(rest, HASH_MEMBER.as_bytes()).ok_or_else(|| bad("the embedded manifest has no manifest_hash member"))?;
    let end = at + HASH_TRAILER_LEN - 1; // the trailer without its final newline
    if rest.len() < end || !rest[..end].ends_with(b"\"}") {
        return Err(bad("the embedded manifest's manifest_hash member is malformed"));
    }
    let mut manifest = rest[..end].to_vec();
    manifest.push(b'\n');
    let tail = &rest[end..];
    let tail = tail
        .strip_prefix(b",")
        .ok_or_else(|| bad("expected the \"encoding\" and \"data\" members after the manifest"))?;
    let mut obj = Vec::with_capacity(tail.len() + 1);
    obj.push(b'{');
    obj.extend_from_slice(tail);
    let tail: Tail = serde_json::from_slice(&obj)
        .map_err(|e| bad(&format!("the members after the manifest are not {{\"encoding\": …, \"data\": …}}: {e}")))?;
    let encoding = Encoding::from_name(&tail.encoding)
        .ok_or_else(|| bad(&format!("unknown encoding {:?} (known: base85, base64)", tail.encoding)))?;
    let data = encoding.decode(&tail.data).map_err(|e| bad(&format!("data is not valid {}: {e}", encoding.name())))?;
    Ok(Document { manifest, data })
}

/// Rebuild the pack a document's manifest names from the back-to-back chunk bytes: checks that
/// the manifest lists no pack or only [`PACK_PATH`], that its chunks are laid out exactly as
/// [`layout`] places them, and that `data` holds exactly their bytes.
///
/// # Errors
/// [`Error::InvalidManifest`] naming what does not fit.
pub fn expand(m: &Manifest, data: &[u8], file: &str) -> Result<Vec<u8>> {
    let bad =
        |key: &str, reason: String| Error::InvalidManifest { file: file.to_string(), key: key.to_string(), reason };
    let size = match m.packs.as_slice() {
        [] => 0,
        [p] if p.path == PACK_PATH => p.size,
        _ => return Err(bad("", format!("a transport manifest lists no pack or the one pack {PACK_PATH}"))),
    };
    let mut refs: Vec<(u64, u64, String)> = Vec::new();
    m.root.for_each_leaf(&mut |path, e: &Entry| {
        for c in e.chunks() {
            refs.push((c.offset, c.length, path.to_string()));
        }
    });
    refs.sort_unstable_by_key(|r| (r.0, r.1));
    refs.dedup_by_key(|r| (r.0, r.1));
    let (offsets, end) = layout(refs.iter().map(|r| r.1));
    for ((offset, _, key), want) in refs.iter().zip(&offsets) {
        if offset != want {
            return Err(bad(key, format!("chunk at offset {offset} of the transport pack, where its layout puts it at {want} (chunks overlap or leave gaps)")));
        }
    }
    if end != size {
        return Err(bad("", format!("the transport pack's size is {size}, but its chunks end at {end}")));
    }
    let total: u64 = refs.iter().map(|r| r.1).sum();
    if total != data.len() as u64 {
        return Err(bad("", format!("the document's data is {} bytes, but its chunks need {total}", data.len())));
    }
    let mut pack = vec![0u8; usize::try_from(size).map_err(|_| bad("", "pack too large".into()))?];
    let mut at = 0usize;
    for ((_, len, _), &offset) in refs.iter().zip(&offsets) {
        let len = *len as usize;
        let o = offset as usize;
        pack[o..o + len].copy_from_slice(&data[at..at + len]);
        at += len;
    }
    Ok(pack)
}

fn trim_ascii(b: &[u8]) -> &[u8] {
    let start = b.iter().position(|c| !c.is_ascii_whitespace()).unwrap_or(b.len());
    let end = b.iter().rposition(|c| !c.is_ascii_whitespace()).map_or(start, |i| i + 1);
    &b[start..end.max(start)]
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

const B85: &[u8; 85] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~";

/// Base85 as Python's `base64.b85encode(data)` (no padding characters): each 4 bytes,
/// big-endian, as 5 digits, most significant first; a last group of `n < 4` bytes is padded
/// with zeros and written as its first `n + 1` digits.
pub fn b85_encode(data: &[u8]) -> String {
    let mut out = Vec::with_capacity(data.len().div_ceil(4) * 5);
    for chunk in data.chunks(4) {
        let mut word = [0u8; 4];
        word[..chunk.len()].copy_from_slice(chunk);
        let mut v = u32::from_be_bytes(word);
        let mut digits = [0u8; 5];
        for d in digits.iter_mut().rev() {
            *d = B85[(v % 85) as usize];
            v /= 85;
        }
        out.extend_from_slice(&digits[..chunk.len() + 1]);
    }
    // Every byte pushed is from the ASCII alphabet.
    String::from_utf8(out).unwrap_or_default()
}

/// The inverse of [`b85_encode`] (what Python's `base64.b85decode` accepts, except a last group
/// of one digit, which no encoder writes).
///
/// # Errors
/// A character outside the alphabet, a group above 2³²−1, or a one-digit last group.
pub fn b85_decode(text: &str) -> std::result::Result<Vec<u8>, String> {
    let mut value = [255u8; 256];
    for (i, &c) in B85.iter().enumerate() {
        value[c as usize] = i as u8;
    }
    let bytes = text.as_bytes();
    if bytes.len() % 5 == 1 {
        return Err("the last group has one digit".into());
    }
    let mut out = Vec::with_capacity(bytes.len() / 5 * 4 + 4);
    for (g, group) in bytes.chunks(5).enumerate() {
        let mut v: u64 = 0;
        for k in 0..5 {
            let c = group.get(k).copied().unwrap_or(b'~');
            let d = value[c as usize];
            if d == 255 {
                return Err(format!("character {:?} at {} is not base85", c as char, g * 5 + k));
            }
            v = v * 85 + u64::from(d);
        }
        let v = u32::try_from(v).map_err(|_| format!("group at {} is above 2^32-1", g * 5))?;
        out.extend_from_slice(&v.to_be_bytes()[..group.len() - 1]);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base85_matches_pythons_b85encode() {
        // base64.b85encode(b"hello world!") and base64.b85encode(b"\x00\x01\x02")
        assert_eq!(b85_encode(b"hello world!"), "Xk~0{Zy<MXa%^NF");
        assert_eq!(b85_encode(&[0, 1, 2]), "009C");
        assert_eq!(b85_encode(&[255; 4]), "|NsC0");
        for n in 0..40usize {
            let data: Vec<u8> = (0..n).map(|i| (i * 37 + 11) as u8).collect();
            assert_eq!(b85_decode(&b85_encode(&data)).unwrap(), data, "length {n}");
        }
        assert!(b85_decode("0\"").is_err());
        assert!(b85_decode("~~~~~").is_err());
        assert!(b85_decode("000000").is_err());
    }

    #[test]
    fn layout_aligns_every_chunk_to_64() {
        assert_eq!(layout([10, 64, 1, 0, 5]), (vec![0, 64, 128, 192, 192], 197));
        assert_eq!(layout([]), (vec![], 0));
    }
}
