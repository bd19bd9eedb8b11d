//! A manifest stored compressed (format 1.6): the manifest's JSON — the same bytes, hash
//! included — as one zstd frame. A reader tells the two apart by the first bytes (a JSON
//! manifest begins with `{`, a zstd frame with its magic number) and reads the JSON it holds.

use bytes::Bytes;
use std::io::Read;

use crate::error::{Error, Result};

use super::MAX_MANIFEST_BYTES;

/// The first four bytes of a zstd frame (RFC 8878, 3.1.1).
pub const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// How every manifest's JSON begins (docs/format.md section 3, "Signature").
const SIGNATURE: &[u8] = b"{\"format\":\"treepack\",\"version\":[";

/// The format minor that stores a manifest compressed.
pub const PACKED_MINOR: u16 = 6;

/// Largest window a compressed manifest may ask a reader to keep (2^24 bytes, the most a
/// writer at the levels it uses asks for): a frame asking more is refused before any memory
/// is taken for it.
const WINDOW_LOG_MAX: u32 = 24;

/// The most a compressed manifest may expand: `MAX_RATIO` times its stored bytes, or
/// `RATIO_FLOOR` bytes, whichever is more (and never past the manifest limit). Reading a
/// manifest takes memory in proportion to its JSON (up to ~60 bytes a byte: a structure listing
/// of a list of zeros), so this ratio multiplies what a small hostile frame can make a reader
/// allocate: at 1024, 1.3 MB made a load abort for want of 2 GiB (session 45). Logs of traced
/// calls compress ~9 times, checkpoints' manifests (hashes) ~3; a writer stores a manifest that
/// would expand more (a very repetitive tree past the floor) as plain JSON.
pub const MAX_RATIO: u64 = 32;
/// See [`MAX_RATIO`].
pub const RATIO_FLOOR: u64 = 4 << 20;

fn max_expansion(stored: usize) -> u64 {
    (stored as u64).saturating_mul(MAX_RATIO).max(RATIO_FLOOR)
}

/// Whether `bytes` hold a compressed manifest.
pub fn is_packed(bytes: &[u8]) -> bool {
    bytes.starts_with(&ZSTD_MAGIC)
}

/// The manifest's JSON: `bytes` as they are when they are JSON, else the one zstd frame they
/// hold, decoded. The output grows with what the frame really decodes to, never with a size
/// it declares, and stops at [`MAX_MANIFEST_BYTES`]; bytes after the frame are refused.
///
/// # Errors
/// [`Error::InvalidManifest`] for a damaged frame or bytes after it, the limit error for a
/// frame that decodes to more than the largest manifest.
pub fn unpack(bytes: Bytes, file: &str) -> Result<Bytes> {
    unpack_limited(bytes, file, MAX_MANIFEST_BYTES)
}

