//! Repositories: many named trees in one location, sharing chunks by hash (docs/repository.md,
//! docs/format.md section 10).
//!
//! A save into a repository writes only the chunks no committed tree holds yet, in a few new
//! packs of its own, and commits its name with a create-only put of `refs/<name>.json`; packs
//! are never rewritten. A tree of a repository is a location too (`LOCATION@NAME`), so every
//! reader — load, partial reads, structure, verify, the CLI — works on it unchanged.

mod gc;
mod save;

pub use gc::RepoGcReport;

use crate::error::{Error, Result};
use crate::format::hash::Hash32;
use crate::format::manifest;
use crate::format::repo::{self as layout, PackIndex, RefRecord};
use crate::read::{LoadOptions, Reader, VerifyReport};
use crate::save::{SaveInfo, SaveOptions};
use crate::Location;
use crate::{IntoLocation, Node};
use bytes::Bytes;
use futures::StreamExt;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// How many small files (refs, indexes, manifests) a repository reads at once.
const READ_CONCURRENCY: usize = 16;

/// A committed name: what [`Repository::names`] lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeRef {
    /// The tree's name.
    pub name: String,
    /// Its root hash (docs/format.md section 9).
    pub root: Hash32,
    /// When its save committed, in milliseconds since the Unix epoch.
    pub saved_ms: u64,
    /// Bytes that save wrote.
    pub bytes_written: u64,
    /// Bytes of chunks that save found already stored.
    pub bytes_reused: u64,
}

/// A repository of trees sharing chunks by hash.
#[derive(Debug)]
pub struct Repository {
    loc: Location,
    /// Pack indexes read so far, by path (they never change once written).
    indexes: Mutex<HashMap<String, Arc<PackIndex>>>,
    /// Pack lists of committed manifests read so far, by manifest path (immutable too).
    tree_packs: Mutex<HashMap<String, Arc<Vec<String>>>>,
}

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// A repository's own location: one that names a tree of a repository (`LOCATION@NAME`, as a
/// path with an `@` that does not exist yet reads) is refused, since opening the repository
/// it names instead would mix two runs' checkpoints (`exp@lr0.1` and `exp@lr0.01` both `exp`).
fn not_a_tree(loc: Location) -> Result<Location> {
    match loc.tree_name() {
        None => Ok(loc),
        Some(name) => Err(Error::BadLocation {
            location: loc.display().to_string(),
            reason: format!(
                "reads as tree `{name}` of a repository at `{}` (LOCATION@NAME, docs/repository.md), not as a \
                 repository's location; for a repository whose path holds an `@`, create its folder first, or \
                 leave the `@` out of the name",
                loc.repository().display()
            ),
        }),
    }
}

impl Repository {
    fn new(loc: Location) -> Repository {
        Repository { loc, indexes: Mutex::default(), tree_packs: Mutex::default() }
    }

    /// Open an existing repository.
    ///
    /// # Errors
    /// [`Error::NotFound`] when there is no repository at the location (it says how to create
    /// one), [`Error::InvalidManifest`] for a damaged marker, storage errors.
    pub async fn open_async(location: impl IntoLocation) -> Result<Repository> {
        let loc = not_a_tree(location.into_location()?)?;
        let marker = loc.get_opt(layout::MARKER, layout::MAX_SMALL_FILE).await?;
        match marker {
            Some(b) => {
                layout::check_marker(&b).map_err(|r| Error::manifest(&loc.file_name(layout::MARKER), "", r))?;
                Ok(Repository::new(loc))
            }
            None => Err(crate::location::no_repository(&loc, None)),
        }
    }

    /// Create a repository (or open the one already there). Only a new or an empty folder (or
    /// prefix) is made one: a location that holds other files is refused, nothing written.
    ///
    /// # Errors
    /// [`Error::BadLocation`] when the location holds a plain tree or files a repository does
    /// not hold, storage errors.
    pub async fn create_async(location: impl IntoLocation) -> Result<Repository> {
        let loc = not_a_tree(location.into_location()?)?;
        loc.refuse_write()?;
        if loc.layout() == crate::store::Layout::SingleFile {
            return Err(Error::BadLocation {
                location: loc.display().to_string(),
                reason: "a repository is a folder or an object-store prefix, not a single .tpk file".into(),
            });
        }
        if loc.exists(crate::store::MANIFEST_NAME).await? {
            return Err(Error::BadLocation {
                location: loc.display().to_string(),
                reason: "holds a tree (treepack.json), not a repository; create the repository elsewhere".into(),
            });
        }
        if !loc.exists(layout::MARKER).await? {
            refuse_foreign(&loc).await?;
        }
        match loc.put(layout::MARKER, vec![Bytes::from(layout::marker_bytes())], true).await {
            Ok(()) | Err(Error::AlreadyExists { .. }) => Repository::open_async(loc).await,
            Err(e) => Err(e),
        }
    }

