//! Slices of stored arrays: a numpy-style slice read touching only the chunks it intersects,
//! and whole arrays read into memory the caller already has (straight from the kernel into
//! place when the chunks allow it).

use super::{alloc, Reader};
use crate::error::{Error, Result};
use crate::format::grid;
use crate::format::manifest::{ArrayEntry, ArrayStorage, ChunkRef, Entry};
use crate::format::model::{ArrayData, Tree};
use bytes::Bytes;
use rayon::prelude::*;

/// Most stored bytes [`Reader::read_into_async`] holds at once.
pub const READ_INTO_BATCH: u64 = 32 << 20;

/// One chunk of a stored array to read straight into its place `dst` in caller memory.
struct Piece<'r, 'o> {
    path: &'r str,
    a: &'r ArrayEntry,
    chunk: usize,
    dst: &'o mut [u8],
}

/// A destination of `want` bytes for the stored array `a` (or the `slice` of it), or the error
/// that says what it has and what the array takes.
fn fits(path: &str, a: &ArrayEntry, out: &[u8], slice: Option<&str>, want: u64) -> Result<()> {
    if out.len() as u64 == want {
        return Ok(());
    }
    let what = slice.map_or_else(|| "the stored".to_string(), |s| format!("[{s}] of the stored"));
    Err(Error::invalid_tree(
        path,
        format!(
            "the destination has {} bytes but {what} {} array of shape {:?} has {want}",
            out.len(),
            a.dtype.display(),
            a.shape
        ),
    ))
}

impl Reader {
    /// Read a numpy-style slice (`"0:2, :, 3"`) of the array at `path`, touching only the chunks
    /// that intersect it.
    ///
    /// # Errors
    /// [`Error::BadSlice`], [`Error::KeyNotFound`], storage and integrity errors.
    pub async fn read_array_async(&self, path: &str, slice: &str, verify: bool) -> Result<ArrayData> {
        let a = self.array_entry(path)?;
        let items = grid::parse_slice(slice)?;
        let sel = grid::normalize(&items, &a.shape, slice)?;
        let out_shape = grid::result_shape(&sel);
        let count: u64 = sel.iter().map(|s| s.count).product();
        let mut out = alloc(count * a.dtype.itemsize(), path)?;
        self.fill(path, a, &sel, &mut out, verify).await?;
        Ok(ArrayData::new(a.dtype.clone(), out_shape, out)?.annotated(a.annotation.as_ref()))
    }

    /// Read the whole array at `path` into `out`, which must be exactly its canonical bytes
    /// (little-endian, C order) long: loads into memory the caller already has (a model's
    /// tensors) without a second copy of the array. At most [`READ_INTO_BATCH`] stored bytes
    /// are fetched at a time, so the extra memory stays bounded however big the array is.
    ///
    /// # Errors
    /// [`Error::KeyNotFound`] when `path` is not an array, [`Error::InvalidTree`] when `out`
    /// has the wrong length, storage and integrity errors.
    pub async fn read_into_async(&self, path: &str, out: &mut [u8], verify: bool) -> Result<()> {
        self.read_many_into_async(vec![(path, out)], verify).await
    }

    /// Read whole arrays into memory the caller already has, each `(path, out)` as
    /// [`Reader::read_into_async`] reads one: a model's tensors at once. The chunks of all of
    /// them that can be read straight into place go through one parallel pass in the files'
    /// order, so the many small arrays of a model (biases, norms) are read and hashed side by
    /// side instead of one after another; the rest are then read as one array is.
    ///
    /// # Errors
    /// As [`Reader::read_into_async`], for the first array that fails (arrays before it, and
    /// others read in the same pass, may have been written).
    pub async fn read_many_into_async(&self, items: Vec<(&str, &mut [u8])>, verify: bool) -> Result<()> {
        let mut pieces: Vec<Piece<'_, '_>> = Vec::new();
        let mut rest = Vec::new();
        for (path, out) in items {
            let a = self.array_entry(path)?;
            fits(path, a, out, None, a.nbytes())?;
            let sel = grid::full(&a.shape);
            match self.in_place(a, &sel, out) {
                Ok(p) => pieces.extend(p.into_iter().map(|(chunk, dst)| Piece { path, a, chunk, dst })),
                Err(out) => rest.push((path, a, sel, out)),
            }
        }
        self.read_pieces(pieces, verify)?;
        for (path, a, sel, out) in rest {
            self.fill_batched(path, a, &sel, out, verify).await?;
        }
        Ok(())
    }

