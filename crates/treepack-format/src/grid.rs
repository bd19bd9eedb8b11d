//! The regular n-d chunk grid that arrays are stored on, and numpy-style slicing over it.
//!
//! Chunks are enumerated in C order of their grid coordinates. Edge chunks are *not* padded: a
//! chunk stores exactly the elements inside the array, so its byte length is
//! `itemsize × prod(extent)`.

use crate::error::{Error, Result};
use crate::model::shape_len;

/// Default target size of one chunk.
pub const DEFAULT_CHUNK_BYTES: u64 = 4 << 20;

/// Chunk shape used when none is given: whole trailing axes, the leading axes split so a chunk is
/// about `target` bytes, with chunk byte sizes kept a multiple of 64 where possible so
/// consecutive chunks of one array stay contiguous in a pack (zero-copy mmap views).
pub fn default_chunk_shape(shape: &[u64], itemsize: u64, target: u64) -> Vec<u64> {
    let mut chunk: Vec<u64> = shape.iter().map(|&d| d.max(1)).collect();
    let total = shape_len(shape).and_then(|n| n.checked_mul(itemsize));
    if shape.is_empty() || total.is_some_and(|t| t <= target.max(1)) {
        return chunk;
    }
    let target = target.max(1);
    let mut inner = itemsize.max(1);
    for k in (0..shape.len()).rev() {
        let full = inner.saturating_mul(shape[k].max(1));
        if full <= target {
            inner = full;
            continue;
        }
        let mut rows = (target / inner).max(1);
        let m = 64 / gcd(inner % 64, 64);
        if rows >= m {
            rows -= rows % m;
        }
        chunk[k] = rows.min(shape[k].max(1));
        for c in chunk.iter_mut().take(k) {
            *c = 1;
        }
        break;
    }
    chunk
}

/// The chunk shape for an array held in blocks of `block` (a JAX array's shards): the default
/// chunking of one block, each split axis cut at a divisor of the block's length, so chunks tile
/// every block and none straddles two. Writers that own blocks (processes of a sharded job) then
/// write whole chunks. Edge blocks of an unevenly divided axis are clipped like edge chunks.
pub fn block_chunk_shape(shape: &[u64], block: &[u64], itemsize: u64, target: u64) -> Vec<u64> {
    let clipped: Vec<u64> = shape.iter().zip(block).map(|(&s, &b)| b.min(s).max(1)).collect();
    let mut chunk = default_chunk_shape(&clipped, itemsize, target);
    for (c, &b) in chunk.iter_mut().zip(&clipped) {
        if *c < b && b % *c != 0 {
            *c = largest_divisor_at_most(b, *c);
        }
    }
    chunk
}

/// The largest divisor of `n` that is at most `cap` (≥ 1).
fn largest_divisor_at_most(n: u64, cap: u64) -> u64 {
    let mut best = 1;
    let mut d = 1u64;
    while d.saturating_mul(d) <= n {
        if n.is_multiple_of(d) {
            if d <= cap {
                best = best.max(d);
            }
            let e = n / d;
            if e <= cap {
                best = best.max(e);
            }
        }
        d += 1;
    }
    best
}

fn gcd(a: u64, b: u64) -> u64 {
    if a == 0 {
        b
    } else {
        gcd(b % a, a)
    }
}

/// An array's shape and chunk shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkGrid {
    /// Array shape, in elements per axis.
    pub shape: Vec<u64>,
    /// Shape of one full chunk, same rank as `shape`; edge chunks are cut to fit the array.
    pub chunk_shape: Vec<u64>,
}

impl ChunkGrid {
    /// Validate a grid: same rank, chunk dims ≥ 1.
    ///
    /// # Errors
    /// A plain reason string, wrapped by the caller with file/key context.
    pub fn new(shape: Vec<u64>, chunk_shape: Vec<u64>) -> std::result::Result<ChunkGrid, String> {
        if shape.len() != chunk_shape.len() {
            return Err(format!("chunk_shape {chunk_shape:?} has a different rank than shape {shape:?}"));
        }
        if chunk_shape.contains(&0) {
            return Err(format!("chunk_shape {chunk_shape:?} has a zero dimension"));
        }
        Ok(ChunkGrid { shape, chunk_shape })
    }

