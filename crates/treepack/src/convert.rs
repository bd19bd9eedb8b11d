//! Converting trees to and from other formats (docs/convert.md). The Rust core handles
//! safetensors and reads `torch.save` checkpoints (without pickle, [`crate::foreign::torch`]);
//! the Python package adds `.npy`/`.npz`, Zarr and HDF5.
//!
//! Conversion streams: a safetensors file is memory-mapped and each tensor becomes an array
//! viewing the mapping (no copy; the save reads the pages as it writes them), and a tree is
//! written to safetensors one leaf at a time, so memory stays bounded by the largest tensor.

use crate::error::{Error, Result};
use crate::format::dtype::DType;
use crate::format::model::{ArrayData, Key, Node, Step, Tree};
use crate::format::safetensors as st;
use crate::format::{
    keypath,
    manifest::{Entry, MAX_DEPTH},
};
use crate::read::Reader;
use crate::save::{SaveInfo, SaveOptions};
use crate::Location;
use bytes::Bytes;
use std::collections::{BTreeMap, HashSet};

/// Formats [`convert`] reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// A treepack location (directory, `.tpk`, object-store prefix, `LOCATION@NAME`).
    Treepack,
    /// A `.safetensors` file.
    Safetensors,
    /// A checkpoint another tool wrote whose location reads as the tree it holds, named as
    /// [`detect_format`] names it: `torch` (a `torch.save` file, read without pickle,
    /// [`crate::foreign::torch`], or a folder of torch shards), `gguf`, `dcp`. A source only.
    Checkpoint(&'static str),
}

/// The checkpoints [`Format::Checkpoint`] reads, and what each is called in messages.
const CHECKPOINTS: [(&str, &str); 3] =
    [("torch", "torch.save checkpoints"), ("gguf", "GGUF files"), ("dcp", "torch.distributed.checkpoint folders")];

/// The format of a folder that is not a treepack tree, by the files it holds.
fn folder_format(path: &std::path::Path) -> Option<&'static str> {
    let has = |f: &str| path.join(f).is_file();
    if ["zarr.json", ".zgroup", ".zarray"].iter().any(|f| has(f)) {
        return Some("zarr");
    }
    // jax.experimental.array_serialization.pytree_serialization.save's layout.
    if has("pytreedef.json") {
        return Some("jax");
    }
    // An Orbax checkpoint, or a CheckpointManager's folder of steps (or a step's folder of
    // items) with one a level down.
    const ORBAX: [&str; 3] = ["_CHECKPOINT_METADATA", "_METADATA", "manifest.ocdbt"];
    // (An older Orbax or flax checkpoint is one aggregated `checkpoint` file of msgpack.)
    let orbax = |p: &std::path::Path| ORBAX.iter().any(|f| p.join(f).is_file()) || msgpack_map(&p.join("checkpoint"));
    if orbax(path) {
        return Some("orbax");
    }
    // torch.distributed.checkpoint's layout: `.metadata` and `__<rank>_<n>.distcp` files.
    let entries = || std::fs::read_dir(path).into_iter().flatten().filter_map(|e| e.ok()).take(4096);
    if has(".metadata") && entries().any(|e| e.file_name().to_str().is_some_and(|n| n.ends_with(".distcp"))) {
        return Some("dcp");
    }
    if let Some(found) = crate::foreign::sharded::find(path) {
        return Some(match found.weights() {
            crate::foreign::sharded::Weights::Safetensors => "safetensors",
            crate::foreign::sharded::Weights::Torch => "torch",
        });
    }
    let below = entries().take(64).any(|e| e.file_type().is_ok_and(|t| t.is_dir()) && orbax(&e.path()));
    below.then_some("orbax")
}

impl Format {
    /// The format of `path` as a destination: `explicit` (`treepack`, `safetensors`) if given,
    /// else named by its extension ([`detect_format`] with `read` false).
    ///
    /// # Errors
    /// [`Error::BadLocation`] for an unknown explicit name, or a format only the Python package
    /// converts.
    pub fn of(path: &str, explicit: Option<&str>) -> Result<Format> {
        Self::named(path, explicit, false)
    }

    /// The format of `path` as a source: `explicit` if given, else read from its content where
    /// it is a local file or folder ([`detect_format`] with `read` true).
    ///
    /// # Errors
    /// As [`Format::of`].
    pub fn of_source(path: &str, explicit: Option<&str>) -> Result<Format> {
        Self::named(path, explicit, true)
    }

