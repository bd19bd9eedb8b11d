//! Durable saves of big files go around the page cache, and single files are written while
//! their chunks are hashed (issue 53): neither changes a byte of what is written.

use std::path::Path;
use treepack::format::*;
use treepack::*;

/// ~40 MiB over 64 arrays of distinct bytes (nothing deduplicates), plus small leaves.
fn tree() -> Node {
    let arrays = (0..64u32).map(|i| {
        let n = 160 << 10; // u32 elements: 640 KiB each
        let bytes: Vec<u8> = (0..n).flat_map(|j: u32| (i * n + j).to_le_bytes()).collect();
        (format!("layer{i:02}"), Node::from(ArrayData::new(DType::U32, vec![u64::from(n)], bytes).unwrap()))
    });
    let mut items: Vec<(String, Node)> = arrays.collect();
    items.push(("step".into(), Node::from(7i64)));
    items.push(("name".into(), Node::from("x".repeat(10_000))));
    Node::dict(items)
}

fn opts(batch: u64, durable: bool) -> SaveOptions {
    SaveOptions { pipeline_batch_bytes: batch, pack_bytes: 24 << 20, durable, ..Default::default() }
}

fn files(p: &Path) -> Vec<(String, Vec<u8>)> {
    if p.is_file() {
        return vec![(".".into(), std::fs::read(p).unwrap())];
    }
    let mut out = vec![("treepack.json".to_string(), std::fs::read(p.join("treepack.json")).unwrap())];
    let mut packs: Vec<_> = std::fs::read_dir(p.join("packs")).unwrap().map(|e| e.unwrap().path()).collect();
    packs.sort();
    for f in packs {
        out.push((f.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&f).unwrap()));
    }
    out
}

/// Pages of `p` in the page cache, of all its pages (mincore over a mapping of it).
fn cached_share(p: &Path) -> f64 {
    let f = std::fs::File::open(p).unwrap();
    let m = unsafe { memmap2::Mmap::map(&f) }.unwrap();
    let page = 4096usize;
    let pages = m.len().div_ceil(page);
    let mut v = vec![0u8; pages];
    let rc = unsafe { libc::mincore(m.as_ptr() as *mut libc::c_void, m.len(), v.as_mut_ptr()) };
    assert_eq!(rc, 0);
    v.iter().filter(|b| **b & 1 == 1).count() as f64 / pages as f64
}

/// Whether this folder's file system takes direct writes (tmpfs does not).
fn takes_direct_writes(dir: &Path) -> bool {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let Ok(f) =
        std::fs::OpenOptions::new().write(true).create(true).custom_flags(libc::O_DIRECT).open(dir.join("probe"))
    else {
        return false;
    };
    let mut m = memmap2::MmapMut::map_anon(4096).unwrap();
    m[0] = 1;
    let ok = f.write_all_at(&m, 0).is_ok();
    let _ = std::fs::remove_file(dir.join("probe"));
    ok
}

/// A `.tpk` streamed while hashed (small batches) and written directly (durable, big) is byte
/// for byte the file a save that hashes everything first and writes through the page cache
/// makes; so are a directory's packs; every variant loads as the tree.
#[test]
fn streamed_and_direct_saves_write_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let t = tree();
    for name in ["t.tpk", "t"] {
        let mut seen = vec![];
        for (i, o) in [opts(u64::MAX, false), opts(1 << 20, true), opts(4 << 20, true), opts(u64::MAX, true)]
            .into_iter()
            .enumerate()
        {
            let p = dir.path().join(format!("{i}-{name}"));
            save(&t, p.to_str().unwrap(), &o).unwrap();
            assert_eq!(load(p.to_str().unwrap(), &LoadOptions::default()).unwrap(), t, "{name} variant {i}");
            seen.push(files(&p));
        }
        for (i, s) in seen.iter().enumerate().skip(1) {
            assert!(s == &seen[0], "{name}: variant {i} wrote other bytes than a buffered, unstreamed save");
        }
        assert!(seen[0].len() >= 2 || name.ends_with(".tpk"));
    }
}

/// A durable save's big files bypass the page cache (where the file system allows direct
/// I/O); a save with `durable=false` leaves them cached.
#[test]
fn durable_big_files_bypass_the_page_cache() {
    let dir = tempfile::tempdir().unwrap();
    if !takes_direct_writes(dir.path()) {
        eprintln!("this file system takes no direct writes: nothing to check");
        return;
    }
    let t = tree();
    let durable = dir.path().join("durable.tpk");
    save(&t, durable.to_str().unwrap(), &opts(1 << 20, true)).unwrap();
    let share = cached_share(&durable);
    assert!(share < 0.05, "{:.0} % of a durable 40 MiB file is in the page cache", share * 100.0);
    let cached = dir.path().join("cached.tpk");
    save(&t, cached.to_str().unwrap(), &opts(1 << 20, false)).unwrap();
    assert!(cached_share(&cached) > 0.9);
    // A directory's packs, the same.
    let d = dir.path().join("dir");
    save(&t, d.to_str().unwrap(), &opts(1 << 20, true)).unwrap();
    for f in std::fs::read_dir(d.join("packs")).unwrap() {
        let f = f.unwrap().path();
        if std::fs::metadata(&f).unwrap().len() >= 16 << 20 {
            assert!(cached_share(&f) < 0.05, "{f:?} is in the page cache");
        }
    }
}

/// A streamed `.tpk` save that may not replace an existing file fails as an unstreamed one
/// does, leaving the file as it was and no staging file beside it.
#[test]
fn a_refused_streamed_save_leaves_the_old_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.tpk");
    save(&Node::from(1i64), p.to_str().unwrap(), &SaveOptions::default()).unwrap();
    let before = std::fs::read(&p).unwrap();
    let e = save(&tree(), p.to_str().unwrap(), &opts(1 << 20, true)).unwrap_err();
    assert!(matches!(e, Error::AlreadyExists { .. }), "{e}");
    assert_eq!(std::fs::read(&p).unwrap(), before);
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), 1, "{names:?}");
}
