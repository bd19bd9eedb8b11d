//! Partial and lazy reads touch only the bytes they need, counted through the location's
//! instrumented I/O statistics.

use treepack::format::manifest::{ArrayStorage, Entry};
use treepack::format::*;
use treepack::*;

fn f32_array(rows: u64, cols: u64, seed: f32) -> ArrayData {
    let v: Vec<u8> = (0..rows * cols).flat_map(|i| (i as f32 + seed).to_le_bytes()).collect();
    ArrayData::new(DType::F32, vec![rows, cols], v).unwrap()
}

fn tree() -> Node {
    Node::dict([
        ("a", Node::from(f32_array(256, 1024, 0.0))), // 1 MiB
        ("b", Node::from(f32_array(256, 1024, 0.5))), // 1 MiB
        ("meta", Node::dict([("name", Node::from("x".repeat(10_000))), ("step", Node::from(7i64))])),
    ])
}

fn chunk_bytes_of(r: &Reader, key: &str, ids: Option<&[u64]>) -> u64 {
    match r.entry(key).unwrap() {
        Tree::Leaf(Entry::Array(a)) => match &a.storage {
            ArrayStorage::Chunked { chunks, .. } => match ids {
                None => chunks.iter().map(|c| c.length).sum(),
                Some(ids) => ids.iter().map(|&i| chunks[i as usize].length).sum(),
            },
            ArrayStorage::Inline(_) => 0,
        },
        Tree::Leaf(e) => e.chunks().iter().map(|c| c.length).sum(),
        _ => panic!("not a leaf"),
    }
}

fn check_layout(path: &str) {
    let opts = SaveOptions { chunk_bytes: 64 << 10, ..Default::default() };
    save(&tree(), path, &opts).unwrap();
    let loc = Location::parse(path).unwrap();
    let r = Reader::open(loc.clone()).unwrap();
    // Structure only: one request.
    assert_eq!(loc.stats().read_requests(), 1, "{path}: opening reads the manifest with one request");
    let manifest_read = loc.stats().bytes_read();
    assert!(manifest_read < 70_000, "{path}: structure read {manifest_read} bytes");

    // One selected leaf: exactly its chunks.
    loc.stats().reset();
    let sel = LoadOptions { select: vec!["a".into()], ..Default::default() };
    let got = r.load(&sel).unwrap();
    let a_bytes = chunk_bytes_of(&r, "a", None);
    assert_eq!(a_bytes, 1 << 20);
    assert_eq!(loc.stats().bytes_read(), a_bytes, "{path}: selecting `a` must read only a's chunks");
    assert!(keypath::resolve(&got, "b").unwrap().exact_eq(&Node::none()));
    assert!(keypath::resolve(&got, "meta/step").unwrap().exact_eq(&Node::none()));
    assert_eq!(keypath::resolve(&got, "a").unwrap().as_array().unwrap(), &f32_array(256, 1024, 0.0));

    // A glob over an inline scalar reads nothing from packs.
    loc.stats().reset();
    let got = r.load(&LoadOptions { select: vec!["meta/st*".into()], ..Default::default() }).unwrap();
    assert_eq!(loc.stats().bytes_read(), 0);
    assert!(keypath::resolve(&got, "meta/step").unwrap().exact_eq(&Node::from(7i64)));

    // A 1% slice of `b` reads only the chunks that intersect it.
    loc.stats().reset();
    let s = r.read_array("b", "10:12, 100:110").unwrap();
    assert_eq!(s.shape(), &[2, 10]);
    let e = r.entry("b").unwrap();
    let Tree::Leaf(Entry::Array(ae)) = e else { panic!() };
    let grid = ae.grid();
    let sel = treepack::format::grid::normalize(
        &treepack::format::grid::parse_slice("10:12, 100:110").unwrap(),
        &ae.shape,
        "",
    )
    .unwrap();
    let ids = grid.chunks_for(&sel);
    assert_eq!(ids.len(), 1);
    assert_eq!(loc.stats().bytes_read(), chunk_bytes_of(&r, "b", Some(&ids)));
    assert!(loc.stats().bytes_read() <= (64 << 10));
    let want: Vec<u8> = (10..12u64)
        .flat_map(|row| (100..110u64).map(move |c| (row * 1024 + c) as f32 + 0.5))
        .flat_map(|v| v.to_le_bytes())
        .collect();
    assert_eq!(s.bytes().as_ref(), &want[..]);

    // Subtree get reads only that subtree's blobs.
    loc.stats().reset();
    let meta = r.get("meta").unwrap();
    assert_eq!(loc.stats().bytes_read(), 10_000);
    assert!(keypath::resolve(&meta, "name").unwrap().exact_eq(&Node::from("x".repeat(10_000))));
}

