//! Big containers parsed by more than one thread: split across the pool, or helped by one thread.

use super::build::{Build, OwnedTree, Parsed};
use super::nodes::NodeSeed;
use super::parse::{parse_generic, Ctx, PathSeg};
use super::strategy::{self, STREAM_OPS};
use super::tape::{HandOver, Replay, Tape, TapeBuilder};
use super::types::HASH_TRAILER_LEN;
use super::validate::check_body;
use crate::error::{Error, Result};
use crate::hash::Hash32;
use crate::refs::RefCheck;
use serde::de::{self, DeserializeSeed, SeqAccess};
use std::cell::RefCell;

/// How one item of a split container is parsed from its own text (as an owned tree, on any
/// thread of the pool).
pub(super) type ItemParser<'f, T> = dyn for<'r> Fn(
        NodeSeed<'_, OwnedTree>,
        &mut serde_json::Deserializer<serde_json::de::StrRead<'r>>,
    ) -> serde_json::Result<T>
    + Sync
    + 'f;

/// Parse the items of a container: first only their extent (a fast scan that keeps borrowed
/// slices of the input), then each item on its own, in parallel when there are many. Big
/// manifests are mostly one or two huge containers near the root, so this spreads most of the
/// parse over all cores; the result is identical to the one-thread parse. An item that fails
/// reports its key path below the container (`indexed`: list items, whose index is their
/// segment; pairs name their key themselves) and the message without the item-relative line and
/// column.
pub(super) fn parse_items_split<'de, A, T, B>(
    node: NodeSeed<'_, B>,
    mut seq: A,
    parse: &ItemParser<'_, T>,
    indexed: bool,
) -> std::result::Result<Vec<T>, A::Error>
where
    A: SeqAccess<'de>,
    T: Send,
{
    let mut raws: Vec<&'de serde_json::value::RawValue> = Vec::new();
    while let Some(r) = seq.next_element::<&'de serde_json::value::RawValue>()? {
        raws.push(r);
    }
    parse_raws(node, &raws, parse, |i| indexed.then_some(PathSeg::Index(i)))
}

/// The second half of [`parse_items_split`] (and of a big dict written as an object): each of
/// `raws` parsed on its own, in parallel when there are many. An item that fails reports its
/// path below the container, `segment(i)` first when it has one.
pub(super) fn parse_raws<T: Send, B, E: de::Error>(
    node: NodeSeed<'_, B>,
    raws: &[&serde_json::value::RawValue],
    parse: &ItemParser<'_, T>,
    segment: impl Fn(usize) -> Option<PathSeg>,
) -> std::result::Result<Vec<T>, E> {
    use rayon::prelude::*;
    // Items parsed apart build owned trees and are not checked inline (see `parse_generic`).
    debug_assert!(node.ctx.packs.is_none());
    let (depth, split, file) = (node.depth, node.split, node.ctx.file);
    let one = |i: usize, raw: &serde_json::value::RawValue| -> std::result::Result<T, (usize, Vec<PathSeg>, String)> {
        let path = RefCell::new(Vec::new());
        let ctx = Ctx { path: Some(&path), packs: None, file, shared_value: Default::default(), refs: None };
        let mut de = serde_json::Deserializer::from_str(raw.get());
        de.disable_recursion_limit();
        let inner = NodeSeed { depth, ctx: &ctx, split: split && !strategy::split_items(raws.len()), b: &OwnedTree };
        parse(inner, &mut de).and_then(|v| de.end().map(|_| v)).map_err(|e| (i, path.into_inner(), item_message(&e)))
    };
    let parsed: std::result::Result<Vec<T>, _> = strategy::split_items(raws.len())
        .then(|| crate::exec::parallel(|| raws.par_iter().enumerate().map(|(i, r)| one(i, r)).collect()))
        .flatten()
        .unwrap_or_else(|| raws.iter().enumerate().map(|(i, r)| one(i, r)).collect());
    parsed.map_err(|(i, inner, msg)| {
        node.ctx.path(|p| {
            p.extend(segment(i));
            p.extend(inner);
        });
        E::custom(msg)
    })
}

/// The message of an error in an item parsed on its own, without the item-relative line and
/// column (which would mislead: they count from the item's start).
pub(super) fn item_message(e: &serde_json::Error) -> String {
    let msg = e.to_string();
    match msg.rsplit_once(" at line ") {
        Some((m, _)) => m.to_string(),
        None => msg,
    }
}

/// What the helper of a streamed parse sends: a stretch of tape, or the end of the parse (an
/// error's key path and message).
enum Streamed {
    Tape(Tape),
    End(std::result::Result<(), String>),
}

/// A manifest's members other than its root (version, writer, metadata, packs, checked as
/// the one-pass parse checks them), and the root's text, found from the writer's layout:
/// `"root"` after a line break, the last member before the trailing hash. The members are
/// parsed with `null` standing in for the root; see [`build_streamed`] for why this finds the
/// top-level root whenever the manifest parses at all. `None` when the manifest is not in that
/// layout.
pub(super) fn split_root<'t>(text: &'t str, file: &str) -> Option<(Parsed<()>, &'t str)> {
    let body_end = text.len().checked_sub(HASH_TRAILER_LEN)?;
    const ROOT: &str = "\n\"root\":";
    let at = text.get(..body_end)?.find(ROOT)? + ROOT.len();
    let members = [&text[..at], "null", &text[body_end..]].concat();
    let head = parse_generic(members.as_bytes(), file, &TapeBuilder::<false>::new(), false, true, 0).ok()?;
    Some((head, &text[at..body_end]))
}

