//! Encrypted objects (docs/format.md section 13, format 1.7): how the files of an encrypted tree
//! are laid out, sealed and opened, and how its data key is kept. No I/O and no randomness: the
//! store reads and writes the objects and makes the data key and salt (treepack-store's
//! `crypt` module).
//!
//! Every file of an encrypted tree — its manifest (or single `.tpk` file) and its packs — is
//! one *encrypted object*: a 16-byte header, the file's plain bytes cut into segments of 64 KiB
//! each sealed with AES-256-GCM, an envelope (only in the object holding the manifest), and a
//! 16-byte trailer. Each object has its own key, derived from the tree's random data key and the
//! object's name; each segment's nonce is its index and whether it is the last. So a segment
//! moved within a file, swapped between files or trees, or a file cut short at a segment
//! boundary, fails to authenticate; ranged reads decrypt only the segments they touch. The data
//! key is stored in the envelope wrapped by the user's key: 32 bytes, a passphrase (Argon2id),
//! or a [`KeyProvider`] (a KMS).

use bytes::Bytes;
use ring::aead::{Aad, LessSafeKey, Nonce, Tag, UnboundKey, AES_256_GCM as RING_AES_256_GCM};
use std::fmt;
use std::ops::Range;
use std::sync::Arc;

/// The format minor version of an encrypted tree: its manifest says `[1,7]` whatever else it
/// holds.
pub const ENCRYPTED_MINOR: u16 = 7;

/// What a stored object says it was encrypted with (from its envelope, if `tail`, the object's
/// last bytes, holds it), for the message that asks for a key.
pub fn describe_stored(tail: &[u8]) -> String {
    let described = trailer_envelope_len(tail, u64::MAX).ok().and_then(|e| {
        let end = tail.len() - TRAILER_LEN as usize;
        let env = tail.get(end.checked_sub(e as usize)?..end)?;
        parse_envelope(env).ok().map(|(env, _)| env.key.describe())
    });
    described.unwrap_or_else(|| "its envelope unreadable".into())
}

/// The first and last 8 bytes of every encrypted object.
pub const MAGIC: [u8; 8] = *b"TPKCRYPT";
/// Bytes of an encrypted object's header.
pub const HEADER_LEN: u64 = 16;
/// Bytes of an encrypted object's trailer.
pub const TRAILER_LEN: u64 = 16;
/// Bytes of each segment's authentication tag.
pub const TAG_LEN: u64 = 16;
/// Plain bytes per segment a writer uses (a reader takes the size from the envelope).
pub const SEGMENT_BYTES: u64 = 64 << 10;
/// The largest envelope a reader accepts.
pub const MAX_ENVELOPE_BYTES: u64 = 16 << 10;
/// The cipher id of AES-256-GCM in a header.
pub const AES_256_GCM: u8 = 1;
/// The cipher's name in an envelope.
pub const AES_256_GCM_NAME: &str = "aes-256-gcm";
/// Segment sizes a reader accepts: 4 KiB to 16 MiB, powers of two.
const SEGMENT_LOG2: std::ops::RangeInclusive<u8> = 12..=24;

/// Argon2id's cost for a passphrase, as a writer sets it: 64 MiB, 3 passes, one lane (RFC 9106's
/// second recommended option, with one lane: a load derives it once).
pub const ARGON2_WRITER: (u32, u32, u32) = (64 << 10, 3, 1);
/// The most memory (KiB) an envelope may ask Argon2id for: a hostile file cannot make a reader
/// allocate more than 256 MiB or spend more than 16 passes deriving a key.
pub const ARGON2_MAX_M_KIB: u32 = 256 << 10;
const ARGON2_MAX_T: u32 = 16;
const ARGON2_MAX_P: u32 = 16;

/// Whether `b` begins (or, a suffix, ends) as an encrypted object does.
pub fn is_encrypted(b: &[u8]) -> bool {
    b.starts_with(&MAGIC)
}

/// A tree's data key: 32 random bytes made for each save. Not shown by `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct DataKey(pub [u8; 32]);

impl fmt::Debug for DataKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DataKey(..)")
    }
}

/// How an encrypted object is cut: its cipher and segment size (from the tree's envelope,
/// repeated in each object's header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// The cipher's id ([`AES_256_GCM`]).
    pub cipher: u8,
    /// Plain bytes per segment (a power of two).
    pub segment: u64,
}

impl Params {
    /// What a writer uses.
    pub const WRITER: Params = Params { cipher: AES_256_GCM, segment: SEGMENT_BYTES };

