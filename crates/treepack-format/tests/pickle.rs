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
        PickleError::Refused { global, path, .. } => assert_eq!((global.as_str(), path.as_str()), ("os.system", "k/1")),
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

/// `pickle.dumps(MetadataIndex('w', [1, 2]))`, `pickle.dumps(_StorageInfo('a.distcp', 3, 4))`,
/// `pickle.dumps(PurePosixPath('/a/b'))` and `pickle.dumps(torch.strided)` as torch 2.x writes them.
const DCP_INDEX: &[u8] = b"\x80\x04\x95z\x00\x00\x00\x00\x00\x00\x00\x8c%torch.distributed.checkpoint.metadata\x94\x8c\rMetadataIndex\x94\x93\x94)\x81\x94}\x94(\x8c\x03fqn\x94\x8c\x01w\x94\x8c\x05index\x94N\x8c\x06offset\x94\x8c\x05torch\x94\x8c\x04Size\x94\x93\x94K\x01K\x02\x86\x94\x85\x94R\x94ub.";
const DCP_INFO: &[u8] = b"\x80\x04\x95u\x00\x00\x00\x00\x00\x00\x00\x8c'torch.distributed.checkpoint.filesystem\x94\x8c\x0c_StorageInfo\x94\x93\x94)\x81\x94}\x94(\x8c\rrelative_path\x94\x8c\x08a.distcp\x94\x8c\x06offset\x94K\x03\x8c\x06length\x94K\x04ub.";
const POSIX_PATH: &[u8] = b"\x80\x04\x95-\x00\x00\x00\x00\x00\x00\x00\x8c\x07pathlib\x94\x8c\rPurePosixPath\x94\x93\x94\x8c\x01/\x94\x8c\x01a\x94\x8c\x01b\x94\x87\x94R\x94.";
const LAYOUT: &[u8] = b"\x80\x04\x95;\x00\x00\x00\x00\x00\x00\x00\x8c\x13torch.serialization\x94\x8c\x0b_get_layout\x94\x93\x94\x8c\rtorch.strided\x94\x85\x94R\x94.";

#[test]
fn each_caller_has_its_own_allow_list() {
    use treepack_format::pickle::{parse_with, AllowList, DcpClass, Global, Obj};
    let dcp = |b: &[u8]| parse_with(b, &Limits::default(), AllowList::DcpMetadata);
    // DCP's classes are records under the metadata's list...
    let p = dcp(DCP_INDEX).unwrap();
    let Obj::Record(r) = p.get(p.root()) else { panic!("{:?}", p.get(p.root())) };
    assert_eq!(r.class, Global::Dcp(DcpClass::MetadataIndex));
    assert_eq!(p.get(r.field("fqn").unwrap()), &Obj::Str("w".into()));
    assert_eq!(p.get(r.field("offset").unwrap()), &Obj::Size(vec![1, 2]));
    let p = dcp(DCP_INFO).unwrap();
    let Obj::Record(r) = p.get(p.root()) else { panic!() };
    assert_eq!(r.class, Global::Dcp(DcpClass::StorageInfo));
    assert_eq!(p.get(r.field("length").unwrap()), &Obj::Int(4.into()));
    let p = dcp(POSIX_PATH).unwrap();
    assert_eq!(p.get(p.root()), &Obj::Str("/a/b".into()));
    let win = b"\x80\x04\x951\x00\x00\x00\x00\x00\x00\x00\x8c\x07pathlib\x94\x8c\x0fPureWindowsPath\x94\x93\x94\x8c\x03C:\\\x94\x8c\x01a\x94\x8c\x01b\x94\x87\x94R\x94.";
    let p = dcp(win).unwrap();
    assert_eq!(p.get(p.root()), &Obj::Str("C:\\a\\b".into()));
    let p = dcp(LAYOUT).unwrap();
    assert!(matches!(p.get(p.root()), Obj::Record(r) if r.class == Global::TorchLayout));
    // ... and refused by torch.save's, which reads checkpoints: its attack surface is unchanged.
    for b in [DCP_INDEX, DCP_INFO, POSIX_PATH, LAYOUT] {
        let e = parse(b, &Limits::default()).unwrap_err();
        assert_eq!(e.kind(), "refused", "{e}");
        assert!(e.to_string().contains("only tensors, storages"), "{e}");
    }
    // torch.save's own names are refused in a .metadata (a tensor rebuild, OrderedDict, numpy).
    for (m, n) in [("torch._utils", "_rebuild_tensor_v2"), ("collections", "OrderedDict"), ("numpy", "dtype")] {
        let s = format!("c{m}\n{n}\n.");
        let e = dcp(s.as_bytes()).unwrap_err();
        assert_eq!(e.kind(), "refused", "{e}");
        assert!(e.to_string().contains("torch.distributed.checkpoint .metadata"), "{e}");
    }
}

