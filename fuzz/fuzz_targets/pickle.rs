//! The never-executing pickle reader (treepack_format::pickle, issue 54): any bytes, as a
//! pickle and as a checkpoint's `data.pkl`, end in a tree or a typed error — never a panic, a
//! hang or a huge allocation — and every tensor of an accepted tree lies inside its storage.
//! The same bytes as a torch.distributed checkpoint's `.metadata` (DCP's allow-list, records)
//! end in a typed description or a typed error, every chunk with its tensor's rank.
#![no_main]
use libfuzzer_sys::fuzz_target;
use treepack_format::model::Tree;
use treepack_format::pickle::torch::{self, Item};
use treepack_format::pickle::{dcp, parse, parse_with, AllowList, Limits};

fuzz_target!(|data: &[u8]| {
    let limits = Limits::default();
    let _ = parse(data, &limits);
    let _ = parse_with(data, &limits, AllowList::DcpMetadata);
    if let Ok(m) = dcp::read(data, &limits) {
        for (_, e) in &m.entries {
            if let dcp::Entry::Tensor(t) = e {
                for c in &t.chunks {
                    assert!(c.offsets.len() <= 64 && c.sizes.len() <= 64);
                }
            }
        }
        for (_, s) in &m.storage {
            let _ = s.offset.checked_add(s.length);
        }
    }
    let Ok(c) = torch::read(data, &limits) else { return };
    c.tree.for_each_leaf(&mut |_, item| {
        if let Item::Tensor(t) = item {
            let s = &c.storages[&t.storage];
            assert_eq!(s.dtype, t.dtype);
            if t.numel() > 0 {
                let last = t.shape.iter().zip(&t.stride).fold(t.offset, |a, (&n, &s)| a + (n - 1) * s);
                assert!(last < s.numel);
            }
            // Reading the view from a storage of exactly that size stays inside it.
            if s.nbytes() <= 1 << 16 {
                let storage = vec![0u8; s.nbytes() as usize];
                torch::strided_copy(&storage, t.dtype.itemsize(), &t.shape, &t.stride, t.offset)
                    .expect("a checked view reads");
            }
        }
    });
    let _: &Tree<Item> = &c.tree;
});
