//! Object stores through the `object_store` crate: S3, GCS, Azure and (read-only) HTTP
//! (`cloud.rs`: their clients and treepack's tuning keys), and the in-process `InMemory` store
//! that [`memory`](crate::memory) locations use.
//!
//! Remote stores get: credentials/region/endpoint from each cloud's usual environment variables
//! plus explicit [`StorageOptions`]; bounded request concurrency; retries
//! with exponential backoff (object_store's retry layer); multipart uploads with parallel parts
//! for large objects (`multipart.rs`); and ranged reads that coalesce neighbouring ranges into
//! few requests (`plan.rs`).

mod cloud;
mod multipart;
mod plan;

pub(crate) use cloud::store_error;
pub use cloud::{RemoteTuning, TUNING_KEYS};

use crate::backend::{BoxFuture, Keep, Listed, RangeRead, Swap, Version, Write};
use crate::{Error, Layout, Location, Result, StorageOptions};
use bytes::Bytes;
use futures::{FutureExt, StreamExt, TryStreamExt};
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use std::ops::Range;
use std::sync::Arc;

/// A backend over an `object_store` store, rooted at a prefix of it.
#[derive(Debug)]
pub struct ObjectBackend {
    store: Arc<dyn ObjectStore>,
    /// Object path of the location's folder (directory layout) or of its file (single file).
    base: ObjPath,
    /// Request shaping of a remote store; `None` for an in-process one (memory).
    tuning: Option<RemoteTuning>,
    /// Why it cannot be written (HTTP).
    read_only: Option<&'static str>,
}

/// The reason an HTTP(S) location refuses writes.
const HTTP_READ_ONLY: &str = "HTTP(S) locations can only be read; save to s3://, gs://, az:// or a local path";

/// The backend of a remote URL and the layout its path asks for. Errors are plain reasons.
pub(crate) fn open(url: &str, options: &StorageOptions) -> std::result::Result<(ObjectBackend, Layout), String> {
    let (store, base, read_only, tuning) = cloud::remote_store(url, options)?;
    let layout = Layout::of(base.as_ref(), false);
    let read_only = read_only.then_some(HTTP_READ_ONLY);
    Ok((ObjectBackend { store, base, tuning: Some(tuning), read_only }, layout))
}

impl ObjectBackend {
    /// An in-process store (memory) rooted at `base`.
    pub(crate) fn in_process(store: Arc<dyn ObjectStore>, base: ObjPath) -> ObjectBackend {
        ObjectBackend { store, base, tuning: None, read_only: None }
    }

    fn obj(&self, rel: &str) -> ObjPath {
        if rel == "." || rel.is_empty() {
            return self.base.clone();
        }
        rel.split('/').fold(self.base.clone(), |p, seg| p.clone().join(seg))
    }

    async fn head_size(&self, loc: &Location, rel: &str) -> Result<u64> {
        let m = self.store.head(&self.obj(rel)).await.map_err(|e| read_err(loc, rel, e))?;
        loc.stats().read(0);
        Ok(m.size)
    }

