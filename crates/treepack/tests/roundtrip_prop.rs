//! Property: any tree saved and loaded comes back bit-for-bit, in every layout, with any
//! chunking; and any slice of any array equals the naive slice of the full array.

use bytes::Bytes;
use num_bigint::BigInt;
use proptest::prelude::*;
use treepack::format::dtype::Field;
use treepack::format::grid::{normalize, SliceItem};
use treepack::format::*;
use treepack::*;

fn dtype_strategy() -> impl Strategy<Value = DType> {
    let simple: Vec<DType> = DType::all_simple().collect();
    prop_oneof![
        4 => proptest::sample::select(simple),
        1 => (1u64..6).prop_map(DType::Bytes),
        1 => (1u64..4).prop_map(DType::Unicode),
        1 => Just(DType::Struct(vec![
            Field { name: "a".into(), dtype: DType::I16, shape: vec![] },
            Field { name: "b".into(), dtype: DType::F64, shape: vec![2] },
        ])),
    ]
}

fn array_strategy() -> impl Strategy<Value = ArrayData> {
    (dtype_strategy(), proptest::collection::vec(0u64..7, 0..4)).prop_flat_map(|(dt, shape)| {
        let n: u64 = shape.iter().product::<u64>() * dt.itemsize();
        proptest::collection::vec(any::<u8>(), n as usize)
            .prop_map(move |bytes| ArrayData::new(dt.clone(), shape.clone(), bytes).unwrap())
    })
}

fn float_strategy() -> impl Strategy<Value = f64> {
    prop_oneof![
        any::<f64>(),
        Just(f64::NAN),
        Just(-0.0),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        any::<u64>().prop_map(f64::from_bits),
    ]
}

fn key_strategy() -> impl Strategy<Value = Key> {
    let leaf = prop_oneof![
        6 => "[a-z/~*]{0,6}".prop_map(Key::Str),
        1 => Just(Key::None),
        1 => any::<bool>().prop_map(Key::Bool),
        2 => any::<i64>().prop_map(|i| Key::Int(Int::Small(i))),
        1 => float_strategy().prop_map(Key::Float),
    ];
    leaf.prop_recursive(2, 6, 3, |inner| proptest::collection::vec(inner, 0..3).prop_map(Key::Tuple))
}

fn leaf_strategy() -> impl Strategy<Value = Node> {
    prop_oneof![
        Just(Node::none()),
        any::<bool>().prop_map(Node::from),
        any::<i64>().prop_map(Node::from),
        "-?[1-9][0-9]{18,40}".prop_map(|s| Node::from(Int::from_big(s.parse::<BigInt>().unwrap()))),
        float_strategy().prop_map(Node::from),
        (float_strategy(), float_strategy()).prop_map(|(a, b)| Tree::Leaf(Leaf::Complex(a, b))),
        ".{0,20}".prop_map(Node::from),
        (0usize..3).prop_map(|k| Node::from("é∑\"\\\n".repeat(k * 400))),
        proptest::collection::vec(any::<u8>(), 0..300).prop_map(|v| Tree::Leaf(Leaf::Bytes(Bytes::from(v)))),
        array_strategy().prop_map(Node::from),
    ]
}

