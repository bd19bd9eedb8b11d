//! Reading stored leaves, verified, in tree order: a whole tree's (local trees by reader threads
//! with positioned and direct reads, or as mmap views) and a selection's, in batches with
//! read-ahead.

use super::*;

impl Reader {
    /// Every leaf of the whole tree whose bytes live in packs, fetched (and verified unless
    /// `opts.verify` is off), in tree order as `(leaf ordinal, leaf)`; the ordinal counts all
    /// leaves depth-first, as [`Tree::for_each_leaf_steps`] visits them. Inline leaves are not
    /// included: read them from [`Reader::manifest`]. `opts.select` and `opts.keep` are ignored.
    ///
    /// This lets a binding (the Python extension) build its own objects straight from the
    /// manifest tree, skipping the intermediate [`Node`] that [`Reader::load_async`] returns.
    ///
    /// # Errors
    /// As [`Reader::load_async`].
    pub async fn fetch_stored_leaves_async(&self, opts: &LoadOptions) -> Result<Vec<(usize, Leaf)>> {
        let all = LoadOptions { select: vec![], keep: None, ..opts.clone() };
        self.fetch_stored(&self.manifest.root, "", &Selection::new::<String>(&[])?, &all).await
    }

    /// The selected leaves of `subtree` that live in packs, in tree order (see
    /// [`Reader::fetch_stored_leaves_async`]).
    pub(super) async fn fetch_stored(
        &self,
        subtree: &Tree<Entry>,
        prefix: &str,
        sel: &Selection,
        opts: &LoadOptions,
    ) -> Result<Vec<(usize, Leaf)>> {
        // A tree read from another tool's file has no hashes of its own: those of its in-memory
        // manifest were computed from the very bytes it holds, when its location was parsed,
        // so checking them again would only hash the data a second time.
        let unverified;
        let opts = if opts.verify && self.loc.read_from().is_some() {
            unverified = LoadOptions { verify: false, ..opts.clone() };
            &unverified
        } else {
            opts
        };
        let mut jobs: Vec<Job<'_>> = Vec::new();
        let mut id = 0usize;
        let everything = sel.is_all() && opts.keep.is_none();
        subtree.for_each_leaf_steps(&mut |p, e| {
            if !e.chunks().is_empty() {
                let full = join_path(prefix, &keypath::steps_text(p));
                if everything || is_selected(sel, opts, &full) {
                    jobs.push(Job { id, path: full, entry: e });
                }
            }
            id += 1;
        });
        let mut results: Vec<(usize, Leaf)> = Vec::with_capacity(jobs.len());
        let tracker = opts.progress.as_ref().map(|cb| {
            let total = jobs.iter().flat_map(|j| j.entry.chunks()).map(|c| c.length).sum();
            Tracker::new(Some(cb.clone()), total)
        });
        let header_key = (0u32, 0u64, container::HEADER_LEN);
        // A single file's header sits right before its first chunk: a full load checks it (the
        // batched path with its first batch, where the range coalesces with that chunk's read
        // and costs no extra request); selective loads skip it and read only the selected chunks.
        let check_header = everything && prefix.is_empty() && self.loc.layout() == Layout::SingleFile;
        if let Some(done) = self.fetch_local_whole(&jobs, opts, tracker.as_ref(), check_header).await? {
            return Ok(done);
        }
        let mut start = 0;
        while start < jobs.len() {
            // The kernel reads the chunks of this batch and the next few while this one is
            // verified and built, and a window (not the whole tree) keeps a load larger than
            // memory from evicting what it is about to read.
            if !opts.mmap && !self.loc.is_remote() {
                self.advise_ahead(&jobs[start..], opts.batch_bytes.saturating_mul(READ_AHEAD_BATCHES));
            }
            let mut end = start;
            let mut bytes = 0u64;
            while end < jobs.len() && (end == start || bytes + jobs[end].entry.nbytes() <= opts.batch_bytes) {
                bytes += jobs[end].entry.nbytes();
                end += 1;
            }
            let batch = &jobs[start..end];
            let mut keys: Vec<ChunkKey> = Vec::new();
            for j in batch {
                keys.extend(self.job_keys(j, opts.mmap));
            }
            let check_header = check_header && start == 0;
            if check_header {
                keys.push(header_key);
            }
            let fetched = self.fetch_keys(keys, opts.mmap, tracker.as_ref(), ReadMode::Buffered).await?;
            if check_header {
                let h = fetched.get(&header_key).map(|b| b.as_ref()).unwrap_or_default();
                container::check_header(h, &self.manifest_file)?;
            }
            results.extend(self.build_batch(batch, &fetched, opts, bytes)?);
            start = end;
        }
        Ok(results)
    }