    /// Whether an object exists. A remote store answers a one-byte ranged GET: the same single
    /// request as a HEAD, and served where HEAD is not (gcp-storage-emulator, some static web
    /// servers). An in-process store is asked for the object's metadata.
    async fn exists_now(&self, loc: &Location, rel: &str) -> Result<bool> {
        let head = |r: Result<u64>| match r {
            Ok(_) => Ok(true),
            Err(Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(e),
        };
        if self.tuning.is_none() {
            return head(self.head_size(loc, rel).await);
        }
        let opts = object_store::GetOptions { range: Some((0..1).into()), ..Default::default() };
        match self.store.get_opts(&self.obj(rel), opts).await {
            Ok(r) => {
                loc.stats().read(0);
                drop(r);
                Ok(true)
            }
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            // An empty object has no byte 0: the stores answer 416 (Range Not Satisfiable), or a
            // whole empty body where a part was asked for. object_store 0.14 reports both as
            // `Generic` (the failed request's status sits in a private error type, and no other
            // variant is a range error), as it does any failure without a variant of its own. So
            // `Generic`, and only it, is settled by a HEAD, which answers an empty object like
            // any other and fails as the store is failing otherwise.
            Err(object_store::Error::Generic { .. }) => head(self.head_size(loc, rel).await),
            Err(e) => Err(read_err(loc, rel, e)),
        }
    }
}

/// A read's error: a missing manifest (or single file) means no tree; a missing pack, an
/// incomplete or replaced one.
fn read_err(loc: &Location, rel: &str, e: object_store::Error) -> Error {
    match e {
        object_store::Error::NotFound { .. } => loc.not_found(rel, loc.file_name(rel)),
        object_store::Error::AlreadyExists { .. } => Error::AlreadyExists { location: loc.display().to_string() },
        e => store_error(loc.file_name(rel), e),
    }
}

/// A write's error: a 404 there means a missing bucket or container, not a missing tree.
fn write_err(loc: &Location, rel: &str, e: object_store::Error) -> Error {
    match e {
        object_store::Error::AlreadyExists { .. } => Error::AlreadyExists { location: loc.display().to_string() },
        e => store_error(loc.file_name(rel), e),
    }
}

impl crate::Backend for ObjectBackend {
    /// Read a whole object and its metadata (ETag, version), or `None` if it does not exist.
    fn get<'a>(&'a self, loc: &'a Location, rel: &'a str, limit: u64) -> BoxFuture<'a, Option<(Bytes, Version)>> {
        async move {
            match self.store.get(&self.obj(rel)).await {
                Ok(r) => {
                    if r.meta.size > limit {
                        return Err(Error::limit(
                            "object size",
                            limit,
                            format!("{} is {} bytes", loc.file_name(rel), r.meta.size),
                        ));
                    }
                    let meta = r.meta.clone();
                    let b = r.bytes().await.map_err(|e| read_err(loc, rel, e))?;
                    loc.stats().read(b.len() as u64);
                    Ok(Some((b.clone(), Version { e_tag: meta.e_tag, version: meta.version, bytes: b })))
                }
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(read_err(loc, rel, e)),
            }
        }
        .boxed()
    }

    /// Ranged reads: coalesced into few requests (`plan.rs`), at most
    /// `max_concurrency` in flight, each retried with backoff by the client.
    fn read_ranges<'a>(&'a self, loc: &'a Location, rel: &'a str, read: RangeRead<'a>) -> BoxFuture<'a, Vec<Bytes>> {
        let RangeRead { ranges, progress, .. } = read;
        async move {
            let tuning = self.tuning.unwrap_or_default();
            let path = self.obj(rel);
            let plan = plan::plan_requests(&ranges, tuning.max_request_bytes);
            let fetched: Vec<(Range<u64>, Vec<usize>, Bytes)> =
                futures::stream::iter(plan.into_iter().map(|(req, members)| {
                    let path = &path;
                    async move {
                        let b = self.store.get_range(path, req.clone()).await.map_err(|e| read_err(loc, rel, e))?;
                        if (b.len() as u64) != req.end - req.start {
                            return Err(Error::OutOfBounds {
                                file: loc.file_name(rel),
                                key: String::new(),
                                reason: format!(
                                    "asked for bytes {}..{}, got {} bytes (truncated?)",
                                    req.start,
                                    req.end,
                                    b.len()
                                ),
                            });
                        }
                        loc.stats().read(b.len() as u64);
                        if let Some(t) = progress {
                            t.advance(b.len() as u64);
                        }
                        Ok((req, members, b))
                    }
                }))
                .buffer_unordered(tuning.max_concurrency)
                .try_collect()
                .await?;
            let mut out = vec![Bytes::new(); ranges.len()];
            for (req, members, b) in fetched {
                for i in members {
                    let r = &ranges[i];
                    out[i] = b.slice((r.start - req.start) as usize..(r.end - req.start) as usize);
                }
            }
            Ok(out)
        }
        .boxed()
    }

    fn read_suffix<'a>(&'a self, loc: &'a Location, rel: &'a str, n: u64) -> BoxFuture<'a, (Bytes, u64)> {
        async move {
            let opts =
                object_store::GetOptions { range: Some(object_store::GetRange::Suffix(n)), ..Default::default() };
            let r = match self.store.get_opts(&self.obj(rel), opts).await {
                Ok(r) => r,
                // Azure has no suffix ranges: ask for the size, then read the tail (two requests).
                Err(object_store::Error::NotSupported { .. }) => {
                    let size = self.head_size(loc, rel).await?;
                    let start = size.saturating_sub(n);
                    return Ok((loc.read_range(rel, start..size).await?, size));
                }
                Err(e) => return Err(read_err(loc, rel, e)),
            };
            let size = r.meta.size;
            let b = r.bytes().await.map_err(|e| read_err(loc, rel, e))?;
            loc.stats().read(b.len() as u64);
            Ok((b, size))
        }
        .boxed()
    }

    fn size<'a>(&'a self, loc: &'a Location, rel: &'a str) -> BoxFuture<'a, u64> {
        self.head_size(loc, rel).boxed()
    }

    fn exists<'a>(&'a self, loc: &'a Location, rel: &'a str) -> BoxFuture<'a, bool> {
        self.exists_now(loc, rel).boxed()
    }

    fn put<'a>(&'a self, loc: &'a Location, rel: &'a str, write: Write<'a>) -> BoxFuture<'a, ()> {
        let Write { parts, create_only, progress, .. } = write;
        async move {
            let n: u64 = parts.iter().map(|b| b.len() as u64).sum();
            // Conditional create needs a single PUT; manifests are always far below the threshold, and
            // a large single-file object was checked for existence when the save began.
            if let Some(t) = self.tuning.filter(|t| n >= t.multipart_threshold) {
                return multipart::put(self.store.as_ref(), &self.obj(rel), parts, t, progress)
                    .await
                    .map_err(|e| write_err(loc, rel, e));
            }
            let payload: PutPayload = parts.into_iter().collect();
            let mode = if create_only { PutMode::Create } else { PutMode::Overwrite };
            self.store
                .put_opts(&self.obj(rel), payload, PutOptions { mode, ..Default::default() })
                .await
                .map_err(|e| write_err(loc, rel, e))?;
            if let Some(t) = progress {
                t.advance(n);
            }
            Ok(())
        }
        .boxed()
    }

    fn replace_if<'a>(&'a self, loc: &'a Location, rel: &'a str, swap: Swap<'a>) -> BoxFuture<'a, bool> {
        let Swap { parts, was, .. } = swap;
        async move {
            let mode = match was {
                None => PutMode::Create,
                Some(v) => {
                    PutMode::Update(object_store::UpdateVersion { e_tag: v.e_tag.clone(), version: v.version.clone() })
                }
            };
            let payload: PutPayload = parts.into_iter().collect();
            match self.store.put_opts(&self.obj(rel), payload, PutOptions { mode, ..Default::default() }).await {
                Ok(_) => Ok(true),
                Err(object_store::Error::Precondition { .. } | object_store::Error::AlreadyExists { .. }) => Ok(false),
                Err(object_store::Error::NotImplemented { .. }) => Err(Error::BadLocation {
                    location: loc.display().to_string(),
                    reason: "this store cannot replace an object conditionally (S3: set the storage option \
                             conditional_put=etag)"
                        .into(),
                }),
                Err(e) => Err(write_err(loc, rel, e)),
            }
        }
        .boxed()
    }

    fn delete<'a>(&'a self, loc: &'a Location, rel: &'a str) -> BoxFuture<'a, ()> {
        async move {
            match self.store.delete(&self.obj(rel)).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(write_err(loc, rel, e)),
            }
        }
        .boxed()
    }

    fn list<'a>(&'a self, loc: &'a Location, rel_dir: &'a str, keep: &'a Keep<'a>) -> BoxFuture<'a, Vec<Listed>> {
        async move {
            let prefix = self.obj(rel_dir);
            let mut s = self.store.list(Some(&prefix));
            let mut out = vec![];
            let (base_len, depth) = (self.base.parts().count(), prefix.parts().count() + 1);
            while let Some(m) = s.next().await {
                let m = m.map_err(|e| read_err(loc, rel_dir, e))?;
                // The folder's own objects, not its subfolders' (as on local disk).
                if m.location.parts().count() != depth {
                    continue;
                }
                let rel: Vec<String> = m.location.parts().skip(base_len).map(|p| p.as_ref().to_string()).collect();
                if keep(rel.last().map_or("", String::as_str)) {
                    out.push((rel.join("/"), m.size, std::time::SystemTime::from(m.last_modified)));
                }
            }
            out.sort();
            Ok(out)
        }
        .boxed()
    }

    fn top_names<'a>(&'a self, loc: &'a Location, limit: usize) -> BoxFuture<'a, Vec<String>> {
        async move {
            let listed = match self.store.list_with_delimiter(Some(&self.base)).await {
                Ok(l) => l,
                Err(object_store::Error::NotFound { .. }) => return Ok(vec![]),
                Err(e) => return Err(store_error(loc.display().to_string(), e)),
            };
            let name = |p: &ObjPath| p.filename().map(str::to_string);
            Ok(listed
                .common_prefixes
                .iter()
                .filter_map(name)
                .chain(listed.objects.iter().filter_map(|o| name(&o.location)))
                .take(limit)
                .collect())
        }
        .boxed()
    }

    fn remote(&self) -> Option<RemoteTuning> {
        self.tuning
    }

    fn read_only(&self) -> Option<&str> {
        self.read_only
    }

    fn sidecar(&self, suffix: &str) -> Option<Arc<dyn crate::Backend>> {
        let key = format!("{}{suffix}", self.base.as_ref());
        let base = ObjPath::parse(&key).ok()?;
        Some(Arc::new(ObjectBackend {
            store: self.store.clone(),
            base,
            tuning: self.tuning,
            read_only: self.read_only,
        }))
    }
}
