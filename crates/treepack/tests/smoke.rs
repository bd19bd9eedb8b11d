#[path = "support/files.rs"]
mod files;
use treepack::*;

fn f32s(v: &[f32], shape: Vec<u64>) -> ArrayData {
    ArrayData::new(DType::F32, shape, v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()).unwrap()
}

#[test]
fn smoke_round_trip_both_layouts() {
    let dir = tempfile::tempdir().unwrap();
    let big: Vec<f32> = (0..300_000).map(|i| i as f32).collect();
    let tree = Node::dict([
        ("w", Node::from(f32s(&big, vec![1000, 300]))),
        ("s", Node::from("hello")),
        ("n", Node::list([Node::from(1i64), Node::from(f64::NAN), Node::none()])),
        ("long", Node::from("x".repeat(10_000))),
    ]);
    for name in ["d", "f.tpk"] {
        let p = dir.path().join(name);
        let p = p.to_str().unwrap();
        let opts = SaveOptions { chunk_bytes: 100_000, ..Default::default() };
        let info = save(&tree, p, &opts).unwrap();
        assert!(info.chunks > 1);
        let back = load(p, &LoadOptions::default()).unwrap();
        assert!(back.exact_eq(&tree), "{name}");
        let r = open(p).unwrap();
        let a = r.read_array("w", "5, 10:13").unwrap();
        assert_eq!(a.bytes().as_ref(), f32s(&[1510.0, 1511.0, 1512.0], vec![3]).bytes().as_ref());
        assert!(r.verify().unwrap().ok());
        assert!(matches!(save(&tree, p, &opts), Err(Error::AlreadyExists { .. })));
        let m = load(p, &LoadOptions { mmap: true, ..Default::default() }).unwrap();
        assert!(m.exact_eq(&tree));
    }
}

/// The runtime-free manifest read of local trees gives the bytes the async read gives, for
/// manifests inside and beyond a single file's tail read, and the same leaves on the spot;
/// missing trees and damaged footers are errors, not panics.
#[test]
fn local_reads_without_the_runtime_equal_the_async_reads() {
    let dir = tempfile::tempdir().unwrap();
    let blob = Tree::Leaf(Leaf::Bytes(bytes::Bytes::from(vec![7u8; 5000])));
    let small = Node::dict([("a", Node::from(1i64)), ("b", blob.clone())]);
    let big = Node::list((0..5000).map(|i| Node::dict([("i", Node::from(i as i64)), ("b", blob.clone())])));
    for (tag, tree) in [("small", &small), ("big", &big)] {
        for name in ["d", "f.tpk"] {
            let p = dir.path().join(format!("{tag}-{name}"));
            let p = p.to_str().unwrap();
            save(tree, p, &SaveOptions::default()).unwrap();
            let loc = p.into_location().unwrap().pin().unwrap();
            // `Location::block_on` drives a local read on this thread; `block_on` on the runtime.
            let (a, fa) = loc.block_on(read::manifest_bytes(&loc)).unwrap();
            let (b, fb) = block_on(read::manifest_bytes(&loc)).unwrap();
            assert_eq!((a.as_ref(), &fa), (b.as_ref(), &fb), "{tag} {name}");
            let r = open(p).unwrap();
            for mmap in [false, true] {
                let opts = LoadOptions { mmap, ..Default::default() };
                let here = loc.block_on(r.fetch_stored_leaves_async(&opts)).unwrap();
                let rt = block_on(r.fetch_stored_leaves_async(&opts)).unwrap();
                assert_eq!(here.len(), rt.len());
                assert!(!here.is_empty() || tag == "small");
                assert!(here.iter().zip(&rt).all(|(x, y)| x.0 == y.0 && x.1.exact_eq(&y.1)), "{tag} {name}");
            }
        }
    }
    let missing = dir.path().join("nothing-here");
    let loc = missing.to_str().unwrap().into_location().unwrap();
    assert!(matches!(loc.block_on(read::manifest_bytes(&loc)), Err(Error::NotFound { .. })));
    let cut = dir.path().join("small-f.tpk");
    let len = std::fs::metadata(&cut).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&cut).unwrap().set_len(len - 3).unwrap();
    let loc = cut.to_str().unwrap().into_location().unwrap().pin().unwrap();
    assert!(matches!(loc.block_on(read::manifest_bytes(&loc)), Err(Error::NotTreepack { .. })));
}

