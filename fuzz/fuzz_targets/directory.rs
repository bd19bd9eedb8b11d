//! A whole directory tree: input = [u32 LE body length][manifest body][pack bytes]. The harness
//! seals the manifest and stores the pack bytes under every pack path the manifest names, then
//! opens, loads (with and without verification, mmap, selections), slices and verifies.
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let n = u32::from_le_bytes([data[0], data[1], data[2], data[3]]) as usize;
    let rest = &data[4..];
    let (body, pack) = rest.split_at(n.min(rest.len()));
    let sealed = treepack::format::manifest::seal(body);
    let Ok(loc) = treepack::Location::parse("memory://fuzz-dir/t") else { return };
    let packs: Vec<String> = match treepack::format::manifest::decode(&sealed, "fuzz") {
        Ok(m) => m.packs.iter().map(|p| p.path.clone()).collect(),
        Err(_) => vec![],
    };
    let b = bytes::Bytes::copy_from_slice(pack);
    for p in packs.iter().take(4) {
        if treepack::format::manifest::validate_pack_path(p).is_ok() {
            let _ = treepack::block_on(loc.put(p, vec![b.clone()], false));
        }
    }
    if treepack::block_on(loc.put("treepack.json", vec![bytes::Bytes::from(sealed)], false)).is_err() {
        return;
    }
    common::exercise(loc.clone());
    for p in packs.iter().take(4) {
        let _ = treepack::block_on(loc.delete(p));
    }
});
