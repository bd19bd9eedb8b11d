//! PNG encoding of Pillow images made in memory (`integrations/pillow.py` stores such an image
//! as PNG, losslessly). Pillow's own encoder tries five filters per row and deflates at level 6,
//! which made PNG encoding most of the save of a dataset of small images. The `png` crate with
//! adaptive filtering and zlib-rs at level 2 writes them several times faster for about the
//! same bytes (docs/design.md, decision 61; bench/RESULTS.md). Decoding stays Pillow's (`Image.open`, formats allow-listed).

use super::*;

/// The PNG colour type and bit depth of a Pillow mode whose raw bytes (`Image.tobytes()`) are
/// PNG's row layout as they are, or after swapping 16-bit samples to big-endian (`I;16`).
/// Other modes (palettes, 32-bit integers, floats, CMYK...) are Pillow's to encode or refuse.
fn layout(mode: &str) -> Option<(png::ColorType, png::BitDepth)> {
    use png::{BitDepth as D, ColorType as C};
    Some(match mode {
        "1" => (C::Grayscale, D::One),
        "L" => (C::Grayscale, D::Eight),
        "LA" => (C::GrayscaleAlpha, D::Eight),
        "RGB" => (C::Rgb, D::Eight),
        "RGBA" => (C::Rgba, D::Eight),
        "I;16" => (C::Grayscale, D::Sixteen),
        _ => return None,
    })
}

/// The PNG file of an image given as Pillow's raw bytes (`tobytes()`), its size and mode; None
/// for a mode this encoder leaves to Pillow, or an empty image. The GIL is released while encoding.
///
/// # Errors
/// `ValueError` when `pixels` is not `height` rows of `width` pixels of `mode`.
#[pyfunction]
pub(crate) fn encode_png<'py>(
    py: Python<'py>,
    pixels: &[u8],
    width: u32,
    height: u32,
    mode: &str,
) -> PyResult<Option<Bound<'py, PyBytes>>> {
    // Empty images too are Pillow's (it refuses them: PNG has no empty image).
    let Some((color, depth)) = layout(mode).filter(|_| width > 0 && height > 0) else { return Ok(None) };
    let bits = color.samples() as u64 * depth as u64;
    let row = (width as u64 * bits).div_ceil(8);
    if row * height as u64 != pixels.len() as u64 {
        return Err(PyValueError::new_err(format!(
            "a {width}x{height} image of mode {mode} has {} bytes of pixels, not {}",
            row * height as u64,
            pixels.len()
        )));
    }
    let out = py
        .detach_releasing(|| {
            let swapped;
            let data = if depth == png::BitDepth::Sixteen {
                swapped = pixels.chunks_exact(2).flat_map(|s| [s[1], s[0]]).collect::<Vec<u8>>();
                &swapped[..]
            } else {
                pixels
            };
            let mut out = Vec::with_capacity(pixels.len() / 2 + 1024);
            let mut e = png::Encoder::new(&mut out, width, height);
            e.set_color(color);
            e.set_depth(depth);
            e.set_deflate_compression(png::DeflateCompression::Level(2));
            e.set_filter(png::Filter::Adaptive);
            let mut w = e.write_header()?;
            w.write_image_data(data)?;
            w.finish()?;
            Ok::<_, png::EncodingError>(out)
        })
        .map_err(|e| PyValueError::new_err(format!("PNG encoding of a {width}x{height} {mode} image failed: {e}")))?;
    Ok(Some(PyBytes::new(py, &out)))
}
