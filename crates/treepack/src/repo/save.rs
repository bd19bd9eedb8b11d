//! A save into a repository: a lease, the chunks already held, the new packs and their
//! indexes, the manifest under its hash, then the name's ref (create-only) — in that order, so
//! that whatever a crash leaves is either committed or garbage gc can tell apart.

use super::*;
use crate::format::codec::Codec;
use crate::format::manifest::{ChunkRef, Entry};
use crate::format::repo::{GcState, Lease};
use crate::save::Reuse;
use std::collections::{BTreeMap, HashSet};

/// A unique id for this save: time and randomness (names its packs and its lease).
fn save_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(now_ms());
    h.write_u32(std::process::id());
    format!("{:011x}{:016x}", now_ms() & 0xfff_ffff_ffff, h.finish())
}

/// Host and process, for a lease's `owner`; gc uses it to tell a dead local save.
pub(super) fn owner() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("{}:{}", host.trim(), std::process::id())
}

pub(super) async fn save(repo: &Repository, tree: &Node, name: &str, opts: &SaveOptions) -> Result<SaveInfo> {
    let target = repo.tree(name)?;
    let loc = &repo.loc;
    let ref_rel = layout::ref_path(name);
    // An overwrite replaces the version it finds now, or fails (compare-and-swap at the commit).
    let was = if opts.overwrite {
        loc.get_versioned(&ref_rel, layout::MAX_SMALL_FILE).await?.map(|(_, v)| v)
    } else if loc.exists(&ref_rel).await? {
        return Err(Error::AlreadyExists { location: target.display().to_string() });
    } else {
        None
    };
    let id = save_id();
    // The lease comes first: a gc that starts after it keeps every pack this save may reuse;
    // one that started before has written its gc state, which the reuse below reads.
    let lease_rel = format!("{}/{id}.json", layout::LEASES_DIR);
    let lease = Lease { started_ms: now_ms(), name: name.to_string(), owner: owner() };
    loc.put_tracked(&lease_rel, vec![Bytes::from(lease.encode())], true, false, None).await?;
    let out = save_leased(repo, tree, name, opts, id, was).await;
    // A lease left behind (a save cancelled or killed) only delays gc, until it expires or
    // its process is found dead.
    let _ = loc.delete(&lease_rel).await;
    out
}

async fn save_leased(
    repo: &Repository,
    tree: &Node,
    name: &str,
    opts: &SaveOptions,
    id: String,
    was: Option<crate::store::Version>,
) -> Result<SaveInfo> {
    let target = repo.tree(name)?;
    let loc = &repo.loc;
    let ref_rel = layout::ref_path(name);
    let before = loc.stats().bytes_written();
    let reuse = Arc::new(reuse(repo, id).await?);
    let w = crate::save::write_data(tree, loc, opts, Some(reuse)).await?;

    // The new packs' indexes: which chunks each holds (what later saves may reuse).
    let mut per_pack: BTreeMap<u32, BTreeMap<u64, (Hash32, u64, Codec)>> = BTreeMap::new();
    let new: HashSet<u32> = w
        .manifest
        .packs
        .iter()
        .enumerate()
        .filter(|(_, p)| w.new_names.contains(&p.path))
        .map(|(i, _)| i as u32)
        .collect();
    w.manifest.root.for_each_leaf_unpathed(&mut |e: &Entry| {
        for c in e.chunks() {
            let ChunkRef { pack, offset, length, codec, hash } = c;
            if new.contains(pack) {
                per_pack.entry(*pack).or_default().insert(*offset, (*hash, *length, *codec));
            }
        }
    });
    let indexes: Vec<(String, Vec<u8>)> = per_pack
        .into_iter()
        .filter_map(|(i, chunks)| {
            let p = w.manifest.packs.get(i as usize)?;
            let idx = PackIndex {
                pack: p.path.clone(),
                size: p.size,
                chunks: chunks.into_iter().map(|(off, (h, len, codec))| (h, off, len, codec)).collect(),
            };
            Some((layout::index_path(&p.path)?, idx.encode()))
        })
        .collect();
    if opts.durable && !new.is_empty() {
        loc.sync_dir(crate::store::PACKS_DIR).await?;
    }
    futures::stream::iter(indexes)
        .map(|(rel, bytes)| async move { loc.put_tracked(&rel, vec![Bytes::from(bytes)], true, opts.durable, None).await })
        .buffer_unordered(READ_CONCURRENCY)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<()>>>()?;

    // The manifest, named by its hash (an identical manifest already there is the same file).
    let root = crate::format::merkle::root_hash(&w.manifest.root);
    let mbytes = Bytes::from(manifest::encode(&w.manifest, &w.stats));
    let mbytes = if w.packed {
        manifest::pack(vec![mbytes], crate::save::MANIFEST_ZSTD_LEVEL).into_iter().next().unwrap_or_default()
    } else {
        mbytes
    };
    let tree_rel = layout::tree_path(&Hash32::of(&mbytes));
    match loc.put_tracked(&tree_rel, vec![mbytes], true, opts.durable, None).await {
        Ok(()) | Err(Error::AlreadyExists { .. }) => {}
        Err(e) => return Err(e),
    }
    let info = SaveInfo {
        location: target.display().to_string(),
        bytes_written: loc.stats().bytes_written() - before,
        ..w.info.clone()
    };
    let r = RefRecord {
        tree: tree_rel,
        root: root.to_hex(),
        saved_ms: now_ms(),
        bytes_written: info.bytes_written,
        bytes_reused: info.bytes_reused,
    };
    // The commit: create-only, so of two savers of one name exactly one wins; an overwrite is
    // a compare-and-swap against the version found when the save began.
    let body = Bytes::from(r.encode());
    let committed = if opts.overwrite {
        loc.replace_if_unchanged(&ref_rel, vec![body.clone()], was.as_ref(), opts.durable).await?
    } else {
        match loc.put_tracked(&ref_rel, vec![body.clone()], true, opts.durable, None).await {
            Ok(()) => true,
            Err(Error::AlreadyExists { .. }) => false,
            Err(e) => return Err(e),
        }
    };
    // A conditional put retried after its response was lost finds its own write: the ref holds
    // exactly these bytes (they carry this save's time and manifest), so this save won.
    if !committed && loc.get_opt(&ref_rel, layout::MAX_SMALL_FILE).await?.as_ref() != Some(&body) {
        let location = target.display().to_string();
        return Err(if opts.overwrite { Error::Conflict { location } } else { Error::AlreadyExists { location } });
    }
    let bytes_written = loc.stats().bytes_written() - before;
    Ok(SaveInfo { bytes_written, root: Some(root), ..info })
}

