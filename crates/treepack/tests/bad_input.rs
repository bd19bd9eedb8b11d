//! Truncated, corrupted and malicious locations get a typed error naming the file and key —
//! never a panic, hang, huge allocation, or a read outside the location.

use std::path::Path;
#[path = "support/files.rs"]
mod files;
use std::time::{Duration, Instant};
use treepack::format::hash::Hash32;
use treepack::format::manifest::seal;
use treepack::format::*;
use treepack::*;

/// Write a directory location with a sealed manifest (given packs/root JSON) and pack files.
fn craft(dir: &Path, packs: &str, root: &str, files: &[(&str, &[u8])]) -> String {
    std::fs::create_dir_all(dir.join("packs")).unwrap();
    let body = format!(
        "{{\"format\":\"treepack\",\"version\":[1,0],\n\"writer\":\"crafted\",\n\"packs\":{packs},\n\"root\":{root}"
    );
    std::fs::write(dir.join("treepack.json"), seal(body.as_bytes())).unwrap();
    for (name, data) in files {
        std::fs::write(dir.join(name), data).unwrap();
    }
    dir.to_str().unwrap().to_string()
}

fn chunk(pack: u32, offset: u64, data: &[u8]) -> String {
    format!(
        "{{\"pack\":{pack},\"offset\":{offset},\"length\":{},\"codec\":\"raw\",\"blake3\":\"{}\"}}",
        data.len(),
        Hash32::of(data).to_hex()
    )
}

/// Load fully and return the error kind, checking it came quickly.
fn load_err(path: &str) -> Error {
    let t = Instant::now();
    let e = load(path, &LoadOptions::default()).expect_err("hostile input must not load");
    assert!(t.elapsed() < Duration::from_secs(1), "took {:?}", t.elapsed());
    e
}

const DATA: [u8; 16] = [1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0];

fn array_root(shape: &str, chunk_shape: &str, chunks: &str) -> String {
    format!("{{\"t\":\"dict\",\"items\":[[\"w\",{{\"t\":\"array\",\"dtype\":\"int32\",\"shape\":{shape},\"chunk_shape\":{chunk_shape},\"chunks\":[{chunks}]}}]]}}")
}

#[test]
fn a_well_formed_crafted_tree_loads() {
    // The crafting helper itself is right: the same bytes with sane values load.
    let d = tempfile::tempdir().unwrap();
    let p = craft(
        d.path(),
        "[{\"path\":\"packs/p.tpp\",\"size\":16}]",
        &array_root("[4]", "[4]", &chunk(0, 0, &DATA)),
        &[("packs/p.tpp", &DATA)],
    );
    let t = load(&p, &LoadOptions::default()).unwrap();
    assert_eq!(keypath::resolve(&t, "w").unwrap().as_array().unwrap().bytes().as_ref(), &DATA);
}

#[test]
fn pack_paths_cannot_escape_the_location() {
    for bad in ["../outside.tpp", "/etc/passwd", "packs/../../x", "packs//x", "", "packs/a\\b", "."] {
        let d = tempfile::tempdir().unwrap();
        let packs = format!("[{{\"path\":{},\"size\":16}}]", serde_json::to_string(bad).unwrap());
        let p = craft(d.path(), &packs, &array_root("[4]", "[4]", &chunk(0, 0, &DATA)), &[]);
        let e = load_err(&p);
        assert!(matches!(e, Error::InvalidManifest { .. }), "{bad}: {e}");
        assert!(e.to_string().contains("treepack.json"), "{e}");
    }
}

#[test]
fn symlinked_packs_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let outside = d.path().join("secret");
    std::fs::write(&outside, DATA).unwrap();
    let loc = d.path().join("tree");
    let p =
        craft(&loc, "[{\"path\":\"packs/p.tpp\",\"size\":16}]", &array_root("[4]", "[4]", &chunk(0, 0, &DATA)), &[]);
    std::os::unix::fs::symlink(&outside, loc.join("packs/p.tpp")).unwrap();
    let e = load_err(&p);
    assert!(matches!(e, Error::Link { .. }) && e.to_string().contains("packs/p.tpp: is a symbolic link"), "{e}");
}

