"""JAX's checkpoint calls on treepack trees: a program that uses
``jax.experimental.array_serialization.pytree_serialization`` switches by changing its import::

    from jax.experimental.array_serialization import pytree_serialization as ser   # before
    import treepack.jax as ser                                                      # after

``save``, ``load``, ``load_pytreedef``, ``nonblocking_save`` and ``nonblocking_load`` take JAX's
arguments and follow its rules (docs/jax.md, "Switching from jax.experimental.array_serialization",
lists the few differences). What they write is an ordinary treepack tree (``treepack.load``,
``treepack.open``, the CLI read it), and they read a checkpoint JAX's own ``save`` wrote.

This module is the public face only: the calls are the JAX integration's
(``treepack/integrations/jax/pytree_api.py``), imported on first use, so that ``import treepack``
never imports JAX.
"""

from __future__ import annotations

from typing import Any, Iterable

from . import _registry
from ._api import PathLike

__all__ = ["save", "load", "load_pytreedef", "nonblocking_save", "nonblocking_load"]


def save(data: Any, directory: PathLike, *, overwrite: bool = True, ts_specs: Any = None, **options: Any) -> Any:
    """Save the pytree ``data`` as a treepack tree at ``directory`` (a folder, a ``.tpk`` file,
    ``s3://``, ``gs://``…): ``jax.Array`` leaves, sharded or not (each process of a multi-process
    job writes its own shards), numpy arrays, ``None``, and everything else ``treepack.save``
    takes, in dicts, lists, tuples, namedtuples, dataclasses and registered pytree nodes.

    - ``overwrite=True`` (JAX's default) replaces a checkpoint already there: a treepack tree
      (atomically: a reader sees the old tree or the new one) or a checkpoint JAX's ``save``
      wrote (removed first, as JAX removes it). A non-empty directory holding anything else is
      refused with a ``RuntimeError`` (also a ``ValueError``) naming the files, and nothing is
      removed.
    - ``overwrite=False`` refuses any non-empty directory with a ``ValueError`` (also a
      ``FileExistsError``).
    - ``ts_specs``: tensorstore specs do not apply (a ``TypeError`` unless ``None``).
    - Any other keyword is ``treepack.save``'s (``compression=``, ``chunk_bytes=``,
      ``metadata=``, ``omit_static=``, ``storage_options=``…).

    Returns ``treepack.save``'s ``SaveInfo`` (JAX's returns ``None``).
    """
    return _registry.method("jax_save")(data, directory, overwrite=overwrite, ts_specs=ts_specs, **options)


def load(directory: PathLike, shardings: Any, *, mask: Any = None, ts_specs: Any = None, trust: Iterable[str] = (),
         **options: Any) -> Any:
    """Load the pytree saved at ``directory``, its arrays as ``jax.Array``s placed by ``shardings``.

    - ``shardings``: a prefix tree of the saved pytree (one value for everything, or a tree
      whose leaves each cover a subtree) whose leaves are ``jax.sharding.Sharding``s, or
      ``jax.ShapeDtypeStruct``s (their ``sharding`` places, their ``dtype`` casts), or ``None``
      (the default device). Each device reads only the chunks of its own shards. Where
      ``shardings`` is a tree, the result has its containers (your classes, with their static
      data); below its leaves, the saved structure.
    - ``mask``: a prefix tree of booleans; the leaves under a false one come back ``None`` and
      are never read.
    - ``trust``: globs of classes (records, pytree nodes) the load may rebuild, as in
      ``treepack.load``; classes registered with ``jax.export.register_pytree_node_serialization``
      are trusted too.
    - Any other keyword is ``treepack.load``'s (``storage_options=``, ``verify=``…).

    A checkpoint JAX's own ``save`` wrote (``pytreedef.json``, ``array_store/``) loads the same way.
    """
    return _registry.method("jax_load")(directory, shardings, mask=mask, ts_specs=ts_specs, trust=trust, **options)


def load_pytreedef(directory: PathLike, *, storage_options: Any = None) -> Any:
    """The saved pytree with a ``jax.ShapeDtypeStruct`` at every array (``None`` at ``None``
    leaves, a ``treepack.LeafInfo`` at other leaves, a ``treepack.StructNode`` for records and
    custom nodes, whose classes are not built), from the manifest alone: no array is read."""
    return _registry.method("jax_load_pytreedef")(directory, storage_options=storage_options)


def nonblocking_save(data: Any, directory: PathLike, *, overwrite: bool = True, ts_specs: Any = None,
                     **options: Any) -> Any:
    """``save`` in the background: returns a ``PyTreeFuture`` (``result()``, ``done()``,
    ``await``; ``pytree``, the tree of ``ShapeDtypeStruct``s being saved) once the tree is
    converted. JAX arrays are held, not copied, until the write is done. Any error of the save
    is raised by ``result()``, as with JAX."""
    return _registry.method("jax_nonblocking_save")(data, directory, overwrite=overwrite, ts_specs=ts_specs, **options)


def nonblocking_load(directory: PathLike, shardings: Any, *, mask: Any = None, ts_specs: Any = None,
                     **options: Any) -> Any:
    """``load`` in the background: returns a ``PyTreeFuture`` whose ``pytree`` is
    ``load_pytreedef(directory)`` (read now: a missing checkpoint raises here, as with JAX) and
    whose ``result()`` is the loaded tree."""
    return _registry.method("jax_nonblocking_load")(directory, shardings, mask=mask, ts_specs=ts_specs, **options)
