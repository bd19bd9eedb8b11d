//! The data model: a tree of containers whose leaves are scalars, strings, bytes and arrays.
//!
//! One generic [`Tree<L>`] carries the container structure so that the in-memory tree
//! ([`Node`] = `Tree<Leaf>`), the stored manifest tree (`Tree<Entry>`) and the structure-only
//! view (`Tree<LeafInfo>`) share the same walking, key-path and mapping code.

use crate::dtype::DType;
use crate::error::{Error, Result};
use bytes::Bytes;
use num_bigint::BigInt;
use std::collections::HashMap;
use std::fmt;

/// An exact integer of any size. Values that fit in `i64` are kept unboxed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Int {
    /// A value that fits in `i64`.
    Small(i64),
    /// A value outside the `i64` range (constructors normalise smaller values to `Small`).
    Big(BigInt),
}

impl Int {
    /// Build from a big integer, normalising to `Small` when it fits.
    pub fn from_big(b: BigInt) -> Int {
        match i64::try_from(&b) {
            Ok(v) => Int::Small(v),
            Err(_) => Int::Big(b),
        }
    }

    /// Parse a decimal string (optional leading `-`).
    pub fn parse(s: &str) -> Option<Int> {
        if s.is_empty() || s.len() > 100_000 {
            return None;
        }
        let digits = s.strip_prefix('-').unwrap_or(s);
        if digits.is_empty() || !digits.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        s.parse::<BigInt>().ok().map(Int::from_big)
    }

    /// The value as `i64`, or `None` if it is a `Big` one.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Int::Small(v) => Some(*v),
            Int::Big(_) => None,
        }
    }
}

impl fmt::Display for Int {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Int::Small(v) => write!(f, "{v}"),
            Int::Big(b) => write!(f, "{b}"),
        }
    }
}

impl From<i64> for Int {
    fn from(v: i64) -> Self {
        Int::Small(v)
    }
}

/// A dict key. Python dicts allow these hashable kinds; order of entries is kept by the dict.
#[derive(Debug, Clone, PartialEq)]
pub enum Key {
    /// The none key (Python `None`).
    None,
    /// A boolean key.
    Bool(bool),
    /// An integer key of any size.
    Int(Int),
    /// A float key; compared by bits in [`Key::same`].
    Float(f64),
    /// A string key, the usual kind.
    Str(String),
    /// A tuple of keys (a Python tuple used as a key).
    Tuple(Vec<Key>),
}

impl Key {
    /// True if two keys are the same key (floats compared by bits so NaN keys are well-defined).
    pub fn same(&self, other: &Key) -> bool {
        match (self, other) {
            (Key::Float(a), Key::Float(b)) => a.to_bits() == b.to_bits(),
            (Key::Tuple(a), Key::Tuple(b)) => a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.same(y)),
            _ => self == other,
        }
    }
}

impl From<&str> for Key {
    fn from(s: &str) -> Self {
        Key::Str(s.to_string())
    }
}
impl From<String> for Key {
    fn from(s: String) -> Self {
        Key::Str(s)
    }
}
impl From<i64> for Key {
    fn from(v: i64) -> Self {
        Key::Int(Int::Small(v))
    }
}

/// An n-dimensional array in canonical form: little-endian, C order, packed.
///
/// The bytes are a cheaply clonable [`Bytes`], so arrays can be views of caller memory (zero-copy
/// saves) or of a memory-mapped file (zero-copy loads).
#[derive(Clone)]
pub struct ArrayData {
    dtype: DType,
    shape: Vec<u64>,
    data: Bytes,
    /// The array type the writer had, when not a plain array (the format's `as` member, 1.3).
    annotation: Option<Box<serde_json::Value>>,
    /// A save hint, never stored: the blocks the array is held in (a JAX array's shards), which
    /// the chunk grid tiles so that each chunk lies in one block.
    block: Option<Box<[u64]>>,
    /// A save hint, never stored: the chunk shape to save with (the one the array was stored
    /// with, for a copy that keeps its chunk grid and so its root hash).
    chunk_shape: Option<Box<[u64]>>,
}

/// Equal values: dtype, shape, bytes and annotation (the save hints are not part of the value).
impl PartialEq for ArrayData {
    fn eq(&self, other: &Self) -> bool {
        self.dtype == other.dtype
            && self.shape == other.shape
            && self.data == other.data
            && self.annotation == other.annotation
    }
}

