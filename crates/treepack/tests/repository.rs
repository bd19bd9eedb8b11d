//! Repositories: cross-save dedup, names committed create-only, `LOCATION@NAME` everywhere,
//! gc that frees what expired and never what a committed tree or a running save needs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use treepack::*;

/// A checkpoint-like tree: `layers` arrays of 256 KiB each (one chunk each), plus a step.
fn checkpoint(layers: usize, seed: u8, step: i64) -> Node {
    let mut items = vec![];
    for i in 0..layers {
        let data: Vec<u8> =
            (0..65536u32).flat_map(|j| ((j as f32) + (i as f32) * 0.5 + seed as f32).to_le_bytes()).collect();
        items.push((format!("layer{i}"), Node::from(ArrayData::new(DType::F32, vec![256, 256], data).unwrap())));
    }
    items.push(("step".to_string(), Node::from(step)));
    Node::dict(items)
}

fn with_layer(mut t: Node, i: usize, seed: u8) -> Node {
    if let Tree::Dict(items) = &mut t {
        let data: Vec<u8> = (0..65536u32).flat_map(|j| ((j as f32) * 3.0 + seed as f32).to_le_bytes()).collect();
        items[i].1 = Node::from(ArrayData::new(DType::F32, vec![256, 256], data).unwrap());
    }
    t
}

/// A new repository `name` in a fresh folder: the folder (removed when dropped), the
/// repository's path and the repository.
fn new_repo(name: &str) -> (tempfile::TempDir, std::path::PathBuf, Repository) {
    let dir = tempfile::tempdir().unwrap();
    let loc = dir.path().join(name);
    let repo = Repository::create(loc.to_str().unwrap()).unwrap();
    (dir, loc, repo)
}

fn dir_size(p: &std::path::Path) -> u64 {
    let mut n = 0;
    for e in std::fs::read_dir(p).unwrap().flatten() {
        let m = e.metadata().unwrap();
        n += if m.is_dir() { dir_size(&e.path()) } else { m.len() };
    }
    n
}

#[test]
fn a_second_save_writes_only_what_changed_and_both_load() {
    let (dir, loc, repo) = new_repo("repo");
    let a = checkpoint(8, 0, 1);
    let ia = repo.save(&a, "step-1", &SaveOptions::default()).unwrap();
    let ra = ia.root.unwrap();
    assert_eq!(ia.bytes_reused, 0);
    assert!(ia.bytes_written > 8 * 262144, "{ia:?}");
    let b = with_layer(checkpoint(8, 0, 2), 3, 9);
    let ib = repo.save(&b, "step-2", &SaveOptions::default()).unwrap();
    let rb = ib.root.unwrap();
    // Seven layers reused, one written (plus the manifest, ref and index).
    assert_eq!(ib.bytes_reused, 7 * 262144, "{ib:?}");
    assert!(ib.bytes_written < 262144 + 16384, "{ib:?}");
    assert!(dir_size(&loc) < 9 * 262144 + 65536, "the repository holds each distinct chunk once");
    // Every reader works on a tree of the repository.
    let la = format!("{}@step-1", loc.display());
    let lb = format!("{}@step-2", loc.display());
    assert!(load(la.as_str(), &LoadOptions::default()).unwrap().exact_eq(&a));
    assert!(repo.load("step-2", &LoadOptions::default()).unwrap().exact_eq(&b));
    assert_eq!(load_structure(lb.as_str()).unwrap(), {
        let r = open(lb.as_str()).unwrap();
        r.structure().unwrap()
    });
    let part = open(lb.as_str()).unwrap().read_array("layer3", "0:2, 0:2").unwrap();
    assert_eq!(part.shape(), &[2, 2]);
    assert!(open(lb.as_str()).unwrap().verify().unwrap().ok());
    // Roots: recorded, recomputed, and the same as the tree saved anywhere else.
    let plain = dir.path().join("plain.tpk");
    save(&b, plain.to_str().unwrap(), &SaveOptions::default()).unwrap();
    assert_eq!(rb, root_hash(plain.to_str().unwrap()).unwrap());
    assert_eq!(rb, root_hash(lb.as_str()).unwrap());
    assert_ne!(ra, rb);
    let names = repo.names().unwrap();
    assert_eq!(
        names.iter().map(|n| (n.name.as_str(), n.root)).collect::<Vec<_>>(),
        vec![("step-1", ra), ("step-2", rb)]
    );
    assert_eq!(names[1].bytes_reused, ib.bytes_reused);
    assert!(repo.verify().unwrap().ok());
}

