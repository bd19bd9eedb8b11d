//! Overwrite, cleanup of old packs, `gc` of crash leftovers, and regressions.

use std::time::Duration;
use treepack::*;

fn arr(n: u64, v: u8) -> Node {
    Node::from(ArrayData::new(DType::U8, vec![n], vec![v; n as usize]).unwrap())
}

fn pack_files(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir.join("packs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn overwrite_replaces_the_tree_and_removes_old_packs() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("t");
    let ps = p.to_str().unwrap();
    save(&Node::dict([("a", arr(1000, 1))]), ps, &SaveOptions::default()).unwrap();
    let first = pack_files(&p);
    assert_eq!(first.len(), 1);
    let e = save(&Node::dict([("a", arr(1000, 2))]), ps, &SaveOptions::default()).unwrap_err();
    assert!(matches!(e, Error::AlreadyExists { .. }), "{e}");
    assert!(e.to_string().contains("overwrite"));
    let second = Node::dict([("a", arr(1000, 2))]);
    save(&second, ps, &SaveOptions { overwrite: true, ..Default::default() }).unwrap();
    assert!(load(ps, &LoadOptions::default()).unwrap().exact_eq(&second));
    let now = pack_files(&p);
    assert_eq!(now.len(), 1);
    assert_ne!(now, first, "the old pack is removed after the new manifest is committed");
    // Re-saving identical content reuses the same (content-derived) pack names.
    save(&second, ps, &SaveOptions { overwrite: true, ..Default::default() }).unwrap();
    assert_eq!(pack_files(&p), now);
    assert!(load(ps, &LoadOptions::default()).unwrap().exact_eq(&second));
}

#[test]
fn identical_chunks_are_stored_once() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("t");
    let t = Node::dict([("a", arr(100_000, 3)), ("b", arr(100_000, 3)), ("c", arr(100_000, 4))]);
    let info = save(&t, p.to_str().unwrap(), &SaveOptions::default()).unwrap();
    assert_eq!(info.chunks, 3);
    assert_eq!(info.unique_chunks, 2);
    let size: u64 = std::fs::read_dir(p.join("packs")).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum();
    assert!(size < 210_000, "{size}");
    assert!(load(p.to_str().unwrap(), &LoadOptions::default()).unwrap().exact_eq(&t));
}

/// `{"a": <5000 float32>}` saved in a fresh folder: the folder (removed when dropped), the
/// tree's path and the tree.
fn saved_dict() -> (tempfile::TempDir, std::path::PathBuf, Node) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("t");
    let t = Node::dict([("a", arr(5000, 1))]);
    save(&t, p.to_str().unwrap(), &SaveOptions::default()).unwrap();
    (d, p, t)
}

#[test]
fn gc_removes_only_unreferenced_leftovers() {
    let (_d, p, t) = saved_dict();
    let ps = p.to_str().unwrap();
    let live = pack_files(&p);
    // What a killed save leaves: an orphan pack and a staging file.
    std::fs::write(p.join("packs/deadbeefdeadbeef-0.tpp"), b"orphan").unwrap();
    std::fs::write(p.join("packs/deadbeefdeadbeef-1.tpp#3"), b"half-written").unwrap();
    std::fs::write(p.join("treepack.json#9"), b"half manifest").unwrap();
    // Young leftovers are kept (a save might still be running)…
    let r = gc(ps, Duration::from_secs(3600)).unwrap();
    assert!(r.removed.is_empty());
    assert_eq!(r.kept_recent.len(), 3);
    // …old ones are removed; the live pack and manifest stay.
    let r = gc(ps, Duration::ZERO).unwrap();
    assert_eq!(r.removed.len(), 3, "{r:?}");
    assert_eq!(pack_files(&p), live);
    assert!(load(ps, &LoadOptions::default()).unwrap().exact_eq(&t));
    // A damaged manifest makes gc refuse rather than delete data.
    std::fs::write(p.join("treepack.json"), b"{\"format\":\"treepack\",\"version\":[1,0] broken").unwrap();
    assert!(gc(ps, Duration::ZERO).is_err());
    assert_eq!(pack_files(&p), live);
}

