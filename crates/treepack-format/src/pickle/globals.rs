//! The allow-lists: the `(module, name)` pairs a pickle may name, each mapped to what it stands
//! for. Nothing is imported: a name maps to a [`Global`] or is refused. Which list applies is
//! the caller's choice ([`AllowList`]): a `torch.save` checkpoint's pickle may name tensors,
//! storages and plain containers; a `torch.distributed.checkpoint` `.metadata` pickle the
//! metadata's dataclasses, read as records — neither reader accepts the other's names.

use crate::dtype::DType;

/// Which allow-list a parse resolves globals through: chosen by the caller, never by the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AllowList {
    /// What `torch.save` pickles a checkpoint's structure with (`data.pkl`): tensor and
    /// parameter rebuilds, storages, dtypes, `torch.Size`/`device`, `OrderedDict`, numpy arrays,
    /// scalars and dtypes, a few builtins.
    #[default]
    TorchSave,
    /// What `torch.distributed.checkpoint` pickles its `.metadata` with: the dataclasses of
    /// `torch.distributed.checkpoint.metadata` and `filesystem._StorageInfo` (as
    /// [`Obj::Record`](super::Obj::Record)s), `_MEM_FORMAT_ENCODING`,
    /// `torch.serialization._get_layout`, `pathlib`'s paths (as text), `torch.Size` and
    /// torch dtypes. No tensors, storages, numpy or builtins.
    DcpMetadata,
}

impl AllowList {
    /// What a parse under this list reads, for the message of a refused global.
    pub fn reads(self) -> &'static str {
        match self {
            AllowList::TorchSave => {
                "only tensors, storages, OrderedDict, numpy arrays/scalars/dtypes and plain Python values are read"
            }
            AllowList::DcpMetadata => {
                "a torch.distributed.checkpoint .metadata is read only as the metadata classes torch writes \
                 (Metadata, TensorStorageMetadata, BytesStorageMetadata, ChunkStorageMetadata, \
                 TensorProperties, MetadataIndex, StorageMeta, _StorageInfo), torch.Size, dtypes and plain values"
            }
        }
    }
}

/// A class of `torch.distributed.checkpoint`'s metadata: a dataclass the DCP reader reads as a
/// record of named fields ([`AllowList::DcpMetadata`] only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DcpClass {
    /// `metadata.Metadata`: `state_dict_metadata`, `planner_data`, `storage_data`,
    /// `storage_meta`, `version`.
    Metadata,
    /// `metadata.TensorStorageMetadata`: `properties`, `size`, `chunks`.
    TensorStorageMetadata,
    /// `metadata.BytesStorageMetadata`: no fields (a `torch.save`d object).
    BytesStorageMetadata,
    /// `metadata.ChunkStorageMetadata`: `offsets`, `sizes`.
    ChunkStorageMetadata,
    /// `metadata.TensorProperties`: its state is the tuple its `__getstate__` makes
    /// (`dtype, layout, requires_grad, memory_format, pin_memory[, strides]`).
    TensorProperties,
    /// `metadata.MetadataIndex`: `fqn`, `offset`, `index`.
    MetadataIndex,
    /// `metadata.StorageMeta`: `checkpoint_id`, `save_id`, `load_id`, `modules`.
    StorageMeta,
    /// `filesystem._StorageInfo`: `relative_path`, `offset`, `length`, `transform_descriptors`.
    StorageInfo,
}

impl DcpClass {
    /// `module.name` of the class.
    pub fn name(self) -> &'static str {
        match self {
            DcpClass::Metadata => "torch.distributed.checkpoint.metadata.Metadata",
            DcpClass::TensorStorageMetadata => "torch.distributed.checkpoint.metadata.TensorStorageMetadata",
            DcpClass::BytesStorageMetadata => "torch.distributed.checkpoint.metadata.BytesStorageMetadata",
            DcpClass::ChunkStorageMetadata => "torch.distributed.checkpoint.metadata.ChunkStorageMetadata",
            DcpClass::TensorProperties => "torch.distributed.checkpoint.metadata.TensorProperties",
            DcpClass::MetadataIndex => "torch.distributed.checkpoint.metadata.MetadataIndex",
            DcpClass::StorageMeta => "torch.distributed.checkpoint.metadata.StorageMeta",
            DcpClass::StorageInfo => "torch.distributed.checkpoint.filesystem._StorageInfo",
        }
    }
}

