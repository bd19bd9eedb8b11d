//! Compressed manifests (format 1.6): arbitrary bytes given the zstd magic, unpacked as a
//! reader unpacks a stored manifest — an error or JSON beginning with `{`, never a panic or
//! more than the manifest limit — and a manifest body packed then unpacked comes back whole.
#![no_main]
use libfuzzer_sys::fuzz_target;
use treepack_format::manifest;

fuzz_target!(|data: &[u8]| {
    let framed = [&manifest::ZSTD_MAGIC[..], data].concat();
    if let Ok(json) = manifest::unpack(bytes::Bytes::from(framed), "fuzz") {
        assert!(json.starts_with(b"{"), "unpacked bytes that are not a JSON object");
        let _ = manifest::decode(&json, "fuzz");
    }
    let body = [b"{".as_slice(), data].concat();
    let packed = manifest::pack(vec![bytes::Bytes::from(body.clone())], 1);
    if manifest::is_packed(&packed[0]) {
        let back = manifest::unpack(packed[0].clone(), "fuzz").expect("what was packed unpacks");
        assert_eq!(back.as_ref(), body.as_slice());
    }
});