    /// The params an envelope names, checked.
    ///
    /// # Errors
    /// An unknown cipher, or a segment size that is not a power of two from 4 KiB to 16 MiB.
    pub fn new(cipher: &str, segment: u64) -> Result<Params, String> {
        if cipher != AES_256_GCM_NAME {
            return Err(format!("unknown cipher {cipher:?} (this treepack reads {AES_256_GCM_NAME})"));
        }
        let ok = segment.is_power_of_two() && SEGMENT_LOG2.contains(&(segment.trailing_zeros() as u8));
        if !ok {
            return Err(format!("segment size {segment} is not a power of two from 4 KiB to 16 MiB"));
        }
        Ok(Params { cipher: AES_256_GCM, segment })
    }

    /// The 16-byte header of an object cut this way.
    pub fn header(&self) -> [u8; 16] {
        let mut h = [0u8; 16];
        h[..8].copy_from_slice(&MAGIC);
        h[8..10].copy_from_slice(&1u16.to_le_bytes());
        h[10..12].copy_from_slice(&0u16.to_le_bytes());
        h[12] = self.cipher;
        h[13] = self.segment.trailing_zeros() as u8;
        h
    }

    /// How many segments `plain` bytes take (at least one: an empty object has one empty
    /// segment, so cutting a file to nothing does not authenticate).
    pub fn segments(&self, plain: u64) -> u64 {
        plain.div_ceil(self.segment).max(1)
    }

    /// The stored size of an object of `plain` bytes with an envelope of `envelope` bytes.
    pub fn stored_len(&self, plain: u64, envelope: u64) -> u64 {
        HEADER_LEN + plain + self.segments(plain) * TAG_LEN + envelope + TRAILER_LEN
    }

    /// The plain size of a stored object of `stored` bytes whose envelope is `envelope` bytes.
    ///
    /// # Errors
    /// A size no object of these params has (cut short inside a tag or header).
    pub fn plain_len(&self, stored: u64, envelope: u64) -> Result<u64, String> {
        let body = stored
            .checked_sub(HEADER_LEN + TRAILER_LEN + envelope)
            .filter(|b| *b >= TAG_LEN)
            .ok_or_else(|| format!("{stored} bytes is too short for an encrypted object"))?;
        let whole = self.segment + TAG_LEN;
        let (full, rest) = (body / whole, body % whole);
        match rest {
            0 => Ok(full * self.segment),
            r if r >= TAG_LEN => Ok(full * self.segment + r - TAG_LEN),
            _ => Err(format!("{stored} bytes ends inside a segment's tag: the file was cut short")),
        }
    }

    /// Where segments `segs` of an object of `plain` bytes are stored.
    pub fn stored_range(&self, segs: Range<u64>, plain: u64) -> Range<u64> {
        let whole = self.segment + TAG_LEN;
        let end_plain = (segs.end * self.segment).min(plain);
        let last_len = end_plain.saturating_sub((segs.end - 1) * self.segment);
        let start = HEADER_LEN + segs.start * whole;
        let end = HEADER_LEN + (segs.end - 1) * whole + last_len + TAG_LEN;
        start..end.max(start)
    }

    /// The segments holding plain bytes `r` (at least one).
    pub fn segments_of(&self, r: &Range<u64>) -> Range<u64> {
        let first = r.start / self.segment;
        let last = if r.end > r.start { (r.end - 1) / self.segment } else { first };
        first..last + 1
    }

    /// Parse an object's header.
    ///
    /// # Errors
    /// Not a header, an unknown cipher or version, a segment size out of range.
    pub fn from_header(h: &[u8]) -> Result<Params, String> {
        if h.len() < HEADER_LEN as usize || !is_encrypted(h) {
            return Err("not an encrypted treepack object (no TPKCRYPT header)".into());
        }
        let major = u16::from_le_bytes([h[8], h[9]]);
        if major != 1 || h[14..16] != [0, 0] {
            return Err(format!("encrypted object version {major} is not supported: upgrade treepack"));
        }
        if h[12] != AES_256_GCM {
            return Err(format!("unknown cipher id {}", h[12]));
        }
        if !SEGMENT_LOG2.contains(&h[13]) {
            return Err(format!("segment size 2^{} is out of range", h[13]));
        }
        Ok(Params { cipher: h[12], segment: 1 << h[13] })
    }
}

/// The envelope's length, from an object's trailer (its last 16 bytes), checked against the
/// object's `stored` size.
///
/// # Errors
/// No trailer, nonzero reserved bytes, an envelope too large for the object or for a reader.
pub fn trailer_envelope_len(trailer: &[u8], stored: u64) -> Result<u64, String> {
    let n = trailer.len();
    if n < TRAILER_LEN as usize || trailer[n - 8..] != MAGIC {
        return Err("no TPKCRYPT trailer: not an encrypted treepack object, or cut short".into());
    }
    let t = &trailer[n - 16..];
    if t[4..8] != [0; 4] {
        return Err("the trailer's reserved bytes are not zero".into());
    }
    let e = u64::from(u32::from_le_bytes([t[0], t[1], t[2], t[3]]));
    if e > MAX_ENVELOPE_BYTES || HEADER_LEN + TAG_LEN + e + TRAILER_LEN > stored {
        return Err(format!("the trailer declares a {e}-byte envelope, which does not fit"));
    }
    Ok(e)
}

