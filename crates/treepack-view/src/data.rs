//! Reading leaves for the page: array slices downsampled on the server, histograms and stats,
//! element tables, string and bytes previews.
//!
//! Every read goes through the tree's reader (only the chunks a slice touches are read) and is
//! bounded: a slice bigger than [`READ_CAP`] elements is refused with a message saying what to
//! ask instead, stats over more than [`STATS_CAP`] elements sample every k-th index of the
//! first axis, and whole arrays are read in blocks ([`crate::numeric::blocks`]).

use crate::numeric::{self, blocks, is_numeric, to_f64};
use crate::sources::{ApiError, ApiResult, Opened};
use serde_json::{json, Value};
use treepack::format::dtype::float_json;
use treepack::format::grid::{self, DimSel, SliceItem};
use treepack::format::keypath;
use treepack::format::manifest::{ArrayEntry, Entry};
use treepack::{Leaf, Tree};

/// The most elements one slice request reads (4096 × 4096): the page asks for a step beyond.
pub(crate) const READ_CAP: u64 = 1 << 24;
/// The most elements stats read; bigger arrays are sampled along their first axis.
pub(crate) const STATS_CAP: u64 = 1 << 26;
/// The most elements an element table shows.
const VALUES_CAP: u64 = 10_000;
/// The largest string or bytes leaf a preview reads.
const BLOB_CAP: u64 = 64 << 20;
/// Points per axis a plot may ask for.
pub(crate) const MAX_POINTS: u64 = 4096;

/// The array at `path`, or a 400 naming what is there instead.
pub(crate) fn array_at<'a>(o: &'a Opened, path: &str) -> ApiResult<&'a ArrayEntry> {
    match keypath::resolve(o.root(), path)? {
        Tree::Leaf(Entry::Array(a)) => Ok(a),
        Tree::Leaf(e) => Err(ApiError::bad(format!("`{path}` is a {} leaf, not an array", e.kind()))),
        t => Err(ApiError::bad(format!("`{path}` is a {}, not an array", t.container_kind()))),
    }
}

/// Parse and check `spec` against `shape`: unlike numpy, which clamps, a range reaching past an
/// axis is refused, so that what the page shows is what was asked for.
pub(crate) fn selection(spec: &str, shape: &[u64]) -> ApiResult<Vec<DimSel>> {
    let items = grid::parse_slice(spec)?;
    let explicit: Vec<&SliceItem> = items.iter().filter(|i| !matches!(i, SliceItem::Ellipsis)).collect();
    // Axis of each explicit item (those after `...` count from the end).
    let ell = items.iter().position(|i| matches!(i, SliceItem::Ellipsis));
    for (n, it) in explicit.iter().enumerate() {
        let axis = match ell {
            Some(e) if n >= e => shape.len().saturating_sub(explicit.len()) + n,
            _ => n,
        };
        let Some(&len) = shape.get(axis) else { break };
        let len = i128::from(len);
        if let SliceItem::Range { start, stop, .. } = it {
            for (what, v) in [("start", start), ("stop", stop)] {
                if let Some(v) = v.map(i128::from) {
                    if v > len || v < -len {
                        return Err(ApiError::bad(format!(
                            "slice `{spec}` is outside the array: {what} {v} on axis {axis} of length {len} \
                             (shape {shape:?})"
                        )));
                    }
                }
            }
        }
    }
    Ok(grid::normalize(&items, shape, spec)?)
}

