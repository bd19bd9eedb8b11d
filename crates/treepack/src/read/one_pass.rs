//! The load-path policy for whole loads, decided here for Rust, Python and the CLI alike: a
//! tree whose manifest is most of the work (many small values, a few stored leaves) is built
//! in **one pass** while its manifest is parsed, with no manifest tree in between; anything
//! else opens a [`Reader`], which fetches stored leaves in parallel batches with read-ahead.
//!
//! The builder ([`Build`]) decides what it makes; [`NodeBuild`] makes the owned [`Node`] of
//! [`crate::load`], the Python bindings make Python objects.

use super::*;
use crate::format::manifest::{Build, KeyRef, PackInfo, Parsed};
use crate::format::model::{Key, Step};
use serde_json::Value;
use std::cell::{Cell, RefCell};

/// Distinct stored leaves a one-pass load reads one by one; past them it reads the tree's
/// (small, see [`ONE_PASS_PACK_BYTES`]) packs whole, once, and takes every further leaf from
/// memory. A tree with a few stored leaves in a big shared pack reads only those leaves; a
/// dataset of 100 images in one small pack reads it in one go instead of 100 reads (and is not
/// sent to the Reader, which would parse its manifest a second time).
pub const ONE_PASS_FETCHES: usize = 16;

/// A one-pass load reads stored leaves on the spot only from packs holding at most this much
/// in all (the most it reads when it reads them whole). Bigger trees go to the Reader, which
/// reads them in parallel batches with read-ahead: reading a checkpoint's first arrays one by
/// one, then its packs again whole, costs a cold load of big leaves much of its time.
pub const ONE_PASS_PACK_BYTES: u64 = 16 << 20;

/// Whether a load with these options may take the one-pass path: a whole tree, read into
/// memory (mmap views and progress reports are the Reader's).
pub fn one_pass_applies(opts: &LoadOptions) -> bool {
    opts.select.is_empty() && opts.keep.is_none() && !opts.mmap && opts.progress.is_none() && opts.expect_root.is_none()
}

/// Decoded bytes of compressed leaves a one-pass load decodes itself, one leaf at a time on its
/// thread; a tree with more goes to the Reader, which decodes in parallel.
pub const ONE_PASS_DECODE_BYTES: u64 = 16 << 20;

/// How many times a load starts over when the tree was replaced while it read it.
pub const LOAD_ATTEMPTS: u32 = 3;

/// What a binding does on each path of a load; [`load_with`] decides which path runs and when
/// a load starts over, for Rust ([`crate::load`]), Python and the CLI alike.
pub trait LoadPaths {
    /// What a load gives.
    type Out;
    /// The binding's error.
    type Err;
    /// The binding's reader.
    type Reader;
    /// The whole tree built in one pass over the manifest `bytes` read from `loc` (see
    /// [`load_one_pass`]), or `None` to take the reader path.
    fn one_pass(&self, loc: &Location, bytes: &[u8], file: &str) -> Option<Self::Out>;
    /// A reader of the tree at `loc`; `read` is the manifest when the policy read it already
    /// (the pinned location, its bytes and file name), for a reader over those bytes.
    ///
    /// # Errors
    /// The binding's (a manifest not found or damaged, a root hash not the one expected).
    fn open(
        &self,
        loc: &Location,
        read: Option<(Location, &[u8], String)>,
    ) -> std::result::Result<Self::Reader, Self::Err>;
    /// The load through `reader`.
    ///
    /// # Errors
    /// The binding's; one for which [`LoadPaths::missing`] holds starts the load over when the
    /// tree was replaced.
    fn through_reader(&self, reader: &Self::Reader) -> std::result::Result<Self::Out, Self::Err>;
    /// Whether `e` says a stored pack was missing.
    fn missing(&self, e: &Self::Err) -> bool;
    /// Whether the location now holds another tree than `reader`'s ([`Reader::replaced`]).
    fn replaced(&self, reader: &Self::Reader) -> bool;
    /// A core error as the binding's.
    fn error(&self, e: Error) -> Self::Err;
}