#[test]
fn gc_single_file_staging() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("t.tpk");
    save(&arr(10, 1), p.to_str().unwrap(), &SaveOptions::default()).unwrap();
    std::fs::write(d.path().join("t.tpk#1"), b"partial").unwrap();
    let r = gc(p.to_str().unwrap(), Duration::ZERO).unwrap();
    assert_eq!(r.removed, vec!["t.tpk#1".to_string()]);
    assert!(p.exists());
}

#[test]
fn gc_keeps_what_a_running_save_wrote_and_removes_dead_saves_markers() {
    let (_d, p, t) = saved_dict();
    let ps = p.to_str().unwrap();
    let loc = Location::parse(ps).unwrap();
    // A save running now: its marker is held; a pack it wrote is unreferenced until it commits.
    let marker = loc.save_marker(true).unwrap().expect("local saves have markers");
    std::thread::sleep(Duration::from_millis(1100)); // coarse file timestamps
    std::fs::write(p.join("packs/0123456789abcdef-0.tpp"), b"in flight").unwrap();
    std::fs::write(p.join("packs/0123456789abcdef-1.tpp#7"), b"being written").unwrap();
    let r = gc(ps, Duration::ZERO).unwrap();
    assert!(r.removed.is_empty(), "grace 0 removed a running save's files: {r:?}");
    assert_eq!(r.kept_recent.len(), 2, "{r:?}");
    drop(marker); // the save ends (here: without committing)
    let r = gc(ps, Duration::ZERO).unwrap();
    assert_eq!(r.removed.len(), 2, "{r:?}");
    // A save that died: its marker is unlocked and old; gc removes it.
    let dead = p.join(format!(".saving-{}-999", std::process::id()));
    std::fs::write(&dead, b"").unwrap();
    let old = std::time::SystemTime::now() - Duration::from_secs(60);
    std::fs::File::options().write(true).open(&dead).unwrap().set_modified(old).unwrap();
    let r = gc(ps, Duration::ZERO).unwrap();
    assert_eq!(r.removed, vec![format!(".saving-{}-999", std::process::id())], "{r:?}");
    assert!(!dead.exists());
    assert!(load(ps, &LoadOptions::default()).unwrap().exact_eq(&t));
}

/// Regression: local paths containing `..` were rejected by the object-store path parser.
#[test]
fn regression_dotdot_in_local_paths() {
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(d.path().join("x")).unwrap();
    let p = format!("{}/x/../t", d.path().display());
    save(&arr(10, 1), &p, &SaveOptions::default()).unwrap();
    assert!(d.path().join("t/treepack.json").exists());
    assert!(load(&p, &LoadOptions::default()).unwrap().exact_eq(&arr(10, 1)));
}

#[test]
fn blocking_api_works_inside_a_tokio_runtime() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        save(&arr(10, 1), "memory://rt/t", &SaveOptions::default()).unwrap();
        let back = load_async("memory://rt/t", &LoadOptions::default()).await.unwrap();
        assert!(back.exact_eq(&arr(10, 1)));
    });
}

#[test]
fn a_reader_keeps_reading_the_single_file_it_opened() {
    // Regression: a reader that opened `t.tpk`, then saw it replaced by a concurrent save, used to
    // read the new file's bytes at the old manifest's offsets (a spurious ChunkCorrupt).
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("t.tpk");
    let ps = p.to_str().unwrap();
    let (v1, v2) = (Node::dict([("a", arr(100_000, 1))]), Node::dict([("a", arr(100_000, 2))]));
    save(&v1, ps, &SaveOptions::default()).unwrap();
    let r = open(ps).unwrap();
    save(&v2, ps, &SaveOptions { overwrite: true, ..Default::default() }).unwrap();
    assert!(r.load(&LoadOptions::default()).unwrap().exact_eq(&v1));
    assert!(r.load(&LoadOptions { mmap: true, ..Default::default() }).unwrap().exact_eq(&v1));
    assert_eq!(r.read_array("a", "5").unwrap().bytes().as_ref(), &[1]);
    assert!(r.verify().unwrap().ok());
    assert!(open(ps).unwrap().load(&LoadOptions::default()).unwrap().exact_eq(&v2));
}