    /// Read the numpy-style slice `slice` of the array at `path` into `out`, which must be exactly
    /// the slice's canonical bytes long (C order): a piece of a big array into a reused buffer
    /// (a pinned staging buffer of a device load). Reads as [`Reader::read_into_async`] does.
    ///
    /// # Errors
    /// [`Error::BadSlice`], [`Error::KeyNotFound`], [`Error::InvalidTree`] when `out` has the
    /// wrong length, storage and integrity errors.
    pub async fn read_slice_into_async(&self, path: &str, slice: &str, out: &mut [u8], verify: bool) -> Result<()> {
        let a = self.array_entry(path)?;
        let items = grid::parse_slice(slice)?;
        let sel = grid::normalize(&items, &a.shape, slice)?;
        fits(path, a, out, Some(slice), sel.iter().map(|s| s.count).product::<u64>() * a.dtype.itemsize())?;
        self.fill(path, a, &sel, out, verify).await
    }

    /// Write the elements `sel` selects of stored array `a` into `out` (C order, every axis of
    /// the selection counted): in place when [`Reader::in_place`] can, else batched.
    async fn fill(&self, path: &str, a: &ArrayEntry, sel: &[grid::DimSel], out: &mut [u8], verify: bool) -> Result<()> {
        match self.in_place(a, sel, out) {
            Ok(p) => {
                self.read_pieces(p.into_iter().map(|(chunk, dst)| Piece { path, a, chunk, dst }).collect(), verify)
            }
            Err(out) => self.fill_batched(path, a, sel, out, verify).await,
        }
    }

