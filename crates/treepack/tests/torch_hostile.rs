//! The hostile torch corpus (`tests/data/torch/hostile/`, made by `make_fixtures.py`, listed in
//! its `EXPECTED.tsv`): code-execution gadgets (`__reduce__` to `os.system`, `subprocess.Popen`,
//! `builtins.getattr`/`eval`/`exec`, `pkgutil.resolve_name`, `torch._utils` functions outside
//! the allow-list, `BUILD` tricks, `INST`/`OBJ`/`NEWOBJ`), opcode-level attacks and damaged
//! zips. Each is read in a child process with a time and memory limit, beside canary files,
//! and must be refused with its typed error and a message naming what was refused.

#[path = "support/child.rs"]
mod child;

use std::path::{Path, PathBuf};
use treepack::foreign::torch;
use treepack::format::pickle::{self, PickleError};

fn corpus() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/torch/hostile")
}

/// `kind: message` of reading one file: a `.pt` through the checkpoint reader, a `.pkl`
/// through the pickle reader alone.
fn outcome(path: &Path) -> String {
    if path.extension().is_some_and(|e| e == "pkl") {
        let bytes = std::fs::read(path).unwrap();
        return match pickle::torch::read(&bytes, &pickle::Limits::default()) {
            Ok(_) => "ok".into(),
            Err(e) => format!("{}: {e}", e.kind()),
        };
    }
    match torch::read(path) {
        Ok(_) => "ok".into(),
        Err(treepack::Error::Pickle { source, file }) => {
            let pe: &PickleError = &source;
            format!("{}: {file}: {pe}", pe.kind())
        }
        Err(e) => format!("{}: {e}", e.kind()),
    }
}

#[test]
fn one_hostile_torch_case() {
    // The child half: run by `every_hostile_torch_file_is_refused` with a case's path.
    if let Some(path) = child::case() {
        println!("outcome {}", outcome(&path));
    }
}

#[test]
fn every_hostile_torch_file_is_refused() {
    let text = std::fs::read_to_string(corpus().join("EXPECTED.tsv")).unwrap();
    let rows: Vec<Vec<&str>> =
        text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).map(|l| l.split('\t').collect()).collect();
    assert!(rows.len() >= 40, "{} cases", rows.len());
    let out = child::Outside::new();
    let mut wrong = vec![];
    for r in &rows {
        let (name, kind, needle, what) = (r[0], r[1], r[2], r[3]);
        let got = child::run("one_hostile_torch_case", &corpus().join(name));
        let got = got.strip_prefix("outcome ").unwrap_or(&got);
        if !got.starts_with(&format!("{kind}: ")) {
            wrong.push(format!("{name} ({what}): expected {kind}, got {got}"));
        } else if !got.contains(needle) {
            wrong.push(format!("{name} ({what}): the message does not say {needle:?}: {got}"));
        } else if name.ends_with(".pt") && !got.contains(name) {
            // The .pt cases name the file.
            wrong.push(format!("{name}: the message does not name the file: {got}"));
        }
    }
    assert!(wrong.is_empty(), "{} of {} cases wrong:\n{}", wrong.len(), rows.len(), wrong.join("\n"));
    out.assert_unchanged();
    assert!(!Path::new("/tmp/treepack-pwned").exists(), "a gadget ran");
}

#[test]
fn refused_globals_name_their_key_path() {
    let got = outcome(&corpus().join("reduce-popen.pt"));
    assert!(got.contains("at `layer/weight`"), "{got}");
    let got = outcome(&corpus().join("reduce-os-system.pt"));
    assert!(got.contains("at `w`"), "{got}");
}

/// `ok <placeholders' types>` or `kind: message` of reading one file as [`outcome`] does, with
/// refused globals as placeholders (`on_missing="placeholder"`'s reader).
fn outcome_with_placeholders(path: &Path) -> String {
    let debug = if path.extension().is_some_and(|e| e == "pkl") {
        let bytes = std::fs::read(path).unwrap();
        match pickle::torch::read_placeholders(&bytes, &pickle::Limits::default()) {
            Ok(c) => format!("{:?}", c.tree),
            Err(e) => return format!("{}: {e}", e.kind()),
        }
    } else {
        match torch::read_placeholders(path) {
            Ok(t) => format!("{t:?}"),
            Err(treepack::Error::Pickle { source, file }) => {
                let pe: &PickleError = &source;
                return format!("{}: {file}: {pe}", pe.kind());
            }
            Err(e) => return format!("{}: {e}", e.kind()),
        }
    };
    let types: Vec<&str> = debug.split("type_name: \"pickle:").skip(1).filter_map(|s| s.split('"').next()).collect();
    format!("ok {}", types.join(" "))
}

#[test]
fn one_hostile_torch_case_with_placeholders() {
    if let Some(path) = child::case() {
        println!("outcome {}", outcome_with_placeholders(&path));
    }
}

#[test]
fn with_placeholders_refused_globals_are_named_and_all_else_refused_as_before() {
    let text = std::fs::read_to_string(corpus().join("EXPECTED.tsv")).unwrap();
    let out = child::Outside::new();
    let (mut wrong, mut read) = (vec![], 0);
    for r in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).map(|l| l.split('\t').collect::<Vec<_>>()) {
        let (name, kind, needle) = (r[0], r[1], r[2]);
        let got = child::run("one_hostile_torch_case_with_placeholders", &corpus().join(name));
        let got = got.strip_prefix("outcome ").unwrap_or(&got);
        let fine = if kind == "refused" {
            // Read, the refused global a placeholder (nothing of it run); or still an error where
            // one stands where a placeholder cannot (a dict key, an allowed call's argument) or
            // the stream is otherwise broken.
            read += usize::from(got.starts_with("ok "));
            !got.starts_with("ok ") || got.contains(needle)
        } else {
            got.starts_with(&format!("{kind}: ")) && got.contains(needle)
        };
        if !fine {
            wrong.push(format!("{name}: expected {kind} ({needle}), got {got}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    assert!(read >= 10, "only {read} of the refused cases read with placeholders");
    out.assert_unchanged();
    assert!(!Path::new("/tmp/treepack-pwned").exists(), "a gadget ran");
    // A checkpoint whose `w` is `os.system(...)`: read, `w` the placeholder.
    let got = outcome_with_placeholders(&corpus().join("reduce-os-system.pt"));
    assert!(got.starts_with("ok posix.system") || got.starts_with("ok os.system"), "{got}");
}
