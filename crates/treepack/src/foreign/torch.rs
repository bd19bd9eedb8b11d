//! `torch.save` checkpoints (zip format, torch ≥ 1.6) read as treepack trees, without pickle.
//!
//! A checkpoint is a zip of `<archive>/data.pkl` (the pickled structure), `<archive>/data/<key>`
//! (one entry per storage, stored uncompressed), `<archive>/byteorder` and `<archive>/version`.
//! The zip's central directory is read with the `zip` crate; every entry this reader uses must
//! be stored (not compressed), have a name without `..`, `/`-rooted or `\` segments, and lie
//! inside the file; its bytes are then sliced from the file's bytes: a private memory map of
//! the file, opened without following a link (its bytes read once where it cannot be mapped),
//! or a range of another file's (a chunk of a torch.distributed checkpoint, [`read_bytes`]).
//! The pickle is read by
//! [`format::pickle::torch`](crate::format::pickle::torch) (allow-listed globals as data, nothing
//! imported or run); tensors become arrays read from their storages: a tensor alone on its
//! storage and contiguous reads just its bytes; a storage several tensors view is read once and
//! shared (contiguous views are slices of it, others copied by their strides). Big-endian
//! checkpoints (`byteorder` = `big`) are swapped to treepack's little-endian.
//!
//! The legacy format (torch < 1.6: a bare pickle stream, or a tar) is refused with a message
//! saying how to re-save it.

use crate::format::dtype::DType;
use crate::format::model::{ArrayData, Leaf, Node, Tree};
use crate::format::pickle::torch::{self as tp, Checkpoint, Item, TensorRef};
use crate::format::pickle::Limits;
use crate::{Error, Result};
use bytes::Bytes;
use std::collections::HashMap;
use std::path::Path;

/// The largest `data.pkl` read (a pickle describes tensors; their bytes are elsewhere).
pub const MAX_PICKLE_BYTES: u64 = 1 << 30;

/// What the first bytes of a file say it is, as far as torch goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sniffed {
    /// A zip: possibly a `torch.save` checkpoint ([`read`] says for sure).
    Zip,
    /// A bare pickle stream or a tar: torch's legacy (pre-1.6) format, which is refused.
    Legacy,
    /// Neither.
    Other,
}

/// What `head` (the first bytes of a file, 512 are enough) looks like.
pub fn sniff(head: &[u8]) -> Sniffed {
    if head.starts_with(b"PK\x03\x04") || head.starts_with(b"PK\x05\x06") {
        Sniffed::Zip
    } else if (head.len() >= 2 && head[0] == 0x80 && head[1] <= 5) || head.get(257..262) == Some(b"ustar") {
        // A bare pickle (torch < 1.6 wrote a magic number, then pickles), or a tar (older still).
        Sniffed::Legacy
    } else {
        Sniffed::Other
    }
}

/// torch's legacy (pre-1.6) files begin with this pickled magic number (`LONG1` of
/// 0x1950a86a20f9469cfc6c after protocol 2).
const LEGACY_MAGIC: [u8; 14] = [0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19];

/// Whether `head` (a file's first bytes; 512 are enough) is a `torch.save` checkpoint: a zip
/// whose first entry is `<name>/data.pkl` (torch writes that entry first; an `.npz` or any
/// other zip begins otherwise), or torch's legacy magic number (read as such only to be
/// refused with its own message). The rule [`crate::convert::detect_format`] and location
/// strings use.
pub fn is_checkpoint(head: &[u8]) -> bool {
    if head.starts_with(&LEGACY_MAGIC) {
        return true;
    }
    if !head.starts_with(b"PK\x03\x04") || head.len() < 30 {
        return false;
    }
    let name_len = usize::from(u16::from_le_bytes([head[26], head[27]]));
    head.get(30..30 + name_len)
        .and_then(|n| n.strip_suffix(b"/data.pkl"))
        .is_some_and(|prefix| !prefix.is_empty() && !prefix.contains(&b'/'))
}

