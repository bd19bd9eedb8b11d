"""JAX: ``jax.Array`` leaves, typed PRNG keys, pytree containers, loading onto shardings.

- A ``jax.Array`` is stored as an ordinary array (readable by any treepack reader) annotated
  (format 1.3, ``"as"``) ``{"type": "jax.Array"}`` plus the sharding it was saved with (mesh
  axis names and shape, ``PartitionSpec``; informational). A sharded array's chunk grid tiles its
  shards (the shard shape is the save's block hint), so every chunk lies in one shard.
- A typed PRNG key array (``jax.random.key``) is stored as its key data (``uint32``) annotated
  ``{"type": "jax.random.key", "impl": "threefry2x32"}`` and comes back as keys.
- A type registered as a JAX pytree node that treepack does not otherwise know (flax
  ``FrozenDict``, ``nnx.State`` and its ``Variable``s, optax states, ``flax.struct`` dataclasses
  such as ``TrainState``) is a ``jax.pytree`` custom node: its children (by their pytree keys) as
  subtrees, its static aux data as JSON. It is rebuilt through the registered unflatten only when
  its class is trusted; static data that JSON cannot hold (``TrainState.apply_fn``, an optax
  ``GradientTransformation``) is code, never stored: the save refuses it, or leaves it out with
  ``omit_static=True`` and the load takes it from ``like=``.
- ``load(path, like=tree)`` where ``tree`` holds ``jax.ShapeDtypeStruct``s or ``jax.Array``s
  (or any pytree containers): the result has ``tree``'s pytree structure (its containers, their
  static data) and each array leaf exactly ``like``'s sharding, each device's shard read from the
  chunks it covers; a different dtype casts. No class from the file is constructed on this path.

Nothing here imports JAX unless the process already did (``sys.modules``) or the file holds
JAX leaves.
"""

from .arrays import ARRAY, KEY, TYPES, Loader, encode, is_array, missing_message, sharding_data
from .like import READ_AHEAD_BYTES, _read_target, applies, load_like
from .multiprocess import TIMEOUT_S, save_collective, spans_processes
from .pytrees import PYTREE, pytree, pytree_build, register

__all__ = [
    "ARRAY", "KEY", "PYTREE", "_read_target", "READ_AHEAD_BYTES", "TIMEOUT_S", "TYPES", "Loader", "applies", "encode", "is_array",
    "load_like", "missing_message", "pytree", "pytree_build", "register", "save_collective", "sharding_data",
    "spans_processes",
]
