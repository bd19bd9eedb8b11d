//! Golden files: the demo tree saved with fixed options must produce exactly the committed bytes,
//! and the committed files must load to the demo tree. A format change therefore shows up as a
//! failing test; regenerate deliberately with `TREEPACK_BLESS=1 cargo test --test golden`.
//! The files earlier writers made (`tests/golden/v1.3/`: formats 1.0 to 1.3, as written before
//! format 1.4) are kept as they were and must still load.

use std::path::{Path, PathBuf};
use treepack::format::*;
use treepack::*;

#[path = "support/files.rs"]
mod files;

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden")
}

/// The golden locations, all format 1.4 (the demo tree's dicts are written as JSON objects):
/// raw chunks in both layouts, each codec (`demo-zstd.tpk`: shuffle+zstd and zstd; `demo-lz4`:
/// shuffle+lz4 and lz4), shared nodes (`demo-refs`: the demo tree as a shared object referred to
/// again, and a cycle), and annotated arrays (`demo-torch`: the demo tree beside arrays as the
/// Python package writes torch tensors: a chunked bfloat16 Parameter and an inline int64 tensor
/// saved from a GPU). `tests/golden/v1.3/` holds the same locations as writers of formats 1.0
/// (`demo`, `demo.tpk`), 1.1 (`demo-zstd.tpk`, `demo-lz4`), 1.2 (`demo-refs`) and 1.3
/// (`demo-torch`) made them. `demo-dtypes` is format 1.5: an array of each dtype that format
/// added (every canonical byte of each, NaN and infinities included), an inline one and a
/// struct with such fields; the others stay 1.4, byte for byte as before 1.5. `demo-packed.tpk`
/// is format 1.6: `demo-zstd.tpk` with its manifest stored as one zstd frame (what a compressed
/// single-file save writes by default; `demo-zstd.tpk` asks for a plain manifest).
const NAMES: [&str; 8] =
    ["demo", "demo.tpk", "demo-zstd.tpk", "demo-lz4", "demo-refs", "demo-torch", "demo-dtypes", "demo-packed.tpk"];

/// The golden locations of `tests/golden/v1.3/` (written before format 1.4).
const NAMES_V1_3: [&str; 6] = ["demo", "demo.tpk", "demo-zstd.tpk", "demo-lz4", "demo-refs", "demo-torch"];

/// `demo-dtypes`: each dtype of format 1.5 as 4096 elements cycling through its canonical bytes
/// (all 256 for the 8-bit floats; for a sub-byte type its 2^bits patterns, high bits zero),
/// starting at a different byte for each so that no two arrays share a chunk; an inline `int4`
/// array of its extremes and a struct of an `int4[2]` and a `float8_e8m0fnu` field.
fn dtypes_tree() -> Node {
    let mut items: Vec<(String, Node)> = vec![];
    for (k, d) in DType::all_simple().filter(|d| d.since_minor() == 5).enumerate() {
        let codes = 1usize << d.sub_byte_bits().unwrap_or(8);
        let bytes: Vec<u8> = (0..4096).map(|i| ((i + 37 * k) % codes) as u8).collect();
        items.push((d.name().unwrap(), Node::from(ArrayData::new(d, vec![4096], bytes).unwrap())));
    }
    // int4: -8, -1, 0, 7 (two's complement in the low 4 bits).
    items.push(("int4_inline".into(), Node::from(ArrayData::new(DType::I4, vec![4], vec![8, 15, 0, 7]).unwrap())));
    let record = DType::Struct(vec![
        dtype::Field { name: "q".into(), dtype: DType::I4, shape: vec![2] },
        dtype::Field { name: "scale".into(), dtype: DType::F8E8M0FNU, shape: vec![] },
    ]);
    let rec = ArrayData::new(record, vec![3], vec![1, 15, 127, 8, 7, 128, 0, 0, 0]).unwrap();
    items.push(("blocks".into(), Node::from(rec)));
    Node::dict(items)
}

/// The golden JSON transport document (docs/format.md section 11): `demo-zstd.tpk` exported
/// with base85.
const TRANSPORT: (&str, &str) = ("demo-zstd.json", "demo-zstd.tpk");

fn transport_doc(src: &Path) -> String {
    treepack::transport::export(src.to_str().unwrap(), &treepack::transport::ExportOptions::default()).unwrap()
}

