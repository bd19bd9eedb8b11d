//! `torch.distributed.checkpoint` (DCP) folders read as trees, without pickle (issue 54).
//!
//! `torch.distributed.checkpoint.save(state_dict, checkpoint_id=DIR)` writes `DIR/.metadata`
//! (a pickled `Metadata`) and `__<rank>_<n>.distcp` data files. The metadata lists every entry
//! of the flattened state_dict by its fully qualified name (`model.w`,
//! `optim.state.0.weight.exp_avg`, ...): a tensor with its dtype, size and the chunks it was
//! saved in (one per rank that held a piece of it), or any other value as one `torch.save`d
//! object; `storage_data` says where in which file each chunk's and object's bytes are. With
//! the default serialization (`TORCH_SAVE`) each such range is a whole `torch.save` zip.
//!
//! The folder reads as a flat dict keyed by those names, in the metadata's order (flat where
//! the source is flat, as a safetensors file reads): each tensor assembled from its chunks as
//! an array annotated as a torch tensor, each object the tree its `torch.save` holds.
//!
//! Who controls which bytes: the checkpoint's author controls the folder's files — the
//! metadata (every name, size, chunk, file name, offset and length) and the data files. The
//! metadata is parsed by [`format::pickle::dcp`](crate::format::pickle::dcp) under DCP's own
//! allow-list (its dataclasses read as records; nothing imported or run); each range by
//! [`super::torch`]'s reader (torch's list). Every file named must be a plain file name of a
//! regular file in the folder (no `/`, `..`, or link); ranges must lie inside their files and not
//! overlap one another; every tensor's chunks must lie inside it and tile it exactly (no gap,
//! no overlap), each chunk's saved tensor having the chunk's dtype and size; a tensor may not
//! claim more bytes than its chunks' ranges hold, so nothing is allocated beyond what the
//! files hold. Transforms (DCP's compression extensions) and the `SAFETENSORS` serialization
//! are refused by name.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use bytes::Bytes;

use crate::format::dtype::DType;
use crate::format::model::{ArrayData, Key, Leaf, Tree};
use crate::format::pickle::dcp::{self as dm, Chunk, Entry, Index, StorageInfo, TensorMeta};
use crate::format::pickle::Limits;
use crate::{Error, Node, Result};

/// The largest `.metadata` read (it describes the chunks; their bytes are elsewhere).
pub const MAX_METADATA_BYTES: u64 = 1 << 30;

/// What messages call the format.
const FORMAT: &str = "torch.distributed checkpoint";

/// Why a DCP folder's location refuses writes.
pub(crate) const READ_ONLY: &str =
    "a torch.distributed checkpoint folder is read as a tree but not written to as one: save \
                         to another directory or a .tpk (`treepack cp CHECKPOINT DST` stores its tree)";

fn bad(file: &Path, reason: impl Into<String>) -> Error {
    Error::InvalidForeign { file: file.display().to_string(), format: FORMAT.into(), reason: reason.into() }
}

/// The tree of the DCP checkpoint in `dir` as a read-only location in memory, shown as
/// `display`: every reader (load, selections, structure, `inspect`, `ls`, `cat`, verify,
/// convert) then works on it as on a treepack tree. The tensors are read once, here.
///
/// # Errors
/// As [`read`].
pub fn open_location(dir: &Path, display: &str) -> Result<crate::Location> {
    let (tree, metadata) = read(dir)?;
    let place = crate::store::Location::parse(&dir.to_string_lossy())?;
    crate::Location::read_into_memory(&tree, metadata, display, READ_ONLY, "torch.distributed checkpoint", place)
}

