//! Hashing, dedup and pack layout: chunks hashed (with their previews' min/max) and compressed
//! in parallel batches, each unique chunk placed in a pack in order, and each pack written as
//! soon as it is complete while later chunks are still hashed. A repository's save hands in the
//! chunks it already holds ([`Reuse`]), which are referred to instead of written again.

use super::Pending;
use crate::error::{Error, Result};
use crate::format::codec::Codec;
use crate::format::container::{self, align_up};
use crate::format::hash::Hash32;
use crate::format::manifest::ChunkRef;
use crate::format::preview;
use crate::progress::Tracker;
use crate::store::PACKS_DIR;
use crate::Location;
use bytes::{Bytes, BytesMut};
use futures::{StreamExt, TryStreamExt};
use rayon::prelude::*;
use std::collections::HashMap;

/// Chunks a repository already holds, which a save into it refers to instead of writing again
/// (crate::repo): hash → where the stored bytes are.
#[derive(Debug, Default)]
pub(crate) struct Reuse {
    /// Each known chunk: (index into `packs`, offset, stored length, codec).
    pub(crate) known: HashMap<Hash32, (u32, u64, u64, Codec)>,
    /// The packs known chunks are in: (path, size).
    pub(crate) packs: Vec<(String, u64)>,
    /// This save's new packs are `packs/<prefix>-<n>.tpp` (unique per save: a repository never
    /// writes a pack name twice).
    pub(crate) prefix: String,
}

/// Marks a [`ChunkRef::pack`] that points into `Reuse::packs` (at `pack - KNOWN_PACK`) until
/// the layout knows how many new packs come first.
const KNOWN_PACK: u32 = 1 << 31;

/// A finished pack: (relative path, parts to write, size).
pub(super) type PackOut = (String, Vec<Bytes>, u64);

/// Where each unique chunk goes, decided chunk by chunk in layout order so that a pack can be
/// written as soon as it is complete, while later chunks are still being hashed.
struct Layouter {
    single: bool,
    reuse: Option<std::sync::Arc<Reuse>>,
    /// Bytes and chunks found in `reuse` (not written again).
    reused_bytes: u64,
    reused_chunks: usize,
    /// The `reuse` packs referred to so far, in first-use order (a ref's pack is
    /// `KNOWN_PACK + position here`).
    known_used: Vec<u32>,
    known_slot: HashMap<u32, u32>,
    pack_bytes: u64,
    /// For each chunk added so far: its final ref.
    refs: Vec<ChunkRef>,
    seen: HashMap<Hash32, ChunkRef>,
    /// BLAKE3 over (hash, pack index) of every stored chunk so far: names the packs.
    id: blake3::Hasher,
    /// The pack being filled: (parts, size).
    open: Option<(Vec<Bytes>, u64)>,
    /// Packs finished so far.
    closed: usize,
}

impl Layouter {
    fn new(single: bool, pack_bytes: u64, reuse: Option<std::sync::Arc<Reuse>>, name_key: Option<[u8; 32]>) -> Self {
        Layouter {
            single,
            reuse,
            reused_bytes: 0,
            reused_chunks: 0,
            known_used: vec![],
            known_slot: HashMap::new(),
            pack_bytes,
            refs: vec![],
            seen: HashMap::new(),
            id: name_key.as_ref().map_or_else(blake3::Hasher::new, blake3::Hasher::new_keyed),
            open: None,
            closed: 0,
        }
    }

