//! The parser's cases: files written byte by byte, every truncation, every byte changed.

use super::*;

/// A GGUF file written byte by byte.
#[derive(Default)]
struct W {
    b: Vec<u8>,
}

impl W {
    fn new(version: u32, tensors: u64, kvs: u64) -> W {
        let mut w = W::default();
        w.b.extend_from_slice(b"GGUF");
        w.u32(version).u64(tensors).u64(kvs);
        w
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.b.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.b.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.b.extend_from_slice(v);
        self
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }
    fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> &mut Self {
        self.str(name).u32(dims.len() as u32);
        for d in dims {
            self.u64(*d);
        }
        self.u32(ty).u64(offset)
    }
    fn pad(&mut self, a: usize) -> &mut Self {
        while !self.b.len().is_multiple_of(a) {
            self.b.push(0);
        }
        self
    }
}

fn small() -> Vec<u8> {
    let mut w = W::new(3, 2, 4);
    w.str("general.architecture").u32(8).str("llama");
    w.str("a.u64").u32(10).u64(u64::MAX);
    w.str("a.f32").u32(6).bytes(&f32::NAN.to_le_bytes());
    w.str("a.nested").u32(9).u32(9).u64(2);
    w.u32(5).u64(2).bytes(&1i32.to_le_bytes()).bytes(&(-2i32).to_le_bytes());
    w.u32(7).u64(1).bytes(&[1]);
    w.tensor("w", &[3, 2], 0, 0);
    w.tensor("q", &[64], 8, 32);
    w.pad(32);
    w.bytes(&[0u8; 24]).pad(32).bytes(&[7u8; 68]);
    w.b
}

#[test]
fn a_small_file_parses() {
    let f = small();
    let h = parse(&f).unwrap();
    assert_eq!(h.version, 3);
    assert_eq!(h.alignment, 32);
    assert_eq!(h.get("general.architecture"), Some(&Value::String("llama".into())));
    let j = serde_json::Value::Object(h.metadata_json());
    assert_eq!(j["a.u64"], serde_json::json!(u64::MAX));
    assert_eq!(j["a.f32"], "nan");
    assert_eq!(j["a.nested"], serde_json::json!([[1, -2], [true]]));
    assert_eq!(h.tensors[0].shape(), vec![2, 3]);
    assert_eq!(h.tensors[0].nbytes, 24);
    assert_eq!(h.tensors[1].ggml_type.name, "Q8_0");
    assert_eq!(h.tensors[1].nbytes, 68);
    assert_eq!(h.range(&h.tensors[1]), h.data_start + 32..f.len() as u64);
}

#[test]
fn every_truncation_is_an_error() {
    let f = small();
    for n in 0..f.len() {
        assert!(parse(&f[..n]).is_err(), "truncated at {n}");
    }
}

#[test]
fn the_type_table_matches_ggml() {
    // Spot checks against gguf-py's GGML_QUANT_SIZES.
    for (name, bs, ts) in [
        ("Q4_0", 32, 18),
        ("Q8_0", 32, 34),
        ("Q4_K", 256, 144),
        ("Q6_K", 256, 210),
        ("IQ4_XS", 256, 136),
        ("TQ1_0", 256, 54),
        ("MXFP4", 32, 17),
        ("BF16", 1, 2),
    ] {
        let t = GgmlType::from_name(name).unwrap();
        assert_eq!((t.block_size, t.type_size), (bs, ts), "{name}");
    }
    let ids: HashSet<u32> = GGML_TYPES.iter().map(|t| t.id).collect();
    assert_eq!(ids.len(), GGML_TYPES.len());
    assert!(REMOVED_TYPES.iter().all(|(id, _)| !ids.contains(id)));
}

fn err(f: &[u8]) -> GgufError {
    parse(f).unwrap_err()
}

