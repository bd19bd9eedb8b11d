//! Containment (issue 50): a location is the only place treepack reads, writes or deletes.
//!
//! Every local file operation on a location's files goes through a [`Dir`]. The location's
//! root folder (a directory location's folder; a single file's parent folder) is opened by the
//! path the user gave, resolved as the operating system resolves it: that path is the user's
//! own, and a link along it is the user's choice. Below the root nothing is followed: each
//! component of a path is opened relative to the folder before it with `openat(O_DIRECTORY |
//! O_NOFOLLOW)`, and the final operation is made relative to its parent folder's descriptor —
//! `openat(O_NOFOLLOW)`, `unlinkat`, `renameat`, `linkat` (never `AT_SYMLINK_FOLLOW`),
//! `mkdirat`, `fstatat(AT_SYMLINK_NOFOLLOW)`, `fsync` of the folder, listings read from it.
//! Because each step starts from a descriptor and not from a path, a link swapped in after a
//! check cannot redirect the operation: the kernel refuses the link in the very call that would
//! have followed it.
//!
//! A link met beneath the root — a folder, a pack, the manifest, a staging name, a marker — is
//! refused with [`Error::Link`], which names it; nothing is read, written or deleted through
//! it. A file opened to be read must be a regular file: a FIFO there would block the reader.
//!
//! Off Unix the same operations run on paths after a `symlink_metadata` check of every
//! component: links present when the check runs are refused, but one swapped in between the
//! check and the operation is followed (the descriptor-relative calls are Unix-only).

use crate::Error;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The refusal of a link, carried inside an `io::Error` until [`io_error`] makes it an
/// [`Error::Link`].
#[derive(Debug)]
pub(crate) struct Refused {
    path: PathBuf,
    /// Whether a folder was expected there (it decides the advice).
    folder: bool,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: is a symbolic link; treepack does not follow links inside a location", self.path.display())
    }
}

impl std::error::Error for Refused {}

fn refused(path: PathBuf, folder: bool) -> io::Error {
    io::Error::other(Refused { path, folder })
}

/// The library's error for a failed local operation on `path`: [`Error::Link`] for a refused
/// link (naming the link, wherever along `path` it was), [`Error::Io`] otherwise.
pub(crate) fn io_error(path: impl Into<PathBuf>, e: io::Error) -> Error {
    match e.get_ref().and_then(|r| r.downcast_ref::<Refused>()) {
        Some(r) => Error::Link {
            path: r.path.clone(),
            fix: if r.folder {
                "replace it with a real folder: move the folder it points to here".into()
            } else {
                "replace it with a regular file: copy the file it points to here, or remove the link".into()
            },
        },
        None => Error::Io { path: path.into(), source: e },
    }
}

/// Whether `e` is the refusal of a link.
pub(crate) fn is_refused(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|r| r.is::<Refused>())
}

fn not_regular() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        "not a regular file (a FIFO, device or socket); a location holds only files and folders",
    )
}

/// The components of a path beneath a location: `/`-separated names, none empty, `.` or `..`
/// (`""` and `"."` name the folder itself: no components).
fn segments(rel: &str) -> io::Result<Vec<&str>> {
    if rel.is_empty() || rel == "." {
        return Ok(vec![]);
    }
    let segs: Vec<&str> = rel.split('/').collect();
    if segs.iter().any(|s| s.is_empty() || *s == "." || *s == ".." || s.contains('\0')) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("`{rel}`: a path inside a location has no empty, `.` or `..` segments"),
        ));
    }
    Ok(segs)
}

/// What a name beneath a folder is, not following links.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    File,
    Folder,
    Link,
    /// A FIFO, device or socket.
    Other,
}

/// A name's kind, size and modification time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Meta {
    pub(crate) kind: Kind,
    pub(crate) len: u64,
    pub(crate) modified: SystemTime,
}

/// A folder beneath a location's root (or the root itself), held open.
#[derive(Debug)]
pub(crate) struct Dir {
    /// Its path: the root's as given, then one component per step (what messages and the
    /// crash-test journal show).
    path: PathBuf,
    #[cfg(unix)]
    fd: std::os::fd::OwnedFd,
}

