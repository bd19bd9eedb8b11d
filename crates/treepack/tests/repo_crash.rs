//! SIGKILL during repository saves, deletes and gc: a child process saves new names (sharing
//! most chunks with the last), deletes old ones and runs gc with no grace, in a loop; it is
//! killed at pseudo-random moments — 50 times on local disk, 12 on S3 (moto) and 12 on Azure
//! (azurite), the object stores reached through a loopback proxy failing 10 % of requests.
//! After every kill each committed name must load, verified, as exactly the tree saved under
//! it, and a gc run by the parent must keep it so.

#[path = "support/servers.rs"]
mod servers;

use std::process::{Command, Stdio};
use std::time::Duration;
use treepack::*;

/// The repository location the child is told about: its text and storage options (as JSON).
fn open_location(text: &str, options_json: &str) -> Location {
    let o: StorageOptions = serde_json::from_str(options_json).unwrap();
    Location::parse_with(text, &o).unwrap()
}

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
    let options = std::env::var("TREEPACK_REPO_CRASH_OPTIONS").unwrap_or_else(|_| "{}".into());
    let repo = Repository::open(open_location(&loc, &options)).unwrap();
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

/// Kill the child `kills` times while it works on the repository at `text`, checking every
/// committed name after each kill; `env` goes to the child too (the Azure emulator's address).
fn kill_and_check(text: &str, options: &StorageOptions, kills: usize, max_delay_ms: u64, env: &[(&str, String)]) {
    let options_json = serde_json::to_string(options).unwrap();
    let loc = || open_location(text, &options_json);
    Repository::create(loc()).unwrap();
    let mut seed = 0x2545_f491_u64;
    let mut checked = 0;
    for _ in 0..kills {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let delay = Duration::from_millis(30 + (seed >> 33) % max_delay_ms);
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["--exact", "repo_crash_child_helper", "--nocapture", "--test-threads=1"])
            .env("TREEPACK_REPO_CRASH_CHILD", text)
            .env("TREEPACK_REPO_CRASH_OPTIONS", &options_json)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut c = cmd.spawn().unwrap();
        std::thread::sleep(delay);
        c.kill().unwrap();
        c.wait().unwrap();
        let repo = Repository::open(loc()).unwrap();
        for t in repo.names().unwrap() {
            let i = index(&t.name).unwrap();
            let back = repo.load(&t.name, &LoadOptions::default()).unwrap_or_else(|e| panic!("{text}@{}: {e}", t.name));
            assert!(back.exact_eq(&version(i)), "{} holds another tree", t.name);
            checked += 1;
        }
        let v = repo.verify().unwrap();
        assert!(v.ok(), "{text}: {:?}", v.problems);
    }
    // The parent's gc (the dead child's leases removed) keeps every name, and frees the rest.
    let repo = Repository::open(loc()).unwrap();
    repo.gc(Duration::ZERO).unwrap();
    assert!(repo.verify().unwrap().ok());
    let names = repo.names().unwrap();
    assert!(
        !names.is_empty() && checked >= kills / 2,
        "{text}: the child committed {} names, {checked} checked",
        names.len()
    );
    for t in &names {
        assert!(repo.load(&t.name, &LoadOptions::default()).unwrap().exact_eq(&version(index(&t.name).unwrap())));
    }
}

#[test]
fn sigkill_during_repository_saves_and_gc_loses_no_committed_name() {
    let dir = tempfile::tempdir().unwrap();
    let loc = dir.path().join("repo").to_str().unwrap().to_string();
    kill_and_check(&loc, &StorageOptions::new(), 50, 400, &[]);
    assert!(std::fs::read_dir(dir.path().join("repo/leases")).unwrap().next().is_none(), "dead leases removed");
}

#[test]
fn sigkill_during_repository_saves_on_object_stores_through_faults() {
    let moto = servers::moto("bucket");
    let flaky = servers::Proxy::start(moto.port, 0.1);
    let s3: StorageOptions = [
        ("endpoint", flaky.url()),
        ("region", "us-east-1".into()),
        ("access_key_id", "testing".into()),
        ("secret_access_key", "testing".into()),
        ("retry_timeout_secs", "30".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    // Object stores answer slower: longer runs, so that the child commits between kills.
    kill_and_check("s3://bucket/crash", &s3, 12, 1500, &[]);
    let az = servers::azurite("container");
    let flaky_az = servers::Proxy::start(az.port, 0.1);
    std::env::set_var("AZURITE_BLOB_STORAGE_URL", flaky_az.url());
    let o: StorageOptions = [("use_emulator", "true"), ("retry_timeout_secs", "30")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    kill_and_check("az://container/crash", &o, 12, 1500, &[("AZURITE_BLOB_STORAGE_URL", flaky_az.url())]);
    assert!(flaky.faults() + flaky_az.faults() >= 10, "the proxies injected faults");
}
