//! Informational previews stored next to each chunked array: the first values, min and max.
//! Readers never use them to reconstruct data; `treepack inspect` shows them.

use crate::dtype::{float32_json, float_json, DType};
use serde_json::{json, Value};

/// How many leading values a preview keeps.
pub const HEAD_LEN: usize = 6;

/// The first values of an array (canonical bytes).
pub fn head(dtype: &DType, bytes: &[u8]) -> Value {
    let n = (bytes.len() as u64 / dtype.itemsize().max(1)).min(HEAD_LEN as u64) as usize;
    Value::Array((0..n).filter_map(|i| dtype.element_json(bytes, i)).collect())
}

/// Min and max of the finite/real values in `bytes`, or `None` if there are none or the dtype
/// is not a real number type.
pub fn min_max(dtype: &DType, bytes: &[u8]) -> Option<(f64, f64)> {
    macro_rules! typed {
        ($t:ty, $conv:expr) => {{
            const N: usize = std::mem::size_of::<$t>();
            let mut lo = f64::INFINITY;
            let mut hi = f64::NEG_INFINITY;
            for c in bytes.chunks_exact(N) {
                let mut a = [0u8; N];
                a.copy_from_slice(c);
                let v: f64 = $conv(<$t>::from_le_bytes(a));
                if v < lo {
                    lo = v;
                }
                if v > hi {
                    hi = v;
                }
            }
            if lo <= hi {
                Some((lo, hi))
            } else {
                None
            }
        }};
    }
    match dtype {
        DType::F32 => {
            // 8 independent lanes so the loop vectorises; NaNs are skipped by f32::min/max.
            let mut lo = [f32::INFINITY; 8];
            let mut hi = [f32::NEG_INFINITY; 8];
            let mut it = bytes.chunks_exact(32);
            for block in &mut it {
                for l in 0..8 {
                    let v = f32::from_le_bytes([block[4 * l], block[4 * l + 1], block[4 * l + 2], block[4 * l + 3]]);
                    lo[l] = lo[l].min(v);
                    hi[l] = hi[l].max(v);
                }
            }
            let mut lo = lo.iter().fold(f32::INFINITY, |a, &b| a.min(b));
            let mut hi = hi.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            for c in it.remainder().chunks_exact(4) {
                let v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                lo = lo.min(v);
                hi = hi.max(v);
            }
            (lo <= hi).then_some((lo as f64, hi as f64))
        }
        DType::F64 => typed!(f64, |v: f64| if v.is_nan() { f64::NAN } else { v }),
        DType::I16 => typed!(i16, f64::from),
        DType::U16 => typed!(u16, f64::from),
        DType::I32 => typed!(i32, f64::from),
        DType::U32 => typed!(u32, f64::from),
        DType::I64 => typed!(i64, |v: i64| v as f64),
        DType::U64 => typed!(u64, |v: u64| v as f64),
        DType::F16 => lanes_u16(bytes, |b| half::f16::from_bits(b).to_f32()),
        // bfloat16 is the top half of a float32: widening is a shift.
        DType::BF16 => lanes_u16(bytes, |b| f32::from_bits(u32::from(b) << 16)),
        d if d.itemsize() == 1 && d.is_real_number() => {
            // bool, int8, uint8, float8 and the sub-byte types: mark which byte values occur,
            // then decode those (a sub-byte type's non-canonical bytes decode to nothing).
            let mut seen = [false; 256];
            for &b in bytes {
                seen[b as usize] = true;
            }
            let mut lo = f64::INFINITY;
            let mut hi = f64::NEG_INFINITY;
            for (b, _) in seen.iter().enumerate().filter(|(_, s)| **s) {
                if let Some(v) = d.element_f64(&[b as u8], 0) {
                    lo = lo.min(v);
                    hi = hi.max(v);
                }
            }
            (lo <= hi).then_some((lo, hi))
        }
        _ => None,
    }
}