impl Dir {
    /// Open a location's root folder by its path, resolved as the OS resolves it (the user's
    /// own path: a link along it is followed, as any program would).
    pub(crate) fn open_root(path: &Path) -> io::Result<Dir> {
        #[cfg(unix)]
        {
            use rustix::fs::{Mode, OFlags};
            let fd = rustix::fs::open(path, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
            Ok(Dir { path: path.to_path_buf(), fd })
        }
        #[cfg(not(unix))]
        {
            if !std::fs::metadata(path)?.is_dir() {
                return Err(io::Error::new(io::ErrorKind::NotADirectory, "not a folder"));
            }
            Ok(Dir { path: path.to_path_buf() })
        }
    }

    /// The folder's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The path of `name` in this folder (for messages and the journal only).
    pub(crate) fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// This folder again (a second descriptor).
    pub(crate) fn try_clone(&self) -> io::Result<Dir> {
        #[cfg(unix)]
        return Ok(Dir { path: self.path.clone(), fd: self.fd.try_clone()? });
        #[cfg(not(unix))]
        return Ok(Dir { path: self.path.clone() });
    }

    /// The folder `rel` beneath this one, each component opened without following a link.
    pub(crate) fn sub(&self, rel: &str) -> io::Result<Dir> {
        let mut cur = self.try_clone()?;
        for seg in segments(rel)? {
            cur = cur.child_dir(seg)?;
        }
        Ok(cur)
    }

    /// The folder `rel` beneath this one, creating what is missing (`mkdir` is `mkdirat`,
    /// recorded by `on_mkdir` after it succeeds, which may fsync the parent: the protocol's
    /// order for new folders).
    pub(crate) fn sub_creating(
        &self,
        rel: &str,
        mut on_mkdir: impl FnMut(&Dir, &str) -> io::Result<()>,
    ) -> io::Result<Dir> {
        let mut cur = self.try_clone()?;
        for seg in segments(rel)? {
            cur = match cur.child_dir(seg) {
                Ok(d) => d,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    match on_mkdir(&cur, seg) {
                        Ok(()) => {}
                        // Made by another save meanwhile (or a link: `child_dir` refuses it).
                        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                        Err(e) => return Err(e),
                    }
                    cur.child_dir(seg)?
                }
                Err(e) => return Err(e),
            };
        }
        Ok(cur)
    }

    /// The folder `name` in this one, not following a link.
    fn child_dir(&self, name: &str) -> io::Result<Dir> {
        let path = self.join(name);
        #[cfg(unix)]
        {
            use rustix::fs::{Mode, OFlags};
            let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            match rustix::fs::openat(&self.fd, name, flags, Mode::empty()) {
                Ok(fd) => Ok(Dir { path, fd }),
                Err(e) => Err(self.explain(name, e.into(), true)),
            }
        }
        #[cfg(not(unix))]
        {
            match self.stat(name)? {
                Some(m) if m.kind == Kind::Folder => Ok(Dir { path }),
                Some(_) => Err(io::Error::new(io::ErrorKind::NotADirectory, "not a folder")),
                None => Err(io::ErrorKind::NotFound.into()),
            }
        }
    }

    /// After an operation on `name` failed with `e`: the refusal of a link if `name` is one,
    /// `e` otherwise.
    fn explain(&self, name: &str, e: io::Error, folder: bool) -> io::Error {
        if e.kind() == io::ErrorKind::NotFound {
            return e;
        }
        match self.stat_any(name) {
            Ok(Some(m)) if m.kind == Kind::Link => refused(self.join(name), folder),
            _ => e,
        }
    }

