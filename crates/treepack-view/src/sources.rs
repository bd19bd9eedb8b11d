//! What the viewer shows: the location it was started on (a tree, or a repository whose trees
//! it opens by name), the other location of a diff, and the errors requests answer with.
//!
//! A request names the tree it reads by a source id: `a` (the location), `b` (the other) or
//! `@NAME` (tree NAME of the repository: the location itself, or the repository of a
//! `LOCATION@NAME`). Every tree is opened through the engine's reader, so the server reads
//! what the engine reads for that location and nothing else.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use treepack::format::manifest::{Entry, Stored};
use treepack::{Error, Location, Reader, Repository, StorageOptions, Tree};

/// An HTTP error: its status and the message the page shows (worded as the CLI's errors).
#[derive(Debug)]
pub(crate) struct ApiError {
    pub status: u16,
    pub message: String,
}

impl ApiError {
    pub fn bad(message: impl Into<String>) -> ApiError {
        ApiError { status: 400, message: message.into() }
    }
    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError { status: 404, message: message.into() }
    }
}

impl From<Error> for ApiError {
    /// The engine's error as `treepack: error: …`, the CLI's wording, with the status its kind
    /// calls for: a key path or name that is not there is a 404, a bad request a 400.
    fn from(e: Error) -> ApiError {
        let status = match e {
            Error::KeyNotFound { .. } | Error::NotFound { .. } => 404,
            Error::BadKeyPath { .. } | Error::BadSlice { .. } | Error::BadDType { .. } | Error::BadLocation { .. } => {
                400
            }
            _ => 500,
        };
        ApiError { status, message: format!("treepack: error: {e}") }
    }
}

pub(crate) type ApiResult<T> = std::result::Result<T, ApiError>;

/// Bytes and leaf counts of one subtree (shared objects counted once, where they are stored).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Sub {
    pub leaves: u64,
    pub arrays: u64,
    /// Logical bytes: arrays' nbytes plus strings' and bytes' sizes.
    pub bytes: u64,
}

impl Sub {
    fn add(&mut self, o: Sub) {
        self.leaves += o.leaves;
        self.arrays += o.arrays;
        self.bytes += o.bytes;
    }
}

/// A tree opened for viewing: its reader and, once a listing asks, the counts of every
/// container (one walk of the manifest, so that listing a level of a 1M-leaf tree costs the
/// rows shown, not a walk per row).
pub(crate) struct Opened {
    pub reader: Reader,
    pub display: String,
    counts: OnceLock<HashMap<usize, Sub>>,
    /// Where each shared object is stored, for refs' rows (one walk, when a ref is first shown).
    targets: OnceLock<HashMap<u64, String>>,
    /// The root hash, computed once (a walk of the whole manifest).
    root_hash: OnceLock<String>,
}

impl Opened {
    fn new(reader: Reader, display: String) -> Opened {
        Opened { reader, display, counts: OnceLock::new(), targets: OnceLock::new(), root_hash: OnceLock::new() }
    }

    pub fn root(&self) -> &Tree<Entry> {
        &self.reader.manifest().root
    }

    /// The tree's root hash (docs/format.md section 9), as hex.
    pub fn root_hash(&self) -> String {
        self.root_hash.get_or_init(|| self.reader.root_hash().to_hex()).clone()
    }

    /// The key path of the shared object `id` (what a ref stands for).
    pub fn target(&self, id: u64) -> Option<String> {
        let t = self
            .targets
            .get_or_init(|| self.root().shared_paths().into_iter().map(|(id, p)| (id, p.to_string())).collect());
        t.get(&id).cloned()
    }

    /// The counts of `node`, a node of this tree.
    pub fn sub(&self, node: &Tree<Entry>) -> Sub {
        match node {
            Tree::Leaf(e) => leaf_sub(e),
            Tree::Ref(_) => Sub::default(),
            Tree::Shared { node, .. } => self.sub(node),
            _ => {
                let m = self.counts.get_or_init(|| {
                    let mut m = HashMap::new();
                    count(self.root(), &mut m);
                    m
                });
                m.get(&(node as *const _ as usize)).copied().unwrap_or_default()
            }
        }
    }
}

fn leaf_sub(e: &Entry) -> Sub {
    let arrays = u64::from(matches!(e, Entry::Array(_)));
    let bytes = match e {
        Entry::Array(_) | Entry::Str(_) | Entry::Bytes(_) => e.nbytes(),
        _ => 0,
    };
    Sub { leaves: 1, arrays, bytes }
}

/// The counts of `t`, with every container's below it in `m` (by address).
pub(crate) fn count_into(t: &Tree<Entry>, m: &mut HashMap<usize, Sub>) -> Sub {
    count(t, m)
}

/// Post-order walk filling `m` with every container's counts, keyed by its address (the
/// manifest's tree never moves while its reader lives).
fn count(t: &Tree<Entry>, m: &mut HashMap<usize, Sub>) -> Sub {
    let s = match t {
        Tree::Leaf(e) => return leaf_sub(e),
        Tree::Ref(_) => return Sub::default(),
        Tree::Shared { node, .. } => return treepack::format::model::grow(|| count(node, m)),
        _ => {
            let mut s = Sub::default();
            for (_, c) in t.children() {
                s.add(treepack::format::model::grow(|| count(c, m)));
            }
            s
        }
    };
    m.insert(t as *const _ as usize, s);
    s
}