/// Every chunk ref `{"pack":…,"offset":…,"blake3":…}` in a manifest, in any order.
fn chunk_refs(v: &serde_json::Value, out: &mut Vec<(u64, u64, String)>) {
    match v {
        serde_json::Value::Object(m) => {
            if let (Some(p), Some(o), Some(h)) = (m.get("pack"), m.get("offset"), m.get("blake3")) {
                out.push((p.as_u64().unwrap(), o.as_u64().unwrap(), h.as_str().unwrap().to_string()));
            }
            m.values().for_each(|x| chunk_refs(x, out));
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| chunk_refs(x, out)),
        _ => {}
    }
}

/// A save big enough to pipeline (hashing on its own thread, each pack written as soon as it is
/// laid out) writes byte-identical files to a one-batch save, across several packs with
/// deduplication between them; pack `n` is named by BLAKE3 over the stored chunks of packs
/// 0..=n (docs/format.md); the tree loads back verified; progress ends at the bytes written.
#[test]
fn pipelined_save_writes_the_same_files_as_a_one_batch_save() {
    let d = tempfile::tempdir().unwrap();
    let varied = |n: usize, seed: usize| {
        let mut x = seed as u64 + 1;
        let bytes: Vec<u8> = (0..n)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (x >> 56) as u8
            })
            .collect();
        Node::from(ArrayData::new(DType::U8, vec![n as u64], bytes).unwrap())
    };
    let mut items: Vec<(String, Node)> = (0..24).map(|i| (format!("w{i:02}"), varied((1 << 20) + i, i))).collect();
    items.push(("copy".into(), varied((1 << 20) + 5, 5))); // identical to w05: deduplicated
    items.push(("note".into(), Node::from("x".repeat(10_000))));
    let tree = Node::dict(items.iter().map(|(k, v)| (k.as_str(), v.clone())));
    let one = SaveOptions {
        chunk_bytes: 256 << 10,
        pack_bytes: 3 << 20,
        pipeline_batch_bytes: u64::MAX,
        ..Default::default()
    };
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let s2 = seen.clone();
    let piped = SaveOptions {
        pipeline_batch_bytes: 700 << 10,
        progress: Some(ProgressFn::new(move |done, total| s2.lock().unwrap().push((done, total)))),
        ..one.clone()
    };
    let (a, b) = (d.path().join("a"), d.path().join("b"));
    let ia = save(&tree, a.to_str().unwrap(), &one).unwrap();
    let ib = save(&tree, b.to_str().unwrap(), &piped).unwrap();
    assert_eq!(ia, SaveInfo { location: ia.location.clone(), ..ib.clone() });
    assert!(ib.packs >= 5, "several packs: {ib:?}");
    assert!(ib.unique_chunks < ib.chunks, "the copy is deduplicated: {ib:?}");
    let manifest = std::fs::read(b.join("treepack.json")).unwrap();
    assert_eq!(std::fs::read(a.join("treepack.json")).unwrap(), manifest);
    let names = pack_files(&b);
    assert_eq!(pack_files(&a), names);
    for n in &names {
        assert_eq!(std::fs::read(a.join("packs").join(n)).unwrap(), std::fs::read(b.join("packs").join(n)).unwrap());
    }

    // Pack names: the prefix rule, recomputed from the manifest's chunk refs.
    let m: serde_json::Value = serde_json::from_slice(&manifest).unwrap();
    let mut refs = vec![];
    chunk_refs(&m["root"], &mut refs);
    refs.sort();
    refs.dedup();
    let packs: Vec<String> =
        m["packs"].as_array().unwrap().iter().map(|p| p["path"].as_str().unwrap().to_string()).collect();
    assert_eq!(packs.len(), ib.packs);
    for (n, path) in packs.iter().enumerate() {
        let mut h = blake3::Hasher::new();
        for (p, _, hash) in refs.iter().filter(|r| r.0 <= n as u64) {
            let raw: Vec<u8> = (0..32).map(|i| u8::from_str_radix(&hash[2 * i..2 * i + 2], 16).unwrap()).collect();
            h.update(&raw);
            h.update(&[*p as u8]);
        }
        assert_eq!(path, &format!("packs/{}-{n}.tpp", &h.finalize().to_hex()[..16]));
    }

    let back = load(b.to_str().unwrap(), &LoadOptions::default()).unwrap();
    assert!(back.exact_eq(&tree));
    let seen = seen.lock().unwrap();
    assert_eq!(seen.last().copied(), Some((ib.bytes_written, ib.bytes_written)), "progress ends at the bytes written");
    assert!(seen.windows(2).all(|w| w[0].0 <= w[1].0), "progress never goes back");
}

