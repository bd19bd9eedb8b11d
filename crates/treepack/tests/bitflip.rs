//! Every single-bit flip of a stored tree is detected (the load fails with a typed error) or
//! provably harmless (the load returns the identical tree — e.g. a flip in padding between
//! chunks, which is never read). Exhaustive over every bit of a small single file, and of a
//! directory's manifest and pack.

use treepack::*;

fn tree() -> Node {
    let arr: Vec<u8> = (0..600u32).flat_map(|i| (i as f32 * 0.5).to_le_bytes()).collect();
    Node::dict([
        ("w", Node::from(ArrayData::new(DType::F32, vec![20, 30], arr).unwrap())),
        ("s", Node::from("a string long enough to live in a pack ".repeat(3))),
        ("n", Node::list([Node::from(7i64), Node::from(-0.0), Node::none(), Node::from(true)])),
    ])
}

fn opts() -> SaveOptions {
    SaveOptions { chunk_bytes: 700, inline_str_bytes: 16, ..Default::default() }
}

/// Flip every bit of `file` in turn; returns (detected, harmless). Each flip is written in place
/// (one byte at its offset, the file held open): rewriting the whole file each time made ext4
/// truncate and write it back, most of this test's time.
fn sweep(loc: &str, file: &std::path::Path, expect: &Node) -> (usize, usize) {
    use std::os::unix::fs::FileExt;
    let good = std::fs::read(file).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(file).unwrap();
    let (mut detected, mut harmless) = (0, 0);
    for (at, &byte) in good.iter().enumerate() {
        for bit in 0..8 {
            f.write_all_at(&[byte ^ (1 << bit)], at as u64).unwrap();
            match load(loc, &LoadOptions::default()) {
                Ok(t) => {
                    assert!(
                        t.exact_eq(expect),
                        "{}: flip of byte {at} bit {bit} changed the data silently",
                        file.display()
                    );
                    harmless += 1;
                }
                Err(_) => detected += 1,
            }
        }
        f.write_all_at(&[byte], at as u64).unwrap();
    }
    assert_eq!(std::fs::read(file).unwrap(), good, "the sweep leaves the file as it found it");
    (detected, harmless)
}

// Three tests, not one: libtest runs them side by side.

#[test]
fn every_bit_flip_of_a_single_file_is_detected_or_harmless() {
    let d = tempfile::tempdir().unwrap();
    let t = tree();
    let single = d.path().join("t.tpk");
    save(&t, single.to_str().unwrap(), &opts()).unwrap();
    let (det, harm) = sweep(single.to_str().unwrap(), &single, &t);
    eprintln!("single file: {} bits flipped, {det} detected, {harm} harmless", det + harm);
    assert!(det > 0 && det + harm == std::fs::metadata(&single).unwrap().len() as usize * 8);
}

/// The tree saved as a directory in a fresh temporary folder: (the folder, the directory, the tree).
fn saved_dir() -> (tempfile::TempDir, std::path::PathBuf, Node) {
    let d = tempfile::tempdir().unwrap();
    let t = tree();
    let dir = d.path().join("t");
    save(&t, dir.to_str().unwrap(), &opts()).unwrap();
    (d, dir, t)
}

#[test]
fn every_bit_flip_of_a_manifest_is_detected() {
    let (_d, dir, t) = saved_dir();
    let manifest = dir.join("treepack.json");
    let (det, harm) = sweep(dir.to_str().unwrap(), &manifest, &t);
    eprintln!("manifest: {det} detected, {harm} harmless");
    assert_eq!(harm, 0, "every manifest bit is covered by the manifest checksum");
    assert_eq!(det, std::fs::metadata(&manifest).unwrap().len() as usize * 8);
}

#[test]
fn every_bit_flip_of_a_pack_is_detected_or_harmless() {
    let (_d, dir, t) = saved_dir();
    let pack = std::fs::read_dir(dir.join("packs")).unwrap().next().unwrap().unwrap().path();
    let (det, harm) = sweep(dir.to_str().unwrap(), &pack, &t);
    eprintln!("pack: {det} detected, {harm} harmless (padding)");
    assert!(det > 0);
}
