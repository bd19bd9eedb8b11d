//! Compression (format 1.1): every dtype round-trips through every codec and filter, in both
//! layouts, through whole loads, mmap loads, slices and verify; incompressible data stays raw
//! (and the file stays format 1.0); identical content is stored once whatever the rule.

use treepack::format::codec::Codec;
use treepack::format::manifest::{ArrayStorage, Entry, Stored};
use treepack::save::Compression;
use treepack::*;

/// Bytes that compress (a slowly varying pattern) for `n` elements of `dtype`.
fn compressible(dtype: &DType, n: u64) -> ArrayData {
    let k = dtype.itemsize();
    let bytes: Vec<u8> = (0..n * k)
        .map(|i| {
            let (e, j) = (i / k, i % k);
            // Low bytes vary, high bytes barely: what numbers look like.
            if j == 0 {
                (e % 13) as u8
            } else {
                ((e / 1000) as u8) & 1
            }
        })
        .collect();
    // bool must hold 0 or 1.
    let bytes = if *dtype == DType::Bool { bytes.iter().map(|b| b & 1).collect() } else { bytes };
    ArrayData::new(dtype.clone(), vec![n / 40, 40], bytes).unwrap()
}

fn codecs(r: &Reader) -> Vec<Codec> {
    let mut out = vec![];
    r.manifest().root.for_each_leaf(&mut |_, e| out.extend(e.chunks().iter().map(|c| c.codec)));
    out
}

