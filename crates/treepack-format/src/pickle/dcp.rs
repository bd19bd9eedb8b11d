//! A `torch.distributed.checkpoint` (DCP) folder's `.metadata` as a typed description, with no
//! I/O: which entries the checkpoint holds (in the order of its `state_dict_metadata`), each
//! tensor's dtype, size and chunks, and where each chunk's or object's bytes are in the folder's
//! `.distcp` files (`storage_data`). The engine reads those bytes
//! (`treepack::foreign::dcp`).
//!
//! The pickle is parsed under [`AllowList::DcpMetadata`]: DCP's dataclasses become
//! [`Record`]s of named fields, read here as data; nothing is imported or run, and no other
//! reader accepts them. What a field may hold is checked where it is read; `planner_data` and
//! `storage_meta` are parsed (their globals must be allowed) but not used.

use super::globals::{AllowList, DcpClass, Global};
use super::{Id, Limits, Obj, Pickle, PickleError, Record};
use crate::dtype::DType;
use crate::model::Int;

type R<T> = Result<T, PickleError>;

/// What a `.metadata` says the checkpoint holds.
#[derive(Debug, Clone, PartialEq)]
pub struct Metadata {
    /// Every entry of the saved (flattened) state_dict, by its fully qualified name, in the
    /// order of `state_dict_metadata`.
    pub entries: Vec<(String, Entry)>,
    /// Where each entry's bytes are (`storage_data`), in its order.
    pub storage: Vec<(Index, StorageInfo)>,
    /// The DCP version that wrote it (`1.0.0`), when it says.
    pub version: Option<String>,
}

/// One entry of `state_dict_metadata`.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    /// A tensor, saved in chunks.
    Tensor(TensorMeta),
    /// Any other value, saved as one `torch.save`d object.
    Bytes,
}

/// A tensor: its element type, its whole size and the chunks it was saved in.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorMeta {
    /// Element type (`TensorProperties.dtype`).
    pub dtype: DType,
    /// The whole tensor's size.
    pub size: Vec<u64>,
    /// The chunks that tile it, as saved.
    pub chunks: Vec<Chunk>,
}

/// A chunk of a tensor: where it starts in each dimension, and its size.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Chunk {
    /// Its first element's index in each dimension.
    pub offsets: Vec<u64>,
    /// Its size in each dimension.
    pub sizes: Vec<u64>,
}

/// A key of `storage_data` (`MetadataIndex`): an entry's name, and for a tensor the offsets of
/// one of its chunks.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Index {
    /// The entry's fully qualified name.
    pub fqn: String,
    /// The chunk's offsets (`None` for a bytes entry).
    pub offset: Option<Vec<u64>>,
}

/// Where an item's bytes are (`filesystem._StorageInfo`).
#[derive(Debug, Clone, PartialEq)]
pub struct StorageInfo {
    /// The file, as the checkpoint names it (relative to its folder; the engine checks it is a
    /// plain file name).
    pub relative_path: String,
    /// Where the bytes start in the file.
    pub offset: u64,
    /// How many bytes.
    pub length: u64,
    /// Stream transforms applied when written (DCP's extensions: `"zstd/1"`...); empty for
    /// none.
    pub transform_descriptors: Vec<String>,
}

/// Parse `data` (a `.metadata` file) under [`AllowList::DcpMetadata`] and read it.
///
/// # Errors
/// Any [`PickleError`] of parsing (a global outside the list is `refused`), or a
/// [`PickleError::BadCall`] / [`PickleError::Malformed`] for metadata that is not what DCP
/// writes (naming the field).
pub fn read(data: &[u8], limits: &Limits) -> R<Metadata> {
    let p = super::parse_with(data, limits, AllowList::DcpMetadata)?;
    interpret(&p)
}

