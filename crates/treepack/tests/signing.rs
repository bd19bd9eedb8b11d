//! Signed trees (issue 55, docs/signing.md): a signature over the root hash, checked from the
//! manifest and the signature alone before a load returns anything; every way of tampering
//! refused with the error that says what happened; carried by copies between layouts;
//! repositories' named trees; rollback to an older signed tree caught by what the caller knows.

use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};
use treepack::format::manifest::seal;
use treepack::sign::{self, Algorithm, Carried, SignedBy, SigningKey, VerifyingKey};
use treepack::*;

fn key(seed: u8) -> SigningKey {
    SigningKey::from_secret_bytes(Algorithm::Ed25519, &[seed; 32]).unwrap()
}

fn p256(seed: u8) -> SigningKey {
    SigningKey::from_secret_bytes(Algorithm::P256, &[seed; 32]).unwrap()
}

fn by(k: &SigningKey) -> SignedBy {
    SignedBy::keys([k.verifying_key()])
}

fn tree(seed: u8) -> Node {
    let w: Vec<u8> = (0..64 * 64u32).flat_map(|i| ((i as f32) + seed as f32).to_le_bytes()).collect();
    let b: Vec<u8> = (0..64u32).flat_map(|i| (i as f32 * 0.5).to_le_bytes()).collect();
    Node::dict([
        (
            "params",
            Node::dict([
                ("w", Node::from(ArrayData::new(DType::F32, vec![64, 64], w).unwrap())),
                ("b", Node::from(ArrayData::new(DType::F32, vec![64], b).unwrap())),
            ]),
        ),
        ("step", Node::from(i64::from(seed))),
        ("name", Node::from("a signed tree")),
    ])
}

/// Saved with a small chunk target (so `w` has several chunks and a pack of its own bytes).
fn save_at(t: &Node, p: &str, metadata: Option<serde_json::Value>) {
    let opts = SaveOptions { chunk_bytes: 4096, metadata, overwrite: true, ..Default::default() };
    save(t, p, &opts).unwrap();
}

fn signed(k: &SigningKey) -> LoadOptions {
    LoadOptions { signed_by: Some(by(k)), ..Default::default() }
}

fn kind<T: std::fmt::Debug>(r: Result<T>) -> String {
    r.expect_err("refused").kind().to_string()
}

fn pack_of(dir: &Path) -> std::path::PathBuf {
    std::fs::read_dir(dir.join("packs")).unwrap().next().unwrap().unwrap().path()
}

#[test]
fn a_signed_tree_loads_and_every_entry_point_checks_first() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("ckpt");
    let p = p.to_str().unwrap();
    let t = tree(1);
    save_at(&t, p, Some(serde_json::json!({"run": 7})));
    let k = key(1);
    let info = sign::sign(p, &k, &SignOptions { tree_version: Some(3), ..Default::default() }).unwrap();
    assert!(info.file.ends_with("ckpt/treepack.sig"), "{}", info.file);
    assert_eq!(info.claims.root, root_hash(p).unwrap());
    assert_eq!(info.claims.name, "ckpt");
    // Every load path: whole, selected, one subtree, a lazy reader's check.
    assert!(load(p, &signed(&k)).unwrap().exact_eq(&t));
    let sel = LoadOptions { select: vec!["params/b".into()], ..signed(&k) };
    assert!(load(p, &sel).is_ok());
    let r = open(p).unwrap();
    assert!(block_on(r.get_async("params/w", &signed(&k))).is_ok());
    let v = block_on(r.verify_signature_async(&by(&k))).unwrap();
    assert!(v.trusted && v.mismatch.is_none());
    assert_eq!(v.claims.tree_version, Some(3));
    assert_eq!(v.signer.unwrap(), k.verifying_key());
    // Any one of several trusted keys.
    let two = SignedBy::keys([key(9).verifying_key(), k.verifying_key()]);
    assert!(sign::verify_signature(p, &two).is_ok());
    // What inspect sees without a trusted key: who, and that it holds.
    let s = sign::signature(p).unwrap().unwrap();
    assert!(!s.trusted && s.mismatch.is_none());
    assert_eq!(s.signer.unwrap().fingerprint(), k.verifying_key().fingerprint());
}