#[test]
fn offsets_and_sizes_are_checked() {
    let cases: Vec<(&str, String, String, &[u8], &str)> = vec![
        // chunk beyond the declared pack size
        ("past end", "[{\"path\":\"packs/p.tpp\",\"size\":16}]".into(), array_root("[4]", "[4]", &chunk(0, 8, &DATA)), &DATA[..], "out_of_bounds"),
        // declared size larger than the real file (truncated pack)
        ("truncated pack", "[{\"path\":\"packs/p.tpp\",\"size\":16}]".into(), array_root("[4]", "[4]", &chunk(0, 0, &DATA)), &DATA[..8], "out_of_bounds"),
        // pack index out of range
        ("bad pack index", "[{\"path\":\"packs/p.tpp\",\"size\":16}]".into(), array_root("[4]", "[4]", &chunk(3, 0, &DATA)), &DATA[..], "out_of_bounds"),
        // shape × itemsize != chunk length
        ("length mismatch", "[{\"path\":\"packs/p.tpp\",\"size\":16}]".into(), array_root("[5]", "[5]", &chunk(0, 0, &DATA)), &DATA[..], "invalid_manifest"),
        // giant declared shape (overflows u64 bytes)
        ("giant shape", "[{\"path\":\"packs/p.tpp\",\"size\":16}]".into(), array_root("[4294967296,4294967296]", "[1,1]", &chunk(0, 0, &DATA)), &DATA[..], "invalid_manifest"),
        // giant but representable: grid needs 2^40 chunks, one listed
        ("giant grid", "[{\"path\":\"packs/p.tpp\",\"size\":16}]".into(), array_root("[1099511627776]", "[1]", &chunk(0, 0, &DATA)), &DATA[..], "invalid_manifest"),
        // one chunk claiming 2^40 bytes
        ("giant chunk", "[{\"path\":\"packs/p.tpp\",\"size\":16}]".into(), array_root("[274877906944]", "[274877906944]", "{\"pack\":0,\"offset\":0,\"length\":1099511627776,\"codec\":\"raw\",\"blake3\":\"af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262\"}"), &DATA[..], "out_of_bounds"),
        // zero chunk dimension
        ("zero chunk dim", "[{\"path\":\"packs/p.tpp\",\"size\":16}]".into(), array_root("[4]", "[0]", &chunk(0, 0, &DATA)), &DATA[..], "invalid_manifest"),
        // chunk count mismatch
        ("chunk count", "[{\"path\":\"packs/p.tpp\",\"size\":16}]".into(), array_root("[4]", "[2]", &chunk(0, 0, &DATA)), &DATA[..], "invalid_manifest"),
        // unknown codec
        ("codec", "[{\"path\":\"packs/p.tpp\",\"size\":16}]".into(), array_root("[4]", "[4]", &chunk(0, 0, &DATA).replace("raw", "zstd9")), &DATA[..], "invalid_manifest"),
        // offset overflow
        ("offset overflow", "[{\"path\":\"packs/p.tpp\",\"size\":16}]".into(), array_root("[4]", "[4]", &chunk(0, u64::MAX - 2, &DATA)), &DATA[..], "out_of_bounds"),
        // NaN / fractions where integers are expected
        ("float shape", "[{\"path\":\"packs/p.tpp\",\"size\":16}]".into(), array_root("[4.5]", "[4]", &chunk(0, 0, &DATA)), &DATA[..], "invalid_manifest"),
        ("NaN shape", "[{\"path\":\"packs/p.tpp\",\"size\":16}]".into(), array_root("[NaN]", "[4]", &chunk(0, 0, &DATA)), &DATA[..], "invalid_manifest"),
        ("negative shape", "[{\"path\":\"packs/p.tpp\",\"size\":16}]".into(), array_root("[-4]", "[4]", &chunk(0, 0, &DATA)), &DATA[..], "invalid_manifest"),
        // too many dims
        ("65 dims", "[{\"path\":\"packs/p.tpp\",\"size\":16}]".into(), array_root(&format!("[4{}]", ",1".repeat(64)), &format!("[4{}]", ",1".repeat(64)), &chunk(0, 0, &DATA)), &DATA[..], "invalid_manifest"),
        // wrong hash
        ("corrupt data", "[{\"path\":\"packs/p.tpp\",\"size\":16}]".into(), array_root("[4]", "[4]", &chunk(0, 0, &[9; 16])), &DATA[..], "chunk_corrupt"),
        // bad hash text
        ("bad hash hex", "[{\"path\":\"packs/p.tpp\",\"size\":16}]".into(), array_root("[4]", "[4]", &chunk(0, 0, &DATA).replace("\"blake3\":\"", "\"blake3\":\"zz")), &DATA[..], "invalid_manifest"),
        // a string blob that is not UTF-8
        ("bad utf8 blob", "[{\"path\":\"packs/p.tpp\",\"size\":16}]".into(), format!("{{\"t\":\"str\",\"size\":2,\"blob\":{}}}", chunk(0, 0, &[0xff, 0xfe])), &[0xff, 0xfe][..], "invalid_manifest"),
        // a blob whose size disagrees with its chunk
        ("blob size", "[{\"path\":\"packs/p.tpp\",\"size\":16}]".into(), format!("{{\"t\":\"bytes\",\"size\":5,\"blob\":{}}}", chunk(0, 0, &DATA)), &DATA[..], "invalid_manifest"),
        // duplicate keys, duplicate members, unknown node types, non-hashable keys
        ("dup keys", "[]".into(), "{\"t\":\"dict\",\"items\":[[\"a\",1],[\"a\",2]]}".into(), &[][..], "invalid_manifest"),
        ("dup int keys", "[]".into(), "{\"t\":\"dict\",\"items\":[[1,1],[1,2]]}".into(), &[][..], "invalid_manifest"),
        ("dup fields", "[]".into(), "{\"t\":\"record\",\"type\":\"x\",\"fields\":[[\"a\",1],[\"a\",2]]}".into(), &[][..], "invalid_manifest"),
        ("dup member", "[]".into(), "{\"t\":\"tuple\",\"items\":[],\"items\":[1]}".into(), &[][..], "invalid_manifest"),
        ("unknown node", "[]".into(), "{\"t\":\"pickle\",\"v\":\"cos\\nsystem\"}".into(), &[][..], "invalid_manifest"),
        ("list key", "[]".into(), "{\"t\":\"dict\",\"items\":[[[1],2]]}".into(), &[][..], "invalid_manifest"),
        ("bad dtype", "[]".into(), "{\"t\":\"array\",\"dtype\":\"object\",\"shape\":[],\"data\":\"\"}".into(), &[][..], "invalid_manifest"),
        ("bad base64", "[]".into(), "{\"t\":\"bytes\",\"b64\":\"!!\"}".into(), &[][..], "invalid_manifest"),
        ("bad int", "[]".into(), "{\"t\":\"int\",\"v\":\"12x\"}".into(), &[][..], "invalid_manifest"),
        ("trailing garbage", "[]".into(), "1} {".into(), &[][..], "invalid_manifest"),
    ];
    for (name, packs, root, file, kind) in cases {
        let d = tempfile::tempdir().unwrap();
        let p = craft(d.path(), &packs, &root, &[("packs/p.tpp", file)]);
        let e = load_err(&p);
        assert_eq!(e.kind(), kind, "{name}: {e}");
        let msg = e.to_string();
        assert!(msg.contains(d.path().to_str().unwrap()), "{name}: error should name the file: {msg}");
    }
}

