//! The outline against the strict parser: same answers on good manifests, on mutations of every
//! byte, and on a parsed tree.

use super::super::tests::{big, sample};
use super::*;
use crate::manifest::parse::{build_one_thread, decode};
use crate::manifest::types::{Manifest, Stored, HASH_TRAILER_LEN};
use crate::manifest::validate::check;
use crate::manifest::write::{encode, seal};
use crate::model::{Int, Tree};
use bytes::Bytes;

/// The blocks of `bytes` as one line per event, leaves with their facts; repeated dict keys
/// refused as a consumer would.
fn lines(bytes: &[u8]) -> std::result::Result<Vec<String>, String> {
    block_lines(&blocks_of(bytes)?)
}

fn blocks_of(bytes: &[u8]) -> std::result::Result<Vec<Block>, String> {
    let mut blocks = Vec::new();
    outline(bytes, "t", &mut |b| {
        blocks.push(b);
        true
    })
    .map_err(|e| e.to_string())?;
    Ok(blocks)
}

fn block_lines(blocks: &[Block]) -> std::result::Result<Vec<String>, String> {
    assert!(blocks.iter().all(|b| b.events.len() <= BLOCK_EVENTS));
    let mut out = Vec::new();
    // Keys seen by each open container (dicts only; `None` for others).
    let mut open: Vec<Option<HashSet<String>>> = Vec::new();
    for b in blocks {
        for e in &b.events {
            // A key repeated in the innermost dict is refused, as a consumer would.
            let key = |k: String, open: &mut Vec<Option<HashSet<String>>>| match open.last_mut() {
                Some(Some(seen)) if seen.contains(&k) => Err(format!("duplicate key {k}")),
                Some(Some(seen)) => {
                    seen.insert(k);
                    Ok(())
                }
                _ => Ok(()),
            };
            match *e {
                Event::Dict | Event::List | Event::Tuple | Event::Named => {
                    open.push((*e == Event::Dict).then(HashSet::new));
                    out.push(format!("{e:?}"));
                }
                Event::End => {
                    open.pop();
                    out.push("end".into());
                }
                Event::EndNamed(i) => {
                    open.pop();
                    let n = &b.named[i as usize];
                    out.push(format!("end {} {} {:?} {}", n.custom, n.type_name, n.data, n.path));
                }
                Event::Key(s, t) => {
                    let text = b.text(s, t).ok_or("bad key range")?.to_string();
                    key(crate::keypath::name_segment_text(&text), &mut open)?;
                    out.push(format!("key {text}"));
                }
                Event::TypedKey(i) => {
                    let k = &b.keys[i as usize];
                    key(crate::keypath::key_segment_text(k), &mut open)?;
                    out.push(format!("key {k:?}"));
                }
                Event::Leaf(i) => {
                    let l = b.leaves.get(i as usize).ok_or("bad leaf row")?;
                    out.push(format!(
                        "leaf {} {} {:?} {:?} {} {}",
                        l.path,
                        l.kind,
                        l.dtype.map(|d| d.to_json().to_string()),
                        l.shape,
                        l.nbytes,
                        l.inline
                    ));
                }
            }
        }
    }
    Ok(out)
}

/// The same lines, from the strict parser's tree.
fn expected(t: &Tree<Entry>, path: &str, out: &mut Vec<String>) {
    crate::model::grow(|| expected_inner(t, path, out))
}

