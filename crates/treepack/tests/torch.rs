//! torch.save checkpoints read without pickle (issue 54): fixtures written by real torch
//! (`tests/data/torch/make_fixtures.py`), each tensor compared with the bytes torch gave for it
//! (`expected.json`), and the plain values of the tree checked one by one.

use std::path::PathBuf;
use treepack::foreign::torch;
use treepack::format::pickle::torch::Item;
use treepack::*;

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/torch").join(name)
}

fn expected() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(data("expected.json")).unwrap()).unwrap()
}

/// The node at `path` (`/`-separated: str keys, int keys and list indexes by their text).
fn get<'a, L>(t: &'a Tree<L>, path: &str) -> &'a Tree<L> {
    let mut at = t;
    for seg in path.split('/') {
        at = match at {
            Tree::Dict(items) => {
                &items
                    .iter()
                    .find(|(k, _)| match k {
                        Key::Str(s) => s == seg,
                        Key::Int(i) => i.to_string() == seg,
                        _ => false,
                    })
                    .unwrap_or_else(|| panic!("no key {seg} in {path}"))
                    .1
            }
            Tree::List(v) | Tree::Tuple(v) => &v[seg.parse::<usize>().unwrap()],
            // An OrderedDict (py.ordereddict) or a numpy scalar (py.npscalar): named children.
            Tree::Custom { children, .. } => {
                &children.iter().find(|(k, _)| k == seg).unwrap_or_else(|| panic!("no child {seg} in {path}")).1
            }
            other => panic!("{path}: {seg} in a {}", other.container_kind()),
        };
    }
    at
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn check_file(name: &str) -> Node {
    let tree = torch::read(data(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let exp = &expected()[name];
    let exp = exp.as_object().unwrap();
    assert!(!exp.is_empty());
    for (path, e) in exp {
        let a = get(&tree, path).as_array().unwrap_or_else(|| panic!("{name} {path}: not an array"));
        assert_eq!(a.dtype().name().unwrap(), e["dtype"].as_str().unwrap(), "{name} {path}");
        let shape: Vec<u64> = e["shape"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        assert_eq!(a.shape(), &shape[..], "{name} {path}");
        assert_eq!(hex(a.bytes()), e["hex"].as_str().unwrap(), "{name} {path}: values");
        let ann = a.annotation().unwrap();
        let want_type = if e["parameter"].as_bool().unwrap() { "torch.nn.Parameter" } else { "torch.Tensor" };
        assert_eq!(ann["type"], want_type, "{name} {path}");
    }
    tree
}

#[test]
fn a_state_dict_reads_with_every_tensor_and_value() {
    let t = check_file("state_dict.pt");
    // The root is an OrderedDict, as treepack writes one (py.ordereddict, items by name).
    let Tree::Custom { type_name, children, .. } = &t else { panic!("root is not an OrderedDict") };
    assert_eq!(type_name, "py.ordereddict");
    let keys: Vec<&str> = children.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys.len(), 14, "{keys:?}");
    assert_eq!(keys[0], "w", "order kept: {keys:?}");
    let leaf = |p: &str| match get(&t, p) {
        Tree::Leaf(l) => l.clone(),
        other => panic!("{p}: {other:?}"),
    };
    assert_eq!(leaf("nested/n"), Leaf::Int(7.into()));
    assert_eq!(leaf("nested/x"), Leaf::Float(2.5));
    assert_eq!(leaf("nested/s"), Leaf::Str("text".into()));
    assert_eq!(leaf("nested/none"), Leaf::None);
    assert_eq!(leaf("nested/big"), Leaf::Int(Int::parse("1180591620717411303424").unwrap()));
    assert_eq!(leaf("nested/list/1"), Leaf::Str("two".into()));
    assert_eq!(leaf("nested/tuple/0"), Leaf::Bool(true));
    // torch.Size, an OrderedDict and a numpy scalar as treepack writes them, so they load as
    // the same types.
    assert!(matches!(get(&t, "nested/size"), Tree::Custom { type_name, .. } if type_name == "py.torch_size"));
    assert!(matches!(get(&t, "nested/size/dims"), Tree::List(v) if v.len() == 2));
    assert!(matches!(get(&t, "nested/inner"), Tree::Custom { type_name, .. } if type_name == "py.ordereddict"));
    assert!(matches!(get(&t, "nested"), Tree::Dict(_)), "a dict stays a dict");
    // The Parameter keeps its kind and requires_grad.
    let p = get(&t, "param").as_array().unwrap();
    assert_eq!(p.annotation().unwrap()["requires_grad"], true);
    // numpy values: a big-endian array read as little-endian, a Fortran-order array in C order,
    // a numpy scalar (py.npscalar) of a 0-d array.
    let n = get(&t, "numpy").as_array().unwrap();
    assert_eq!((n.dtype(), n.shape()), (&DType::I32, &[4u64][..]));
    assert_eq!(&n.bytes()[..], &[0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0]);
    let f = get(&t, "fortran").as_array().unwrap();
    let vals: Vec<f64> = f.bytes().chunks(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!((f.shape(), vals), (&[2u64, 3][..], vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]));
    let s = get(&t, "np_scalar/value").as_array().unwrap();
    assert_eq!((s.shape(), &s.bytes()[..]), (&[][..], &1.5f64.to_le_bytes()[..]));
    assert!(
        matches!(get(&t, "set"), Tree::Custom { type_name, children, .. } if type_name == "py.set" && children.len() == 2)
    );
}

#[test]
fn tensors_sharing_a_storage_share_its_bytes() {
    let t = torch::read(data("state_dict.pt")).unwrap();
    let (a, b) = (get(&t, "a").as_array().unwrap(), get(&t, "b").as_array().unwrap());
    // Both views are slices of the one storage read: b starts 6 floats after a.
    assert_eq!(a.bytes().as_ptr() as usize + 24, b.bytes().as_ptr() as usize);
    let s = torch::read_structure(data("state_dict.pt")).unwrap();
    let Tree::Leaf(Item::Tensor(bt)) = get(&s.tree, "b") else { panic!() };
    assert_eq!((bt.offset, &bt.shape[..], &bt.stride[..]), (6, &[2u64, 3][..], &[3u64, 1][..]));
    let Tree::Leaf(Item::Tensor(wt)) = get(&s.tree, "wt") else { panic!() };
    assert!(!wt.is_contiguous());
    assert_eq!(s.storages[&bt.storage].tensors, 2);
}

#[test]
fn an_optimizer_state_dict_reads() {
    let t = check_file("optimizer.pt");
    // AdamW's param_groups: floats, bools, a list of parameter indexes.
    let g = get(&t, "param_groups/0");
    assert!(matches!(get(g, "lr"), Tree::Leaf(Leaf::Float(x)) if *x == 1e-3));
    assert!(matches!(get(g, "params"), Tree::List(v) if v.len() == 4));
    assert!(matches!(get(g, "amsgrad"), Tree::Leaf(Leaf::Bool(false))));
}

#[test]
fn a_model_state_dict_and_offsets_read() {
    check_file("model.pt");
    let t = check_file("offset.pt");
    let s = torch::read_structure(data("offset.pt")).unwrap();
    let Tree::Leaf(Item::Tensor(x)) = get(&s.tree, "alone") else { panic!() };
    assert_eq!(x.offset, 10);
    assert!(get(&t, "slice").as_array().is_some());
}

#[test]
fn the_structure_reads_without_tensor_bytes() {
    let s = torch::read_structure(data("state_dict.pt")).unwrap();
    let Tree::Leaf(Item::Tensor(w)) = get(&s.tree, "nested/inner/bf") else { panic!() };
    assert_eq!((&w.dtype, &w.shape[..]), (&DType::BF16, &[3u64][..]));
    assert!(!s.big_endian);
}

#[test]
fn sniff_tells_zip_from_legacy() {
    assert_eq!(torch::sniff(&std::fs::read(data("model.pt")).unwrap()), torch::Sniffed::Zip);
    assert_eq!(torch::sniff(&std::fs::read(data("hostile/legacy.pt")).unwrap()), torch::Sniffed::Legacy);
    assert_eq!(torch::sniff(b"hello"), torch::Sniffed::Other);
}

#[cfg(unix)]
#[test]
fn a_link_to_a_checkpoint_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let link = d.path().join("link.pt");
    std::os::unix::fs::symlink(data("model.pt"), &link).unwrap();
    let e = torch::read(&link).unwrap_err();
    assert_eq!(e.kind(), "link", "{e}");
    let e = torch::read(d.path().join("missing.pt")).unwrap_err();
    assert_eq!(e.kind(), "not_found", "{e}");
}

// ---- Checkpoints split over shards by an index (Hugging Face's layout) ----

/// A safetensors file of float32 tensors `(name, values)`, `metadata` its `__metadata__`.
fn safetensors_bytes(tensors: &[(&str, &[f32])], metadata: Option<serde_json::Value>) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    if let Some(m) = metadata {
        header.insert("__metadata__".into(), m);
    }
    let mut data = Vec::new();
    for (name, v) in tensors {
        let begin = data.len();
        data.extend(v.iter().flat_map(|x| x.to_le_bytes()));
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": "F32", "shape": [v.len()], "data_offsets": [begin, data.len()]}),
        );
    }
    let h = serde_json::to_vec(&header).unwrap();
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend(data);
    out
}

