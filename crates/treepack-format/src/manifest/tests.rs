//! Tests of the manifest: writer, parsers, checks, and the spec's examples.

use super::parse::parse_with;
use super::strategy::{HELP_MIN_BYTES, SPLIT_MIN_BYTES};
use super::types::{HASH_PREFIX, HASH_SUFFIX};
use super::*;
use crate::codec::Codec;
use crate::dtype::DType;
use crate::error::Error;
use crate::hash::Hash32;
use crate::model::{Int, Key, Step, Tree};
use serde_json::Value;
use std::cell::RefCell;

pub(crate) fn sample() -> Manifest {
    // The parallel and helped parses run on the tests' threads.
    crate::exec::testing::install();
    let chunk = ChunkRef { pack: 0, offset: 0, length: 8, codec: Codec::Raw, hash: Hash32::of(&[0u8; 8]) };
    Manifest {
        version: (1, 0),
        writer: "test".into(),
        metadata: Some(serde_json::json!({"step": 3})),
        packs: vec![PackInfo { path: "packs/a-0.tpp".into(), size: 64 }],
        root: Tree::Dict(vec![
            (Key::Str("a".into()), Tree::Leaf(Entry::Int(Int::Small(1)))),
            (
                Key::Int(Int::Small(7)),
                Tree::List(vec![Tree::Leaf(Entry::Float(-0.0)), Tree::Leaf(Entry::Float(f64::NAN))]),
            ),
            (
                Key::Tuple(vec![Key::None, Key::Bool(true)]),
                Tree::Tuple(vec![Tree::Leaf(Entry::Str(Stored::Inline("x\"\n".into())))]),
            ),
            (
                Key::Str("w".into()),
                Tree::Leaf(Entry::Array(Box::new(ArrayEntry {
                    dtype: DType::F32,
                    shape: vec![2],
                    storage: ArrayStorage::Chunked { chunk_shape: vec![2], chunks: vec![chunk] },
                    preview: None,
                    annotation: Some(serde_json::json!({"type": "torch.Tensor", "requires_grad": true})),
                }))),
            ),
        ]),
    }
}

/// A manifest over 1 MiB: a root list of many records whose second level holds a big dict,
/// so both list and dict items take the split (parallel) parse.
pub(crate) fn big(keyed: bool) -> Manifest {
    let mut m = sample();
    let one = m.root.clone();
    let items: Vec<Tree<Entry>> = (0..3300)
        .map(|i| match i {
            7 => Tree::Dict(
                (0..2000).map(|j| (Key::Str(format!("k{j}")), Tree::Leaf(Entry::Int(Int::Small(j))))).collect(),
            ),
            _ => one.clone(),
        })
        .collect();
    m.root = if keyed {
        // A big dict under one member of the root (an optimizer's state, say).
        let named = items.into_iter().enumerate().map(|(i, t)| (Key::Str(format!("p{i}")), t)).collect();
        Tree::Dict(vec![(Key::Str("opt".into()), Tree::Dict(named))])
    } else {
        Tree::List(items)
    };
    m
}

/// The spec gives the trailer's length (86 bytes; an earlier text of the spec said 88).
#[test]
fn the_spec_states_the_hash_trailer_length() {
    assert_eq!(HASH_TRAILER_LEN, 86);
    let spec = include_str!("../../../../docs/format.md");
    assert!(spec.contains("(86 bytes in all)") && spec.contains("last 86 bytes"));
    let sealed = seal(b"{}");
    assert_eq!(sealed.len() - 2, HASH_TRAILER_LEN);
}

#[test]
fn one_pass_build_equals_decode_and_checks_every_leaf() {
    for keyed in [false, true] {
        let bytes = encode(&big(keyed), &serde_json::json!({}));
        let p = build(&bytes, "t", &OwnedTree).unwrap();
        let m = Manifest { version: p.version, writer: p.writer, metadata: p.metadata, packs: p.packs, root: p.root };
        // Compared as encoded bytes: the sample holds a NaN, which `==` never equals.
        assert!(encode(&m, &serde_json::json!({})) == bytes, "one-pass parse differs");
    }
    // A chunk past the end of its pack: `decode` finds it in its validation pass, `build`
    // while reading the leaf.
    let mut m = sample();
    m.packs[0].size = 4;
    let bytes = encode(&m, &serde_json::json!({}));
    assert!(matches!(decode(&bytes, "t"), Err(Error::OutOfBounds { .. })));
    let e = build(&bytes, "t", &OwnedTree).unwrap_err().to_string();
    assert!(e.contains("spans bytes"), "{e}");
}