/// What an allowed global stands for.
#[derive(Debug, Clone, PartialEq)]
pub enum Global {
    /// `torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata])`.
    RebuildTensorV2,
    /// `torch._utils._rebuild_tensor(storage, offset, size, stride)`.
    RebuildTensor,
    /// `torch._utils._rebuild_parameter(data, requires_grad, hooks)`.
    RebuildParameter,
    /// `torch._utils._rebuild_parameter_with_state(data, requires_grad, hooks, state)`.
    RebuildParameterWithState,
    /// `torch._tensor._rebuild_from_type_v2(func, new_type, args, state)`.
    RebuildFromTypeV2,
    /// The classes `torch.Tensor` and `torch.nn.Parameter`, as `new_type` of the above.
    TensorClass {
        /// `torch.nn.Parameter` (else `torch.Tensor`).
        parameter: bool,
    },
    /// A torch storage class (`torch.FloatStorage`..., `torch.UntypedStorage`), with its dtype.
    StorageType(DType),
    /// A torch dtype (`torch.float32`...), with its treepack name.
    TorchDtype(DType),
    /// `torch.Size`.
    TorchSize,
    /// `torch.device`.
    TorchDevice,
    /// `collections.OrderedDict`.
    OrderedDict,
    /// `builtins.set` / `builtins.frozenset`.
    Set {
        /// `frozenset`.
        frozen: bool,
    },
    /// `builtins.slice`.
    Slice,
    /// `builtins.complex`.
    Complex,
    /// `builtins.bytearray`.
    ByteArray,
    /// `_codecs.encode(str, "latin1")`: how protocol 2 pickles `bytes`.
    CodecsEncode,
    /// `numpy.core.multiarray._reconstruct` (and `numpy._core...`).
    NumpyReconstruct,
    /// `numpy.ndarray`, the class `_reconstruct` is given.
    NumpyNdarray,
    /// `numpy.dtype`.
    NumpyDtype,
    /// `numpy.core.multiarray.scalar` (and `numpy._core...`).
    NumpyScalar,
    /// A dataclass of DCP's metadata, made as a record by `NEWOBJ` and filled by `BUILD`.
    Dcp(DcpClass),
    /// `torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING(n)`: an enum member.
    DcpMemFormat,
    /// `torch.serialization._get_layout(name)`: a `torch.layout` by its name (`torch.strided`).
    TorchLayout,
    /// `pathlib.PosixPath(*parts)` / `PurePosixPath` (and the Windows ones, where `windows`):
    /// read as its text.
    Path {
        /// `WindowsPath` / `PureWindowsPath`: parts joined with `\\`.
        windows: bool,
    },
}