    fn named(path: &str, explicit: Option<&str>, read: bool) -> Result<Format> {
        match explicit.unwrap_or_else(|| detect_format(path, read)) {
            "treepack" | "tpk" => Ok(Format::Treepack),
            "safetensors" => Ok(Format::Safetensors),
            name => match CHECKPOINTS.iter().find(|(c, _)| *c == name) {
                Some((c, _)) if read => Ok(Format::Checkpoint(c)),
                Some((_, what)) => Err(Error::BadLocation {
                    location: path.to_string(),
                    reason: format!(
                        "treepack reads {what} but does not write them: convert to treepack or .safetensors{}",
                        if name == "torch" {
                            ", or torch.save(treepack.load(SRC), DST) in Python (tensors come back as torch tensors)"
                        } else {
                            ""
                        }
                    ),
                }),
                None => Err(Self::python_only(path, name)),
            },
        }
    }
}

/// The formats [`detect_format`] tells apart, as `convert` names them (the Rust core reads the
/// first five; the Python package the others, through numpy, zarr-python, h5py and TensorStore).
pub const FORMAT_NAMES: [&str; 11] =
    ["treepack", "safetensors", "torch", "gguf", "dcp", "npz", "npy", "zarr", "hdf5", "orbax", "jax"];

/// Extensions that name a format (compared without regard to case).
const EXTENSIONS: [(&str, &str); 9] = [
    ("safetensors", "safetensors"),
    ("pt", "torch"),
    ("pth", "torch"),
    ("npz", "npz"),
    ("npy", "npy"),
    ("zarr", "zarr"),
    ("h5", "hdf5"),
    ("hdf5", "hdf5"),
    ("he5", "hdf5"),
];

/// The format of what is at `path`, one of [`FORMAT_NAMES`]: the one detector of the CLI and
/// the Python package. With `read` (a source), a local file or folder that exists is known by
/// its content: a folder holding `treepack.json` is a treepack tree, one holding `zarr.json`,
/// `.zgroup` or `.zarray` a Zarr store, `pytreedef.json` JAX's `pytree_serialization`, Orbax's
/// metadata files or a msgpack `checkpoint` file (or a folder of such folders) Orbax, a
/// `.msgpack` file of a msgpack map (`flax.serialization.to_bytes`) Orbax too, `.metadata` and `.distcp` files a torch
/// distributed checkpoint, a Hugging Face index of shards or one `model.safetensors` /
/// `pytorch_model.bin` those; a file by its first bytes (`GGUF`, (`TREEPACK`, numpy's
/// `\x93NUMPY`, a zip whose first entry is `<name>/data.pkl` (a `torch.save` checkpoint; torch's
/// legacy magic too), any other zip's `PK` (npz), HDF5's signature at 0 or past a user block, a
/// safetensors header's length and `{`). Anything else (a destination, a remote place, content that no
/// rule knows) is named by its extension, and is a treepack location without one it knows.
pub fn detect_format(path: &str, read: bool) -> &'static str {
    if read && !path.contains("://") {
        if let Some(found) = content_format(std::path::Path::new(path)) {
            return found;
        }
    }
    let name = path.trim_end_matches('/').rsplit('/').next().unwrap_or_default();
    let dots = name.len() - name.trim_start_matches('.').len();
    let Some(i) = name[dots..].rfind('.') else { return "treepack" };
    let ext = name[dots + i + 1..].to_ascii_lowercase();
    EXTENSIONS.iter().find(|(e, _)| *e == ext).map_or("treepack", |(_, f)| f)
}

/// Whether `path` is a file whose first byte begins a msgpack map (fixmap, map 16, map 32): what
/// `flax.serialization.to_bytes` writes, and an older Orbax checkpoint's aggregated `checkpoint`
/// file. (A TensorFlow checkpoint folder's `checkpoint` is text.)
fn msgpack_map(path: &std::path::Path) -> bool {
    use std::io::Read;
    let mut b = [0u8; 1];
    // (Not through a link: the reader refuses links, and a FIFO's open would block.)
    std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file())
        && std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut b)).is_ok()
        && matches!(b[0], 0x80..=0x8f | 0xde | 0xdf)
}

