//! GGUF files (llama.cpp's models) read as trees (issue 54): files written byte by byte here
//! (a key-value pair of every type, nested arrays, F32/F16/BF16/I32 tensors, Q8_0 and Q4_K
//! tensors), one written by gguf-py (`tests/data/gguf/make_fixtures.py`), read through
//! `foreign::gguf::read` and through the read-only location `open_location` makes; then hostile
//! files, each read in a child process with a time and memory limit, that must be refused with
//! a message saying what and where — and a small valid file truncated at every byte.

#[path = "support/child.rs"]
mod child;

use std::path::{Path, PathBuf};
use treepack::foreign::gguf;
use treepack::*;

/// Bytes of a GGUF file, pushed one field at a time.
#[derive(Default, Clone)]
struct Raw(Vec<u8>);

impl Raw {
    fn header(version: u32, tensors: u64, kvs: u64) -> Raw {
        let mut r = Raw(b"GGUF".to_vec());
        r.u32(version).u64(tensors).u64(kvs);
        r
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }
    fn info(&mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> &mut Self {
        self.str(name).u32(dims.len() as u32);
        for d in dims {
            self.u64(*d);
        }
        self.u32(ty).u64(offset)
    }
    fn pad(&mut self, a: usize) -> &mut Self {
        while !self.0.len().is_multiple_of(a) {
            self.0.push(0);
        }
        self
    }
}

/// A GGUF file: key-value pairs (already encoded: type id and value) and tensors (name, GGUF
/// dims, ggml type id, bytes), laid out as llama.cpp lays them out.
struct Writer {
    kvs: Vec<(String, u32, Vec<u8>)>,
    tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
    alignment: usize,
}

impl Writer {
    fn new() -> Writer {
        Writer { kvs: vec![], tensors: vec![], alignment: 32 }
    }
    fn kv(&mut self, key: &str, ty: u32, value: Raw) -> &mut Self {
        self.kvs.push((key.into(), ty, value.0));
        self
    }
    fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, data: Vec<u8>) -> &mut Self {
        self.tensors.push((name.into(), dims.to_vec(), ty, data));
        self
    }
    fn bytes(&self) -> Vec<u8> {
        let mut r = Raw::header(3, self.tensors.len() as u64, self.kvs.len() as u64);
        for (k, ty, v) in &self.kvs {
            r.str(k).u32(*ty).bytes(v);
        }
        let mut at = 0u64;
        for (name, dims, ty, data) in &self.tensors {
            r.info(name, dims, *ty, at);
            at = (at + data.len() as u64).next_multiple_of(self.alignment as u64);
        }
        r.pad(self.alignment);
        for (_, _, _, data) in &self.tensors {
            r.bytes(data).pad(self.alignment);
        }
        r.0
    }
}

fn v(f: impl FnOnce(&mut Raw)) -> Raw {
    let mut r = Raw::default();
    f(&mut r);
    r
}

