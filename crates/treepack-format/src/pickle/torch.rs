//! A PyTorch checkpoint's pickle (`data.pkl` of a `torch.save` zip) as a tree, with no I/O:
//! plain values become leaves and containers, numpy arrays and scalars become arrays (their
//! bytes are in the pickle), and each tensor becomes a [`TensorRef`] — its storage's key,
//! dtype, shape, strides and offset, checked to lie inside the storage — for the engine to
//! read from the zip (`treepack::foreign::torch`).
//!
//! The walk is bounded in depth ([`Limits::max_depth`]) and in output size
//! ([`Limits::max_tree_nodes`]: an object shared at many places counts at each), refuses a
//! container that holds itself, keys that cannot be dict keys in a tree, and duplicate keys.

use super::{Global, Id, Limits, NumpyArray, NumpyObj, Obj, Pickle, PickleError, StorageRef, TensorObj};
use crate::dtype::DType;
use crate::model::{ArrayData, Key, Leaf, Tree};
use std::collections::{BTreeMap, HashSet};

type R<T> = Result<T, PickleError>;

/// A tensor of the checkpoint, described, not read.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorRef {
    /// The key of its storage: the zip entry `<archive>/data/<key>`.
    pub storage: String,
    /// Element type (the storage's).
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<u64>,
    /// Strides, in elements.
    pub stride: Vec<u64>,
    /// Offset of element 0 in the storage, in elements.
    pub offset: u64,
    /// `requires_grad` as saved.
    pub requires_grad: bool,
    /// Saved as a `torch.nn.Parameter`.
    pub parameter: bool,
    /// The device its storage was saved from (`cpu`, `cuda:0`).
    pub device: String,
}

impl TensorRef {
    /// Elements in the tensor.
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }
    /// Whether the tensor's elements lie packed in C order from its offset: then its bytes are
    /// one range of the storage.
    pub fn is_contiguous(&self) -> bool {
        let mut expect = 1u64;
        for (&n, &s) in self.shape.iter().zip(&self.stride).rev() {
            if n != 1 && s != expect {
                return false;
            }
            expect = expect.saturating_mul(n);
        }
        true
    }
    /// The annotation treepack's torch integration reads (`{"type": "torch.Tensor"}` or
    /// `torch.nn.Parameter` with `requires_grad`).
    pub fn annotation(&self) -> serde_json::Value {
        if self.parameter {
            serde_json::json!({"type": "torch.nn.Parameter", "requires_grad": self.requires_grad})
        } else if self.requires_grad {
            serde_json::json!({"type": "torch.Tensor", "requires_grad": true})
        } else {
            serde_json::json!({"type": "torch.Tensor"})
        }
    }
}

/// A leaf of a checkpoint's tree: a value, or a tensor to read from a storage.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    /// A value held in the pickle itself (numpy arrays included).
    Leaf(Leaf),
    /// A tensor whose bytes are in a storage.
    Tensor(TensorRef),
}

/// A storage the checkpoint's tensors use.
#[derive(Debug, Clone, PartialEq)]
pub struct StorageInfo {
    /// Element type.
    pub dtype: DType,
    /// Length in elements.
    pub numel: u64,
    /// The device it was saved from.
    pub location: String,
    /// How many tensors of the tree view it.
    pub tensors: usize,
}

impl StorageInfo {
    /// Its length in bytes (checked: `numel × itemsize` fits in 64 bits when the storage was
    /// accepted).
    pub fn nbytes(&self) -> u64 {
        self.numel.saturating_mul(self.dtype.itemsize())
    }
}

/// A checkpoint's pickle as a tree, and the storages its tensors need.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    /// The pickled structure; tensors as [`Item::Tensor`].
    pub tree: Tree<Item>,
    /// Storages by key.
    pub storages: BTreeMap<String, StorageInfo>,
}

/// Parse `data` (a `data.pkl`) and build its tree.
///
/// # Errors
/// Any [`PickleError`] of [`parse`](super::parse) or of the walk (a tensor outside its
/// storage, a storage named with two dtypes, a bad key, a limit).
pub fn read(data: &[u8], limits: &Limits) -> R<Checkpoint> {
    let p = super::parse(data, limits)?;
    interpret(&p, limits)
}

