//! Chunk codecs: how a chunk's stored bytes encode its canonical bytes (docs/format.md, "Codecs").
//!
//! A codec is a compressor — none (`raw`), zstd or LZ4 — optionally
//! after the shuffle filter, which groups the bytes of each position within an element
//! (element size from the array's dtype) so that the slowly varying bytes of numbers (exponents,
//! high bytes of small integers) sit together. Hashes are always of the canonical bytes, so
//! deduplication and `verify` do not depend on the codec.
//!
//! Decoding is bounded: the canonical length comes from the manifest (the chunk's region, or a
//! blob's size), the output buffer is exactly that long, and a frame that would produce more or
//! fewer bytes is an error — a decompression bomb can make a reader allocate nothing beyond
//! what the manifest declares.

mod lz4;
mod shuffle;
mod zstd;

use bytes::Bytes;
use std::fmt;

/// How a chunk's stored bytes encode its canonical bytes, as recorded in its chunk reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Codec {
    /// Stored bytes are the canonical bytes.
    Raw,
    /// One zstd frame of the canonical bytes.
    Zstd,
    /// One LZ4 block (no frame, no size prefix) of the canonical bytes.
    Lz4,
    /// The canonical bytes shuffled by element size, then one zstd frame.
    ShuffleZstd,
    /// The canonical bytes shuffled by element size, then one LZ4 block.
    ShuffleLz4,
}

/// The compressor a writer applies after the optional filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Compressor {
    /// zstd, at a level from 1 (fast) to 22 (small); negative levels are faster still.
    Zstd,
    /// LZ4 (one speed).
    Lz4,
}

/// Whether a writer shuffles a chunk's bytes before compressing them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Filter {
    /// Never.
    None,
    /// Always (arrays of multi-byte dtypes).
    Shuffle,
    /// Where it helps: a chunk's sample is compressed both ways, and the shuffle is kept if it
    /// makes the sample at least [`SHUFFLE_GAIN`] smaller. Numbers whose high bytes vary slowly
    /// (weights, token ids) gain; sparse arrays, whose zero elements are long runs only when
    /// left whole, lose ratio and decoding speed to it.
    Auto,
}

/// How a writer encodes one chunk: a compressor, its level, and the filter before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Encoding {
    /// The compressor.
    pub compressor: Compressor,
    /// zstd's level (ignored by LZ4).
    pub level: i32,
    /// Shuffle bytes by element size first (arrays of multi-byte dtypes only).
    pub filter: Filter,
}

/// [`Filter::Auto`] keeps the shuffle when the shuffled sample is at most this fraction of the
/// plain one: when both are close, plain chunks decode faster (no unshuffle).
pub const SHUFFLE_GAIN: f64 = 0.97;

/// Levels zstd accepts.
pub const ZSTD_LEVELS: std::ops::RangeInclusive<i32> = -7..=22;

/// A chunk is stored compressed only if that saves at least this fraction of its bytes;
/// otherwise it is stored raw (and reads stay zero-copy for it). A fifth: decoding costs a
/// load far more than reading the bytes saved, so data that barely compresses (float weights)
/// is better stored raw (docs/compression.md).
pub const MIN_SAVING: f64 = 0.2;

/// Chunks larger than this are first probed: a sample of [`PROBE_BYTES`] is compressed, and a
/// chunk whose sample does not compress is stored raw without compressing the rest (random
/// weights cost a save almost nothing under a compressing policy).
pub const PROBE_ABOVE: usize = 256 << 10;
/// Bytes of a chunk's sample (see [`PROBE_ABOVE`]).
pub const PROBE_BYTES: usize = 64 << 10;

