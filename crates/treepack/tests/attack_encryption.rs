//! Attack pass on encrypted trees (issue 55): AES-GCM nonce reuse through one `Location`
//! (a save retried after a failure, saves running at once through clones), hand-made hostile
//! encrypted objects (lying trailers, envelopes, headers, tiny files) read with the key, and
//! partial reads that straddle segments of compressed and uncompressed packs.

use std::path::{Path, PathBuf};
use treepack::save::Compression;
use treepack::*;

const KEY: [u8; 32] = [0x5a; 32];

fn enc(p: &str) -> Location {
    Location::parse(p).unwrap().with_encryption(KeySource::Key(KEY)).unwrap()
}

fn arr(n: u32, seed: f32) -> Node {
    let b: Vec<u8> = (0..n).flat_map(|i| (i as f32 * 0.5 + seed).to_le_bytes()).collect();
    Node::from(ArrayData::new(DType::F32, vec![u64::from(n)], b).unwrap())
}

fn tree(seed: f32) -> Node {
    Node::dict([("w", arr(100_000, seed)), ("b", arr(300, seed)), ("note", Node::from(format!("seed {seed}")))])
}

fn opts() -> SaveOptions {
    SaveOptions { overwrite: true, ..Default::default() }
}

fn pack_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = match std::fs::read_dir(dir.join("packs")) {
        Ok(r) => r.map(|e| e.unwrap().path()).collect(),
        Err(_) => vec![],
    };
    v.sort();
    v
}

/// Bug: the data key of a save lived in the `Location` until a manifest was committed, so a save
/// that failed after its packs (or its manifest) were sealed left its data key behind, and the
/// next save through the same `Location` sealed another tree with it: the same per-object keys
/// and the same nonces (segment indexes) for other plaintexts — AES-GCM nonce reuse, which gives
/// away the XOR of the plaintexts and the GHASH key (forgeries). Every save must make its own.
#[test]
fn a_save_retried_through_the_same_location_makes_a_new_data_key() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("dir");
    let loc = enc(p.to_str().unwrap());
    // The manifest's name taken by a folder with a file in it: the packs are written and
    // sealed, then the manifest's rename fails.
    std::fs::create_dir_all(p.join("treepack.json").join("x")).unwrap();
    let e = save(&tree(1.0), loc.clone(), &opts()).expect_err("the manifest cannot be written");
    let failed = pack_files(&p);
    assert!(!failed.is_empty(), "the failed save wrote its packs first: {e}");
    std::fs::remove_dir_all(p.join("treepack.json")).unwrap();
    // The same tree again, through the same location: its packs are keyed by the data key, so
    // the same names again would mean the same data key (and so the same object keys, and the
    // manifest sealed again under the same nonces with other bytes).
    save(&tree(1.0), loc.clone(), &opts()).unwrap();
    let now = pack_files(&p);
    let fresh: Vec<&PathBuf> = now.iter().filter(|f| !failed.contains(f)).collect();
    assert_eq!(fresh.len(), failed.len(), "the retried save reused the failed save's data key: {now:?}");
    assert_eq!(load(loc.clone(), &LoadOptions::default()).unwrap(), tree(1.0));
    // And a single file: the envelope (the wrapped data key, with its salt) differs per save.
    let tpk = d.path().join("one.tpk");
    let one = enc(tpk.to_str().unwrap());
    save(&tree(1.0), one.clone(), &opts()).unwrap();
    let a = std::fs::read(&tpk).unwrap();
    save(&tree(2.0), one.clone(), &opts()).unwrap();
    let b = std::fs::read(&tpk).unwrap();
    assert_ne!(a[a.len() - 400..], b[b.len() - 400..], "two saves through one location share an envelope");
    assert_eq!(load(one, &LoadOptions::default()).unwrap(), tree(2.0));
}

/// Bug: two saves running at once through clones of one `Location` shared its one data key:
/// both manifests sealed under the same key and nonces (nonce reuse), or, when one committed
/// first, the other's manifest got a new data key while its packs had the old one — a tree
/// that cannot be read (`tampered`), written without an error.
#[test]
fn saves_at_once_through_clones_of_one_location_each_stay_readable() {
    let d = tempfile::tempdir().unwrap();
    for round in 0..10 {
        let p = d.path().join(format!("r{round}"));
        let loc = enc(p.to_str().unwrap());
        let trees = [tree(1.0), tree(2.0)];
        std::thread::scope(|s| {
            let hs: Vec<_> = trees
                .iter()
                .map(|t| {
                    let l = loc.clone();
                    s.spawn(move || save(t, l, &SaveOptions { chunk_bytes: 16 << 10, ..opts() }))
                })
                .collect();
            for h in hs {
                // Either may lose the race to the other (both overwrite); neither may panic.
                let _ = h.join().unwrap();
            }
        });
        let back = load(enc(p.to_str().unwrap()), &LoadOptions::default())
            .unwrap_or_else(|e| panic!("round {round}: the tree left behind does not load: {e}"));
        assert!(back == trees[0] || back == trees[1], "round {round}");
    }
}

