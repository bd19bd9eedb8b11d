//! The root hash (docs/format.md section 9): the spec's worked example and test vectors, and
//! the promise that the root does not depend on how or where a tree is stored.

use std::path::{Path, PathBuf};
use treepack::format::merkle;
use treepack::*;

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden")
}

fn spec() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/format.md")).unwrap()
}

fn hex(data: &[u8]) -> String {
    blake3::hash(data).to_hex().to_string()
}

/// The rows of the spec's test-vector table: (golden location, root).
fn vectors() -> Vec<(String, String)> {
    let text = spec();
    let start = text.find("<!-- root vectors -->").expect("the spec has a root vector table");
    text[start..]
        .lines()
        .skip(3)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(|c| c.trim().trim_matches('`')).collect();
            (cells[1].to_string(), cells[2].to_string())
        })
        .collect()
}

#[test]
fn the_spec_example_hashes_as_written() {
    // {"a": [1, 2.5], "b": "hi"}: the list is a container (hashed on its own), the string a leaf
    // written in place as its BLAKE3 and size.
    let tree = Node::dict([("a", Node::list([Node::from(1i64), Node::from(2.5f64)])), ("b", Node::from("hi"))]);
    let list = "[1,2.5]";
    let dict = format!(
        r#"{{"items":[["a","{}"],["b",{{"blake3":"{}","size":2,"t":"str"}}]],"t":"dict"}}"#,
        hex(list.as_bytes()),
        hex(b"hi")
    );
    let dir = tempfile::tempdir().unwrap();
    let loc = dir.path().join("t");
    save(&tree, loc.to_str().unwrap(), &SaveOptions::default()).unwrap();
    let root = root_hash(loc.to_str().unwrap()).unwrap();
    assert_eq!(root.to_hex(), hex(dict.as_bytes()));
    let text = spec();
    assert!(text.contains(list) && text.contains(&hex(list.as_bytes())), "the spec shows the list's encoding and hash");
    assert!(text.contains(&root.to_hex()), "the spec shows the example's root {}", root.to_hex());
}

#[test]
fn golden_roots_are_the_spec_vectors() {
    let v = vectors();
    assert_eq!(v.len(), 7, "one vector per golden location: {v:?}");
    for (name, want) in v {
        let got = root_hash(golden_dir().join(&name).to_str().unwrap()).unwrap();
        assert_eq!(got.to_hex(), want, "{name}");
    }
}

