//! Locations as the engine reads them: what a location string names, resolved one layer above
//! the store (docs/design.md decision 75).
//!
//! The store ([`crate::store`], the `treepack-store` crate) knows places: folders, files,
//! prefixes, buckets. Two things a location string may name are the engine's: a tree of a
//! repository (`LOCATION@NAME`, docs/repository.md), whose manifest is found through the name's
//! ref instead of `treepack.json`; and a JSON transport document (`x.json`, docs/transport.md),
//! read as the tree it holds. [`Location::parse_with`] resolves both and yields a store location
//! with the tree name, if any — every reader and writer then works on it unchanged.

use crate::error::{Error, Result};
use crate::store::{self, Layout, StorageOptions};
use std::path::Path;
use std::sync::Arc;

/// A place a tree is (or will be) stored: a store location ([`store::Location`], whose methods
/// it has through `Deref`), and for a tree of a repository (`LOCATION@NAME`) the tree's name.
#[derive(Debug, Clone)]
pub struct Location {
    store: store::Location,
    /// A tree of the repository at this location (`LOCATION@NAME`, crate::repo): its manifest
    /// is found through the name's ref instead of `treepack.json`.
    tree: Option<Arc<str>>,
    /// What another tool wrote that this location's tree was read from (a transport document,
    /// a torch.save checkpoint), for messages and `inspect`; `None` for a treepack tree.
    read_from: Option<&'static str>,
    /// The file that tree was read from, where there is one (a conversion reads and writes the
    /// file itself, not the tree read from it).
    file: Option<store::Location>,
}

/// A safetensors file whose metadata says `"format": "pt"` (how PyTorch's writers, Hugging Face's
/// among them, mark their files) holds torch tensors: its arrays are annotated as treepack's
/// torch integration annotates tensors, so they load as `torch.Tensor`s where torch is
/// installed (numpy arrays elsewhere, or with `numpy=True`). Other files' arrays stay arrays.
fn torch_tensors_where_said(tree: crate::Node, metadata: Option<&serde_json::Value>) -> Result<crate::Node> {
    use crate::format::model::Leaf;
    if metadata.and_then(|m| m.get("format")).and_then(|f| f.as_str()) != Some("pt") {
        return Ok(tree);
    }
    tree.try_map(&mut |_, leaf| match leaf {
        Leaf::Array(a) if a.annotation().is_none() => {
            Ok(Leaf::Array(a.with_annotation(Some(serde_json::json!({"type": "torch.Tensor"})))?))
        }
        other => Ok(other),
    })
}

/// Why a safetensors file's location refuses writes.
const SAFETENSORS_READ_ONLY: &str =
    "a safetensors file is read as a tree but not written to as one: save to a directory \
                                     or a .tpk, or `treepack convert TREE FILE.safetensors`";

/// Why a folder of checkpoint shards refuses writes.
const CHECKPOINT_READ_ONLY: &str = "a folder of checkpoint shards is read as a tree but not written to as one: save \
                                    to another directory or a .tpk (`treepack cp CHECKPOINT DST` stores its tree)";

/// Why a torch.save checkpoint's location refuses writes.
const TORCH_READ_ONLY: &str = crate::foreign::torch::DOCUMENT_READ_ONLY;

/// What a torch.save checkpoint's location is shown as read from.
const TORCH_READ_FROM: &str = "torch.save checkpoint";

/// The tree another tool's file holds ([`Location::foreign_tree`]), and how a location over it
/// says where it came from.
#[derive(Debug)]
pub struct ForeignTree {
    /// The tree, its arrays views of the file where they can be.
    pub tree: crate::Node,
    /// The file's metadata (safetensors' `__metadata__`, GGUF's key-value pairs), as a tree's.
    pub metadata: Option<serde_json::Value>,
    why: &'static str,
    read_from: &'static str,
}

