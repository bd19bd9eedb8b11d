//! What a location's folder already holds, before a save writes into it.

use super::{Layout, Location};
use crate::error::{Error, Result};

impl Location {
    /// The names directly inside a directory location (files and folders, links included, not
    /// followed), at most `limit` of them; empty when the folder does not exist yet. Remote
    /// stores answer with one delimited listing (one request).
    ///
    /// # Errors
    /// Storage errors listing the folder.
    pub async fn top_entries(&self, limit: usize) -> Result<Vec<String>> {
        if self.layout != Layout::Directory {
            return Ok(vec![]);
        }
        if let Some(dir) = &self.local {
            let rd = match std::fs::read_dir(dir) {
                Ok(rd) => rd,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
                // A file where the folder should be: the save's own error says so.
                Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => return Ok(vec![]),
                Err(e) => return Err(Error::Io { path: dir.clone(), source: e }),
            };
            return Ok(rd.flatten().take(limit).map(|e| e.file_name().to_string_lossy().into_owned()).collect());
        }
        let listed = match self.store.list_with_delimiter(Some(&self.base)).await {
            Ok(l) => l,
            Err(object_store::Error::NotFound { .. }) => return Ok(vec![]),
            Err(e) => return Err(super::store_error(self.display.clone(), e)),
        };
        let name = |p: &object_store::path::Path| p.filename().map(str::to_string);
        Ok(listed
            .common_prefixes
            .iter()
            .filter_map(name)
            .chain(listed.objects.iter().filter_map(|o| name(&o.location)))
            .take(limit)
            .collect())
    }
}
