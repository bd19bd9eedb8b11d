//! Key paths, typed keys, globs and slice expressions: everything a user or file can hand the
//! path and slice parsers.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    let _ = treepack_format::keypath::split(s);
    let _ = treepack_format::keypath::parse_key(s);
    let _ = treepack_format::keypath::unescape(s);
    if let Ok(g) = treepack_format::keypath::Glob::new(s) {
        let _ = g.matches(&["a".into(), "b".into(), s.into()]);
        let _ = g.selects(&[s.into()]);
    }
    let _ = treepack_format::keypath::Selection::new(&[s]);
    if let Ok(items) = treepack_format::grid::parse_slice(s) {
        for shape in [&[][..], &[7][..], &[3, 5][..], &[2, 0, 4][..]] {
            if let Ok(sel) = treepack_format::grid::normalize(&items, shape, s) {
                if let Ok(g) = treepack_format::grid::ChunkGrid::new(shape.to_vec(), shape.iter().map(|&d| d.clamp(1, 4)).collect()) {
                    let _ = g.chunks_for(&sel);
                }
            }
        }
    }
});
