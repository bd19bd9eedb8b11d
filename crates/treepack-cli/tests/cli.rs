//! The `treepack` binary, driven as a user would (the commands shown in the README).

use assert_cmd::Command;

fn tp() -> Command {
    Command::cargo_bin("treepack").unwrap()
}

/// A temporary folder holding the demo tree at `name`; returns the folder (keep it alive) and the
/// tree's path.
fn demo(name: &str) -> (tempfile::TempDir, String) {
    let d = tempfile::tempdir().unwrap();
    let ckpt = d.path().join(name).to_str().unwrap().to_string();
    run_ok(&["demo", &ckpt]);
    (d, ckpt)
}

/// Assert that `out` contains each of `parts` (naming the first missing one, with `out`).
fn assert_contains(out: &str, parts: &[&str]) {
    for p in parts {
        assert!(out.contains(p), "no {p:?} in: {out}");
    }
}

fn run_ok(args: &[&str]) -> String {
    let out = tp().args(args).output().unwrap();
    assert!(out.status.success(), "{args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn demo_inspect_ls_cat_verify() {
    let d = tempfile::tempdir().unwrap();
    let ckpt = d.path().join("ckpt");
    let c = ckpt.to_str().unwrap();
    let out = run_ok(&["demo", c]);
    assert_contains(&out, &["loaded back: identical", "kernel: float32[512, 256]"]);

    let out = run_ok(&["inspect", c]);
    assert_contains(&out, &["embed: bfloat16[1000, 64]", "totals: 41 leaves, 18 arrays"]);

    let out = run_ok(&["inspect", c, "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["totals"]["leaves"], 41);
    let kernel = v["leaves"].as_array().unwrap().iter().find(|l| l["path"] == "params/dense/kernel").unwrap();
    assert_eq!(kernel["shape"], serde_json::json!([512, 256]));
    assert_eq!(kernel["dtype"], "float32");

    let out = run_ok(&["ls", c, "params/**"]);
    assert_eq!(out.lines().count(), 3, "{out}");
    assert!(out.lines().next().unwrap().starts_with("params/dense/kernel\tfloat32[512, 256]"));

    // kernel[i, j] = ((i*256 + j) % 97) * 0.01 - 0.3 in float32: [0, 254] -> 60*0.01-0.3
    let out = run_ok(&["cat", c, "params/dense/kernel[0:2, -2:]"]);
    assert!(out.starts_with("float32[2, 2] =\n"), "{out}");
    assert!(out.contains("[[0.29999995, 0.31],\n [-0.050000012, -0.04000002]]"), "{out}");

    let out = run_ok(&["cat", c, "scalars/name"]);
    assert_eq!(out.trim(), "\"treepack demo ✓\"");
    let out = run_ok(&["cat", c, "odd_keys/with~1slash"]);
    assert_eq!(out.trim(), "\"escaped in key paths\"");
    let out = run_ok(&["cat", c, "dtypes/unicode3"]);
    assert!(out.contains("[\"hé\", \"∑xy\"]"), "{out}");

    let out = run_ok(&["verify", c]);
    assert!(out.starts_with("OK: "), "{out}");
}

#[test]
fn verify_names_the_corrupt_chunk_and_fails() {
    let (_d, c) = demo("ckpt.tpk");
    let (ckpt, c) = (std::path::PathBuf::from(&c), c.as_str());
    let mut bytes = std::fs::read(&ckpt).unwrap();
    bytes[200] ^= 0xff; // inside the first chunk (params/dense/kernel)
    std::fs::write(&ckpt, &bytes).unwrap();
    let out = tp().args(["verify", c]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let s = String::from_utf8(out.stdout).unwrap();
    assert_contains(&s, &["CORRUPT params/dense/kernel chunk 0", "FAILED"]);
    let out = tp().args(["verify", c, "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], false);
    assert_eq!(v["problems"][0]["key"], "params/dense/kernel");
}

#[test]
fn errors_are_clear_and_exit_2() {
    let d = tempfile::tempdir().unwrap();
    let out = tp().args(["inspect", d.path().join("nope").to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let e = String::from_utf8(out.stderr).unwrap();
    assert!(e.contains("no treepack tree found"), "{e}");
    let c = d.path().join("c");
    run_ok(&["demo", c.to_str().unwrap()]);
    let out = tp().args(["cat", c.to_str().unwrap(), "params/nope"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let e = String::from_utf8(out.stderr).unwrap();
    assert!(e.contains("has no child `nope`") && e.contains("dense"), "{e}");
    // Which file: the message names it (a new user's finding, session 45).
    assert!(e.contains(&format!("cannot read `params/nope` of `{}`", c.display())), "{e}");
    let out = tp().args(["cat", c.to_str().unwrap(), "params/dense/kernel[999]"]).output().unwrap();
    assert!(String::from_utf8(out.stderr).unwrap().contains("out of bounds"));
    let out = tp().args(["demo", c.to_str().unwrap()]).output().unwrap();
    assert!(String::from_utf8(out.stderr).unwrap().contains("already exists"));
}

#[test]
fn gc_command() {
    let d = tempfile::tempdir().unwrap();
    let c = d.path().join("c");
    run_ok(&["demo", c.to_str().unwrap()]);
    std::fs::write(c.join("packs/0000000000000000-0.tpp"), b"orphan").unwrap();
    let out = run_ok(&["gc", c.to_str().unwrap(), "--grace-secs", "0"]);
    assert!(out.contains("removed packs/0000000000000000-0.tpp"), "{out}");
    run_ok(&["verify", c.to_str().unwrap()]);
}

/// A folder outside the location, of files named like a tree's (and two days old, so that a gc
/// following a link would find them old enough), and a snapshot of its bytes.
#[cfg(unix)]
fn outside_target(d: &std::path::Path) -> (std::path::PathBuf, Vec<(String, Vec<u8>)>) {
    let target = d.join("outside");
    std::fs::create_dir_all(&target).unwrap();
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(48 * 3600);
    for (name, bytes) in [
        ("config.json", &b"{\"user\": \"data\"}\n"[..]),
        ("deadbeef.tpp", &[0u8; 64][..]),
        ("x.tpp#1-1", &[0u8; 8][..]),
    ] {
        std::fs::write(target.join(name), bytes).unwrap();
        std::fs::File::options().write(true).open(target.join(name)).unwrap().set_modified(old).unwrap();
    }
    let snap = snapshot(&target);
    (target, snap)
}

#[cfg(unix)]
fn snapshot(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap())
        })
        .collect();
    v.sort();
    v
}

/// `args` fails with exit status 2 and a message naming `link` as a link.
#[cfg(unix)]
fn refuses_link(args: &[&str], link: &std::path::Path) {
    let out = tp().args(args).output().unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {e}");
    assert!(e.contains(&format!("{}: is a symbolic link", link.display())), "{args:?}: {e}");
    assert!(e.contains("replace it with a real folder"), "{args:?}: {e}");
}

#[cfg(unix)]
#[test]
fn gc_and_repo_gc_refuse_links_inside_the_location() {
    let (d, ckpt) = demo("ckpt");
    let (target, before) = outside_target(d.path());
    let packs = std::path::Path::new(&ckpt).join("packs");
    std::fs::remove_dir_all(&packs).unwrap();
    std::os::unix::fs::symlink(&target, &packs).unwrap();
    refuses_link(&["gc", &ckpt], &packs);
    refuses_link(&["gc", &ckpt, "--grace-secs", "0"], &packs);
    assert_eq!(snapshot(&target), before, "files outside the location changed");

    let (_d2, ckpt) = demo("ckpt");
    let repo = d.path().join("repo");
    let r = repo.to_str().unwrap();
    run_ok(&["repo", "init", r]);
    run_ok(&["repo", "save-from", r, "v1", &ckpt, "-q"]);
    run_ok(&["repo", "rm", r, "v1"]);
    for folder in ["index", "packs", "refs"] {
        let real = repo.join(format!("{folder}.real"));
        std::fs::rename(repo.join(folder), &real).unwrap();
        std::os::unix::fs::symlink(&target, repo.join(folder)).unwrap();
        refuses_link(&["repo", "gc", r, "--grace-secs", "0"], &repo.join(folder));
        assert_eq!(snapshot(&target), before, "files outside the repository changed ({folder})");
        std::fs::remove_file(repo.join(folder)).unwrap();
        std::fs::rename(&real, repo.join(folder)).unwrap();
    }
    // With the folders real again, the repository's gc works.
    let out = run_ok(&["repo", "gc", r, "--grace-secs", "0"]);
    assert!(out.contains("removed "), "{out}");
}

#[path = "../../treepack/tests/support/servers.rs"]
mod servers;

#[test]
fn cp_to_s3_and_back_with_storage_options() {
    let moto = servers::moto("bucket");
    let ep = format!("endpoint={}", moto.url());
    let o = ["-o", &ep, "-o", "region=us-east-1", "-o", "access_key_id=k", "-o", "secret_access_key=s"];
    let d = tempfile::tempdir().unwrap();
    let local = d.path().join("ckpt");
    let l = local.to_str().unwrap();
    run_ok(&["demo", l]);
    let out = run_ok(&[&o[..], &["cp", l, "s3://bucket/runs/ckpt"]].concat());
    assert!(out.contains("copied 41 leaves"), "{out}");
    let out = run_ok(&[&o[..], &["inspect", "s3://bucket/runs/ckpt"]].concat());
    assert!(out.contains("totals: 41 leaves, 18 arrays"), "{out}");
    let out = run_ok(&[&o[..], &["verify", "s3://bucket/runs/ckpt"]].concat());
    assert!(out.starts_with("OK:"), "{out}");
    let out = run_ok(&[&o[..], &["cat", "s3://bucket/runs/ckpt", "params/dense/kernel[0, 0:3]"]].concat());
    assert!(out.contains("float32[3]"), "{out}");
    // Without --overwrite a second copy is refused with a clear message and exit code 2.
    let out = tp().args([&o[..], &["cp", l, "s3://bucket/runs/ckpt"]].concat()).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("already exists"));
    // And back to a single local file, identical leaf for leaf.
    let back = d.path().join("back.tpk");
    run_ok(&[&o[..], &["cp", "s3://bucket/runs/ckpt", back.to_str().unwrap()]].concat());
    let a = treepack::load(l, &Default::default()).unwrap();
    let b = treepack::load(back.to_str().unwrap(), &Default::default()).unwrap();
    assert!(a.exact_eq(&b));
    // A malformed option is refused before anything happens.
    let out = tp().args(["-o", "novalue", "inspect", l]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("KEY=VALUE"));
}

/// Issue 23: `cat` names a record's type, shows a custom node's value, and list indexes never
/// wrap around (negative ones count from the end, as in Python).
#[test]
fn cat_shows_types_values_and_exact_indexes() {
    let (_d, c) = demo("ckpt");
    let c = c.as_str();
    let out = run_ok(&["cat", c, "config"]);
    assert!(out.starts_with("record demo.Config:\n"), "{out}");
    assert!(out.contains("layers: 2"), "{out}");
    let out = run_ok(&["cat", c, "custom"]);
    assert!(out.starts_with("custom demo.Image {\"mode\":\"L\",\"size\":[4,4]}:\n"), "{out}");

    assert_eq!(run_ok(&["cat", c, "history/-1/0"]).trim(), "2");
    assert_eq!(run_ok(&["cat", c, "history/1/-2"]).trim(), "2");
    for bad in ["history/2", "history/5", "history/-3", "history/0/2"] {
        let out = tp().args(["cat", c, bad]).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad}: {}", String::from_utf8_lossy(&out.stdout));
        let e = String::from_utf8(out.stderr).unwrap();
        assert!(e.contains("out of range"), "{bad}: {e}");
    }
}

#[test]
fn recompress_inspect_shows_codecs_and_ratios_and_loads_back() {
    let (d, ckpt) = demo("ckpt");
    let z = d.path().join("z.tpk");
    let z = z.to_str().unwrap();
    let out = run_ok(&["recompress", &ckpt, z, "--compression", "zstd:5"]);
    assert!(out.contains("copied 41 leaves"), "{out}");
    assert!(out.contains("chunks ") && out.contains("x)"), "{out}");
    let out = run_ok(&["inspect", z]);
    // A compressed single file stores its manifest compressed too (format 1.6).
    assert!(out.contains("format 1.6"), "{out}");
    // The demo kernel is a repeating pattern: it compresses.
    let kernel = out.lines().find(|l| l.contains("kernel: float32[512, 256]")).unwrap();
    assert!(kernel.contains("zstd ") && kernel.contains("x "), "{kernel}");
    assert!(out.contains("compression: chunks "), "{out}");
    let v: serde_json::Value = serde_json::from_str(&run_ok(&["inspect", z, "--json"])).unwrap();
    let t = &v["totals"];
    assert!(t["chunk_stored_bytes"].as_u64().unwrap() * 2 < t["chunk_bytes"].as_u64().unwrap(), "{t}");
    assert!(run_ok(&["verify", z]).starts_with("OK: "));
    // Back to raw: byte-identical to the original save's chunks (format 1.4 for its dicts, not
    // for codecs).
    let raw = d.path().join("raw");
    run_ok(&["cp", z, raw.to_str().unwrap()]);
    assert!(run_ok(&["inspect", raw.to_str().unwrap()]).contains("format 1.4"));
    // A bad policy is refused before anything is read or written.
    let bad = d.path().join("bad");
    let out = tp().args(["cp", &ckpt, bad.to_str().unwrap(), "--compression", "zstd:99"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let e = String::from_utf8(out.stderr).unwrap();
    assert!(e.contains("bad compression policy") && e.contains("out of range"), "{e}");
    assert!(!bad.exists());
}

/// Regression: `treepack ls ckpt | head -1` panicked ("failed printing to stdout: Broken pipe")
/// once `head` stopped reading; it must end quietly, as Unix tools do.
#[cfg(unix)]
#[test]
fn a_closed_output_pipe_ends_the_command_quietly() {
    use std::io::Read;
    // More lines than a pipe buffers (64 KiB), so that the writer meets the closed pipe.
    let d = tempfile::tempdir().unwrap();
    let ckpt = d.path().join("many").to_str().unwrap().to_string();
    let tree = treepack::Node::dict((0..20_000).map(|i| (format!("leaf-{i:05}"), treepack::Node::from(i as i64))));
    treepack::save(&tree, ckpt.as_str(), &treepack::SaveOptions::default()).unwrap();
    let exe = assert_cmd::cargo::cargo_bin("treepack");
    let mut child = std::process::Command::new(exe)
        .args(["ls", &ckpt])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 16];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap(); // then the pipe is closed
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    child.wait().unwrap();
    assert!(!err.contains("panicked"), "{err}");
}

/// Annotated arrays (format 1.3, torch tensors) show what the writer had, in `ls` and in
/// `inspect --json`.
#[test]
fn ls_and_inspect_show_array_annotations() {
    let golden = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/golden/demo-torch");
    let ls = run_ok(&["ls", golden]);
    let weight = ls.lines().find(|l| l.starts_with("weight\t")).unwrap();
    assert!(weight.starts_with("weight\tbfloat16[256, 256]  128.0 KiB  torch.nn.Parameter  2 chunks"), "{weight}");
    let step = ls.lines().find(|l| l.starts_with("step\t")).unwrap();
    assert_eq!(step, "step\tint64[2]  16 B  torch.Tensor  inline");
    let json: serde_json::Value = serde_json::from_str(&run_ok(&["inspect", "--json", golden])).unwrap();
    let leaves = json["leaves"].as_array().unwrap();
    let step = leaves.iter().find(|l| l["path"] == "step").unwrap();
    assert_eq!(step["as"], serde_json::json!({"type": "torch.Tensor", "device": "cuda:0"}));
    assert_eq!(json["version"], serde_json::json!([1, 4]));
}

#[test]
fn hash_and_repositories_from_the_command_line() {
    let (d, ckpt) = demo("ckpt");
    let root = run_ok(&["hash", &ckpt]).trim().to_string();
    assert_eq!(root.len(), 64);
    let tpk = d.path().join("copy.tpk").to_str().unwrap().to_string();
    run_ok(&["cp", &ckpt, &tpk, "--compression", "zstd", "-q"]);
    assert_eq!(run_ok(&["hash", &tpk]).trim(), root, "one root whatever the layout and codec");
    assert_ne!(run_ok(&["hash", &ckpt, "--key", "params"]).trim(), root);

    let repo = d.path().join("repo").to_str().unwrap().to_string();
    let out = run_ok(&["repo", "init", &repo]);
    assert!(out.contains("repository ready"), "{out}");
    let out = run_ok(&["repo", "save-from", &repo, "v1", &ckpt, "-q"]);
    assert!(out.contains(&format!("root {root}")), "{out}");
    // The same tree again: every chunk is already there.
    let out = run_ok(&["cp", &ckpt, &format!("{repo}@v2"), "-q"]);
    assert!(out.contains("already in the repository, reused"), "{out}");
    let v2 = format!("{repo}@v2");
    // LOCATION@NAME wherever a location is taken.
    assert_eq!(run_ok(&["hash", &v2]).trim(), root);
    assert!(run_ok(&["inspect", &v2]).contains("kernel: float32[512, 256]"));
    assert!(run_ok(&["ls", &v2, "params/**"]).contains("params/dense/kernel"));
    assert!(run_ok(&["verify", &v2]).starts_with("OK"));
    let out = run_ok(&["repo", "ls", &repo]);
    assert!(out.contains("v1 ") && out.contains("v2 ") && out.contains("2 trees"), "{out}");
    let listed: serde_json::Value = serde_json::from_str(&run_ok(&["repo", "ls", &repo, "--json"])).unwrap();
    assert_eq!(listed[1]["root"], root.as_str());
    assert!(listed[1]["bytes_reused"].as_u64().unwrap() > 600_000, "{listed}");
    run_ok(&["repo", "rm", &repo, "v1"]);
    let out = run_ok(&["repo", "gc", &repo, "--grace-secs", "0"]);
    assert!(out.contains("removed trees/"), "v1's manifest goes, the shared packs stay: {out}");
    assert!(run_ok(&["repo", "verify", &repo]).starts_with("OK"));
    let out = tp().args(["inspect", &format!("{repo}@v1")]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no tree named \"v1\""));
}

#[test]
fn diff_exits_like_diff() {
    let (d, ckpt) = demo("ckpt");
    let copy = d.path().join("copy.tpk").to_str().unwrap().to_string();
    run_ok(&["cp", &ckpt, &copy, "-q"]);
    let out = tp().args(["diff", &ckpt, &copy]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "identical");
    let other = d.path().join("other").to_str().unwrap().to_string();
    run_ok(&["demo", &other]);
    // The demo writes the same tree: equal. A different tree (the demo's params alone) differs.
    assert_eq!(tp().args(["diff", &ckpt, &other]).output().unwrap().status.code(), Some(0));
    let repo = d.path().join("r").to_str().unwrap().to_string();
    run_ok(&["repo", "init", &repo]);
    run_ok(&["cp", &ckpt, &format!("{repo}@a"), "-q"]);
    let out = tp().args(["diff", &format!("{repo}@a"), &ckpt, "--json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "a copy in a repository is the same tree");
    let out = tp().args(["diff", &ckpt, &format!("{ckpt}/../nothing")]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn convert_to_and_from_safetensors() {
    let (d, ckpt) = demo("ckpt");
    // The demo tree holds complex numbers, strings and records: safetensors cannot, and the
    // error says which leaf.
    let st = d.path().join("m.safetensors").to_str().unwrap().to_string();
    let out = tp().args(["convert", &ckpt, &st]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(err.contains("`dtypes/complex64`: safetensors has no complex64"), "{err}");
    // Its params alone convert, and come back as the same tree.
    let only = d.path().join("only.tpk").to_str().unwrap().to_string();
    let tree = treepack::load(ckpt.as_str(), &treepack::LoadOptions::default()).unwrap();
    let treepack::Tree::Dict(items) = tree else { panic!() };
    let p = items.into_iter().find(|(k, _)| matches!(k, treepack::Key::Str(s) if s == "params")).unwrap().1;
    treepack::save(&p, only.as_str(), &treepack::SaveOptions::default()).unwrap();
    let out = run_ok(&["convert", &only, &st]);
    assert!(out.contains("converted") && out.contains("tensors"), "{out}");
    let back = d.path().join("back").to_str().unwrap().to_string();
    // Nested again at "." (names are read as stored by default).
    run_ok(&["convert", &st, &back, "--separator", "."]);
    let out = tp().args(["diff", &only, &back]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn export_import_and_schema() {
    let (d, ckpt) = demo("ckpt");
    let doc = d.path().join("t.json").to_str().unwrap().to_string();
    let err = run_ok(&["export", &ckpt, "--json", "--compression", "zstd", "--output", &doc]);
    assert!(err.is_empty(), "nothing on stdout when writing a file: {err}");
    // The document is a location: ls, hash (the tree's root), verify.
    assert_eq!(run_ok(&["hash", &doc]), run_ok(&["hash", &ckpt]));
    assert!(run_ok(&["ls", &doc]).contains("params/dense/kernel"));
    assert!(run_ok(&["verify", &doc]).starts_with("OK"));
    // To stdout, base64; and refused over an existing file without --overwrite.
    let text = run_ok(&["export", &ckpt, "--encoding", "base64"]);
    assert!(text.starts_with("{\"format\":\"treepack-json\"") && text.contains("\"encoding\":\"base64\""));
    let out = tp().args(["export", &ckpt, "--output", &doc]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--overwrite"));
    // Import stores it anywhere, same root; from stdin too.
    let back = d.path().join("back.tpk").to_str().unwrap().to_string();
    assert!(run_ok(&["import", &doc, &back]).starts_with("imported 41 leaves"));
    assert_eq!(run_ok(&["hash", &back]), run_ok(&["hash", &ckpt]));
    let piped = d.path().join("piped").to_str().unwrap().to_string();
    assert!(tp().args(["import", "-", &piped]).write_stdin(text.clone()).output().unwrap().status.success());
    assert_eq!(run_ok(&["hash", &piped]), run_ok(&["hash", &ckpt]));
    // Writing to a document is refused with what to do.
    let out = tp().args(["cp", &ckpt, &doc, "--overwrite", "-q"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("treepack import DOC DST"), "{out:?}");
    let schema: serde_json::Value = serde_json::from_str(&run_ok(&["schema", &ckpt])).unwrap();
    assert_eq!(schema["$schema"], "https://json-schema.org/draft/2020-12/schema");
}

#[test]
fn refs_show_the_place_they_stand_for() {
    // tests/golden/demo-refs holds the demo tree at `model` and again at `again`, and a list
    // that holds itself at `cycle/1`.
    let golden = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/golden/demo-refs");
    let out = run_ok(&["inspect", golden]);
    assert_contains(&out, &["├── model: dict[7] (shared #0)", "again: ref -> model (shared #0, stored once)"]);
    let ls = run_ok(&["ls", golden]);
    assert_contains(
        &ls,
        &["\nagain\tref -> model (shared #0, stored once)\n", "\ncycle/1\tref -> cycle (shared #1, stored once)\n"],
    );
    assert_eq!(run_ok(&["ls", golden, "again"]).trim(), "again\tref -> model (shared #0, stored once)");
    let json: serde_json::Value = serde_json::from_str(&run_ok(&["inspect", "--json", golden])).unwrap();
    assert_eq!(
        json["refs"],
        serde_json::json!([{"path": "again", "shared": 0, "target": "model"}, {"path": "cycle/1", "shared": 1, "target": "cycle"}])
    );
}

/// Files holding JSON nested 100,000 deep (issue 50): every command that reads them exits 2
/// with the typed error (file, key path, member), never "stack overflow, aborting".
#[test]
fn deep_json_exits_2_with_the_error() {
    let d = tempfile::tempdir().unwrap();
    let deep = "[".repeat(100_000) + &"]".repeat(100_000);
    let tree = d.path().join("deep");
    std::fs::create_dir_all(&tree).unwrap();
    let body = format!(
        "{{\"format\":\"treepack\",\"version\":[1,4],\n\"writer\":\"deep\",\n\"metadata\":{deep},\n\"packs\":[],\n\"root\":{{\"a\":1}}"
    );
    std::fs::write(tree.join("treepack.json"), treepack::format::manifest::seal(body.as_bytes())).unwrap();
    let t = tree.to_str().unwrap();
    // A safetensors file whose one tensor name splits at its 20,000 dots.
    let name = "a.".repeat(20_000) + "w";
    let header = serde_json::json!({ name: {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]} }).to_string();
    let st = d.path().join("m.safetensors");
    std::fs::write(&st, [&(header.len() as u64).to_le_bytes()[..], header.as_bytes(), &[7]].concat()).unwrap();
    let out_dir = d.path().join("out");
    let cases: [(&[&str], &str); 5] = [
        (&["inspect", t], "member `metadata`: JSON nested deeper than 128 levels"),
        (&["inspect", t, "--json"], "member `metadata`: JSON nested deeper than 128 levels"),
        (&["cat", t, "a"], "member `metadata`: JSON nested deeper than 128 levels"),
        (&["verify", t], "member `metadata`: JSON nested deeper than 128 levels"),
        (
            &["convert", st.to_str().unwrap(), out_dir.to_str().unwrap(), "--separator", "."],
            "splits into more than 999 nested keys",
        ),
    ];
    for (args, want) in cases {
        let out = tp().args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        // A signal (the abort of a stack overflow) has no exit code.
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("overflow"), "{args:?}: {err}");
    }
    assert!(!out_dir.exists());
}

/// `cat` of a ref place shows the object it names, not an empty `leaf:` line.
#[test]
fn cat_of_a_ref_place_shows_the_object() {
    let golden = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/golden/demo-refs");
    let again = run_ok(&["cat", golden, "again/params/dense/bias"]);
    let direct = run_ok(&["cat", golden, "model/params/dense/bias"]);
    assert_eq!(again, direct);
    let out = run_ok(&["cat", golden, "again"]);
    assert!(out.contains("params:") && out.contains("dense:") && out.contains("float32"), "{out}");
    assert!(!out.trim_start().starts_with("leaf"), "{out}");
    let out = run_ok(&["cat", golden, "cycle"]);
    assert!(out.contains("ref to shared object"), "{out}");
}

/// A state_dict-like tree (issue 51): an OrderedDict root whose data holds a long `_metadata`,
/// 500 weights, and a log of 300 calls of 3 fields each: 1 + 500 + 1 + 300 + 900 = 1702 tree
/// lines in all, and long metadata.
fn big_tree(d: &std::path::Path) -> String {
    use treepack::{Node, SaveOptions, Tree};
    let meta: serde_json::Map<String, serde_json::Value> =
        (0..200).map(|i| (format!("layer{i}"), serde_json::json!({"version": 1}))).collect();
    let mut children: Vec<(String, Node)> =
        (0..500).map(|i| (format!("layer{i}.weight"), Node::from(i as i64))).collect();
    let calls = (0..300)
        .map(|i| Node::dict([("name", Node::from("f")), ("step", Node::from(i as i64)), ("ok", Node::from(true))]))
        .collect();
    children.push(("calls".into(), Tree::List(calls)));
    let root = Tree::Custom {
        type_name: "py.ordereddict".into(),
        data: serde_json::json!({"attrs": {"_metadata": meta}}),
        children,
    };
    let p = d.join("sd").to_str().unwrap().to_string();
    let opts = SaveOptions { metadata: Some(serde_json::json!({"notes": "x".repeat(500)})), ..Default::default() };
    treepack::save(&root, p.as_str(), &opts).unwrap();
    p
}

/// The tree lines of `inspect`'s output (the root's and those drawn below it).
fn tree_lines(out: &str) -> Vec<&str> {
    out.lines().filter(|l| l.starts_with("<root>:") || l.starts_with(['├', '└', '│', ' '])).collect()
}

#[test]
fn inspect_prints_a_readable_summary_of_a_big_tree() {
    let d = tempfile::tempdir().unwrap();
    let p = big_tree(d.path());
    // By default: 200 tree lines, then how many more and how to see them; long data cut.
    let out = run_ok(&["inspect", &p]);
    let lines = tree_lines(&out);
    assert_eq!(lines.len(), 200, "{out}");
    assert!(out.contains("\n… 1502 more lines not shown (--max-lines 0 shows all"), "{out}");
    assert!(lines[0].starts_with("<root>: custom py.ordereddict {\"attrs\":{\"_metadata\":"), "{}", lines[0]);
    assert!(lines[0].ends_with(" chars) (501 children)") && lines[0].contains("… ("), "{}", lines[0]);
    assert!(lines[0].chars().count() < 200, "{}", lines[0]);
    let md = out.lines().find(|l| l.starts_with("metadata: ")).unwrap();
    assert!(md.chars().count() < 160 && md.ends_with("… (512 chars)"), "{md}");
    assert!(out.contains("(values longer than 120 characters cut, marked …: --width 0 shows them whole)"), "{out}");
    assert!(out.lines().all(|l| l.chars().count() < 400), "{out}");
    assert!(out.trim_end().ends_with("totals: 1400 leaves, 0 arrays, 0 B of array data, 0 B stored"), "{out}");
    // Everything, whole.
    let out = run_ok(&["inspect", &p, "--max-lines", "0", "--width", "0"]);
    let lines = tree_lines(&out);
    assert_eq!(lines.len(), 1702);
    assert!(lines[0].contains("\"layer199\":{\"version\":1}") && !lines[0].contains('…'), "{}", lines[0]);
    assert!(!out.contains("more line") && !out.contains("cut, marked"), "{out}");
    assert_eq!(lines[1701], "        └── ok: bool True");
    // Levels: the root and its children, the log's line marked as having more below.
    let out = run_ok(&["inspect", &p, "--depth", "1", "--max-lines", "0"]);
    let lines = tree_lines(&out);
    assert_eq!(lines.len(), 502, "{out}");
    assert_eq!(lines[501], "└── calls: list[300]  …");
    assert!(out.contains("(levels below 1 not shown, marked …: leave --depth out to show them all)"), "{out}");
    let out = run_ok(&["inspect", &p, "--depth", "1", "--max-lines", "10"]);
    assert_eq!(tree_lines(&out).len(), 10, "{out}");
    assert!(out.contains("\n… 492 more lines not shown"), "{out}");
    let out = run_ok(&["inspect", &p, "--depth", "0"]);
    assert_eq!(tree_lines(&out).len(), 1, "{out}");
    // A subtree, within the same limits.
    let out = run_ok(&["inspect", &p, "--key", "calls", "--max-lines", "4"]);
    let shown: Vec<&str> = out.lines().skip_while(|l| !l.starts_with("calls: ")).take(5).collect();
    assert_eq!(shown[..4], ["calls: list[300]", "├── 0: dict[3]", "│   ├── name: str \"f\"", "│   ├── step: int 0"]);
    assert!(shown[4].starts_with("… "), "{out}");
    assert!(out.contains("\n… 1197 more lines not shown"), "{out}");
    // A small tree prints whole, with no notes.
    let (_d, ckpt) = demo("ckpt");
    let out = run_ok(&["inspect", &ckpt]);
    assert!(!out.contains("more line") && !out.contains("not shown") && !out.contains("cut, marked"), "{out}");
}

#[test]
fn a_folder_without_a_manifest_says_what_is_there() {
    let d = tempfile::tempdir().unwrap();
    // A save that died before it committed: packs, no treepack.json.
    let (_keep, ckpt) = demo("ckpt");
    std::fs::remove_file(std::path::Path::new(&ckpt).join("treepack.json")).unwrap();
    let out = tp().args(["inspect", &ckpt]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("no treepack tree found") && e.contains("`packs/` holds 1 pack file"), "{e}");
    assert!(e.contains("a save that died before it committed") && e.contains(&format!("`treepack gc {ckpt}`")), "{e}");
    let out = run_ok(&["gc", &ckpt, "--grace-secs", "0"]);
    assert!(out.contains("removed packs/"), "{out}");
    // No packs: no word of gc.
    // (`treepack gc`, not "gc": a random temporary folder's name may hold those letters)
    let e = String::from_utf8_lossy(&tp().args(["inspect", &ckpt]).output().unwrap().stderr).to_string();
    assert!(e.contains("no treepack tree found") && !e.contains("treepack gc"), "{e}");
    let e = String::from_utf8_lossy(
        &tp().args(["inspect", d.path().join("nope").to_str().unwrap()]).output().unwrap().stderr,
    )
    .to_string();
    assert!(e.contains("no treepack tree found") && !e.contains("treepack gc"), "{e}");
    // A repository: name a tree of it.
    let repo = d.path().join("repo").to_str().unwrap().to_string();
    run_ok(&["repo", "init", &repo]);
    let e = String::from_utf8_lossy(&tp().args(["inspect", &repo]).output().unwrap().stderr).to_string();
    assert!(e.contains(&format!("name one as `{repo}@NAME`")) && e.contains("treepack repo ls"), "{e}");
}

#[test]
fn repo_init_refuses_a_folder_of_other_files() {
    let d = tempfile::tempdir().unwrap();
    let mine = d.path().join("mine");
    std::fs::create_dir_all(mine.join("0")).unwrap();
    std::fs::write(mine.join("notes.txt"), b"mine").unwrap();
    let out = tp().args(["repo", "init", mine.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("holds `0`, `notes.txt` that are not a repository's"), "{e}");
    assert_eq!(std::fs::read_dir(&mine).unwrap().count(), 2, "nothing written");
    // An empty folder, and a repository again, are fine.
    let empty = d.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    run_ok(&["repo", "init", empty.to_str().unwrap()]);
    run_ok(&["repo", "init", empty.to_str().unwrap()]);
}

/// `treepack convert --select GLOB` (repeatable, as `load(select=)`): what is not selected is
/// left out, so a tree holding strings and records converts its arrays to safetensors; a
/// pattern that matches nothing is an error naming it, unless it begins with `?` (issue 51).
#[test]
fn convert_select_leaves_out_what_is_not_selected() {
    let (d, ckpt) = demo("ckpt");
    let path = |n: &str| d.path().join(n).to_str().unwrap().to_string();
    let st = path("params.safetensors");
    let out = run_ok(&["convert", &ckpt, &st, "--select", "params/**", "--select", "?ema/**", "-q"]);
    assert!(out.starts_with("converted 3 tensors"), "{out}");
    let (tree, _) = treepack::convert::read_safetensors(&treepack::Location::parse(&st).unwrap(), Some(".")).unwrap();
    let mut names = vec![];
    tree.for_each_leaf(&mut |p, _| names.push(p.to_string()));
    names.sort();
    assert_eq!(names, ["params/dense/bias", "params/dense/kernel", "params/embed"]);
    // Back into treepack, selecting again: the key paths are the tree's (`params/dense/*`).
    let back = path("back");
    let out = run_ok(&["convert", &st, &back, "--select", "params/dense/*", "--separator", ".", "-q"]);
    assert!(out.starts_with("converted 2 tensors"), "{out}");
    let ls = run_ok(&["ls", &back]);
    let listed: Vec<&str> = ls.lines().map(|l| l.split('\t').next().unwrap()).collect();
    assert_eq!(listed, ["params/dense/kernel", "params/dense/bias"]);
    // A pattern matching nothing: exit 2 naming it, nothing written.
    let none = path("none.safetensors");
    let out = tp().args(["convert", &ckpt, &none, "--select", "params/**", "--select", "parms/**"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        err.contains("`parms/**`") && err.contains("select matches nothing") && err.contains("leading `?`"),
        "{err}"
    );
    assert!(!std::path::Path::new(&none).exists());
    let out = tp().args(["convert", &st, &path("none"), "--select", "layers/**"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("`layers/**`"));
    // Strings and None selected: refused, and the error says how to leave them out.
    let out = tp().args(["convert", &ckpt, &none, "--select", "scalars/**"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(err.contains("`scalars/") && err.contains("leave it out (select)"), "{err}");
    // A ref to a dict (demo-refs: `again` holds `model` again): safetensors has no links; a
    // selection of one place converts.
    let golden = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/golden/demo-refs");
    let out =
        tp().args(["convert", golden, &none, "--select", "model/params/**", "--select", "again"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(err.contains("`model/dtypes/complex64`"), "selecting the ref selects its whole object: {err}");
    let out = run_ok(&["convert", golden, &none, "--select", "model/params/**", "-q"]);
    assert!(out.starts_with("converted 3 tensors"), "{out}");
}

/// `convert` knows a source by its content, as the Python package does (the same detector,
/// `treepack::convert::detect_format`; python/tests/test_detect_format.py holds the same cases):
/// a safetensors file named `.npz` converts as safetensors, a treepack tree named `.zarr` as
/// treepack, and an npy, zip or HDF5 file named `.safetensors` is said to be what it is.
#[test]
fn convert_knows_a_source_by_its_content_not_its_name() {
    let (d, ckpt) = demo("ckpt");
    let path = |name: &str| d.path().join(name).to_str().unwrap().to_string();
    run_ok(&["convert", &ckpt, &path("w.safetensors"), "--select", "params/**", "-q"]);
    std::fs::rename(path("w.safetensors"), path("w.npz")).unwrap();
    let out = run_ok(&["convert", &path("w.npz"), &path("back"), "-q"]);
    assert!(out.starts_with("converted 3 tensors"), "{out}");
    std::fs::rename(&ckpt, path("tree.zarr")).unwrap();
    let out = run_ok(&["convert", &path("tree.zarr"), &path("again.safetensors"), "--select", "params/**", "-q"]);
    assert!(out.starts_with("converted 3 tensors"), "{out}");
    for (name, bytes, format) in [
        ("a.safetensors", &b"\x93NUMPY\x01\x00v\x00{'descr': '<f4'}"[..], "npy"),
        (
            "b.safetensors",
            &b"PK\x05\x06\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"[..],
            "npz",
        ),
        ("c.safetensors", &b"\x89HDF\r\n\x1a\n\x00\x00\x00\x00\x00\x08\x08\x00"[..], "hdf5"),
    ] {
        std::fs::write(path(name), bytes).unwrap();
        assert_eq!(treepack::convert::detect_format(&path(name), true), format);
        // (a Python-owned format: run by `python -m treepack`, here an interpreter that is not there)
        let out = tp()
            .env("TREEPACK_PYTHON", path("no-python"))
            .args(["convert", &path(name), &path("out")])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(&format!("this is a {format} file")), "{name}: {err}");
    }
    // A destination, or a source that is not there, is named by its extension.
    assert_eq!(treepack::convert::detect_format(&path("new.NPZ"), true), "npz");
    assert_eq!(treepack::convert::detect_format(&path("w.npz"), false), "npz");
    assert_eq!(treepack::convert::detect_format(&path("w.npz"), true), "safetensors");
}

/// A torch.save checkpoint (written by torch: crates/treepack/tests/data/torch/make_fixtures.py)
/// is known by its content whatever its name, and every reading command reads it as the tree it
/// holds, without Python and without pickle; treepack writes none.
#[test]
fn a_torch_checkpoint_is_read_by_every_reading_command() {
    let d = tempfile::tempdir().unwrap();
    let path = |name: &str| d.path().join(name).to_str().unwrap().to_string();
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/../treepack/tests/data/torch/");
    std::fs::copy(format!("{fixtures}state_dict.pt"), path("pytorch_model.bin")).unwrap();
    let ckpt = path("pytorch_model.bin");
    assert_eq!(treepack::convert::detect_format(&ckpt, true), "torch");
    assert_eq!(treepack::convert::detect_format(&path("new.pt"), false), "torch");
    let out = run_ok(&["inspect", &ckpt]);
    assert_contains(&out, &["(torch.save checkpoint, read as a tree", "w: float32[3, 4]", "torch.Tensor"]);
    let v: serde_json::Value = serde_json::from_str(&run_ok(&["inspect", &ckpt, "--json"])).unwrap();
    assert_eq!(v["read_from"], "torch.save checkpoint");
    let out = run_ok(&["ls", &ckpt, "nested/inner/*"]);
    assert_contains(&out, &["nested/inner/scale\tfloat16[2]", "nested/inner/bf\tbfloat16[3]"]);
    let out = run_ok(&["cat", &ckpt, "nested/s"]);
    assert_eq!(out.trim(), "\"text\"");
    assert_contains(&run_ok(&["verify", &ckpt]), &["0 problems"]);
    let out = run_ok(&["convert", &ckpt, &path("t.tpk"), "-q"]);
    assert!(out.starts_with("converted "), "{out}");
    assert_eq!(run_ok(&["cat", &path("t.tpk"), "nested/s"]).trim(), "\"text\"");
    let out = run_ok(&["convert", &format!("{fixtures}model.pt"), &path("m.safetensors"), "-q"]);
    assert!(out.starts_with("converted 4 tensors"), "{out}");
    // Never written: not as a destination, not as a location to save into.
    let out = tp().args(["convert", &path("t.tpk"), &path("back.pt")]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("does not write them"), "{err}");
    let out = tp().args(["cp", &path("t.tpk"), &ckpt, "--overwrite"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("read as a tree but not written"), "{err}");
    // The legacy format is named, with what to do.
    std::fs::write(path("old.pt"), b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19\x2e").unwrap();
    let out = tp().args(["inspect", &path("old.pt")]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("legacy torch.save format") && err.contains("re-save"), "{err}");
}

/// A safetensors file reads as the flat tree it holds (names as stored) in every reading
/// command, and is still written as a file by convert.
#[test]
fn a_safetensors_file_is_read_by_every_reading_command() {
    let (d, ckpt) = demo("ckpt");
    let path = |n: &str| d.path().join(n).to_str().unwrap().to_string();
    let st = path("params.safetensors");
    run_ok(&["convert", &ckpt, &st, "--select", "params/**", "-q"]);
    let out = run_ok(&["inspect", &st]);
    assert_contains(&out, &["(safetensors file, read as a tree", "params.dense.kernel: float32[512, 256]"]);
    let out = run_ok(&["ls", &st]);
    assert_eq!(out.lines().count(), 3, "{out}");
    let out = run_ok(&["cat", &st, "params.dense.kernel[0:1, 0:2]"]);
    assert!(out.starts_with("float32[1, 2] ="), "{out}");
    // Overwritten as a file, not refused as a tree read from one.
    run_ok(&["convert", &ckpt, &st, "--select", "params/embed", "--overwrite", "-q"]);
    assert_eq!(run_ok(&["ls", &st]).lines().count(), 1);
    // A folder of shards and its index (Hugging Face's layout) reads as the one flat tree.
    let folder = path("sharded");
    std::fs::create_dir(&folder).unwrap();
    let shard = |name: &str, select: &str| {
        run_ok(&["convert", &ckpt, &format!("{folder}/{name}"), "--select", select, "-q"]);
    };
    shard("model-00001-of-00002.safetensors", "params/dense/**");
    shard("model-00002-of-00002.safetensors", "params/embed");
    let index = serde_json::json!({"weight_map": {
        "params.dense.kernel": "model-00001-of-00002.safetensors",
        "params.dense.bias": "model-00001-of-00002.safetensors",
        "params.embed": "model-00002-of-00002.safetensors"}});
    std::fs::write(format!("{folder}/model.safetensors.index.json"), index.to_string()).unwrap();
    let out = run_ok(&["inspect", &folder]);
    assert_contains(
        &out,
        &["(folder of safetensors shards, read as a tree", "params.dense.kernel: float32[512, 256]", "params.embed"],
    );
    assert_eq!(run_ok(&["ls", &folder]).lines().count(), 3);
    let out = run_ok(&["cat", &folder, "params.dense.kernel[0:1, 0:2]"]);
    assert!(out.starts_with("float32[1, 2] ="), "{out}");
    let out = run_ok(&["convert", &folder, &path("from-shards.tpk"), "-q"]);
    assert!(out.starts_with("converted 3 tensors"), "{out}");
}

/// A file of another tool's that the Python package reads (npy, npz, HDF5) is named as such by
/// every reading command, with what to do, instead of "missing TREEPACK magic" (session 37).
#[test]
fn a_file_the_python_package_reads_is_named_with_what_to_do() {
    let d = tempfile::tempdir().unwrap();
    let npy = b"\x93NUMPY\x01\x00\x76\x00{'descr': '<f8', 'fortran_order': False, 'shape': (0,), }".to_vec();
    for (name, head, fmt) in [
        ("a.npy", npy, "npy"),
        ("a.npz", b"PK\x03\x04\x14\x00\x00\x00\x00\x00 not a whole zip".to_vec(), "npz"),
        ("a.h5", b"\x89HDF\r\n\x1a\n not a whole file".to_vec(), "hdf5"),
    ] {
        let p = d.path().join(name);
        let mut bytes = head;
        bytes.resize(4096, b' ');
        std::fs::write(&p, bytes).unwrap();
        for cmd in ["inspect", "ls", "verify"] {
            // (inspect and ls run the Python package's command: here no interpreter can be run)
            let out = tp()
                .env("TREEPACK_PYTHON", d.path().join("no-python"))
                .args([cmd, p.to_str().unwrap()])
                .output()
                .unwrap();
            assert_eq!(out.status.code(), Some(2), "{cmd} {name}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                err.contains(&format!("this is a {fmt} file")) && err.contains("treepack.open("),
                "{cmd} {name}: {err}"
            );
        }
    }
}

/// A folder of another tool's that the Python package reads (Zarr, Orbax, JAX) is named as such
/// by every reading command, with what to do, instead of "no treepack tree".
#[test]
fn a_folder_the_python_package_reads_is_named_with_what_to_do() {
    let d = tempfile::tempdir().unwrap();
    for (name, marker, fmt) in
        [("a.zarr", "zarr.json", "zarr"), ("ckpt", "_CHECKPOINT_METADATA", "orbax"), ("tree", "pytreedef.json", "jax")]
    {
        let p = d.path().join(name);
        std::fs::create_dir(&p).unwrap();
        std::fs::write(p.join(marker), "{}").unwrap();
        for cmd in ["inspect", "ls", "verify"] {
            let out = tp()
                .env("TREEPACK_PYTHON", d.path().join("no-python"))
                .args([cmd, p.to_str().unwrap()])
                .output()
                .unwrap();
            assert_eq!(out.status.code(), Some(2), "{cmd} {name}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                err.contains(&format!("this is a {fmt} folder")) && err.contains("treepack.load("),
                "{cmd} {name}: {err}"
            );
        }
    }
}

/// `inspect`, `ls`, `cat` and `convert` of a file the Python package reads run `python -m treepack`
/// with the same arguments (the interpreter from TREEPACK_PYTHON): its output and exit status are
/// the command's. An interpreter without the package, or none, is named with what to install;
/// storage options and keys, which that command does not take, are refused before it runs.
#[cfg(unix)]
#[test]
fn a_file_the_python_package_reads_is_browsed_through_python() {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    let npz = d.path().join("a.npz");
    let mut bytes = b"PK\x03\x04".to_vec();
    bytes.resize(64, 0);
    std::fs::write(&npz, bytes).unwrap();
    let log = d.path().join("argv");
    // A stand-in interpreter: records its arguments, prints a line, exits 3.
    let fake = d.path().join("fake-python");
    std::fs::write(
        &fake,
        format!("#!/bin/sh\nprintf '%s\\n' \"$@\" > '{}'\necho from-python\necho warned >&2\nexit 3\n", log.display()),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let p = npz.to_str().unwrap();
    let args = |a: &[&str]| -> Vec<String> { a.iter().map(|s| s.to_string()).collect() };
    for (cmd, want) in [
        (
            args(&["inspect", p, "--key", "w", "--depth", "1"]),
            args(&["inspect", "--key", "w", "--depth", "1", "--max-lines", "200", "--width", "120", "--", p]),
        ),
        (args(&["ls", p, "--", "-x*"]), args(&["ls", "--", p, "-x*"])),
        (args(&["cat", p, "w[0:2, :]"]), args(&["cat", "--", p, "w[0:2, :]"])),
        (
            args(&["convert", p, "out.tpk", "--overwrite", "--select", "w"]),
            args(&["convert", "--select", "w", "--overwrite", "--", p, "out.tpk"]),
        ),
        (args(&["convert", "in.tpk", "out.h5", "-q"]), args(&["convert", "--quiet", "--", "in.tpk", "out.h5"])),
    ] {
        let _ = std::fs::remove_file(&log);
        let out = tp().env("TREEPACK_PYTHON", &fake).args(&cmd).output().unwrap();
        assert_eq!(out.status.code(), Some(3), "{cmd:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "from-python\n", "{cmd:?}");
        assert_eq!(String::from_utf8_lossy(&out.stderr), "warned\n", "{cmd:?}");
        // The stand-in gets `-c PROGRAM ARGS…`: the program's lines, then the arguments.
        let got: Vec<String> = std::fs::read_to_string(&log).unwrap().lines().map(String::from).collect();
        assert_eq!(got[0], "-c", "{cmd:?}");
        assert!(got.iter().any(|l| l.contains("from treepack.__main__ import main")), "{got:?}");
        assert_eq!(got[got.len() - want.len()..], want[..], "{cmd:?}");
    }
    // A treepack tree or safetensors file is this command's own: the interpreter is not run.
    let tree = d.path().join("t");
    tp().args(["demo", tree.to_str().unwrap()]).output().unwrap();
    let _ = std::fs::remove_file(&log);
    let out = tp().env("TREEPACK_PYTHON", &fake).args(["ls", tree.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success() && !log.exists());

    let no_module = d.path().join("bare-python");
    std::fs::write(&no_module, "#!/bin/sh\necho \"ModuleNotFoundError: No module named 'treepack'\" >&2\nexit 1\n")
        .unwrap();
    std::fs::set_permissions(&no_module, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = tp().env("TREEPACK_PYTHON", &no_module).args(["inspect", p]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        err.contains("has no treepack package")
            && err.contains("pip install treepack")
            && err.contains("TREEPACK_PYTHON"),
        "{err}"
    );

    let _ = std::fs::remove_file(&log);
    let out = tp().env("TREEPACK_PYTHON", &fake).args(["-o", "region=x", "cat", p, "w"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(err.contains("without storage options or keys") && !log.exists(), "{err}");
}
