//! A repository's small files (format::repo): refs, pack indexes, the gc state, leases, the
//! marker and tree names. Parsing must never panic, and whatever parses must encode to bytes
//! that parse to the same value.
#![no_main]
use libfuzzer_sys::fuzz_target;
use treepack_format::repo::{check_marker, name_of_ref, validate_name, GcState, Lease, PackIndex, RefRecord};

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = RefRecord::decode(data) {
        assert_eq!(RefRecord::decode(&r.encode()).expect("an encoded ref parses"), r);
        assert!(r.tree_hash().is_some());
    }
    if let Ok(i) = PackIndex::decode(data) {
        assert_eq!(PackIndex::decode(&i.encode()).expect("an encoded index parses"), i);
        assert!(i.chunks.iter().all(|c| c.1 + c.2 <= i.size));
    }
    if let Ok(g) = GcState::decode(data) {
        assert_eq!(GcState::decode(&g.encode()).expect("an encoded gc state parses"), g);
    }
    if let Ok(l) = Lease::decode(data) {
        assert_eq!(Lease::decode(&l.encode()).expect("an encoded lease parses"), l);
    }
    let _ = check_marker(data);
    if let Ok(text) = std::str::from_utf8(data) {
        if validate_name(text).is_ok() {
            assert_eq!(name_of_ref(&format!("refs/{text}.json")), Some(text));
        }
    }
});