/// The slice `spec` of the numeric array at `path`, downsampled to at most `max` points per
/// axis: a 1-D result as a min/max envelope (spikes stay visible), a 2-D one as block means.
pub(crate) fn slice(o: &Opened, path: &str, spec: &str, max: u64) -> ApiResult<Value> {
    let a = array_at(o, path)?;
    if !is_numeric(&a.dtype) {
        return Err(ApiError::bad(format!(
            "`{path}` holds {} elements, which are not plotted: its values are shown as a table",
            a.dtype.display()
        )));
    }
    let sel = selection(spec, &a.shape)?;
    let kept: Vec<&DimSel> = sel.iter().filter(|s| s.keep).collect();
    if kept.len() > 2 {
        return Err(ApiError::bad(format!(
            "slice `{spec}` of `{path}` has {} axes: the viewer plots 1 or 2; index the others (e.g. `0, :, :`)",
            kept.len()
        )));
    }
    let count: u64 = sel.iter().map(|s| s.count).product();
    if count > READ_CAP {
        return Err(ApiError::bad(format!(
            "slice `{spec}` of `{path}` has {count} elements; the viewer reads at most {READ_CAP} at once: \
             ask for a smaller region or a step (`::4`)"
        )));
    }
    let max = max.clamp(2, MAX_POINTS);
    let arr = o.reader.read_array(path, spec)?;
    let v = to_f64(&a.dtype, arr.bytes()).unwrap_or_default();
    let (nan, inf) = nonfinite(&v);
    let mut out = match kept.as_slice() {
        [] => json!({"kind": "scalar", "value": v.first().copied().map(float_json)}),
        [ax] => envelope(&v, ax, max),
        [r, c] => heatmap(&v, r, c, max),
        _ => unreachable!("checked above"),
    };
    let (lo, hi) = finite_range(&v);
    out["min"] = lo.map_or(Value::Null, float_json);
    out["max"] = hi.map_or(Value::Null, float_json);
    out["nan"] = json!(nan);
    out["inf"] = json!(inf);
    out["dtype"] = json!(a.dtype.display());
    out["slice"] = json!(spec);
    out["elements"] = json!(count);
    Ok(out)
}

fn nonfinite(v: &[f64]) -> (u64, u64) {
    v.iter().fold((0, 0), |(n, i), x| (n + u64::from(x.is_nan()), i + u64::from(x.is_infinite())))
}

fn finite_range(v: &[f64]) -> (Option<f64>, Option<f64>) {
    v.iter().filter(|x| x.is_finite()).fold((None, None), |(lo, hi), &x| {
        (Some(lo.map_or(x, |l: f64| l.min(x))), Some(hi.map_or(x, |h: f64| h.max(x))))
    })
}

/// A finite value as a JSON number, anything else as null (a gap in a plot).
fn num(x: f64) -> Value {
    if x.is_finite() {
        json!(x)
    } else {
        Value::Null
    }
}

/// A 1-D result: every point when it fits, else per bucket its minimum and maximum in index
/// order, with x the array index each came from.
fn envelope(v: &[f64], ax: &DimSel, max: u64) -> Value {
    let index = |i: usize| ax.start + i as u64 * ax.step;
    let n = v.len();
    let (mut xs, mut ys) = (vec![], vec![]);
    if n as u64 <= max {
        xs.extend((0..n).map(index));
        ys.extend(v.iter().map(|&y| num(y)));
    } else {
        let buckets = (max / 2).max(1) as usize;
        for b in 0..buckets {
            let (lo, hi) = (b * n / buckets, (b + 1) * n / buckets);
            let mut best: Option<(usize, usize)> = None;
            for i in lo..hi {
                if !v[i].is_finite() {
                    continue;
                }
                best = Some(match best {
                    None => (i, i),
                    Some((a, z)) => (if v[i] < v[a] { i } else { a }, if v[i] > v[z] { i } else { z }),
                });
            }
            match best {
                Some((a, z)) => {
                    for i in if a <= z { [a, z] } else { [z, a] } {
                        xs.push(index(i));
                        ys.push(num(v[i]));
                    }
                }
                None => {
                    xs.push(index(lo));
                    ys.push(Value::Null);
                }
            }
        }
    }
    json!({"kind": "line", "x": xs, "y": ys, "length": n, "downsampled": n as u64 > max})
}