#[test]
fn directory_partial_reads_touch_only_needed_bytes() {
    let d = tempfile::tempdir().unwrap();
    check_layout(d.path().join("ckpt").to_str().unwrap());
}

#[test]
fn single_file_partial_reads_touch_only_needed_bytes() {
    let d = tempfile::tempdir().unwrap();
    check_layout(d.path().join("ckpt.tpk").to_str().unwrap());
}

#[test]
fn memory_store_partial_reads_touch_only_needed_bytes() {
    check_layout("memory://partial/ckpt");
    check_layout("memory://partial/ckpt.tpk");
}

#[test]
fn single_file_with_large_manifest_needs_two_requests() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("many.tpk");
    let p = p.to_str().unwrap();
    let t =
        Node::list((0..20_000i64).map(|i| Node::dict([("i", Node::from(i)), ("s", Node::from(format!("item {i}")))])));
    save(&t, p, &SaveOptions::default()).unwrap();
    let loc = Location::parse(p).unwrap();
    let r = Reader::open(loc.clone()).unwrap();
    assert_eq!(loc.stats().read_requests(), 2);
    assert_eq!(r.structure().unwrap().leaf_count(), 40_000);
}

#[test]
fn mmap_returns_views_of_the_file() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("m.tpk");
    let p = p.to_str().unwrap();
    save(&tree(), p, &SaveOptions { chunk_bytes: 64 << 10, ..Default::default() }).unwrap();
    let loc = Location::parse(p).unwrap();
    let r = Reader::open(loc.clone()).unwrap();
    loc.stats().reset();
    let t = r.load(&LoadOptions { mmap: true, verify: false, ..Default::default() }).unwrap();
    // No read requests: bytes come from the mapping, and multi-chunk arrays are one view.
    assert_eq!(loc.stats().read_requests(), 0);
    let a = keypath::resolve(&t, "a").unwrap().as_array().unwrap();
    assert_eq!(a, &f32_array(256, 1024, 0.0));
    assert_eq!(a.bytes().as_ptr() as usize % 64, 0, "mmap views are 64-byte aligned");
}

/// Save `t` at `path` in chunks of 64 KiB, with these chunk shapes and this compression.
fn save_in_64k_chunks(t: &Node, path: &std::path::Path, chunk_shapes: Vec<(String, Vec<u64>)>, compression: &str) {
    let opts = SaveOptions {
        chunk_bytes: 64 << 10,
        chunk_shapes,
        compression: save::Compression::parse(compression).unwrap(),
        ..Default::default()
    };
    save(t, path.to_str().unwrap(), &opts).unwrap();
}