/// The tree each golden location holds.
fn tree_for(name: &str) -> Node {
    if name == "demo-dtypes" {
        return dtypes_tree();
    }
    let tree = demo::example_tree();
    if name == "demo-torch" {
        let bf16: Vec<u8> = (0..65536u32).flat_map(|i| (0x3f80u16 + (i % 128) as u16).to_le_bytes()).collect();
        let weight = ArrayData::new(DType::BF16, vec![256, 256], bf16)
            .unwrap()
            .with_annotation(Some(serde_json::json!({"type": "torch.nn.Parameter", "requires_grad": true})))
            .unwrap();
        let steps: Vec<u8> = [3i64, 4].iter().flat_map(|v| v.to_le_bytes()).collect();
        let step = ArrayData::new(DType::I64, vec![2], steps)
            .unwrap()
            .with_annotation(Some(serde_json::json!({"type": "torch.Tensor", "device": "cuda:0"})))
            .unwrap();
        return Node::dict([("demo", tree), ("weight", Node::from(weight)), ("step", Node::from(step))]);
    }
    if name != "demo-refs" {
        return tree;
    }
    Node::dict([
        ("model", Tree::Shared { id: 0, node: Box::new(tree) }),
        ("again", Tree::Ref(0)),
        ("cycle", Tree::Shared { id: 1, node: Box::new(Node::list([Node::from("loop"), Tree::Ref(1)])) }),
    ])
}

fn options(name: &str) -> SaveOptions {
    // float32 arrays without the shuffle, everything else with it (where it moves bytes).
    let compression = match name {
        "demo-zstd.tpk" | "demo-packed.tpk" => {
            r#"[{"dtypes": ["float32"], "codec": "zstd", "filter": "none"}, {"codec": "zstd", "level": 3, "filter": "shuffle"}]"#
        }
        "demo-lz4" => {
            r#"[{"dtypes": ["float32"], "codec": "lz4", "filter": "none"}, {"codec": "lz4", "filter": "shuffle"}]"#
        }
        _ => "none",
    };
    SaveOptions {
        writer: "treepack-golden".into(),
        metadata: Some(serde_json::json!({"purpose": "golden file for docs/format.md"})),
        chunk_bytes: 64 << 10,
        compression: save::Compression::parse(compression).unwrap(),
        // demo-zstd.tpk stays the 1.4 file it was; demo-packed.tpk takes the default.
        manifest_compression: (name == "demo-zstd.tpk").then_some(false),
        ..Default::default()
    }
}

/// The encrypted golden file (format 1.7): `demo.tpk` encrypted with the 32-byte key of bytes
/// 0..32, with the data key and salt fixed (docs/format.md section 13).
const ENCRYPTED: (&str, &str) = ("demo-encrypted.tpk", "demo.tpk");

fn golden_key() -> KeySource {
    KeySource::Key(std::array::from_fn(|i| i as u8))
}

fn encrypted_at(p: &Path) -> Location {
    Location::parse(p.to_str().unwrap()).unwrap().with_fixed_encryption(golden_key(), [0x42; 32], [0x24; 32])
}

/// All files of a location, relative path → bytes.
fn files(root: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = vec![];
    if root.is_file() {
        out.push((String::new(), std::fs::read(root).unwrap()));
        return out;
    }
    for e in files::walk(root) {
        let rel = e.strip_prefix(root).unwrap().to_string_lossy().into_owned();
        out.push((rel, std::fs::read(&e).unwrap()));
    }
    out.sort();
    out
}

fn hashes_text() -> String {
    hashes_text_of(&golden_dir())
}

/// BLAKE3SUMS of the golden locations in `dir`.
fn hashes_text_of(dir: &Path) -> String {
    let names: &[&str] = if dir.ends_with("v1.3") { &NAMES_V1_3 } else { &NAMES };
    let mut s = String::new();
    for &name in names {
        for (rel, bytes) in files(&dir.join(name)) {
            let path = if rel.is_empty() { name.to_string() } else { format!("{name}/{rel}") };
            s.push_str(&format!("{}  {}\n", hash::Hash32::of(&bytes).to_hex(), path));
        }
    }
    let doc = std::fs::read(dir.join(TRANSPORT.0)).unwrap_or_default();
    s.push_str(&format!("{}  {}\n", hash::Hash32::of(&doc).to_hex(), TRANSPORT.0));
    if !dir.ends_with("v1.3") {
        let enc = std::fs::read(dir.join(ENCRYPTED.0)).unwrap_or_default();
        s.push_str(&format!("{}  {}\n", hash::Hash32::of(&enc).to_hex(), ENCRYPTED.0));
    }
    s
}