/// A 2-D result as block means of at most `max` × `max` blocks: `data` row-major, nulls where a
/// block has no finite value; `rows`/`cols` give the array index each output row/column starts at.
fn heatmap(v: &[f64], r: &DimSel, c: &DimSel, max: u64) -> Value {
    let (nr, nc) = (r.count as usize, c.count as usize);
    let fr = nr.div_ceil(max as usize).max(1);
    let fc = nc.div_ceil(max as usize).max(1);
    let (orows, ocols) = (nr.div_ceil(fr), nc.div_ceil(fc));
    let mut sum = vec![0f64; orows * ocols];
    let mut cnt = vec![0u32; orows * ocols];
    for i in 0..nr {
        let row = &v[i * nc..(i + 1) * nc];
        let base = (i / fr) * ocols;
        for (j, &x) in row.iter().enumerate() {
            if x.is_finite() {
                sum[base + j / fc] += x;
                cnt[base + j / fc] += 1;
            }
        }
    }
    // f32 precision is plenty for colours and halves the JSON.
    let data: Vec<Value> = sum
        .iter()
        .zip(&cnt)
        .map(
            |(&s, &n)| {
                if n == 0 {
                    Value::Null
                } else {
                    treepack::format::dtype::float32_json((s / f64::from(n)) as f32)
                }
            },
        )
        .collect();
    json!({
        "kind": "heatmap", "shape": [orows, ocols], "data": data, "factor": [fr, fc],
        "rows": {"start": r.start, "step": r.step * fr as u64, "count": r.count},
        "cols": {"start": c.start, "step": c.step * fc as u64, "count": c.count},
    })
}

/// The longest side, in pixels, of an image the server encodes: a bigger slice is averaged
/// down to it.
pub(crate) const IMAGE_SIDE: u64 = 4096;

/// Whether elements of this dtype can be pixels: bytes (0–255) or floats (0–1, clipped).
pub(crate) fn pixel_dtype(d: &treepack::DType) -> bool {
    use treepack::DType as D;
    matches!(d, D::U8 | D::F16 | D::BF16 | D::F32 | D::F64)
}

/// Whether an array can be shown as an image: pixels of [`pixel_dtype`], its last axes
/// `(H, W)` (rank 2) or `(H, W, 3)`/`(H, W, 4)` (RGB, RGBA; leading axes are indexed).
pub(crate) fn image_like(a: &ArrayEntry) -> bool {
    pixel_dtype(&a.dtype)
        && match a.shape.as_slice() {
            [h, w] => *h > 0 && *w > 0,
            [.., h, w, c] => *h > 0 && *w > 0 && matches!(c, 3 | 4),
            _ => false,
        }
}

/// The slice `spec` of the array at `path` as a PNG: two axes kept (grey), or three whose last
/// is the array's last axis of 3 or 4 channels taken whole (RGB, RGBA). Bytes are pixels as
/// they are; floats are read as 0–1 and clipped (NaN black). A slice of more than `max` pixels
/// a side is shown as block means, the same factor on both axes so that the image keeps its
/// proportions.
pub(crate) fn image(o: &Opened, path: &str, spec: &str, max: u64) -> ApiResult<(&'static str, Vec<u8>)> {
    let a = array_at(o, path)?;
    if !pixel_dtype(&a.dtype) {
        return Err(ApiError::bad(format!(
            "`{path}` holds {} elements: images are uint8 (0–255) or floats (0–1)",
            a.dtype.display()
        )));
    }
    let sel = selection(spec, &a.shape)?;
    let kept: Vec<(usize, &DimSel)> = sel.iter().enumerate().filter(|(_, s)| s.keep).collect();
    let last = a.shape.len().saturating_sub(1);
    // The last axis of 3 or 4 is colour: kept, it must be kept whole, as the channels.
    let colour = a.shape.len() >= 3 && matches!(a.shape[last], 3 | 4);
    let (h, w, channels) = match kept.as_slice() {
        [(_, r), (ax, c)] if !(colour && *ax == last) => (r.count, c.count, 1),
        [(_, r), (_, c), (ax, ch)]
            if *ax == last
                && ch.start == 0
                && ch.step == 1
                && ch.count == a.shape[last]
                && matches!(ch.count, 3 | 4) =>
        {
            (r.count, c.count, ch.count)
        }
        _ => {
            return Err(ApiError::bad(format!(
                "slice `{spec}` of `{path}` is not an image: keep two axes (height, width), or three whose last is \
                 the 3 or 4 colour channels taken whole (`..., :`)"
            )))
        }
    };
    if h == 0 || w == 0 {
        return Err(ApiError::bad(format!("slice `{spec}` of `{path}` is empty: an image needs pixels")));
    }
    let count = h * w * channels;
    if count > READ_CAP {
        return Err(ApiError::bad(format!(
            "slice `{spec}` of `{path}` has {count} elements; the viewer reads at most {READ_CAP} at once: \
             ask for a smaller region or a step (`::4, ::4`)"
        )));
    }
    let max = max.clamp(16, IMAGE_SIDE);
    let arr = o.reader.read_array(path, spec)?;
    let v = to_f64(&a.dtype, arr.bytes()).unwrap_or_default();
    let scale = if matches!(a.dtype, treepack::DType::U8) { 1.0 } else { 255.0 };
    let (h, w, c) = (h as usize, w as usize, channels as usize);
    let f = h.max(w).div_ceil(max as usize).max(1);
    let (oh, ow) = (h.div_ceil(f), w.div_ceil(f));
    let mut sum = vec![0f64; oh * ow * c];
    let mut cnt = vec![0u32; oh * ow];
    for i in 0..h {
        for j in 0..w {
            let b = (i / f) * ow + j / f;
            cnt[b] += 1;
            for k in 0..c {
                let x = v.get((i * w + j) * c + k).copied().unwrap_or(0.0);
                // NaN adds nothing: black where a block is all NaN.
                sum[b * c + k] += if x.is_nan() { 0.0 } else { (x * scale).clamp(0.0, 255.0) };
            }
        }
    }
    let pixels: Vec<u8> =
        sum.iter().enumerate().map(|(i, &s)| (s / f64::from(cnt[i / c].max(1))).round() as u8).collect();
    let color = match c {
        1 => png::ColorType::Grayscale,
        3 => png::ColorType::Rgb,
        _ => png::ColorType::Rgba,
    };
    Ok(("image/png", encode_png(&pixels, ow as u32, oh as u32, color)?))
}

