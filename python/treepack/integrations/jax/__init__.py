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

``treepack.jax`` (``pytree_api.py``) offers the calls of JAX's own
``jax.experimental.array_serialization.pytree_serialization`` on treepack trees.

Nothing here imports JAX unless the process already did (``sys.modules``) or the file holds
JAX leaves.
"""

from typing import Any, Callable, Dict, List, Optional

from ... import _plugin
from . import staging
from .arrays import ARRAY, KEY, TYPES, Loader, encode, is_array, missing_message, sharding_data
from .like import READ_AHEAD_BYTES, _read_target, applies, load_like
from .multiprocess import TIMEOUT_S, save_collective, spans_processes
from .pytrees import PYTREE, pytree, pytree_build, register
from .pytree_api import METHODS

__all__ = [
    "ARRAY", "KEY", "PYTREE", "_read_target", "READ_AHEAD_BYTES", "TIMEOUT_S", "TYPES", "Loader", "applies", "encode", "is_array",
    "load_like", "missing_message", "pytree", "pytree_build", "register", "save_collective", "sharding_data",
    "spans_processes",
]


# ---------------------------------------------------------------- the plug-in


def _encode(obj: Any, where: str, memo: Any, omit_static: bool) -> Any:
    return encode(obj, where) if is_array(obj) else None


def _fallback(obj: Any, where: str, memo: Any, omit_static: bool, type_name: str) -> Any:
    # A registered pytree node of any module (flax, optax, flax.struct classes of the user's).
    return pytree(obj, where, omit_static, type_name)


def _decode_pytree(dec: Any, t: str, data: Any, kids: Dict[str, Any]) -> Any:
    """A ``jax.pytree`` node: its class, when trusted, rebuilt through JAX's unflatten."""
    name = data.get("class") if isinstance(data, dict) else None
    if not isinstance(name, str):
        raise ValueError("jax.pytree: the node names no class")
    if not dec.trusted(name):
        return dec.missing(name, kids, "type is not trusted (pass trust=[...])")
    if data.get("static") == "omitted":
        return dec.missing(
            name, kids, "saved with omit_static=True (its static data, code, was left out): load it with "
            "like=<an instance>, whose static data is used"
        )
    try:
        cls = _plugin.resolve_class(name)
        return pytree_build(cls, data, list(kids.values()))
    except LookupError as e:
        return dec.missing(name, kids, str(e))


def _arrays(options: Dict[str, Any]) -> Callable[[Any, Dict[str, Any]], Any]:
    return Loader(options.get(staging.OPTION)).array  # (an ImportError without JAX)


def _like(request: Any, reader: Any, like: Any, structure: Any) -> Any:
    if not applies(like):
        return _plugin.DECLINE
    select = request.select
    return load_like(reader, like, structure, request.decoder, _plugin.np_dtype,
                     lambda subtrees, nodes: request.audit_built(reader, subtrees, nodes), request.mmap, request.verify,
                     [select] if isinstance(select, str) else select)


def _save(tree: Any, p: str, prepare: Callable[[Any], Any], write_opts: Dict[str, Any],
          chunk_bytes: Optional[int]) -> Optional[Callable[[], Any]]:
    # One save of a multi-process JAX job: every process writes its part, process 0 commits.
    if not spans_processes(tree):
        return None
    return save_collective(tree, p, prepare, write_opts, chunk_bytes)


def _missing(paths: List[str]) -> str:
    return missing_message(paths)


def _backends_started() -> bool:
    """Whether JAX has made its devices already (asking where arrays go then costs nothing)."""
    global _started
    if _started is None:
        try:
            from jax._src import xla_bridge

            _started = xla_bridge.backends_are_initialized
        except (ImportError, AttributeError):  # (another JAX: the tree is asked first)
            _started = lambda: False  # noqa: E731
    return bool(_started())


_started: Optional[Callable[[], bool]] = None


def _prepare_load(request: Any) -> Optional[Callable[[bool], None]]:
    """A plain load of a local tree whose arrays are all JAX arrays, when they go to an
    accelerator (the default device): the load reads them as views of the file (``mmap``, their
    hashes checked as the load asks, every other leaf as usual), and each is copied into the
    staging buffers and on to the device (a ``staging.Stager`` in the load's options, which
    ``arrays.Loader`` uses), so that the whole tree is never copied into fresh host memory first.
    Returns the stager's ``finish``, which the load calls when it ends. The manifest is read for
    this only when JAX's devices are accelerators or not made yet (so a CPU process pays nothing,
    and a tree without JAX arrays never makes JAX start its devices)."""
    if _backends_started() and staging.default_device() is None:
        return None
    if not request.may_map():
        return None
    try:
        types = request.reader().array_types()
    except Exception:  # noqa: BLE001 (the load itself reports what is wrong with the tree)
        return None
    if not types or not all(t in TYPES for t, _ in types):
        return None
    device = staging.default_device()
    if device is None:
        return None
    stager = staging.Stager(device)
    request.mmap = True
    request.decoder.options[staging.OPTION] = stager
    return stager.finish


_plugin.integrate(
    __name__,
    encode=_encode,
    fallback=_fallback,
    nodes={PYTREE: _decode_pytree},
    arrays=_arrays,
    missing=_missing,
    like=_like,
    save=_save,
    structure=register,
    prepare_load=_prepare_load,
    methods=METHODS,
)
