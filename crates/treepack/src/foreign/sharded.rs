//! Checkpoints split over several files by an index, as Hugging Face's `save_pretrained` writes
//! them: a folder with `model.safetensors.index.json` (or `pytorch_model.bin.index.json`) whose
//! `weight_map` names the shard file of every tensor. The folder reads as the one flat tree
//! of all the shards' tensors, keys as stored — what `load_state_dict` takes — shard by shard
//! in the order of their file names (`-00001-of-`, `-00002-of-`, …), each shard's tensors in
//! its own order: the order the writer filled them in, a model's own order for torch shards. A folder holding one unsharded `model.safetensors` / `pytorch_model.bin` (a
//! `save_pretrained` folder of a small model) reads as that file.
//!
//! Who controls which bytes: the index and the shards are the checkpoint's author's. The index
//! is bounded in size and parsed by serde_json (its own depth limit); each shard it names must
//! be a plain file name of a regular file in the folder (no `/`, no `..`, no link), so the
//! folder is the only place read; every tensor the index lists must be in its shard and every
//! tensor of a shard listed, so a lying index fails instead of dropping or inventing tensors.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use crate::format::model::{Key, Tree};
use crate::{Error, Node, Result};

/// The kind of weights files an index names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Weights {
    /// `.safetensors` shards.
    Safetensors,
    /// `torch.save` shards (`pytorch_model-00001-of-00002.bin`).
    Torch,
}

/// What a folder of a Hugging Face checkpoint holds: an index of shards, or one weights file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// An index (`*.safetensors.index.json`, `*.bin.index.json`) of shard files.
    Index(PathBuf, Weights),
    /// One unsharded weights file (`model.safetensors`, `pytorch_model.bin`).
    Single(PathBuf, Weights),
}

impl Found {
    /// The kind of weights.
    pub fn weights(&self) -> Weights {
        match self {
            Found::Index(_, w) | Found::Single(_, w) => *w,
        }
    }
}

/// The largest index read: real ones are tens of KB (one line per tensor).
const MAX_INDEX_BYTES: u64 = 64 << 20;

/// The checkpoint `dir` holds by Hugging Face's layout, if it holds one: an index first
/// (`model.safetensors.index.json`, else the one `*.safetensors.index.json`, then the same
/// for `.bin`), else an unsharded `model.safetensors` or `pytorch_model.bin`. Links are not
/// followed: a checkpoint whose index or weights are links is not one this finds.
pub fn find(dir: &Path) -> Option<Found> {
    let regular = |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_file());
    for (preferred, suffix, w) in [
        ("model.safetensors.index.json", ".safetensors.index.json", Weights::Safetensors),
        ("pytorch_model.bin.index.json", ".bin.index.json", Weights::Torch),
    ] {
        if regular(&dir.join(preferred)) {
            return Some(Found::Index(dir.join(preferred), w));
        }
        let mut named = std::fs::read_dir(dir)
            .ok()?
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_str().is_some_and(|n| n.ends_with(suffix)) && regular(&e.path()));
        if let (Some(one), None) = (named.next(), named.next()) {
            return Some(Found::Index(one.path(), w));
        }
    }
    for (name, w) in [("model.safetensors", Weights::Safetensors), ("pytorch_model.bin", Weights::Torch)] {
        if regular(&dir.join(name)) {
            return Some(Found::Single(dir.join(name), w));
        }
    }
    None
}

fn bad(file: &Path, format: &str, reason: impl Into<String>) -> Error {
    Error::InvalidForeign { file: file.display().to_string(), format: format.into(), reason: reason.into() }
}

/// A parsed index: the shard of every tensor in the index's order, and its `metadata`.
struct Index {
    order: Vec<(String, String)>,
    metadata: Option<serde_json::Value>,
}

fn read_index(path: &Path) -> Result<Index> {
    let format = "Hugging Face checkpoint index";
    let meta = std::fs::symlink_metadata(path).map_err(|e| Error::Io { path: path.to_path_buf(), source: e })?;
    if meta.len() > MAX_INDEX_BYTES {
        return Err(bad(
            path,
            format,
            format!("{} bytes, more than an index may have ({MAX_INDEX_BYTES})", meta.len()),
        ));
    }
    let text = std::fs::read(path).map_err(|e| Error::Io { path: path.to_path_buf(), source: e })?;
    // serde_json's parser stops at 128 levels of nesting: a hostile index cannot recurse deep.
    let doc: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| bad(path, format, format!("not JSON: {e}")))?;
    let map = doc
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad(path, format, "no \"weight_map\" object (tensor name -> shard file)"))?;
    let mut order = Vec::with_capacity(map.len());
    for (name, shard) in map {
        let shard = shard
            .as_str()
            .ok_or_else(|| bad(path, format, format!("the shard of tensor {name:?} is not a file name")))?;
        let plain = !shard.is_empty()
            && shard != "."
            && shard != ".."
            && !shard.contains(['/', '\\', '\0'])
            && Path::new(shard).file_name().is_some_and(|f| f == shard);
        if !plain {
            return Err(bad(
                path,
                format,
                format!("tensor {name:?} names shard {shard:?}, not a file of the checkpoint's folder (a plain name)"),
            ));
        }
        order.push((name.clone(), shard.to_string()));
    }
    Ok(Index { order, metadata: doc.get("metadata").cloned() })
}

/// The tensors of one shard by name in its order, and the shard's own metadata.
type Shard = (Vec<(String, Node)>, Option<serde_json::Value>);

