//! The load-path policy (`read::one_pass`): which path a whole load takes, and that both give
//! the same tree and the same errors.

use treepack::read::one_pass::{
    load_one_pass, NodeBuild, ONE_PASS_DECODE_BYTES, ONE_PASS_FETCHES, ONE_PASS_PACK_BYTES,
};
use treepack::*;

fn blob(i: u8) -> Node {
    Tree::Leaf(Leaf::Bytes(bytes::Bytes::from(vec![i; 5000])))
}

/// `load_one_pass` of the tree at `p` with the owned-node builder.
fn one_pass(p: &str) -> Option<Node> {
    let loc = p.into_location().unwrap().pin().unwrap();
    let (bytes, file) = loc.block_on(read::manifest_bytes(&loc)).unwrap();
    load_one_pass(&loc, &bytes, &file, &NodeBuild { file: &file }, true)
}

#[test]
fn small_trees_load_in_one_pass_and_others_through_the_reader_alike() {
    let dir = tempfile::tempdir().unwrap();
    let few = Node::dict(
        (0..ONE_PASS_FETCHES as u8).map(|i| (format!("b{i}"), blob(i))).chain([("n".into(), Node::from(7i64))]),
    );
    // Past ONE_PASS_FETCHES distinct leaves the small packs are read whole (a dataset of images).
    let many = Node::list((0..=4 * ONE_PASS_FETCHES as u8).map(blob));
    // One blob shared by 10k records is read once: one distinct stored leaf.
    let shared = Node::list((0..10_000).map(|i| Node::dict([("i", Node::from(i as i64)), ("b", blob(1))])));
    // Packs bigger than ONE_PASS_PACK_BYTES in all: the Reader reads them in parallel batches.
    let big = Node::dict([
        ("n", Node::from(1i64)),
        ("b", Tree::Leaf(Leaf::Bytes(bytes::Bytes::from(vec![3u8; ONE_PASS_PACK_BYTES as usize + 1])))),
    ]);
    for name in ["d", "f.tpk"] {
        for (tag, tree, pass) in
            [("few", &few, true), ("many", &many, true), ("shared", &shared, true), ("big", &big, false)]
        {
            let p = dir.path().join(format!("{tag}-{name}"));
            let p = p.to_str().unwrap();
            save(tree, p, &SaveOptions::default()).unwrap();
            let got = one_pass(p);
            assert_eq!(got.is_some(), pass, "{tag} {name}");
            if let Some(got) = got {
                assert!(got.exact_eq(tree), "{tag} {name}");
            }
            let loaded = load(p, &LoadOptions::default()).unwrap();
            assert!(loaded.exact_eq(tree), "{tag} {name}");
            assert!(open(p).unwrap().load(&LoadOptions::default()).unwrap().exact_eq(tree), "{tag} {name}");
        }
    }
}

/// The first chunk of the stored leaf at `path`.
fn chunk(p: &str, path: &str) -> format::manifest::ChunkRef {
    match open(p).unwrap().entry(path).unwrap() {
        Tree::Leaf(e) => e.chunks()[0].clone(),
        _ => panic!("`{path}` is not a leaf"),
    }
}

