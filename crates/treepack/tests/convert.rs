//! Conversion to and from safetensors (issue 31): round trips of every dtype both formats have,
//! names nested and flat, what safetensors cannot hold, hostile files.

use treepack::convert::{convert, ConvertOptions, Format};
use treepack::*;

fn arr(dtype: DType, shape: Vec<u64>, seed: u8) -> Node {
    let n: u64 = shape.iter().product::<u64>() * dtype.itemsize();
    let data: Vec<u8> = (0..n).map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed)).collect();
    let data = if dtype == DType::Bool { data.iter().map(|b| b & 1).collect() } else { data };
    Node::from(ArrayData::new(dtype, shape, data).unwrap())
}

fn all_dtypes() -> Node {
    let ds = [
        DType::Bool,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::F8E4M3FN,
        DType::F8E5M2,
    ];
    let mut items: Vec<(String, Node)> =
        ds.iter().enumerate().map(|(i, d)| (format!("t{i}"), arr(d.clone(), vec![3, 5], i as u8))).collect();
    items.push(("empty".into(), arr(DType::F32, vec![0, 4], 0)));
    items.push(("scalar".into(), arr(DType::F64, vec![], 1)));
    items.push((
        "layers".into(),
        Node::dict([
            ("0", Node::dict([("w", arr(DType::F32, vec![64, 64], 2))])),
            ("1", Node::dict([("w", arr(DType::F32, vec![64, 64], 3))])),
        ]),
    ));
    Node::dict(items)
}

fn loc(p: &std::path::Path) -> Location {
    Location::parse(p.to_str().unwrap()).unwrap()
}

#[test]
fn trees_of_arrays_round_trip_through_safetensors() {
    let dir = tempfile::tempdir().unwrap();
    let tree = all_dtypes();
    let src = dir.path().join("t");
    let md = serde_json::json!({"format": "pt", "step": 3});
    save(&tree, src.to_str().unwrap(), &SaveOptions { metadata: Some(md), ..Default::default() }).unwrap();
    let st = dir.path().join("m.safetensors");
    let info =
        convert(&loc(&src), &loc(&st), Format::Treepack, Format::Safetensors, &ConvertOptions::default()).unwrap();
    assert_eq!(info.tensors, 19);
    // The header names nested tensors with dots, and keeps metadata as strings.
    let bytes = std::fs::read(&st).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    assert_eq!(header["layers.1.w"]["dtype"], "F32");
    assert_eq!(header["t10"]["dtype"], "BF16");
    assert_eq!(header["__metadata__"], serde_json::json!({"format": "pt", "step": "3"}));
    assert_eq!((8 + n) % 8, 0, "data 8-aligned");
    let back = dir.path().join("back.tpk");
    let nested = ConvertOptions { separator: Some(".".into()), ..Default::default() };
    convert(&loc(&st), &loc(&back), Format::Safetensors, Format::Treepack, &nested).unwrap();
    assert!(load(back.to_str().unwrap(), &LoadOptions::default()).unwrap().exact_eq(&tree));
    // Flat names by default: one level, dotted keys kept.
    let flat = dir.path().join("flat");
    convert(&loc(&st), &loc(&flat), Format::Safetensors, Format::Treepack, &ConvertOptions::default()).unwrap();
    let f = open(flat.to_str().unwrap()).unwrap();
    assert!(f.read_array("layers.0.w", "").is_ok());
    // Existing destinations are kept unless overwritten.
    let e =
        convert(&loc(&src), &loc(&st), Format::Treepack, Format::Safetensors, &ConvertOptions::default()).unwrap_err();
    assert_eq!(e.kind(), "already_exists");
}

#[test]
fn what_safetensors_cannot_hold_is_named_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let st = dir.path().join("x.safetensors");
    for (tree, says) in [
        (
            Node::dict([("w", arr(DType::F32, vec![2], 0)), ("cfg", Node::dict([("name", Node::from("run"))]))]),
            "cfg/name",
        ),
        (Node::dict([("c", arr(DType::C64, vec![2], 0))]), "no complex64"),
        (
            Node::dict([("a", Node::dict([("b", arr(DType::F32, vec![1], 0))])), ("a.b", arr(DType::F32, vec![1], 0))]),
            "two leaves",
        ),
    ] {
        let src = dir.path().join(format!("s{}", says.len()));
        save(&tree, src.to_str().unwrap(), &SaveOptions::default()).unwrap();
        let e = convert(&loc(&src), &loc(&st), Format::Treepack, Format::Safetensors, &ConvertOptions::default())
            .unwrap_err();
        assert!(e.to_string().contains(says), "{e}");
        assert!(!st.exists());
    }
}

