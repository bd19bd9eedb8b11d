//! A save written in parts by many writers (the processes of a JAX job), merged into one tree.
//!
//! Each writer saves its *part*: the same tree, where every array sharded across writers is a
//! `treepack.shards` custom node holding only the blocks (shards) this writer owns, each chunked
//! on the array's common chunk grid. Its packs are written; its manifest is not committed but
//! handed to the committer, which [`merge`]s all parts: one manifest whose `packs` list is every
//! part's, whose tree is the first part's, and where each `treepack.shards` node becomes one
//! chunked array whose chunk references come from whichever part wrote them. Blocks are matched
//! with their array by the node's `id` when it has one (a Dask task's part holds only its block),
//! else by key path. A `treepack.shards`
//! node never appears in a committed manifest (docs/format.md, "Saves written in parts").

use serde_json::Value;
use std::collections::HashMap;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::grid::ChunkGrid;
use crate::keypath::{self, Segment};
use crate::manifest::{ArrayEntry, ArrayStorage, ChunkRef, Entry, Manifest, PackInfo, MAX_NDIM};
use crate::model::{check_annotation, grow, shape_len, Tree};

/// The custom node type of a sharded array's blocks inside a part.
pub const SHARDS: &str = "treepack.shards";

fn err(key: &str, reason: impl Into<String>) -> Error {
    Error::Parts { key: if key.is_empty() { "<root>".into() } else { key.into() }, reason: reason.into() }
}

/// What a `treepack.shards` node declares about the whole array.
struct Declared {
    dtype: DType,
    shape: Vec<u64>,
    chunk_shape: Vec<u64>,
    annotation: Option<Value>,
    origins: Vec<Vec<u64>>,
}

fn u64s(v: Option<&Value>, key: &str, what: &str) -> Result<Vec<u64>> {
    let a = v.and_then(Value::as_array).ok_or_else(|| err(key, format!("`{what}` is not a list of integers")))?;
    if a.len() > MAX_NDIM {
        return Err(err(key, format!("`{what}` has {} entries (limit {MAX_NDIM})", a.len())));
    }
    a.iter().map(|x| x.as_u64().ok_or_else(|| err(key, format!("`{what}` is not a list of integers")))).collect()
}

fn declared(data: &Value, key: &str, pieces: usize) -> Result<Declared> {
    let dtype = DType::from_json(data.get("dtype").unwrap_or(&Value::Null)).map_err(|e| err(key, e.to_string()))?;
    let shape = u64s(data.get("shape"), key, "shape")?;
    let chunk_shape = u64s(data.get("chunk_shape"), key, "chunk_shape")?;
    if chunk_shape.len() != shape.len() || chunk_shape.contains(&0) {
        return Err(err(key, format!("chunk shape {chunk_shape:?} does not fit shape {shape:?}")));
    }
    if shape_len(&shape).and_then(|n| n.checked_mul(dtype.itemsize())).is_none() {
        return Err(err(key, format!("shape {shape:?} overflows")));
    }
    let annotation = data.get("as").cloned();
    if let Some(a) = &annotation {
        check_annotation(a).map_err(|r| err(key, r))?;
    }
    let list = data.get("origins").and_then(Value::as_array).ok_or_else(|| err(key, "no `origins` list"))?;
    if list.len() != pieces {
        return Err(err(key, format!("{} origins for {pieces} blocks", list.len())));
    }
    let origins = list.iter().map(|o| u64s(Some(o), key, "origin")).collect::<Result<Vec<_>>>()?;
    Ok(Declared { dtype, shape, chunk_shape, annotation, origins })
}

/// One part's blocks of one array: (declared data, its pieces, the part's pack remap).
type Blocks<'m> = (&'m Value, &'m [(String, Tree<Entry>)], &'m [u32]);