impl fmt::Debug for ArrayData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ArrayData({}, {:?}, {} bytes)", self.dtype.display(), self.shape, self.data.len())?;
        if let Some(a) = &self.annotation {
            write!(f, " as {a}")?;
        }
        Ok(())
    }
}

/// Longest `type` name an array annotation may have.
pub const MAX_ANNOTATION_TYPE: usize = 256;

/// The rule for an array's `as` member: a JSON object whose `type` is a non-empty string of at
/// most [`MAX_ANNOTATION_TYPE`] bytes.
pub fn check_annotation(v: &serde_json::Value) -> std::result::Result<(), String> {
    match v.get("type") {
        Some(serde_json::Value::String(t)) if !t.is_empty() && t.len() <= MAX_ANNOTATION_TYPE && v.is_object() => Ok(()),
        _ => Err(format!(
            "an array's `as` must be a JSON object with a non-empty string `type` of at most {MAX_ANNOTATION_TYPE} bytes"
        )),
    }
}

/// Product of a shape, or `None` on overflow.
pub fn shape_len(shape: &[u64]) -> Option<u64> {
    shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d))
}

impl ArrayData {
    /// Wrap canonical bytes. Fails if `data.len() != itemsize × prod(shape)`.
    ///
    /// # Errors
    /// [`Error::InvalidTree`] on a length mismatch or overflow.
    pub fn new(dtype: DType, shape: Vec<u64>, data: impl Into<Bytes>) -> Result<Self> {
        let data = data.into();
        let expected = shape_len(&shape).and_then(|n| n.checked_mul(dtype.itemsize()));
        if expected != Some(data.len() as u64) {
            return Err(Error::invalid_tree(
                "<array>",
                format!(
                    "{} bytes given but dtype {} × shape {:?} needs {}",
                    data.len(),
                    dtype.display(),
                    shape,
                    expected.map_or("more than 2^64".to_string(), |e| e.to_string())
                ),
            ));
        }
        Ok(ArrayData { dtype, shape, data, annotation: None, block: None, chunk_shape: None })
    }

    /// Wrap bytes whose length the caller has already made right.
    pub(crate) fn new_unchecked(dtype: DType, shape: Vec<u64>, data: Bytes) -> Self {
        debug_assert_eq!(shape_len(&shape).map(|n| n * dtype.itemsize()), Some(data.len() as u64));
        ArrayData { dtype, shape, data, annotation: None, block: None, chunk_shape: None }
    }

    /// The same array, annotated with the array type it stands for (a torch tensor, a JAX
    /// array): a JSON object with a string `type` member and that type's attributes, written
    /// as the array node's `as` member (docs/format.md, section 5). Readers that do not know
    /// the type still get the array.
    ///
    /// # Errors
    /// [`Error::InvalidTree`] when `annotation` is not an object with a string `type`.
    pub fn with_annotation(mut self, annotation: Option<serde_json::Value>) -> Result<Self> {
        if let Some(a) = &annotation {
            check_annotation(a).map_err(|reason| Error::invalid_tree("<array>", reason))?;
        }
        self.annotation = annotation.map(Box::new);
        Ok(self)
    }

    /// Attach a stored array's annotation (already checked by the manifest parser).
    #[doc(hidden)]
    pub fn annotated(mut self, annotation: Option<&serde_json::Value>) -> Self {
        self.annotation = annotation.map(|a| Box::new(a.clone()));
        self
    }

    /// The array type this array stands for, if the writer named one (see
    /// [`ArrayData::with_annotation`]).
    pub fn annotation(&self) -> Option<&serde_json::Value> {
        self.annotation.as_deref()
    }

    /// The same array, held in blocks of `block` elements per axis (a sharded JAX array's shard
    /// shape): the writer's default chunking then tiles each block, so every chunk lies in one
    /// block and a process that owns a block owns whole chunks. A hint for saving; not stored.
    ///
    /// # Errors
    /// [`Error::InvalidTree`] when `block` does not have the array's rank or has a zero entry.
    pub fn with_block(mut self, block: Option<Vec<u64>>) -> Result<Self> {
        self.block = self.per_axis_hint("block", block)?;
        Ok(self)
    }

    /// A save hint with one entry ≥ 1 per axis of this array, checked.
    fn per_axis_hint(&self, what: &str, hint: Option<Vec<u64>>) -> Result<Option<Box<[u64]>>> {
        if let Some(h) = &hint {
            if h.len() != self.shape.len() || h.contains(&0) {
                return Err(Error::invalid_tree(
                    "<array>",
                    format!("{what} {h:?} does not fit shape {:?} (one entry ≥ 1 per axis)", self.shape),
                ));
            }
        }
        Ok(hint.map(Vec::into_boxed_slice))
    }

