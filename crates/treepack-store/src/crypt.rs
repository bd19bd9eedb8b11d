//! Encrypted locations (docs/format.md section 13; docs/encryption.md): a backend that seals
//! what a tree's files hold on the way out and opens it on the way in, over any other backend.
//!
//! The engine above sees plain bytes, offsets and sizes, as of an unencrypted tree: ranged reads
//! become reads of the segments that hold them, decrypted and cut to the range; writes of the
//! tree's files (its manifest, or single file, and its packs) are sealed whole. Other objects
//! (a signature beside the tree, save markers) pass through in the clear. Local files are read
//! through the backend only: no memory maps, no reads straight into the caller's memory (what
//! they would hand out is ciphertext).
//!
//! Each save makes a fresh random data key, wrapped into the envelope of the object that holds
//! the manifest; the key is dropped once that object is written, so no two saves share one
//! (AES-GCM's nonces, a segment's index, are unique per object key).

use crate::backend::{Backend, BoxFuture, Keep, Listed, RangeRead, Swap, Version, Write};
use crate::buffers::{self, Pooled};
use crate::{Error, Layout, Location, RemoteTuning, Result, MANIFEST_NAME, PACKS_DIR};
use bytes::Bytes;
use futures::FutureExt;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use treepack_format::crypt::{self as fc, DataKey, KeySource, ObjectKey, Params};

/// One tree's keys: its data key, how its objects are cut, its envelope as stored, and what
/// it is encrypted with (for messages).
struct TreeKey {
    dek: DataKey,
    params: Params,
    envelope: Vec<u8>,
    /// What the data key is wrapped with, as its envelope says (for `inspect`).
    with: String,
}

/// The key a location was given, the data key of the save in progress, and what the location
/// has learned (shared with the location each save writes through, [`Encrypted::for_save`]).
pub(crate) struct Crypt {
    source: KeySource,
    /// A data key and salt fixed in advance, for golden files (byte-identical saves).
    fixed: Option<(DataKey, [u8; 32])>,
    write: Mutex<Option<Arc<TreeKey>>>,
    learned: Arc<Learned>,
}

/// Envelopes opened: their bytes, and the tree key each gave.
type Opened = Vec<(Vec<u8>, Arc<TreeKey>)>;

/// What a location has learned: the data key of the tree read, the envelopes opened and the
/// sizes of the objects read.
#[derive(Default)]
struct Learned {
    read: Mutex<Option<Arc<TreeKey>>>,
    /// Envelopes already opened (Argon2id, or a key provider's call, runs once per envelope),
    /// shared with the pinned views of the location ([`Encrypted::fresh`]).
    opened: Arc<Mutex<Opened>>,
    /// Stored size and envelope length of the objects read.
    sizes: Mutex<HashMap<String, (u64, u64)>>,
}

impl Crypt {
    fn new(source: KeySource, fixed: Option<(DataKey, [u8; 32])>) -> Crypt {
        Crypt { source, fixed, write: Mutex::new(None), learned: Arc::default() }
    }
}

/// Segments sealed at a time when a file is written as it is sealed: 8 MiB of plain bytes.
const SEAL_RUN: u64 = 128;

/// A buffer for a sealed file (kept between files: crate::buffers).
fn buffer(len: usize) -> Result<memmap2::MmapMut> {
    buffers::take(len, "a sealed file's buffer")
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The backend of an encrypted location: `plain` is the same location on the backend below,
/// through which the stored bytes move.
pub(crate) struct Encrypted {
    plain: Location,
    crypt: Crypt,
}

impl std::fmt::Debug for Encrypted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Encrypted({:?})", self.plain.backend())
    }
}

/// Whether `rel` is the object that holds a tree's manifest (and its envelope).
fn holds_envelope(layout: Layout, rel: &str) -> bool {
    match layout {
        Layout::SingleFile => rel == "." || rel.is_empty(),
        Layout::Directory => rel == MANIFEST_NAME,
    }
}

/// The name an object's key is derived from.
fn object_name(rel: &str) -> &str {
    if rel.is_empty() {
        "."
    } else {
        rel
    }
}

