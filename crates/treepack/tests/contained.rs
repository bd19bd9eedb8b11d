//! Issue 50, finding 2: a location is the only place treepack reads, writes or deletes. Links
//! planted inside a location — its `packs/` folder, a repository's `packs/`, `index/` or
//! `refs/`, the manifest, a pack, a staging name, a save marker, a folder in the middle of a
//! path — must be refused with an error that names the link, by loads, saves, `gc` and
//! repository `gc` alike, and nothing outside the location may change. Each case runs in a
//! child process (tests/support/child.rs) next to canary files it must not touch; files in the
//! links' target are aged two days, so that a `gc` following a link would find them old enough
//! to delete even with the default grace.

#![cfg(unix)]

#[path = "support/child.rs"]
mod child;

use child::Outside;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
use treepack::*;

const HOUR: Duration = Duration::from_secs(3600);

fn arr(n: u64, v: u8) -> Node {
    Node::from(ArrayData::new(DType::U8, vec![n], vec![v; n as usize]).unwrap())
}

fn tree(v: u8) -> Node {
    Node::dict([("a", arr(5000, v)), ("b", arr(3000, v.wrapping_add(1)))])
}

/// 24 MiB of distinct 4 MiB chunks: a durable save writes it directly (O_DIRECT, files of 16
/// MiB or more) and, as a `.tpk` with small hashing batches, while hashing it.
fn big_tree(v: u8) -> Node {
    let n = 24usize << 20;
    let bytes: Vec<u8> = (0..n).map(|i| (i % 251) as u8 ^ (i >> 22) as u8 ^ v).collect();
    Node::dict([("big", Node::from(ArrayData::new(DType::U8, vec![n as u64], bytes).unwrap()))])
}