    /// Number of chunks along each axis.
    pub fn grid_shape(&self) -> Vec<u64> {
        self.shape.iter().zip(&self.chunk_shape).map(|(&s, &c)| s.div_ceil(c)).collect()
    }

    /// Total number of chunks (`None` on overflow).
    pub fn num_chunks(&self) -> Option<u64> {
        shape_len(&self.grid_shape())
    }

    /// Grid coordinates of chunk number `i` (C order).
    pub fn coords(&self, mut i: u64) -> Vec<u64> {
        let g = self.grid_shape();
        let mut c = vec![0; g.len()];
        for d in (0..g.len()).rev() {
            c[d] = i % g[d].max(1);
            i /= g[d].max(1);
        }
        c
    }

    /// Origin (first element index) and extent of chunk number `i`.
    pub fn chunk_region(&self, i: u64) -> (Vec<u64>, Vec<u64>) {
        let c = self.coords(i);
        let origin: Vec<u64> = c.iter().zip(&self.chunk_shape).map(|(&c, &s)| c * s).collect();
        let extent = origin.iter().zip(&self.chunk_shape).zip(&self.shape).map(|((&o, &c), &s)| c.min(s - o)).collect();
        (origin, extent)
    }

    /// Chunk numbers that intersect a selection, in C order.
    pub fn chunks_for(&self, sel: &[DimSel]) -> Vec<u64> {
        let g = self.grid_shape();
        if g.contains(&0) {
            return vec![];
        }
        // Per axis: the chunk coordinates touched by the selected indices.
        let mut per_axis: Vec<Vec<u64>> = Vec::with_capacity(g.len());
        for (d, s) in sel.iter().enumerate() {
            let cs = self.chunk_shape[d];
            let mut v: Vec<u64> = Vec::new();
            if s.count == 0 {
                return vec![];
            }
            if s.step == 1 {
                let first = s.start / cs;
                let last = (s.start + s.count - 1) / cs;
                v.extend(first..=last);
            } else {
                for k in 0..s.count {
                    let c = (s.start + k * s.step) / cs;
                    if v.last() != Some(&c) {
                        v.push(c);
                    }
                }
            }
            per_axis.push(v);
        }
        let mut out = Vec::new();
        let mut idx = vec![0usize; g.len()];
        loop {
            let mut n = 0u64;
            for d in 0..g.len() {
                n = n * g[d] + per_axis[d][idx[d]];
            }
            out.push(n);
            // odometer
            let mut d = g.len();
            loop {
                if d == 0 {
                    return out;
                }
                d -= 1;
                idx[d] += 1;
                if idx[d] < per_axis[d].len() {
                    break;
                }
                idx[d] = 0;
            }
        }
    }
}

/// One axis of a normalised selection: `count` indices `start, start+step, ...`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DimSel {
    /// First selected index on the axis (already made non-negative and in range).
    pub start: u64,
    /// Number of selected indices (0 for an empty range).
    pub count: u64,
    /// Distance between selected indices (≥ 1).
    pub step: u64,
    /// False for an integer index (the axis is dropped from the result shape).
    pub keep: bool,
}

/// One item of a slice expression before normalisation.
#[derive(Debug, Clone, PartialEq)]
pub enum SliceItem {
    /// A single index (`3`, `-1`); the axis is dropped from the result.
    Index(i64),
    /// A range `start:stop:step`; each part may be left out.
    Range {
        /// First index (negative counts from the end); `None` for the start of the axis.
        start: Option<i64>,
        /// Index one past the last (negative counts from the end); `None` for the end of the axis.
        stop: Option<i64>,
        /// Step; `None` for 1. Only positive steps are accepted by [`normalize`].
        step: Option<i64>,
    },
    /// `...`: as many full ranges as needed to cover the axes not given.
    Ellipsis,
}