/// The manifest object of an encrypted directory tree, replaced by `bytes`: read with the key,
/// every one is refused with a typed error (no panic, no huge allocation, no hang).
#[test]
fn hostile_manifest_objects_are_refused_with_a_typed_error() {
    let d = tempfile::tempdir().unwrap();
    let base = d.path().join("base");
    save(&tree(1.0), enc(base.to_str().unwrap()), &opts()).unwrap();
    let good = std::fs::read(base.join("treepack.json")).unwrap();
    let n = good.len();
    let env_len = u32::from_le_bytes(good[n - 16..n - 12].try_into().unwrap()) as usize;
    let env = good[n - 16 - env_len..n - 16].to_vec();
    let body = good[16..n - 16 - env_len].to_vec();
    let with_trailer = |body: &[u8], env: &[u8], declared: u32, reserved: [u8; 4]| {
        let mut v = good[..16].to_vec();
        v.extend_from_slice(body);
        v.extend_from_slice(env);
        v.extend_from_slice(&declared.to_le_bytes());
        v.extend_from_slice(&reserved);
        v.extend_from_slice(b"TPKCRYPT");
        v
    };
    let env_json: serde_json::Value = serde_json::from_slice(&env).unwrap();
    let env_with = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut e = env_json.clone();
        f(&mut e);
        let e = serde_json::to_vec(&e).unwrap();
        with_trailer(&body, &e, e.len() as u32, [0; 4])
    };
    let mut header_4k = good.clone();
    header_4k[13] = 12;
    let deep = {
        let mut e = b"{\"cipher\":".to_vec();
        e.extend(std::iter::repeat_n(b'[', 8000));
        e
    };
    let cases: Vec<(&str, Vec<u8>, &[&str])> = vec![
        ("empty", vec![], &["not_encrypted", "not_treepack", "invalid_manifest"]),
        ("one byte", b"T".to_vec(), &["not_encrypted", "not_treepack", "invalid_manifest"]),
        ("magic only", b"TPKCRYPT".to_vec(), &["tampered", "encrypted"]),
        ("16 bytes", b"TPKCRYPTTPKCRYPT".to_vec(), &["tampered"]),
        ("trailer only", with_trailer(&[], &[], 0, [0; 4])[16..].to_vec(), &["tampered"]),
        ("header and trailer", with_trailer(&[], &[], 0, [0; 4]), &["tampered"]),
        ("envelope longer than the file", with_trailer(&body, &env, (n + 10) as u32, [0; 4]), &["tampered"]),
        ("envelope past the limit", with_trailer(&body, &env, u32::MAX, [0; 4]), &["tampered"]),
        ("envelope one byte short", with_trailer(&body, &env, env_len as u32 - 1, [0; 4]), &["wrong_key"]),
        // The envelope then starts with the body's last byte, random: JSON whitespace 4 times in
        // 256, and then the envelope parses and the body, one byte short, fails authentication.
        ("envelope one byte long", with_trailer(&body, &env, env_len as u32 + 1, [0; 4]), &["wrong_key", "tampered"]),
        ("reserved bytes", with_trailer(&body, &env, env_len as u32, [0, 0, 0, 1]), &["tampered"]),
        ("no envelope", with_trailer(&body, &[], 0, [0; 4]), &["wrong_key"]),
        ("deep JSON", with_trailer(&body, &deep, deep.len() as u32, [0; 4]), &["wrong_key"]),
        ("header says 4 KiB segments", header_4k, &["tampered"]),
        ("envelope says 4 KiB segments", env_with(&|e| e["segment_bytes"] = 4096.into()), &["wrong_key"]),
        ("envelope segment 2^40", env_with(&|e| e["segment_bytes"] = (1u64 << 40).into()), &["wrong_key"]),
        ("envelope segment 0", env_with(&|e| e["segment_bytes"] = 0.into()), &["wrong_key"]),
        ("odd hex", env_with(&|e| e["data_key"] = "abc".into()), &["wrong_key"]),
        ("non-ascii hex", env_with(&|e| e["data_key"] = "éé".into()), &["wrong_key"]),
        ("short data key", env_with(&|e| e["data_key"] = "00".repeat(32).into()), &["wrong_key"]),
        ("long data key", env_with(&|e| e["data_key"] = "00".repeat(4000).into()), &["wrong_key"]),
        ("salt short", env_with(&|e| e["key"]["salt"] = "00".into()), &["wrong_key"]),
        ("unknown kind", env_with(&|e| e["key"]["kind"] = "rot13".into()), &["wrong_key"]),
        ("other cipher", env_with(&|e| e["cipher"] = "chacha20".into()), &["wrong_key"]),
    ];
    for (what, bytes, kinds) in cases {
        let p = d.path().join(what.replace(' ', "_"));
        std::fs::create_dir_all(&p).unwrap();
        let _ = std::fs::remove_dir_all(p.join("packs"));
        std::fs::create_dir_all(p.join("packs")).unwrap();
        for f in pack_files(&base) {
            std::fs::copy(&f, p.join("packs").join(f.file_name().unwrap())).unwrap();
        }
        std::fs::write(p.join("treepack.json"), &bytes).unwrap();
        for read in 0..3 {
            let l = enc(p.to_str().unwrap());
            let r = match read {
                0 => load(l, &LoadOptions::default()).map(|_| ()),
                1 => open(l).map(|_| ()),
                _ => root_hash(l).map(|_| ()),
            };
            let e = r.expect_err(what);
            assert!(kinds.contains(&e.kind()), "{what}: {} {e}", e.kind());
        }
    }
}

