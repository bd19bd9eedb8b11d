//! `treepack::diff`: what differs between two stored trees, from their manifests alone.

use treepack::*;

fn arr(n: u64, seed: u8) -> Node {
    let data: Vec<u8> = (0..n * 4).map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed)).collect();
    Node::from(ArrayData::new(DType::F32, vec![n], data).unwrap())
}

#[test]
fn diff_names_paths_values_shapes_and_changed_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let a = Node::dict([
        ("w", arr(1 << 20, 0)),
        ("lr", Node::from(0.001f64)),
        ("name", Node::from("run-1")),
        ("old", Node::list([Node::from(1i64)])),
        ("shape", arr(10, 0)),
    ]);
    // One 4 MiB-chunk's worth changed in w (chunks of 256 Ki elements), a value, a string, one
    // key removed, one added, one array reshaped.
    let mut w: Vec<u8> = (0..4u64 << 20).map(|i| (i as u8).wrapping_mul(7)).collect();
    w[(3 << 20) + 5] ^= 1;
    let b = Node::dict([
        ("w", Node::from(ArrayData::new(DType::F32, vec![1 << 20], w).unwrap())),
        ("lr", Node::from(0.0005f64)),
        ("name", Node::from("run-1")),
        ("shape", arr(12, 0)),
        ("new", Node::from(true)),
    ]);
    let opts = SaveOptions { chunk_bytes: 1 << 20, ..Default::default() };
    let (pa, pb) = (dir.path().join("a"), dir.path().join("b.tpk"));
    save(&a, pa.to_str().unwrap(), &opts).unwrap();
    save(&b, pb.to_str().unwrap(), &opts).unwrap();
    let d = diff(pa.to_str().unwrap(), pb.to_str().unwrap()).unwrap();
    let lines: Vec<String> = d.iter().map(|x| x.line()).collect();
    assert_eq!(
        lines,
        [
            "~ w: float32[1048576]: 1 of 4 chunks differ",
            "~ lr: 0.001 -> 0.0005",
            "- old: list (1 items)",
            "~ shape: float32[10] -> float32[12]",
            "+ new: true",
        ],
        "{lines:#?}"
    );
    // Identical trees (another layout, another codec): nothing.
    let c = dir.path().join("c.tpk");
    save(
        &a,
        c.to_str().unwrap(),
        &SaveOptions { compression: save::Compression::parse("zstd").unwrap(), ..opts.clone() },
    )
    .unwrap();
    assert!(diff(pa.to_str().unwrap(), c.to_str().unwrap()).unwrap().is_empty());
    assert_eq!(d[0].to_json()["chunks_differ"], 1);
}

#[test]
fn diff_reads_no_array_data() {
    let dir = tempfile::tempdir().unwrap();
    let (pa, pb) = (dir.path().join("a"), dir.path().join("b"));
    save(&Node::dict([("w", arr(1 << 22, 0))]), pa.to_str().unwrap(), &SaveOptions::default()).unwrap();
    save(&Node::dict([("w", arr(1 << 22, 1))]), pb.to_str().unwrap(), &SaveOptions::default()).unwrap();
    let (la, lb) = (Location::parse(pa.to_str().unwrap()).unwrap(), Location::parse(pb.to_str().unwrap()).unwrap());
    let d = diff(&la, &lb).unwrap();
    assert_eq!(d.len(), 1);
    let read = la.stats().bytes_read() + lb.stats().bytes_read();
    assert!(read < 64 << 10, "only the manifests are read: {read} bytes");
}