/// Parse `data` as [`read`] does, except that an object the pickle builds from a global
/// outside the allow-list becomes a placeholder instead of an error
/// ([`parse_placeholders`](super::parse_placeholders)): a [`Tree::Custom`] of type
/// `pickle:<module.name>` (a name no treepack type has) with data `{"global", "reason"}` and
/// no children. Nothing named by the file is imported or run; every other check and limit
/// holds as in [`read`].
///
/// # Errors
/// As [`read`], less refused globals (a refused object used as a dict key is still refused:
/// a placeholder cannot be a key).
pub fn read_placeholders(data: &[u8], limits: &Limits) -> R<Checkpoint> {
    let p = super::parse_placeholders(data, limits)?;
    interpret(&p, limits)
}

/// The custom type of the placeholder for an object built from the refused global `global`.
pub fn placeholder_type(global: &str) -> String {
    format!("{PLACEHOLDER_PREFIX}{global}")
}

/// The prefix of placeholders' custom types ([`read_placeholders`]).
pub const PLACEHOLDER_PREFIX: &str = "pickle:";

/// Build the tree of a parsed pickle.
///
/// # Errors
/// As [`read`], past parsing.
pub fn interpret(p: &Pickle, limits: &Limits) -> R<Checkpoint> {
    let budget = limits.max_tree_nodes.min((p.len() as u64).saturating_mul(8).max(1 << 20));
    let mut w =
        Walk { p, limits, budget, nodes: 0, open: vec![false; p.len()], path: vec![], storages: BTreeMap::new() };
    let tree = w.node(p.root())?;
    Ok(Checkpoint { tree, storages: w.storages })
}

struct Walk<'a> {
    p: &'a Pickle,
    limits: &'a Limits,
    /// The most nodes this tree may have.
    budget: u64,
    nodes: u64,
    /// Objects on the current path (a container met again inside itself is a cycle).
    open: Vec<bool>,
    path: Vec<String>,
    storages: BTreeMap<String, StorageInfo>,
}

fn malformed(reason: String) -> PickleError {
    PickleError::Malformed { offset: 0, reason }
}

