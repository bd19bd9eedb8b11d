//! The pickle reader on hand-made streams: what it reads, and what it refuses with which
//! error (the corpus of real and hostile torch files is in crates/treepack/tests/torch*.rs).

use treepack_format::model::{Int, Key, Leaf, Tree};
use treepack_format::pickle::torch::{read, Item};
use treepack_format::pickle::{parse, Limits, PickleError};

fn tree(b: &[u8]) -> Tree<Item> {
    read(b, &Limits::default()).unwrap_or_else(|e| panic!("{e}")).tree
}
fn err(b: &[u8]) -> PickleError {
    read(b, &Limits::default()).expect_err("refused")
}
fn leaf(l: Leaf) -> Tree<Item> {
    Tree::Leaf(Item::Leaf(l))
}

#[test]
fn plain_values_of_every_protocol() {
    // Protocol 0: a dict of an int, a float, a str, a list, a long.
    let t = tree(b"(dp0\nVa\np1\nI7\nsVb\np2\nF2.5\nsVc\n(lp3\nI01\naNasVd\nL12345678901234567890L\ns.");
    let Tree::Dict(items) = t else { panic!() };
    assert_eq!(items[0], (Key::Str("a".into()), leaf(Leaf::Int(7.into()))));
    assert_eq!(items[1].1, leaf(Leaf::Float(2.5)));
    assert_eq!(items[2].1, Tree::List(vec![leaf(Leaf::Bool(true)), leaf(Leaf::None)]));
    assert_eq!(items[3].1, leaf(Leaf::Int(Int::parse("12345678901234567890").unwrap())));
    // Protocol 4: framed, memoized, a frozenset and bytes.
    let t = tree(b"\x80\x04\x95\x0f\x00\x00\x00\x00\x00\x00\x00(K\x01K\x02\x91\x94C\x02hi\x94\x86\x94.");
    let Tree::Tuple(v) = t else { panic!() };
    assert!(
        matches!(&v[0], Tree::Custom { type_name, children, .. } if type_name == "py.frozenset" && children.len() == 2)
    );
    assert_eq!(v[1], leaf(Leaf::Bytes(b"hi".to_vec().into())));
    // Protocol 2 bytes: _codecs.encode(str, 'latin1').
    let t = tree(b"\x80\x02c_codecs\nencode\nX\x03\x00\x00\x00\xc3\xbfaX\x06\x00\x00\x00latin1\x86R.");
    assert_eq!(t, leaf(Leaf::Bytes(vec![0xff, b'a'].into())));
    // A repeated key is refused; LONG1 of a negative number.
    assert_eq!(err(b"}(K\x01K\x02K\x01K\x03u.").kind(), "malformed");
    assert_eq!(tree(b"\x80\x02\x8a\x01\xff."), leaf(Leaf::Int((-1).into())));
}

#[test]
fn globals_outside_the_allow_list_are_refused_where_met() {
    let e = err(b"\x80\x02}X\x01\x00\x00\x00k]q\x00(K\x01cos\nsystem\n");
    match e {
        PickleError::Refused { global, path } => assert_eq!((global.as_str(), path.as_str()), ("os.system", "k/1")),
        e => panic!("{e}"),
    }
    // Even a global never called is refused: nothing outside the list is named and kept.
    assert_eq!(err(b"cbuiltins\ngetattr\n.").kind(), "refused");
    // Allowed globals used as what they are not.
    assert_eq!(err(b"\x80\x02ctorch\nFloatStorage\n)R.").kind(), "bad_call");
    assert_eq!(err(b"\x80\x02ccollections\nOrderedDict\nK\x01\x85R.").kind(), "bad_call");
}

#[test]
fn opcode_attacks_fail_fast_and_typed() {
    let cases: &[(&[u8], &str)] = &[
        (b"\x80\x04\x8e\xff\xff\xff\xff\xff\xff\xff\xff.", "truncated"),
        (b"\x80\x02X\xff\xff\xff\xff", "truncated"),
        (b"\x80\x02\x8b\x00\x00\x00\x40", "limit"),
        (b"\x80\x02h\x05.", "malformed"),
        (b"\x80\x02Nr\x00\x00\x00\x7f.", "limit"),
        (b"\x80\x02a.", "malformed"),
        (b"\x80\x02e.", "malformed"),
        (b"\x80\x021.", "malformed"),
        (b"\x80\x02(\x85.", "malformed"),
        (b"\x80\x02N", "truncated"),
        (b"\x80\x02S'abc\n.", "malformed"),
        (b"\x80\x02Ffoo\n.", "malformed"),
        (b"\x80\x02I1", "truncated"),
        (b"\x80\x02\x83\x01\x00.", "opcode"),
        (b"", "truncated"),
    ];
    for (b, kind) in cases {
        let e = err(b);
        assert_eq!(e.kind(), *kind, "{b:?}: {e}");
    }
}

#[test]
fn limits_hold() {
    let tight = Limits { max_depth: 10, max_memo: 4, max_objects: 100, ..Limits::default() };
    let deep = [&b"\x80\x02"[..], &[b'('; 11], b"."].concat();
    assert_eq!(parse(&deep, &tight).unwrap_err().kind(), "limit");
    assert_eq!(parse(b"\x80\x02Nq\x05.", &tight).unwrap_err().kind(), "limit");
    let many = [&b"\x80\x02("[..], &[b'N'; 101], b"l."].concat();
    assert_eq!(parse(&many, &tight).unwrap_err().kind(), "limit");
    // Nested lists deeper than the tree's bound.
    let lists = [&b"\x80\x02"[..], &[b']'; 12], &[b'a'; 11], b"."].concat();
    assert_eq!(read(&lists, &tight).unwrap_err().kind(), "limit");
}
