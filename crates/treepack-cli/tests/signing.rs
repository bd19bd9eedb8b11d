//! Signed trees on the command line (issue 55, docs/signing.md): keygen, sign, inspect, verify
//! --signed-by, and cp carrying a signature from a directory to a .tpk and into a repository.

use assert_cmd::Command;

fn tp() -> Command {
    Command::cargo_bin("treepack").unwrap()
}

/// (exit code, stdout, stderr).
fn run(args: &[&str]) -> (i32, String, String) {
    let out = tp().args(args).output().unwrap();
    let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
    (out.status.code().unwrap_or(-1), text(out.stdout), text(out.stderr))
}

fn run_ok(args: &[&str]) -> String {
    let (code, out, err) = run(args);
    assert_eq!(code, 0, "{args:?} failed: {err}{out}");
    out
}

#[test]
fn keygen_sign_inspect_verify_and_cp_carry_the_signature() {
    let d = tempfile::tempdir().unwrap();
    let p = |n: &str| d.path().join(n).to_str().unwrap().to_string();
    let (ckpt, key, public) = (p("ckpt"), p("release.pem"), p("release.pub.pem"));
    run_ok(&["demo", &ckpt]);
    let made = run_ok(&["keygen", &key]);
    assert!(made.contains("release.pub.pem") && made.contains("ed25519 key"), "{made}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&key).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "the private key is readable by others: {mode:o}");
    }
    assert_ne!(run(&["keygen", &key]).0, 0, "keygen replaced a key without --overwrite");
    let (other, other_pub) = (p("other.pem"), p("other.pub.pem"));
    run_ok(&["keygen", &other, "--algorithm", "ecdsa-p256"]);

    let before = run_ok(&["inspect", &ckpt, "--max-lines", "1"]);
    assert!(before.contains("signature: none"), "{before}");
    let signed = run_ok(&["sign", &ckpt, "--key", &key, "--tree-version", "3"]);
    assert!(signed.contains("treepack.sig") && signed.contains("tree version 3"), "{signed}");
    let shown = run_ok(&["inspect", &ckpt, "--max-lines", "1"]);
    assert!(shown.contains("signature: signed by ed25519") && shown.contains("holds for this tree"), "{shown}");
    let j: serde_json::Value = serde_json::from_str(&run_ok(&["inspect", &ckpt, "--json"])).unwrap();
    assert_eq!(j["signature"]["algorithm"], "ed25519");
    assert_eq!(j["signature"]["tree_version"], 3);
    assert_eq!(j["signature"]["trusted"], false);

    let ok = run_ok(&["verify", &ckpt, "--signed-by", &public]);
    assert!(ok.contains("signature OK") && ok.contains("OK: "), "{ok}");
    let (code, out, _) = run(&["verify", &ckpt, "--signed-by", &other_pub]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("SIGNATURE REFUSED") && out.contains("not by a trusted key"), "{out}");
    let (code, out, _) = run(&["verify", &ckpt, "--signed-by", &public, "--min-version", "4"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("older than min_version 4"), "{out}");
    let (code, out, _) = run(&["verify", &ckpt, "--signed-by", &other_pub, "--signed-by", &public, "--json"]);
    assert_eq!(code, 0, "{out}");
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["signature_ok"], true);

    // cp: a directory to a .tpk to a repository's name; each copy is signed as the source was.
    let (tpk, repo) = (p("copy.tpk"), p("runs"));
    let copied = run_ok(&["cp", "-q", &ckpt, &tpk]);
    assert!(copied.contains("signature carried"), "{copied}");
    assert!(std::path::Path::new(&format!("{tpk}.sig")).exists());
    run_ok(&["repo", "init", &repo]);
    let named = format!("{repo}@step-3");
    let copied = run_ok(&["cp", "-q", &tpk, &named]);
    assert!(copied.contains("signature carried"), "{copied}");
    for loc in [&tpk, &named] {
        let out = run_ok(&["verify", loc, "--signed-by", &public, "--min-version", "3"]);
        assert!(out.contains("signature OK"), "{loc}: {out}");
    }
    // A tampered pack: the signature holds (the manifest is the one signed), the chunk does not.
    let packs = d.path().join("ckpt/packs");
    let pack = std::fs::read_dir(&packs).unwrap().next().unwrap().unwrap().path();
    let mut b = std::fs::read(&pack).unwrap();
    b[0] ^= 0xff;
    std::fs::write(&pack, b).unwrap();
    let (code, out, _) = run(&["verify", &ckpt, "--signed-by", &public]);
    assert_eq!(code, 1);
    assert!(out.contains("signature OK") && out.contains("CORRUPT"), "{out}");
    // Keys that are not keys, and a key file that is not there: errors that say so (exit 2).
    let (code, _, err) = run(&["sign", &ckpt, "--key", &public]);
    assert_eq!(code, 2);
    assert!(err.contains("public key"), "{err}");
    let (code, _, err) = run(&["verify", &ckpt, "--signed-by", &p("missing.pem")]);
    assert_eq!(code, 2);
    assert!(err.contains("missing.pem"), "{err}");
}
