//! The allow-list: the `(module, name)` pairs a pickle may name, each mapped to what it stands
//! for. Nothing is imported: a name maps to a [`Global`] or is refused.

use crate::dtype::DType;

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

/// What `module.name` stands for, or `None`: refused.
pub fn lookup(module: &str, name: &str) -> Option<Global> {
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
