//! The trait every backend implements, and what its operations share.

use crate::{Location, ReadMode, RemoteTuning, Result};
use bytes::Bytes;
use std::ops::Range;
use std::time::SystemTime;

/// The future of a backend operation (boxed: backends are used as `dyn Backend`).
pub type BoxFuture<'a, T> = futures::future::BoxFuture<'a, Result<T>>;

/// An object found by a listing: its path relative to the location, its size in bytes and
/// when it was last modified.
pub type Listed = (String, u64, SystemTime);

/// Where bytes moved are reported as they move (a progress bar's counter).
pub trait Progress: Sync {
    /// `bytes` more were read or written.
    fn advance(&self, bytes: u64);
}

/// The names of a folder a listing keeps (see [`Backend::list`]).
pub type Keep<'k> = dyn Fn(&str) -> bool + Sync + 'k;

/// Byte ranges of one object to read, as [`Backend::read_ranges`] gets them.
pub struct RangeRead<'a> {
    /// The ranges, answered in this order.
    pub ranges: Vec<Range<u64>>,
    /// How a local read treats the page cache.
    pub mode: ReadMode,
    /// Hears of the bytes as they arrive.
    pub progress: Option<&'a dyn Progress>,
}

/// An object to write, as [`Backend::put`] gets it.
pub struct Write<'a> {
    /// The object's bytes, in parts written one after the other.
    pub parts: Vec<Bytes>,
    /// Fail with [`Error::AlreadyExists`](crate::Error::AlreadyExists) if the object exists.
    pub create_only: bool,
    /// Survive a machine crash once written (object stores' writes always do).
    pub durable: bool,
    /// Hears of the bytes written.
    pub progress: Option<&'a dyn Progress>,
}

/// An object to write part by part, as [`Backend::put_stream`] gets it: each part is asked
/// for once the one before is written (and may be dropped then).
pub struct WriteStream<'a> {
    /// The object's parts, in order; an error ends the write (nothing is committed).
    pub parts: Box<dyn Iterator<Item = Result<Bytes>> + Send>,
    /// Fail with [`Error::AlreadyExists`](crate::Error::AlreadyExists) if the object exists.
    pub create_only: bool,
    /// Survive a machine crash once written.
    pub durable: bool,
    /// Hears of the bytes written.
    pub progress: Option<&'a dyn Progress>,
}

/// A compare-and-swap replace, as [`Backend::replace_if`] gets it.
pub struct Swap<'a> {
    /// The new object's bytes.
    pub parts: Vec<Bytes>,
    /// The version that must still be there (`None`: the object must still not exist).
    pub was: Option<&'a Version>,
    /// Survive a machine crash once written.
    pub durable: bool,
}

/// An object's version as read: what a compare-and-swap replace checks is still there.
#[derive(Debug, Clone)]
pub struct Version {
    pub(crate) e_tag: Option<String>,
    pub(crate) version: Option<String>,
    /// The bytes read (local files are compared by content).
    pub(crate) bytes: Bytes,
}

