//! BLAKE3 content hashes of canonical chunk bytes.

use std::fmt;

/// A 32-byte BLAKE3 hash, written as 64 lowercase hex digits in the manifest.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Hash32(pub [u8; 32]);

impl Hash32 {
    /// Hash bytes. Large inputs are hashed with several threads (those of the installed
    /// [`Exec`](crate::exec::Exec)).
    pub fn of(data: &[u8]) -> Hash32 {
        if data.len() >= 1 << 20 {
            let mut h = blake3::Hasher::new();
            if crate::exec::parallel(|| {
                h.update_rayon(data);
            })
            .is_none()
            {
                h.update(data);
            }
            Hash32(*h.finalize().as_bytes())
        } else {
            Hash32(*blake3::hash(data).as_bytes())
        }
    }

    /// The 64 lowercase hex digits, as written in the manifest.
    pub fn to_hex(&self) -> String {
        let mut s = String::with_capacity(64);
        self.push_hex(&mut s);
        s
    }

    /// Append the 64 lowercase hex digits to `s` (no allocation: one per chunk reference).
    pub fn push_hex(&self, s: &mut String) {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        for b in self.0 {
            s.push(char::from(DIGITS[usize::from(b >> 4)]));
            s.push(char::from(DIGITS[usize::from(b & 15)]));
        }
    }

    /// Parse 64 lowercase hex digits.
    pub fn from_hex(s: &str) -> Option<Hash32> {
        let b = s.as_bytes();
        if b.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for i in 0..32 {
            let hi = hex_val(b[2 * i])?;
            let lo = hex_val(b[2 * i + 1])?;
            out[i] = hi << 4 | lo;
        }
        Some(Hash32(out))
    }
}

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

impl fmt::Debug for Hash32 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Hash32({})", self.to_hex())
    }
}

impl fmt::Display for Hash32 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn hex_round_trip_and_known_vector() {
        let h = Hash32::of(b"");
        assert_eq!(h.to_hex(), "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262");
        assert_eq!(Hash32::from_hex(&h.to_hex()), Some(h));
        assert_eq!(Hash32::from_hex("AF"), None);
        let big = vec![7u8; 3 << 20];
        assert_eq!(Hash32::of(&big).0, *blake3::hash(&big).as_bytes());
        crate::exec::testing::install();
        assert_eq!(Hash32::of(&big).0, *blake3::hash(&big).as_bytes());
    }
}