fn tree_strategy() -> impl Strategy<Value = Node> {
    leaf_strategy().prop_recursive(4, 48, 5, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..5).prop_map(Tree::List),
            proptest::collection::vec(inner.clone(), 0..5).prop_map(Tree::Tuple),
            proptest::collection::vec((key_strategy(), inner.clone()), 0..5).prop_map(|kv| {
                let mut out: Vec<(Key, Node)> = vec![];
                for (k, v) in kv {
                    let t = keypath::Segment::Key(k.clone()).text();
                    if !out.iter().any(|(x, _)| keypath::Segment::Key(x.clone()).text() == t) {
                        out.push((k, v));
                    }
                }
                Tree::Dict(out)
            }),
            proptest::collection::vec(inner.clone(), 0..4).prop_map(|v| Tree::Record {
                type_name: "pkg.Rec".into(),
                fields: v.into_iter().enumerate().map(|(i, n)| (format!("f{i}"), n)).collect(),
            }),
            (proptest::collection::vec(inner, 0..3), any::<i32>()).prop_map(|(v, d)| Tree::Custom {
                type_name: "pkg.Custom".into(),
                data: serde_json::json!({"d": d}),
                children: v.into_iter().enumerate().map(|(i, n)| (format!("c{i}"), n)).collect(),
            }),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn any_tree_round_trips(tree in tree_strategy(), chunk in prop_oneof![Just(17u64), Just(64), Just(1 << 20)], inline in prop_oneof![Just(0usize), Just(128)]) {
        let dir = tempfile::tempdir().unwrap();
        let opts = SaveOptions { chunk_bytes: chunk, inline_bytes: inline, inline_str_bytes: inline * 8, ..Default::default() };
        let mem = format!("memory://prop/{}", rand_name());
        for loc in [dir.path().join("d").to_str().unwrap().to_string(), dir.path().join("f.tpk").to_str().unwrap().to_string(), mem] {
            save(&tree, &loc, &opts).unwrap();
            let back = load(&loc, &LoadOptions::default()).unwrap();
            prop_assert!(back.exact_eq(&tree), "{loc}: {back:?}\n!=\n{tree:?}");
            let mm = load(&loc, &LoadOptions { mmap: true, ..Default::default() }).unwrap();
            prop_assert!(mm.exact_eq(&tree));
            prop_assert!(open(&loc).unwrap().verify().unwrap().ok());
            prop_assert_eq!(load_structure(&loc).unwrap().leaf_count(), tree.leaf_count());
        }
    }

    /// Shared objects (format 1.2) over any subtrees: a shared node, refs to it after it and
    /// inside a second shared node that also refers to itself (a cycle).
    #[test]
    fn any_tree_with_shared_objects_round_trips(a in tree_strategy(), b in tree_strategy(), c in tree_strategy()) {
        let tree = Node::list([
            Tree::Shared { id: 0, node: Box::new(Node::list([a])) },
            Tree::Ref(0),
            b,
            Tree::Shared { id: 1, node: Box::new(Node::dict([("c", c), ("me", Tree::Ref(1)), ("first", Tree::Ref(0))])) },
        ]);
        let dir = tempfile::tempdir().unwrap();
        for loc in [dir.path().join("d").to_str().unwrap().to_string(), dir.path().join("f.tpk").to_str().unwrap().to_string()] {
            save(&tree, &loc, &SaveOptions { inline_bytes: 0, ..Default::default() }).unwrap();
            let back = load(&loc, &LoadOptions::default()).unwrap();
            prop_assert!(back.exact_eq(&tree), "{loc}: {back:?}\n!=\n{tree:?}");
            prop_assert!(open(&loc).unwrap().load(&LoadOptions::default()).unwrap().exact_eq(&tree));
            prop_assert!(open(&loc).unwrap().verify().unwrap().ok());
        }
    }

    #[test]
    fn any_slice_matches_naive_slicing(a in array_strategy(), chunk in 1u64..64, raw in proptest::collection::vec((any::<Option<i8>>(), any::<Option<i8>>(), 1i64..4, any::<bool>(), any::<i8>()), 0..4)) {
        let loc = format!("memory://slices/{}", rand_name());
        let tree = Node::dict([("a", Node::from(a.clone()))]);
        save(&tree, &loc, &SaveOptions { chunk_bytes: chunk, inline_bytes: 0, ..Default::default() }).unwrap();
        let items: Vec<String> = raw.iter().take(a.shape().len()).map(|(s, e, st, is_idx, idx)| {
            if *is_idx { idx.to_string() } else {
                format!("{}:{}:{}", s.map(|v| v.to_string()).unwrap_or_default(), e.map(|v| v.to_string()).unwrap_or_default(), st)
            }
        }).collect();
        let spec = items.join(",");
        let parsed = treepack::format::grid::parse_slice(&spec).unwrap();
        let expected = naive_slice(&a, &parsed, &spec);
        let got = open(&loc).unwrap().read_array("a", &spec);
        match (expected, got) {
            (Some(e), Ok(g)) => { prop_assert_eq!(g.shape(), e.shape()); prop_assert_eq!(g.bytes(), e.bytes()); }
            (None, Err(Error::BadSlice { .. })) => {}
            (e, g) => prop_assert!(false, "spec {spec}: expected {e:?}, got {g:?}"),
        }
    }
}

/// Reference slicing: iterate every element of the full array and keep the selected ones.
fn naive_slice(a: &ArrayData, items: &[SliceItem], spec: &str) -> Option<ArrayData> {
    let sel = normalize(items, a.shape(), spec).ok()?;
    let isz = a.dtype().itemsize() as usize;
    let shape = a.shape();
    let n: u64 = shape.iter().product();
    let mut out = vec![];
    // Enumerate output index tuples in C order.
    let counts: Vec<u64> = sel.iter().map(|s| s.count).collect();
    let total: u64 = counts.iter().product();
    for k in 0..total {
        let mut rem = k;
        let mut flat = 0u64;
        let mut idx = vec![0u64; counts.len()];
        for d in (0..counts.len()).rev() {
            idx[d] = rem % counts[d];
            rem /= counts[d];
        }
        for d in 0..counts.len() {
            flat = flat * shape[d] + sel[d].start + idx[d] * sel[d].step;
        }
        assert!(flat < n.max(1));
        out.extend_from_slice(&a.bytes()[flat as usize * isz..(flat as usize + 1) * isz]);
    }
    Some(ArrayData::new(a.dtype().clone(), treepack::format::grid::result_shape(&sel), out).unwrap())
}

fn rand_name() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!("{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}
