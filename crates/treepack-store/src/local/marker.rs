//! Markers of running local saves, so that `gc` never removes files a save still owns.
//!
//! `gc` removes unreferenced packs and staging files older than a grace period. With a short
//! grace (or a save slower than it) that could remove a pack a running save has written but not
//! yet committed, and the save would then commit a manifest naming a missing pack. So a local
//! save holds an exclusively `flock`ed, empty marker file (`.saving-<pid>-<n>` in a directory
//! location, `.<name>.saving-<pid>-<n>` beside a single file) from its first write to its end;
//! `gc` keeps every file modified after the oldest live marker was created. A marker whose lock
//! can be taken belongs to a save that died: `gc` removes it. The kernel drops the lock when the
//! process dies, however it dies. Off Unix, no markers (the grace period alone protects).

use super::beneath::{io_error, Dir, Kind};
use super::Local;
use crate::Result;
use std::fs::File;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// How long an unlocked marker still counts as a running save's (see `oldest_running`).
const UNLOCKED_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// A live save's marker; removed (and unlocked) when dropped.
#[derive(Debug)]
pub struct SaveMarker {
    /// The folder it is in, held open: it is removed from there, whatever that folder's path
    /// names by then.
    dir: Dir,
    name: String,
    _file: File,
}

fn prefix(single_file_name: Option<&str>) -> String {
    match single_file_name {
        Some(name) => format!(".{name}.saving-"),
        None => ".saving-".into(),
    }
}

#[cfg(unix)]
fn flock(f: &File, op: libc::c_int) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid open descriptor; flock only changes the lock on its open file description.
    unsafe { libc::flock(f.as_raw_fd(), op) == 0 }
}

impl SaveMarker {
    /// Create and lock a marker in `dir` (the location's directory, or a single file's folder
    /// with `single_file_name` set). A name already there — a planted link — is refused, never
    /// followed.
    ///
    /// # Errors
    /// I/O errors creating the file.
    pub(super) fn create(dir: Dir, single_file_name: Option<&str>) -> io::Result<Option<SaveMarker>> {
        if !cfg!(unix) {
            return Ok(None);
        }
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("{}{}-{n}", prefix(single_file_name), std::process::id());
        let file = dir.create_new(&name)?;
        #[cfg(unix)]
        if !flock(&file, libc::LOCK_EX | libc::LOCK_NB) {
            // A file system without `flock` (some network mounts): no marker, rather than no
            // save; there `gc`'s grace period alone protects running saves (docs/security.md).
            let _ = dir.unlink(&name);
            return Ok(None);
        }
        Ok(Some(SaveMarker { dir, name, _file: file }))
    }
}

impl Drop for SaveMarker {
    fn drop(&mut self) {
        // Removed before the descriptor (and with it the lock) goes: a `gc` never sees an
        // unlocked marker of a save that is still running.
        let _ = self.dir.unlink(&self.name);
    }
}

/// When the oldest save still running in `dir` started (None if none), after removing the
/// markers of saves that died. Returns the stale markers removed too.
///
/// # Errors
/// I/O errors listing `dir`; a marker name that is a link is refused (nothing is removed).
pub(super) fn oldest_running(
    dir: &Dir,
    single_file_name: Option<&str>,
) -> io::Result<(Option<SystemTime>, Vec<String>)> {
    let pre = prefix(single_file_name);
    let mut oldest: Option<SystemTime> = None;
    let mut stale = vec![];
    let markers: Vec<_> = dir.entries()?.into_iter().filter(|(n, _)| n.starts_with(&pre)).collect();
    if let Some((n, _)) = markers.iter().find(|(_, m)| m.kind == Kind::Link) {
        // Refused before anything is removed.
        return Err(dir.refuse_link(n));
    }
    for (name, _) in markers {
        let Ok(file) = dir.open_read(&name) else { continue };
        let created = file.metadata().and_then(|m| m.modified()).unwrap_or(SystemTime::UNIX_EPOCH);
        // A save creates its marker, then locks it: a marker younger than `UNLOCKED_GRACE` may
        // be one whose lock is still to come, so it counts as live even when unlocked.
        let young = SystemTime::now().duration_since(created).map_or(true, |age| age < UNLOCKED_GRACE);
        #[cfg(unix)]
        if !young && flock(&file, libc::LOCK_EX | libc::LOCK_NB) {
            // Nobody holds it: the save that made it is gone.
            if dir.unlink(&name).is_ok() {
                stale.push(name);
            }
            continue;
        }
        oldest = Some(oldest.map_or(created, |o| o.min(created)));
    }
    Ok((oldest, stale))
}

impl Local {
    /// Mark a local save as running until the marker is dropped (see the module docs): `gc`
    /// keeps what it writes meanwhile. Creates the location's directory (durably, when
    /// `durable`).
    ///
    /// # Errors
    /// I/O errors creating the folder or the marker; a link where the marker goes is refused.
    pub fn save_marker(&self, durable: bool) -> Result<Option<SaveMarker>> {
        let (dir, name) = self.marker_dir();
        let opened =
            super::durable::create_beneath(&dir, &self.root_pin, "", durable).map_err(|e| io_error(dir.clone(), e))?;
        SaveMarker::create(opened, name.as_deref()).map_err(|e| io_error(dir, e))
    }

    /// When the oldest local save still running here started, and the markers of dead saves
    /// removed (relative names), for `gc`.
    ///
    /// # Errors
    /// I/O errors listing the folder; a marker name that is a link is refused.
    pub fn running_saves(&self) -> Result<(Option<std::time::SystemTime>, Vec<String>)> {
        let (dir, name) = self.marker_dir();
        let opened = match self.root_pin.open(&dir) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((None, vec![])),
            Err(e) => return Err(io_error(dir, e)),
        };
        oldest_running(&opened, name.as_deref()).map_err(|e| io_error(dir, e))
    }

    /// The folder that holds a local save's markers (the location's root folder), and for a
    /// single file its name.
    fn marker_dir(&self) -> (PathBuf, Option<String>) {
        let t = self.target("");
        if self.single {
            (t.root, Some(t.rel))
        } else {
            (t.root, None)
        }
    }
}