/// How many trees of a repository stay open at once (a history or a diff between two names
/// needs two; each holds its manifest in memory).
const OPEN_NAMES: usize = 4;

/// Everything the server reads from, opened at start.
pub(crate) struct State {
    /// The location as given, for the page's title and messages.
    pub location: String,
    pub other_location: Option<String>,
    main: Option<Arc<Opened>>,
    other: Option<Arc<Opened>>,
    /// The repository whose trees `@NAME` names: the location itself, or that of a
    /// `LOCATION@NAME`.
    repo: Option<(Repository, Location)>,
    names: Mutex<Vec<(String, Arc<Opened>)>>,
    pub history: Mutex<Option<Arc<serde_json::Value>>>,
}

impl State {
    /// Open `location` as a tree, or else as a repository; `other` as a tree.
    ///
    /// # Errors
    /// The error opening the tree when the location is neither a tree nor a repository, with
    /// the CLI's context (`cannot open `x``).
    pub fn open(location: &str, other: Option<&str>, so: &StorageOptions) -> treepack::Result<State> {
        let loc = Location::parse_with(location, so)?;
        let (main, repo) = match loc.tree_name() {
            Some(_) => {
                let r = open_tree(&loc, location)?;
                let base = loc.repository();
                (Some(r), Repository::open(base.clone()).ok().map(|x| (x, base)))
            }
            None => match open_tree(&loc, location) {
                Ok(r) => (Some(r), None),
                // Not a tree: a repository, or the tree's error stands.
                Err(e) => match Repository::open(loc.clone()) {
                    Ok(repo) => (None, Some((repo, loc))),
                    Err(_) => return Err(e),
                },
            },
        };
        let other = match other {
            Some(o) => Some(open_tree(&Location::parse_with(o, so)?, o)?),
            None => None,
        };
        Ok(State {
            location: location.to_string(),
            other_location: other.as_ref().map(|o| o.display.clone()),
            main,
            other,
            repo,
            names: Mutex::new(vec![]),
            history: Mutex::new(None),
        })
    }

    pub fn has_tree(&self) -> bool {
        self.main.is_some()
    }

    pub fn repository(&self) -> Option<&Repository> {
        self.repo.as_ref().map(|(r, _)| r)
    }

    /// The repository's display name (what `@NAME` is appended to).
    pub fn repository_display(&self) -> Option<String> {
        self.repo.as_ref().map(|(_, l)| l.display().to_string())
    }

    /// The tree a source id names (see the module's doc).
    pub fn tree(&self, id: &str) -> ApiResult<Arc<Opened>> {
        match id {
            "" | "a" => self.main.clone().ok_or_else(|| {
                ApiError::bad(format!("{} is a repository, not a tree: name one of its trees (@NAME)", self.location))
            }),
            "b" => self.other.clone().ok_or_else(|| ApiError::bad("no second location was given to compare with")),
            _ => match id.strip_prefix('@') {
                Some(name) => self.named(name),
                None => Err(ApiError::bad(format!("unknown tree `{id}`: use a, b or @NAME"))),
            },
        }
    }

    /// Tree `name` of the repository, opened once and kept among the last few used.
    fn named(&self, name: &str) -> ApiResult<Arc<Opened>> {
        let Some((repo, _)) = &self.repo else {
            return Err(ApiError::bad(format!("{} is not a repository: it has no tree @{name}", self.location)));
        };
        if let Some(o) = self.recent(name) {
            return Ok(o);
        }
        let loc = repo.tree(name)?;
        let shown = loc.display().to_string();
        let opened = open_tree(&loc, &shown)?;
        let mut names = self.names.lock().unwrap_or_else(|p| p.into_inner());
        names.retain(|(n, _)| n != name);
        names.push((name.to_string(), opened.clone()));
        if names.len() > OPEN_NAMES {
            names.remove(0);
        }
        Ok(opened)
    }

    fn recent(&self, name: &str) -> Option<Arc<Opened>> {
        let mut names = self.names.lock().unwrap_or_else(|p| p.into_inner());
        let i = names.iter().position(|(n, _)| n == name)?;
        let hit = names.remove(i);
        let o = hit.1.clone();
        names.push(hit);
        Some(o)
    }
}

/// Open the tree at `loc` through the engine's reader.
fn open_tree(loc: &Location, shown: &str) -> treepack::Result<Arc<Opened>> {
    Ok(Arc::new(Opened::new(treepack::open(loc.clone())?, shown.to_string())))
}

/// A string or bytes leaf's size and whether it is stored inline.
pub(crate) fn stored_size<T: AsRef<[u8]>>(s: &Stored<T>) -> (u64, bool) {
    match s {
        Stored::Inline(v) => (v.as_ref().len() as u64, true),
        Stored::Blob { size, .. } => (*size, false),
    }
}
