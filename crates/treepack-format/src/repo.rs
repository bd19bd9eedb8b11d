//! A repository's small files (docs/format.md section 10), with no I/O: tree names, the ref
//! that commits a name, the index of each pack's chunks, the gc state and save leases.
//!
//! Every parser here reads files a hostile writer may have made: sizes are bounded, paths
//! checked with the manifest's pack-path rules, hashes parsed strictly, and nothing is trusted
//! to be consistent with anything else until checked.

use crate::codec::Codec;
use crate::hash::Hash32;
use crate::manifest;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The file that makes a location a repository.
pub const MARKER: &str = "treepack-repo.json";
/// Folder of refs: `refs/<name>.json` commits a name.
pub const REFS_DIR: &str = "refs";
/// Folder of committed manifests, named by the BLAKE3 of their bytes.
pub const TREES_DIR: &str = "trees";
/// Folder of pack indexes: `index/<pack stem>.json` lists one pack's chunks.
pub const INDEX_DIR: &str = "index";
/// Folder of leases: one per save in progress.
pub const LEASES_DIR: &str = "leases";
/// The gc state: packs and trees found unreferenced, and since when.
pub const GC_STATE: &str = "gc.json";
/// Largest ref, lease, marker or gc-state file accepted.
pub const MAX_SMALL_FILE: u64 = 1 << 20;
/// Largest pack index accepted (a 256 MiB pack of 4 KiB chunks lists 64k chunks, ~7 MiB).
pub const MAX_INDEX_FILE: u64 = 256 << 20;
/// Longest tree name.
pub const MAX_NAME: usize = 128;

/// The marker's content.
pub fn marker_bytes() -> Vec<u8> {
    b"{\"format\":\"treepack-repository\",\"version\":[1,0]}\n".to_vec()
}

/// Check a marker: the right format name and major version 1.
///
/// # Errors
/// What is wrong, for an error message.
pub fn check_marker(bytes: &[u8]) -> Result<(), String> {
    #[derive(Deserialize)]
    struct M {
        format: String,
        version: (u16, u16),
    }
    let m: M = serde_json::from_slice(bytes).map_err(|e| format!("not a repository marker: {e}"))?;
    if m.format != "treepack-repository" {
        return Err(format!("not a repository marker (format {:?})", m.format));
    }
    if m.version.0 != 1 {
        return Err(format!(
            "repository format version {}.{} is not supported; upgrade treepack",
            m.version.0, m.version.1
        ));
    }
    Ok(())
}

/// Check a tree name: 1 to 128 bytes of `A-Z a-z 0-9 . _ -`, not starting with `.` (so it is
/// one safe path segment on every store, and `LOCATION@NAME` stays unambiguous).
///
/// # Errors
/// What is wrong and what is allowed.
pub fn validate_name(name: &str) -> Result<(), String> {
    let ok_chars = name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if name.is_empty() || name.len() > MAX_NAME || !ok_chars || name.starts_with('.') {
        return Err(format!(
            "tree name {name:?} is not allowed: use 1 to {MAX_NAME} characters from A-Z a-z 0-9 . _ - (not starting with .), e.g. step-1000"
        ));
    }
    Ok(())
}

/// `refs/<name>.json`.
pub fn ref_path(name: &str) -> String {
    format!("{REFS_DIR}/{name}.json")
}

/// The name of a ref file (`refs/<name>.json`), if it is one.
pub fn name_of_ref(rel: &str) -> Option<&str> {
    let n = rel.strip_prefix(REFS_DIR)?.strip_prefix('/')?.strip_suffix(".json")?;
    validate_name(n).ok().map(|_| n)
}

/// `trees/<hex>.json` for a manifest whose bytes hash to `h`.
pub fn tree_path(h: &Hash32) -> String {
    format!("{TREES_DIR}/{}.json", h.to_hex())
}

/// `index/<stem>.json` for the pack `packs/<stem>.tpp`.
pub fn index_path(pack: &str) -> Option<String> {
    let stem = pack.strip_prefix("packs/")?.strip_suffix(".tpp")?;
    (!stem.contains('/')).then(|| format!("{INDEX_DIR}/{stem}.json"))
}