    /// Place one chunk; returns the previous pack when this chunk starts a new one.
    fn add(&mut self, data: &Bytes, h: Hash32, codec: Codec) -> Option<PackOut> {
        if let Some(r) = self.seen.get(&h) {
            self.refs.push(r.clone());
            return None;
        }
        if let Some(&(pack, offset, length, codec)) = self.reuse.as_ref().and_then(|r| r.known.get(&h)) {
            let next = self.known_used.len() as u32;
            let slot = *self.known_slot.entry(pack).or_insert(next);
            if slot == next {
                self.known_used.push(pack);
            }
            let r = ChunkRef { pack: KNOWN_PACK + slot, offset, length, codec, hash: h };
            self.reused_bytes += length;
            self.reused_chunks += 1;
            self.seen.insert(h, r.clone());
            self.refs.push(r);
            return None;
        }
        let len = data.len() as u64;
        let full = !self.single && self.open.as_ref().is_some_and(|(_, s)| *s > 0 && *s + len > self.pack_bytes);
        let finished = if full { self.close() } else { None };
        let base = if self.single { container::HEADER_LEN } else { 0 };
        let idx = self.closed;
        let (parts, size) = self.open.get_or_insert_with(|| (vec![], base));
        let off = align_up(*size);
        if off > *size {
            parts.push(Bytes::from_static(&ZEROS[..(off - *size) as usize]));
        }
        parts.push(data.clone());
        *size = off + len;
        let r = ChunkRef { pack: idx as u32, offset: off, length: len, codec, hash: h };
        self.id.update(&h.0);
        self.id.update(&[idx as u8]);
        self.seen.insert(h, r.clone());
        self.refs.push(r);
        finished
    }

    /// The parts of the open pack laid out so far, taken out of it (its size stays): a single
    /// file written as it is laid out (`stream` of [`hash_and_layout`]).
    fn take_open_parts(&mut self) -> Vec<Bytes> {
        self.open.as_mut().map(|(parts, _)| coalesce(std::mem::take(parts))).unwrap_or_default()
    }

    /// Finish the open pack. Pack `n` is named by the BLAKE3 of the (hash, pack) records of
    /// every chunk stored in packs 0..=n: known the moment the pack is full, deterministic and
    /// content-derived (docs/format.md, "Writer rules for layout").
    fn close(&mut self) -> Option<PackOut> {
        let (parts, size) = self.open.take()?;
        let n = self.closed;
        self.closed += 1;
        let name = if self.single {
            ".".to_string()
        } else if let Some(r) = &self.reuse {
            format!("{PACKS_DIR}/{}-{n}.tpp", r.prefix)
        } else {
            format!("{PACKS_DIR}/{}-{n}.tpp", &self.id.finalize().to_hex()[..16])
        };
        Some((name, coalesce(parts), size))
    }
}

/// What hashing and layout produced, besides the packs.
pub(super) struct Hashed {
    pub(super) refs: Vec<ChunkRef>,
    /// Per pending chunk: its min/max (previews).
    pub(super) min_max: Vec<Option<(f64, f64)>>,
    pub(super) unique: usize,
    /// Chunks (and their stored bytes) found in the repository instead of written.
    pub(super) reused_chunks: usize,
    pub(super) reused_bytes: u64,
    /// The `Reuse::packs` (by index) referred to, in the order their refs were numbered
    /// after the new packs.
    pub(super) known_packs: Vec<u32>,
}

/// A chunk's hash, min/max (previews) and compressed form (when the policy compressed it).
type ChunkStats = (Hash32, Option<(f64, f64)>, Option<(Bytes, Codec)>);