/// Min/max over 16-bit floats widened to f32, NaNs skipped. 16 independent lanes with
/// compare-and-select (`v < lo` is false for NaN, so a NaN never replaces a bound and the select
/// is one `minps`): several times faster than `f32::min` lanes on bfloat16 (bench/RESULTS.md).
fn lanes_u16(bytes: &[u8], widen: impl Fn(u16) -> f32) -> Option<(f64, f64)> {
    const LANES: usize = 16;
    let mut lo = [f32::INFINITY; LANES];
    let mut hi = [f32::NEG_INFINITY; LANES];
    let mut it = bytes.chunks_exact(2 * LANES);
    for block in &mut it {
        for l in 0..LANES {
            let v = widen(u16::from_le_bytes([block[2 * l], block[2 * l + 1]]));
            lo[l] = if v < lo[l] { v } else { lo[l] };
            hi[l] = if v > hi[l] { v } else { hi[l] };
        }
    }
    let mut lo = lo.iter().fold(f32::INFINITY, |a, &b| if b < a { b } else { a });
    let mut hi = hi.iter().fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a });
    for c in it.remainder().chunks_exact(2) {
        let v = widen(u16::from_le_bytes([c[0], c[1]]));
        lo = if v < lo { v } else { lo };
        hi = if v > hi { v } else { hi };
    }
    (lo <= hi).then_some((f64::from(lo), f64::from(hi)))
}

/// Combine per-chunk min/max results.
pub fn combine(a: Option<(f64, f64)>, b: Option<(f64, f64)>) -> Option<(f64, f64)> {
    match (a, b) {
        (Some((l1, h1)), Some((l2, h2))) => Some((l1.min(l2), h1.max(h2))),
        (x, None) | (None, x) => x,
    }
}

