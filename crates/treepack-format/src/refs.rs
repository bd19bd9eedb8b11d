//! Shared objects and refs (format 1.2, docs/format.md section 4): the rule for their ids,
//! checked by every reader and writer through [`RefCheck`] or [`check_refs`], and how a ref
//! finds its object.

use crate::model::{grow, Step, Tree};

/// The rule for shared ids (format 1.2), applied as nodes are met in document order: shared
/// nodes are numbered 0, 1, 2, ..., and a ref names a shared node begun before it (an
/// ancestor, for a cycle, or an earlier subtree). Every reader and writer checks it with this.
#[derive(Debug, Default, Clone, Copy)]
pub struct RefCheck {
    next: u64,
}

impl RefCheck {
    /// The check of a part of a tree after whose start `next` shared nodes have begun (a
    /// fragment of manifest text, parsed on its own).
    pub fn after(next: u64) -> Self {
        RefCheck { next }
    }

    /// The shared nodes `ids` begin, one after the other (a fragment's, whose text was
    /// written in order).
    ///
    /// # Errors
    /// The reason, when they do not start at the next id.
    pub fn begin_all(&mut self, ids: std::ops::Range<u64>) -> Result<(), String> {
        if !ids.is_empty() {
            self.begin(ids.start)?;
            self.next = ids.end;
        }
        Ok(())
    }

    /// A shared node `id` begins.
    ///
    /// # Errors
    /// The reason, when `id` is not the next id.
    pub fn begin(&mut self, id: u64) -> Result<(), String> {
        if id != self.next {
            return Err(format!(
                "shared node id {id} out of order (shared nodes are numbered 0, 1, 2, ... in order; expected {})",
                self.next
            ));
        }
        self.next += 1;
        Ok(())
    }

    /// A ref to `id`.
    ///
    /// # Errors
    /// The reason, when no shared node `id` begins before the ref.
    pub fn reference(&self, id: u64) -> Result<(), String> {
        if id >= self.next {
            return Err(format!("ref to id {id}, which no shared node before it has"));
        }
        Ok(())
    }

    /// A shared node's value, which is a shared node or a ref when `nested`.
    ///
    /// # Errors
    /// The reason, when it is one (an object is one node; a ref as its own value never
    /// reaches one).
    pub fn value(nested: bool) -> Result<(), String> {
        if nested {
            return Err("a shared node's `v` must be an object, not a shared node or a ref".into());
        }
        Ok(())
    }
}

fn is_ref<L>(t: &Tree<L>) -> bool {
    matches!(t, Tree::Shared { .. } | Tree::Ref(_))
}

/// Check a tree's shared ids against [`RefCheck`]'s rule (and that a shared node's value is an
/// object), in document order; the error names the place.
///
/// # Errors
/// The key path and the reason.
pub fn check_refs<L>(root: &Tree<L>) -> Result<(), (String, String)> {
    check_refs_with(root, RefCheck::default(), &|_| None)
}

/// [`check_refs`] from `rc`'s state, for trees whose leaves may hold shared nodes of their own:
/// `ids` gives a leaf's (a fragment of manifest text written in order), begun where it stands.
///
/// # Errors
/// The key path and the reason.
pub fn check_refs_with<L>(
    root: &Tree<L>,
    rc: RefCheck,
    ids: &dyn Fn(&L) -> Option<std::ops::Range<u64>>,
) -> Result<(), (String, String)> {
    type Ids<'i, L> = &'i dyn Fn(&L) -> Option<std::ops::Range<u64>>;
    fn walk<'a, L>(
        t: &'a Tree<L>,
        path: &mut Vec<Step<'a>>,
        rc: &mut RefCheck,
        ids: Ids<'_, L>,
    ) -> Result<(), (String, String)> {
        let here = |path: &Vec<Step<'a>>, r: String| (crate::keypath::steps_text(path), r);
        match t {
            Tree::Leaf(l) => ids(l).map_or(Ok(()), |r| rc.begin_all(r).map_err(|r| here(path, r))),
            Tree::Ref(id) => rc.reference(*id).map_err(|r| here(path, r)),
            Tree::Shared { id, node } => {
                rc.begin(*id).map_err(|r| here(path, r))?;
                RefCheck::value(is_ref(node)).map_err(|r| here(path, r))?;
                grow(|| walk(node, path, rc, ids))
            }
            t => grow(|| {
                for (step, c) in t.children() {
                    path.push(step);
                    walk(c, path, rc, ids)?;
                    path.pop();
                }
                Ok(())
            }),
        }
    }
    /// The same walk without key paths (no allocation per node): the path is found only for
    /// an error.
    fn fast<L>(t: &Tree<L>, rc: &mut RefCheck, ids: Ids<'_, L>) -> bool {
        grow(|| match t {
            Tree::Leaf(l) => ids(l).is_none_or(|r| rc.begin_all(r).is_ok()),
            Tree::Ref(id) => rc.reference(*id).is_ok(),
            Tree::Shared { id, node } => rc.begin(*id).is_ok() && !is_ref(node) && fast(node, rc, ids),
            Tree::List(v) | Tree::Tuple(v) => v.iter().all(|c| fast(c, rc, ids)),
            Tree::Dict(v) => v.iter().all(|(_, c)| fast(c, rc, ids)),
            Tree::Record { fields: v, .. } | Tree::Custom { children: v, .. } => {
                v.iter().all(|(_, c)| fast(c, rc, ids))
            }
        })
    }
    if fast(root, &mut rc.clone(), ids) {
        return Ok(());
    }
    let mut rc = rc;
    walk(root, &mut Vec::new(), &mut rc, ids)
}

/// The object at `node`: the target of a [`Tree::Ref`] (found in `root`), the inside of a
/// [`Tree::Shared`], or `node` itself.
pub fn follow<'t, L>(root: &'t Tree<L>, node: &'t Tree<L>) -> &'t Tree<L> {
    match node {
        Tree::Ref(id) => find_shared(root, *id).map(Tree::unshared).unwrap_or(node),
        n => n.unshared(),
    }
}

/// The shared node `id` of `root` (a walk: refs are rare, and readers validated the ids).
pub fn find_shared<L>(root: &Tree<L>, id: u64) -> Option<&Tree<L>> {
    match root {
        Tree::Shared { id: i, .. } if *i == id => Some(root),
        Tree::Shared { node, .. } => grow(|| find_shared(node, id)),
        t => grow(|| t.children().into_iter().find_map(|(_, c)| find_shared(c, id))),
    }
}