/// A folder of two safetensors shards and `model.safetensors.index.json` naming them.
fn sharded_folder(dir: &std::path::Path) {
    let pt = Some(serde_json::json!({"format": "pt"}));
    std::fs::write(
        dir.join("model-00001-of-00002.safetensors"),
        safetensors_bytes(&[("a.w", &[1.0, 2.0])], pt.clone()),
    )
    .unwrap();
    std::fs::write(
        dir.join("model-00002-of-00002.safetensors"),
        safetensors_bytes(&[("b.w", &[3.0]), ("a.b", &[4.0, 5.0, 6.0])], pt),
    )
    .unwrap();
    let index = serde_json::json!({"metadata": {"total_size": 24}, "weight_map": {
        "a.b": "model-00002-of-00002.safetensors",
        "a.w": "model-00001-of-00002.safetensors",
        "b.w": "model-00002-of-00002.safetensors"}});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    std::fs::write(dir.join("config.json"), "{\"model_type\": \"gpt2\"}").unwrap();
}

fn floats(t: &Node, name: &str) -> Vec<f32> {
    match get(t, name) {
        Tree::Leaf(Leaf::Array(a)) => {
            assert_eq!(a.annotation().unwrap()["type"], "torch.Tensor", "{name}: format pt makes torch tensors");
            a.bytes().chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
        }
        _ => panic!("{name} is not an array"),
    }
}

