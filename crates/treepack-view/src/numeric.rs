//! Array bytes as numbers, and arrays read in bounded blocks.
//!
//! Plots, histograms and change norms work on f64: every real dtype converts exactly or to the
//! nearest double (int64 beyond 2^53 rounds), booleans as 0/1, complex numbers as their
//! magnitude. Structured, string and byte-string dtypes are not numbers (their elements are
//! shown as a table instead).

use treepack::format::dtype::{minifloat_to_f64, narrow_int_value};
use treepack::DType;

/// Whether the viewer plots arrays of this dtype.
pub(crate) fn is_numeric(d: &DType) -> bool {
    d.is_real_number() || matches!(d, DType::C64 | DType::C128)
}

/// Canonical little-endian bytes of `d` as f64s (`None` for a dtype that is not numeric).
pub(crate) fn to_f64(d: &DType, b: &[u8]) -> Option<Vec<f64>> {
    macro_rules! each {
        ($t:ty, $f:expr) => {{
            const N: usize = std::mem::size_of::<$t>();
            b.chunks_exact(N)
                .map(|c| {
                    let mut a = [0u8; N];
                    a.copy_from_slice(c);
                    #[allow(clippy::redundant_closure_call)]
                    $f(<$t>::from_le_bytes(a))
                })
                .collect()
        }};
    }
    Some(match d {
        DType::Bool => b.iter().map(|&x| f64::from(u8::from(x != 0))).collect(),
        DType::I8 => b.iter().map(|&x| f64::from(x as i8)).collect(),
        DType::U8 => b.iter().map(|&x| f64::from(x)).collect(),
        DType::I16 => each!(i16, f64::from),
        DType::U16 => each!(u16, f64::from),
        DType::I32 => each!(i32, f64::from),
        DType::U32 => each!(u32, f64::from),
        DType::I64 => each!(i64, |v: i64| v as f64),
        DType::U64 => each!(u64, |v: u64| v as f64),
        DType::F16 => each!(u16, |v: u16| f64::from(half::f16::from_bits(v).to_f32())),
        DType::BF16 => each!(u16, |v: u16| f64::from(half::bf16::from_bits(v).to_f32())),
        DType::F32 => each!(f32, f64::from),
        DType::F64 => each!(f64, |v: f64| v),
        DType::C64 => b
            .chunks_exact(8)
            .map(|c| {
                let re = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                let im = f32::from_le_bytes([c[4], c[5], c[6], c[7]]);
                f64::from(re).hypot(f64::from(im))
            })
            .collect(),
        DType::C128 => b
            .chunks_exact(16)
            .map(|c| {
                let mut r = [0u8; 8];
                let mut i = [0u8; 8];
                r.copy_from_slice(&c[..8]);
                i.copy_from_slice(&c[8..]);
                f64::from_le_bytes(r).hypot(f64::from_le_bytes(i))
            })
            .collect(),
        DType::I4 | DType::U4 | DType::I2 | DType::U2 | DType::I1 | DType::U1 => {
            // A byte with its high bits set has no value: NaN, which plots as a gap.
            b.iter().map(|&x| narrow_int_value(d, x).map_or(f64::NAN, |v| v as f64)).collect()
        }
        d if d.minifloat().is_some() => b.iter().map(|&x| minifloat_to_f64(d, x).unwrap_or(f64::NAN)).collect(),
        _ => return None,
    })
}

/// The most elements one read of a block holds (16 MiB of f64 once converted: bounded memory
/// however big the array).
pub(crate) const BLOCK: u64 = 1 << 21;

/// Slices (as slice text) covering `shape` in C order, each at most about [`BLOCK`] elements,
/// taking every `step0`-th index of axis 0 (a sample of arrays too big to read whole). Blocks
/// cut the first axis whose trailing axes fit a block, and index the axes before it one by one.
pub(crate) fn blocks(shape: &[u64], step0: u64) -> Vec<String> {
    if shape.is_empty() {
        return vec![String::new()];
    }
    if shape.contains(&0) {
        return vec![];
    }
    // The first axis k whose trailing product fits a block.
    let mut k = shape.len() - 1;
    let mut trailing = 1u64;
    for i in (0..shape.len()).rev() {
        if trailing.saturating_mul(shape[i]) > BLOCK {
            k = i;
            break;
        }
        trailing = trailing.saturating_mul(shape[i]);
        k = i;
    }
    let trailing: u64 = shape[k + 1..].iter().product();
    let per = (BLOCK / trailing.max(1)).max(1);
    let mut out = vec![];
    // Indexes of the axes before k, odometer-style (axis 0 stepped by step0).
    let mut idx = vec![0u64; k];
    loop {
        let step_k = if k == 0 { step0 } else { 1 };
        let mut start = 0;
        while start < shape[k] {
            let stop = (start + per * step_k).min(shape[k]);
            let mut parts: Vec<String> = idx.iter().map(u64::to_string).collect();
            parts.push(format!("{start}:{stop}:{step_k}"));
            out.push(parts.join(","));
            start = stop;
        }
        // Next index of the axes before k.
        let mut d = k;
        loop {
            if d == 0 {
                return out;
            }
            d -= 1;
            idx[d] += if d == 0 { step0 } else { 1 };
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn covered(shape: &[u64]) -> u64 {
        let mut n = 0;
        for b in blocks(shape, 1) {
            let items = treepack::format::grid::parse_slice(&b).unwrap();
            let sel = treepack::format::grid::normalize(&items, shape, &b).unwrap();
            n += sel.iter().map(|s| s.count).product::<u64>();
        }
        n
    }

    #[test]
    fn blocks_cover_every_element_once() {
        for shape in [vec![10], vec![3, 4], vec![5, 1 << 20], vec![3, 1 << 22], vec![2, 3, 1 << 22], vec![1 << 23]] {
            assert_eq!(covered(&shape), shape.iter().product::<u64>(), "{shape:?}");
        }
        assert_eq!(blocks(&[], 1), vec![String::new()]);
        assert!(blocks(&[0, 3], 1).is_empty());
    }

    #[test]
    fn numbers_of_each_kind() {
        assert_eq!(to_f64(&DType::I16, &(-3i16).to_le_bytes()), Some(vec![-3.0]));
        assert_eq!(to_f64(&DType::Bool, &[0, 1]), Some(vec![0.0, 1.0]));
        let c: Vec<u8> = [3f32, 4f32].iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(to_f64(&DType::C64, &c), Some(vec![5.0]));
        assert_eq!(to_f64(&DType::Unicode(2), &[0; 8]), None);
    }
}