    /// What `name` is, not following a link (`None`: nothing of that name).
    fn stat_any(&self, name: &str) -> io::Result<Option<Meta>> {
        #[cfg(unix)]
        let r = rustix::fs::statat(&self.fd, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
            .map(|st| meta_of(&st))
            .map_err(io::Error::from);
        #[cfg(not(unix))]
        let r = std::fs::symlink_metadata(self.join(name)).map(|m| meta_of(&m));
        match r {
            Ok(m) => Ok(Some(m)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The refusal of the link `name` (found by a listing).
    pub(crate) fn refuse_link(&self, name: &str) -> io::Error {
        refused(self.join(name), false)
    }

    /// The folder's own size, kind and time.
    pub(crate) fn stat_self(&self) -> io::Result<Meta> {
        #[cfg(unix)]
        return Ok(meta_of(&rustix::fs::fstat(&self.fd)?));
        #[cfg(not(unix))]
        return Ok(meta_of(&std::fs::metadata(&self.path)?));
    }

    /// What `name` is (`None`: nothing of that name); a link is refused.
    pub(crate) fn stat(&self, name: &str) -> io::Result<Option<Meta>> {
        match self.stat_any(name)? {
            Some(m) if m.kind == Kind::Link => Err(refused(self.join(name), false)),
            m => Ok(m),
        }
    }

    /// Open the regular file `name` to read (a link is refused, so is a FIFO, device or
    /// socket — opened without blocking, then checked).
    pub(crate) fn open_read(&self, name: &str) -> io::Result<File> {
        #[cfg(unix)]
        {
            use rustix::fs::OFlags;
            // O_NONBLOCK only keeps the open of a FIFO from waiting for a writer; it changes
            // nothing for a regular file.
            self.open_file(name, OFlags::RDONLY | OFlags::NONBLOCK)
        }
        #[cfg(not(unix))]
        {
            self.stat(name)?;
            check_regular(File::open(self.join(name))?)
        }
    }

    /// Create the new file `name` to write (fails if anything has that name; a link there is
    /// refused as a link).
    pub(crate) fn create_new(&self, name: &str) -> io::Result<File> {
        #[cfg(unix)]
        {
            use rustix::fs::OFlags;
            self.open_file(name, OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL)
        }
        #[cfg(not(unix))]
        {
            self.stat(name)?;
            std::fs::OpenOptions::new().write(true).create_new(true).open(self.join(name))
        }
    }

    /// Open `name` to write, creating it if missing and keeping its bytes (a lock file).
    pub(crate) fn open_or_create(&self, name: &str) -> io::Result<File> {
        #[cfg(unix)]
        {
            use rustix::fs::OFlags;
            self.open_file(name, OFlags::WRONLY | OFlags::CREATE | OFlags::NONBLOCK)
        }
        #[cfg(not(unix))]
        {
            self.stat(name)?;
            let f = std::fs::OpenOptions::new().write(true).create(true).truncate(false).open(self.join(name))?;
            check_regular(f)
        }
    }

    #[cfg(unix)]
    fn open_file(&self, name: &str, flags: rustix::fs::OFlags) -> io::Result<File> {
        use rustix::fs::{Mode, OFlags};
        let fd =
            rustix::fs::openat(&self.fd, name, flags | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::from_raw_mode(0o666))
                .map_err(|e| self.explain(name, e.into(), false))?;
        check_regular(File::from(fd))
    }

    /// Create the folder `name` (`AlreadyExists` if the name is taken).
    pub(crate) fn mkdir(&self, name: &str) -> io::Result<()> {
        #[cfg(unix)]
        return Ok(rustix::fs::mkdirat(&self.fd, name, rustix::fs::Mode::from_raw_mode(0o777))?);
        #[cfg(not(unix))]
        return std::fs::create_dir(self.join(name));
    }

    /// Remove the file `name` (`NotFound` if missing). A link is refused, not removed, and a
    /// folder is never removed.
    pub(crate) fn unlink(&self, name: &str) -> io::Result<()> {
        match self.stat(name)? {
            None => return Err(io::ErrorKind::NotFound.into()),
            Some(m) if m.kind == Kind::Folder => {
                return Err(io::Error::new(io::ErrorKind::IsADirectory, "a folder; only files are removed"))
            }
            Some(_) => {}
        }
        // A link swapped in since the check is removed itself: `unlinkat` never follows one.
        #[cfg(unix)]
        return Ok(rustix::fs::unlinkat(&self.fd, name, rustix::fs::AtFlags::empty())?);
        #[cfg(not(unix))]
        return std::fs::remove_file(self.join(name));
    }

    /// Rename `from` to `to` in this folder, replacing `to` — unless `to` is a link, which is
    /// refused rather than silently replaced.
    pub(crate) fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        self.stat(to)?;
        #[cfg(unix)]
        return Ok(rustix::fs::renameat(&self.fd, from, &self.fd, to)?);
        #[cfg(not(unix))]
        return std::fs::rename(self.join(from), self.join(to));
    }

    /// Give the file `from` the second name `to` (`AlreadyExists` if taken; a link there is
    /// refused as a link). The link is never followed.
    pub(crate) fn link(&self, from: &str, to: &str) -> io::Result<()> {
        #[cfg(unix)]
        let r = rustix::fs::linkat(&self.fd, from, &self.fd, to, rustix::fs::AtFlags::empty()).map_err(io::Error::from);
        #[cfg(not(unix))]
        let r = std::fs::hard_link(self.join(from), self.join(to));
        r.map_err(|e| if e.kind() == io::ErrorKind::AlreadyExists { self.explain(to, e, false) } else { e })
    }

    /// fsync the folder: the names created, renamed or removed in it so far become durable.
    pub(crate) fn sync(&self) -> io::Result<()> {
        #[cfg(unix)]
        return Ok(rustix::fs::fsync(&self.fd)?);
        #[cfg(not(unix))]
        return File::open(&self.path)?.sync_all();
    }

    /// The folder's entries (UTF-8 names only, as treepack writes), each with what it is, not
    /// following links. Names removed while listing are left out.
    pub(crate) fn entries(&self) -> io::Result<Vec<(String, Meta)>> {
        let mut names = vec![];
        #[cfg(unix)]
        for ent in rustix::fs::Dir::read_from(&self.fd)? {
            let ent = ent?;
            if let Ok(n) = ent.file_name().to_str() {
                names.push(n.to_string());
            }
        }
        #[cfg(not(unix))]
        for ent in std::fs::read_dir(&self.path)? {
            if let Some(n) = ent?.file_name().to_str() {
                names.push(n.to_string());
            }
        }
        let mut out = vec![];
        for n in names.into_iter().filter(|n| n != "." && n != "..") {
            if let Some(m) = self.stat_any(&n)? {
                out.push((n, m));
            }
        }
        Ok(out)
    }
}

fn check_regular(f: File) -> io::Result<File> {
    if f.metadata()?.is_file() {
        Ok(f)
    } else {
        Err(not_regular())
    }
}

#[cfg(unix)]
fn meta_of(st: &rustix::fs::Stat) -> Meta {
    use rustix::fs::FileType;
    let kind = match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => Kind::File,
        FileType::Directory => Kind::Folder,
        FileType::Symlink => Kind::Link,
        _ => Kind::Other,
    };
    // The fields' integer types differ between platforms: converted generically.
    fn wide<T: TryInto<i64>>(v: T) -> i64 {
        v.try_into().unwrap_or(0)
    }
    let (secs, nanos) = (wide(st.st_mtime), wide(st.st_mtime_nsec));
    let since = std::time::Duration::new(secs.unsigned_abs(), u32::try_from(nanos).unwrap_or(0));
    let modified =
        if secs >= 0 { SystemTime::UNIX_EPOCH.checked_add(since) } else { SystemTime::UNIX_EPOCH.checked_sub(since) };
    Meta {
        kind,
        len: u64::try_from(wide(st.st_size)).unwrap_or(0),
        modified: modified.unwrap_or(SystemTime::UNIX_EPOCH),
    }
}

#[cfg(not(unix))]
fn meta_of(m: &std::fs::Metadata) -> Meta {
    let t = m.file_type();
    let kind = if t.is_symlink() {
        Kind::Link
    } else if t.is_dir() {
        Kind::Folder
    } else if t.is_file() {
        Kind::File
    } else {
        Kind::Other
    };
    Meta { kind, len: m.len(), modified: m.modified().unwrap_or(SystemTime::UNIX_EPOCH) }
}

/// Which folder a location's root is, from the first time it is opened (its device and inode),
/// shared by every clone of the location's backend. The root is opened by its path at each
/// step; a folder another program moved, removed or swapped for another (or for a link) in
/// the meantime would get the rest of a save — a manifest naming packs that went to the first
/// folder, a tree written among the other folder's files — so it is refused instead.
#[derive(Debug, Clone, Default)]
pub(crate) struct RootPin(std::sync::Arc<std::sync::Mutex<Option<(u64, u64)>>>);

impl RootPin {
    /// The root folder at `path`, opened now: the one first opened through this pin (recorded
    /// then), or an error saying it was replaced.
    pub(crate) fn open(&self, path: &Path) -> io::Result<Dir> {
        let dir = Dir::open_root(path)?;
        #[cfg(unix)]
        {
            let st = rustix::fs::fstat(&dir.fd)?;
            #[allow(clippy::unnecessary_cast)] // (the widths differ between platforms)
            let id = (st.st_dev as u64, st.st_ino as u64);
            let mut first = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            match *first {
                None => *first = Some(id),
                Some(was) if was != id => {
                    return Err(io::Error::other(
                        "this folder was replaced while treepack used it (another program moved, removed or \
                         swapped it): nothing more is written to or read from it; run the operation again",
                    ))
                }
                Some(_) => {}
            }
        }
        Ok(dir)
    }
}

/// A local file (or folder) of a location, described — nothing opened yet: the root folder
/// and the path beneath it.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    /// The root folder's path, as the user gave it (made absolute).
    pub(crate) root: PathBuf,
    /// `/`-separated path beneath the root; empty for the root itself.
    pub(crate) rel: String,
    /// The root folder's identity (the location backend's).
    pub(crate) pin: RootPin,
}

impl Target {
    /// The full path, for messages and the journal.
    pub(crate) fn path(&self) -> PathBuf {
        self.rel.split('/').filter(|s| !s.is_empty()).fold(self.root.clone(), |p, s| p.join(s))
    }