/// A folder `name` in `parent` holding the folders `dirs` and the files `files` (path, bytes).
fn folder_of(parent: &std::path::Path, name: &str, dirs: &[&str], files: &[(&str, &[u8])]) -> std::path::PathBuf {
    let folder = parent.join(name);
    for d in dirs {
        std::fs::create_dir_all(folder.join(d)).unwrap();
    }
    for (f, bytes) in files {
        std::fs::write(folder.join(f), bytes).unwrap();
    }
    folder
}

/// A save into a folder holding other files and no tree is refused, with or without overwrite,
/// and leaves the files alone; treepack's own leftovers (a dead save's packs, staging files)
/// are not in the way; a repository folder says to save as LOCATION@NAME.
#[test]
fn a_save_into_a_folder_of_other_files_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let dir = folder_of(d.path(), "ckpt", &["data"], &[("config.json", b"{\"mine\": true}")]);
    let tree = Node::dict([("x", Node::from(1i64))]);
    for overwrite in [false, true] {
        let e = save(&tree, dir.to_str().unwrap(), &SaveOptions { overwrite, ..Default::default() }).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("config.json") && msg.contains("data") && msg.contains("new or empty folder"), "{msg}");
    }
    let mut names: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.file_name()).collect();
    names.sort();
    assert_eq!(names, vec![std::ffi::OsString::from("config.json"), "data".into()], "nothing was written");
    // An empty folder, and a folder with only a dead save's leftovers, take the tree.
    let empty = d.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    save(&tree, empty.to_str().unwrap(), &SaveOptions::default()).unwrap();
    let left = folder_of(d.path(), "left", &["packs"], &[("packs/0123.tpp", b"x"), ("treepack.json#1-2", b"x")]);
    save(&tree, left.to_str().unwrap(), &SaveOptions::default()).unwrap();
    // A tree with other files beside it is still a tree: it can be overwritten.
    std::fs::write(empty.join("README"), b"notes").unwrap();
    save(&tree, empty.to_str().unwrap(), &SaveOptions { overwrite: true, ..Default::default() }).unwrap();
    assert_eq!(std::fs::read(empty.join("README")).unwrap(), b"notes");
    let repo = d.path().join("repo");
    Repository::create(repo.to_str().unwrap()).unwrap();
    let e = save(&tree, repo.to_str().unwrap(), &SaveOptions::default()).unwrap_err();
    assert!(e.to_string().contains("LOCATION@NAME"), "{e}");
}

/// A save never writes a tree its readers refuse: at the deepest level readers accept (1000),
/// a plain JSON scalar may sit, but not a container or a leaf written as a tagged object
/// (an array, bytes): such a save is refused, not committed as an unreadable file.
#[test]
fn the_deepest_level_holds_only_what_readers_read() {
    let depth = treepack::format::manifest::MAX_DEPTH;
    let nest = |leaf: Node| (0..depth).fold(leaf, |t, _| Node::list([t]));
    let d = tempfile::tempdir().unwrap();
    for (i, (leaf, ok)) in [
        (Node::from(1i64), true),
        (Node::from("short"), true),
        (arr(4, 1), false),
        (Node::from(b"xy".to_vec()), false),
        (Node::list([]), false),
    ]
    .into_iter()
    .enumerate()
    {
        let p = d.path().join(format!("t{i}"));
        let p = p.to_str().unwrap();
        let tree = nest(leaf);
        let r = save(&tree, p, &SaveOptions::default());
        if ok {
            r.unwrap();
            assert!(load(p, &LoadOptions::default()).unwrap().exact_eq(&tree), "case {i}");
        } else {
            assert_eq!(r.unwrap_err().kind(), "limit_exceeded", "case {i}");
            assert!(!std::path::Path::new(p).join("treepack.json").exists(), "case {i}");
        }
    }
}