impl Codec {
    /// The codec's name in a chunk reference.
    pub fn name(&self) -> &'static str {
        match self {
            Codec::Raw => "raw",
            Codec::Zstd => "zstd",
            Codec::Lz4 => "lz4",
            Codec::ShuffleZstd => "shuffle+zstd",
            Codec::ShuffleLz4 => "shuffle+lz4",
        }
    }

    /// Whether the stored bytes are the canonical bytes themselves: then a chunk's stored
    /// length is known from its region, and readers may hand out views (mmap, one span) of it.
    pub fn is_identity(&self) -> bool {
        matches!(self, Codec::Raw)
    }

    /// Whether the codec shuffles by element size (meaningful for arrays only).
    pub fn is_shuffled(&self) -> bool {
        matches!(self, Codec::ShuffleZstd | Codec::ShuffleLz4)
    }

    /// The most canonical bytes `stored` bytes of this codec can decode to: zstd's densest
    /// block (an RLE block: 4 bytes for up to 128 KiB) expands at most 32768-fold, an LZ4 block
    /// about 255-fold. A manifest declaring more is refused before anything is read, so a tiny
    /// chunk cannot make a reader allocate gigabytes.
    pub fn max_decoded(&self, stored: u64) -> u64 {
        match self {
            Codec::Raw => stored,
            Codec::Zstd | Codec::ShuffleZstd => stored.saturating_mul(32 << 10),
            Codec::Lz4 | Codec::ShuffleLz4 => stored.saturating_mul(256).saturating_add(64),
        }
    }

    /// Parse a codec name. Unknown codecs yield `None` (the caller reports which chunk).
    pub fn from_name(s: &str) -> Option<Codec> {
        Some(match s {
            "raw" => Codec::Raw,
            "zstd" => Codec::Zstd,
            "lz4" => Codec::Lz4,
            "shuffle+zstd" => Codec::ShuffleZstd,
            "shuffle+lz4" => Codec::ShuffleLz4,
            _ => return None,
        })
    }

    /// Decode stored bytes into the canonical bytes, exactly `expected_len` of them, of
    /// elements of `itemsize` bytes (for the shuffle). `raw` hands the stored bytes back
    /// without a copy.
    ///
    /// # Errors
    /// A reason if the stored bytes are damaged or decode to any other length; never allocates
    /// more than `expected_len` (twice, for a shuffled chunk).
    pub fn decode(&self, stored: Bytes, expected_len: u64, itemsize: u64) -> Result<Bytes, String> {
        if let Codec::Raw = self {
            if stored.len() as u64 != expected_len {
                return Err(format!("raw chunk holds {} bytes, expected {expected_len}", stored.len()));
            }
            return Ok(stored);
        }
        let mut out = zeroed(expected_len)?;
        self.decode_into(&stored, &mut out, itemsize)?;
        Ok(Bytes::from(out))
    }

    /// Decode stored bytes into `out`, which must be exactly the canonical length.
    ///
    /// # Errors
    /// As [`Codec::decode`].
    pub fn decode_into(&self, stored: &[u8], out: &mut [u8], itemsize: u64) -> Result<(), String> {
        match self {
            Codec::Raw => {
                if stored.len() != out.len() {
                    return Err(format!("raw chunk holds {} bytes, expected {}", stored.len(), out.len()));
                }
                out.copy_from_slice(stored);
                Ok(())
            }
            Codec::Zstd => zstd::decode_into(stored, out),
            Codec::Lz4 => lz4::decode_into(stored, out),
            Codec::ShuffleZstd | Codec::ShuffleLz4 => with_scratch(out.len(), |shuffled| {
                match self {
                    Codec::ShuffleZstd => zstd::decode_into(stored, shuffled)?,
                    _ => lz4::decode_into(stored, shuffled)?,
                }
                shuffle::unshuffle(shuffled, out, item(itemsize));
                Ok(())
            })?,
        }
    }
}