/// The tree of the checkpoint at `path` as a read-only location in memory, shown as `display`:
/// every reader (load, selections, structure, `inspect`, `ls`, `cat`, verify, convert) then
/// works on it as on a treepack tree. The tensors are read once, here.
///
/// # Errors
/// As [`read`].
pub fn open_location(path: &Path, display: &str) -> Result<crate::Location> {
    let file = crate::store::Location::parse(&path.to_string_lossy())?;
    crate::Location::read_into_memory(&read(path)?, None, display, DOCUMENT_READ_ONLY, "torch.save checkpoint", file)
}

/// Why a checkpoint's location refuses writes.
pub(crate) const DOCUMENT_READ_ONLY: &str =
    "a torch.save checkpoint is read as a tree but not written to; save to a directory or a \
                                  .tpk (`treepack cp CHECKPOINT DST` stores its tree)";

/// A checkpoint's structure, read without tensor bytes: the tree with each tensor described
/// (storage key, dtype, shape, strides, offset), and the storages, each checked to be in the zip
/// with the right size.
#[derive(Debug, Clone)]
pub struct Structure {
    /// The pickled structure; tensors as [`Item::Tensor`].
    pub tree: Tree<Item>,
    /// Storages by key.
    pub storages: std::collections::BTreeMap<String, tp::StorageInfo>,
    /// `true` when the checkpoint was written big-endian.
    pub big_endian: bool,
}

/// Read a `torch.save` checkpoint as a tree: its dicts, lists, tuples and values as they are,
/// tensors as arrays annotated `torch.Tensor` / `torch.nn.Parameter` (as treepack's torch
/// integration saves them).
///
/// # Errors
/// [`Error::Pickle`] for a pickle the reader refuses (naming the global and key path);
/// [`Error::InvalidForeign`] for a damaged, legacy or compressed checkpoint;
/// [`Error::Link`] if `path` is a symbolic link; [`Error::NotFound`], [`Error::Io`],
/// [`Error::OutOfMemory`].
pub fn read(path: impl AsRef<Path>) -> Result<Node> {
    let c = Opened::open(path.as_ref())?;
    let s = c.structure(false)?;
    c.materialise(&s)
}

/// Read a `torch.save` checkpoint as [`read`] does, except that each object its pickle builds
/// from a global outside the allow-list is a placeholder instead of an error: a custom node of
/// type `pickle:<module.name>` (a name no treepack type has, so it is never built: Python's
/// `on_missing="placeholder"` gives a `treepack.Unloadable` for it) whose data says why
/// ([`format::pickle::torch::read_placeholders`](crate::format::pickle::torch::read_placeholders)).
/// Nothing named by the file is imported or run; every other check is as in [`read`].
///
/// # Errors
/// As [`read`], less refused globals (but for one used as a dict key).
pub fn read_placeholders(path: impl AsRef<Path>) -> Result<Node> {
    let c = Opened::open(path.as_ref())?;
    let s = c.structure(true)?;
    c.materialise(&s)
}

/// [`open_location`] over [`read_placeholders`]'s tree.
///
/// # Errors
/// As [`read_placeholders`].
pub fn open_location_placeholders(path: &Path, display: &str) -> Result<crate::Location> {
    let file = crate::store::Location::parse(&path.to_string_lossy())?;
    let tree = read_placeholders(path)?;
    crate::Location::read_into_memory(&tree, None, display, DOCUMENT_READ_ONLY, "torch.save checkpoint", file)
}

/// Read a `torch.save` checkpoint held in `data` (a whole file, or a range of one: each chunk
/// of a torch.distributed checkpoint is one), shown as `shown` in messages, as [`read`] reads a
/// file. Tensors are views of `data` where they can be.
///
/// # Errors
/// As [`read`].
pub fn read_bytes(data: Bytes, shown: &str) -> Result<Node> {
    let c = Opened::from_bytes(data, shown.to_string())?;
    let s = c.structure(false)?;
    c.materialise(&s)
}

