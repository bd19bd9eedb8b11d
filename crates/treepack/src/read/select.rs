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
    let children = t.children();
    // A place of its own: a leaf, a ref, and anything with no children, an empty list or dict
    // too (a record whose fields are `[]` and `{}` is selected by them, as by any field).
    if matches!(t, Tree::Leaf(_) | Tree::Ref(_)) || children.is_empty() {
        let taken = is_selected(sel, opts, path);
        if object && !taken {
            out.insert(path.clone());
        }
        return taken;
    }
    let mut any = false;
    for (step, c) in children {
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

/// `n` with the records and custom nodes at the paths in `unbuilt` replaced by `None`, and the
/// refs to the shared objects that goes with them too (a selected ref place would have selected
/// its object: see [`close_selection`]). The shared objects left are numbered again 0, 1, 2,
/// ... in document order, as a builder expects them.
pub(super) fn prune(n: Node, path: &mut String, unbuilt: &HashSet<String>) -> Node {
    prune_at(n, path, unbuilt, &mut Renumber::default())
}

/// Shared ids while pruning: those dropped, and the new id of each kept.
#[derive(Default)]
struct Renumber {
    gone: HashSet<u64>,
    ids: HashMap<u64, u64>,
}

impl Renumber {
    /// Every shared id inside `t`, dropped with it.
    fn drop_all(&mut self, t: &Node) {
        if let Tree::Shared { id, .. } = t {
            self.gone.insert(*id);
        }
        for (_, c) in t.children() {
            crate::format::model::grow(|| self.drop_all(c));
        }
    }
}

fn prune_at(n: Node, path: &mut String, unbuilt: &HashSet<String>, ids: &mut Renumber) -> Node {
    let below = |path: &mut String, step: Step<'_>, c: Node, ids: &mut Renumber| -> Node {
        let len = path.len();
        if len > 0 {
            path.push('/');
        }
        keypath::push_step_text(path, &step);
        let out = crate::format::model::grow(|| prune_at(c, path, unbuilt, ids));
        path.truncate(len);
        out
    };
    let object_gone =
        |t: &Node, path: &str| matches!(t, Tree::Record { .. } | Tree::Custom { .. }) && unbuilt.contains(path);
    match n {
        t if object_gone(&t, path) => {
            ids.drop_all(&t);
            Tree::Leaf(Leaf::None)
        }
        Tree::Leaf(l) => Tree::Leaf(l),
        Tree::List(v) => {
            Tree::List(v.into_iter().enumerate().map(|(i, c)| below(path, Step::Index(i), c, ids)).collect())
        }
        Tree::Tuple(v) => {
            Tree::Tuple(v.into_iter().enumerate().map(|(i, c)| below(path, Step::Index(i), c, ids)).collect())
        }
        Tree::Dict(v) => Tree::Dict(
            v.into_iter()
                .map(|(k, c)| {
                    let c = below(path, Step::Key(&k), c, ids);
                    (k, c)
                })
                .collect(),
        ),
        Tree::Record { type_name, fields } => Tree::Record {
            type_name,
            fields: fields.into_iter().map(|(k, c)| (k.clone(), below(path, Step::Name(&k), c, ids))).collect(),
        },
        Tree::Custom { type_name, data, children } => Tree::Custom {
            type_name,
            data,
            children: children.into_iter().map(|(k, c)| (k.clone(), below(path, Step::Name(&k), c, ids))).collect(),
        },
        Tree::Shared { id, node } => {
            if object_gone(&node, path) {
                // An object not built is no object: nothing to share.
                ids.drop_all(&node);
                ids.gone.insert(id);
                return Tree::Leaf(Leaf::None);
            }
            // Numbered as it begins (document order), before what it holds.
            let new = ids.ids.len() as u64;
            ids.ids.insert(id, new);
            Tree::Shared { id: new, node: Box::new(prune_at(*node, path, unbuilt, ids)) }
        }
        Tree::Ref(id) if ids.gone.contains(&id) => Tree::Leaf(Leaf::None),
        Tree::Ref(id) => Tree::Ref(ids.ids.get(&id).copied().unwrap_or(id)),
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

/// A partial load closed under what must come whole: `opts` with the selection replaced by
/// the exact places to read (`keep`), where
/// - a selected ref place (or a selected place below one) also selects the whole object it
///   refers to, wherever that object sits: a selection that picks only a ref still loads the
///   object, which then comes back at its own place too (the one place a shared object is
///   stored);
/// - with [`LoadOptions::partial_types`] set, anything selected inside a custom node selects
///   all of it, unless its type may be built in part (a DataFrame or a sparse tensor with some
///   of its parts `None` cannot be built; an `OrderedDict` of tensors can).
///
/// Nodes without children (records, custom nodes, empty lists, tuples and dicts) are places of
/// their own. `None` when nothing
/// changes (a whole load, or nothing to close over).
///
/// # Errors
/// [`Error::BadKeyPath`] for a malformed selection glob.
pub fn close_selection<L>(subtree: &Tree<L>, prefix: &str, opts: &LoadOptions) -> Result<Option<LoadOptions>> {
    let sel = Selection::new(&opts.select)?;
    if sel.is_all() && opts.keep.is_none() {
        return Ok(None);
    }
    let budget = crate::format::manifest::outline::tree_path_budget(subtree);
    let mut w = Places { partial: opts.partial_types.as_ref(), budget, ..Places::default() };
    w.walk(subtree, &mut prefix.to_string());
    if w.over_budget {
        // Each place holds its key path, as a structure listing's rows do (and is bounded alike).
        return Err(Error::manifest("", prefix, crate::format::manifest::outline::PATHS_TOO_LONG));
    }
    if w.shared.is_empty() && w.whole.is_empty() {
        return Ok(None);
    }
    let n = w.places.len();
    // A pattern that goes on below a ref place (`b/1` where `b` is a ref) selects through it:
    // the object the ref names comes whole.
    let mut kept: Vec<bool> = w
        .places
        .iter()
        .map(|p| {
            is_selected(&sel, opts, &p.path)
                || (p.refers.is_some()
                    && opts.keep.is_none()
                    && sel.reaches_below_texts(&keypath::split(&p.path).unwrap_or_default()))
        })
        .collect();
    let mut queue: Vec<usize> = (0..n).filter(|&i| kept[i]).collect();
    let mut expanded = vec![false; w.whole.len()];
    let mut done: HashSet<u64> = HashSet::new();
    // Each place, once kept, keeps the object its ref names and the whole nodes around it; each
    // object and node is expanded once, so the work is linear in the places they span.
    let keep_range = |(s, e): (usize, usize), kept: &mut Vec<bool>, queue: &mut Vec<usize>| {
        for (j, k) in kept.iter_mut().enumerate().take(e.min(n)).skip(s) {
            if !*k {
                *k = true;
                queue.push(j);
            }
        }
    };
    while let Some(i) = queue.pop() {
        if let Some(id) = w.places[i].refers {
            if done.insert(id) {
                if let Some(&range) = w.shared.get(&id) {
                    keep_range(range, &mut kept, &mut queue);
                }
            }
        }
        let mut a = w.places[i].inside;
        while let Some(x) = a {
            if expanded[x] {
                break;
            }
            expanded[x] = true;
            keep_range(w.whole[x].range, &mut kept, &mut queue);
            a = w.whole[x].parent;
        }
    }
    let keep = w.places.into_iter().zip(kept).filter(|(_, k)| *k).map(|(p, _)| p.path).collect();
    Ok(Some(LoadOptions { select: vec![], keep: Some(keep), ..opts.clone() }))
}

/// One place of a [`close_selection`] walk: a leaf, a ref, or a node without children (a
/// record, a custom node, an empty list, tuple or dict).
struct Place {
    path: String,
    /// The shared object a ref names.
    refers: Option<u64>,
    /// The innermost custom node around it that comes whole (an index into `Places::whole`).
    inside: Option<usize>,
}

/// A custom node that is built whole: the places it spans and the one around it.
struct Whole {
    range: (usize, usize),
    parent: Option<usize>,
}

#[derive(Default)]
struct Places<'a> {
    places: Vec<Place>,
    /// The places each shared object spans, by id.
    shared: HashMap<u64, (usize, usize)>,
    whole: Vec<Whole>,
    open: Vec<usize>,
    partial: Option<&'a HashSet<String>>,
    /// Bytes of key paths the places may still take.
    budget: usize,
    over_budget: bool,
}

impl Places<'_> {
    fn place(&mut self, path: &str, refers: Option<u64>) {
        match self.budget.checked_sub(path.len()) {
            Some(left) if !self.over_budget => self.budget = left,
            _ => {
                self.over_budget = true;
                return;
            }
        }
        self.places.push(Place { path: path.to_string(), refers, inside: self.open.last().copied() });
    }

    fn walk<L>(&mut self, t: &Tree<L>, path: &mut String) {
        match t {
            Tree::Leaf(_) => return self.place(path, None),
            Tree::Ref(id) => return self.place(path, Some(*id)),
            Tree::Shared { id, node } => {
                let s = self.places.len();
                crate::format::model::grow(|| self.walk(node, path));
                self.shared.insert(*id, (s, self.places.len()));
                return;
            }
            Tree::Record { fields, .. } if fields.is_empty() => return self.place(path, None),
            Tree::Custom { children, .. } if children.is_empty() => return self.place(path, None),
            // (an empty list or dict: the field of a record that selecting it builds)
            Tree::List(v) | Tree::Tuple(v) if v.is_empty() => return self.place(path, None),
            Tree::Dict(v) if v.is_empty() => return self.place(path, None),
            _ => {}
        }
        // A node built whole spans all its places; one built in part that holds its attributes
        // in a `PARTIAL_ATTRS` child spans that child's places: whatever else of it is kept
        // keeps them too.
        let (whole, attrs) = match (t, self.partial) {
            (Tree::Custom { type_name, children, .. }, Some(partial)) => {
                let in_part = partial.contains(type_name);
                if in_part && !children.iter().any(|(k, _)| super::is_attrs_child(t, k)) {
                    (None, false)
                } else {
                    let x = self.whole.len();
                    let start = if in_part { usize::MAX } else { self.places.len() };
                    self.whole.push(Whole { range: (start, usize::MAX), parent: self.open.last().copied() });
                    self.open.push(x);
                    (Some(x), in_part)
                }
            }
            _ => (None, false),
        };
        for (step, c) in t.children() {
            let len = path.len();
            if len > 0 {
                path.push('/');
            }
            keypath::push_step_text(path, &step);
            let own = attrs && matches!(step, crate::format::model::Step::Name(k) if super::is_attrs_child(t, k));
            if let (true, Some(x)) = (own, whole) {
                self.whole[x].range.0 = self.places.len();
            }
            crate::format::model::grow(|| self.walk(c, path));
            if let (true, Some(x)) = (own, whole) {
                self.whole[x].range.1 = self.places.len();
            }
            path.truncate(len);
        }
        if attrs {
            self.open.pop();
            return;
        }
        if let Some(x) = whole {
            self.open.pop();
            self.whole[x].range.1 = self.places.len();
        }
    }
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
            // An object already brought here (the place asked for is a ref to an object whose
            // own place lies inside another object it refers to: a child that holds its
            // parent): a ref to it, not a second copy.
            Tree::Shared { id, node } => match ids.get(id) {
                Some(&new) => Tree::Ref(new),
                None => {
                    let new = ids.len() as u64;
                    ids.insert(*id, new);
                    Tree::Shared { id: new, node: Box::new(crate::format::model::grow(|| walk(root, node, ids))) }
                }
            },
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

/// The `select` patterns (not marked optional with a leading `?`) that match no place of
/// `subtree` (at `prefix`): no node's key path, and no ref place they go on below (a pattern
/// through a ref reads the object it names). A load refuses these: a mistyped key path must not
/// load as `None` without a word.
///
/// # Errors
/// [`Error::BadKeyPath`] for a malformed pattern.
pub fn unmatched_patterns<L>(subtree: &Tree<L>, prefix: &str, patterns: &[String]) -> Result<Vec<String>> {
    let sel = Selection::new(patterns)?;
    let mut left: Vec<&keypath::Glob> = sel.globs().iter().filter(|g| !g.optional()).collect();
    if left.is_empty() {
        return Ok(vec![]);
    }
    let mut path: Vec<String> = if prefix.is_empty() { vec![] } else { keypath::split(prefix)? };
    fn walk<L>(t: &Tree<L>, path: &mut Vec<String>, left: &mut Vec<&keypath::Glob>) {
        left.retain(|g| !(g.matches(path) || (matches!(t, Tree::Ref(_)) && g.reaches_below(path))));
        if left.is_empty() {
            return;
        }
        for (step, child) in t.children() {
            path.push(keypath::Segment::from_step_pub(&step).text());
            crate::format::model::grow(|| walk(child, path, left));
            path.pop();
            if left.is_empty() {
                return;
            }
        }
    }
    walk(subtree, &mut path, &mut left);
    Ok(left.into_iter().map(|g| g.source().to_string()).collect())
}