/// What commits a name: the tree it names and what the save reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefRecord {
    /// The committed manifest, `trees/<64 hex>.json`.
    pub tree: String,
    /// The tree's root hash (section 9), 64 hex digits.
    pub root: String,
    /// When the save committed, milliseconds since the Unix epoch.
    pub saved_ms: u64,
    /// Bytes the save wrote (new packs, indexes and the manifest).
    pub bytes_written: u64,
    /// Bytes of chunks the save found already stored and did not write again.
    pub bytes_reused: u64,
}

/// A small file's JSON as one line (refs, gc state, leases).
fn json_line(v: &impl Serialize) -> Vec<u8> {
    let mut out = serde_json::to_vec(v).unwrap_or_default();
    out.push(b'\n');
    out
}

impl RefRecord {
    /// Encode as one line of JSON.
    pub fn encode(&self) -> Vec<u8> {
        json_line(self)
    }

    /// Parse and check a ref: `tree` must be `trees/<64 hex>.json`, `root` 64 hex digits.
    ///
    /// # Errors
    /// What is wrong, for an error message.
    pub fn decode(bytes: &[u8]) -> Result<RefRecord, String> {
        let r: RefRecord = serde_json::from_slice(bytes).map_err(|e| format!("not a tree ref: {e}"))?;
        let hex = r.tree.strip_prefix("trees/").and_then(|t| t.strip_suffix(".json"));
        if hex.and_then(Hash32::from_hex).is_none() {
            return Err(format!("tree {:?} is not trees/<64 hex digits>.json", r.tree));
        }
        if Hash32::from_hex(&r.root).is_none() {
            return Err(format!("root {:?} is not 64 lowercase hex digits", r.root));
        }
        Ok(r)
    }

    /// The manifest's hash (its file name).
    pub fn tree_hash(&self) -> Option<Hash32> {
        Hash32::from_hex(self.tree.strip_prefix("trees/")?.strip_suffix(".json")?)
    }
}

/// The chunks stored in one pack: what a save may reuse without writing them again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackIndex {
    /// The pack, `packs/<stem>.tpp`.
    pub pack: String,
    /// Its size in bytes.
    pub size: u64,
    /// Each chunk: hash of its canonical bytes, offset, stored length, codec.
    pub chunks: Vec<(Hash32, u64, u64, Codec)>,
}

#[derive(Serialize, Deserialize)]
struct PackIndexJson {
    pack: String,
    size: u64,
    chunks: Vec<(String, u64, u64, String)>,
}

impl PackIndex {
    /// Encode as JSON: `{"pack":…,"size":…,"chunks":[["<hex>",offset,length,"codec"],…]}`.
    pub fn encode(&self) -> Vec<u8> {
        let j = PackIndexJson {
            pack: self.pack.clone(),
            size: self.size,
            chunks: self.chunks.iter().map(|(h, o, l, c)| (h.to_hex(), *o, *l, c.name().to_string())).collect(),
        };
        let mut v = serde_json::to_vec(&j).unwrap_or_default();
        v.push(b'\n');
        v
    }

    /// Parse and check an index: a valid pack path under `packs/`, known codecs, strict hashes,
    /// every chunk inside the pack.
    ///
    /// # Errors
    /// What is wrong, for an error message.
    pub fn decode(bytes: &[u8]) -> Result<PackIndex, String> {
        let j: PackIndexJson = serde_json::from_slice(bytes).map_err(|e| format!("not a pack index: {e}"))?;
        manifest::validate_pack_path(&j.pack)?;
        if index_path(&j.pack).is_none() {
            return Err(format!("pack {:?} is not packs/<name>.tpp", j.pack));
        }
        let mut chunks = Vec::with_capacity(j.chunks.len());
        for (i, (h, off, len, codec)) in j.chunks.into_iter().enumerate() {
            let hash = Hash32::from_hex(&h).ok_or_else(|| format!("chunk {i}: hash {h:?} is not 64 hex digits"))?;
            let codec = Codec::from_name(&codec).ok_or_else(|| format!("chunk {i}: unknown codec {codec:?}"))?;
            if off.checked_add(len).is_none_or(|end| end > j.size) {
                return Err(format!("chunk {i}: bytes {off}+{len} lie outside the pack's {} bytes", j.size));
            }
            chunks.push((hash, off, len, codec));
        }
        Ok(PackIndex { pack: j.pack, size: j.size, chunks })
    }
}