/// The key of one object of a tree: derived from the tree's data key, the params and the
/// object's name (`treepack.json`, `packs/<name>.tpp`, `.` for a single file).
pub struct ObjectKey {
    cipher: LessSafeKey,
    header: [u8; 16],
    params: Params,
}

/// An AES-256-GCM key (a 32-byte key always is one).
fn aes_key(key: &[u8; 32]) -> LessSafeKey {
    LessSafeKey::new(UnboundKey::new(&RING_AES_256_GCM, key).unwrap_or_else(|_| unreachable!("32 bytes")))
}

fn tag_of(b: &[u8]) -> Option<Tag> {
    <[u8; 16]>::try_from(b).ok().map(Tag::from)
}

impl ObjectKey {
    /// The key of object `name` of the tree whose data key is `dek`.
    pub fn new(dek: &DataKey, params: Params, name: &str) -> ObjectKey {
        let header = params.header();
        let mut h = blake3::Hasher::new_derive_key("treepack 1.7 encrypted object key");
        h.update(&dek.0);
        h.update(&header);
        h.update(name.as_bytes());
        ObjectKey { cipher: aes_key(h.finalize().as_bytes()), header, params }
    }

    fn nonce(i: u64, last: bool) -> Nonce {
        let mut n = [0u8; 12];
        n[..8].copy_from_slice(&i.to_le_bytes());
        n[8] = u8::from(last);
        // Unique per key: a segment's index (and last flag) under a key of its object and save.
        Nonce::assume_unique_for_key(n)
    }

    /// The stored object holding `parts` (its plain bytes, one after the other) and
    /// `envelope`. Segments are sealed in parallel on the installed executor.
    pub fn seal(&self, parts: &[Bytes], envelope: &[u8]) -> Vec<u8> {
        let plain: u64 = parts.iter().map(|p| p.len() as u64).sum();
        let mut out = vec![0u8; self.params.stored_len(plain, envelope.len() as u64) as usize];
        self.seal_into(parts, envelope, &mut out);
        out
    }

    /// [`seal`](Self::seal) into `out`, which must be exactly
    /// [`Params::stored_len`] long (every byte of it is written: it may hold anything before).
    pub fn seal_into(&self, parts: &[Bytes], envelope: &[u8], out: &mut [u8]) {
        let plain: u64 = parts.iter().map(|p| p.len() as u64).sum();
        let p = self.params;
        let total = p.stored_len(plain, envelope.len() as u64) as usize;
        assert_eq!(out.len(), total, "seal_into: the output is not the object's stored size");
        out[..16].copy_from_slice(&self.header);
        let end = self.trailer(envelope);
        out[total - end.len()..].copy_from_slice(&end);
        let body_end = total - end.len();
        self.seal_segments(parts, 0..p.segments(plain), &mut out[HEADER_LEN as usize..body_end]);
    }

    /// The object's first 16 bytes.
    pub fn header(&self) -> [u8; 16] {
        self.header
    }

    /// The object's last bytes: `envelope`, then the trailer.
    pub fn trailer(&self, envelope: &[u8]) -> Vec<u8> {
        let mut t = envelope.to_vec();
        t.extend_from_slice(&(envelope.len() as u32).to_le_bytes());
        t.extend_from_slice(&[0; 4]);
        t.extend_from_slice(&MAGIC);
        t
    }

    /// The stored bytes of segments `segs` of the object whose plain bytes are `parts` (one
    /// after the other): what [`Params::stored_range`] places there. A writer may seal an object
    /// a run of segments at a time, writing each run as it is sealed.
    pub fn segments_len(&self, plain: u64, segs: Range<u64>) -> usize {
        let r = self.params.stored_range(segs, plain);
        (r.end - r.start) as usize
    }

