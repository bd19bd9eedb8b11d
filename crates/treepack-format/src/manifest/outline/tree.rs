//! The outline of a manifest already parsed: the same blocks [`outline()`] streams from its
//! text, for one structure builder whatever the source.

use crate::error::{Error, Result};
use crate::manifest::members::ArrayBufs;
use crate::manifest::outline::{path_budget, u32_of, Block, Event, LeafTable, State};
use crate::manifest::types::{Entry, PackInfo};
use crate::model::{Key, Step, Tree};
use serde::de;
use std::collections::HashMap;

/// The blocks [`outline()`](super::outline()) would stream for a manifest already parsed (a reader's tree and
/// packs): one structure builder serves the text and the tree alike. Leaves are checked again
/// as [`outline()`](super::outline()) checks them.
///
/// # Errors
/// A leaf that does not fit `packs`, or a block grown past its limits.
pub fn outline_tree(
    root: &Tree<Entry>,
    packs: &[PackInfo],
    file: &str,
    sink: &mut dyn FnMut(Block) -> bool,
) -> Result<()> {
    let mut no_spare = || None;
    let mut st = State {
        block: Block::default(),
        table: LeafTable::default(),
        path: String::new(),
        starts: Vec::new(),
        path_budget: super::tree_path_budget(root),
        shared: HashMap::new(),
        names: Vec::new(),
        packs: Some(packs.to_vec()),
        scratch: ArrayBufs::default(),
        file,
        sink,
        spare: &mut no_spare,
        stopped: false,
    };
    let res: std::result::Result<(), serde_json::Error> = walk_tree(&mut st, root);
    res.map_err(|e| Error::manifest(file, st.path.clone(), e.to_string()))?;
    if !st.flush() {
        return Err(Error::manifest(file, "<root>", "the reader stopped"));
    }
    Ok(())
}

/// [`outline_tree`]'s walk: the events the text parser emits, in the same order.
fn walk_tree<E: de::Error>(st: &mut State<'_>, t: &Tree<Entry>) -> std::result::Result<(), E> {
    crate::model::grow(|| {
        match t {
            Tree::Leaf(e) => return st.entry(e),
            Tree::Shared { id, node } => {
                st.shared_begin(*id)?;
                return walk_tree(st, node);
            }
            Tree::Ref(id) => return st.reference(*id),
            Tree::List(items) | Tree::Tuple(items) => {
                st.event(if matches!(t, Tree::List(_)) { Event::List } else { Event::Tuple })?;
                for (i, c) in items.iter().enumerate() {
                    st.enter(Step::Index(i));
                    walk_tree(st, c)?;
                    st.exit();
                }
            }
            Tree::Dict(pairs) => {
                st.event(Event::Dict)?;
                for (k, c) in pairs {
                    match k {
                        Key::Str(s) => st.key_text(s)?,
                        other => {
                            st.room()?;
                            let i = u32_of(st.block.keys.len())?;
                            st.block.keys.push(other.clone());
                            st.block.events.push(Event::TypedKey(i));
                        }
                    }
                    st.enter(Step::Key(k));
                    walk_tree(st, c)?;
                    st.exit();
                }
            }
            Tree::Record { type_name, fields: named } | Tree::Custom { type_name, children: named, .. } => {
                st.event(Event::Named)?;
                for (n, c) in named {
                    st.key_text(n)?;
                    st.enter(Step::Name(n));
                    walk_tree(st, c)?;
                    st.exit();
                }
                let (custom, data) = match t {
                    Tree::Custom { data, .. } => (true, (!data.is_null()).then(|| data.to_string())),
                    _ => (false, None),
                };
                return st.end_named(custom, type_name.clone(), data);
            }
        }
        st.event(Event::End)
    })
}

/// [`path_budget`] for a tree already parsed: that of the smallest manifest that could hold it
/// (every node at least two bytes, plus its key or name).
#[doc(hidden)]
pub fn tree_path_budget<L>(root: &Tree<L>) -> usize {
    fn floor<L>(t: &Tree<L>) -> usize {
        crate::model::grow(|| {
            t.children()
                .into_iter()
                .map(|(step, c)| {
                    let own = match step {
                        Step::Key(Key::Str(s)) => s.len(),
                        Step::Name(n) => n.len(),
                        _ => 1,
                    };
                    own.saturating_add(2).saturating_add(floor(c))
                })
                .fold(2usize, usize::saturating_add)
        })
    }
    path_budget(floor(root))
}
