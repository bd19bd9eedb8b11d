//! The engine's layers (docs/architecture.md): the save pipeline (`src/save/`) and the readers
//! (`src/read/`) know nothing of repositories — a tree of a repository is resolved by the
//! naming layer (`src/location.rs`) for readers, and saved through the repository, which hands
//! the pipeline its dedup hook (`save::Reuse`), by the facade (`src/lib.rs`). So the repository
//! sits on top of both, and nothing below it names it.

#[path = "../../treepack-store/tests/support/sources.rs"]
mod support;

use std::path::PathBuf;

#[test]
fn save_and_read_name_no_repository() {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let files: Vec<PathBuf> = ["save", "read"].iter().flat_map(|layer| support::sources(&src.join(layer))).collect();
    assert!(files.len() >= 8, "the sources were not found: {files:?}");
    for f in &files {
        for (n, line) in std::fs::read_to_string(f).unwrap().lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            for bad in ["crate::repo", "Repository", "super::repo"] {
                assert!(!code.contains(bad), "{}:{}: names the repository (`{bad}`): {line}", f.display(), n + 1);
            }
        }
    }
}
