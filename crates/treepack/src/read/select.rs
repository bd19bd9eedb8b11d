//! Selections: which leaves a load reads (`select` globs, `like` keep sets) and which records
//! and custom nodes it builds.

use super::*;

pub(super) fn join_path(prefix: &str, p: &str) -> String {
    match (prefix.is_empty(), p.is_empty()) {
        (true, _) => p.to_string(),
        (false, true) => prefix.to_string(),
        (false, false) => format!("{prefix}/{p}"),
    }
}

/// The key paths (from the root: `prefix` is `subtree`'s own path) of the records and custom
/// nodes that a load with `opts` does not build, because the selection takes neither their own
/// path nor any leaf below them. They come back as `None`: a partial load constructs, and so
/// needs trust for, only what it returns (issue 23). Empty when everything is loaded.
///
/// # Errors
/// [`Error::BadKeyPath`] for a malformed selection glob.
pub fn unbuilt_objects<L>(subtree: &Tree<L>, prefix: &str, opts: &LoadOptions) -> Result<HashSet<String>> {
    let sel = Selection::new(&opts.select)?;
    let mut out = HashSet::new();
    if !(sel.is_all() && opts.keep.is_none()) {
        mark_unbuilt(subtree, &mut prefix.to_string(), &sel, opts, &mut out);
    }
    Ok(out)
}

/// Whether anything below `t` (at `path`) is selected; records and custom nodes with nothing
/// selected go into `out`.
pub(super) fn mark_unbuilt<L>(
    t: &Tree<L>,
    path: &mut String,
    sel: &Selection,
    opts: &LoadOptions,
    out: &mut HashSet<String>,
) -> bool {
    let t = t.unshared();
    let object = matches!(t, Tree::Record { .. } | Tree::Custom { .. });
    if matches!(t, Tree::Leaf(_) | Tree::Ref(_)) || (object && t.children().is_empty()) {
        let taken = is_selected(sel, opts, path);
        if object && !taken {
            out.insert(path.clone());
        }
        return taken;
    }
    let mut any = false;
    for (step, c) in t.children() {
        let len = path.len();
        if len > 0 {
            path.push('/');
        }
        keypath::push_step_text(path, &step);
        any |= crate::format::model::grow(|| mark_unbuilt(c, path, sel, opts, out));
        path.truncate(len);
    }
    if object && !any {
        out.insert(path.clone());
    }
    any
}

/// `n` with the records and custom nodes at the paths in `unbuilt` replaced by `None`.
pub(super) fn prune(n: Node, path: &mut String, unbuilt: &HashSet<String>) -> Node {
    fn below(path: &mut String, step: Step<'_>, c: Node, unbuilt: &HashSet<String>) -> Node {
        let len = path.len();
        if len > 0 {
            path.push('/');
        }
        keypath::push_step_text(path, &step);
        let out = crate::format::model::grow(|| prune(c, path, unbuilt));
        path.truncate(len);
        out
    }
    let named = |v: Vec<(String, Node)>, path: &mut String| -> Vec<(String, Node)> {
        v.into_iter()
            .map(|(k, c)| {
                let c = below(path, Step::Name(&k), c, unbuilt);
                (k, c)
            })
            .collect()
    };
    match n {
        Tree::Record { .. } | Tree::Custom { .. } if unbuilt.contains(path.as_str()) => Tree::Leaf(Leaf::None),
        Tree::Leaf(l) => Tree::Leaf(l),
        Tree::List(v) => {
            Tree::List(v.into_iter().enumerate().map(|(i, c)| below(path, Step::Index(i), c, unbuilt)).collect())
        }
        Tree::Tuple(v) => {
            Tree::Tuple(v.into_iter().enumerate().map(|(i, c)| below(path, Step::Index(i), c, unbuilt)).collect())
        }
        Tree::Dict(v) => Tree::Dict(
            v.into_iter()
                .map(|(k, c)| {
                    let c = below(path, Step::Key(&k), c, unbuilt);
                    (k, c)
                })
                .collect(),
        ),
        Tree::Record { type_name, fields } => Tree::Record { type_name, fields: named(fields, path) },
        Tree::Custom { type_name, data, children } => Tree::Custom { type_name, data, children: named(children, path) },
        Tree::Shared { id, node } => match prune(*node, path, unbuilt) {
            // An object not built is no object: nothing to share.
            Tree::Leaf(Leaf::None) => Tree::Leaf(Leaf::None),
            node => Tree::Shared { id, node: Box::new(node) },
        },
        Tree::Ref(id) => Tree::Ref(id),
    }
}

pub(super) fn is_selected(sel: &Selection, opts: &LoadOptions, path: &str) -> bool {
    if let Some(keep) = &opts.keep {
        if !keep.contains(path) {
            return false;
        }
    }
    sel.is_all() || sel.selects_texts(&keypath::split(path).unwrap_or_default())
}

