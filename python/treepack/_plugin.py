"""The extension API of treepack's framework integrations (``treepack/integrations/*``): the
registry they plug into and the few helpers of the generic layer they need. An integration
imports this module and nothing else of treepack (python/tests/test_architecture.py). An
integration that offers a whole API of its own (``treepack.jax``'s calls) makes them with the
public ``save``, ``load`` and ``load_structure`` re-exported here, and runs background work on
``executor()``, the pool of non-blocking saves.

An integration module calls ``integrate(__name__, ...)`` when it is imported, with the functions
of ``treepack._registry.Handlers``; ``treepack._registry.INTEGRATIONS`` says which names lead
to it (docs/architecture.md, "The Python packages: integrations as plug-ins").
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, Optional

from . import _core as core  # the extension (Reader, prepare, block_chunk_shape, encode_png…)
from . import _staging as staging  # the buffers loads copy through onto a device (Ring, put_back)
from ._api import LoadRequest, _opts, load, load_structure, save
from ._async import _executor as executor
from ._codec import PARTIAL_TYPES, encode_array, encode_other, np_dtype, resolve_class, tz_data, tz_from, zone_key
from ._codec.files import files_of
from ._errors import ForeignFileError, UnsupportedObjectError
from ._lazy import LazyArray, slice_text
from ._like import check_subtree, child_path, deref, describe_stored, forget_places, key_child_path, stored_dtype, take_all, where
from ._parts import SHARDS, Piece
from ._parts import commit as commit_parts
from ._registry import DECLINE, Description, SaveRun, SaveState, integrate, save_state, trust_globs, type_name
from ._structure import LeafInfo, StructNode

__all__ = [
    "DECLINE", "Description", "ForeignFileError", "LazyArray", "LeafInfo", "LoadRequest", "PARTIAL_TYPES", "Piece",
    "SHARDS", "SaveRun", "SaveState", "StructNode", "check_subtree", "child_path", "commit_parts", "core", "deref",
    "describe_stored", "encode_array", "forget_places", "encode_other", "executor", "files_of", "integrate", "integrate_nodes", "key_child_path", "load",
    "load_structure", "np_dtype", "resolve_class", "save",
    "save_state", "slice_text", "staging", "storage_options", "stored_dtype", "take_all", "trust_globs", "tz_data", "tz_from",
    "UnsupportedObjectError", "type_name",
    "where", "zone_key",
]


def storage_options(options: Optional[Dict[str, Any]]) -> Optional[Dict[str, str]]:
    """``storage_options=`` as the extension takes them (every value a string)."""
    return _opts(options)


def integrate_nodes(module: str, accepts: Callable[[Any], bool], encode: Callable[[Any], Description],
                    decode: Callable[[str, Dict[str, Any]], Any], names: Iterable[str],
                    hint: Optional[Callable[[Any], Optional[str]]] = None) -> Any:
    """Register the integration ``module`` whose values are node types built from their children
    alone (pandas' frames, xarray's arrays): ``accepts`` picks its values, ``encode(obj)``
    describes one (its TypeError is worded with the place the value was met), ``decode(t,
    kids)`` builds one back (its LookupError, a library it needs missing, becomes the decoder's
    placeholder for a missing node type); ``hint(obj)``, what to do with another object of
    the framework that a save refuses (or None)."""

    def _encode(obj: Any, where: str, memo: Any, omit_static: bool) -> Optional[Description]:
        if not accepts(obj):
            return None
        try:
            return encode(obj)
        except TypeError as e:
            # (a value the framework's codec cannot keep: named with the save's other refusals)
            raise UnsupportedObjectError(where, type_name(type(obj)), str(e)) from None

    def _decode(dec: Any, t: str, data: Any, kids: Dict[str, Any]) -> Any:
        try:
            return decode(t, kids)
        except LookupError as e:
            return dec.missing(t, None, str(e))

    return integrate(module, encode=_encode, nodes={name: _decode for name in names}, hint=hint)