impl ForeignTree {
    /// The tree with every array's bytes copied out of the file into memory of its own, each
    /// array in 8 MiB pieces on the compute pool's threads (fresh pages are faulted in on every
    /// core, not one): what a load that does not map the file gives, so that its arrays outlive
    /// any later change to the file (a file rewritten in place under a mapping's views kills the
    /// process). Each array's buffer is its own, so a builder takes it without a second copy.
    ///
    /// # Errors
    /// None in practice: each array is rebuilt from its own parts.
    pub fn into_owned(self) -> Result<crate::Node> {
        use crate::format::model::{ArrayData, Leaf};
        use rayon::prelude::*;
        let mut tree = self.tree;
        let mut leaves = Vec::new();
        tree.for_each_leaf_mut(&mut |l| leaves.push(std::mem::replace(l, Leaf::None)));
        let copied: Vec<Leaf> = crate::runtime::parallel(|| {
            leaves
                .into_par_iter()
                .map(|l| match l {
                    Leaf::Array(a) => {
                        let annotation = a.annotation().cloned();
                        let (dtype, shape, bytes) = a.into_parts();
                        let copy = bytes::Bytes::from(owned_copy(&bytes));
                        Ok(Leaf::Array(ArrayData::new(dtype, shape, copy)?.annotated(annotation.as_ref())))
                    }
                    other => Ok(other),
                })
                .collect::<Result<Vec<Leaf>>>()
        })?;
        let mut copied = copied.into_iter();
        tree.for_each_leaf_mut(&mut |l| {
            if let Some(c) = copied.next() {
                *l = c;
            }
        });
        Ok(tree)
    }
}

/// `src` copied into a fresh buffer, 8 MiB pieces at a time on the calling pool's threads.
fn owned_copy(src: &[u8]) -> Vec<u8> {
    use rayon::prelude::*;
    const PIECE: usize = 8 << 20;
    let mut v: Vec<u8> = Vec::with_capacity(src.len());
    v.spare_capacity_mut()[..src.len()].par_chunks_mut(PIECE).zip(src.par_chunks(PIECE)).for_each(|(d, s)| {
        // SAFETY: `d` and `s` are the same piece of two slices of equal length (so of equal
        // length themselves), one in a fresh allocation: they do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(s.as_ptr(), d.as_mut_ptr().cast::<u8>(), s.len()) };
    });
    // SAFETY: every one of the first `src.len()` bytes was written above.
    unsafe { v.set_len(src.len()) };
    v
}

/// Why a transport document's location refuses writes.
const DOCUMENT_READ_ONLY: &str =
    "a JSON transport document is read as a tree but not written to; save to a directory or \
                                  a .tpk (`treepack import DOC DST` stores the document's tree)";

impl Location {
    /// Parse a location string: a local path, `file://…`, or `memory://bucket/prefix` (a
    /// process-wide in-memory store, for tests). A path ending in `.tpk` uses the single-file
    /// layout; an existing local file is read as a single file whatever its name, and an
    /// existing `.json` transport document, `torch.save` checkpoint or safetensors file as the
    /// tree it holds (read-only). `LOCATION@NAME`
    /// names the tree `NAME` of the repository at `LOCATION`.
    ///
    /// # Errors
    /// [`Error::BadLocation`] for unsupported schemes or malformed strings.
    pub fn parse(s: &str) -> Result<Location> {
        Self::parse_with(s, &StorageOptions::new())
    }