/// A place where objects are kept, rooted at one location: a local folder or single file, an
/// in-memory bucket's prefix, an object store's prefix. Objects are named by `/`-separated
/// paths relative to that root; `""` and `"."` name the root itself (a single file).
///
/// Every operation gets the [`Location`] it serves, for what errors say (its display string,
/// its files' names, [`Location::not_found`]) and for its [`IoStats`](crate::IoStats): reads are
/// counted by the backend (as many requests as it made), writes by the location. The
/// capabilities only local files have (positioned reads into the caller's memory, memory maps,
/// read-ahead hints, `O_DIRECT`, save markers) are not part of the trait: a backend that has
/// them returns its [`local`](Backend::local) view.
///
/// The backends are this crate's modules, and `tests/conformance.rs` holds each to the same
/// behaviour: [`local`](crate::local), [`memory`](crate::memory), [`object`](crate::object).
pub trait Backend: std::fmt::Debug + Send + Sync {
    /// Read a whole object and its version, or `None` if it does not exist. `limit` caps the
    /// size accepted ([`Error::LimitExceeded`](crate::Error::LimitExceeded) beyond it).
    fn get<'a>(&'a self, loc: &'a Location, rel: &'a str, limit: u64) -> BoxFuture<'a, Option<(Bytes, Version)>>;

    /// Read byte ranges of one object, in the order asked.
    fn read_ranges<'a>(&'a self, loc: &'a Location, rel: &'a str, read: RangeRead<'a>) -> BoxFuture<'a, Vec<Bytes>>;

    /// Read the last `n` bytes of an object (all of it if smaller), with its total size.
    fn read_suffix<'a>(&'a self, loc: &'a Location, rel: &'a str, n: u64) -> BoxFuture<'a, (Bytes, u64)>;

    /// The size of an object ([`Error::NotFound`](crate::Error::NotFound) when missing).
    fn size<'a>(&'a self, loc: &'a Location, rel: &'a str) -> BoxFuture<'a, u64>;

    /// Whether an object exists (an empty one does).
    fn exists<'a>(&'a self, loc: &'a Location, rel: &'a str) -> BoxFuture<'a, bool>;

    /// Write an object atomically: readers see the old object or the whole new one.
    fn put<'a>(&'a self, loc: &'a Location, rel: &'a str, write: Write<'a>) -> BoxFuture<'a, ()>;

    /// Write an object atomically from parts made as it is written (bounded memory for a big
    /// object made on the fly). By default the parts are gathered, then [`put`](Self::put).
    fn put_stream<'a>(&'a self, loc: &'a Location, rel: &'a str, write: WriteStream<'a>) -> BoxFuture<'a, ()> {
        use futures::FutureExt;
        async move {
            let WriteStream { parts, create_only, durable, progress } = write;
            let parts = parts.collect::<Result<Vec<Bytes>>>()?;
            self.put(loc, rel, Write { parts, create_only, durable, progress }).await
        }
        .boxed()
    }

    /// Replace an object only if it is still the version `swap.was`. `false`, with nothing
    /// written, when another writer changed it first.
    fn replace_if<'a>(&'a self, loc: &'a Location, rel: &'a str, swap: Swap<'a>) -> BoxFuture<'a, bool>;

    /// Delete an object; a missing one is not an error.
    fn delete<'a>(&'a self, loc: &'a Location, rel: &'a str) -> BoxFuture<'a, ()>;

    /// The objects directly in a folder (not in its subfolders), as paths relative to the root,
    /// of the names (last path segment) `keep` accepts; sorted. A folder that is not there
    /// lists empty.
    fn list<'a>(&'a self, loc: &'a Location, rel_dir: &'a str, keep: &'a Keep<'a>) -> BoxFuture<'a, Vec<Listed>>;

    /// The names directly inside the root (files and folders, links not followed), at most
    /// `limit`; empty when there is nothing there.
    fn top_names<'a>(&'a self, loc: &'a Location, limit: usize) -> BoxFuture<'a, Vec<String>>;

    /// How requests are shaped, for a remote store (`None` elsewhere).
    fn remote(&self) -> Option<RemoteTuning> {
        None
    }

    /// Why the backend cannot be written, if it cannot (HTTP).
    fn read_only(&self) -> Option<&str> {
        None
    }

    /// The local-only capabilities, for a backend on local disk.
    fn local(&self) -> Option<&crate::local::Local> {
        None
    }

    /// For a backend rooted at one file, the backend of the file beside it named as it is plus
    /// `suffix` (`model.tpk` → `model.tpk.sig`): where a single file keeps what travels with it
    /// (its signature). `None` where the backend cannot say.
    fn sidecar(&self, _suffix: &str) -> Option<std::sync::Arc<dyn Backend>> {
        None
    }
}

/// `parts`, counting the bytes of those taken: the count is read once the write is done.
#[allow(clippy::type_complexity)]
pub(crate) fn counted(
    parts: Box<dyn Iterator<Item = Result<Bytes>> + Send>,
) -> (Box<dyn Iterator<Item = Result<Bytes>> + Send>, std::sync::Arc<std::sync::atomic::AtomicU64>) {
    let n = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let seen = n.clone();
    let parts = Box::new(parts.inspect(move |p| {
        if let Ok(b) = p {
            seen.fetch_add(b.len() as u64, std::sync::atomic::Ordering::Relaxed);
        }
    }));
    (parts, n)
}

/// Run blocking work (a file read) from async code: on tokio's blocking pool when a runtime
/// drives the caller, right here otherwise — so each read is written once, as async code, and a
/// local future can be driven on the calling thread with no runtime at all.
pub(crate) async fn maybe_spawn_blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    match tokio::runtime::Handle::try_current() {
        Ok(h) => h.spawn_blocking(f).await.map_err(|e| crate::Error::internal(format!("blocking task failed: {e}")))?,
        Err(_) => f(),
    }
}
