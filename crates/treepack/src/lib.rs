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
//! Module map (one concern each): [`model`] (the tree), [`dtype`], [`keypath`], [`grid`]
//! (chunking and slicing), [`hash`], [`codec`], [`manifest`] (the format), [`container`]
//! (single-file layout), [`store`] (locations), [`save`], [`read`], [`serde_tree`].
//! The format is specified in `docs/format.md`.

pub mod codec;
pub mod container;
pub mod demo;
pub mod dtype;
pub mod error;
pub mod grid;
pub mod hash;
pub mod keypath;
pub mod manifest;
pub mod model;
pub mod preview;
pub mod read;
pub mod runtime;
pub mod save;
pub mod serde_tree;
pub mod store;

pub use dtype::{DType, Field};
pub use error::{Error, Result};
pub use manifest::{Entry, LeafInfo, Manifest};
pub use model::{ArrayData, Int, Key, Leaf, Node, Tree};
pub use read::{LoadOptions, Problem, Reader, VerifyReport};
pub use runtime::block_on;
pub use save::{GcReport, SaveInfo, SaveOptions};
pub use serde_tree::{from_tree, to_tree};
pub use store::{IoStats, Layout, Location};

/// Save a tree at a location (a directory, a `.tpk` file, or `memory://…`).
///
/// # Errors
/// [`Error::AlreadyExists`] unless `opts.overwrite`; [`Error::InvalidTree`]; storage errors.
pub fn save(tree: &Node, location: &str, opts: &SaveOptions) -> Result<SaveInfo> {
    let loc = Location::parse(location)?;
    block_on(save::save_async(tree, &loc, opts))
}

/// Async [`save`].
///
/// # Errors
/// As [`save`].
pub async fn save_async(tree: &Node, location: &str, opts: &SaveOptions) -> Result<SaveInfo> {
    let loc = Location::parse(location)?;
    save::save_async(tree, &loc, opts).await
}

/// Load a whole tree (or the leaves selected by `opts.select`).
///
/// # Errors
/// [`Error::NotFound`], format and integrity errors, storage errors.
pub fn load(location: &str, opts: &LoadOptions) -> Result<Node> {
    let loc = Location::parse(location)?;
    block_on(async { Reader::open_async(loc).await?.load_async(opts).await })
}

/// Async [`load`].
///
/// # Errors
/// As [`load`].
pub async fn load_async(location: &str, opts: &LoadOptions) -> Result<Node> {
    let loc = Location::parse(location)?;
    Reader::open_async(loc).await?.load_async(opts).await
}

/// Read only the manifest: the tree with a [`LeafInfo`] at every leaf.
///
/// # Errors
/// As [`open`].
pub fn load_structure(location: &str) -> Result<Tree<LeafInfo>> {
    Ok(open(location)?.structure())
}

/// Open a lazy reader on a stored tree.
///
/// # Errors
/// [`Error::NotFound`], format errors, storage errors.
pub fn open(location: &str) -> Result<Reader> {
    Reader::open(Location::parse(location)?)
}

/// Async [`open`].
///
/// # Errors
/// As [`open`].
pub async fn open_async(location: &str) -> Result<Reader> {
    Reader::open_async(Location::parse(location)?).await
}

/// Remove leftovers of interrupted saves older than `grace` (see [`save::gc_async`]).
///
/// # Errors
/// As [`save::gc_async`].
pub fn gc(location: &str, grace: std::time::Duration) -> Result<GcReport> {
    let loc = Location::parse(location)?;
    block_on(save::gc_async(&loc, grace))
}

/// The README's examples, compiled and run as doctests.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