/// Packs and trees gc found unreferenced, with the time (ms since the epoch) it first did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcState {
    /// Relative path → when gc first found it unreferenced.
    pub condemned: BTreeMap<String, u64>,
}

impl GcState {
    /// Encode as JSON.
    pub fn encode(&self) -> Vec<u8> {
        json_line(self)
    }

    /// Parse a gc state; paths must be valid pack or tree paths.
    ///
    /// # Errors
    /// What is wrong, for an error message.
    pub fn decode(bytes: &[u8]) -> Result<GcState, String> {
        let s: GcState = serde_json::from_slice(bytes).map_err(|e| format!("not a gc state: {e}"))?;
        for p in s.condemned.keys() {
            manifest::validate_pack_path(p)?;
        }
        Ok(s)
    }
}

/// A save in progress: gc deletes nothing that this save may reuse while it lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// When the save started, ms since the epoch.
    pub started_ms: u64,
    /// The tree name it will commit.
    pub name: String,
    /// Who: host and process id, for people reading the folder.
    pub owner: String,
}

impl Lease {
    /// Encode as JSON.
    pub fn encode(&self) -> Vec<u8> {
        json_line(self)
    }

    /// Parse a lease.
    ///
    /// # Errors
    /// What is wrong, for an error message.
    pub fn decode(bytes: &[u8]) -> Result<Lease, String> {
        serde_json::from_slice(bytes).map_err(|e| format!("not a lease: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_one_safe_segment() {
        for ok in ["step-1000", "v1.2", "A_b", "0"] {
            assert!(validate_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", ".", "..", ".hidden", "a/b", "a b", "é", "a@b", &"x".repeat(129)] {
            assert!(validate_name(bad).is_err(), "{bad}");
        }
        assert_eq!(name_of_ref("refs/step-1.json"), Some("step-1"));
        assert_eq!(name_of_ref("refs/a/b.json"), None);
        assert_eq!(index_path("packs/abc-0.tpp").as_deref(), Some("index/abc-0.json"));
        assert_eq!(index_path("packs/x/abc-0.tpp"), None);
    }

    #[test]
    fn indexes_refuse_chunks_outside_their_pack_and_bad_fields() {
        let h = Hash32::of(b"x").to_hex();
        let ok = format!(r#"{{"pack":"packs/a-0.tpp","size":100,"chunks":[["{h}",64,36,"zstd"]]}}"#);
        let idx = PackIndex::decode(ok.as_bytes()).unwrap();
        assert_eq!(PackIndex::decode(&idx.encode()).unwrap(), idx);
        for bad in [
            format!(r#"{{"pack":"packs/a-0.tpp","size":100,"chunks":[["{h}",64,37,"raw"]]}}"#),
            format!(r#"{{"pack":"packs/a-0.tpp","size":100,"chunks":[["{h}",18446744073709551615,2,"raw"]]}}"#),
            r#"{"pack":"../a-0.tpp","size":100,"chunks":[]}"#.to_string(),
            format!(r#"{{"pack":"packs/a-0.tpp","size":100,"chunks":[["{h}",0,1,"gzip"]]}}"#),
            r#"{"pack":"packs/a-0.tpp","size":100,"chunks":[["XYZ",0,1,"raw"]]}"#.to_string(),
            "[]".to_string(),
        ] {
            assert!(PackIndex::decode(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn refs_name_a_tree_file_and_a_root() {
        let h = Hash32::of(b"m").to_hex();
        let r = RefRecord {
            tree: format!("trees/{h}.json"),
            root: h.clone(),
            saved_ms: 1,
            bytes_written: 2,
            bytes_reused: 3,
        };
        assert_eq!(RefRecord::decode(&r.encode()).unwrap(), r);
        let bad = RefRecord { tree: "trees/../../etc.json".into(), ..r.clone() };
        assert!(RefRecord::decode(&bad.encode()).is_err());
        let bad = RefRecord { root: "nope".into(), ..r };
        assert!(RefRecord::decode(&bad.encode()).is_err());
    }
}