fn le<T: Copy, const N: usize>(xs: &[T], f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
    xs.iter().flat_map(|x| f(*x)).collect()
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// A file with a key-value pair of every type and tensors of every kind the tree has.
fn every_kind() -> (Vec<u8>, serde_json::Value) {
    let mut w = Writer::new();
    w.kv(
        "general.architecture",
        8,
        v(|r| {
            r.str("llama");
        }),
    )
    .kv(
        "t.u8",
        0,
        v(|r| {
            r.bytes(&[250]);
        }),
    )
    .kv(
        "t.i8",
        1,
        v(|r| {
            r.bytes(&(-5i8).to_le_bytes());
        }),
    )
    .kv(
        "t.u16",
        2,
        v(|r| {
            r.bytes(&65535u16.to_le_bytes());
        }),
    )
    .kv(
        "t.i16",
        3,
        v(|r| {
            r.bytes(&(-32768i16).to_le_bytes());
        }),
    )
    .kv(
        "t.u32",
        4,
        v(|r| {
            r.u32(4_000_000_000);
        }),
    )
    .kv(
        "t.i32",
        5,
        v(|r| {
            r.bytes(&(-7i32).to_le_bytes());
        }),
    )
    .kv(
        "t.f32",
        6,
        v(|r| {
            r.bytes(&0.5f32.to_le_bytes());
        }),
    )
    .kv(
        "t.f32.inf",
        6,
        v(|r| {
            r.bytes(&f32::NEG_INFINITY.to_le_bytes());
        }),
    )
    .kv(
        "t.bool",
        7,
        v(|r| {
            r.bytes(&[1]);
        }),
    )
    .kv(
        "t.string",
        8,
        v(|r| {
            r.str("héllo\u{0}wörld");
        }),
    )
    .kv(
        "t.array",
        9,
        v(|r| {
            r.u32(8).u64(3).str("a").str("").str("ç");
        }),
    )
    .kv(
        "t.empty",
        9,
        v(|r| {
            r.u32(4).u64(0);
        }),
    )
    .kv(
        "t.nested",
        9,
        v(|r| {
            r.u32(9).u64(2);
            r.u32(5).u64(2).bytes(&1i32.to_le_bytes()).bytes(&2i32.to_le_bytes());
            r.u32(9).u64(1).u32(7).u64(2).bytes(&[0, 1]);
        }),
    )
    .kv(
        "t.u64",
        10,
        v(|r| {
            r.u64(u64::MAX);
        }),
    )
    .kv(
        "t.i64",
        11,
        v(|r| {
            r.bytes(&i64::MIN.to_le_bytes());
        }),
    )
    .kv(
        "t.f64",
        12,
        v(|r| {
            r.bytes(&(-1.25f64).to_le_bytes());
        }),
    );
    let f32s = le(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], f32::to_le_bytes);
    w.tensor("token_embd.weight", &[3, 2], 0, f32s)
        .tensor("blk.0.attn_norm.weight", &[4], 1, pattern(8, 1))
        .tensor("bf", &[2, 1, 2], 30, pattern(8, 2))
        .tensor("ids", &[5], 26, le(&[1i32, -2, 3, -4, 5], i32::to_le_bytes))
        .tensor("blk.0.ffn_up.weight", &[64, 2], 8, pattern(2 * 2 * 34, 3))
        .tensor("blk.0.ffn_down.weight", &[256, 3], 12, pattern(3 * 144, 4))
        .tensor("scalar", &[], 28, (2.5f64).to_le_bytes().to_vec());
    let md = serde_json::json!({
        "general.architecture": "llama", "t.u8": 250, "t.i8": -5, "t.u16": 65535, "t.i16": -32768,
        "t.u32": 4_000_000_000u32, "t.i32": -7, "t.f32": 0.5, "t.f32.inf": "-inf", "t.bool": true,
        "t.string": "héllo\u{0}wörld", "t.array": ["a", "", "ç"], "t.empty": [],
        "t.nested": [[1, 2], [[false, true]]], "t.u64": u64::MAX, "t.i64": i64::MIN, "t.f64": -1.25,
    });
    (w.bytes(), md)
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn array<'a>(t: &'a Node, name: &str) -> &'a ArrayData {
    let Tree::Dict(items) = t else { panic!("not a dict") };
    let (_, n) = items.iter().find(|(k, _)| *k == Key::Str(name.into())).unwrap_or_else(|| panic!("no {name}"));
    n.as_array().unwrap_or_else(|| panic!("{name}: not an array"))
}

fn names(t: &Node) -> Vec<String> {
    let Tree::Dict(items) = t else { panic!("not a dict") };
    items.iter().map(|(k, _)| if let Key::Str(s) = k { s.clone() } else { panic!("{k:?}") }).collect()
}