#[test]
fn every_dtype_round_trips_through_every_codec_and_filter() {
    let dir = tempfile::tempdir().unwrap();
    let policies = [
        ("zstd1", "zstd:1"),
        ("zstd19", "zstd:19"),
        ("lz4", "lz4"),
        ("plain-zstd", r#"[{"codec": "zstd", "filter": "none"}]"#),
        ("plain-lz4", r#"[{"codec": "lz4", "filter": "none"}]"#),
        ("shuffle-zstd", r#"[{"codec": "zstd", "level": 3, "filter": "shuffle"}]"#),
        ("shuffle-lz4", r#"[{"codec": "lz4", "filter": "shuffle"}]"#),
    ];
    let mut dtypes: Vec<DType> = DType::all_simple().collect();
    dtypes.push(DType::from_name("bytes:3").unwrap());
    for (tag, policy) in policies {
        let arrays: Vec<(String, ArrayData)> =
            dtypes.iter().map(|d| (d.name().unwrap(), compressible(d, 40_000))).collect();
        let tree = Node::dict(arrays.iter().map(|(k, a)| (k.clone(), Node::from(a.clone()))));
        let compression = Compression::parse(policy).unwrap();
        // Small chunks: many per array, so multi-chunk paths (in-place decode, slices) run.
        let opts = SaveOptions { compression, chunk_bytes: 64 << 10, ..Default::default() };
        for name in ["d", "f.tpk"] {
            let p = dir.path().join(format!("{tag}-{name}"));
            let p = p.to_str().unwrap();
            save(&tree, p, &opts).unwrap();
            let r = open(p).unwrap();
            // 1.1 for the codecs, 1.4 for the dict written as an object (see the next test), 1.5
            // for the dtypes of 1.5 (int4, float4_e2m1fn, ...) among every dtype.
            assert_eq!(r.manifest().version, (1, 5), "{tag}");
            let cs = codecs(&r);
            assert!(cs.iter().all(|c| !c.is_identity()), "{tag} {name}: some chunk stayed raw: {cs:?}");
            // `auto` (the default filter) shuffles some dtypes' chunks; `shuffle` every chunk of a
            // multi-byte dtype; `none` none.
            let shuffled = cs.iter().filter(|c| c.is_shuffled()).count();
            assert_eq!(shuffled > 0, !tag.starts_with("plain"), "{tag}");
            if tag.starts_with("shuffle") {
                assert!(shuffled * 3 > cs.len() * 2, "{tag}: {shuffled} of {} chunks shuffled", cs.len());
            }
            assert!(load(p, &LoadOptions::default()).unwrap().exact_eq(&tree), "{tag} {name}");
            assert!(
                r.load(&LoadOptions { mmap: true, ..Default::default() }).unwrap().exact_eq(&tree),
                "{tag} {name} mmap"
            );
            assert!(r.verify().unwrap().ok(), "{tag} {name}");
            for (key, whole) in &arrays {
                let part = r.read_array(key, "17:203, 3:9").unwrap();
                let k = whole.dtype().itemsize() as usize;
                let want: Vec<u8> =
                    (17..203).flat_map(|row| whole.bytes()[(row * 40 + 3) * k..(row * 40 + 9) * k].to_vec()).collect();
                assert_eq!(part.bytes().as_ref(), &want[..], "{tag} {name} {key}");
            }
        }
    }
}

#[test]
fn incompressible_data_stays_raw_and_the_file_stays_format_1_0() {
    let dir = tempfile::tempdir().unwrap();
    // BLAKE3's output stream: as random as bytes get.
    let mut noise = vec![0u8; 1 << 20];
    blake3::Hasher::new().update(b"noise").finalize_xof().fill(&mut noise);
    // A list at the root: no dict written as an object (format 1.4).
    let tree = Node::list([Node::from(ArrayData::new(DType::F32, vec![1 << 18], noise).unwrap())]);
    let p = dir.path().join("n");
    let p = p.to_str().unwrap();
    let opts = SaveOptions { compression: Compression::parse("auto").unwrap(), ..Default::default() };
    save(&tree, p, &opts).unwrap();
    let r = open(p).unwrap();
    assert_eq!(r.manifest().version, (1, 0));
    // Compressed chunks make it 1.1.
    let z = dir.path().join("z");
    let z = z.to_str().unwrap();
    save(&Node::list([Node::from(compressible(&DType::F32, 40_000))]), z, &opts).unwrap();
    assert_eq!(open(z).unwrap().manifest().version, (1, 1));
    assert!(codecs(&r).iter().all(Codec::is_identity));
    assert!(load(p, &LoadOptions::default()).unwrap().exact_eq(&tree));
}

#[test]
fn blobs_compress_and_identical_content_is_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    let text = "the same sentence again. ".repeat(4000);
    let a = compressible(&DType::I64, 40_000);
    let tree = Node::dict([
        ("s", Node::from(text.as_str())),
        ("b", Tree::Leaf(Leaf::Bytes(bytes::Bytes::from(text.clone().into_bytes())))),
        ("x", Node::from(a.clone())),
        ("y", Node::from(a)),
    ]);
    // `x` and `y` fall under different rules; their identical chunks are stored once, with
    // the codec of the first.
    let policy = r#"[{"paths": ["y"], "codec": "lz4"}, {"codec": "zstd", "level": 5}]"#;
    let opts = SaveOptions { compression: Compression::parse(policy).unwrap(), ..Default::default() };
    let p = dir.path().join("t.tpk");
    let p = p.to_str().unwrap();
    let info = save(&tree, p, &opts).unwrap();
    assert!(info.unique_chunks < info.chunks);
    let r = open(p).unwrap();
    let m = r.manifest();
    let Tree::Dict(items) = &m.root else { panic!("a dict root") };
    for (_, t) in items {
        match t {
            Tree::Leaf(Entry::Str(Stored::Blob { chunk, size }))
            | Tree::Leaf(Entry::Bytes(Stored::Blob { chunk, size })) => {
                assert_eq!(chunk.codec, Codec::Zstd);
                assert!(chunk.length * 20 < *size);
            }
            Tree::Leaf(Entry::Array(a)) => {
                let ArrayStorage::Chunked { chunks, .. } = &a.storage else { panic!() };
                assert!(chunks.iter().all(|c| c.codec == Codec::ShuffleZstd));
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(load(p, &LoadOptions::default()).unwrap().exact_eq(&tree));
    assert!(r.verify().unwrap().ok());
}

#[test]
fn a_bad_policy_is_refused_before_anything_is_written() {
    let e = Compression::parse(r#"[{"codec": "zstd", "level": 40}]"#).unwrap_err();
    assert_eq!(e.kind(), "invalid_compression");
    assert!(e.to_string().contains("level 40 is out of range"), "{e}");
}
