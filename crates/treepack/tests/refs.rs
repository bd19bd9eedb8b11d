//! Shared references and cycles (format 1.2, issue 26): an object met at several places is
//! stored once (a `shared` node) and referred to elsewhere (`ref` nodes); cycles round-trip;
//! key paths and selections go through refs; bad ids are refused when saving and loading.

use treepack::*;

fn arr(v: &[i32]) -> Node {
    Node::from(
        ArrayData::new(DType::I32, vec![v.len() as u64], v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())
            .unwrap(),
    )
}

/// `{"a": <shared 0: {"x": [1,2,3], "y": "why"}>, "b": ref 0, "c": [ref 0, <shared 1: a cycle>]}`
/// `tree` saved in a fresh folder: the folder (removed when dropped) and the tree's location.
fn saved(tree: &Node) -> (tempfile::TempDir, String) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("t").to_str().unwrap().to_string();
    save(tree, &p, &SaveOptions::default()).unwrap();
    (d, p)
}

fn tree() -> Node {
    let obj = Node::dict([("x", arr(&[1, 2, 3])), ("y", Node::from("why"))]);
    let cycle = Tree::Shared { id: 1, node: Box::new(Node::list([Node::from(7i64), Tree::Ref(1)])) };
    Node::dict([
        ("a", Tree::Shared { id: 0, node: Box::new(obj) }),
        ("b", Tree::Ref(0)),
        ("c", Node::list([Tree::Ref(0), cycle])),
    ])
}