fn expected_inner(t: &Tree<Entry>, path: &str, out: &mut Vec<String>) {
    let join = |seg: String| if path.is_empty() { seg } else { format!("{path}/{seg}") };
    match t {
        Tree::Shared { node, .. } => expected(node, path, out),
        Tree::Ref(id) => out.push(format!("leaf {path} ref None None {id} true")),
        Tree::Leaf(e) => {
            let (dtype, shape, inline) = match e {
                Entry::Array(a) => (
                    Some(a.dtype.to_json().to_string()),
                    Some(a.shape.as_slice()),
                    matches!(a.storage, ArrayStorage::Inline(_)),
                ),
                _ => (None, None, e.chunks().is_empty()),
            };
            out.push(format!("leaf {path} {} {dtype:?} {shape:?} {} {inline}", e.kind(), e.nbytes()));
        }
        Tree::List(items) | Tree::Tuple(items) => {
            out.push(if matches!(t, Tree::List(_)) { "List" } else { "Tuple" }.into());
            for (i, v) in items.iter().enumerate() {
                expected(v, &join(i.to_string()), out);
            }
            out.push("end".into());
        }
        Tree::Dict(pairs) => {
            out.push("Dict".into());
            for (k, v) in pairs {
                out.push(match k {
                    Key::Str(s) => format!("key {s}"),
                    k => format!("key {k:?}"),
                });
                expected(v, &join(crate::keypath::key_segment_text(k)), out);
            }
            out.push("end".into());
        }
        Tree::Record { type_name, fields } | Tree::Custom { type_name, children: fields, .. } => {
            out.push("Named".into());
            for (n, v) in fields {
                out.push(format!("key {n}"));
                expected(v, &join(crate::keypath::name_segment_text(n)), out);
            }
            let (custom, data) = match t {
                Tree::Custom { data, .. } => (true, (!data.is_null()).then(|| data.to_string())),
                _ => (false, None),
            };
            out.push(format!("end {custom} {type_name} {data:?} {path}"));
        }
    }
}

/// `m` with more members in its root dict.
fn with_members(mut m: Manifest, more: impl IntoIterator<Item = (Key, Tree<Entry>)>) -> Manifest {
    let Tree::Dict(pairs) = &mut m.root else { unreachable!() };
    pairs.extend(more);
    m
}

fn rich() -> Manifest {
    let mut m = sample();
    let Tree::Dict(pairs) = &mut m.root else { unreachable!() };
    pairs.push((
        Key::Str("rec/~*".into()),
        Tree::Record {
            type_name: "my.Point".into(),
            fields: vec![
                ("x".into(), Tree::Leaf(Entry::Float(1.5))),
                ("".into(), Tree::Leaf(Entry::Str(Stored::Inline("é\\".into())))),
            ],
        },
    ));
    pairs.push((
        Key::Float(2.5),
        Tree::Custom {
            type_name: "datetime".into(),
            data: serde_json::json!({"iso": "2026-01-01"}),
            children: vec![("b".into(), Tree::Leaf(Entry::Bytes(Stored::Inline(Bytes::from_static(b"xyz")))))],
        },
    ));
    pairs.push((
        Key::Str("small".into()),
        Tree::Leaf(Entry::Array(Box::new(ArrayEntry {
            dtype: DType::I16,
            shape: vec![2, 1],
            storage: ArrayStorage::Inline(Bytes::from_static(&[1, 0, 2, 0])),
            preview: None,
            annotation: Some(serde_json::json!({"type": "torch.Tensor"})),
        }))),
    ));
    pairs.push((Key::Str("empty".into()), Tree::Dict(vec![])));
    // Shared objects and refs (1.2): a shared list holding a ref to itself, then a ref to it.
    pairs.push((
        Key::Str("cycle".into()),
        Tree::Shared { id: 0, node: Box::new(Tree::List(vec![Tree::Leaf(Entry::Int(Int::Small(1))), Tree::Ref(0)])) },
    ));
    pairs.push((Key::Str("again".into()), Tree::Ref(0)));
    m
}

fn strict_lines(bytes: &[u8]) -> std::result::Result<Vec<String>, String> {
    let p = build_one_thread(bytes, "t", &OwnedTree).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    expected(&p.root, "", &mut out);
    Ok(out)
}