/// Merge the manifests of a save written in parts (see the module docs) into the manifest to
/// commit. `parts[0]` gives the tree; the others give only their `treepack.shards` blocks.
///
/// # Errors
/// [`Error::Parts`] naming the key path when the parts do not make one tree: a sharded array
/// whose blocks overlap, leave holes, do not lie on the declared chunk grid, disagree on dtype
/// or shape, or sit where the first part's tree has no sharded array.
pub fn merge(parts: Vec<Manifest>) -> Result<Manifest> {
    let mut parts = parts.into_iter();
    let mut base = parts.next().ok_or_else(|| err("", "no parts to merge"))?;
    let others: Vec<Manifest> = parts.collect();
    // One pack list: the first part's packs keep their indexes; a pack two parts name (the same
    // content-derived name: the same bytes) is listed once.
    let mut index: HashMap<String, u32> = HashMap::new();
    for (i, p) in base.packs.iter().enumerate() {
        index.insert(p.path.clone(), i as u32);
    }
    let base_remap: Vec<u32> = (0..base.packs.len() as u32).collect();
    let mut remaps: Vec<Vec<u32>> = vec![];
    for m in &others {
        let mut remap = Vec::with_capacity(m.packs.len());
        for p in &m.packs {
            let i = match index.get(&p.path) {
                Some(&i) => {
                    if base.packs[i as usize].size != p.size {
                        return Err(err("", format!("two parts list pack {} with different sizes", p.path)));
                    }
                    i
                }
                None => {
                    let i = base.packs.len() as u32;
                    base.packs.push(PackInfo { path: p.path.clone(), size: p.size });
                    index.insert(p.path.clone(), i);
                    i
                }
            };
            remap.push(i);
        }
        remaps.push(remap);
    }
    // Every other part's blocks, by key path.
    let mut found: HashMap<String, Vec<Blocks<'_>>> = HashMap::new();
    for (m, remap) in others.iter().zip(&remaps) {
        let mut path = keypath::KeyPath::root();
        collect(&m.root, &mut path, remap, &mut found)?;
    }
    let mut path = keypath::KeyPath::root();
    let root = std::mem::replace(&mut base.root, Tree::List(vec![]));
    base.root = assemble(root, &mut path, &base_remap, &mut found)?;
    if let Some(k) = found.keys().min() {
        return Err(err(k, "a part holds blocks of a sharded array here, but the first part's tree has none"));
    }
    Ok(base)
}

fn collect<'m>(
    t: &'m Tree<Entry>,
    path: &mut keypath::KeyPath,
    remap: &'m [u32],
    found: &mut HashMap<String, Vec<Blocks<'m>>>,
) -> Result<()> {
    grow(|| {
        if let Tree::Custom { type_name, data, children } = t {
            if type_name == SHARDS {
                found.entry(match_key(data, path)).or_default().push((data, children, remap));
                return Ok(());
            }
        }
        for_children(t, path, &mut |p, c| collect(c, p, remap, found))
    })
}

fn for_children<'t>(
    t: &'t Tree<Entry>,
    path: &mut keypath::KeyPath,
    f: &mut dyn FnMut(&mut keypath::KeyPath, &'t Tree<Entry>) -> Result<()>,
) -> Result<()> {
    match t {
        Tree::Leaf(_) | Tree::Ref(_) => Ok(()),
        Tree::Shared { node, .. } => f(path, node),
        Tree::List(v) | Tree::Tuple(v) => {
            v.iter().enumerate().try_for_each(|(i, c)| under(path, Segment::Index(i), c, f))
        }
        Tree::Dict(v) => v.iter().try_for_each(|(k, c)| under(path, Segment::Key(k.clone()), c, f)),
        Tree::Record { fields: v, .. } | Tree::Custom { children: v, .. } => {
            v.iter().try_for_each(|(k, c)| under(path, Segment::Name(k.clone()), c, f))
        }
    }
}

