//! The byte shuffle (as in Blosc and HDF5): for `n` whole elements of `k` bytes, byte `j` of
//! element `i` goes to position `j * n + i`; the `len % k` trailing bytes stay at the end.

/// Shuffle `src` into `dst` (same length) by element size `k`.
pub(super) fn shuffle(src: &[u8], dst: &mut [u8], k: usize) {
    let n = src.len() / k;
    if k <= 1 || n == 0 {
        dst.copy_from_slice(src);
        return;
    }
    for (i, elem) in src.chunks_exact(k).enumerate() {
        for (j, &b) in elem.iter().enumerate() {
            dst[j * n + i] = b;
        }
    }
    dst[n * k..].copy_from_slice(&src[n * k..]);
}

/// The inverse of [`shuffle`].
pub(super) fn unshuffle(src: &[u8], dst: &mut [u8], k: usize) {
    let n = src.len() / k;
    if k <= 1 || n == 0 {
        dst.copy_from_slice(src);
        return;
    }
    for (i, elem) in dst.chunks_exact_mut(k).enumerate() {
        for (j, b) in elem.iter_mut().enumerate() {
            *b = src[j * n + i];
        }
    }
    dst[n * k..].copy_from_slice(&src[n * k..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shuffle_groups_byte_planes_and_inverts() {
        let src = [1u8, 2, 3, 4, 5, 6, 7];
        let mut s = [0u8; 7];
        shuffle(&src, &mut s, 2);
        assert_eq!(s, [1, 3, 5, 2, 4, 6, 7]);
        let mut back = [0u8; 7];
        unshuffle(&s, &mut back, 2);
        assert_eq!(back, src);
        for k in [1, 3, 4, 8, 16, 100] {
            let src: Vec<u8> = (0..1000u32).map(|i| (i * 31 % 251) as u8).collect();
            let mut s = vec![0; src.len()];
            shuffle(&src, &mut s, k);
            let mut back = vec![0; src.len()];
            unshuffle(&s, &mut back, k);
            assert_eq!(back, src, "k={k}");
        }
    }
}
