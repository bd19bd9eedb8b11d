//! Structure-only reads: the tree with a [`LeafInfo`] at every leaf, reading only the manifest.
//!
//! Which reader runs is decided here, for every binding: manifests of [`OUTLINE_MIN_BYTES`] or
//! more are read by the structure-only outline (`format::manifest::outline`: no entry tree, no
//! decoded data), smaller ones by the full parse (design decision 38). The Python extension asks
//! [`outline_pays`] and builds its own objects from the same events.

use crate::error::Result;
use crate::format::manifest::outline::{outline, Block, Event};
use crate::format::manifest::{self, LeafInfo};
use crate::format::model::{Key, Tree};
use crate::store::Layout;
use crate::Location;

/// Manifests at least this large are read for their structure by the outline; below that the
/// full parse costs less than setting the outline up (and, in Python, its helper thread).
pub const OUTLINE_MIN_BYTES: usize = 256 << 10;

/// Whether the structure of a manifest of `len` bytes is read by the outline.
pub fn outline_pays(len: usize) -> bool {
    len >= OUTLINE_MIN_BYTES
}

/// The structure of the tree at `loc`: the outline for big manifests, the full parse otherwise
/// or whenever the outline finds anything off (that parse then reports the error in full).
///
/// # Errors
/// As [`super::Reader::open`].
pub fn load_structure(loc: Location) -> Result<Tree<LeafInfo>> {
    let loc = loc.pin()?;
    let (bytes, file) = loc.block_on(super::manifest_bytes(&loc))?;
    if outline_pays(bytes.len()) {
        if let Some(t) = by_outline(&bytes, &file, loc.layout()) {
            return Ok(t);
        }
    }
    // One request in all: the bytes already read are parsed, not fetched again.
    super::Reader::from_bytes(loc, &bytes, file)?.structure()
}

/// The structure from sealed manifest bytes through the outline; `None` if the seal, the parse,
/// a repeated dict key or a pack the layout forbids says no.
pub fn by_outline(bytes: &[u8], file: &str, layout: Layout) -> Option<Tree<LeafInfo>> {
    manifest::check(bytes, file).ok()?;
    let mut b = Builder::default();
    let packs = outline(bytes, file, &mut |block| b.feed(&block).is_some()).ok()?;
    if !packs.iter().all(|p| layout.allows_pack(&p.path)) {
        return None;
    }
    b.root
}

/// A container being built, with the key or name of its next child.
enum Frame {
    Dict(Vec<(Key, Tree<LeafInfo>)>, Option<Key>),
    List(Vec<Tree<LeafInfo>>, bool),
    Named(Vec<(String, Tree<LeafInfo>)>, Option<String>),
}

#[derive(Default)]
struct Builder {
    stack: Vec<Frame>,
    root: Option<Tree<LeafInfo>>,
}

impl Builder {
    fn feed(&mut self, b: &Block) -> Option<()> {
        for e in &b.events {
            match *e {
                Event::Dict => self.stack.push(Frame::Dict(Vec::new(), None)),
                Event::List => self.stack.push(Frame::List(Vec::new(), false)),
                Event::Tuple => self.stack.push(Frame::List(Vec::new(), true)),
                Event::Named => self.stack.push(Frame::Named(Vec::new(), None)),
                Event::Key(s, t) => {
                    let text = b.text(s, t)?;
                    match self.stack.last_mut()? {
                        Frame::Dict(_, k) => *k = Some(Key::Str(text.to_string())),
                        Frame::Named(_, n) => *n = Some(text.to_string()),
                        Frame::List(..) => return None,
                    }
                }
                Event::TypedKey(i) => match self.stack.last_mut()? {
                    Frame::Dict(_, k) => *k = Some(b.keys.get(i as usize)?.clone()),
                    _ => return None,
                },
                Event::Leaf(i) => {
                    let l = b.leaves.get(i as usize)?;
                    let info = LeafInfo {
                        path: l.path.to_string(),
                        kind: l.kind,
                        dtype: l.dtype.cloned(),
                        shape: l.shape.map(<[u64]>::to_vec),
                        nbytes: l.nbytes,
                    };
                    self.add(Tree::Leaf(info))?;
                }
                Event::End => {
                    let t = match self.stack.pop()? {
                        Frame::Dict(pairs, None) => {
                            // The outline leaves repeated dict keys to its consumer.
                            if manifest::first_duplicate_key(&pairs).is_some() {
                                return None;
                            }
                            Tree::Dict(pairs)
                        }
                        Frame::List(items, tuple) => {
                            if tuple {
                                Tree::Tuple(items)
                            } else {
                                Tree::List(items)
                            }
                        }
                        _ => return None,
                    };
                    self.add(t)?;
                }
                Event::EndNamed(i) => {
                    let Frame::Named(children, None) = self.stack.pop()? else { return None };
                    let n = b.named.get(i as usize)?;
                    let t = if n.custom {
                        let data = match &n.data {
                            // Text the outline kept of a value it read bounded: read it with the
                            // same bound (serde_json's own, 128, refuses a value at the limit).
                            Some(text) => {
                                crate::format::json::from_str(text, "data", crate::format::json::MAX_VALUE_DEPTH)
                                    .ok()?
                            }
                            None => serde_json::Value::Null,
                        };
                        Tree::Custom { type_name: n.type_name.clone(), data, children }
                    } else {
                        Tree::Record { type_name: n.type_name.clone(), fields: children }
                    };
                    self.add(t)?;
                }
            }
        }
        Some(())
    }

