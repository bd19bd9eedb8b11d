//! Encrypted trees (issue 55, docs/encryption.md): every file of the tree sealed, nothing of it
//! readable without the key; partial reads decrypt only what they touch; every way of
//! tampering — a flipped byte, segments moved or swapped, a pack from another save, a file cut
//! short, a plain tree put in its place — refused with the error that says so, naming the leaf.

use std::path::{Path, PathBuf};
use treepack::*;

const KEY: [u8; 32] = [0x42; 32];
const MARK: &str = "a very secret string inline in the manifest";

fn b_leaf() -> Node {
    let b: Vec<u8> = (0..256u32).flat_map(|i| (i as f32 * 0.5).to_le_bytes()).collect();
    Node::from(ArrayData::new(DType::F32, vec![256], b).unwrap())
}

fn tree(seed: u8) -> Node {
    let w: Vec<u8> = (0..256 * 256u32).flat_map(|i| ((i as f32) * 0.25 + f32::from(seed)).to_le_bytes()).collect();
    Node::dict([
        (
            "params",
            Node::dict([("w", Node::from(ArrayData::new(DType::F32, vec![256, 256], w).unwrap())), ("b", b_leaf())]),
        ),
        ("step", Node::from(i64::from(seed))),
        ("note", Node::from(MARK)),
    ])
}

fn enc(p: &str, key: KeySource) -> Location {
    Location::parse(p).unwrap().with_encryption(key).unwrap()
}

fn opts() -> SaveOptions {
    // Small chunks: `w` (256 KiB) spans four 64 KiB chunks, each its own segment run.
    SaveOptions { chunk_bytes: 64 << 10, overwrite: true, ..Default::default() }
}

fn err<T: std::fmt::Debug>(r: Result<T>) -> Error {
    r.expect_err("refused")
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

fn pack_of(dir: &Path) -> PathBuf {
    files(&dir.join("packs")).into_iter().next().unwrap()
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn encrypted_trees_round_trip_in_every_layout_and_store() {
    let d = tempfile::tempdir().unwrap();
    let t = tree(1);
    for p in [
        d.path().join("dir").display().to_string(),
        d.path().join("one.tpk").display().to_string(),
        "memory://enc-test/dir".to_string(),
        "memory://enc-test/one.tpk".to_string(),
    ] {
        for key in [KeySource::Key(KEY), KeySource::Passphrase("correct horse".into())] {
            save(&t, enc(&p, key.clone()), &opts()).unwrap();
            let back = load(enc(&p, key.clone()), &LoadOptions::default()).unwrap();
            assert_eq!(back, t, "{p}");
            // A partial read, and verify, through the key.
            let r = open(enc(&p, key.clone())).unwrap();
            assert_eq!(r.get("params/b").unwrap(), b_leaf());
            assert_eq!(r.manifest().version, (1, 7));
            let report = r.verify().unwrap();
            assert!(report.ok(), "{p}: {report:?}");
            // Without the key: a clear refusal saying what it was encrypted with.
            let e = err(load(p.as_str(), &LoadOptions::default()));
            assert_eq!(e.kind(), "encrypted", "{e}");
            let want = match key {
                KeySource::Key(_) => "32-byte key",
                _ => "a passphrase",
            };
            assert!(e.to_string().contains(want) && e.to_string().contains("encryption="), "{e}");
        }
    }
}

#[test]
fn nothing_of_the_tree_is_in_its_files() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("dir");
    let t = tree(1);
    save(&t, enc(p.to_str().unwrap(), KeySource::Key(KEY)), &opts()).unwrap();
    let tpk = d.path().join("one.tpk");
    save(&t, enc(tpk.to_str().unwrap(), KeySource::Key(KEY)), &opts()).unwrap();
    // A run of `w`'s bytes, a key name, the inline string, the manifest's signature.
    let w: Vec<u8> = (1000..1016u32).flat_map(|i| ((i as f32) * 0.25 + 1.0).to_le_bytes()).collect();
    let mut all = files(&p);
    all.push(tpk);
    for f in all {
        let b = std::fs::read(&f).unwrap();
        assert!(b.starts_with(b"TPKCRYPT") && b.ends_with(b"TPKCRYPT"), "{}", f.display());
        for needle in [&w[..], MARK.as_bytes(), b"params", b"{\"format\":\"treepack\"", b"TREEPACK", b"TPKFOOT1"] {
            assert!(!contains(&b, needle), "{} holds {:?}", f.display(), String::from_utf8_lossy(needle));
        }
    }
}

#[test]
fn wrong_missing_and_unexpected_keys_are_told_apart() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("dir");
    let ps = p.to_str().unwrap();
    save(&tree(1), enc(ps, KeySource::Key(KEY)), &opts()).unwrap();
    let e = err(load(enc(ps, KeySource::Key([1; 32])), &LoadOptions::default()));
    assert_eq!(e.kind(), "wrong_key");
    assert!(e.to_string().contains("is not the key this tree was encrypted with"), "{e}");
    let e = err(load(enc(ps, KeySource::Passphrase("x".into())), &LoadOptions::default()));
    assert_eq!(e.kind(), "wrong_key");
    assert!(e.to_string().contains("encrypted with the 32-byte key"), "{e}");
    // A passphrase tree opened with another passphrase.
    let q = d.path().join("q.tpk");
    save(&tree(1), enc(q.to_str().unwrap(), KeySource::Passphrase("one".into())), &opts()).unwrap();
    let e = err(load(enc(q.to_str().unwrap(), KeySource::Passphrase("two".into())), &LoadOptions::default()));
    assert_eq!(e.kind(), "wrong_key");
    assert!(e.to_string().contains("passphrase given does not open"), "{e}");
    // A key given for a plain tree: refused (someone may have put it there), in both layouts.
    for plain in [d.path().join("plain"), d.path().join("plain.tpk")] {
        save(&tree(1), plain.to_str().unwrap(), &opts()).unwrap();
        let e = err(load(enc(plain.to_str().unwrap(), KeySource::Key(KEY)), &LoadOptions::default()));
        assert_eq!(e.kind(), "not_encrypted", "{e}");
    }
    // Nothing there: not found, as for a plain location.
    let e = err(load(enc(d.path().join("none").to_str().unwrap(), KeySource::Key(KEY)), &LoadOptions::default()));
    assert_eq!(e.kind(), "not_found", "{e}");
}