    /// Seal segments `segs` of the object whose plain bytes are `parts` into `out`
    /// ([`segments_len`](Self::segments_len) long). In parallel for big runs.
    pub fn seal_segments(&self, parts: &[Bytes], segs: Range<u64>, out: &mut [u8]) {
        let plain: u64 = parts.iter().map(|p| p.len() as u64).sum();
        let p = self.params;
        let mut starts = Vec::with_capacity(parts.len());
        let mut at = 0u64;
        for part in parts {
            starts.push(at);
            at += part.len() as u64;
        }
        let last = p.segments(plain) - 1;
        let whole = (p.segment + TAG_LEN) as usize;
        let seal_one = |k: usize, slot: &mut [u8]| {
            let i = segs.start + k as u64;
            let a = i * p.segment;
            let b = ((i + 1) * p.segment).min(plain);
            let len = (b - a) as usize;
            let (data, tag) = slot.split_at_mut(len);
            gather(parts, &starts, a, data);
            // Sealing a segment (far below AES-GCM's 64 GiB limit) cannot fail.
            if let Ok(t) =
                self.cipher.seal_in_place_separate_tag(Self::nonce(i, i == last), Aad::from(&self.header), data)
            {
                tag[..TAG_LEN as usize].copy_from_slice(t.as_ref());
            }
        };
        let run = |out: &mut [u8]| {
            use rayon::prelude::*;
            out.par_chunks_mut(whole).enumerate().for_each(|(k, slot)| seal_one(k, slot));
        };
        if out.len() < 1 << 20 || crate::exec::parallel(|| run(&mut *out)).is_none() {
            for (k, slot) in out.chunks_mut(whole).enumerate() {
                seal_one(k, slot);
            }
        }
    }

    /// Open consecutive segments starting at `first` whose stored bytes are `stored` (from the
    /// first segment's start), of an object of `plain` bytes, into `out` (the plain bytes of
    /// those segments, exactly). In parallel for big reads.
    ///
    /// # Errors
    /// The index of the first segment that does not authenticate, or that `stored` cuts short.
    pub fn open(&self, first: u64, stored: &[u8], plain: u64, out: &mut [u8]) -> Result<(), u64> {
        let p = self.params;
        let last = p.segments(plain) - 1;
        let whole = (p.segment + TAG_LEN) as usize;
        let seg = p.segment as usize;
        let open_one = |k: usize, dst: &mut [u8]| -> Result<(), u64> {
            let i = first + k as u64;
            let src = stored.get(k * whole..k * whole + dst.len() + TAG_LEN as usize).ok_or(i)?;
            let (data, tag) = src.split_at(dst.len());
            dst.copy_from_slice(data);
            let tag = tag_of(tag).ok_or(i)?;
            self.cipher
                .open_in_place_separate_tag(Self::nonce(i, i == last), Aad::from(&self.header), tag, dst, 0..)
                .map(|_| ())
                .map_err(|_| i)
        };
        if out.is_empty() {
            // The one empty segment of an empty object.
            let mut none = [0u8; 0];
            return open_one(0, &mut none);
        }
        each_segment(out, seg, open_one)
    }
}

impl ObjectKey {
    /// How this key's object is cut.
    pub fn params(&self) -> Params {
        self.params
    }

    /// Open consecutive segments starting at `first`, of an object of `plain` bytes, whose
    /// ciphertexts are already in place in `out` (the plain bytes of those segments, exactly)
    /// and whose tags are `tags`, 16 bytes each. In parallel for big reads.
    ///
    /// # Errors
    /// The index of the first segment that does not authenticate.
    pub fn open_detached(&self, first: u64, out: &mut [u8], tags: &[u8], plain: u64) -> Result<(), u64> {
        let last = self.params.segments(plain) - 1;
        let seg = self.params.segment as usize;
        let open_one = |k: usize, dst: &mut [u8]| -> Result<(), u64> {
            let i = first + k as u64;
            let tag = tags.get(k * TAG_LEN as usize..(k + 1) * TAG_LEN as usize).and_then(tag_of).ok_or(i)?;
            self.cipher
                .open_in_place_separate_tag(Self::nonce(i, i == last), Aad::from(&self.header), tag, dst, 0..)
                .map(|_| ())
                .map_err(|_| i)
        };
        each_segment(out, seg, open_one)
    }
}

/// Run `f` on each `seg`-byte piece of `out` (with its index), on the installed executor's
/// pool when `out` is big; the first error stops it.
fn each_segment(out: &mut [u8], seg: usize, f: impl Fn(usize, &mut [u8]) -> Result<(), u64> + Sync) -> Result<(), u64> {
    let run = |out: &mut [u8]| {
        use rayon::prelude::*;
        out.par_chunks_mut(seg).enumerate().try_for_each(|(k, dst)| f(k, dst))
    };
    if out.len() >= 1 << 20 {
        if let Some(r) = crate::exec::parallel(|| run(&mut *out)) {
            return r;
        }
    }
    out.chunks_mut(seg).enumerate().try_for_each(|(k, dst)| f(k, dst))
}

