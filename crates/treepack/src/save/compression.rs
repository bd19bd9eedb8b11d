//! The compression policy: an ordered list of rules; the first rule that matches a stored leaf
//! (an array on a chunk grid, or a str/bytes blob) decides how its chunks are encoded.
//! Parsed once here from the forms users write (`"zstd:3"`, `"auto"`, a JSON list of rule
//! objects), for Rust, the CLI and Python alike.

use crate::error::{Error, Result};
use crate::format::codec::{Compressor, Encoding, Filter, ZSTD_LEVELS};
use crate::format::dtype::DType;
use crate::format::keypath::Glob;
use serde::Deserialize;

/// How a save compresses: the first matching rule decides; no rule (the default) stores every
/// chunk raw, as format 1.0 did.
#[derive(Debug, Clone, Default)]
pub struct Compression {
    rules: Vec<Rule>,
    source: String,
}

/// One rule of a [`Compression`] policy.
#[derive(Debug, Clone)]
pub struct Rule {
    paths: Vec<Glob>,
    dtypes: Vec<Glob>,
    min_size: u64,
    /// `None`: store raw.
    encoding: Option<Encoding>,
}

/// A rule as users write it (Python dicts, JSON). Unknown keys are refused.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleText {
    #[serde(default)]
    paths: Vec<String>,
    #[serde(default)]
    dtypes: Vec<String>,
    #[serde(default)]
    min_size: u64,
    codec: String,
    level: Option<i32>,
    filter: Option<String>,
}

/// zstd's level when none is given: fast, and most of the ratio of higher levels on numbers.
pub const DEFAULT_ZSTD_LEVEL: i32 = 3;
/// Leaves smaller than this are not compressed by the `auto` policy (nor by the one-word forms).
pub const AUTO_MIN_SIZE: u64 = 16 << 10;

impl Compression {
    /// Store every chunk raw.
    pub fn none() -> Compression {
        Compression::default()
    }

    /// Whether any rule compresses.
    pub fn is_none(&self) -> bool {
        self.rules.iter().all(|r| r.encoding.is_none())
    }

    /// The policy as it was written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Parse a policy: `"none"`, `"auto"`, `"zstd"`, `"zstd:LEVEL"`, `"lz4"` (each of those
    /// compresses stored leaves of at least 16 KiB, arrays shuffled by element size where that helps), or a
    /// JSON list of rule objects with the keys `paths` (key-path globs), `dtypes` (dtype name
    /// globs; `str` and `bytes` match blobs), `min_size` (bytes), `codec` (`zstd`, `lz4`,
    /// `none`), `level` (zstd only) and `filter` (`auto`, the default: shuffle each chunk
    /// whose sample compresses better shuffled; `shuffle`: always; `none`).
    ///
    /// # Errors
    /// [`Error::InvalidCompression`], naming what is wrong and the accepted forms.
    pub fn parse(text: &str) -> Result<Compression> {
        let t = text.trim();
        let rules = if t.starts_with('[') {
            let list: Vec<RuleText> = serde_json::from_str(t).map_err(|e| bad(text, e.to_string()))?;
            list.iter()
                .enumerate()
                .map(|(i, r)| rule(r).map_err(|m| bad(text, format!("rule {i}: {m}"))))
                .collect::<Result<_>>()?
        } else {
            match t {
                "none" | "raw" | "" => vec![],
                "auto" => auto(),
                word => {
                    let (codec, level) = match word.split_once(':') {
                        Some((c, l)) => (
                            c,
                            Some(l.parse::<i32>().map_err(|_| bad(text, format!("level `{l}` is not an integer")))?),
                        ),
                        None => (word, None),
                    };
                    let r = RuleText {
                        paths: vec![],
                        dtypes: vec![],
                        min_size: AUTO_MIN_SIZE,
                        codec: codec.to_string(),
                        level,
                        filter: None,
                    };
                    vec![rule(&r).map_err(|m| bad(text, m))?]
                }
            }
        };
        Ok(Compression { rules, source: text.to_string() })
    }

    /// How to encode the chunks of a stored leaf at `path` (escaped segment texts) of `nbytes`
    /// canonical bytes; `dtype` is `None` for blobs (`is_str` tells which kind). `None`: raw.
    pub fn encoding_for(&self, path: &[String], dtype: Option<&DType>, is_str: bool, nbytes: u64) -> Option<Encoding> {
        let kind = match dtype {
            Some(d) => d.name().unwrap_or_else(|| "struct".into()),
            None if is_str => "str".into(),
            None => "bytes".into(),
        };
        let kind = [kind];
        let r = self.rules.iter().find(|r| {
            nbytes >= r.min_size
                && (r.dtypes.is_empty() || r.dtypes.iter().any(|g| g.matches(&kind)))
                && (r.paths.is_empty() || r.paths.iter().any(|g| g.matches(path)))
        })?;
        r.encoding
    }

    /// Whether rules look at key paths (callers then compute each leaf's path texts).
    pub fn needs_paths(&self) -> bool {
        self.rules.iter().any(|r| !r.paths.is_empty())
    }
}

/// zstd's level in the `auto` policy: on checkpoint-like data level 1 compresses as well as 3
/// and saves and loads faster (docs/compression.md).
pub const AUTO_ZSTD_LEVEL: i32 = 1;