#[test]
fn a_plain_save_to_location_at_name_saves_into_the_repository() {
    let (_dir, loc, _) = new_repo("repo");
    let t = checkpoint(2, 1, 5);
    let at = format!("{}@v1", loc.display());
    let info = save(&t, at.as_str(), &SaveOptions::default()).unwrap();
    assert_eq!(info.location, at);
    let again = save(&t, format!("{}@v2", loc.display()).as_str(), &SaveOptions::default()).unwrap();
    assert_eq!(again.bytes_reused, 2 * 262144);
    assert!(load(at.as_str(), &LoadOptions::default()).unwrap().exact_eq(&t));
}

#[test]
fn names_are_create_only_unless_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let repo = Repository::create(dir.path().join("r").to_str().unwrap()).unwrap();
    repo.save(&checkpoint(1, 0, 1), "best", &SaveOptions::default()).unwrap();
    let err = repo.save(&checkpoint(1, 1, 2), "best", &SaveOptions::default()).unwrap_err();
    assert_eq!(err.kind(), "already_exists");
    assert!(err.to_string().contains("@best"), "{err}");
    let newer = checkpoint(1, 1, 2);
    repo.save(&newer, "best", &SaveOptions { overwrite: true, ..Default::default() }).unwrap();
    assert!(repo.load("best", &LoadOptions::default()).unwrap().exact_eq(&newer));
}