/// Issue 51: a pack cut short (a copy that stopped, a full disk) names the key path of the leaf
/// whose bytes are missing, by every way of reading it, not an empty "``".
#[test]
fn a_truncated_pack_names_the_leaf_it_cuts() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("t");
    let big: Vec<u8> = (0..4_000_000u32).flat_map(|i| (i as f32).to_le_bytes()).collect();
    // Packs hold leaves in tree order: the cut falls in the last one, `params/w`.
    let tree = Node::dict([
        ("first", Node::from(ArrayData::new(DType::U8, vec![300], vec![7u8; 300]).unwrap())),
        ("second", Node::from(ArrayData::new(DType::U8, vec![300], vec![9u8; 300]).unwrap())),
        ("params", Node::dict([("w", Node::from(ArrayData::new(DType::F32, vec![4_000_000], big).unwrap()))])),
    ]);
    let opts = SaveOptions { chunk_bytes: 1 << 20, ..Default::default() };
    save(&tree, p.to_str().unwrap(), &opts).unwrap();
    let packs: Vec<_> = std::fs::read_dir(p.join("packs")).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(packs.len(), 1, "{packs:?}");
    let len = std::fs::metadata(&packs[0]).unwrap().len();
    std::fs::File::options().write(true).open(&packs[0]).unwrap().set_len(len / 2).unwrap();
    let ps = p.to_str().unwrap();
    let named = |what: &str, e: Error| {
        let msg = e.to_string();
        assert_eq!(e.kind(), "out_of_bounds", "{what}: {msg}");
        assert!(msg.contains("`params/w`") && !msg.contains("``"), "{what}: {msg}");
        assert!(msg.contains(".tpp") && msg.contains("truncated"), "{what}: {msg}");
    };
    named("load", load(ps, &LoadOptions::default()).unwrap_err());
    named("load batched", load(ps, &LoadOptions { batch_bytes: 1 << 20, ..Default::default() }).unwrap_err());
    named("select", load(ps, &LoadOptions { select: vec!["params/**".into()], ..Default::default() }).unwrap_err());
    named("mmap", load(ps, &LoadOptions { mmap: true, ..Default::default() }).unwrap_err());
    named("slice", open(ps).unwrap().read_array("params/w", "3999000:4000000").unwrap_err());
    named("get", open(ps).unwrap().get("params").unwrap_err());
    // What lies before the cut still reads.
    assert!(open(ps).unwrap().get("first").is_ok());
    assert!(open(ps).unwrap().read_array("params/w", "0:10").is_ok());
}

