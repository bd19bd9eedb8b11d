//! Encrypted objects (format 1.7): arbitrary bytes read as an encrypted object — its trailer,
//! envelope and header parsed, its segments opened — an error or the plain bytes, never a panic,
//! a hang or an allocation beyond the object's size; and arbitrary plain bytes sealed then
//! opened come back whole, while any flipped stored byte fails.
#![no_main]
use libfuzzer_sys::fuzz_target;
use treepack_format::crypt::{self, DataKey, KeyInfo, KeySource, ObjectKey, Params};

fuzz_target!(|data: &[u8]| {
    let n = data.len() as u64;
    if let Ok(e) = crypt::trailer_envelope_len(data, n) {
        let end = data.len() - crypt::TRAILER_LEN as usize;
        if let Ok((env, params)) = crypt::parse_envelope(&data[end - e as usize..end]) {
            // Argon2id within bounds can still take a second: the fuzzer derives only cheap ones.
            let cheap = match &env.key {
                KeyInfo::Passphrase { m_kib, t, .. } => *m_kib <= 64 && *t <= 2,
                _ => true,
            };
            if cheap {
                let _ = crypt::open_envelope(&KeySource::Key([7; 32]), &env, params);
                let _ = crypt::open_envelope(&KeySource::Passphrase("p".into()), &env, params);
            }
        }
        if let Ok(params) = Params::from_header(data) {
            if let Ok(plain) = params.plain_len(n, e) {
                assert!(plain <= n, "a plain size larger than the stored object");
                let key = ObjectKey::new(&DataKey([1; 32]), params, "fuzz");
                let mut out = vec![0u8; plain as usize];
                let _ = key.open(0, &data[crypt::HEADER_LEN as usize..], plain, &mut out);
            }
        }
    }
    let _ = crypt::describe_stored(data);
    // Seal and open: the bytes come back; one flipped byte is refused.
    let params = Params { cipher: crypt::AES_256_GCM, segment: 4096 };
    let key = ObjectKey::new(&DataKey([2; 32]), params, "packs/x.tpp");
    let sealed = key.seal(&[bytes::Bytes::copy_from_slice(data)], b"");
    let mut out = vec![0u8; data.len()];
    key.open(0, &sealed[16..], n, &mut out).expect("what was sealed opens");
    assert_eq!(out, data);
    let mut bad = sealed.clone();
    let at = 16 + (data.first().copied().unwrap_or(0) as usize) % (sealed.len() - 32);
    bad[at] ^= 1;
    assert!(key.open(0, &bad[16..], n, &mut out).is_err(), "a flipped byte was accepted");
});
