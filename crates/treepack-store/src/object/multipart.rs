//! Multipart uploads of large objects to remote stores: parts of `multipart_part_size` bytes,
//! `max_concurrency` in flight, progress as parts go, and an abort on failure (an upload is
//! invisible until it completes).

use super::RemoteTuning;
use crate::backend::Progress;
use bytes::Bytes;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt, WriteMultipart};

/// Upload `parts` as the object `path` in parts.
pub(super) async fn put(
    store: &dyn ObjectStore,
    path: &ObjPath,
    parts: Vec<Bytes>,
    t: RemoteTuning,
    progress: Option<&dyn Progress>,
) -> Result<(), object_store::Error> {
    let upload = store.put_multipart(path).await?;
    let mut w = WriteMultipart::new_with_chunk_size(upload, t.multipart_part_size);
    let result: Result<(), object_store::Error> = async {
        for p in parts {
            // Feed in part-sized pieces so progress and back-pressure track real uploads.
            let mut off = 0;
            while off < p.len() {
                let end = (off + t.multipart_part_size).min(p.len());
                w.wait_for_capacity(t.max_concurrency).await?;
                w.put(p.slice(off..end));
                if let Some(tr) = progress {
                    tr.advance((end - off) as u64);
                }
                off = end;
            }
        }
        Ok(())
    }
    .await;
    match result {
        Ok(()) => w.finish().await.map(|_| ()),
        Err(e) => {
            // Best effort: the upload was never visible; aborting frees the stored parts.
            let _ = w.abort().await;
            Err(e)
        }
    }
}