#[test]
fn records_are_built_once_from_their_state() {
    use treepack_format::pickle::{parse_with, AllowList};
    let dcp = |b: &[u8]| parse_with(b, &Limits::default(), AllowList::DcpMetadata);
    let class = b"\x80\x04\x8c'torch.distributed.checkpoint.filesystem\x8c\x0c_StorageInfo\x93";
    let with = |rest: &[u8]| [&class[..], rest].concat();
    // Called with arguments, built twice, given a list as state, a state of 65 fields.
    assert_eq!(dcp(&with(b"K\x01\x85\x81.")).unwrap_err().kind(), "bad_call");
    assert_eq!(dcp(&with(b")\x81}b}b.")).unwrap_err().kind(), "bad_call");
    assert_eq!(dcp(&with(b")\x81]b.")).unwrap_err().kind(), "bad_call");
    let mut many = with(b")\x81}(");
    for i in 0..65 {
        many.extend_from_slice(b"\x8c\x03");
        many.extend_from_slice(format!("f{i:02}").as_bytes());
        many.extend_from_slice(b"K\x00");
    }
    many.extend_from_slice(b"ub.");
    let e = dcp(&many).unwrap_err();
    assert!(e.to_string().contains("more than 64 fields"), "{e}");
    // A slots state (None, {...}) sets fields.
    assert!(dcp(&with(b")\x81N}\x8c\x06offsetK\x01s\x86b.")).is_ok());
    // An enum member outside DCP's three, a layout name too long.
    let e = dcp(b"\x80\x04\x8c%torch.distributed.checkpoint.metadata\x8c\x14_MEM_FORMAT_ENCODING\x93K\x07\x85R.")
        .unwrap_err();
    assert_eq!(e.kind(), "bad_call", "{e}");
}

#[test]
fn dcp_metadata_reads_as_a_typed_description() {
    use treepack_format::pickle::dcp;
    // Not Metadata at its root: refused naming what it is.
    let e = dcp::read(DCP_INDEX, &Limits::default()).unwrap_err();
    assert!(e.to_string().contains("not torch.distributed.checkpoint.metadata.Metadata"), "{e}");
}

/// The placeholder of an object built from the refused global `g`, as `read_placeholders` makes it.
fn is_placeholder(t: &Tree<Item>, g: &str) -> bool {
    matches!(t, Tree::Custom { type_name, data, children }
        if *type_name == format!("pickle:{g}") && children.is_empty() && data["global"] == g
            && data["reason"].as_str().is_some_and(|r| r.contains(g) && r.contains("nothing named by the file was imported or run")))
}