/// Read a parsed `.metadata` pickle.
///
/// # Errors
/// As [`read`], past parsing.
pub fn interpret(p: &Pickle) -> R<Metadata> {
    let r = Reader { p };
    let root = r.record(p.root(), DcpClass::Metadata, "the metadata")?;
    let sdm = r.field(root, DcpClass::Metadata, "state_dict_metadata")?;
    let mut entries = vec![];
    let mut seen = std::collections::HashSet::new();
    for &(k, v) in r.dict(sdm, "state_dict_metadata")? {
        let fqn = r.text(k, "a name of state_dict_metadata")?;
        if !seen.insert(fqn.clone()) {
            return Err(PickleError::Malformed {
                offset: 0,
                reason: format!("{} appears twice in state_dict_metadata", shown(&fqn)),
            });
        }
        let where_ = format!("state_dict_metadata[{}]", shown(&fqn));
        let entry = match r.p.get(v) {
            Obj::Record(Record { class: Global::Dcp(DcpClass::BytesStorageMetadata), .. }) => Entry::Bytes,
            Obj::Record(rec @ Record { class: Global::Dcp(DcpClass::TensorStorageMetadata), .. }) => {
                Entry::Tensor(r.tensor(rec, &where_)?)
            }
            o => {
                return Err(
                    r.bad(&where_, format!("a {}, not TensorStorageMetadata or BytesStorageMetadata", o.type_name()))
                )
            }
        };
        entries.push((fqn, entry));
    }
    let sd = r.field(root, DcpClass::Metadata, "storage_data")?;
    let mut storage = vec![];
    for &(k, v) in r.dict(sd, "storage_data")? {
        let index = r.record(k, DcpClass::MetadataIndex, "a key of storage_data")?;
        let fqn = r.text(r.field(index, DcpClass::MetadataIndex, "fqn")?, "MetadataIndex.fqn")?;
        let where_ = format!("storage_data[{}]", shown(&fqn));
        let offset = match index.field("offset") {
            Some(o) if !matches!(r.p.get(o), Obj::None) => Some(r.ints(o, &where_, "offset")?),
            _ => None,
        };
        let info = r.record(v, DcpClass::StorageInfo, &where_)?;
        let relative_path = r.text(r.field(info, DcpClass::StorageInfo, "relative_path")?, "relative_path")?;
        let offset_b = r.uint(r.field(info, DcpClass::StorageInfo, "offset")?, &where_, "offset")?;
        let length = r.uint(r.field(info, DcpClass::StorageInfo, "length")?, &where_, "length")?;
        let transform_descriptors = match info.field("transform_descriptors").map(|t| (t, r.p.get(t))) {
            None | Some((_, Obj::None)) => vec![],
            Some((_, Obj::List(v) | Obj::Tuple(v))) => {
                v.iter().map(|&d| r.text(d, "a transform descriptor")).collect::<R<_>>()?
            }
            Some((_, o)) => return Err(r.bad(&where_, format!("transform_descriptors is a {}", o.type_name()))),
        };
        storage.push((
            Index { fqn, offset },
            StorageInfo { relative_path, offset: offset_b, length, transform_descriptors },
        ));
    }
    let version = match root.field("version").map(|v| r.p.get(v)) {
        None | Some(Obj::None) => None,
        Some(Obj::Str(s)) if s.len() <= 64 => Some(s.clone()),
        Some(o) => return Err(r.bad("Metadata.version", format!("a {}, not a short str", o.type_name()))),
    };
    Ok(Metadata { entries, storage, version })
}

/// A name as messages show it: quoted, at most 200 characters.
fn shown(s: &str) -> String {
    format!("{:?}", s.chars().take(200).collect::<String>())
}

struct Reader<'a> {
    p: &'a Pickle,
}

impl<'a> Reader<'a> {
    fn bad(&self, at: &str, reason: String) -> PickleError {
        PickleError::BadCall { global: "torch.distributed.checkpoint metadata".into(), path: at.into(), reason }
    }

