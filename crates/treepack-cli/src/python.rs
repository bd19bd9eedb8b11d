//! The formats the Python package owns (`.npy`, `.npz`, Zarr, HDF5, Orbax and JAX checkpoints:
//! design decisions 56 and 58) browsed and converted from this command: `inspect`, `ls`, `cat`
//! and `convert` of such a file run `python -m treepack` with the same arguments (decision 98).
//!
//! Why not read them here: their readers are numpy's, h5py's (the HDF5 C library),
//! zarr-python's and TensorStore's, and each encoding has one owner. The interpreter is
//! `$TREEPACK_PYTHON`, else `python3` on the PATH — the user's own, as `git` runs the user's
//! editor. When it cannot be run or has no treepack, the command says what to install.

use crate::Cmd;
use std::ffi::OsString;
use std::io::Write;
use std::process::{Command, ExitCode, Stdio};

/// The formats whose readers live in the Python package.
pub const FORMATS: &[&str] = &["npy", "npz", "zarr", "hdf5", "orbax", "jax"];

/// The Python-owned format of `path`: its content when it exists locally, else its extension
/// (a destination); None for anything else, remote places included.
pub fn owned_format(path: &str, read: bool) -> Option<&'static str> {
    if path.contains("://") {
        return None;
    }
    let f = treepack::convert::detect_format(path, read);
    FORMATS.contains(&f).then_some(f)
}

/// A `--from`/`--to` name of a Python-owned format.
pub fn owned_name(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    FORMATS.contains(&n.as_str()) || n == "h5"
}

/// `python -m treepack ARGS` without the working directory on the module path.
const PROGRAM: &str = "import sys\nif sys.path and sys.path[0] == '':\n    del sys.path[0]\n\
from treepack.__main__ import main\nsys.exit(main(sys.argv[1:]))";

/// What running the Python command gave.
pub enum Ran {
    /// It ran: its exit status (its output went to this process's stdout and stderr).
    Done(ExitCode),
    /// No interpreter, or one without the treepack package: why, to tell the user.
    Unavailable(String),
}

/// Run `python -m treepack ARGS` (as [`PROGRAM`]): stdout and stdin shared, stderr passed on after it ends (to
/// tell "no treepack module" from the command's own errors).
pub fn run(args: &[OsString]) -> Ran {
    let python = std::env::var_os("TREEPACK_PYTHON").unwrap_or_else(|| OsString::from("python3"));
    let shown = python.to_string_lossy().into_owned();
    // Not `-m treepack`: that puts the working directory first on the module path, and a
    // `treepack/` or `treepack.py` in a downloaded dataset's folder would run. `-c` puts ""
    // there, which the program removes before it imports anything.
    let child = Command::new(&python).arg("-c").arg(PROGRAM).args(args).stderr(Stdio::piped()).spawn();
    let out = match child.and_then(|c| c.wait_with_output()) {
        Ok(out) => out,
        Err(e) => return Ran::Unavailable(format!("`{shown}` could not be run ({e})")),
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success()
        && (stderr.contains("No module named 'treepack'") || stderr.contains("No module named treepack"))
    {
        return Ran::Unavailable(format!("`{shown}` has no treepack package"));
    }
    let _ = std::io::stderr().write_all(&out.stderr);
    Ran::Done(match out.status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(c) => ExitCode::from(u8::try_from(c).unwrap_or(2)),
        None => ExitCode::from(2), // killed by a signal
    })
}

/// The error of a command that needed the Python package and could not run it.
pub fn unavailable(path: &str, fmt: &str, why: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "{path}: this is a {fmt} {}, which the Python package reads: `treepack` runs `python -m treepack` for it, \
         but {why}. Install it (pip install treepack) or name an interpreter that has it with TREEPACK_PYTHON=/path/to/python; \
         in Python: treepack.load(\"{path}\"), treepack.open(\"{path}\")",
        if std::path::Path::new(path).is_dir() { "folder" } else { "file" }
    )
}

/// `inspect`, `ls`, `cat` and `convert` of a file whose format the Python package owns: run by
/// `python -m treepack`. None: not such a command, this command runs it.
pub fn run_owned(cmd: &Cmd, options: bool) -> Option<anyhow::Result<ExitCode>> {
    let s = |x: &str| std::ffi::OsString::from(x);
    let (path, fmt, args) = match cmd {
        Cmd::Inspect { path, json, key, view } => {
            let fmt = owned_format(path, true)?;
            let mut a = vec![s("inspect")];
            if *json {
                a.push(s("--json"));
            }
            if let Some(k) = key {
                a.extend([s("--key"), s(k)]);
            }
            if let Some(d) = view.depth {
                a.extend([s("--depth"), s(&d.to_string())]);
            }
            a.extend([s("--max-lines"), s(&view.max_lines.to_string()), s("--width"), s(&view.width.to_string())]);
            a.extend([s("--"), s(path)]);
            (path, fmt, a)
        }
        Cmd::Ls { path, patterns } => {
            let fmt = owned_format(path, true)?;
            let mut a = vec![s("ls"), s("--"), s(path)];
            a.extend(patterns.iter().map(|p| s(p)));
            (path, fmt, a)
        }
        Cmd::Cat { path, key } => (path, owned_format(path, true)?, vec![s("cat"), s("--"), s(path), s(key)]),
        Cmd::Convert { src, dst, from, to, separator, select, out } => {
            let src_fmt = match from {
                Some(f) => owned_name(f).then_some("source"),
                None => owned_format(src, true),
            };
            let dst_fmt = match to {
                Some(f) => owned_name(f).then_some("destination"),
                None => owned_format(dst, false),
            };
            let (path, fmt) = match (src_fmt, dst_fmt) {
                (Some(f), _) => (src, f),
                (None, Some(f)) => (dst, f),
                (None, None) => return None,
            };
            let mut a = vec![s("convert")];
            for (flag, v) in [("--from", from), ("--to", to)] {
                if let Some(v) = v {
                    a.extend([s(flag), s(v)]);
                }
            }
            if !separator.is_empty() {
                a.extend([s("--separator"), s(separator)]);
            }
            for g in select {
                a.extend([s("--select"), s(g)]);
            }
            if out.overwrite {
                a.push(s("--overwrite"));
            }
            if out.compression != "none" {
                a.extend([s("--compression"), s(&out.compression)]);
            }
            if out.quiet {
                a.push(s("--quiet"));
            }
            a.extend([s("--"), s(src), s(dst)]);
            (path, fmt, a)
        }
        _ => return None,
    };
    if options {
        return Some(Err(anyhow::anyhow!(
            "{path}: a {fmt} {} is read by the Python package, which this command runs without storage \
             options or keys: use Python for them (treepack.load, treepack.convert(..., encryption=...))",
            if std::path::Path::new(path).is_dir() { "folder" } else { "file" }
        )));
    }
    Some(match run(&args) {
        Ran::Done(code) => Ok(code),
        Ran::Unavailable(why) => Err(unavailable(path, fmt, &why)),
    })
}