    /// Open the root folder (the one first opened: [`RootPin`]).
    pub(crate) fn root(&self) -> io::Result<Dir> {
        self.pin.open(&self.root)
    }

    /// The folder the target names, opened beneath the root.
    pub(crate) fn dir(&self) -> io::Result<Dir> {
        self.root()?.sub(&self.rel)
    }

    /// The rel path's folder part and last name (`None` for the root itself).
    pub(crate) fn split(&self) -> Option<(&str, &str)> {
        if self.rel.is_empty() {
            return None;
        }
        Some(self.rel.rsplit_once('/').unwrap_or(("", self.rel.as_str())))
    }

    /// The target's parent folder, opened beneath the root, and the target's name in it.
    pub(crate) fn parent(&self) -> io::Result<(Dir, &str)> {
        let (dir, name) =
            self.split().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the location's own folder"))?;
        Ok((self.root()?.sub(dir)?, name))
    }

    /// Open the target to read (a regular file, reached without following any link).
    pub(crate) fn open_read(&self) -> io::Result<File> {
        let (dir, name) = self.parent()?;
        dir.open_read(name)
    }

    /// What the target is (`None`: nothing there); a link is refused.
    pub(crate) fn stat(&self) -> io::Result<Option<Meta>> {
        let r = match self.split() {
            None => self.root().and_then(|d| d.stat_self()).map(Some),
            Some(_) => self.parent().and_then(|(dir, name)| dir.stat(name)),
        };
        match r {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            r => r,
        }
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn setup() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let (root, outside) = (d.path().join("root"), d.path().join("outside"));
        std::fs::create_dir_all(root.join("real")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("f"), b"outside").unwrap();
        (d, root, outside)
    }

