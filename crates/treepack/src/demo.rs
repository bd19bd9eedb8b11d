//! An example tree with every leaf kind and dtype, used by `treepack demo`, tests and docs.

use crate::format::dtype::{DType, Field};
use crate::format::model::{ArrayData, Int, Key, Leaf, Node, Tree};
use bytes::Bytes;
use num_bigint::BigInt;

fn arr(dtype: DType, shape: Vec<u64>, f: impl Fn(u64) -> Vec<u8>) -> Node {
    let n: u64 = shape.iter().product();
    let data: Vec<u8> = (0..n).flat_map(f).collect();
    // Sizes are consistent by construction; a mistake here is a bug in this file.
    Node::from(ArrayData::new(dtype, shape, data).unwrap_or_else(|e| panic!("demo tree: {e}")))
}

/// A small "model checkpoint" that exercises every leaf kind, container and dtype.
pub fn example_tree() -> Node {
    let dense = Node::dict([
        ("kernel", arr(DType::F32, vec![512, 256], |i| ((i % 97) as f32 * 0.01 - 0.3).to_le_bytes().to_vec())),
        ("bias", arr(DType::F32, vec![256], |i| (i as f32 * 0.001).to_le_bytes().to_vec())),
    ]);
    let embed = arr(DType::BF16, vec![1000, 64], |i| {
        half::bf16::from_f32((i % 13) as f32 - 6.0).to_bits().to_le_bytes().to_vec()
    });
    let dtypes = Node::dict([
        ("bool", arr(DType::Bool, vec![8], |i| vec![(i % 3 == 0) as u8])),
        ("int8", arr(DType::I8, vec![4], |i| vec![(i as i8 - 2) as u8])),
        ("uint16", arr(DType::U16, vec![2, 3], |i| (i as u16 * 1000).to_le_bytes().to_vec())),
        ("int64", arr(DType::I64, vec![3], |i| (i as i64 - (1 << 40)).to_le_bytes().to_vec())),
        ("float16", arr(DType::F16, vec![5], |i| half::f16::from_f32(i as f32 / 4.0).to_bits().to_le_bytes().to_vec())),
        (
            "float64",
            arr(DType::F64, vec![2, 2], |i| [f64::NAN, -0.0, f64::INFINITY, 1e-300][i as usize].to_le_bytes().to_vec()),
        ),
        (
            "complex64",
            arr(DType::C64, vec![2], |i| [i as f32, -(i as f32)].iter().flat_map(|x| x.to_le_bytes()).collect()),
        ),
        ("float8_e4m3fn", arr(DType::F8E4M3FN, vec![4], |i| vec![0x38 + i as u8])),
        ("float8_e5m2", arr(DType::F8E5M2, vec![4], |i| vec![0x3c + i as u8])),
        ("bytes4", arr(DType::Bytes(4), vec![2], |i| if i == 0 { b"ab\0\0".to_vec() } else { b"wxyz".to_vec() })),
        (
            "unicode3",
            arr(DType::Unicode(3), vec![2], |i| {
                let s: [char; 3] = if i == 0 { ['h', 'é', '\0'] } else { ['∑', 'x', 'y'] };
                s.iter().flat_map(|c| (*c as u32).to_le_bytes()).collect()
            }),
        ),
        (
            "record_dtype",
            arr(
                DType::Struct(vec![
                    Field { name: "id".into(), dtype: DType::I32, shape: vec![] },
                    Field { name: "pos".into(), dtype: DType::F32, shape: vec![2] },
                ]),
                vec![3],
                |i| [(i as i32).to_le_bytes(), (i as f32).to_le_bytes(), (-(i as f32)).to_le_bytes()].concat(),
            ),
        ),
        ("scalar_0d", arr(DType::F64, vec![], |_| 2.5f64.to_le_bytes().to_vec())),
        ("empty", arr(DType::F32, vec![0, 3], |_| vec![])),
    ]);
    let scalars = Node::dict([
        ("none", Node::none()),
        ("flag", Node::from(true)),
        ("step", Node::from(1000i64)),
        ("big_int", Node::from(Int::from_big(BigInt::from(3u8).pow(100)))),
        ("lr", Node::from(3e-4)),
        ("nan", Node::from(f64::NAN)),
        ("neg_zero", Node::from(-0.0)),
        ("inf", Node::from(f64::INFINITY)),
        ("z", Tree::Leaf(Leaf::Complex(1.5, -2.0))),
        ("name", Node::from("treepack demo ✓")),
        ("notes", Node::from("lorem ipsum ".repeat(500))),
        ("raw", Tree::Leaf(Leaf::Bytes(Bytes::from_static(b"\x00\x01binary\xff")))),
        ("blob", Tree::Leaf(Leaf::Bytes(Bytes::from((0..5000u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>())))),
    ]);
    let odd_keys = Tree::Dict(vec![
        (Key::Int(Int::Small(1)), Node::from("int key")),
        (Key::Tuple(vec![Key::Str("a".into()), Key::Int(Int::Small(2))]), Node::from("tuple key")),
        (Key::None, Node::from("None key")),
        (Key::Str("with/slash".into()), Node::from("escaped in key paths")),
    ]);
    Node::dict([
        ("params", Node::dict([("dense", dense), ("embed", embed)])),
        ("dtypes", dtypes),
        ("scalars", scalars),
        (
            "history",
            Node::list([
                Node::tuple([Node::from(1i64), Node::from(0.9)]),
                Node::tuple([Node::from(2i64), Node::from(0.7)]),
            ]),
        ),
        ("config", Node::record("demo.Config", [("layers", Node::from(2i64)), ("activation", Node::from("gelu"))])),
        (
            "custom",
            Tree::Custom {
                type_name: "demo.Image".into(),
                data: serde_json::json!({"mode": "L", "size": [4, 4]}),
                children: vec![("pixels".into(), arr(DType::U8, vec![4, 4], |i| vec![(i * 16) as u8]))],
            },
        ),
        ("odd_keys", odd_keys),
    ])
}