    /// The repository's location.
    pub fn location(&self) -> &Location {
        &self.loc
    }

    /// The location of tree `name` (`LOCATION@NAME`): pass it to [`crate::load`],
    /// [`crate::open`] and the rest.
    ///
    /// # Errors
    /// [`Error::BadLocation`] for an invalid name.
    pub fn tree(&self, name: &str) -> Result<Location> {
        self.loc.with_tree(name)
    }

    /// Save `tree` as `name`: only chunks the repository does not hold yet are written.
    /// `SaveInfo::bytes_reused` tells what was found, `SaveInfo::bytes_written` what was not,
    /// `SaveInfo::root` the tree's root hash. Create-only unless `opts.overwrite`: of two
    /// writers of one name, one wins and the other gets [`Error::AlreadyExists`].
    ///
    /// # Errors
    /// [`Error::AlreadyExists`], [`Error::BadLocation`] for an invalid name, as [`crate::save()`].
    pub async fn save_async(&self, tree: &Node, name: &str, opts: &SaveOptions) -> Result<SaveInfo> {
        save::save(self, tree, name, opts).await
    }

    /// Load tree `name` (every [`LoadOptions`] applies).
    ///
    /// # Errors
    /// [`Error::NotFound`] for an unknown name, as [`crate::load`].
    pub fn load(&self, name: &str, opts: &LoadOptions) -> Result<Node> {
        crate::load(self.tree(name)?, opts)
    }

    /// A lazy reader on tree `name`.
    ///
    /// # Errors
    /// As [`Repository::load`].
    pub async fn reader_async(&self, name: &str) -> Result<Reader> {
        Reader::open_async(self.tree(name)?).await
    }

    /// The ref of `name`, or `None`.
    async fn read_ref(&self, name: &str) -> Result<Option<RefRecord>> {
        let rel = layout::ref_path(name);
        let Some(b) = self.loc.get_opt(&rel, layout::MAX_SMALL_FILE).await? else { return Ok(None) };
        RefRecord::decode(&b).map(Some).map_err(|r| Error::manifest(&self.loc.file_name(&rel), "", r))
    }

    /// Root hash of tree `name`, as recorded when it was saved (no manifest read).
    ///
    /// # Errors
    /// [`Error::NotFound`] for an unknown name.
    pub async fn root_hash(&self, name: &str) -> Result<Hash32> {
        let r = self.read_ref(name).await?.ok_or_else(|| self.unknown(name))?;
        Hash32::from_hex(&r.root).ok_or_else(|| Error::internal("a checked ref holds a bad root"))
    }

    fn unknown(&self, name: &str) -> Error {
        crate::location::unknown_tree(&self.loc, name)
    }

