//! Shared by the fuzz targets: exercise every read path of an opened tree. Errors are expected
//! (hostile input); panics, hangs and huge allocations are the bugs the fuzzer looks for.

use treepack::{LoadOptions, Location, Reader};

pub fn exercise(loc: Location) {
    let Ok(r) = Reader::open(loc) else { return };
    let _ = r.structure();
    for verify in [false, true] {
        let _ = r.load(&LoadOptions { verify, ..Default::default() });
    }
    let _ = r.load(&LoadOptions { mmap: true, verify: false, ..Default::default() });
    let _ = r.load(&LoadOptions { select: vec!["*/**".into()], ..Default::default() });
    let mut arrays = vec![];
    r.manifest().root.for_each_leaf(&mut |p, e| {
        if matches!(e, treepack::Entry::Array(_)) {
            arrays.push(p.to_string());
        }
    });
    for a in arrays.iter().take(8) {
        for slice in ["", "0", "-1", "1:3", "...", "::2"] {
            let _ = r.read_array(a, slice);
        }
        let _ = r.get(a);
    }
    let _ = r.verify();
}
