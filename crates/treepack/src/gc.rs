//! Garbage collection: remove what interrupted saves left behind, never what a committed
//! manifest references.

use crate::error::Result;
use crate::format::manifest;
use crate::store::{Layout, MANIFEST_NAME, PACKS_DIR};
use crate::Location;
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
/// belong to a save that is still running; on local disk, so is every file modified since the
/// oldest save still running there started (its marker, see `store::marker`), whatever the
/// grace, and markers of saves that died are removed.
///
/// Order matters against saves that commit meanwhile: the manifest is read, the candidates
/// listed, the running saves found, and the manifest read again; a file referenced by either
/// manifest is kept. (A save that wrote a listed file either still runs at the marker scan, or
/// committed before the second read.)
///
/// # Errors
/// Refuses (with [`Error::InvalidManifest`](crate::Error::InvalidManifest) etc.) when a
/// manifest exists but cannot be read, so a damaged tree's data is never deleted; refuses with
/// [`Error::Link`](crate::Error::Link), before removing anything, when a symbolic link is met
/// inside a local location (a linked `packs/`, a leftover or marker name that is a link): gc
/// removes only regular files it found beneath the location (treepack-store's local/beneath.rs).
pub async fn gc_async(loc: &Location, grace: std::time::Duration) -> Result<GcReport> {
    let now = std::time::SystemTime::now();
    let mut report = GcReport::default();
    match loc.layout() {
        Layout::Directory => {
            let mut referenced = referenced_packs(loc).await?;
            let mut candidates = loc.list(PACKS_DIR).await?;
            let leftover = |p: &str| p.contains('#');
            candidates.extend(loc.list_where("", leftover).await?.into_iter().filter(|(p, _, _)| leftover(p)));
            let (running_since, stale) = loc.running_saves()?;
            report.removed.extend(stale);
            referenced.extend(referenced_packs(loc).await?);
            for (rel, size, modified) in candidates {
                let rel = rel.trim_start_matches('/').to_string();
                if referenced.contains(&rel) || rel == MANIFEST_NAME {
                    continue;
                }
                if !removable(now, modified, grace, running_since) {
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
            let Some(local) = loc.local() else { return Ok(report) };
            // The file's folder is the root: its leftovers are names in it, each refused if it
            // is a link (before anything is removed) and otherwise removed from that folder.
            let candidates = local.leftovers_beside()?;
            let (running_since, stale) = loc.running_saves()?;
            report.removed.extend(stale);
            for (fname, size, modified) in candidates {
                if !removable(now, modified, grace, running_since) {
                    report.kept_recent.push(fname);
                    continue;
                }
                // Gone already: renamed into place by the save that owned it meanwhile.
                if !local.remove_beside(&fname)? {
                    continue;
                }
                report.bytes_freed += size;
                report.removed.push(fname);
            }
        }
    }
    Ok(report)
}

/// Packs the committed manifest references (none if there is no manifest).
async fn referenced_packs(loc: &Location) -> Result<HashSet<String>> {
    Ok(match loc.get_opt(MANIFEST_NAME, manifest::MAX_MANIFEST_BYTES).await? {
        Some(b) => {
            let file = loc.file_name(MANIFEST_NAME);
            manifest::decode(&manifest::unpack(b, &file)?, &file)?.packs.into_iter().map(|p| p.path).collect()
        }
        None => HashSet::new(),
    })
}

/// A leftover may go once it is older than the grace period and was not modified since the
/// oldest running save started (a second of slack for file-system timestamp granularity).
fn removable(
    now: std::time::SystemTime,
    modified: std::time::SystemTime,
    grace: std::time::Duration,
    running_since: Option<std::time::SystemTime>,
) -> bool {
    let old_enough = now.duration_since(modified).map(|d| d >= grace).unwrap_or(false);
    let before_running = running_since.is_none_or(|t| modified + std::time::Duration::from_secs(1) < t);
    old_enough && before_running
}
