//! # treepack
//!
//! Save and load *trees of data* — nested dicts, lists, tuples, records and custom nodes whose
//! leaves are n-d arrays, scalars, strings and bytes — fast, safely, partially, anywhere.
//!
//! ```no_run
//! use treepack::{Node, ArrayData, DType, SaveOptions, LoadOptions};
//! let w = ArrayData::new(DType::F32, vec![2, 2], vec![0u8; 16])?;
//! let tree = Node::dict([("params", Node::dict([("w", Node::from(w))])), ("step", Node::from(3i64))]);
//! treepack::save(&tree, "ckpt", &SaveOptions::default())?;
//! let back = treepack::load("ckpt", &LoadOptions::default())?;
//! assert!(back.exact_eq(&tree));
//! let part = treepack::open("ckpt")?.read_array("params/w", "0, :")?;
//! assert_eq!(part.shape(), &[2]);
//! # Ok::<(), treepack::Error>(())
//! ```
//!
//! The crate's layers (docs/architecture.md): [`format`](mod@format) — the tree model, dtypes, key paths,
//! chunk grids, hashes, the manifest and the single-file container, with no I/O (the
//! `treepack-format` crate, re-exported here with its [`error`] module); [`store`] — where trees
//! are kept: local disk, memory and object stores behind one backend trait (the
//! `treepack-store` crate); the engine — [`Location`] (what a location string names: a
//! repository's tree, a transport document), [`save`](mod@save), [`read`], [`gc`](mod@gc),
//! [`repo`], [`transport`], [`sign`](mod@sign) (signed trees); and [`serde_tree`] for Rust
//! values. The format is specified in `docs/format.md`.

#![warn(missing_docs)]

pub mod convert;
pub mod demo;
pub mod foreign;
pub use treepack_format as format;
pub use treepack_format::error;
pub mod gc;
mod location;
pub mod progress;
pub mod read;
pub mod repo;
mod runtime;
pub mod save;
pub mod serde_tree;
pub mod sign;
pub use treepack_store as store;
pub mod transport;

pub use error::{Error, Result};
pub use format::dtype::{DType, Field};
pub use format::hash::Hash32;
pub use format::manifest::{Entry, LeafInfo, Manifest};
pub use format::model::{ArrayData, Int, Key, Leaf, Node, Place, Tree};
pub use gc::GcReport;
pub use location::{ForeignTree, Location};
pub use progress::ProgressFn;
pub use read::{LoadOptions, Problem, Reader, VerifyReport};
pub use repo::{Repository, TreeRef};
pub use runtime::{block_on, in_background};
pub use save::{SaveInfo, SaveOptions};
pub use serde_tree::{from_tree, to_tree};
pub use sign::{sign, verify_signature, SignOptions, SignedBy};
pub use store::{IoStats, KeyProvider, KeySource, Layout, StorageOptions, Version};

/// Anything that names a location: a string (parsed with [`Location::parse`], so cloud settings
/// come from the environment) or a [`Location`] built with [`Location::parse_with`] and explicit
/// [`StorageOptions`].
pub trait IntoLocation {
    /// # Errors
    /// [`Error::BadLocation`] when a string cannot be parsed.
    fn into_location(self) -> Result<Location>;
}

impl IntoLocation for &str {
    fn into_location(self) -> Result<Location> {
        Location::parse(self)
    }
}
impl IntoLocation for &String {
    fn into_location(self) -> Result<Location> {
        Location::parse(self)
    }
}
impl IntoLocation for String {
    fn into_location(self) -> Result<Location> {
        Location::parse(&self)
    }
}
impl IntoLocation for Location {
    fn into_location(self) -> Result<Location> {
        Ok(self)
    }
}
impl IntoLocation for &Location {
    fn into_location(self) -> Result<Location> {
        Ok(self.clone())
    }
}
impl IntoLocation for store::Location {
    fn into_location(self) -> Result<Location> {
        Ok(self.into())
    }
}

/// Save a tree at a location (a directory, a `.tpk` file, `s3://…`, `gs://…`, `az://…`, `memory://…`).
///
/// # Errors
/// [`Error::AlreadyExists`] unless `opts.overwrite`; [`Error::InvalidTree`]; storage errors.
pub fn save(tree: &Node, location: impl IntoLocation, opts: &SaveOptions) -> Result<SaveInfo> {
    let loc = location.into_location()?;
    block_on(save_to(tree, &loc, opts))
}

/// Async [`save()`].
///
/// # Errors
/// As [`save()`].
pub async fn save_async(tree: &Node, location: impl IntoLocation, opts: &SaveOptions) -> Result<SaveInfo> {
    let loc = location.into_location()?;
    save_to(tree, &loc, opts).await
}

/// A save where the location says: a tree of a repository (`LOCATION@NAME`) through the
/// repository, which hands its dedup hook to the save pipeline; any other place straight to
/// the pipeline. Decided here, above both, so that `save` knows nothing of repositories.
async fn save_to(tree: &Node, loc: &Location, opts: &SaveOptions) -> Result<SaveInfo> {
    match loc.tree_name() {
        Some(name) => {
            let repo = match Repository::open_async(loc.repository()).await {
                // (said with how the location was read: a path with an `@` that does not exist)
                Err(Error::NotFound { .. }) => return Err(location::no_repository(&loc.repository(), Some(loc))),
                r => r?,
            };
            repo.save_async(tree, name, opts).await
        }
        None => save::save_async(tree, loc, opts).await,
    }
}

