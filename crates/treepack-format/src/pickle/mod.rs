//! Pickle streams read as data, never executed (issue 54).
//!
//! [`parse`] interprets the opcodes of pickle protocols 0–5 the way Python's unpickler does,
//! except that nothing is imported or called: a global (`GLOBAL`, `STACK_GLOBAL`, `INST`)
//! resolves only through an allow-list ([`globals`]) to a [`Global`] *kind*, and applying one
//! (`REDUCE`, `NEWOBJ`, `OBJ`, `BUILD`) builds a typed [`Obj`] node from its arguments, checked
//! as data. Every other global is refused when it is met, with an error naming `module.name`
//! and the key path (the dict keys and list indexes leading there).
//!
//! What it allows is chosen by the caller ([`AllowList`]). For a `torch.save` checkpoint, what
//! `torch.save` (protocol 2), numpy arrays, scalars and dtypes, and plain Python containers
//! pickle to: [`torch`] turns a parsed checkpoint pickle into a tree whose tensors are described
//! by their storage, dtype, shape, strides and offset, for the engine to read from the
//! checkpoint's zip. For a `torch.distributed.checkpoint` folder's `.metadata`, DCP's metadata
//! dataclasses, read as [`Record`]s of named fields: [`dcp`] turns them into a typed
//! description of the checkpoint. Records exist only under that list, so a `torch.save` file
//! naming those classes is refused as before.
//!
//! Bounded: the interpreter is one loop (no recursion), every declared length is checked
//! against the bytes left before anything is allocated, memo indexes, nesting of `MARK`s, the
//! number of objects and big integers' sizes are limited ([`Limits`]), and the walks that turn
//! objects into trees are bounded in depth and in output size (a pickle can share one object at
//! many places and so describe an exponentially large tree). Every failure is a
//! [`PickleError`]; nothing here panics on data.

pub mod dcp;
pub mod globals;
mod machine;
pub mod torch;

use crate::model::Int;

pub use globals::{AllowList, DcpClass, Global};
pub use machine::{parse, parse_placeholders, parse_with};

/// Limits of one parse. The defaults suit checkpoints of any real size: the counts grow with
/// the number of tensors (a few objects each), not with their bytes.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Nesting: open `MARK`s while parsing, and levels of the tree built from the objects.
    pub max_depth: usize,
    /// Memo entries, and the largest memo index a `PUT` may name.
    pub max_memo: u64,
    /// Objects the stream may create (each opcode creates at most one).
    pub max_objects: usize,
    /// Nodes of the tree built from the objects (objects met at several places count each
    /// time). The walk also stops at 8 nodes per object the stream made (at least 2^20): a
    /// stream that shares objects to describe a much larger tree is refused before that tree
    /// fills memory.
    pub max_tree_nodes: u64,
    /// Bytes of one big integer (`LONG1`/`LONG4`), digits of one text integer.
    pub max_int_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_depth: 1000,
            max_memo: 1 << 24,
            max_objects: 1 << 26,
            max_tree_nodes: 1 << 24,
            max_int_bytes: 4096,
        }
    }
}

/// Why a pickle was refused. [`PickleError::kind`] names the kind in a word.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PickleError {
    /// A global outside the allow-list: nothing was imported or called.
    #[error("refused global `{global}` at `{path}`: {reads}; nothing named by the file is imported or run (load the file with the code that wrote it only if you trust it)")]
    Refused {
        /// `module.name` as the pickle names it.
        global: String,
        /// Key path where it was met (`/` for the root).
        path: String,
        /// What the allow-list in use reads ([`AllowList::reads`]).
        reads: &'static str,
    },
    /// An allowed global used in a way it may not be (called with the wrong arguments, built
    /// on with `BUILD`, a class where a function belongs...).
    #[error("`{global}` at `{path}`: {reason}")]
    BadCall {
        /// `module.name` of the global, or the kind of object acted on.
        global: String,
        /// Key path where it was met.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// An opcode this reader does not interpret (extension codes, out-of-band buffers,
    /// persistent ids other than torch storages, unknown bytes).
    #[error("opcode {name} (0x{code:02x}) at byte {offset}: {reason}")]
    Opcode {
        /// The opcode byte.
        code: u8,
        /// Its name (`EXT1`, `NEXT_BUFFER`...), or `unknown`.
        name: &'static str,
        /// Where it is in the stream.
        offset: usize,
        /// Why it is refused.
        reason: String,
    },
    /// The stream ends inside an opcode or before `STOP`.
    #[error("truncated pickle: {what} at byte {offset} needs {needed} bytes, {left} left")]
    Truncated {
        /// What was being read.
        what: &'static str,
        /// Where.
        offset: usize,
        /// Bytes it declares or needs.
        needed: u64,
        /// Bytes left in the stream.
        left: u64,
    },
    /// The stream is not a well-formed pickle (stack underflow, a missing `MARK`, a memo index
    /// never stored, a bad text literal, a container of the wrong kind...).
    #[error("malformed pickle at byte {offset}: {reason}")]
    Malformed {
        /// Where (0 when found after parsing).
        offset: usize,
        /// What is wrong.
        reason: String,
    },
    /// A limit of [`Limits`] was exceeded.
    #[error("pickle {what} exceeds the limit of {limit} ({detail})")]
    Limit {
        /// What is limited (`depth`, `memo index`, `objects`, `tree nodes`, `integer size`).
        what: &'static str,
        /// The limit.
        limit: u64,
        /// The value met, or where.
        detail: String,
    },
}