impl Walk<'_> {
    fn at(&self) -> String {
        if self.path.is_empty() {
            "/".into()
        } else {
            self.path.join("/")
        }
    }
    fn bad(&self, what: &str, reason: String) -> PickleError {
        PickleError::BadCall { global: what.into(), path: self.at(), reason }
    }

    fn node(&mut self, id: Id) -> R<Tree<Item>> {
        self.nodes += 1;
        if self.nodes > self.budget {
            return Err(PickleError::Limit {
                what: "tree nodes",
                limit: self.budget,
                detail: format!("at `{}` (objects shared at many places count at each)", self.at()),
            });
        }
        if self.path.len() >= self.limits.max_depth {
            return Err(PickleError::Limit {
                what: "depth",
                limit: self.limits.max_depth as u64,
                detail: format!("at `{}`", self.at()),
            });
        }
        let i = id as usize;
        if self.open.get(i).copied().unwrap_or(false) {
            return Err(malformed(format!(
                "the object at `{}` contains itself (a cycle), which a tree cannot hold",
                self.at()
            )));
        }
        if let Some(o) = self.open.get_mut(i) {
            *o = true;
        }
        let r = crate::model::grow(|| self.node_inner(id));
        if let Some(o) = self.open.get_mut(i) {
            *o = false;
        }
        r
    }

    fn children(&mut self, ids: &[Id]) -> R<Vec<Tree<Item>>> {
        let mut out = Vec::with_capacity(ids.len().min(1 << 16));
        for (k, &c) in ids.iter().enumerate() {
            self.path.push(k.to_string());
            let n = self.node(c);
            self.path.pop();
            out.push(n?);
        }
        Ok(out)
    }

    fn named(&mut self, kids: &[(&str, Id)]) -> R<Vec<(String, Tree<Item>)>> {
        let mut out = vec![];
        for &(name, c) in kids {
            self.path.push(name.to_string());
            let n = self.node(c);
            self.path.pop();
            out.push((name.to_string(), n?));
        }
        Ok(out)
    }

    fn node_inner(&mut self, id: Id) -> R<Tree<Item>> {
        let leaf = |l: Leaf| Ok(Tree::Leaf(Item::Leaf(l)));
        match self.p.get(id) {
            Obj::None => leaf(Leaf::None),
            Obj::Bool(b) => leaf(Leaf::Bool(*b)),
            Obj::Int(i) => leaf(Leaf::Int(i.clone())),
            Obj::Float(f) => leaf(Leaf::Float(*f)),
            Obj::Complex(a, b) => leaf(Leaf::Complex(*a, *b)),
            Obj::Str(s) => leaf(Leaf::Str(s.clone())),
            Obj::Bytes(b) => leaf(Leaf::Bytes(b.clone().into())),
            Obj::ByteArray(b) => Ok(Tree::Custom {
                type_name: "py.bytearray".into(),
                data: serde_json::Value::Null,
                children: vec![("data".into(), Tree::Leaf(Item::Leaf(Leaf::Bytes(b.clone().into()))))],
            }),
            Obj::List(v) => Ok(Tree::List(self.children(v)?)),
            Obj::Tuple(v) => Ok(Tree::Tuple(self.children(v)?)),
            // torch's own values as treepack's torch integration writes them (py.torch_*), so
            // that they load as the same types.
            Obj::Size(v) => Ok(Tree::Custom {
                type_name: "py.torch_size".into(),
                data: serde_json::Value::Null,
                children: vec![(
                    "dims".into(),
                    Tree::List(v.iter().map(|&n| Tree::Leaf(Item::Leaf(Leaf::Int((n as i64).into())))).collect()),
                )],
            }),
            Obj::Set { items, frozen } => {
                let kids = self.children(items)?;
                Ok(Tree::Custom {
                    type_name: if *frozen { "py.frozenset" } else { "py.set" }.into(),
                    data: serde_json::Value::Null,
                    children: kids.into_iter().enumerate().map(|(i, k)| (i.to_string(), k)).collect(),
                })
            }
            Obj::Slice(a, b, c) => Ok(Tree::Custom {
                type_name: "py.slice".into(),
                data: serde_json::Value::Null,
                children: self.named(&[("start", *a), ("stop", *b), ("step", *c)])?,
            }),
            Obj::Dict { items, ordered: true, attrs } => {
                // As treepack writes an OrderedDict (py.ordereddict): its items as children when
                // every key is a str, else one `items` child; its attributes as JSON data.
                let mut data = serde_json::Map::new();
                if let Some(a) = attrs {
                    data.insert("attrs".into(), self.json(*a, 0)?);
                }
                let pairs = self.dict(items)?;
                let children = if pairs.iter().all(|(k, _)| matches!(k, Key::Str(_))) {
                    pairs.into_iter().map(|(k, v)| (if let Key::Str(k) = k { k } else { String::new() }, v)).collect()
                } else {
                    data.insert("items".into(), true.into());
                    vec![("items".into(), Tree::Dict(pairs))]
                };
                let data = if data.is_empty() { serde_json::Value::Null } else { data.into() };
                Ok(Tree::Custom { type_name: "py.ordereddict".into(), data, children })
            }
            Obj::Dict { items, .. } => Ok(Tree::Dict(self.dict(items)?)),
            Obj::Global(Global::TorchDtype(d)) => Ok(Tree::Custom {
                type_name: "py.torch_dtype".into(),
                data: super::globals::torch_dtype_name(d).into(),
                children: vec![],
            }),
            Obj::Global(g) => leaf(Leaf::Str(g.name())),
            Obj::Device(d) => {
                Ok(Tree::Custom { type_name: "py.torch_device".into(), data: d.clone().into(), children: vec![] })
            }
            Obj::Storage(s) => {
                // A storage saved by itself: the whole of it, as a 1-d tensor.
                let t = TensorObj {
                    storage: id,
                    offset: 0,
                    shape: vec![s.numel],
                    stride: vec![1],
                    requires_grad: false,
                    parameter: false,
                };
                self.tensor(&t)
            }
            Obj::Tensor(t) => self.tensor(t),
            Obj::Numpy(n) => self.numpy(n),
            Obj::Refused(g) => Ok(Tree::Custom {
                type_name: placeholder_type(g),
                data: serde_json::json!({
                    "global": g,
                    "reason": format!(
                        "refused global `{g}` by treepack's non-executing pickle reader ({}); nothing named by \
                         the file was imported or run",
                        super::AllowList::TorchSave.reads()
                    ),
                }),
                children: vec![],
            }),
            // Records are made only under the DCP metadata's allow-list, never a checkpoint's.
            Obj::Record(r) => {
                Err(self.bad(&r.class.name(), "a record is not a value of a torch.save checkpoint".into()))
            }
        }
    }

    /// A dict's pairs as a tree's (keys checked, none twice).
    fn dict(&mut self, items: &[(Id, Id)]) -> R<Vec<(Key, Tree<Item>)>> {
        let mut out = Vec::with_capacity(items.len().min(1 << 16));
        let mut seen = HashSet::new();
        for &(k, v) in items {
            let key = self.key(k, 0)?;
            let text = crate::keypath::Segment::Key(key.clone()).text();
            if !seen.insert(format!("{key:?}")) {
                return Err(malformed(format!("key {text} appears twice in the dict at `{}`", self.at())));
            }
            self.path.push(text.chars().take(200).collect());
            let n = self.node(v);
            self.path.pop();
            out.push((key, n?));
        }
        Ok(out)
    }

    /// An `OrderedDict`'s attributes as JSON (what treepack keeps of them): None, bools, ints
    /// that fit 64 bits, finite floats, strings, lists, tuples and str-keyed dicts, nested at
    /// most 32 deep; anything else is refused naming where.
    fn json(&self, id: Id, depth: usize) -> R<serde_json::Value> {
        use serde_json::Value as J;
        let no =
            |what: &str| self.bad("OrderedDict attributes", format!("{what} is not JSON data, which they must be"));
        if depth > 32 {
            return Err(no("a value nested more than 32 deep"));
        }
        Ok(match self.p.get(id) {
            Obj::None => J::Null,
            Obj::Bool(b) => J::Bool(*b),
            Obj::Int(i) => match i.as_i64() {
                Some(n) => n.into(),
                None => return Err(no("an int beyond 64 bits")),
            },
            Obj::Float(f) if f.is_finite() => serde_json::Number::from_f64(*f).map_or(J::Null, J::Number),
            Obj::Str(s) => J::String(s.clone()),
            Obj::List(v) | Obj::Tuple(v) => J::Array(v.iter().map(|&c| self.json(c, depth + 1)).collect::<R<_>>()?),
            Obj::Dict { items, attrs: None, .. } => {
                let mut m = serde_json::Map::new();
                for &(k, v) in items {
                    let Obj::Str(k) = self.p.get(k) else { return Err(no("a dict with a key that is not a str")) };
                    m.insert(k.clone(), self.json(v, depth + 1)?);
                }
                J::Object(m)
            }
            o => return Err(no(&format!("a {}", o.type_name()))),
        })
    }

    fn key(&self, id: Id, depth: usize) -> R<Key> {
        if depth > 16 {
            return Err(self.bad("dict key", "a tuple key nested more than 16 deep".into()));
        }
        Ok(match self.p.get(id) {
            Obj::None => Key::None,
            Obj::Bool(b) => Key::Bool(*b),
            Obj::Int(i) => Key::Int(i.clone()),
            Obj::Float(f) => Key::Float(*f),
            Obj::Str(s) => Key::Str(s.clone()),
            Obj::Tuple(v) => {
                if v.len() > 64 {
                    return Err(self.bad("dict key", "a tuple key of more than 64 items".into()));
                }
                Key::Tuple(v.iter().map(|&c| self.key(c, depth + 1)).collect::<R<_>>()?)
            }
            Obj::Refused(g) => {
                return Err(PickleError::Refused {
                    global: g.clone(),
                    path: self.at(),
                    reads: super::AllowList::TorchSave.reads(),
                })
            }
            o => return Err(self.bad("dict key", format!("a {} cannot be a key of a tree's dict", o.type_name()))),
        })
    }

    fn tensor(&mut self, t: &TensorObj) -> R<Tree<Item>> {
        let Obj::Storage(s) = self.p.get(t.storage) else {
            return Err(self.bad("torch.Tensor", "its storage is not a storage".into()));
        };
        let StorageRef { dtype, key, location, numel } = s;
        let nbytes = numel.checked_mul(dtype.itemsize());
        if nbytes.is_none() {
            return Err(self.bad("torch storage", format!("storage `{key}` of {numel} elements overflows 64 bits")));
        }
        let at = self.at();
        match self.storages.get_mut(key) {
            Some(info) => {
                if info.dtype != *dtype || info.numel != *numel {
                    return Err(PickleError::BadCall {
                        global: "torch storage".into(),
                        path: at,
                        reason: format!(
                            "storage `{key}` is named as {} × {} and as {} × {}",
                            info.numel,
                            info.dtype.display(),
                            numel,
                            dtype.display()
                        ),
                    });
                }
                info.tensors += 1;
            }
            None => {
                self.storages.insert(
                    key.clone(),
                    StorageInfo { dtype: dtype.clone(), numel: *numel, location: location.clone(), tensors: 1 },
                );
            }
        }
        // Every element the tensor views lies inside its storage.
        let count = t.shape.iter().try_fold(1u64, |a, &n| a.checked_mul(n));
        let Some(count) = count.filter(|c| c.checked_mul(dtype.itemsize()).is_some()) else {
            return Err(self.bad("torch.Tensor", format!("shape {:?} overflows 64 bits", t.shape)));
        };
        if count > 0 {
            let last = t
                .shape
                .iter()
                .zip(&t.stride)
                .try_fold(t.offset, |a, (&n, &s)| (n - 1).checked_mul(s).and_then(|x| a.checked_add(x)));
            match last {
                Some(l) if l < *numel => {}
                _ => {
                    return Err(self.bad(
                        "torch.Tensor",
                        format!(
                            "offset {} size {:?} stride {:?} reaches past its storage `{key}` of {numel} elements",
                            t.offset, t.shape, t.stride
                        ),
                    ))
                }
            }
        }
        Ok(Tree::Leaf(Item::Tensor(TensorRef {
            storage: key.clone(),
            dtype: dtype.clone(),
            shape: t.shape.clone(),
            stride: t.stride.clone(),
            offset: t.offset,
            requires_grad: t.requires_grad,
            parameter: t.parameter,
            device: location.clone(),
        })))
    }

    fn numpy_dtype(&self, id: Id) -> R<(DType, bool)> {
        let Obj::Numpy(NumpyObj::Dtype { descr, order }) = self.p.get(id) else {
            return Err(self.bad("numpy.dtype", "not a dtype".into()));
        };
        let b = descr.as_bytes();
        let (kind, digits) = match b.first() {
            Some(k) => (*k, &descr[1..]),
            None => return Err(self.bad("numpy.dtype", "empty dtype text".into())),
        };
        let n: usize = digits.parse().map_err(|_| {
            self.bad("numpy.dtype", format!("dtype {descr:?} is not read (plain numbers, bool, bytes and str are)"))
        })?;
        let d = match kind {
            b'S' => DType::Bytes(n as u64),
            b'U' => DType::Unicode(n as u64),
            k => DType::from_numpy_kind(k, n).ok_or_else(|| {
                self.bad("numpy.dtype", format!("dtype {descr:?} is not read (plain numbers, bool, bytes and str are)"))
            })?,
        };
        let big = *order == Some('>') && d.swap_unit() > 1;
        Ok((d, big))
    }

    fn numpy(&mut self, n: &NumpyObj) -> R<Tree<Item>> {
        match n {
            NumpyObj::Dtype { .. } => Err(self.bad("numpy.dtype", "a dtype by itself is not read as a value".into())),
            NumpyObj::Array(None) => {
                Err(self.bad("numpy.ndarray", "an array whose state was never set (no BUILD)".into()))
            }
            NumpyObj::Array(Some(NumpyArray { shape, dtype, fortran, data })) => {
                let (d, big) = self.numpy_dtype(*dtype)?;
                let item = d.itemsize();
                let count = shape.iter().try_fold(1u64, |a, &n| a.checked_mul(n));
                if count.and_then(|c| c.checked_mul(item)) != Some(data.len() as u64) {
                    return Err(self
                        .bad("numpy.ndarray", format!("{} bytes for shape {shape:?} of {}", data.len(), d.display())));
                }
                let mut bytes = if *fortran && shape.len() > 1 {
                    let mut stride = Vec::with_capacity(shape.len());
                    let mut s = 1u64;
                    for &n in shape {
                        stride.push(s);
                        s = s.saturating_mul(n);
                    }
                    strided_copy(data, item, shape, &stride, 0).map_err(|e| self.bad("numpy.ndarray", e))?
                } else {
                    data.clone()
                };
                if big {
                    swap_bytes(&mut bytes, d.swap_unit());
                }
                let a =
                    ArrayData::new(d, shape.clone(), bytes).map_err(|e| self.bad("numpy.ndarray", e.to_string()))?;
                Ok(Tree::Leaf(Item::Leaf(Leaf::Array(a))))
            }
            NumpyObj::Scalar { dtype, data } => {
                let (d, big) = self.numpy_dtype(*dtype)?;
                if data.len() as u64 != d.itemsize() {
                    return Err(self.bad("numpy scalar", format!("{} bytes for one {}", data.len(), d.display())));
                }
                let mut bytes = data.clone();
                if big {
                    swap_bytes(&mut bytes, d.swap_unit());
                }
                let a = ArrayData::scalar(d, bytes).map_err(|e| self.bad("numpy scalar", e.to_string()))?;
                // As treepack writes a numpy scalar (py.npscalar), so it loads as one, not as a
                // 0-d array.
                Ok(Tree::Custom {
                    type_name: "py.npscalar".into(),
                    data: serde_json::Value::Null,
                    children: vec![("value".into(), Tree::Leaf(Item::Leaf(Leaf::Array(a))))],
                })
            }
        }
    }
}