/// The format a local file or folder's content shows, if a rule of [`detect_format`] knows it.
pub(crate) fn content_format(path: &std::path::Path) -> Option<&'static str> {
    use std::io::{Read, Seek, SeekFrom};
    // treepack's own extension is taken at its word: every load of a `.tpk` asks, and reading its
    // head here would cost each a second open (a `.tpk` that is not one fails with its footer).
    if path.extension().is_some_and(|e| e == crate::store::SINGLE_FILE_EXT) {
        return Some("treepack");
    }
    const HDF5: &[u8; 8] = b"\x89HDF\r\n\x1a\n";
    let meta = std::fs::metadata(path).ok()?;
    if meta.is_dir() {
        if path.join(crate::store::MANIFEST_NAME).is_file() {
            return Some("treepack");
        }
        return folder_format(path);
    }
    if !meta.is_file() {
        return None; // (a FIFO would block the open below until someone wrote to it)
    }
    let mut f = std::fs::File::open(path).ok()?;
    let mut head = [0u8; 512];
    let mut n = 0;
    while n < head.len() {
        match f.read(&mut head[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(_) => return None,
        }
    }
    let head = &head[..n];
    if head.starts_with(crate::format::container::MAGIC) {
        return Some("treepack");
    }
    if head.starts_with(b"\x93NUMPY") {
        return Some("npy");
    }
    if head.starts_with(b"GGUF") {
        return Some("gguf");
    }
    if crate::foreign::torch::is_checkpoint(head) {
        return Some("torch");
    }
    if head.starts_with(b"PK\x03\x04") || head.starts_with(b"PK\x05\x06") {
        return Some("npz");
    }
    if head.starts_with(HDF5) {
        return Some("hdf5");
    }
    // flax.serialization's msgpack, by its extension and its first byte (a map).
    if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("msgpack"))
        && matches!(head.first(), Some(0x80..=0x8f | 0xde | 0xdf))
    {
        return Some("orbax");
    }
    if n >= 9 && head[8] == b'{' {
        let len = u64::from_le_bytes(head[..8].try_into().ok()?);
        if len.checked_add(8).is_some_and(|end| end <= meta.len()) {
            return Some("safetensors");
        }
    }
    // HDF5 after a user block: its signature at 512, 1024, 2048, … bytes.
    let mut at = 512u64;
    while at + 8 <= meta.len() && at <= 1 << 30 {
        let mut sig = [0u8; 8];
        if f.seek(SeekFrom::Start(at)).is_ok() && f.read_exact(&mut sig).is_ok() && &sig == HDF5 {
            return Some("hdf5");
        }
        at *= 2;
    }
    None
}

impl Format {
    fn python_only(path: &str, name: &str) -> Error {
        Error::BadLocation {
            location: path.to_string(),
            reason: format!(
                "{name:?}: the Rust core converts treepack and safetensors (and reads torch.save, GGUF and torch.distributed checkpoints); npz, npy, Zarr, HDF5, Orbax and JAX checkpoints go through the Python package: python -m treepack convert SRC DST (pip install treepack; docs/convert.md)"
            ),
        }
    }
}

/// How [`convert`] maps names and writes.
#[derive(Debug, Clone, Default)]
pub struct ConvertOptions {
    /// Splits a flat file's names into nested keys when it is read (`"."`: the tensor
    /// `layers.0.w` is `{"layers": {"0": {"w": …}}}`), and joins nested keys into names when one
    /// is written. `None` (the default): names are read as stored, flat — the tree a flat file
    /// holds — and nested keys are written joined by `"."`, the only way they fit a flat file.
    pub separator: Option<String>,
    /// Key-path globs, with the syntax and meaning of a load's `select` (docs/format.md section
    /// 6; a leading `?` marks a pattern that may match nothing): only what they select is
    /// converted, and a pattern that matches nothing is an error. Empty: everything. See
    /// [`selected_paths`].
    pub select: Vec<String>,
    /// How the treepack side is saved (`overwrite`, `compression`, `durable`, …); `overwrite`
    /// also applies to a safetensors destination.
    pub save: SaveOptions,
}

/// What a conversion did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConvertInfo {
    /// Tensors (arrays) converted.
    pub tensors: usize,
    /// Bytes of tensor data converted.
    pub bytes: u64,
    /// For a treepack destination, what its save wrote.
    pub saved: Option<SaveInfo>,
}