fn read_shard(path: &Path, weights: Weights) -> Result<Shard> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => {
            return Err(Error::Link {
                path: path.to_path_buf(),
                fix: "a shard of a checkpoint is read from its folder: put the file itself there, not a link".into(),
            });
        }
        Ok(m) if m.is_file() => {}
        Ok(_) => return Err(bad(path, "Hugging Face checkpoint", "a shard the index names is not a file")),
        Err(e) => return Err(Error::Io { path: path.to_path_buf(), source: e }),
    }
    let (tree, metadata) = match weights {
        Weights::Safetensors => {
            let loc: crate::Location = crate::store::Location::parse(&path.to_string_lossy())?.into();
            crate::convert::read_safetensors_file(&loc, None)?
        }
        Weights::Torch => (super::torch::read(path)?, None),
    };
    let items = match tree {
        Tree::Dict(items) => items,
        // A state_dict saved by torch.save is an OrderedDict.
        Tree::Custom { type_name, children, data } if type_name == "py.ordereddict" && data.get("items").is_none() => {
            children.into_iter().map(|(k, v)| (Key::Str(k), v)).collect()
        }
        _ => {
            return Err(bad(path, "Hugging Face checkpoint", "a shard that is not a flat mapping of names to tensors"))
        }
    };
    let mut out = Vec::with_capacity(items.len());
    for (k, v) in items {
        let Key::Str(k) = k else {
            return Err(bad(path, "Hugging Face checkpoint", "a shard with a key that is not a string"));
        };
        out.push((k, v));
    }
    Ok((out, metadata))
}

/// Read what [`find`] found in `dir` as one flat tree of every tensor, with the metadata of
/// the shards (safetensors' `__metadata__`, `"format": "pt"` among it) and of the index.
///
/// # Errors
/// [`Error::InvalidForeign`] for an index that is not one, a shard name that is not a plain
/// file of the folder, or an index and shards that disagree on the tensors; [`Error::Link`]
/// for a shard that is a link; the shards' own reading errors.
pub fn read(found: &Found) -> Result<(Node, Option<serde_json::Value>)> {
    let (index_path, weights) = match found {
        Found::Single(path, Weights::Safetensors) => {
            let loc: crate::Location = crate::store::Location::parse(&path.to_string_lossy())?.into();
            return crate::convert::read_safetensors_file(&loc, None);
        }
        Found::Single(path, Weights::Torch) => return Ok((super::torch::read(path)?, None)),
        Found::Index(path, w) => (path, *w),
    };
    let dir = index_path.parent().unwrap_or(Path::new("."));
    let index = read_index(index_path)?;
    let mut listed: BTreeMap<&str, &str> = index.order.iter().map(|(n, s)| (n.as_str(), s.as_str())).collect();
    let files: std::collections::BTreeSet<&str> = listed.values().copied().collect();
    let mut metadata = serde_json::Map::new();
    if let Some(serde_json::Value::Object(m)) = &index.metadata {
        metadata.extend(m.clone());
    }
    // Storage ids (tensors viewing one torch storage, `"storage": {"id"}`) are numbered per
    // file: each shard's are moved past the previous shards' so no two shards' ids meet.
    let mut next_storage = 0;
    let mut items = Vec::with_capacity(index.order.len());
    let mut seen = HashSet::with_capacity(index.order.len());
    for file in files {
        let (mut tensors, shard_metadata) = read_shard(&dir.join(file), weights)?;
        if let Some(serde_json::Value::Object(m)) = shard_metadata {
            metadata.extend(m);
        }
        next_storage = renumber_storages(&mut tensors, next_storage)?;
        for (name, t) in tensors {
            if listed.get(name.as_str()) != Some(&file) || !seen.insert(name.clone()) {
                let again = if seen.contains(&name) { " a second time" } else { "" };
                return Err(bad(
                    index_path,
                    "Hugging Face checkpoint index",
                    format!("shard {file:?} holds tensor {name:?}{again}, which the index does not list there"),
                ));
            }
            listed.remove(name.as_str());
            items.push((Key::Str(name), t));
        }
    }
    if let Some((name, file)) = listed.into_iter().next() {
        return Err(bad(
            index_path,
            "Hugging Face checkpoint index",
            format!("tensor {name:?} is not in its shard {file:?}"),
        ));
    }
    let metadata = (!metadata.is_empty()).then_some(serde_json::Value::Object(metadata));
    Ok((Tree::Dict(items), metadata))
}

/// Move the storage ids of `tensors` to `base` and up; the next free id after them.
pub(crate) fn renumber_storages(tensors: &mut [(String, Node)], base: u64) -> Result<u64> {
    use crate::format::model::Leaf;
    let mut next = base;
    for (_, t) in tensors.iter_mut() {
        let taken = std::mem::replace(t, Tree::Dict(vec![]));
        *t = taken.try_map(&mut |_, leaf| match leaf {
            Leaf::Array(a) => {
                let Some(mut ann) = a.annotation().cloned() else { return Ok(Leaf::Array(a)) };
                let Some(id) = ann.pointer("/storage/id").and_then(|i| i.as_u64()) else { return Ok(Leaf::Array(a)) };
                ann["storage"]["id"] = (base + id).into();
                next = next.max(base + id + 1);
                Ok(Leaf::Array(a.with_annotation(Some(ann))?))
            }
            other => Ok(other),
        })?;
    }
    Ok(next)
}
