//! Golden files: the demo tree saved with fixed options must produce exactly the committed bytes,
//! and the committed files must load to the demo tree. A format change therefore shows up as a
//! failing test; regenerate deliberately with `TREEPACK_BLESS=1 cargo test --test golden`.

use std::path::{Path, PathBuf};
use treepack::format::*;
use treepack::*;

#[path = "support/files.rs"]
mod files;

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden")
}

fn options() -> SaveOptions {
    SaveOptions {
        writer: "treepack-golden".into(),
        metadata: Some(serde_json::json!({"purpose": "golden file for docs/format.md"})),
        chunk_bytes: 64 << 10,
        ..Default::default()
    }
}

/// All files of a location, relative path → bytes.
fn files(root: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = vec![];
    if root.is_file() {
        out.push((String::new(), std::fs::read(root).unwrap()));
        return out;
    }
    for e in files::walk(root) {
        let rel = e.strip_prefix(root).unwrap().to_string_lossy().into_owned();
        out.push((rel, std::fs::read(&e).unwrap()));
    }
    out.sort();
    out
}

fn hashes_text() -> String {
    let mut s = String::new();
    for name in ["demo", "demo.tpk"] {
        for (rel, bytes) in files(&golden_dir().join(name)) {
            let path = if rel.is_empty() { name.to_string() } else { format!("{name}/{rel}") };
            s.push_str(&format!("{}  {}\n", hash::Hash32::of(&bytes).to_hex(), path));
        }
    }
    s
}

#[test]
fn golden_files_are_reproduced_byte_for_byte() {
    let tree = demo::example_tree();
    let tmp = tempfile::tempdir().unwrap();
    if std::env::var_os("TREEPACK_BLESS").is_some() {
        let g = golden_dir();
        let _ = std::fs::remove_dir_all(g.join("demo"));
        let _ = std::fs::remove_file(g.join("demo.tpk"));
        std::fs::create_dir_all(&g).unwrap();
        save(&tree, g.join("demo").to_str().unwrap(), &options()).unwrap();
        save(&tree, g.join("demo.tpk").to_str().unwrap(), &options()).unwrap();
        std::fs::write(g.join("BLAKE3SUMS"), hashes_text()).unwrap();
    }
    for name in ["demo", "demo.tpk"] {
        let fresh = tmp.path().join(name);
        save(&tree, fresh.to_str().unwrap(), &options()).unwrap();
        let committed = files(&golden_dir().join(name));
        assert!(!committed.is_empty(), "golden files missing; run with TREEPACK_BLESS=1");
        let produced = files(&fresh);
        assert_eq!(committed.len(), produced.len(), "{name}: file count changed");
        for ((ra, a), (rb, b)) in committed.iter().zip(&produced) {
            assert_eq!(ra, rb, "{name}: file names changed");
            assert!(
                a == b,
                "{name}/{ra}: bytes changed — the format changed; if deliberate, bump docs/format.md and re-bless"
            );
        }
    }
    let listed = std::fs::read_to_string(golden_dir().join("BLAKE3SUMS")).unwrap();
    assert_eq!(listed, hashes_text(), "BLAKE3SUMS does not match the golden files");
}

#[test]
fn golden_files_load_to_the_demo_tree() {
    let tree = demo::example_tree();
    for name in ["demo", "demo.tpk"] {
        let p = golden_dir().join(name);
        let back = load(p.to_str().unwrap(), &LoadOptions::default()).unwrap();
        assert!(back.exact_eq(&tree), "{name}");
        assert!(open(p.to_str().unwrap()).unwrap().verify().unwrap().ok());
    }
}