#[test]
fn a_parsed_tree_outlines_as_its_text_does() {
    for m in [rich(), big(false), big(true)] {
        let bytes = encode(&m, &serde_json::json!({}));
        let from_text = blocks_of(&bytes).unwrap();
        let mut from_tree = Vec::new();
        outline_tree(&m.root, &m.packs, "t", &mut |b| {
            from_tree.push(b);
            true
        })
        .unwrap();
        assert_eq!(block_lines(&from_tree).unwrap(), block_lines(&from_text).unwrap());
        let parts = |v: &[Block]| {
            v.iter().map(|b| (b.events.clone(), b.text.clone(), b.keys.clone(), b.named.clone())).collect::<Vec<_>>()
        };
        assert_eq!(parts(&from_tree), parts(&from_text));
    }
}

#[test]
fn outline_lists_what_the_strict_parser_reads() {
    for m in [rich(), big(false), big(true)] {
        let bytes = encode(&m, &serde_json::json!({}));
        let want = strict_lines(&bytes).unwrap();
        assert_eq!(lines(&bytes).unwrap(), want);
    }
}

#[test]
fn outline_refuses_what_the_strict_parser_refuses() {
    let bytes = encode(&rich(), &serde_json::json!({}));
    let body = &bytes[..bytes.len() - HASH_TRAILER_LEN];
    let mut accepted = 0;
    // Every byte of the body (top-level members and root) deleted, or replaced by a few
    // telling characters, resealed.
    for i in 0..body.len() {
        let variants: Vec<Vec<u8>> = std::iter::once(None)
            .chain(b"\"0]}[,a-".iter().map(Some))
            .map(|c| {
                let mut v = body.to_vec();
                match c {
                    None => {
                        v.remove(i);
                    }
                    Some(&c) => v[i] = c,
                }
                seal(&v)
            })
            .collect();
        for v in variants {
            let strict = strict_lines(&v);
            let fast = check(&v, "t").map_err(|e| e.to_string()).and_then(|_| lines(&v));
            match (&strict, &fast) {
                (Ok(a), Ok(b)) => {
                    assert_eq!(a, b, "{}", String::from_utf8_lossy(&v));
                    accepted += 1;
                }
                (Err(_), Err(_)) => {}
                _ => {
                    panic!("strict {:?} but outline {:?} for {}", strict.err(), fast.err(), String::from_utf8_lossy(&v))
                }
            }
        }
    }
    assert!(accepted > 50, "only {accepted} variants parsed: the mutations test little");
}