    /// The same array, to be saved on chunks of `chunk_shape` (a hint, not stored; a save's
    /// `chunk_shapes` patterns still win). Copies set it to the stored grid so that the copy
    /// has the same chunks, and so the same root hash (docs/format.md section 9).
    ///
    /// # Errors
    /// [`Error::InvalidTree`] when it does not have the array's rank or has a zero entry.
    pub fn with_chunk_shape(mut self, chunk_shape: Option<Vec<u64>>) -> Result<Self> {
        self.chunk_shape = self.per_axis_hint("chunk shape", chunk_shape)?;
        Ok(self)
    }

    /// The chunk shape hint (see [`ArrayData::with_chunk_shape`]).
    pub fn chunk_shape_hint(&self) -> Option<&[u64]> {
        self.chunk_shape.as_deref()
    }

    /// The blocks the array is held in, if the writer said (see [`ArrayData::with_block`]).
    pub fn block(&self) -> Option<&[u64]> {
        self.block.as_deref()
    }

    /// A 0-d array (typed scalar) from canonical bytes.
    pub fn scalar(dtype: DType, data: impl Into<Bytes>) -> Result<Self> {
        Self::new(dtype, vec![], data)
    }

    /// Element type.
    pub fn dtype(&self) -> &DType {
        &self.dtype
    }
    /// Shape, in elements per axis (empty for a 0-d array).
    pub fn shape(&self) -> &[u64] {
        &self.shape
    }
    /// Canonical bytes (little-endian, C order).
    pub fn bytes(&self) -> &Bytes {
        &self.data
    }
    /// Size of the canonical bytes.
    pub fn nbytes(&self) -> u64 {
        self.data.len() as u64
    }
    /// Number of elements (1 for a 0-d array).
    pub fn len(&self) -> u64 {
        shape_len(&self.shape).unwrap_or(0)
    }
    /// True if the array has no elements (some axis is 0).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Take the array apart into dtype, shape and canonical bytes, without copying.
    pub fn into_parts(self) -> (DType, Vec<u64>, Bytes) {
        (self.dtype, self.shape, self.data)
    }
}

/// A leaf value of an in-memory tree.
#[derive(Debug, Clone, PartialEq)]
pub enum Leaf {
    /// The none value (Python `None`, Rust `()` or `None`).
    None,
    /// A boolean.
    Bool(bool),
    /// An integer of any size.
    Int(Int),
    /// A 64-bit float; saved bit for bit (NaN payloads, -0.0).
    Float(f64),
    /// A complex number: real part, imaginary part.
    Complex(f64, f64),
    /// A UTF-8 string.
    Str(String),
    /// A byte string.
    Bytes(Bytes),
    /// An n-d array (a typed scalar is a 0-d one).
    Array(ArrayData),
    /// A subtree of plain values already written as manifest text by the walk that met it (the
    /// Python encoder's), saved as is: see [`Fragment`](crate::manifest::Fragment).
    /// Loads never make one.
    Fragment(crate::manifest::Fragment),
}

impl Leaf {
    /// The leaf's kind name as used in `LeafInfo` and the CLI.
    pub fn kind(&self) -> &'static str {
        match self {
            Leaf::None => "none",
            Leaf::Bool(_) => "bool",
            Leaf::Int(_) => "int",
            Leaf::Float(_) => "float",
            Leaf::Complex(..) => "complex",
            Leaf::Str(_) => "str",
            Leaf::Bytes(_) => "bytes",
            Leaf::Array(_) => "array",
            Leaf::Fragment(_) => "fragment",
        }
    }

    /// Equality that treats floats bitwise (NaN == NaN with the same bits, -0.0 != 0.0).
    pub fn exact_eq(&self, other: &Leaf) -> bool {
        match (self, other) {
            (Leaf::Float(a), Leaf::Float(b)) => a.to_bits() == b.to_bits(),
            (Leaf::Complex(a, b), Leaf::Complex(c, d)) => a.to_bits() == c.to_bits() && b.to_bits() == d.to_bits(),
            _ => self == other,
        }
    }
}

/// What [`Tree::for_each_place`] meets at a key path.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Place<'a, L> {
    /// A leaf.
    Leaf(&'a L),
    /// The first place of the shared object with this id (its contents are visited next).
    Shared(u64),
    /// Another place of the shared object with this id.
    Ref(u64),
}

