//! Crash-state replay (issue 32): every state a power cut or kernel crash could leave on disk,
//! checked without pulling a plug.
//!
//! A save runs with the store's journal on (`store::journal`, the `failpoints` feature), which
//! records each file-system operation local writes perform: create+write, fsync, rename, link,
//! unlink, mkdir, directory fsync. The replay models the file system the way POSIX allows it to
//! behave after a crash (CrashMonkey and ALICE did this for real applications; this is a
//! simplified model, docs/security.md):
//!
//! - a file's data is durable only once the file was fsynced; unsynced data may be lost (the
//!   file is empty or holds what it held at its last fsync), torn (a page-aligned prefix of the
//!   new bytes), or present;
//! - a directory's entries (creates, renames, links, unlinks) are durable only once the
//!   directory was fsynced; each later one may or may not have reached the disk, independently
//!   of the others (any subset; a rename is atomic: old name or new name);
//! - what existed before the save started is durable.
//!
//! After every operation of the save (every crash point) the replay enumerates the states those
//! rules allow — every subset of the undurable directory operations (or, past 10 of them, every
//! prefix plus 200 seeded random subsets) times the file-data variants (all unsynced data lost,
//! all present, each file alone present, each file alone torn) — writes each one to a fresh
//! folder and loads it with every hash checked. The load must give the tree committed before the
//! save, the new tree, or (when there was none before) "not found": never an error on a
//! committed-looking tree, never other data. And once `save` has returned, the state in which
//! nothing undurable survived must load as the new tree. The same replay of a save with
//! `durable: false` must find violations, which shows the replay can fail.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use treepack::store::journal::{self, FsOp};
use treepack::*;

/// The journal is one per process: the tests here take turns.
static JOURNAL_TESTS: Mutex<()> = Mutex::new(());

#[derive(Clone, Debug, PartialEq)]
enum Ent {
    File(usize),
    Dir,
}

#[derive(Clone, Debug)]
enum DirOp {
    Set(OsString, Ent),
    Remove(OsString),
    Rename(OsString, OsString, Ent),
}

type Dirs = BTreeMap<PathBuf, BTreeMap<OsString, Ent>>;

/// The model: inodes with their durable and current bytes, directories with their durable and
/// current entries, and the directory operations not yet durable, in program order.
#[derive(Clone)]
struct Fs {
    root: PathBuf,
    inodes: Vec<(Vec<u8>, Vec<u8>)>,
    durable: Dirs,
    current: Dirs,
    pending: Vec<(PathBuf, DirOp)>,
}

fn split(p: &Path) -> (PathBuf, OsString) {
    (p.parent().expect("a parent").to_path_buf(), p.file_name().expect("a name").to_os_string())
}

fn apply(entries: &mut BTreeMap<OsString, Ent>, op: &DirOp) {
    match op {
        DirOp::Set(n, e) => {
            entries.insert(n.clone(), e.clone());
        }
        DirOp::Remove(n) => {
            entries.remove(n);
        }
        DirOp::Rename(from, to, e) => {
            entries.remove(from);
            entries.insert(to.clone(), e.clone());
        }
    }
}

impl Fs {
    /// What is under `root` now, all of it durable.
    fn snapshot(root: &Path) -> Fs {
        let mut fs = Fs {
            root: root.to_path_buf(),
            inodes: vec![],
            durable: Dirs::new(),
            current: Dirs::new(),
            pending: vec![],
        };
        fn walk(fs: &mut Fs, dir: &Path) {
            let mut entries = BTreeMap::new();
            for e in std::fs::read_dir(dir).unwrap() {
                let e = e.unwrap();
                if e.file_type().unwrap().is_dir() {
                    walk(fs, &e.path());
                    entries.insert(e.file_name(), Ent::Dir);
                } else {
                    let data = std::fs::read(e.path()).unwrap();
                    fs.inodes.push((data.clone(), data));
                    entries.insert(e.file_name(), Ent::File(fs.inodes.len() - 1));
                }
            }
            fs.durable.insert(dir.to_path_buf(), entries.clone());
            fs.current.insert(dir.to_path_buf(), entries);
        }
        walk(&mut fs, root);
        fs
    }

    fn change(&mut self, dir: PathBuf, op: DirOp) {
        apply(self.current.get_mut(&dir).unwrap_or_else(|| panic!("no directory {dir:?} in the model")), &op);
        self.pending.push((dir, op));
    }

    fn lookup(&self, p: &Path) -> usize {
        let (dir, name) = split(p);
        match self.current[&dir].get(&name) {
            Some(Ent::File(i)) => *i,
            other => panic!("{p:?} is {other:?}"),
        }
    }

