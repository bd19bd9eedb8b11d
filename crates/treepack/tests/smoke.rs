use treepack::*;

fn f32s(v: &[f32], shape: Vec<u64>) -> ArrayData {
    ArrayData::new(DType::F32, shape, v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()).unwrap()
}

#[test]
fn smoke_round_trip_both_layouts() {
    let dir = tempfile::tempdir().unwrap();
    let big: Vec<f32> = (0..300_000).map(|i| i as f32).collect();
    let tree = Node::dict([
        ("w", Node::from(f32s(&big, vec![1000, 300]))),
        ("s", Node::from("hello")),
        ("n", Node::list([Node::from(1i64), Node::from(f64::NAN), Node::none()])),
        ("long", Node::from("x".repeat(10_000))),
    ]);
    for name in ["d", "f.tpk"] {
        let p = dir.path().join(name);
        let p = p.to_str().unwrap();
        let opts = SaveOptions { chunk_bytes: 100_000, ..Default::default() };
        let info = save(&tree, p, &opts).unwrap();
        assert!(info.chunks > 1);
        let back = load(p, &LoadOptions::default()).unwrap();
        assert!(back.exact_eq(&tree), "{name}");
        let r = open(p).unwrap();
        let a = r.read_array("w", "5, 10:13").unwrap();
        assert_eq!(a.bytes().as_ref(), f32s(&[1510.0, 1511.0, 1512.0], vec![3]).bytes().as_ref());
        assert!(r.verify().unwrap().ok());
        assert!(matches!(save(&tree, p, &opts), Err(Error::AlreadyExists { .. })));
        let m = load(p, &LoadOptions { mmap: true, ..Default::default() }).unwrap();
        assert!(m.exact_eq(&tree));
    }
}

/// The runtime-free manifest read of local trees gives the bytes the async read gives, for
/// manifests inside and beyond a single file's tail read, and the same leaves on the spot;
/// missing trees and damaged footers are errors, not panics.
#[test]
fn local_reads_without_the_runtime_equal_the_async_reads() {
    let dir = tempfile::tempdir().unwrap();
    let blob = Tree::Leaf(Leaf::Bytes(bytes::Bytes::from(vec![7u8; 5000])));
    let small = Node::dict([("a", Node::from(1i64)), ("b", blob.clone())]);
    let big = Node::list((0..5000).map(|i| Node::dict([("i", Node::from(i as i64)), ("b", blob.clone())])));
    for (tag, tree) in [("small", &small), ("big", &big)] {
        for name in ["d", "f.tpk"] {
            let p = dir.path().join(format!("{tag}-{name}"));
            let p = p.to_str().unwrap();
            save(tree, p, &SaveOptions::default()).unwrap();
            let loc = p.into_location().unwrap().pin().unwrap();
            let (a, fa) = read::manifest_bytes_local(&loc).expect("a local tree").unwrap();
            let (b, fb) = block_on(read::manifest_bytes(&loc)).unwrap();
            assert_eq!((a.as_ref(), &fa), (b.as_ref(), &fb), "{tag} {name}");
            let r = open(p).unwrap();
            let sync = r.fetch_stored_leaves_local(&LoadOptions::default()).expect("a local tree").unwrap();
            let asy = block_on(r.fetch_stored_leaves_async(&LoadOptions::default())).unwrap();
            assert_eq!(sync.len(), asy.len());
            assert!(sync.iter().zip(&asy).all(|(x, y)| x.0 == y.0 && x.1.exact_eq(&y.1)), "{tag} {name}");
        }
    }
    let missing = dir.path().join("nothing-here");
    let loc = missing.to_str().unwrap().into_location().unwrap();
    assert!(matches!(read::manifest_bytes_local(&loc), Some(Err(Error::NotFound { .. }))));
    let cut = dir.path().join("small-f.tpk");
    let len = std::fs::metadata(&cut).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&cut).unwrap().set_len(len - 3).unwrap();
    let loc = cut.to_str().unwrap().into_location().unwrap().pin().unwrap();
    assert!(matches!(read::manifest_bytes_local(&loc), Some(Err(_))));
}
