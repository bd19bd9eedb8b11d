//! Parsing entry points: `decode` (checked, owned tree), `build` (any `Build`er), and the parse context.

use super::build::{Build, OwnedTree, Parsed};
use super::nodes::TopSeed;
use super::types::{Entry, Manifest, PackInfo};
use super::validate::{check, check_body, check_frame, has_entry_checks, validate_entry, validate_from};
use crate::error::{Error, Result};
use crate::keypath::KeyPath;
use crate::manifest::split::{build_streamed, split_root};
use crate::manifest::strategy;
use crate::refs::RefCheck;
use serde::de::{self, DeserializeSeed};
use std::cell::RefCell;

/// Verify the trailing hash member and parse a manifest. `file` names the source in errors.
///
/// # Errors
/// [`Error::NotTreepack`], [`Error::UnsupportedVersion`], [`Error::ManifestChecksum`] or
/// [`Error::InvalidManifest`] (with the key path of the problem).
pub fn decode(bytes: &[u8], file: &str) -> Result<Manifest> {
    check(bytes, file)?;
    parse_unchecked(bytes, file)
}

/// Parse without checking the trailing hash (used by fuzzing and by `decode`).
pub fn parse_unchecked(bytes: &[u8], file: &str) -> Result<Manifest> {
    parse_with(bytes, file, strategy::split_owned(bytes.len()))
}

/// Parse with or without splitting big containers across threads (the result is the same;
/// tests compare both).
pub(super) fn parse_with(bytes: &[u8], file: &str, split: bool) -> Result<Manifest> {
    parse_with_ids(bytes, file, split, 0)
}

/// [`parse_with`] of a document whose shared ids start at `first_shared` (a fragment's: its
/// refs may name shared nodes before it).
pub(super) fn parse_with_ids(bytes: &[u8], file: &str, split: bool, first_shared: u64) -> Result<Manifest> {
    let p = parse_generic(bytes, file, &OwnedTree, split, false, first_shared)?;
    let m = Manifest { version: p.version, writer: p.writer, metadata: p.metadata, packs: p.packs, root: p.root };
    validate_from(&m, file, RefCheck::after(first_shared))?;
    Ok(m)
}

/// Check a manifest's size, signature, version and trailing hash, then parse it into whatever
/// `builder` builds, in one pass with no owned tree in between. Each leaf is validated as it is
/// read (the checks [`validate`](super::validate) makes), which needs `packs` before `root`, and `root` last (a
/// big manifest's root is parsed on a helper thread, see `build_streamed`), as every writer puts
/// them; a manifest in another member order gets an error here and must go through [`decode`].
///
/// This is the fast path for callers that turn the tree into something else at once (the Python
/// bindings build their objects here). Its errors are terse: on any error, call [`decode`] to
/// get the full, typed one.
///
/// # Errors
/// As [`decode`], with less precise messages.
pub fn build<B: Build>(bytes: &[u8], file: &str, builder: &B) -> Result<Parsed<B::Node>> {
    let stored = check_frame(bytes, file)?;
    // Pack paths are checked as they are read (before any builder sees them), leaves as each
    // is read: nothing is left for a `validate` pass. Big manifests built on this thread alone
    // ([`Build::HELPER`]) are parsed on the helper thread (`build_streamed`), which hashes the
    // manifest on this thread meanwhile; on one core there is no helper.
    if strategy::stream::<B>(bytes.len()) {
        if let Some(parsed) = build_streamed(bytes, file, builder, &stored) {
            return parsed;
        }
    }
    check_body(bytes, &stored, false, file)?;
    parse_generic(bytes, file, builder, false, true, 0)
}

/// The packs a manifest names, checked as [`decode`] checks them, without parsing its tree
/// when the manifest is in the writer's layout (`root` last): what a save that replaces a tree
/// needs to remove the old packs, without decoding the whole tree it replaces (for a tree of
/// plain values overwritten in a loop, that decoding would cost more than the save).
///
/// # Errors
/// As [`decode`].
pub fn packs_of(bytes: &[u8], file: &str) -> Result<Vec<PackInfo>> {
    check(bytes, file)?;
    match std::str::from_utf8(bytes).ok().and_then(|text| split_root(text, file)) {
        Some((head, _)) => Ok(head.packs),
        None => Ok(parse_unchecked(bytes, file)?.packs),
    }
}

/// [`build`]'s streamed parse (see `build_streamed`) at any size: `None` where it does not
/// apply (the manifest is not in the writer's layout, or no helper thread is free). The fuzz
/// target checks that it accepts, builds and refuses exactly what [`build_one_thread`] does.
#[doc(hidden)]
pub fn build_streamed_any_size<B: Build>(bytes: &[u8], file: &str, builder: &B) -> Option<Result<Parsed<B::Node>>> {
    match check_frame(bytes, file) {
        Ok(stored) => build_streamed(bytes, file, builder, &stored),
        Err(e) => Some(Err(e)),
    }
}