/// The load policy. A whole tree read into memory ([`one_pass_applies`]) has its manifest read
/// (one request) and is built in one pass while it is parsed when the binding's
/// [`LoadPaths::one_pass`] takes it; anything else, or any failure there, goes through a
/// reader (over the bytes already read, where the binding takes them). A load through the
/// reader that finds a pack missing starts over on the new tree when the location now holds
/// another one: an overwrite removes the packs only the replaced tree used, so the load raced
/// it (docs/security.md, "Readers racing an overwrite"); at most [`LOAD_ATTEMPTS`] times in
/// all. Blocking: call it where blocking is allowed.
///
/// # Errors
/// The manifest's read errors, and the binding's.
pub fn load_with<P: LoadPaths>(loc: &Location, opts: &LoadOptions, paths: &P) -> std::result::Result<P::Out, P::Err> {
    let mut attempt = 1;
    loop {
        let r = if one_pass_applies(opts) {
            let pinned = loc.pin().map_err(|e| paths.error(e))?;
            let (bytes, file) = pinned.block_on(manifest_bytes(&pinned)).map_err(|e| paths.error(e))?;
            // A signed load checks the signature against these very bytes before anything is
            // built from them (docs/signing.md); each attempt checks the manifest it reads.
            if let Some(by) = &opts.signed_by {
                pinned.block_on(crate::sign::check_bytes(&pinned, &bytes, &file, by)).map_err(|e| paths.error(e))?;
            }
            if let Some(out) = paths.one_pass(&pinned, &bytes, &file) {
                return Ok(out);
            }
            paths.open(loc, Some((pinned, &bytes, file)))?
        } else {
            paths.open(loc, None)?
        };
        match paths.through_reader(&r) {
            Err(e) if attempt < LOAD_ATTEMPTS && paths.missing(&e) && paths.replaced(&r) => attempt += 1,
            out => return out,
        }
    }
}

/// Build the whole tree from manifest bytes read from `loc`, in one pass: `b` gets every node
/// as it is parsed, and the stored leaves (local trees only, packs of at most
/// [`ONE_PASS_PACK_BYTES`] in all) are read on the spot, verified when `verify`: the first
/// [`ONE_PASS_FETCHES`] distinct ones one by one, the rest from the packs read whole. `None`
/// whenever this path does not apply or anything fails (a damaged manifest, a builder that
/// says no): the caller then loads through a [`Reader`] over the bytes already read, which
/// gives the result or the full error.
pub fn load_one_pass<B: Build>(loc: &Location, bytes: &[u8], file: &str, b: &B, verify: bool) -> Option<B::Node> {
    let pass = OnePass {
        inner: b,
        loc,
        file,
        reader: RefCell::new(None),
        fetched: RefCell::new(HashSet::new()),
        whole: RefCell::new(None),
        fetches_left: Cell::new(if loc.local_path().is_some() { ONE_PASS_FETCHES } else { 0 }),
        decode_left: Cell::new(ONE_PASS_DECODE_BYTES),
        header_checked: Cell::new(false),
        opts: LoadOptions { verify, ..Default::default() },
    };
    let parsed: Parsed<B::Node> = manifest::build(bytes, file, &pass).ok()?;
    // The layout rule `Reader::open` enforces.
    parsed.packs.iter().all(|p| loc.layout().allows_pack(&p.path)).then_some(parsed.root)
}

/// A [`Build`] that reads stored leaves on the spot for the builder it wraps.
struct OnePass<'a, B> {
    inner: &'a B,
    loc: &'a Location,
    file: &'a str,
    /// A reader over the manifest's packs (its tree is the one being parsed), once the packs
    /// are read, found to fit the layout and small enough.
    reader: RefCell<Option<Reader>>,
    /// The chunks read so far, to count distinct stored leaves.
    fetched: RefCell<HashSet<ChunkKey>>,
    /// The packs read whole (by pack index), once more than [`ONE_PASS_FETCHES`] distinct
    /// leaves were asked for.
    whole: RefCell<Option<HashMap<u32, Bytes>>>,
    fetches_left: Cell<usize>,
    /// Decoded bytes of compressed leaves this pass may still decode.
    decode_left: Cell<u64>,
    header_checked: Cell<bool>,
    opts: LoadOptions,
}

