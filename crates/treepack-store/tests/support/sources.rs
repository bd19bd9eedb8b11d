//! Shared by the layering tests of the store and the engine (`#[path]`-included).

use std::path::{Path, PathBuf};

/// Every `.rs` file below `dir`.
pub fn sources(dir: &Path) -> Vec<PathBuf> {
    let (mut out, mut todo) = (vec![], vec![dir.to_path_buf()]);
    while let Some(d) = todo.pop() {
        for p in std::fs::read_dir(d).unwrap().map(|e| e.unwrap().path()) {
            if p.is_dir() {
                todo.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out
}