#[test]
fn unsigned_other_key_and_resigned_trees_are_refused_before_any_data() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("ckpt");
    let p = p.to_str().unwrap();
    save_at(&tree(1), p, None);
    let (k, other) = (key(1), key(2));
    // Unsigned: every path refuses, naming where the signature would be; the packs are not read.
    let e = load(p, &signed(&k)).unwrap_err();
    assert_eq!(e.kind(), "unsigned");
    assert!(e.to_string().contains("treepack.sig") && e.to_string().contains("treepack sign"), "{e}");
    std::fs::remove_dir_all(d.path().join("ckpt/packs")).unwrap();
    let sel = LoadOptions { select: vec!["params/w".into()], ..signed(&k) };
    assert_eq!(kind(load(p, &sel)), "unsigned");
    // Signed by another key; then re-signed by an attacker over a tree they changed.
    save_at(&tree(1), p, None);
    sign::sign(p, &other, &SignOptions::default()).unwrap();
    let e = load(p, &signed(&k)).unwrap_err();
    assert_eq!(e.kind(), "untrusted_signer", "{e}");
    assert!(e.to_string().contains(&other.verifying_key().fingerprint()[..16]), "{e}");
    sign::sign(p, &k, &SignOptions::default()).unwrap();
    save_at(&tree(2), p, None);
    sign::sign(p, &other, &SignOptions::default()).unwrap();
    assert_eq!(kind(load(p, &signed(&k))), "untrusted_signer");
}

/// The manifest's bytes edited by `edit` and sealed again (a checksum holds: what refuses the
/// edit is the signature).
fn reseal(dir: &Path, edit: impl Fn(String) -> String) {
    let f = dir.join("treepack.json");
    let b = std::fs::read(&f).unwrap();
    let body = String::from_utf8(b[..b.len() - 86].to_vec()).unwrap();
    let edited = edit(body.clone());
    assert_ne!(edited, body, "the edit changed nothing");
    std::fs::write(&f, seal(edited.as_bytes())).unwrap();
}

/// The manifest text with the first digit of its first chunk hash changed.
fn flip_first_hash(s: String) -> String {
    let at = s.find("\"blake3\":\"").unwrap() + 10;
    let c = if &s[at..=at] == "0" { "1" } else { "0" };
    format!("{}{c}{}", &s[..at], &s[at + 1..])
}

