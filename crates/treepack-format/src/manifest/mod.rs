//! The manifest (`treepack.json`): the tree's structure, inline values, and where every chunk
//! lives. Written as compact JSON by hand (fast, deterministic) and parsed by a strict streaming
//! visitor that bounds depth, rejects duplicates, and reports the key path of any problem.
//!
//! The normative description is docs/format.md; this module is its reference implementation.
//!
//! **One writer.** `text.rs` writes every piece of JSON the format writes (strings, numbers,
//! keys, chunk references, node openings); the manifest writer (`write.rs`: `encode`, `seal`),
//! the fragment writer a caller's walk writes subtrees with (`fragment.rs`) and the root hash
//! ([`crate::merkle`], members sorted) are its callers, so they agree byte for byte by
//! construction.
//!
//! **One grammar, several reading strategies.** `members.rs` holds each rule of the grammar
//! once (top-level members, tagged node objects, leaves, arrays, dtypes, shapes, pairs). The
//! readers are strategies over it, each accepting and refusing exactly what the others do:
//! - one pass (`nodes.rs`, entry points in `parse.rs`): the serde visitors that drive a
//!   [`Build`]er (`build.rs`: owned trees, loaded nodes, the bindings' objects) as they read;
//! - split (`split.rs`): big containers near the root of a big manifest, their items parsed on
//!   the caller's threads, for owned trees;
//! - streamed (`split.rs`, `tape.rs`): a big root parsed on a lent helper thread onto tapes
//!   that the calling thread replays into builders that must stay on it (decision 60);
//! - outline (`outline/`): the structure alone (events and leaf tables), for callers that ask
//!   for it.
//!
//! Which of the first three runs is decided in one place, `strategy.rs`, by the manifest's
//! size, the builder and the threads the caller lent (`crate::exec`); the outline is never
//! chosen by size. Types and limits are in `types.rs`, the checks in `validate.rs`.

mod build;
mod fragment;
mod members;
mod nodes;
pub mod outline;
mod packed;
mod parse;
mod split;
mod strategy;
mod tape;
#[cfg(test)]
pub(crate) mod tests;
pub(crate) mod text;
mod types;
mod validate;
mod write;

pub use build::{replay, replay_values, replay_with, Build, KeyRef, LeafFn, OwnedTree, Parsed};
pub use fragment::{Fragment, FragmentWriter, Mark, PairText, Recycle};
pub use packed::{is_packed, pack, unpack, PACKED_MINOR, ZSTD_MAGIC};
pub use parse::{build, build_one_thread, build_streamed_any_size, decode, packs_of, parse_unchecked};
pub use tape::{HandOver, Replay, Tape, TapeBuilder};
pub use types::{
    ArrayEntry, ArrayStorage, ChunkRef, Entry, LeafInfo, Manifest, PackInfo, Stored, FORMAT_NAME, HASH_TRAILER_LEN,
    MAX_DEPTH, MAX_MANIFEST_BYTES, MAX_NDIM, MAX_PACKS, VERSION_MAJOR, VERSION_MINOR,
};
pub use validate::{check, first_duplicate_key, first_duplicate_name, validate, validate_pack_path};
pub use write::{encode, encode_parts, has_object_dicts, object_form, seal};
