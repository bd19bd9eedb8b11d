//! The rule of this crate (docs/architecture.md, docs/design.md decision 74): the format does no
//! I/O, has no async runtime and starts no threads or pools of its own. Its manifest must not
//! depend on a crate that would do so, and its code (outside its tests) must not name what
//! does; with no executor installed, its parallel work runs on the calling thread.

use std::path::{Path, PathBuf};
use treepack_format::manifest::{self, Entry, Manifest, PackInfo};
use treepack_format::model::{Int, Key, Tree};

/// Crates the format may not depend on: async runtimes, object stores, memory maps, system calls.
const FORBIDDEN_CRATES: [&str; 8] = ["tokio", "object_store", "futures", "memmap2", "libc", "rustix", "mio", "url"];

/// What the format's code may not name: files, sockets, processes, threads and pools.
const FORBIDDEN_CODE: [&str; 10] = [
    "std::fs",
    "std::net",
    "std::process",
    "std::os::",
    "std::thread::spawn",
    "std::thread::Builder",
    "std::thread::scope",
    "tokio::",
    "ThreadPoolBuilder",
    "spawn_blocking",
];

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn the_manifest_names_no_crate_that_does_io() {
    let toml = std::fs::read_to_string(crate_dir().join("Cargo.toml")).unwrap();
    let mut section = String::new();
    let mut deps = vec![];
    for line in toml.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line.trim_matches(|c| c == '[' || c == ']').to_string();
            continue;
        }
        // Normal and target dependencies, and build scripts' (dev-dependencies are the tests').
        let deps_section = section == "dependencies"
            || section == "build-dependencies"
            || (section.starts_with("target.") && section.ends_with(".dependencies"));
        if deps_section && !line.is_empty() && !line.starts_with('#') {
            if let Some((name, _)) = line.split_once('=') {
                deps.push(name.trim().trim_matches('"').to_string());
            }
        } else if let Some(name) = section.strip_prefix("dependencies.") {
            deps.push(name.to_string());
        }
    }
    assert!(deps.contains(&"serde_json".to_string()), "the dependencies were not found: {deps:?}");
    for d in &deps {
        let canonical = d.replace('-', "_");
        assert!(!FORBIDDEN_CRATES.contains(&canonical.as_str()), "treepack-format must not depend on `{d}`");
    }
}

/// The crate's source files, with the files only its tests compile left out.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `text` without its test module: `#[cfg(test)]` on a `mod` item, which comes last in a file
/// (clippy's `items_after_test_module`, denied in CI, keeps it so). Returns the rest, and the
/// name of a test module kept in its own file (`mod tests;`), if any.
fn without_tests(text: &str) -> (String, Option<String>) {
    let lines: Vec<&str> = text.lines().collect();
    for (i, l) in lines.iter().enumerate() {
        let is_cfg_test = l.trim().starts_with("#[cfg(test)]") || l.trim().starts_with("#[cfg(all(test");
        let next = lines.get(i + 1).map_or("", |n| n.trim());
        if is_cfg_test && (next.starts_with("mod ") || next.contains(" mod ")) {
            let outside = next
                .ends_with(';')
                .then(|| next.trim_end_matches(';').rsplit(' ').next().unwrap_or_default().to_string());
            if outside.is_none() {
                return (lines[..i].join("\n"), None);
            }
            let rest: Vec<&str> = lines[..i].iter().chain(&lines[i + 2..]).copied().collect();
            return (rest.join("\n"), outside);
        }
    }
    (text.to_string(), None)
}

#[test]
fn the_code_names_no_file_socket_process_or_thread() {
    let src = crate_dir().join("src");
    let mut files = vec![];
    sources(&src, &mut files);
    assert!(files.len() > 20, "the sources were not found: {files:?}");
    let mut test_only = vec![];
    let mut checked = vec![];
    for f in &files {
        let (code, outside) = without_tests(&std::fs::read_to_string(f).unwrap());
        if let Some(name) = outside {
            let dir = f.parent().unwrap();
            // `mod tests;` in `x/mod.rs` (or `lib.rs`) is `x/tests.rs`; in `x.rs`, `x/tests.rs`.
            let base = match f.file_stem().and_then(|s| s.to_str()) {
                Some("mod" | "lib") => dir.to_path_buf(),
                Some(stem) => dir.join(stem),
                None => dir.to_path_buf(),
            };
            test_only.push(base.join(format!("{name}.rs")));
            test_only.push(base.join(name).join("mod.rs"));
        }
        checked.push((f.clone(), code));
    }
    for (f, code) in checked.iter().filter(|(f, _)| !test_only.contains(f)) {
        for (n, line) in code.lines().enumerate() {
            let line = line.split("//").next().unwrap_or_default();
            for bad in FORBIDDEN_CODE {
                assert!(!line.contains(bad), "{}:{}: the format must not use `{bad}`: {line}", f.display(), n + 1);
            }
            // `use std::{fs, ...}` and the like.
            if let Some(names) = line.trim().strip_prefix("use std::{") {
                for m in ["fs", "net", "process", "thread", "os"] {
                    let named = names.split(|c: char| !c.is_alphanumeric() && c != '_').any(|w| w == m);
                    assert!(!named, "{}:{}: the format must not use `std::{m}`: {line}", f.display(), n + 1);
                }
            }
        }
    }
    assert!(
        test_only.iter().any(|p| p.ends_with("manifest/tests.rs")),
        "the test-only files were not recognised: {test_only:?}"
    );
}

/// A manifest over the split threshold: a root list of many small dicts.
fn big_manifest() -> Manifest {
    let item = |i: i64| Tree::Dict(vec![(Key::Str(format!("k{i}")), Tree::Leaf(Entry::Int(Int::Small(i))))]);
    Manifest {
        version: (1, 4),
        writer: "test".into(),
        metadata: None,
        packs: Vec::<PackInfo>::new(),
        root: Tree::List((0..80_000).map(item).collect()),
    }
}

/// With no executor installed (this test binary installs none), the work that would run on
/// the caller's threads runs on this one, with the same results.
#[test]
fn without_an_executor_the_format_runs_on_the_calling_thread() {
    use treepack_format::exec;
    assert!(exec::installed().is_none());
    assert_eq!(exec::threads(), 1);
    assert_eq!(exec::parallel(|| 1), None);
    assert_eq!(exec::with_helper(|| {}, || 1), None);
    // A big hash, written the way it is read back.
    let big = vec![3u8; 3 << 20];
    let h = treepack_format::hash::Hash32::of(&big);
    assert_eq!(h.0, *blake3::hash(&big).as_bytes());
    // A big manifest: written, then parsed by the split parse and the builder, on one thread.
    let m = big_manifest();
    let bytes = manifest::encode(&m, &serde_json::json!({}));
    assert!(bytes.len() >= 1 << 20, "{} bytes", bytes.len());
    let back = manifest::decode(&bytes, "t").unwrap();
    assert_eq!(manifest::encode(&back, &serde_json::json!({})), bytes);
    let built = manifest::build(&bytes, "t", &manifest::OwnedTree).unwrap();
    assert!(built.root == m.root);
    assert!(manifest::build_streamed_any_size(&bytes, "t", &manifest::OwnedTree).is_none(), "no helper, no stream");
}
