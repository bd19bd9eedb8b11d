//! Chunk codecs. Format v1 defines only `raw`; the field exists in every chunk so compression
//! (zstd, lz4, byte-shuffle; see ROADMAP wave 2) plugs in without a format change.

use std::fmt;

/// How a chunk's stored bytes encode its canonical bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Codec {
    /// Stored bytes are the canonical bytes.
    Raw,
}

impl Codec {
    /// The codec's name as written in the manifest (`raw`).
    pub fn name(&self) -> &'static str {
        match self {
            Codec::Raw => "raw",
        }
    }

    /// Whether the stored bytes are the canonical bytes themselves: then a chunk's stored
    /// length is known from its region, and readers may hand out views (mmap, one span) of it.
    pub fn is_identity(&self) -> bool {
        matches!(self, Codec::Raw)
    }

    /// Parse a codec name. Unknown codecs yield `None` (the caller reports which chunk).
    pub fn from_name(s: &str) -> Option<Codec> {
        match s {
            "raw" => Some(Codec::Raw),
            _ => None,
        }
    }

    /// Decode stored bytes into canonical bytes of exactly `expected_len` bytes.
    ///
    /// # Errors
    /// A reason string if the decoded length differs (never allocates more than `expected_len`).
    pub fn decode(&self, stored: bytes::Bytes, expected_len: u64) -> Result<bytes::Bytes, String> {
        match self {
            Codec::Raw => {
                if stored.len() as u64 != expected_len {
                    return Err(format!("raw chunk holds {} bytes, expected {expected_len}", stored.len()));
                }
                Ok(stored)
            }
        }
    }
}

impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