    /// Parse a location with explicit [`StorageOptions`] (see [`store::Location::parse_with`]
    /// for the schemes and options; [`Location::parse`] for trees of repositories and transport
    /// documents).
    ///
    /// # Errors
    /// [`Error::BadLocation`] for unsupported schemes, malformed strings, unknown option keys
    /// and cloud clients that cannot be configured (e.g. no bucket); errors reading a
    /// transport document.
    pub fn parse_with(s: &str, options: &StorageOptions) -> Result<Location> {
        if s.is_empty() {
            return Err(Error::BadLocation { location: s.to_string(), reason: "empty location".into() });
        }
        if let Some((repo, name)) = split_tree(s) {
            return Self::parse_with(repo, options)?.with_tree(name);
        }
        let loc = store::Location::parse_with(s, options)?;
        // A local single file named `.json` may be a transport document, and a file or folder of
        // any name another tool's checkpoint (told by its content, by the one detector `convert`
        // and the Python package use): each is read as the tree it holds.
        let Some(path) = loc.local_path() else { return Ok(loc.into()) };
        let file = loc.layout() == Layout::SingleFile;
        if file && crate::transport::is_document_file(path) {
            return crate::transport::read_document_file(path, s);
        }
        match Self::foreign_tree(path, file)? {
            Some(f) => Self::read_into_memory(&f.tree, f.metadata, s, f.why, f.read_from, loc),
            None => Ok(loc.into()),
        }
    }

    /// The tree another tool's local file or folder named by the location string `s` holds
    /// ([`Location::foreign_tree`]), where `s` names one as [`Location::parse_with`] reads it;
    /// `None` for every other location.
    ///
    /// # Errors
    /// As [`Location::parse_with`].
    pub fn foreign_of(s: &str, options: &StorageOptions) -> Result<Option<ForeignTree>> {
        if s.is_empty() || split_tree(s).is_some() {
            return Ok(None);
        }
        let loc = store::Location::parse_with(s, options)?;
        let Some(path) = loc.local_path() else { return Ok(None) };
        let file = loc.layout() == Layout::SingleFile;
        if file && crate::transport::is_document_file(path) {
            return Ok(None);
        }
        Self::foreign_tree(path, file)
    }

    /// The tree another tool's local file or folder holds, told by its content (by the one
    /// detector `convert` and the Python package use), read without running its code; `None`
    /// for anything else (a treepack tree, or what only the Python package reads). Its arrays
    /// are views of the file's bytes (a private memory map) where they can be. What
    /// [`Location::parse_with`] stores in memory as a read-only tree, and what a whole load
    /// builds from directly (`treepack-py`'s `load`).
    ///
    /// # Errors
    /// The format reader's: a damaged or hostile file, a refused pickle global, a link.
    pub fn foreign_tree(path: &Path, file: bool) -> Result<Option<ForeignTree>> {
        let found = |tree, metadata, why, read_from| Ok(Some(ForeignTree { tree, metadata, why, read_from }));
        match crate::convert::content_format(path) {
            // Read without pickle.
            Some("torch") if file => found(crate::foreign::torch::read(path)?, None, TORCH_READ_ONLY, TORCH_READ_FROM),
            // A folder of Hugging Face shards and their index: one flat tree.
            Some("torch") => match crate::foreign::sharded::find(path) {
                Some(found_shards) => {
                    let (tree, metadata) = crate::foreign::sharded::read(&found_shards)?;
                    found(tree, metadata, CHECKPOINT_READ_ONLY, "folder of torch.save shards")
                }
                None => Ok(None),
            },
            // A torch.distributed checkpoint folder: its entries, flat, by their names.
            Some("dcp") if !file => {
                let (tree, metadata) = crate::foreign::dcp::read(path)?;
                found(tree, metadata, crate::foreign::dcp::READ_ONLY, "torch.distributed checkpoint")
            }
            // llama.cpp's models: tensors flat by name, quantized ones as their bytes.
            Some("gguf") if file => {
                let (tree, metadata) = crate::foreign::gguf::read(path)?;
                found(tree, metadata, crate::foreign::gguf::READ_ONLY, crate::foreign::gguf::READ_FROM)
            }
            // Its tensors, flat, named as stored (a state_dict's keys); a sharded one's too.
            Some("safetensors") => {
                let plain: Location = store::Location::parse(&path.to_string_lossy())?.into();
                let (tree, metadata) = crate::convert::read_safetensors(&plain, None)?;
                let tree = torch_tensors_where_said(tree, metadata.as_ref())?;
                if file {
                    found(tree, metadata, SAFETENSORS_READ_ONLY, "safetensors file")
                } else {
                    found(tree, metadata, CHECKPOINT_READ_ONLY, "folder of safetensors shards")
                }
            }
            _ => Ok(None),
        }
    }