/// The helper's side of [`build_streamed`]: one node's text parsed onto tapes, each handed to
/// `hand_over` as it fills; returns the last (`PATHS`: with `enter`/`exit` recorded).
fn parse_onto_tapes<const PATHS: bool>(
    text: &str,
    ctx: &Ctx<'_>,
    hand_over: &HandOver<'_>,
) -> serde_json::Result<Tape> {
    let tape = TapeBuilder::<PATHS>::streaming(STREAM_OPS, hand_over);
    let mut de = serde_json::Deserializer::from_str(text);
    de.disable_recursion_limit();
    NodeSeed { depth: 0, ctx, split: false, b: &tape }.deserialize(&mut de).and_then(|()| de.end())?;
    Ok(tape.into_tape())
}

/// [`build`] of a big manifest for a builder that must stay on this thread ([`Build::HELPER`]:
/// Python objects), on two cores: the helper thread parses the root's node onto tapes and hands
/// each over as it fills; this thread makes the builder's nodes from them as they come. The
/// builder's work stays on this thread, the parse moves off it, and nothing is scanned twice.
///
/// The root's text is found from the writer's layout (docs/format.md: `"root"` after a line
/// break, the last member before the trailing hash): the other members are parsed here, with
/// `null` standing in for the root, while the helper parses the root's text. Equivalent to the
/// one-thread parse: a raw line break is never inside a string, so when the members parse with
/// `null` in its place, that `"root":` is a member of the top-level object, and the rest up to
/// the hash is the root's node exactly when it parses as one node. `None` when the manifest is
/// not in that layout (the one-thread parse then reads it) or no helper is free.
///
/// `bytes` passed [`check_frame`], which read the `stored` hash: this thread checks the body
/// against it while the helper parses, before it builds anything (a damaged manifest reaches
/// the builder no sooner than through the one-thread parse, which checks first).
pub(super) fn build_streamed<B: Build>(
    bytes: &[u8],
    file: &str,
    b: &B,
    stored: &Hash32,
) -> Option<Result<Parsed<B::Node>>> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let text = std::str::from_utf8(bytes).ok()?;
    let (head, root_text) = split_root(text, file)?;
    let stop = AtomicBool::new(false);
    let (tx, rx) = std::sync::mpsc::channel::<Streamed>();
    // Tapes go back to be cleared and refilled by the thread that allocated their contents (a
    // free from another thread is several times slower, and this thread is the busy one).
    let (back_tx, back_rx) = std::sync::mpsc::channel::<Tape>();
    let packs = head.packs.clone();
    let stop = &stop;
    let helper = move || {
        let packs = RefCell::new(Some(packs));
        let refs = RefCell::new(RefCheck::default());
        // No key path: an error here is reported by the one-thread parse below, which keeps one.
        let ctx = Ctx { path: None, packs: Some(&packs), file, shared_value: Default::default(), refs: Some(&refs) };
        let hand_over = |full: Tape| -> std::result::Result<Tape, String> {
            if stop.load(Ordering::Relaxed) {
                return Err("the builder stopped".into());
            }
            let next = back_rx.try_recv().map(Tape::cleared).unwrap_or_else(|_| Tape::sized_like(&full));
            let _ = tx.send(Streamed::Tape(full));
            Ok(next)
        };
        let parsed = if B::PATHS {
            parse_onto_tapes::<true>(root_text, &ctx, &hand_over)
        } else {
            parse_onto_tapes::<false>(root_text, &ctx, &hand_over)
        };
        let end = match parsed {
            Ok(last) => {
                let _ = tx.send(Streamed::Tape(last));
                Ok(())
            }
            Err(e) => Err(item_message(&e)),
        };
        let _ = tx.send(Streamed::End(end));
        drop(tx);
        for t in back_rx.iter() {
            drop(t);
        }
    };
    let head_packs = &head.packs;
    let main = move || -> Result<B::Node> {
        let fail = |key: String, msg: String| {
            stop.store(true, Ordering::Relaxed);
            Err(Error::manifest(file, key, msg))
        };
        if let Err(e) = check_body(bytes, stored, true, file) {
            stop.store(true, Ordering::Relaxed);
            return Err(e);
        }
        b.packs(head_packs);
        let mut replay = Replay::default();
        for m in rx.iter() {
            match m {
                Streamed::Tape(t) => {
                    let r = replay.feed(b, &t);
                    let _ = back_tx.send(t);
                    if let Err(msg) = r {
                        return fail("<root>".into(), msg);
                    }
                }
                Streamed::End(Ok(())) => break,
                Streamed::End(Err(msg)) => {
                    // The root's text was parsed alone, so an error at its end (a member after
                    // it) reads "trailing characters": the one-thread parse (of text only, no
                    // builder; its tapes dropped as they fill) says what the manifest's error
                    // is, as in any other load.
                    let discard = |t: Tape| Ok(t.cleared());
                    let text_only = TapeBuilder::<false>::streaming(STREAM_OPS, &discard);
                    if let Err(e) = parse_generic(bytes, file, &text_only, false, true, 0) {
                        stop.store(true, Ordering::Relaxed);
                        return Err(e);
                    }
                    // Not reached while both parses check the same (the fuzz target compares
                    // them); the helper keeps no key path.
                    return fail("<root>".into(), msg);
                }
            }
        }
        let mut nodes = replay.finish();
        match (nodes.pop(), nodes.is_empty()) {
            (Some(root), true) => Ok(root),
            _ => fail("<root>".into(), "the streamed root is not one node".into()),
        }
    };
    let root = crate::exec::with_helper(helper, main)?;
    Some(root.map(|root| Parsed {
        version: head.version,
        writer: head.writer,
        metadata: head.metadata,
        packs: head.packs,
        root,
    }))
}
