//! Saves written in parts by several writers (the processes of a JAX job) and merged into one
//! tree by `commit_parts` (format::parts): the blocks of a sharded array come from whichever
//! part wrote them; overlaps, holes and blocks off the chunk grid are refused, naming the key.

use serde_json::json;
use treepack::format::parts::SHARDS;
use treepack::*;

const ROWS: u64 = 16;
const COLS: u64 = 6;

fn whole() -> Vec<f32> {
    (0..ROWS * COLS).map(|i| i as f32 * 0.5).collect()
}

/// Rows `r0..r1` of the whole array as a block chunked on `chunk` rows.
fn block(r0: u64, r1: u64, chunk: u64) -> Node {
    let v: Vec<u8> = whole()[(r0 * COLS) as usize..(r1 * COLS) as usize].iter().flat_map(|x| x.to_le_bytes()).collect();
    let a = ArrayData::new(DType::F32, vec![r1 - r0, COLS], v).unwrap().with_block(Some(vec![chunk, COLS])).unwrap();
    Node::from(a)
}

/// A `treepack.shards` node holding the row blocks starting at `origins` (each `rows` long).
fn shards(origins: &[u64], rows: u64, chunk: u64) -> Node {
    let data = json!({
        "dtype": "float32", "shape": [ROWS, COLS], "chunk_shape": [chunk, COLS],
        "as": {"type": "jax.Array"},
        "origins": origins.iter().map(|&o| json!([o, 0])).collect::<Vec<_>>(),
    });
    let children =
        origins.iter().enumerate().map(|(i, &o)| (i.to_string(), block(o, (o + rows).min(ROWS), chunk))).collect();
    Tree::Custom { type_name: SHARDS.into(), data, children }
}

fn part(first: bool, x: Node) -> Node {
    Node::dict([
        ("x", x),
        ("step", if first { Node::from(7i64) } else { Node::none() }),
        ("name", if first { Node::from("run") } else { Node::none() }),
    ])
}

fn write_parts(dir: &std::path::Path, parts: Vec<Node>) -> Vec<Vec<u8>> {
    let opts = SaveOptions::default();
    parts.iter().map(|p| save_part(p, dir.to_str().unwrap(), &opts).unwrap().0).collect()
}

#[test]
fn parts_merge_into_one_tree() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("t");
    // Two writers, four row blocks of 4 rows, each chunked in 2-row chunks.
    let parts = write_parts(&dir, vec![part(true, shards(&[0, 8], 4, 2)), part(false, shards(&[4, 12], 4, 2))]);
    let info = commit_parts(dir.to_str().unwrap(), &parts, &SaveOptions::default()).unwrap();
    assert_eq!((info.leaves, info.arrays, info.packs), (3, 1, 2));
    let r = Reader::open(Location::parse(dir.to_str().unwrap()).unwrap()).unwrap();
    let a = r.read_array("x", "").unwrap();
    let want: Vec<u8> = whole().iter().flat_map(|x| x.to_le_bytes()).collect();
    assert_eq!((a.shape(), a.bytes().as_ref()), (&[ROWS, COLS][..], &want[..]));
    assert_eq!(a.annotation(), Some(&json!({"type": "jax.Array"})));
    let m = r.manifest();
    assert_eq!(m.version, (1, 4)); // annotated (1.3), its dicts written as objects (1.4)
    assert!(r.verify().unwrap().ok());
    let t = load(dir.to_str().unwrap(), &LoadOptions::default()).unwrap();
    let Tree::Dict(items) = &t else { panic!("not a dict") };
    assert_eq!(items[1].1, Node::from(7i64));
    // A second commit at the same place is refused unless overwriting.
    let again = commit_parts(dir.to_str().unwrap(), &parts, &SaveOptions::default()).unwrap_err();
    assert_eq!(again.kind(), "already_exists");
}

#[test]
fn parts_that_do_not_make_one_array_are_refused_naming_the_key() {
    let cases: Vec<(Vec<Node>, &str)> = vec![
        // Both writers hold the block at row 4.
        (vec![part(true, shards(&[0, 4], 4, 2)), part(false, shards(&[4, 8, 12], 4, 2))], "overlap"),
        // Nobody holds rows 12..16.
        (vec![part(true, shards(&[0, 8], 4, 2)), part(false, shards(&[4], 4, 2))], "hole"),
        // A block starting between chunks.
        (vec![part(true, shards(&[0, 8], 4, 2)), part(false, shards(&[3, 12], 4, 2))], "not on the chunk grid"),
        // A writer whose tree has blocks where the first part has none.
        (
            vec![
                Node::dict([("x", shards(&[0, 4, 8, 12], 4, 2)), ("y", Node::none())]),
                Node::dict([("x", shards(&[], 4, 2)), ("y", shards(&[0], 4, 2))]),
            ],
            "first part's tree has none",
        ),
    ];
    for (i, (parts, want)) in cases.into_iter().enumerate() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("t");
        let bytes = write_parts(&dir, parts);
        let e = commit_parts(dir.to_str().unwrap(), &bytes, &SaveOptions::default()).unwrap_err();
        let msg = e.to_string();
        assert_eq!(e.kind(), "parts", "case {i}: {msg}");
        assert!(msg.contains(want) && (msg.contains("`x`") || msg.contains("`y`")), "case {i}: {msg}");
        assert!(!dir.join("treepack.json").exists(), "case {i}: nothing committed");
    }
}

#[test]
fn parts_need_a_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let e = save_part(
        &part(true, shards(&[0], 16, 4)),
        tmp.path().join("t.tpk").to_str().unwrap(),
        &SaveOptions::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("needs a directory"), "{e}");
}