#[test]
fn small_compressed_trees_are_decoded_in_the_one_pass_and_bigger_ones_by_the_reader() {
    let dir = tempfile::tempdir().unwrap();
    let zstd =
        SaveOptions { compression: save::Compression::parse(r#"[{"codec": "zstd"}]"#).unwrap(), ..Default::default() };
    // Raw leaves (random bytes stay raw under zstd) before compressed ones: before, the pass
    // read the raw ones, then gave up at the first compressed leaf, and the Reader read them again.
    let noise = |seed: u64| {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        Tree::Leaf(Leaf::Bytes(bytes::Bytes::from(
            (0..5000)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect::<Vec<u8>>(),
        )))
    };
    let small = Node::dict([("n", Node::from(1i64)), ("r", noise(1)), ("s", noise(2)), ("b", blob(4)), ("c", blob(5))]);
    // Compressed leaves decoding to more than ONE_PASS_DECODE_BYTES (from a few KiB of packs).
    let half = (ONE_PASS_DECODE_BYTES / 2 + 1) as usize;
    let big = Node::dict([
        ("r", noise(3)),
        ("z1", Tree::Leaf(Leaf::Bytes(bytes::Bytes::from(vec![0u8; half])))),
        ("z2", Tree::Leaf(Leaf::Bytes(bytes::Bytes::from(vec![1u8; half])))),
    ]);
    for (tag, tree, pass) in [("small", &small, true), ("big", &big, false)] {
        for name in ["d", "f.tpk"] {
            let p = dir.path().join(format!("{tag}-{name}"));
            let p = p.to_str().unwrap();
            save(tree, p, &zstd).unwrap();
            let last = if tag == "small" { "c" } else { "z2" };
            assert!(!chunk(p, last).codec.is_identity(), "{tag} {name}: `{last}` is compressed");
            assert!(chunk(p, "r").codec.is_identity(), "{tag} {name}: `r` is stored raw");
            let got = one_pass(p);
            assert_eq!(got.is_some(), pass, "{tag} {name}");
            if let Some(got) = got {
                assert!(got.exact_eq(tree), "{tag} {name}");
            }
            assert!(load(p, &LoadOptions::default()).unwrap().exact_eq(tree), "{tag} {name}");
        }
    }
    // A damaged compressed chunk: the pass gives up, the load names the leaf.
    let p = dir.path().join("small-d");
    let pack = std::fs::read_dir(p.join("packs")).unwrap().next().unwrap().unwrap().path();
    let c = chunk(p.to_str().unwrap(), "b");
    let mut bytes = std::fs::read(&pack).unwrap();
    bytes[(c.offset + c.length / 2) as usize] ^= 0xff;
    std::fs::write(&pack, &bytes).unwrap();
    assert!(one_pass(p.to_str().unwrap()).is_none());
    let e = load(p.to_str().unwrap(), &LoadOptions::default()).unwrap_err();
    assert!(e.to_string().contains("`b`") || matches!(&e, Error::ChunkCorrupt { key, .. } if key == "b"), "{e}");
}

#[test]
fn a_damaged_stored_leaf_stops_the_one_pass_and_load_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let tree = Node::dict([("a", Node::from(1i64)), ("b", blob(3))]);
    let p = dir.path().join("t.tpk");
    save(&tree, p.to_str().unwrap(), &SaveOptions::default()).unwrap();
    // Flip a byte of the blob (the 5000 bytes of 3 right after the header).
    let mut bytes = std::fs::read(&p).unwrap();
    let at = bytes.windows(64).position(|w| w.iter().all(|&b| b == 3)).unwrap();
    bytes[at + 10] ^= 0xff;
    std::fs::write(&p, &bytes).unwrap();
    let p = p.to_str().unwrap();
    assert!(one_pass(p).is_none());
    let e = load(p, &LoadOptions::default()).unwrap_err();
    assert!(matches!(&e, Error::ChunkCorrupt { key, .. } if key == "b"), "{e}");
    // Not verified: the one pass reads it as stored.
    let loc = p.into_location().unwrap().pin().unwrap();
    let (m, file) = loc.block_on(read::manifest_bytes(&loc)).unwrap();
    let got = load_one_pass(&loc, &m, &file, &NodeBuild { file: &file }, false).unwrap();
    assert!(!got.exact_eq(&tree));
}

#[test]
fn leaves_taken_from_packs_read_whole_are_verified_and_a_short_pack_goes_to_the_reader() {
    let dir = tempfile::tempdir().unwrap();
    let n = 3 * ONE_PASS_FETCHES as u8;
    let tree = Node::list((0..n).map(blob));
    for name in ["d", "f.tpk"] {
        let p = dir.path().join(name);
        let ps = p.to_str().unwrap();
        save(&tree, ps, &SaveOptions::default()).unwrap();
        let pack = if name == "d" {
            std::fs::read_dir(p.join("packs")).unwrap().next().unwrap().unwrap().path()
        } else {
            p.clone()
        };
        let good = std::fs::read(&pack).unwrap();
        // A leaf past the first ONE_PASS_FETCHES (so taken from the whole pack) damaged.
        let mut bytes = good.clone();
        let at = bytes.windows(64).position(|w| w.iter().all(|&b| b == n - 2)).unwrap();
        bytes[at + 10] ^= 0xff;
        std::fs::write(&pack, &bytes).unwrap();
        assert!(one_pass(ps).is_none(), "{name}");
        let e = load(ps, &LoadOptions::default()).unwrap_err();
        let want = format!("{}", n - 2);
        assert!(matches!(&e, Error::ChunkCorrupt { key, .. } if *key == want), "{name}: {e}");
        // A pack cut short (the directory's; the single file's end holds its manifest).
        if name == "d" {
            std::fs::write(&pack, &good[..good.len() - 100]).unwrap();
            assert!(one_pass(ps).is_none());
            let e = load(ps, &LoadOptions::default()).unwrap_err();
            assert!(e.to_string().contains(&pack.file_name().unwrap().to_string_lossy().to_string()), "{e}");
        }
    }
}
