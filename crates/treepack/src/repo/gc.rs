//! Repository gc: remove packs and manifests no committed name needs, never one a save in
//! progress may still refer to (docs/repository.md, "How gc stays safe").
//!
//! The protocol. A save writes a lease, then reads the gc state, and reuses no pack the state
//! condemns. gc (1) reads every ref and the packs their manifests name, (2) lists packs and
//! manifests, and condemns those unreferenced in the gc state, written before anything is
//! deleted; (3) lists leases: any live one defers every deletion (that save may have read the
//! state before step 2 and reuse a pack it condemns); (4) reads the refs again, so a save that
//! committed while gc ran keeps its packs; then (5) deletes what has been condemned for at
//! least `grace` — a pack's index before the pack, so no later save finds a pack that is gone.
//! A save that starts after step 2 has read the new state and reuses nothing condemned.

use super::*;
use crate::format::repo::{GcState, Lease};
use std::collections::{BTreeMap, HashSet};

/// A lease older than this belongs to a save that died (or one too slow to be safe: saves
/// must finish within it). Leases of dead processes on this host are removed at once.
pub const LEASE_EXPIRY_MS: u64 = 6 * 3600 * 1000;

/// Staging files younger than this are left alone whatever the grace (a save may be writing).
const STAGING_GRACE_MS: u64 = 600 * 1000;

/// What [`Repository::gc_async`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RepoGcReport {
    /// Packs and manifests removed (paths relative to the repository).
    pub removed: Vec<String>,
    /// Their total size.
    pub bytes_freed: u64,
    /// Unreferenced files kept for now: younger than the grace period as garbage, or a save
    /// was running.
    pub waiting: Vec<String>,
    /// Saves in progress that deferred deletions.
    pub saves_running: usize,
    /// Leases of saves that died, removed.
    pub leases_removed: usize,
}

/// `read` of each item, [`READ_CONCURRENCY`] at a time, the results in the items' order.
async fn read_each<I: IntoIterator, T, F: std::future::Future<Output = Result<T>>>(
    items: I,
    read: impl FnMut(I::Item) -> F,
) -> Vec<Result<T>> {
    futures::stream::iter(items).map(read).buffered(READ_CONCURRENCY).collect().await
}

/// The manifests the refs name, and the packs those manifests name.
async fn referenced(repo: &Repository) -> Result<(HashSet<String>, HashSet<String>)> {
    let listed = repo.loc.list(layout::REFS_DIR).await?;
    let names: Vec<String> =
        listed.iter().filter_map(|(rel, _, _)| layout::name_of_ref(rel).map(str::to_string)).collect();
    let refs = read_each(names, |n| async move { repo.read_ref(&n).await }).await;
    let mut trees = HashSet::new();
    for r in refs {
        if let Some(r) = r? {
            trees.insert(r.tree);
        }
    }
    let lists = read_each(trees.iter().cloned(), |t| async move { repo.packs_of_tree(&t).await }).await;
    let mut packs = HashSet::new();
    for l in lists {
        packs.extend(l?.iter().cloned());
    }
    Ok((trees, packs))
}