    /// When the selection `sel` of `a` is one contiguous run of the array and the local, raw
    /// chunks it needs each lie wholly inside it (a whole array; a sharded load's shard of whole
    /// rows), `out` split into each such chunk's place, for the kernel to read the chunk straight
    /// there; otherwise `out`, given back.
    fn in_place<'o>(
        &self,
        a: &ArrayEntry,
        sel: &[grid::DimSel],
        out: &'o mut [u8],
    ) -> std::result::Result<Vec<(usize, &'o mut [u8])>, &'o mut [u8]> {
        let itemsize = a.dtype.itemsize();
        let ArrayStorage::Chunked { chunks, .. } = &a.storage else { return Err(out) };
        if sel.iter().any(|s| s.count == 0) || self.loc.local_path().is_none() {
            return Err(out);
        }
        let Some((lo, hi)) = contiguous_range(&a.shape, sel, itemsize) else { return Err(out) };
        let grid = a.grid();
        let ids = grid.chunks_for(sel);
        let mut places: Vec<(usize, u64)> = Vec::with_capacity(ids.len());
        let direct = ids.iter().all(|&i| {
            let r = &chunks[i as usize];
            let (origin, extent) = grid.chunk_region(i);
            let off = grid::c_offset(&a.shape, &origin, itemsize);
            let ok = r.codec.is_identity()
                && r.length == a.chunk_nbytes(&grid, i as usize)
                && grid::chunk_is_contiguous(&grid, &extent)
                && off >= lo
                && off + r.length <= hi;
            places.push((i as usize, off - lo.min(off)));
            ok
        });
        if !direct {
            return Err(out);
        }
        places.sort_by_key(|p| p.1);
        let mut slices: Vec<(usize, &mut [u8])> = Vec::with_capacity(places.len());
        let mut rest = out;
        let mut at = 0u64;
        for &(i, off) in &places {
            let len = chunks[i].length as usize;
            let tail = std::mem::take(&mut rest);
            let (_, tail) = tail.split_at_mut((off - at) as usize);
            let (here, tail) = tail.split_at_mut(len);
            slices.push((i, here));
            rest = tail;
            at = off + len as u64;
        }
        Ok(slices)
    }

    /// Read each piece's chunk by the kernel straight into its place and hash it there, the
    /// pieces in parallel, in the order of the files (what the kernel reads ahead for).
    fn read_pieces(&self, mut pieces: Vec<Piece<'_, '_>>, verify: bool) -> Result<()> {
        pieces.sort_by_key(|p| match &p.a.storage {
            ArrayStorage::Chunked { chunks, .. } => (chunks[p.chunk].pack, chunks[p.chunk].offset),
            ArrayStorage::Inline(_) => (0, 0),
        });
        crate::runtime::parallel(|| {
            pieces.into_par_iter().try_for_each(|Piece { path, a, chunk: i, dst }| {
                let ArrayStorage::Chunked { chunks, .. } = &a.storage else {
                    return Err(Error::internal("an inline array read in place"));
                };
                let r = &chunks[i];
                let rel = &self.manifest.packs[r.pack as usize].path;
                let read = self.loc.read_local_into(rel, r.offset, dst).map_err(|e| match e {
                    Error::OutOfBounds { file, key, reason } if key.is_empty() => {
                        Error::OutOfBounds { file, key: path.to_string(), reason }
                    }
                    e => e,
                })?;
                if !read {
                    return Err(Error::internal("a local location without a local path"));
                }
                if verify {
                    self.check_hash(path, i, r, dst)?;
                }
                Ok(())
            })
        })
    }

    /// [`Reader::fill`] when the chunks cannot be read in place: at most [`READ_INTO_BATCH`]
    /// stored bytes are fetched at a time, decoded and verified in parallel, and copied into
    /// place.
    async fn fill_batched(
        &self,
        path: &str,
        a: &ArrayEntry,
        sel: &[grid::DimSel],
        out: &mut [u8],
        verify: bool,
    ) -> Result<()> {
        let itemsize = a.dtype.itemsize();
        let chunks = match &a.storage {
            ArrayStorage::Inline(d) => {
                if sel.iter().all(|s| s.count > 0) {
                    grid::copy_chunk(out, sel, &vec![0u64; a.shape.len()], &a.shape, d, itemsize as usize);
                }
                return Ok(());
            }
            ArrayStorage::Chunked { chunks, .. } => chunks,
        };
        if sel.iter().any(|s| s.count == 0) {
            return Ok(());
        }
        let grid = a.grid();
        let ids = grid.chunks_for(sel);
        let mut start = 0;
        while start < ids.len() {
            let mut end = start + 1;
            let mut bytes = chunks[ids[start] as usize].length;
            while end < ids.len() && bytes + chunks[ids[end] as usize].length <= READ_INTO_BATCH {
                bytes += chunks[ids[end] as usize].length;
                end += 1;
            }
            let refs: Vec<ChunkRef> = ids[start..end].iter().map(|&i| chunks[i as usize].clone()).collect();
            let fetched = self.fetch(&refs, false).await?;
            // Decoded and verified in parallel (hashing sets the pace), then copied into place.
            let decoded: Vec<Bytes> = crate::runtime::parallel(|| {
                ids[start..end]
                    .par_iter()
                    .zip(refs.par_iter())
                    .map(|(&i, r)| {
                        self.chunk_bytes(
                            path,
                            i as usize,
                            r,
                            &fetched,
                            (a.chunk_nbytes(&grid, i as usize), itemsize),
                            verify,
                        )
                    })
                    .collect::<Result<Vec<_>>>()
            })?;
            for (&i, b) in ids[start..end].iter().zip(decoded) {
                let (origin, extent) = grid.chunk_region(i);
                grid::copy_chunk(out, sel, &origin, &extent, &b, itemsize as usize);
            }
            start = end;
        }
        Ok(())
    }

    fn array_entry(&self, path: &str) -> Result<&ArrayEntry> {
        match self.entry(path)? {
            Tree::Leaf(Entry::Array(a)) => Ok(a),
            other => Err(Error::KeyNotFound {
                path: path.to_string(),
                reason: format!("`{path}` is a {} node, not an array", leaf_kind(other)),
            }),
        }
    }
}

fn leaf_kind(t: &Tree<Entry>) -> &'static str {
    match t {
        Tree::Leaf(e) => e.kind(),
        t => t.container_kind(),
    }
}

/// The byte range `[lo, hi)` of a C-order array of `shape` that `sel` selects, when the
/// selection is one contiguous run: axes before some `k` select one index, axis `k` a step-1
/// range, the axes after it whole.
fn contiguous_range(shape: &[u64], sel: &[grid::DimSel], itemsize: u64) -> Option<(u64, u64)> {
    let n = shape.len();
    let mut k = 0;
    while k < n && sel[k].count == 1 {
        k += 1;
    }
    if k < n && sel[k].step != 1 {
        return None;
    }
    if !(k + 1..n).all(|d| sel[d].start == 0 && sel[d].step == 1 && sel[d].count == shape[d]) {
        return None;
    }
    let origin: Vec<u64> = sel.iter().map(|s| s.start).collect();
    let lo = grid::c_offset(shape, &origin, itemsize);
    let len = sel.iter().try_fold(itemsize, |acc, s| acc.checked_mul(s.count))?;
    Some((lo, lo.checked_add(len)?))
}