/// `f` on child `c` with `seg` on the path while it runs.
fn under<'t>(
    path: &mut keypath::KeyPath,
    seg: Segment,
    c: &'t Tree<Entry>,
    f: &mut dyn FnMut(&mut keypath::KeyPath, &'t Tree<Entry>) -> Result<()>,
) -> Result<()> {
    path.push(seg);
    let r = f(path, c);
    path.pop();
    r
}

fn path_text(path: &keypath::KeyPath) -> String {
    path.texts().join("/")
}

/// What matches a part's blocks with the first part's array: the node's `id` when it has one
/// (writers whose parts hold only blocks, not the tree: Dask tasks), else its key path (every
/// process of a JAX job saves the whole tree).
fn match_key(data: &Value, path: &keypath::KeyPath) -> String {
    match data.get("id").and_then(Value::as_str) {
        Some(id) => format!("id {id}"),
        None => path_text(path),
    }
}

fn assemble(
    t: Tree<Entry>,
    path: &mut keypath::KeyPath,
    remap: &[u32],
    found: &mut HashMap<String, Vec<Blocks<'_>>>,
) -> Result<Tree<Entry>> {
    grow(move || {
        let seq = |v: Vec<Tree<Entry>>, path: &mut keypath::KeyPath, found: &mut HashMap<String, Vec<Blocks<'_>>>| {
            v.into_iter()
                .enumerate()
                .map(|(i, c)| child(c, Segment::Index(i), path, remap, found))
                .collect::<Result<Vec<_>>>()
        };
        Ok(match t {
            Tree::Custom { type_name, data, children } if type_name == SHARDS => {
                let mut blocks: Vec<Blocks<'_>> = vec![(&data, &children, remap)];
                blocks.extend(found.remove(&match_key(&data, path)).unwrap_or_default());
                Tree::Leaf(Entry::Array(Box::new(array(&path_text(path), &blocks)?)))
            }
            Tree::List(v) => Tree::List(seq(v, path, found)?),
            Tree::Tuple(v) => Tree::Tuple(seq(v, path, found)?),
            Tree::Dict(v) => Tree::Dict(
                v.into_iter()
                    .map(|(k, c)| Ok((k.clone(), child(c, Segment::Key(k), path, remap, found)?)))
                    .collect::<Result<Vec<_>>>()?,
            ),
            Tree::Record { type_name, fields } => {
                Tree::Record { type_name, fields: named(fields, path, remap, found)? }
            }
            Tree::Custom { type_name, data, children } => {
                Tree::Custom { type_name, data, children: named(children, path, remap, found)? }
            }
            Tree::Shared { id, node } => Tree::Shared { id, node: Box::new(assemble(*node, path, remap, found)?) },
            other => other,
        })
    })
}

fn named(
    v: Vec<(String, Tree<Entry>)>,
    path: &mut keypath::KeyPath,
    remap: &[u32],
    found: &mut HashMap<String, Vec<Blocks<'_>>>,
) -> Result<Vec<(String, Tree<Entry>)>> {
    v.into_iter().map(|(k, c)| Ok((k.clone(), child(c, Segment::Name(k), path, remap, found)?))).collect()
}

/// A child assembled at its key path.
fn child(
    c: Tree<Entry>,
    at: Segment,
    path: &mut keypath::KeyPath,
    remap: &[u32],
    found: &mut HashMap<String, Vec<Blocks<'_>>>,
) -> Result<Tree<Entry>> {
    path.push(at);
    let r = assemble(c, path, remap, found);
    path.pop();
    r
}

