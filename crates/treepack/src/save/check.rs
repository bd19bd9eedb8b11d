//! The checks a tree passes before anything of it is written: depth, unique keys, the ids of
//! shared objects (format 1.2), and the depth of the JSON values it holds.

use crate::error::{Error, Result};
use crate::format::json::{deeper_than, MAX_VALUE_DEPTH};
use crate::format::keypath;
use crate::format::manifest::{self, MAX_DEPTH};
use crate::format::model::{Leaf, Node, Step, Tree};

/// Depth, key uniqueness and shared ids; whether the tree holds shared nodes or refs.
pub(super) fn check_tree(tree: &Node, inline_str_bytes: usize) -> Result<bool> {
    let mut path = Vec::new();
    let mut has_refs = false;
    check_node(tree, 0, &mut path, &mut has_refs, inline_str_bytes)?;
    if has_refs {
        // Fragments of text may hold shared nodes (written with their final ids): they begin
        // where the fragment stands.
        let ids = |l: &Leaf| match l {
            Leaf::Fragment(f) if f.has_refs() => Some(f.shared_ids()),
            _ => None,
        };
        crate::format::refs::check_refs_with(tree, Default::default(), &ids)
            .map_err(|(path, r)| Error::invalid_tree(path, r))?;
    }
    Ok(has_refs)
}

/// Whether a node is written as a JSON object or array (not a bare JSON scalar).
fn written_as_object(t: &Node, inline_str_bytes: usize) -> bool {
    match t {
        Tree::Leaf(Leaf::None | Leaf::Bool(_)) => false,
        Tree::Leaf(Leaf::Int(i)) => !matches!(i, crate::format::model::Int::Small(_)),
        Tree::Leaf(Leaf::Float(f)) => !f.is_finite(),
        // Strings up to the save's inline size are JSON strings (longer ones are blobs).
        Tree::Leaf(Leaf::Str(s)) => s.len() > inline_str_bytes,
        _ => true,
    }
}

/// Depth and key uniqueness in one walk, with no allocation per node: string keys are compared
/// as they are (two string keys name the same path exactly when they are equal); the key path is
/// only formatted for an error. Notes whether shared nodes or refs occur (checked after).
fn check_node<'a>(
    t: &'a Node,
    depth: usize,
    path: &mut Vec<Step<'a>>,
    has_refs: &mut bool,
    inline: usize,
) -> Result<()> {
    if depth > MAX_DEPTH || (depth == MAX_DEPTH && written_as_object(t, inline)) {
        // Readers refuse a JSON object or array at depth MAX_DEPTH: a container, or a leaf
        // written as a tagged object (an array, bytes, a big int…). Only plain JSON scalars
        // may sit there.
        return Err(Error::limit("tree depth", MAX_DEPTH as u64, "nest containers less deeply"));
    }
    let dup = match t {
        Tree::Leaf(Leaf::Fragment(f)) => {
            *has_refs |= f.has_refs();
            return Ok(());
        }
        Tree::Leaf(Leaf::Array(a)) => {
            return match a.annotation() {
                Some(v) => check_value(v, "as", path),
                None => Ok(()),
            };
        }
        Tree::Leaf(_) => return Ok(()),
        Tree::Ref(_) => {
            *has_refs = true;
            return Ok(());
        }
        Tree::Shared { node, .. } => {
            *has_refs = true;
            return crate::format::model::grow(|| check_node(node, depth, path, has_refs, inline));
        }
        Tree::List(_) | Tree::Tuple(_) => None,
        Tree::Dict(pairs) => {
            manifest::first_duplicate_key(pairs).map(|i| crate::format::keypath::key_segment_text(&pairs[i].0))
        }
        Tree::Record { fields: named, .. } | Tree::Custom { children: named, .. } => {
            if let Tree::Custom { data, .. } = t {
                check_value(data, "data", path)?;
            }
            manifest::first_duplicate_name(named).map(|i| crate::format::keypath::name_segment_text(&named[i].0))
        }
    };
    if let Some(txt) = dup {
        return Err(Error::invalid_tree(keypath::steps_text(path), format!("duplicate key `{txt}`")));
    }
    crate::format::model::grow(|| {
        let mut visit = |step: Step<'a>, c: &'a Node, path: &mut Vec<Step<'a>>| {
            path.push(step);
            let r = check_node(c, depth + 1, path, has_refs, inline);
            path.pop();
            r
        };
        match t {
            Tree::Leaf(_) | Tree::Shared { .. } | Tree::Ref(_) => Ok(()),
            Tree::List(v) | Tree::Tuple(v) => {
                v.iter().enumerate().try_for_each(|(i, c)| visit(Step::Index(i), c, path))
            }
            Tree::Dict(v) => v.iter().try_for_each(|(k, c)| visit(Step::Key(k), c, path)),
            Tree::Record { fields: v, .. } | Tree::Custom { children: v, .. } => {
                v.iter().try_for_each(|(n, c)| visit(Step::Name(n), c, path))
            }
        }
    })
}