impl Encoding {
    /// Encode one chunk's canonical bytes (elements of `itemsize` bytes): the stored bytes
    /// and their codec, or `None` when compression would not save [`MIN_SAVING`] of them (a
    /// big chunk is judged by a sample first, see [`PROBE_ABOVE`]).
    pub fn encode(&self, data: &[u8], itemsize: u64) -> Option<(Bytes, Codec)> {
        if data.is_empty() {
            return None;
        }
        let k = item(itemsize);
        let compress = |d: &[u8], shuffled: bool| -> Option<Vec<u8>> {
            let run = |d: &[u8]| match self.compressor {
                Compressor::Zstd => zstd::encode(d, self.level),
                Compressor::Lz4 => Some(lz4::encode(d)),
            };
            if !shuffled {
                return run(d);
            }
            with_scratch(d.len(), |buf| {
                shuffle::shuffle(d, buf, k);
                run(buf)
            })
            .ok()
            .flatten()
        };
        let worth = |stored: usize, raw: usize| (stored as f64) <= (raw as f64) * (1.0 - MIN_SAVING);
        let fixed = match self.filter {
            _ if k == 1 => Some(false),
            Filter::None => Some(false),
            Filter::Shuffle => Some(true),
            Filter::Auto => None,
        };
        // Choosing the filter compresses the sample twice: half a sample each way keeps the
        // probe's cost that of one (incompressible data must cost a save little).
        let probe = if fixed.is_some() { PROBE_BYTES } else { PROBE_BYTES / 2 };
        let sample = &data[..data.len().min(probe - probe % k)];
        let (shuffled, stored) = if sample.len() == data.len() {
            // A small chunk: compressed both ways if the filter is to be chosen.
            match fixed {
                Some(f) => (f, compress(data, f)?),
                None => match (compress(data, true), compress(data, false)) {
                    (Some(s), Some(p)) if (s.len() as f64) <= SHUFFLE_GAIN * p.len() as f64 => (true, s),
                    (_, p) => (false, p?),
                },
            }
        } else {
            // A bigger chunk, judged by its sample. Shuffled, each byte plane of the sample is
            // compressed alone: in the chunk each plane fills zstd blocks (128 KiB) of its own,
            // with their own entropy tables, where the sample's short planes would share one.
            let plain = || compress(sample, false).map(|c| c.len());
            let planes = || {
                with_scratch(sample.len(), |buf| {
                    shuffle::shuffle(sample, buf, k);
                    buf.chunks(sample.len() / k).map(|p| compress(p, false).map(|c| c.len())).sum::<Option<usize>>()
                })
                .ok()
                .flatten()
            };
            let (shuffled, size) = match fixed {
                Some(f) if data.len() <= PROBE_ABOVE => (f, None),
                Some(f) => (f, if f { planes() } else { plain() }),
                None => match (planes(), plain()) {
                    (Some(s), Some(p)) if (s as f64) <= SHUFFLE_GAIN * p as f64 => (true, Some(s)),
                    (_, p) => (false, p),
                },
            };
            if (fixed.is_none() || data.len() > PROBE_ABOVE) && !size.is_some_and(|z| worth(z, sample.len())) {
                return None;
            }
            (shuffled, compress(data, shuffled)?)
        };
        let codec = match (self.compressor, shuffled) {
            (Compressor::Zstd, false) => Codec::Zstd,
            (Compressor::Zstd, true) => Codec::ShuffleZstd,
            (Compressor::Lz4, false) => Codec::Lz4,
            (Compressor::Lz4, true) => Codec::ShuffleLz4,
        };
        worth(stored.len(), data.len()).then(|| (Bytes::from(stored), codec))
    }
}

/// An element size the shuffle can use (a struct dtype's may be large; 0 means bytes).
fn item(itemsize: u64) -> usize {
    usize::try_from(itemsize).unwrap_or(1).max(1)
}

/// Scratch buffers this size or smaller are kept by their thread for the next chunk.
const KEEP_SCRATCH: usize = 64 << 20;

/// Run `f` on a buffer of `len` bytes (contents unspecified) that the thread reuses chunk after
/// chunk: a fresh buffer per chunk costs its page faults every time (a quarter of a shuffled
/// chunk's decoding time on the development VM).
fn with_scratch<T>(len: usize, f: impl FnOnce(&mut [u8]) -> T) -> Result<T, String> {
    thread_local! {
        static SCRATCH: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
    }
    let mut buf = SCRATCH.take();
    if buf.len() < len {
        drop(std::mem::take(&mut buf));
        buf = zeroed(len as u64)?;
    }
    let out = f(&mut buf[..len]);
    if buf.len() <= KEEP_SCRATCH {
        SCRATCH.set(buf);
    }
    Ok(out)
}