/// Convert `src` to `dst` (formats from `from`/`to` or the extensions: `.safetensors`, else a
/// treepack location).
///
/// # Errors
/// [`Error::InvalidTree`] naming the key path of what the target cannot hold (a string in
/// safetensors, a dtype it lacks), format errors of the source, storage errors.
pub fn convert(src: &Location, dst: &Location, from: Format, to: Format, opts: &ConvertOptions) -> Result<ConvertInfo> {
    match (from, to) {
        (Format::Safetensors, Format::Treepack) => {
            let (mut tree, metadata) = read_safetensors(src, opts.separator.as_deref())?;
            if let Some(keep) = selected_paths(&tree, &opts.select, src.display())? {
                tree = prune(tree, &mut String::new(), &keep);
            }
            let (tensors, bytes) = count_arrays(&tree);
            let save = SaveOptions { metadata: metadata.or(opts.save.metadata.clone()), ..opts.save.clone() };
            let saved = crate::save(&tree, dst, &save)?;
            Ok(ConvertInfo { tensors, bytes, saved: Some(saved) })
        }
        // A checkpoint's location reads as the tree it holds (crate::Location::parse).
        (Format::Checkpoint(_), Format::Treepack) => {
            let mut tree = crate::load(src.clone(), &crate::LoadOptions::default())?;
            if let Some(keep) = selected_paths(&tree, &opts.select, src.display())? {
                tree = prune(tree, &mut String::new(), &keep);
            }
            let (tensors, bytes) = count_arrays(&tree);
            let saved = crate::save(&tree, dst, &opts.save)?;
            Ok(ConvertInfo { tensors, bytes, saved: Some(saved) })
        }
        (Format::Treepack | Format::Checkpoint(_), Format::Safetensors) => {
            let r = Reader::open(src.clone())?;
            let keep = selected_paths(&r.manifest().root, &opts.select, src.display())?;
            write_safetensors(
                &r,
                dst,
                opts.separator.as_deref(),
                keep.as_ref(),
                opts.save.overwrite,
                opts.save.progress.clone(),
            )
        }
        (Format::Treepack, Format::Treepack) => Err(Error::BadLocation {
            location: dst.display().to_string(),
            reason: "both sides are treepack locations: copy with `treepack cp` (or convert to .safetensors)".into(),
        }),
        (_, Format::Checkpoint(name)) => Err(Error::BadLocation {
            location: dst.display().to_string(),
            reason: format!("treepack does not write {name} checkpoints"),
        }),
        (Format::Safetensors, Format::Safetensors) => Err(Error::BadLocation {
            location: dst.display().to_string(),
            reason: "both sides are safetensors files: nothing to convert".into(),
        }),
    }
}

/// What a conversion with `select` keeps of the tree `root`, as the key paths of the nodes kept:
/// - a place (a leaf, a ref, a record or custom node without children) that the selection
///   takes as a load's selection takes it — its path or an ancestor's matches a pattern, and a
///   kept ref keeps the object it names, wherever that is stored
///   ([`crate::read::close_selection`]);
/// - a container with something kept below it, or an empty one whose path is selected.
///
/// What is not kept is left out of the destination (an item left out of a list or a tuple
/// becomes `None` in a tree, so the others keep their index). `None` for an empty `select`:
/// everything. `file` names the source in the error.
///
/// # Errors
/// [`Error::KeyNotFound`] naming the patterns (not marked optional with a leading `?`) that
/// match nothing, as a load's; [`Error::BadKeyPath`] for a malformed pattern.
pub fn selected_paths<L>(root: &Tree<L>, select: &[String], file: &str) -> Result<Option<HashSet<String>>> {
    selected_paths_by(root, select, file, true)
}

/// [`selected_paths`], or with `close` false the key paths the patterns select themselves: not
/// the objects refs lead to, nor the whole custom nodes around what is selected (what a caller
/// that asks whether the user selected a place wants to know).
///
/// # Errors
/// As [`selected_paths`].
pub fn selected_paths_by<L>(
    root: &Tree<L>,
    select: &[String],
    file: &str,
    close: bool,
) -> Result<Option<HashSet<String>>> {
    if select.is_empty() {
        return Ok(None);
    }
    let unmatched = crate::read::unmatched_patterns(root, "", select)?;
    if !unmatched.is_empty() {
        return Err(Error::KeyNotFound {
            path: unmatched.join("`, `"),
            reason: format!(
                "select matches nothing in {file} (`treepack ls` or Python's `treepack.load_structure` lists its key paths; a pattern that may match \
                 nothing is written with a leading `?`, e.g. `?ema/**`)"
            ),
        });
    }
    let opts = crate::read::LoadOptions { select: select.to_vec(), ..Default::default() };
    let closed = if close { crate::read::close_selection(root, "", &opts)? } else { None };
    let sel = keypath::Selection::new(select)?;
    let mut keep = HashSet::new();
    mark_kept(root, &mut String::new(), &sel, closed.as_ref().and_then(|o| o.keep.as_ref()), &mut keep);
    Ok(Some(keep))
}

