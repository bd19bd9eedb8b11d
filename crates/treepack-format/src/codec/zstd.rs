//! zstd (RFC 8878) through the `zstd` crate (libzstd): one frame per chunk, with its content
//! size, decoded in one pass straight into a buffer of the manifest's length (no window buffer
//! of the frame's choosing is allocated).

/// Compress `data` at `level` into one frame; `None` if libzstd fails (the chunk is then
/// stored raw).
pub(super) fn encode(data: &[u8], level: i32) -> Option<Vec<u8>> {
    thread_local! {
        // A compression context per thread and level: its tables are reused chunk after chunk.
        static CCTX: std::cell::RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> =
            const { std::cell::RefCell::new(None) };
    }
    CCTX.with(|c| {
        let mut c = c.borrow_mut();
        if c.as_ref().is_none_or(|(l, _)| *l != level) {
            *c = Some((level, zstd::bulk::Compressor::new(level).ok()?));
        }
        let (_, cx) = c.as_mut()?;
        cx.compress(data).ok()
    })
}

/// Decompress `stored` into `out`, which must come out exactly full.
pub(super) fn decode_into(stored: &[u8], out: &mut [u8]) -> Result<(), String> {
    match zstd::zstd_safe::decompress(out, stored) {
        Ok(n) if n == out.len() => Ok(()),
        Ok(n) => Err(format!("zstd frame decodes to {n} bytes, expected {}", out.len())),
        Err(code) => Err(format!(
            "damaged zstd frame ({}; or it decodes to more than the expected {} bytes)",
            zstd::zstd_safe::get_error_name(code),
            out.len()
        )),
    }
}