/// Read only a checkpoint's structure (names, dtypes, shapes), no tensor bytes.
///
/// # Errors
/// As [`read`].
pub fn read_structure(path: impl AsRef<Path>) -> Result<Structure> {
    Opened::open(path.as_ref())?.structure(false)
}

/// One zip entry this reader may use.
#[derive(Debug, Clone, Copy)]
struct Entry {
    start: u64,
    size: u64,
}

struct Opened {
    /// The checkpoint's bytes: the file mapped copy-on-write (tensors are then views of it,
    /// with no copy), or a range of a file (a chunk of a DCP checkpoint).
    data: Bytes,
    shown: String,
    prefix: String,
    entries: HashMap<String, Result<Entry, String>>,
}

impl Opened {
    fn bad(&self, reason: impl Into<String>) -> Error {
        bad(&self.shown, reason)
    }

    fn open(path: &Path) -> Result<Opened> {
        Opened::from_bytes(super::map_file(path, "PyTorch checkpoint")?, path.display().to_string())
    }

    /// A checkpoint whose bytes are `data` (a whole file, or a range of one), shown as `shown`.
    fn from_bytes(data: Bytes, shown: String) -> Result<Opened> {
        match sniff(&data[..data.len().min(512)]) {
            Sniffed::Zip => {}
            Sniffed::Legacy => {
                return Err(bad(
                    &shown,
                    "legacy torch.save format (torch < 1.6: a bare pickle or a tar, not a zip), which is not read; \
                     re-save it with torch >= 1.6 (torch.save(torch.load(f, weights_only=True), new_file)) where you trust it",
                ))
            }
            Sniffed::Other => return Err(bad(&shown, "not a zip: a torch.save checkpoint (torch >= 1.6) is a zip")),
        }
        let entries = zip_entries(&data).map_err(|r| bad(&shown, r))?;
        // The archive's folder: the one `<name>/data.pkl` in the zip.
        let mut pkls = entries.keys().filter_map(|k| k.strip_suffix("/data.pkl")).filter(|p| !p.contains('/'));
        let prefix = match (pkls.next(), pkls.next()) {
            (Some(p), None) => p.to_string(),
            (None, _) => return Err(bad(&shown, "a zip without `<name>/data.pkl`: not a torch.save checkpoint")),
            (Some(_), Some(_)) => {
                return Err(bad(&shown, "a zip with several `<name>/data.pkl`: not one torch.save checkpoint"))
            }
        };
        Ok(Opened { data, shown, prefix, entries })
    }

    fn entry(&self, name: &str) -> Result<Option<Entry>> {
        match self.entries.get(&format!("{}/{name}", self.prefix)) {
            None => Ok(None),
            Some(Ok(e)) => Ok(Some(*e)),
            Some(Err(r)) => Err(self.bad(format!("entry `{}/{name}`: {r}", self.prefix))),
        }
    }

    fn read_range(&self, e: Entry, offset: u64, len: u64, what: &str) -> Result<Bytes> {
        if offset.checked_add(len).is_none_or(|end| end > e.size) {
            return Err(self.bad(format!("{what}: {len} bytes at {offset} lie outside its {} bytes", e.size)));
        }
        let start = e.start.checked_add(offset).and_then(|s| usize::try_from(s).ok());
        let n = usize::try_from(len).ok();
        match start.zip(n).and_then(|(s, n)| Some(s..s.checked_add(n)?)) {
            Some(r) if r.end <= self.data.len() => Ok(self.data.slice(r)),
            _ => Err(self.bad(format!("{what}: the file ends before its bytes (truncated)"))),
        }
    }