/// PNG of 8-bit pixels. Quick rather than small: these images go to the local browser once.
fn encode_png(pixels: &[u8], width: u32, height: u32, color: png::ColorType) -> ApiResult<Vec<u8>> {
    let fail = |e: png::EncodingError| ApiError { status: 500, message: format!("PNG encoding failed: {e}") };
    let mut out = Vec::with_capacity(pixels.len() / 2 + 1024);
    let mut e = png::Encoder::new(&mut out, width, height);
    e.set_color(color);
    e.set_depth(png::BitDepth::Eight);
    e.set_deflate_compression(png::DeflateCompression::Level(1));
    e.set_filter(png::Filter::Adaptive);
    let mut wr = e.write_header().map_err(fail)?;
    wr.write_image_data(pixels).map_err(fail)?;
    wr.finish().map_err(fail)?;
    Ok(out)
}

/// Running sums of one pass over an array's values.
#[derive(Default)]
struct Moments {
    n: u64,
    finite: u64,
    nan: u64,
    posinf: u64,
    neginf: u64,
    zeros: u64,
    min: Option<f64>,
    max: Option<f64>,
    mean: f64,
    m2: f64,
}

impl Moments {
    fn add(&mut self, v: &[f64]) {
        for &x in v {
            self.n += 1;
            if x.is_nan() {
                self.nan += 1;
            } else if x.is_infinite() {
                if x > 0.0 {
                    self.posinf += 1;
                } else {
                    self.neginf += 1;
                }
            } else {
                // Welford's update: a stable mean and variance in one pass.
                self.finite += 1;
                self.zeros += u64::from(x == 0.0);
                self.min = Some(self.min.map_or(x, |m| m.min(x)));
                self.max = Some(self.max.map_or(x, |m| m.max(x)));
                let d = x - self.mean;
                self.mean += d / self.finite as f64;
                self.m2 += d * (x - self.mean);
            }
        }
    }
}