    #[test]
    fn links_are_refused_at_every_step() {
        let (_d, root, outside) = setup();
        symlink(&outside, root.join("lnk")).unwrap();
        symlink(outside.join("f"), root.join("real/f")).unwrap();
        let dir = Dir::open_root(&root).unwrap();
        let e = dir.sub("lnk").unwrap_err();
        assert!(is_refused(&e), "{e}");
        let err = io_error(root.join("lnk/x"), e);
        assert_eq!(err.kind(), "link");
        assert!(err.to_string().contains(&root.join("lnk").display().to_string()), "{err}");
        assert!(err.to_string().contains("real folder"), "{err}");
        let real = dir.sub("real").unwrap();
        for e in [
            real.open_read("f").unwrap_err(),
            real.create_new("f").unwrap_err(),
            real.open_or_create("f").unwrap_err(),
            real.unlink("f").unwrap_err(),
            real.stat("f").unwrap_err(),
        ] {
            assert!(is_refused(&e), "{e}");
        }
        std::fs::write(root.join("real/new"), b"x").unwrap();
        assert!(is_refused(&real.rename("new", "f").unwrap_err()));
        assert!(is_refused(&real.link("new", "f").unwrap_err()));
        let kinds: Vec<_> = real.entries().unwrap().into_iter().map(|(n, m)| (n, m.kind)).collect();
        assert!(kinds.contains(&("f".into(), Kind::Link)), "{kinds:?}");
        assert_eq!(std::fs::read(outside.join("f")).unwrap(), b"outside");
        let t = Target { root: root.clone(), rel: "lnk/f".into(), pin: RootPin::default() };
        assert!(is_refused(&t.open_read().unwrap_err()));
        assert!(segments("a/../b").is_err() && segments("a//b").is_err() && segments("./a").is_err());
    }

    #[test]
    fn fifos_are_refused_without_blocking() {
        let (_d, root, _) = setup();
        let p = root.join("real/fifo");
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let dir = Dir::open_root(&root).unwrap().sub("real").unwrap();
        assert_eq!(dir.open_read("fifo").unwrap_err().kind(), io::ErrorKind::InvalidInput);
        // Opened to write without a reader: refused by the kernel (ENXIO) rather than waited on.
        assert!(dir.open_or_create("fifo").is_err());
    }
}