#[test]
fn tampering_with_the_manifest_the_packs_or_the_envelope_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("ckpt");
    let p = dir.to_str().unwrap();
    let t = tree(1);
    let k = key(1);
    let fresh = || {
        save_at(&t, p, Some(serde_json::json!({"lr": 0.1})));
        sign::sign(p, &k, &SignOptions::default()).unwrap();
    };
    // A flipped byte in the manifest: its own checksum refuses it, before the signature.
    fresh();
    let f = dir.join("treepack.json");
    let mut b = std::fs::read(&f).unwrap();
    b[40] ^= 1;
    std::fs::write(&f, &b).unwrap();
    assert!(load(p, &signed(&k)).is_err());
    // An edit that keeps the manifest's checksum: a chunk hash (the root changes), the metadata,
    // the format version — each a signature mismatch saying what changed.
    for (edit, needle) in [
        (Box::new(flip_first_hash) as Box<dyn Fn(String) -> String>, "root hash"),
        (Box::new(|s: String| s.replace("{\"lr\":0.1}", "{\"lr\":9.9}")), "metadata changed"),
        (Box::new(|s: String| s.replacen("\"version\":[1,", "\"version\":[1,9", 1)), "format version"),
    ] {
        fresh();
        reseal(&dir, edit);
        let e = load(p, &signed(&k)).unwrap_err();
        assert_eq!(e.kind(), "signature_mismatch", "{e}");
        assert!(e.to_string().contains(needle), "{needle}: {e}");
    }
    // A flipped byte in a pack: the signature holds (the manifest is the signed one) and the
    // chunk read is refused against it; a leaf elsewhere still loads.
    fresh();
    let pack = pack_of(&dir);
    let mut b = std::fs::read(&pack).unwrap();
    b[100] ^= 0x40;
    std::fs::write(&pack, &b).unwrap();
    assert_eq!(kind(load(p, &signed(&k))), "chunk_corrupt");
    let sel = LoadOptions { select: vec!["step".into()], ..signed(&k) };
    assert!(load(p, &sel).is_ok());
    // Every byte of the envelope flipped in turn: refused, or (a flip in the unauthenticated
    // key id, hint or media type's tail) the very tree comes back. Never another tree.
    fresh();
    let sig_file = dir.join("treepack.sig");
    let good = std::fs::read(&sig_file).unwrap();
    let (mut refused, mut harmless) = (0, 0);
    for i in 0..good.len() {
        let mut b = good.clone();
        b[i] ^= 0x01;
        std::fs::write(&sig_file, &b).unwrap();
        match sign::verify_signature(p, &by(&k)) {
            Err(e) => {
                assert!(
                    ["invalid_signature", "untrusted_signer", "signature_mismatch"].contains(&e.kind()),
                    "byte {i}: {e}"
                );
                refused += 1;
            }
            Ok(info) => {
                assert_eq!(info.claims.root, root_hash(p).unwrap());
                harmless += 1;
            }
        }
    }
    assert!(refused > good.len() * 3 / 4, "{refused} refused, {harmless} harmless");
    // The signature bytes themselves altered: it names the trusted key but does not verify.
    let text = String::from_utf8(good.clone()).unwrap();
    let at = text.find("\"sig\":\"").unwrap() + 8;
    let mut b = good.clone();
    b[at] = if b[at] == b'A' { b'B' } else { b'A' };
    std::fs::write(&sig_file, &b).unwrap();
    let e = sign::verify_signature(p, &by(&k)).unwrap_err();
    assert_eq!(e.kind(), "invalid_signature", "{e}");
    assert!(e.to_string().contains("altered"), "{e}");
}

#[test]
fn another_trees_envelope_does_not_sign_this_one() {
    let d = tempfile::tempdir().unwrap();
    let (a, b) = (d.path().join("a"), d.path().join("b"));
    let (pa, pb) = (a.to_str().unwrap(), b.to_str().unwrap());
    let k = key(1);
    save_at(&tree(1), pa, None);
    save_at(&tree(2), pb, None);
    sign::sign(pa, &k, &SignOptions::default()).unwrap();
    sign::sign(pb, &k, &SignOptions::default()).unwrap();
    std::fs::copy(a.join("treepack.sig"), b.join("treepack.sig")).unwrap();
    let e = load(pb, &signed(&k)).unwrap_err();
    assert_eq!(e.kind(), "signature_mismatch");
    assert!(e.to_string().contains("another tree's signature"), "{e}");
}

#[test]
fn cp_between_layouts_keeps_the_signature() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("ckpt");
    let src = src.to_str().unwrap();
    let t = tree(3);
    save_at(&t, src, Some(serde_json::json!({"note": "carried"})));
    let k = p256(5);
    sign::sign(src, &k, &SignOptions { tree_version: Some(1), ..Default::default() }).unwrap();
    // What `treepack cp` does: load, keep the chunk grids, save with the metadata, carry.
    let copy = |from: &str, to: &str| {
        let r = open(from).unwrap();
        let mut n = r.load(&LoadOptions::default()).unwrap();
        save::keep_chunk_shapes(&mut n, &r.manifest().root);
        let opts = SaveOptions { metadata: r.manifest().metadata.clone(), overwrite: true, ..Default::default() };
        save(&n, to, &opts).unwrap();
        sign::copy_signature(&Location::parse(from).unwrap(), &Location::parse(to).unwrap()).unwrap()
    };
    let tpk = d.path().join("c.tpk");
    let tpk = tpk.to_str().unwrap();
    let mem = "memory://signing-cp/copy";
    assert_eq!(copy(src, tpk), Carried::Copied);
    assert!(Path::new(&format!("{tpk}.sig")).exists());
    assert_eq!(copy(tpk, mem), Carried::Copied);
    assert_eq!(copy(mem, "memory://signing-cp/copy.tpk"), Carried::Copied);
    for p in [tpk, mem, "memory://signing-cp/copy.tpk"] {
        assert!(load(p, &signed(&k)).unwrap().exact_eq(&t), "{p}");
    }
    // A copy that is another tree (other metadata) does not get the signature; an unsigned
    // source leaves no stale signature at the destination.
    let r = open(src).unwrap();
    let mut n = r.load(&LoadOptions::default()).unwrap();
    save::keep_chunk_shapes(&mut n, &r.manifest().root);
    save(&n, tpk, &SaveOptions { overwrite: true, ..Default::default() }).unwrap();
    let carried = sign::copy_signature(&Location::parse(src).unwrap(), &Location::parse(tpk).unwrap()).unwrap();
    assert!(matches!(carried, Carried::NotCarried(ref why) if why.contains("metadata")), "{carried:?}");
    std::fs::remove_file(d.path().join("ckpt/treepack.sig")).unwrap();
    let carried = sign::copy_signature(&Location::parse(src).unwrap(), &Location::parse(tpk).unwrap()).unwrap();
    assert_eq!(carried, Carried::Unsigned);
    assert!(!Path::new(&format!("{tpk}.sig")).exists());
    Location::forget_memory("signing-cp");
}