/// A tree: containers over leaves of type `L`.
#[derive(Debug, Clone, PartialEq)]
pub enum Tree<L> {
    /// A leaf value.
    Leaf(L),
    /// A list of subtrees.
    List(Vec<Tree<L>>),
    /// A tuple of subtrees (kept distinct from a list so it round-trips as a tuple).
    Tuple(Vec<Tree<L>>),
    /// Ordered dict; keys are unique.
    Dict(Vec<(Key, Tree<L>)>),
    /// A named type with ordered, named fields (dataclass, namedtuple, Rust struct).
    Record {
        /// Name of the user type.
        type_name: String,
        /// Field names and values, in declaration order.
        fields: Vec<(String, Tree<L>)>,
    },
    /// A registered custom type: its name, JSON data, and named children.
    Custom {
        /// Name under which the type was registered.
        type_name: String,
        /// The type's own JSON data (null for none).
        data: serde_json::Value,
        /// Named child subtrees, in order.
        children: Vec<(String, Tree<L>)>,
    },
    /// The first place of an object met at several places of the tree (or inside itself: a
    /// cycle): the others are [`Tree::Ref`]s to its `id`. Not a key-path step: the node's path
    /// is the path of its place (format 1.2, docs/format.md section 4).
    Shared {
        /// The object's id: shared nodes are numbered 0, 1, 2, ... in document order.
        id: u64,
        /// The object.
        node: Box<Tree<L>>,
    },
    /// Another place of the object of shared node `id` (which starts earlier in the tree).
    Ref(u64),
}

/// Run `f` with at least 128 KiB of stack left, switching to a fresh 4 MiB segment when needed:
/// every recursive walk over a tree (up to `MAX_DEPTH` deep, possibly from a hostile file) goes
/// through this, so no input can overflow the stack whatever the build profile.
///
/// The first [`UNCHECKED_LEVELS`] nested calls on a thread skip the check: a thread's first
/// check asks the OS where its stack ends, and on a process's main thread glibc answers by
/// parsing `/proc/self/maps` (slow in a process with many mappings, as a Python process with
/// numpy loaded, and paid by the first load of every process). Trees are rarely deeper; the levels skipped use a few KiB each.
pub fn grow<R>(f: impl FnOnce() -> R) -> R {
    thread_local! {
        static LEVEL: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }
    /// Restores the level however `f` returns (a panic unwinding through included).
    struct Exit;
    impl Drop for Exit {
        fn drop(&mut self) {
            LEVEL.with(|l| l.set(l.get().saturating_sub(1)));
        }
    }
    let level = LEVEL.with(|l| {
        let v = l.get();
        l.set(v + 1);
        v
    });
    let _exit = Exit;
    if level < UNCHECKED_LEVELS {
        f()
    } else {
        stacker::maybe_grow(128 * 1024, 4 * 1024 * 1024, f)
    }
}

/// See [`grow`].
pub const UNCHECKED_LEVELS: usize = 16;

/// [`grow`] for a walk that knows its depth (`depth` levels below its start): its first
/// [`UNCHECKED_LEVELS`] levels skip even `grow`'s level count, whose two thread-local
/// accesses per container show in a walk of many small containers (a `cdylib`'s thread-locals
/// cost a call each); deeper levels are checked. Never inlined: inlined, the walks' code around
/// it grows, and the walk gets slower than with `grow`.
#[inline(never)]
pub fn grow_at<R>(depth: usize, f: impl FnOnce() -> R) -> R {
    if depth < UNCHECKED_LEVELS {
        f()
    } else {
        stacker::maybe_grow(128 * 1024, 4 * 1024 * 1024, f)
    }
}

/// The in-memory tree users build and get back.
pub type Node = Tree<Leaf>;

