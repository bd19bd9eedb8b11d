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
    let (bytes, file) = stored_manifest(loc).await?;
    // A compressed manifest (format 1.6) is read as the JSON it holds, by every reader.
    Ok((manifest::unpack(bytes, &file)?, file))
}

/// The manifest's bytes as stored (compressed or not).
async fn stored_manifest(loc: &Location) -> Result<(Bytes, String)> {
    Ok(match loc.layout() {
        // A tree of a repository: found through its name (crate::Location, the naming layer).
        Layout::Directory if loc.tree_name().is_some() => loc.tree_manifest().await?,
        Layout::Directory => {
            let file = loc.file_name(MANIFEST_NAME);
            let Some(b) = loc.get_opt(MANIFEST_NAME, manifest::MAX_MANIFEST_BYTES).await? else {
                return Err(no_tree_here(loc, &file).await);
            };
            (b, file)
        }
        Layout::SingleFile => (read_single_manifest(loc).await?, loc.display().to_string()),
    })
}

/// The error for a folder without a manifest, saying what is there instead when that is
/// cheap to tell: a repository (name a tree of it), or the packs of a save that died before it
/// committed (which `gc` removes).
async fn no_tree_here(loc: &Location, file: &str) -> Error {
    if loc.exists(crate::format::repo::MARKER).await.unwrap_or(false) {
        return Error::NotFound {
            location: loc.display().to_string(),
            detail: format!(
                "this is a repository of named trees, not a tree: name one as `{0}@NAME` \
                 (`treepack repo ls {0}` lists them)",
                loc.display()
            ),
        };
    }
    // Another tool's checkpoint folder the Python package reads (Zarr, Orbax, JAX).
    if let Some(e) = python_read(loc, "folder") {
        return e;
    }
    let packs = loc.list(crate::store::PACKS_DIR).await.map(|v| v.len()).unwrap_or(0);
    if packs > 0 {
        return Error::NotFound {
            location: loc.display().to_string(),
            detail: format!(
                "no treepack tree found (`{file}` does not exist), but `{1}/` holds {packs} pack file{2}: a save \
                 that died before it committed leaves its packs behind; `treepack gc {0}` removes them (those older \
                 than an hour; `--grace-secs 0` once no save is running there), then save the tree again",
                loc.display(),
                crate::store::PACKS_DIR,
                if packs == 1 { "" } else { "s" },
            ),
        };
    }
    Error::no_tree(loc.display(), file)
}

async fn read_single_manifest(loc: &Location) -> Result<Bytes> {
    let (tail, size) = loc.read_suffix(".", TAIL_READ).await?;
    match locate_manifest(tail, size, loc.display()) {
        Ok(Tail::Manifest(b)) => Ok(b),
        Ok(Tail::Need(r)) => loc.read_range(".", r).await,
        Err(e @ Error::NotTreepack { .. }) => Err(python_read(loc, "file").unwrap_or(e)),
        Err(e) => Err(e),
    }
}

/// For a local file or folder of another tool that only the Python package reads (npy, npz,
/// HDF5, Zarr, Orbax, JAX; told by its content), the error that says so and what reads it.
fn python_read(loc: &Location, what: &str) -> Option<Error> {
    let fmt = loc.local_path().and_then(crate::convert::content_format).filter(|f| *f != "treepack")?;
    Some(Error::NotFound {
        location: loc.display().to_string(),
        detail: format!(
            "no treepack tree here: this is a {fmt} {what}, which the Python package reads \
             (treepack.load(\"{0}\"), treepack.open(\"{0}\")) or converts (python -m treepack convert {0} model.tpk)",
            loc.display()
        ),
    })
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
    if tail.ends_with(&crate::format::crypt::MAGIC) {
        return Err(Error::Encrypted {
            location: file.to_string(),
            with: crate::format::crypt::describe_stored(&tail),
        });
    }
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