/// What every reading of [`every_kind`] must give.
fn check_every_kind(t: &Node, md: &serde_json::Value, want_md: &serde_json::Value, bytes: &[u8]) {
    assert_eq!(
        names(t),
        [
            "token_embd.weight",
            "blk.0.attn_norm.weight",
            "bf",
            "ids",
            "blk.0.ffn_up.weight",
            "blk.0.ffn_down.weight",
            "scalar"
        ]
    );
    assert_eq!(md, want_md);
    let h = treepack::format::gguf::parse(bytes).unwrap();
    let at = |i: usize| {
        let r = h.range(&h.tensors[i]);
        &bytes[r.start as usize..r.end as usize]
    };
    let a = array(t, "token_embd.weight");
    assert_eq!((a.dtype(), a.shape()), (&DType::F32, &[2u64, 3][..]));
    assert_eq!(a.bytes(), at(0));
    assert_eq!(a.annotation(), None);
    let a = array(t, "blk.0.attn_norm.weight");
    assert_eq!((a.dtype(), a.shape(), &a.bytes()[..]), (&DType::F16, &[4u64][..], at(1)));
    let a = array(t, "bf");
    assert_eq!((a.dtype(), a.shape(), &a.bytes()[..]), (&DType::BF16, &[2u64, 1, 2][..], at(2)));
    let a = array(t, "ids");
    assert_eq!((a.dtype(), a.shape(), &a.bytes()[..]), (&DType::I32, &[5u64][..], at(3)));
    let a = array(t, "blk.0.ffn_up.weight");
    assert_eq!((a.dtype(), a.shape(), &a.bytes()[..]), (&DType::U8, &[136u64][..], at(4)));
    assert_eq!(
        a.annotation(),
        Some(&serde_json::json!({"type": "gguf.quantized", "ggml_type": "Q8_0", "shape": [2, 64]}))
    );
    let a = array(t, "blk.0.ffn_down.weight");
    assert_eq!((a.dtype(), a.shape(), &a.bytes()[..]), (&DType::U8, &[432u64][..], at(5)));
    assert_eq!(
        a.annotation(),
        Some(&serde_json::json!({"type": "gguf.quantized", "ggml_type": "Q4_K", "shape": [3, 256]}))
    );
    let a = array(t, "scalar");
    assert_eq!((a.dtype(), a.shape(), &a.bytes()[..]), (&DType::F64, &[][..], &2.5f64.to_le_bytes()[..]));
}

#[test]
fn every_kv_type_and_tensor_kind_reads() {
    let dir = tempfile::tempdir().unwrap();
    let (bytes, want_md) = every_kind();
    let p = write(dir.path(), "model.gguf", &bytes);
    let (t, md) = gguf::read(&p).unwrap();
    check_every_kind(&t, &md.unwrap(), &want_md, &bytes);
}

/// Through the read-only location every reader works on (`Location::parse` gives it once
/// location.rs routes GGUF files there; see `treepack_load_reads_a_gguf_path`).
#[test]
fn the_tree_loads_through_its_location() {
    let dir = tempfile::tempdir().unwrap();
    let (bytes, want_md) = every_kind();
    let p = write(dir.path(), "model.gguf", &bytes);
    let loc = gguf::open_location(&p, p.to_str().unwrap()).unwrap();
    assert_eq!(loc.read_from(), Some("GGUF file"));
    let t = load(loc.clone(), &LoadOptions::default()).unwrap();
    let md = open(loc.clone()).unwrap().manifest().metadata.clone().unwrap();
    check_every_kind(&t, &md, &want_md, &bytes);
    assert_eq!(t, gguf::read(&p).unwrap().0);
    let s = load_structure(loc.clone()).unwrap();
    assert_eq!(s.leaf_count(), 7);
    let e = save(&t, loc, &SaveOptions { overwrite: true, ..Default::default() }).unwrap_err();
    assert_eq!(e.kind(), "read_only", "{e}");
    assert!(e.to_string().contains("GGUF file"), "{e}");
}

/// `treepack::load(path)` of a GGUF file: on once location.rs reads GGUF files through
/// `foreign::gguf::open_location`.
#[test]
fn treepack_load_reads_a_gguf_path() {
    let dir = tempfile::tempdir().unwrap();
    let (bytes, want_md) = every_kind();
    let p = write(dir.path(), "model.gguf", &bytes);
    let loc = Location::parse(p.to_str().unwrap()).unwrap();
    assert_eq!(loc.read_from(), Some("GGUF file"));
    let t = load(loc.clone(), &LoadOptions::default()).unwrap();
    let md = open(loc).unwrap().manifest().metadata.clone().unwrap();
    check_every_kind(&t, &md, &want_md, &bytes);
}