/// `read_into` fills caller memory with an array's canonical bytes (what in-place torch loads
/// use), for contiguous chunks, chunks that are not runs of the array, compressed chunks and
/// inline arrays; a destination of the wrong size is refused before anything is read.
#[test]
fn read_into_fills_caller_memory_exactly() {
    let dir = tempfile::tempdir().unwrap();
    for (name, chunk_shapes, compression) in [
        ("runs", vec![], "none"),
        ("tiles", vec![("**".to_string(), vec![100, 300])], "none"),
        ("zstd", vec![], "zstd"),
    ] {
        let path = dir.path().join(name);
        let t = Node::dict([("a", Node::from(f32_array(256, 1024, 0.25))), ("s", Node::from(f32_array(2, 3, 1.0)))]);
        save_in_64k_chunks(&t, &path, chunk_shapes, compression);
        let r = open(path.to_str().unwrap()).unwrap();
        for key in ["a", "s"] {
            let want = keypath::resolve(&t, key).unwrap().as_array().unwrap().bytes().clone();
            let mut out = vec![0u8; want.len()];
            r.read_into(key, &mut out).unwrap();
            assert!(out == want.as_ref(), "{name}/{key}");
        }
        // Row pieces of `a` into a reused buffer (a device load's staging): what those rows hold,
        // pieces cutting through chunks or not; a buffer of the wrong size is refused.
        let whole = keypath::resolve(&t, "a").unwrap().as_array().unwrap().bytes().clone();
        let mut buf = vec![0u8; 100 * 1024 * 4];
        for (lo, hi) in [(0usize, 100usize), (100, 200), (200, 256), (7, 9)] {
            let piece = &mut buf[..(hi - lo) * 4096];
            r.location().block_on(r.read_slice_into_async("a", &format!("{lo}:{hi}"), piece, true)).unwrap();
            assert!(piece == &whole[lo * 4096..hi * 4096], "{name} rows {lo}:{hi}");
        }
        let e = r.location().block_on(r.read_slice_into_async("a", "0:3", &mut buf[..100], true)).unwrap_err();
        assert!(e.to_string().contains("the destination has 100 bytes but [0:3] of the stored float32 array"), "{e}");
        let mut short = vec![0u8; 10];
        let e = r.read_into("a", &mut short).unwrap_err().to_string();
        assert!(
            e.contains("the destination has 10 bytes but the stored float32 array of shape [256, 1024] has 1048576"),
            "{e}"
        );
        assert!(r.read_into("missing", &mut short).is_err());
        // A flipped byte in a pack is caught (the direct-read path hashes in place too).
        let pack = std::fs::read_dir(path.join("packs")).unwrap().next().unwrap().unwrap().path();
        let mut bytes = std::fs::read(&pack).unwrap();
        bytes[1000] ^= 0x40;
        std::fs::write(&pack, bytes).unwrap();
        let r = open(path.to_str().unwrap()).unwrap();
        let mut out = vec![0u8; 1 << 20];
        let e = r.read_into("a", &mut out).unwrap_err();
        assert!(matches!(e, Error::ChunkCorrupt { .. } | Error::BadChunk { .. }), "{name}: {e}");
    }
}

/// Many arrays read into caller memory at once (a model's tensors): big and small, inline,
/// tiled (copied, not read in place), compressed, in a directory and a `.tpk`; each gets its own
/// bytes, and a corrupt chunk of one fails the whole read naming that array.
#[test]
fn read_many_into_fills_every_destination() {
    let dir = tempfile::tempdir().unwrap();
    let leaves: Vec<(String, ArrayData)> = (0..40u64)
        .map(|i| (format!("w{i}"), f32_array(1 + i % 7 * 37, 1 + (i * 13) % 300, i as f32)))
        .chain([("tiny".to_string(), f32_array(1, 3, 9.0)), ("big".to_string(), f32_array(512, 1024, 0.5))])
        .collect();
    let t = Node::dict(leaves.iter().map(|(k, a)| (k.as_str(), Node::from(a.clone()))));
    for (name, chunk_shapes, compression) in [
        ("dir", vec![], "none"),
        ("one.tpk", vec![], "none"),
        ("tiles", vec![("w3".to_string(), vec![16, 16])], "none"),
        ("zstd", vec![], "zstd"),
    ] {
        let path = dir.path().join(name);
        save_in_64k_chunks(&t, &path, chunk_shapes, compression);
        let r = open(path.to_str().unwrap()).unwrap();
        let mut outs: Vec<Vec<u8>> = leaves.iter().map(|(_, a)| vec![0xAA; a.bytes().len()]).collect();
        let items = leaves.iter().zip(outs.iter_mut()).map(|((k, _), o)| (k.as_str(), o.as_mut_slice())).collect();
        r.location().block_on(r.read_many_into_async(items, true)).unwrap();
        for ((k, a), o) in leaves.iter().zip(&outs) {
            assert!(o.as_slice() == a.bytes().as_ref(), "{name}/{k}");
        }
        // A wrong size is refused before anything is read, naming the array.
        let mut first = vec![0xAAu8; leaves[0].1.bytes().len()];
        let mut short = vec![0u8; 8];
        let items = vec![(leaves[0].0.as_str(), first.as_mut_slice()), ("big", short.as_mut_slice())];
        let e = r.location().block_on(r.read_many_into_async(items, true)).unwrap_err();
        assert!(e.to_string().contains("big") && e.to_string().contains("the destination has 8 bytes"), "{e}");
        assert!(first.iter().all(|&b| b == 0xAA), "{name}: written before the sizes were checked");
    }
    // One flipped byte in the big array's pack: the read fails, naming it.
    let path = dir.path().join("dir");
    let r = open(path.to_str().unwrap()).unwrap();
    let Ok(Tree::Leaf(Entry::Array(a))) = r.entry("big") else { panic!("no big") };
    let ArrayStorage::Chunked { chunks, .. } = &a.storage else { panic!("inline big") };
    let c = &chunks[3];
    let pack = path.join(&r.manifest().packs[c.pack as usize].path);
    let mut bytes = std::fs::read(&pack).unwrap();
    bytes[c.offset as usize + 100] ^= 0x40;
    std::fs::write(&pack, bytes).unwrap();
    let r = open(path.to_str().unwrap()).unwrap();
    let mut outs: Vec<Vec<u8>> = leaves.iter().map(|(_, a)| vec![0; a.bytes().len()]).collect();
    let items = leaves.iter().zip(outs.iter_mut()).map(|((k, _), o)| (k.as_str(), o.as_mut_slice())).collect();
    let e = r.location().block_on(r.read_many_into_async(items, true)).unwrap_err();
    assert!(matches!(&e, Error::ChunkCorrupt { key, chunk: 3, .. } if key == "big"), "{e}");
}