#[test]
fn of_concurrent_writers_of_one_name_one_wins_and_other_names_all_commit() {
    let (_dir, loc, _) = new_repo("r");
    let loc = loc.to_str().unwrap().to_string();
    let results: Vec<(Result<SaveInfo>, Node)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..6u8)
            .map(|i| {
                let loc = loc.clone();
                s.spawn(move || {
                    let repo = Repository::open(loc.as_str()).unwrap();
                    let t = checkpoint(2, i, i as i64);
                    let same = repo.save(&t, "same", &SaveOptions::default());
                    repo.save(&t, &format!("own-{i}"), &SaveOptions::default()).unwrap();
                    (same, t)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let won: Vec<&Node> = results.iter().filter(|(r, _)| r.is_ok()).map(|(_, t)| t).collect();
    assert_eq!(won.len(), 1, "exactly one writer of `same` commits");
    for (r, _) in &results {
        if let Err(e) = r {
            assert_eq!(e.kind(), "already_exists", "{e}");
        }
    }
    let repo = Repository::open(loc.as_str()).unwrap();
    assert!(repo.load("same", &LoadOptions::default()).unwrap().exact_eq(won[0]));
    for (i, (_, t)) in results.iter().enumerate() {
        assert!(repo.load(&format!("own-{i}"), &LoadOptions::default()).unwrap().exact_eq(t));
    }
    assert_eq!(repo.names().unwrap().len(), 7);
}

#[test]
fn gc_frees_what_only_deleted_trees_used_and_keeps_the_rest() {
    let (_dir, loc, repo) = new_repo("r");
    let a = checkpoint(4, 0, 1);
    let b = with_layer(a.clone(), 0, 7);
    repo.save(&a, "a", &SaveOptions::default()).unwrap();
    repo.save(&b, "b", &SaveOptions::default()).unwrap();
    // Nothing deleted: nothing to free.
    let r = repo.gc(Duration::ZERO).unwrap();
    assert!(r.removed.is_empty(), "{r:?}");
    repo.delete("a").unwrap();
    assert_eq!(repo.delete("a").unwrap_err().kind(), "not_found");
    // With a grace period, condemned but kept.
    let r = repo.gc(Duration::from_secs(3600)).unwrap();
    assert!(r.removed.is_empty() && !r.waiting.is_empty(), "{r:?}");
    let r = repo.gc(Duration::ZERO).unwrap();
    // a's pack holds four layers, three still used by b: it stays. a's manifest goes.
    assert_eq!(r.removed.len(), 1, "{r:?}");
    assert!(r.removed[0].starts_with("trees/"), "{r:?}");
    repo.delete("b").unwrap();
    let r = repo.gc(Duration::ZERO).unwrap();
    assert!(r.bytes_freed >= 5 * 262144, "{r:?}");
    assert!(repo.names().unwrap().is_empty());
    assert_eq!(std::fs::read_dir(loc.join("packs")).unwrap().count(), 0);
    assert_eq!(std::fs::read_dir(loc.join("index")).unwrap().count(), 0);
    // And a new save after that writes everything again, correctly.
    let info = repo.save(&a, "a", &SaveOptions::default()).unwrap();
    assert_eq!(info.bytes_reused, 0);
    assert!(repo.load("a", &LoadOptions::default()).unwrap().exact_eq(&a));
}

#[test]
fn gc_racing_saves_never_breaks_a_committed_tree() {
    let (_dir, loc, _) = new_repo("r");
    let loc = loc.to_str().unwrap().to_string();
    let stop = Arc::new(AtomicBool::new(false));
    std::thread::scope(|s| {
        let (l2, st) = (loc.clone(), stop.clone());
        // gc with no grace, as often as it can, while names are saved and deleted.
        let g = s.spawn(move || {
            let repo = Repository::open(l2.as_str()).unwrap();
            let mut runs = 0;
            while !st.load(Ordering::Relaxed) {
                repo.gc(Duration::ZERO).unwrap();
                runs += 1;
            }
            runs
        });
        /// Stops the gc thread however this thread ends (a failed assertion included).
        struct Stop(Arc<AtomicBool>);
        impl Drop for Stop {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let _stop = Stop(stop.clone());
        let repo = Repository::open(loc.as_str()).unwrap();
        let base = checkpoint(3, 0, 0);
        let mut last = base.clone();
        repo.save(&last, "s0", &SaveOptions::default()).unwrap();
        for i in 1..40u8 {
            // Each save shares two layers with the last, whose name is deleted just before: gc
            // may condemn its packs while this save reuses them.
            let t = with_layer(last.clone(), (i % 3) as usize, i);
            repo.delete(&format!("s{}", i - 1)).unwrap();
            repo.save(&t, &format!("s{i}"), &SaveOptions { durable: false, ..Default::default() }).unwrap();
            last = t.clone();
            let back = repo.load(&format!("s{i}"), &LoadOptions::default()).unwrap();
            assert!(back.exact_eq(&t), "s{i}");
        }
        stop.store(true, Ordering::Relaxed);
        assert!(g.join().unwrap() > 0);
    });
    let repo = Repository::open(loc.as_str()).unwrap();
    assert!(repo.verify().unwrap().ok());
    repo.gc(Duration::ZERO).unwrap();
    assert!(repo.verify().unwrap().ok());
    assert_eq!(repo.names().unwrap().len(), 1);
}

#[test]
fn a_running_save_defers_gc_and_a_dead_ones_lease_does_not() {
    let (_dir, loc, repo) = new_repo("r");
    repo.save(&checkpoint(1, 0, 0), "a", &SaveOptions::default()).unwrap();
    repo.delete("a").unwrap();
    let leases = loc.join("leases");
    std::fs::create_dir_all(&leases).unwrap();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis();
    // A live save (this process) defers every deletion.
    let live = format!(r#"{{"started_ms":{now},"name":"x","owner":"{}:{}"}}"#, host.trim(), std::process::id());
    std::fs::write(leases.join("live.json"), live).unwrap();
    let r = repo.gc(Duration::ZERO).unwrap();
    assert_eq!((r.saves_running, r.removed.len()), (1, 0), "{r:?}");
    // A save whose process is gone (or whose lease expired) is not waited for.
    std::fs::remove_file(leases.join("live.json")).unwrap();
    let dead = format!(r#"{{"started_ms":{now},"name":"x","owner":"{}:4000000000"}}"#, host.trim());
    std::fs::write(leases.join("dead.json"), dead).unwrap();
    std::fs::write(leases.join("old.json"), r#"{"started_ms":1,"name":"x","owner":"elsewhere:1"}"#).unwrap();
    let r = repo.gc(Duration::ZERO).unwrap();
    assert_eq!((r.saves_running, r.leases_removed), (0, 2), "{r:?}");
    assert_eq!(r.removed.len(), 2, "the pack and the manifest: {r:?}");
}

#[test]
fn errors_say_what_is_missing_or_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let loc = dir.path().join("r");
    let l = loc.to_str().unwrap();
    let err = Repository::open(l).unwrap_err();
    assert!(err.to_string().contains("no treepack repository here") && err.to_string().contains("create"), "{err}");
    let err = load(format!("{l}@x").as_str(), &LoadOptions::default()).unwrap_err();
    assert!(err.to_string().contains("no treepack repository"), "{err}");
    let repo = Repository::create(l).unwrap();
    let err = load(format!("{l}@nope").as_str(), &LoadOptions::default()).unwrap_err();
    assert_eq!(err.kind(), "not_found");
    assert!(err.to_string().contains("no tree named \"nope\""), "{err}");
    let err = repo.save(&checkpoint(1, 0, 0), "../x", &SaveOptions::default()).unwrap_err();
    assert!(err.to_string().contains("not allowed"), "{err}");
    // A plain tree is not a repository, and a repository is not made over one.
    let plain = dir.path().join("plain");
    save(&checkpoint(1, 0, 0), plain.to_str().unwrap(), &SaveOptions::default()).unwrap();
    assert!(Repository::create(plain.to_str().unwrap()).unwrap_err().to_string().contains("holds a tree"));
    // A new path with an @ and a valid name after it names a repository tree.
    assert!(save(&checkpoint(1, 0, 0), dir.path().join("new@x").to_str().unwrap(), &SaveOptions::default()).is_err());
    // A path with an @ that exists is that path, not a repository tree.
    let odd = dir.path().join("odd@name");
    std::fs::rename(&plain, &odd).unwrap();
    assert!(load(odd.to_str().unwrap(), &LoadOptions::default()).is_ok());
    // A manifest changed on disk no longer matches the hash it is named by.
    repo.save(&checkpoint(1, 0, 0), "t", &SaveOptions::default()).unwrap();
    let tree = std::fs::read_dir(loc.join("trees")).unwrap().next().unwrap().unwrap().path();
    let mut m = std::fs::read(&tree).unwrap();
    let n = m.len();
    m[n - 100] ^= 1;
    std::fs::write(&tree, m).unwrap();
    let err = repo.load("t", &LoadOptions::default()).unwrap_err();
    assert_eq!(err.kind(), "manifest_checksum", "{err}");
    // A damaged ref is reported with its file.
    std::fs::write(loc.join("refs").join("t.json"), b"{\"tree\":\"../../etc/passwd\"}").unwrap();
    let err = repo.load("t", &LoadOptions::default()).unwrap_err();
    assert!(err.to_string().contains("refs/t.json"), "{err}");
}

#[test]
fn a_repository_in_an_object_store_shares_chunks_too() {
    let loc = "memory://repo-test/prefix";
    let repo = Repository::create(loc).unwrap();
    let a = checkpoint(3, 2, 1);
    repo.save(&a, "a", &SaveOptions::default()).unwrap();
    let info = repo.save(&with_layer(a.clone(), 1, 3), "b", &SaveOptions::default()).unwrap();
    assert_eq!(info.bytes_reused, 2 * 262144);
    assert!(load(format!("{loc}@a").as_str(), &LoadOptions::default()).unwrap().exact_eq(&a));
    repo.delete("a").unwrap();
    let r = repo.gc(Duration::ZERO).unwrap();
    assert_eq!(r.removed.len(), 1, "a's manifest; its pack still holds b's layers: {r:?}");
    assert!(repo.verify().unwrap().ok());
}

#[test]
fn a_pack_deleted_by_hand_is_reported_for_every_tree_that_needs_it() {
    let (_dir, loc, repo) = new_repo("r");
    let a = checkpoint(2, 0, 1);
    repo.save(&a, "a", &SaveOptions::default()).unwrap();
    repo.save(&with_layer(a.clone(), 1, 5), "b", &SaveOptions::default()).unwrap();
    // a's pack holds layer0, which b shares.
    let first = repo.names().unwrap();
    let pack = open(format!("{}@a", loc.display()).as_str()).unwrap().manifest().packs[0].path.clone();
    std::fs::remove_file(loc.join(&pack)).unwrap();
    for name in ["a", "b"] {
        let err = repo.load(name, &LoadOptions::default()).unwrap_err();
        assert_eq!(err.kind(), "not_found", "{err}");
        let msg = err.to_string();
        assert!(msg.contains(&format!("@{name}")) && msg.contains(&pack), "{msg}");
    }
    let v = repo.verify().unwrap();
    assert!(!v.ok());
    // Each problem names the tree (`name:key path`) and the missing file; the index of the
    // pack that is gone is reported too.
    let keys: Vec<&str> = v.problems.iter().map(|p| p.key.as_str()).collect();
    assert!(keys.iter().any(|k| k.starts_with("a:")) && keys.iter().any(|k| k.starts_with("b:")), "{:?}", v.problems);
    assert!(v.problems.iter().all(|p| p.file.contains(&pack) || p.file.contains("index/")), "{:?}", v.problems);
    // gc does not make it worse: names stay, nothing else is deleted.
    repo.gc(Duration::ZERO).unwrap();
    assert_eq!(repo.names().unwrap(), first);
}

/// The compare-and-swap overwrites stand on: a replace of a version someone else replaced fails.
pub fn compare_and_swap_replaces_only_the_version_read(loc: &Location) {
    let put = |b: &'static [u8]| vec![bytes::Bytes::from_static(b)];
    assert!(block_on(loc.replace_if_unchanged("cas/x", put(b"one"), None, false)).unwrap());
    assert!(!block_on(loc.replace_if_unchanged("cas/x", put(b"two"), None, false)).unwrap(), "exists already");
    let (_, v1) = block_on(loc.get_versioned("cas/x", 1 << 20)).unwrap().unwrap();
    assert!(block_on(loc.replace_if_unchanged("cas/x", put(b"two"), Some(&v1), false)).unwrap());
    // v1 is stale now: a writer that read it loses, and the newer bytes stay.
    assert!(!block_on(loc.replace_if_unchanged("cas/x", put(b"three"), Some(&v1), false)).unwrap());
    assert_eq!(block_on(loc.get_opt("cas/x", 1 << 20)).unwrap().unwrap().as_ref(), b"two");
}

#[test]
fn overwrites_are_compare_and_swap() {
    let dir = tempfile::tempdir().unwrap();
    compare_and_swap_replaces_only_the_version_read(&Location::parse(dir.path().join("l").to_str().unwrap()).unwrap());
    compare_and_swap_replaces_only_the_version_read(&Location::parse("memory://cas-test/p").unwrap());
    // Writers overwriting one name at once: each wins or gets `conflict`, none is lost silently.
    let loc = dir.path().join("r");
    let repo = Repository::create(loc.to_str().unwrap()).unwrap();
    repo.save(&checkpoint(1, 0, 0), "n", &SaveOptions::default()).unwrap();
    let over = SaveOptions { overwrite: true, durable: false, ..Default::default() };
    let outcomes: Vec<(u8, std::result::Result<SaveInfo, Error>)> = std::thread::scope(|s| {
        let hs: Vec<_> = (1..=6u8)
            .map(|i| {
                let (repo, over) = (&repo, &over);
                s.spawn(move || (i, repo.save(&checkpoint(1, i, i as i64), "n", over)))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut won = vec![];
    for (i, r) in &outcomes {
        match r {
            Ok(_) => won.push(*i),
            Err(e) => {
                assert_eq!(e.kind(), "conflict", "{e}");
                assert!(e.to_string().contains("another writer replaced it"), "{e}");
            }
        }
    }
    assert!(!won.is_empty());
    let back = repo.load("n", &LoadOptions::default()).unwrap();
    assert!(won.iter().any(|&i| back.exact_eq(&checkpoint(1, i, i as i64))), "the name holds a winner's tree");
}

/// A pack index is a claim about its pack, not a fact: an index whose pack is shorter than it
/// says (a lying or stale index), or whose pack is gone, must not be reused, so the next save
/// never commits a tree that cannot be read.
#[test]
fn a_lying_pack_index_is_not_reused() {
    for case in ["longer", "missing pack", "smaller"] {
        let (_dir, loc, repo) = new_repo("repo");
        let a = checkpoint(2, 0, 1);
        repo.save(&a, "step-1", &SaveOptions::default()).unwrap();
        let index_dir = loc.join("index");
        let index = std::fs::read_dir(&index_dir).unwrap().flatten().next().unwrap().path();
        let text = std::fs::read_to_string(&index).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let pack = loc.join(v["pack"].as_str().unwrap());
        let size = v["size"].as_u64().unwrap();
        match case {
            // The index claims the pack is bigger than it is (its chunks "lie past the end").
            "longer" => {
                let lie = text.replace(&format!("\"size\":{size}"), &format!("\"size\":{}", size + 8000));
                let lie = lie.replacen(",0,", ",8000,", 1);
                std::fs::write(&index, lie).unwrap();
            }
            "missing pack" => std::fs::remove_file(&pack).unwrap(),
            _ => std::fs::OpenOptions::new().write(true).open(&pack).unwrap().set_len(size / 2).unwrap(),
        }
        let info = repo.save(&a, "step-2", &SaveOptions::default()).unwrap();
        assert_eq!(info.bytes_reused, 0, "{case}: {info:?}");
        let back = repo.load("step-2", &LoadOptions::default()).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert!(back.exact_eq(&a), "{case}");
    }
}
