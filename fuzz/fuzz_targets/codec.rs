//! Every chunk decoder (zstd, lz4, each with and without the shuffle) on arbitrary stored bytes
//! and declared lengths: an error or exactly the declared length, never a panic, never more
//! memory than the declared length (twice for a shuffled codec) — and what encodes, decodes back.
#![no_main]
use libfuzzer_sys::fuzz_target;
use treepack_format::codec::{Codec, Compressor, Encoding, Filter};

fuzz_target!(|data: &[u8]| {
    let Some((&head, rest)) = data.split_first() else { return };
    let codecs = [Codec::Raw, Codec::Zstd, Codec::Lz4, Codec::ShuffleZstd, Codec::ShuffleLz4];
    let codec = codecs[head as usize % codecs.len()];
    let itemsize = u64::from(head >> 4).max(1);
    // Declared lengths around the stored length, bounded as a manifest bounds them.
    for expected in [0u64, 1, rest.len() as u64, (rest.len() as u64).saturating_mul(3), 1 << 16] {
        if expected > codec.max_decoded(rest.len() as u64) {
            continue;
        }
        if let Ok(out) = codec.decode(bytes::Bytes::copy_from_slice(rest), expected, itemsize) {
            assert_eq!(out.len() as u64, expected, "{codec} decoded to another length");
        }
    }
    let enc = Encoding {
        compressor: if head & 1 == 0 { Compressor::Zstd } else { Compressor::Lz4 },
        level: 1,
        filter: [Filter::None, Filter::Shuffle, Filter::Auto][usize::from(head >> 1) % 3],
    };
    if let Some((stored, c)) = enc.encode(rest, itemsize) {
        let back = c.decode(stored, rest.len() as u64, itemsize).expect("what was encoded decodes");
        assert_eq!(back.as_ref(), rest);
    }
});