/// One chunked array from the blocks every part wrote of it.
fn array(key: &str, blocks: &[Blocks<'_>]) -> Result<ArrayEntry> {
    let first = declared(blocks[0].0, key, blocks[0].1.len())?;
    let grid = ChunkGrid::new(first.shape.clone(), first.chunk_shape.clone()).map_err(|r| err(key, r))?;
    let n = grid.num_chunks().ok_or_else(|| err(key, "too many chunks"))?;
    let given: u64 = blocks
        .iter()
        .flat_map(|b| b.1.iter())
        .map(|(_, t)| match t {
            Tree::Leaf(Entry::Array(a)) => match &a.storage {
                ArrayStorage::Chunked { chunks, .. } => chunks.len() as u64,
                ArrayStorage::Inline(_) => 0,
            },
            _ => 0,
        })
        .sum();
    if given < n {
        return Err(err(
            key,
            format!("the blocks hold {given} chunks but the array has {n}: blocks are missing (holes)"),
        ));
    }
    let gshape = grid.grid_shape();
    let mut refs: Vec<Option<ChunkRef>> = vec![None; n as usize];
    for (data, pieces, remap) in blocks {
        let d = declared(data, key, pieces.len())?;
        if d.dtype != first.dtype || d.shape != first.shape || d.chunk_shape != first.chunk_shape {
            return Err(err(key, "the parts disagree on the array's dtype, shape or chunk shape"));
        }
        if d.annotation != first.annotation {
            return Err(err(key, "the parts disagree on the array's annotation"));
        }
        for ((_, piece), origin) in pieces.iter().zip(&d.origins) {
            let Tree::Leaf(Entry::Array(a)) = piece else {
                return Err(err(key, "a block is not an array"));
            };
            let ArrayStorage::Chunked { chunk_shape, chunks } = &a.storage else {
                return Err(err(key, "a block is stored inline, not on the chunk grid"));
            };
            if a.dtype != first.dtype || origin.len() != first.shape.len() || a.shape.len() != first.shape.len() {
                return Err(err(
                    key,
                    format!("a block at {origin:?} has dtype {} and rank {}", a.dtype.display(), a.shape.len()),
                ));
            }
            let fits = origin
                .iter()
                .zip(&a.shape)
                .zip(&first.shape)
                .all(|((&o, &s), &g)| o.checked_add(s).is_some_and(|e| e <= g));
            if !fits {
                return Err(err(
                    key,
                    format!("a block of shape {:?} at {origin:?} lies outside shape {:?}", a.shape, first.shape),
                ));
            }
            let local = ChunkGrid::new(a.shape.clone(), chunk_shape.clone()).map_err(|r| err(key, r))?;
            for (i, c) in chunks.iter().enumerate() {
                let (lo, le) = local.chunk_region(i as u64);
                let mut g = 0u64;
                for d in 0..lo.len() {
                    let start = origin[d] + lo[d];
                    let cs = first.chunk_shape[d];
                    let want = cs.min(first.shape[d] - start);
                    if start % cs != 0 || le[d] != want {
                        return Err(err(
                            key,
                            format!(
                                "the block at {origin:?} is not on the chunk grid {:?} (a chunk at {start} of extent {} on axis {d})",
                                first.chunk_shape, le[d]
                            ),
                        ));
                    }
                    g = g * gshape[d] + start / cs;
                }
                let slot = &mut refs[g as usize];
                if slot.is_some() {
                    return Err(err(key, format!("two blocks hold chunk {:?} (they overlap)", grid.coords(g))));
                }
                let pack = remap
                    .get(c.pack as usize)
                    .copied()
                    .ok_or_else(|| err(key, "a chunk names a pack the part does not list"))?;
                *slot = Some(ChunkRef { pack, ..c.clone() });
            }
        }
    }
    let chunks = refs
        .into_iter()
        .enumerate()
        .map(|(i, r)| r.ok_or_else(|| err(key, format!("no block holds chunk {:?} (a hole)", grid.coords(i as u64)))))
        .collect::<Result<Vec<_>>>()?;
    Ok(ArrayEntry {
        dtype: first.dtype,
        shape: first.shape,
        storage: ArrayStorage::Chunked { chunk_shape: first.chunk_shape, chunks },
        preview: None,
        annotation: first.annotation,
    })
}