    /// A fresh in-memory location of its own (not reachable by a `memory://` name), shown as
    /// `display`: where a transport document is unpacked to be read.
    pub(crate) fn new_memory(display: &str) -> Location {
        store::Location::new_memory(display).into()
    }

    /// A fresh read-only location in memory holding `tree` (with `metadata`), read from a file
    /// of the kind `read_from` names and shown as `display`: every reader then works on it as on
    /// a treepack tree.
    pub(crate) fn read_into_memory(
        tree: &crate::Node,
        metadata: Option<serde_json::Value>,
        display: &str,
        why: &'static str,
        read_from: &'static str,
        file: store::Location,
    ) -> Result<Location> {
        let loc = Location::new_memory(display);
        // Each chunk in a pack of its own: the in-memory store keeps a one-part pack as the very
        // bytes given (a view of the file read), where it would copy several parts into one
        // buffer. Stored raw, with no previews: nothing here is written anywhere.
        let opts = crate::SaveOptions {
            durable: false,
            metadata,
            pack_bytes: 1,
            preview: false,
            compression: crate::save::Compression::none(),
            ..Default::default()
        };
        crate::save(tree, loc.clone(), &opts)?;
        Ok(Location { file: Some(file), ..loc.into_read_only_as(why, read_from) })
    }

    /// The place itself: for a tree read from another tool's file, that file (what a
    /// conversion reads or overwrites); this location otherwise.
    pub fn place(&self) -> Location {
        match &self.file {
            Some(f) => f.clone().into(),
            None => self.clone(),
        }
    }

    /// This location, refusing writes from now on (a transport document's, once unpacked).
    pub(crate) fn into_read_only(self) -> Location {
        self.into_read_only_as(DOCUMENT_READ_ONLY, "JSON transport document")
    }

    /// This location, refusing writes from now on with `why`: the tree read from a file of
    /// the kind `read_from` names.
    pub(crate) fn into_read_only_as(self, why: &'static str, read_from: &'static str) -> Location {
        Location { store: self.store.refusing_writes(why), read_from: Some(read_from), ..self }
    }