    fn step(&mut self, op: &FsOp) {
        match op {
            FsOp::Mkdir(p) => {
                let (dir, name) = split(p);
                self.current.insert(p.clone(), BTreeMap::new());
                self.durable.insert(p.clone(), BTreeMap::new());
                self.change(dir, DirOp::Set(name, Ent::Dir));
            }
            FsOp::Write { path, data } => {
                self.inodes.push((vec![], data.clone()));
                let (dir, name) = split(path);
                self.change(dir, DirOp::Set(name, Ent::File(self.inodes.len() - 1)));
            }
            FsOp::Fsync(p) => {
                let i = self.lookup(p);
                self.inodes[i].0 = self.inodes[i].1.clone();
            }
            FsOp::FsyncDir(d) => {
                self.durable.insert(d.clone(), self.current[d].clone());
                self.pending.retain(|(dir, _)| dir != d);
            }
            FsOp::Rename { from, to } => {
                let (dir, a) = split(from);
                let (_, b) = split(to);
                let e = self.current[&dir][&a].clone();
                self.change(dir, DirOp::Rename(a, b, e));
            }
            FsOp::Link { from, to } => {
                let (dir, a) = split(from);
                let (_, b) = split(to);
                let e = self.current[&dir][&a].clone();
                self.change(dir, DirOp::Set(b, e));
            }
            FsOp::Unlink(p) => {
                let (dir, name) = split(p);
                self.change(dir, DirOp::Remove(name));
            }
        }
    }

    /// The subsets of the pending operations a crash may have persisted.
    fn subsets(&self) -> Vec<Vec<bool>> {
        let m = self.pending.len();
        if m <= 10 {
            return (0..1u32 << m).map(|bits| (0..m).map(|i| bits >> i & 1 == 1).collect()).collect();
        }
        let mut out: Vec<Vec<bool>> = (0..=m).map(|k| (0..m).map(|i| i < k).collect()).collect();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..200 {
            out.push(
                (0..m)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x & 1 == 1
                    })
                    .collect(),
            );
        }
        out
    }

    /// The directories as a crash that persisted the chosen pending operations leaves them.
    fn dirs_after(&self, chosen: &[bool]) -> Dirs {
        let mut dirs = self.durable.clone();
        for ((dir, op), keep) in self.pending.iter().zip(chosen) {
            if *keep {
                apply(dirs.get_mut(dir).expect("a modelled directory"), op);
            }
        }
        dirs
    }

    /// Write the state `dirs` with each file's bytes chosen by `data` under `out` (in place of
    /// the model's root).
    fn materialize(&self, dirs: &Dirs, data: &dyn Fn(usize) -> Vec<u8>, out: &Path) {
        fn write(dirs: &Dirs, dir: &Path, to: &Path, data: &dyn Fn(usize) -> Vec<u8>) {
            std::fs::create_dir_all(to).unwrap();
            for (name, e) in &dirs[dir] {
                match e {
                    Ent::Dir => write(dirs, &dir.join(name), &to.join(name), data),
                    Ent::File(i) => std::fs::write(to.join(name), data(*i)).unwrap(),
                }
            }
        }
        write(dirs, &self.root, out, data);
    }

    /// Inodes reachable in `dirs` whose current bytes are not durable.
    fn undurable_files(&self, dirs: &Dirs) -> Vec<usize> {
        let mut out: Vec<usize> = dirs
            .values()
            .flat_map(|d| d.values())
            .filter_map(|e| match e {
                Ent::File(i) if self.inodes[*i].0 != self.inodes[*i].1 => Some(*i),
                _ => None,
            })
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }
}

const PAGE: usize = 4096;

/// A torn write: the durable bytes, then a page-aligned prefix of the rest of the new ones.
fn torn(old: &[u8], new: &[u8]) -> Vec<u8> {
    let keep = (new.len() / 2 / PAGE * PAGE).max(old.len().min(new.len()));
    new[..keep].to_vec()
}

#[derive(Default, Debug)]
struct Report {
    states: usize,
    crash_points: usize,
    violations: Vec<String>,
}

