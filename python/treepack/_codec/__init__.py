"""Python-side encoding of the types the Rust walker does not handle itself, and decoding back.

Built-in Python types are stored as custom nodes named ``py.<type>`` (always allowed: treepack's
own decoders build them, nothing is imported). Dataclasses and namedtuples are records named
``module:qualname``; enums are ``py.enum`` nodes naming their class; both are rebuilt only when
trusted. Registered types are custom nodes named by their registration.
"""

from .builtins import (
    AUDIT_FREE,
    BUILTIN_TYPES,
    BuildError,
    PARTIAL_TYPES,
    Decoder,
    MissingFramework,
    Unloadable,
    encode_other,
    _tz_data as tz_data,
    _tz_from as tz_from,
    zone_key,
)
from .classes import _seen_classes, resolve_class
from .files import File
from .dtypes import _dtype_cache, _dtype_desc, _np_dtype, encode_array, np_dtype
from .trust import audit

__all__ = [
    "AUDIT_FREE", "BUILTIN_TYPES", "BuildError", "PARTIAL_TYPES", "Decoder", "File", "MissingFramework", "Unloadable", "audit", "encode_array", "encode_other",
    "np_dtype", "resolve_class", "tz_data", "tz_from", "zone_key",
]