    /// What kind of file this location's tree was read from, when it is not a treepack tree
    /// (`"JSON transport document"`, `"torch.save checkpoint"`).
    pub fn read_from(&self) -> Option<&'static str> {
        self.read_from
    }

    /// Drop the process-wide `memory://bucket` store and everything in it (its memory is
    /// freed once no location uses it). Returns whether there was one.
    pub fn forget_memory(bucket: &str) -> bool {
        store::Location::forget_memory(bucket)
    }

    /// The location one save writes through (store::Location::for_save): an encrypted save's
    /// data key is its own, never shared with another save through this location.
    pub(crate) fn for_save(&self) -> Location {
        Location { store: self.store.for_save(), ..self.clone() }
    }

    /// The store location (for a tree of a repository: the repository's, shown as
    /// `LOCATION@NAME`).
    pub fn store(&self) -> &store::Location {
        &self.store
    }

    /// The committed manifest of this location's tree (`LOCATION@NAME`): the name's ref, then
    /// the manifest it names, checked against the hash its file is named by. How a name
    /// resolves is this layer's; readers and the repository both read through it.
    ///
    /// # Errors
    /// [`Error::NotFound`] when the repository or the name does not exist; a damaged ref or a
    /// manifest whose bytes do not match its name.
    pub(crate) async fn tree_manifest(&self) -> Result<(bytes::Bytes, String)> {
        use crate::format::repo::{self as layout, RefRecord};
        let name = self.tree.as_deref().unwrap_or_default();
        let repo = self.repository();
        let rel = layout::ref_path(name);
        let Some(b) = repo.get_opt(&rel, layout::MAX_SMALL_FILE).await? else {
            // Say whether the repository itself is missing.
            let Some(marker) = repo.get_opt(layout::MARKER, layout::MAX_SMALL_FILE).await? else {
                return Err(no_repository(&repo, Some(self)));
            };
            layout::check_marker(&marker).map_err(|r| Error::manifest(&repo.file_name(layout::MARKER), "", r))?;
            return Err(unknown_tree(&repo, name));
        };
        let r = RefRecord::decode(&b).map_err(|e| Error::manifest(&repo.file_name(&rel), "", e))?;
        committed_manifest(&repo, &r.tree).await
    }

    /// The tree name of a `LOCATION@NAME` location.
    pub fn tree_name(&self) -> Option<&str> {
        self.tree.as_deref()
    }

    /// The repository of a `LOCATION@NAME` location (itself otherwise).
    pub fn repository(&self) -> Location {
        let Some(name) = &self.tree else { return self.clone() };
        let display = self.display();
        Location {
            store: self.store.relabeled(&display[..display.len() - name.len() - 1]),
            tree: None,
            read_from: None,
            file: None,
        }
    }

    /// This location with its tree encrypted by `key` (docs/encryption.md): a save seals the
    /// tree's files with a fresh data key wrapped by `key`; a read opens them, and refuses a tree
    /// that is not encrypted ([`Error::NotEncrypted`]).
    ///
    /// # Errors
    /// [`Error::BadLocation`] for a tree of a repository (not supported yet) or another tool's
    /// file read as a tree (never encrypted).
    pub fn with_encryption(&self, key: crate::store::KeySource) -> Result<Location> {
        let bad = |reason: String| Error::BadLocation { location: self.display().to_string(), reason };
        if self.tree.is_some() {
            return Err(bad("trees of a repository cannot be encrypted yet: save an encrypted tree to a \
                            directory or a .tpk"
                .into()));
        }
        if self.read_from.is_some() {
            // Another tool's file: never encrypted (a key given expects what is not there).
            return Err(Error::NotEncrypted { location: self.display().to_string() });
        }
        Ok(Location { store: self.store.with_encryption(key), ..self.clone() })
    }

    /// [`with_encryption`](Self::with_encryption) with the data key and salt fixed: for golden
    /// files only (see [`store::Location::with_fixed_encryption`]).
    #[doc(hidden)]
    pub fn with_fixed_encryption(&self, key: crate::store::KeySource, data_key: [u8; 32], salt: [u8; 32]) -> Location {
        Location { store: self.store.with_fixed_encryption(key, data_key, salt), ..self.clone() }
    }

    /// The tree `name` of the repository at this location.
    ///
    /// # Errors
    /// [`Error::BadLocation`] for an invalid name or a single-file location.
    pub fn with_tree(&self, name: &str) -> Result<Location> {
        let bad = |r: String| Error::BadLocation { location: format!("{}@{name}", self.display()), reason: r };
        crate::format::repo::validate_name(name).map_err(bad)?;
        if self.layout() == Layout::SingleFile {
            return Err(bad("a repository is a folder or an object-store prefix, not a single file".into()));
        }
        let base = self.repository();
        let display = format!("{}@{name}", base.display());
        Ok(Location { store: base.store.relabeled(&display), tree: Some(name.into()), read_from: None, file: None })
    }

    /// For a local single file, open it now and read through that handle from then on (a
    /// no-op elsewhere; see [`store::Location::pin`]).
    ///
    /// # Errors
    /// [`Error::NotFound`] if the file does not exist; [`Error::Link`] if it is a symbolic link.
    pub fn pin(&self) -> Result<Location> {
        Ok(Location {
            store: self.store.pin()?,
            tree: self.tree.clone(),
            read_from: self.read_from,
            file: self.file.clone(),
        })
    }

    /// Run a read of this location to completion from synchronous code: a local tree's on the
    /// calling thread (its file reads run inline), anything else on the I/O runtime. Every
    /// blocking entry point of the library goes through here, so a local load never starts the
    /// runtime's threads.
    pub fn block_on<F: std::future::Future + Send>(&self, fut: F) -> F::Output
    where
        F::Output: Send,
    {
        if self.local_path().is_some() && tokio::runtime::Handle::try_current().is_err() {
            crate::runtime::block_on_here(fut)
        } else {
            crate::runtime::block_on(fut)
        }
    }
}