#[test]
fn repository_trees_are_signed_by_name_and_rollback_is_caught_by_what_the_caller_knows() {
    let d = tempfile::tempdir().unwrap();
    let loc = d.path().join("runs");
    let repo = Repository::create(loc.to_str().unwrap()).unwrap();
    let k = key(1);
    let at = |s: u64| Some(UNIX_EPOCH + Duration::from_secs(s));
    repo.save(&tree(1), "step-1", &SaveOptions::default()).unwrap();
    repo.save(&tree(2), "step-2", &SaveOptions::default()).unwrap();
    repo.save(&tree(3), "step-3", &SaveOptions::default()).unwrap();
    let name = |n: &str| format!("{}@{n}", loc.display());
    let root2 = root_hash(name("step-2")).unwrap();
    let v1 = SignOptions { tree_version: Some(1), signed_at: at(1_000_000), ..Default::default() };
    let v2 = SignOptions { tree_version: Some(2), signed_at: at(2_000_000), ..Default::default() };
    sign::sign(name("step-1"), &k, &v1).unwrap();
    let info = sign::sign(name("step-2"), &k, &v2).unwrap();
    assert!(info.file.ends_with("signatures/step-2.sig"), "{}", info.file);
    assert_eq!(info.claims.name, "step-2");
    assert!(repo.load("step-2", &signed(&k)).unwrap().exact_eq(&tree(2)));
    assert_eq!(kind(repo.load("step-3", &signed(&k))), "unsigned");
    // step-1's signature put in step-3's place: another tree's.
    std::fs::copy(loc.join("signatures/step-1.sig"), loc.join("signatures/step-3.sig")).unwrap();
    assert_eq!(kind(repo.load("step-3", &signed(&k))), "signature_mismatch");
    // Rollback: step-2's ref pointed back at step-1's tree, with step-1's own valid signature.
    std::fs::copy(loc.join("refs/step-1.json"), loc.join("refs/step-2.json")).unwrap();
    std::fs::copy(loc.join("signatures/step-1.sig"), loc.join("signatures/step-2.sig")).unwrap();
    // A signature alone cannot tell: it is a valid signature of a tree the key signed.
    assert!(repo.load("step-2", &signed(&k)).unwrap().exact_eq(&tree(1)));
    // What the caller knows catches it: the root it expects, the least tree version, the date.
    let exact = LoadOptions { expect_root: Some(root2), ..signed(&k) };
    assert_eq!(kind(repo.load("step-2", &exact)), "root_mismatch");
    for policy in [SignedBy { min_version: Some(2), ..by(&k) }, SignedBy { not_before: at(1_500_000), ..by(&k) }] {
        let e = repo.load("step-2", &LoadOptions { signed_by: Some(policy), ..Default::default() }).unwrap_err();
        assert_eq!(e.kind(), "signature_mismatch");
        assert!(e.to_string().contains("rolled back"), "{e}");
    }
    // A signature with no tree version cannot satisfy min_version.
    sign::sign(name("step-3"), &k, &SignOptions::default()).unwrap();
    let e = repo
        .load(
            "step-3",
            &LoadOptions { signed_by: Some(SignedBy { min_version: Some(1), ..by(&k) }), ..Default::default() },
        )
        .unwrap_err();
    assert!(e.to_string().contains("no tree version"), "{e}");
    // Deleting a name deletes its signature.
    repo.delete("step-3").unwrap();
    assert!(!loc.join("signatures/step-3.sig").exists());
}