/// Read the DCP checkpoint in `dir`: a flat dict of every entry of its metadata, tensors as
/// arrays annotated `torch.Tensor`, other values as their `torch.save`d trees; and metadata
/// (`"format": "pt"`, the DCP version) for the tree.
///
/// # Errors
/// [`Error::Pickle`] for a `.metadata` the pickle reader refuses (naming the global and where);
/// [`Error::InvalidForeign`] for metadata that does not describe its files (a file outside the
/// folder, a range outside its file or over another, chunks that do not tile their tensor, a
/// chunk of another dtype or size, transforms, another serialization); [`Error::Link`] for a
/// `.metadata` or data file that is a link; the chunks' own reading errors
/// ([`super::torch::read_bytes`]); [`Error::NotFound`], [`Error::Io`], [`Error::OutOfMemory`].
pub fn read(dir: &Path) -> Result<(Node, Option<serde_json::Value>)> {
    let meta_path = dir.join(".metadata");
    let size = regular_file(&meta_path)?;
    if size > MAX_METADATA_BYTES {
        return Err(Error::limit(
            ".metadata size",
            MAX_METADATA_BYTES,
            format!("{}: {size} bytes", meta_path.display()),
        ));
    }
    let md = {
        let bytes = super::map_file(&meta_path, FORMAT)?;
        dm::read(&bytes, &Limits::default())
            .map_err(|e| Error::Pickle { file: meta_path.display().to_string(), source: e })?
    };
    let files = Files::open(dir, &meta_path, &md.storage)?;
    let mut items: Vec<(String, Node)> = Vec::with_capacity(md.entries.len());
    let mut next_storage = 0;
    for (fqn, entry) in &md.entries {
        match entry {
            Entry::Bytes => {
                let (bytes, shown) = files.range(&Index { fqn: fqn.clone(), offset: None }, fqn)?;
                let node = super::torch::read_bytes(bytes, &shown)?;
                // Tensors sharing a storage are numbered per torch.save; keep each object's apart.
                let mut one = vec![(fqn.clone(), node)];
                next_storage = super::sharded::renumber_storages(&mut one, next_storage)?;
                items.extend(one);
            }
            Entry::Tensor(t) => items.push((fqn.clone(), Tree::Leaf(Leaf::Array(tensor(&files, fqn, t)?)))),
        }
    }
    let mut metadata = serde_json::Map::new();
    metadata.insert("format".into(), "pt".into());
    if let Some(v) = &md.version {
        metadata.insert("dcp_version".into(), v.clone().into());
    }
    let tree = Tree::Dict(items.into_iter().map(|(k, v)| (Key::Str(k), v)).collect());
    Ok((tree, Some(serde_json::Value::Object(metadata))))
}

/// The size of the regular file at `path`, refusing a link or anything else.
fn regular_file(path: &Path) -> Result<u64> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => Err(Error::Link {
            path: path.to_path_buf(),
            fix: "a torch.distributed checkpoint is read from its folder: put the file itself there, not a link".into(),
        }),
        Ok(m) if m.is_file() => Ok(m.len()),
        Ok(_) => Err(bad(path, "not a regular file")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(Error::NotFound { location: path.display().to_string(), detail: "no such file".into() })
        }
        Err(e) => Err(Error::Io { path: path.to_path_buf(), source: e }),
    }
}

/// Whether `name` is a plain file name: one path segment, not `.`/`..`, no separator or NUL.
fn plain_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains(['/', '\\', '\0'])
        && Path::new(name).file_name().is_some_and(|f| f == name)
}

/// The data files of a checkpoint, mapped, and where each item's bytes are in them.
struct Files<'a> {
    dir: &'a Path,
    data: HashMap<&'a str, Bytes>,
    at: HashMap<&'a Index, &'a StorageInfo>,
}