    /// The tree and storages; `placeholders`: refused globals as placeholders, not errors.
    fn structure(&self, placeholders: bool) -> Result<Structure> {
        let big_endian = match self.entry("byteorder")? {
            None => false,
            Some(e) => match self.read_range(e, 0, e.size.min(16), "byteorder")?.as_ref() {
                b"little" => false,
                b"big" => true,
                other => {
                    return Err(
                        self.bad(format!("byteorder is {:?}, not little or big", String::from_utf8_lossy(other)))
                    )
                }
            },
        };
        let pkl = self.entry("data.pkl")?.ok_or_else(|| self.bad("no data.pkl"))?;
        if pkl.size > MAX_PICKLE_BYTES {
            return Err(Error::limit("data.pkl size", MAX_PICKLE_BYTES, format!("{}: {} bytes", self.shown, pkl.size)));
        }
        let bytes = self.read_range(pkl, 0, pkl.size, "data.pkl")?;
        let read = if placeholders { tp::read_placeholders } else { tp::read };
        let Checkpoint { tree, storages } = read(&bytes, &Limits::default())
            .map_err(|e| Error::Pickle { file: format!("{} (data.pkl)", self.shown), source: e })?;
        for (key, s) in &storages {
            let e = self
                .entry(&format!("data/{key}"))?
                .ok_or_else(|| self.bad(format!("storage `{key}` has no entry data/{key}")))?;
            if e.size != s.nbytes() {
                return Err(self.bad(format!(
                    "storage `{key}` holds {} bytes, but {} × {} needs {}",
                    e.size,
                    s.numel,
                    s.dtype.display(),
                    s.nbytes()
                )));
            }
        }
        Ok(Structure { tree, storages, big_endian })
    }

    /// The tree with every tensor's bytes read.
    fn materialise(&self, s: &Structure) -> Result<Node> {
        let mut cache: HashMap<String, Bytes> = HashMap::new();
        // Bytes the views that are copied out of their storage (strided, or of zero stride)
        // may make in all: as treepack's own storages (`Storages.RATIO` and `SLACK`), 8 times
        // what the file holds and 1 MiB; a 1 KB file of views with zero strides asked for GiBs.
        let mut budget = (self.data.len() as u64).saturating_mul(EXPANSION_RATIO).saturating_add(EXPANSION_SLACK);
        // Storages several tensors view, numbered as treepack's torch integration numbers them
        // (`"storage": {"id", "offset", "stride"}` on each view), so that a load rebuilds one
        // storage they share, as torch.load does (tied weights stay tied).
        let mut ids: HashMap<String, usize> = HashMap::new();
        s.tree.clone().try_map(&mut |path, item| match item {
            Item::Leaf(l) => Ok(l),
            Item::Tensor(t) => {
                let shared = s.storages.get(&t.storage).is_some_and(|i| i.tensors > 1);
                let data = self.tensor_bytes(&t, shared, s.big_endian, &mut cache, &path.to_string(), &mut budget)?;
                let a = ArrayData::new(t.dtype.clone(), t.shape.clone(), data)?;
                let mut ann = t.annotation();
                if t.device != "cpu" {
                    ann["device"] = t.device.clone().into();
                }
                if shared {
                    let next = ids.len();
                    let id = *ids.entry(t.storage.clone()).or_insert(next);
                    ann["storage"] = serde_json::json!({"id": id, "offset": t.offset, "stride": t.stride});
                }
                Ok(Leaf::Array(a.with_annotation(Some(ann))?))
            }
        })
    }