fn lease_dead(l: &Lease, now: u64) -> bool {
    if l.started_ms.saturating_add(LEASE_EXPIRY_MS) < now {
        return true;
    }
    // On this host, a lease whose process is gone is dead (pid reuse only keeps it longer).
    let me = super::save::owner();
    let (host, _) = me.rsplit_once(':').unwrap_or(("", ""));
    match l.owner.rsplit_once(':') {
        Some((h, pid)) if !host.is_empty() && h == host && cfg!(target_os = "linux") => {
            pid.parse::<u32>().is_ok_and(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
        }
        _ => false,
    }
}

/// Whether a local staging file (`name#<pid>-<n>`) belongs to a process that no longer runs
/// (staging files are local, so the pid is one of this host's).
fn staging_owner_dead(rel: &str) -> bool {
    let pid = rel.rsplit_once('#').and_then(|(_, t)| t.split_once('-')).and_then(|(p, _)| p.parse::<u32>().ok());
    cfg!(target_os = "linux") && pid.is_some_and(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
}

pub(super) async fn gc(repo: &Repository, grace: std::time::Duration) -> Result<RepoGcReport> {
    let loc = &repo.loc;
    loc.refuse_write()?;
    let start = now_ms();
    let state_file = loc.file_name(layout::GC_STATE);
    let old = match loc.get_opt(layout::GC_STATE, layout::MAX_SMALL_FILE).await? {
        Some(b) => GcState::decode(&b).map_err(|r| Error::gc_state(&state_file, r))?,
        None => GcState::default(),
    };
    // (1) and (2): what is needed, what is stored, and the rest condemned.
    let (trees, packs) = referenced(repo).await?;
    let mut sizes: BTreeMap<String, u64> = BTreeMap::new();
    for dir in [crate::store::PACKS_DIR, layout::TREES_DIR] {
        for (rel, size, _) in loc.list(dir).await? {
            if !trees.contains(&rel) && !packs.contains(&rel) && manifest::validate_pack_path(&rel).is_ok() {
                sizes.insert(rel, size);
            }
        }
    }
    let state = GcState {
        condemned: sizes.keys().map(|k| (k.clone(), old.condemned.get(k).copied().unwrap_or(start))).collect(),
    };
    if state != old {
        loc.put_tracked(layout::GC_STATE, vec![Bytes::from(state.encode())], false, true, None).await?;
    }
    let mut report = RepoGcReport::default();
    // (3) Saves in progress.
    let now = now_ms();
    for (rel, _, _) in loc.list(layout::LEASES_DIR).await? {
        if !rel.ends_with(".json") {
            continue; // a lease being written (a local staging file)
        }
        let Some(b) = loc.get_opt(&rel, layout::MAX_SMALL_FILE).await? else { continue };
        match Lease::decode(&b) {
            Ok(l) if !lease_dead(&l, now) => report.saves_running += 1,
            // A damaged lease is treated as a dead one: it cannot say when it started.
            _ => {
                loc.delete(&rel).await?;
                report.leases_removed += 1;
            }
        }
    }
    if report.saves_running > 0 {
        report.waiting = state.condemned.into_keys().collect();
        return Ok(report);
    }
    // (4) Saves that committed while this ran keep what they name.
    let (trees, packs) = referenced(repo).await?;
    // (5) Delete what waited long enough.
    let grace_ms = grace.as_millis() as u64;
    let mut left = GcState::default();
    for (rel, since) in state.condemned {
        if trees.contains(&rel) || packs.contains(&rel) {
            continue;
        }
        if now.saturating_sub(since) < grace_ms {
            report.waiting.push(rel.clone());
            left.condemned.insert(rel, since);
            continue;
        }
        if let Some(idx) = layout::index_path(&rel) {
            loc.delete(&idx).await?;
        }
        loc.delete(&rel).await?;
        report.bytes_freed += sizes.get(&rel).copied().unwrap_or(0);
        report.removed.push(rel);
    }
    // Indexes of packs that no longer exist (an interrupted gc) are removed too.
    let stored: HashSet<String> = loc.list(crate::store::PACKS_DIR).await?.into_iter().map(|(rel, _, _)| rel).collect();
    for (rel, _, _) in loc.list(layout::INDEX_DIR).await? {
        let pack = rel.strip_prefix("index/").and_then(|s| s.strip_suffix(".json")).map(|s| format!("packs/{s}.tpp"));
        if pack.is_some_and(|p| !stored.contains(&p)) {
            loc.delete(&rel).await?;
        }
    }
    // Staging files of local saves that died mid-write (`name#<pid>-<n>`): those of dead
    // processes, and old ones (a save starting meanwhile writes fresh ones).
    let staging_ms = grace_ms.max(STAGING_GRACE_MS);
    for dir in [crate::store::PACKS_DIR, layout::TREES_DIR, layout::INDEX_DIR, layout::REFS_DIR, layout::LEASES_DIR] {
        for (rel, size, modified) in loc.list(dir).await? {
            let age = std::time::SystemTime::now().duration_since(modified).map(|d| d.as_millis() as u64).unwrap_or(0);
            if rel.contains('#') && (age >= staging_ms || staging_owner_dead(&rel)) && loc.remove_local(&rel)? {
                report.bytes_freed += size;
                report.removed.push(rel);
            }
        }
    }
    if !report.removed.is_empty() {
        loc.put_tracked(layout::GC_STATE, vec![Bytes::from(left.encode())], false, true, None).await?;
    }
    Ok(report)
}
