//! The manifest (`treepack.json`): the tree's structure, inline values, and where every chunk
//! lives. Written as compact JSON by hand (fast, deterministic) and parsed by a strict streaming
//! visitor that bounds depth, rejects duplicates, and reports the key path of any problem.
//!
//! The normative description is docs/format.md; this module is its reference implementation:
//! [`types`](self) and limits (`types.rs`), the writer (`write.rs`), the checks (`validate.rs`),
//! and two readers of one grammar — the one-pass parser that drives a [`Build`]er (`parse.rs`,
//! `nodes.rs`, `split.rs` for big containers on more threads with `tape.rs`, `build.rs`) and the structure-only
//! [`outline`] — sharing the member readers in `members.rs`.

mod build;
mod fragment;
mod members;
mod nodes;
pub mod outline;
mod parse;
mod split;
mod tape;
#[cfg(test)]
pub(crate) mod tests;
pub(crate) mod text;
mod types;
mod validate;
mod write;

pub use build::{replay, replay_values, replay_with, Build, KeyRef, LeafFn, OwnedTree, Parsed};
pub use fragment::{Fragment, FragmentWriter, Mark, PairText, Recycle};
pub use parse::{build, build_one_thread, build_streamed_any_size, decode, packs_of, parse_unchecked};
pub use tape::{HandOver, Replay, Tape, TapeBuilder};
pub use types::{
    ArrayEntry, ArrayStorage, ChunkRef, Entry, LeafInfo, Manifest, PackInfo, Stored, FORMAT_NAME, HASH_TRAILER_LEN,
    MAX_DEPTH, MAX_MANIFEST_BYTES, MAX_NDIM, MAX_PACKS, VERSION_MAJOR, VERSION_MINOR,
};
pub use validate::{check, first_duplicate_key, first_duplicate_name, validate, validate_pack_path};
pub use write::{encode, encode_parts, has_object_dicts, object_form, seal};
