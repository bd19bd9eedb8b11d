//! Criterion benchmarks for the hot paths: chunk hashing, array previews (min/max over every
//! saved byte), manifest encode/decode, pack I/O.
//! Run: `cargo bench -p treepack --bench hot`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use treepack::format::*;
use treepack::*;

fn hashing(c: &mut Criterion) {
    let mut g = c.benchmark_group("chunk_hash");
    for size in [64 << 10, 4 << 20] {
        let data = vec![7u8; size];
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_with_input(BenchmarkId::from_parameter(size), &data, |b, d| b.iter(|| hash::Hash32::of(d)));
    }
    g.finish();
}

fn previews(c: &mut Criterion) {
    let mut g = c.benchmark_group("preview_min_max");
    let size = 4usize << 20;
    let f32s: Vec<u8> = (0..size / 4).flat_map(|i| (i as f32 * 1e-3).to_le_bytes()).collect();
    let bf16s: Vec<u8> =
        (0..size / 2).flat_map(|i| ((((i as f32) * 1e-3).to_bits() >> 16) as u16).to_le_bytes()).collect();
    g.throughput(Throughput::Bytes(size as u64));
    for (name, dtype, data) in [("float32", DType::F32, &f32s), ("bfloat16", DType::BF16, &bf16s)] {
        g.bench_with_input(BenchmarkId::new(name, size), data, |b, d| b.iter(|| preview::min_max(&dtype, d)));
    }
    g.finish();
}

fn many_leaves(n: i64) -> Node {
    Node::list((0..n).map(|i| {
        Node::dict([
            ("step", Node::from(i)),
            ("lr", Node::from(i as f64 * 1e-3)),
            ("name", Node::from(format!("p{i}"))),
        ])
    }))
}

fn manifest(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m");
    let p = p.to_str().unwrap();
    save(&many_leaves(30_000), p, &SaveOptions::default()).unwrap();
    let bytes = std::fs::read(dir.path().join("m/treepack.json")).unwrap();
    let m = manifest::decode(&bytes, "bench").unwrap();
    let mut g = c.benchmark_group("manifest_90k_leaves");
    g.throughput(Throughput::Bytes(bytes.len() as u64));
    g.bench_function("decode", |b| b.iter(|| manifest::decode(&bytes, "bench").unwrap()));
    g.bench_function("encode", |b| b.iter(|| manifest::encode(&m, &serde_json::json!({}))));
    // The structure-only read `load_structure` uses for big manifests (one thread, blocks dropped).
    g.bench_function("outline", |b| b.iter(|| manifest::outline::outline(&bytes, "bench", &mut |_| true).unwrap()));
    // Rust's `load_structure` of a big manifest: the outline's events built into a tree, against
    // the full parse then `Manifest::structure` (what it did before; read::structure's policy).
    g.bench_function("structure_by_outline", |b| {
        b.iter(|| read::structure::by_outline(&bytes, "bench", Layout::Directory).unwrap())
    });
    g.bench_function("structure_by_decode", |b| {
        b.iter(|| manifest::decode(&bytes, "bench").unwrap().structure().unwrap())
    });
    g.finish();
}

fn pack_io(c: &mut Criterion) {
    let n = 16 << 20;
    let data: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
    let tree = Node::dict([("w", Node::from(ArrayData::new(DType::U8, vec![n as u64], data).unwrap()))]);
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("p");
    let p = p.to_str().unwrap().to_string();
    let mut g = c.benchmark_group("pack_io_16MiB");
    g.sample_size(10);
    g.throughput(Throughput::Bytes(n as u64));
    let opts = SaveOptions { overwrite: true, ..Default::default() };
    g.bench_function("save_dir", |b| b.iter(|| save(&tree, &p, &opts).unwrap()));
    g.bench_function("load_dir", |b| b.iter(|| load(&p, &LoadOptions::default()).unwrap()));
    g.bench_function("load_dir_noverify", |b| {
        b.iter(|| load(&p, &LoadOptions { verify: false, ..Default::default() }).unwrap())
    });
    g.finish();
}

criterion_group!(benches, hashing, previews, manifest, pack_io);
criterion_main!(benches);