/// Copy plain bytes `at..at + out.len()` of `parts` (which begin at `starts`) into `out`.
fn gather(parts: &[Bytes], starts: &[u64], at: u64, out: &mut [u8]) {
    let mut i = starts.partition_point(|&s| s <= at).saturating_sub(1);
    let mut done = 0usize;
    while done < out.len() && i < parts.len() {
        let off = (at + done as u64).saturating_sub(starts[i]) as usize;
        let src = &parts[i][off.min(parts[i].len())..];
        let n = src.len().min(out.len() - done);
        out[done..done + n].copy_from_slice(&src[..n]);
        done += n;
        i += 1;
    }
}

/// What the user gives to encrypt or open a tree.
#[derive(Clone)]
pub enum KeySource {
    /// A 32-byte key.
    Key([u8; 32]),
    /// A passphrase, stretched by Argon2id with a salt kept in the envelope.
    Passphrase(String),
    /// A key-management service: wraps and unwraps data keys with keys it keeps.
    Provider(Arc<dyn KeyProvider>),
}

impl fmt::Debug for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KeySource::Key(_) => "KeySource::Key(..)",
            KeySource::Passphrase(_) => "KeySource::Passphrase(..)",
            KeySource::Provider(_) => "KeySource::Provider(..)",
        })
    }
}

/// The hook a key-management service plugs into: it wraps a tree's data key with a key it keeps
/// (the wrapped bytes are stored in the tree's envelope, in the clear) and unwraps it again.
pub trait KeyProvider: Send + Sync {
    /// Wrap `data_key`: the id of the key used (shown in messages and by `inspect`) and the
    /// wrapped bytes (at most 4 KiB).
    ///
    /// # Errors
    /// What the service said.
    fn wrap(&self, data_key: &[u8; 32]) -> Result<(String, Vec<u8>), String>;

    /// Unwrap what [`wrap`](Self::wrap) made with the key `key_id`.
    ///
    /// # Errors
    /// What the service said (no access, another key).
    fn unwrap(&self, key_id: &str, wrapped: &[u8]) -> Result<Vec<u8>, String>;
}

/// How the data key is wrapped, as the envelope says.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum KeyInfo {
    /// By a 32-byte key, named by `id` (the first 8 bytes of a hash derived from it).
    Key {
        /// The key's id, 16 hex digits.
        id: String,
        /// 32 random bytes, hex: with the key, they derive the wrapping key.
        salt: String,
    },
    /// By a passphrase through Argon2id.
    Passphrase {
        /// `argon2id`.
        kdf: String,
        /// Memory in KiB.
        m_kib: u32,
        /// Passes.
        t: u32,
        /// Lanes.
        p: u32,
        /// 32 random bytes, hex.
        salt: String,
    },
    /// By a key provider's key `id`.
    Provider {
        /// The provider's key id.
        id: String,
    },
}

/// The clear part of an encrypted tree, stored in the object holding its manifest: what a
/// reader needs to find the data key. It says which cipher, how the objects are cut and how the
/// data key is wrapped (whose key, a passphrase's salt and cost) — nothing of the tree.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Envelope {
    /// `aes-256-gcm`.
    pub cipher: String,
    /// Plain bytes per segment.
    pub segment_bytes: u64,
    /// How the data key is wrapped.
    pub key: KeyInfo,
    /// The wrapped data key, hex.
    pub data_key: String,
}

/// Why a data key could not be wrapped or unwrapped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyError {
    /// The key given is of another kind than the tree's (a passphrase for a key-encrypted tree).
    WrongKind {
        /// What the tree was encrypted with.
        tree: String,
        /// What was given.
        given: &'static str,
    },
    /// The key given does not open the data key.
    WrongKey(String),
    /// The envelope cannot be read as one.
    Invalid(String),
    /// The key provider failed.
    Provider(String),
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyError::WrongKind { tree, given } => {
                write!(f, "the tree was encrypted with {tree}, and {given} was given")
            }
            KeyError::WrongKey(s) | KeyError::Invalid(s) | KeyError::Provider(s) => f.write_str(s),
        }
    }
}

impl KeyInfo {
    /// What the tree was encrypted with, for messages and `inspect`.
    pub fn describe(&self) -> String {
        match self {
            KeyInfo::Key { id, .. } => format!("the 32-byte key {id}"),
            KeyInfo::Passphrase { .. } => "a passphrase".into(),
            KeyInfo::Provider { id } => format!("the key provider's key {id:?}"),
        }
    }
}

impl KeySource {
    fn given(&self) -> &'static str {
        match self {
            KeySource::Key(_) => "a 32-byte key",
            KeySource::Passphrase(_) => "a passphrase",
            KeySource::Provider(_) => "a key provider",
        }
    }
}

