//! Checks of a whole manifest and of each entry (packs, chunk grids, chunk references, sizes).

use super::nodes::PairKey;
use super::types::{
    ArrayStorage, ChunkRef, Entry, Manifest, PackInfo, Stored, HASH_PREFIX, HASH_SUFFIX, HASH_TRAILER_LEN,
    MAX_MANIFEST_BYTES, MAX_NDIM, VERSION_MAJOR,
};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::grid::ChunkGrid;
use crate::hash::Hash32;
use crate::keypath::KeyPath;
use crate::model::{shape_len, Key};
use crate::refs::{check_refs_with, RefCheck};
use std::collections::HashSet;

/// The checks [`decode`](super::decode) makes before parsing: size limit, signature, version, trailing hash.
///
/// # Errors
/// As [`decode`](super::decode), for everything but the parse.
pub fn check(bytes: &[u8], file: &str) -> Result<()> {
    let stored = check_frame(bytes, file)?;
    check_body(bytes, &stored, false, file)
}

/// [`check`] less the hash of the body: size, signature, version and the trailer's shape.
/// Returns the hash the trailer states, for [`check_body`].
pub(super) fn check_frame(bytes: &[u8], file: &str) -> Result<Hash32> {
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
    let trailer = &bytes[split..];
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
    Ok(stored)
}

/// The rest of [`check`]: the body's BLAKE3 against the trailer's `stored` hash (`bytes` passed
/// [`check_frame`]). `here`: hashed on this thread alone, as while the parse helper has the
/// other core (see `build_streamed`).
pub(super) fn check_body(bytes: &[u8], stored: &Hash32, here: bool, file: &str) -> Result<()> {
    let body = &bytes[..bytes.len() - HASH_TRAILER_LEN];
    let actual = if here { Hash32(*blake3::hash(body).as_bytes()) } else { Hash32::of(body) };
    if actual != *stored {
        return Err(Error::ManifestChecksum { file: file.into(), expected: stored.to_hex(), actual: actual.to_hex() });
    }
    Ok(())
}

pub(super) fn check_version_prefix(bytes: &[u8], file: &str) -> Result<()> {
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

/// Index of the first dict item whose key names the same path as an earlier one (writers check
/// with this what readers refuse).
pub fn first_duplicate_key<V>(pairs: &[(Key, V)]) -> Option<usize> {
    first_duplicate(pairs)
}

/// Index of the first record field or custom child whose name repeats an earlier one.
pub fn first_duplicate_name<V>(named: &[(String, V)]) -> Option<usize> {
    first_duplicate(named)
}

/// Index of the first pair whose key names the same path as an earlier one. Small containers
/// (the common case) are compared pairwise; large ones through a hash set of borrowed keys.
pub(super) fn first_duplicate<'de, K: PairKey<'de>, V>(pairs: &[(K, V)]) -> Option<usize> {
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

/// Check everything the parser cannot: pack names, chunk bounds, sizes and grid consistency.
///
/// # Errors
/// [`Error::InvalidManifest`] or [`Error::OutOfBounds`] naming the key path.
pub fn validate(m: &Manifest, file: &str) -> Result<()> {
    validate_from(m, file, RefCheck::default())
}

/// [`validate`] with shared ids checked from `refs`' state (a fragment's, parsed on its own).
pub(super) fn validate_from(m: &Manifest, file: &str, refs: RefCheck) -> Result<()> {
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
    // Shared nodes and refs (1.2): checked whatever the minor says, since a file may lie about
    // it (one walk with no allocation per node).
    check_refs_with(&m.root, refs, &|_| None)
        .map_err(|(path, r)| Error::manifest(file, if path.is_empty() { "<root>".into() } else { path }, r))?;
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

pub(super) fn validate_chunk(
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
    if c.codec.is_identity() && c.length != expect_len {
        return Err(Error::manifest(
            file,
            key(),
            format!("chunk {i} stores {} bytes but its region needs {expect_len} (shape × itemsize)", c.length),
        ));
    }
    if expect_len > c.codec.max_decoded(c.length) {
        return Err(Error::manifest(
            file,
            key(),
            format!(
                "chunk {i} stores {} bytes of `{}`, which cannot decode to the {expect_len} bytes its region needs                  (a decompression bomb?)",
                c.length, c.codec
            ),
        ));
    }
    Ok(())
}

/// The byte count of an array of `dtype` and `shape`: at most `MAX_NDIM` dimensions, and a
/// count that fits 64 bits.
pub(super) fn array_nbytes(dtype: &DType, shape: &[u64]) -> std::result::Result<u64, String> {
    if shape.len() > MAX_NDIM {
        return Err(format!("{} dimensions (limit {MAX_NDIM})", shape.len()));
    }
    shape_len(shape)
        .and_then(|n| n.checked_mul(dtype.itemsize()))
        .ok_or_else(|| format!("shape {shape:?} overflows 64-bit byte counts"))
}

/// Inline data must hold exactly dtype × shape bytes.
pub(super) fn check_inline_len(len: u64, nbytes: u64) -> std::result::Result<(), String> {
    if len != nbytes {
        return Err(format!("inline data has {len} bytes but dtype × shape needs {nbytes}"));
    }
    Ok(())
}

/// Whether [`validate_entry`] checks anything of `e` (stored strings and bytes, arrays): a
/// parse skips the call for the rest, most of a tree's leaves.
pub(super) fn has_entry_checks(e: &Entry) -> bool {
    matches!(e, Entry::Str(Stored::Blob { .. }) | Entry::Bytes(Stored::Blob { .. }) | Entry::Array(_))
}

/// Check one leaf entry against the packs; entries [`has_entry_checks`] rules out pass as they
/// are (keep the two in step).
pub(super) fn validate_entry(packs: &[PackInfo], path: &KeyPath, e: &Entry, file: &str) -> Result<()> {
    let key = || path.to_string();
    match e {
        Entry::Str(Stored::Blob { size, chunk }) | Entry::Bytes(Stored::Blob { size, chunk }) => {
            if chunk.codec.is_shuffled() {
                return Err(Error::manifest(file, key(), format!("codec `{}` applies to arrays only", chunk.codec)));
            }
            validate_chunk(packs, chunk, *size, path, 0, file)
        }
        Entry::Array(a) => {
            let nbytes = array_nbytes(&a.dtype, &a.shape).map_err(|r| Error::manifest(file, key(), r))?;
            match &a.storage {
                ArrayStorage::Inline(d) => {
                    check_inline_len(d.len() as u64, nbytes).map_err(|r| Error::manifest(file, key(), r))?;
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