/// The chunks this save may refer to: every pack index, less the packs gc has condemned.
async fn reuse(repo: &Repository, prefix: String) -> Result<Reuse> {
    let loc = &repo.loc;
    let condemned = match loc.get_opt(layout::GC_STATE, layout::MAX_SMALL_FILE).await? {
        Some(b) => GcState::decode(&b).map_err(|r| Error::gc_state(loc.file_name(layout::GC_STATE), r))?.condemned,
        None => BTreeMap::new(),
    };
    let listed: Vec<String> = loc
        .list(layout::INDEX_DIR)
        .await?
        .into_iter()
        .map(|(rel, _, _)| rel)
        .filter(|r| r.ends_with(".json"))
        .collect();
    if let Ok(mut m) = repo.indexes.lock() {
        let keep: HashSet<&String> = listed.iter().collect();
        m.retain(|k, _| keep.contains(k));
    }
    let read: Vec<Option<Arc<PackIndex>>> = futures::stream::iter(listed)
        // An index that cannot be read is not reused (reuse only saves writing; `verify`
        // reports the damage).
        .map(|rel| async move { repo.read_index(&rel).await.ok() })
        .buffered(READ_CONCURRENCY)
        .collect()
        .await;
    // An index is only a claim about its pack: reuse a pack's chunks only when the pack is
    // there with the size its index says (every chunk lies inside that size: `PackIndex::decode`),
    // so a lying or stale index cannot make this save commit a tree that cannot be read. The
    // chunks' bytes are not hashed again here (that would read every reused byte on every save);
    // each load still verifies them, and `repo verify` finds a damaged pack (docs/design.md).
    let sizes: BTreeMap<String, u64> =
        loc.list(crate::store::PACKS_DIR).await?.into_iter().map(|(rel, size, _)| (rel, size)).collect();
    let mut out = Reuse { prefix, ..Default::default() };
    for idx in read.into_iter().flatten() {
        if condemned.contains_key(&idx.pack) || sizes.get(&idx.pack) != Some(&idx.size) {
            continue;
        }
        let i = out.packs.len() as u32;
        out.packs.push((idx.pack.clone(), idx.size));
        for &(h, off, len, codec) in &idx.chunks {
            out.known.entry(h).or_insert((i, off, len, codec));
        }
    }
    Ok(out)
}