/// One step from a container to a child, used by key paths.
#[derive(Debug, Clone, PartialEq)]
pub enum Step<'a> {
    /// Position of an item in a list or tuple.
    Index(usize),
    /// Key of a dict entry.
    Key(&'a Key),
    /// Name of a record field or a custom node's child.
    Name(&'a str),
}

/// The body of the leaf walks that need no key path, shared or mutable (`iter` or `iter_mut`):
/// `f` on each leaf, children in order, `recurse` the walk itself.
macro_rules! each_leaf {
    ($tree:expr, $f:ident, $iter:ident, $recurse:ident) => {
        match $tree {
            Tree::Leaf(l) => $f(l),
            Tree::List(v) | Tree::Tuple(v) => grow(|| v.$iter().for_each(|c| c.$recurse($f))),
            Tree::Dict(v) => grow(|| v.$iter().for_each(|(_, c)| c.$recurse($f))),
            Tree::Record { fields, .. } => grow(|| fields.$iter().for_each(|(_, c)| c.$recurse($f))),
            Tree::Custom { children, .. } => grow(|| children.$iter().for_each(|(_, c)| c.$recurse($f))),
            Tree::Shared { node, .. } => grow(|| node.$recurse($f)),
            Tree::Ref(_) => {}
        }
    };
}

impl<L> Tree<L> {
    /// Children with the step that reaches each, in order (empty for leaves).
    pub fn children(&self) -> Vec<(Step<'_>, &Tree<L>)> {
        match self {
            Tree::Leaf(_) | Tree::Ref(_) => vec![],
            Tree::Shared { node, .. } => node.children(),
            Tree::List(v) | Tree::Tuple(v) => v.iter().enumerate().map(|(i, c)| (Step::Index(i), c)).collect(),
            Tree::Dict(v) => v.iter().map(|(k, c)| (Step::Key(k), c)).collect(),
            Tree::Record { fields: v, .. } | Tree::Custom { children: v, .. } => {
                v.iter().map(|(k, c)| (Step::Name(k.as_str()), c)).collect()
            }
        }
    }

    /// Map every leaf, keeping the structure; `f` gets the leaf's key path.
    ///
    /// # Errors
    /// Whatever `f` returns.
    pub fn try_map<M, E>(self, f: &mut impl FnMut(&crate::keypath::KeyPath, L) -> Result<M, E>) -> Result<Tree<M>, E> {
        let mut path = crate::keypath::KeyPath::root();
        self.try_map_at(&mut path, f)
    }

    fn try_map_at<M, E>(
        self,
        path: &mut crate::keypath::KeyPath,
        f: &mut impl FnMut(&crate::keypath::KeyPath, L) -> Result<M, E>,
    ) -> Result<Tree<M>, E> {
        grow(move || self.try_map_inner(path, f))
    }

    fn try_map_inner<M, E>(
        self,
        path: &mut crate::keypath::KeyPath,
        f: &mut impl FnMut(&crate::keypath::KeyPath, L) -> Result<M, E>,
    ) -> Result<Tree<M>, E> {
        use crate::keypath::Segment;
        Ok(match self {
            Tree::Leaf(l) => Tree::Leaf(f(path, l)?),
            Tree::List(v) => Tree::List(map_seq(v, path, f)?),
            Tree::Tuple(v) => Tree::Tuple(map_seq(v, path, f)?),
            Tree::Dict(v) => {
                let mut out = Vec::with_capacity(v.len());
                for (k, c) in v {
                    path.push(Segment::Key(k.clone()));
                    let m = c.try_map_at(path, f);
                    let k = match path.pop() {
                        Some(Segment::Key(k)) => k,
                        _ => unreachable!("pushed a key segment"),
                    };
                    out.push((k, m?));
                }
                Tree::Dict(out)
            }
            Tree::Record { type_name, fields } => Tree::Record { type_name, fields: map_named(fields, path, f)? },
            Tree::Custom { type_name, data, children } => {
                Tree::Custom { type_name, data, children: map_named(children, path, f)? }
            }
            Tree::Shared { id, node } => Tree::Shared { id, node: Box::new(node.try_map_at(path, f)?) },
            Tree::Ref(id) => Tree::Ref(id),
        })
    }

    /// Map every leaf by reference, keeping the structure (keys and names are cloned, leaves are
    /// not); `f` gets the leaf's owned key path. A convenience over [`Tree::map_ref_steps`],
    /// which is cheaper on big trees (no path is built per leaf).
    ///
    /// # Errors
    /// Whatever `f` returns.
    pub fn map_ref<M, E>(
        &self,
        f: &mut impl FnMut(&crate::keypath::KeyPath, &L) -> Result<M, E>,
    ) -> Result<Tree<M>, E> {
        self.map_ref_steps(&mut |steps, l| f(&crate::keypath::KeyPath::from_steps(steps), l))
    }

    /// Visit every leaf in tree order with the borrowed steps that reach it. Nothing is cloned or
    /// formatted per leaf (render a path with [`crate::keypath::steps_text`] only when needed),
    /// which is what makes walks over 100k-leaf trees cheap.
    pub fn for_each_leaf_steps<'a>(&'a self, f: &mut impl FnMut(&[Step<'a>], &'a L)) {
        let mut path = Vec::new();
        self.visit_steps(&mut path, f);
    }

    fn visit_steps<'a>(&'a self, path: &mut Vec<Step<'a>>, f: &mut impl FnMut(&[Step<'a>], &'a L)) {
        let mut go = |step: Step<'a>, c: &'a Tree<L>, path: &mut Vec<Step<'a>>| {
            path.push(step);
            c.visit_steps(path, f);
            path.pop();
        };
        match self {
            Tree::Leaf(l) => f(path, l),
            Tree::List(v) | Tree::Tuple(v) => {
                grow(|| v.iter().enumerate().for_each(|(i, c)| go(Step::Index(i), c, path)))
            }
            Tree::Dict(v) => grow(|| v.iter().for_each(|(k, c)| go(Step::Key(k), c, path))),
            Tree::Record { fields: v, .. } | Tree::Custom { children: v, .. } => {
                grow(|| v.iter().for_each(|(k, c)| go(Step::Name(k), c, path)))
            }
            Tree::Shared { node, .. } => grow(|| node.visit_steps(path, f)),
            Tree::Ref(_) => {}
        }
    }

    /// Map every leaf by reference, keeping the structure; `f` gets the borrowed steps to the
    /// leaf (see [`Tree::for_each_leaf_steps`]). Keys and names are cloned into the new tree.
    ///
    /// # Errors
    /// Whatever `f` returns.
    pub fn map_ref_steps<'a, M, E>(
        &'a self,
        f: &mut impl FnMut(&[Step<'a>], &'a L) -> Result<M, E>,
    ) -> Result<Tree<M>, E> {
        let mut path = Vec::new();
        self.map_steps_at(&mut path, f)
    }

    fn map_steps_at<'a, M, E>(
        &'a self,
        path: &mut Vec<Step<'a>>,
        f: &mut impl FnMut(&[Step<'a>], &'a L) -> Result<M, E>,
    ) -> Result<Tree<M>, E> {
        fn named<'a, L, M, E>(
            v: &'a [(String, Tree<L>)],
            path: &mut Vec<Step<'a>>,
            f: &mut impl FnMut(&[Step<'a>], &'a L) -> Result<M, E>,
        ) -> Result<Vec<(String, Tree<M>)>, E> {
            let mut out = Vec::with_capacity(v.len());
            for (k, c) in v {
                path.push(Step::Name(k));
                let m = c.map_steps_at(path, f);
                path.pop();
                out.push((k.clone(), m?));
            }
            Ok(out)
        }
        if let Tree::Leaf(l) = self {
            // Leaves recurse no further: no stack check for most nodes.
            return Ok(Tree::Leaf(f(path, l)?));
        }
        grow(move || {
            let mut seq = |v: &'a [Tree<L>], path: &mut Vec<Step<'a>>| -> Result<Vec<Tree<M>>, E> {
                let mut out = Vec::with_capacity(v.len());
                for (i, c) in v.iter().enumerate() {
                    path.push(Step::Index(i));
                    let m = c.map_steps_at(path, f);
                    path.pop();
                    out.push(m?);
                }
                Ok(out)
            };
            Ok(match self {
                Tree::Leaf(l) => Tree::Leaf(f(path, l)?),
                Tree::List(v) => Tree::List(seq(v, path)?),
                Tree::Tuple(v) => Tree::Tuple(seq(v, path)?),
                Tree::Dict(v) => {
                    let mut out = Vec::with_capacity(v.len());
                    for (k, c) in v {
                        path.push(Step::Key(k));
                        let m = c.map_steps_at(path, f);
                        path.pop();
                        out.push((k.clone(), m?));
                    }
                    Tree::Dict(out)
                }
                Tree::Record { type_name, fields } => {
                    Tree::Record { type_name: type_name.clone(), fields: named(fields, path, f)? }
                }
                Tree::Custom { type_name, data, children } => Tree::Custom {
                    type_name: type_name.clone(),
                    data: data.clone(),
                    children: named(children, path, f)?,
                },
                Tree::Shared { id, node } => Tree::Shared { id: *id, node: Box::new(node.map_steps_at(path, f)?) },
                Tree::Ref(id) => Tree::Ref(*id),
            })
        })
    }

    /// Visit every leaf with its key path, in tree order.
    pub fn for_each_leaf<'a>(&'a self, f: &mut impl FnMut(&crate::keypath::KeyPath, &'a L)) {
        self.for_each_place(&mut |p, place| {
            if let Place::Leaf(l) = place {
                f(p, l)
            }
        });
    }

    /// Visit every leaf and every place of a shared object with its key path, in tree order:
    /// what tools that show refs by the place holding the object need (`ref #0` is `x`).
    pub fn for_each_place<'a>(&'a self, f: &mut impl FnMut(&crate::keypath::KeyPath, Place<'a, L>)) {
        let mut path = crate::keypath::KeyPath::root();
        self.visit(&mut path, f);
    }

    /// The key path of each shared object's first place, by id.
    pub fn shared_paths(&self) -> HashMap<u64, crate::keypath::KeyPath> {
        let mut out = HashMap::new();
        self.for_each_place(&mut |p, place| {
            if let Place::Shared(id) = place {
                out.entry(id).or_insert_with(|| p.clone());
            }
        });
        out
    }

    fn visit<'a>(
        &'a self,
        path: &mut crate::keypath::KeyPath,
        f: &mut impl FnMut(&crate::keypath::KeyPath, Place<'a, L>),
    ) {
        match self {
            Tree::Leaf(l) => return f(path, Place::Leaf(l)),
            Tree::Shared { id, node } => {
                f(path, Place::Shared(*id));
                return grow(|| node.visit(path, f));
            }
            Tree::Ref(id) => return f(path, Place::Ref(*id)),
            _ => {}
        }
        grow(|| {
            for (step, child) in self.children() {
                path.push(crate::keypath::Segment::from_step(&step));
                child.visit(path, f);
                path.pop();
            }
        })
    }

    /// Call `f` on every leaf in order, without building key paths (cheaper when the path is not
    /// needed).
    pub fn for_each_leaf_unpathed<'a>(&'a self, f: &mut impl FnMut(&'a L)) {
        each_leaf!(self, f, iter, for_each_leaf_unpathed)
    }

    /// Call `f` on every leaf in order, mutably (patching leaves in place costs no new tree).
    pub fn for_each_leaf_mut(&mut self, f: &mut impl FnMut(&mut L)) {
        each_leaf!(self, f, iter_mut, for_each_leaf_mut)
    }

    /// Number of leaves.
    pub fn leaf_count(&self) -> usize {
        let mut n = 0;
        self.for_each_leaf_unpathed(&mut |_| n += 1);
        n
    }

    /// Maximum container depth (a lone leaf has depth 0).
    pub fn depth(&self) -> usize {
        fn deepest<'a, L: 'a>(kids: impl Iterator<Item = &'a Tree<L>>) -> usize {
            grow(|| kids.map(Tree::depth).max().unwrap_or(0))
        }
        match self {
            Tree::Leaf(_) | Tree::Ref(_) => 0,
            Tree::Shared { node, .. } => grow(|| node.depth()),
            Tree::List(v) | Tree::Tuple(v) => 1 + deepest(v.iter()),
            Tree::Dict(v) => 1 + deepest(v.iter().map(|(_, c)| c)),
            Tree::Record { fields, .. } => 1 + deepest(fields.iter().map(|(_, c)| c)),
            Tree::Custom { children, .. } => 1 + deepest(children.iter().map(|(_, c)| c)),
        }
    }

    /// A short name of the container kind (`list`, `dict`, ...) or `leaf`.
    pub fn container_kind(&self) -> &'static str {
        match self {
            Tree::Leaf(_) => "leaf",
            Tree::List(_) => "list",
            Tree::Tuple(_) => "tuple",
            Tree::Dict(_) => "dict",
            Tree::Record { .. } => "record",
            Tree::Custom { .. } => "custom",
            Tree::Shared { node, .. } => node.container_kind(),
            Tree::Ref(_) => "ref",
        }
    }

    /// The node itself, or the object a [`Tree::Shared`] wraps (the shared wrapper is no place
    /// of its own).
    pub fn unshared(&self) -> &Tree<L> {
        match self {
            Tree::Shared { node, .. } => node.unshared(),
            t => t,
        }
    }

    /// Whether the tree holds shared nodes or refs (written as format 1.2; the rules are in
    /// [`crate::refs`]).
    pub fn has_refs(&self) -> bool {
        match self {
            Tree::Shared { .. } | Tree::Ref(_) => true,
            Tree::Leaf(_) => false,
            t => grow(|| t.children().iter().any(|(_, c)| c.has_refs())),
        }
    }
}