impl Encrypted {
    pub(crate) fn new(plain: Location, source: KeySource, fixed: Option<(DataKey, [u8; 32])>) -> Encrypted {
        Encrypted { plain, crypt: Crypt::new(source, fixed) }
    }

    /// The same location and key, with nothing learned: a pinned reader's view.
    pub(crate) fn fresh(&self, plain: Location) -> Encrypted {
        let mut e = Encrypted::new(plain, self.crypt.source.clone(), self.crypt.fixed.clone());
        // The envelopes opened stay opened: an envelope's bytes give the same data key.
        e.crypt.learned = Arc::new(Learned { opened: self.crypt.learned.opened.clone(), ..Learned::default() });
        e
    }

    /// The same location, key and what it learned, for one save: the save's data key is its
    /// own, made on first use and dropped with it. So two saves through one location — at once,
    /// or one retried after another failed with its packs or manifest sealed — never seal
    /// anything under the same data key (AES-GCM nonce reuse), and a save never mixes its packs'
    /// key with another save's manifest.
    pub(crate) fn for_save(&self) -> Encrypted {
        let crypt = Crypt {
            source: self.crypt.source.clone(),
            fixed: self.crypt.fixed.clone(),
            write: Mutex::new(None),
            learned: self.crypt.learned.clone(),
        };
        Encrypted { plain: self.plain.clone(), crypt }
    }

    /// What the tree read was encrypted with (`the 32-byte key 8d10e47c8bf2374e`, `a
    /// passphrase`, a provider's key), once its envelope was read.
    pub(crate) fn encrypted_with(&self) -> Option<String> {
        lock(&self.crypt.learned.read).as_ref().map(|t| t.with.clone())
    }

    pub(crate) fn plain(&self) -> &Location {
        &self.plain
    }

    fn layout(&self) -> Layout {
        self.plain.layout()
    }

    /// Whether `rel` is one of the tree's own files (sealed), not something beside it.
    fn sealed(&self, rel: &str) -> bool {
        holds_envelope(self.layout(), rel) || rel.starts_with(&format!("{PACKS_DIR}/"))
    }

