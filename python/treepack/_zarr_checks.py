"""What a Zarr store's files are checked for before zarr-python reads any of them: no links, no
special files, metadata of bounded size naming only codecs that decode to bytes or numbers, no
arrays of Python objects. The store zarr-python then reads through is ``_hierarchy``'s."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Tuple

from ._errors import ForeignFileError


MAX_METADATA = 64 << 20
"""A Zarr metadata file (``zarr.json``, ``.zarray``, ...) larger than this is refused."""

# Codecs a Zarr array may use: they decode bytes to bytes or fixed-size numbers. Object codecs
# (pickle, msgpack, JSON, categorize) and anything else are refused by name before a chunk is read.
_V2_CODECS = frozenset({"zlib", "gzip", "bz2", "lzma", "blosc", "zstd", "lz4", "shuffle", "delta",
                        "fixedscaleoffset", "quantize", "bitround", "packbits", "astype", "crc32",
                        "crc32c", "adler32", "fletcher32", "jenkins_lookup3"})
_V3_CODECS = frozenset({"bytes", "endian", "transpose", "gzip", "zstd", "blosc", "crc32c", "sharding_indexed",
                        # variable-length strings: decoded without pickle, then refused as object arrays
                        "vlen-utf8", "vlen-bytes"}) | {f"numcodecs.{c}" for c in _V2_CODECS}
_NODE_FILES = ("zarr.json", ".zarray", ".zgroup")


def _check_zarr_store(root: str) -> Tuple[int, Dict[str, List[str]]]:
    """Walk a Zarr folder without following links and check every entry before zarr-python
    reads any: a symbolic link anywhere (to a chunk, a metadata file or a folder) and anything
    but folders and regular files (FIFOs, devices, sockets) are refused, naming the entry; every
    array's metadata is checked (``_check_zarr_metadata``). Returns the bytes stored and, for
    each folder (``""`` the root), the names of its sub-folders that hold a node's metadata."""
    if not os.path.isdir(root):
        raise ForeignFileError(f"{root}: not a readable Zarr store: not a folder (Zarr zip stores are not read; "
                               "unzip it first)")
    stored = 0
    nodes: Dict[str, List[str]] = {}
    stack = [""]
    while stack:
        rel = stack.pop()
        here = os.path.join(root, rel) if rel else root
        kids = []
        with os.scandir(here) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            sub = f"{rel}/{e.name}" if rel else e.name
            if e.is_symlink():
                try:
                    to = os.readlink(e.path)
                except OSError:
                    to = "?"
                raise ForeignFileError(
                    f"{root}: Zarr store entry `{sub}` is a symbolic link (to {to!r}); nothing was read: a store is "
                    "read without following links, which could lead out of it. Replace the link by a copy of "
                    "what it points to (cp -L) if you trust it")
            if e.is_dir(follow_symlinks=False):
                stack.append(sub)
                if any(os.path.isfile(os.path.join(e.path, m)) and not os.path.islink(os.path.join(e.path, m))
                       for m in _NODE_FILES):
                    kids.append(e.name)
            elif e.is_file(follow_symlinks=False):
                st = e.stat(follow_symlinks=False)
                stored += st.st_size
                if e.name in ("zarr.json", ".zarray"):
                    _check_zarr_metadata(root, sub, st.st_size)
            else:
                raise ForeignFileError(f"{root}: Zarr store entry `{sub}` is not a regular file or folder (a FIFO, "
                                       "socket or device); nothing was read. Remove it")
        nodes[rel] = kids
    return stored, nodes


def _check_zarr_metadata(root: str, rel: str, size: int) -> None:
    """Refuse an array whose chunks would be decoded into Python objects (an object dtype:
    pickle, msgpack, JSON codecs) or through a codec not known to be safe, naming the array."""
    array = rel.rpartition("/")[0] or "<root>"

    def refuse(what: str, todo: str) -> ForeignFileError:
        return ForeignFileError(f"{root}: Zarr array `{array}` ({rel}) {what}; none of its chunks was read. {todo}")

    if size > MAX_METADATA:
        raise refuse(f"has a metadata file of {size} bytes (more than {MAX_METADATA})", "Check where it came from")
    try:
        with open(os.path.join(root, rel), "rb") as f:
            doc = json.loads(f.read(MAX_METADATA + 1))
    except (ValueError, RecursionError) as e:
        raise ForeignFileError(f"{root}: not a readable Zarr store: `{rel}` is not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ForeignFileError(f"{root}: not a readable Zarr store: `{rel}` is not a JSON object")
    if rel.endswith(".zarray"):
        dtype = doc.get("dtype")
        if _v2_dtype_has_object(dtype):
            codec = (doc.get("filters") or [{}])[0] if isinstance(doc.get("filters"), list) else {}
            cid = codec.get("id") if isinstance(codec, dict) else None
            raise refuse(f"has the object dtype {json.dumps(dtype)[:200]}, whose chunks are Python objects encoded by "
                         f"the {cid or 'object'!r} codec (pickle-like)",
                         "treepack never decodes Python objects from a file; convert the array to a fixed-size "
                         "dtype with zarr-python if you trust the file")
        codecs = [doc.get("compressor")] + (doc.get("filters") or [] if isinstance(doc.get("filters"), list) else [])
        for c in codecs:
            if c is None:
                continue
            cid = c.get("id") if isinstance(c, dict) else None
            if cid not in _V2_CODECS:
                raise refuse(f"uses the codec {json.dumps(cid if cid is not None else c)[:100]}, which treepack does "
                             "not decode", f"treepack reads Zarr v2 arrays with {', '.join(sorted(_V2_CODECS))}; "
                             "re-encode it with zarr-python if you trust the file")
        return
    if doc.get("node_type") != "array":
        return
    if doc.get("storage_transformers"):
        raise refuse("uses storage transformers", "treepack reads arrays stored as plain chunks only")

    def check(codecs: Any) -> None:
        for c in codecs if isinstance(codecs, list) else []:
            name = c.get("name") if isinstance(c, dict) else c
            if name not in _V3_CODECS:
                raise refuse(f"uses the codec {json.dumps(name)[:100]}, which treepack does not decode",
                             f"treepack reads Zarr v3 arrays with {', '.join(sorted(_V3_CODECS))}; re-encode it "
                             "with zarr-python if you trust the file")
            cfg = c.get("configuration") if isinstance(c, dict) else None
            if name == "sharding_indexed" and isinstance(cfg, dict):
                check(cfg.get("codecs"))
                check(cfg.get("index_codecs"))

    check(doc.get("codecs"))


def _v2_dtype_has_object(spec: Any) -> bool:
    """Whether a Zarr v2 dtype (a numpy type string, or a list of fields) holds Python objects."""
    if isinstance(spec, str):
        return "O" in spec.lstrip("<>|=")[:1]
    if isinstance(spec, list):
        return any(isinstance(f, list) and len(f) >= 2 and _v2_dtype_has_object(f[1]) for f in spec)
    return False
