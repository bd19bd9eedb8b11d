//! The engine's layers (docs/architecture.md): the save pipeline (`src/save/`) and the readers
//! (`src/read/`) know nothing of repositories — a tree of a repository is resolved by the
//! naming layer (`src/location.rs`) for readers, and saved through the repository, which hands
//! the pipeline its dedup hook (`save::Reuse`), by the facade (`src/lib.rs`). So the repository
//! sits on top of both, and nothing below it names it.

use std::path::{Path, PathBuf};

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
fn save_and_read_name_no_repository() {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = vec![];
    for layer in ["save", "read"] {
        sources(&src.join(layer), &mut files);
    }
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