/// Hash (and min/max) the pending chunks in batches, lay them out in order, and hand each pack
/// to `emit` as soon as it is complete. With `stream`, the open pack's parts are handed to it
/// after each batch instead (a single file written while later chunks are hashed; the pack
/// `emit` gets at the end holds only what was not streamed). Stops early (returning `None`) when
/// `emit` or `stream` says so.
#[allow(clippy::too_many_arguments)]
pub(super) fn hash_and_layout(
    pending: &[Pending],
    single: bool,
    pack_bytes: u64,
    batch_bytes: u64,
    reuse: Option<std::sync::Arc<Reuse>>,
    name_key: Option<[u8; 32]>,
    mut emit: impl FnMut(PackOut) -> bool,
    mut stream: Option<&mut dyn FnMut(Bytes) -> bool>,
) -> Option<Hashed> {
    let known = reuse.clone();
    let mut lay = Layouter::new(single, pack_bytes, reuse, name_key);
    let mut min_max = Vec::with_capacity(pending.len());
    let mut start = 0;
    while start < pending.len() {
        let mut end = start;
        let mut bytes = 0u64;
        while end < pending.len() && (end == start || bytes < batch_bytes) {
            bytes += pending[end].data.len() as u64;
            end += 1;
        }
        // With at least a chunk per thread, each chunk is hashed on one thread, fused with its
        // min/max block by block; otherwise each chunk's hash is itself spread over threads.
        let fused = end - start >= crate::runtime::threads();
        // Chunks are compressed (when the policy says so) on the same threads, right after
        // they are hashed.
        let stats: Vec<ChunkStats> = crate::runtime::parallel(|| {
            pending[start..end]
                .par_iter()
                .map(|p| {
                    let (h, mm) = hash_and_min_max(p, fused);
                    // A chunk the repository holds is not written: no need to compress it.
                    let stored = known.as_ref().is_some_and(|r| r.known.contains_key(&h));
                    (h, mm, p.encoding.filter(|_| !stored).and_then(|e| e.encode(&p.data, p.itemsize)))
                })
                .collect()
        });
        for (p, (h, mm, encoded)) in pending[start..end].iter().zip(stats) {
            min_max.push(mm);
            let added = match &encoded {
                Some((stored, codec)) => lay.add(stored, h, *codec),
                None => lay.add(&p.data, h, Codec::Raw),
            };
            if let Some(pack) = added {
                if !emit(pack) {
                    return None;
                }
            }
        }
        if let Some(send) = stream.as_mut() {
            for part in lay.take_open_parts() {
                if !send(part) {
                    return None;
                }
            }
        }
        start = end;
    }
    if let Some(pack) = lay.close() {
        if !emit(pack) {
            return None;
        }
    }
    let new_packs = lay.closed;
    let mut refs = lay.refs;
    for r in refs.iter_mut().filter(|r| r.pack >= KNOWN_PACK) {
        r.pack = r.pack - KNOWN_PACK + new_packs as u32;
    }
    Some(Hashed {
        unique: lay.seen.len(),
        refs,
        min_max,
        reused_chunks: lay.reused_chunks,
        reused_bytes: lay.reused_bytes,
        known_packs: lay.known_used,
    })
}

/// A chunk's hash and, for previews, its min/max. Fused, the data is read from memory once:
/// each 64 KiB block is hashed and then scanned while it is still in cache (the two passes
/// over a 4 MiB chunk otherwise each stream it from DRAM, and a save spends more CPU for it).
/// Same hash either way: BLAKE3 is incremental.
fn hash_and_min_max(p: &Pending, fused: bool) -> (Hash32, Option<(f64, f64)>) {
    const BLOCK: usize = 64 << 10;
    match &p.dtype {
        Some(d) if fused && p.data.len() > BLOCK => {
            let item = d.itemsize().clamp(1, BLOCK as u64) as usize;
            let mut h = blake3::Hasher::new();
            let mut mm = None;
            for block in p.data.chunks(BLOCK - BLOCK % item) {
                h.update(block);
                mm = preview::combine(mm, preview::min_max(d, block));
            }
            (Hash32(*h.finalize().as_bytes()), mm)
        }
        d => (Hash32::of(&p.data), d.as_ref().and_then(|d| preview::min_max(d, &p.data))),
    }
}

/// Write packs, `concurrency` at a time (each fsynced, when `durable`, while later ones are
/// written and hashed); `create_only` in a repository, which never rewrites a pack.
pub(super) async fn write_packs(
    loc: &Location,
    packs: impl futures::Stream<Item = PackOut>,
    concurrency: usize,
    durable: bool,
    create_only: bool,
    tracker: &Tracker,
) -> Result<()> {
    packs
        .map(|(name, parts, _)| async move { loc.put_tracked(&name, parts, create_only, durable, Some(tracker)).await })
        .buffer_unordered(concurrency)
        .try_collect::<Vec<()>>()
        .await
        .map(|_| ())
}