/// A zeroed buffer of `len` bytes, or the reason it cannot be had. Zeroed by the allocator
/// (fresh pages for big buffers), not by writing: the decoder writes every byte anyway.
#[doc(hidden)]
pub fn zeroed(len: u64) -> Result<Vec<u8>, String> {
    let n = usize::try_from(len).map_err(|_| format!("a chunk of {len} bytes does not fit this machine's memory"))?;
    if n == 0 {
        return Ok(Vec::new());
    }
    let layout = std::alloc::Layout::array::<u8>(n).map_err(|_| format!("a chunk of {len} bytes is too large"))?;
    // SAFETY: `layout` has a non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(layout) };
    if p.is_null() {
        return Err(format!("cannot allocate {len} bytes for a decoded chunk"));
    }
    // SAFETY: `p` was allocated by the global allocator with the layout of `[u8; n]` (the
    // layout a `Vec<u8>` of capacity `n` has), and its `n` bytes are initialised (zero).
    Ok(unsafe { Vec::from_raw_parts(p, n, n) })
}

impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_codec_round_trips_exactly_and_refuses_other_lengths() {
        let data: Vec<u8> = (0..100_000u32).flat_map(|i| ((i / 7) as u16).to_le_bytes()).collect();
        for (compressor, level) in [(Compressor::Zstd, 1), (Compressor::Zstd, 19), (Compressor::Lz4, 0)] {
            for filter in [Filter::None, Filter::Shuffle] {
                let enc = Encoding { compressor, level, filter };
                let (stored, codec) = enc.encode(&data, 2).expect("compressible");
                assert!(stored.len() < data.len() / 2, "{codec}");
                assert_eq!(Codec::from_name(codec.name()), Some(codec));
                let back = codec.decode(stored.clone(), data.len() as u64, 2).unwrap();
                assert_eq!(back.as_ref(), &data[..], "{codec}");
                assert!(codec.decode(stored.clone(), data.len() as u64 - 1, 2).is_err(), "{codec} short");
                assert!(codec.decode(stored.clone(), data.len() as u64 + 1, 2).is_err(), "{codec} long");
                let cut = stored.slice(..stored.len() - 3);
                assert!(codec.decode(cut, data.len() as u64, 2).is_err(), "{codec} truncated");
            }
        }
    }

    #[test]
    fn the_auto_filter_shuffles_only_where_it_helps() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        // Small integers in 4 bytes: the three high byte planes are zero once shuffled.
        let ids: Vec<u8> = (0..300_000).flat_map(|_| ((next() % 1000) as u32).to_le_bytes()).collect();
        // Sparse floats: whole zero elements are long runs only when left unshuffled.
        let sparse: Vec<u8> = (0..300_000)
            .flat_map(|_| {
                let v = next();
                let f = if v % 10 < 8 { 0.0 } else { f32::from_bits((v >> 32) as u32 & 0x3fff_ffff) };
                f.to_le_bytes()
            })
            .collect();
        let auto = Encoding { compressor: Compressor::Zstd, level: 1, filter: Filter::Auto };
        for (data, want) in [(&ids, Codec::ShuffleZstd), (&sparse, Codec::Zstd)] {
            for len in [data.len(), 40_000] {
                // A chunk judged by its sample, and a small one compressed both ways.
                let (stored, codec) = auto.encode(&data[..len], 4).expect("compressible");
                assert_eq!(codec, want, "len {len}");
                assert_eq!(codec.decode(stored, len as u64, 4).unwrap().as_ref(), &data[..len]);
            }
        }
        let always = Encoding { filter: Filter::Shuffle, ..auto };
        assert_eq!(always.encode(&sparse, 4).map(|e| e.1), Some(Codec::ShuffleZstd));
        let never = Encoding { filter: Filter::None, ..auto };
        assert_eq!(never.encode(&ids, 4).map(|e| e.1), Some(Codec::Zstd));
    }

    #[test]
    fn incompressible_chunks_stay_raw() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let noise: Vec<u8> = (0..1 << 20)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let enc = Encoding { compressor: Compressor::Zstd, level: 3, filter: Filter::Auto };
        assert!(enc.encode(&noise, 4).is_none());
        assert!(enc.encode(&[], 4).is_none());
    }
}
