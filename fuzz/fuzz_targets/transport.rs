//! JSON transport documents (format::transport, crate::transport): reading any bytes as a
//! document never panics or allocates beyond what the document holds, and a document that
//! opens loads, verifies and exports again to a document with the same tree.
#![no_main]
use libfuzzer_sys::fuzz_target;
use treepack::transport::{export, open, ExportOptions};
use treepack::LoadOptions;

fuzz_target!(|data: &[u8]| {
    let Ok(r) = open(data) else { return };
    let _ = r.structure();
    let _ = r.verify();
    let Ok(tree) = r.load(&LoadOptions::default()) else { return };
    let again = export(r.location(), &ExportOptions::default()).expect("a loadable document exports");
    let back = open(again.as_bytes()).expect("an exported document opens");
    assert!(back.load(&LoadOptions::default()).expect("and loads").exact_eq(&tree));
    assert_eq!(back.root_hash(), r.root_hash());
});