    fn manifest_rel(&self) -> &'static str {
        match self.layout() {
            Layout::SingleFile => ".",
            Layout::Directory => MANIFEST_NAME,
        }
    }

    fn tampered(&self, rel: &str, span: Range<u64>, reason: impl Into<String>) -> Error {
        Error::Tampered {
            file: self.plain.file_name(rel),
            key: String::new(),
            start: span.start,
            end: span.end,
            reason: reason.into(),
        }
    }

    /// The error for the manifest's object when it lacks the encrypted object's header or
    /// trailer: a file with neither is a plain one (`NotEncrypted`); one with either is an
    /// encrypted file cut short, extended or damaged (`Tampered`), not a plain tree put there.
    fn not_encrypted_or_cut(&self, rel: &str, looks_encrypted: bool) -> Result<()> {
        if looks_encrypted {
            return Err(self.tampered(
                rel,
                0..0,
                "the file has only one of the TPKCRYPT header and trailer: it was cut short, extended or damaged",
            ));
        }
        Err(Error::NotEncrypted { location: self.plain.display().to_string() })
    }

    fn wrong_key(&self, e: fc::KeyError) -> Error {
        let reason = match &e {
            fc::KeyError::WrongKind { .. } | fc::KeyError::WrongKey(_) => {
                format!("{e}: pass the key it was encrypted with")
            }
            fc::KeyError::Invalid(s) => format!("the tree's encryption envelope cannot be read: {s}"),
            fc::KeyError::Provider(s) => format!("the key provider failed: {s}"),
        };
        Error::WrongKey { location: self.plain.display().to_string(), reason }
    }

    /// The data key a save writes with: made on first use, dropped when the manifest is written.
    pub(crate) fn write_key(&self) -> Result<(DataKey, Params)> {
        let t = self.write_tree()?;
        Ok((t.dek.clone(), t.params))
    }

    fn write_tree(&self) -> Result<Arc<TreeKey>> {
        let mut w = lock(&self.crypt.write);
        if let Some(t) = &*w {
            return Ok(t.clone());
        }
        let (dek, salt) = match &self.crypt.fixed {
            Some(f) => f.clone(),
            None => {
                let mut k = [0u8; 32];
                let mut s = [0u8; 32];
                getrandom::fill(&mut k)
                    .and_then(|()| getrandom::fill(&mut s))
                    .map_err(|e| Error::internal(format!("the system's random number generator failed: {e}")))?;
                (DataKey(k), s)
            }
        };
        let params = Params::WRITER;
        let env = fc::seal_envelope(&self.crypt.source, params, &dek, salt).map_err(|e| self.wrong_key(e))?;
        let t = Arc::new(TreeKey { dek, params, envelope: fc::envelope_bytes(&env), with: env.key.describe() });
        *w = Some(t.clone());
        Ok(t)
    }

    /// The key of the tree read: from the envelope of its manifest's object, read once.
    async fn read_tree(&self) -> Result<Arc<TreeKey>> {
        if let Some(t) = lock(&self.crypt.learned.read).clone() {
            return Ok(t);
        }
        let rel = self.manifest_rel();
        self.object_size(rel).await?;
        lock(&self.crypt.learned.read).clone().ok_or_else(|| Error::internal("an encrypted tree's key was not learned"))
    }

    /// The stored size and envelope length of `rel` (the envelope read and opened, for the
    /// manifest's object).
    async fn object_size(&self, rel: &str) -> Result<(u64, u64)> {
        if let Some(s) = lock(&self.crypt.learned.sizes).get(rel) {
            return Ok(*s);
        }
        let got = if holds_envelope(self.layout(), rel) {
            let (tail, size) = self.plain.read_suffix(rel, fc::TRAILER_LEN + fc::MAX_ENVELOPE_BYTES).await?;
            if !tail.ends_with(&fc::MAGIC) {
                // No trailer: a plain file, or an encrypted one cut short or extended.
                let head = self.plain.read_range(rel, 0..size.min(fc::MAGIC.len() as u64)).await?;
                self.not_encrypted_or_cut(rel, fc::is_encrypted(&head))?;
            }
            let (_, e) = self.envelope_from_tail(rel, &tail, size)?;
            (size, e)
        } else {
            (self.plain.size(rel).await?, 0)
        };
        lock(&self.crypt.learned.sizes).insert(rel.to_string(), got);
        Ok(got)
    }

    /// The tree key from the envelope at the end of `tail` (the last bytes of the manifest's
    /// object, `size` bytes in all), and the envelope's length.
    fn envelope_from_tail(&self, rel: &str, tail: &[u8], size: u64) -> Result<(Arc<TreeKey>, u64)> {
        if !tail.ends_with(&fc::MAGIC) {
            return Err(self.tampered(rel, 0..0, "no TPKCRYPT trailer"));
        }
        let e = fc::trailer_envelope_len(tail, size).map_err(|r| self.tampered(rel, 0..0, r))?;
        let end = tail.len() - fc::TRAILER_LEN as usize;
        let env =
            tail.get(end - e as usize..end).ok_or_else(|| self.tampered(rel, 0..0, "the envelope was not read"))?;
        if let Some((_, t)) = lock(&self.crypt.learned.opened).iter().find(|(b, _)| b == env) {
            let t = t.clone();
            *lock(&self.crypt.learned.read) = Some(t.clone());
            return Ok((t, e));
        }
        let (parsed, params) = fc::parse_envelope(env).map_err(|e| self.wrong_key(e))?;
        let dek = fc::open_envelope(&self.crypt.source, &parsed, params).map_err(|e| self.wrong_key(e))?;
        let t = Arc::new(TreeKey { dek, params, envelope: env.to_vec(), with: parsed.key.describe() });
        lock(&self.crypt.learned.opened).push((env.to_vec(), t.clone()));
        *lock(&self.crypt.learned.read) = Some(t.clone());
        Ok((t, e))
    }

    /// Open a whole stored object.
    async fn open_whole(&self, rel: &str, c: &[u8]) -> Result<Bytes> {
        let size = c.len() as u64;
        let (t, e) = if holds_envelope(self.layout(), rel) {
            if !fc::is_encrypted(c) || !c.ends_with(&fc::MAGIC) {
                self.not_encrypted_or_cut(rel, fc::is_encrypted(c) || c.ends_with(&fc::MAGIC))?;
            }
            self.envelope_from_tail(rel, c, size)?
        } else {
            let t = self.read_tree().await?;
            let e = fc::trailer_envelope_len(c, size).map_err(|r| self.tampered(rel, 0..0, r))?;
            if e != 0 {
                return Err(self.tampered(rel, 0..0, "a pack holds an envelope"));
            }
            (t, 0)
        };
        self.check_header(rel, &t, c)?;
        let plain = t.params.plain_len(size, e).map_err(|r| self.tampered(rel, 0..0, r))?;
        lock(&self.crypt.learned.sizes).insert(rel.to_string(), (size, e));
        let key = ObjectKey::new(&t.dek, t.params, object_name(rel));
        let mut out = vec![0u8; plain as usize];
        let seg = t.params.segment;
        key.open(0, &c[fc::HEADER_LEN as usize..], plain, &mut out)
            .map_err(|i| self.tampered(rel, i * seg..((i + 1) * seg).min(plain), format!("segment {i}")))?;
        Ok(Bytes::from(out))
    }

    /// Ranges of the plain bytes of `rel`.
    async fn read_plain(&self, rel: &str, read: RangeRead<'_>) -> Result<Vec<Bytes>> {
        let t = self.read_tree().await?;
        let (stored, e) = self.object_size(rel).await?;
        let p = t.params;
        let plain = p.plain_len(stored, e).map_err(|r| self.tampered(rel, 0..0, r))?;
        let mut want = Vec::with_capacity(read.ranges.len());
        let mut segs = Vec::with_capacity(read.ranges.len());
        for r in &read.ranges {
            if r.end > plain || r.start > r.end {
                return Err(Error::OutOfBounds {
                    file: self.plain.file_name(rel),
                    key: String::new(),
                    reason: format!("bytes {}..{} lie past the end of the file ({plain} bytes)", r.start, r.end),
                });
            }
            let s = p.segments_of(r);
            // A read of the first segment takes the header with it, and of the last the envelope
            // and trailer, to check them: a whole load so checks every byte of every file.
            let mut sr = p.stored_range(s.clone(), plain);
            if s.start == 0 {
                sr.start = 0;
            }
            if s.end == p.segments(plain) {
                sr.end = stored;
            }
            want.push(sr);
            segs.push(s);
        }
        let key = ObjectKey::new(&t.dek, p, object_name(rel));
        if let Some(l) = self.plain.local() {
            // A local file: each segment read straight into its place in the range's buffer.
            let mut out = Vec::with_capacity(read.ranges.len());
            for ((r, s), sr) in read.ranges.iter().zip(segs).zip(&want) {
                if r.start == r.end {
                    out.push(Bytes::new());
                    continue;
                }
                out.push(self.read_local(l, rel, &t, &key, (stored, e, plain), r, s)?);
                if let Some(pr) = read.progress {
                    pr.advance(sr.end - sr.start);
                }
            }
            return Ok(out);
        }
        let got = self
            .plain
            .backend()
            .read_ranges(&self.plain, rel, RangeRead { ranges: want, mode: read.mode, progress: read.progress })
            .await?;
        let mut out = Vec::with_capacity(got.len());
        for ((r, s), c) in read.ranges.iter().zip(segs).zip(got) {
            if r.start == r.end {
                out.push(Bytes::new());
                continue;
            }
            let c = self.check_ends(rel, &t, &c, s.start == 0, s.end == p.segments(plain), e)?;
            let from = s.start * p.segment;
            let to = (s.end * p.segment).min(plain);
            let mut buf = vec![0u8; (to - from) as usize];
            key.open(s.start, c, plain, &mut buf).map_err(|i| {
                self.tampered(rel, i * p.segment..((i + 1) * p.segment).min(plain), format!("segment {i}"))
            })?;
            out.push(Bytes::from(buf).slice((r.start - from) as usize..(r.end - from) as usize));
        }
        Ok(out)
    }

    /// The plain bytes `r` of the local file `rel` (`sizes`: stored size, envelope length, plain
    /// size), in segments `s`: one vectored read puts each segment's ciphertext where its plain
    /// bytes go and its tag beside, then each is opened in place (in parallel when big) — one
    /// buffer, one copy by the kernel.
    #[allow(clippy::too_many_arguments)]
    fn read_local(
        &self,
        l: &crate::local::Local,
        rel: &str,
        t: &TreeKey,
        key: &ObjectKey,
        (_stored, e, plain): (u64, u64, u64),
        r: &Range<u64>,
        s: Range<u64>,
    ) -> Result<Bytes> {
        let p = t.params;
        let (first, last) = (s.start == 0, s.end == p.segments(plain));
        let from = s.start * p.segment;
        let to = (s.end * p.segment).min(plain);
        let mut out = vec![0u8; (to - from) as usize];
        let mut tags = vec![0u8; (fc::TAG_LEN * (s.end - s.start)) as usize];
        let mut head = [0u8; fc::HEADER_LEN as usize];
        let mut tail = vec![0u8; if last { (fc::TRAILER_LEN + e) as usize } else { 0 }];
        let start = if first { 0 } else { p.stored_range(s.clone(), plain).start };
        {
            let mut bufs: Vec<&mut [u8]> = Vec::with_capacity(2 * (s.end - s.start) as usize + 2);
            if first {
                bufs.push(&mut head);
            }
            for (slot, tag) in out.chunks_mut(p.segment as usize).zip(tags.chunks_mut(fc::TAG_LEN as usize)) {
                bufs.push(slot);
                bufs.push(tag);
            }
            if last {
                bufs.push(&mut tail);
            }
            l.read_vectored_into(&self.plain, rel, start, &mut bufs)?;
        }
        if first {
            self.check_header(rel, t, &head)?;
        }
        if last {
            self.check_trailer(rel, &tail, e)?;
        }
        key.open_detached(s.start, &mut out, &tags, plain)
            .map_err(|i| self.tampered(rel, i * p.segment..((i + 1) * p.segment).min(plain), format!("segment {i}")))?;
        Ok(Bytes::from(out).slice((r.start - from) as usize..(r.end - from) as usize))
    }

    /// The segments of `c` (stored bytes read from a segment's start, or from the object's start
    /// when `first`, through its end when `last`), having checked the header and trailer read
    /// with them against the tree's envelope.
    fn check_ends<'c>(&self, rel: &str, t: &TreeKey, c: &'c [u8], first: bool, last: bool, e: u64) -> Result<&'c [u8]> {
        let mut c = c;
        if first {
            self.check_header(rel, t, c)?;
            c = &c[fc::HEADER_LEN as usize..];
        }
        if last {
            self.check_trailer(rel, c, e)?;
            c = &c[..c.len() - (fc::TRAILER_LEN + e) as usize];
        }
        Ok(c)
    }

    /// Check that `h` (bytes from the start of the object `rel`) begins with the header the
    /// tree's envelope implies.
    fn check_header(&self, rel: &str, t: &TreeKey, h: &[u8]) -> Result<()> {
        match Params::from_header(h) {
            Ok(p) if p == t.params => Ok(()),
            Ok(_) => Err(self.tampered(rel, 0..0, "the header does not match the tree's envelope")),
            Err(r) => Err(self.tampered(rel, 0..0, r)),
        }
    }

    /// Check that `tail` (bytes through the end of the object `rel`) ends with a trailer of an
    /// `e`-byte envelope, the envelope within `tail`.
    fn check_trailer(&self, rel: &str, tail: &[u8], e: u64) -> Result<()> {
        let fits = tail.len() as u64 >= fc::TRAILER_LEN + e;
        if fits && fc::trailer_envelope_len(tail, u64::MAX).ok() == Some(e) {
            return Ok(());
        }
        Err(self.tampered(rel, 0..0, "the trailer does not match the file"))
    }

    /// Seal `parts` as the object `rel`: with the envelope for the manifest's object, after
    /// which the save's data key is dropped (the next save makes its own).
    async fn seal(&self, rel: &str, parts: Vec<Bytes>) -> Result<(Bytes, Option<Arc<TreeKey>>)> {
        let t = self.write_tree()?;
        let last = holds_envelope(self.layout(), rel);
        let key = ObjectKey::new(&t.dek, t.params, object_name(rel));
        let env = if last { t.envelope.clone() } else { vec![] };
        let sealed = crate::backend::maybe_spawn_blocking(move || {
            let plain: u64 = parts.iter().map(|p| p.len() as u64).sum();
            let len = key.params().stored_len(plain, env.len() as u64) as usize;
            let mut m = buffer(len)?;
            key.seal_into(&parts, &env, &mut m[..len]);
            Ok(Bytes::from_owner(Pooled::new(m, len)))
        })
        .await?;
        lock(&self.crypt.learned.sizes).remove(rel);
        Ok((sealed, last.then_some(t)))
    }

    /// The sealed parts of the object `rel` holding `parts`, made on a thread of their own a
    /// run of [`SEAL_RUN`] segments at a time, at most two runs ahead of the writer (which
    /// drops each run once written, so its buffer is kept for a later one).
    #[allow(clippy::type_complexity)]
    fn seal_stream(
        &self,
        rel: &str,
        parts: Vec<Bytes>,
    ) -> Result<(Box<dyn Iterator<Item = Result<Bytes>> + Send>, Option<Arc<TreeKey>>)> {
        let t = self.write_tree()?;
        let last = holds_envelope(self.layout(), rel);
        let key = ObjectKey::new(&t.dek, t.params, object_name(rel));
        let env = if last { t.envelope.clone() } else { vec![] };
        lock(&self.crypt.learned.sizes).remove(rel);
        let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Bytes>>(2);
        std::thread::Builder::new()
            .name("treepack-seal".into())
            .spawn(move || {
                let plain: u64 = parts.iter().map(|p| p.len() as u64).sum();
                let n = key.params().segments(plain);
                if tx.send(Ok(Bytes::copy_from_slice(&key.header()))).is_err() {
                    return;
                }
                let mut at = 0;
                while at < n {
                    let segs = at..(at + SEAL_RUN).min(n);
                    at = segs.end;
                    let len = key.segments_len(plain, segs.clone());
                    let piece = buffer(len).map(|mut m| {
                        key.seal_segments(&parts, segs, &mut m[..len]);
                        Bytes::from_owner(Pooled::new(m, len))
                    });
                    let failed = piece.is_err();
                    // The writer stopped (a failed write): so does this thread.
                    if tx.send(piece).is_err() || failed {
                        return;
                    }
                }
                let _ = tx.send(Ok(Bytes::from(key.trailer(&env))));
            })
            .map_err(|e| Error::Io { path: "treepack-seal thread".into(), source: e })?;
        Ok((Box::new(rx.into_iter()), last.then_some(t)))
    }

    /// After the manifest's object is written: the tree written is the one read from now on,
    /// and the next save makes a new data key.
    fn committed(&self, t: Option<Arc<TreeKey>>) {
        if let Some(t) = t {
            *lock(&self.crypt.learned.read) = Some(t);
            *lock(&self.crypt.write) = None;
        }
    }
}

