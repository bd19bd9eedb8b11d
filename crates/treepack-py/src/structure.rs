//! `load_structure`: Python objects built from the outline's blocks (one builder), read on a
//! helper thread for big manifests, on this thread for small ones, or from a reader's tree.

use super::*;

/// `load_structure`'s objects from outline blocks that `run` hands to its sink on this thread
/// (the outline of small manifests, or a reader's parsed tree through `outline_tree`): the one
/// structure builder, [`OutlineBuilder`], whatever the source. `None` when `run` says no or
/// anything is off; the builder's refusal of the file (`OutlineBuilder::refused`) as the error.
pub(crate) fn structure_here<'py>(
    py: Python<'py>,
    make_node: &Bound<'py, PyAny>,
    keys_unique: bool,
    run: impl FnOnce(&mut dyn FnMut(Block) -> bool) -> bool,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let mut b = OutlineBuilder::new(py, make_node, keys_unique);
    let mut fed = true;
    let ok = run(&mut |block| {
        fed = b.feed(&block).is_some();
        fed
    });
    if let Some(e) = b.refused.take() {
        return Err(e);
    }
    if !(ok && fed) {
        return Ok(None);
    }
    Ok(b.finish())
}

/// `load_structure` from a structure-only read of the manifest (`treepack::format::manifest::outline`)
/// on a helper thread, streamed in blocks while this thread builds the Python objects: the
/// parse, the leaves' facts and their key paths all cost this thread nothing, and each leaf
/// object is a small handle into its block's table. `None` whenever anything is off (a bad
/// seal or parse, a repeated dict key, a Python error, a pack the layout forbids): the caller
/// then takes the one-pass parse, which gives the result or the full error.
pub(crate) fn structure_outline<'py>(
    py: Python<'py>,
    bytes: &[u8],
    file: &str,
    layout: treepack::Layout,
    make_node: &Bound<'py, PyAny>,
) -> Option<Bound<'py, PyAny>> {
    let (tx, mut rx) = std::sync::mpsc::channel::<Block>();
    // Blocks built go back to be filled again.
    let (back_tx, back_rx) = std::sync::mpsc::channel::<Block>();
    std::thread::scope(|s| {
        let helper = std::thread::Builder::new()
            .name("treepack-outline".into())
            .spawn_scoped(s, move || {
                treepack::format::manifest::outline::outline_reusing(
                    bytes,
                    file,
                    &mut |b| tx.send(b).is_ok(),
                    &mut || back_rx.try_recv().ok(),
                )
            })
            .ok()?;
        // The seal is checked here while the helper parses.
        let mut built =
            treepack::format::manifest::check(bytes, file).ok().map(|_| OutlineBuilder::new(py, make_node, false));
        if let Some(b) = &mut built {
            loop {
                let block = match rx.try_recv() {
                    Ok(block) => block,
                    Err(std::sync::mpsc::TryRecvError::Empty) => {
                        // Wait without the interpreter (the receiver goes with the wait and back).
                        let (got, back) = py.detach_releasing(move || (rx.recv(), rx));
                        rx = back;
                        match got {
                            Ok(block) => block,
                            Err(_) => break,
                        }
                    }
                    Err(std::sync::mpsc::TryRecvError::Disconnected) => break,
                };
                if b.feed(&block).is_none() {
                    built = None;
                    break;
                }
                let _ = back_tx.send(block.reuse());
            }
        }
        // A helper still reading stops at its next block.
        drop(rx);
        let packs = helper.join().ok()?.ok()?;
        if !packs.iter().all(|p| layout.allows_pack(&p.path)) {
            return None;
        }
        let tree = built?.finish()?;
        OUTLINE_BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Some(tree)
    })
}

/// Structures built by [`structure_outline`] in this process (tests check which path ran).
pub(crate) static OUTLINE_BUILDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many `load_structure` calls were answered by the structure-only read (for tests).
#[pyfunction]
pub(crate) fn _outline_builds() -> u64 {
    OUTLINE_BUILDS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Builds `load_structure`'s objects from outline events (pre-order), one container frame per
/// open node.
pub(crate) struct OutlineBuilder<'py, 'm> {
    pub(crate) dec: Decoder<'py>,
    pub(crate) make_node: &'m Bound<'py, PyAny>,
    pub(crate) stack: Vec<Frame<'py>>,
    pub(crate) root: Option<Bound<'py, PyAny>>,
    /// Slots of (length, text, string): the text kept inline, so a hit costs one compare.
    pub(crate) keys: Vec<Option<KeySlot<'py>>>,
    /// The events come from a parsed tree, whose dict keys are known to be unique.
    pub(crate) keys_unique: bool,
    /// A refusal that is the file's fault, not the path's (keys made to share one hash): the
    /// error of `load_structure`, whichever reader was building.
    pub(crate) refused: Option<PyErr>,
}

/// (length, text, the string) of a key `OutlineBuilder` met.
pub(crate) type KeySlot<'py> = (u8, [u8; KEY_INLINE], Bound<'py, PyString>);