#[test]
fn shared_objects_and_cycles_round_trip_as_format_1_2() {
    let d = tempfile::tempdir().unwrap();
    for name in ["dir", "one.tpk"] {
        let p = d.path().join(name);
        let p = p.to_str().unwrap();
        save(&tree(), p, &SaveOptions::default()).unwrap();
        let r = open(p).unwrap();
        // 1.4: its dicts are objects (the shared nodes alone make 1.2, see below).
        assert_eq!(r.manifest().version, (1, 4));
        let back = load(p, &LoadOptions::default()).unwrap();
        assert!(back.exact_eq(&tree()), "{name}: {back:?}");
        assert!(r.load(&LoadOptions::default()).unwrap().exact_eq(&tree()), "{name}");
        assert!(r.verify().unwrap().ok());
        // A path below a ref continues in the object.
        let Tree::Leaf(Leaf::Array(x)) = r.get("b/x").unwrap() else { panic!() };
        assert_eq!(x.bytes().as_ref(), arr(&[1, 2, 3]).as_array().unwrap().bytes().as_ref());
        assert_eq!(r.read_array("c/0/x", "1:").unwrap().len(), 2);
    }
    let text = std::fs::read_to_string(d.path().join("dir/treepack.json")).unwrap();
    assert!(text.contains(r#""b":{"t":"ref","id":0}"#), "{text}");
    assert!(text.contains(r#"{"t":"shared","id":1,"v":[7,{"t":"ref","id":1}]}"#), "{text}");
    // The array is stored once.
    assert_eq!(text.matches("\"t\":\"array\"").count(), 1);
}

#[test]
fn a_selection_of_a_ref_place_loads_the_object() {
    let (_d, p) = saved(&tree());
    let p = p.as_str();
    let back = load(p, &LoadOptions { select: vec!["b".into()], ..Default::default() }).unwrap();
    let Tree::Dict(items) = &back else { panic!() };
    // `b` is still a ref, and its object is loaded at its own place `a`.
    assert!(matches!(items[1].1, Tree::Ref(0)), "{back:?}");
    let Tree::Shared { id: 0, node } = &items[0].1 else { panic!("{back:?}") };
    let Tree::Dict(obj) = &**node else { panic!() };
    assert!(obj[0].1.as_array().is_some() && matches!(&obj[1].1, Tree::Leaf(Leaf::Str(s)) if s == "why"));
    // Nothing else.
    assert!(
        matches!(items[2].1, Tree::List(ref v) if matches!(v[1], Tree::Shared { .. } | Tree::Leaf(Leaf::None))),
        "{back:?}"
    );
}

#[test]
fn bad_ids_are_refused_when_saving() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("bad");
    for (tree, says) in [
        (Node::list([Tree::Ref(0)]), "ref to id 0"),
        (Node::list([Tree::Shared { id: 1, node: Box::new(Node::list([])) }]), "out of order"),
        (Node::list([Tree::Shared { id: 0, node: Box::new(Tree::Ref(0)) }]), "must be an object"),
        (
            Node::list([
                Tree::Shared { id: 0, node: Box::new(Node::list([])) },
                Tree::Shared { id: 0, node: Box::new(Node::list([])) },
            ]),
            "out of order",
        ),
    ] {
        let e = save(&tree, p.to_str().unwrap(), &SaveOptions::default()).unwrap_err();
        assert!(matches!(e, Error::InvalidTree { .. }) && e.to_string().contains(says), "{e}");
    }
}

#[test]
fn trees_without_refs_are_still_written_as_before() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("plain");
    save(&Node::list([arr(&[1])]), p.to_str().unwrap(), &SaveOptions::default()).unwrap();
    assert_eq!(open(p.to_str().unwrap()).unwrap().manifest().version, (1, 0));
    // Shared nodes without object dicts: 1.2.
    let p = d.path().join("shared");
    let shared = Node::list([Tree::Shared { id: 0, node: Box::new(Node::list([arr(&[1])])) }, Tree::Ref(0)]);
    save(&shared, p.to_str().unwrap(), &SaveOptions::default()).unwrap();
    assert_eq!(open(p.to_str().unwrap()).unwrap().manifest().version, (1, 2));
}

#[test]
fn small_trees_with_refs_still_load_in_one_pass() {
    use treepack::read::one_pass::{load_one_pass, NodeBuild};
    let (_d, p) = saved(&tree());
    let p = p.as_str();
    let loc = p.into_location().unwrap().pin().unwrap();
    let (bytes, file) = loc.block_on(read::manifest_bytes(&loc)).unwrap();
    let got = load_one_pass(&loc, &bytes, &file, &NodeBuild { file: &file }, true).expect("one pass");
    assert!(got.exact_eq(&tree()));
}

/// `{"img": <shared 0: custom image>, "img2": ref 0, "sp": <shared 1: custom sparse {values,
/// indices}>, "sp2": ref 1, "od": custom ordereddict {w, b}}`: objects a partial load must build
/// whole or not at all, and one it may build in part.
fn objects() -> Node {
    let custom = |t: &str, kids: Vec<(&str, Node)>| Tree::Custom {
        type_name: t.into(),
        data: serde_json::Value::Null,
        children: kids.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
    };
    let img = custom("py.image", vec![("files", Node::dict([("image", Node::from(vec![1u8, 2, 3]))]))]);
    let sp = custom("py.torch_sparse", vec![("indices", arr(&[0, 1])), ("values", arr(&[5, 6]))]);
    Node::dict([
        ("img", Tree::Shared { id: 0, node: Box::new(img) }),
        ("img2", Tree::Ref(0)),
        ("sp", Tree::Shared { id: 1, node: Box::new(sp) }),
        ("sp2", Tree::Ref(1)),
        ("od", custom("py.ordereddict", vec![("w", arr(&[1])), ("b", arr(&[2]))])),
    ])
}

#[test]
fn partial_loads_build_whole_objects_and_drop_refs_to_objects_not_built() {
    let (_d, p) = saved(&objects());
    let p = p.as_str();
    let partial: std::collections::HashSet<String> = ["py.ordereddict".to_string()].into();
    let opts = |sel: &[&str]| LoadOptions {
        select: sel.iter().map(|s| s.to_string()).collect(),
        partial_types: Some(partial.clone()),
        ..Default::default()
    };
    // The ref `sp2` selected: the sparse tensor comes whole (its own place too); the image not
    // selected is None at both its places, and the ids left are numbered from 0 again.
    let back = load(p, &opts(&["sp2"])).unwrap();
    let Tree::Dict(items) = &back else { panic!() };
    assert!(matches!(items[0].1, Tree::Leaf(Leaf::None)) && matches!(items[1].1, Tree::Leaf(Leaf::None)), "{back:?}");
    let Tree::Shared { id: 0, node } = &items[2].1 else { panic!("{back:?}") };
    let Tree::Custom { children, .. } = &**node else { panic!() };
    assert!(children.iter().all(|(_, c)| c.as_array().is_some()), "whole: {back:?}");
    assert!(matches!(items[3].1, Tree::Ref(0)), "{back:?}");
    // Part of a custom node selected: all of it comes; an ordereddict may come in part.
    let back = load(p, &opts(&["sp/values", "od/w"])).unwrap();
    let Tree::Dict(items) = &back else { panic!() };
    let Tree::Shared { node, .. } = &items[2].1 else { panic!("{back:?}") };
    let Tree::Custom { children, .. } = &**node else { panic!() };
    assert!(children.iter().all(|(_, c)| c.as_array().is_some()), "whole: {back:?}");
    let Tree::Custom { children, .. } = &items[4].1 else { panic!("{back:?}") };
    assert!(children[0].1.as_array().is_some() && matches!(children[1].1, Tree::Leaf(Leaf::None)), "{back:?}");
    // Without partial_types (the Rust default) custom nodes are data and may come in part.
    let back = load(p, &LoadOptions { select: vec!["sp/values".into()], ..Default::default() }).unwrap();
    let Tree::Dict(items) = &back else { panic!() };
    let Tree::Shared { node, .. } = &items[2].1 else { panic!("{back:?}") };
    let Tree::Custom { children, .. } = &**node else { panic!() };
    assert!(matches!(children[0].1, Tree::Leaf(Leaf::None)) && children[1].1.as_array().is_some(), "{back:?}");
}

/// A node that may be built in part keeps its attributes child (`PARTIAL_ATTRS`: a state
/// dict's `_metadata`) whenever any of it is built; not otherwise, and not the other children.
#[test]
fn a_partial_node_built_in_part_comes_with_its_attributes() {
    let custom = |t: &str, kids: Vec<(&str, Node)>| Tree::Custom {
        type_name: t.into(),
        data: serde_json::json!({"attrs": true}),
        children: kids.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
    };
    let attrs = Node::dict([("meta", arr(&[7])), ("more", Node::dict([("x", arr(&[8]))]))]);
    let od = custom("py.ordereddict", vec![("w", arr(&[1])), ("b", arr(&[2])), (read::PARTIAL_ATTRS, attrs)]);
    let (_d, p) = saved(&Node::dict([("od", od), ("other", arr(&[3]))]));
    let partial: std::collections::HashSet<String> = ["py.ordereddict".to_string()].into();
    let opts = |sel: &[&str]| LoadOptions {
        select: sel.iter().map(|s| s.to_string()).collect(),
        partial_types: Some(partial.clone()),
        ..Default::default()
    };
    let back = load(&p, &opts(&["od/w"])).unwrap();
    let Tree::Dict(items) = &back else { panic!() };
    let Tree::Custom { children, .. } = &items[0].1 else { panic!("{back:?}") };
    assert!(children[0].1.as_array().is_some() && matches!(children[1].1, Tree::Leaf(Leaf::None)), "{back:?}");
    let Tree::Dict(a) = &children[2].1 else { panic!("{back:?}") };
    assert!(a[0].1.as_array().is_some(), "the attributes come whole: {back:?}");
    let Tree::Dict(more) = &a[1].1 else { panic!("{back:?}") };
    assert!(more[0].1.as_array().is_some(), "{back:?}");
    assert!(matches!(items[1].1, Tree::Leaf(Leaf::None)), "{back:?}");
    // Nothing of the node selected: nor its attributes.
    let back = load(&p, &opts(&["other"])).unwrap();
    let Tree::Dict(items) = &back else { panic!() };
    assert!(matches!(items[0].1, Tree::Leaf(Leaf::None)), "{back:?}");
    // A child of that name in a node whose data does not say it holds attributes (a key of an
    // older file's mapping) is a child like the others.
    let od = Tree::Custom {
        type_name: "py.ordereddict".into(),
        data: serde_json::Value::Null,
        children: vec![("w".into(), arr(&[1])), (read::PARTIAL_ATTRS.into(), arr(&[9]))],
    };
    let (_d2, p2) = saved(&Node::dict([("od", od)]));
    let back = load(&p2, &opts(&["od/w"])).unwrap();
    let Tree::Dict(items) = &back else { panic!() };
    let Tree::Custom { children, .. } = &items[0].1 else { panic!("{back:?}") };
    assert!(matches!(children[1].1, Tree::Leaf(Leaf::None)), "{back:?}");
}

/// A select that matches nothing is refused naming each such pattern (a typo must not load as
/// `None`); a pattern with a leading `?` may match nothing; a pattern through a ref place
/// (`b/x` where `b` is a ref) reads the object the ref names.
#[test]
fn selects_that_match_nothing_are_refused_and_selects_go_through_refs() {
    let (_d, p) = saved(&tree());
    let p = p.as_str();
    let sel = |v: &[&str]| LoadOptions { select: v.iter().map(|s| s.to_string()).collect(), ..Default::default() };
    for (patterns, missing) in [
        (vec!["a/xx"], vec!["a/xx"]),
        (vec!["a/x", "zz/**", "c/5"], vec!["zz/**", "c/5"]),
        (vec!["b/nope"], vec![]), // through a ref: the pattern goes on below the ref place
    ] {
        let r = load(p, &sel(&patterns));
        if missing.is_empty() {
            r.unwrap();
            continue;
        }
        let e = r.unwrap_err();
        assert_eq!(e.kind(), "key_not_found", "{e}");
        let msg = e.to_string();
        for m in &missing {
            assert!(msg.contains(m), "{m} not in {msg}");
        }
        // (the tree as the user names it: the location, not its manifest file)
        assert!(msg.contains(&format!("select matches nothing in {p} ")) && msg.contains("leading `?`"), "{msg}");
        assert!(!msg.contains("`a/x`,"), "a pattern that matched is not named: {msg}");
    }
    // Optional patterns, and an empty dict matched by its own path.
    let back = load(p, &sel(&["a/y", "?ema/**"])).unwrap();
    let Tree::Dict(items) = &back else { panic!() };
    assert_eq!(items[0].0, Key::from("a"));
    // Through a ref: `b/x` reads the object `b` names (it comes whole, at `a` and through `b`).
    let back = load(p, &sel(&["b/x"])).unwrap();
    let Tree::Dict(items) = &back else { panic!() };
    let Tree::Shared { node, .. } = &items[0].1 else { panic!("{back:?}") };
    let Tree::Dict(obj) = node.as_ref() else { panic!() };
    assert!(matches!(&obj[0].1, Tree::Leaf(Leaf::Array(_))), "{back:?}");
    assert!(matches!(items[1].1, Tree::Ref(0)), "{back:?}");
}

/// A record whose fields are an empty list and an empty dict is selected by them, as by any
/// field: a partial load builds it (it came back `None`: only leaves counted as selected), with
/// a shared object elsewhere (the selection closed over refs) or without.
#[test]
fn records_of_empty_containers_come_back_from_a_partial_load() {
    let record = || Tree::Record {
        type_name: "m:Messages".into(),
        fields: vec![("messages".into(), Node::list([])), ("meta".into(), Node::dict::<&str>([]))],
    };
    let obj = Node::dict([("k", Node::from(1i64))]);
    for with_refs in [false, true] {
        let mut call = vec![("inputs", record()), ("x", Node::from(1i64))];
        if with_refs {
            call.push(("a", Tree::Shared { id: 0, node: Box::new(obj.clone()) }));
            call.push(("b", Tree::Ref(0)));
        }
        let (_d, p) = saved(&Node::dict([("call", Node::dict(call)), ("other", Node::from(2i64))]));
        for sel in [&["call"][..], &["call/**"], &["call/inputs"], &["call/inputs/messages"]] {
            let opts = LoadOptions { select: sel.iter().map(|s| s.to_string()).collect(), ..Default::default() };
            let back = load(&p, &opts).unwrap();
            let Tree::Dict(items) = &back else { panic!() };
            let Tree::Dict(call) = &items[0].1 else { panic!("{back:?}") };
            assert!(call[0].1.exact_eq(&record()), "refs {with_refs}, {sel:?}: {back:?}");
        }
    }
}

/// A read of a ref place whose object lies inside another object it refers to (a traced call
/// that holds its parent, which lists it): the object once, its parent's list refers to it.
#[test]
fn a_ref_place_inside_the_object_it_refers_to_reads_whole() {
    // {"calls": [<shared 0: {"children": [<shared 1: {"parent": ref 0}>]}>, ref 1]}
    let child = Tree::Shared { id: 1, node: Box::new(Node::dict([("parent", Tree::Ref(0))])) };
    let root = Tree::Shared { id: 0, node: Box::new(Node::dict([("children", Node::list([child]))])) };
    let (_d, p) = saved(&Node::dict([("calls", Node::list([root, Tree::Ref(1)]))]));
    let r = open(&p).unwrap();
    // The child first (id 0), its parent inside it (id 1), whose list refers back to it.
    let want = Tree::Shared {
        id: 0,
        node: Box::new(Node::dict([(
            "parent",
            Tree::Shared { id: 1, node: Box::new(Node::dict([("children", Node::list([Tree::Ref(0)]))])) },
        )])),
    };
    let got = r.get("calls/1").unwrap();
    assert!(got.exact_eq(&want), "{got:?}");
}
