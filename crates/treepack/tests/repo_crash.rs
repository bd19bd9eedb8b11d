//! SIGKILL during repository saves, deletes and gc: a child process saves new names (sharing
//! most chunks with the last), deletes old ones and runs gc with no grace, in a loop; it is
//! killed at pseudo-random moments 50 times. After every kill each committed name must load,
//! verified, as exactly the tree saved under it, and a gc run by the parent must keep it so.

use std::process::{Command, Stdio};
use std::time::Duration;
use treepack::*;

/// The tree saved as `s<i>`: four 1 MiB arrays, one of which changes at each step.
fn version(i: u64) -> Node {
    let layer = |k: u64| {
        let seed = if k == i % 4 { i } else { k * 1000 };
        let bytes: Vec<u8> = (0..1u64 << 20).map(|j| (j.wrapping_mul(31).wrapping_add(seed)) as u8).collect();
        Node::from(ArrayData::new(DType::U8, vec![1 << 20], bytes).unwrap())
    };
    Node::dict([("i", Node::from(i as i64)), ("a", layer(0)), ("b", layer(1)), ("c", layer(2)), ("d", layer(3))])
}

fn index(name: &str) -> Option<u64> {
    name.strip_prefix('s')?.parse().ok()
}

/// Runs only as the child of the crash test.
#[test]
fn repo_crash_child_helper() {
    let Ok(loc) = std::env::var("TREEPACK_REPO_CRASH_CHILD") else { return };
    let repo = Repository::open(loc.as_str()).unwrap();
    let start = repo.names().unwrap().iter().filter_map(|t| index(&t.name)).max().unwrap_or(0) + 1;
    let opts = SaveOptions { chunk_bytes: 256 << 10, pack_bytes: 1 << 20, ..Default::default() };
    for i in start.. {
        repo.save(&version(i), &format!("s{i}"), &opts).unwrap();
        for t in repo.names().unwrap() {
            if index(&t.name).is_some_and(|j| j + 2 < i) {
                repo.delete(&t.name).unwrap();
            }
        }
        repo.gc(Duration::ZERO).unwrap();
    }
}

#[test]
fn sigkill_during_repository_saves_and_gc_loses_no_committed_name() {
    let dir = tempfile::tempdir().unwrap();
    let loc = dir.path().join("repo").to_str().unwrap().to_string();
    Repository::create(loc.as_str()).unwrap();
    let mut seed = 0x2545_f491_u64;
    let mut checked = 0;
    for _ in 0..50 {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let delay = Duration::from_millis(30 + (seed >> 33) % 400);
        let mut c = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "repo_crash_child_helper", "--nocapture", "--test-threads=1"])
            .env("TREEPACK_REPO_CRASH_CHILD", &loc)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(delay);
        c.kill().unwrap();
        c.wait().unwrap();
        let repo = Repository::open(loc.as_str()).unwrap();
        for t in repo.names().unwrap() {
            let i = index(&t.name).unwrap();
            let back = repo.load(&t.name, &LoadOptions::default()).unwrap_or_else(|e| panic!("{}: {e}", t.name));
            assert!(back.exact_eq(&version(i)), "{} holds another tree", t.name);
            checked += 1;
        }
        let v = repo.verify().unwrap();
        assert!(v.ok(), "{:?}", v.problems);
    }
    // The parent's gc (the dead child's lease removed) keeps every name, and frees the rest.
    let repo = Repository::open(loc.as_str()).unwrap();
    repo.gc(Duration::ZERO).unwrap();
    assert!(repo.verify().unwrap().ok());
    let names = repo.names().unwrap();
    assert!(!names.is_empty() && checked >= 50, "the child committed {} names, {checked} checked", names.len());
    for t in &names {
        assert!(repo.load(&t.name, &LoadOptions::default()).unwrap().exact_eq(&version(index(&t.name).unwrap())));
    }
    assert!(std::fs::read_dir(dir.path().join("repo/leases")).unwrap().next().is_none(), "dead leases removed");
}