    /// Verify (if asked) and build the leaves of one batch from their fetched chunks.
    pub(super) fn build_batch(
        &self,
        batch: &[Job<'_>],
        fetched: &HashMap<ChunkKey, Bytes>,
        opts: &LoadOptions,
        bytes: u64,
    ) -> Result<Vec<(usize, Leaf)>> {
        // Deduplicated content (the same chunk referenced by many leaves, e.g. identical
        // images in 10k records) is hashed once per batch rather than once per leaf.
        let verified = if opts.verify { self.verify_shared(batch, fetched)? } else { HashSet::new() };
        let build = |j: &Job<'_>| {
            let pre = matches!(j.entry.chunks(), [c] if verified.contains(&(c.pack, c.offset, c.length, c.hash)));
            Ok((j.id, self.assemble(j, fetched, opts, opts.verify && !pre)?))
        };
        // Hashing and copying go to the thread pool; views and small batches (an mmap load
        // of a checkpoint) stay on this thread, which also spares starting the pool.
        let parallel = (opts.verify || !opts.mmap) && bytes >= PARALLEL_MIN_BYTES;
        if parallel {
            crate::runtime::parallel(|| batch.par_iter().map(build).collect())
        } else {
            batch.iter().map(build).collect()
        }
    }

    /// Bytes `off..off + len` of a mapped pack, or the error of a range past its end.
    pub(super) fn map_range(&self, pack: u32, map: &Bytes, off: u64, len: u64) -> Result<Bytes> {
        let end = off.saturating_add(len);
        if end > map.len() as u64 {
            return Err(Error::OutOfBounds {
                file: self.pack_file(pack),
                key: String::new(),
                reason: format!("bytes {off}..{end} lie past the end of the file (truncated?)"),
            });
        }
        Ok(map.slice(off as usize..end as usize))
    }

