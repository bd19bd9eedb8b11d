//! JSON transport (docs/transport.md): a stored tree as one self-contained JSON document and
//! back. The document's form is docs/format.md section 11 ([`crate::format::transport`]).
//!
//! Export reads the tree's stored chunks (verifying each) and lays them out as one pack, so a
//! compressed tree travels compressed and the document has the tree's root hash. Reading a
//! document puts its manifest and pack in memory and opens them with the ordinary [`Reader`]:
//! every check a stored tree gets, a document gets.

use crate::error::{Error, Result};
use crate::format::manifest::{self, ArrayStorage, Entry, Manifest, PackInfo, Stored};
use crate::format::model::Tree;
use crate::format::transport as form;
pub use crate::format::transport::Encoding;
use crate::read::{LoadOptions, Reader};
use crate::save::{SaveInfo, SaveOptions};
use crate::store::MANIFEST_NAME;
use crate::IntoLocation;
use crate::Location;
use bytes::Bytes;
use std::collections::HashMap;

/// Options for [`export`].
#[derive(Debug, Clone, Default)]
pub struct ExportOptions {
    /// How the chunk bytes are written as text (base85 by default).
    pub encoding: Encoding,
    /// Re-encode the chunks under this policy first (docs/compression.md); `None` copies them
    /// as stored. Chunk grids are kept, so the document has the tree's root hash either way.
    pub compression: Option<crate::save::Compression>,
}

/// The tree at `location` as one JSON transport document. Chunks are copied as stored
/// (compressed ones stay compressed), each verified against its hash on the way, unless
/// `opts.compression` asks for them to be re-encoded.
///
/// # Errors
/// What opening and reading the tree can fail with ([`Error::NotFound`],
/// [`Error::ChunkCorrupt`], storage errors).
pub async fn export_async(location: Location, opts: &ExportOptions) -> Result<String> {
    let mut reader = Reader::open_async(location).await?;
    if let Some(compression) = &opts.compression {
        let mut tree = reader.load_async(&LoadOptions::default()).await?;
        crate::save::keep_chunk_shapes(&mut tree, &reader.manifest().root);
        let mem = Location::new_memory("memory://(export)");
        let m = reader.manifest();
        let save = SaveOptions {
            compression: compression.clone(),
            metadata: m.metadata.clone(),
            writer: m.writer.clone(),
            ..SaveOptions::default()
        };
        crate::save_async(&tree, mem.clone(), &save).await?;
        reader = Reader::open_async(mem).await?;
    }
    let chunks = reader.stored_chunks_async().await?;
    let mut m: Manifest = reader.manifest().clone();
    let (offsets, size) = form::layout(chunks.iter().map(|(_, b)| b.len() as u64));
    let mut data = Vec::with_capacity(chunks.iter().map(|(_, b)| b.len()).sum());
    let mut moved = HashMap::with_capacity(chunks.len());
    for ((key, bytes), offset) in chunks.iter().zip(offsets) {
        data.extend_from_slice(bytes);
        moved.insert(*key, offset);
    }
    relocate(&mut m.root, &moved)?;
    m.packs = if chunks.is_empty() { vec![] } else { vec![PackInfo { path: form::PACK_PATH.to_string(), size }] };
    let text = manifest::encode(&m, &stats(&m, data.len() as u64));
    Ok(form::write(&text, &data, opts.encoding))
}

/// Blocking [`export_async`].
///
/// # Errors
/// As [`export_async`].
pub fn export(location: impl IntoLocation, opts: &ExportOptions) -> Result<String> {
    let loc = location.into_location()?;
    loc.clone().block_on(export_async(loc, opts))
}

/// Put a document's tree at `location` (a directory layout, e.g. `memory://bucket/prefix`), as
/// it is in the document: its manifest byte for byte and its one pack. Errors name `file`.
///
/// # Errors
/// [`Error::NotTreepack`] and [`Error::InvalidManifest`] for a malformed document (the manifest
/// is checked in full, checksum included), storage errors.
pub async fn unpack_async(doc: &[u8], location: &Location, file: &str) -> Result<()> {
    let d = form::read(doc, file)?;
    let m = manifest::decode(&d.manifest, file)?;
    let pack = form::expand(&m, &d.data, file)?;
    drop(d.data);
    if !m.packs.is_empty() {
        location.put(form::PACK_PATH, vec![Bytes::from(pack)], false).await?;
    }
    location.put(MANIFEST_NAME, vec![Bytes::from(d.manifest)], false).await
}

/// A read-only location in memory holding a document's tree, shown as `display`: every reader
/// (load, some leaves, a slice, structure, root hash, verify) then works on it as on any other.
///
/// # Errors
/// As [`unpack_async`].
pub fn unpack(doc: &[u8], display: &str) -> Result<Location> {
    let loc = Location::new_memory(display);
    // An in-memory store needs no runtime: its futures complete at once.
    futures::executor::block_on(unpack_async(doc, &loc, display))?;
    Ok(loc.into_read_only())
}