/// A row-range slice of a chunked array (one contiguous run: each chunk read straight into its
/// place) and a strided one (chunks copied) both equal the same slice of the whole, and a
/// corrupt chunk inside the range is caught either way.
#[test]
fn row_range_slices_read_chunks_in_place_and_verify_them() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("t");
    let p = p.to_str().unwrap();
    let a = f32_array(64, 8, 0.0);
    let opts = SaveOptions { chunk_bytes: 8 * 8 * 4, durable: false, ..Default::default() }; // 8 rows per chunk
    save(&Node::dict([("a", Node::from(a.clone()))]), p, &opts).unwrap();
    let r = Reader::open(Location::parse(p).unwrap()).unwrap();
    let whole = a.bytes();
    let rows = |r0: usize, r1: usize| whole[r0 * 32..r1 * 32].to_vec();
    for (slice, want) in
        [("16:40", rows(16, 40)), ("8:16", rows(8, 16)), ("0:64", rows(0, 64)), ("5", rows(5, 6)), ("3:9", rows(3, 9))]
    {
        let got = r.read_array("a", slice).unwrap();
        assert_eq!(got.bytes().as_ref(), &want[..], "slice {slice}");
    }
    let strided = r.read_array("a", "::16, 2").unwrap();
    let want: Vec<u8> = (0..4).flat_map(|i| whole[(i * 16 * 8 + 2) * 4..(i * 16 * 8 + 3) * 4].to_vec()).collect();
    assert_eq!(strided.bytes().as_ref(), &want[..]);
    // Flip a byte of chunk 2 (rows 16..24) in the pack: both read paths name it.
    let pack = std::fs::read_dir(tmp.path().join("t/packs")).unwrap().next().unwrap().unwrap().path();
    let mut bytes = std::fs::read(&pack).unwrap();
    let Tree::Leaf(treepack::format::manifest::Entry::Array(e)) = r.entry("a").unwrap() else { panic!() };
    let treepack::format::manifest::ArrayStorage::Chunked { chunks, .. } = &e.storage else { panic!() };
    bytes[chunks[2].offset as usize + 5] ^= 1;
    std::fs::write(&pack, bytes).unwrap();
    let r = Reader::open(Location::parse(p).unwrap()).unwrap();
    for slice in ["16:40", "::2"] {
        let err = r.read_array("a", slice).unwrap_err();
        assert_eq!(err.kind(), "chunk_corrupt", "{slice}: {err}");
    }
}
