//! Measure each codec on checkpoint-like data (docs/compression.md's table): ratio, and save and
//! load speed through the library (in memory, so the disk does not set the pace).
//!
//!     cargo run --release --example codecs -p treepack
//!
//! The data (deterministic): bfloat16 weights drawn from a normal distribution, float32 Adam
//! moments of which 90 % are zero, int32 token ids below 32 000, bool masks, and float32
//! weights (incompressible in their low bytes).

use std::time::Instant;

/// The allocator the Python extension and the CLI use (big buffers on huge pages), so the
/// numbers are the shipped binaries'.
#[global_allocator]
static GLOBAL: treepack_alloc::BigMapped<mimalloc::MiMalloc> = treepack_alloc::BigMapped(mimalloc::MiMalloc);
use treepack::*;

/// xorshift64*: deterministic, fast, good enough for test data.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Standard normal (Box-Muller).
    fn normal(&mut self) -> f32 {
        let (u, v) = (self.unit().max(1e-300), self.unit());
        ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
    }
}

fn arr(dtype: DType, n: usize, bytes: Vec<u8>) -> Node {
    Node::from(ArrayData::new(dtype, vec![n as u64], bytes).unwrap())
}

fn main() {
    let n = 16 << 20; // elements per array
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    let f32s: Vec<f32> = (0..n).map(|_| r.normal() * 0.02).collect();
    let bf16: Vec<u8> = f32s.iter().flat_map(|x| ((x.to_bits() >> 16) as u16).to_le_bytes()).collect();
    let f32b: Vec<u8> = f32s.iter().flat_map(|x| x.to_le_bytes()).collect();
    let moments: Vec<u8> =
        f32s.iter().map(|x| if r.unit() < 0.9 { 0.0 } else { x * x }).flat_map(|x: f32| x.to_le_bytes()).collect();
    let tokens: Vec<u8> = (0..n).flat_map(|_| ((r.next() % 32_000) as i32).to_le_bytes()).collect();
    let mask: Vec<u8> = (0..n).map(|_| u8::from(r.unit() < 0.5)).collect();
    let cases = [
        ("bf16 weights", arr(DType::BF16, n, bf16)),
        ("f32 moments, 90% zero", arr(DType::F32, n, moments)),
        ("int32 token ids", arr(DType::I32, n, tokens)),
        ("bool masks", arr(DType::Bool, n, mask)),
        ("f32 weights", arr(DType::F32, n, f32b)),
    ];
    let only = std::env::var("CODECS_ONLY").ok();
    let policies: Vec<&str> = match &only {
        Some(p) => vec![p.as_str()],
        None => vec!["none", "lz4", "zstd:1", "zstd:3", "auto", r#"[{"codec":"zstd","level":3,"filter":"none"}]"#],
    };
    if std::env::var("CODECS_MICRO").is_ok() {
        use treepack::format::codec::{Compressor, Encoding, Filter};
        for (name, tree) in &cases {
            let Tree::Leaf(Leaf::Array(a)) = tree else { unreachable!() };
            let chunk = &a.bytes()[..4 << 20];
            let k = a.dtype().itemsize();
            for shuffle in [false, true] {
                let level = std::env::var("CODECS_LEVEL").ok().and_then(|l| l.parse().ok()).unwrap_or(3);
                let enc = Encoding {
                    compressor: Compressor::Zstd,
                    level,
                    filter: if shuffle { Filter::Shuffle } else { Filter::None },
                };
                let Some((stored, codec)) = enc.encode(chunk, k) else { continue };
                let t = Instant::now();
                for _ in 0..20 {
                    codec.decode(stored.clone(), chunk.len() as u64, k).unwrap();
                }
                let dt = t.elapsed().as_secs_f64() / 20.0;
                println!("{name} {codec}: decode one 4 MiB chunk {:.2} ms = {:.2} GiB/s", dt * 1e3, 4.0 / 1024.0 / dt);
            }
        }
        return;
    }
    println!("| data | policy | ratio | save | load |");
    println!("| --- | --- | ---: | ---: | ---: |");
    let case = std::env::var("CODECS_CASE").ok();
    for (name, tree) in &cases {
        if case.as_deref().is_some_and(|c| !name.starts_with(c)) {
            continue;
        }
        let Tree::Leaf(Leaf::Array(a)) = tree else { unreachable!() };
        let gib = a.nbytes() as f64 / (1u64 << 30) as f64;
        for &policy in &policies {
            // In memory by default (the disk does not set the pace); CODECS_DIR=path for a local tree.
            let loc: Location = match std::env::var("CODECS_DIR") {
                Ok(d) => format!("{d}/x").into_location().unwrap(),
                Err(_) => "memory://bench/x".into_location().unwrap(),
            };
            let opts = SaveOptions {
                compression: save::Compression::parse(policy).unwrap(),
                overwrite: true,
                ..Default::default()
            };
            let mut saves = vec![];
            let mut loads = vec![];
            let mut stored = 0;
            let runs = std::env::var("CODECS_RUNS").ok().and_then(|r| r.parse().ok()).unwrap_or(3);
            for _ in 0..runs {
                let t = Instant::now();
                save(tree, loc.clone(), &opts).unwrap();
                saves.push(t.elapsed().as_secs_f64());
                let t = Instant::now();
                let back = load(loc.clone(), &LoadOptions::default()).unwrap();
                loads.push(t.elapsed().as_secs_f64());
                assert!(back.exact_eq(tree));
                let rd = open(loc.clone()).unwrap();
                stored = rd.manifest().packs.iter().map(|p| p.size).sum::<u64>();
            }
            saves.sort_by(f64::total_cmp);
            loads.sort_by(f64::total_cmp);
            let (saves, loads) = (&saves[saves.len() / 2 - 1..], &loads[loads.len() / 2 - 1..]);
            let policy = if policy.starts_with('[') { "zstd:3, no shuffle" } else { policy };
            println!(
                "| {name} | {policy} | {:.2}x | {:.2} GiB/s | {:.2} GiB/s |",
                a.nbytes() as f64 / stored as f64,
                gib / saves[1],
                gib / loads[1]
            );
        }
    }
}