impl Global {
    /// The name this kind is shown with in messages.
    pub fn name(&self) -> String {
        match self {
            Global::RebuildTensorV2 => "torch._utils._rebuild_tensor_v2".into(),
            Global::RebuildTensor => "torch._utils._rebuild_tensor".into(),
            Global::RebuildParameter => "torch._utils._rebuild_parameter".into(),
            Global::RebuildParameterWithState => "torch._utils._rebuild_parameter_with_state".into(),
            Global::RebuildFromTypeV2 => "torch._tensor._rebuild_from_type_v2".into(),
            Global::TensorClass { parameter: true } => "torch.nn.Parameter".into(),
            Global::TensorClass { parameter: false } => "torch.Tensor".into(),
            Global::StorageType(d) => format!("torch storage of {}", d.display()),
            Global::TorchDtype(d) => format!("torch.{}", torch_dtype_name(d)),
            Global::TorchSize => "torch.Size".into(),
            Global::TorchDevice => "torch.device".into(),
            Global::OrderedDict => "collections.OrderedDict".into(),
            Global::Set { frozen: false } => "builtins.set".into(),
            Global::Set { frozen: true } => "builtins.frozenset".into(),
            Global::Slice => "builtins.slice".into(),
            Global::Complex => "builtins.complex".into(),
            Global::ByteArray => "builtins.bytearray".into(),
            Global::CodecsEncode => "_codecs.encode".into(),
            Global::NumpyReconstruct => "numpy.core.multiarray._reconstruct".into(),
            Global::NumpyNdarray => "numpy.ndarray".into(),
            Global::NumpyDtype => "numpy.dtype".into(),
            Global::NumpyScalar => "numpy.core.multiarray.scalar".into(),
            Global::Dcp(c) => c.name().into(),
            Global::DcpMemFormat => "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING".into(),
            Global::TorchLayout => "torch.serialization._get_layout".into(),
            Global::Path { windows: false } => "pathlib.PosixPath".into(),
            Global::Path { windows: true } => "pathlib.WindowsPath".into(),
        }
    }
}

/// torch's storage classes and their element types.
const STORAGES: &[(&str, DType)] = &[
    ("DoubleStorage", DType::F64),
    ("FloatStorage", DType::F32),
    ("HalfStorage", DType::F16),
    ("BFloat16Storage", DType::BF16),
    ("LongStorage", DType::I64),
    ("IntStorage", DType::I32),
    ("ShortStorage", DType::I16),
    ("CharStorage", DType::I8),
    ("ByteStorage", DType::U8),
    ("BoolStorage", DType::Bool),
    ("ComplexFloatStorage", DType::C64),
    ("ComplexDoubleStorage", DType::C128),
    ("UntypedStorage", DType::U8),
];

/// torch's dtype attributes and the treepack dtypes they are.
const TORCH_DTYPES: &[(&str, DType)] = &[
    ("float64", DType::F64),
    ("double", DType::F64),
    ("float32", DType::F32),
    ("float", DType::F32),
    ("float16", DType::F16),
    ("half", DType::F16),
    ("bfloat16", DType::BF16),
    ("int64", DType::I64),
    ("long", DType::I64),
    ("int32", DType::I32),
    ("int", DType::I32),
    ("int16", DType::I16),
    ("short", DType::I16),
    ("int8", DType::I8),
    ("uint8", DType::U8),
    ("uint16", DType::U16),
    ("uint32", DType::U32),
    ("uint64", DType::U64),
    ("bool", DType::Bool),
    ("complex64", DType::C64),
    ("cfloat", DType::C64),
    ("complex128", DType::C128),
    ("cdouble", DType::C128),
    ("float8_e4m3fn", DType::F8E4M3FN),
    ("float8_e5m2", DType::F8E5M2),
    ("float8_e4m3fnuz", DType::F8E4M3FNUZ),
    ("float8_e5m2fnuz", DType::F8E5M2FNUZ),
    ("float8_e8m0fnu", DType::F8E8M0FNU),
];

/// The name torch gives a dtype (`float32` for [`DType::F32`]).
pub fn torch_dtype_name(d: &DType) -> &'static str {
    TORCH_DTYPES.iter().find(|(_, t)| t == d).map_or("unknown", |(n, _)| n)
}

/// What `module.name` stands for under `list`, or `None`: refused.
pub fn lookup(module: &str, name: &str, list: AllowList) -> Option<Global> {
    match list {
        AllowList::TorchSave => lookup_torch_save(module, name),
        AllowList::DcpMetadata => lookup_dcp(module, name),
    }
}