/// Histogram (`bins` equal bins between the finite min and max) and stats of the numeric array
/// at `path`: count, min, max, mean, std, zeros, NaN and ±inf counts.
pub(crate) fn stats(o: &Opened, path: &str, bins: u64) -> ApiResult<Value> {
    let a = array_at(o, path)?;
    if !is_numeric(&a.dtype) {
        return Err(ApiError::bad(format!("`{path}` holds {} elements: no histogram", a.dtype.display())));
    }
    let bins = bins.clamp(1, 1024) as usize;
    let total: u64 = a.shape.iter().product();
    // Too big to read whole: every step0-th index of the first axis.
    let step0 = if total > STATS_CAP && !a.shape.is_empty() { total.div_ceil(STATS_CAP).min(a.shape[0]) } else { 1 };
    let parts = blocks(&a.shape, step0);
    let read = |spec: &str| -> ApiResult<Vec<f64>> {
        let arr = o.reader.read_array(path, spec)?;
        Ok(to_f64(&a.dtype, arr.bytes()).unwrap_or_default())
    };
    let mut m = Moments::default();
    // One block: read once for both passes; more: read again for the histogram rather than
    // hold the array.
    let first = if parts.len() == 1 { Some(read(&parts[0])?) } else { None };
    match &first {
        Some(v) => m.add(v),
        None => {
            for p in &parts {
                m.add(&read(p)?);
            }
        }
    }
    let mut counts = vec![0u64; bins];
    let (lo, hi) = (m.min.unwrap_or(0.0), m.max.unwrap_or(0.0));
    let width = (hi - lo) / bins as f64;
    let mut fill = |v: &[f64]| {
        for &x in v.iter().filter(|x| x.is_finite()) {
            let b = if width > 0.0 { (((x - lo) / width) as usize).min(bins - 1) } else { 0 };
            counts[b] += 1;
        }
    };
    match &first {
        Some(v) => fill(v),
        None => {
            for p in &parts {
                fill(&read(p)?);
            }
        }
    }
    let edges: Vec<Value> = (0..=bins).map(|i| float_json(lo + width * i as f64)).collect();
    let std = if m.finite > 0 { (m.m2 / m.finite as f64).sqrt() } else { f64::NAN };
    Ok(json!({
        "count": m.n, "finite": m.finite, "nan": m.nan, "posinf": m.posinf, "neginf": m.neginf, "zeros": m.zeros,
        "min": m.min.map_or(Value::Null, float_json), "max": m.max.map_or(Value::Null, float_json),
        "mean": if m.finite > 0 { float_json(m.mean) } else { Value::Null }, "std": num(std),
        "edges": edges, "counts": counts, "sampled": step0 > 1, "step": step0, "elements": total,
    }))
}

/// Elements of the slice `spec` of any array, as JSON values (structured, string and
/// byte-string dtypes too): the table view.
pub(crate) fn values(o: &Opened, path: &str, spec: &str) -> ApiResult<Value> {
    let a = array_at(o, path)?;
    let sel = selection(spec, &a.shape)?;
    let count: u64 = sel.iter().map(|s| s.count).product();
    if count > VALUES_CAP {
        return Err(ApiError::bad(format!(
            "slice `{spec}` of `{path}` has {count} elements; a table shows at most {VALUES_CAP}"
        )));
    }
    let arr = o.reader.read_array(path, spec)?;
    let vals: Vec<Value> =
        (0..count as usize).map(|i| a.dtype.element_json(arr.bytes(), i).unwrap_or(Value::Null)).collect();
    Ok(json!({"shape": arr.shape(), "values": vals, "dtype": a.dtype.display(), "slice": spec}))
}

/// A string leaf's first `limit` bytes (cut at a character boundary), or a bytes leaf's first
/// `limit` bytes as hex, with the media type its first bytes say (images and audio the page
/// shows through [`raw`]).
pub(crate) fn text(o: &Opened, path: &str, limit: u64) -> ApiResult<Value> {
    let (kind, size) = match keypath::resolve(o.root(), path)? {
        Tree::Leaf(Entry::Str(s)) => ("str", crate::sources::stored_size(s).0),
        Tree::Leaf(Entry::Bytes(b)) => ("bytes", crate::sources::stored_size(b).0),
        Tree::Leaf(e) => return Err(ApiError::bad(format!("`{path}` is a {} leaf, not a string or bytes", e.kind()))),
        t => return Err(ApiError::bad(format!("`{path}` is a {}, not a string or bytes", t.container_kind()))),
    };
    let bytes = blob(o, path, size)?;
    let limit = limit.clamp(16, 1 << 20) as usize;
    Ok(match kind {
        "str" => {
            let s = String::from_utf8_lossy(&bytes);
            let mut end = s.len().min(limit);
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            json!({"kind": "str", "size": size, "text": &s[..end], "truncated": end < s.len()})
        }
        _ => {
            let shown = &bytes[..bytes.len().min(limit)];
            json!({"kind": "bytes", "size": size, "hex": hexdump(shown), "truncated": shown.len() < bytes.len(),
                   "mime": sniff(&bytes)})
        }
    })
}