/// Save `new` at `rel` (inside a fresh folder holding `old` there if given) with the journal on,
/// then replay every crash state.
fn replay(rel: &str, old: Option<&Node>, new: &Node, durable: bool) -> Report {
    let _turn = JOURNAL_TESTS.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("fs");
    std::fs::create_dir(&root).unwrap();
    let loc = root.join(rel);
    // Small hashing batches: directory packs are written while later chunks are hashed, and a
    // single file is streamed (written while hashed), as big saves are.
    let opts = SaveOptions {
        pack_bytes: 8 << 10,
        chunk_bytes: 4 << 10,
        pipeline_batch_bytes: 8 << 10,
        durable,
        ..Default::default()
    };
    if let Some(old) = old {
        save(old, loc.to_str().unwrap(), &opts).unwrap();
    }
    let mut fs = Fs::snapshot(&root);
    journal::start();
    let saved = save(new, loc.to_str().unwrap(), &SaveOptions { overwrite: true, ..opts });
    let ops = journal::take();
    saved.unwrap();
    assert!(ops.len() >= 4, "the journal recorded only {} operations", ops.len());

    let mut report = Report::default();
    let scratch = tmp.path().join("state");
    for k in 0..=ops.len() {
        if k > 0 {
            fs.step(&ops[k - 1]);
        }
        report.crash_points += 1;
        for chosen in fs.subsets() {
            let dirs = fs.dirs_after(&chosen);
            let files = fs.undurable_files(&dirs);
            let mut variants: Vec<Box<dyn Fn(usize) -> Vec<u8>>> = vec![];
            let inodes = fs.inodes.clone();
            variants.push(Box::new({
                let inodes = inodes.clone();
                move |i| inodes[i].0.clone()
            }));
            if !files.is_empty() {
                variants.push(Box::new({
                    let inodes = inodes.clone();
                    move |i| inodes[i].1.clone()
                }));
                for &f in &files {
                    let inodes2 = inodes.clone();
                    variants.push(Box::new(move |i| if i == f { inodes2[i].1.clone() } else { inodes2[i].0.clone() }));
                    let inodes3 = inodes.clone();
                    variants.push(Box::new(move |i| {
                        if i == f {
                            torn(&inodes3[i].0, &inodes3[i].1)
                        } else {
                            inodes3[i].1.clone()
                        }
                    }));
                }
            }
            let everything_lost = chosen.iter().all(|c| !c);
            for (vi, data) in variants.iter().enumerate() {
                let _ = std::fs::remove_dir_all(&scratch);
                fs.materialize(&dirs, data.as_ref(), &scratch);
                report.states += 1;
                let at = scratch.join(rel);
                let got = load(at.to_str().unwrap(), &LoadOptions::default());
                let what = format!("crash after op {k}/{} (subset {chosen:?}, data variant {vi})", ops.len());
                let returned = k == ops.len() && everything_lost && vi == 0;
                match (&got, old) {
                    (Ok(t), _) if t.exact_eq(new) => {}
                    (Ok(t), Some(o)) if t.exact_eq(o) && !returned => {}
                    (Err(Error::NotFound { .. }), None) if !returned => {}
                    (Ok(_), _) => report.violations.push(format!("{what}: loaded a tree that is neither old nor new")),
                    (Err(e), _) if returned => {
                        report.violations.push(format!("{what}: save() had returned, but the new tree is lost: {e}"))
                    }
                    (Err(e), _) => report.violations.push(format!("{what}: {e}")),
                }
                if returned {
                    if let Ok(t) = &got {
                        if !t.exact_eq(new) {
                            report.violations.push(format!("{what}: save() had returned, but the old tree loads"));
                        }
                    }
                }
            }
        }
    }
    report
}

fn tree(v: u8) -> Node {
    let arr = |n: usize, s: u8| {
        let bytes: Vec<u8> = (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(s).wrapping_add(v)).collect();
        Node::from(ArrayData::new(DType::U8, vec![n as u64], bytes).unwrap())
    };
    // 37 KiB in chunks of 4 KiB over several packs (small `pack_bytes`), a string stored in a
    // pack, inline scalars.
    Node::dict([
        ("v", Node::from(i64::from(v))),
        ("a", arr(20 << 10, 1)),
        ("b", arr(12 << 10, 2)),
        ("s", Node::from("x".repeat(5000) + &v.to_string())),
    ])
}

fn check(name: &str, r: &Report) {
    println!(
        "{name}: {} crash points, {} crash states checked, {} violations",
        r.crash_points,
        r.states,
        r.violations.len()
    );
    assert!(
        r.violations.is_empty(),
        "{name}: {} violations, e.g.\n{}",
        r.violations.len(),
        r.violations[..r.violations.len().min(5)].join("\n")
    );
}

/// A durable fresh save to `rel` and a durable overwrite of it, replayed and checked (`what`
/// names the layout in failures).
fn fresh_and_overwrite(rel: &str, what: &str) -> (Report, Report) {
    let fresh = replay(rel, None, &tree(1), true);
    check(&format!("fresh {what} save"), &fresh);
    let over = replay(rel, Some(&tree(1)), &tree(2), true);
    check(&format!("{what} overwrite"), &over);
    (fresh, over)
}

#[test]
fn durable_directory_saves_leave_the_old_tree_the_new_tree_or_nothing() {
    let (fresh, over) = fresh_and_overwrite("ckpt", "directory");
    assert!(fresh.crash_points >= 15 && over.crash_points >= 15, "too few operations recorded");
}

#[test]
fn durable_single_file_saves_leave_the_old_tree_the_new_tree_or_nothing() {
    fresh_and_overwrite("ckpt.tpk", ".tpk");
    // A nested location: the folders the save creates must be durable too.
    let nested = replay("runs/7/ckpt", None, &tree(3), true);
    check("save into new folders", &nested);
}

#[test]
fn the_replay_finds_what_a_save_without_fsync_can_lose() {
    // With `durable: false` a crash can lose a tree save() returned, or leave a manifest whose
    // packs never reached the disk: the replay must see both, or it proves nothing.
    let r = replay("ckpt", Some(&tree(1)), &tree(2), false);
    println!("durable: false: {} crash states, {} violations", r.states, r.violations.len());
    assert!(
        r.violations.iter().any(|v| v.contains("save() had returned")),
        "{:?}",
        &r.violations[..r.violations.len().min(3)]
    );
    assert!(
        r.violations.iter().any(|v| !v.contains("save() had returned")),
        "no corrupt committed-looking state found: {:?}",
        &r.violations[..r.violations.len().min(3)]
    );
}