#[test]
fn deep_nesting_is_refused_quickly() {
    let d = tempfile::tempdir().unwrap();
    let deep = "[".repeat(200_000) + &"]".repeat(200_000);
    let p = craft(d.path(), "[]", &deep, &[]);
    let e = load_err(&p);
    assert!(matches!(e, Error::InvalidManifest { .. }) && e.to_string().contains("deeper"), "{e}");
    // Saving a too-deep tree is refused too.
    let mut t = Node::none();
    for _ in 0..1100 {
        t = Node::list([t]);
    }
    let e = save(&t, d.path().join("deep").to_str().unwrap(), &SaveOptions::default()).unwrap_err();
    assert!(matches!(e, Error::LimitExceeded { .. }), "{e}");
}

#[test]
fn manifest_damage_is_detected() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("t");
    let ps = p.to_str().unwrap();
    save(&Node::dict([("a", Node::from("hello")), ("n", Node::from(1i64))]), ps, &SaveOptions::default()).unwrap();
    let m = std::fs::read(p.join("treepack.json")).unwrap();
    // An edit inside a value: checksum mismatch.
    let edited = String::from_utf8(m.clone()).unwrap().replace("hello", "jello");
    std::fs::write(p.join("treepack.json"), &edited).unwrap();
    assert_eq!(load_err(ps).kind(), "manifest_checksum");
    // Truncation: not a complete treepack manifest.
    std::fs::write(p.join("treepack.json"), &m[..m.len() - 10]).unwrap();
    assert_eq!(load_err(ps).kind(), "not_treepack");
    // Invalid UTF-8 inside (sealed, so it reaches the parser).
    let body = b"{\"format\":\"treepack\",\"version\":[1,0],\n\"packs\":[],\n\"root\":\"\xff\xfe\"";
    std::fs::write(p.join("treepack.json"), seal(body)).unwrap();
    assert_eq!(load_err(ps).kind(), "invalid_manifest");
    // A newer major version says so.
    let body = b"{\"format\":\"treepack\",\"version\":[7,0],\n\"packs\":[],\n\"root\":null";
    std::fs::write(p.join("treepack.json"), seal(body)).unwrap();
    let e = load_err(ps);
    assert!(matches!(e, Error::UnsupportedVersion { .. }) && e.to_string().contains("upgrade"), "{e}");
    // Unknown optional members are ignored (forward compatibility within a major version).
    let body = b"{\"format\":\"treepack\",\"version\":[1,9],\n\"future\":{\"x\":1},\n\"packs\":[],\n\"root\":{\"t\":\"tuple\",\"items\":[1],\"new_field\":true}";
    std::fs::write(p.join("treepack.json"), seal(body)).unwrap();
    assert!(load(ps, &LoadOptions::default()).unwrap().exact_eq(&Node::tuple([Node::from(1i64)])));
    // Not a treepack file at all.
    std::fs::write(p.join("treepack.json"), b"PK\x03\x04 not json").unwrap();
    assert_eq!(load_err(ps).kind(), "not_treepack");
    // Nothing there.
    let e = load_err(d.path().join("missing").to_str().unwrap());
    assert_eq!(e.kind(), "not_found");
}