impl<B: Build> OnePass<'_, B> {
    fn fetch(&self, e: &Entry) -> std::result::Result<Leaf, String> {
        let reader = self.reader.borrow();
        let Some(r) = reader.as_ref() else { return Err("stored leaves are read by the Reader here".into()) };
        if e.chunks().iter().any(|c| !c.codec.is_identity()) {
            // Decoding, not reading, sets a compressed leaf's pace: the Reader decodes leaves
            // and chunks in parallel, this pass one leaf at a time on the calling thread. So
            // this pass decodes only up to ONE_PASS_DECODE_BYTES in all; past that the tree goes
            // to the Reader (and what was built so far is built again: refusing the first
            // compressed leaf instead read a small tree's raw leaves before it twice).
            let (n, left) = (e.nbytes(), self.decode_left.get());
            if n > left {
                return Err("compressed leaves past the one pass's share are decoded by the Reader".into());
            }
            self.decode_left.set(left - n);
        }
        let key = e.chunks().first().map(|c| (c.pack, c.offset, c.length)).unwrap_or_default();
        if self.whole.borrow().is_none() && !self.fetched.borrow().contains(&key) {
            let left = self.fetches_left.get();
            if left == 0 {
                let packs = self.loc.block_on(r.read_packs_whole()).map_err(|e| e.to_string())?;
                *self.whole.borrow_mut() = Some(packs);
            } else {
                self.fetches_left.set(left - 1);
                self.fetched.borrow_mut().insert(key);
            }
        }
        let check_header = !self.header_checked.replace(true) && self.loc.layout() == Layout::SingleFile;
        let whole = self.whole.borrow();
        self.loc.block_on(r.fetch_entry(e, &self.opts, check_header, whole.as_ref())).map_err(|e| e.to_string())
    }
}

impl<B: Build> Build for OnePass<'_, B> {
    type Node = B::Node;
    const HELPER: bool = B::HELPER;
    const PATHS: bool = B::PATHS;
    fn leaf_ref(&self, e: &Entry) -> std::result::Result<Self::Node, String> {
        if e.chunks().is_empty() {
            return self.inner.leaf_ref(e);
        }
        self.inner.stored(e, &mut || self.fetch(e))
    }
    fn leaf(&self, e: Entry) -> std::result::Result<Self::Node, String> {
        if e.chunks().is_empty() {
            return self.inner.leaf(e);
        }
        self.inner.stored(&e, &mut || self.fetch(&e))
    }
    fn none_leaf(&self) -> std::result::Result<Self::Node, String> {
        self.inner.none_leaf()
    }
    fn bool_leaf(&self, v: bool) -> std::result::Result<Self::Node, String> {
        self.inner.bool_leaf(v)
    }
    fn int_leaf(&self, v: i64) -> std::result::Result<Self::Node, String> {
        self.inner.int_leaf(v)
    }
    fn float_leaf(&self, v: f64) -> std::result::Result<Self::Node, String> {
        self.inner.float_leaf(v)
    }
    fn str_leaf(&self, v: &str) -> std::result::Result<Self::Node, String> {
        self.inner.str_leaf(v)
    }
    fn list(&self, items: Vec<Self::Node>, tuple: bool) -> std::result::Result<Self::Node, String> {
        self.inner.list(items, tuple)
    }
    fn dict(&self, pairs: Vec<(Key, Self::Node)>) -> std::result::Result<Self::Node, String> {
        self.inner.dict(pairs)
    }
    fn dict_ref(&self, pairs: Vec<(KeyRef<'_>, Self::Node)>) -> std::result::Result<Self::Node, String> {
        self.inner.dict_ref(pairs)
    }
    fn record(&self, type_name: String, fields: Vec<(String, Self::Node)>) -> std::result::Result<Self::Node, String> {
        self.inner.record(type_name, fields)
    }
    fn named_begin(&self, custom: bool, type_name: &str) -> std::result::Result<(), String> {
        self.inner.named_begin(custom, type_name)
    }
    fn custom(
        &self,
        type_name: String,
        data: Value,
        children: Vec<(String, Self::Node)>,
    ) -> std::result::Result<Self::Node, String> {
        self.inner.custom(type_name, data, children)
    }
    fn shared_begin(&self, id: u64) {
        self.inner.shared_begin(id)
    }
    fn shared(&self, id: u64, node: Self::Node) -> std::result::Result<Self::Node, String> {
        self.inner.shared(id, node)
    }
    fn reference(&self, id: u64) -> std::result::Result<Self::Node, String> {
        self.inner.reference(id)
    }
    fn packs(&self, packs: &[PackInfo]) {
        let small = packs.iter().map(|p| p.size).fold(0u64, u64::saturating_add) <= ONE_PASS_PACK_BYTES;
        if small && self.loc.local_path().is_some() && packs.iter().all(|p| self.loc.layout().allows_pack(&p.path)) {
            let m = Manifest {
                version: (manifest::VERSION_MAJOR, manifest::VERSION_MINOR),
                writer: String::new(),
                metadata: None,
                packs: packs.to_vec(),
                root: Tree::List(vec![]),
            };
            *self.reader.borrow_mut() = Some(Reader::from_parts(self.loc.clone(), m, self.file.to_string()));
        }
        self.inner.packs(packs);
    }
    fn enter(&self, step: Step<'_>) {
        self.inner.enter(step);
    }
    fn exit(&self) {
        self.inner.exit();
    }
}