#[test]
fn golden_files_are_reproduced_byte_for_byte() {
    let tmp = tempfile::tempdir().unwrap();
    if std::env::var_os("TREEPACK_BLESS").is_some() {
        let g = golden_dir();
        std::fs::create_dir_all(&g).unwrap();
        for name in NAMES {
            let _ = std::fs::remove_dir_all(g.join(name));
            let _ = std::fs::remove_file(g.join(name));
            save(&tree_for(name), g.join(name).to_str().unwrap(), &options(name)).unwrap();
        }
        std::fs::write(g.join(TRANSPORT.0), transport_doc(&g.join(TRANSPORT.1))).unwrap();
        let _ = std::fs::remove_file(g.join(ENCRYPTED.0));
        save(&tree_for(ENCRYPTED.1), encrypted_at(&g.join(ENCRYPTED.0)), &options(ENCRYPTED.1)).unwrap();
        std::fs::write(g.join("BLAKE3SUMS"), hashes_text()).unwrap();
    }
    for name in NAMES {
        let fresh = tmp.path().join(name);
        save(&tree_for(name), fresh.to_str().unwrap(), &options(name)).unwrap();
        let committed = files(&golden_dir().join(name));
        assert!(!committed.is_empty(), "golden files missing; run with TREEPACK_BLESS=1");
        let produced = files(&fresh);
        assert_eq!(committed.len(), produced.len(), "{name}: file count changed");
        for ((ra, a), (rb, b)) in committed.iter().zip(&produced) {
            assert_eq!(ra, rb, "{name}: file names changed");
            assert!(
                a == b,
                "{name}/{ra}: bytes changed — the format changed; if deliberate, bump docs/format.md and re-bless"
            );
        }
    }
    let doc = std::fs::read_to_string(golden_dir().join(TRANSPORT.0)).unwrap();
    assert!(
        doc == transport_doc(&tmp.path().join(TRANSPORT.1)),
        "{}: the transport document changed; if deliberate, bump docs/format.md section 11 and re-bless",
        TRANSPORT.0
    );
    let back = load(golden_dir().join(TRANSPORT.0).to_str().unwrap(), &LoadOptions::default()).unwrap();
    assert!(back.exact_eq(&tree_for(TRANSPORT.1)));
    let fresh = tmp.path().join(ENCRYPTED.0);
    save(&tree_for(ENCRYPTED.1), encrypted_at(&fresh), &options(ENCRYPTED.1)).unwrap();
    assert!(
        std::fs::read(&fresh).unwrap() == std::fs::read(golden_dir().join(ENCRYPTED.0)).unwrap(),
        "{}: bytes changed — the format changed; if deliberate, bump docs/format.md section 13 and re-bless",
        ENCRYPTED.0
    );
    let listed = std::fs::read_to_string(golden_dir().join("BLAKE3SUMS")).unwrap();
    assert_eq!(listed, hashes_text(), "BLAKE3SUMS does not match the golden files");
}

/// The encrypted golden file opens with its key (any reader's data key comes from its
/// envelope), holds the demo tree with `demo.tpk`'s root hash, and is refused without the key.
#[test]
fn the_encrypted_golden_file_loads_with_its_key() {
    let p = golden_dir().join(ENCRYPTED.0);
    let loc = Location::parse(p.to_str().unwrap()).unwrap().with_encryption(golden_key()).unwrap();
    let r = open(loc.clone()).unwrap();
    assert_eq!(r.manifest().version, (1, 7));
    let plain = open(golden_dir().join(ENCRYPTED.1).to_str().unwrap()).unwrap();
    assert_eq!(r.root_hash(), plain.root_hash());
    assert!(load(loc, &LoadOptions::default()).unwrap().exact_eq(&tree_for(ENCRYPTED.1)));
    assert!(r.verify().unwrap().ok());
    let e = load(p.to_str().unwrap(), &LoadOptions::default()).unwrap_err();
    assert_eq!(e.kind(), "encrypted", "{e}");
    assert!(e.to_string().contains(&treepack::format::crypt::key_id(&std::array::from_fn(|i| i as u8))), "{e}");
}

#[test]
fn golden_files_load_to_the_demo_tree() {
    golden_files_in_load_to_the_demo_tree(&golden_dir(), &NAMES, |name| match name {
        "demo-dtypes" => 5,
        "demo-packed.tpk" => 6,
        _ => 4,
    });
    // The packed manifest is the plain one, compressed: the same JSON, hash included.
    let packed = std::fs::read(golden_dir().join("demo-packed.tpk")).unwrap();
    let plain = std::fs::read(golden_dir().join("demo-zstd.tpk")).unwrap();
    assert!(packed.len() < plain.len());
}

/// Files written by earlier versions (the golden files of format 1.3, before dicts were
/// written as objects) load unchanged, and are still the bytes those writers made.
#[test]
fn files_of_earlier_versions_still_load() {
    let dir = golden_dir().join("v1.3");
    golden_files_in_load_to_the_demo_tree(&dir, &NAMES_V1_3, |name| match name {
        "demo-torch" => 3,
        "demo-refs" => 2,
        n if n.contains('-') => 1,
        _ => 0,
    });
    let listed = std::fs::read_to_string(dir.join("BLAKE3SUMS")).unwrap();
    assert_eq!(listed, hashes_text_of(&dir), "tests/golden/v1.3 must stay as earlier writers made it");
    let back = load(dir.join(TRANSPORT.0).to_str().unwrap(), &LoadOptions::default()).unwrap();
    assert!(back.exact_eq(&tree_for(TRANSPORT.1)));
}