/// A reader of a document's tree, held in memory.
///
/// # Errors
/// As [`unpack_async`].
pub fn open(doc: &[u8]) -> Result<Reader> {
    Reader::open(unpack(doc, "(transport document)")?)
}

/// Whether the local file at `path` is a transport document: its name ends in `.json` and it
/// begins with the document's signature. A location naming one reads as the tree it holds.
pub(crate) fn is_document_file(path: &std::path::Path) -> bool {
    use std::io::Read;
    if path.extension().and_then(|e| e.to_str()) != Some("json") {
        return false;
    }
    let want = format!("{{\"format\":\"{}\"", form::FORMAT_NAME);
    let mut head = vec![0u8; want.len()];
    std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut head)).is_ok() && head == want.as_bytes()
}

/// The location of the tree in the local transport document at `path` (see
/// [`is_document_file`]), read whole into memory.
pub(crate) fn read_document_file(path: &std::path::Path, display: &str) -> Result<Location> {
    let size = std::fs::metadata(path).map_err(|e| Error::Io { path: path.to_path_buf(), source: e })?.len();
    if size > form::MAX_DOCUMENT_BYTES {
        return Err(Error::limit("transport document", form::MAX_DOCUMENT_BYTES, format!("{display} is {size} bytes")));
    }
    let doc = std::fs::read(path).map_err(|e| Error::Io { path: path.to_path_buf(), source: e })?;
    unpack(&doc, display)
}

/// Store a document's tree at `dst` (any location; `opts` as for [`crate::save()`]: overwrite,
/// compression, durability). Arrays keep their chunk grids, so the stored tree has the
/// document's root hash.
///
/// # Errors
/// As [`open`], and what the save can fail with.
pub fn import(doc: &[u8], dst: impl IntoLocation, opts: &SaveOptions) -> Result<SaveInfo> {
    let dst = dst.into_location()?;
    let reader = open(doc)?;
    let mut tree = reader.load(&LoadOptions::default())?;
    crate::save::keep_chunk_shapes(&mut tree, &reader.manifest().root);
    let opts =
        SaveOptions { metadata: opts.metadata.clone().or_else(|| reader.manifest().metadata.clone()), ..opts.clone() };
    crate::save(&tree, dst, &opts)
}

/// Point every chunk reference at its place in the transport pack.
fn relocate(root: &mut Tree<Entry>, moved: &HashMap<(u32, u64, u64), u64>) -> Result<()> {
    let mut missing = false;
    root.for_each_leaf_mut(&mut |e| {
        let refs: &mut [manifest::ChunkRef] = match e {
            Entry::Str(Stored::Blob { chunk, .. }) | Entry::Bytes(Stored::Blob { chunk, .. }) => {
                std::slice::from_mut(chunk)
            }
            Entry::Array(a) => match &mut a.storage {
                ArrayStorage::Chunked { chunks, .. } => chunks,
                ArrayStorage::Inline(_) => &mut [],
            },
            _ => &mut [],
        };
        for c in refs {
            match moved.get(&(c.pack, c.offset, c.length)) {
                Some(&offset) => {
                    c.pack = 0;
                    c.offset = offset;
                }
                None => missing = true,
            }
        }
    });
    if missing {
        return Err(Error::internal("a chunk of the exported tree was not read"));
    }
    Ok(())
}

/// The manifest's informational `stats` for the document's tree.
fn stats(m: &Manifest, stored_bytes: u64) -> serde_json::Value {
    let (mut leaves, mut arrays, mut array_bytes, mut chunks) = (0u64, 0u64, 0u64, 0u64);
    let mut unique = std::collections::HashSet::new();
    m.root.for_each_leaf_unpathed(&mut |e| {
        leaves += 1;
        if let Entry::Array(a) = e {
            arrays += 1;
            array_bytes += a.nbytes();
        }
        for c in e.chunks() {
            chunks += 1;
            unique.insert(c.offset);
        }
    });
    serde_json::json!({
        "leaves": leaves, "arrays": arrays, "array_bytes": array_bytes,
        "chunks": chunks, "unique_chunks": unique.len(), "stored_bytes": stored_bytes,
    })
}

/// The JSON Schema (2020-12) of the tree at `location` (docs/transport.md, "Schema"): its type
/// — containers, key and field names, leaf kinds, array dtypes and ranks — as a schema that
/// validates its transport document and that of any tree of the same type. Pretty-printed.
///
/// # Errors
/// What opening the tree can fail with.
pub fn schema(location: impl IntoLocation) -> Result<String> {
    let r = crate::open(location)?;
    let title = format!("treepack tree {}", r.location().display());
    Ok(crate::format::schema::schema_text(r.manifest(), &r.manifest().root, &title))
}