#[test]
fn keys_from_pem_files_and_what_is_refused() {
    let d = tempfile::tempdir().unwrap();
    for k in [key(3), p256(3)] {
        let f = d.path().join("k.pem");
        std::fs::write(&f, k.to_pem().unwrap()).unwrap();
        let back = sign::read_signing_key(&f).unwrap();
        assert_eq!(back.verifying_key(), k.verifying_key());
        let pubf = d.path().join("k.pub.pem");
        std::fs::write(&pubf, k.verifying_key().to_pem()).unwrap();
        assert_eq!(sign::read_verifying_key(&pubf).unwrap(), k.verifying_key());
        // The private file checks too (its public half).
        assert_eq!(sign::read_verifying_key(&f).unwrap(), k.verifying_key());
        let e = sign::read_signing_key(&pubf).unwrap_err();
        assert_eq!(e.kind(), "bad_key");
        assert!(e.to_string().contains("public key"), "{e}");
    }
    // A SEC1 P-256 key (`openssl ecparam -genkey`), an encrypted key, another algorithm.
    let sec1 = "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIFPuLK/UL7P0hE+VSc5f1KefTZRjB382E0EbmCu8yhK+oAoGCCqGSM49\nAwEHoUQDQgAEHoOzHn7Ogd4KvXC1jCVqkMekblJWv6v7J54Ej1Ob7USUtKl28LE8\ntATPgqgknqXH51DMnHBZFoyp3AsUaCUK8w==\n-----END EC PRIVATE KEY-----\n";
    assert_eq!(SigningKey::from_pem(sec1).unwrap().algorithm(), Algorithm::P256);
    let enc = "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIB\n-----END ENCRYPTED PRIVATE KEY-----\n";
    assert!(SigningKey::from_pem(enc).unwrap_err().contains("encrypted"));
    let rsa = "-----BEGIN RSA PRIVATE KEY-----\nMIIB\n-----END RSA PRIVATE KEY-----\n";
    assert!(SigningKey::from_pem(rsa).unwrap_err().contains("Ed25519 or ECDSA P-256"));
    assert!(VerifyingKey::from_pem("not a key").is_err());
    // Fingerprints are model-signing's key hint: SHA-256 of the public PEM text.
    let k = p256(3).verifying_key();
    assert_eq!(k.fingerprint().len(), 64);
    assert_ne!(k.fingerprint(), key(3).verifying_key().fingerprint());
}

#[test]
fn a_single_file_signature_is_a_sidecar_and_a_read_only_place_cannot_be_signed() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("m.tpk");
    let p = p.to_str().unwrap();
    save_at(&tree(4), p, None);
    let k = key(4);
    sign::sign(p, &k, &SignOptions::default()).unwrap();
    assert!(Path::new(&format!("{p}.sig")).exists());
    assert!(load(p, &signed(&k)).is_ok());
    // Truncating the .tpk: refused before the signature is looked at, or by it.
    let f = std::fs::read(p).unwrap();
    std::fs::write(p, &f[..f.len() - 100]).unwrap();
    assert!(load(p, &signed(&k)).is_err());
    // A tree read from another tool's file has no signature of its own.
    let st = d.path().join("x.safetensors");
    let header = br#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}     "#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header);
    bytes.extend_from_slice(&1f32.to_le_bytes());
    std::fs::write(&st, bytes).unwrap();
    let e = sign::sign(st.to_str().unwrap(), &k, &SignOptions::default()).unwrap_err();
    assert_eq!(e.kind(), "bad_location", "{e}");
}

