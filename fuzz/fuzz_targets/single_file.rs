//! The single-file (.tpk) container. If the first byte is even, the input is the whole file (fuzzes
//! header/footer parsing as found). Otherwise input = [flag][u32 LE body length][manifest body]
//! [file prefix: header + chunk bytes]; the harness appends the sealed manifest and a matching
//! footer, so the fuzzer reaches chunk tables, offsets and array assembly.
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let Some((&flag, data)) = data.split_first() else { return };
    let file: Vec<u8> = if flag % 2 == 0 || data.len() < 4 {
        data.to_vec()
    } else {
        let n = u32::from_le_bytes([data[0], data[1], data[2], data[3]]) as usize;
        let rest = &data[4..];
        let (body, prefix) = rest.split_at(n.min(rest.len()));
        let sealed = treepack::format::manifest::seal(body);
        let mut f = prefix.to_vec();
        let off = f.len() as u64;
        f.extend_from_slice(&sealed);
        f.extend_from_slice(&treepack::format::container::footer(off, sealed.len() as u64));
        f
    };
    let Ok(loc) = treepack::Location::parse("memory://fuzz-file/t.tpk") else { return };
    if treepack::block_on(loc.put(".", vec![bytes::Bytes::from(file)], false)).is_err() {
        return;
    }
    common::exercise(loc);
});