    /// Add a finished node to the open container (under its pending key), or make it the root.
    fn add(&mut self, t: Tree<LeafInfo>) -> Option<()> {
        match self.stack.last_mut() {
            None if self.root.is_none() => self.root = Some(t),
            None => return None,
            Some(Frame::Dict(pairs, k)) => pairs.push((k.take()?, t)),
            Some(Frame::List(items, _)) => items.push(t),
            Some(Frame::Named(children, n)) => children.push((n.take()?, t)),
        }
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::manifest::encode;
    use crate::format::model::Node;

    /// The outline's structure is the full parse's, for every node kind, and a damaged or
    /// ambiguous manifest makes it step aside.
    #[test]
    fn outline_structure_is_the_full_parse_structure() {
        let mut tree = crate::demo::example_tree();
        if let Tree::Dict(items) = &mut tree {
            items.push((Key::Int(crate::format::model::Int::Small(7)), Node::from("typed key")));
        }
        let dir = tempfile::tempdir().unwrap();
        let loc = Location::parse(dir.path().join("t").to_str().unwrap()).unwrap();
        crate::save(&tree, &loc, &crate::SaveOptions::default()).unwrap();
        let r = super::super::Reader::open(loc.clone()).unwrap();
        let m = r.manifest();
        let bytes = encode(m, &serde_json::json!({}));
        let got = by_outline(&bytes, "t", Layout::Directory).expect("the outline reads it");
        assert_eq!(got, m.structure().unwrap());
        let mut bad = bytes.clone();
        let at = bad.len() / 2;
        bad[at] ^= 1;
        assert!(by_outline(&bad, "t", Layout::Directory).is_none(), "a broken seal is refused");
        assert!(by_outline(&bytes, "t", Layout::SingleFile).is_none() || m.packs.is_empty());
        // The facade takes the same path whatever the manifest's size, with the same result.
        assert_eq!(load_structure(loc).unwrap(), m.structure().unwrap());
    }

    /// A manifest over 1 MiB: a root list of many small subtrees (typed and tuple keys, floats,
    /// strings, an annotated array) with one big dict among them, or (`keyed`: a config-like
    /// tree) a root dict with one member holding all of them.
    fn big(keyed: bool) -> crate::format::manifest::Manifest {
        use crate::format::codec::Codec;
        use crate::format::dtype::DType;
        use crate::format::hash::Hash32;
        use crate::format::manifest::{ArrayEntry, ArrayStorage, ChunkRef, Entry, Manifest, PackInfo, Stored};
        use crate::format::model::Int;
        let leaf = |e: Entry| Tree::Leaf(e);
        let chunk = ChunkRef { pack: 0, offset: 0, length: 8, codec: Codec::Raw, hash: Hash32::of(&[1u8; 8]) };
        let array = ArrayEntry {
            dtype: DType::F32,
            shape: vec![2],
            storage: ArrayStorage::Chunked { chunk_shape: vec![2], chunks: vec![chunk] },
            preview: None,
            annotation: Some(serde_json::json!({"type": "torch.Tensor"})),
        };
        let one = Tree::Dict(vec![
            (Key::Str("n".into()), leaf(Entry::Int(Int::Small(3)))),
            (Key::Int(Int::Small(-2)), Tree::Tuple(vec![leaf(Entry::Float(0.25)), leaf(Entry::Float(-0.0))])),
            (Key::Tuple(vec![Key::Bool(false), Key::None]), leaf(Entry::Str(Stored::Inline("q\"\n".into())))),
            (Key::Str("w".into()), leaf(Entry::Array(Box::new(array)))),
        ]);
        let items: Vec<Tree<Entry>> = (0..3300)
            .map(|i| match i {
                7 => Tree::Dict(
                    (0..2000).map(|j| (Key::Str(format!("k{j}")), leaf(Entry::Int(Int::Small(j))))).collect(),
                ),
                _ => one.clone(),
            })
            .collect();
        let root = if keyed {
            let named = items.into_iter().enumerate().map(|(i, t)| (Key::Str(format!("p{i}")), t)).collect();
            Tree::Dict(vec![(Key::Str("opt".into()), Tree::Dict(named))])
        } else {
            Tree::List(items)
        };
        let packs = vec![PackInfo { path: "packs/a-0.tpp".into(), size: 64 }];
        Manifest { version: (1, 0), writer: "test".into(), metadata: None, packs, root }
    }

    #[test]
    fn the_policy_reads_big_manifests_by_outline() {
        assert!(!outline_pays(OUTLINE_MIN_BYTES - 1));
        assert!(outline_pays(OUTLINE_MIN_BYTES));
        for keyed in [false, true] {
            let m = big(keyed);
            let bytes = encode(&m, &serde_json::json!({}));
            assert!(outline_pays(bytes.len()), "{} bytes", bytes.len());
            assert_eq!(by_outline(&bytes, "t", Layout::Directory).expect("read"), m.structure().unwrap());
        }
    }
}