impl<'a> Files<'a> {
    /// Check every `storage_data` entry against the folder and open the files they name: plain
    /// names of regular files in `dir`, no transforms, each range inside its file and apart
    /// from every other range.
    fn open(dir: &'a Path, meta_path: &Path, storage: &'a [(Index, StorageInfo)]) -> Result<Files<'a>> {
        let mut at = HashMap::with_capacity(storage.len());
        let mut ranges: BTreeMap<&str, Vec<(u64, u64, &str)>> = BTreeMap::new();
        for (index, info) in storage {
            let name = info.relative_path.as_str();
            let fqn = index.fqn.as_str();
            if !plain_name(name) {
                return Err(bad(
                    meta_path,
                    format!(
                        "`{fqn}` names the file {:?}, not a file of the checkpoint's folder (a plain name)",
                        name.chars().take(200).collect::<String>()
                    ),
                ));
            }
            if !info.transform_descriptors.is_empty() {
                return Err(bad(
                    meta_path,
                    format!(
                        "`{fqn}` was saved through the stream transforms {:?} (DCP's compression extensions), \
                         which are not read: save without extensions",
                        info.transform_descriptors
                    ),
                ));
            }
            let end = info.offset.checked_add(info.length).ok_or_else(|| {
                bad(meta_path, format!("`{fqn}`: {} bytes at {} overflow 64 bits", info.length, info.offset))
            })?;
            ranges.entry(name).or_default().push((info.offset, end, fqn));
            if at.insert(index, info).is_some() {
                return Err(bad(meta_path, format!("`{fqn}` has the same storage_data key twice")));
            }
        }
        let mut data = HashMap::with_capacity(ranges.len());
        for (name, mut rs) in ranges {
            let path = dir.join(name);
            regular_file(&path)?;
            let bytes = super::map_file(&path, FORMAT)?;
            rs.sort_unstable();
            for (i, &(start, end, fqn)) in rs.iter().enumerate() {
                if end > bytes.len() as u64 {
                    return Err(bad(
                        &path,
                        format!(
                            "`{fqn}`: {} bytes at {start} lie past the end of the file ({} bytes; truncated, or the \
                             metadata lies)",
                            end - start,
                            bytes.len()
                        ),
                    ));
                }
                if let Some(&(next, _, other)) = rs.get(i + 1) {
                    if next < end {
                        return Err(bad(
                            &path,
                            format!("the bytes of `{fqn}` ({start}..{end}) and of `{other}` (from {next}) overlap"),
                        ));
                    }
                }
            }
            data.insert(name, bytes);
        }
        Ok(Files { dir, data, at })
    }

    /// Where the item `index` (of entry `fqn`) is.
    fn info(&self, index: &Index, fqn: &str) -> Result<&'a StorageInfo> {
        self.at.get(index).copied().ok_or_else(|| {
            let what = match &index.offset {
                None => String::new(),
                Some(o) => format!(" (its chunk at {o:?})"),
            };
            bad(
                &self.dir.join(".metadata"),
                format!("`{fqn}`{what} has no storage_data entry: where its bytes are is not said"),
            )
        })
    }

    /// The bytes of the item `index` (of entry `fqn`), and how messages show them.
    fn range(&self, index: &Index, fqn: &str) -> Result<(Bytes, String)> {
        let info = self.info(index, fqn)?;
        let name = info.relative_path.as_str();
        let file = self.data.get(name).ok_or_else(|| bad(&self.dir.join(name), "not opened"))?;
        // Checked against the file when it was opened.
        let (start, end) = (info.offset as usize, (info.offset + info.length) as usize);
        let bytes = file.slice(start..end);
        let shown = format!("{} (`{fqn}`, {} bytes at {start})", self.dir.join(name).display(), info.length);
        if !bytes.starts_with(b"PK\x03\x04") {
            return Err(bad(
                &self.dir.join(name),
                format!(
                    "the bytes of `{fqn}` ({} at {start}) are not a torch.save zip: only checkpoints saved with DCP's \
                     default serialization (TORCH_SAVE) are read, not serialization_format=SAFETENSORS",
                    info.length
                ),
            ));
        }
        Ok((bytes, shown))
    }
}