/// The id a 32-byte key is named by: 16 hex digits of a hash derived from it (it reveals
/// nothing of the key).
pub fn key_id(key: &[u8; 32]) -> String {
    let h = blake3::derive_key("treepack 1.7 key id", key);
    hex(&h[..8])
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str, what: &str) -> Result<Vec<u8>, KeyError> {
    let bad = || KeyError::Invalid(format!("the envelope's {what} is not hex"));
    if !s.len().is_multiple_of(2) || s.len() > 8192 {
        return Err(bad());
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2).ok_or_else(bad)?, 16).map_err(|_| bad()))
        .collect()
}

fn salt32(s: &str) -> Result<[u8; 32], KeyError> {
    unhex(s, "salt")?.try_into().map_err(|_| KeyError::Invalid("the envelope's salt is not 32 bytes".into()))
}

fn argon2id(pass: &str, salt: &[u8; 32], (m, t, p): (u32, u32, u32)) -> Result<[u8; 32], KeyError> {
    if m > ARGON2_MAX_M_KIB || t > ARGON2_MAX_T || p > ARGON2_MAX_P || t == 0 || p == 0 {
        return Err(KeyError::Invalid(format!(
            "the envelope asks Argon2id for m={m} KiB, t={t}, p={p}: beyond what a reader spends (m <= {ARGON2_MAX_M_KIB}, 1 <= t <= {ARGON2_MAX_T}, 1 <= p <= {ARGON2_MAX_P})"
        )));
    }
    let params =
        argon2::Params::new(m, t, p, Some(32)).map_err(|e| KeyError::Invalid(format!("Argon2id parameters: {e}")))?;
    let a = argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
    let mut out = [0u8; 32];
    a.hash_password_into(pass.as_bytes(), salt, &mut out).map_err(|e| KeyError::Invalid(format!("Argon2id: {e}")))?;
    Ok(out)
}

/// The AEAD that wraps a data key under `kek`: keyed by `kek` and the salt, so its one nonce is
/// never reused; bound to the params and the key's kind.
fn wrap_cipher(kek: &[u8; 32], salt: &[u8; 32]) -> LessSafeKey {
    let mut h = blake3::Hasher::new_derive_key("treepack 1.7 data key wrap");
    h.update(kek);
    h.update(salt);
    aes_key(h.finalize().as_bytes())
}

/// The one nonce of a wrapping key (each wrapping key, derived from a fresh salt, seals once).
fn zero_nonce() -> Nonce {
    Nonce::assume_unique_for_key([0u8; 12])
}

fn wrap_aad(params: Params, kind: &str) -> Vec<u8> {
    let mut a = params.header().to_vec();
    a.extend_from_slice(kind.as_bytes());
    a
}

fn seal_key(kek: &[u8; 32], salt: &[u8; 32], params: Params, kind: &str, dek: &DataKey) -> String {
    let mut buf = dek.0;
    let tag = wrap_cipher(kek, salt)
        .seal_in_place_separate_tag(zero_nonce(), Aad::from(wrap_aad(params, kind)), &mut buf[..])
        .map(|t| t.as_ref().to_vec())
        .unwrap_or_default();
    let mut out = buf.to_vec();
    out.extend_from_slice(&tag);
    hex(&out)
}

fn open_key(
    kek: &[u8; 32],
    salt: &[u8; 32],
    params: Params,
    kind: &str,
    wrapped: &str,
    tree: &KeyInfo,
) -> Result<DataKey, KeyError> {
    let w = unhex(wrapped, "data_key")?;
    if w.len() != 48 {
        return Err(KeyError::Invalid("the envelope's data_key is not 48 bytes".into()));
    }
    let mut buf = [0u8; 32];
    buf.copy_from_slice(&w[..32]);
    let tag = tag_of(&w[32..]).ok_or_else(|| KeyError::Invalid("bad data_key tag".into()))?;
    wrap_cipher(kek, salt)
        .open_in_place_separate_tag(zero_nonce(), Aad::from(wrap_aad(params, kind)), tag, &mut buf[..], 0..)
        .map_err(|_| match tree {
            KeyInfo::Passphrase { .. } => KeyError::WrongKey("the passphrase given does not open this tree".into()),
            _ => KeyError::WrongKey(format!(
                "the key given does not open this tree, which was encrypted with {}",
                tree.describe()
            )),
        })?;
    Ok(DataKey(buf))
}

