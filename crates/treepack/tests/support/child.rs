//! Hostile cases in a child process: the test binary runs itself again for one test, with a
//! time limit and an address-space limit, so that a crash (a stack overflow aborts the whole
//! process), a hang or a huge allocation fails that test instead of taking the suite down.
//!
//! A test using it has two halves, chosen by [`case`]:
//!
//! ```ignore
//! #[test]
//! fn deep_metadata() {
//!     if let Some(dir) = child::case() {
//!         // the child: do the hostile thing to `dir`, print what happened
//!         println!("{}", child::outcome(treepack::load(&dir)));
//!         return;
//!     }
//!     let out = Outside::new(); // canary files the case must not touch
//!     /* build the hostile location in out.loc */
//!     let got = child::run("deep_metadata", &out.loc);
//!     assert!(got.contains("error limit"), "{got}");
//!     out.assert_unchanged();
//! }
//! ```
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CASE_ENV: &str = "TREEPACK_CHILD_CASE";
/// The child's limits: as the hostile Python cases have.
pub const TIME_LIMIT: Duration = Duration::from_secs(10);
pub const MEMORY_LIMIT: u64 = 2 << 30;

/// In the child: the path the case works on. `None` in the parent.
pub fn case() -> Option<PathBuf> {
    std::env::var_os(CASE_ENV).map(PathBuf::from)
}

/// A case's result as one line the parent can match: `ok` or `error <kind>: <message>`.
pub fn outcome<T>(r: treepack::Result<T>) -> String {
    match r {
        Ok(_) => "outcome ok".into(),
        Err(e) => format!("outcome error {}: {e}", e.kind()),
    }
}

/// Run the test `test_name` of this binary again as a child working on `path`; returns the
/// line it printed starting with `outcome ` (the whole output if there is none). Panics if the
/// child was killed by a signal (a stack overflow's abort, the memory limit), ran past the time
/// limit or failed.
pub fn run(test_name: &str, path: &Path) -> String {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut cmd = Command::new(exe);
    cmd.args([test_name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CASE_ENV, path)
        .env("RUST_BACKTRACE", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                let lim = libc::rlimit { rlim_cur: MEMORY_LIMIT, rlim_max: MEMORY_LIMIT };
                if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut child = cmd.spawn().expect("start the child");
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for the child") {
            break s;
        }
        if start.elapsed() > TIME_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{test_name}: the hostile case ran past {TIME_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let output = child.wait_with_output().expect("the child's output");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = status.signal() {
            panic!("{test_name}: the hostile case was killed by signal {sig}\nstdout: {stdout}\nstderr: {stderr}");
        }
    }
    assert!(status.success(), "{test_name}: the child failed ({status})\nstdout: {stdout}\nstderr: {stderr}");
    // With --nocapture the harness writes `test NAME ... ` on the line the child's output starts.
    stdout.lines().find_map(|l| l.find("outcome ").map(|i| l[i..].to_string())).unwrap_or(stdout)
}

/// A test's folder: `loc` for the hostile location (not created) and `outside`, canary files
/// that no operation on `loc` may read into a tree, change or delete.
pub struct Outside {
    _dir: tempfile::TempDir,
    /// The folder the test works in.
    pub root: PathBuf,
    /// Where the hostile location goes.
    pub loc: PathBuf,
    /// The canaries: `canary.txt`, `secret.txt`, and `target/` (a folder of files named like
    /// a tree's: `config.json`, `deadbeef.tpp`, a staging name) for links to point at.
    pub outside: PathBuf,
    before: BTreeMap<String, String>,
}

/// The bytes of `secret.txt`: a test that a read stays inside checks they appear nowhere.
pub const SECRET: &[u8] = b"SECRET-0123456789: must never be read into a tree\n";

impl Outside {
    pub fn new() -> Outside {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path().to_path_buf();
        let outside = root.join("outside");
        let target = outside.join("target");
        std::fs::create_dir_all(&target).expect("mkdir");
        std::fs::write(outside.join("canary.txt"), b"canary: must never change\n").expect("write");
        std::fs::write(outside.join("secret.txt"), SECRET).expect("write");
        std::fs::write(target.join("config.json"), b"{\"user\": \"data\"}\n").expect("write");
        std::fs::write(target.join("deadbeef.tpp"), [0u8; 64]).expect("write");
        std::fs::write(target.join("x.tpp#1-1"), [0u8; 8]).expect("write");
        let mut o = Outside { _dir: dir, loc: root.join("loc"), root, outside, before: BTreeMap::new() };
        o.before = o.snapshot();
        o
    }

    /// The folder links in hostile cases point at.
    pub fn target(&self) -> PathBuf {
        self.outside.join("target")
    }

    fn snapshot(&self) -> BTreeMap<String, String> {
        fn walk(dir: &Path, base: &Path, out: &mut BTreeMap<String, String>) {
            let Ok(rd) = std::fs::read_dir(dir) else { return };
            for e in rd.flatten() {
                let p = e.path();
                let rel = p.strip_prefix(base).unwrap_or(&p).display().to_string();
                let Ok(m) = std::fs::symlink_metadata(&p) else { continue };
                if m.file_type().is_symlink() {
                    out.insert(
                        rel,
                        format!("link {}", std::fs::read_link(&p).map(|t| t.display().to_string()).unwrap_or_default()),
                    );
                } else if m.is_dir() {
                    out.insert(rel, "dir".into());
                    walk(&p, base, out);
                } else {
                    let data = std::fs::read(&p).unwrap_or_default();
                    out.insert(rel, format!("file {} {}", data.len(), blake3::hash(&data).to_hex()));
                }
            }
        }
        let mut out = BTreeMap::new();
        walk(&self.outside, &self.outside, &mut out);
        out
    }

    /// Panics naming every entry of `outside` added, removed or changed since [`Outside::new`].
    pub fn assert_unchanged(&self) {
        let after = self.snapshot();
        let changed: Vec<_> =
            self.before.keys().chain(after.keys()).filter(|k| self.before.get(*k) != after.get(*k)).collect();
        assert!(changed.is_empty(), "files outside the location changed: {changed:?}");
    }
}
