//! Merging the parts of a save written by several processes (format::parts). The input is two
//! or more manifest bodies separated by NUL bytes; each is sealed and decoded, and the decoded
//! ones are merged: the merge must never panic, and what it accepts must encode to a manifest
//! that decodes again.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let parts: Vec<_> = data
        .split(|&b| b == 0)
        .take(8)
        .filter_map(|body| treepack_format::manifest::decode(&treepack_format::manifest::seal(body), "fuzz").ok())
        .collect();
    if parts.is_empty() {
        return;
    }
    if let Ok(m) = treepack_format::parts::merge(parts) {
        let again = treepack_format::manifest::encode(&m, &serde_json::Value::Null);
        treepack_format::manifest::decode(&again, "merged").expect("a merged manifest encodes to a valid one");
    }
});