#[test]
fn a_folder_of_safetensors_shards_reads_as_one_flat_tree_in_the_index_order() {
    let dir = tempfile::tempdir().unwrap();
    sharded_folder(dir.path());
    let p = dir.path().to_str().unwrap();
    assert_eq!(convert::detect_format(p, true), "safetensors");
    let t = load(Location::parse(p).unwrap(), &LoadOptions::default()).unwrap();
    let Tree::Dict(items) = &t else { panic!("not a dict") };
    let names: Vec<_> = items
        .iter()
        .map(|(k, _)| match k {
            Key::Str(s) => s.as_str(),
            _ => "?",
        })
        .collect();
    // Shard by shard, each in its own order.
    assert_eq!(names, ["a.w", "b.w", "a.b"]);
    assert_eq!(floats(&t, "a.b"), [4.0, 5.0, 6.0]);
    assert_eq!(floats(&t, "a.w"), [1.0, 2.0]);
    assert_eq!(floats(&t, "b.w"), [3.0]);
    // Read-only: a save there is refused, naming why.
    let e = save(&t, Location::parse(p).unwrap(), &SaveOptions::default()).unwrap_err().to_string();
    assert!(e.contains("read as a tree but not written"), "{e}");
    // The index file itself is not the way in; the folder is.
    assert_eq!(
        convert::detect_format(dir.path().join("model-00001-of-00002.safetensors").to_str().unwrap(), true),
        "safetensors"
    );
}