fn map_seq<L, M, E>(
    v: Vec<Tree<L>>,
    path: &mut crate::keypath::KeyPath,
    f: &mut impl FnMut(&crate::keypath::KeyPath, L) -> Result<M, E>,
) -> Result<Vec<Tree<M>>, E> {
    let mut out = Vec::with_capacity(v.len());
    for (i, c) in v.into_iter().enumerate() {
        path.push(crate::keypath::Segment::Index(i));
        let m = c.try_map_at(path, f);
        path.pop();
        out.push(m?);
    }
    Ok(out)
}

fn map_named<L, M, E>(
    v: Vec<(String, Tree<L>)>,
    path: &mut crate::keypath::KeyPath,
    f: &mut impl FnMut(&crate::keypath::KeyPath, L) -> Result<M, E>,
) -> Result<Vec<(String, Tree<M>)>, E> {
    let mut out = Vec::with_capacity(v.len());
    for (k, c) in v {
        path.push(crate::keypath::Segment::Name(k));
        let m = c.try_map_at(path, f);
        let k = match path.pop() {
            Some(crate::keypath::Segment::Name(k)) => k,
            _ => unreachable!("pushed a name segment"),
        };
        out.push((k, m?));
    }
    Ok(out)
}

// ---- Convenience constructors for in-memory trees ----

