//! torch.distributed.checkpoint folders read without pickle (issue 54): folders written by real
//! `torch.distributed.checkpoint.save` (`tests/data/dcp/make_fixtures.py`: a nested state_dict of
//! many dtypes and plain values, a model with its AdamW state from `get_state_dict`, DTensors
//! sharded over two ranks of a gloo group), each entry compared with what torch gave
//! (`expected.json`); the folder as a location (load, read-only, convert); and the hostile
//! corpus (`tests/data/dcp/hostile/`, `EXPECTED.tsv`), each case read in a child process with a
//! time and memory limit beside canary files, refused with its kind and a message naming what.

#[path = "support/child.rs"]
mod child;

use std::path::{Path, PathBuf};
use treepack::foreign::{dcp, torch};
use treepack::*;

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/dcp").join(name)
}

fn expected() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(data("expected.json")).unwrap()).unwrap()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A node as `make_fixtures.py` writes the values it saved: tensors as their dtype, shape and
/// bytes; tuples and lists as lists; dicts as objects.
fn render(n: &Node, path: &str) -> serde_json::Value {
    use serde_json::json;
    match n {
        Tree::Leaf(Leaf::Array(a)) => {
            let ann = a.annotation().unwrap_or_else(|| panic!("{path}: no annotation"));
            assert_eq!(ann["type"], "torch.Tensor", "{path}");
            json!({"tensor": {"dtype": torch::torch_dtype_name(a.dtype()), "shape": a.shape(), "hex": hex(a.bytes())}})
        }
        Tree::Leaf(Leaf::None) => json!(null),
        Tree::Leaf(Leaf::Bool(b)) => json!(b),
        Tree::Leaf(Leaf::Int(i)) => json!(i.as_i64().unwrap()),
        Tree::Leaf(Leaf::Float(f)) => json!(f),
        Tree::Leaf(Leaf::Str(s)) => json!(s),
        Tree::List(v) | Tree::Tuple(v) => {
            v.iter().enumerate().map(|(i, c)| render(c, &format!("{path}/{i}"))).collect()
        }
        Tree::Dict(items) => serde_json::Value::Object(
            items
                .iter()
                .map(|(k, v)| {
                    let Key::Str(k) = k else { panic!("{path}: key {k:?}") };
                    (k.clone(), render(v, &format!("{path}/{k}")))
                })
                .collect(),
        ),
        other => panic!("{path}: a {}", other.container_kind()),
    }
}

/// The fixture `name` read, checked against what torch saved: every entry, in the metadata's
/// order, flat.
fn check(name: &str, tree: &Node) {
    let exp = &expected()[name];
    let Tree::Dict(items) = tree else { panic!("{name}: not a dict") };
    let keys: Vec<&str> = items
        .iter()
        .map(|(k, _)| match k {
            Key::Str(s) => s.as_str(),
            k => panic!("{k:?}"),
        })
        .collect();
    let order: Vec<&str> = exp["order"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(keys, order, "{name}: the entries in the metadata's order");
    for (k, v) in items {
        let Key::Str(k) = k else { unreachable!() };
        assert_eq!(render(v, k), exp["values"][k], "{name}: {k}");
    }
}

#[test]
fn real_checkpoints_read_with_every_entry() {
    for name in ["state", "optim", "sharded"] {
        let (tree, metadata) = dcp::read(&data(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        check(name, &tree);
        let m = metadata.unwrap();
        assert_eq!(m["format"], "pt");
        assert_eq!(m["dcp_version"], "1.0.0");
    }
}

#[test]
fn a_sharded_tensor_is_assembled_from_its_chunks() {
    // Rows split 3 + 2 over two files, columns in two blocks, the middle dimension of a 3-d
    // tensor, and a row only one rank held (the other's chunk is empty).
    let (tree, _) = dcp::read(&data("sharded")).unwrap();
    let Tree::Dict(items) = &tree else { panic!() };
    let cols = items.iter().find(|(k, _)| *k == Key::Str("cols".into())).unwrap().1.as_array().unwrap();
    let want: Vec<u8> = (0..24i32).flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(cols.bytes().as_ref(), &want[..]);
    assert_eq!(cols.shape(), &[4, 6]);
}

#[test]
fn a_folder_is_a_read_only_location() {
    let dir = data("optim");
    let s = dir.to_str().unwrap();
    let loc = Location::parse(s).unwrap();
    assert_eq!(loc.read_from(), Some("torch.distributed checkpoint"));
    assert_eq!(convert::detect_format(s, true), "dcp");
    let tree = load(s, &LoadOptions::default()).unwrap();
    check("optim", &tree);
    let e = save(&tree, s, &SaveOptions { overwrite: true, ..Default::default() }).unwrap_err();
    assert!(e.to_string().contains("torch.distributed checkpoint folder is read as a tree"), "{e}");
    // Converted to a .tpk, it loads as the same tree.
    let out = tempfile::tempdir().unwrap();
    let dst = out.path().join("x.tpk");
    let dst_s = dst.to_str().unwrap();
    let from = convert::Format::of_source(s, None).unwrap();
    assert_eq!(from, convert::Format::Checkpoint("dcp"));
    convert::convert(
        &Location::parse(s).unwrap(),
        &Location::parse(dst_s).unwrap(),
        from,
        convert::Format::Treepack,
        &convert::ConvertOptions::default(),
    )
    .unwrap();
    check("optim", &load(dst_s, &LoadOptions::default()).unwrap());
}

/// A copy of the fixture `name` in a fresh folder.
fn copy(name: &str) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(data(name)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), d.path().join(e.file_name())).unwrap();
    }
    d
}