/// Hash and lay out on a separate thread while writing each finished pack here. Returns the
/// layout and the (name, size) of every pack in order.
#[allow(clippy::too_many_arguments)]
pub(super) async fn hash_and_write_pipelined(
    loc: &Location,
    pending: Vec<Pending>,
    reuse: Option<std::sync::Arc<Reuse>>,
    name_key: Option<[u8; 32]>,
    pack_bytes: u64,
    batch_bytes: u64,
    concurrency: usize,
    durable: bool,
    tracker: &Tracker,
) -> Result<(Hashed, Vec<(String, u64)>)> {
    use futures::SinkExt;
    // One finished pack may wait while the writers are busy: bounded memory is not at stake
    // (the packs borrow the caller's buffers), but hashing far ahead of the disk gains nothing.
    let create_only = reuse.is_some();
    let (tx, rx) = futures::channel::mpsc::channel::<PackOut>(1);
    let (done_tx, done_rx) = futures::channel::oneshot::channel();
    let background = crate::runtime::is_background();
    std::thread::Builder::new()
        .name("treepack-hash".into())
        .spawn(move || {
            let mut tx = tx;
            let hashed = crate::runtime::in_background_if(background, || {
                hash_and_layout(
                    &pending,
                    false,
                    pack_bytes,
                    batch_bytes,
                    reuse,
                    name_key,
                    |pack| futures::executor::block_on(tx.send(pack)).is_ok(),
                    None,
                )
            });
            drop(tx);
            // The chunks go back to the caller's thread, which owns (and frees) the buffers.
            let _ = done_tx.send((hashed, pending));
        })
        .map_err(|e| Error::Io { path: "treepack-hash thread".into(), source: e })?;
    let mut list = vec![];
    let names = rx.map(|pack| {
        list.push((pack.0.clone(), pack.2));
        pack
    });
    let written = write_packs(loc, names, concurrency, durable, create_only, tracker).await;
    // On a failed write the stream (and the channel) is dropped here, so the hashing thread
    // stops at its next pack; wait for it either way.
    let (hashed, pending) = done_rx.await.map_err(|_| Error::internal("the hashing thread stopped unexpectedly"))?;
    drop(pending);
    written?;
    let hashed = hashed.ok_or_else(|| Error::internal("hashing stopped before the end"))?;
    Ok((hashed, list))
}

static ZEROS: [u8; 64] = [0; 64];

/// Merge runs of small parts into larger buffers: fewer write calls, no copy of big arrays.
fn coalesce(parts: Vec<Bytes>) -> Vec<Bytes> {
    const SMALL: usize = 64 << 10;
    const FLUSH: usize = 4 << 20;
    let mut out = Vec::with_capacity(parts.len());
    let mut buf = BytesMut::new();
    for p in parts {
        if p.len() < SMALL {
            buf.extend_from_slice(&p);
            if buf.len() >= FLUSH {
                out.push(buf.split().freeze());
            }
        } else {
            if !buf.is_empty() {
                out.push(buf.split().freeze());
            }
            out.push(p);
        }
    }
    if !buf.is_empty() {
        out.push(buf.freeze());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::dtype::DType;

    /// Hashing fused with min/max block by block gives exactly the one-pass results, for every
    /// previewed dtype family and lengths that do not divide into blocks.
    #[test]
    fn fused_hash_and_min_max_equal_the_separate_passes() {
        let n = (300 << 10) + 24;
        let bytes: Vec<u8> = (0..n as u64).map(|i| (i.wrapping_mul(0x9e37_79b9) >> 7) as u8).collect();
        for dtype in [DType::F32, DType::BF16, DType::F16, DType::U8, DType::I64, DType::F64, DType::Bool] {
            let len = n - n % dtype.itemsize() as usize;
            let p = Pending {
                data: Bytes::copy_from_slice(&bytes[..len]),
                dtype: Some(dtype.clone()),
                encoding: None,
                itemsize: dtype.itemsize(),
            };
            let fused = hash_and_min_max(&p, true);
            assert_eq!(fused, hash_and_min_max(&p, false), "{dtype:?}");
            assert_eq!(fused.0, Hash32::of(&p.data));
        }
    }
}