/// Parse `"0:2, :, 3"` / `"..., -1"` into items.
///
/// # Errors
/// [`Error::BadSlice`] for malformed text.
pub fn parse_slice(spec: &str) -> Result<Vec<SliceItem>> {
    let spec_t = spec.trim().trim_start_matches('[').trim_end_matches(']');
    if spec_t.trim().is_empty() {
        return Ok(vec![]);
    }
    let err = |r: &str| Error::BadSlice { spec: spec.to_string(), shape: vec![], reason: r.to_string() };
    let num = |s: &str| -> Result<Option<i64>> {
        let s = s.trim();
        if s.is_empty() {
            Ok(None)
        } else {
            s.parse::<i64>().map(Some).map_err(|_| err(&format!("`{s}` is not an integer")))
        }
    };
    let mut out = Vec::new();
    for part in spec_t.split(',') {
        let p = part.trim();
        if p == "..." {
            out.push(SliceItem::Ellipsis);
        } else if p.contains(':') {
            let bits: Vec<&str> = p.split(':').collect();
            if bits.len() > 3 {
                return Err(err("too many `:` in one axis"));
            }
            out.push(SliceItem::Range {
                start: num(bits[0])?,
                stop: num(bits[1])?,
                step: if bits.len() == 3 { num(bits[2])? } else { None },
            });
        } else {
            out.push(SliceItem::Index(num(p)?.ok_or_else(|| err("empty axis"))?));
        }
    }
    Ok(out)
}

/// Normalise slice items against a shape (negative indices, defaults, clamping like numpy).
///
/// # Errors
/// [`Error::BadSlice`] for out-of-range indices, too many axes, or a non-positive step.
pub fn normalize(items: &[SliceItem], shape: &[u64], spec: &str) -> Result<Vec<DimSel>> {
    let err = |r: String| Error::BadSlice { spec: spec.to_string(), shape: shape.to_vec(), reason: r };
    let n_ell = items.iter().filter(|i| matches!(i, SliceItem::Ellipsis)).count();
    if n_ell > 1 {
        return Err(err("at most one `...`".into()));
    }
    let explicit = items.len() - n_ell;
    if explicit > shape.len() {
        return Err(err(format!("{explicit} indices for an array with {} axes", shape.len())));
    }
    let mut expanded: Vec<SliceItem> = Vec::with_capacity(shape.len());
    for it in items {
        if matches!(it, SliceItem::Ellipsis) {
            for _ in 0..shape.len() - explicit {
                expanded.push(SliceItem::Range { start: None, stop: None, step: None });
            }
        } else {
            expanded.push(it.clone());
        }
    }
    while expanded.len() < shape.len() {
        expanded.push(SliceItem::Range { start: None, stop: None, step: None });
    }
    let mut out = Vec::with_capacity(shape.len());
    for (d, it) in expanded.iter().enumerate() {
        let len = i128::from(shape[d]);
        match it {
            SliceItem::Index(i) => {
                let i = i128::from(*i);
                let j = if i < 0 { i + len } else { i };
                if j < 0 || j >= len {
                    return Err(err(format!("index {i} is out of bounds for axis {d} of length {len}")));
                }
                out.push(DimSel { start: j as u64, count: 1, step: 1, keep: false });
            }
            SliceItem::Range { start, stop, step } => {
                let step = step.unwrap_or(1);
                if step <= 0 {
                    return Err(err(format!("step {step} on axis {d}: only positive steps are supported")));
                }
                let clamp = |v: Option<i64>, dflt: i128| -> i128 {
                    match v {
                        None => dflt,
                        Some(v) => {
                            let v = i128::from(v);
                            let v = if v < 0 { v + len } else { v };
                            v.clamp(0, len)
                        }
                    }
                };
                let a = clamp(*start, 0);
                let b = clamp(*stop, len);
                let step = i128::from(step);
                let count = if b > a { (b - a + step - 1) / step } else { 0 };
                out.push(DimSel { start: a as u64, count: count as u64, step: step as u64, keep: true });
            }
            SliceItem::Ellipsis => unreachable!("expanded above"),
        }
    }
    Ok(out)
}