fn golden_files_in_load_to_the_demo_tree(dir: &Path, names: &[&str], minor_of: impl Fn(&str) -> u16) {
    for &name in names {
        let tree = tree_for(name);
        let p = dir.join(name);
        let r = open(p.to_str().unwrap()).unwrap();
        let codecs: std::collections::BTreeSet<&str> = {
            let mut v = std::collections::BTreeSet::new();
            r.manifest().root.for_each_leaf(&mut |_, e| v.extend(e.chunks().iter().map(|c| c.codec.name())));
            v
        };
        let want: &[&str] = match name {
            "demo-zstd.tpk" | "demo-packed.tpk" => &["raw", "shuffle+zstd", "zstd"],
            "demo-lz4" => &["lz4", "raw", "shuffle+lz4"],
            _ => &["raw"],
        };
        assert_eq!(codecs.into_iter().collect::<Vec<_>>(), want, "{name}: the codecs it covers");
        assert_eq!(r.manifest().version, (1, minor_of(name)), "{name}");
        let back = load(p.to_str().unwrap(), &LoadOptions::default()).unwrap();
        assert!(back.exact_eq(&tree), "{name}");
        assert!(open(p.to_str().unwrap()).unwrap().verify().unwrap().ok());
    }
}

/// What a reader of an older format does with a 1.5 file: a dtype name it does not know (as
/// `int4` is to a 1.4 reader, whose table lacks it) is refused as the manifest is read, with an
/// error naming the dtype and where it is, never misread. Here `demo-dtypes` with its `int4`
/// arrays renamed `int3` (which no treepack has) stands for it; a 1.4 build reading the golden
/// file itself says "invalid manifest at `float8_e3m4`: unknown or invalid dtype `float8_e3m4`:
/// not a treepack dtype name" (CHANGELOG.md).
#[test]
fn a_dtype_this_reader_does_not_know_is_refused_by_name() {
    let src = golden_dir().join("demo-dtypes");
    let text = std::fs::read(src.join("treepack.json")).unwrap();
    let body = String::from_utf8(text[..text.len() - manifest::HASH_TRAILER_LEN].to_vec()).unwrap();
    assert!(body.contains("\"dtype\":\"int4\""));
    let body = body.replace("\"dtype\":\"int4\"", "\"dtype\":\"int3\"");
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("t");
    std::fs::create_dir_all(dst.join("packs")).unwrap();
    for (rel, bytes) in files(&src) {
        std::fs::write(dst.join(rel), bytes).unwrap();
    }
    std::fs::write(dst.join("treepack.json"), manifest::seal(body.as_bytes())).unwrap();
    for e in [open(dst.to_str().unwrap()).err(), load(dst.to_str().unwrap(), &LoadOptions::default()).err()] {
        let e = e.expect("refused");
        let msg = e.to_string();
        assert!(msg.contains("`int4`") && msg.contains("dtype `int3`") && msg.contains("upgrade treepack"), "{msg}");
    }
}

/// A writer stamps the oldest version that holds its tree: 1.5 only when an array (or a struct
/// field) has a 1.5 dtype, whatever else the tree holds; without one, what it was before 1.5.
#[test]
fn a_tree_is_format_1_5_only_with_a_1_5_dtype() {
    let tmp = tempfile::tempdir().unwrap();
    let arr = |d: DType, n: usize| Node::from(ArrayData::new(d, vec![n as u64], vec![1u8; n]).unwrap());
    let q = DType::Struct(vec![dtype::Field { name: "q".into(), dtype: DType::U4, shape: vec![] }]);
    let cases = [
        ("plain", Node::list([arr(DType::U8, 1000)]), (1, 0)),
        ("int4", Node::list([arr(DType::I4, 1000)]), (1, 5)),
        ("inline uint1", Node::list([arr(DType::U1, 3)]), (1, 5)),
        ("struct field", Node::list([arr(q, 3)]), (1, 5)),
        ("dict", Node::dict([("a", arr(DType::U8, 3))]), (1, 4)),
        ("dict and float4", Node::dict([("a", arr(DType::F4E2M1FN, 3))]), (1, 5)),
    ];
    for (i, (what, tree, version)) in cases.into_iter().enumerate() {
        let p = tmp.path().join(i.to_string());
        save(&tree, p.to_str().unwrap(), &SaveOptions::default()).unwrap();
        let r = open(p.to_str().unwrap()).unwrap();
        assert_eq!(r.manifest().version, version, "{what}");
        assert!(load(p.to_str().unwrap(), &LoadOptions::default()).unwrap().exact_eq(&tree), "{what}");
    }
}