#[test]
fn single_file_damage_is_detected() {
    let (_d, ps) = files::temp_place("t.tpk");
    let (p, ps) = (std::path::PathBuf::from(&ps), ps.as_str());
    let arr = ArrayData::new(DType::U8, vec![100_000], vec![7u8; 100_000]).unwrap();
    save(&Node::dict([("a", Node::from(arr))]), ps, &SaveOptions::default()).unwrap();
    let good = std::fs::read(&p).unwrap();
    for cut in [0, 10, 63, 64, 1000, good.len() - 65, good.len() - 1] {
        std::fs::write(&p, &good[..cut]).unwrap();
        let e = load_err(ps);
        assert!(matches!(e, Error::NotTreepack { .. } | Error::OutOfBounds { .. }), "cut {cut}: {e}");
    }
    // Footer pointing elsewhere.
    let mut bad = good.clone();
    let n = bad.len();
    bad[n - 64] ^= 0x10;
    std::fs::write(&p, &bad).unwrap();
    assert_eq!(load_err(ps).kind(), "not_treepack");
    // A flipped data byte: the load names the chunk; verify reports it.
    let mut bad = good.clone();
    bad[5000] ^= 1;
    std::fs::write(&p, &bad).unwrap();
    let e = load_err(ps);
    assert!(matches!(&e, Error::ChunkCorrupt { key, .. } if key == "a"), "{e}");
    let rep = open(ps).unwrap().verify().unwrap();
    assert_eq!(rep.problems.len(), 1);
    assert_eq!(rep.problems[0].key, "a");
    // With verification off the corrupt bytes are returned as stored (documented trade-off).
    assert!(load(ps, &LoadOptions { verify: false, ..Default::default() }).is_ok());
    // A header flip is reported by verify.
    let mut bad = good.clone();
    bad[20] = 1;
    std::fs::write(&p, &bad).unwrap();
    assert!(!open(ps).unwrap().verify().unwrap().ok());
}

#[test]
fn invalid_in_memory_trees_are_rejected_on_save() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("x");
    let dup = Tree::Dict(vec![(Key::from("a"), Node::from(1i64)), (Key::from("a"), Node::from(2i64))]);
    assert!(matches!(save(&dup, p.to_str().unwrap(), &SaveOptions::default()), Err(Error::InvalidTree { .. })));
    assert!(ArrayData::new(DType::F32, vec![3], vec![0u8; 11]).is_err());
    let bad_chunks = SaveOptions { chunk_shapes: vec![("w".into(), vec![0])], ..Default::default() };
    let t = Node::dict([("w", Node::from(ArrayData::new(DType::U8, vec![300], vec![0u8; 300]).unwrap()))]);
    assert!(matches!(save(&t, p.to_str().unwrap(), &bad_chunks), Err(Error::InvalidTree { .. })));
}

/// An empty chunked array (shape `[0, 5]`: a grid of no chunks) is valid and loads as an
/// empty array, whole, by selection and as a structure.
#[test]
fn an_empty_chunked_array_loads() {
    let d = tempfile::tempdir().unwrap();
    let root = r#"{"t":"dict","items":[["w",{"t":"array","dtype":"float32","shape":[0,5],"chunk_shape":[1,5],"chunks":[]}],["n",1]]}"#;
    let p = craft(&d.path().join("t"), "[]", root, &[]);
    for opts in [LoadOptions::default(), LoadOptions { select: vec!["w".into()], ..Default::default() }] {
        let t = load(p.as_str(), &opts).unwrap();
        let Tree::Dict(items) = &t else { panic!("{t:?}") };
        let Tree::Leaf(Leaf::Array(a)) = &items[0].1 else { panic!("{t:?}") };
        assert_eq!(a.shape(), &[0, 5]);
        assert!(a.bytes().is_empty());
    }
    assert!(open(p.as_str()).unwrap().verify().unwrap().ok());
}
