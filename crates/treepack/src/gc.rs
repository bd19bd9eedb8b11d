//! Garbage collection: remove what interrupted saves left behind, never what a committed
//! manifest references.

use crate::error::{Error, Result};
use crate::format::manifest;
use crate::store::{Layout, Location, MANIFEST_NAME, PACKS_DIR};
use std::collections::HashSet;

/// What [`gc_async`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Relative paths removed.
    pub removed: Vec<String>,
    /// Total size of the removed files, in bytes.
    pub bytes_freed: u64,
    /// Leftovers younger than the grace period (possibly a save still running), kept.
    pub kept_recent: Vec<String>,
}

/// Remove what interrupted saves left behind: pack files no committed manifest references and
/// half-written staging files (`name#N`). Files younger than `grace` are kept because they may
/// belong to a save that is still running.
///
/// # Errors
/// Refuses (with [`Error::InvalidManifest`] etc.) when a manifest exists but cannot be read, so
/// a damaged tree's data is never deleted.
pub async fn gc_async(loc: &Location, grace: std::time::Duration) -> Result<GcReport> {
    let now = std::time::SystemTime::now();
    let mut report = GcReport::default();
    let old_enough = |t: std::time::SystemTime| now.duration_since(t).map(|d| d >= grace).unwrap_or(false);
    match loc.layout() {
        Layout::Directory => {
            let referenced: HashSet<String> = match loc.get_opt(MANIFEST_NAME, manifest::MAX_MANIFEST_BYTES).await? {
                Some(b) => {
                    manifest::decode(&b, &loc.file_name(MANIFEST_NAME))?.packs.into_iter().map(|p| p.path).collect()
                }
                None => HashSet::new(),
            };
            let mut candidates = loc.list(PACKS_DIR).await?;
            candidates.extend(loc.list("").await?.into_iter().filter(|(p, _, _)| p.contains('#')));
            for (rel, size, modified) in candidates {
                let rel = rel.trim_start_matches('/').to_string();
                if referenced.contains(&rel) || rel == MANIFEST_NAME {
                    continue;
                }
                if !old_enough(modified) {
                    report.kept_recent.push(rel);
                    continue;
                }
                if rel.contains('#') {
                    loc.remove_local(&rel)?;
                } else {
                    loc.delete(&rel).await?;
                }
                report.bytes_freed += size;
                report.removed.push(rel);
            }
        }
        Layout::SingleFile => {
            if let Some(file) = loc.local_path() {
                let (Some(dir), Some(name)) = (file.parent(), file.file_name().and_then(|n| n.to_str())) else {
                    return Ok(report);
                };
                let prefix = format!("{name}#");
                let rd = std::fs::read_dir(dir).map_err(|e| Error::Io { path: dir.to_path_buf(), source: e })?;
                for ent in rd.flatten() {
                    let fname = ent.file_name().to_string_lossy().into_owned();
                    if !fname.starts_with(&prefix) {
                        continue;
                    }
                    let Ok(meta) = ent.metadata() else { continue };
                    if !old_enough(meta.modified().unwrap_or(now)) {
                        report.kept_recent.push(fname);
                        continue;
                    }
                    std::fs::remove_file(ent.path()).map_err(|e| Error::Io { path: ent.path(), source: e })?;
                    report.bytes_freed += meta.len();
                    report.removed.push(fname);
                }
            }
        }
    }
    Ok(report)
}