/// Drop a saved tree's pages from the page cache (the files are synced by `save`).
#[cfg(target_os = "linux")]
fn evict(p: &std::path::Path) {
    use std::os::fd::AsRawFd;
    let paths: Vec<std::path::PathBuf> = if p.is_dir() { files::walk(p) } else { vec![p.to_path_buf()] };
    for f in paths {
        let f = std::fs::File::open(f).unwrap();
        f.sync_all().unwrap();
        // SAFETY: an advisory call on an open descriptor.
        assert_eq!(unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) }, 0);
    }
}

/// A whole load of big leaves that are not in the page cache reads them straight from the disk
/// (where the kernel can tell what is cached: `cachestat`, Linux 6.5) and gets exactly what a
/// cached load gets, in buffers aligned as in the file; a cached load never goes around the
/// cache; a damaged byte in an uncached leaf is still caught.
#[cfg(target_os = "linux")]
#[test]
fn cold_whole_loads_read_around_the_cache_and_equal_cached_loads() {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut v = release.split(|c: char| !c.is_ascii_digit()).filter_map(|x| x.parse::<u32>().ok());
    let can_tell = (v.next().unwrap_or(0), v.next().unwrap_or(0)) >= (6, 5);
    // On the disk the tests build on, not a tmpfs /tmp (nothing there is ever uncached).
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut pairs: Vec<(String, Node)> = (0..6)
        .map(|i| {
            let v: Vec<f32> = (0..384 * 1024).map(|j| (i * 1_000_000 + j) as f32).collect();
            (format!("w{i}"), Node::from(f32s(&v, vec![384, 1024])))
        })
        .collect();
    pairs.push(("bias".into(), Node::from(f32s(&[1.0, 2.0, 3.0], vec![3]))));
    pairs.push(("step".into(), Node::from(7i64)));
    let tree = Node::dict(pairs);
    for name in ["d", "f.tpk"] {
        let path = dir.path().join(name);
        let p = path.to_str().unwrap();
        save(&tree, p, &SaveOptions::default()).unwrap();
        let r = open(p).unwrap();
        let warm = r.load(&LoadOptions::default()).unwrap();
        assert!(warm.exact_eq(&tree), "{name}");
        assert_eq!(r.location().stats().bytes_read_direct(), 0, "{name}: a cached load stays in the cache");

        evict(&path);
        let r = open(p).unwrap();
        let cold = r.load(&LoadOptions::default()).unwrap();
        assert!(cold.exact_eq(&tree), "{name}");
        if can_tell {
            assert!(r.location().stats().bytes_read_direct() >= 6 * 384 * 1024 * 4, "{name}");
        }
        let Tree::Dict(items) = &cold else { panic!("a dict") };
        for (_, n) in items {
            match n {
                Tree::Leaf(Leaf::Array(a)) if a.bytes().len() >= 1 << 20 => {
                    assert_eq!(a.bytes().as_ptr() as usize % 64, 0, "{name}: array data aligned as in the file")
                }
                _ => {}
            }
        }
    }
    // Compressed leaves take the same whole-load path (decoded by the compute pool) and come
    // back equal, cold and warm.
    let opts = SaveOptions { compression: save::Compression::parse("zstd:1").unwrap(), ..Default::default() };
    for name in ["z", "z.tpk"] {
        let path = dir.path().join(name);
        let p = path.to_str().unwrap();
        save(&tree, p, &opts).unwrap();
        let r = open(p).unwrap();
        let mut compressed = 0;
        r.manifest()
            .root
            .for_each_leaf(&mut |_, e| compressed += e.chunks().iter().filter(|c| !c.codec.is_identity()).count());
        assert!(compressed >= 6, "{name}: {compressed} compressed chunks");
        assert!(r.load(&LoadOptions::default()).unwrap().exact_eq(&tree), "{name} warm");
        evict(&path);
        assert!(open(p).unwrap().load(&LoadOptions::default()).unwrap().exact_eq(&tree), "{name} cold");
    }
    // One flipped byte in the middle of an uncached array is a corrupt chunk, not wrong data.
    let path = dir.path().join("f.tpk");
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.len() / 3;
    bytes[at] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    for state in ["cached", "evicted"] {
        if state == "evicted" {
            evict(&path);
        }
        let e = load(path.to_str().unwrap(), &LoadOptions::default()).unwrap_err();
        assert!(matches!(e, Error::ChunkCorrupt { .. }), "{state}: {e}");
    }
}
