//! In-process stores: `memory://bucket/prefix` names a bucket shared by the whole process (for
//! tests, and for handing a tree between parts of one program), and fresh stores of their own
//! serve a caller that needs a place no name reaches. Both are object_store's `InMemory`,
//! served by the [object backend](crate::object) as an in-process store: no multipart uploads,
//! no request shaping, existence by a metadata lookup, and futures that complete at once (no
//! runtime needed to drive them).

use crate::object::ObjectBackend;
use crate::Layout;
use object_store::memory::InMemory;
use object_store::path::Path as ObjPath;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

fn buckets() -> &'static Mutex<HashMap<String, Arc<InMemory>>> {
    static M: OnceLock<Mutex<HashMap<String, Arc<InMemory>>>> = OnceLock::new();
    M.get_or_init(Default::default)
}

/// The backend of `memory://` + `rest` (`bucket/prefix`): the process-wide bucket (made on
/// first use) under that prefix, and the layout the prefix asks for. Errors are plain reasons.
pub(crate) fn open(rest: &str) -> Result<(ObjectBackend, Layout), String> {
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let store = buckets()
        .lock()
        .map_err(|_| "memory store registry poisoned".to_string())?
        .entry(bucket.to_string())
        .or_insert_with(|| Arc::new(InMemory::new()))
        .clone();
    let base = ObjPath::parse(prefix.trim_matches('/')).map_err(|e| e.to_string())?;
    Ok((ObjectBackend::in_process(store, base), Layout::of(prefix, false)))
}

/// A fresh in-memory store of its own, at its root.
pub(crate) fn fresh() -> ObjectBackend {
    ObjectBackend::in_process(Arc::new(InMemory::new()), ObjPath::default())
}

/// Drop the bucket `bucket` from the registry (its memory is freed once no location uses it).
/// Returns whether there was one.
pub(crate) fn forget(bucket: &str) -> bool {
    buckets().lock().map(|mut m| m.remove(bucket).is_some()).unwrap_or(false)
}
