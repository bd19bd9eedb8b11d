"""treepack: save and load trees of data — nested dicts, lists, tuples, dataclasses and custom
objects whose leaves are numpy arrays, scalars, strings and bytes — fast, safely and partially.

Strict by default: loading never imports or runs code it was not told to trust, and never
unpickles unless ``allow_pickle=True``. See docs/python.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import _codec, _core, _like, _registry
from ._api import (
    LeafInfo,
    PathLike,
    Progress,
    SaveInfo,
    StorageOptions,
    StructNode,
    UntrustedTypeError,
    VerifyReport,
    _struct_node,
    diff,
    gc,
    load,
    load_structure,
    root_hash,
    save,
    untrusted_types,
    verify,
)
from ._async import SaveHandle, aload, asave
from ._codec import BuildError, File, Unloadable
from ._core import CorruptError, FormatError, RootMismatchError, TreepackError
from ._errors import ForeignFileError, UnsupportedObjectError
from ._lazy import LazyArray, View, open
from ._registry import Registration, register, registered
from ._core import (
    InvalidSignatureError, SignatureError, SignatureMismatchError, UnsignedError, UntrustedSignerError,
    EncryptionError, EncryptedError, NotEncryptedError, WrongKeyError, TamperedError,
)
from ._encryption import KeyProvider, Passphrase, generate_encryption_key

if TYPE_CHECKING:  # what the names below resolve to, for type checkers and editors
    from ._html import HTMLTree, html_tree
    from ._signing import SignatureInfo, generate_key, sign, signature, verify_signature
    from ._view import ViewServer, view
    from ._convert import convert
    from ._repo import CheckpointManager, Repository, TreeRef
    from ._transport import dumps, export_json, loads, schema

__version__ = _core.__version__

# Names whose modules load on first use (PEP 562): signing, notebook drawing, the viewer
# server, conversions, repositories and JSON transport are what a plain save or load never
# needs, and their imports (dataclasses, `html`'s entity table, zip and foreign readers) were
# near half of `import treepack`.
_LATER = {
    "SignatureInfo": "_signing", "generate_key": "_signing", "sign": "_signing", "signature": "_signing",
    "verify_signature": "_signing", "HTMLTree": "_html", "html_tree": "_html", "ViewServer": "_view", "view": "_view",
    "convert": "_convert", "CheckpointManager": "_repo", "Repository": "_repo", "TreeRef": "_repo",
    "dumps": "_transport", "export_json": "_transport", "loads": "_transport", "schema": "_transport",
}


def __getattr__(name: str):  # noqa: ANN202 (the module's own hook)
    module = _LATER.get(name)
    if module is None:
        raise AttributeError(f"module 'treepack' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():  # noqa: ANN202
    return sorted(set(globals()) | set(_LATER))

__all__ = [
    "save", "load", "load_structure", "open", "untrusted_types", "verify", "gc", "asave", "aload", "SaveHandle",
    "register", "registered", "Registration", "File", "LeafInfo", "StructNode", "SaveInfo", "Unloadable", "BuildError",
    "UntrustedTypeError", "UnsupportedObjectError", "TreepackError", "CorruptError", "FormatError", "ForeignFileError", "RootMismatchError", "root_hash", "diff", "convert", "dumps", "loads", "export_json", "schema", "Repository", "TreeRef", "CheckpointManager", "View", "LazyArray",
    "view", "ViewServer", "html_tree", "HTMLTree",
    "sign", "verify_signature", "signature", "generate_key", "SignatureInfo", "SignatureError", "UnsignedError",
    "UntrustedSignerError", "SignatureMismatchError", "InvalidSignatureError",
    "Passphrase", "KeyProvider", "generate_encryption_key", "EncryptionError", "EncryptedError", "NotEncryptedError",
    "WrongKeyError", "TamperedError",
]