/// Write this process's part of a save many processes share (the processes of a JAX job): its
/// packs, and the manifest it would commit, returned encoded instead of committed. Arrays
/// sharded across processes are `treepack.shards` custom nodes holding the blocks this process
/// owns (see [`format::parts`]). One process then passes every part to [`commit_parts`].
///
/// # Errors
/// As [`save()`]; [`Error::BadLocation`] for a single-file location.
pub fn save_part(tree: &Node, location: impl IntoLocation, opts: &SaveOptions) -> Result<(Vec<u8>, SaveInfo)> {
    let loc = location.into_location()?;
    block_on(save::save_part_async(tree, &loc, opts))
}

/// Merge the parts written by [`save_part`] (the committer's own first) into one tree and
/// commit it atomically: create-only unless `opts.overwrite`, as [`save()`].
///
/// # Errors
/// [`Error::Parts`] when the parts do not make one tree (sharded blocks that overlap, leave
/// holes or lie off the chunk grid), [`Error::AlreadyExists`], storage errors.
pub fn commit_parts(location: impl IntoLocation, parts: &[Vec<u8>], opts: &SaveOptions) -> Result<SaveInfo> {
    let loc = location.into_location()?;
    block_on(save::commit_parts_async(&loc, parts, opts))
}

/// Load a whole tree (or the leaves selected by `opts.select`).
///
/// # Errors
/// [`Error::NotFound`], format and integrity errors, storage errors.
pub fn load(location: impl IntoLocation, opts: &LoadOptions) -> Result<Node> {
    read::one_pass::load_with(&location.into_location()?, opts, &NodePaths { opts })
}

/// The paths of [`load`]: an owned [`Node`] either way.
struct NodePaths<'a> {
    opts: &'a LoadOptions,
}

impl read::one_pass::LoadPaths for NodePaths<'_> {
    type Out = Node;
    type Err = Error;
    type Reader = Reader;
    fn one_pass(&self, loc: &Location, bytes: &[u8], file: &str) -> Option<Node> {
        let b = read::one_pass::NodeBuild { file };
        let node = read::one_pass::load_one_pass(loc, bytes, file, &b, self.opts.verify)?;
        // Shared ids are checked on the whole tree (the reader's parse reports the place).
        format::refs::check_refs(&node).is_ok().then_some(node)
    }
    fn open(&self, loc: &Location, read: Option<(Location, &[u8], String)>) -> Result<Reader> {
        match read {
            Some((pinned, bytes, file)) => Reader::from_bytes(pinned, bytes, file),
            None => Reader::open(loc.clone()),
        }
    }
    fn through_reader(&self, r: &Reader) -> Result<Node> {
        r.location().block_on(r.load_async(self.opts))
    }
    fn missing(&self, e: &Error) -> bool {
        matches!(e, Error::NotFound { .. })
    }
    fn replaced(&self, r: &Reader) -> bool {
        r.replaced()
    }
    fn error(&self, e: Error) -> Error {
        e
    }
}

/// Async [`load`].
///
/// # Errors
/// As [`load`].
pub async fn load_async(location: impl IntoLocation, opts: &LoadOptions) -> Result<Node> {
    let loc = location.into_location()?;
    let mut attempt = 1;
    loop {
        let r = Reader::open_async(loc.clone()).await?;
        match r.load_async(opts).await {
            // As [`read::one_pass::load_with`]: a pack gone missing, the tree replaced.
            Err(Error::NotFound { .. }) if attempt < read::one_pass::LOAD_ATTEMPTS && r.replaced_async().await => {
                attempt += 1
            }
            out => return out,
        }
    }
}

/// Read only the manifest: the tree with a [`LeafInfo`] at every leaf (big manifests through
/// the structure-only outline, see [`read::structure`]).
///
/// # Errors
/// As [`open`].
pub fn load_structure(location: impl IntoLocation) -> Result<Tree<LeafInfo>> {
    read::structure::load_structure(location.into_location()?)
}

/// The root hash of a stored tree (docs/format.md section 9): a Merkle hash over its structure
/// and its leaves' canonical bytes, computed from the manifest (no array data is read). The
/// same for the tree stored as a directory, a `.tpk`, in a repository, compressed or not.
///
/// # Errors
/// As [`open`].
pub fn root_hash(location: impl IntoLocation) -> Result<format::hash::Hash32> {
    Ok(open(location)?.root_hash())
}

/// What differs between the trees at `a` and `b`: key paths added, removed or changed, dtypes
/// and shapes, and for arrays the chunks that differ — compared by hash from the two manifests,
/// reading no array data. Empty when the trees are equal.
///
/// # Errors
/// As [`open`], for either location.
pub fn diff(a: impl IntoLocation, b: impl IntoLocation) -> Result<Vec<format::diff::Difference>> {
    let (ra, rb) = (open(a)?, open(b)?);
    if ra.root_hash() == rb.root_hash() {
        return Ok(vec![]);
    }
    Ok(format::diff::diff(&ra.manifest().root, &rb.manifest().root))
}

/// Open a lazy reader on a stored tree.
///
/// # Errors
/// [`Error::NotFound`], format errors, storage errors.
pub fn open(location: impl IntoLocation) -> Result<Reader> {
    Reader::open(location.into_location()?)
}

/// Async [`open`].
///
/// # Errors
/// As [`open`].
pub async fn open_async(location: impl IntoLocation) -> Result<Reader> {
    Reader::open_async(location.into_location()?).await
}

/// Remove leftovers of interrupted saves older than `grace` (see [`gc::gc_async`]).
///
/// # Errors
/// As [`gc::gc_async`].
pub fn gc(location: impl IntoLocation, grace: std::time::Duration) -> Result<GcReport> {
    let loc = location.into_location()?;
    block_on(gc::gc_async(&loc, grace))
}

/// The README's examples, compiled and run as doctests.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