#[test]
fn a_wider_alignment_and_gaps_between_tensors_read() {
    let mut w = Writer::new();
    w.alignment = 64;
    w.kv(
        "general.alignment",
        4,
        v(|r| {
            r.u32(64);
        }),
    );
    w.tensor("a", &[3], 0, pattern(12, 5)).tensor("b", &[2], 24, pattern(2, 6));
    let mut bytes = w.bytes();
    let h = treepack::format::gguf::parse(&bytes).unwrap();
    assert_eq!((h.alignment, h.data_start % 64, h.tensors[1].offset), (64, 0, 64));
    // Move `b` one alignment further on (a gap after `a`): still read.
    let at = bytes.windows(2).rposition(|w| w == [64, 0]).unwrap();
    bytes[at] = 128;
    bytes.extend_from_slice(&[0u8; 64]);
    bytes.truncate(h.data_start as usize + 128 + 64);
    let b = pattern(2, 6);
    bytes[h.data_start as usize + 128..][..2].copy_from_slice(&b);
    let dir = tempfile::tempdir().unwrap();
    let (t, _) = gguf::read(write(dir.path(), "m.gguf", &bytes)).unwrap();
    assert_eq!(array(&t, "b").bytes(), &b[..]);
    assert_eq!(array(&t, "a").bytes(), &pattern(12, 5)[..]);
}

/// A file gguf-py (llama.cpp's writer) wrote, read as gguf-py reads it.
#[test]
fn a_file_gguf_py_wrote_reads_as_it_wrote_it() {
    let data = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/gguf");
    let exp: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(data.join("expected.json")).unwrap()).unwrap();
    let (t, md) = gguf::read(data.join("gguf_py.gguf")).unwrap();
    let order: Vec<String> = exp["order"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().into()).collect();
    assert_eq!(names(&t), order);
    assert_eq!(md.unwrap(), exp["metadata"]);
    for (name, e) in exp["tensors"].as_object().unwrap() {
        let a = array(&t, name);
        assert_eq!(a.dtype().name().unwrap(), e["dtype"].as_str().unwrap(), "{name}");
        let shape: Vec<u64> = e["shape"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        assert_eq!(a.shape(), &shape[..], "{name}");
        let hex: String = a.bytes().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, e["hex"].as_str().unwrap(), "{name}");
        match e["quantized"].as_array() {
            None => assert_eq!(a.annotation(), None, "{name}"),
            Some(q) => assert_eq!(
                a.annotation(),
                Some(&serde_json::json!({"type": "gguf.quantized", "ggml_type": q[0], "shape": q[1]})),
                "{name}"
            ),
        }
    }
}

// ---- hostile files ----

