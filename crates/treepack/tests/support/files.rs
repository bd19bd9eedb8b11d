//! File helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// Every file under `p`, recursively (a directory tree's manifest and packs).
pub fn walk(p: &Path) -> Vec<PathBuf> {
    let mut v = vec![];
    for e in std::fs::read_dir(p).unwrap() {
        let e = e.unwrap().path();
        if e.is_dir() {
            v.extend(walk(&e));
        } else {
            v.push(e);
        }
    }
    v
}