impl From<store::Location> for Location {
    /// A store location as the engine's, naming no tree. The engine's executor is installed
    /// here, so that the store's parallel work (multi-range local reads) finds the engine's
    /// pools whichever operation comes first.
    fn from(store: store::Location) -> Location {
        crate::runtime::install_exec();
        Location { store, tree: None, read_from: None, file: None }
    }
}

impl std::ops::Deref for Location {
    type Target = store::Location;

    /// The store location: reads, writes, listings and the rest of the store's operations.
    fn deref(&self) -> &store::Location {
        &self.store
    }
}

/// A repository's committed manifest at `tree` (`trees/<hash>.json`), checked against the hash
/// its file is named by.
pub(crate) async fn committed_manifest(repo: &Location, tree: &str) -> Result<(bytes::Bytes, String)> {
    use crate::format::hash::Hash32;
    let file = repo.file_name(tree);
    let b = repo
        .get_opt(tree, crate::format::manifest::MAX_MANIFEST_BYTES)
        .await?
        .ok_or_else(|| Error::missing_part(repo.display(), &file))?;
    let want = tree.strip_prefix("trees/").and_then(|t| t.strip_suffix(".json")).and_then(Hash32::from_hex);
    let got = Hash32::of(&b);
    if want != Some(got) {
        return Err(Error::ManifestChecksum {
            file,
            expected: want.map(|h| h.to_hex()).unwrap_or_default(),
            actual: got.to_hex(),
        });
    }
    // Named by the hash of its stored bytes; read, by every caller (loads, gc), as its JSON.
    let b = crate::format::manifest::unpack(b, &file)?;
    Ok((b, file))
}

/// The error for a location that holds no repository; `tree`, the `LOCATION@NAME` location it
/// was reached from, is said to have been read so (a path with an `@` that does not exist yet).
pub(crate) fn no_repository(repo: &Location, tree: Option<&Location>) -> Error {
    let mut detail = "no treepack repository here; create one with Repository::create (Python: \
                      treepack.Repository(location, create=True); CLI: treepack repo init)"
        .to_string();
    if let Some(t) = tree.filter(|t| t.local_path().is_some()) {
        detail.push_str(&format!(
            ". `{}` was read as tree `{}` of a repository at `{}`, since nothing of that name exists \
             (LOCATION@NAME, docs/repository.md); for a plain tree at a path with `@` in it, create \
             its folder first, or leave the `@` out of the name",
            t.display(),
            t.tree_name().unwrap_or_default(),
            repo.display()
        ));
    }
    Error::NotFound { location: repo.display().to_string(), detail }
}

/// The error for a name the repository at `repo` does not hold.
pub(crate) fn unknown_tree(repo: &Location, name: &str) -> Error {
    Error::NotFound {
        location: format!("{}@{name}", repo.display()),
        detail: format!("no tree named {name:?} in this repository (names() lists them)"),
    }
}

/// `LOCATION@NAME` names the tree `NAME` of the repository at `LOCATION` (docs/repository.md):
/// split there when the text after the last `@` is a valid tree name, it lies in the path (not
/// in a URL's `user@host`), and — for a local path — the whole text is not itself an existing
/// file or folder.
fn split_tree(s: &str) -> Option<(&str, &str)> {
    let (loc, name) = s.rsplit_once('@')?;
    if loc.is_empty() || crate::format::repo::validate_name(name).is_err() {
        return None;
    }
    if let Some((scheme, rest)) = loc.split_once("://") {
        // The `@` must come after the authority (the first `/` after `scheme://`).
        if !rest.contains('/') && scheme != "file" && scheme != "memory" {
            return None;
        }
    } else if Path::new(s).exists() {
        return None;
    }
    Some((loc, name))
}