#[test]
fn an_index_that_lies_or_points_outside_its_folder_is_refused() {
    let cases: &[(&str, &str)] = &[
        (r#"{"weight_map": {"a.w": "../outside.safetensors"}}"#, "not a file of the checkpoint's folder"),
        (r#"{"weight_map": {"a.w": "/etc/passwd"}}"#, "not a file of the checkpoint's folder"),
        (
            r#"{"weight_map": {"a.w": "model-00001-of-00002.safetensors", "zz": "model-00001-of-00002.safetensors"}}"#,
            "\"zz\" is not in its shard",
        ),
        (r#"{"weight_map": {"a.w": "model-00001-of-00002.safetensors"}}"#, "which the index does not list there"),
        (r#"{"weight_map": {"a.w": "missing.safetensors"}}"#, "missing.safetensors"),
        (r#"{"weight_map": 3}"#, "no \"weight_map\" object"),
        (
            r#"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["#,
            "not JSON",
        ),
    ];
    for (index, want) in cases {
        let dir = tempfile::tempdir().unwrap();
        sharded_folder(dir.path());
        // The second shard unlisted, for the "does not list" case.
        if want.contains("does not list") {
            std::fs::write(
                dir.path().join("model-00001-of-00002.safetensors"),
                safetensors_bytes(&[("a.w", &[1.0]), ("extra", &[2.0])], None),
            )
            .unwrap();
        }
        std::fs::write(dir.path().join("model.safetensors.index.json"), index).unwrap();
        let e = Location::parse(dir.path().to_str().unwrap()).and_then(|l| load(l, &LoadOptions::default()));
        let e = e.expect_err(index).to_string();
        assert!(e.contains(want), "{index}: {e}");
    }
}

#[cfg(unix)]
#[test]
fn a_shard_that_is_a_link_is_refused() {
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(
        outside.path().join("secret.safetensors"),
        safetensors_bytes(&[("b.w", &[9.0]), ("a.b", &[9.0])], None),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    sharded_folder(dir.path());
    let shard = dir.path().join("model-00002-of-00002.safetensors");
    std::fs::remove_file(&shard).unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret.safetensors"), &shard).unwrap();
    let e = Location::parse(dir.path().to_str().unwrap()).and_then(|l| load(l, &LoadOptions::default()));
    let e = e.unwrap_err();
    assert!(matches!(e, Error::Link { .. }), "{e}");
}

#[test]
fn a_folder_of_torch_shards_reads_through_its_index() {
    // One shard (state_dict.pt, whose tensors share storages) named by a `.bin` index: the tree
    // is the shard's, its tied storages as the file gives them. (Several torch shards, their
    // storage ids kept apart, are tested with a real transformers model in Python.)
    let dir = tempfile::tempdir().unwrap();
    let one = torch::read(data("state_dict.pt")).unwrap();
    let Tree::Custom { children, .. } = &one else { panic!("state_dict.pt is not an OrderedDict") };
    let shard = "pytorch_model-00001-of-00001.bin";
    std::fs::copy(data("state_dict.pt"), dir.path().join(shard)).unwrap();
    let map: serde_json::Map<String, serde_json::Value> =
        children.iter().map(|(k, _)| (k.clone(), shard.into())).collect();
    std::fs::write(dir.path().join("pytorch_model.bin.index.json"), serde_json::json!({"weight_map": map}).to_string())
        .unwrap();
    let p = dir.path().to_str().unwrap();
    assert_eq!(convert::detect_format(p, true), "torch");
    let t = load(Location::parse(p).unwrap(), &LoadOptions::default()).unwrap();
    let Tree::Dict(items) = &t else { panic!("not a dict") };
    assert_eq!(items.len(), children.len());
    let leaves = |t: &Node| {
        let mut v = vec![];
        t.for_each_leaf_unpathed(&mut |l| {
            if let Leaf::Array(a) = l {
                v.push((a.annotation().cloned(), a.bytes().to_vec()));
            }
        });
        v
    };
    assert_eq!(leaves(&t), leaves(&one));
}

/// What a whole load builds from (`Location::foreign_of`): the tree the checkpoint holds, the
/// same as the tree its location holds in memory; `into_owned` copies every array out of the
/// file's mapping into a buffer of its own, with the same bytes and annotations (session 37).
#[test]
fn a_checkpoint_read_for_a_whole_load_is_the_tree_its_location_holds_and_owned_copies_are_its_own() {
    let path = data("state_dict.pt");
    let s = path.to_str().unwrap();
    let found = Location::foreign_of(s, &StorageOptions::new()).unwrap().expect("a torch.save checkpoint");
    let stored = load(Location::parse(s).unwrap(), &LoadOptions::default()).unwrap();
    assert_eq!(found.tree, stored);
    let mapped: Vec<(usize, usize)> = {
        let mut v = Vec::new();
        found.tree.for_each_leaf(&mut |_, l: &Leaf| {
            if let Leaf::Array(a) = l {
                v.push((a.bytes().as_ptr() as usize, a.bytes().len()));
            }
        });
        v
    };
    let keep = found.tree.clone(); // (keeps the mapping alive: no new buffer can take its addresses)
    let owned = found.into_owned().unwrap();
    assert_eq!(owned, stored);
    let mut i = 0;
    owned.for_each_leaf(&mut |_, l: &Leaf| {
        if let Leaf::Array(a) = l {
            let (p, n) = (a.bytes().as_ptr() as usize, a.bytes().len());
            // Not inside any array of the mapped tree (so not the file's mapping).
            assert!(mapped.iter().all(|&(q, m)| n == 0 || p + n <= q || q + m <= p), "array {i} still views the file");
            i += 1;
        }
    });
    assert!(i > 3);
    drop(keep);
    // Other locations are not foreign files: a treepack tree, a missing path, a remote one.
    let d = tempfile::tempdir().unwrap();
    let tpk = d.path().join("t.tpk");
    save(&owned, Location::parse(tpk.to_str().unwrap()).unwrap(), &SaveOptions::default()).unwrap();
    for other in [tpk.to_str().unwrap(), "/no/such/file.pt", "memory://bucket/x"] {
        assert!(Location::foreign_of(other, &StorageOptions::new()).unwrap().is_none(), "{other}");
    }
}