/// Slots of `OutlineBuilder`'s key cache.
pub(crate) const KEY_SLOTS: usize = 512;
/// Longest key `OutlineBuilder`'s cache keeps.
pub(crate) const KEY_INLINE: usize = 22;

pub(crate) enum Frame<'py> {
    /// `n` items set so far: a dict with fewer entries repeated a key.
    Dict {
        d: Bound<'py, PyDict>,
        key: Option<Bound<'py, PyAny>>,
        n: usize,
        leaves_only: bool,
        same: SameHash,
    },
    Seq {
        items: Vec<Bound<'py, PyAny>>,
        tuple: bool,
        leaves_only: bool,
    },
    Named {
        name: Option<Bound<'py, PyAny>>,
        kids: Vec<Bound<'py, PyAny>>,
    },
}

impl<'py, 'm> OutlineBuilder<'py, 'm> {
    pub(crate) fn new(py: Python<'py>, make_node: &'m Bound<'py, PyAny>, keys_unique: bool) -> Self {
        OutlineBuilder {
            dec: Decoder::new(py, None, None, false),
            make_node,
            stack: Vec::new(),
            root: None,
            keys: vec![None; KEY_SLOTS],
            keys_unique,
            refused: None,
        }
    }

    /// Build what `block` describes; `None` on anything unexpected or any Python error.
    pub(crate) fn feed(&mut self, block: &Block) -> Option<()> {
        let py = self.dec.py;
        for e in &block.events {
            match *e {
                Event::Dict => self.stack.push(Frame::Dict {
                    d: PyDict::new(py),
                    key: None,
                    n: 0,
                    leaves_only: true,
                    same: SameHash::default(),
                }),
                Event::List | Event::Tuple => {
                    self.stack.push(Frame::Seq { items: Vec::new(), tuple: *e == Event::Tuple, leaves_only: true })
                }
                Event::Named => self.stack.push(Frame::Named { name: None, kids: Vec::new() }),
                Event::Key(a, b) => {
                    let k = self.key_str(block.text(a, b)?);
                    self.key(k)?;
                }
                Event::TypedKey(i) => {
                    let k = self.dec.key(block.keys.get(i as usize)?).ok()?;
                    self.key(k)?;
                }
                Event::Leaf(i) => {
                    let info = LeafInfo::row(&block.leaves, i)?;
                    let obj = leaf_info(py, info).ok()?;
                    self.add(obj, true)?;
                }
                Event::End => {
                    let v = match self.stack.pop()? {
                        Frame::Dict { d, n, leaves_only, .. } => {
                            // Keys the format tells apart but Python takes for one (1 and 1.0)
                            // merge, as in a load; from text, a shorter dict may be a repeated
                            // key, which only the strict parser can tell.
                            if d.len() != n && !self.keys_unique {
                                return None;
                            }
                            untrack_if_leaves(leaves_only, d.into_any())
                        }
                        Frame::Seq { items, tuple, leaves_only } => {
                            untrack_if_leaves(leaves_only, self.dec.sequence(items, tuple).ok()?)
                        }
                        Frame::Named { .. } => return None,
                    };
                    self.add(v, false)?;
                }
                Event::EndNamed(i) => {
                    let Frame::Named { kids, .. } = self.stack.pop()? else { return None };
                    let n = block.named.get(i as usize)?;
                    let kind = if n.custom { "custom" } else { "record" };
                    let kids = PyList::new(py, kids).ok()?;
                    let v = self.make_node.call1((kind, &n.type_name, n.data.as_deref(), kids, &n.path)).ok()?;
                    self.add(v, false)?;
                }
            }
        }
        Some(())
    }