/// Load `p` with the key, expecting `tampered` naming `key` (when given).
fn refused_as_tampered(p: &Path, key: Option<&str>) {
    let e = err(load(enc(p.to_str().unwrap(), KeySource::Key(KEY)), &LoadOptions::default()));
    assert_eq!(e.kind(), "tampered", "{e}");
    if let Some(k) = key {
        assert!(e.to_string().contains(&format!("`{k}`")), "{e}");
    }
    assert!(e.to_string().contains("restore the file from a good copy"), "{e}");
}

#[test]
fn every_way_of_tampering_is_refused_naming_the_leaf() {
    let d = tempfile::tempdir().unwrap();
    let base = d.path().join("base");
    save(&tree(1), enc(base.to_str().unwrap(), KeySource::Key(KEY)), &opts()).unwrap();
    let copy = |name: &str| {
        let to = d.path().join(name);
        std::fs::create_dir_all(to.join("packs")).unwrap();
        for f in files(&base) {
            std::fs::copy(&f, to.join(f.strip_prefix(&base).unwrap())).unwrap();
        }
        to
    };
    // A flipped byte in `w`'s first segment (the pack begins with `params/w`? find by load).
    let flipped = copy("flipped");
    let pack = pack_of(&flipped);
    let mut b = std::fs::read(&pack).unwrap();
    b[16 + 100] ^= 1;
    std::fs::write(&pack, &b).unwrap();
    refused_as_tampered(&flipped, Some("params/w"));

    // Two segments swapped.
    let swapped = copy("swapped");
    let pack = pack_of(&swapped);
    let mut b = std::fs::read(&pack).unwrap();
    let w = (64 << 10) + 16;
    let (x, y) = b[16..16 + 2 * w].split_at_mut(w);
    x.swap_with_slice(y);
    std::fs::write(&pack, &b).unwrap();
    refused_as_tampered(&swapped, Some("params/w"));

    // Cut short at a segment boundary (the trailer moved along, so the size still parses).
    let cut = copy("cut");
    let pack = pack_of(&cut);
    let b = std::fs::read(&pack).unwrap();
    let mut short = b[..16 + 2 * w].to_vec();
    short.extend_from_slice(&b[b.len() - 16..]);
    std::fs::write(&pack, &short).unwrap();
    let e = err(load(enc(cut.to_str().unwrap(), KeySource::Key(KEY)), &LoadOptions::default()));
    assert!(matches!(e.kind(), "tampered" | "out_of_bounds"), "{e}");
    assert!(e.to_string().contains("params/"), "{e}");

    // The same tree saved again with the same key: its pack (another data key) put in place.
    let other = d.path().join("other");
    save(&tree(1), enc(other.to_str().unwrap(), KeySource::Key(KEY)), &opts()).unwrap();
    let replayed = copy("replayed");
    let ours = pack_of(&replayed);
    std::fs::copy(pack_of(&other), &ours).unwrap();
    refused_as_tampered(&replayed, Some("params/w"));

    // A plain tree's manifest put in place of the encrypted one.
    let swapped_manifest = copy("plainmanifest");
    let plain = d.path().join("plain");
    save(&tree(1), plain.to_str().unwrap(), &opts()).unwrap();
    std::fs::copy(plain.join("treepack.json"), swapped_manifest.join("treepack.json")).unwrap();
    let e = err(load(enc(swapped_manifest.to_str().unwrap(), KeySource::Key(KEY)), &LoadOptions::default()));
    assert_eq!(e.kind(), "not_encrypted", "{e}");

    // A flipped byte in the manifest's object.
    let m = copy("manifest-flip");
    let mut b = std::fs::read(m.join("treepack.json")).unwrap();
    b[20] ^= 0x80;
    std::fs::write(m.join("treepack.json"), &b).unwrap();
    let e = err(load(enc(m.to_str().unwrap(), KeySource::Key(KEY)), &LoadOptions::default()));
    assert_eq!(e.kind(), "tampered", "{e}");

    // A flipped byte in the envelope's wrapped key: the key no longer opens it.
    let env = copy("envelope-flip");
    let mut b = std::fs::read(env.join("treepack.json")).unwrap();
    let at = b.windows(12).position(|x| x == b"\"data_key\":\"").unwrap() + 13;
    b[at] = if b[at] == b'0' { b'1' } else { b'0' };
    std::fs::write(env.join("treepack.json"), &b).unwrap();
    let e = err(load(enc(env.to_str().unwrap(), KeySource::Key(KEY)), &LoadOptions::default()));
    assert_eq!(e.kind(), "wrong_key", "{e}");

    // The untouched copy still loads (the tests above changed copies only).
    assert_eq!(load(enc(copy("ok").to_str().unwrap(), KeySource::Key(KEY)), &LoadOptions::default()).unwrap(), tree(1));
}

