//! The single-file container (`.tpk`):
//!
//! ```text
//! 0        header (64 bytes): "TREEPACK", major u16 LE, minor u16 LE, 52 zero bytes
//! 64       chunks, each at an offset that is a multiple of 64, zero padding between
//! M        manifest (same bytes as a directory's treepack.json; its pack 0 is ".", this file)
//! end-64   footer (64 bytes): manifest offset u64 LE, manifest length u64 LE, 40 zero bytes, "TPKFOOT1"
//! ```
//! A reader fetches the last few KiB (one ranged GET), finds the footer and usually the whole
//! manifest in it.

use crate::error::{Error, Result};
use crate::manifest::VERSION_MAJOR;

/// Size of the header at the start of a single file, in bytes.
pub const HEADER_LEN: u64 = 64;
/// Size of the footer at the end of a single file, in bytes.
pub const FOOTER_LEN: u64 = 64;
/// Magic bytes at offset 0 of a single file.
pub const MAGIC: &[u8; 8] = b"TREEPACK";
/// Magic bytes closing the footer (the file's last 8 bytes).
pub const FOOTER_MAGIC: &[u8; 8] = b"TPKFOOT1";
/// Alignment of every chunk (bytes), in packs and single files alike.
pub const ALIGN: u64 = 64;

/// The header of a file whose manifest has format version `VERSION_MAJOR.minor`: magic, major
/// and minor version (u16 LE), zero bytes.
pub fn header(minor: u16) -> [u8; 64] {
    let mut h = [0u8; 64];
    h[..8].copy_from_slice(MAGIC);
    h[8..10].copy_from_slice(&VERSION_MAJOR.to_le_bytes());
    h[10..12].copy_from_slice(&minor.to_le_bytes());
    h
}

/// Check a header.
///
/// # Errors
/// [`Error::NotTreepack`] for bad magic or nonzero reserved bytes; [`Error::UnsupportedVersion`].
pub fn check_header(h: &[u8], file: &str) -> Result<()> {
    if h.len() < 64 || &h[..8] != MAGIC {
        return Err(Error::NotTreepack { file: file.into(), reason: "missing TREEPACK magic at offset 0".into() });
    }
    let major = u16::from_le_bytes([h[8], h[9]]);
    let minor = u16::from_le_bytes([h[10], h[11]]);
    if major != VERSION_MAJOR {
        return Err(Error::UnsupportedVersion {
            file: file.into(),
            found: format!("{major}.{minor}"),
            supported: VERSION_MAJOR,
        });
    }
    if h[12..64].iter().any(|&b| b != 0) {
        return Err(Error::NotTreepack {
            file: file.into(),
            reason: "reserved header bytes are not zero (corrupt header)".into(),
        });
    }
    Ok(())
}

/// The footer that points at the manifest: its byte offset and length in the file (u64 LE), zero bytes, magic.
pub fn footer(manifest_offset: u64, manifest_len: u64) -> [u8; 64] {
    let mut f = [0u8; 64];
    f[..8].copy_from_slice(&manifest_offset.to_le_bytes());
    f[8..16].copy_from_slice(&manifest_len.to_le_bytes());
    f[56..].copy_from_slice(FOOTER_MAGIC);
    f
}

/// Parse a footer against the file size; returns the manifest's byte range.
///
/// # Errors
/// [`Error::NotTreepack`] for a bad footer or a manifest range outside the file.
pub fn parse_footer(f: &[u8], file_size: u64, file: &str) -> Result<(u64, u64)> {
    let bad = |r: &str| Error::NotTreepack { file: file.into(), reason: r.into() };
    if f.len() != 64 || &f[56..] != FOOTER_MAGIC {
        return Err(bad("missing TPKFOOT1 footer at the end (truncated or not a .tpk file)"));
    }
    if f[16..56].iter().any(|&b| b != 0) {
        return Err(bad("reserved footer bytes are not zero (corrupt footer)"));
    }
    let mut a = [0u8; 8];
    a.copy_from_slice(&f[..8]);
    let off = u64::from_le_bytes(a);
    a.copy_from_slice(&f[8..16]);
    let len = u64::from_le_bytes(a);
    let end = off.checked_add(len).ok_or_else(|| bad("manifest range overflows"))?;
    if off < HEADER_LEN || end != file_size - FOOTER_LEN {
        return Err(bad(&format!("footer places the manifest at {off}..{end}, which does not end at the footer")));
    }
    Ok((off, len))
}

/// Round `x` up to the chunk alignment.
pub fn align_up(x: u64) -> u64 {
    x.div_ceil(ALIGN) * ALIGN
}