/// The full selection of a shape.
pub fn full(shape: &[u64]) -> Vec<DimSel> {
    shape.iter().map(|&n| DimSel { start: 0, count: n, step: 1, keep: true }).collect()
}

/// Shape of the result of a selection (integer-indexed axes dropped).
pub fn result_shape(sel: &[DimSel]) -> Vec<u64> {
    sel.iter().filter(|s| s.keep).map(|s| s.count).collect()
}

/// Copy the part of one chunk that falls inside `sel` into `out` (C-order buffer of the
/// selection, counted with every axis kept).
pub fn copy_chunk(out: &mut [u8], sel: &[DimSel], origin: &[u64], extent: &[u64], chunk: &[u8], itemsize: usize) {
    let n = sel.len();
    if n == 0 {
        out[..itemsize].copy_from_slice(&chunk[..itemsize]);
        return;
    }
    // For each axis: pairs (output index, chunk-local index) of selected indices inside the chunk.
    let mut pairs: Vec<Vec<(u64, u64)>> = Vec::with_capacity(n);
    for d in 0..n {
        let s = sel[d];
        let lo = origin[d];
        let hi = origin[d] + extent[d];
        // first k with start + k*step >= lo
        let k0 = if s.start >= lo { 0 } else { (lo - s.start).div_ceil(s.step) };
        let mut v = Vec::new();
        let mut k = k0;
        while k < s.count {
            let i = s.start + k * s.step;
            if i >= hi {
                break;
            }
            v.push((k, i - lo));
            k += 1;
        }
        if v.is_empty() {
            return;
        }
        pairs.push(v);
    }
    let mut out_strides = vec![itemsize as u64; n];
    let mut in_strides = vec![itemsize as u64; n];
    for d in (0..n - 1).rev() {
        out_strides[d] = out_strides[d + 1] * sel[d + 1].count;
        in_strides[d] = in_strides[d + 1] * extent[d + 1];
    }
    let last = &pairs[n - 1];
    let contiguous = sel[n - 1].step == 1;
    let mut idx = vec![0usize; n.saturating_sub(1)];
    loop {
        let mut ob = 0u64;
        let mut ib = 0u64;
        for d in 0..n - 1 {
            let (o, i) = pairs[d][idx[d]];
            ob += o * out_strides[d];
            ib += i * in_strides[d];
        }
        if contiguous {
            let (o0, i0) = last[0];
            let len = last.len() * itemsize;
            let ob = (ob + o0 * out_strides[n - 1]) as usize;
            let ib = (ib + i0 * in_strides[n - 1]) as usize;
            out[ob..ob + len].copy_from_slice(&chunk[ib..ib + len]);
        } else {
            for &(o, i) in last {
                let ob = (ob + o * out_strides[n - 1]) as usize;
                let ib = (ib + i * in_strides[n - 1]) as usize;
                out[ob..ob + itemsize].copy_from_slice(&chunk[ib..ib + itemsize]);
            }
        }
        let mut d = n - 1;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < pairs[d].len() {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// True if chunk `i` of a full read is one contiguous byte range of the C-order array, so it
/// can be read straight into place.
pub fn chunk_is_contiguous(grid: &ChunkGrid, extent: &[u64]) -> bool {
    // Contiguous iff: axes before some k have extent 1, axes after k are full.
    let n = grid.shape.len();
    let mut k = 0;
    while k < n && extent[k] == 1 {
        k += 1;
    }
    (k + 1..n).all(|d| extent[d] == grid.shape[d])
}

/// Byte offset of element `origin` in a C-order array of `shape`.
pub fn c_offset(shape: &[u64], origin: &[u64], itemsize: u64) -> u64 {
    let mut off = 0u64;
    for d in 0..shape.len() {
        off = off * shape[d] + origin[d];
    }
    off * itemsize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_chunking_tiles_every_block() {
        // Blocks that fit the target are one chunk each.
        assert_eq!(block_chunk_shape(&[1024, 512], &[256, 512], 4, 4 << 20), vec![256, 512]);
        // A block larger than the target is cut at a divisor of its length: 3000 rows of 4 KiB
        // would be 1024 rows by default, which does not divide 3000; 1000 does.
        let c = block_chunk_shape(&[6000, 1024], &[3000, 1024], 4, 4 << 20);
        assert_eq!(c, vec![1000, 1024]);
        assert_eq!(3000 % c[0], 0);
        // Uneven sharding (last block clipped) and blocks larger than the array.
        assert_eq!(block_chunk_shape(&[10], &[4], 8, 1 << 20), vec![4]);
        assert_eq!(block_chunk_shape(&[10, 3], &[64, 64], 8, 1 << 20), vec![10, 3]);
        // A prime block length falls back to 1 row per chunk rather than straddle blocks.
        assert_eq!(block_chunk_shape(&[2 * 1009, 4096], &[1009, 4096], 4, 1 << 20)[0], 1);
        assert_eq!(largest_divisor_at_most(3000, 1024), 1000);
        assert_eq!(largest_divisor_at_most(12, 5), 4);
        assert_eq!(largest_divisor_at_most(7, 100), 7);
    }

    #[test]
    fn default_chunking() {
        assert_eq!(default_chunk_shape(&[10, 10], 4, 1 << 20), vec![10, 10]);
        let c = default_chunk_shape(&[4096, 1024], 4, 1 << 20);
        assert_eq!(c, vec![256, 1024]);
        let c = default_chunk_shape(&[3, 1 << 22], 1, 1 << 20);
        assert_eq!(c, vec![1, 1 << 20]);
        assert_eq!(default_chunk_shape(&[0, 5], 4, 16), vec![1, 5]);
        assert_eq!(default_chunk_shape(&[], 8, 1), Vec::<u64>::new());
        // rows of 12 bytes: chunks are a multiple of 16 rows (=192 bytes, a multiple of 64)
        let c = default_chunk_shape(&[1000, 3], 4, 1000);
        assert_eq!(c[0] % 16, 0);
    }

    #[test]
    fn slicing_copies_the_right_elements() {
        // 5x7 array of u8 values r*10+c, chunks 2x3; select [1:5:2, 2:7] and [3, ::3]
        let shape = [5u64, 7];
        let grid = ChunkGrid::new(shape.to_vec(), vec![2, 3]).unwrap();
        for spec in ["1:5:2, 2:7", "3, ::3", "..., -1", "", "-2:"] {
            let sel = normalize(&parse_slice(spec).unwrap(), &shape, spec).unwrap();
            let count: u64 = sel.iter().map(|s| s.count).product();
            let mut out = vec![0u8; count as usize];
            for ci in grid.chunks_for(&sel) {
                let (o, e) = grid.chunk_region(ci);
                let mut chunk = vec![];
                for r in o[0]..o[0] + e[0] {
                    for c in o[1]..o[1] + e[1] {
                        chunk.push((r * 10 + c) as u8);
                    }
                }
                copy_chunk(&mut out, &sel, &o, &e, &chunk, 1);
            }
            let mut expect = vec![];
            for a in 0..sel[0].count {
                for b in 0..sel[1].count {
                    expect.push(((sel[0].start + a * sel[0].step) * 10 + sel[1].start + b * sel[1].step) as u8);
                }
            }
            assert_eq!(out, expect, "{spec}");
        }
        assert!(normalize(&parse_slice("9").unwrap(), &shape, "9").is_err());
        assert!(normalize(&parse_slice("::-1").unwrap(), &shape, "::-1").is_err());
        assert!(normalize(&parse_slice("1,2,3").unwrap(), &shape, "").is_err());
    }
}