#[test]
fn a_single_file_cut_or_flipped_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("one.tpk");
    save(&tree(1), enc(p.to_str().unwrap(), KeySource::Key(KEY)), &opts()).unwrap();
    let good = std::fs::read(&p).unwrap();
    let mut b = good.clone();
    b[16 + 70_000] ^= 4;
    std::fs::write(&p, &b).unwrap();
    refused_as_tampered(&p, Some("params/w"));
    // A segment dropped from the middle (the rest shifted): the next segment is out of place.
    let w = (64 << 10) + 16;
    let mut b = good[..16 + w].to_vec();
    b.extend_from_slice(&good[16 + 2 * w..]);
    std::fs::write(&p, &b).unwrap();
    let e = err(load(enc(p.to_str().unwrap(), KeySource::Key(KEY)), &LoadOptions::default()));
    assert_eq!(e.kind(), "tampered", "{e}");
}

#[test]
fn pack_names_reveal_nothing_and_overwrites_clean_up() {
    let d = tempfile::tempdir().unwrap();
    let a = d.path().join("a");
    let b = d.path().join("b");
    save(&tree(1), enc(a.to_str().unwrap(), KeySource::Key(KEY)), &opts()).unwrap();
    save(&tree(1), enc(b.to_str().unwrap(), KeySource::Key(KEY)), &opts()).unwrap();
    let name = |p: &Path| pack_of(p).file_name().unwrap().to_owned();
    // Same content, same key: other names (content-derived names would let anyone confirm a
    // guess of the content), other bytes.
    assert_ne!(name(&a), name(&b));
    assert_ne!(std::fs::read(pack_of(&a)).unwrap(), std::fs::read(pack_of(&b)).unwrap());
    // Overwritten: the old tree's packs go, the new one loads.
    let loc = enc(a.to_str().unwrap(), KeySource::Key(KEY));
    save(&tree(2), loc.clone(), &opts()).unwrap();
    assert_eq!(files(&a.join("packs")).len(), 1);
    assert_eq!(load(loc, &LoadOptions::default()).unwrap(), tree(2));
}

#[test]
fn a_partial_read_decrypts_only_the_segments_it_needs() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("dir");
    // 16 MiB of weights beside a small leaf.
    let big: Vec<u8> = (0..4u32 << 20).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let t = Node::dict([
        ("big", Node::from(ArrayData::new(DType::F32, vec![4 << 20], big).unwrap())),
        ("small", Node::from(ArrayData::new(DType::I64, vec![4], vec![7u8; 32]).unwrap())),
    ]);
    save(&t, enc(p.to_str().unwrap(), KeySource::Key(KEY)), &SaveOptions::default()).unwrap();
    let loc = enc(p.to_str().unwrap(), KeySource::Key(KEY));
    let r = open(loc.clone()).unwrap();
    loc.stats().reset();
    assert_eq!(r.get("small").unwrap(), Node::from(ArrayData::new(DType::I64, vec![4], vec![7u8; 32]).unwrap()));
    let read = loc.stats().bytes_read();
    assert!(read <= 2 * ((64 << 10) + 16), "read {read} bytes for a 32-byte leaf");
    // A slice of `big` reads the one 4 MiB chunk it lies in (whole, to check its hash): the
    // segments of that chunk, not the file.
    loc.stats().reset();
    let a = r.read_array("big", "[1000000:1000010]").unwrap();
    assert_eq!(a.shape(), &[10]);
    let read = loc.stats().bytes_read();
    assert!(read <= (4 << 20) + 2 * ((64 << 10) + 16) + 64 * 16, "read {read} bytes for one 4 MiB chunk");
}

#[test]
fn what_is_not_supported_is_refused_clearly() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("parts");
    let e = err(save_part(&tree(1), enc(p.to_str().unwrap(), KeySource::Key(KEY)), &opts()));
    assert!(e.to_string().contains("cannot be encrypted yet"), "{e}");
    let repo = d.path().join("repo");
    let e = err(Location::parse(&format!("{}@main", repo.display())).unwrap().with_encryption(KeySource::Key(KEY)));
    assert!(e.to_string().contains("trees of a repository cannot be encrypted yet"), "{e}");
}
