"""Multi-process saves in a ``jax.distributed`` job: every process writes its shards as a part,
process 0 merges the parts and commits (docs/jax.md, "Multi-process saves")."""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np

from ... import _plugin
from ..._plugin import SHARDS, Piece
from .arrays import ARRAY, KEY, sharding_data


class _Collective(threading.local):
    #: Set while a save all processes make converts its tree: the save's chunk byte target.
    chunk_bytes: Optional[int] = None


_collective = _Collective()


def _shards(a: Any, where: str) -> Tuple[str, str, str, list]:
    """The blocks of a process-spanning array this process writes: its shards with
    ``replica_id == 0`` (each block of the array has exactly one such shard in the job)."""
    import jax

    ann: Dict[str, Any] = {"type": ARRAY}
    data = a
    if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
        ann = {"type": KEY, "impl": str(jax.random.key_impl(a))}
        data = jax.random.key_data(a)
    sd = sharding_data(a.sharding)
    if sd is not None:
        ann["sharding"] = sd
    dt = np.dtype(data.dtype)
    block = list(data.sharding.shard_shape(data.shape))
    cs = _plugin.core.block_chunk_shape(list(data.shape), block, dt.itemsize, _collective.chunk_bytes or None)
    mine = [sh for sh in data.addressable_shards if sh.replica_id == 0]
    origins = [[int(sl.indices(n)[0]) for sl, n in zip(sh.index, data.shape)] for sh in mine]
    desc = {
        "dtype": json.loads(_plugin.encode_array(np.empty(0, dt))[1]),
        "shape": [int(n) for n in data.shape],
        "chunk_shape": cs,
        "as": ann,
        "origins": origins,
    }
    kids = [(str(i), Piece(np.asarray(sh.data), cs)) for i, sh in enumerate(mine)]
    return ("custom", SHARDS, json.dumps(desc, sort_keys=True), kids)


def spans_processes(tree: Any) -> bool:
    """Whether saving ``tree`` is a step of a multi-process JAX job: JAX's distributed runtime
    is up and the tree holds an array that spans processes (so every process saves it)."""
    jax = sys.modules.get("jax")
    if jax is None:
        return False
    from jax._src import distributed

    if distributed.global_state.client is None:
        return False
    try:
        leaves = jax.tree_util.tree_leaves(tree)
    except Exception:  # keys JAX cannot sort, say: walk the plain containers ourselves
        leaves, stack = [], [tree]
        while stack:
            x = stack.pop()
            if isinstance(x, dict):
                stack.extend(x.values())
            elif isinstance(x, (list, tuple)):
                stack.extend(x)
            else:
                leaves.append(x)
    return any(isinstance(x, jax.Array) and not x.is_fully_addressable for x in leaves)


#: Seconds a process of a multi-process save waits for the others (their parts, the commit)
#: before giving up with an error; nothing is committed then. ``TREEPACK_BARRIER_TIMEOUT``
#: overrides it.
TIMEOUT_S = 600.0

_saves = 0
_saves_lock = threading.Lock()


def _timeout_ms() -> int:
    return int(float(os.environ.get("TREEPACK_BARRIER_TIMEOUT", TIMEOUT_S)) * 1000)


def save_collective(tree: Any, p: str, prepare: Callable[[Any], Any], write_opts: Dict[str, Any],
                    chunk_bytes: Optional[int]) -> Callable[[], Any]:
    """A save every process of a JAX job makes together (docs/jax.md, "Multi-process saves"):
    each writes the blocks it owns of the process-spanning arrays (process 0 also everything
    else) as its *part*, hands the part's manifest to process 0 through JAX's distributed
    key-value store, and process 0 merges and commits them once all arrived. Converts the tree
    now; returns the function that writes, exchanges and commits (run it on any thread)."""
    import jax
    from jax._src import distributed

    global _saves
    client = distributed.global_state.client
    pid, n = jax.process_index(), jax.process_count()
    with _saves_lock:
        _saves += 1
        sid = f"treepack/save/{_saves}"
    if pid != 0:
        # Process 0 writes what is not sharded across processes; the others only their blocks.
        tree = jax.tree_util.tree_map(lambda x: x if isinstance(x, jax.Array) and not x.is_fully_addressable else None, tree)
    _collective.chunk_bytes = chunk_bytes or 0
    try:
        prepared = prepare(tree)
    finally:
        _collective.chunk_bytes = None

    def run() -> Any:
        timeout = _timeout_ms()
        try:
            part, info = prepared.write_part(p, **write_opts)
        except BaseException as e:
            client.key_value_set_bytes(f"{sid}/part/{pid}", b"ERR " + f"{type(e).__name__}: {e}".encode())
            raise
        client.key_value_set_bytes(f"{sid}/part/{pid}", part)
        if pid == 0:
            parts = [part]
            status = "ok"
            try:
                for i in range(1, n):
                    got = _wait(client, f"{sid}/part/{i}", timeout, p, f"process {i}'s part")
                    if got.startswith(b"ERR "):
                        raise RuntimeError(f"treepack.save({p!r}): process {i} failed to write its part: {got[4:].decode()}; nothing was committed")
                    parts.append(got)
                info = _plugin.commit_parts(p, parts, write_opts)
            except BaseException as e:
                status = f"{type(e).__name__}: {e}"
                raise
            finally:
                client.key_value_set(f"{sid}/done", status)
                for i in range(1, n):
                    try:
                        client.key_value_delete(f"{sid}/part/{i}")
                    except Exception:
                        pass
            return info
        status = _wait(client, f"{sid}/done", timeout, p, "process 0's commit").decode()
        if status != "ok":
            raise RuntimeError(f"treepack.save({p!r}): process 0 did not commit the save: {status}")
        return info

    return run


def _wait(client: Any, key: str, timeout_ms: int, p: str, what: str) -> bytes:
    try:
        return client.blocking_key_value_get_bytes(key, timeout_ms)
    except Exception as e:  # jaxlib's error for a deadline or a lost coordinator
        raise TimeoutError(
            f"treepack.save({p!r}): waited {timeout_ms / 1000:.0f} s for {what} of this multi-process save and it did "
            f"not arrive (did that process fail, or not call save with the same trees in the same order?); nothing "
            f"was committed. ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        ) from None
