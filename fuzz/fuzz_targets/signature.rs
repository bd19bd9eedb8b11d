//! Signature files (format::signature, docs/format.md section 12): the envelope parser, the
//! statement decoder, the check against trusted keys, PEM and DER keys and UTC times must never
//! panic whatever the bytes; a statement that decodes encodes to one that decodes the same, and
//! one the trusted key signs verifies and says the same.
#![no_main]
use libfuzzer_sys::fuzz_target;
use treepack_format::signature::{self as sig, time, Algorithm, Check, Claims, SigningKey, VerifyingKey};

fn whole_seconds(mut c: Claims) -> Claims {
    c.signed_at_ms = c.signed_at_ms / 1000 * 1000;
    c
}

fuzz_target!(|data: &[u8]| {
    let ed = SigningKey::from_secret_bytes(Algorithm::Ed25519, &[7; 32]).expect("an Ed25519 key");
    let p256 = SigningKey::from_secret_bytes(Algorithm::P256, &[9; 32]).expect("a P-256 key");
    let trusted = [ed.verifying_key(), p256.verifying_key()];
    if let Ok(env) = sig::parse(data) {
        let _ = env.check(&trusted);
        if let Ok(c) = env.claims() {
            let _ = env.self_consistent(&c);
            let again = sig::decode_statement(&sig::encode_statement(&c)).expect("a re-encoded statement parses");
            assert_eq!(again, whole_seconds(c));
        }
    }
    // The bytes as a statement: one that decodes, signed by a trusted key, verifies.
    if let Ok(c) = sig::decode_statement(data) {
        let c = whole_seconds(c);
        for k in [&ed, &p256] {
            let env = sig::parse(&sig::sign(&c, k)).expect("a signature treepack writes parses");
            assert!(matches!(env.check(&trusted), Check::Verified { .. }));
            assert_eq!(env.claims().expect("its statement parses"), c);
        }
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = SigningKey::from_pem(text);
        let _ = VerifyingKey::from_pem(text);
        if let Ok(ms) = time::parse_utc(text) {
            assert_eq!(time::parse_utc(&time::format_utc(ms)), Ok(ms / 1000 * 1000));
        }
    }
    let _ = VerifyingKey::from_der(data);
});