impl Node {
    /// A none leaf.
    pub fn none() -> Node {
        Tree::Leaf(Leaf::None)
    }
    /// A dict with string keys, in the given order.
    pub fn dict<K: Into<Key>>(items: impl IntoIterator<Item = (K, Node)>) -> Node {
        Tree::Dict(items.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }
    /// A list of the items, in order.
    pub fn list(items: impl IntoIterator<Item = Node>) -> Node {
        Tree::List(items.into_iter().collect())
    }
    /// A tuple of the items, in order.
    pub fn tuple(items: impl IntoIterator<Item = Node>) -> Node {
        Tree::Tuple(items.into_iter().collect())
    }
    /// A record of the named type with the given fields, in order.
    pub fn record(type_name: &str, fields: impl IntoIterator<Item = (&'static str, Node)>) -> Node {
        Tree::Record { type_name: type_name.into(), fields: fields.into_iter().map(|(k, v)| (k.into(), v)).collect() }
    }
    /// Exact structural equality (floats bitwise).
    pub fn exact_eq(&self, other: &Node) -> bool {
        match (self, other) {
            (Tree::Leaf(a), Tree::Leaf(b)) => a.exact_eq(b),
            (Tree::List(a), Tree::List(b)) | (Tree::Tuple(a), Tree::Tuple(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.exact_eq(y))
            }
            (Tree::Dict(a), Tree::Dict(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|((k1, x), (k2, y))| k1.same(k2) && x.exact_eq(y))
            }
            (Tree::Record { type_name: t1, fields: a }, Tree::Record { type_name: t2, fields: b }) => {
                t1 == t2 && a.len() == b.len() && a.iter().zip(b).all(|((k1, x), (k2, y))| k1 == k2 && x.exact_eq(y))
            }
            (
                Tree::Custom { type_name: t1, data: d1, children: a },
                Tree::Custom { type_name: t2, data: d2, children: b },
            ) => {
                t1 == t2
                    && d1 == d2
                    && a.len() == b.len()
                    && a.iter().zip(b).all(|((k1, x), (k2, y))| k1 == k2 && x.exact_eq(y))
            }
            (Tree::Shared { id: i, node: a }, Tree::Shared { id: j, node: b }) => i == j && a.exact_eq(b),
            (Tree::Ref(i), Tree::Ref(j)) => i == j,
            _ => false,
        }
    }
    /// The array at this node, if it is an array leaf.
    pub fn as_array(&self) -> Option<&ArrayData> {
        match self {
            Tree::Leaf(Leaf::Array(a)) => Some(a),
            _ => None,
        }
    }
}

macro_rules! leaf_from {
    ($t:ty, $v:ident => $e:expr) => {
        impl From<$t> for Node {
            fn from($v: $t) -> Node {
                Tree::Leaf($e)
            }
        }
    };
}
leaf_from!(bool, v => Leaf::Bool(v));
leaf_from!(i64, v => Leaf::Int(Int::Small(v)));
leaf_from!(i32, v => Leaf::Int(Int::Small(v as i64)));
leaf_from!(u64, v => Leaf::Int(i64::try_from(v).map(Int::Small).unwrap_or_else(|_| Int::Big(BigInt::from(v)))));
leaf_from!(f64, v => Leaf::Float(v));
leaf_from!(&str, v => Leaf::Str(v.to_string()));
leaf_from!(String, v => Leaf::Str(v));
leaf_from!(ArrayData, v => Leaf::Array(v));
leaf_from!(Vec<u8>, v => Leaf::Bytes(Bytes::from(v)));
leaf_from!(Int, v => Leaf::Int(v));