    /// Every committed name, sorted, with its root, save time and sizes.
    ///
    /// # Errors
    /// Storage errors; [`Error::InvalidManifest`] for a damaged ref.
    pub async fn names_async(&self) -> Result<Vec<TreeRef>> {
        let listed = self.loc.list(layout::REFS_DIR).await?;
        let names: Vec<String> =
            listed.iter().filter_map(|(rel, _, _)| layout::name_of_ref(rel).map(str::to_string)).collect();
        let refs: Vec<Result<Option<(String, RefRecord)>>> = futures::stream::iter(names)
            .map(|n| async move { Ok(self.read_ref(&n).await?.map(|r| (n, r))) })
            .buffered(READ_CONCURRENCY)
            .collect()
            .await;
        let mut out = vec![];
        for r in refs {
            // A name deleted between the listing and its read is simply gone.
            if let Some((name, r)) = r? {
                let root =
                    Hash32::from_hex(&r.root).ok_or_else(|| Error::internal("a checked ref holds a bad root"))?;
                out.push(TreeRef {
                    name,
                    root,
                    saved_ms: r.saved_ms,
                    bytes_written: r.bytes_written,
                    bytes_reused: r.bytes_reused,
                });
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Delete the name `name`. Its chunks stay until [`Repository::gc_async`] finds no other
    /// tree uses them.
    ///
    /// # Errors
    /// [`Error::NotFound`] for an unknown name, storage errors.
    pub async fn delete_async(&self, name: &str) -> Result<()> {
        layout::validate_name(name)
            .map_err(|r| Error::BadLocation { location: self.loc.display().into(), reason: r })?;
        let rel = layout::ref_path(name);
        if !self.loc.exists(&rel).await? {
            return Err(self.unknown(name));
        }
        self.loc.delete(&rel).await?;
        // Its signature goes with it (a later tree of the name must not find it).
        let sig = format!("{}/{name}{}", crate::sign::REPO_SIGNATURES, crate::sign::SIDECAR_SUFFIX);
        match self.loc.delete(&sig).await {
            Ok(()) | Err(Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Remove what no committed name needs (the protocol: docs/repository.md, "How gc stays safe").
    ///
    /// # Errors
    /// Storage errors; a damaged ref or manifest stops gc before it deletes anything.
    pub async fn gc_async(&self, grace: std::time::Duration) -> Result<RepoGcReport> {
        gc::gc(self, grace).await
    }

    /// Re-hash every chunk of every tree (each shared chunk once per tree that holds it), and
    /// check each pack index against its pack. Problems name the tree (`name:key`) or file.
    ///
    /// # Errors
    /// Storage errors other than missing or corrupt data (which are reported as problems).
    pub async fn verify_async(&self) -> Result<VerifyReport> {
        let mut report = VerifyReport::default();
        for t in self.names_async().await? {
            let problem = |reason: String| crate::read::Problem {
                file: format!("{}@{}", self.loc.display(), t.name),
                key: String::new(),
                chunk: None,
                reason,
            };
            let r = match Reader::open_async(self.tree(&t.name)?).await {
                Ok(r) => r,
                Err(e) => {
                    report.problems.push(problem(e.to_string()));
                    continue;
                }
            };
            if r.root_hash() != t.root {
                report.problems.push(problem(format!(
                    "root hash {} differs from the {} its ref records",
                    r.root_hash().to_hex(),
                    t.root.to_hex()
                )));
            }
            let v = r.verify_async().await?;
            report.chunks_checked += v.chunks_checked;
            report.bytes_checked += v.bytes_checked;
            report.problems.extend(v.problems.into_iter().map(|mut p| {
                p.key = format!("{}:{}", t.name, p.key);
                p
            }));
        }
        // Staging files (`…#pid-n`) are leftovers of killed writes, for gc, not indexes.
        for (rel, _, _) in self.loc.list(layout::INDEX_DIR).await?.into_iter().filter(|(r, _, _)| r.ends_with(".json"))
        {
            match self.read_index(&rel).await {
                Ok(idx) => match self.loc.size(&idx.pack).await {
                    Ok(size) if size == idx.size => {}
                    Ok(size) => report.problems.push(crate::read::Problem {
                        file: self.loc.file_name(&rel),
                        key: String::new(),
                        chunk: None,
                        reason: format!("{} has {size} bytes, the index says {}", idx.pack, idx.size),
                    }),
                    Err(e) => report.problems.push(crate::read::Problem {
                        file: self.loc.file_name(&rel),
                        key: String::new(),
                        chunk: None,
                        reason: e.to_string(),
                    }),
                },
                Err(e) => report.problems.push(crate::read::Problem {
                    file: self.loc.file_name(&rel),
                    key: String::new(),
                    chunk: None,
                    reason: e.to_string(),
                }),
            }
        }
        Ok(report)
    }

    /// A pack index, from the cache or read and checked.
    async fn read_index(&self, rel: &str) -> Result<Arc<PackIndex>> {
        if let Some(i) = self.indexes.lock().ok().and_then(|m| m.get(rel).cloned()) {
            return Ok(i);
        }
        let (b, file) = self.get_part(rel, layout::MAX_INDEX_FILE).await?;
        let idx = Arc::new(PackIndex::decode(&b).map_err(|r| Error::manifest(&file, "", r))?);
        if layout::index_path(&idx.pack).as_deref() != Some(rel) {
            return Err(Error::manifest(&file, "pack", format!("{} does not belong to this index file", idx.pack)));
        }
        if let Ok(mut m) = self.indexes.lock() {
            m.insert(rel.to_string(), idx.clone());
        }
        Ok(idx)
    }

    /// The packs a committed manifest names, from the cache or read (and its hash checked).
    async fn packs_of_tree(&self, tree: &str) -> Result<Arc<Vec<String>>> {
        if let Some(p) = self.tree_packs.lock().ok().and_then(|m| m.get(tree).cloned()) {
            return Ok(p);
        }
        let (bytes, file) = self.manifest_bytes(tree).await?;
        let m = manifest::decode(&bytes, &file)?;
        let packs = Arc::new(m.packs.into_iter().map(|p| p.path).collect::<Vec<_>>());
        if let Ok(mut c) = self.tree_packs.lock() {
            c.insert(tree.to_string(), packs.clone());
        }
        Ok(packs)
    }

    /// A file of the repository that must be there (a missing one is a missing part), of at
    /// most `limit` bytes, with its name for errors.
    async fn get_part(&self, rel: &str, limit: u64) -> Result<(Bytes, String)> {
        let file = self.loc.file_name(rel);
        let b = self.loc.get_opt(rel, limit).await?.ok_or_else(|| Error::missing_part(self.loc.display(), &file))?;
        Ok((b, file))
    }

    /// A committed manifest's bytes, checked against the hash its file is named by.
    async fn manifest_bytes(&self, tree: &str) -> Result<(Bytes, String)> {
        crate::location::committed_manifest(&self.loc, tree).await
    }
}

/// Refuse to make a repository of a folder (or prefix) that holds anything a repository does
/// not: a project folder, another tool's checkpoints. What a repository holds itself (another
/// creator may be writing it right now) is fine, and so is an empty or a new folder.
///
/// # Errors
/// [`Error::BadLocation`] naming a few of the foreign names; storage errors.
async fn refuse_foreign(loc: &Location) -> Result<()> {
    const OWN: [&str; 8] = [
        layout::MARKER,
        crate::sign::REPO_SIGNATURES,
        layout::REFS_DIR,
        layout::TREES_DIR,
        layout::INDEX_DIR,
        layout::LEASES_DIR,
        layout::GC_STATE,
        crate::store::PACKS_DIR,
    ];
    // A marker's staging file (`treepack-repo.json#N`) is a creator's at work.
    let own = |name: &str| OWN.contains(&name) || name.starts_with(layout::MARKER);
    // Names directly inside (nothing opened or followed; one delimited listing on a store).
    let mut foreign: Vec<String> = loc.top_entries(4096).await?.into_iter().filter(|n| !own(n)).collect();
    if foreign.is_empty() {
        return Ok(());
    }
    foreign.sort();
    foreign.dedup();
    let n = foreign.len();
    let shown: Vec<String> = foreign.iter().take(5).map(|f| format!("`{f}`")).collect();
    Err(Error::BadLocation {
        location: loc.display().to_string(),
        reason: format!(
            "holds {}{} that {} not a repository's, so it is not a repository; create the repository in an \
             empty or a new folder",
            shown.join(", "),
            if n > 5 { format!(" and {} more", n - 5) } else { String::new() },
            if n == 1 { "is" } else { "are" },
        ),
    })
}

/// Blocking facades, for callers outside an async runtime.
impl Repository {
    /// Blocking [`Repository::open_async`].
    ///
    /// # Errors
    /// As [`Repository::open_async`].
    pub fn open(location: impl IntoLocation) -> Result<Repository> {
        let loc = location.into_location()?;
        loc.clone().block_on(Repository::open_async(loc))
    }
    /// Blocking [`Repository::create_async`].
    ///
    /// # Errors
    /// As [`Repository::create_async`].
    pub fn create(location: impl IntoLocation) -> Result<Repository> {
        let loc = location.into_location()?;
        loc.clone().block_on(Repository::create_async(loc))
    }
    /// Blocking [`Repository::save_async`].
    ///
    /// # Errors
    /// As [`Repository::save_async`].
    pub fn save(&self, tree: &Node, name: &str, opts: &SaveOptions) -> Result<SaveInfo> {
        crate::block_on(self.save_async(tree, name, opts))
    }
    /// Blocking [`Repository::names_async`].
    ///
    /// # Errors
    /// As [`Repository::names_async`].
    pub fn names(&self) -> Result<Vec<TreeRef>> {
        self.loc.block_on(self.names_async())
    }
    /// Blocking [`Repository::delete_async`].
    ///
    /// # Errors
    /// As [`Repository::delete_async`].
    pub fn delete(&self, name: &str) -> Result<()> {
        self.loc.block_on(self.delete_async(name))
    }
    /// Blocking [`Repository::gc_async`].
    ///
    /// # Errors
    /// As [`Repository::gc_async`].
    pub fn gc(&self, grace: std::time::Duration) -> Result<RepoGcReport> {
        crate::block_on(self.gc_async(grace))
    }
    /// Blocking [`Repository::verify_async`].
    ///
    /// # Errors
    /// As [`Repository::verify_async`].
    pub fn verify(&self) -> Result<VerifyReport> {
        crate::block_on(self.verify_async())
    }
}
