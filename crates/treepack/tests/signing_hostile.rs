//! Hostile signature files (issue 55), in the style of `tests/hostile/`: each case is a signed
//! tree whose signature file an attacker replaced — huge, nested 100,000 deep, bad base64, the
//! wrong payload type, thousands of signatures, a statement its signer's key was made to sign
//! that is not a tree's, a link out of the location, a FIFO — checked in a child process with a
//! 10 s and 2 GiB limit (tests/support/child.rs) beside canary files that must not change. Each
//! must end in its typed error within a second, never a crash, a hang or a huge allocation, and
//! every reader of the signature must agree: a signed load, `verify_signature`, and
//! `signature` (what `inspect` shows).

#[path = "support/child.rs"]
mod child;

use child::Outside;
use std::path::Path;
use std::time::{Duration, Instant};
use treepack::format::signature::{self as sig, Algorithm, SigningKey};
use treepack::sign::{self, SignedBy};
use treepack::*;

fn key() -> SigningKey {
    SigningKey::from_secret_bytes(Algorithm::Ed25519, &[7; 32]).unwrap()
}

/// Standard base64 with padding (the engine has no base64 dependency of its own).
fn b64(b: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(b.len().div_ceil(3) * 4);
    for c in b.chunks(3) {
        let n =
            (u32::from(c[0]) << 16) | (u32::from(*c.get(1).unwrap_or(&0)) << 8) | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            out.push(if i <= c.len() { char::from(A[(n >> (18 - 6 * i)) as usize & 63]) } else { '=' });
        }
    }
    out
}

/// A bundle whose payload `payload` (of type `payload_type`) the trusted key really signed.
fn signed_bundle(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let s = key().sign(&sig::pae(payload_type, payload));
    format!(
        r#"{{"dsseEnvelope":{{"payload":"{}","payloadType":"{payload_type}","signatures":[{{"sig":"{}"}}]}}}}"#,
        b64(payload),
        b64(&s)
    )
    .into_bytes()
}

/// A statement as treepack writes one, with `edit` applied to its JSON text.
fn statement(edit: impl Fn(String) -> String) -> Vec<u8> {
    let root = "0".repeat(64);
    edit(format!(
        r#"{{"_type":"https://in-toto.io/Statement/v1","subject":[{{"name":"t","digest":{{"treepackRootBlake3":"{root}"}}}}],"predicateType":"https://treepack/signature/v1","predicate":{{"formatVersion":[1,4],"metadataBlake3":null,"signedAt":"2026-01-01T00:00:00Z"}}}}"#
    ))
    .into_bytes()
}