/// A tensor assembled from its chunks, annotated as a torch tensor.
fn tensor(files: &Files, fqn: &str, t: &TensorMeta) -> Result<ArrayData> {
    let meta = files.dir.join(".metadata");
    let item = t.dtype.itemsize();
    if t.size.len() > 64 {
        return Err(bad(&meta, format!("`{fqn}` has {} dimensions (at most 64)", t.size.len())));
    }
    let numel = t.size.iter().try_fold(1u64, |a, &n| a.checked_mul(n));
    let Some((numel, nbytes)) = numel.and_then(|n| Some((n, n.checked_mul(item)?))) else {
        return Err(bad(&meta, format!("`{fqn}`: size {:?} overflows 64 bits", t.size)));
    };
    // Every chunk inside the tensor; their volumes add up to the tensor's.
    let mut covered = 0u64;
    let mut claimed = 0u64;
    for c in &t.chunks {
        check_chunk(&meta, fqn, &t.size, c)?;
        // In bounds, so no overflow.
        covered = covered.saturating_add(c.sizes.iter().product::<u64>());
        claimed = claimed.saturating_add(files.info(&chunk_index(fqn, c), fqn)?.length);
    }
    if covered != numel {
        return Err(bad(
            &meta,
            format!(
                "the {} chunks of `{fqn}` cover {covered} elements of its {numel} (size {:?}): they must tile it \
                 exactly",
                t.chunks.len(),
                t.size
            ),
        ));
    }
    // Nothing is allocated beyond what the files hold.
    if nbytes > claimed && numel > 0 {
        return Err(bad(
            &meta,
            format!("`{fqn}` claims {nbytes} bytes, more than the {claimed} bytes its chunks' ranges hold"),
        ));
    }
    let mut pieces = Vec::with_capacity(t.chunks.len());
    for c in &t.chunks {
        let (bytes, shown) = files.range(&chunk_index(fqn, c), fqn)?;
        let a = match super::torch::read_bytes(bytes, &shown)? {
            Tree::Leaf(Leaf::Array(a)) => a,
            other => {
                return Err(bad(
                    &files.dir.join(".metadata"),
                    format!("a chunk of `{fqn}` holds a {}, not a tensor", other.container_kind()),
                ))
            }
        };
        if *a.dtype() != t.dtype || a.shape() != c.sizes.as_slice() {
            return Err(bad(
                &meta,
                format!(
                    "the chunk of `{fqn}` at {:?} holds a {} tensor of size {:?}, where the metadata says {} of {:?}",
                    c.offsets,
                    torch_name(a.dtype()),
                    a.shape(),
                    torch_name(&t.dtype),
                    c.sizes
                ),
            ));
        }
        pieces.push((c, a.into_parts().2));
    }
    let annotation = Some(serde_json::json!({"type": "torch.Tensor"}));
    // One chunk that is the whole tensor: its bytes as they are (a view of the file).
    if let [(c, bytes)] = pieces.as_slice() {
        if c.sizes == t.size {
            return ArrayData::new(t.dtype.clone(), t.size.clone(), bytes.clone())?.with_annotation(annotation);
        }
    }
    let out = assemble(&meta, fqn, &t.size, item, numel, nbytes, &pieces)?;
    ArrayData::new(t.dtype.clone(), t.size.clone(), out)?.with_annotation(annotation)
}

fn chunk_index(fqn: &str, c: &Chunk) -> Index {
    Index { fqn: fqn.to_string(), offset: Some(c.offsets.clone()) }
}

fn torch_name(d: &DType) -> &'static str {
    super::torch::torch_dtype_name(d)
}