    /// A whole local load of big leaves (90 % of the bytes in leaves of 1 MiB or more): leaves are read by more threads than cores (a thread waiting for the
    /// device needs no core), uncached bytes straight from the device
    /// ([`ReadMode::CachedOrDirect`]), and verified by half the cores (`verify_pool`) as
    /// they arrive, so the device never waits for a hashing phase and there is no kernel
    /// read-ahead to pay for twice. `Ok(None)` when this does not apply (mmap, remote, little
    /// data, chunks shared other than by raw leaves of equal bytes): the batched path then reads.
    pub(super) async fn fetch_local_whole(
        &self,
        jobs: &[Job<'_>],
        opts: &LoadOptions,
        tracker: Option<&Tracker>,
        check_header: bool,
    ) -> Result<Option<Vec<(usize, Leaf)>>> {
        // Local files (an encrypted tree's too: its reads decrypt as they arrive, on these
        // threads, and the hashing overlaps them as for a plain tree).
        if opts.mmap || self.loc.local().is_none() {
            return Ok(None);
        }
        // Mostly big leaves (a checkpoint's matrices next to its biases and norms): the small
        // ones, read through the cache, are hinted to the kernel up front.
        let total: u64 = jobs.iter().map(|j| j.entry.nbytes()).fold(0, u64::saturating_add);
        let is_small = |j: &&Job<'_>| j.entry.nbytes() < DIRECT_MIN_BYTES as u64;
        let small: u64 = jobs.iter().filter(is_small).map(|j| j.entry.nbytes()).sum();
        if total < PARALLEL_MIN_BYTES || small > total / 10 {
            return Ok(None);
        }
        // Leaves that repeat an earlier leaf's bytes (chunk dedup: tied weights, the zeroed
        // biases of a fresh model) are read once: the repeat takes the first one's verified
        // bytes. Only a raw array read as one range can: its leaf's bytes are that range.
        // Other overlaps leave the load to the batched path.
        let mut claimed: HashSet<ChunkKey> = HashSet::new();
        let mut first_of: HashMap<ChunkKey, usize> = HashMap::new();
        let mut unique: Vec<Job<'_>> = Vec::with_capacity(jobs.len());
        let mut repeats: Vec<(usize, ChunkKey)> = Vec::new();
        for (i, j) in jobs.iter().enumerate() {
            let keys = self.job_keys(j, false);
            let whole_range = match (&keys[..], j.entry) {
                ([k], Entry::Array(_)) if j.entry.chunks().iter().all(|c| c.codec.is_identity()) => Some(*k),
                _ => None,
            };
            if let Some(k) = whole_range.filter(|k| first_of.contains_key(k)) {
                repeats.push((i, k));
                continue;
            }
            if !keys.iter().all(|k| claimed.insert(*k)) {
                return Ok(None);
            }
            if let Some(k) = whole_range {
                first_of.insert(k, unique.len());
            }
            unique.push(Job { id: j.id, path: j.path.clone(), entry: j.entry });
        }
        if check_header {
            let key = (0u32, 0u64, container::HEADER_LEN);
            let h = self.fetch_keys(vec![key], false, None, ReadMode::Buffered).await?;
            container::check_header(h.get(&key).map(|b| b.as_ref()).unwrap_or_default(), &self.manifest_file)?;
        }
        if small > 0 {
            let small_jobs: Vec<Job<'_>> =
                jobs.iter().filter(is_small).map(|j| Job { id: j.id, path: String::new(), entry: j.entry }).collect();
            self.advise_ahead(&small_jobs, opts.batch_bytes.saturating_mul(READ_AHEAD_BATCHES));
        }
        let read = self.read_whole(&unique, opts, tracker)?;
        if repeats.is_empty() {
            return Ok(Some(read));
        }
        let mut firsts: HashMap<ChunkKey, Bytes> = HashMap::new();
        for (k, &u) in &first_of {
            if let Some((_, Leaf::Array(a))) = read.get(u) {
                firsts.insert(*k, a.bytes().clone());
            }
        }
        let mut read = read.into_iter();
        let mut repeats = repeats.into_iter().peekable();
        let mut out = Vec::with_capacity(jobs.len());
        for (i, j) in jobs.iter().enumerate() {
            let Some((_, k)) = repeats.next_if(|r| r.0 == i) else {
                out.push(read.next().ok_or_else(|| Error::internal("a whole load lost a leaf"))?);
                continue;
            };
            let bytes =
                firsts.get(&k).cloned().ok_or_else(|| Error::internal("a repeated leaf's first was not read"))?;
            if let Some(t) = tracker {
                t.advance(k.2);
            }
            // Verified as the first leaf's bytes unless a chunk of its names another hash.
            let same = |a: &[ChunkRef], b: &[ChunkRef]| {
                a.len() == b.len()
                    && a.iter()
                        .zip(b)
                        .all(|(x, y)| (x.pack, x.offset, x.length, x.hash) == (y.pack, y.offset, y.length, y.hash))
            };
            let verified = first_of.get(&k).is_some_and(|&u| same(unique[u].entry.chunks(), j.entry.chunks()));
            out.push((j.id, self.assemble(j, &HashMap::from([(k, bytes)]), opts, opts.verify && !verified)?));
        }
        Ok(Some(out))
    }

    /// The leaves of `jobs`, which share no chunk, read by the threads of
    /// [`Reader::fetch_local_whole`].
    fn read_whole(
        &self,
        jobs: &[Job<'_>],
        opts: &LoadOptions,
        tracker: Option<&Tracker>,
    ) -> Result<Vec<(usize, Leaf)>> {
        let threads = (crate::runtime::threads() * 2).clamp(MIN_READ_THREADS, MAX_READ_THREADS).min(jobs.len());
        let next = std::sync::atomic::AtomicUsize::new(0);
        let failed = std::sync::atomic::AtomicBool::new(false);
        let mut slots: Vec<Option<Result<Leaf>>> = jobs.iter().map(|_| None).collect();
        // A leaf that came from the device is verified and built by this thread as it arrives,
        // hashed by `verify_pool` (half the cores): a reader that hashed it would have no read in
        // flight meanwhile. A leaf copied from the page cache is verified by its reader at once,
        // while its bytes are in that core's cache. (Design decisions 32 and 33.)
        enum Read {
            Fetched(HashMap<ChunkKey, Bytes>),
            Built(Leaf),
        }
        let (tx, rx) = std::sync::mpsc::sync_channel::<(usize, Result<Read>)>(threads * 2);
        std::thread::scope(|s| {
            for _ in 0..threads {
                let tx = tx.clone();
                let (next, failed) = (&next, &failed);
                s.spawn(move || {
                    use std::sync::atomic::Ordering::Relaxed;
                    while !failed.load(Relaxed) {
                        let i = next.fetch_add(1, Relaxed);
                        let Some(j) = jobs.get(i) else { break };
                        let before = crate::store::direct_bytes_on_this_thread();
                        // No runtime on this thread: the reads run right here.
                        let keys = self.job_keys(j, false);
                        let got = crate::runtime::block_on_here(self.fetch_keys(
                            keys,
                            false,
                            tracker,
                            ReadMode::CachedOrDirect,
                        ))
                        .and_then(|f| {
                            if crate::store::direct_bytes_on_this_thread() == before {
                                self.assemble(j, &f, opts, opts.verify).map(Read::Built)
                            } else {
                                Ok(Read::Fetched(f))
                            }
                        });
                        if tx.send((i, got)).is_err() {
                            break;
                        }
                    }
                });
            }
            drop(tx);
            let verifiers = crate::runtime::verify_pool();
            for (i, read) in rx.iter() {
                let got = read.and_then(|r| match r {
                    // A compressed leaf is decoded by the whole compute pool (decoding, not the
                    // device, sets its pace); inside the verify pool it would get half the cores.
                    Read::Fetched(f) if jobs[i].entry.chunks().iter().any(|c| !c.codec.is_identity()) => {
                        self.assemble(&jobs[i], &f, opts, opts.verify)
                    }
                    Read::Fetched(f) => match verifiers {
                        Some(pool) => pool.install(|| self.assemble(&jobs[i], &f, opts, opts.verify)),
                        None => self.assemble(&jobs[i], &f, opts, opts.verify),
                    },
                    Read::Built(leaf) => Ok(leaf),
                });
                let bad = got.is_err();
                slots[i] = Some(got);
                if bad {
                    // The readers stop at their next leaf (a full channel frees them: `rx` goes).
                    failed.store(true, std::sync::atomic::Ordering::Relaxed);
                    break;
                }
            }
            drop(rx);
        });
        let mut out = Vec::with_capacity(jobs.len());
        for (j, slot) in jobs.iter().zip(slots) {
            match slot {
                Some(got) => out.push((j.id, got?)),
                // Not reached: a leaf failed (its error is returned) and the threads stopped.
                None => continue,
            }
        }
        if out.len() != jobs.len() {
            return Err(Error::internal("a whole load stopped without an error"));
        }
        Ok(out)
    }

    /// The byte ranges to read for one leaf: its whole span when its chunks are contiguous
    /// (remote reads of big arrays go chunk by chunk instead, so several requests can fetch
    /// them in parallel, re-coalesced up to `max_request_bytes`), else each chunk.
    pub(super) fn job_keys(&self, j: &Job<'_>, mmap: bool) -> Vec<ChunkKey> {
        match span_of(j.entry) {
            Some(span) if !mmap && self.loc.remote_tuning().is_none_or(|t| span.2 <= t.max_request_bytes) => vec![span],
            _ => j.entry.chunks().iter().map(|c| (c.pack, c.offset, c.length)).collect(),
        }
    }

    /// Ask the kernel to read ahead the chunks of the leaves from `next[0]` on, up to `limit`
    /// bytes of them (chunks already cached cost one cheap call per contiguous run).
    pub(super) fn advise_ahead(&self, next: &[Job<'_>], limit: u64) {
        let mut by_pack: HashMap<u32, Vec<Range<u64>>> = HashMap::new();
        let mut bytes = 0u64;
        for j in next {
            if bytes > 0 && bytes + j.entry.nbytes() > limit {
                break;
            }
            bytes += j.entry.nbytes();
            for c in j.entry.chunks() {
                by_pack.entry(c.pack).or_default().push(c.offset..c.offset + c.length);
            }
        }
        for (pack, mut ranges) in by_pack {
            // One call per contiguous run of chunks.
            ranges.sort_unstable_by_key(|r| r.start);
            let mut runs: Vec<Range<u64>> = Vec::with_capacity(ranges.len());
            for r in ranges {
                match runs.last_mut() {
                    Some(last) if r.start <= last.end + 4096 => last.end = last.end.max(r.end),
                    _ => runs.push(r),
                }
            }
            if let Some(p) = self.manifest.packs.get(pack as usize) {
                self.loc.will_need(&p.path, &runs);
            }
        }
    }
}
