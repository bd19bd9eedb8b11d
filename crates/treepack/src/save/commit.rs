//! The end of a save: its manifest (or its single file) committed after its packs, and saves
//! written in parts by several processes (one part each, merged and committed by one of them).

use super::*;

pub(super) async fn old_packs(loc: &Location) -> Option<Vec<String>> {
    let bytes = loc.get_opt(MANIFEST_NAME, manifest::MAX_MANIFEST_BYTES).await.ok()??;
    let bytes = manifest::unpack(bytes, MANIFEST_NAME).ok()?;
    let packs = manifest::packs_of(&bytes, MANIFEST_NAME).ok()?;
    Some(packs.into_iter().map(|p| p.path).collect())
}

/// Write one process's part of a save that many processes share (format::parts): its packs,
/// and the manifest it would commit, returned (encoded) instead of committed. The committer
/// passes every part's manifest to [`commit_parts_async`]. Directory layout only.
///
/// # Errors
/// As [`save_async`]; [`Error::BadLocation`] for a single-file location.
pub async fn save_part_async(tree: &Node, loc: &Location, opts: &SaveOptions) -> Result<(Vec<u8>, SaveInfo)> {
    if loc.layout() == Layout::SingleFile {
        return Err(Error::BadLocation {
            location: loc.display().to_string(),
            reason: "a save written by several processes needs a directory (or object-store prefix), not one file"
                .into(),
        });
    }
    refuse_repository(loc)?;
    refuse_encrypted_parts(loc)?;
    let w = write_data(tree, loc, opts, None).await?;
    let bytes = manifest::encode(&w.manifest, &w.stats);
    Ok((bytes, w.info))
}

/// Commit a save written in parts: merge the parts' manifests (each from
/// [`save_part_async`], the committer's own first) into one and commit it at `loc` as a save
/// does (create-only unless `opts.overwrite`; packs of a replaced tree removed after).
///
/// # Errors
/// [`Error::Parts`] when the parts do not make one tree; [`Error::AlreadyExists`] unless
/// overwriting; storage errors.
pub async fn commit_parts_async(loc: &Location, parts: &[Vec<u8>], opts: &SaveOptions) -> Result<SaveInfo> {
    loc.refuse_write()?;
    refuse_repository(loc)?;
    refuse_encrypted_parts(loc)?;
    let decoded =
        parts.iter().enumerate().map(|(i, b)| manifest::decode(b, &format!("part {i}"))).collect::<Result<Vec<_>>>()?;
    let mut merged = crate::format::parts::merge(decoded)?;
    let has_refs = merged.root.has_refs();
    let mut leaves = 0usize;
    let (mut arrays, mut array_bytes, mut annotated, mut compressed) = (0usize, 0u64, false, false);
    let mut dtype_minor = 0u16;
    merged.root.for_each_leaf_unpathed(&mut |e: &Entry| {
        leaves += 1;
        if let Entry::Array(a) = e {
            arrays += 1;
            array_bytes += a.nbytes();
            annotated |= a.annotation.is_some();
            dtype_minor = dtype_minor.max(a.dtype.since_minor());
        }
        compressed |= e.chunks().iter().any(|c| !c.codec.is_identity());
    });
    // As a save stamps its manifest (the merged tree's dicts are written as objects too).
    let object_dicts = manifest::has_object_dicts(&merged.root);
    merged.version.1 = super::oldest_minor(dtype_minor, object_dicts, annotated, has_refs, compressed);
    // Parts go to a directory: its manifest is plain JSON unless asked.
    let packed = opts.manifest_compression == Some(true);
    if packed {
        merged.version.1 = merged.version.1.max(manifest::PACKED_MINOR);
    }
    let exists = loc.exists(MANIFEST_NAME).await?;
    if exists && !opts.overwrite {
        return Err(Error::AlreadyExists { location: loc.display().to_string() });
    }
    let previous = if exists { old_packs(loc).await } else { None };
    let stored: u64 = merged.packs.iter().map(|p| p.size).sum();
    let pack_count = merged.packs.len();
    let stats = json!({"leaves": leaves, "arrays": arrays, "array_bytes": array_bytes, "stored_bytes": stored, "parts": parts.len()});
    let tracker = Tracker::new(opts.progress.clone(), 0);
    let before = loc.stats().bytes_written();
    let new_names: HashSet<String> = merged.packs.iter().map(|p| p.path.clone()).collect();
    let w = Written {
        manifest: merged,
        packed,
        stats,
        previous,
        single_parts: None,
        single_stream: None,
        new_names,
        stored,
        tracker,
        before,
        info: SaveInfo {
            location: loc.display().to_string(),
            leaves,
            arrays,
            array_bytes,
            bytes_written: 0,
            chunks: 0,
            unique_chunks: 0,
            packs: pack_count,
            bytes_reused: 0,
            root: None,
        },
        _marker: None,
    };
    commit(loc, w, opts).await
}

