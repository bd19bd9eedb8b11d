//! Big containers parsed by more than one thread: split across the pool, or helped by one thread.

use super::*;

/// Parse the items of a container: first only their extent (a fast scan that keeps borrowed
/// slices of the input), then each item on its own, in parallel when there are many. Big
/// manifests are mostly one or two huge containers near the root, so this spreads most of the
/// parse over all cores; the result is identical to the one-thread parse. An item that fails
/// reports its key path below the container (`indexed`: list items, whose index is their
/// segment; pairs name their key themselves) and the message without the item-relative line and
/// column.
pub(super) fn parse_items_split<'de, A, T, F, B>(
    node: NodeSeed<'_, B>,
    mut seq: A,
    parse: F,
    indexed: bool,
) -> std::result::Result<Vec<T>, A::Error>
where
    A: SeqAccess<'de>,
    T: Send,
    F: for<'r> Fn(
            NodeSeed<'_, OwnedTree>,
            &mut serde_json::Deserializer<serde_json::de::StrRead<'r>>,
        ) -> serde_json::Result<T>
        + Sync,
{
    use rayon::prelude::*;
    // Items parsed apart build owned trees and are not checked inline (see `parse_generic`).
    debug_assert!(node.ctx.packs.is_none());
    let (depth, split, file) = (node.depth, node.split, node.ctx.file);
    let mut raws: Vec<&'de serde_json::value::RawValue> = Vec::new();
    while let Some(r) = seq.next_element::<&'de serde_json::value::RawValue>()? {
        raws.push(r);
    }
    let one = |i: usize, raw: &serde_json::value::RawValue| -> std::result::Result<T, (usize, Vec<PathSeg>, String)> {
        let path = RefCell::new(Vec::new());
        let ctx = Ctx { path: &path, packs: None, file, shared_value: Default::default(), refs: None };
        let mut de = serde_json::Deserializer::from_str(raw.get());
        de.disable_recursion_limit();
        let inner = NodeSeed { depth, ctx: &ctx, split: split && raws.len() < SPLIT_MIN_ITEMS, b: &OwnedTree };
        parse(inner, &mut de).and_then(|v| de.end().map(|_| v)).map_err(|e| (i, path.into_inner(), item_message(&e)))
    };
    let parsed: std::result::Result<Vec<T>, _> = if raws.len() >= SPLIT_MIN_ITEMS {
        crate::runtime::parallel(|| raws.par_iter().enumerate().map(|(i, r)| one(i, r)).collect())
    } else {
        raws.iter().enumerate().map(|(i, r)| one(i, r)).collect()
    };
    parsed.map_err(|(i, inner, msg)| {
        let mut p = node.ctx.path.borrow_mut();
        if indexed {
            p.push(PathSeg::Index(i));
        }
        p.extend(inner);
        de::Error::custom(msg)
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

/// Items claimed at a time by either thread of a helped parse.
pub(super) const HELP_BLOCK: usize = 32;

/// A block of items the helper thread parsed: its first index, and the owned items or the
/// failing item's index, key path below the container and message.
pub(super) type HelpedBlock<T> = (usize, std::result::Result<Vec<T>, (usize, Vec<PathSeg>, String)>);

/// Parse the items of a container for a builder that must stay on this thread
/// ([`Build::HELPER`]: Python objects), on two cores. Once a container shows at least
/// `SPLIT_MIN_ITEMS` items, a helper thread starts; this thread goes on scanning the items'
/// extent, queueing them in blocks as it goes, and the helper parses queued blocks into owned
/// trees from the first one on. After the scan this thread takes blocks too, builds them
/// directly, and [`replay`]s the helper's blocks as they arrive (sending them back to be freed
/// where they were allocated). The builder's work (the Python objects) stays on one thread, most
/// of the parsing moves off it, and the split adapts to how slow the builder is. Every item is
/// checked exactly as in the one-thread parse (leaves inline, against the packs). Containers
/// with fewer items are parsed here item by item, with splitting allowed further down.
///
/// `direct` parses item `i` with the builder, `owned` parses an item into an owned tree,
/// `replay_one` builds item `i` from that tree; `indexed`: list items, whose index is their key
/// path segment (pairs name their key themselves).
pub(super) fn parse_items_helped<'de, A, B, T, U, FD, FO, FR>(
    node: NodeSeed<'_, B>,
    mut seq: A,
    direct: FD,
    owned: FO,
    replay_one: FR,
    indexed: bool,
) -> std::result::Result<Vec<U>, A::Error>
where
    A: SeqAccess<'de>,
    B: Build,
    T: Send,
    FD: for<'r> Fn(
        usize,
        NodeSeed<'_, B>,
        &mut serde_json::Deserializer<serde_json::de::StrRead<'r>>,
    ) -> serde_json::Result<U>,
    FO: for<'r> Fn(
            NodeSeed<'_, OwnedTree>,
            &mut serde_json::Deserializer<serde_json::de::StrRead<'r>>,
        ) -> serde_json::Result<T>
        + Sync,
    FR: Fn(usize, &T) -> std::result::Result<U, String>,
{
    use serde_json::value::RawValue;
    use std::sync::{Condvar, Mutex, MutexGuard};
    let parse_here = |i: usize, raw: &RawValue, split: bool| -> std::result::Result<U, A::Error> {
        let mut de = serde_json::Deserializer::from_str(raw.get());
        de.disable_recursion_limit();
        let here = NodeSeed { depth: node.depth, ctx: node.ctx, split, b: node.b };
        direct(i, here, &mut de).and_then(|v| de.end().map(|_| v)).map_err(|e| de::Error::custom(item_message(&e)))
    };
    let mut first: Vec<&'de RawValue> = Vec::new();
    while first.len() < SPLIT_MIN_ITEMS {
        match seq.next_element::<&'de RawValue>()? {
            Some(r) => first.push(r),
            None => break,
        }
    }
    if first.len() < SPLIT_MIN_ITEMS {
        // A small container: only an item holding most of its bytes (a wrapper's payload) may
        // be split further down; scanning every mid-size item again would cost a second
        // tokenization of most of the manifest for nothing.
        let total: usize = first.iter().map(|r| r.get().len()).sum();
        return first
            .iter()
            .enumerate()
            .map(|(i, r)| parse_here(i, r, node.split && r.get().len() * 2 > total))
            .collect();
    }
    // The items of a big container are not split again (one helper per parse).
    let lease = if crate::runtime::threads() < 2 { None } else { crate::runtime::parse_helper() };
    let Some(lease) = lease else {
        let mut out = Vec::with_capacity(first.len());
        for (i, r) in first.iter().enumerate() {
            out.push(parse_here(i, r, false)?);
        }
        while let Some(r) = seq.next_element::<&'de RawValue>()? {
            out.push(parse_here(out.len(), r, false)?);
        }
        return Ok(out);
    };

    /// Blocks of scanned items waiting for a thread, by first index.
    struct Queue<'de> {
        jobs: std::collections::VecDeque<(usize, Vec<&'de RawValue>)>,
        /// The scan is over: no more jobs will come.
        scanned: bool,
        /// This thread failed: the helper stops at its next job.
        stop: bool,
        /// The helper waits for a job (only then is a push worth a wake-up call).
        waiting: bool,
    }
    let queue = Mutex::new(Queue { jobs: Default::default(), scanned: false, stop: false, waiting: false });
    let ready = Condvar::new();
    // A panicking helper is re-raised when the scope joins it; the queue stays usable until then.
    let lock = || -> MutexGuard<'_, Queue<'de>> { queue.lock().unwrap_or_else(|p| p.into_inner()) };
    let push = |start: usize, block: Vec<&'de RawValue>| {
        let mut q = lock();
        q.jobs.push_back((start, block));
        let wake = q.waiting;
        drop(q);
        if wake {
            ready.notify_one();
        }
    };
    let finish = |stop: bool| {
        let mut q = lock();
        q.scanned = true;
        q.stop |= stop;
        drop(q);
        ready.notify_all();
    };
    let (depth, file) = (node.depth, node.ctx.file);
    // The helper checks leaves against its own copy of the packs.
    let packs: Option<Option<Vec<PackInfo>>> = node.ctx.packs.map(|p| p.borrow().clone());
    /// Ends the queue when dropped: whichever way this thread leaves the scope (an error, even
    /// a panic), the helper stops waiting for jobs, so the scope can join it.
    struct EndQueue<F: Fn(bool)>(F);
    impl<F: Fn(bool)> Drop for EndQueue<F> {
        fn drop(&mut self) {
            (self.0)(true);
        }
    }
    {
        let (tx, rx) = std::sync::mpsc::channel::<HelpedBlock<T>>();
        // Replayed blocks go back to be freed by the thread that allocated them (a free from
        // another thread is several times slower, and this thread is the busy one).
        let (back_tx, back_rx) = std::sync::mpsc::channel::<Vec<T>>();
        let (owned, queue, ready) = (&owned, &queue, &ready);
        let helper = move || {
            let packs = packs.map(RefCell::new);
            loop {
                while let Ok(done) = back_rx.try_recv() {
                    drop(done);
                }
                let job = {
                    let mut q = queue.lock().unwrap_or_else(|p| p.into_inner());
                    loop {
                        if q.stop {
                            break None;
                        }
                        if let Some(j) = q.jobs.pop_front() {
                            break Some(j);
                        }
                        if q.scanned {
                            break None;
                        }
                        q.waiting = true;
                        q = ready.wait(q).unwrap_or_else(|p| p.into_inner());
                        q.waiting = false;
                    }
                };
                let Some((start, raws)) = job else {
                    drop(tx);
                    for done in back_rx.iter() {
                        drop(done);
                    }
                    return;
                };
                let mut block = Vec::with_capacity(raws.len());
                for (i, raw) in (start..).zip(raws) {
                    let path = RefCell::new(Vec::new());
                    let ctx =
                        Ctx { path: &path, packs: packs.as_ref(), file, shared_value: Default::default(), refs: None };
                    let mut de = serde_json::Deserializer::from_str(raw.get());
                    de.disable_recursion_limit();
                    let seed = NodeSeed { depth, ctx: &ctx, split: false, b: &OwnedTree };
                    match owned(seed, &mut de).and_then(|v| de.end().map(|_| v)) {
                        Ok(t) => block.push(t),
                        Err(e) => {
                            let _ = tx.send((start, Err((i, path.into_inner(), item_message(&e)))));
                            return;
                        }
                    }
                }
                if tx.send((start, Ok(block))).is_err() {
                    return;
                }
            }
        };
        lease.run(helper, || {
            let _end = EndQueue(&finish);
            // Queue what is scanned so far, then the rest as it is scanned.
            let mut n = 0;
            for block in first.chunks(HELP_BLOCK) {
                push(n, block.to_vec());
                n += block.len();
            }
            let mut scan = || -> std::result::Result<(), A::Error> {
                let mut block = Vec::with_capacity(HELP_BLOCK);
                while let Some(r) = seq.next_element::<&'de RawValue>()? {
                    block.push(r);
                    if block.len() == HELP_BLOCK {
                        push(n, std::mem::replace(&mut block, Vec::with_capacity(HELP_BLOCK)));
                        n += HELP_BLOCK;
                    }
                }
                if !block.is_empty() {
                    n += block.len();
                    push(n - block.len(), block);
                }
                Ok(())
            };
            let scanned = scan();
            finish(scanned.is_err());
            scanned?;
            let mut out: Vec<Option<U>> = Vec::with_capacity(n);
            out.resize_with(n, || None);
            let take =
                |(start, block): HelpedBlock<T>, out: &mut Vec<Option<U>>| -> std::result::Result<(), A::Error> {
                    match block {
                        Ok(items) => {
                            for (j, t) in items.iter().enumerate() {
                                out[start + j] = Some(replay_one(start + j, t).map_err(de::Error::custom)?);
                            }
                            let _ = back_tx.send(items);
                            Ok(())
                        }
                        Err((i, inner, msg)) => {
                            let mut p = node.ctx.path.borrow_mut();
                            if indexed {
                                p.push(PathSeg::Index(i));
                            }
                            p.extend(inner);
                            Err(de::Error::custom(msg))
                        }
                    }
                };
            let mut run = || -> std::result::Result<(), A::Error> {
                loop {
                    while let Ok(b) = rx.try_recv() {
                        take(b, &mut out)?;
                    }
                    let Some((start, raws)) = lock().jobs.pop_front() else { break };
                    for (i, raw) in (start..).zip(raws) {
                        out[i] = Some(parse_here(i, raw, false)?);
                    }
                }
                // The helper's last blocks (the channel closes when it ends).
                for b in rx.iter() {
                    take(b, &mut out)?;
                }
                Ok(())
            };
            let res = run();
            if res.is_err() {
                finish(true); // the helper stops at its next block
            }
            drop(back_tx);
            res?;
            out.into_iter().map(|u| u.ok_or_else(|| de::Error::custom("an item was not parsed"))).collect()
        })
    }
}
