//! The GGUF header parser (treepack_format::gguf): never a panic or a huge allocation, and every
//! header it accepts describes tensors inside the file, aligned, not overlapping, each of the
//! byte size its ggml type and dims give; the header alone parses to the same.
#![no_main]
use libfuzzer_sys::fuzz_target;
use treepack_format::gguf::{parse, parse_with, Limits};

fuzz_target!(|data: &[u8]| {
    let Ok(h) = parse(data) else { return };
    let len = data.len() as u64;
    assert!(h.alignment.is_power_of_two());
    assert_eq!(h.data_start % h.alignment, 0);
    let mut spans = vec![];
    for t in &h.tensors {
        let r = h.range(t);
        assert!(r.end <= len, "{} ends past the file", t.name);
        assert_eq!(t.offset % h.alignment, 0);
        let n = t.elements();
        assert_eq!(t.dims.first().copied().unwrap_or(1) % t.ggml_type.block_size, 0);
        assert_eq!(t.nbytes, n / t.ggml_type.block_size * t.ggml_type.type_size);
        if let Some(d) = t.ggml_type.dtype() {
            assert_eq!(t.nbytes, n * d.itemsize());
        }
        if t.nbytes > 0 {
            spans.push(r);
        }
    }
    spans.sort_by_key(|r| r.start);
    for w in spans.windows(2) {
        assert!(w[0].end <= w[1].start, "overlapping tensors accepted");
    }
    serde_json::to_string(&serde_json::Value::Object(h.metadata_json())).expect("metadata as JSON");
    let head = &data[..usize::try_from(h.data_start).unwrap_or(usize::MAX).min(data.len())];
    let again = parse_with(head, len, &Limits::default()).expect("the header alone parses");
    assert_eq!(format!("{again:?}"), format!("{h:?}"));
});