/// Reverse the bytes of each `unit`-byte value of `data` (big- to little-endian).
pub fn swap_bytes(data: &mut [u8], unit: u64) {
    if unit > 1 {
        for c in data.chunks_exact_mut(unit as usize) {
            c.reverse();
        }
    }
}

/// The elements of a strided view of `src` (`itemsize` bytes each; `stride` and `offset` in
/// elements) copied out in C order. The caller has checked that every element lies in `src`;
/// this checks again and fails rather than read outside it.
///
/// # Errors
/// A message when an element would lie outside `src` or the output cannot be allocated.
pub fn strided_copy(src: &[u8], itemsize: u64, shape: &[u64], stride: &[u64], offset: u64) -> Result<Vec<u8>, String> {
    let count = shape.iter().try_fold(1u64, |a, &n| a.checked_mul(n)).ok_or("shape overflows")?;
    let total = count.checked_mul(itemsize).ok_or("size overflows")?;
    let total = usize::try_from(total).map_err(|_| "size overflows")?;
    if total > src.len() && stride.iter().all(|&s| s != 0) {
        return Err(format!("a view of {total} bytes over {} bytes", src.len()));
    }
    let mut out = Vec::new();
    out.try_reserve_exact(total).map_err(|_| format!("cannot allocate {total} bytes"))?;
    if count == 0 {
        return Ok(out);
    }
    let item = itemsize as usize;
    let rank = shape.len();
    let mut idx = vec![0u64; rank];
    loop {
        let at = idx.iter().zip(stride).fold(offset, |a, (&i, &s)| a.saturating_add(i.saturating_mul(s)));
        let start = usize::try_from(at.saturating_mul(itemsize)).map_err(|_| "offset overflows")?;
        let piece = src
            .get(start..start.saturating_add(item))
            .ok_or_else(|| format!("element at byte {start} lies outside {} bytes", src.len()))?;
        out.extend_from_slice(piece);
        // The next index, last dimension fastest.
        let mut d = rank;
        loop {
            if d == 0 {
                return Ok(out);
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}