/// Whether `t` (at `path`) is kept; what is kept goes into `keep`. `places`: the places a
/// selection closed over refs keeps (`None`: those the patterns select).
fn mark_kept<L>(
    t: &Tree<L>,
    path: &mut String,
    sel: &keypath::Selection,
    places: Option<&HashSet<String>>,
    keep: &mut HashSet<String>,
) -> bool {
    let node = t.unshared();
    let selected = |path: &str| sel.selects_texts(&keypath::split(path).unwrap_or_default());
    let place = match node {
        Tree::Leaf(_) | Tree::Ref(_) => true,
        Tree::Record { fields: c, .. } | Tree::Custom { children: c, .. } => c.is_empty(),
        _ => false,
    };
    let kept = if place {
        places.map_or_else(|| selected(path), |p| p.contains(path.as_str()))
    } else {
        let children = node.children();
        let mut any = false;
        for (step, c) in &children {
            let len = path.len();
            if len > 0 {
                path.push('/');
            }
            keypath::push_step_text(path, step);
            any |= crate::format::model::grow(|| mark_kept(c, path, sel, places, keep));
            path.truncate(len);
        }
        any || (children.is_empty() && selected(path))
    };
    if kept {
        keep.insert(path.clone());
    }
    kept
}

/// `t` (at `path`) with what `keep` lacks left out: dict entries dropped, list and tuple items
/// `None` (the others keep their index). For the trees a conversion reads (dicts of arrays).
fn prune(t: Node, path: &mut String, keep: &HashSet<String>) -> Node {
    let below = |path: &mut String, step: Step<'_>, c: Node| -> Option<Node> {
        let len = path.len();
        if len > 0 {
            path.push('/');
        }
        keypath::push_step_text(path, &step);
        let out = keep.contains(path.as_str()).then(|| crate::format::model::grow(|| prune(c, path, keep)));
        path.truncate(len);
        out
    };
    let none = || Tree::Leaf(crate::format::model::Leaf::None);
    match t {
        Tree::Dict(v) => Tree::Dict(
            v.into_iter()
                .filter_map(|(k, c)| {
                    let c = below(path, Step::Key(&k), c)?;
                    Some((k, c))
                })
                .collect(),
        ),
        Tree::List(v) => Tree::List(
            v.into_iter().enumerate().map(|(i, c)| below(path, Step::Index(i), c).unwrap_or_else(none)).collect(),
        ),
        Tree::Tuple(v) => Tree::Tuple(
            v.into_iter().enumerate().map(|(i, c)| below(path, Step::Index(i), c).unwrap_or_else(none)).collect(),
        ),
        t => t,
    }
}

fn count_arrays(t: &Node) -> (usize, u64) {
    let (mut n, mut b) = (0, 0);
    t.for_each_leaf_unpathed(&mut |l| {
        if let crate::format::model::Leaf::Array(a) = l {
            n += 1;
            b += a.nbytes();
        }
    });
    (n, b)
}

fn bad_file(loc: &Location, reason: String) -> Error {
    Error::InvalidForeign { file: loc.display().to_string(), format: "safetensors".into(), reason }
}

/// Read a safetensors file as a tree: tensors as arrays viewing a memory map of the file (a
/// remote file is read whole), nested by `separator`; its `__metadata__` as JSON.
///
/// # Errors
/// [`Error::InvalidForeign`] for a damaged or hostile file (saying what is wrong),
/// [`Error::InvalidTree`] when names collide once nested (`a` and `a.b`: pass no separator).
pub fn read_safetensors(loc: &Location, separator: Option<&str>) -> Result<(Node, Option<serde_json::Value>)> {
    // The file itself, not the tree its location reads as (crate::Location::parse).
    let loc = &loc.place();
    // A folder of shards and their index (crate::foreign::sharded): one flat tree, then nested.
    if let Some(dir) = loc.local_path().filter(|p| p.is_dir()) {
        use crate::foreign::sharded;
        if let Some(found) = sharded::find(dir).filter(|f| f.weights() == sharded::Weights::Safetensors) {
            let (tree, metadata) = sharded::read(&found)?;
            return Ok((nest(tree, separator, loc)?, metadata));
        }
    }
    read_safetensors_file(loc, separator)
}

/// A flat dict of tensors by name nested at `separator` (the names split as
/// [`read_safetensors`] splits a file's).
fn nest(tree: Node, separator: Option<&str>, loc: &Location) -> Result<Node> {
    let Tree::Dict(items) = tree else { return Ok(tree) };
    if separator.is_none_or(|s| s.is_empty()) {
        return Ok(Tree::Dict(items));
    }
    let mut root = Builder::default();
    for (k, v) in items {
        let Key::Str(name) = k else {
            return Err(Error::invalid_tree(loc.display(), "a tensor name that is not a string"));
        };
        let parts = split_name(&name, separator).map_err(|detail| {
            Error::limit("tree depth", MAX_NAME_KEYS as u64, format!("{}: {detail}", loc.display()))
        })?;
        root.insert(&parts, v, &name)?;
    }
    Ok(root.finish())
}

