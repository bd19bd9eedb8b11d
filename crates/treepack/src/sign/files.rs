//! File digests in the form of the OpenSSF model-signing specification 1.0 (its `files`
//! serialization: one SHA-256 per file, named by its path in the model folder), so that its
//! reference verifier checks a signed treepack tree's files as it checks any model's.
//!
//! They describe one layout's files: a directory's `treepack.json` and packs, or a `.tpk`
//! itself. A copy to another layout has other files, so these digests do not hold for it (the
//! treepack signature, over the root hash, still does).

use crate::error::{Error, Result};
use crate::format::manifest::Manifest;
use crate::format::signature::ModelSigning;
use crate::store::{Layout, MANIFEST_NAME};
use crate::Location;
use sha2::Digest as _;

/// Bytes read at once while hashing a file.
const PIECE: u64 = 16 << 20;

/// SHA-256 of the whole file `rel` of `loc`, read in pieces.
async fn sha256(loc: &Location, rel: &str) -> Result<[u8; 32]> {
    let size = loc.size(rel).await?;
    let mut h = sha2::Sha256::new();
    let mut at = 0;
    while at < size {
        let end = (at + PIECE).min(size);
        h.update(&loc.read_range(rel, at..end).await?);
        at = end;
    }
    Ok(h.finalize().into())
}

/// The digests of the files that hold the tree at `loc` (its manifest `m`): for a directory its
/// manifest and every pack (the signature file `sig_rel` left out), for a single file the file.
///
/// # Errors
/// [`Error::BadLocation`] for a tree of a repository (its packs are shared with other trees, so
/// no folder holds just its files); storage errors.
pub(super) async fn digests(loc: &Location, m: &Manifest, sig_rel: &str) -> Result<ModelSigning> {
    // The files as they are on disk: an encrypted tree's sealed bytes (the digests of its plain
    // bytes would let anyone confirm a guess of a file's content, and describe no file there).
    let stored: Location = loc.store().stored().into();
    if loc.tree_name().is_some() {
        return Err(Error::BadLocation {
            location: loc.display().to_string(),
            reason: "a repository's trees share packs, so no folder holds one tree's files for the model-signing \
                     verifier to check: sign without file digests, or copy the tree to a folder or .tpk and sign that"
                .into(),
        });
    }
    if loc.layout() == Layout::SingleFile {
        return Ok(ModelSigning { files: vec![(".".into(), sha256(&stored, ".").await?)], ignore_paths: vec![] });
    }
    let mut names: Vec<&str> = std::iter::once(MANIFEST_NAME).chain(m.packs.iter().map(|p| p.path.as_str())).collect();
    names.sort_unstable();
    names.dedup();
    let mut files = Vec::with_capacity(names.len());
    for n in names {
        files.push((n.to_string(), sha256(&stored, n).await?));
    }
    Ok(ModelSigning { files, ignore_paths: vec![sig_rel.to_string()] })
}
