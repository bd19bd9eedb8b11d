//! Turning fetched chunks into leaves: each chunk decoded by its codec to its canonical bytes and
//! verified, then placed in the leaf's buffer (straight into it, in parallel, for compressed
//! arrays of contiguous chunks).

use super::*;

impl Reader {
    /// Chunk `i` of the leaf at `job_path`: its stored bytes taken from `fetched`, decoded to
    /// its canonical `(length, element size)` and verified if asked.
    pub(super) fn chunk_bytes(
        &self,
        job_path: &str,
        i: usize,
        r: &ChunkRef,
        fetched: &HashMap<ChunkKey, Bytes>,
        canonical: (u64, u64),
        verify: bool,
    ) -> Result<Bytes> {
        let b = fetched.get(&(r.pack, r.offset, r.length)).cloned().ok_or_else(|| Error::OutOfBounds {
            file: self.pack_file(r.pack),
            key: job_path.to_string(),
            reason: format!("chunk {i} was not read"),
        })?;
        self.check_chunk(job_path, i, r, b, canonical, verify)
    }

    /// Decode one chunk's stored bytes to its canonical `(length, element size)`, then verify
    /// (optionally) the canonical bytes' hash.
    pub(super) fn check_chunk(
        &self,
        job_path: &str,
        i: usize,
        r: &ChunkRef,
        b: Bytes,
        canonical: (u64, u64),
        verify: bool,
    ) -> Result<Bytes> {
        let b = r.codec.decode(b, canonical.0, canonical.1).map_err(|reason| self.bad_chunk(job_path, i, r, reason))?;
        if verify {
            self.check_hash(job_path, i, r, &b)?;
        }
        Ok(b)
    }

    /// The error of chunk `i` its codec could not decode.
    pub(super) fn bad_chunk(&self, job_path: &str, i: usize, r: &ChunkRef, reason: String) -> Error {
        Error::BadChunk {
            file: self.pack_file(r.pack),
            key: job_path.to_string(),
            chunk: i,
            codec: r.codec.name().to_string(),
            reason,
        }
    }

    /// Check chunk `i`'s canonical bytes against its recorded hash.
    pub(super) fn check_hash(&self, job_path: &str, i: usize, r: &ChunkRef, canonical: &[u8]) -> Result<()> {
        let h = Hash32::of(canonical);
        if h != r.hash {
            return Err(Error::ChunkCorrupt {
                file: self.pack_file(r.pack),
                key: job_path.to_string(),
                chunk: i,
                expected: r.hash.to_hex(),
                actual: h.to_hex(),
            });
        }
        Ok(())
    }

    pub(super) fn assemble(
        &self,
        job: &Job<'_>,
        fetched: &HashMap<ChunkKey, Bytes>,
        opts: &LoadOptions,
        verify: bool,
    ) -> Result<Leaf> {
        match job.entry {
            Entry::Str(Stored::Blob { chunk, size }) => {
                let b = self.chunk_bytes(&job.path, 0, chunk, fetched, (*size, 1), verify)?;
                String::from_utf8(b.to_vec()).map(Leaf::Str).map_err(|_| {
                    Error::manifest(&self.pack_file(chunk.pack), job.path.clone(), "string blob is not valid UTF-8")
                })
            }
            Entry::Bytes(Stored::Blob { chunk, size }) => {
                Ok(Leaf::Bytes(self.chunk_bytes(&job.path, 0, chunk, fetched, (*size, 1), verify)?))
            }
            Entry::Array(a) => self
                .assemble_array(&job.path, a, fetched, opts, verify)
                .map(|d| Leaf::Array(d.annotated(a.annotation.as_ref()))),
            other => inline_leaf_ref(other, &self.manifest_file, &|| job.path.clone()),
        }
    }