/// A builder that must never be shown the packs it is given.
struct NoPacks;
impl Build for NoPacks {
    type Node = ();
    fn leaf_ref(&self, _e: &Entry) -> std::result::Result<(), String> {
        Ok(())
    }
    fn list(&self, _i: Vec<()>, _t: bool) -> std::result::Result<(), String> {
        Ok(())
    }
    fn dict(&self, _p: Vec<(Key, ())>) -> std::result::Result<(), String> {
        Ok(())
    }
    fn record(&self, _n: String, _f: Vec<(String, ())>) -> std::result::Result<(), String> {
        Ok(())
    }
    fn custom(&self, _n: String, _d: Value, _c: Vec<(String, ())>) -> std::result::Result<(), String> {
        Ok(())
    }
    fn packs(&self, packs: &[PackInfo]) {
        panic!("a builder was shown unchecked packs: {packs:?}");
    }
}

#[test]
fn builders_never_see_a_pack_path_that_escapes_the_tree() {
    let mut m = sample();
    m.packs[0].path = "../../etc/passwd".into();
    let bytes = encode(&m, &serde_json::json!({}));
    match build(&bytes, "t", &NoPacks) {
        Err(Error::InvalidManifest { key, reason, .. }) => {
            assert_eq!(key, "packs");
            assert!(reason.contains("not a safe relative path"), "{reason}");
        }
        other => panic!("expected InvalidManifest, got {other:?}"),
    }
}

#[test]
fn split_parse_equals_the_one_thread_parse() {
    for keyed in [false, true] {
        let bytes = encode(&big(keyed), &serde_json::json!({}));
        assert!(bytes.len() >= SPLIT_MIN_BYTES, "{}", bytes.len());
        let a = parse_with(&bytes, "t", true).unwrap();
        let b = parse_with(&bytes, "t", false).unwrap();
        assert_eq!(encode(&a, &serde_json::json!({})), bytes);
        assert_eq!(encode(&b, &serde_json::json!({})), bytes);
    }
}

