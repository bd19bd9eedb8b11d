//! Shared objects and refs in the walk (format 1.2): the objects met, the refs to them, and
//! the ids they get, either renumbered after a first walk (`share_refs`) or given as they
//! begin in a second walk that knows them (docs/design.md decision 62). The walks themselves
//! are in `encode.rs` and `encode_text.rs`; all three are one `Encoder`.

use super::*;

/// Refs after which a first walk writing text gives way to a second (see `prepare`), when
/// they are also at least one per 16 containers met. A ref made before the ids are known is a
/// node, and so is every container holding one, with its siblings: a list of records each
/// holding a ref to one of a few objects (a dataset's rows sharing a few images, a log whose
/// records share an array) became nodes record by record, several times the cost of the same
/// records as text (bench/RESULTS.md, "Measurements cited by code comments"). A second walk
/// writes those refs as text; it costs about one walk of text, so it is worth it
/// for many refs among few containers only: a big tree with a few dozen refs keeps one walk.
const TEXT_REFS: usize = 64;

impl<'py> Encoder<'py> {
    /// A node of a counted kind (see [`counted`]) begins: its ordinal; `obj`, when given, may
    /// be referred to again.
    #[inline]
    pub(crate) fn begin(&mut self, obj: Option<&Bound<'py, PyAny>>) -> u64 {
        let o = self.ordinal;
        self.ordinal += 1;
        if self.share && self.text.is_some() {
            self.texted.push(false);
        }
        if let (true, Some(obj)) = (self.share, obj) {
            let addr = obj.as_ptr() as usize;
            self.seen.insert(addr, (o, obj.clone()));
            if self.known.as_ref().is_some_and(|k| k.contains(&addr)) {
                let id = self.ids.len() as u64;
                self.ids.insert(addr, id);
                if let Some(w) = self.text.as_mut() {
                    // Text written after it may refer to it (a node kept out of the text, or
                    // a container whose text `shared_begin` opens next).
                    w.shared_elsewhere(id);
                }
            }
        }
        o
    }

    /// The shared id `obj` was given as it began (second walk, an object met again later).
    #[inline]
    pub(crate) fn shared_id(&self, obj: &Bound<'py, PyAny>) -> Option<u64> {
        self.known.as_ref()?;
        self.ids.get(&(obj.as_ptr() as usize)).copied()
    }

    /// `n`, the node of `obj` just built, as a shared node if `obj` is one (second walk).
    #[inline]
    pub(crate) fn wrap_shared(&mut self, obj: &Bound<'py, PyAny>, n: Node) -> Node {
        match self.shared_id(obj) {
            Some(id) => {
                self.shared_firsts += 1;
                Tree::Shared { id, node: Box::new(n) }
            }
            None => n,
        }
    }

    /// A ref, if `obj` was met before. In a first walk, its ordinal (renumbered at the end,
    /// `share_refs`); in a second, its final id. An object the walk wrote as text and meets
    /// again cannot become a ref (its text has no shared id): a first walk notes it and goes
    /// on to the end, finding every object met again, for a second walk to number as it goes;
    /// a second walk that meets an object the first did not see twice starts over without text.
    #[inline]
    pub(crate) fn again(&mut self, obj: &Bound<'py, PyAny>, fragile: bool) -> PyResult<Option<Node>> {
        if !self.share {
            return Ok(None);
        }
        let addr = obj.as_ptr() as usize;
        let Some((o, _)) = self.seen.get(&addr) else { return Ok(None) };
        let o = *o;
        if let Some(at) = self.open.iter().rposition(|x| *x == o) {
            // A cycle closes here. A loader rebuilds it by putting a stand-in where the object
            // belongs and replacing it once the object exists, which works in lists, dicts and
            // records made before their fields. It cannot work when the stand-in goes straight
            // into a tuple, or when an object from the cycle's top down to here is built from
            // copies of its children (an object array, a namedtuple, a pydantic model, a
            // registered type): the copy would keep the stand-in. The loader patches the copies
            // of a few such containers, as pickle fills them after making them (`PATCHED_AFTER`).
            let through = self.copying.iter().rev().find(|(p, _)| *p >= at).map(|(_, t)| t);
            if fragile || through.is_some() {
                let what = match through.map(String::as_str) {
                    Some("py.dict") => "through a dict whose keys are not all str, int, float, bool, None or \
                                        tuples of them (numpy scalars, enum members: stored as key-value pairs, \
                                        built from them)"
                        .to_string(),
                    Some(t) => {
                        let t = match t {
                            "py.deque" => "collections.deque",
                            "py.ordereddict" => "collections.OrderedDict",
                            "py.counter" => "collections.Counter",
                            "py.defaultdict" => "collections.defaultdict",
                            "py.objarray" => "a numpy object array",
                            "py.mapping" => "a dict subclass",
                            "py.set" => "set",
                            "py.frozenset" => "frozenset",
                            t => t,
                        };
                        format!("through an object of type {t}, which is built from its contents")
                    }
                    None => "through a tuple, which is built from its items".into(),
                };
                return Err(PyValueError::new_err(format!(
                    "cannot save `{}`: an object contains itself {what}; loading could not rebuild \
                     that cycle. Hold the object in a list, a dict with str or int keys or a dataclass \
                     at that place instead",
                    self.here()
                )));
            }
        }
        if self.known.is_some() {
            return match self.ids.get(&addr) {
                Some(&id) => Ok(Some(Tree::Ref(id))),
                None => {
                    self.restart = true;
                    Err(PyValueError::new_err(
                        "treepack: an object not known to be shared was met again; starting over",
                    ))
                }
            };
        }
        self.again_met.insert(addr);
        if self.texted.get(o as usize) == Some(&true) {
            self.restart = true;
        }
        if self.text.is_some() {
            self.text_refs += 1;
            // Many refs, and many for the containers met (one per 16 at least).
            if self.text_refs >= TEXT_REFS && self.text_refs as u64 * 16 >= self.ordinal {
                self.restart = true;
            }
        }
        self.refd.insert(o);
        Ok(Some(Tree::Ref(o)))
    }
}