    fn record(&self, id: Id, class: DcpClass, what: &str) -> R<&'a Record> {
        match self.p.get(id) {
            Obj::Record(r) if r.class == Global::Dcp(class) => Ok(r),
            o => Err(self.bad(what, format!("a {}, not {}", o.type_name(), class.name()))),
        }
    }

    fn field(&self, r: &Record, class: DcpClass, name: &str) -> R<Id> {
        r.field(name).ok_or_else(|| self.bad(class.name(), format!("has no field `{name}`")))
    }

    fn dict(&self, id: Id, what: &str) -> R<&'a [(Id, Id)]> {
        match self.p.get(id) {
            Obj::Dict { items, .. } => Ok(items),
            o => Err(self.bad(what, format!("a {}, not a dict", o.type_name()))),
        }
    }

    fn text(&self, id: Id, what: &str) -> R<String> {
        match self.p.get(id) {
            Obj::Str(s) => Ok(s.clone()),
            o => Err(self.bad(what, format!("a {}, not a str", o.type_name()))),
        }
    }

    fn uint(&self, id: Id, at: &str, what: &str) -> R<u64> {
        match self.p.get(id) {
            Obj::Int(Int::Small(v)) if *v >= 0 => Ok(*v as u64),
            o => Err(self.bad(at, format!("{what} is a {}, not a non-negative integer", o.type_name()))),
        }
    }

    /// A `torch.Size` (or a tuple or list) of non-negative integers, at most 64 of them.
    fn ints(&self, id: Id, at: &str, what: &str) -> R<Vec<u64>> {
        match self.p.get(id) {
            Obj::Size(v) => Ok(v.clone()),
            Obj::Tuple(v) | Obj::List(v) if v.len() <= 64 => v.iter().map(|&i| self.uint(i, at, what)).collect(),
            o => Err(self.bad(at, format!("{what} is a {}, not a torch.Size", o.type_name()))),
        }
    }

    fn tensor(&self, rec: &Record, at: &str) -> R<TensorMeta> {
        let class = DcpClass::TensorStorageMetadata;
        let props = self.record(self.field(rec, class, "properties")?, DcpClass::TensorProperties, at)?;
        let dtype = match props.field("dtype").map(|d| self.p.get(d)) {
            Some(Obj::Global(Global::TorchDtype(d))) => d.clone(),
            Some(o) => {
                return Err(self.bad(at, format!("its dtype is {}, not a torch dtype this reader knows", o.type_name())))
            }
            None => return Err(self.bad(at, "its properties name no dtype".into())),
        };
        match props.field("layout").map(|l| self.p.get(l)) {
            None | Some(Obj::None) => {}
            Some(Obj::Record(l)) if l.class == Global::TorchLayout => {
                let name = l.field("name").map(|n| self.p.get(n));
                if !matches!(name, Some(Obj::Str(s)) if s == "torch.strided") {
                    let name = match name {
                        Some(Obj::Str(s)) => shown(s),
                        _ => "?".into(),
                    };
                    return Err(
                        self.bad(at, format!("a tensor of layout {name}: only strided (dense) tensors are read"))
                    );
                }
            }
            Some(o) => return Err(self.bad(at, format!("its layout is a {}, not a torch.layout", o.type_name()))),
        }
        let size = self.ints(self.field(rec, class, "size")?, at, "size")?;
        let chunks_id = self.field(rec, class, "chunks")?;
        let (Obj::List(ids) | Obj::Tuple(ids)) = self.p.get(chunks_id) else {
            return Err(self.bad(at, "its chunks are not a list".into()));
        };
        let mut chunks = Vec::with_capacity(ids.len().min(1 << 16));
        for &c in ids {
            let c = self.record(c, DcpClass::ChunkStorageMetadata, at)?;
            let offsets =
                self.ints(self.field(c, DcpClass::ChunkStorageMetadata, "offsets")?, at, "a chunk's offsets")?;
            let sizes = self.ints(self.field(c, DcpClass::ChunkStorageMetadata, "sizes")?, at, "a chunk's sizes")?;
            chunks.push(Chunk { offsets, sizes });
        }
        Ok(TensorMeta { dtype, size, chunks })
    }
}