/// The preview object written to the manifest.
pub fn to_json(dtype: &DType, head: Value, mm: Option<(f64, f64)>) -> Value {
    let mut o = json!({ "head": head });
    if let Some((lo, hi)) = mm {
        let as_json = |x: f64| {
            if matches!(dtype, DType::Bool) {
                Value::Bool(x != 0.0)
            } else if !matches!(dtype, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
                && dtype.is_real_number()
                && x.fract() == 0.0
                && x.abs() < 9.0e15
                && dtype.minifloat().is_none()
            {
                json!(x as i64)
            } else if matches!(dtype, DType::F64) {
                float_json(x)
            } else {
                float32_json(x as f32)
            }
        };
        o["min"] = as_json(lo);
        o["max"] = as_json(hi);
    }
    o
}

/// A preview as one line of text, `min -0.3 max 0.66  [-0.3, -0.29, …]` (empty parts left
/// out), the first values clipped to about `width` characters: what `treepack inspect` and the
/// viewer's notebook tree show.
pub fn text(preview: &Value, width: usize) -> String {
    let val = |v: &Value| match v {
        Value::String(s) => s.clone(),
        v => v.to_string(),
    };
    let mut s = String::new();
    if let (Some(lo), Some(hi)) = (preview.get("min"), preview.get("max")) {
        s.push_str(&format!("min {} max {}", val(lo), val(hi)));
    }
    if let Some(Value::Array(h)) = preview.get("head") {
        let mut items = h.iter().map(val).collect::<Vec<_>>().join(", ");
        if items.chars().count() > width {
            items = items.chars().take(width).collect::<String>() + "…";
        }
        if !s.is_empty() {
            s.push_str("  ");
        }
        s.push_str(&format!("[{}{}]", items, if h.len() >= HEAD_LEN { ", …" } else { "" }));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn min_max_skips_nan() {
        let v: Vec<u8> =
            [3.0f32, f32::NAN, -1.5, 7.0, 0.0, 1.0, 2.0, 3.0, 4.0, -9.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(min_max(&DType::F32, &v), Some((-9.0, 7.0)));
        let v: Vec<u8> = [5i32, -2].iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(min_max(&DType::I32, &v), Some((-2.0, 5.0)));
        assert_eq!(min_max(&DType::U8, &[4, 9, 1]), Some((1.0, 9.0)));
        assert_eq!(min_max(&DType::F32, &f32::NAN.to_le_bytes()), None);
        let v: Vec<u8> = (0..21).flat_map(|i| half::bf16::from_f32(i as f32 - 10.0).to_bits().to_le_bytes()).collect();
        assert_eq!(min_max(&DType::BF16, &v), Some((-10.0, 10.0)));
        let v: Vec<u8> =
            [half::f16::NAN, half::f16::from_f32(2.5)].iter().flat_map(|x| x.to_bits().to_le_bytes()).collect();
        assert_eq!(min_max(&DType::F16, &v), Some((2.5, 2.5)));
    }

    /// Sub-byte and 1.5 float types: min/max over canonical bytes (others skipped), integers
    /// as JSON integers, floats as floats, NaN skipped.
    #[test]
    fn min_max_of_format_1_5_types() {
        // int4: 7, -8, -1 and a non-canonical 0x10 (no value).
        let mm = min_max(&DType::I4, &[0x07, 0x08, 0x0f, 0x10]);
        assert_eq!(mm, Some((-8.0, 7.0)));
        assert_eq!(to_json(&DType::I4, json!([]), mm), json!({"head": [], "min": -8, "max": 7}));
        assert_eq!(min_max(&DType::U1, &[0x00, 0x01, 0x02]), Some((0.0, 1.0)));
        // float4_e2m1fn: 0.5, -6, 6.
        let mm = min_max(&DType::F4E2M1FN, &[0x01, 0x0f, 0x07]);
        assert_eq!(to_json(&DType::F4E2M1FN, json!([]), mm), json!({"head": [], "min": -6.0, "max": 6.0}));
        // float8_e8m0fnu: 2^-127, 2^127 and NaN.
        let mm = min_max(&DType::F8E8M0FNU, &[0x00, 0xfe, 0xff]);
        assert_eq!(mm, Some((2f64.powi(-127), 2f64.powi(127))));
        // float8_e4m3: infinities are skipped, as for every 8-bit float.
        assert_eq!(min_max(&DType::F8E4M3, &[0x78, 0x38, 0xf8]), Some((1.0, 1.0)));
        assert_eq!(head(&DType::I2, &[0x03, 0x02, 0x01, 0x04]), json!([-1, -2, 1, null]));
    }

    /// The lane kernels against a plain scan, on lengths around the 16-lane block (remainders),
    /// with NaNs, infinities and extremes in every position class.
    #[test]
    fn lane_kernels_match_a_plain_scan() {
        let specials = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, f32::MAX, f32::MIN, 1e-40];
        for len in [0usize, 1, 15, 16, 17, 31, 33, 100, 1000] {
            for seed in 0..7u32 {
                let vals: Vec<f32> = (0..len)
                    .map(|i| {
                        let x = (i as u32).wrapping_mul(2654435761).wrapping_add(seed * 97);
                        if x.is_multiple_of(11) {
                            specials[(x as usize / 11 + seed as usize) % specials.len()]
                        } else {
                            (x % 2000) as f32 / 7.0 - 140.0
                        }
                    })
                    .collect();
                let expect = {
                    let finite_or_inf: Vec<f32> = vals.iter().copied().filter(|v| !v.is_nan()).collect();
                    (!finite_or_inf.is_empty()).then(|| {
                        let lo = finite_or_inf.iter().copied().fold(f32::INFINITY, f32::min);
                        let hi = finite_or_inf.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                        (f64::from(lo), f64::from(hi))
                    })
                };
                let b: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
                assert_eq!(min_max(&DType::F32, &b), expect, "f32 len {len} seed {seed}");
                // bfloat16: truncate each value to its top half, and compare with the same scan.
                let h: Vec<u16> = vals.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
                let wide: Vec<f32> =
                    h.iter().map(|&x| f32::from_bits(u32::from(x) << 16)).filter(|v| !v.is_nan()).collect();
                let expect = (!wide.is_empty()).then(|| {
                    (
                        f64::from(wide.iter().copied().fold(f32::INFINITY, f32::min)),
                        f64::from(wide.iter().copied().fold(f32::NEG_INFINITY, f32::max)),
                    )
                });
                let b: Vec<u8> = h.iter().flat_map(|v| v.to_le_bytes()).collect();
                assert_eq!(min_max(&DType::BF16, &b), expect, "bf16 len {len} seed {seed}");
            }
        }
    }
}