    fn tensor_bytes(
        &self,
        t: &TensorRef,
        shared: bool,
        big: bool,
        cache: &mut HashMap<String, Bytes>,
        key: &str,
        budget: &mut u64,
    ) -> Result<Bytes> {
        let e = self
            .entry(&format!("data/{}", t.storage))?
            .ok_or_else(|| self.bad(format!("no storage `{}`", t.storage)))?;
        let item = t.dtype.itemsize();
        let what = format!("storage `{}` of `{key}`", t.storage);
        let swap = |b: Bytes| {
            if !big {
                return b;
            }
            let mut v = b.to_vec();
            tp::swap_bytes(&mut v, t.dtype.swap_unit());
            Bytes::from(v)
        };
        // The extents were checked against the storage by the pickle reader, and the storage's
        // size against its entry: these products do not overflow.
        if !shared && t.is_contiguous() {
            let n = t.numel() * item;
            return Ok(swap(self.read_range(e, t.offset * item, n, &what)?));
        }
        let whole = match cache.get(&t.storage) {
            Some(b) => b.clone(),
            None => {
                let b = swap(self.read_range(e, 0, e.size, &what)?);
                cache.insert(t.storage.clone(), b.clone());
                b
            }
        };
        if t.is_contiguous() {
            let start = (t.offset * item) as usize;
            let end = start + (t.numel() * item) as usize;
            return if end <= whole.len() {
                Ok(whole.slice(start..end))
            } else {
                Err(self.bad(format!("{what}: a view past its end")))
            };
        }
        let n = t.numel().saturating_mul(item);
        *budget = budget.checked_sub(n).ok_or_else(|| {
            self.bad(format!(
                "{what}: its views copied out of their storages would make more than {EXPANSION_RATIO} times the \
                 file's size in all (a view of zero stride repeats its elements): refused, as a file made to \
                 exhaust memory"
            ))
        })?;
        tp::strided_copy(&whole, item, &t.shape, &t.stride, t.offset)
            .map(Bytes::from)
            .map_err(|r| self.bad(format!("{what}: {r}")))
    }
}

/// What copies of strided views of a checkpoint may make in all: this many times the file's
/// size, plus [`EXPANSION_SLACK`].
const EXPANSION_RATIO: u64 = 8;
const EXPANSION_SLACK: u64 = 1 << 20;

fn bad(file: &str, reason: impl Into<String>) -> Error {
    Error::InvalidForeign { file: file.to_string(), format: "PyTorch checkpoint".into(), reason: reason.into() }
}

/// The zip's entries by name: where each one's bytes start and how many there are, or why
/// it cannot be used (compressed, encrypted, a link, outside the file). A name that could
/// escape a folder (`..`, rooted, `\`) refuses the whole zip.
fn zip_entries(data: &[u8]) -> std::result::Result<HashMap<String, std::result::Result<Entry, String>>, String> {
    let len = data.len() as u64;
    let mut z = zip::ZipArchive::new(std::io::Cursor::new(data))
        .map_err(|e| format!("its zip directory cannot be read: {e}"))?;
    let mut out = HashMap::new();
    for i in 0..z.len() {
        let f = z.by_index_raw(i).map_err(|e| format!("zip entry {i} cannot be read: {e}"))?;
        let name = std::str::from_utf8(f.name_raw())
            .map_err(|_| format!("zip entry {i} has a name that is not UTF-8"))?
            .to_string();
        if name.starts_with('/') || name.contains('\\') || name.contains('\0') || name.split('/').any(|s| s == "..") {
            return Err(format!(
                "zip entry name {:?} escapes its folder (`..`, rooted or `\\`): refused",
                name.chars().take(200).collect::<String>()
            ));
        }
        let entry = if f.encrypted() {
            Err("encrypted".to_string())
        } else if f.is_symlink() {
            Err("a symbolic link".to_string())
        } else if f.compression() != zip::CompressionMethod::Stored {
            Err(format!(
                "compressed ({:?}); torch.save stores entries uncompressed: re-save it with torch.save, or unzip and re-zip it with `zip -0`",
                f.compression()
            ))
        } else if f.size() != f.compressed_size() {
            Err(format!("stored, yet its size {} differs from its stored size {}", f.size(), f.compressed_size()))
        } else {
            match f.data_start() {
                Some(start) if start.checked_add(f.size()).is_some_and(|end| end <= len) => {
                    Ok(Entry { start, size: f.size() })
                }
                Some(start) => Err(format!("{} bytes at {start} lie past the end of the file ({len} bytes)", f.size())),
                None => Err("its data offset is unknown".to_string()),
            }
        };
        if out.insert(name.clone(), entry).is_some() {
            return Err(format!("zip entry {:?} appears twice", name.chars().take(200).collect::<String>()));
        }
    }
    Ok(out)
}

/// The dtype names torch gives treepack dtypes, for messages and listings.
pub fn torch_dtype_name(d: &DType) -> &'static str {
    crate::format::pickle::globals::torch_dtype_name(d)
}