fn hostile_cases() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let one_tensor = |dims: &[u64], ty: u32, offset: u64, data: usize| {
        let mut r = Raw::header(3, 1, 0);
        r.info("t", dims, ty, offset).pad(32).bytes(&vec![0u8; data]);
        r.0
    };
    let kv = |f: &dyn Fn(&mut Raw)| {
        let mut r = Raw::header(3, 0, 1);
        f(&mut r);
        r.bytes(&[0u8; 16]);
        r.0
    };
    let mut deep = Raw::header(3, 0, 1);
    deep.str("deep").u32(9);
    for _ in 0..1_000_000 {
        deep.u32(9).u64(1);
    }
    deep.u32(0).u64(0);
    let mut many = Raw::header(3, 0, 1);
    many.str("many").u32(9).u32(0).u64((1 << 24) + 1).bytes(&vec![0u8; (1 << 24) + 1]);
    let mut two = Raw::header(3, 2, 0);
    two.info("a", &[16], 0, 0).info("b", &[8], 0, 32).pad(32).bytes(&[0u8; 64]);
    let mut dup = Raw::header(3, 2, 0);
    dup.info("a", &[8], 0, 0).info("a", &[8], 0, 32).pad(32).bytes(&[0u8; 64]);
    let mut badname = Raw::header(3, 1, 0);
    badname.u64(2).bytes(&[0xc3, 0x28]).u32(1).u64(4).u32(0).u64(0).pad(32).bytes(&[0u8; 16]);
    vec![
        ("empty.gguf", vec![], "truncated: the magic"),
        ("not-gguf.gguf", b"GGML\x03\0\0\0 and more bytes".to_vec(), "not a GGUF file"),
        ("v1.gguf", Raw::header(1, 0, 0).0, "version 1"),
        ("big-endian.gguf", Raw::header(3u32.swap_bytes(), 0, 0).0, "big-endian"),
        ("v99.gguf", Raw::header(99, 0, 0).0, "GGUF version 99"),
        ("kv-2-60.gguf", Raw::header(3, 0, 1 << 60).0, "key-value count"),
        ("tensors-2-60.gguf", Raw::header(3, 1 << 60, 0).0, "tensor count"),
        ("kv-lying.gguf", Raw::header(3, 0, 100_000).0, "100000 key-value pairs"),
        (
            "string-2-40.gguf",
            kv(&|r| {
                r.str("k").u32(8).u64(1 << 40);
            }),
            "string length of key \"k\"",
        ),
        (
            "string-lying.gguf",
            kv(&|r| {
                r.str("k").u32(8).u64(1 << 20);
            }),
            "truncated: key \"k\"",
        ),
        (
            "key-2-40.gguf",
            kv(&|r| {
                r.u64(1 << 40);
            }),
            "key length of key #0",
        ),
        (
            "array-2-61.gguf",
            kv(&|r| {
                r.str("k").u32(9).u32(10).u64(1 << 61);
            }),
            "2305843009213693952 uint64",
        ),
        ("array-deep.gguf", deep.0, "array nesting"),
        ("array-many.gguf", many.0, "metadata values in all"),
        (
            "value-type.gguf",
            kv(&|r| {
                r.str("k").u32(13);
            }),
            "value type 13",
        ),
        (
            "array-type.gguf",
            kv(&|r| {
                r.str("k").u32(9).u32(99).u64(1);
            }),
            "value type 99",
        ),
        (
            "bool-2.gguf",
            kv(&|r| {
                r.str("k").u32(7).bytes(&[2]);
            }),
            "neither 0 nor 1",
        ),
        (
            "key-utf8.gguf",
            kv(&|r| {
                r.u64(1).bytes(&[0xff]).u32(0).bytes(&[0]);
            }),
            "not UTF-8",
        ),
        (
            "value-utf8.gguf",
            kv(&|r| {
                r.str("k").u32(8).u64(1).bytes(&[0x80]);
            }),
            "not UTF-8",
        ),
        ("name-utf8.gguf", badname.0, "not UTF-8"),
        (
            "alignment-3.gguf",
            kv(&|r| {
                r.str("general.alignment").u32(4).u32(3);
            }),
            "not a power of two",
        ),
        (
            "alignment-0.gguf",
            kv(&|r| {
                r.str("general.alignment").u32(4).u32(0);
            }),
            "not a power of two",
        ),
        (
            "alignment-str.gguf",
            kv(&|r| {
                r.str("general.alignment").u32(8).str("32");
            }),
            "not uint32",
        ),
        ("unknown-type.gguf", one_tensor(&[4], 99, 0, 16), "ggml type 99 is not a ggml type"),
        ("removed-type.gguf", one_tensor(&[32], 4, 0, 20), "(Q4_2) was removed"),
        ("past-end.gguf", one_tensor(&[4], 0, 0, 12), "past the end of the file"),
        ("offset-past-end.gguf", one_tensor(&[4], 0, 1 << 40, 16), "past the end of the file"),
        ("offset-wraps.gguf", one_tensor(&[4], 0, u64::MAX - 31, 16), "past the end of the file"),
        ("offset-unaligned.gguf", one_tensor(&[4], 0, 4, 32), "not a multiple of the alignment"),
        ("blocks.gguf", one_tensor(&[33, 2], 8, 0, 128), "whole Q8_0 blocks"),
        ("elements.gguf", one_tensor(&[1 << 32, 1 << 32], 0, 0, 16), "2^63"),
        ("huge-shape.gguf", one_tensor(&[1 << 31, 1 << 20], 0, 0, 16), "past the end of the file"),
        ("bytes-overflow.gguf", one_tensor(&[1 << 31, 1 << 31], 0, 0, 16), "more than 2^64 bytes"),
        (
            "dims.gguf",
            {
                let mut r = Raw::header(3, 1, 0);
                r.str("t").u32(u32::MAX).bytes(&[0u8; 64]);
                r.0
            },
            "dimensions of tensor \"t\"",
        ),
        ("overlap.gguf", two.0, "overlap"),
        ("duplicate.gguf", dup.0, "appears twice"),
    ]
}