/// Builds the owned [`Node`] of a load: inline leaves from the manifest, stored ones as read.
pub struct NodeBuild<'a> {
    /// The manifest's file, named in errors.
    pub file: &'a str,
}

impl Build for NodeBuild<'_> {
    type Node = Node;
    fn leaf_ref(&self, e: &Entry) -> std::result::Result<Node, String> {
        inline_leaf_ref(e, self.file, &String::new).map(Tree::Leaf).map_err(|e| e.to_string())
    }
    fn value(&self, l: Leaf) -> std::result::Result<Node, String> {
        Ok(Tree::Leaf(l))
    }
    fn list(&self, items: Vec<Node>, tuple: bool) -> std::result::Result<Node, String> {
        Ok(if tuple { Tree::Tuple(items) } else { Tree::List(items) })
    }
    fn dict(&self, pairs: Vec<(Key, Node)>) -> std::result::Result<Node, String> {
        Ok(Tree::Dict(pairs))
    }
    fn record(&self, type_name: String, fields: Vec<(String, Node)>) -> std::result::Result<Node, String> {
        Ok(Tree::Record { type_name, fields })
    }
    fn custom(
        &self,
        type_name: String,
        data: Value,
        children: Vec<(String, Node)>,
    ) -> std::result::Result<Node, String> {
        Ok(Tree::Custom { type_name, data, children })
    }
    fn shared(&self, id: u64, node: Node) -> std::result::Result<Node, String> {
        Ok(Tree::Shared { id, node: Box::new(node) })
    }
    fn reference(&self, id: u64) -> std::result::Result<Node, String> {
        Ok(Tree::Ref(id))
    }
}

impl Reader {
    /// One stored leaf, read (or taken from `whole`, packs read whole by
    /// [`Reader::read_packs_whole`]) and, if `opts.verify`, verified; `check_header` also checks
    /// a single file's header.
    async fn fetch_entry(
        &self,
        e: &Entry,
        opts: &LoadOptions,
        check_header: bool,
        whole: Option<&HashMap<u32, Bytes>>,
    ) -> Result<Leaf> {
        let job = Job { id: 0, path: String::new(), entry: e };
        let mut keys = self.job_keys(&job, false);
        let header = (0u32, 0u64, container::HEADER_LEN);
        if check_header {
            keys.push(header);
        }
        let fetched = match whole {
            Some(packs) => keys
                .into_iter()
                .map(|(p, off, len)| {
                    let pack = packs.get(&p).ok_or_else(|| Error::internal("a pack was not read whole"))?;
                    Ok(((p, off, len), self.map_range(p, pack, off, len)?))
                })
                .collect::<Result<_>>()?,
            None => self.fetch_keys(keys, false, None, ReadMode::Buffered).await?,
        };
        if check_header {
            container::check_header(fetched.get(&header).map(|b| b.as_ref()).unwrap_or_default(), &self.manifest_file)?;
        }
        self.assemble(&job, &fetched, opts, opts.verify)
    }

    /// Every pack of the tree, read whole: one read each (the one-pass load's, for small packs).
    async fn read_packs_whole(&self) -> Result<HashMap<u32, Bytes>> {
        let keys = self.manifest.packs.iter().enumerate().map(|(i, p)| (i as u32, 0, p.size)).collect();
        Ok(self
            .fetch_keys(keys, false, None, ReadMode::Buffered)
            .await?
            .into_iter()
            .map(|((p, _, _), b)| (p, b))
            .collect())
    }

    /// Build the whole tree through `b` from this reader's manifest and `leaves`, the stored
    /// leaves [`Reader::fetch_stored_leaves_async`] read (in tree order, by leaf ordinal): the
    /// Reader path of a whole load, for builders of anything (Python objects).
    ///
    /// # Errors
    /// The first error `b` returns.
    pub fn build_whole<B: Build>(&self, b: &B, leaves: Vec<(usize, Leaf)>) -> std::result::Result<B::Node, String> {
        let mut leaves = leaves.into_iter().peekable();
        let mut id = 0usize;
        manifest::replay_with(b, &self.manifest.root, &mut |b, e| {
            let i = id;
            id += 1;
            if e.chunks().is_empty() {
                return b.leaf_ref(e);
            }
            // Leaves before this one that the builder shared without taking are skipped.
            while leaves.next_if(|(j, _)| *j < i).is_some() {}
            b.stored(e, &mut || match leaves.next_if(|(j, _)| *j == i) {
                Some((_, l)) => Ok(l),
                None => Err(format!("stored leaf {i} was not read")),
            })
        })
    }
}
