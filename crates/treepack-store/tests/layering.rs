//! The rule of this crate (docs/architecture.md, docs/design.md decision 75): the store moves
//! bytes and knows nothing above that. It may not depend on the engine (`treepack`) or on what
//! reads documents (`serde_json`), and its code may not name the format's trees, manifests or
//! repositories — what a location string names beyond a place (`LOCATION@NAME`, a `.json`
//! transport document) is resolved in the engine, one layer up.

use std::path::{Path, PathBuf};

/// Crates the store may not depend on: the engine, and document parsers.
const FORBIDDEN_CRATES: [&str; 4] = ["treepack", "serde_json", "serde", "treepack_py"];

/// What the store's code may not name: the format's trees, manifests, repositories and documents.
const FORBIDDEN_CODE: [&str; 5] =
    ["treepack_format::manifest", "treepack_format::model", "treepack_format::repo", "transport", "serde_json"];

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn the_manifest_names_no_engine_and_no_document_parser() {
    let toml = std::fs::read_to_string(crate_dir().join("Cargo.toml")).unwrap();
    let mut section = String::new();
    let mut deps = vec![];
    for line in toml.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line.trim_matches(|c| c == '[' || c == ']').to_string();
            continue;
        }
        let deps_section = section == "dependencies"
            || section == "build-dependencies"
            || (section.starts_with("target.") && section.ends_with(".dependencies"));
        if deps_section && !line.is_empty() && !line.starts_with('#') {
            if let Some((name, _)) = line.split_once('=') {
                deps.push(name.trim().trim_matches('"').replace('-', "_"));
            }
        }
    }
    assert!(deps.contains(&"object_store".to_string()), "the dependencies were not found: {deps:?}");
    for d in &deps {
        assert!(!FORBIDDEN_CRATES.contains(&d.as_str()), "treepack-store must not depend on `{d}`");
    }
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn the_code_names_no_tree_manifest_repository_or_document() {
    let mut files = vec![];
    sources(&crate_dir().join("src"), &mut files);
    assert!(files.len() >= 10, "the sources were not found: {files:?}");
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            for bad in FORBIDDEN_CODE {
                assert!(!code.contains(bad), "{}:{}: the store names `{bad}`: {line}", f.display(), n + 1);
            }
        }
    }
}