thread_local! {
    /// Leaves handed over by `replay` on this thread (shows a helped parse really helped).
    pub(super) static REPLAYED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A builder that must stay on its thread ([`Build::HELPER`]); it builds the owned tree and
/// notes each leaf's key path as `enter`/`exit` give it.
struct Helped {
    thread: std::thread::ThreadId,
    path: RefCell<Vec<String>>,
    leaves: RefCell<Vec<String>>,
}
impl Helped {
    fn new() -> Helped {
        crate::exec::testing::install();
        Helped { thread: std::thread::current().id(), path: RefCell::default(), leaves: RefCell::default() }
    }
    fn here(&self) {
        assert_eq!(std::thread::current().id(), self.thread, "a HELPER builder was called off its thread");
    }
}
impl Build for Helped {
    type Node = Tree<Entry>;
    const HELPER: bool = true;
    const PATHS: bool = true;
    fn leaf_ref(&self, e: &Entry) -> std::result::Result<Tree<Entry>, String> {
        self.here();
        self.leaves.borrow_mut().push(self.path.borrow().join("/"));
        OwnedTree.leaf_ref(e)
    }
    fn list(&self, items: Vec<Tree<Entry>>, tuple: bool) -> std::result::Result<Tree<Entry>, String> {
        self.here();
        OwnedTree.list(items, tuple)
    }
    fn dict(&self, pairs: Vec<(Key, Tree<Entry>)>) -> std::result::Result<Tree<Entry>, String> {
        self.here();
        OwnedTree.dict(pairs)
    }
    fn record(&self, n: String, f: Vec<(String, Tree<Entry>)>) -> std::result::Result<Tree<Entry>, String> {
        self.here();
        OwnedTree.record(n, f)
    }
    fn custom(&self, n: String, d: Value, c: Vec<(String, Tree<Entry>)>) -> std::result::Result<Tree<Entry>, String> {
        self.here();
        OwnedTree.custom(n, d, c)
    }
    fn shared(&self, id: u64, node: Tree<Entry>) -> std::result::Result<Tree<Entry>, String> {
        self.here();
        OwnedTree.shared(id, node)
    }
    fn reference(&self, id: u64) -> std::result::Result<Tree<Entry>, String> {
        self.here();
        OwnedTree.reference(id)
    }
    fn enter(&self, step: Step<'_>) {
        let mut t = String::new();
        crate::keypath::push_step_text(&mut t, &step);
        self.path.borrow_mut().push(t);
    }
    fn exit(&self) {
        self.path.borrow_mut().pop();
    }
}

/// `text` (an edited manifest) with its trailing hash made right again.
fn rehash(text: &[u8]) -> Vec<u8> {
    let body = &text[..text.len() - HASH_TRAILER_LEN];
    let mut out = body.to_vec();
    out.extend_from_slice(format!("{HASH_PREFIX}{}{HASH_SUFFIX}", Hash32::of(body).to_hex()).as_bytes());
    out
}

/// The parse helper is lent to one parse at a time: the tests of helped parses take turns, so
/// each finds it free.
static HELPED_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A manifest over the streaming threshold with every kind of node: records, custom nodes with
/// data, shared nodes and refs to them (one a cycle), big ints, complex numbers, bytes, tuples
/// and typed keys.
fn every_node_kind() -> Manifest {
    let mut m = sample();
    let items = (0..2000u64)
        .map(|i| {
            let record = Tree::Record {
                type_name: "m.Rec".into(),
                fields: vec![
                    ("big".into(), Tree::Leaf(Entry::Int(Int::from_big(num_bigint::BigInt::from(u64::MAX) * (i + 1))))),
                    ("z".into(), Tree::Leaf(Entry::Complex(i as f64, -0.5))),
                    ("b".into(), Tree::Leaf(Entry::Bytes(Stored::Inline(bytes::Bytes::from(vec![i as u8; 3]))))),
                    ("back".into(), Tree::Ref(2 * i)),
                ],
            };
            let custom = Tree::Custom {
                type_name: "m.Obj".into(),
                data: serde_json::json!({"n": i, "s": "d\"q"}),
                children: vec![(
                    "kid".into(),
                    Tree::Tuple(vec![Tree::Leaf(Entry::None), Tree::Leaf(Entry::Bool(true))]),
                )],
            };
            Tree::Shared {
                id: 2 * i,
                node: Box::new(Tree::List(vec![
                    Tree::Shared { id: 2 * i + 1, node: Box::new(record) },
                    Tree::Ref(2 * i + 1),
                    custom,
                    Tree::Dict(vec![
                        (Key::Int(Int::Small(i as i64)), Tree::Leaf(Entry::Float(0.1))),
                        // Strings without escapes (lent by the parser) and with them (made by it).
                        (Key::Str(format!("s{i}")), Tree::Leaf(Entry::Str(Stored::Inline(format!("plain {i}"))))),
                        (Key::Str("e\"k".into()), Tree::Leaf(Entry::Str(Stored::Inline(format!("tab\t{i}\u{e9}"))))),
                    ]),
                ])),
            }
        })
        .collect();
    m.root = Tree::List(items);
    m
}

#[test]
fn streamed_build_equals_the_one_thread_build_for_every_node_kind() {
    let _turn = HELPED_TESTS.lock().unwrap_or_else(|p| p.into_inner());
    let bytes = encode(&every_node_kind(), &serde_json::json!({}));
    assert!(bytes.len() >= HELP_MIN_BYTES, "{}", bytes.len());
    let leaves = built_both_ways(&bytes);
    assert!(leaves.len() > 10_000, "{}", leaves.len());
}

/// Build `bytes` on one thread and through `build` (streamed when big), check that both
/// re-encode to `bytes` and saw the same key paths in the same order; returns those paths.
fn built_both_ways(bytes: &[u8]) -> Vec<String> {
    let (one, helped) = (Helped::new(), Helped::new());
    let a = build_one_thread(bytes, "t", &one).unwrap();
    let before = REPLAYED.with(|n| n.get());
    let b = build(bytes, "t", &helped).unwrap();
    if std::thread::available_parallelism().map_or(1, |p| p.get()) > 1 {
        assert!(REPLAYED.with(|n| n.get()) > before + 10, "the root was not streamed");
    }
    for p in [a, b] {
        let m = Manifest { version: p.version, writer: p.writer, metadata: p.metadata, packs: p.packs, root: p.root };
        assert!(encode(&m, &serde_json::json!({})) == bytes, "streamed parse differs");
    }
    let (x, y) = (one.leaves.into_inner(), helped.leaves.into_inner());
    assert_eq!(x, y, "the same key paths in the same order");
    x
}

/// The one-pass parse streams a big root from the writer's layout: `root` after a line break,
/// last before the hash. A manifest with a member after `root` is refused at any size (`decode`
/// reads it); a line break before a `"root":` that is not the top-level member changes nothing.
#[test]
fn streamed_build_needs_root_last_and_finds_the_top_level_root() {
    let _turn = HELPED_TESTS.lock().unwrap_or_else(|p| p.into_inner());
    for m in [sample(), big(false)] {
        let text = String::from_utf8(encode(&m, &serde_json::json!({}))).unwrap();
        let body_end = text.len() - HASH_TRAILER_LEN;
        let after = rehash(format!("{},\"extra\":1{}", &text[..body_end], &text[body_end..]).as_bytes());
        assert!(decode(&after, "t").is_ok());
        for r in [build(&after, "t", &Helped::new()), build_one_thread(&after, "t", &Helped::new())] {
            let e = r.expect_err("a member after root");
            assert!(e.to_string().contains("member `extra` after `root`"), "{e}");
        }
        let nested = text.replacen("\"metadata\":{\"step\":3}", "\"metadata\":{\n\"root\":{\n\"root\":2}}", 1);
        assert_ne!(nested, text);
        let nested = rehash(nested.as_bytes());
        let p = build(&nested, "t", &Helped::new()).unwrap();
        assert_eq!(p.metadata, Some(serde_json::json!({"root": {"root": 2}})));
        let m2 = Manifest { version: p.version, writer: p.writer, metadata: p.metadata, packs: p.packs, root: p.root };
        let d = decode(&nested, "t").unwrap();
        assert!(encode(&m2, &serde_json::json!({})) == encode(&d, &serde_json::json!({})));
    }
}

#[test]
fn helped_build_equals_the_one_thread_build() {
    let _turn = HELPED_TESTS.lock().unwrap_or_else(|p| p.into_inner());
    // The big container at the root, one level down in a root dict, and as the dominant
    // item of a small root list (the only item of a small container that is split further).
    let mut wrapped = big(true);
    let Tree::Dict(mut opt) = wrapped.root else { unreachable!("big(true) is a dict") };
    let payload = opt.pop().map(|(_, t)| t).unwrap_or(Tree::Leaf(Entry::None));
    wrapped.root = Tree::List(vec![Tree::Leaf(Entry::Int(Int::Small(1))), payload]);
    for m in [big(false), big(true), wrapped] {
        let bytes = encode(&m, &serde_json::json!({}));
        assert!(bytes.len() >= SPLIT_MIN_BYTES, "{}", bytes.len());
        let leaves = built_both_ways(&bytes);
        assert!(leaves.len() > 10_000 && leaves.iter().any(|p| p.contains("/k1999")), "{}", leaves.len());
    }
}

#[test]
fn helped_build_refuses_what_the_one_thread_build_refuses() {
    let _turn = HELPED_TESTS.lock().unwrap_or_else(|p| p.into_inner());
    for keyed in [false, true] {
        let text = String::from_utf8(encode(&big(keyed), &serde_json::json!({}))).unwrap();
        let damaged = damaged_copies(
            &text,
            [
                // a bad node in an early item of the big container
                (text.find("{\"t\":\"tuple\""), "{\"t\":\"tuple\"", "{\"t\":\"tupel\""),
                // a chunk past the end of its pack (a check made only inline by `build`)
                (text.rfind("\"length\":"), "\"length\":", "\"length\":9"),
            ],
        );
        for (bad, to) in damaged {
            let with_hash = rehash(bad.as_bytes());
            assert!(decode(&with_hash, "t").is_err(), "{to}: decode accepts it");
            let errs: Vec<(String, String)> = [true, false]
                .iter()
                .map(|&helped| {
                    let r = if helped {
                        build(&with_hash, "t", &Helped::new())
                    } else {
                        build_one_thread(&with_hash, "t", &Helped::new())
                    };
                    key_and_reason(r, to)
                })
                .collect();
            assert_eq!(errs[0], errs[1], "{to}");
        }
        // Damage the hash does not cover: the streamed build hashes while its helper parses,
        // and reports the checksum as the one-thread build does, having built nothing.
        let mut bad = text.clone().into_bytes();
        let at = bad.len() / 2;
        bad[at] = if bad[at] == b'1' { b'2' } else { b'1' };
        let helped = Helped::new();
        let (a, b) = (build(&bad, "t", &helped).unwrap_err(), build_one_thread(&bad, "t", &Helped::new()).unwrap_err());
        assert!(matches!(a, Error::ManifestChecksum { .. }), "{a}");
        assert_eq!(a.to_string(), b.to_string());
        assert!(helped.leaves.into_inner().is_empty(), "the builder was fed a damaged manifest");
    }
}

#[test]
fn split_parse_names_the_same_key_path_on_errors() {
    for keyed in [false, true] {
        split_errors_match(String::from_utf8(encode(&big(keyed), &serde_json::json!({}))).unwrap());
    }
}

fn split_errors_match(text: String) {
    for (bad, to) in damaged_copies(&text, []) {
        let errs: Vec<(String, String)> =
            [true, false].iter().map(|&split| key_and_reason(parse_with(bad.as_bytes(), "t", split), to)).collect();
        assert_eq!(errs[0], errs[1], "{to}");
    }
}

/// Copies of a big manifest's text (`big`), each damaged at one place, with what was written
/// there: a bad dtype deep inside a late item (list item 2500), a bad int inside the big dict
/// (item 7, key k1500), a duplicate key in the big dict, a bad node in a late item of the root
/// container; then each of `more`, (where, what is there, what replaces it).
fn damaged_copies<const N: usize>(
    text: &str,
    more: [(Option<usize>, &str, &'static str); N],
) -> Vec<(String, &'static str)> {
    let common = [
        (text.rmatch_indices("\"float32\"").nth(100).map(|(i, _)| i), "\"float32\"", "\"float33\""),
        (text.find("\"k1500\":1500"), "\"k1500\":1500", "\"k1500\":{\"t\":\"int\",\"v\":\"x\"}"),
        (text.find("\"k1501\":1501"), "\"k1501\":1501", "\"k1500\":1501"),
        (text.rfind("{\"t\":\"tuple\""), "{\"t\":\"tuple\"", "{\"t\":\"tupel\""),
    ];
    common
        .into_iter()
        .chain(more)
        .map(|(at, from, to)| {
            let at = at.expect("pattern present");
            (format!("{}{}{}", &text[..at], to, &text[at + from.len()..]), to)
        })
        .collect()
}

/// The key path and reason (without its line and column) of an `InvalidManifest` error.
fn key_and_reason<T: std::fmt::Debug>(r: crate::error::Result<T>, to: &str) -> (String, String) {
    match r {
        Err(Error::InvalidManifest { key, reason, .. }) => {
            (key, reason.split(" at line ").next().unwrap_or_default().to_string())
        }
        other => panic!("{to}: expected InvalidManifest, got {other:?}"),
    }
}

#[test]
fn encode_decode_round_trip() {
    let m = sample();
    let bytes = encode(&m, &serde_json::json!({}));
    let back = decode(&bytes, "t").unwrap();
    assert_eq!(back.packs, m.packs);
    assert_eq!(back.metadata, m.metadata);
    // NaN != NaN, so compare the re-encoding instead
    assert_eq!(encode(&back, &serde_json::json!({})), bytes);
    // still plain JSON for other tools
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["format"], "treepack");
}

#[test]
fn detects_flips_and_truncation() {
    let bytes = encode(&sample(), &serde_json::json!({}));
    let mut flipped = bytes.clone();
    flipped[60] ^= 1;
    assert!(decode(&flipped, "t").is_err());
    assert!(matches!(decode(&bytes[..bytes.len() - 5], "t"), Err(Error::NotTreepack { .. })));
}

fn with_root(root: &str) -> Vec<u8> {
    let body = format!("{{\"format\":\"treepack\",\"version\":[1,0],\n\"packs\":[],\n\"root\":{root}");
    let h = Hash32::of(body.as_bytes());
    format!("{body}{HASH_PREFIX}{}{HASH_SUFFIX}", h.to_hex()).into_bytes()
}

#[test]
fn rejects_hostile_roots() {
    let cases = [
        ("{\"t\":\"dict\",\"items\":[[\"a\",1],[\"a\",2]]}", "duplicate key"),
        ("{\"a\":1,\"a\":2}", "duplicate key"),
        ("{\"a\":1,\"\\u0061\":2}", "duplicate key"),
        ("{\"a\":{\"t\":\"wat\"}}", "unknown node type"),
        ("{\"t\":\"array\",\"dtype\":\"float32\",\"shape\":[2],\"data\":\"AAAA\"}", "inline data"),
        ("{\"t\":\"wat\"}", "unknown node type"),
        ("{\"t\":\"dict\",\"items\":[[[1],2]]}", "dict key"),
        ("{\"t\":\"float\",\"v\":\"NaN\"}", "float string"),
    ];
    for (root, needle) in cases {
        let err = decode(&with_root(root), "t").unwrap_err().to_string();
        assert!(err.contains(needle), "{root}: {err}");
    }
    let deep = "[".repeat(MAX_DEPTH + 5) + &"]".repeat(MAX_DEPTH + 5);
    assert!(decode(&with_root(&deep), "t").unwrap_err().to_string().contains("deeper"));
    let ok = "[".repeat(MAX_DEPTH - 1) + &"]".repeat(MAX_DEPTH - 1);
    decode(&with_root(&ok), "t").unwrap();
}

#[test]
fn dict_keys_of_every_kind_parse_and_escaped_duplicates_are_found() {
    // String keys take `KeySeed`'s direct path (borrowed and unescaped); the others are
    // read as nodes and converted. Both must give the keys the writer meant.
    let root = r#"{"t":"dict","items":[["plain",1],["esc\"aped\n",2],[7,3],[1.5,4],[true,5],[null,6],
        [{"t":"tuple","items":[1,"x"]},7],[{"t":"int","v":"123456789012345678901234567890"},8]]}"#;
    let m = decode(&with_root(root), "t").unwrap();
    let Tree::Dict(pairs) = &m.root else { panic!("not a dict") };
    let keys: Vec<&Key> = pairs.iter().map(|(k, _)| k).collect();
    let big = Int::parse("123456789012345678901234567890").unwrap();
    let want = [
        Key::Str("plain".into()),
        Key::Str("esc\"aped\n".into()),
        Key::Int(Int::Small(7)),
        Key::Float(1.5),
        Key::Bool(true),
        Key::None,
        Key::Tuple(vec![Key::Int(Int::Small(1)), Key::Str("x".into())]),
        Key::Int(big),
    ];
    assert_eq!(keys, want.iter().collect::<Vec<_>>());
    // "a" written escaped is still "a": a duplicate, in small dicts and big ones.
    let small = r#"{"t":"dict","items":[["a",1],["\u0061",2]]}"#;
    let big_items: Vec<String> = (0..40).map(|i| format!("[\"k{i}\",{i}]")).collect();
    let big = format!(r#"{{"t":"dict","items":[{},["\u006b7",0]]}}"#, big_items.join(","));
    for root in [small.to_string(), big] {
        let err = decode(&with_root(&root), "t").unwrap_err().to_string();
        assert!(err.contains("duplicate key"), "{err}");
    }
}

#[test]
fn error_names_the_key_path() {
    let err = decode(&with_root("{\"t\":\"dict\",\"items\":[[\"params\",[1,{\"t\":\"zzz\"}]]]}"), "f").unwrap_err();
    match err {
        Error::InvalidManifest { key, .. } => assert_eq!(key, "params/1"),
        e => panic!("{e}"),
    }
}

#[test]
fn future_major_version_says_upgrade() {
    let body = "{\"format\":\"treepack\",\"version\":[2,0],\"packs\":[],\"root\":null}";
    assert!(matches!(decode(body.as_bytes(), "f"), Err(Error::UnsupportedVersion { .. })));
}

#[test]
fn strings_are_escaped_exactly_where_json_requires() {
    // Runs without escapes copied whole, every escape at the right place, multi-byte
    // characters intact; serde_json reads back the same string.
    for v in [
        "",
        "plain",
        "q\"uote\\back",
        "\n\r\t\u{1}\u{1f}\u{7f} ctl",
        "é✓😀 mixed \"é\" \u{0}",
        "\"\"\\\\",
        "ends with \u{7f}",
    ] {
        let mut s = String::new();
        super::text::write_str(&mut s, v);
        let back: String = serde_json::from_str(&s).unwrap_or_else(|e| panic!("{s}: {e}"));
        assert_eq!(back, v);
        assert!(s.bytes().all(|b| b >= 0x20 && b != 0x7f), "raw control byte in {s:?}");
    }
    let mut s = String::new();
    super::text::write_str(&mut s, "a\u{1}b\"");
    assert_eq!(s, r#""a\u0001b\"""#);
}

/// `packs_of` (what an overwrite reads of the tree it replaces) names the packs `decode` does,
/// from the members alone in the writer's layout and through the whole parse otherwise, and
/// refuses what `decode` refuses.
#[test]
fn packs_of_reads_the_members_and_checks_as_decode_does() {
    for m in [sample(), big(false)] {
        let bytes = encode(&m, &serde_json::json!({}));
        assert_eq!(packs_of(&bytes, "t").unwrap(), m.packs);
        // `root` not last (another writer's member order): the whole parse reads it.
        let text = String::from_utf8(bytes.clone()).unwrap();
        let body_end = text.len() - HASH_TRAILER_LEN;
        let after = rehash(format!("{},\"extra\":1{}", &text[..body_end], &text[body_end..]).as_bytes());
        assert_eq!(packs_of(&after, "t").unwrap(), m.packs);
        // A damaged body fails the hash, as in `decode`.
        let mut bad = bytes.clone();
        let i = bad.len() / 2;
        bad[i] ^= 1;
        let (a, b) = (packs_of(&bad, "t").unwrap_err(), decode(&bad, "t").unwrap_err());
        assert_eq!(a.to_string(), b.to_string());
        // A pack path outside `packs/` is refused in the members, as in `decode`.
        let evil = rehash(text.replacen("packs/a-0.tpp", "../a-0.tpp", 1).as_bytes());
        assert!(decode(&evil, "t").is_err());
        assert!(packs_of(&evil, "t").is_err());
    }
}

/// Floats are written by zmij as Ryu writes them (the format's reference text, golden files and
/// key paths): the same digits, `e16` and not `e+16`.
#[test]
fn floats_are_written_as_ryu_writes_them() {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut vals =
        vec![0.0, -0.0, 1.0, 0.1, 0.3, 1e-5, 1e-7, 1e15, 1e16, 1e21, 1e22, f64::MAX, f64::MIN_POSITIVE, 5e-324];
    for i in 0..200_000u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        vals.extend([f64::from_bits(x), 1.0 / (i as f64 + 1.0), (x % 1_000_000) as f64 * 1e-3, -(x as f64)]);
    }
    let mut r = ryu::Buffer::new();
    for v in vals.into_iter().filter(|v| v.is_finite()) {
        let mut s = String::new();
        super::text::push_finite_float(&mut s, v);
        assert_eq!(s, r.format_finite(v), "{v:e}");
    }
}

/// Counts the leaves it builds and refuses the type `m:Refused` (a record or custom node) in
/// `named_begin`, as a builder that needs an audit for some types does.
#[derive(Default)]
struct Refusing {
    leaves: std::cell::Cell<usize>,
    asked: RefCell<Vec<(bool, String)>>,
    /// The steps `failed_under` was called with, innermost first.
    failed: RefCell<Vec<String>>,
}
impl Build for Refusing {
    type Node = Tree<Entry>;
    fn leaf_ref(&self, e: &Entry) -> std::result::Result<Tree<Entry>, String> {
        self.leaves.set(self.leaves.get() + 1);
        OwnedTree.leaf_ref(e)
    }
    fn list(&self, items: Vec<Tree<Entry>>, tuple: bool) -> std::result::Result<Tree<Entry>, String> {
        OwnedTree.list(items, tuple)
    }
    fn dict(&self, pairs: Vec<(Key, Tree<Entry>)>) -> std::result::Result<Tree<Entry>, String> {
        OwnedTree.dict(pairs)
    }
    fn named_begin(&self, custom: bool, type_name: &str) -> std::result::Result<(), String> {
        self.asked.borrow_mut().push((custom, type_name.to_string()));
        Refusing::refuse(type_name)
    }
    fn record(&self, n: String, f: Vec<(String, Tree<Entry>)>) -> std::result::Result<Tree<Entry>, String> {
        Refusing::refuse(&n)?;
        OwnedTree.record(n, f)
    }
    fn custom(&self, n: String, d: Value, c: Vec<(String, Tree<Entry>)>) -> std::result::Result<Tree<Entry>, String> {
        Refusing::refuse(&n)?;
        OwnedTree.custom(n, d, c)
    }
    fn failed_under(&self, step: Step<'_>) {
        self.failed.borrow_mut().push(crate::keypath::steps_text(&[step]));
    }
}
impl Refusing {
    /// What the builder refuses at a node's end too (when `named_begin` came too late or never).
    fn refuse(type_name: &str) -> std::result::Result<(), String> {
        if type_name == "m:Refused" {
            return Err(format!("`{type_name}` needs the audit"));
        }
        Ok(())
    }
}

#[test]
fn a_refused_type_stops_the_build_before_anything_under_it_is_built() {
    let node = |kind: &str, members: &str, ty: &str| {
        let (list, data) = if kind == "custom" { ("children", ",\"data\":{\"k\":1}") } else { ("fields", "") };
        let kids = "[[\"x\",1],[\"y\",{\"z\":[2,3]}]]";
        match members {
            "type first" => format!("{{\"t\":\"{kind}\",\"type\":\"{ty}\"{data},\"{list}\":{kids}}}"),
            _ => format!("{{\"t\":\"{kind}\",\"{list}\":{kids}{data},\"type\":\"{ty}\"}}"),
        }
    };
    for kind in ["record", "custom"] {
        for members in ["type first", "type last"] {
            let root = format!(
                "{{\"a\":[1,2],\"ok\":{},\"bad\":{},\"after\":4}}",
                node(kind, members, "m:Fine"),
                node(kind, members, "m:Refused")
            );
            let bytes = with_root(&root);
            let b = Refusing::default();
            let e = build(&bytes, "t", &b).unwrap_err().to_string();
            assert!(e.contains("`m:Refused` needs the audit"), "{e}");
            // `a` (2) and the accepted node (3) are built; the refused node's 3 leaves only
            // when its type came after them (read to the end of the node, as before).
            let want = if members == "type first" { 5 } else { 8 };
            assert_eq!(b.leaves.get(), want, "{kind}, {members}");
            // Asked by the parser, with the node's kind, only when `type` came first.
            let asked = b.asked.borrow().clone();
            let fine = (kind == "custom", "m:Fine".to_string());
            let refused = (kind == "custom", "m:Refused".to_string());
            let expect = if members == "type first" { vec![fine, refused] } else { vec![] };
            assert_eq!(asked, expect, "{kind}, {members}");
            // The same manifest's owned tree, replayed: refused before its children.
            let owned = decode(&with_root(&root.replace("m:Refused", "m:Other")), "t").unwrap().root;
            let refused = match owned {
                Tree::Dict(mut pairs) => {
                    if let Some((_, Tree::Record { type_name, .. } | Tree::Custom { type_name, .. })) = pairs.get_mut(2)
                    {
                        *type_name = "m:Refused".into();
                    }
                    Tree::Dict(pairs)
                }
                other => panic!("{other:?}"),
            };
            let b = Refusing::default();
            let e = replay(&b, &refused).unwrap_err();
            assert!(e.contains("needs the audit"), "{e}");
            assert_eq!(b.leaves.get(), 5, "{kind}, replayed");
            assert_eq!(b.asked.borrow().last(), Some(&(kind == "custom", "m:Refused".to_string())), "{kind}");
            // Where it failed, told step by step as the error went out: `bad`, nothing else.
            assert_eq!(*b.failed.borrow(), ["bad"], "{kind}");
            // Deeper: under a list item and an int key, innermost step first.
            let deep = Tree::Dict(vec![(
                Key::Str("runs".into()),
                Tree::List(vec![Tree::List(vec![]), { Tree::Dict(vec![(Key::Int(Int::Small(7)), refused.clone())]) }]),
            )]);
            let b = Refusing::default();
            replay(&b, &deep).unwrap_err();
            assert_eq!(*b.failed.borrow(), ["bad", "~i7", "1", "runs"], "{kind}");
        }
    }
}