fn envelope(payload: &str, payload_type: &str, sigs: &str) -> Vec<u8> {
    format!(r#"{{"payload":"{payload}","payloadType":"{payload_type}","signatures":[{sigs}]}}"#).into_bytes()
}

/// What the case's signature file is.
enum Sig {
    Bytes(Vec<u8>),
    /// A symbolic link to the canary secret outside the location.
    LinkOut,
    Fifo,
    Folder,
}

struct Case {
    name: &'static str,
    kind: &'static str,
    sig: Sig,
}

fn cases() -> Vec<Case> {
    let good_payload = b64(&statement(|s| s));
    let deep = |n: usize| "[".repeat(n) + &"]".repeat(n);
    let many_sigs = vec![r#"{"sig":"AAAA"}"#; 10_000].join(",");
    let c = |name, kind, b: Vec<u8>| Case { name, kind, sig: Sig::Bytes(b) };
    vec![
        c("empty", "invalid_signature", vec![]),
        c("not-json", "invalid_signature", b"\xff\xfe not json at all".to_vec()),
        c("huge", "invalid_signature", vec![b' '; (sig::MAX_ENVELOPE_BYTES + 1) as usize]),
        c("huge-whitespace-below-limit", "invalid_signature", {
            let mut b = vec![b' '; (sig::MAX_ENVELOPE_BYTES - 2) as usize];
            b.extend_from_slice(b"{}");
            b
        }),
        c("deep-json", "invalid_signature", deep(100_000).into_bytes()),
        c("deep-bundle", "invalid_signature", format!(r#"{{"dsseEnvelope":{}}}"#, deep(100_000)).into_bytes()),
        c("deep-objects", "invalid_signature", ("{\"a\":".repeat(100_000) + "1" + &"}".repeat(100_000)).into_bytes()),
        c(
            "bad-base64-payload",
            "invalid_signature",
            envelope("%%%not base64%%%", sig::PAYLOAD_TYPE, r#"{"sig":"AAAA"}"#),
        ),
        c("bad-base64-sig", "invalid_signature", envelope(&good_payload, sig::PAYLOAD_TYPE, r#"{"sig":"@@@@"}"#)),
        c("wrong-payload-type", "invalid_signature", envelope(&good_payload, "text/plain", r#"{"sig":"AAAA"}"#)),
        c("no-signatures", "invalid_signature", envelope(&good_payload, sig::PAYLOAD_TYPE, "")),
        c("ten-thousand-signatures", "invalid_signature", envelope(&good_payload, sig::PAYLOAD_TYPE, &many_sigs)),
        c("huge-signature", "untrusted_signer", {
            let big = b64(&vec![7u8; 2 << 20]);
            envelope(&good_payload, sig::PAYLOAD_TYPE, &format!(r#"{{"sig":"{big}"}}"#))
        }),
        c("hostile-keyid", "untrusted_signer", {
            let id = "\\u001b[31m".repeat(50_000);
            envelope(&good_payload, sig::PAYLOAD_TYPE, &format!(r#"{{"sig":"AAAA","keyid":"{id}"}}"#))
        }),
        c(
            "bundle-of-another-media-type",
            "invalid_signature",
            br#"{"mediaType":"application/x-other","dsseEnvelope":{}}"#.to_vec(),
        ),
        // Payloads the trusted key was made to sign: parsed only after it verified, and refused.
        c("signed-deep-payload", "invalid_signature", signed_bundle(sig::PAYLOAD_TYPE, deep(100_000).as_bytes())),
        c("signed-not-a-statement", "invalid_signature", signed_bundle(sig::PAYLOAD_TYPE, b"{\"hello\":1}")),
        c(
            "signed-two-subjects",
            "invalid_signature",
            signed_bundle(
                sig::PAYLOAD_TYPE,
                &statement(|s| s.replace("\"subject\":[{", "\"subject\":[{\"name\":\"x\",\"digest\":{}},{")),
            ),
        ),
        c(
            "signed-sha256-subject-only",
            "invalid_signature",
            signed_bundle(sig::PAYLOAD_TYPE, &statement(|s| s.replace("treepackRootBlake3", "sha256"))),
        ),
        c(
            "signed-no-metadata-binding",
            "invalid_signature",
            signed_bundle(sig::PAYLOAD_TYPE, &statement(|s| s.replace("\"metadataBlake3\":null,", ""))),
        ),
        c(
            "signed-bad-time",
            "invalid_signature",
            signed_bundle(sig::PAYLOAD_TYPE, &statement(|s| s.replace("2026-01-01T00:00:00Z", "yesterday"))),
        ),
        c("signed-another-root", "signature_mismatch", signed_bundle(sig::PAYLOAD_TYPE, &statement(|s| s))),
        Case { name: "link-out", kind: "link", sig: Sig::LinkOut },
        Case { name: "fifo", kind: "io", sig: Sig::Fifo },
        Case { name: "folder", kind: "io", sig: Sig::Folder },
    ]
}

/// Write the case: a signed tree at `loc`, its signature file replaced.
fn write_case(out: &Outside, c: &Case) {
    let loc = out.loc.to_str().unwrap();
    let t = Node::dict([("w", Node::from(ArrayData::new(DType::F32, vec![4], vec![0u8; 16]).unwrap()))]);
    save(&t, loc, &SaveOptions::default()).unwrap();
    sign::sign(loc, &key(), &SignOptions::default()).unwrap();
    let f = out.loc.join(sign::DIR_SIGNATURE);
    std::fs::remove_file(&f).unwrap();
    match &c.sig {
        Sig::Bytes(b) => std::fs::write(&f, b).unwrap(),
        Sig::LinkOut => std::os::unix::fs::symlink(out.outside.join("secret.txt"), &f).unwrap(),
        Sig::Fifo => {
            let p = std::ffi::CString::new(f.to_str().unwrap()).unwrap();
            // SAFETY: a NUL-terminated path; mkfifo touches nothing else.
            assert_eq!(unsafe { libc::mkfifo(p.as_ptr(), 0o644) }, 0);
        }
        Sig::Folder => std::fs::create_dir(&f).unwrap(),
    }
}

/// In the child: every reader of the signature, each outcome on one line, with its time.
fn read_every_way(dir: &Path) {
    let p = dir.to_str().unwrap();
    let by = SignedBy::keys([key().verifying_key()]);
    let t = Instant::now();
    let outcomes = [
        child::outcome(load(p, &LoadOptions { signed_by: Some(by.clone()), ..Default::default() })),
        child::outcome(sign::verify_signature(p, &by)),
        child::outcome(sign::signature(p)),
    ];
    println!("{} || took {} ms", outcomes.join(" || "), t.elapsed().as_millis());
}

#[test]
fn hostile_signature_files_end_in_their_typed_errors() {
    if let Some(dir) = child::case() {
        return read_every_way(&dir);
    }
    for c in cases() {
        let out = Outside::new();
        write_case(&out, &c);
        let got = child::run("hostile_signature_files_end_in_their_typed_errors", &out.loc);
        let parts: Vec<&str> = got.split(" || ").collect();
        assert_eq!(parts.len(), 4, "{}: {got}", c.name);
        // The signed load and the check refuse with the case's kind; `signature` (inspect) too,
        // unless the bytes parse as a statement it can show (a valid signature over another root).
        let want = format!("outcome error {}:", c.kind);
        assert!(parts[0].starts_with(&want), "{}: load: {}", c.name, parts[0]);
        assert!(parts[1].trim_start_matches("outcome ").starts_with(&want[8..]), "{}: verify: {}", c.name, parts[1]);
        let shown_ok = ["signed-another-root", "huge-signature", "hostile-keyid"].contains(&c.name);
        assert!(shown_ok || parts[2].contains("error"), "{}: signature(): {}", c.name, parts[2]);
        // Messages stay messages: a 1 MiB key id is cut, not echoed.
        assert!(got.len() < 4000, "{}: {} bytes of output", c.name, got.len());
        let ms: u64 = parts[3].trim().trim_start_matches("took ").trim_end_matches(" ms").parse().unwrap();
        assert!(Duration::from_millis(ms) < Duration::from_secs(1), "{}: took {ms} ms", c.name);
        out.assert_unchanged();
    }
}