/// [`build`] on this thread alone (tests compare it with the helped parse).
#[doc(hidden)]
pub fn build_one_thread<B: Build>(bytes: &[u8], file: &str, builder: &B) -> Result<Parsed<B::Node>> {
    check(bytes, file)?;
    parse_generic(bytes, file, builder, false, true, 0)
}

/// Parse with `builder`; `inline_checks` validates each leaf as it is read (against the packs,
/// which must come first).
pub(super) fn parse_generic<B: Build>(
    bytes: &[u8],
    file: &str,
    builder: &B,
    split: bool,
    inline_checks: bool,
    first_shared: u64,
) -> Result<Parsed<B::Node>> {
    let path = RefCell::new(Vec::<PathSeg>::new());
    let packs = RefCell::new(None);
    let refs = RefCell::new(RefCheck::after(first_shared));
    let split = split && B::PARALLEL;
    // Shared ids are checked as they are read, except where parts of the manifest are parsed on
    // other threads (then `validate`'s `check_refs`, or the builder, checks them in order).
    let refs = (!split).then_some(&refs);
    let ctx =
        Ctx { path: Some(&path), packs: inline_checks.then_some(&packs), file, shared_value: Default::default(), refs };
    // Text checked as UTF-8 once is read without checking each string again (a slice reader
    // checks every string it meets, a visible cost on short strings). Bytes that are
    // not UTF-8 are read as bytes, as before: strings skipped unread are not checked, and the
    // outline (which does the same) must accept what this parser accepts.
    fn run<'de, R: serde_json::de::Read<'de>, B: Build>(
        mut de: serde_json::Deserializer<R>,
        top: TopSeed<'_, B>,
    ) -> serde_json::Result<Parsed<B::Node>> {
        de.disable_recursion_limit();
        top.deserialize(&mut de).and_then(|m| de.end().map(|_| m))
    }
    let top = TopSeed { ctx: &ctx, split, b: builder };
    let res = match std::str::from_utf8(bytes) {
        Ok(text) => run(serde_json::Deserializer::from_str(text), top),
        Err(_) => run(serde_json::Deserializer::from_slice(bytes), top),
    };
    res.map_err(|e| {
        let p = path.borrow().iter().map(PathSeg::text).collect::<Vec<_>>().join("/");
        Error::manifest(file, if p.is_empty() { "<root>".to_string() } else { p }, e.to_string())
    })
}

/// What every node seed of one parse shares.
pub(super) struct Ctx<'a> {
    /// The key path being parsed, to name the place of an error. `None` where an error is
    /// reported by parsing again (the streamed parse's helper, which need not pay for it).
    pub(super) path: Option<&'a RefCell<Vec<PathSeg>>>,
    /// With inline checks: the packs once read (`None` before `packs`).
    pub(super) packs: Option<&'a RefCell<Option<Vec<PackInfo>>>>,
    pub(super) file: &'a str,
    /// The depth of the shared node's `v` being read, if one is: that node may not itself be
    /// a shared node or a ref.
    pub(super) shared_value: std::cell::Cell<Option<usize>>,
    /// The shared ids met so far, when this parse checks them (see `parse_generic`).
    pub(super) refs: Option<&'a RefCell<RefCheck>>,
}

impl Ctx<'_> {
    /// Change the key path being parsed, if this parse keeps one.
    #[inline]
    pub(super) fn path(&self, f: impl FnOnce(&mut Vec<PathSeg>)) {
        if let Some(p) = self.path {
            f(&mut p.borrow_mut());
        }
    }

    pub(super) fn check_leaf<E: de::Error>(&self, e: &Entry) -> std::result::Result<(), E> {
        let Some(packs) = self.packs else { return Ok(()) };
        let packs = packs.borrow();
        let Some(packs) = packs.as_deref() else {
            return Err(E::custom("`packs` must come before `root` for a one-pass parse"));
        };
        // The scalars that make most of a tree's leaves skip the call.
        if !has_entry_checks(e) {
            return Ok(());
        }
        validate_entry(packs, &KeyPath::root(), e, self.file).map_err(|err| E::custom(err.to_string()))
    }
}

/// One step of the key path being parsed, kept only to name the place of an error (indices are
/// not formatted unless an error happens).
pub(super) enum PathSeg {
    Index(usize),
    Text(String),
    /// A pair's key whose text is filled in only if an error happens below it.
    Pending,
}

impl PathSeg {
    pub(super) fn text(&self) -> String {
        match self {
            PathSeg::Index(i) => i.to_string(),
            PathSeg::Text(t) => t.clone(),
            PathSeg::Pending => "?".into(),
        }
    }
}
