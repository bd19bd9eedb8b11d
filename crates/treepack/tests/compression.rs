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
            // for the dtypes of 1.5 (int4, float4_e2m1fn, ...) among every dtype; 1.6 for the
            // single file, whose manifest a compressed save stores compressed too.
            let minor = if name.ends_with(".tpk") { 6 } else { 5 };
            assert_eq!(r.manifest().version, (1, minor), "{tag} {name}");
            if !name.ends_with(".tpk") {
                // A directory's treepack.json stays plain JSON unless asked.
                let stored = std::fs::read(std::path::Path::new(p).join("treepack.json")).unwrap();
                assert!(stored.starts_with(b"{\"format\":\"treepack\""), "{tag} {name}");
            }
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

/// A compressed manifest (format 1.6) in every layout: asked for, by default where it applies,
/// refused when asked not to; each loads to the tree, and a compressed save of a tree of small
/// values (the manifest is most of it) is several times smaller.
#[test]
fn manifests_are_stored_compressed_where_asked_and_load_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let items: Vec<Node> = (0..5000)
        .map(|i| {
            Node::dict([
                ("id", Node::from(format!("call-{i:06}"))),
                ("op", Node::from(["predict", "embed", "score"][i % 3])),
                ("tokens", Node::from((i * 7 % 300) as i64)),
            ])
        })
        .collect();
    let tree = Node::dict([("calls", Node::list(items)), ("w", Node::from(compressible(&DType::F32, 50_000)))]);
    let zstd = Compression::parse("zstd").unwrap();
    let manifest_of = |p: &std::path::Path| -> Vec<u8> {
        if p.is_dir() {
            std::fs::read(p.join("treepack.json")).unwrap()
        } else {
            let b = std::fs::read(p).unwrap();
            let f = &b[b.len() - treepack::format::container::FOOTER_LEN as usize..];
            let (off, len) = treepack::format::container::parse_footer(f, b.len() as u64, "t").unwrap();
            b[off as usize..(off + len) as usize].to_vec()
        }
    };
    let repo = treepack::Repository::create(dir.path().join("repo").to_str().unwrap()).unwrap();
    for (name, compression, ask, packed) in [
        ("dir-default", zstd.clone(), None, false),
        ("dir-asked", zstd.clone(), Some(true), true),
        ("plain-asked", Compression::none(), Some(true), true),
        ("f-default.tpk", zstd.clone(), None, true),
        ("f-refused.tpk", zstd.clone(), Some(false), false),
        ("f-plain.tpk", Compression::none(), None, false),
    ] {
        let p = dir.path().join(name);
        let opts = SaveOptions { compression: compression.clone(), manifest_compression: ask, ..Default::default() };
        save(&tree, p.to_str().unwrap(), &opts).unwrap();
        let stored = manifest_of(&p);
        assert_eq!(treepack::format::manifest::is_packed(&stored), packed, "{name}");
        assert_eq!(open(p.to_str().unwrap()).unwrap().manifest().version.1 == 6, packed, "{name}");
        assert!(load(p.to_str().unwrap(), &LoadOptions::default()).unwrap().exact_eq(&tree), "{name}");
        assert!(open(p.to_str().unwrap()).unwrap().verify().unwrap().ok(), "{name}");
        let loc = format!("{}@{}", dir.path().join("repo").display(), name.replace(".tpk", ""));
        repo.save(&tree, &name.replace(".tpk", ""), &opts).unwrap();
        assert!(load(&loc, &LoadOptions::default()).unwrap().exact_eq(&tree), "{loc}");
    }
    let plain = manifest_of(&dir.path().join("f-refused.tpk")).len();
    let packed = manifest_of(&dir.path().join("f-default.tpk")).len();
    assert!(packed * 5 < plain, "compressed manifest {packed} B, plain {plain} B");
}