/// A bytes leaf whose first bytes say it is an image or audio, served as that media type;
/// anything else is refused, so that no leaf is ever served as a page or script of this origin.
pub(crate) fn raw(o: &Opened, path: &str) -> ApiResult<(&'static str, Vec<u8>)> {
    let size = match keypath::resolve(o.root(), path)? {
        Tree::Leaf(Entry::Bytes(b)) => crate::sources::stored_size(b).0,
        _ => return Err(ApiError::bad(format!("`{path}` is not a bytes leaf"))),
    };
    let bytes = blob(o, path, size)?;
    match sniff(&bytes) {
        Some(mime) => Ok((mime, bytes)),
        None => Err(ApiError::bad(format!("`{path}` is not an image or audio clip the page can show"))),
    }
}

fn blob(o: &Opened, path: &str, size: u64) -> ApiResult<Vec<u8>> {
    if size > BLOB_CAP {
        return Err(ApiError::bad(format!(
            "`{path}` is {size} bytes; previews read at most {BLOB_CAP} (`treepack cat` prints it whole)"
        )));
    }
    match o.reader.get(path)? {
        Tree::Leaf(Leaf::Str(s)) => Ok(s.into_bytes()),
        Tree::Leaf(Leaf::Bytes(b)) => Ok(b.to_vec()),
        _ => Err(ApiError::bad(format!("`{path}` is not a string or bytes leaf"))),
    }
}

/// What the tree's reader has read from its location so far (every request's reads together):
/// requests and bytes. Tells how much a view cost, and lets tests check that a slice reads only
/// the chunks it touches.
pub(crate) fn io(o: &Opened) -> Value {
    let st = o.reader.location().store().stats();
    json!({"bytes_read": st.bytes_read(), "read_requests": st.read_requests()})
}

/// The media types the page shows, told by their magic numbers (never SVG: it can hold script).
fn sniff(b: &[u8]) -> Option<&'static str> {
    let starts = |m: &[u8]| b.starts_with(m);
    Some(if starts(b"\x89PNG\r\n\x1a\n") {
        "image/png"
    } else if starts(b"\xff\xd8\xff") {
        "image/jpeg"
    } else if starts(b"GIF87a") || starts(b"GIF89a") {
        "image/gif"
    } else if starts(b"RIFF") && b.get(8..12) == Some(b"WEBP") {
        "image/webp"
    } else if starts(b"RIFF") && b.get(8..12) == Some(b"WAVE") {
        "audio/wav"
    } else if starts(b"OggS") {
        "audio/ogg"
    } else if starts(b"fLaC") {
        "audio/flac"
    } else if starts(b"ID3") {
        "audio/mpeg"
    } else {
        return None;
    })
}

/// `xxd`-style lines: offset, 16 bytes in hex, the printable ones as text.
fn hexdump(b: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    for (i, line) in b.chunks(16).enumerate() {
        let _ = write!(s, "{:08x}  ", i * 16);
        for j in 0..16 {
            match line.get(j) {
                Some(x) => {
                    let _ = write!(s, "{x:02x} ");
                }
                None => s.push_str("   "),
            }
        }
        s.push(' ');
        s.extend(line.iter().map(|&c| if (0x20..0x7f).contains(&c) { c as char } else { '.' }));
        s.push('\n');
    }
    s
}

/// Read the numeric arrays at `path` in `x` and `y` block by block, calling `f` on each pair
/// of blocks (the same elements of both): change norms between two trees.
pub(crate) fn zip_blocks(
    x: &Opened,
    y: &Opened,
    path: &str,
    a: &ArrayEntry,
    mut f: impl FnMut(&[f64], &[f64]),
) -> ApiResult<()> {
    for spec in blocks(&a.shape, 1) {
        let u = x.reader.read_array(path, &spec)?;
        let v = y.reader.read_array(path, &spec)?;
        f(&to_f64(&a.dtype, u.bytes()).unwrap_or_default(), &to_f64(&a.dtype, v.bytes()).unwrap_or_default());
    }
    Ok(())
}