#[test]
fn hostile_headers_are_refused_with_what_and_where() {
    // Counts far beyond the bytes.
    let e = err(&W::new(3, 0, 1 << 60).b);
    assert_eq!(e.kind(), "limit", "{e}");
    let e = err(&W::new(3, 0, 1000).b);
    assert_eq!(e.kind(), "truncated", "{e}");
    assert!(e.to_string().contains("1000 key-value pairs"), "{e}");
    // A 2^40-byte string.
    let mut w = W::new(3, 0, 1);
    w.str("k").u32(8).u64(1 << 40).bytes(b"abc");
    let e = err(&w.b);
    assert_eq!(e.kind(), "limit", "{e}");
    let mut w = W::new(3, 0, 1);
    w.str("k").u32(8).u64(1 << 20).bytes(b"abc");
    let e = err(&w.b);
    assert!(matches!(e, GgufError::Truncated { needed: 1048576, left: 3, .. }), "{e}");
    assert!(e.to_string().contains("key \"k\""), "{e}");
    // An array declaring 2^61 u64s.
    let mut w = W::new(3, 0, 1);
    w.str("k").u32(9).u32(10).u64(1 << 61);
    assert_eq!(err(&w.b).kind(), "truncated");
    // Arrays nested past the limit.
    let mut w = W::new(3, 0, 1);
    w.str("deep").u32(9);
    for _ in 0..100 {
        w.u32(9).u64(1);
    }
    let e = err(&w.b);
    assert_eq!(e.kind(), "limit", "{e}");
    assert!(e.to_string().contains("array nesting"), "{e}");
    // An unknown value type, a bad bool, bad UTF-8, a duplicate key, an empty key.
    let mut w = W::new(3, 0, 1);
    w.str("k").u32(13).u32(0);
    assert!(err(&w.b).to_string().contains("value type 13"));
    let mut w = W::new(3, 0, 1);
    w.str("k").u32(7).bytes(&[2]);
    assert!(err(&w.b).to_string().contains("neither 0 nor 1"));
    let mut w = W::new(3, 0, 1);
    w.str("k").u32(9).u32(8).u64(2).str("ok").u64(1).bytes(&[0xff]);
    let e = err(&w.b);
    assert!(e.to_string().contains("key \"k\"[1]") && e.to_string().contains("UTF-8"), "{e}");
    let mut w = W::new(3, 0, 2);
    w.str("k").u32(0).bytes(&[1]).str("k").u32(0).bytes(&[1]);
    assert!(err(&w.b).to_string().contains("twice"));
    let mut w = W::new(3, 0, 1);
    w.str("").u32(0).bytes(&[1, 0, 0, 0]);
    assert!(err(&w.b).to_string().contains("empty key"));
    // Versions.
    assert!(err(&W::new(1, 0, 0).b).to_string().contains("version 1"));
    assert!(err(&W::new(3u32.swap_bytes(), 0, 0).b).to_string().contains("big-endian"));
    assert_eq!(err(&W::new(4, 0, 0).b).kind(), "version");
    assert_eq!(err(b"GGML\x03\0\0\0").kind(), "magic");
    // Alignment.
    let mut w = W::new(3, 0, 1);
    w.str(ALIGNMENT_KEY).u32(4).u32(24);
    assert!(err(&w.b).to_string().contains("not a power of two"));
    let mut w = W::new(3, 0, 1);
    w.str(ALIGNMENT_KEY).u32(10).u64(32);
    assert!(err(&w.b).to_string().contains("not uint32"));
}

#[test]
fn hostile_tensors_are_refused() {
    let one = |name: &str, dims: &[u64], ty: u32, offset: u64, data: usize| {
        let mut w = W::new(3, 1, 0);
        w.tensor(name, dims, ty, offset).pad(32).bytes(&vec![0u8; data]);
        parse(&w.b)
    };
    assert!(one("t", &[4], 0, 0, 16).is_ok());
    let e = one("t", &[4], 99, 0, 16).unwrap_err();
    assert!(matches!(e, GgufError::UnknownType { id: 99, .. }), "{e}");
    assert!(e.to_string().contains("tensor \"t\""), "{e}");
    assert!(one("t", &[4], 4, 0, 16).unwrap_err().to_string().contains("Q4_2"));
    assert!(one("t", &[4], 0, 0, 15).unwrap_err().to_string().contains("past the end"));
    assert!(one("t", &[4], 0, 32, 16).unwrap_err().to_string().contains("past the end"));
    assert!(one("t", &[4], 0, 8, 64).unwrap_err().to_string().contains("not a multiple"));
    assert!(one("t", &[4], 0, u64::MAX - 31, 64).unwrap_err().to_string().contains("past the end"));
    assert!(one("t", &[33], 8, 0, 64).unwrap_err().to_string().contains("whole Q8_0 blocks"));
    assert!(one("t", &[1 << 32, 1 << 32], 0, 0, 64).unwrap_err().to_string().contains("2^63"));
    assert!(one("t", &[u64::MAX], 0, 0, 64).is_err());
    assert!(one("t", &[0, 5], 0, 0, 0).is_ok());
    assert!(one("", &[4], 0, 0, 16).unwrap_err().to_string().contains("empty tensor name"));
    let mut w = W::new(3, 1, 0);
    w.str("t").u32(65).bytes(&[0; 64]);
    assert_eq!(err(&w.b).kind(), "limit");
    // Overlap and duplicates.
    let mut w = W::new(3, 2, 0);
    w.tensor("a", &[16], 0, 0).tensor("b", &[8], 0, 32).pad(32).bytes(&[0u8; 64]);
    assert!(err(&w.b).to_string().contains("overlap"));
    let mut w = W::new(3, 2, 0);
    w.tensor("a", &[8], 0, 0).tensor("a", &[8], 0, 32).pad(32).bytes(&[0u8; 64]);
    assert!(err(&w.b).to_string().contains("twice"));
}

/// A small fuzz, every run: each byte of a valid file set to a few values; never a panic,
/// and what parses still has its tensors inside the file.
#[test]
fn every_byte_mutated_is_an_error_or_a_sound_header() {
    let f = small();
    for i in 0..f.len() {
        for b in [0u8, 1, 2, 0x7f, 0x80, 0xff, f[i] ^ 1, f[i].wrapping_add(32)] {
            let mut g = f.clone();
            g[i] = b;
            if let Ok(h) = parse(&g) {
                for t in &h.tensors {
                    assert!(h.range(t).end <= g.len() as u64);
                }
            }
        }
    }
}

#[test]
fn a_prefix_holding_the_header_is_enough() {
    let f = small();
    let h = parse(&f).unwrap();
    let head = &f[..h.data_start as usize];
    // (Debug, not ==: the header holds a NaN.)
    let again = parse_with(head, f.len() as u64, &Limits::default()).unwrap();
    assert_eq!(format!("{again:?}"), format!("{h:?}"));
    assert_eq!(parse_with(&f[..20], f.len() as u64, &Limits::default()).unwrap_err().kind(), "truncated");
}