    /// A str key through a small direct-mapped cache: the same few keys repeat in every dict
    /// of a big tree, and a miss costs only the string the cache did not have.
    pub(crate) fn key_str(&mut self, s: &str) -> Bound<'py, PyAny> {
        let bytes = s.as_bytes();
        if bytes.len() > KEY_INLINE {
            return PyString::new(self.dec.py, s).into_any();
        }
        // FNV-1a over the key's bytes picks the slot.
        let h = bytes.iter().fold(0x811c_9dc5u32, |h, &b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193));
        let slot = &mut self.keys[h as usize % KEY_SLOTS];
        if let Some((len, text, k)) = slot {
            if text.get(..*len as usize) == Some(bytes) {
                return k.clone().into_any();
            }
        }
        let k = PyString::new(self.dec.py, s);
        let mut text = [0u8; KEY_INLINE];
        text[..bytes.len()].copy_from_slice(bytes);
        *slot = Some((bytes.len() as u8, text, k.clone()));
        k.into_any()
    }

    pub(crate) fn key(&mut self, k: Bound<'py, PyAny>) -> Option<()> {
        match self.stack.last_mut()? {
            Frame::Dict { key, .. } | Frame::Named { name: key, .. } => *key = Some(k),
            Frame::Seq { .. } => return None,
        }
        Some(())
    }

    pub(crate) fn add(&mut self, v: Bound<'py, PyAny>, leaf: bool) -> Option<()> {
        match self.stack.last_mut() {
            None => {
                if self.root.replace(v).is_some() {
                    return None;
                }
            }
            Some(Frame::Dict { d, key, n, leaves_only, same }) => {
                let k = match same.check(key.take()?) {
                    Ok(k) => k,
                    Err(e) => {
                        let at = self.path_of_top();
                        // (an exception that takes no attribute is reported without its place)
                        let _ = e.value(self.dec.py).setattr("_treepack_at", at);
                        self.refused = Some(e);
                        return None;
                    }
                };
                d.set_item(k, v).ok()?;
                *n += 1;
                *leaves_only &= leaf;
            }
            Some(Frame::Seq { items, leaves_only, .. }) => {
                items.push(v);
                *leaves_only &= leaf;
            }
            Some(Frame::Named { name, kids }) => {
                kids.push(PyTuple::new(self.dec.py, [name.take()?, v]).ok()?.into_any());
            }
        }
        Some(())
    }

    /// The key path of the innermost open node (for errors): the step each node around it is
    /// building.
    fn path_of_top(&self) -> String {
        let around = &self.stack[..self.stack.len().saturating_sub(1)];
        let steps: Vec<String> = around
            .iter()
            .map(|f| match f {
                Frame::Dict { key, .. } => key.as_ref().map_or_else(|| "?".into(), key_path_text),
                Frame::Seq { items, .. } => items.len().to_string(),
                Frame::Named { name, .. } => name.as_ref().map_or_else(|| "?".into(), key_path_text),
            })
            .collect();
        steps.join("/")
    }

    pub(crate) fn finish(self) -> Option<Bound<'py, PyAny>> {
        if !self.stack.is_empty() {
            return None;
        }
        self.root
    }
}

/// `load_structure` from the outline of the manifest (no `Reader`, no manifest tree). Returns
/// `None` whenever that path does not apply or anything fails, and the caller then takes the
/// `Reader` path, which reports the error in full.
#[pyfunction]
#[pyo3(signature = (path, make_node, storage_options=None))]
pub(crate) fn structure_one_pass<'py>(
    py: Python<'py>,
    path: &str,
    make_node: Bound<'py, PyAny>,
    storage_options: Options,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let Some((loc, bytes, file)) = manifest_of(py, path, storage_options)? else { return Ok(None) };
    let layout = loc.layout();
    // The core decides which reader pays (the outline for big manifests); here it also runs on a
    // helper thread while this thread builds.
    if treepack::read::structure::outline_pays(bytes.len()) {
        return without_gc(py, || Ok(structure_outline(py, &bytes, &file, layout, &make_node)));
    }
    // Small manifests: the outline on this thread (no helper to start).
    let run = |sink: &mut dyn FnMut(Block) -> bool| {
        treepack::format::manifest::check(&bytes, &file).is_ok()
            && treepack::format::manifest::outline::outline(&bytes, &file, sink)
                .is_ok_and(|packs| packs.iter().all(|p| layout.allows_pack(&p.path)))
    };
    without_gc(py, || structure_here(py, &make_node, false, run))
}

/// The key-path segment of a dict key (a str: of a record field's or a child's name too), as
/// the core writes it (docs/format.md, "Key paths": `~i1` for the int key 1, `~2` for `*`):
/// the Python side builds the paths of a structure's places with it, so that they are the ones
/// the core compares them with.
#[pyfunction]
pub(crate) fn key_text(key: &Bound<'_, PyAny>) -> String {
    key_path_text(key)
}

/// The key-path text of a dict key or a name met while building (docs/format.md, "Key paths"),
/// for errors: a key of a type a path cannot name is shown by its `repr`.
fn key_path_text(k: &Bound<'_, PyAny>) -> String {
    match crate::encode::key_of(k) {
        Ok(key) => treepack::format::keypath::Segment::Key(key).text(),
        Err(_) => k.repr().map(|r| r.to_string()).unwrap_or_else(|_| "?".into()),
    }
}
