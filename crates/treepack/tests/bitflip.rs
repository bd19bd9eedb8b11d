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

/// Flip every bit of `file` in turn; returns (detected, harmless).
fn sweep(loc: &str, file: &std::path::Path, expect: &Node) -> (usize, usize) {
    let good = std::fs::read(file).unwrap();
    let (mut detected, mut harmless) = (0, 0);
    let mut buf = good.clone();
    for byte in 0..good.len() {
        for bit in 0..8 {
            buf[byte] = good[byte] ^ (1 << bit);
            std::fs::write(file, &buf).unwrap();
            match load(loc, &LoadOptions::default()) {
                Ok(t) => {
                    assert!(
                        t.exact_eq(expect),
                        "{}: flip of byte {byte} bit {bit} changed the data silently",
                        file.display()
                    );
                    harmless += 1;
                }
                Err(_) => detected += 1,
            }
        }
        buf[byte] = good[byte];
    }
    std::fs::write(file, &good).unwrap();
    (detected, harmless)
}

#[test]
fn every_bit_flip_is_detected_or_harmless() {
    let d = tempfile::tempdir().unwrap();
    let t = tree();

    let single = d.path().join("t.tpk");
    save(&t, single.to_str().unwrap(), &opts()).unwrap();
    let (det, harm) = sweep(single.to_str().unwrap(), &single, &t);
    eprintln!("single file: {} bits flipped, {det} detected, {harm} harmless", det + harm);
    assert!(det > 0 && det + harm == std::fs::metadata(&single).unwrap().len() as usize * 8);

    let dir = d.path().join("t");
    save(&t, dir.to_str().unwrap(), &opts()).unwrap();
    let manifest = dir.join("treepack.json");
    let (det, harm) = sweep(dir.to_str().unwrap(), &manifest, &t);
    eprintln!("manifest: {det} detected, {harm} harmless");
    assert_eq!(harm, 0, "every manifest bit is covered by the manifest checksum");
    let pack = std::fs::read_dir(dir.join("packs")).unwrap().next().unwrap().unwrap().path();
    let (det, harm) = sweep(dir.to_str().unwrap(), &pack, &t);
    eprintln!("pack: {det} detected, {harm} harmless (padding)");
    assert!(det > 0);
}
