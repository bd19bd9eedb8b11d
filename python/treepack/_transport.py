"""JSON transport (docs/transport.md): a tree as one self-contained JSON document, and the JSON
Schema of a tree's type.

The document's form belongs to the Rust core (docs/format.md section 11): ``dumps`` saves into
an in-memory location and exports it there; ``loads`` unpacks a document into one and loads it
with every option and every check of ``load``. A ``.json`` document on disk is itself a
location: ``treepack.load("tree.json")``, ``treepack.open("tree.json")``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from typing import Any, Dict, Iterator, Union

from . import _core, _registry
from ._api import Compression, PathLike, StorageOptions, _compression_text, _opts, _path, load, save

_ids = itertools.count()


@contextlib.contextmanager
def memory_location() -> Iterator[str]:
    """A fresh ``memory://`` location for one save or load, dropped (memory freed) afterwards."""
    bucket = f"treepack-mem-{os.getpid()}-{next(_ids)}"
    try:
        yield f"memory://{bucket}/t"
    finally:
        _core.forget_memory(bucket)


def dumps(tree: Any, *, encoding: str = "base85", compression: Compression = None, **save_kwargs: Any) -> str:
    """``tree`` as one JSON transport document (a ``str``): the same readable manifest as a saved
    tree (structure, small values, array previews) followed by the stored chunk bytes as one
    ``encoding`` string (``"base85"``, 25 % larger than the bytes, or ``"base64"``, 33 %).

    ``compression`` as for :func:`save` (``"zstd"``, ``"auto"``, rules…): compressed chunks travel
    compressed. Other keyword arguments go to :func:`save` (``metadata``, ``chunk_bytes``,
    ``allow_pickle``, ``shared``…). The document has the root hash the tree has when saved.
    """
    for bad in ("storage_options", "overwrite", "blocking"):
        if bad in save_kwargs:
            raise TypeError(f"dumps() takes no {bad}=: the document is returned, not stored")
    with memory_location() as loc:
        save(tree, loc, compression=compression, **save_kwargs)
        return _core.export_json(loc, encoding)


def loads(document: Union[str, bytes, bytearray, memoryview], **load_kwargs: Any) -> Any:
    """The tree of a JSON transport document (from :func:`dumps`, :func:`export_json` or
    ``treepack export``), loaded as :func:`load` loads a stored tree: strict (untrusted types
    refused, no pickle unless ``allow_pickle=True``), every chunk checked against its hash, and
    ``select=``, ``like=``, ``trust=``, ``expect_root=``… as there.
    """
    # (Options whose result reads the location later, such as dask=, cannot use a temporary one.)
    for bad in ("storage_options", *_registry.LOCATION_OPTIONS, "mmap"):
        if load_kwargs.get(bad):
            raise TypeError(f"loads() takes no {bad}=: the document is already in memory")
    doc = document.encode("utf-8") if isinstance(document, str) else bytes(document)
    with memory_location() as loc:
        _core.unpack_json(doc, loc)
        return load(loc, **load_kwargs)


def export_json(path: PathLike, *, encoding: str = "base85", compression: Compression = None,
                storage_options: StorageOptions = None) -> str:
    """The stored tree at ``path`` as one JSON transport document, its chunks copied as stored
    (verified on the way) or re-encoded under ``compression``; its root hash is the tree's."""
    return _core.export_json(_path(path), encoding, _compression_text(compression), _opts(storage_options))


def schema(path: PathLike, *, storage_options: StorageOptions = None) -> Dict[str, Any]:
    """The JSON Schema (2020-12) of the stored tree's type: containers, key and field names, leaf
    kinds, array dtypes and ranks (extents are annotations: ``treepackShape``). It validates the
    tree's transport document (:func:`dumps`) and that of any tree of the same type."""
    return json.loads(_core.schema(_path(path), _opts(storage_options)))