impl PickleError {
    /// A short, stable name of the kind: `refused`, `bad_call`, `opcode`, `truncated`,
    /// `malformed`, `limit`.
    pub fn kind(&self) -> &'static str {
        match self {
            PickleError::Refused { .. } => "refused",
            PickleError::BadCall { .. } => "bad_call",
            PickleError::Opcode { .. } => "opcode",
            PickleError::Truncated { .. } => "truncated",
            PickleError::Malformed { .. } => "malformed",
            PickleError::Limit { .. } => "limit",
        }
    }
}

/// An object's index in the objects of a [`Pickle`].
pub type Id = u32;

/// A torch storage named by a persistent id `('storage', storage_type, key, location, numel)`.
#[derive(Debug, Clone, PartialEq)]
pub struct StorageRef {
    /// The element type of the storage class (`torch.FloatStorage` → float32; `UntypedStorage` → uint8).
    pub dtype: crate::dtype::DType,
    /// Its key: the entry `data/<key>` of the checkpoint's zip.
    pub key: String,
    /// The device it was saved from (`cpu`, `cuda:0`).
    pub location: String,
    /// Its length in elements of `dtype`.
    pub numel: u64,
}

/// A tensor rebuilt by `torch._utils._rebuild_tensor_v2` (or `_rebuild_tensor`), as data.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorObj {
    /// The storage object (an [`Obj::Storage`]).
    pub storage: Id,
    /// Offset into the storage, in elements.
    pub offset: u64,
    /// Shape.
    pub shape: Vec<u64>,
    /// Strides, in elements.
    pub stride: Vec<u64>,
    /// `requires_grad` as saved.
    pub requires_grad: bool,
    /// Rebuilt as a `torch.nn.Parameter`.
    pub parameter: bool,
}

/// A numpy array or dtype under construction (`_reconstruct` then `BUILD`), as data.
#[derive(Debug, Clone, PartialEq)]
pub enum NumpyObj {
    /// `numpy.dtype(descr, align, copy)`, with the byte order its `BUILD` state gives.
    Dtype {
        /// `f8`, `i4`, `b1`, `U3`...
        descr: String,
        /// `<`, `>`, `|` or `=` (`None` before `BUILD`).
        order: Option<char>,
    },
    /// `_reconstruct(ndarray, (0,), b'b')` before its `BUILD` (`None`) and after it.
    Array(Option<NumpyArray>),
    /// `scalar(dtype, bytes)`.
    Scalar {
        /// The dtype object (an [`Obj::Numpy`] dtype).
        dtype: Id,
        /// The value's bytes, in the dtype's byte order.
        data: Vec<u8>,
    },
}

/// A numpy array's `BUILD` state: `(version, shape, dtype, is_fortran, rawdata)`.
#[derive(Debug, Clone, PartialEq)]
pub struct NumpyArray {
    /// Shape.
    pub shape: Vec<u64>,
    /// The dtype object (an [`Obj::Numpy`] dtype).
    pub dtype: Id,
    /// Fortran (column-major) order of `data`.
    pub fortran: bool,
    /// The elements' bytes.
    pub data: Vec<u8>,
}

/// An instance of a class an allow-list reads as a record ([`AllowList::DcpMetadata`]'s
/// dataclasses, an enum member, a `torch.layout`): its fields by name, as its `BUILD` state (or
/// the call) gave them. Nothing of the class is run: only the reader that asked for the list
/// makes sense of the fields.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// The class ([`Global::Dcp`], [`Global::DcpMemFormat`], [`Global::TorchLayout`]).
    pub class: Global,
    /// Field name and value, in the order the state gave them.
    pub fields: Vec<(String, Id)>,
    /// Whether its state was set (`BUILD`); a record's state is set at most once.
    pub built: bool,
}

