"""torch dtypes as treepack stores them: which go straight to numpy, which through an integer
view of their width (bfloat16, float8), and what to do with those treepack cannot keep."""

from __future__ import annotations

from typing import Any

import numpy as np

#: torch dtype name -> (dtype to view the tensor as for ``.numpy()``, numpy dtype name or
#: ml_dtypes name the stored array has). Views keep the bytes: bfloat16 and float8 tensors are
#: read as integers of their width and reinterpreted, since torch's ``.numpy()`` refuses them.
VIA = {
    "bfloat16": ("int16", "bfloat16"),
    "float8_e4m3fn": ("uint8", "float8_e4m3fn"),
    "float8_e5m2": ("uint8", "float8_e5m2"),
    "float8_e4m3fnuz": ("uint8", "float8_e4m3fnuz"),
    "float8_e5m2fnuz": ("uint8", "float8_e5m2fnuz"),
    "float8_e8m0fnu": ("uint8", "float8_e8m0fnu"),  # format 1.5
}
DIRECT = frozenset(
    "bool uint8 int8 int16 int32 int64 uint16 uint32 uint64 float16 float32 float64 complex64 complex128".split()
)
HINTS = {
    "complex32": "convert it with .to(torch.complex64)",
    "quint8": "store .int_repr() and the quantization parameters, or .dequantize()",
    "qint8": "store .int_repr() and the quantization parameters, or .dequantize()",
    "qint32": "store .int_repr() and the quantization parameters, or .dequantize()",
    "quint4x2": "store .int_repr() and the quantization parameters, or .dequantize()",
    # Two float4 values in each byte: treepack's float4_e2m1fn holds one per byte (as ml_dtypes).
    "float4_e2m1fn_x2": "it packs two float4_e2m1fn values into each byte; store .view(torch.uint8) "
    "(and unpack it yourself), or unpack it into a numpy ml_dtypes.float4_e2m1fn array (one value per byte)",
}
# torch's int1-int7 and uint1-uint7 are placeholders: a byte each, with no defined value or
# conversion (torch cannot copy into or read them), so no treepack dtype is their exact match.
for _bits in range(1, 8):
    for _name in (f"int{_bits}", f"uint{_bits}"):
        HINTS[_name] = (
            "torch's sub-byte integer dtypes hold bits without defined values; store .view(torch.uint8) "
            "with how it is packed, or a numpy ml_dtypes int4/int2/int1 (uint4/uint2/uint1) array"
        )


def dtype_name(dt: Any) -> str:
    return str(dt).rpartition(".")[2]


def numpy_of(torch: Any, t: Any) -> np.ndarray:
    """A numpy view of the CPU tensor ``t``'s memory (bf16 and the like as the integer type of
    their size, which the reader fills byte for byte)."""
    name = dtype_name(t.dtype)
    return (t.view(getattr(torch, VIA[name][0])) if name in VIA else t).numpy()