#[test]
fn outline_checks_leaves_packs_and_depth() {
    // A chunk past the end of its pack.
    let mut m = sample();
    m.packs[0].size = 4;
    let e = lines(&encode(&m, &serde_json::json!({}))).unwrap_err();
    assert!(e.contains("spans bytes"), "{e}");
    // A pack path outside the tree.
    let mut m = sample();
    m.packs[0].path = "../x".into();
    assert!(lines(&encode(&m, &serde_json::json!({}))).is_err());
    // Depth.
    let deep = |n: usize| {
        let body = format!(
            "{{\"format\":\"treepack\",\"version\":[1,0],\"packs\":[],\"root\":{}{}",
            "[".repeat(n),
            "]".repeat(n)
        );
        seal(body.as_bytes())
    };
    assert_eq!(lines(&deep(MAX_DEPTH)).err(), None);
    assert!(strict_lines(&deep(MAX_DEPTH)).is_ok());
    assert!(lines(&deep(MAX_DEPTH + 1)).unwrap_err().contains("deeper"));
    // Inline arrays, read without the strict parser: each damage refused by both.
    let good = encode(&rich(), &serde_json::json!({}));
    let body = String::from_utf8(good[..good.len() - HASH_TRAILER_LEN].to_vec()).unwrap();
    let small = r#"{"t":"array","dtype":"int16","shape":[2,1],"as":{"type":"torch.Tensor"},"data":"AQACAA=="}"#;
    assert!(body.contains(small));
    for bad in [
        r#"{"t":"array","dtype":"int16","shape":[2,2],"data":"AQACAA=="}"#,
        r#"{"t":"array","dtype":"int16","shape":[2,1],"data":"AQACAA="}"#,
        r#"{"t":"array","dtype":"int16","shape":[2,1],"data":"AQAC*A=="}"#,
        r#"{"t":"array","dtype":"int16","shape":[2,1],"shape":[2,1],"data":"AQACAA=="}"#,
        r#"{"t":"array","dtype":"int17","shape":[2,1],"data":"AQACAA=="}"#,
        r#"{"t":"array","dtype":"int16","shape":[2,-1],"data":"AQACAA=="}"#,
        r#"{"t":"array","dtype":"int16","data":"AQACAA=="}"#,
        r#"{"t":"array","dtype":"int16","shape":[4294967296,4294967296,4294967296],"data":""}"#,
        r#"{"t":"array","dtype":"int16","shape":[2,1],"data":"AQACAA==","chunks":[]}"#,
        // Annotations (1.3): an object with a non-empty string `type` of at most 256 bytes, once.
        r#"{"t":"array","dtype":"int16","shape":[2,1],"as":"torch","data":"AQACAA=="}"#,
        r#"{"t":"array","dtype":"int16","shape":[2,1],"as":{"type":3},"data":"AQACAA=="}"#,
        r#"{"t":"array","dtype":"int16","shape":[2,1],"as":{"type":""},"data":"AQACAA=="}"#,
        r#"{"t":"array","dtype":"int16","shape":[2,1],"as":{},"data":"AQACAA=="}"#,
        &format!(
            r#"{{"t":"array","dtype":"int16","shape":[2,1],"as":{{"type":"{}"}},"data":"AQACAA=="}}"#,
            "a".repeat(257)
        ),
        r#"{"t":"array","dtype":"int16","shape":[2,1],"as":{"type":"a"},"as":{"type":"a"},"data":"AQACAA=="}"#,
    ] {
        let v = seal(body.replace(small, bad).as_bytes());
        assert!(strict_lines(&v).is_err(), "{bad}");
        assert!(lines(&v).is_err(), "{bad}");
    }
    let ok = r#"{"t":"array","dtype":"int16","shape":[2,1],"preview":{"head":[1,2]},"data":"AQACAA==","x":[]}"#;
    let v = seal(body.replace(small, ok).as_bytes());
    assert_eq!(lines(&v).unwrap(), strict_lines(&v).unwrap());
    // Bytes that are not UTF-8, in a skipped member and in a key: both parsers agree.
    for bad in [&b"{\"t\":\"dict\",\"x\":\"\xff\",\"items\":[]}"[..], b"{\"t\":\"dict\",\"items\":[[\"\xff\",1]]}"] {
        let mut v = b"{\"format\":\"treepack\",\"version\":[1,0],\"packs\":[],\"root\":".to_vec();
        v.extend_from_slice(bad);
        let v = seal(&v);
        assert_eq!(strict_lines(&v).is_ok(), lines(&v).is_ok(), "{}", String::from_utf8_lossy(bad));
    }
    // Repeated record fields.
    let fields = vec![("a".into(), Tree::Leaf(Entry::None)), ("a".into(), Tree::Leaf(Entry::None))];
    let m = with_members(rich(), [(Key::Str("r2".into()), Tree::Record { type_name: "T".into(), fields })]);
    let e = lines(&encode(&m, &serde_json::json!({}))).unwrap_err();
    assert!(e.contains("duplicate"), "{e}");
}