#[test]
fn one_hostile_gguf_case() {
    // The child half: run by the tests below with a case's path.
    let Some(path) = child::case() else { return };
    if path.is_dir() {
        // Every file in the folder must be refused.
        let mut n = 0;
        for e in std::fs::read_dir(&path).unwrap() {
            let p = e.unwrap().path();
            if gguf::read(&p).is_ok() {
                println!("outcome ok for {}", p.display());
                return;
            }
            n += 1;
        }
        println!("outcome refused {n}");
        return;
    }
    println!("{}", child::outcome(gguf::read(&path)));
}

#[test]
fn every_hostile_gguf_file_is_refused() {
    let out = child::Outside::new();
    std::fs::create_dir(&out.loc).unwrap();
    let mut wrong = vec![];
    let cases = hostile_cases();
    for (name, bytes, needle) in &cases {
        let p = write(&out.loc, name, bytes);
        let got = child::run("one_hostile_gguf_case", &p);
        if !got.starts_with("outcome error invalid_foreign: ") {
            wrong.push(format!("{name}: expected invalid_foreign, got {got}"));
        } else if !got.contains(needle) {
            wrong.push(format!("{name}: the message does not say {needle:?}: {got}"));
        } else if !got.contains(&*p.display().to_string()) {
            wrong.push(format!("{name}: the message does not name the file: {got}"));
        }
        std::fs::remove_file(&p).unwrap();
    }
    assert!(wrong.is_empty(), "{} of {} cases wrong:\n{}", wrong.len(), cases.len(), wrong.join("\n"));
    // A link to a valid file is refused as a link.
    #[cfg(unix)]
    {
        let target = write(&out.root, "real.gguf", &every_kind().0);
        let link = out.loc.join("link.gguf");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let got = child::run("one_hostile_gguf_case", &link);
        assert!(got.starts_with("outcome error link: "), "{got}");
    }
    out.assert_unchanged();
}

#[test]
fn a_file_truncated_at_every_byte_is_refused() {
    let (bytes, _) = every_kind();
    // The last tensor's bytes end before the file's padding does: cut there or later, the file
    // is whole.
    let h = treepack::format::gguf::parse(&bytes).unwrap();
    let needed = h.tensors.iter().map(|t| h.range(t).end).max().unwrap() as usize;
    assert!(needed < bytes.len());
    let out = child::Outside::new();
    std::fs::create_dir(&out.loc).unwrap();
    for n in 0..needed {
        write(&out.loc, &format!("{n:05}.gguf"), &bytes[..n]);
    }
    let got = child::run("one_hostile_gguf_case", &out.loc);
    assert_eq!(got, format!("outcome refused {needed}"));
    out.assert_unchanged();
    for n in needed..bytes.len() {
        let p = write(&out.root, "whole.gguf", &bytes[..n]);
        assert_eq!(gguf::read(&p).unwrap().0.leaf_count(), 7, "cut at {n}");
    }
}
