//! Starting the user's browser on a file: `$BROWSER` (a `:`-separated list, as Python's
//! `webbrowser` and `xdg-open` read it; `%s` stands for the file), else the system's opener.

use std::path::Path;
use std::process::{Command, Stdio};

/// Open `file` in a browser, without waiting for it.
pub(crate) fn open(file: &Path) -> std::io::Result<()> {
    let target = file.to_string_lossy().into_owned();
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "no browser opener found");
    for cmd in candidates() {
        let mut parts: Vec<String> = cmd.split_whitespace().map(str::to_string).collect();
        if parts.is_empty() {
            continue;
        }
        match parts.iter().position(|p| p.contains("%s")) {
            Some(i) => parts[i] = parts[i].replace("%s", &target),
            None => parts.push(target.clone()),
        }
        let spawned = Command::new(&parts[0])
            .args(&parts[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        match spawned {
            Ok(_) => return Ok(()),
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn candidates() -> Vec<String> {
    let mut out: Vec<String> = std::env::var("BROWSER")
        .ok()
        .map(|b| b.split(':').filter(|s| !s.trim().is_empty()).map(str::to_string).collect())
        .unwrap_or_default();
    if cfg!(target_os = "macos") {
        out.push("open".into());
    } else if cfg!(windows) {
        out.push("explorer".into());
    } else {
        out.extend(["xdg-open", "gio open", "sensible-browser"].map(String::from));
    }
    out
}