/// [`read_safetensors`] of one file (`loc` the file itself).
pub(crate) fn read_safetensors_file(
    loc: &Location,
    separator: Option<&str>,
) -> Result<(Node, Option<serde_json::Value>)> {
    let bytes: Bytes = match loc.mmap(".")? {
        Some(b) => b,
        None => {
            loc.block_on(loc.get_opt(".", u64::MAX))?.ok_or_else(|| Error::no_tree(loc.display(), loc.display()))?
        }
    };
    let n = st::header_len(&bytes, bytes.len() as u64).map_err(|r| bad_file(loc, r))?;
    let header = st::parse_header(&bytes[8..8 + n as usize], bytes.len() as u64).map_err(|r| bad_file(loc, r))?;
    let mut root = Builder::default();
    for t in &header.tensors {
        let data = bytes.slice((header.data_start + t.begin) as usize..(header.data_start + t.end) as usize);
        let a = ArrayData::new(t.dtype.clone(), t.shape.clone(), data)?;
        let parts = split_name(&t.name, separator).map_err(|detail| {
            Error::limit("tree depth", MAX_NAME_KEYS as u64, format!("{}: {detail}", loc.display()))
        })?;
        root.insert(&parts, Node::from(a), &t.name)?;
    }
    let md = header.metadata.map(|m| serde_json::Value::Object(m.into_iter().map(|(k, v)| (k, v.into())).collect()));
    Ok((root.finish(), md))
}

/// The most keys a tensor name may split into: the tensor is then an array (a JSON object in
/// the manifest) inside `MAX_NAME_KEYS` dicts, the deepest tree readers accept.
pub const MAX_NAME_KEYS: usize = MAX_DEPTH - 1;

/// A tensor name split at `separator` into the keys it is nested under, at most
/// [`MAX_NAME_KEYS`] of them, refused before the tree is built: a 40 KB header whose name has
/// 20,000 dots would otherwise nest 20,000 dicts, deeper than building and dropping them can
/// recurse (and deeper than any reader accepts).
fn split_name<'n>(name: &'n str, separator: Option<&str>) -> std::result::Result<Vec<&'n str>, String> {
    let parts: Vec<&str> = match separator {
        Some(sep) if !sep.is_empty() => name.split(sep).take(MAX_NAME_KEYS + 1).collect(),
        _ => vec![name],
    };
    if parts.len() > MAX_NAME_KEYS {
        let shown: String = name.chars().take(40).collect();
        let more = if shown.len() < name.len() { format!("… ({} bytes)", name.len()) } else { String::new() };
        return Err(format!(
            "tensor {shown:?}{more} splits into more than {MAX_NAME_KEYS} nested keys at {:?}; convert with no separator (flat names)",
            separator.unwrap_or_default()
        ));
    }
    Ok(parts)
}

/// Nested dicts built from split names, in first-seen order.
#[derive(Default)]
struct Builder {
    items: Vec<(String, Slot)>,
    index: std::collections::HashMap<String, usize>,
}

enum Slot {
    Leaf(Node),
    Dict(Builder),
}

impl Builder {
    fn insert(&mut self, parts: &[&str], leaf: Node, name: &str) -> Result<()> {
        let collide = || {
            Error::invalid_tree(
                name,
                "this name and another one are a value and a group at once once split at the separator; convert with no separator (flat names)",
            )
        };
        let (first, rest) = parts.split_first().ok_or_else(collide)?;
        match self.index.get(*first).copied() {
            None => {
                let slot = if rest.is_empty() {
                    Slot::Leaf(leaf)
                } else {
                    let mut b = Builder::default();
                    // A name may nest MAX_NAME_KEYS keys deep (`split_name`): deeper than a
                    // thread's stack holds these frames in a debug build.
                    crate::format::model::grow(|| b.insert(rest, leaf, name))?;
                    Slot::Dict(b)
                };
                self.index.insert(first.to_string(), self.items.len());
                self.items.push((first.to_string(), slot));
                Ok(())
            }
            Some(i) => match (&mut self.items[i].1, rest.is_empty()) {
                (Slot::Dict(d), false) => crate::format::model::grow(|| d.insert(rest, leaf, name)),
                _ => Err(collide()),
            },
        }
    }