#[test]
fn signing_reads_no_array_data_and_a_check_reads_one_small_file() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("ckpt");
    let p = p.to_str().unwrap();
    save_at(&tree(5), p, None);
    let k = key(5);
    std::fs::remove_dir_all(d.path().join("ckpt/packs")).unwrap();
    sign::sign(p, &k, &SignOptions::default()).unwrap();
    let r = open(p).unwrap();
    r.location().stats().reset();
    block_on(r.verify_signature_async(&by(&k))).unwrap();
    assert_eq!(r.location().stats().read_requests(), 1, "the signature file only");
}

/// `tests/golden/signing/`: fixed keys and the signature of `tests/golden/demo` (docs/format.md
/// section 12). Signing is deterministic (Ed25519; ECDSA with RFC 6979 nonces), so the files
/// are reproduced byte for byte (`TREEPACK_BLESS=1` rewrites them). One signature holds for the
/// demo tree in all four golden layouts: the root hash does not depend on the layout or codecs.
#[test]
fn golden_signatures_are_reproduced_and_hold_in_every_layout() {
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden");
    let dir = golden.join("signing");
    let keys = [("ed25519", key(42)), ("p256", p256(42))];
    let opts = SignOptions {
        tree_version: Some(1),
        name: Some("demo".into()),
        signed_at: Some(UNIX_EPOCH + Duration::from_secs(1_795_000_000)),
        ..Default::default()
    };
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join("demo.tpk");
    std::fs::copy(golden.join("demo.tpk"), &copy).unwrap();
    let copy = copy.to_str().unwrap();
    for (alg, k) in &keys {
        let made = sign::sign(copy, k, &opts).unwrap();
        let bytes = std::fs::read(format!("{copy}.sig")).unwrap();
        let (priv_file, pub_file, sig_file) =
            (dir.join(format!("{alg}.pem")), dir.join(format!("{alg}.pub.pem")), dir.join(format!("demo.{alg}.sig")));
        if std::env::var_os("TREEPACK_BLESS").is_some() {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&priv_file, k.to_pem().unwrap()).unwrap();
            std::fs::write(&pub_file, k.verifying_key().to_pem()).unwrap();
            std::fs::write(&sig_file, &bytes).unwrap();
        }
        assert_eq!(std::fs::read(&sig_file).unwrap(), bytes, "{alg}: re-bless with TREEPACK_BLESS=1");
        assert_eq!(sign::read_signing_key(&priv_file).unwrap().verifying_key(), k.verifying_key());
        let trusted = SignedBy::keys([sign::read_verifying_key(&pub_file).unwrap()]);
        assert_eq!(made.claims.root.to_hex(), "146c2c6856389c807c2b4773d07a333deab7b2cc03111df931f56f2e5781dab4");
        for layout in ["demo", "demo.tpk", "demo-zstd.tpk", "demo-lz4"] {
            let target = tmp.path().join(format!("{alg}-{layout}"));
            let src = golden.join(layout);
            if src.is_dir() {
                std::fs::create_dir_all(target.join("packs")).unwrap();
                for f in files_of(&src) {
                    std::fs::copy(src.join(&f), target.join(&f)).unwrap();
                }
                std::fs::copy(&sig_file, target.join(sign::DIR_SIGNATURE)).unwrap();
            } else {
                std::fs::copy(&src, &target).unwrap();
                std::fs::copy(&sig_file, format!("{}.sig", target.display())).unwrap();
            }
            let t = target.to_str().unwrap();
            let info = sign::verify_signature(t, &trusted).unwrap_or_else(|e| panic!("{alg} {layout}: {e}"));
            assert_eq!(info.claims.tree_version, Some(1));
            assert_eq!(info.claims.name, "demo");
        }
    }
}

/// The files of a golden directory tree: its manifest and packs, relative paths.
fn files_of(dir: &Path) -> Vec<String> {
    let mut out = vec!["treepack.json".to_string()];
    for e in std::fs::read_dir(dir.join("packs")).unwrap() {
        out.push(format!("packs/{}", e.unwrap().file_name().to_string_lossy()));
    }
    out
}
