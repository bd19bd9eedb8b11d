//! The safetensors header reader (treepack_format::safetensors): never a panic or a huge allocation, and
//! every header it accepts describes tensors that tile the data exactly.
#![no_main]
use libfuzzer_sys::fuzz_target;
use treepack_format::safetensors::{header_len, parse_header, write_header};

fuzz_target!(|data: &[u8]| {
    let len = data.len() as u64;
    let Ok(n) = header_len(data, len) else { return };
    let Ok(h) = parse_header(&data[8..8 + n as usize], len) else { return };
    let mut at = h.data_start;
    for t in &h.tensors {
        assert_eq!(h.data_start + t.begin, at);
        at = h.data_start + t.end;
    }
    assert_eq!(at, len);
    // What was read can be written again.
    let tensors: Vec<_> = h.tensors.iter().map(|t| (t.name.clone(), t.dtype.clone(), t.shape.clone())).collect();
    write_header(&tensors, h.metadata.as_ref()).expect("a parsed header writes");
});