/// A JSON value the manifest will hold (`member` of the node at `path`) nests no deeper than
/// readers accept ([`MAX_VALUE_DEPTH`]): a writer never writes what its readers refuse.
fn check_value(v: &serde_json::Value, member: &str, path: &[Step<'_>]) -> Result<()> {
    if !deeper_than(v, MAX_VALUE_DEPTH) {
        return Ok(());
    }
    let at = keypath::steps_text(path);
    Err(Error::limit(
        "JSON value depth",
        MAX_VALUE_DEPTH as u64,
        format!("the `{member}` of `{at}` nests arrays and objects deeper than that; nest it less deeply"),
    ))
}

/// The save's `metadata` nests no deeper than readers accept.
pub(super) fn check_metadata(metadata: Option<&serde_json::Value>) -> Result<()> {
    match metadata {
        Some(v) if deeper_than(v, MAX_VALUE_DEPTH) => Err(Error::limit(
            "JSON value depth",
            MAX_VALUE_DEPTH as u64,
            "the save's `metadata` nests arrays and objects deeper than that; nest it less deeply",
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::model::{Int, Key, Leaf};

    /// The writer refuses what every reader refuses: keys that name one path twice (at any depth,
    /// string, typed or field names) and trees nested past `MAX_DEPTH`, naming where.
    #[test]
    fn check_tree_refuses_duplicate_keys_and_deep_trees() {
        let leaf = || Node::Leaf(Leaf::None);
        let refused = |t: &Node| match check_tree(t, 4096).map(drop) {
            Err(Error::InvalidTree { key, reason }) => format!("{key}: {reason}"),
            other => panic!("expected InvalidTree, got {other:?}"),
        };
        let dup = Tree::Dict(vec![(Key::Str("a".into()), leaf()), (Key::Str("a".into()), leaf())]);
        assert_eq!(refused(&Node::dict([("x", Node::list([leaf(), dup]))])), "x/1: duplicate key `a`");
        let ints = Tree::Dict(vec![(Key::Int(Int::Small(1)), leaf()), (Key::Int(Int::Small(1)), leaf())]);
        assert_eq!(refused(&ints), ": duplicate key `~i1`");
        let fields = Tree::Record { type_name: "P".into(), fields: vec![("f".into(), leaf()), ("f".into(), leaf())] };
        assert_eq!(refused(&Node::dict([("r~", fields)])), "r~0: duplicate key `f`");
        // The same text as a string and as a typed key are different paths; many keys go
        // through the hash-set comparison.
        let mixed: Vec<(Key, Node)> = (0..40)
            .map(|i| (Key::Str(format!("k{i}")), leaf()))
            .chain([(Key::Str("~i1".into()), leaf()), (Key::Int(Int::Small(1)), leaf())])
            .collect();
        assert!(check_tree(&Tree::Dict(mixed.clone()), 4096).is_ok());
        let mut many = mixed;
        many.push((Key::Str("k39".into()), leaf()));
        assert_eq!(refused(&Tree::Dict(many)), ": duplicate key `k39`");
        let mut deep = leaf();
        for _ in 0..MAX_DEPTH {
            deep = Node::list([deep]);
        }
        assert!(check_tree(&deep, 4096).is_ok());
        match check_tree(&Node::list([deep]), 4096) {
            Err(Error::LimitExceeded { .. }) => {}
            other => panic!("expected a depth limit error, got {other:?}"),
        }
    }

    /// Shared ids are checked with the readers' rule.
    #[test]
    fn check_tree_refuses_bad_shared_ids() {
        let bad = Node::list([Tree::Ref(0)]);
        assert!(matches!(check_tree(&bad, 4096), Err(Error::InvalidTree { key, .. }) if key == "0"));
        let good = Node::list([Tree::Shared { id: 0, node: Box::new(Node::list([])) }, Tree::Ref(0)]);
        assert!(check_tree(&good, 4096).unwrap());
    }
}
