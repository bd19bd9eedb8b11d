//! The rule of this crate (docs/architecture.md, docs/design.md decision 75): the store moves
//! bytes and knows nothing above that. It may not depend on the engine (`treepack`) or on what
//! reads documents (`serde_json`), and its code may not name the format's trees, manifests or
//! repositories — what a location string names beyond a place (`LOCATION@NAME`, a `.json`
//! transport document) is resolved in the engine, one layer up.

#[path = "support/sources.rs"]
mod support;

use std::path::PathBuf;
use support::sources;

/// Crates the store may not depend on: the engine, and document parsers.
const FORBIDDEN_CRATES: [&str; 4] = ["treepack", "serde_json", "serde", "treepack_py"];

/// What the store's code may not name: the format's trees, manifests, repositories and documents.
const FORBIDDEN_CODE: [&str; 5] =
    ["treepack_format::manifest", "treepack_format::model", "treepack_format::repo", "transport", "serde_json"];

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The crates a manifest's dependency tables name (normal, build and target ones; the
/// tests' dev-dependencies are theirs), `-` written `_`.
fn dependencies(toml: &str) -> Vec<String> {
    let is_deps = |table: &str| {
        table == "dependencies"
            || table == "build-dependencies"
            || (table.starts_with("target.") && table.ends_with(".dependencies"))
    };
    toml.split("\n[")
        .filter_map(|t| t.split_once(']'))
        .filter(|(table, _)| is_deps(table))
        .flat_map(|(_, body)| body.lines().map(str::trim).filter(|l| !l.starts_with('#')))
        .filter_map(|l| l.split_once('=').map(|(name, _)| name.trim().trim_matches('"').replace('-', "_")))
        .collect()
}

#[test]
fn the_manifest_names_no_engine_and_no_document_parser() {
    let deps = dependencies(&std::fs::read_to_string(crate_dir().join("Cargo.toml")).unwrap());
    assert!(deps.contains(&"object_store".to_string()), "the dependencies were not found: {deps:?}");
    for d in &deps {
        assert!(!FORBIDDEN_CRATES.contains(&d.as_str()), "treepack-store must not depend on `{d}`");
    }
}

#[test]
fn the_code_names_no_tree_manifest_repository_or_document() {
    let files = sources(&crate_dir().join("src"));
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
