//! Crash atomicity and concurrent writers.
//!
//! `sigkill_mid_save_leaves_old_or_new_tree`: a child process overwrites a tree in a loop and is
//! killed with SIGKILL at pseudo-random moments, 60 times. After every kill the location must load
//! (with all hashes verified) as exactly the old or the new tree — never a partial one — and `gc`
//! must leave a loadable tree. `two_writers_exactly_one_wins`: concurrent creates of the same
//! location — exactly one succeeds, the other gets `AlreadyExists`, both as threads and as separate
//! processes. `reader_process_during_saves_sees_whole_trees`: a reader racing a writer process
//! sees the old tree, the new tree, or "not found" — never a mixed or corrupt one.

use std::process::{Command, Stdio};
use std::time::Duration;
use treepack::format::*;
use treepack::*;

fn version(v: u8) -> Node {
    // ~12 MiB over many chunks and packs, plus small leaves, so a save takes a while.
    let bytes: Vec<u8> = (0..12usize << 20).map(|i| ((i >> 20) as u8).wrapping_add(i as u8).wrapping_add(v)).collect();
    let big = ArrayData::new(DType::U8, vec![12 << 20], bytes).unwrap();
    Node::dict([
        ("v", Node::from(i64::from(v))),
        ("big", Node::from(big)),
        ("items", Node::list((0..2000).map(|i| Node::from(format!("{v}-{i}"))))),
    ])
}

/// This test binary re-run as a child that only runs `crash_child_helper` against `loc`.
fn child(loc: &str) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", "crash_child_helper", "--nocapture", "--test-threads=1"])
        .env("TREEPACK_CRASH_CHILD", loc)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    c
}

/// A location (directory or `.tpk`, by `layout`'s name) holding `version(1)`.
/// For each layout (a folder, a single file): `f(layout, loc, (version 1, version 2))` on a new
/// location holding version 1.
fn each_layout_at_version_1(mut f: impl FnMut(&str, &str, (Node, Node))) {
    let dir = tempfile::tempdir().unwrap();
    for layout in ["tree", "tree.tpk"] {
        let loc = dir.path().join(layout).to_str().unwrap().to_string();
        save(&version(1), &loc, &SaveOptions::default()).unwrap();
        f(layout, &loc, (version(1), version(2)));
    }
}

/// How the child overwrites: small chunks and packs so a save makes several storage writes, and
/// small hashing batches so directory saves are pipelined (packs written while hashing goes on).
fn child_opts() -> SaveOptions {
    SaveOptions {
        overwrite: true,
        chunk_bytes: 1 << 20,
        pack_bytes: 4 << 20,
        pipeline_batch_bytes: 2 << 20,
        ..Default::default()
    }
}

/// Runs only as the child of the crash tests.
#[test]
fn crash_child_helper() {
    let Ok(loc) = std::env::var("TREEPACK_CRASH_CHILD") else { return };
    if std::env::var_os("TREEPACK_FAILPOINT_ABORT_BEFORE_PUT").is_some() {
        // One overwrite that aborts before its N-th storage write.
        save(&version(2), &loc, &child_opts()).unwrap();
        std::process::exit(0);
    }
    for i in 0.. {
        save(&version(if i % 2 == 0 { 2 } else { 1 }), &loc, &child_opts()).unwrap();
    }
}

#[test]
fn sigkill_mid_save_leaves_old_or_new_tree() {
    each_layout_at_version_1(|layout, loc, (a, b)| {
        let mut seed = 0x9e37_79b9_u64;
        let mut saw = [0usize; 2];
        for _ in 0..30 {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let delay = Duration::from_millis(20 + (seed >> 33) % 300);
            let mut child = child(loc).spawn().unwrap();
            std::thread::sleep(delay);
            child.kill().unwrap(); // SIGKILL on Unix
            child.wait().unwrap();
            let got = load(loc, &LoadOptions::default()).expect("after a kill the location must still load");
            if got.exact_eq(&a) {
                saw[0] += 1;
            } else if got.exact_eq(&b) {
                saw[1] += 1;
            } else {
                panic!("{layout}: a killed save left a tree that is neither the old nor the new one");
            }
            gc(loc, Duration::ZERO).unwrap();
            assert!(load(loc, &LoadOptions::default()).is_ok(), "gc must not break the committed tree");
        }
        eprintln!("{layout}: old/new after kills: {saw:?}");
    });
}

/// Deterministic version: abort before each storage write of an overwrite in turn (packs, then
/// the manifest), and check the location after each crash.
#[test]
fn abort_before_each_write_leaves_old_or_new_tree() {
    let dir = tempfile::tempdir().unwrap();
    for layout in ["tree", "tree.tpk"] {
        let loc = dir.path().join(layout);
        let loc = loc.to_str().unwrap().to_string();
        let (a, b) = (version(1), version(2));
        let mut n = 1;
        loop {
            save(&a, &loc, &SaveOptions { overwrite: true, ..Default::default() }).unwrap();
            let status = child(&loc).env("TREEPACK_FAILPOINT_ABORT_BEFORE_PUT", n.to_string()).status().unwrap();
            let got =
                load(&loc, &LoadOptions::default()).unwrap_or_else(|e| panic!("{layout}: abort before write {n}: {e}"));
            if status.success() {
                assert!(got.exact_eq(&b), "{layout}: completed save must leave the new tree");
                break;
            }
            assert!(got.exact_eq(&a), "{layout}: abort before write {n} must leave the old tree");
            gc(&loc, Duration::ZERO).unwrap();
            assert!(load(&loc, &LoadOptions::default()).unwrap().exact_eq(&a));
            n += 1;
        }
        // The directory layout writes 3 packs then the manifest; the single file is one write.
        assert_eq!(n, if layout == "tree" { 5 } else { 2 }, "{layout}: number of storage writes in a save");
    }
}

