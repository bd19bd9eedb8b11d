//! The formats the Python package owns (`.npy`, `.npz`, Zarr, HDF5, Orbax and JAX checkpoints:
//! design decisions 56 and 58) browsed and converted from this command: `inspect`, `ls`, `cat`
//! and `convert` of such a file run `python -m treepack` with the same arguments (decision 98).
//!
//! Why not read them here: their readers are numpy's, h5py's (the HDF5 C library),
//! zarr-python's and TensorStore's, and each encoding has one owner. The interpreter is
//! `$TREEPACK_PYTHON`, else `python3` on the PATH — the user's own, as `git` runs the user's
//! editor. When it cannot be run or has no treepack, the command says what to install.

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
