//! JSON transport documents (docs/transport.md, docs/format.md section 11): export, read back
//! (in memory, or a `.json` file as a location), import, schema.

use std::path::{Path, PathBuf};
#[path = "support/files.rs"]
mod files;
use treepack::format::transport::{self as form, Encoding};
use treepack::transport::{self, ExportOptions};
use treepack::*;

fn golden(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden").join(name)
}

fn loaded(loc: impl IntoLocation) -> Node {
    load(loc, &LoadOptions::default()).unwrap()
}

#[test]
fn every_golden_tree_travels_as_a_document_with_its_values_and_root() {
    for name in ["demo", "demo.tpk", "demo-zstd.tpk", "demo-lz4", "demo-refs", "demo-torch"] {
        let p = golden(name);
        let p = p.to_str().unwrap();
        for encoding in [Encoding::Base85, Encoding::Base64] {
            let doc = transport::export(p, &ExportOptions { encoding, ..Default::default() }).unwrap();
            assert!(doc.starts_with(
                "{\"format\":\"treepack-json\",\"version\":[1,0],\n\"manifest\":{\"format\":\"treepack\""
            ));
            // Plain JSON: any parser reads it, and the structure is there to read.
            let v: serde_json::Value = serde_json::from_str(&doc).unwrap();
            assert_eq!(v["encoding"], encoding.name());
            assert_eq!(v["manifest"]["metadata"]["purpose"], "golden file for docs/format.md");
            let r = transport::open(doc.as_bytes()).unwrap();
            assert!(r.load(&LoadOptions::default()).unwrap().exact_eq(&loaded(p)), "{name}");
            assert_eq!(r.root_hash(), root_hash(p).unwrap(), "{name}: the root hash travels");
            assert!(r.verify().unwrap().ok());
            // Compressed chunks travel compressed.
            let codecs = |m: &Manifest| {
                let mut v = std::collections::BTreeSet::new();
                m.root.for_each_leaf(&mut |_, e| v.extend(e.chunks().iter().map(|c| c.codec.name())));
                v
            };
            assert_eq!(codecs(r.manifest()), codecs(open(p).unwrap().manifest()), "{name}");
        }
    }
}

#[test]
fn export_can_recompress_and_keeps_the_root() {
    let p = golden("demo");
    let p = p.to_str().unwrap();
    let plain = transport::export(p, &ExportOptions::default()).unwrap();
    let opts = ExportOptions { compression: Some(save::Compression::parse("zstd").unwrap()), ..Default::default() };
    let z = transport::export(p, &opts).unwrap();
    assert!(z.len() * 10 < plain.len(), "{} vs {}", z.len(), plain.len());
    let r = transport::open(z.as_bytes()).unwrap();
    assert_eq!(r.root_hash(), root_hash(p).unwrap());
    assert!(r.load(&LoadOptions::default()).unwrap().exact_eq(&loaded(p)));
    assert_eq!(r.manifest().writer, "treepack-golden");
}

#[test]
fn a_json_file_is_a_read_only_location_and_import_stores_it() {
    let d = tempfile::tempdir().unwrap();
    let src = golden("demo-refs");
    let doc = d.path().join("tree.json");
    std::fs::write(&doc, transport::export(src.to_str().unwrap(), &ExportOptions::default()).unwrap()).unwrap();
    let docp = doc.to_str().unwrap();
    let want = loaded(src.to_str().unwrap());
    assert!(loaded(docp).exact_eq(&want));
    assert_eq!(root_hash(docp).unwrap(), root_hash(src.to_str().unwrap()).unwrap());
    let part = load(docp, &LoadOptions { select: vec!["model/params/**".into()], ..Default::default() }).unwrap();
    assert!(!part.exact_eq(&want));
    // Writing to it is refused, saying what to do.
    let e = save(&Node::from(1i64), docp, &SaveOptions { overwrite: true, ..Default::default() }).unwrap_err();
    assert_eq!(e.kind(), "read_only", "{e}");
    assert!(e.to_string().contains("treepack import"), "{e}");
    // Import into both layouts keeps values and root.
    for dst in ["back", "back.tpk"] {
        let dst = d.path().join(dst);
        let dst = dst.to_str().unwrap();
        let bytes = std::fs::read(&doc).unwrap();
        transport::import(&bytes, dst, &SaveOptions::default()).unwrap();
        assert!(loaded(dst).exact_eq(&want));
        assert_eq!(root_hash(dst).unwrap(), root_hash(docp).unwrap());
        let e = transport::import(&bytes, dst, &SaveOptions::default()).unwrap_err();
        assert_eq!(e.kind(), "already_exists");
    }
}

#[test]
fn a_repository_tree_exports_only_its_own_chunks() {
    let (_d, repo) = files::temp_place("repo");
    let repo = repo.as_str();
    Repository::create(repo).unwrap();
    let big = Node::from(
        ArrayData::new(DType::U8, vec![1 << 20], (0..1u32 << 20).map(|i| (i * 7) as u8).collect::<Vec<u8>>()).unwrap(),
    );
    save(&Node::dict([("big", big)]), format!("{repo}@a"), &SaveOptions::default()).unwrap();
    let small = Node::dict([("x", Node::from(ArrayData::new(DType::U8, vec![1000], vec![3; 1000]).unwrap()))]);
    save(&small, format!("{repo}@b"), &SaveOptions::default()).unwrap();
    let doc = transport::export(format!("{repo}@b").as_str(), &ExportOptions::default()).unwrap();
    assert!(doc.len() < 4000, "{} bytes", doc.len());
    assert!(transport::open(doc.as_bytes()).unwrap().load(&LoadOptions::default()).unwrap().exact_eq(&small));
}