#[test]
fn hostile_safetensors_files_fail_with_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let good = {
        let src = dir.path().join("g");
        save(
            &Node::dict([("a", arr(DType::F32, vec![4], 0)), ("b", arr(DType::U8, vec![3], 1))]),
            src.to_str().unwrap(),
            &SaveOptions::default(),
        )
        .unwrap();
        let st = dir.path().join("g.safetensors");
        convert(&loc(&src), &loc(&st), Format::Treepack, Format::Safetensors, &ConvertOptions::default()).unwrap();
        std::fs::read(&st).unwrap()
    };
    let n = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let with_header = |h: &str| {
        let mut v = (h.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(h.as_bytes());
        v.extend_from_slice(&good[8 + n..]);
        v
    };
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("truncated", good[..good.len() - 2].to_vec(), "the file has"),
        ("short", good[..5].to_vec(), "8-byte"),
        ("header-past-end", [&(1u64 << 40).to_le_bytes()[..], &good[8..]].concat(), "accepted"),
        (
            "giant-shape",
            with_header(r#"{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]}}"#),
            "do not hold",
        ),
        (
            "overlap",
            with_header(
                r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"U8","shape":[3],"data_offsets":[2,5]}}"#,
            ),
            "gap or an overlap",
        ),
        ("bad-dtype", with_header(r#"{"a":{"dtype":"F4","shape":[4],"data_offsets":[0,19]}}"#), "not supported"),
        ("not-json", with_header("nope nope"), "JSON"),
    ];
    for (name, bytes, says) in cases {
        let p = dir.path().join(format!("{name}.safetensors"));
        std::fs::write(&p, bytes).unwrap();
        let out = dir.path().join(format!("out-{name}"));
        // A safetensors file reads as its tree where its location is parsed: the error comes
        // from there, or from the conversion, and says the same either way.
        let e = Location::parse(p.to_str().unwrap())
            .and_then(|src| {
                convert(&src, &loc(&out), Format::Safetensors, Format::Treepack, &ConvertOptions::default())
            })
            .unwrap_err();
        assert_eq!(e.kind(), "invalid_foreign", "{name}: {e}");
        let msg = e.to_string();
        assert!(msg.contains("not a valid safetensors file") && msg.contains(says), "{name}: {msg}");
        assert!(msg.contains(&format!("{name}.safetensors")) && !msg.contains("treepack file"), "{name}: {msg}");
        assert!(!out.exists(), "{name}");
    }
}

#[test]
fn conversions_report_progress_both_ways() {
    use std::sync::{Arc, Mutex};
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("t");
    save(&all_dtypes(), src.to_str().unwrap(), &SaveOptions::default()).unwrap();
    for (from, to, a, b) in [
        (Format::Treepack, Format::Safetensors, src.clone(), dir.path().join("m.safetensors")),
        (Format::Safetensors, Format::Treepack, dir.path().join("m.safetensors"), dir.path().join("back")),
    ] {
        let seen = Arc::new(Mutex::new(vec![]));
        let s2 = seen.clone();
        let progress = ProgressFn::new(move |done, total| s2.lock().unwrap().push((done, total)));
        let opts = ConvertOptions {
            save: SaveOptions { progress: Some(progress), ..Default::default() },
            ..Default::default()
        };
        convert(&loc(&a), &loc(&b), from, to, &opts).unwrap();
        let seen = seen.lock().unwrap();
        let last = *seen.last().unwrap();
        assert!(seen.len() >= 2 && last.0 == last.1 && last.1 > 0, "{from:?} -> {to:?}: {seen:?}");
    }
}

/// A treepack source's chunks are checked against their hashes as they are written to a
/// safetensors file (each array read into one reused buffer): a flipped byte fails the
/// conversion naming the chunk, and no destination is left behind.
#[test]
fn a_corrupt_chunk_fails_a_conversion_to_safetensors() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("t");
    let tree = Node::dict([("small", arr(DType::F32, vec![10], 1)), ("big", arr(DType::F32, vec![512, 512], 2))]);
    save(&tree, src.to_str().unwrap(), &SaveOptions { chunk_bytes: 64 << 10, ..Default::default() }).unwrap();
    let st = dir.path().join("ok.safetensors");
    convert(&loc(&src), &loc(&st), Format::Treepack, Format::Safetensors, &ConvertOptions::default()).unwrap();
    let back = dir.path().join("back");
    convert(&loc(&st), &loc(&back), Format::Safetensors, Format::Treepack, &ConvertOptions::default()).unwrap();
    assert!(load(back.to_str().unwrap(), &LoadOptions::default()).unwrap().exact_eq(&tree));
    let pack = std::fs::read_dir(src.join("packs")).unwrap().next().unwrap().unwrap().path();
    let mut bytes = std::fs::read(&pack).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x10;
    std::fs::write(&pack, bytes).unwrap();
    let bad = dir.path().join("bad.safetensors");
    let e =
        convert(&loc(&src), &loc(&bad), Format::Treepack, Format::Safetensors, &ConvertOptions::default()).unwrap_err();
    assert!(matches!(e, Error::ChunkCorrupt { .. } | Error::BadChunk { .. }), "{e}");
    assert!(!bad.exists());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 3, "no staging file left");
    // t, ok, back
}

/// flax's msgpack (a `.msgpack` file, or an older Orbax folder's `checkpoint` file) is known by
/// its first byte, a msgpack map; a TensorFlow folder's text `checkpoint`, a link, and a FIFO
/// (whose open would block) are not taken for one.
#[test]
fn msgpack_checkpoints_are_known_by_their_first_byte() {
    use treepack::convert::detect_format;
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    std::fs::write(p("model.msgpack"), b"\x82\xa1a\x01\xa1b\x02").unwrap();
    std::fs::write(p("text.msgpack"), b"not msgpack").unwrap();
    for (folder, byte) in [("old", &b"\xde\x00\x01"[..]), ("tf", &b"model_checkpoint_path: \"x\"\n"[..])] {
        std::fs::create_dir(p(folder)).unwrap();
        std::fs::write(dir.path().join(folder).join("checkpoint"), byte).unwrap();
    }
    std::fs::create_dir(p("linked")).unwrap();
    std::os::unix::fs::symlink(p("old/checkpoint"), dir.path().join("linked").join("checkpoint")).unwrap();
    assert_eq!(detect_format(&p("model.msgpack"), true), "orbax");
    assert_eq!(detect_format(&p("text.msgpack"), true), "treepack");
    assert_eq!(detect_format(&p("old"), true), "orbax");
    assert_eq!(detect_format(&p("tf"), true), "treepack");
    assert_eq!(detect_format(&p("linked"), true), "treepack");
    let fifo = p("pipe.msgpack");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    assert_eq!(detect_format(&fifo, true), "treepack"); // (returned: did not block on the open)
}