impl Backend for Encrypted {
    fn get<'a>(&'a self, _loc: &'a Location, rel: &'a str, limit: u64) -> BoxFuture<'a, Option<(Bytes, Version)>> {
        async move {
            if !self.sealed(rel) {
                return self.plain.get_versioned(rel, limit).await;
            }
            // What `limit` plain bytes take stored, with the largest envelope.
            let overhead = (limit / fc::SEGMENT_BYTES.min(4096) + 1) * fc::TAG_LEN
                + fc::HEADER_LEN
                + fc::TRAILER_LEN
                + fc::MAX_ENVELOPE_BYTES;
            let Some((c, v)) = self.plain.get_versioned(rel, limit.saturating_add(overhead)).await? else {
                return Ok(None);
            };
            let b = self.open_whole(rel, &c).await?;
            if b.len() as u64 > limit {
                return Err(Error::LimitExceeded {
                    what: self.plain.file_name(rel),
                    limit,
                    detail: format!("{} bytes decrypted", b.len()),
                });
            }
            Ok(Some((b, v)))
        }
        .boxed()
    }

    fn read_ranges<'a>(&'a self, _loc: &'a Location, rel: &'a str, read: RangeRead<'a>) -> BoxFuture<'a, Vec<Bytes>> {
        async move {
            if !self.sealed(rel) {
                return self.plain.backend().read_ranges(&self.plain, rel, read).await;
            }
            self.read_plain(rel, read).await
        }
        .boxed()
    }

    fn read_suffix<'a>(&'a self, _loc: &'a Location, rel: &'a str, n: u64) -> BoxFuture<'a, (Bytes, u64)> {
        async move {
            if !self.sealed(rel) {
                return self.plain.read_suffix(rel, n).await;
            }
            let t = self.read_tree().await?;
            let (stored, e) = self.object_size(rel).await?;
            let plain = t.params.plain_len(stored, e).map_err(|r| self.tampered(rel, 0..0, r))?;
            let r = plain.saturating_sub(n)..plain;
            let got = self
                .read_plain(rel, RangeRead { ranges: vec![r], mode: crate::ReadMode::Buffered, progress: None })
                .await?;
            Ok((got.into_iter().next().unwrap_or_default(), plain))
        }
        .boxed()
    }

    fn size<'a>(&'a self, _loc: &'a Location, rel: &'a str) -> BoxFuture<'a, u64> {
        async move {
            if !self.sealed(rel) {
                return self.plain.size(rel).await;
            }
            let t = self.read_tree().await?;
            let (stored, e) = self.object_size(rel).await?;
            t.params.plain_len(stored, e).map_err(|r| self.tampered(rel, 0..0, r))
        }
        .boxed()
    }

    fn exists<'a>(&'a self, _loc: &'a Location, rel: &'a str) -> BoxFuture<'a, bool> {
        self.plain.exists(rel).boxed()
    }

    fn put<'a>(&'a self, _loc: &'a Location, rel: &'a str, write: Write<'a>) -> BoxFuture<'a, ()> {
        async move {
            if !self.sealed(rel) {
                return self.plain.backend().put(&self.plain, rel, write).await;
            }
            if self.plain.local().is_some() {
                // Sealed a run of segments at a time while the runs before are written: a few
                // kept buffers, however big the file.
                let (parts, t) = self.seal_stream(rel, write.parts)?;
                let Write { create_only, durable, progress, .. } = write;
                let stream = crate::backend::WriteStream { parts, create_only, durable, progress };
                self.plain.backend().put_stream(&self.plain, rel, stream).await?;
                self.committed(t);
                return Ok(());
            }
            let (sealed, t) = self.seal(rel, write.parts).await?;
            self.plain.backend().put(&self.plain, rel, Write { parts: vec![sealed], ..write }).await?;
            self.committed(t);
            Ok(())
        }
        .boxed()
    }

    fn replace_if<'a>(&'a self, _loc: &'a Location, rel: &'a str, swap: Swap<'a>) -> BoxFuture<'a, bool> {
        async move {
            if !self.sealed(rel) {
                return self.plain.backend().replace_if(&self.plain, rel, swap).await;
            }
            let (sealed, t) = self.seal(rel, swap.parts).await?;
            let ok = self.plain.backend().replace_if(&self.plain, rel, Swap { parts: vec![sealed], ..swap }).await?;
            if ok {
                self.committed(t);
            }
            Ok(ok)
        }
        .boxed()
    }

    fn delete<'a>(&'a self, _loc: &'a Location, rel: &'a str) -> BoxFuture<'a, ()> {
        lock(&self.crypt.learned.sizes).remove(rel);
        self.plain.backend().delete(&self.plain, rel)
    }

    fn list<'a>(&'a self, _loc: &'a Location, rel_dir: &'a str, keep: &'a Keep<'a>) -> BoxFuture<'a, Vec<Listed>> {
        self.plain.backend().list(&self.plain, rel_dir, keep)
    }

    fn top_names<'a>(&'a self, _loc: &'a Location, limit: usize) -> BoxFuture<'a, Vec<String>> {
        self.plain.backend().top_names(&self.plain, limit)
    }

    fn remote(&self) -> Option<RemoteTuning> {
        self.plain.backend().remote()
    }

    fn read_only(&self) -> Option<&str> {
        self.plain.backend().read_only()
    }

    fn local(&self) -> Option<&crate::local::Local> {
        // For what is not the tree's bytes (save markers, directory syncs, gc's leftovers):
        // `Location` keeps reads of bytes off it for an encrypted location.
        self.plain.backend().local()
    }

    fn sidecar(&self, suffix: &str) -> Option<Arc<dyn Backend>> {
        self.plain.backend().sidecar(suffix)
    }
}