/// Found in review (issue 24): the outline skipped `metadata` and `preview` unread and took
/// leaves and typed keys met before `packs`, so it accepted files the strict parser refuses.
#[test]
fn outline_and_strict_parser_agree_outside_the_root() {
    let head = r#"{"format":"treepack","version":[1,0]"#;
    let arr = |preview: &str| {
        format!(r#"{{"t":"array","dtype":"int16","shape":[2,1],"preview":{preview},"data":"AQACAA=="}}"#)
    };
    let refused: Vec<Vec<u8>> = vec![
        format!(r#"{head},"metadata":1e400,"packs":[],"root":1"#).into_bytes(),
        [format!(r#"{head},"metadata":""#).as_bytes(), b"\xff", br#"","packs":[],"root":1"#].concat(),
        format!(r#"{head},"packs":[],"root":{}"#, arr(r#"{"min":1e400}"#)).into_bytes(),
        format!(r#"{head},"root":1,"packs":[]"#).into_bytes(),
        format!(r#"{head},"root":{},"packs":[]"#, arr("null")).into_bytes(),
        format!(r#"{head},"root":{{"t":"dict","items":[[1,[]]]}},"packs":[]"#).into_bytes(),
    ];
    for body in refused {
        let v = seal(&body);
        let text = String::from_utf8_lossy(&body).into_owned();
        assert!(strict_lines(&v).is_err(), "strict accepted {text}");
        assert!(lines(&v).is_err(), "outline accepted {text}");
    }
    let accepted = [
        format!(r#"{head},"metadata":{{"run":[1,2.5,"x",null]}},"packs":[],"root":1"#),
        format!(r#"{head},"packs":[],"root":{}"#, arr(r#"{"min":1,"max":2}"#)),
        format!(r#"{head},"packs":[],"root":{{"t":"dict","items":[[1,[]]]}}"#),
    ];
    for body in accepted {
        let v = seal(body.as_bytes());
        assert_eq!(lines(&v).unwrap(), strict_lines(&v).unwrap(), "{body}");
    }
}

/// A record with many fields is read in linear time, and a repeat far in is still found.
#[test]
fn many_record_fields_and_a_late_repeat() {
    let fields: Vec<String> = (0..20_000).map(|i| format!(r#"["f{i}",null]"#)).collect();
    let record = |extra: &str| {
        format!(
            r#"{{"format":"treepack","version":[1,0],"packs":[],"root":{{"t":"record","type":"T","fields":[{}{extra}]}}"#,
            fields.join(",")
        )
    };
    let v = seal(record("").as_bytes());
    assert_eq!(lines(&v).unwrap().len(), 2 + 2 * fields.len());
    let v = seal(record(r#",["f19999",null]"#).as_bytes());
    assert!(lines(&v).unwrap_err().contains("duplicate key `f19999`"));
    assert!(strict_lines(&v).is_err());
}

#[test]
fn reused_blocks_read_the_same() {
    let bytes = encode(&big(true), &serde_json::json!({}));
    let want = lines(&bytes).unwrap();
    let (mut got, spares, mut reused) = (Vec::new(), RefCell::new(Vec::new()), 0);
    let describe = |b: &Block| b.events.iter().map(|e| format!("{e:?}")).collect::<Vec<_>>();
    let mut first = Vec::new();
    outline(&bytes, "t", &mut |b| {
        first.extend(describe(&b));
        true
    })
    .unwrap();
    outline_reusing(
        &bytes,
        "t",
        &mut |b| {
            got.extend(describe(&b));
            spares.borrow_mut().push(b.reuse());
            true
        },
        &mut || {
            let s = spares.borrow_mut().pop();
            reused += usize::from(s.is_some());
            s
        },
    )
    .unwrap();
    assert_eq!(got, first);
    assert!(reused > 10, "{reused}");
    assert!(!want.is_empty());
}

#[test]
fn outline_stops_when_the_reader_does() {
    let bytes = encode(&big(true), &serde_json::json!({}));
    let mut n = 0;
    let r = outline(&bytes, "t", &mut |_| {
        n += 1;
        n < 2
    });
    assert!(r.is_err());
    assert_eq!(n, 2);
}

#[test]
fn refs_name_the_place_they_stand_for() {
    // `rich()` ends with a shared list at `cycle` holding a ref to itself, then a ref at `again`;
    // the text and the parsed tree give the same targets, across any block boundary.
    let m = rich();
    let bytes = encode(&m, &serde_json::json!({}));
    let mut from_tree = Vec::new();
    outline_tree(&m.root, &m.packs, "t", &mut |b| {
        from_tree.push(b);
        true
    })
    .unwrap();
    for blocks in [blocks_of(&bytes).unwrap(), from_tree] {
        let refs: Vec<(String, Option<String>, u64)> = blocks
            .iter()
            .flat_map(|b| (0..b.leaves.len()).filter_map(|i| b.leaves.get(i)))
            .filter(|l| l.kind == "ref")
            .map(|l| (l.path.to_string(), l.target.map(str::to_string), l.nbytes))
            .collect();
        assert_eq!(refs, vec![("cycle/1".into(), Some("cycle".into()), 0), ("again".into(), Some("cycle".into()), 0)]);
    }
}

#[test]
fn key_paths_past_the_budget_are_refused_not_allocated() {
    // 20k zeros under 20 levels of 1000-byte keys: a 61 KB manifest whose leaves' paths would
    // take 390 MB. The outline, the parsed tree's outline and `Manifest::structure` all refuse
    // it (within the budget: nothing near that size is allocated); `decode` and loads are fine.
    let mut root = Tree::List((0..20_000).map(|_| Tree::Leaf(Entry::Int(Int::Small(0)))).collect());
    for i in 0..20 {
        root = Tree::Dict(vec![(Key::Str(format!("{}{i}", "k".repeat(1000))), root)]);
    }
    let m = Manifest { version: (1, 0), writer: "t".into(), metadata: None, packs: vec![], root };
    let bytes = encode(&m, &serde_json::json!({}));
    assert!(bytes.len() < 70_000, "{}", bytes.len());
    let e = blocks_of(&bytes).unwrap_err();
    assert!(e.contains("key paths would take more memory than the manifest allows"), "{e}");
    assert!(e.len() < 1000, "the message names the place, shortened: {e}");
    let e = outline_tree(&m.root, &m.packs, "t", &mut |_| true).unwrap_err().to_string();
    assert!(e.contains("key paths would take more memory"), "{e}");
    let parsed = decode(&bytes, "t").unwrap();
    let e = parsed.structure().unwrap_err().to_string();
    assert!(e.contains("key paths would take more memory"), "{e}");
    // A tree of the same shape with short keys lists fine.
    let mut root = Tree::List((0..20_000).map(|_| Tree::Leaf(Entry::Int(Int::Small(0)))).collect());
    for i in 0..20 {
        root = Tree::Dict(vec![(Key::Str(format!("k{i}")), root)]);
    }
    let m = Manifest { version: (1, 0), writer: "t".into(), metadata: None, packs: vec![], root };
    assert_eq!(
        blocks_of(&encode(&m, &serde_json::json!({}))).unwrap().iter().map(|b| b.leaves.len()).sum::<usize>(),
        20_000
    );
    assert_eq!(m.structure().unwrap().leaf_count(), 20_000);
}

#[test]
fn a_ref_to_an_object_not_met_has_no_target() {
    // The outline leaves id checks to the strict parser; a dangling ref still lists, with no
    // target (not a stretch of the table picked by the row's unused dims index).
    let a = |n: u64| {
        Tree::Leaf(Entry::Array(Box::new(ArrayEntry {
            dtype: DType::U8,
            shape: vec![1; n as usize],
            storage: ArrayStorage::Inline(Bytes::from_static(&[7])),
            preview: None,
            annotation: None,
        })))
    };
    let root = Tree::List(vec![a(60), a(60), Tree::Ref(9)]);
    let mut blocks = Vec::new();
    outline_tree(&root, &[], "t", &mut |b| {
        blocks.push(b);
        true
    })
    .unwrap();
    let t = &blocks[0].leaves;
    let r = t.get(2).unwrap();
    assert_eq!((r.kind, r.path, r.target, r.nbytes), ("ref", "2", None, 9));
}