/// The `auto` policy: every stored leaf of 16 KiB or more through zstd at level 1, arrays
/// shuffled by element size first where that helps.
fn auto() -> Vec<Rule> {
    vec![Rule {
        paths: vec![],
        dtypes: vec![],
        min_size: AUTO_MIN_SIZE,
        encoding: Some(Encoding { compressor: Compressor::Zstd, level: AUTO_ZSTD_LEVEL, filter: Filter::Auto }),
    }]
}

fn rule(r: &RuleText) -> std::result::Result<Rule, String> {
    let glob = |p: &String| Glob::new(p).map_err(|e| e.to_string());
    let paths = r.paths.iter().map(glob).collect::<std::result::Result<Vec<_>, _>>()?;
    let dtypes = r.dtypes.iter().map(glob).collect::<std::result::Result<Vec<_>, _>>()?;
    let compressor = match r.codec.as_str() {
        "none" | "raw" => None,
        "zstd" => Some(Compressor::Zstd),
        "lz4" => Some(Compressor::Lz4),
        other => return Err(format!("unknown codec `{other}` (use zstd, lz4 or none)")),
    };
    let level = match (compressor, r.level) {
        (Some(Compressor::Zstd), Some(l)) if !ZSTD_LEVELS.contains(&l) => {
            return Err(format!("zstd level {l} is out of range ({}..={})", ZSTD_LEVELS.start(), ZSTD_LEVELS.end()))
        }
        (Some(Compressor::Zstd), l) => l.unwrap_or(DEFAULT_ZSTD_LEVEL),
        (_, Some(l)) => return Err(format!("level {l} given, but only zstd has levels")),
        (_, None) => 0,
    };
    let filter = match r.filter.as_deref() {
        None | Some("auto") => Filter::Auto,
        Some("shuffle") => Filter::Shuffle,
        Some("none") => Filter::None,
        Some(other) => return Err(format!("unknown filter `{other}` (use auto, shuffle or none)")),
    };
    if compressor.is_none() && r.filter.is_some() {
        return Err("a filter needs a codec".into());
    }
    Ok(Rule {
        paths,
        dtypes,
        min_size: r.min_size,
        encoding: compressor.map(|compressor| Encoding { compressor, level, filter }),
    })
}

fn bad(text: &str, reason: String) -> Error {
    Error::InvalidCompression {
        policy: text.to_string(),
        reason: format!(
            "{reason}; use \"none\", \"auto\", \"zstd\", \"zstd:LEVEL\", \"lz4\" or a list of rules \
             ({{\"paths\", \"dtypes\", \"min_size\", \"codec\", \"level\", \"filter\"}})"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Vec<String> {
        s.split('/').map(str::to_string).collect()
    }

    #[test]
    fn policies_parse_and_the_first_matching_rule_decides() {
        assert!(Compression::parse("none").unwrap().is_none());
        let z = Compression::parse("zstd:7").unwrap();
        let e = z.encoding_for(&p("a"), Some(&DType::F32), false, 1 << 20).unwrap();
        assert_eq!((e.compressor, e.level, e.filter), (Compressor::Zstd, 7, Filter::Auto));
        assert!(z.encoding_for(&p("a"), Some(&DType::F32), false, 100).is_none(), "small leaves stay raw");
        let rules = r#"[{"paths": ["params/**"], "dtypes": ["float*", "bfloat16"], "min_size": 1024, "codec": "zstd", "level": 1},
                       {"dtypes": ["str"], "codec": "lz4", "filter": "none"},
                       {"codec": "none"}]"#;
        let c = Compression::parse(rules).unwrap();
        let hit = c.encoding_for(&p("params/w"), Some(&DType::BF16), false, 4096).unwrap();
        assert_eq!((hit.compressor, hit.level), (Compressor::Zstd, 1));
        assert!(c.encoding_for(&p("opt/w"), Some(&DType::BF16), false, 4096).is_none());
        assert!(c.encoding_for(&p("params/w"), Some(&DType::I32), false, 4096).is_none());
        let s = c.encoding_for(&p("notes"), None, true, 10).unwrap();
        assert_eq!((s.compressor, s.filter), (Compressor::Lz4, Filter::None));
        assert!(c.encoding_for(&p("blob"), None, false, 1 << 20).is_none(), "bytes blobs fall to `none`");
        for (f, want) in [("auto", Filter::Auto), ("shuffle", Filter::Shuffle), ("none", Filter::None)] {
            let c = Compression::parse(&format!(r#"[{{"codec": "lz4", "filter": "{f}"}}]"#)).unwrap();
            assert_eq!(c.encoding_for(&p("x"), Some(&DType::F32), false, 10).unwrap().filter, want);
        }
    }

    #[test]
    fn bad_policies_say_what_is_wrong() {
        for (text, says) in [
            ("brotli", "unknown codec `brotli`"),
            ("zstd:99", "out of range"),
            ("zstd:x", "not an integer"),
            ("lz4:3", "only zstd has levels"),
            (r#"[{"codec": "zstd", "levle": 3}]"#, "unknown field `levle`"),
            (r#"[{"codec": "zstd", "filter": "bitshuffle"}]"#, "unknown filter"),
            (r#"[{"codec": "zstd", "paths": ["a/**b"]}]"#, "`**` must be a whole segment"),
        ] {
            let e = Compression::parse(text).unwrap_err().to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
    }
}
