//! The byte shuffle (as in Blosc and HDF5): for `n` whole elements of `k` bytes, byte `j` of
//! element `i` goes to position `j * n + i`; the `len % k` trailing bytes stay at the end.

/// Elements per block: a block's bytes (at most 2 KiB for 8-byte elements) stay in L1 while
/// each of its byte planes is gathered or scattered.
const BLOCK: usize = 256;

/// Shuffle `src` into `dst` (same length) by element size `k`.
pub(super) fn shuffle(src: &[u8], dst: &mut [u8], k: usize) {
    transpose(src, dst, k, true);
}

/// The inverse of [`shuffle`].
pub(super) fn unshuffle(src: &[u8], dst: &mut [u8], k: usize) {
    transpose(src, dst, k, false);
}

/// [`shuffle`] (`forward`) or [`unshuffle`]: the whole elements moved, the tail copied.
fn transpose(src: &[u8], dst: &mut [u8], k: usize, forward: bool) {
    let n = src.len() / k.max(1);
    if k <= 1 || n == 0 {
        dst.copy_from_slice(src);
        return;
    }
    let (body, tail) = dst.split_at_mut(n * k);
    let from = &src[..n * k];
    match (k, forward) {
        (2, true) => shuffle_k::<2>(from, body, n),
        (4, true) => shuffle_k::<4>(from, body, n),
        (8, true) => shuffle_k::<8>(from, body, n),
        (_, true) => shuffle_any(from, body, n, k),
        (2, false) => unshuffle_k::<2>(from, body, n),
        (4, false) => unshuffle_k::<4>(from, body, n),
        (8, false) => unshuffle_k::<8>(from, body, n),
        (_, false) => unshuffle_any(from, body, n, k),
    }
    tail.copy_from_slice(&src[n * k..]);
}

/// `n` elements of `K` bytes, element-major in `src`, plane-major in `dst`. Const `K` lets the
/// compiler drop the bounds checks and vectorise the gathers.
fn shuffle_k<const K: usize>(src: &[u8], dst: &mut [u8], n: usize) {
    let mut planes: Vec<&mut [u8]> = dst.chunks_exact_mut(n).collect();
    for (b, elems) in src.chunks(BLOCK * K).enumerate() {
        let at = b * BLOCK;
        for (j, plane) in planes.iter_mut().enumerate() {
            let out = &mut plane[at..at + elems.len() / K];
            for (o, e) in out.iter_mut().zip(elems.chunks_exact(K)) {
                *o = e[j];
            }
        }
    }
}

fn unshuffle_k<const K: usize>(src: &[u8], dst: &mut [u8], n: usize) {
    let planes: Vec<&[u8]> = src.chunks_exact(n).collect();
    for (b, elems) in dst.chunks_mut(BLOCK * K).enumerate() {
        let at = b * BLOCK;
        for (j, plane) in planes.iter().enumerate() {
            let from = &plane[at..at + elems.len() / K];
            for (e, &v) in elems.chunks_exact_mut(K).zip(from) {
                e[j] = v;
            }
        }
    }
}

fn shuffle_any(src: &[u8], dst: &mut [u8], n: usize, k: usize) {
    for (i, elem) in src.chunks_exact(k).enumerate() {
        for (j, &b) in elem.iter().enumerate() {
            dst[j * n + i] = b;
        }
    }
}

fn unshuffle_any(src: &[u8], dst: &mut [u8], n: usize, k: usize) {
    for (i, elem) in dst.chunks_exact_mut(k).enumerate() {
        for (j, b) in elem.iter_mut().enumerate() {
            *b = src[j * n + i];
        }
    }
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
        for k in [1, 2, 3, 4, 8, 16, 100] {
            // Lengths around the block size, with and without a tail.
            for len in [1000usize, 2048, 4096 + 7, 100_003] {
                let src: Vec<u8> = (0..len as u32).map(|i| (i * 31 % 251) as u8).collect();
                let mut s = vec![0; src.len()];
                shuffle(&src, &mut s, k);
                let n = len / k;
                // Byte j of element i moved to j * n + i.
                if n > 5 && k > 1 {
                    assert_eq!(s[(k - 1) * n + 5], src[5 * k + k - 1], "k={k} len={len}");
                }
                let mut back = vec![0; src.len()];
                unshuffle(&s, &mut back, k);
                assert_eq!(back, src, "k={k} len={len}");
            }
        }
    }
}