#[test]
fn refused_globals_become_placeholders_only_when_asked() {
    use treepack_format::pickle::parse_placeholders;
    use treepack_format::pickle::torch::read_placeholders;
    let ph = |b: &[u8]| read_placeholders(b, &Limits::default()).unwrap_or_else(|e| panic!("{e}")).tree;
    // {'a': os.system('ls'), 'b': 7}: REDUCE on a refused global.
    let system = b"\x80\x02}(X\x01\x00\x00\x00acos\nsystem\nX\x02\x00\x00\x00ls\x85RX\x01\x00\x00\x00bK\x07u.";
    match err(system) {
        PickleError::Refused { global, path, .. } => assert_eq!((global.as_str(), path.as_str()), ("os.system", "a")),
        e => panic!("{e}"),
    }
    let Tree::Dict(items) = ph(system) else { panic!() };
    assert!(is_placeholder(&items[0].1, "os.system"), "{:?}", items[0].1);
    assert_eq!(items[1], (Key::Str("b".into()), leaf(Leaf::Int(7.into()))));
    // NEWOBJ then BUILD on a refused class: its state is dropped, unread.
    let built = b"\x80\x02cmypkg\nThing\n)\x81}X\x01\x00\x00\x00xcos\nsystem\nsb.";
    assert_eq!(err(built).kind(), "refused");
    assert!(is_placeholder(&ph(built), "mypkg.Thing"));
    // A list subclass with APPENDS, a dict subclass with SETITEMS, INST, OBJ and NEWOBJ_EX: all placeholders.
    let list_sub = b"\x80\x02cmypkg\nL\n)\x81(K\x01K\x02e.";
    assert!(is_placeholder(&ph(list_sub), "mypkg.L"));
    let dict_sub = b"\x80\x02cmypkg\nD\n)\x81(K\x01K\x02u.";
    assert!(is_placeholder(&ph(dict_sub), "mypkg.D"));
    assert!(is_placeholder(&ph(b"(K\x01imypkg\nThing\n."), "mypkg.Thing"));
    assert!(is_placeholder(&ph(b"\x80\x02(cmypkg\nThing\nK\x01o."), "mypkg.Thing"));
    assert!(is_placeholder(&ph(b"\x80\x04\x8c\x05mypkg\x8c\x05Thing\x93)}\x92."), "mypkg.Thing"));
    // A refused global never called, inside a list and as a dict value.
    let Tree::List(v) = ph(b"\x80\x02](cmypkg\nThing\n)\x81K\x01}X\x01\x00\x00\x00kcbuiltins\neval\nse.") else {
        panic!()
    };
    assert!(is_placeholder(&v[0], "mypkg.Thing"));
    assert_eq!(v[1], leaf(Leaf::Int(1.into())));
    let Tree::Dict(d) = &v[2] else { panic!() };
    assert!(is_placeholder(&d[0].1, "builtins.eval"));
    // As a dict key a placeholder cannot stand: still refused, naming it and where.
    match read_placeholders(b"\x80\x02}(X\x01\x00\x00\x00k}cmypkg\nThing\n)\x81K\x01su.", &Limits::default()) {
        Err(PickleError::Refused { global, path, .. }) => {
            assert_eq!((global.as_str(), path.as_str()), ("mypkg.Thing", "k"))
        }
        r => panic!("{r:?}"),
    }
    // A placeholder given to an allowed global is checked as data, as anything else would be.
    let arg = b"\x80\x02ccollections\nOrderedDict\ncmypkg\nX\n)R\x85R.";
    assert_eq!(read_placeholders(arg, &Limits::default()).unwrap_err().kind(), "bad_call");
    // Other opcodes and every limit hold as before.
    assert_eq!(parse_placeholders(b"\x80\x02\x82\x01.", &Limits::default()).unwrap_err().kind(), "opcode");
    let tight = Limits { max_depth: 10, max_memo: 4, max_objects: 100, ..Limits::default() };
    let many = [&b"\x80\x02("[..], &b"cmypkg\nT\n)R".repeat(60), b"l."].concat();
    assert_eq!(parse_placeholders(&many, &tight).unwrap_err().kind(), "limit");
    let deep = [&b"\x80\x02cmypkg\nT\n"[..], &[b'('; 11], b"."].concat();
    assert_eq!(parse_placeholders(&deep, &tight).unwrap_err().kind(), "limit");
    let big = b"\x80\x02cmypkg\nT\n\x8b\x00\x00\x00\x40";
    assert_eq!(parse_placeholders(big, &tight).unwrap_err().kind(), "limit");
}
