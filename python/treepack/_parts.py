"""Saves written in parts (docs/format.md, "Saves written in parts"), shared by the writers that
use them: the processes of a JAX job (integrations/jax/multiprocess.py) and Dask tasks
(integrations/dask.py). Each writer saves its part (``Prepared.write_part``); one commits."""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import numpy as np

from . import _core

#: The custom node type of a sharded array's blocks inside a part.
SHARDS = "treepack.shards"


class Piece:
    """A block of an array that several writers hold: chunked on the array's common grid."""

    __slots__ = ("value", "chunk_shape")

    def __init__(self, value: np.ndarray, chunk_shape: List[int]) -> None:
        self.value, self.chunk_shape = value, chunk_shape

    def describe(self) -> Tuple[str, str, None, list]:
        """``encode_other``'s description: an array whose grid tiles the block, never copied
        (a block is a writer's own buffer, unchanged until its part is written)."""
        return ("array", "", None, [("value", self.value), ("block", tuple(self.chunk_shape)), ("immutable", True)])


def commit(p: str, parts: List[bytes], write_opts: Dict[str, Any]) -> Any:
    """Merge the parts (the committer's own first) and commit the tree at ``p``."""
    return _core.commit_parts(p, parts, overwrite=write_opts.get("overwrite", False),
                              storage_options=write_opts.get("storage_options"), durable=write_opts.get("durable", True),
                              compress_manifest=write_opts.get("compress_manifest"))
