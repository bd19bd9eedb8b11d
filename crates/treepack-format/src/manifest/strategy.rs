//! Which reading strategy runs: the one policy over the strategies of the manifest grammar
//! (`members.rs`). Every threshold a reader consults lives here, so the choice can be read,
//! and changed, in one place.
//!
//! | strategy | code | runs when |
//! | --- | --- | --- |
//! | one pass | `nodes.rs` | every parse, and the whole of a small one |
//! | split | `split.rs` | [`split_owned`]: an owned tree ([`decode`](super::decode)) of a big manifest; its big containers near the root ([`split_below`], [`split_items`]) have their items parsed on the caller's threads |
//! | streamed | `split.rs`, `tape.rs` | [`stream`]: [`build`](super::build) into objects that must stay on the calling thread ([`Build::HELPER`]), for a manifest big enough, with a helper thread lent: the helper parses onto tapes the calling thread replays |
//! | outline | `outline/` | never chosen by size: a caller that wants the structure alone (leaf tables, no values) asks for it |
//!
//! The strategies accept, refuse and build exactly the same (tests compare each with the one
//! pass, and fuzz targets the streamed parse); the policy changes only where the work runs.

use super::build::Build;

/// Manifests at least this large parse the items of big containers near the root on several
/// threads: below it, handing items to other threads costs more than it saves.
pub(super) const SPLIT_MIN_BYTES: usize = 1 << 20;
/// Manifests at least this large are parsed on the parse helper when built into objects that
/// must stay on the calling thread ([`Build::HELPER`]). Lower than [`SPLIT_MIN_BYTES`]: the
/// helper is a thread kept for the purpose (nothing to start), so manifests of ten thousand
/// leaves already gain.
pub(super) const HELP_MIN_BYTES: usize = 128 << 10;
/// Containers this deep or deeper are always parsed on one thread: the big containers of a big
/// manifest are near its root.
const SPLIT_DEPTH: usize = 3;
/// Containers with fewer items than this are parsed on one thread.
const SPLIT_MIN_ITEMS: usize = 256;
/// Ops in each tape a streamed parse hands over (about 1k-2k nodes: small enough to start the
/// builder at once, large enough that handing over costs little).
pub(super) const STREAM_OPS: usize = 4096;

/// Whether an owned parse of a manifest of `len` bytes may split big containers.
pub(super) fn split_owned(len: usize) -> bool {
    len >= SPLIT_MIN_BYTES
}

/// Whether the children of a container at `depth` may still be split.
pub(super) fn split_below(depth: usize) -> bool {
    depth + 1 < SPLIT_DEPTH
}

/// Whether a container of `items` items has them parsed on several threads (then its items'
/// own containers are not split again).
pub(super) fn split_items(items: usize) -> bool {
    items >= SPLIT_MIN_ITEMS
}

/// Whether [`build`](super::build) streams a manifest of `len` bytes from the helper thread.
pub(super) fn stream<B: Build>(len: usize) -> bool {
    B::HELPER && len >= HELP_MIN_BYTES && crate::exec::threads() >= 2
}