/// A chunk's rank is the tensor's, and it lies inside the tensor.
fn check_chunk(meta: &Path, fqn: &str, size: &[u64], c: &Chunk) -> Result<()> {
    if c.offsets.len() != size.len() || c.sizes.len() != size.len() {
        return Err(bad(
            meta,
            format!(
                "a chunk of `{fqn}` at {:?} of size {:?} does not have the tensor's {} dimensions",
                c.offsets,
                c.sizes,
                size.len()
            ),
        ));
    }
    for ((&o, &s), &n) in c.offsets.iter().zip(&c.sizes).zip(size) {
        if o.checked_add(s).is_none_or(|end| end > n) {
            return Err(bad(
                meta,
                format!(
                    "the chunk of `{fqn}` at {:?} of size {:?} reaches outside its size {size:?}",
                    c.offsets, c.sizes
                ),
            ));
        }
    }
    Ok(())
}

/// The tensor of `size` with each chunk's C-order bytes placed at its offsets; an element
/// written twice is refused (the chunks' volumes add up to the tensor's, so with no overlap
/// there is no gap either).
fn assemble(
    meta: &Path,
    fqn: &str,
    size: &[u64],
    item: u64,
    numel: u64,
    nbytes: u64,
    pieces: &[(&Chunk, Bytes)],
) -> Result<Vec<u8>> {
    let oom = |bytes: u64| Error::OutOfMemory { key: fqn.to_string(), bytes };
    let n = usize::try_from(nbytes).map_err(|_| oom(nbytes))?;
    let mut out = Vec::new();
    out.try_reserve_exact(n).map_err(|_| oom(nbytes))?;
    out.resize(n, 0);
    let mut seen = Coverage::new(numel).ok_or_else(|| oom(numel / 8))?;
    let rank = size.len();
    // Elements between consecutive indexes of each dimension of the whole tensor.
    let mut stride = vec![1u64; rank];
    for d in (0..rank.saturating_sub(1)).rev() {
        stride[d] = stride[d + 1] * size[d + 1];
    }
    let item = item as usize;
    for (c, bytes) in pieces {
        // Runs along the last dimension: each is contiguous in the chunk and in the tensor.
        let run = c.sizes.last().copied().unwrap_or(1);
        if run == 0 || c.sizes.contains(&0) {
            continue;
        }
        let outer = &c.sizes[..rank.saturating_sub(1)];
        let runs: u64 = outer.iter().product();
        let mut idx = vec![0u64; outer.len()];
        let mut src = 0usize;
        for _ in 0..runs {
            let at = idx.iter().zip(&c.offsets).zip(&stride).map(|((&i, &o), &s)| (i + o) * s).sum::<u64>()
                + c.offsets.last().copied().unwrap_or(0);
            if !seen.mark(at, run) {
                return Err(bad(meta, format!("the chunk of `{fqn}` at {:?} overlaps another chunk of it", c.offsets)));
            }
            let len = run as usize * item;
            let dst = at as usize * item;
            out[dst..dst + len].copy_from_slice(&bytes[src..src + len]);
            src += len;
            // The next run: the last outer dimension fastest.
            for d in (0..outer.len()).rev() {
                idx[d] += 1;
                if idx[d] < outer[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
    }
    Ok(out)
}

/// Which elements of a tensor a chunk has written, one bit each.
struct Coverage(Vec<u64>);

impl Coverage {
    fn new(n: u64) -> Option<Coverage> {
        let words = usize::try_from(n.div_ceil(64)).ok()?;
        let mut v = Vec::new();
        v.try_reserve_exact(words).ok()?;
        v.resize(words, 0);
        Some(Coverage(v))
    }

    /// Mark elements `start..start + len`; `false` if one was marked before.
    fn mark(&mut self, start: u64, len: u64) -> bool {
        let mut i = start;
        let end = start + len;
        while i < end {
            let w = (i / 64) as usize;
            let bit = i % 64;
            let take = (64 - bit).min(end - i);
            let mask = if take == 64 { u64::MAX } else { ((1u64 << take) - 1) << bit };
            if self.0[w] & mask != 0 {
                return false;
            }
            self.0[w] |= mask;
            i += take;
        }
        true
    }
}
