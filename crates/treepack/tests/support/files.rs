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

/// A place named `name` in a fresh folder: the folder (removed when dropped) and the place's
/// path as the location string the API takes.
pub fn temp_place(name: &str) -> (tempfile::TempDir, String) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join(name).to_str().unwrap().to_string();
    (d, p)
}