/// A pack of an encrypted tree replaced by a crafted object: read with the key, refused.
#[test]
fn hostile_packs_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let base = d.path().join("base");
    save(&tree(1.0), enc(base.to_str().unwrap()), &opts()).unwrap();
    let pack = pack_files(&base).remove(0);
    let good = std::fs::read(&pack).unwrap();
    let n = good.len();
    let mut with_env = good[..n - 16].to_vec();
    with_env.extend_from_slice(b"{}");
    with_env.extend_from_slice(&2u32.to_le_bytes());
    with_env.extend_from_slice(&[0; 4]);
    with_env.extend_from_slice(b"TPKCRYPT");
    let mut extended = good.clone();
    extended.extend_from_slice(&vec![0u8; (64 << 10) + 16]);
    let mut header = good.clone();
    header[13] = 24;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("one byte", vec![0]),
        ("header only", good[..16].to_vec()),
        ("an envelope in a pack", with_env),
        ("a segment appended", extended),
        ("cut inside a tag", good[..n - 20].to_vec()),
        ("the manifest's object", std::fs::read(base.join("treepack.json")).unwrap()),
        ("header says 16 MiB segments", header),
    ];
    for (what, bytes) in cases {
        std::fs::write(&pack, &bytes).unwrap();
        let e = load(enc(base.to_str().unwrap()), &LoadOptions::default()).expect_err(what);
        assert!(matches!(e.kind(), "tampered" | "out_of_bounds" | "missing_part"), "{what}: {} {e}", e.kind());
        let r = open(enc(base.to_str().unwrap())).unwrap();
        assert!(r.verify().map(|v| !v.ok()).unwrap_or(true), "{what}: verify passed");
    }
    std::fs::write(&pack, &good).unwrap();
    assert_eq!(load(enc(base.to_str().unwrap()), &LoadOptions::default()).unwrap(), tree(1.0));
}

/// Ranged reads whose chunks straddle 64 KiB segments decrypt exactly, compressed or not, in
/// both layouts and in memory.
#[test]
fn slices_across_segment_boundaries_decrypt_exactly() {
    let d = tempfile::tempdir().unwrap();
    let n = 200_003u32;
    let t = Node::dict([("pad", arr(7, 0.0)), ("w", arr(n, 3.0))]);
    let want: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 + 3.0).collect();
    for (i, p) in [
        d.path().join("dir").display().to_string(),
        d.path().join("one.tpk").display().to_string(),
        "memory://attack-enc/dir".to_string(),
    ]
    .into_iter()
    .enumerate()
    {
        for zstd in [false, true] {
            let o = SaveOptions {
                // Chunks of an odd size, so they begin and end inside segments.
                chunk_bytes: 70_001,
                compression: Compression::parse(if zstd { "zstd:1" } else { "none" }).unwrap(),
                ..opts()
            };
            save(&t, enc(&p), &o).unwrap();
            let r = open(enc(&p)).unwrap();
            for (a, b) in [(0u64, 1u64), (16_383, 16_385), (17_000, 50_000), (n as u64 - 3, n as u64), (0, n as u64)] {
                let got = r.read_array("w", &format!("{a}:{b}")).unwrap_or_else(|e| panic!("{i} {zstd} {a}..{b}: {e}"));
                let vals: Vec<f32> =
                    got.bytes().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
                assert_eq!(vals, want[a as usize..b as usize], "{p} zstd={zstd} {a}..{b}");
            }
        }
    }
}