/// The `.metadata` list: DCP's classes, and the torch values their fields hold.
fn lookup_dcp(module: &str, name: &str) -> Option<Global> {
    const METADATA: &str = "torch.distributed.checkpoint.metadata";
    Some(match (module, name) {
        (METADATA, "Metadata") => Global::Dcp(DcpClass::Metadata),
        (METADATA, "TensorStorageMetadata") => Global::Dcp(DcpClass::TensorStorageMetadata),
        (METADATA, "BytesStorageMetadata") => Global::Dcp(DcpClass::BytesStorageMetadata),
        (METADATA, "ChunkStorageMetadata") => Global::Dcp(DcpClass::ChunkStorageMetadata),
        (METADATA, "TensorProperties") => Global::Dcp(DcpClass::TensorProperties),
        (METADATA, "MetadataIndex") => Global::Dcp(DcpClass::MetadataIndex),
        (METADATA, "StorageMeta") => Global::Dcp(DcpClass::StorageMeta),
        (METADATA, "_MEM_FORMAT_ENCODING") => Global::DcpMemFormat,
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo") => Global::Dcp(DcpClass::StorageInfo),
        ("torch.serialization", "_get_layout") => Global::TorchLayout,
        // Python 3.13 defines the path classes in `pathlib._local`.
        ("pathlib" | "pathlib._local", "PosixPath" | "PurePosixPath") => Global::Path { windows: false },
        ("pathlib" | "pathlib._local", "WindowsPath" | "PureWindowsPath") => Global::Path { windows: true },
        ("torch", "Size") => Global::TorchSize,
        ("torch", n) => Global::TorchDtype(TORCH_DTYPES.iter().find(|(s, _)| *s == n)?.1.clone()),
        _ => return None,
    })
}

/// The `torch.save` list.
fn lookup_torch_save(module: &str, name: &str) -> Option<Global> {
    let numpy_core = matches!(module, "numpy.core.multiarray" | "numpy._core.multiarray");
    Some(match (module, name) {
        ("torch._utils", "_rebuild_tensor_v2") => Global::RebuildTensorV2,
        ("torch._utils", "_rebuild_tensor") => Global::RebuildTensor,
        ("torch._utils", "_rebuild_parameter") => Global::RebuildParameter,
        ("torch._utils", "_rebuild_parameter_with_state") => Global::RebuildParameterWithState,
        ("torch._tensor", "_rebuild_from_type_v2") => Global::RebuildFromTypeV2,
        ("torch._tensor" | "torch", "Tensor") => Global::TensorClass { parameter: false },
        ("torch.nn.parameter", "Parameter") => Global::TensorClass { parameter: true },
        ("torch", "Size") => Global::TorchSize,
        ("torch", "device") => Global::TorchDevice,
        ("torch" | "torch.storage", "UntypedStorage") => Global::StorageType(DType::U8),
        ("torch", n) => {
            if let Some((_, d)) = STORAGES.iter().find(|(s, _)| *s == n) {
                Global::StorageType(d.clone())
            } else if let Some((_, d)) = TORCH_DTYPES.iter().find(|(s, _)| *s == n) {
                Global::TorchDtype(d.clone())
            } else {
                return None;
            }
        }
        ("collections", "OrderedDict") => Global::OrderedDict,
        ("builtins" | "__builtin__", "set") => Global::Set { frozen: false },
        ("builtins" | "__builtin__", "frozenset") => Global::Set { frozen: true },
        ("builtins" | "__builtin__", "slice") => Global::Slice,
        ("builtins" | "__builtin__", "complex") => Global::Complex,
        ("builtins" | "__builtin__", "bytearray") => Global::ByteArray,
        ("_codecs", "encode") => Global::CodecsEncode,
        (_, "_reconstruct") if numpy_core => Global::NumpyReconstruct,
        (_, "scalar") if numpy_core => Global::NumpyScalar,
        ("numpy", "ndarray") => Global::NumpyNdarray,
        ("numpy", "dtype") => Global::NumpyDtype,
        _ => return None,
    })
}