#[test]
fn trees_without_chunks_and_empty_trees_travel() {
    for tree in [
        Node::dict([("a", Node::from(1i64)), ("s", Node::from("x"))]),
        Node::list([]),
        Node::from(ArrayData::new(DType::F32, vec![0, 3], vec![]).unwrap()),
    ] {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("t");
        save(&tree, p.to_str().unwrap(), &SaveOptions::default()).unwrap();
        let doc = transport::export(p.to_str().unwrap(), &ExportOptions::default()).unwrap();
        assert!(doc.ends_with(",\n\"encoding\":\"base85\",\n\"data\":\"\"}\n"), "{doc}");
        assert!(transport::open(doc.as_bytes()).unwrap().load(&LoadOptions::default()).unwrap().exact_eq(&tree));
    }
}

/// A document whose manifest is re-sealed after `edit` (so its checksum holds) and whose data is
/// `data`.
fn resealed(doc: &str, edit: impl Fn(&str) -> String, data: Option<&[u8]>) -> Vec<u8> {
    let d = form::read(doc.as_bytes(), "t").unwrap();
    let text = String::from_utf8(d.manifest).unwrap();
    let body = &text[..text.len() - format::manifest::HASH_TRAILER_LEN];
    let m = format::manifest::seal(edit(body).as_bytes());
    form::write(&m, data.unwrap_or(&d.data), Encoding::Base85).into_bytes()
}

#[test]
fn malformed_documents_fail_with_what_is_wrong() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("t");
    let arr = |n: u64, v: u8| Node::from(ArrayData::new(DType::U8, vec![n], vec![v; n as usize]).unwrap());
    save(&Node::dict([("a", arr(300, 1)), ("b", arr(500, 2))]), p.to_str().unwrap(), &SaveOptions::default()).unwrap();
    let doc = transport::export(p.to_str().unwrap(), &ExportOptions::default()).unwrap();
    let swap = |from: &str, to: &str| doc.replacen(from, to, 1).into_bytes();
    let cut = doc.len() / 2;
    let cases: Vec<(&str, Vec<u8>, &str, &str)> = vec![
        ("empty", vec![], "not_treepack", "is empty"),
        ("cut in the signature", doc.as_bytes()[..12].to_vec(), "not_treepack", "cut short"),
        ("not JSON", b"[1, 2]".to_vec(), "not_treepack", "begins with"),
        ("a manifest", std::fs::read(p.join("treepack.json")).unwrap(), "not_treepack", "this is a manifest"),
        ("future major", swap("[1,0],\n\"manifest\"", "[2,0],\n\"manifest\""), "unsupported_version", "2.0"),
        ("truncated", doc.as_bytes()[..cut].to_vec(), "not_treepack", ""),
        (
            "no data",
            doc.as_bytes()[..doc.rfind(",\n\"data\"").unwrap()].iter().chain(b"}").copied().collect(),
            "not_treepack",
            "data",
        ),
        ("unknown encoding", swap("\"base85\"", "\"base91\""), "not_treepack", "unknown encoding"),
        ("bad base85", swap("\"data\":\"", "\"data\":\"\\\"\""), "not_treepack", ""),
        ("edited manifest", swap("\"leaves\":2", "\"leaves\":3"), "manifest_checksum", ""),
        ("short data", resealed(&doc, |m| m.to_string(), Some(&[0u8; 700])), "invalid_manifest", "need 800"),
        (
            "another pack",
            resealed(&doc, |m| m.replace("packs/transport.tpp", "packs/other.tpp"), None),
            "invalid_manifest",
            "one pack",
        ),
        (
            "gap",
            resealed(
                &doc,
                |m| m.replace("\"offset\":320", "\"offset\":384").replace("\"size\":820", "\"size\":884"),
                None,
            ),
            "invalid_manifest",
            "layout puts it at 320",
        ),
        (
            "huge size",
            resealed(&doc, |m| m.replace("\"size\":820", "\"size\":1000000000000"), None),
            "invalid_manifest",
            "size",
        ),
    ];
    for (what, bytes, kind, says) in cases {
        let e = transport::open(&bytes).expect_err(what);
        assert_eq!(e.kind(), kind, "{what}: {e}");
        assert!(e.to_string().contains(says), "{what}: {e}");
    }
}

#[test]
fn the_schema_describes_the_tree_type() {
    let s = transport::schema(golden("demo-refs").to_str().unwrap()).unwrap();
    let v: serde_json::Value = serde_json::from_str(&s).unwrap();
    assert_eq!(v["$schema"], "https://json-schema.org/draft/2020-12/schema");
    assert_eq!(v["properties"]["format"]["const"], "treepack-json");
    let root = &v["properties"]["manifest"]["properties"]["root"];
    // A dict of string keys: an object (format 1.4), or the `items` form earlier writers made.
    let (object, items) = (&root["anyOf"][0], &root["anyOf"][1]);
    assert_eq!(object["required"], serde_json::json!(["again", "cycle", "model"]));
    assert_eq!(object["properties"]["again"]["properties"]["t"]["const"], "ref");
    assert_eq!(items["properties"]["t"]["const"], "dict");
    assert_eq!(items["properties"]["items"]["prefixItems"][0]["prefixItems"][0]["const"], "model");
    assert_eq!(items["properties"]["items"]["prefixItems"][1]["prefixItems"][1]["properties"]["t"]["const"], "ref");
    assert!(s.contains("\"treepackShape\""), "{s}");
}