#[test]
fn links_in_the_folder_are_refused() {
    // A data file that is a link (to a file outside), then a .metadata that is one.
    let outside = copy("state");
    let d = copy("state");
    std::fs::remove_file(d.path().join("__0_0.distcp")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("__0_0.distcp"), d.path().join("__0_0.distcp")).unwrap();
    let e = dcp::read(d.path()).unwrap_err();
    assert_eq!(e.kind(), "link", "{e}");
    assert!(e.to_string().contains("__0_0.distcp"), "{e}");
    let d = copy("state");
    std::fs::remove_file(d.path().join(".metadata")).unwrap();
    std::os::unix::fs::symlink(outside.path().join(".metadata"), d.path().join(".metadata")).unwrap();
    assert_eq!(dcp::read(d.path()).unwrap_err().kind(), "link");
}

fn corpus() -> PathBuf {
    data("hostile")
}

/// `kind: message` of reading one case: a folder through the DCP reader, a `.pt` through the
/// torch.save reader. Pickle errors are `pickle/<its kind>`.
fn outcome(path: &Path) -> String {
    let r = if path.extension().is_some_and(|e| e == "pt") {
        torch::read(path).map(|_| ())
    } else {
        dcp::read(path).map(|_| ())
    };
    match r {
        Ok(()) => "ok".into(),
        Err(Error::Pickle { source, file }) => format!("pickle/{}: {file}: {source}", source.kind()),
        Err(e) => format!("{}: {e}", e.kind()),
    }
}

#[test]
fn one_hostile_dcp_case() {
    // The child half: run by `every_hostile_dcp_case_is_refused` with a case's path.
    if let Some(path) = child::case() {
        println!("outcome {}", outcome(&path));
    }
}

#[test]
fn every_hostile_dcp_case_is_refused() {
    let text = std::fs::read_to_string(corpus().join("EXPECTED.tsv")).unwrap();
    let rows: Vec<Vec<&str>> =
        text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).map(|l| l.split('\t').collect()).collect();
    assert!(rows.len() >= 30, "{} cases", rows.len());
    let out = child::Outside::new();
    let mut wrong = vec![];
    for r in &rows {
        let (name, kind, needle, what) = (r[0], r[1], r[2], r[3]);
        let got = child::run("one_hostile_dcp_case", &corpus().join(name));
        let got = got.strip_prefix("outcome ").unwrap_or(&got);
        if !got.starts_with(&format!("{kind}: ")) {
            wrong.push(format!("{name} ({what}): expected {kind}, got {got}"));
        } else if !got.contains(needle) {
            wrong.push(format!("{name} ({what}): the message does not say {needle:?}: {got}"));
        } else if !got.contains(name) {
            wrong.push(format!("{name}: the message does not name the file: {got}"));
        }
    }
    assert!(wrong.is_empty(), "{} of {} cases wrong:\n{}", wrong.len(), rows.len(), wrong.join("\n"));
    out.assert_unchanged();
    assert!(!Path::new("/tmp/treepack-pwned").exists(), "a gadget ran");
}

#[test]
fn mutated_folders_read_or_fail_typed() {
    // Random byte flips and cuts of the metadata and of a data file of real checkpoints: each
    // read ends in the tree or an error, never a panic (the pickle reader itself is fuzzed by
    // the `pickle` target, which reads every input as a .metadata too).
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for (name, file) in [("sharded", ".metadata"), ("state", ".metadata"), ("sharded", "__1_0.distcp")] {
        let d = copy(name);
        let path = d.path().join(file);
        let good = std::fs::read(&path).unwrap();
        for _ in 0..150 {
            let mut b = good.clone();
            if next() % 8 == 0 {
                b.truncate((next() % b.len() as u64) as usize);
            } else {
                for _ in 0..1 + next() % 4 {
                    let i = (next() % b.len() as u64) as usize;
                    b[i] ^= 1 << (next() % 8);
                }
            }
            std::fs::write(&path, &b).unwrap();
            let _ = dcp::read(d.path());
        }
    }
}