    fn finish(self) -> Node {
        Tree::Dict(
            self.items
                .into_iter()
                .map(|(k, s)| {
                    let v = match s {
                        Slot::Leaf(n) => n,
                        Slot::Dict(b) => crate::format::model::grow(|| b.finish()),
                    };
                    (Key::Str(k), v)
                })
                .collect(),
        )
    }
}

/// One place of a tree, as [`walk_places`] meets it.
enum Place<'a> {
    /// A leaf.
    Leaf(&'a Entry),
    /// A ref to the shared object with this id.
    Ref(u64),
    /// Where the shared object with this id begins (its node follows, at the same path).
    Shared(u64),
}

/// Every place of `t` in document order, with its steps: leaves, refs, and the beginning of
/// every shared object (which `for_each_leaf_steps` does not show).
fn walk_places<'a>(t: &'a Tree<Entry>, steps: &mut Vec<Step<'a>>, f: &mut dyn FnMut(&[Step<'a>], Place<'a>)) {
    match t {
        Tree::Leaf(e) => f(steps, Place::Leaf(e)),
        Tree::Ref(id) => f(steps, Place::Ref(*id)),
        Tree::Shared { id, node } => {
            f(steps, Place::Shared(*id));
            crate::format::model::grow(|| walk_places(node, steps, f));
        }
        _ => {
            for (step, c) in t.children() {
                if matches!(step, Step::Name(k) if crate::read::is_attrs_child(t, k)) {
                    // A mapping's attributes (a state dict's `_metadata`) are no leaves of the
                    // flat file: torch's and safetensors' own writers leave them out too.
                    continue;
                }
                steps.push(step);
                crate::format::model::grow(|| walk_places(c, steps, f));
                steps.pop();
            }
        }
    }
}