fn big_overwrite() -> SaveOptions {
    SaveOptions { overwrite: true, pipeline_batch_bytes: 1 << 20, pack_bytes: 64 << 20, ..Default::default() }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn overwrite() -> SaveOptions {
    SaveOptions { overwrite: true, ..Default::default() }
}

/// In the child: the links' target folder (beside the location, see `Outside`).
fn target_of(loc: &Path) -> PathBuf {
    loc.parent().unwrap().join("outside/target")
}

/// A fresh `Outside` whose target files look two days old.
fn outside() -> Outside {
    let out = Outside::new();
    let old = SystemTime::now() - 48 * HOUR;
    for e in std::fs::read_dir(out.target()).unwrap() {
        std::fs::File::options().write(true).open(e.unwrap().path()).unwrap().set_modified(old).unwrap();
    }
    out
}

/// Replace the folder `rel` of `loc` with a link to the target.
/// The two halves of a test ([`child::case`]). In the child: print what `child_does` to the
/// location, and `None` (the test returns). In the parent: a fresh outside, with `tree(1)`
/// saved at `saved_at` beneath its location (`""`: the location itself) when given.
fn child_or_outside(child_does: impl FnOnce(&Path) -> String, saved_at: Option<&str>) -> Option<Outside> {
    if let Some(loc) = child::case() {
        println!("{}", child_does(&loc));
        return None;
    }
    let out = outside();
    if let Some(rel) = saved_at {
        let at = if rel.is_empty() { out.loc.clone() } else { out.loc.join(rel) };
        save(&tree(1), s(&at), &SaveOptions::default()).unwrap();
    }
    Some(out)
}

/// A link planted at `rel` beneath the location, to `target` in the folder outside it: the
/// child's operation (test `test`) refuses it, naming it, and nothing outside changes.
fn link_refused(out: &Outside, test: &str, rel: &str, target: &str) -> PathBuf {
    let link = out.loc.join(rel);
    symlink(out.target().join(target), &link).unwrap();
    assert_link(&run(test, &out.loc), &link);
    out.assert_unchanged();
    link
}

fn link_folder(out: &Outside, rel: &str) {
    let p = out.loc.join(rel);
    std::fs::remove_dir_all(&p).unwrap();
    symlink(out.target(), &p).unwrap();
}

/// Run the child half of `test` on `loc`; its outcome line (found wherever the harness's own
/// `test NAME ... ` output put it).
fn run(test: &str, loc: &Path) -> String {
    let got = child::run(test, loc);
    match got.find("outcome ") {
        Some(i) => got[i..].lines().next().unwrap_or_default().to_string(),
        None => got,
    }
}

/// The child's outcome must be a refused link naming `link`.
fn assert_link(got: &str, link: &Path) {
    assert!(got.starts_with("outcome error link: "), "expected a refused link, got: {got}");
    let name = link.display().to_string();
    assert!(got.contains(&format!("{name}: is a symbolic link")), "the error does not name {name}: {got}");
    assert!(got.contains("replace it with"), "the error does not say what to do: {got}");
}

// --- gc of a directory location

fn gc_with_packs_linked(test: &str, grace: Duration) {
    let Some(out) = child_or_outside(|loc| child::outcome(gc(s(loc), grace)), Some("")) else { return };
    link_folder(&out, "packs");
    assert_link(&run(test, &out.loc), &out.loc.join("packs"));
    out.assert_unchanged();
}

#[test]
fn gc_refuses_a_linked_packs_folder_with_the_default_grace() {
    gc_with_packs_linked("gc_refuses_a_linked_packs_folder_with_the_default_grace", HOUR);
}

#[test]
fn gc_refuses_a_linked_packs_folder_with_zero_grace() {
    gc_with_packs_linked("gc_refuses_a_linked_packs_folder_with_zero_grace", Duration::ZERO);
}

#[test]
fn gc_refuses_a_pack_that_is_a_link_and_load_refuses_it_too() {
    let Some(out) = child_or_outside(|loc| child::outcome(gc(s(loc), Duration::ZERO)), Some("")) else { return };
    // An unreferenced pack beside the link, which gc would remove were it not refusing.
    std::fs::write(out.loc.join("packs/0000000000000000-0.tpp"), b"orphan").unwrap();
    let link = link_refused(
        &out,
        "gc_refuses_a_pack_that_is_a_link_and_load_refuses_it_too",
        "packs/deadbeef.tpp",
        "deadbeef.tpp",
    );
    // Refused before anything was removed.
    assert!(out.loc.join("packs/0000000000000000-0.tpp").exists() && link.symlink_metadata().is_ok());
    std::fs::remove_file(out.loc.join("packs/0000000000000000-0.tpp")).unwrap();
    assert!(load(s(&out.loc), &LoadOptions::default()).unwrap().exact_eq(&tree(1)));
    // The tree's own pack replaced by a link to a file outside: the load refuses it.
    let pack =
        std::fs::read_dir(out.loc.join("packs")).unwrap().map(|e| e.unwrap().path()).find(|p| p != &link).unwrap();
    std::fs::remove_file(&link).unwrap();
    std::fs::rename(&pack, out.root.join("moved.tpp")).unwrap();
    symlink(out.target().join("deadbeef.tpp"), &pack).unwrap();
    let e = load(s(&out.loc), &LoadOptions::default()).unwrap_err();
    assert_link(&child::outcome::<()>(Err(e)), &pack);
    out.assert_unchanged();
}

#[test]
fn gc_refuses_a_staging_name_that_is_a_link() {
    let Some(out) = child_or_outside(|loc| child::outcome(gc(s(loc), Duration::ZERO)), Some("")) else { return };
    let link = link_refused(&out, "gc_refuses_a_staging_name_that_is_a_link", "packs/x.tpp#1-1", "x.tpp#1-1");
    // Beside the manifest too.
    std::fs::remove_file(&link).unwrap();
    link_refused(&out, "gc_refuses_a_staging_name_that_is_a_link", "treepack.json#1-1", "config.json");
}

#[test]
fn gc_refuses_a_marker_name_that_is_a_link() {
    let Some(out) = child_or_outside(|loc| child::outcome(gc(s(loc), Duration::ZERO)), Some("")) else { return };
    link_refused(&out, "gc_refuses_a_marker_name_that_is_a_link", ".saving-1-1", "config.json");
}

// --- saves

#[test]
fn an_overwrite_refuses_a_linked_packs_folder() {
    let Some(out) = child_or_outside(|loc| child::outcome(save(&tree(7), s(loc), &overwrite())), Some("")) else {
        return;
    };
    link_folder(&out, "packs");
    assert_link(&run("an_overwrite_refuses_a_linked_packs_folder", &out.loc), &out.loc.join("packs"));
    out.assert_unchanged();
    // A first save into a folder that holds only the link: refused the same way.
    std::fs::remove_file(out.loc.join("treepack.json")).unwrap();
    assert_link(&run("an_overwrite_refuses_a_linked_packs_folder", &out.loc), &out.loc.join("packs"));
    out.assert_unchanged();
}

/// The same with packs big enough to be written directly (O_DIRECT) and pipelined.
#[test]
fn a_big_durable_overwrite_refuses_a_linked_packs_folder() {
    let test = "a_big_durable_overwrite_refuses_a_linked_packs_folder";
    let Some(out) = child_or_outside(|loc| child::outcome(save(&big_tree(7), s(loc), &big_overwrite())), Some(""))
    else {
        return;
    };
    link_folder(&out, "packs");
    assert_link(&run(test, &out.loc), &out.loc.join("packs"));
    out.assert_unchanged();
    // A first save into a folder that holds only the link: refused the same way.
    std::fs::remove_file(out.loc.join("treepack.json")).unwrap();
    assert_link(&run("an_overwrite_refuses_a_linked_packs_folder", &out.loc), &out.loc.join("packs"));
    out.assert_unchanged();
}

fn save_onto_a_linked_manifest(test: &str, opts: SaveOptions) {
    let Some(out) = child_or_outside(|loc| child::outcome(save(&tree(7), s(loc), &opts)), None) else { return };
    std::fs::create_dir_all(&out.loc).unwrap();
    let link = out.loc.join("treepack.json");
    symlink(out.target().join("config.json"), &link).unwrap();
    assert_link(&run(test, &out.loc), &link);
    out.assert_unchanged();
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the link was replaced");
}

#[test]
fn a_save_refuses_a_linked_manifest() {
    save_onto_a_linked_manifest("a_save_refuses_a_linked_manifest", SaveOptions::default());
}

#[test]
fn an_overwrite_refuses_a_linked_manifest() {
    save_onto_a_linked_manifest("an_overwrite_refuses_a_linked_manifest", overwrite());
}

// --- single files

/// In the child: plant links at the names this process's next save would take for its
/// marker (`marker`) or its staging file, then save (overwrite) to `t.tpk`.
fn save_tpk_with_planted(loc: &Path, marker: bool) -> String {
    save_tpk_with_planted_of(loc, marker, &tree(7), &overwrite())
}

/// [`save_tpk_with_planted`] of `tree` with `opts`.
fn save_tpk_with_planted_of(loc: &Path, marker: bool, tree: &Node, opts: &SaveOptions) -> String {
    let target = target_of(loc);
    for n in 0..8 {
        let name = if marker {
            format!(".t.tpk.saving-{}-{n}", std::process::id())
        } else {
            format!("t.tpk#{}-{n}", std::process::id())
        };
        symlink(target.join("config.json"), loc.join(name)).unwrap();
    }
    child::outcome(save(tree, s(&loc.join("t.tpk")), opts))
}

/// A single-file save (test `test`) into links planted at the names it would take (see
/// [`save_tpk_with_planted`]): refused, naming one (`named`), and nothing outside changed.
/// `None` in the child.
fn planted_link_refused(test: &str, marker: bool, named: &str) -> Option<Outside> {
    let out = child_or_outside(|loc| save_tpk_with_planted(loc, marker), Some("t.tpk"))?;
    let got = run(test, &out.loc);
    assert!(got.starts_with("outcome error link: ") && got.contains(named), "{got}");
    out.assert_unchanged();
    Some(out)
}

#[test]
fn a_single_file_save_refuses_a_planted_staging_link() {
    if let Some(out) = planted_link_refused("a_single_file_save_refuses_a_planted_staging_link", false, "t.tpk#") {
        assert!(load(s(&out.loc.join("t.tpk")), &LoadOptions::default()).unwrap().exact_eq(&tree(1)));
    }
}

/// The same for a big `.tpk` written while hashed and directly (the streamed put's staging
/// file is the one planted).
#[test]
fn a_big_streamed_single_file_save_refuses_a_planted_staging_link() {
    let test = "a_big_streamed_single_file_save_refuses_a_planted_staging_link";
    let Some(out) =
        child_or_outside(|loc| save_tpk_with_planted_of(loc, false, &big_tree(7), &big_overwrite()), Some("t.tpk"))
    else {
        return;
    };
    let got = run(test, &out.loc);
    assert!(got.starts_with("outcome error link: ") && got.contains("t.tpk#"), "{got}");
    out.assert_unchanged();
    assert!(load(s(&out.loc.join("t.tpk")), &LoadOptions::default()).unwrap().exact_eq(&tree(1)));
}

#[test]
fn a_single_file_save_refuses_a_planted_marker_link() {
    planted_link_refused("a_single_file_save_refuses_a_planted_marker_link", true, ".t.tpk.saving-");
}

#[test]
fn a_single_file_that_is_a_link_is_neither_overwritten_nor_loaded() {
    if let Some(loc) = child::case() {
        let r = save(&tree(7), s(&loc.join("t.tpk")), &overwrite());
        let l = load(s(&loc.join("t.tpk")), &LoadOptions::default());
        println!("{} / {}", child::outcome(r), child::outcome(l).trim_start_matches("outcome "));
        return;
    }
    let out = outside();
    std::fs::create_dir_all(&out.loc).unwrap();
    let link = out.loc.join("t.tpk");
    symlink(out.target().join("deadbeef.tpp"), &link).unwrap();
    let got = run("a_single_file_that_is_a_link_is_neither_overwritten_nor_loaded", &out.loc);
    let (saved, loaded) = got.split_once(" / ").unwrap_or((&got, ""));
    assert_link(saved, &link);
    assert_link(&format!("outcome {loaded}"), &link);
    out.assert_unchanged();
}

#[test]
fn single_file_gc_refuses_a_staging_link() {
    let Some(out) = child_or_outside(|loc| child::outcome(gc(s(&loc.join("t.tpk")), Duration::ZERO)), Some("t.tpk"))
    else {
        return;
    };
    link_refused(&out, "single_file_gc_refuses_a_staging_link", "t.tpk#1-1", "x.tpp#1-1");
}

// --- repositories

/// [`child_or_outside`] for a repository: in the child, `op` on the repository at the location;
/// in the parent, a new repository there holding `tree(1)` as `a`.
fn child_or_repository<T>(op: impl FnOnce(Repository) -> treepack::Result<T>) -> Option<(Outside, Repository)> {
    let out = child_or_outside(|loc| child::outcome(Repository::open(s(loc)).and_then(op)), None)?;
    let repo = Repository::create(s(&out.loc)).unwrap();
    repo.save(&tree(1), "a", &SaveOptions::default()).unwrap();
    Some((out, repo))
}

fn repo_gc_with_linked(test: &str, folder: &str) {
    let Some((out, repo)) = child_or_repository(|r| r.gc(Duration::ZERO)) else { return };
    repo.save(&tree(2), "b", &SaveOptions::default()).unwrap();
    repo.delete("a").unwrap();
    link_folder(&out, folder);
    assert_link(&run(test, &out.loc), &out.loc.join(folder));
    out.assert_unchanged();
}

#[test]
fn repository_gc_refuses_a_linked_packs_folder() {
    repo_gc_with_linked("repository_gc_refuses_a_linked_packs_folder", "packs");
}

#[test]
fn repository_gc_refuses_a_linked_index_folder() {
    repo_gc_with_linked("repository_gc_refuses_a_linked_index_folder", "index");
}

#[test]
fn repository_gc_refuses_a_linked_refs_folder() {
    repo_gc_with_linked("repository_gc_refuses_a_linked_refs_folder", "refs");
}

#[test]
fn repository_gc_refuses_a_linked_trees_folder() {
    repo_gc_with_linked("repository_gc_refuses_a_linked_trees_folder", "trees");
}

#[test]
fn a_repository_save_refuses_a_linked_packs_folder() {
    let Some((out, _)) = child_or_repository(|r| r.save(&tree(9), "c", &SaveOptions::default())) else { return };
    link_folder(&out, "packs");
    assert_link(&run("a_repository_save_refuses_a_linked_packs_folder", &out.loc), &out.loc.join("packs"));
    out.assert_unchanged();
}

// --- every operation of a location, with a link in the middle of the path

#[test]
fn every_operation_refuses_a_link_in_the_middle_of_a_path() {
    if let Some(loc) = child::case() {
        let l = Location::parse(s(&loc)).unwrap();
        let rel = "packs/sub/deadbeef.tpp";
        let kinds: Vec<String> = l.block_on(async {
            let kind = |r: Result<()>| r.err().map_or("ok".to_string(), |e| format!("{}: {e}", e.kind()));
            vec![
                kind(l.get_opt(rel, 1 << 20).await.map(drop)),
                kind(l.size(rel).await.map(drop)),
                kind(l.exists(rel).await.map(drop)),
                kind(l.read_range(rel, 0..8).await.map(drop)),
                kind(l.local_size(rel).map(drop)),
                kind(l.mmap(rel).map(drop)),
                kind(l.read_local_into(rel, 0, &mut [0u8; 8]).map(drop)),
                kind(l.put(rel, vec![bytes_of(b"new")], false).await),
                kind(l.put("packs/sub/new.tpp", vec![bytes_of(b"new")], true).await),
                kind(l.delete(rel).await),
                kind(l.remove_local("packs/sub/x.tpp#1-1").map(drop)),
                kind(l.list("packs/sub").await.map(drop)),
                kind(l.list("packs").await.map(drop)),
                kind(l.sync_dir("packs/sub").await),
            ]
        });
        let bad: Vec<&String> = kinds.iter().filter(|k| !k.starts_with("link: ")).collect();
        if bad.is_empty() {
            println!("outcome all refused: {}", kinds[0]);
        } else {
            println!("outcome not refused: {bad:?}");
        }
        return;
    }
    let out = outside();
    std::fs::create_dir_all(out.loc.join("packs")).unwrap();
    symlink(out.target(), out.loc.join("packs/sub")).unwrap();
    let got = run("every_operation_refuses_a_link_in_the_middle_of_a_path", &out.loc);
    assert!(got.starts_with("outcome all refused: "), "{got}");
    assert!(got.contains(&format!("{}: is a symbolic link", out.loc.join("packs/sub").display())), "{got}");
    out.assert_unchanged();
}

fn bytes_of(b: &'static [u8]) -> bytes::Bytes {
    bytes::Bytes::from_static(b)
}

// --- what stays allowed

#[test]
fn the_locations_own_path_may_be_a_link() {
    // The path the user gave is resolved as the OS does: a link there is the user's choice.
    let out = outside();
    let real = out.root.join("real");
    save(&tree(1), s(&real), &SaveOptions::default()).unwrap();
    symlink(&real, &out.loc).unwrap();
    assert!(load(s(&out.loc), &LoadOptions::default()).unwrap().exact_eq(&tree(1)));
    save(&tree(2), s(&out.loc), &overwrite()).unwrap();
    assert!(load(s(&real), &LoadOptions::default()).unwrap().exact_eq(&tree(2)));
    gc(s(&out.loc), Duration::ZERO).unwrap();
    out.assert_unchanged();
}