/// The envelope of a tree whose data key is `dek`, wrapped by `source` (`salt`: 32 random
/// bytes for a key or passphrase).
///
/// # Errors
/// What a key provider said.
pub fn seal_envelope(source: &KeySource, params: Params, dek: &DataKey, salt: [u8; 32]) -> Result<Envelope, KeyError> {
    let (key, data_key) = match source {
        KeySource::Key(k) => (KeyInfo::Key { id: key_id(k), salt: hex(&salt) }, seal_key(k, &salt, params, "key", dek)),
        KeySource::Passphrase(pass) => {
            let (m_kib, t, p) = ARGON2_WRITER;
            let kek = argon2id(pass, &salt, ARGON2_WRITER)?;
            let info = KeyInfo::Passphrase { kdf: "argon2id".into(), m_kib, t, p, salt: hex(&salt) };
            (info, seal_key(&kek, &salt, params, "passphrase", dek))
        }
        KeySource::Provider(pr) => {
            let (id, wrapped) = pr.wrap(&dek.0).map_err(KeyError::Provider)?;
            if wrapped.len() > 4096 || id.len() > 1024 {
                return Err(KeyError::Provider(
                    "the key provider's wrapped key (or key id) is too long: at most 4 KiB".into(),
                ));
            }
            (KeyInfo::Provider { id }, hex(&wrapped))
        }
    };
    Ok(Envelope { cipher: AES_256_GCM_NAME.into(), segment_bytes: params.segment, key, data_key })
}

/// Parse an envelope's bytes, bounded.
///
/// # Errors
/// Too big, not the JSON of an envelope, params out of range.
pub fn parse_envelope(b: &[u8]) -> Result<(Envelope, Params), KeyError> {
    if b.len() as u64 > MAX_ENVELOPE_BYTES {
        return Err(KeyError::Invalid("the envelope is too large".into()));
    }
    let env: Envelope =
        serde_json::from_slice(b).map_err(|e| KeyError::Invalid(format!("the envelope is not valid: {e}")))?;
    let params = Params::new(&env.cipher, env.segment_bytes).map_err(KeyError::Invalid)?;
    Ok((env, params))
}

/// The data key of a tree, from its envelope and the key the user gave.
///
/// # Errors
/// [`KeyError::WrongKind`], [`KeyError::WrongKey`], an invalid envelope, a provider's failure.
pub fn open_envelope(source: &KeySource, env: &Envelope, params: Params) -> Result<DataKey, KeyError> {
    let wrong_kind = || KeyError::WrongKind { tree: env.key.describe(), given: source.given() };
    match (&env.key, source) {
        (KeyInfo::Key { id, salt }, KeySource::Key(k)) => {
            let salt = salt32(salt)?;
            if *id != key_id(k) {
                return Err(KeyError::WrongKey(format!(
                    "the key given ({}) is not the key this tree was encrypted with ({id})",
                    key_id(k)
                )));
            }
            open_key(k, &salt, params, "key", &env.data_key, &env.key)
        }
        (KeyInfo::Passphrase { kdf, m_kib, t, p, salt }, KeySource::Passphrase(pass)) => {
            if kdf != "argon2id" {
                return Err(KeyError::Invalid(format!("unknown key derivation {kdf:?} (this treepack uses argon2id)")));
            }
            let salt = salt32(salt)?;
            let kek = argon2id(pass, &salt, (*m_kib, *t, *p))?;
            open_key(&kek, &salt, params, "passphrase", &env.data_key, &env.key)
        }
        (KeyInfo::Provider { id }, KeySource::Provider(pr)) => {
            let wrapped = unhex(&env.data_key, "data_key")?;
            let k = pr.unwrap(id, &wrapped).map_err(KeyError::Provider)?;
            let k: [u8; 32] = k
                .try_into()
                .map_err(|_| KeyError::Provider("the key provider's unwrap returned other than 32 bytes".into()))?;
            Ok(DataKey(k))
        }
        _ => Err(wrong_kind()),
    }
}

/// An envelope's bytes as stored.
pub fn envelope_bytes(env: &Envelope) -> Vec<u8> {
    serde_json::to_vec(env).unwrap_or_default()
}