#[test]
fn the_root_does_not_depend_on_layout_codec_inlining_or_location() {
    let demo = root_hash(golden_dir().join("demo").to_str().unwrap()).unwrap();
    for name in ["demo.tpk", "demo-zstd.tpk", "demo-lz4"] {
        assert_eq!(root_hash(golden_dir().join(name).to_str().unwrap()).unwrap(), demo, "{name}");
    }
    // Strings and bytes in packs or inline, arrays inline or as one chunk: the same root.
    let long = "x".repeat(300);
    let tree = Node::dict([
        ("s", Node::from(long.as_str())),
        ("b", Node::from(vec![7u8; 200])),
        ("a", Node::from(ArrayData::new(DType::I32, vec![3, 5], vec![1u8; 60]).unwrap())),
        ("e", Node::from(ArrayData::new(DType::F64, vec![0, 4], vec![]).unwrap())),
        ("z", Node::from(ArrayData::new(DType::U8, vec![], vec![9]).unwrap())),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let inline = SaveOptions { inline_bytes: 1 << 20, inline_str_bytes: 1 << 20, ..Default::default() };
    let stored = SaveOptions { inline_bytes: 0, inline_str_bytes: 0, ..Default::default() };
    let a = dir.path().join("inline");
    let b = dir.path().join("stored.tpk");
    save(&tree, a.to_str().unwrap(), &inline).unwrap();
    save(&tree, b.to_str().unwrap(), &stored).unwrap();
    let ra = root_hash(a.to_str().unwrap()).unwrap();
    assert_eq!(ra, root_hash(b.to_str().unwrap()).unwrap());
    // Not a constant: one changed byte or key changes it.
    let other = Node::dict([("s", Node::from(long.as_str())), ("b", Node::from(vec![7u8; 199]))]);
    let c = dir.path().join("other");
    save(&other, c.to_str().unwrap(), &inline).unwrap();
    assert_ne!(root_hash(c.to_str().unwrap()).unwrap(), ra);
}

#[test]
fn a_shared_subtree_has_one_hash_wherever_it_is() {
    let sub = Node::dict([("w", Node::from(ArrayData::new(DType::F32, vec![4], vec![0u8; 16]).unwrap()))]);
    let a = Node::dict([("x", sub.clone()), ("n", Node::from(1i64))]);
    let b = Node::list([Node::from("other"), sub.clone()]);
    let dir = tempfile::tempdir().unwrap();
    for (name, t) in [("a", &a), ("b", &b)] {
        save(t, dir.path().join(name).to_str().unwrap(), &SaveOptions::default()).unwrap();
    }
    let ra = open(dir.path().join("a").to_str().unwrap()).unwrap();
    let rb = open(dir.path().join("b").to_str().unwrap()).unwrap();
    let (Tree::Dict(xa), Tree::List(xb)) = (&ra.manifest().root, &rb.manifest().root) else { panic!() };
    assert_eq!(merkle::node_hash(&xa[0].1), merkle::node_hash(&xb[1]));
}

#[test]
fn expect_root_refuses_another_tree_before_reading_data() {
    let demo = golden_dir().join("demo");
    let loc = demo.to_str().unwrap();
    let root = root_hash(loc).unwrap();
    let opts = LoadOptions { expect_root: Some(root), ..Default::default() };
    assert!(load(loc, &opts).unwrap().exact_eq(&demo::example_tree()));
    let wrong = Hash32::of(b"not this tree");
    let err = load(loc, &LoadOptions { expect_root: Some(wrong), ..Default::default() }).unwrap_err();
    assert_eq!(err.kind(), "root_mismatch");
    let msg = err.to_string();
    assert!(msg.contains(&root.to_hex()) && msg.contains(&wrong.to_hex()) && msg.contains("not the tree"), "{msg}");
    // Partial reads check it too.
    let r = open(loc).unwrap();
    let err =
        block_on(r.get_async("params", &LoadOptions { expect_root: Some(wrong), ..Default::default() })).unwrap_err();
    assert_eq!(err.kind(), "root_mismatch");
}

#[test]
fn a_copy_that_keeps_chunk_grids_keeps_the_root() {
    let src = golden_dir().join("demo");
    let r = open(src.to_str().unwrap()).unwrap();
    let mut tree = r.load(&LoadOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    // Saved with the default chunking (4 MiB chunks, not the golden 64 KiB): another root.
    let plain = dir.path().join("plain");
    save(&tree, plain.to_str().unwrap(), &SaveOptions::default()).unwrap();
    assert_ne!(root_hash(plain.to_str().unwrap()).unwrap(), r.root_hash());
    // With the stored grids kept, the same root whatever the codec.
    save::keep_chunk_shapes(&mut tree, &r.manifest().root);
    let kept = dir.path().join("kept.tpk");
    let opts = SaveOptions { compression: save::Compression::parse("zstd").unwrap(), ..Default::default() };
    save(&tree, kept.to_str().unwrap(), &opts).unwrap();
    assert_eq!(root_hash(kept.to_str().unwrap()).unwrap(), r.root_hash());
}

/// A tree holding subtrees already written as text (`Leaf::Fragment`, what the Python encoder
/// makes of plain values) saves exactly as the same tree of nodes: the same manifest, with the
/// default inline limit (fragments written as they are) and a lower one (expanded first), and
/// the same root in a repository (which hashes nodes).
#[test]
fn fragments_save_as_the_nodes_they_stand_for() {
    use treepack::format::manifest::FragmentWriter;
    let mut w = FragmentWriter::new();
    let m = w.mark();
    w.dict_begin();
    w.pair_begin("name");
    w.str("a string of some length");
    w.comma();
    w.pair_begin("xs");
    w.list_begin();
    w.int(1);
    w.comma();
    w.float(-0.0);
    w.list_end();
    w.dict_end();
    let frag = w.split_off(m);
    let arr = ArrayData::new(DType::F32, vec![64], vec![0u8; 256]).unwrap();
    let with = Node::dict([("cfg", Tree::Leaf(Leaf::Fragment(frag.clone()))), ("w", Node::from(arr.clone()))]);
    let nodes = Node::dict([("cfg", frag.to_node().unwrap()), ("w", Node::from(arr))]);
    assert!(with.expand_fragments().unwrap().exact_eq(&nodes));
    let dir = tempfile::tempdir().unwrap();
    let manifest = |tree: &Node, name: &str, opts: &SaveOptions| {
        let loc = dir.path().join(name);
        save(tree, loc.to_str().unwrap(), opts).unwrap();
        std::fs::read(loc.join("treepack.json")).unwrap()
    };
    let default = SaveOptions::default();
    let a = manifest(&with, "a", &default);
    assert_eq!(a, manifest(&nodes, "b", &default));
    assert!(String::from_utf8_lossy(&a).contains(r#""cfg":{"name":"a string of some length""#));
    let low = SaveOptions { inline_str_bytes: 8, ..Default::default() };
    let c = manifest(&with, "c", &low);
    assert_eq!(c, manifest(&nodes, "d", &low));
    assert!(String::from_utf8_lossy(&c).contains(r#""name":{"t":"str","size":23,"blob""#));
    let repo = dir.path().join("repo");
    Repository::create(repo.to_str().unwrap()).unwrap();
    let r1 = save(&with, format!("{}@f", repo.display()).as_str(), &default).unwrap();
    let r2 = save(&nodes, format!("{}@n", repo.display()).as_str(), &default).unwrap();
    assert_eq!(r1.root, r2.root);
    assert_eq!(r1.root, Some(root_hash(dir.path().join("a").to_str().unwrap()).unwrap()));
}
