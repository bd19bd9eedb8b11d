//! Finding and reading a tree's manifest: `treepack.json` of a directory, or the manifest
//! section at the tail of a single `.tpk` file.

use super::*;

/// Read a single file's manifest: one ranged read of the tail (and one more for big manifests).
/// The manifest's bytes (unchecked) and the name of the file they came from: `treepack.json` of
/// a directory, or the manifest section of a single file (one ranged read of its tail).
///
/// # Errors
/// [`Error::NotFound`], storage errors, [`Error::NotTreepack`] for a damaged single file.
pub async fn manifest_bytes(loc: &Location) -> Result<(Bytes, String)> {
    Ok(match loc.layout() {
        Layout::Directory if loc.tree_name().is_some() => {
            crate::repo::manifest_bytes(loc, loc.tree_name().unwrap_or_default()).await?
        }
        Layout::Directory => {
            let file = loc.file_name(MANIFEST_NAME);
            let b = loc
                .get_opt(MANIFEST_NAME, manifest::MAX_MANIFEST_BYTES)
                .await?
                .ok_or_else(|| Error::no_tree(loc.display(), &file))?;
            (b, file)
        }
        Layout::SingleFile => (read_single_manifest(loc).await?, loc.display().to_string()),
    })
}

async fn read_single_manifest(loc: &Location) -> Result<Bytes> {
    let (tail, size) = loc.read_suffix(".", TAIL_READ).await?;
    match locate_manifest(tail, size, loc.display())? {
        Tail::Manifest(b) => Ok(b),
        Tail::Need(r) => loc.read_range(".", r).await,
    }
}

/// Where a single file's manifest is, from the file's last bytes.
pub(super) enum Tail {
    /// The tail read holds all of it.
    Manifest(Bytes),
    /// It starts before the tail read: this range must be read.
    Need(Range<u64>),
}

/// Check a single file's footer (and header, if the tail read covers the whole file) and find
/// its manifest.
pub(super) fn locate_manifest(tail: Bytes, size: u64, file: &str) -> Result<Tail> {
    let min = container::HEADER_LEN + container::FOOTER_LEN;
    if size < min || (tail.len() as u64) < size.min(TAIL_READ) {
        return Err(Error::NotTreepack {
            file: file.to_string(),
            reason: format!("file has {size} bytes, fewer than a header and footer"),
        });
    }
    let tail_len = tail.len() as u64;
    if tail_len == size {
        container::check_header(&tail[..container::HEADER_LEN as usize], file)?;
    }
    let footer = &tail[tail.len() - container::FOOTER_LEN as usize..];
    let (off, len) = container::parse_footer(footer, size, file)?;
    if len > manifest::MAX_MANIFEST_BYTES {
        return Err(Error::limit(
            "manifest size",
            manifest::MAX_MANIFEST_BYTES,
            format!("{file} declares {len} bytes"),
        ));
    }
    let tail_start = size - tail_len;
    if off >= tail_start {
        let s = (off - tail_start) as usize;
        Ok(Tail::Manifest(tail.slice(s..s + len as usize)))
    } else {
        Ok(Tail::Need(off..off + len))
    }
}

/// Open a location and read only its manifest.
///
/// # Errors
/// As [`Reader::open_async`].
pub async fn load_structure_async(loc: Location) -> Result<Tree<LeafInfo>> {
    Reader::open_async(loc).await?.structure()
}