/// Saves written in parts go to plain locations only (for now): a repository's saves take a
/// lease and reuse its chunks, which the parts' writers would each have to do.
/// Parts written by several processes would each make their own data key, and the manifest
/// holds one: an encrypted save is written by one process.
fn refuse_encrypted_parts(loc: &Location) -> Result<()> {
    if loc.is_encrypted() {
        return Err(Error::BadLocation {
            location: loc.display().to_string(),
            reason: "a save written in parts by several processes cannot be encrypted yet (each process would \
                     make its own data key): save the tree from one process, or save it plain"
                .into(),
        });
    }
    Ok(())
}

fn refuse_repository(loc: &Location) -> Result<()> {
    if loc.tree_name().is_some() {
        return Err(Error::BadLocation {
            location: loc.display().to_string(),
            reason: "a save written by several processes (JAX, Dask) cannot go into a repository yet; save it to a \
                     plain location, then copy it in (treepack cp SRC REPO@NAME)"
                .into(),
        });
    }
    Ok(())
}

/// Everything a save has written or decided before its commit.
pub(crate) struct Written {
    pub(crate) manifest: Manifest,
    /// Whether the manifest is stored compressed (`SaveOptions::packs_manifest`; its version
    /// says 1.6 then).
    pub(crate) packed: bool,
    pub(crate) stats: serde_json::Value,
    /// Packs of the tree being replaced (directory layout), removed after the commit.
    pub(crate) previous: Option<Vec<String>>,
    /// The single-file layout's one pack (its parts, or those not streamed yet), written with
    /// the manifest.
    pub(crate) single_parts: Option<PackOut>,
    /// A single file being written as its chunks were hashed: the manifest and the footer are
    /// its last parts.
    pub(crate) single_stream: Option<SingleStream>,
    pub(crate) new_names: HashSet<String>,
    pub(crate) stored: u64,
    pub(crate) tracker: Tracker,
    /// Bytes the location had written before this save (for `bytes_written`).
    pub(crate) before: u64,
    pub(crate) info: SaveInfo,
    /// Held until the save ends: `gc` keeps whatever it writes (store::marker).
    pub(crate) _marker: Option<crate::store::SaveMarker>,
}

/// Write the manifest (or, for one file, the whole file) of what [`write_data`] wrote, then
/// remove the packs only a replaced tree used.
pub(super) async fn commit(loc: &Location, w: Written, opts: &SaveOptions) -> Result<SaveInfo> {
    let single = loc.layout() == Layout::SingleFile;
    let mparts = manifest::encode_parts(&w.manifest, &w.stats);
    let mparts = if w.packed { manifest::pack(mparts, super::MANIFEST_ZSTD_LEVEL) } else { mparts };
    let mlen: u64 = mparts.iter().map(|p| p.len() as u64).sum();
    let minor = w.manifest.version.1;
    let leaves = w.info.leaves;
    let pack_count = w.manifest.packs.len();
    if leaves >= BACKGROUND_DROP_LEAVES {
        super::drop_in_background(w.manifest);
    } else {
        drop(w.manifest);
    }
    let tracker = &w.tracker;
    if single {
        let streamed = w.single_stream;
        let mut parts = match &streamed {
            Some(_) => vec![],
            None => vec![Bytes::copy_from_slice(&container::header(minor))],
        };
        let mut end = container::HEADER_LEN;
        if let Some((_, p, size)) = w.single_parts {
            parts.extend(p);
            end = size;
        }
        tracker.set_total(end + mlen + container::FOOTER_LEN);
        parts.extend(mparts);
        parts.push(Bytes::copy_from_slice(&container::footer(end, mlen)));
        match streamed {
            Some(s) if s.minor != minor => {
                return Err(Error::internal("a streamed single file's header does not match its manifest's version"))
            }
            Some(s) => {
                tracker.advance(parts.iter().map(|p| p.len() as u64).sum());
                s.finish(parts)?;
            }
            None => loc.put_tracked(".", parts, !opts.overwrite, opts.durable, Some(tracker)).await?,
        }
    } else {
        tracker.set_total(w.stored + mlen);
        // Commit protocol: the packs' names are made durable before the manifest that names
        // them; the manifest (fsynced, renamed, its directory fsynced) before any pack of the
        // tree it replaces is removed.
        if opts.durable && pack_count > 0 {
            loc.sync_dir(PACKS_DIR).await?;
        }
        loc.put_tracked(MANIFEST_NAME, mparts, !opts.overwrite, opts.durable, Some(tracker)).await?;
        if let Some(old) = w.previous {
            for p in old
                .into_iter()
                .filter(|p| !w.new_names.contains(p) && manifest::validate_pack_path(p).is_ok() && p != ".")
            {
                loc.delete(&p).await?;
            }
        }
    }
    Ok(SaveInfo { bytes_written: loc.stats().bytes_written() - w.before, packs: pack_count, ..w.info })
}