/// Whether the encoder counted this node (it counts every node of these kinds as it begins
/// it, in document order; [`share_refs`] counts the same nodes the same way).
fn counted(t: &Node) -> bool {
    matches!(
        t,
        Tree::List(_)
            | Tree::Tuple(_)
            | Tree::Dict(_)
            | Tree::Record { .. }
            | Tree::Custom { .. }
            | Tree::Leaf(Leaf::Array(_))
    )
}

/// The encoder's refs made format 1.2: each node a ref points at (by its ordinal) wrapped as
/// a shared node, ids 0, 1, 2, ... in document order, and the refs renumbered to match.
pub(crate) fn share_refs(node: Node, refd: &rustc_hash::FxHashSet<u64>) -> PyResult<Node> {
    struct St<'a> {
        refd: &'a rustc_hash::FxHashSet<u64>,
        ordinal: u64,
        ids: HashMap<u64, u64>,
    }
    fn walk(t: Node, st: &mut St<'_>) -> PyResult<Node> {
        if let Tree::Leaf(Leaf::Fragment(f)) = &t {
            // Its containers were counted by the encoder as it wrote them.
            st.ordinal += f.containers();
            return Ok(t);
        }
        let ord = counted(&t).then(|| {
            st.ordinal += 1;
            st.ordinal - 1
        });
        let wrap = ord.filter(|o| st.refd.contains(o)).map(|o| {
            let id = st.ids.len() as u64;
            st.ids.insert(o, id);
            id
        });
        let named = |v: Vec<(String, Node)>, st: &mut St<'_>| -> PyResult<Vec<(String, Node)>> {
            v.into_iter().map(|(k, c)| Ok((k, treepack::format::model::grow(|| walk(c, st))?))).collect()
        };
        let t = match t {
            Tree::List(v) => Tree::List(
                v.into_iter().map(|c| treepack::format::model::grow(|| walk(c, st))).collect::<PyResult<_>>()?,
            ),
            Tree::Tuple(v) => Tree::Tuple(
                v.into_iter().map(|c| treepack::format::model::grow(|| walk(c, st))).collect::<PyResult<_>>()?,
            ),
            Tree::Dict(v) => Tree::Dict(
                v.into_iter()
                    .map(|(k, c)| Ok((k, treepack::format::model::grow(|| walk(c, st))?)))
                    .collect::<PyResult<_>>()?,
            ),
            Tree::Record { type_name, fields } => Tree::Record { type_name, fields: named(fields, st)? },
            Tree::Custom { type_name, data, children } => {
                Tree::Custom { type_name, data, children: named(children, st)? }
            }
            Tree::Ref(o) => Tree::Ref(*st.ids.get(&o).ok_or_else(|| {
                PyValueError::new_err(format!("treepack bug: a ref to node {o}, which was not met before it"))
            })?),
            t => t,
        };
        Ok(match wrap {
            Some(id) => Tree::Shared { id, node: Box::new(t) },
            None => t,
        })
    }
    let mut st = St { refd, ordinal: 0, ids: HashMap::new() };
    let out = walk(node, &mut st)?;
    if st.ids.len() != refd.len() {
        return Err(PyValueError::new_err("treepack bug: shared objects were not all found"));
    }
    Ok(out)
}