impl Record {
    /// The value of field `name`, if the state set it.
    pub fn field(&self, name: &str) -> Option<Id> {
        self.fields.iter().rev().find(|(n, _)| n == name).map(|&(_, v)| v)
    }
}

/// An object the pickle made: plain Python values, and typed nodes for the allowed globals.
#[derive(Debug, Clone, PartialEq)]
pub enum Obj {
    /// `None`.
    None,
    /// `True`/`False`.
    Bool(bool),
    /// An integer of any size.
    Int(Int),
    /// A float.
    Float(f64),
    /// `complex(re, im)`.
    Complex(f64, f64),
    /// A str.
    Str(String),
    /// bytes.
    Bytes(Vec<u8>),
    /// bytearray.
    ByteArray(Vec<u8>),
    /// A list.
    List(Vec<Id>),
    /// A tuple.
    Tuple(Vec<Id>),
    /// A dict or an `OrderedDict`, its pairs in order (duplicate keys replaced in place when
    /// they are simple values).
    Dict {
        /// Key and value ids, in insertion order.
        items: Vec<(Id, Id)>,
        /// Made by `collections.OrderedDict`.
        ordered: bool,
        /// An `OrderedDict`'s instance attributes, set by `BUILD` (a state_dict's `_metadata`):
        /// a dict of attribute names.
        attrs: Option<Id>,
    },
    /// A set or frozenset, its items in pickle order.
    Set {
        /// Item ids.
        items: Vec<Id>,
        /// A `frozenset`.
        frozen: bool,
    },
    /// `slice(start, stop, step)`.
    Slice(Id, Id, Id),
    /// An allowed global itself, not called (a dtype such as `torch.float32`, a class).
    Global(Global),
    /// A torch storage (persistent id).
    Storage(StorageRef),
    /// A torch tensor.
    Tensor(TensorObj),
    /// A `torch.Size`.
    Size(Vec<u64>),
    /// A `torch.device`, as text (`cpu`, `cuda:0`).
    Device(String),
    /// A numpy dtype, array or scalar.
    Numpy(NumpyObj),
    /// An instance of a class read as a record (DCP's metadata only).
    Record(Record),
    /// A global outside the allow-list, or what the stream made by calling it or setting its
    /// state, as a placeholder naming it (`module.name`): only made by
    /// [`parse_placeholders`]; nothing of it was imported or run.
    Refused(String),
}

impl Obj {
    /// The Python type name of the object, for messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Obj::None => "None",
            Obj::Bool(_) => "bool",
            Obj::Int(_) => "int",
            Obj::Float(_) => "float",
            Obj::Complex(..) => "complex",
            Obj::Str(_) => "str",
            Obj::Bytes(_) => "bytes",
            Obj::ByteArray(_) => "bytearray",
            Obj::List(_) => "list",
            Obj::Tuple(_) => "tuple",
            Obj::Dict { ordered: false, .. } => "dict",
            Obj::Dict { ordered: true, .. } => "OrderedDict",
            Obj::Set { frozen: false, .. } => "set",
            Obj::Set { frozen: true, .. } => "frozenset",
            Obj::Slice(..) => "slice",
            Obj::Global(_) => "global",
            Obj::Storage(_) => "torch storage",
            Obj::Tensor(_) => "torch.Tensor",
            Obj::Size(_) => "torch.Size",
            Obj::Device(_) => "torch.device",
            Obj::Numpy(NumpyObj::Dtype { .. }) => "numpy.dtype",
            Obj::Numpy(NumpyObj::Array(_)) => "numpy.ndarray",
            Obj::Numpy(NumpyObj::Scalar { .. }) => "numpy scalar",
            Obj::Refused(_) => "refused global",
            Obj::Record(r) => match r.class {
                Global::Dcp(c) => c.name(),
                Global::DcpMemFormat => "_MEM_FORMAT_ENCODING",
                Global::TorchLayout => "torch.layout",
                _ => "record",
            },
        }
    }
}

/// A parsed pickle: every object it made, and the one `STOP` returned.
#[derive(Debug, Clone)]
pub struct Pickle {
    objects: Vec<Obj>,
    root: Id,
}

impl Pickle {
    /// The object `STOP` returned.
    pub fn root(&self) -> Id {
        self.root
    }
    /// The object `id` (ids come from this pickle's objects, so they are in range).
    pub fn get(&self, id: Id) -> &Obj {
        // Ids are only made by the parser, as indexes of objects it pushed.
        self.objects.get(id as usize).unwrap_or(&Obj::None)
    }
    /// How many objects the stream made.
    pub fn len(&self) -> usize {
        self.objects.len()
    }
    /// Whether it made none (never: a parsed pickle returns one).
    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }
}
