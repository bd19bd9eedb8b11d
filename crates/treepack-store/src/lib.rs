//! # treepack-store
//!
//! Where treepack trees are kept: a [`Backend`] trait and one module per backend — [`local`]
//! disk (containment, durable writes, save markers, `O_DIRECT` reads, memory maps, a pinned
//! single file), [`memory`] (process-wide `memory://` buckets) and [`object`] stores (S3, GCS,
//! Azure, read-only HTTP, through the `object_store` crate) — behind one thin [`Location`]: a
//! backend rooted at a folder, file or prefix, its [`Layout`], a display string, [`IoStats`] and
//! whether it may be written.
//!
//! The store moves bytes and knows nothing above that: what a manifest holds, how trees are
//! named, and files that stand for a tree are the `treepack` engine's, resolved one layer up
//! into a plain location (docs/architecture.md, docs/design.md decision 75; `tests/layering.rs`
//! keeps it so).
//!
//! Every read and write is counted in [`IoStats`], which tests use to prove partial loads touch
//! only the bytes they need.

#![warn(missing_docs)]

mod backend;
mod buffers;
mod crypt;
pub mod local;
mod location;
pub mod memory;
pub mod object;

pub use backend::{Backend, BoxFuture, Keep, Listed, Progress, RangeRead, Swap, Version, Write, WriteStream};
pub use local::durable::journal;
pub use local::{direct_bytes_on_this_thread, ReadMode, SaveMarker, DIRECT_MIN_BYTES};
pub use location::{IoStats, Location};
pub use object::{RemoteTuning, TUNING_KEYS};

use std::collections::BTreeMap;

pub use treepack_format::crypt::{KeyProvider, KeySource};
pub use treepack_format::error::{Error, Result};

/// File name of the manifest in a directory location.
pub const MANIFEST_NAME: &str = "treepack.json";
/// Folder of pack files in a directory location.
pub const PACKS_DIR: &str = "packs";
/// Extension that selects the single-file layout.
pub const SINGLE_FILE_EXT: &str = "tpk";

/// How a tree is laid out at its location.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// A folder (or prefix) with `treepack.json` and `packs/*.tpp`.
    Directory,
    /// One `.tpk` file: header, chunks, manifest, footer.
    SingleFile,
}

impl Layout {
    /// Whether a manifest in this layout may name this pack: a single file's only pack is
    /// itself (`.`), and a directory's packs are files inside it.
    pub fn allows_pack(self, pack_path: &str) -> bool {
        (pack_path == ".") == (self == Layout::SingleFile)
    }

    /// The layout a location string asks for: a single file when the thing is a file (`is_file`)
    /// or its name ends in `.tpk`, a directory otherwise.
    pub(crate) fn of(path: &str, is_file: bool) -> Layout {
        if is_file || path.trim_end_matches('/').ends_with(&format!(".{SINGLE_FILE_EXT}")) {
            Layout::SingleFile
        } else {
            Layout::Directory
        }
    }
}

/// Settings for a remote location, as `key -> value` strings: the keys of object_store's
/// builders (`aws_access_key_id`, `region`, `endpoint`, `google_service_account_key`,
/// `azure_storage_account_name`, `allow_http`, …) plus treepack's own [`TUNING_KEYS`].
/// Values given here override the environment.
pub type StorageOptions = BTreeMap<String, String>;