    pub(super) fn assemble_array(
        &self,
        path: &str,
        a: &ArrayEntry,
        fetched: &HashMap<ChunkKey, Bytes>,
        opts: &LoadOptions,
        verify: bool,
    ) -> Result<ArrayData> {
        let ArrayStorage::Chunked { chunks, .. } = &a.storage else {
            return inline_array(a, &self.manifest_file, path);
        };
        let grid = a.grid();
        let fix = |e: Error| match e {
            Error::InvalidTree { reason, .. } => Error::manifest(&self.manifest_file, path, reason),
            e => e,
        };
        let itemsize = a.dtype.itemsize();
        let canonical = |i: usize| (a.chunk_nbytes(&grid, i), itemsize);
        if chunks.len() == 1 {
            let b = self.chunk_bytes(path, 0, &chunks[0], fetched, canonical(0), verify)?;
            return ArrayData::new(a.dtype.clone(), a.shape.clone(), b).map_err(fix);
        }
        if let Some(span) = span_of_array(a).and_then(|k| fetched.get(&k).cloned()) {
            // The chunks were read as one contiguous span: it is the array's buffer. Check each
            // chunk as a slice of it (in parallel), then drop the slices so the buffer stays unique.
            let base = chunks[0].offset;
            crate::runtime::parallel(|| {
                chunks.par_iter().enumerate().try_for_each(|(i, r)| {
                    let s = (r.offset - base) as usize;
                    self.check_chunk(path, i, r, span.slice(s..s + r.length as usize), canonical(i), verify).map(drop)
                })
            })?;
            return ArrayData::new(a.dtype.clone(), a.shape.clone(), span).map_err(fix);
        }
        if opts.mmap && chunks.iter().all(|c| c.codec.is_identity()) && contiguous_in_pack(&grid, chunks) {
            // One view over all chunks; verify each chunk's slice.
            for (i, r) in chunks.iter().enumerate() {
                self.chunk_bytes(path, i, r, fetched, canonical(i), verify)?;
            }
            if let Some(map) = self.mmaps.lock().ok().and_then(|m| m.get(&chunks[0].pack).cloned()) {
                let start = chunks[0].offset as usize;
                let end = start + a.nbytes() as usize;
                return ArrayData::new(a.dtype.clone(), a.shape.clone(), map.slice(start..end)).map_err(fix);
            }
        }
        let total = a.nbytes();
        let mut out = alloc(total, path)?;
        if chunks.iter().any(|c| !c.codec.is_identity())
            && self.decode_in_place(path, a, &grid, fetched, &mut out, verify)?
        {
            return ArrayData::new(a.dtype.clone(), a.shape.clone(), out).map_err(fix);
        }
        let full = grid::full(&a.shape);
        for (i, r) in chunks.iter().enumerate() {
            let b = self.chunk_bytes(path, i, r, fetched, canonical(i), verify)?;
            let (origin, extent) = grid.chunk_region(i as u64);
            if grid::chunk_is_contiguous(&grid, &extent) {
                let off = grid::c_offset(&a.shape, &origin, itemsize) as usize;
                out[off..off + b.len()].copy_from_slice(&b);
            } else {
                grid::copy_chunk(&mut out, &full, &origin, &extent, &b, itemsize as usize);
            }
        }
        ArrayData::new(a.dtype.clone(), a.shape.clone(), out).map_err(fix)
    }

    /// Decode a compressed array whose chunks are each one contiguous run of it (the default
    /// chunking) straight into `out`, chunks in parallel, each verified where it landed.
    /// `Ok(false)` when the chunks are not contiguous runs (the caller then copies them).
    pub(super) fn decode_in_place(
        &self,
        path: &str,
        a: &ArrayEntry,
        grid: &ChunkGrid,
        fetched: &HashMap<ChunkKey, Bytes>,
        out: &mut [u8],
        verify: bool,
    ) -> Result<bool> {
        let ArrayStorage::Chunked { chunks, .. } = &a.storage else { return Ok(false) };
        let itemsize = a.dtype.itemsize();
        // Chunk i's slice of `out`: in C order, contiguous chunks follow one another.
        let mut slices: Vec<(usize, &ChunkRef, &mut [u8])> = Vec::with_capacity(chunks.len());
        let mut rest = out;
        let mut at = 0u64;
        for (i, r) in chunks.iter().enumerate() {
            let (origin, extent) = grid.chunk_region(i as u64);
            if !grid::chunk_is_contiguous(grid, &extent) || grid::c_offset(&a.shape, &origin, itemsize) != at {
                return Ok(false);
            }
            let len = a.chunk_nbytes(grid, i);
            let (here, tail) = std::mem::take(&mut rest).split_at_mut(len as usize);
            slices.push((i, r, here));
            rest = tail;
            at += len;
        }
        let decode = |(i, r, dst): &mut (usize, &ChunkRef, &mut [u8])| -> Result<()> {
            let key = (r.pack, r.offset, r.length);
            let stored = fetched.get(&key).ok_or_else(|| Error::OutOfBounds {
                file: self.pack_file(r.pack),
                key: path.to_string(),
                reason: format!("chunk {i} was not read"),
            })?;
            r.codec.decode_into(stored, dst, itemsize).map_err(|reason| self.bad_chunk(path, *i, r, reason))?;
            if verify {
                self.check_hash(path, *i, r, dst)?;
            }
            Ok(())
        };
        crate::runtime::parallel(|| slices.par_iter_mut().try_for_each(decode))?;
        Ok(true)
    }
}
