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