/// Whether numbers of this array can be compared (see [`numeric::is_numeric`]).
pub(crate) fn comparable(a: &ArrayEntry) -> bool {
    numeric::is_numeric(&a.dtype)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_keeps_spikes() {
        let mut v = vec![0.0; 10_000];
        v[1234] = 7.0;
        let ax = DimSel { start: 0, count: 10_000, step: 1, keep: true };
        let out = envelope(&v, &ax, 100);
        assert!(out["y"].as_array().unwrap().contains(&json!(7.0)));
        assert!(out["x"].as_array().unwrap().contains(&json!(1234)));
        assert!(out["y"].as_array().unwrap().len() <= 100);
    }

    #[test]
    fn heatmap_block_means() {
        let v: Vec<f64> = (0..16).map(f64::from).collect();
        let r = DimSel { start: 0, count: 4, step: 1, keep: true };
        let out = heatmap(&v, &r, &r, 2);
        assert_eq!(out["shape"], json!([2, 2]));
        assert_eq!(out["data"], json!([2.5, 4.5, 10.5, 12.5]));
    }

    /// The pixels of the PNG `image` answers for `slice` of `path`: (width, height, samples).
    fn pixels(o: &Opened, path: &str, slice: &str, max: u64) -> (u32, u32, Vec<u8>) {
        let (mime, body) = image(o, path, slice, max).unwrap();
        assert_eq!(mime, "image/png");
        let mut r = png::Decoder::new(std::io::Cursor::new(body)).read_info().unwrap();
        let mut buf = vec![0; r.output_buffer_size().unwrap()];
        let info = r.next_frame(&mut buf).unwrap();
        buf.truncate(info.buffer_size());
        (info.width, info.height, buf)
    }

    #[test]
    fn images_are_the_arrays_pixels() {
        use treepack::{ArrayData, DType, Node};
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("t");
        // RGB: red rises along the columns, green down the rows, blue a constant 7.
        let rgb: Vec<u8> = (0..32u32 * 48).flat_map(|p| [(p % 48 * 5) as u8, (p / 48 * 8) as u8, 7]).collect();
        let grey: Vec<u8> = (0..4096u32 * 64).map(|p| (p % 64) as u8).collect();
        let unit: Vec<u8> = [0.0f32, 0.5, 1.0, 2.0, -1.0, f32::NAN].iter().flat_map(|x| x.to_le_bytes()).collect();
        let tree = Node::dict([
            ("rgb", Node::from(ArrayData::new(DType::U8, vec![32, 48, 3], rgb).unwrap())),
            ("tall", Node::from(ArrayData::new(DType::U8, vec![4096, 64], grey).unwrap())),
            ("unit", Node::from(ArrayData::new(DType::F32, vec![2, 3], unit).unwrap())),
        ]);
        treepack::save(&tree, dir.to_str().unwrap(), &treepack::SaveOptions::default()).unwrap();
        let state = crate::sources::State::open(dir.to_str().unwrap(), None, &Default::default()).unwrap();
        let o = state.tree("a").unwrap();
        let (w, h, px) = pixels(&o, "rgb", ":, :, :", 1024);
        assert_eq!((w, h), (48, 32));
        let at = |r: usize, c: usize| px[(r * 48 + c) * 3..(r * 48 + c) * 3 + 3].to_vec();
        assert_eq!((at(0, 0), at(3, 10), at(31, 47)), (vec![0, 0, 7], vec![50, 24, 7], vec![235, 248, 7]));
        // A region with a step: rows 2..4, columns 0, 16, 32.
        let (w, h, px) = pixels(&o, "rgb", "2:4, ::16, :", 1024);
        assert_eq!((w, h, &px[3..6]), (3, 2, &[80u8, 16, 7][..]));
        // Bigger than `max` a side: means of 16 × 16 blocks; columns 0..16 average 7.5 → 8.
        let (w, h, px) = pixels(&o, "tall", ":, :", 256);
        assert_eq!((w, h, &px[..4]), (4, 256, &[8u8, 24, 40, 56][..]));
        // Floats are 0–1, clipped; NaN is black.
        assert_eq!(pixels(&o, "unit", ":, :", 1024).2, [0, 128, 255, 255, 0, 0]);
    }

    #[test]
    fn sniffs_images_never_markup() {
        assert_eq!(sniff(b"\x89PNG\r\n\x1a\nxxxx"), Some("image/png"));
        assert_eq!(sniff(b"<svg onload=alert(1)>"), None);
        assert_eq!(sniff(b"<html>"), None);
    }
}