/// A partial load of a tree with shared nodes, closed under refs: `opts` with the selection
/// replaced by the exact leaves to read (`keep`), where a selected ref place (or a selected
/// place below one) also selects the whole object it refers to, wherever that object sits. So
/// a selection that picks only a ref still loads the object, which then comes back at its own
/// place too (the one place a shared object is stored). `None` when nothing changes (a whole
/// load, or no refs).
///
/// # Errors
/// [`Error::BadKeyPath`] for a malformed selection glob.
pub fn close_under_refs<L>(subtree: &Tree<L>, prefix: &str, opts: &LoadOptions) -> Result<Option<LoadOptions>> {
    let sel = Selection::new(&opts.select)?;
    if (sel.is_all() && opts.keep.is_none()) || !subtree.has_refs() {
        return Ok(None);
    }
    // Every leaf and ref place with its path; the shared nodes' paths by id.
    let mut places: Vec<(String, Option<u64>)> = Vec::new();
    let mut shared: HashMap<u64, String> = HashMap::new();
    fn walk<L>(
        t: &Tree<L>,
        path: &mut String,
        places: &mut Vec<(String, Option<u64>)>,
        shared: &mut HashMap<u64, String>,
    ) {
        match t {
            Tree::Leaf(_) => places.push((path.clone(), None)),
            Tree::Ref(id) => places.push((path.clone(), Some(*id))),
            Tree::Shared { id, node } => {
                shared.insert(*id, path.clone());
                crate::format::model::grow(|| walk(node, path, places, shared));
            }
            t => {
                for (step, c) in t.children() {
                    let len = path.len();
                    if len > 0 {
                        path.push('/');
                    }
                    keypath::push_step_text(path, &step);
                    crate::format::model::grow(|| walk(c, path, places, shared));
                    path.truncate(len);
                }
            }
        }
    }
    walk(subtree, &mut prefix.to_string(), &mut places, &mut shared);
    let mut keep: HashSet<String> = HashSet::new();
    let mut objects: Vec<u64> = Vec::new();
    for (p, r) in &places {
        if is_selected(&sel, opts, p) {
            keep.insert(p.clone());
            objects.extend(*r);
        }
    }
    // Whole objects of selected refs, and of refs inside those objects, to a fixpoint.
    let mut done: HashSet<u64> = HashSet::new();
    while let Some(id) = objects.pop() {
        if !done.insert(id) {
            continue;
        }
        let Some(root) = shared.get(&id) else { continue };
        let inside = |p: &str| root.is_empty() || p == root || p.starts_with(&format!("{root}/"));
        for (p, r) in places.iter().filter(|(p, _)| inside(p)) {
            keep.insert(p.clone());
            objects.extend(*r);
        }
    }
    Ok(Some(LoadOptions { select: vec![], keep: Some(keep), ..opts.clone() }))
}

/// `place` (a subtree of `root`) made self-contained: a ref inside it to an object stored
/// outside it gets that object here (as a shared node, so further refs to it inside stay
/// refs), ids renumbered 0, 1, 2, ... in document order. Loading a place of a tree with shared
/// objects loads what it refers to, wherever that is stored.
pub fn localize(root: &Tree<Entry>, place: &Tree<Entry>) -> Tree<Entry> {
    fn walk(root: &Tree<Entry>, t: &Tree<Entry>, ids: &mut HashMap<u64, u64>) -> Tree<Entry> {
        let seq = |v: &Vec<Tree<Entry>>, ids: &mut HashMap<u64, u64>| -> Vec<Tree<Entry>> {
            v.iter().map(|c| crate::format::model::grow(|| walk(root, c, ids))).collect()
        };
        let named = |v: &Vec<(String, Tree<Entry>)>, ids: &mut HashMap<u64, u64>| -> Vec<(String, Tree<Entry>)> {
            v.iter().map(|(k, c)| (k.clone(), crate::format::model::grow(|| walk(root, c, ids)))).collect()
        };
        match t {
            Tree::Leaf(e) => Tree::Leaf(e.clone()),
            Tree::List(v) => Tree::List(seq(v, ids)),
            Tree::Tuple(v) => Tree::Tuple(seq(v, ids)),
            Tree::Dict(v) => Tree::Dict(
                v.iter().map(|(k, c)| (k.clone(), crate::format::model::grow(|| walk(root, c, ids)))).collect(),
            ),
            Tree::Record { type_name, fields } => {
                Tree::Record { type_name: type_name.clone(), fields: named(fields, ids) }
            }
            Tree::Custom { type_name, data, children } => {
                Tree::Custom { type_name: type_name.clone(), data: data.clone(), children: named(children, ids) }
            }
            Tree::Shared { id, node } => {
                let new = ids.len() as u64;
                ids.insert(*id, new);
                Tree::Shared { id: new, node: Box::new(crate::format::model::grow(|| walk(root, node, ids))) }
            }
            Tree::Ref(id) => match ids.get(id) {
                Some(new) => Tree::Ref(*new),
                // Stored outside: brought here.
                None => match crate::format::refs::find_shared(root, *id) {
                    Some(shared) => crate::format::model::grow(|| walk(root, shared, ids)),
                    None => Tree::Ref(*id),
                },
            },
        }
    }
    walk(root, place, &mut HashMap::new())
}
