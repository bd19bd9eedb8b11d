//! LZ4 block format through `lz4_flex` (pure Rust, bounds-checked decoding): one block per
//! chunk, no frame and no size prefix — the canonical length comes from the manifest.

/// Compress `data` into one LZ4 block.
pub(super) fn encode(data: &[u8]) -> Vec<u8> {
    lz4_flex::block::compress(data)
}

/// Decompress `stored` into `out`, which must come out exactly full.
pub(super) fn decode_into(stored: &[u8], out: &mut [u8]) -> Result<(), String> {
    match lz4_flex::block::decompress_into(stored, out) {
        Ok(n) if n == out.len() => Ok(()),
        Ok(n) => Err(format!("lz4 block decodes to {n} bytes, expected {}", out.len())),
        Err(e) => Err(format!("damaged lz4 block ({e}; or it decodes to more than the expected {} bytes)", out.len())),
    }
}