fn unpack_limited(bytes: Bytes, file: &str, limit: u64) -> Result<Bytes> {
    // An encrypted tree read without its key (a reader with the key sees the plain bytes).
    if crate::crypt::is_encrypted(&bytes) {
        return Err(Error::Encrypted { location: file.to_string(), with: crate::crypt::describe_stored(&bytes) });
    }
    if !is_packed(&bytes) {
        return Ok(bytes);
    }
    let allowed = max_expansion(bytes.len()).min(limit);
    let bad = |e: &dyn std::fmt::Display| {
        Error::manifest(file, "", format!("the manifest is a damaged zstd frame ({e}); the file was cut or changed"))
    };
    let mut dec = zstd::stream::read::Decoder::with_buffer(&bytes[..]).map_err(|e| bad(&e))?.single_frame();
    dec.window_log_max(WINDOW_LOG_MAX).map_err(|e| bad(&e))?;
    // The first bytes first: a frame that does not begin as a manifest does is refused before
    // the rest of it is decoded (a bomb of anything else costs nothing).
    let mut out = vec![0u8; SIGNATURE.len()];
    let mut got = 0;
    while got < out.len() {
        match dec.read(&mut out[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(bad(&e)),
        }
    }
    if got < out.len() || out != SIGNATURE {
        return Err(Error::manifest(file, "", "the compressed manifest does not hold a JSON manifest"));
    }
    out.reserve((bytes.len() * 4).min(64 << 20));
    (&mut dec).take(allowed + 1 - out.len() as u64).read_to_end(&mut out).map_err(|e| bad(&e))?;
    if out.len() as u64 > allowed {
        return Err(if allowed < limit {
            Error::limit(
                "compressed manifest expansion",
                allowed,
                format!(
                    "{file} holds a {} B compressed manifest that decodes to more than {MAX_RATIO} times that \
                     (no treepack writes one: it stores such a manifest plain)",
                    bytes.len()
                ),
            )
        } else {
            Error::limit("manifest size", limit, format!("{file} holds a compressed manifest that decodes to more"))
        });
    }
    if !dec.finish().is_empty() {
        return Err(Error::manifest(file, "", "bytes follow the compressed manifest's zstd frame"));
    }
    Ok(Bytes::from(out))
}

/// The stored form of a manifest encoded in `parts`: one zstd frame at `level` (with its
/// content size, deterministic for a level), or `parts` unchanged when compression fails.
pub fn pack(parts: Vec<Bytes>, level: i32) -> Vec<Bytes> {
    let total: usize = parts.iter().map(Bytes::len).sum();
    let packed = (|| {
        let mut enc = zstd::stream::write::Encoder::new(Vec::with_capacity(total / 4 + 64), level).ok()?;
        enc.set_pledged_src_size(Some(total as u64)).ok()?;
        enc.include_contentsize(true).ok()?;
        enc.window_log(WINDOW_LOG_MAX).ok()?;
        for p in &parts {
            std::io::Write::write_all(&mut enc, p).ok()?;
        }
        enc.finish().ok()
    })();
    match packed {
        // A manifest that compresses past what a reader accepts stays plain (`MAX_RATIO`).
        Some(v) if total as u64 <= max_expansion(v.len()) => vec![Bytes::from(v)],
        _ => parts,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_manifests_round_trip_and_hostile_frames_are_refused() {
        let json =
            Bytes::from(format!("{{\"format\":\"treepack\",\"version\":[1,6],\"x\":\"{}\"}}", "a".repeat(100_000)));
        let packed = pack(vec![json.slice(..10), json.slice(10..)], 3);
        assert_eq!(packed.len(), 1);
        assert!(is_packed(&packed[0]) && packed[0].len() < 1000);
        assert_eq!(unpack(packed[0].clone(), "t").ok(), Some(json.clone()));
        // Plain JSON passes through untouched.
        assert_eq!(unpack(json.clone(), "t").ok(), Some(json.clone()));
        // Cut, changed, followed by more bytes, or not JSON inside.
        let p = packed[0].clone();
        let cut = unpack(p.slice(..p.len() - 5), "t").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(cut.contains("damaged zstd frame"), "{cut}");
        let mut trailing = p.to_vec();
        trailing.extend_from_slice(b"{}");
        let t = unpack(Bytes::from(trailing), "t").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(t.contains("bytes follow") || t.contains("damaged"), "{t}");
        let not_json = pack(vec![Bytes::from_static(b"[1,2,3]")], 3);
        let n = unpack(not_json[0].clone(), "t").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(n.contains("does not hold a JSON manifest"), "{n}");
    }

    #[test]
    fn a_small_frame_cannot_expand_past_its_ratio_and_a_writer_keeps_such_a_manifest_plain() {
        let json = format!("{{\"format\":\"treepack\",\"version\":[1,6],\"x\":\"{}\"}}", "a".repeat(64 << 20));
        let json = Bytes::from(json);
        // Written by hand past the ratio (64 MiB in a few KiB): refused, naming the ratio.
        let frame = zstd::bulk::compress(&json, 19).unwrap_or_default();
        assert!((frame.len() as u64) * MAX_RATIO < json.len() as u64);
        let e = unpack(Bytes::from(frame), "t").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("compressed manifest expansion") && e.contains("32 times"), "{e}");
        // The writer stores it plain instead.
        let stored = pack(vec![json.clone()], 3);
        assert!(!is_packed(&stored[0]) && stored[0] == json);
    }

    #[test]
    fn a_frame_that_decodes_past_the_limit_stops_at_it() {
        let json =
            Bytes::from(format!("{{\"format\":\"treepack\",\"version\":[1,6],\"x\":\"{}\"}}", " ".repeat(1 << 20)));
        let packed = pack(vec![json], 19);
        assert!(is_packed(&packed[0]) && packed[0].len() < 1024);
        let e = unpack_limited(packed[0].clone(), "t", 1 << 16).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("manifest size") && e.contains("decodes to more"), "{e}");
    }
}