/// Parts a streamed single file's hashing may be ahead of its writer: two default batches (64
/// MiB) of default chunks (4 MiB), and more of smaller ones.
const STREAM_PARTS_AHEAD: usize = 64;

/// A single file written while its chunks are hashed: its header first, its chunks as they are
/// laid out, its manifest and footer at the commit, all through one streamed put on a thread of
/// its own (local disk: the file under its staging name, committed only after the footer).
/// Dropped unfinished (a failed save), it ends the put with an error, so nothing is committed.
pub(crate) struct SingleStream {
    tx: Option<std::sync::mpsc::SyncSender<Result<Bytes>>>,
    done: Option<std::thread::JoinHandle<Result<()>>>,
    /// The format version its header was written with.
    pub(crate) minor: u16,
}

impl SingleStream {
    /// Start the put of `loc`'s single file, sending its header (version `minor`).
    pub(crate) fn start(loc: &Location, minor: u16, create_only: bool, durable: bool) -> Result<SingleStream> {
        // Parts are slices of the caller's buffers (or small parts gathered), not copies: the
        // hashing may run two batches of chunks ahead of the writer, so that neither waits for
        // the other between batches.
        let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Bytes>>(STREAM_PARTS_AHEAD);
        let loc = loc.clone();
        let background = crate::runtime::is_background();
        let done = std::thread::Builder::new()
            .name("treepack-write".into())
            .spawn(move || {
                crate::runtime::in_background_if(background, || {
                    futures::executor::block_on(loc.put_stream(
                        ".",
                        Box::new(rx.into_iter()),
                        create_only,
                        durable,
                        None,
                    ))
                })
            })
            .map_err(|e| Error::Io { path: "treepack-write thread".into(), source: e })?;
        let s = SingleStream { tx: Some(tx), done: Some(done), minor };
        s.send(Bytes::copy_from_slice(&container::header(minor)));
        Ok(s)
    }

    /// Send the next part; `false` when the put has stopped (see [`failed`](Self::failed)).
    pub(crate) fn send(&self, part: Bytes) -> bool {
        self.tx.as_ref().is_some_and(|t| t.send(Ok(part)).is_ok())
    }

    /// The error the put stopped with.
    pub(crate) fn failed(&mut self) -> Error {
        drop(self.tx.take());
        match self.join() {
            Err(e) => e,
            Ok(()) => Error::internal("the single file's writer stopped without an error"),
        }
    }

    /// Send the last parts and wait for the file to be committed.
    fn finish(mut self, last: Vec<Bytes>) -> Result<()> {
        for p in last {
            if !self.send(p) {
                break;
            }
        }
        drop(self.tx.take());
        self.join()
    }

    fn join(&mut self) -> Result<()> {
        self.done
            .take()
            .map_or(Ok(()), |h| h.join().unwrap_or_else(|_| Err(Error::internal("the single file's writer panicked"))))
    }
}

impl Drop for SingleStream {
    fn drop(&mut self) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(Err(Error::internal("the save stopped before its file was complete")));
        }
        let _ = self.join();
    }
}