/// `rounds` races of two writers, each for a new location of each layout (`{name}{round}` and
/// `{name}{round}.tpk` in a fresh folder): `race(folder, location, label)` runs one.
fn race_rounds(rounds: usize, name: &str, mut race: impl FnMut(&std::path::Path, &str, &str)) {
    let dir = tempfile::tempdir().unwrap();
    for round in 0..rounds {
        for ext in ["", ".tpk"] {
            let label = format!("round {round}{ext}");
            let loc = dir.path().join(format!("{name}{round}{ext}")).to_str().unwrap().to_string();
            race(dir.path(), &loc, &label);
        }
    }
}

#[test]
fn two_writers_exactly_one_wins() {
    race_rounds(20, "race", |_, loc, label| {
        let barrier = std::sync::Barrier::new(2);
        let results: Vec<Result<SaveInfo>> = std::thread::scope(|s| {
            let hs: Vec<_> = (1..=2u8)
                .map(|v| {
                    let barrier = &barrier;
                    s.spawn(move || {
                        let t = Node::dict([("writer", Node::from(i64::from(v)))]);
                        barrier.wait();
                        save(&t, loc, &SaveOptions::default())
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let ok = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(ok, 1, "{label}: {results:?}");
        assert!(results.iter().any(|r| matches!(r, Err(Error::AlreadyExists { .. }))));
        let winner = results.iter().position(Result::is_ok).unwrap() as i64 + 1;
        let got = load(loc, &LoadOptions::default()).unwrap();
        assert!(got.exact_eq(&Node::dict([("writer", Node::from(winner))])));
    });
}

/// Runs only as a child of `two_processes_exactly_one_wins`: wait for the go-file, save once,
/// and report through the exit code (0 saved, 3 already exists, 4 anything else).
#[test]
fn race_child_helper() {
    let Ok(loc) = std::env::var("TREEPACK_RACE_CHILD") else { return };
    let v: i64 = std::env::var("TREEPACK_RACE_WRITER").unwrap().parse().unwrap();
    let go = std::path::PathBuf::from(std::env::var("TREEPACK_RACE_GO").unwrap());
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !go.exists() {
        assert!(std::time::Instant::now() < deadline, "no go signal");
        std::thread::yield_now();
    }
    let big = ArrayData::new(DType::U8, vec![1 << 20], vec![v as u8; 1 << 20]).unwrap();
    let t = Node::dict([("writer", Node::from(v)), ("data", Node::from(big))]);
    let code = match save(&t, &loc, &SaveOptions::default()) {
        Ok(_) => 0,
        Err(Error::AlreadyExists { .. }) => 3,
        Err(_) => 4,
    };
    std::process::exit(code);
}

#[test]
fn two_processes_exactly_one_wins() {
    race_rounds(10, "prace", |dir, loc, label| {
        let go = dir.join(format!("go-{}", label.replace(' ', "-")));
        let mut kids: Vec<_> = (1..=2)
            .map(|v| {
                Command::new(std::env::current_exe().unwrap())
                    .args(["--exact", "race_child_helper", "--nocapture", "--test-threads=1"])
                    .env("TREEPACK_RACE_CHILD", loc)
                    .env("TREEPACK_RACE_WRITER", v.to_string())
                    .env("TREEPACK_RACE_GO", &go)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap()
            })
            .collect();
        std::fs::write(&go, b"go").unwrap();
        let codes: Vec<i32> = kids.iter_mut().map(|k| k.wait().unwrap().code().unwrap_or(-1)).collect();
        let mut sorted = codes.clone();
        sorted.sort();
        assert_eq!(sorted, vec![0, 3], "{label}: exit codes {codes:?} (0 saved, 3 already exists)");
        let winner = codes.iter().position(|&c| c == 0).unwrap() as i64 + 1;
        let got = load(loc, &LoadOptions::default()).unwrap();
        assert!(keypath::resolve(&got, "writer").unwrap().exact_eq(&Node::from(winner)), "{label}");
    });
}

#[test]
fn reader_process_during_saves_sees_whole_trees() {
    each_layout_at_version_1(|layout, loc, (a, b)| {
        // The writer overwrites 1 -> 2 -> 1 ... until killed.
        let mut writer = child(loc).spawn().unwrap();
        let (mut seen_a, mut seen_b, mut not_found) = (0, 0, 0);
        for i in 0..40 {
            match load(loc, &LoadOptions::default()) {
                Ok(t) if t.exact_eq(&a) => seen_a += 1,
                Ok(t) if t.exact_eq(&b) => seen_b += 1,
                Ok(_) => panic!("{layout}: load {i} returned a tree that is neither version"),
                // A reader that read the old manifest may find the old packs already replaced.
                Err(e) if e.kind() == "not_found" => not_found += 1,
                Err(e) => panic!("{layout}: load {i} failed with {} ({e})", e.kind()),
            }
        }
        writer.kill().unwrap();
        writer.wait().unwrap();
        eprintln!("{layout}: old {seen_a}, new {seen_b}, not found {not_found}");
        assert!(seen_a + seen_b >= 20, "{layout}: most loads see a whole tree");
    });
}
