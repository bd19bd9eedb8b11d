//! The byte shuffle (as in Blosc and HDF5): for `n` whole elements of `k` bytes, byte `j` of
//! element `i` goes to position `j * n + i`; the `len % k` trailing bytes stay at the end.

/// Elements per block of the staged shuffles: a block's intermediate planes (at most 8 KiB)
/// stay in L1 between stages.
const BLOCK: usize = 1024;

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
        (2, true) => split2(from, body, n),
        (4, true) => split4(from, body, n),
        (8, true) => split8(from, body, n),
        (_, true) => shuffle_any(from, body, n, k),
        (2, false) => merge2(from, body, n),
        (4, false) => merge4(from, body, n),
        (8, false) => merge8(from, body, n),
        (_, false) => unshuffle_any(from, body, n, k),
    }
    tail.copy_from_slice(&src[n * k..]);
}

// The 2-, 4- and 8-byte shuffles run in stages of pairs: unshuffling 4-byte elements zips
// planes 0 and 1 into 2-byte words, planes 2 and 3 likewise, then the two word planes into
// elements. Each stage is integer arithmetic on a pair (`lo | hi << w`), the shape LLVM turns
// into SIMD pack/unpack instructions, several times faster than byte-by-byte strided stores
// (bench/RESULTS.md). Other element sizes go byte by byte.

macro_rules! pairs {
    ($zip:ident, $unzip:ident, $half:ty, $whole:ty, $w:literal) => {
        /// Interleave words of `a` and `b` into pairs (`a` the low half).
        fn $zip(a: &[[u8; $w]], b: &[[u8; $w]], out: &mut [[u8; 2 * $w]]) {
            let m = out.len().min(a.len()).min(b.len());
            let (a, b, out) = (&a[..m], &b[..m], &mut out[..m]);
            for i in 0..m {
                let lo = <$whole>::from(<$half>::from_le_bytes(a[i]));
                let hi = <$whole>::from(<$half>::from_le_bytes(b[i]));
                out[i] = (lo | hi << (8 * $w)).to_le_bytes();
            }
        }
        /// The inverse of the zip: pairs split into their low and high words.
        fn $unzip(src: &[[u8; 2 * $w]], a: &mut [[u8; $w]], b: &mut [[u8; $w]]) {
            let m = src.len().min(a.len()).min(b.len());
            let (src, a, b) = (&src[..m], &mut a[..m], &mut b[..m]);
            for i in 0..m {
                let v = <$whole>::from_le_bytes(src[i]);
                a[i] = (v as $half).to_le_bytes();
                b[i] = ((v >> (8 * $w)) as $half).to_le_bytes();
            }
        }
    };
}
pairs!(zip1, unzip1, u8, u16, 1);
pairs!(zip2, unzip2, u16, u32, 2);
pairs!(zip4, unzip4, u32, u64, 4);

/// `s` as whole `N`-byte words (a trailing part is ignored: callers pass exact multiples).
fn words<const N: usize>(s: &[u8]) -> &[[u8; N]] {
    s.as_chunks::<N>().0
}

fn words_mut<const N: usize>(s: &mut [u8]) -> &mut [[u8; N]] {
    s.as_chunks_mut::<N>().0
}

/// Byte plane `j` of `planes` (each `n` long), elements `at..at + m`.
fn plane(planes: &[u8], n: usize, j: usize, at: usize, m: usize) -> &[[u8; 1]] {
    words::<1>(&planes[j * n + at..j * n + at + m])
}

fn merge2(src: &[u8], dst: &mut [u8], n: usize) {
    zip1(plane(src, n, 0, 0, n), plane(src, n, 1, 0, n), words_mut::<2>(dst));
}

fn split2(src: &[u8], dst: &mut [u8], n: usize) {
    let (a, b) = dst.split_at_mut(n);
    unzip1(words::<2>(src), words_mut::<1>(a), words_mut::<1>(b));
}

fn merge4(src: &[u8], dst: &mut [u8], n: usize) {
    let mut w = [[[0u8; 2]; BLOCK]; 2];
    for (b, out) in dst.chunks_mut(4 * BLOCK).enumerate() {
        let (at, m) = (b * BLOCK, out.len() / 4);
        for (q, w) in w.iter_mut().enumerate() {
            zip1(plane(src, n, 2 * q, at, m), plane(src, n, 2 * q + 1, at, m), w);
        }
        zip2(&w[0][..m], &w[1][..m], words_mut::<4>(out));
    }
}

fn split4(src: &[u8], dst: &mut [u8], n: usize) {
    let mut w = [[[0u8; 2]; BLOCK]; 2];
    let mut planes: Vec<&mut [u8]> = dst.chunks_exact_mut(n).collect();
    for (b, inp) in src.chunks(4 * BLOCK).enumerate() {
        let (at, m) = (b * BLOCK, inp.len() / 4);
        let [w0, w1] = &mut w;
        unzip2(words::<4>(inp), &mut w0[..m], &mut w1[..m]);
        for (q, w) in w.iter().enumerate() {
            let (p0, p1) = planes[2 * q..].split_at_mut(1);
            unzip1(&w[..m], words_mut::<1>(&mut p0[0][at..at + m]), words_mut::<1>(&mut p1[0][at..at + m]));
        }
    }
}

fn merge8(src: &[u8], dst: &mut [u8], n: usize) {
    let mut w2 = [[[0u8; 2]; BLOCK]; 4];
    let mut w4 = [[[0u8; 4]; BLOCK]; 2];
    for (b, out) in dst.chunks_mut(8 * BLOCK).enumerate() {
        let (at, m) = (b * BLOCK, out.len() / 8);
        for (q, w) in w2.iter_mut().enumerate() {
            zip1(plane(src, n, 2 * q, at, m), plane(src, n, 2 * q + 1, at, m), w);
        }
        for (q, w) in w4.iter_mut().enumerate() {
            zip2(&w2[2 * q][..m], &w2[2 * q + 1][..m], w);
        }
        zip4(&w4[0][..m], &w4[1][..m], words_mut::<8>(out));
    }
}

fn split8(src: &[u8], dst: &mut [u8], n: usize) {
    let mut w2 = [[[0u8; 2]; BLOCK]; 4];
    let mut w4 = [[[0u8; 4]; BLOCK]; 2];
    let mut planes: Vec<&mut [u8]> = dst.chunks_exact_mut(n).collect();
    for (b, inp) in src.chunks(8 * BLOCK).enumerate() {
        let (at, m) = (b * BLOCK, inp.len() / 8);
        let [w40, w41] = &mut w4;
        unzip4(words::<8>(inp), &mut w40[..m], &mut w41[..m]);
        for (q, w) in w4.iter().enumerate() {
            let (a, b) = w2[2 * q..].split_at_mut(1);
            unzip2(&w[..m], &mut a[0][..m], &mut b[0][..m]);
        }
        for (q, w) in w2.iter().enumerate() {
            let (p0, p1) = planes[2 * q..].split_at_mut(1);
            unzip1(&w[..m], words_mut::<1>(&mut p0[0][at..at + m]), words_mut::<1>(&mut p1[0][at..at + m]));
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