/// The key a save names its packs with, instead of the content-derived name (which would let
/// anyone confirm a guess of the content): derived from the data key.
pub fn pack_name_key(dek: &DataKey) -> [u8; 32] {
    blake3::derive_key("treepack 1.7 pack names", &dek.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dek() -> DataKey {
        DataKey([7; 32])
    }

    fn roundtrip(plain: &[u8], seg: u64) {
        let p = Params { cipher: AES_256_GCM, segment: seg };
        let k = ObjectKey::new(&dek(), p, "packs/x.tpp");
        let parts: Vec<Bytes> = plain.chunks(1000).map(Bytes::copy_from_slice).collect();
        let s = k.seal(&parts, b"{}");
        assert_eq!(s.len() as u64, p.stored_len(plain.len() as u64, 2));
        assert_eq!(trailer_envelope_len(&s, s.len() as u64).unwrap(), 2);
        assert_eq!(Params::from_header(&s).unwrap(), p);
        let n = p.plain_len(s.len() as u64, 2).unwrap();
        assert_eq!(n, plain.len() as u64);
        let mut out = vec![0u8; plain.len()];
        k.open(0, &s[16..], n, &mut out).unwrap();
        assert_eq!(out, plain);
        // Every range decrypts from just its segments.
        for r in [0..1u64, 4095..4097, 0..n, n.saturating_sub(3)..n] {
            if r.end > n || r.start >= r.end {
                continue;
            }
            let segs = p.segments_of(&r);
            let sr = p.stored_range(segs.clone(), n);
            let plain_seg = segs.start * seg..(segs.end * seg).min(n);
            let mut buf = vec![0u8; (plain_seg.end - plain_seg.start) as usize];
            k.open(segs.start, &s[sr.start as usize..sr.end as usize], n, &mut buf).unwrap();
            let off = (r.start - plain_seg.start) as usize;
            assert_eq!(&buf[off..off + (r.end - r.start) as usize], &plain[r.start as usize..r.end as usize]);
        }
        // Any flipped byte of a segment fails it.
        if !plain.is_empty() {
            let mut bad = s.clone();
            bad[16] ^= 1;
            assert_eq!(k.open(0, &bad[16..], n, &mut out), Err(0));
        }
        // Another object's key fails.
        let other = ObjectKey::new(&dek(), p, "packs/y.tpp");
        assert!(other.open(0, &s[16..], n, &mut out).is_err());
    }

    #[test]
    fn objects_roundtrip_at_every_size() {
        for n in [0usize, 1, 4095, 4096, 4097, 8192, 3 * 4096 + 5, 70_000] {
            let plain: Vec<u8> = (0..n).map(|i| (i * 31 % 251) as u8).collect();
            roundtrip(&plain, 4096);
        }
        let plain: Vec<u8> = (0..3_000_000).map(|i: u32| (i % 253) as u8).collect();
        roundtrip(&plain, SEGMENT_BYTES);
    }

    #[test]
    fn cutting_an_object_at_a_segment_boundary_fails() {
        let p = Params { cipher: AES_256_GCM, segment: 4096 };
        let k = ObjectKey::new(&dek(), p, "x");
        let plain = vec![5u8; 3 * 4096];
        let s = k.seal(&[Bytes::from(plain)], b"");
        // Drop the last segment: the new last one was sealed as not last.
        let cut = 16 + 2 * (4096 + 16);
        let n = 2 * 4096;
        let mut out = vec![0u8; n];
        assert_eq!(k.open(0, &s[16..cut], n as u64, &mut out), Err(1));
        // Segments swapped.
        let mut sw = s.clone();
        let w = 4096 + 16;
        let (a, b) = sw[16..16 + 2 * w].split_at_mut(w);
        a.swap_with_slice(b);
        let mut out = vec![0u8; 3 * 4096];
        assert_eq!(k.open(0, &sw[16..], 3 * 4096, &mut out), Err(0));
    }

    #[test]
    fn plain_len_refuses_sizes_no_object_has() {
        let p = Params::WRITER;
        assert!(p.plain_len(10, 0).is_err());
        assert!(p.plain_len(32 + 8, 0).is_err());
        assert_eq!(p.plain_len(32 + 16, 0).unwrap(), 0);
        assert!(trailer_envelope_len(&[0u8; 16], 100).is_err());
    }

    #[test]
    fn envelopes_open_with_their_key_only() {
        let p = Params::WRITER;
        let d = dek();
        let e = seal_envelope(&KeySource::Key([1; 32]), p, &d, [2; 32]).unwrap();
        let b = envelope_bytes(&e);
        let (e2, p2) = parse_envelope(&b).unwrap();
        assert_eq!(open_envelope(&KeySource::Key([1; 32]), &e2, p2).unwrap(), d);
        let wrong = open_envelope(&KeySource::Key([3; 32]), &e2, p2).unwrap_err();
        assert!(matches!(wrong, KeyError::WrongKey(_)), "{wrong}");
        let kind = open_envelope(&KeySource::Passphrase("x".into()), &e2, p2).unwrap_err();
        assert!(kind.to_string().contains("was encrypted with the 32-byte key"), "{kind}");
        // A tampered wrapped key (or params) fails as a wrong key would.
        let mut t = e2.clone();
        t.segment_bytes = 4096;
        assert!(open_envelope(&KeySource::Key([1; 32]), &t, Params::new("aes-256-gcm", 4096).unwrap()).is_err());
        // Hostile Argon2 costs are refused before any memory is taken.
        let h = Envelope {
            key: KeyInfo::Passphrase { kdf: "argon2id".into(), m_kib: u32::MAX, t: 1, p: 1, salt: hex(&[0; 32]) },
            ..e2
        };
        let err = open_envelope(&KeySource::Passphrase("x".into()), &h, p2).unwrap_err();
        assert!(err.to_string().contains("beyond what a reader spends"), "{err}");
    }
}