/// The flat name of a leaf: its key-path segments joined by `separator` (`"."` where none is
/// given: a nested tree written to a flat file needs its names joined somehow).
fn flat_name(steps: &[Step<'_>], separator: Option<&str>) -> std::result::Result<String, String> {
    let mut segs = Vec::with_capacity(steps.len());
    for s in steps {
        segs.push(match s {
            Step::Index(i) => i.to_string(),
            Step::Name(n) => n.to_string(),
            Step::Key(Key::Str(k)) => k.clone(),
            Step::Key(Key::Int(i)) => i.to_string(),
            Step::Key(k) => {
                return Err(format!("the key {} cannot be a tensor name", keypath::Segment::Key((*k).clone()).text()))
            }
        });
    }
    match separator {
        Some(sep) if !sep.is_empty() => Ok(segs.join(sep)),
        _ if segs.len() == 1 => Ok(segs.remove(0)),
        _ => Ok(segs.join(".")),
    }
}

/// Write the arrays of the tree `r` reads as a safetensors file at `dst`, one leaf at a time
/// (staged, then renamed into place), reporting tensor bytes written to `progress`. With
/// `keep` ([`selected_paths`]), only the leaves whose key paths it holds.
///
/// # Errors
/// [`Error::InvalidTree`] naming the first leaf safetensors cannot hold (anything but an array,
/// or a dtype it lacks), [`Error::AlreadyExists`] unless `overwrite`, storage errors.
pub fn write_safetensors(
    r: &Reader,
    dst: &Location,
    separator: Option<&str>,
    keep: Option<&HashSet<String>>,
    overwrite: bool,
    progress: Option<crate::progress::ProgressFn>,
) -> Result<ConvertInfo> {
    // The file itself, not the tree an existing file's location reads as (crate::Location::parse).
    let dst = &dst.place();
    let mut tensors: Vec<(String, DType, Vec<u64>)> = vec![];
    let mut paths: Vec<String> = vec![];
    let mut problem: Option<Error> = None;
    // Where each shared object begins, and the arrays by key path: a ref to an array is that
    // array again under the ref's name (safetensors has no links: an array held at n places
    // costs n times its bytes, no more); a ref to anything else is refused.
    let mut shared_at: std::collections::HashMap<u64, String> = std::collections::HashMap::new();
    let mut begins: HashSet<String> = HashSet::new();
    let mut arrays: std::collections::HashMap<String, (DType, Vec<u64>)> = std::collections::HashMap::new();
    walk_places(&r.manifest().root, &mut vec![], &mut |steps, place| {
        if problem.is_some() {
            return;
        }
        let path = keypath::steps_text(steps);
        if let Place::Shared(id) = place {
            begins.insert(path.clone());
            shared_at.insert(id, path);
            return;
        }
        if keep.is_some_and(|k| !k.contains(&path)) {
            return;
        }
        let e = match place {
            Place::Leaf(e) => e,
            Place::Ref(id) => {
                let target = shared_at.get(&id).cloned().unwrap_or_default();
                match (arrays.get(&target), flat_name(steps, separator)) {
                    (Some((dtype, shape)), Ok(name)) => {
                        tensors.push((name, dtype.clone(), shape.clone()));
                        paths.push(target);
                    }
                    (Some(_), Err(why)) => problem = Some(Error::invalid_tree(path, why)),
                    (None, _) => {
                        problem = Some(Error::invalid_tree(
                            path,
                            format!("holds the object at `{target}` again; safetensors has no links and holds only arrays: leave one of the two places out (select) or keep this tree in treepack"),
                        ))
                    }
                }
                return;
            }
            Place::Shared(_) => return,
        };
        match e {
            Entry::Array(a) if st::dtype_name(&a.dtype).is_some() => match flat_name(steps, separator) {
                Ok(name) => {
                    tensors.push((name, a.dtype.clone(), a.shape.clone()));
                    if begins.contains(&path) {
                        arrays.insert(path.clone(), (a.dtype.clone(), a.shape.clone()));
                    }
                    paths.push(path);
                }
                Err(why) => problem = Some(Error::invalid_tree(path, why)),
            },
            Entry::Array(a) => {
                problem = Some(Error::invalid_tree(
                    path,
                    format!("safetensors has no {} dtype (it has bool, int8-64, uint8-64, float16, bfloat16, float32, float64, float8_e4m3fn, float8_e5m2, float8_e8m0fnu; its F4 and F6 types pack several values into a byte, where treepack stores one per byte)", a.dtype.display()),
                ))
            }
            other => {
                problem = Some(Error::invalid_tree(
                    path,
                    format!("a {} cannot be stored in safetensors, which holds only arrays; leave it out (select) or keep this tree in treepack", other.kind()),
                ))
            }
        }
    });
    if let Some(e) = problem {
        return Err(e);
    }
    let mut seen = std::collections::HashSet::new();
    for (name, ..) in &tensors {
        if !seen.insert(name.as_str()) {
            return Err(Error::invalid_tree(
                name.clone(),
                "two leaves get this tensor name; convert with another separator",
            ));
        }
    }
    let metadata: Option<BTreeMap<String, String>> =
        r.manifest().metadata.as_ref().and_then(|m| m.as_object()).map(|m| {
            m.iter().map(|(k, v)| (k.clone(), v.as_str().map_or_else(|| v.to_string(), str::to_string))).collect()
        });
    let (head, offsets) = st::write_header(&tensors, metadata.as_ref()).map_err(|r| Error::invalid_tree("", r))?;
    let Some(local) = dst.local() else {
        return Err(Error::BadLocation {
            location: dst.display().to_string(),
            reason: "safetensors files are written to local paths (copy the file to an object store after)".into(),
        });
    };
    // Written through its folder's descriptor (treepack-store's local/beneath.rs): the folder is
    // the user's path, the file is a name in it, and neither the file nor its staging name is
    // followed if it is a link.
    // Each array is read into one reused buffer (fresh memory for every array cost more than
    // the write), checked against its chunk hashes unless the tree is another tool's file read
    // into memory: its hashes were made from these very bytes moments ago.
    let verify = r.location().read_from().is_none();
    let bytes = local.write_file(dst.display(), overwrite, |f| {
        f.write_all(&head)?;
        let mut total = 0u64;
        let tracker = crate::progress::Tracker::new(progress, offsets.last().map_or(0, |o| o.1));
        let mut buf: Vec<u8> = Vec::new();
        for (p, (begin, end)) in paths.iter().zip(&offsets) {
            let n = usize::try_from(end - begin).map_err(|_| Error::invalid_tree(p.clone(), "too big for memory"))?;
            if buf.len() < n {
                drop(std::mem::take(&mut buf)); // (freed before the bigger one is made)
                buf = crate::format::codec::zeroed(n as u64)
                    .map_err(|_| Error::OutOfMemory { key: p.clone(), bytes: n as u64 })?;
            }
            r.location().block_on(r.read_into_async(p, &mut buf[..n], verify))?;
            f.write_all(&buf[..n])?;
            total += end - begin;
            tracker.advance(end - begin);
        }
        Ok(total)
    })?;
    Ok(ConvertInfo { tensors: tensors.len(), bytes, saved: None })
}
