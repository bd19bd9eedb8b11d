"""JAX arrays and typed PRNG keys as annotated arrays (format 1.3 ``as``), and back."""

from __future__ import annotations

import json
import sys
from typing import Any, Dict, List, Optional, Tuple

import numpy as np


ARRAY = "jax.Array"
KEY = "jax.random.key"
TYPES = (ARRAY, KEY)


def is_array(obj: Any) -> bool:
    """Whether ``obj`` is a ``jax.Array`` (False, without importing JAX, when JAX is not loaded)."""
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(obj, jax.Array)


def _spec_entry(p: Any) -> Any:
    if p is None or isinstance(p, str):
        return p
    if isinstance(p, (tuple, list)):
        return [_spec_entry(x) for x in p]
    return str(p)  # PartitionSpec.UNCONSTRAINED and the like


def sharding_data(s: Any) -> Optional[Dict[str, Any]]:
    """The annotation's ``sharding`` member: mesh axes and ``PartitionSpec`` for a
    ``NamedSharding``, the class name for others; None for one device."""
    import jax

    if isinstance(s, jax.sharding.SingleDeviceSharding):
        return None
    if isinstance(s, jax.sharding.NamedSharding):
        mesh = s.mesh
        return {
            "mesh": {"axes": [str(a) for a in mesh.axis_names], "shape": [int(n) for n in mesh.axis_sizes]},
            "spec": [_spec_entry(p) for p in s.spec],
        }
    return {"kind": type(s).__name__}


def encode(a: Any, where: str) -> Tuple[str, str, str, list]:
    """``encode_other``'s description of a ``jax.Array``: an annotated ``array`` with its host
    values, the shard shape as the block the chunk grid tiles, and ``immutable`` (a JAX array
    cannot change, so a background save needs no copy of it). An array that spans processes,
    in a save all processes make: the blocks this process owns (``treepack.shards``)."""
    import jax

    if not a.is_fully_addressable:
        from .multiprocess import _collective, _shards

        if _collective.chunk_bytes is None:
            raise TypeError(
                f"cannot save `{where}`: a jax.Array sharded over several processes, in a save this process makes "
                "alone; every process of the job must call treepack.save with the tree (docs/jax.md)"
            )
        return _shards(a, where)
    if a.is_deleted():
        raise TypeError(f"cannot save `{where}`: the jax.Array was deleted (donated to a jitted function?)")
    ann: Dict[str, Any]
    if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
        ann = {"type": KEY, "impl": str(jax.random.key_impl(a))}
        data = jax.random.key_data(a)
    else:
        ann = {"type": ARRAY}
        data = a
        if getattr(a, "weak_type", False):
            # A weakly typed array (`jnp.asarray(0.5)`) gives way to the other operand's dtype:
            # loaded strong, `bf16_array * scale` would become float32.
            ann["weak_type"] = True
    sd = sharding_data(a.sharding)
    if sd is not None:
        ann["sharding"] = sd
    host = np.asarray(data)
    kids: List[Tuple[str, Any]] = [("value", host)]
    block = tuple(int(n) for n in a.sharding.shard_shape(a.shape)) if sd is not None else None
    if block is not None and block != tuple(a.shape):
        kids.append(("block", block + tuple(host.shape[a.ndim:])))
    kids.append(("immutable", True))
    return ("array", "", json.dumps(ann, separators=(",", ":"), sort_keys=True), kids)


class Loader:
    """Turns annotated arrays into ``jax.Array``s (on the default device) and typed keys. In a
    load the JAX integration prepared for an accelerator, arrays go through the staging buffers
    (``stager``: ``staging.Stager``, from the load's options)."""

    def __init__(self, stager: Any = None) -> None:
        import jax

        self.jax, self.stager = jax, stager

    def array(self, arr: np.ndarray, ann: Dict[str, Any]) -> Any:
        jax = self.jax
        if ann.get("type") == KEY:
            impl = ann.get("impl")
            if not isinstance(impl, str):
                raise ValueError("a jax.random.key leaf has no `impl` name")
            try:
                return jax.random.wrap_key_data(jax.numpy.asarray(arr), impl=impl)
            except (ValueError, TypeError) as e:
                raise ValueError(f"jax.random.key leaf: key data of shape {arr.shape} with impl {impl!r}: {e}") from None
        out = jax.device_put(arr) if self.stager is None else self.stager.put(arr)
        return weak(out) if ann.get("weak_type") is True else out


def weak(x: Any) -> Any:
    """``x`` weakly typed (its values and placement unchanged). JAX makes such arrays only from
    Python scalars or through its own internal conversion: this uses that conversion, and says
    so when a JAX without it cannot."""
    try:
        from jax._src.lax import lax as _lax

        return _lax._convert_element_type(x, x.dtype, weak_type=True)
    except (ImportError, AttributeError, TypeError) as e:
        import warnings

        warnings.warn(f"treepack: this JAX cannot make a weakly typed array ({e}); a weakly typed array of the file "
                      "is loaded strongly typed", RuntimeWarning, stacklevel=3)
        return x


def missing_message(paths: List[str]) -> str:
    shown = ", ".join(f"`{p or '<root>'}`" for p in paths[:5])
    more = f" and {len(paths) - 5} more" if len(paths) > 5 else ""
    return (
        f"this tree holds {len(paths)} JAX array(s) ({shown}{more}) but jax cannot be imported: install it "
        "(pip install jax, or pip install 'treepack[jax]'), or pass on_missing='placeholder' to load them as numpy arrays"
    )
