"""The public API: save, load, load_structure, untrusted_types, verify and gc, with the types they
return (LeafInfo, StructNode, SaveInfo, VerifyReport) or raise (UntrustedTypeError)."""

from __future__ import annotations

import datetime as _dt
import json
import os
import sys
import threading
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _codec, _core, _encryption, _like, _registry
from . import _async
from ._async import SaveHandle
from ._core import TreepackError
from ._structure import LeafInfo, StructNode, _struct_node

PathLike = Union[str, "os.PathLike[str]"]
StorageOptions = Optional[Mapping[str, Any]]
"""Cloud settings for remote locations (``s3://``, ``gs://``, ``az://``, ``http(s)://``): object_store's
keys (``aws_access_key_id``, ``region``, ``endpoint``, ``google_service_account_key``, ``azure_storage_account_name``…)
and treepack's tuning keys (``max_concurrency``, ``multipart_threshold``, ``multipart_part_size``,
``max_request_bytes``, ``max_retries``, ``retry_timeout_secs``). Values override environment variables."""
Progress = Union[None, bool, Callable[[int, int], Any]]
"""``True`` for a tqdm bar on stderr, or a callback called as ``progress(bytes_done, bytes_total)``
from a background thread while data moves. ``None``/``False``: quiet."""
# A compression policy: "none", "auto", "zstd", "zstd:LEVEL", "lz4", or a list of rule dicts.
Compression = Union[None, str, Sequence[Mapping[str, Any]]]


class _Bar:
    """``progress=True``: a tqdm bar fed by the byte-count callback (from the I/O threads, which
    tqdm allows), closed when the operation ends either way."""

    def __init__(self, desc: str) -> None:
        try:
            from tqdm.auto import tqdm
        except ImportError:
            raise ImportError(
                "progress=True shows a tqdm bar, but tqdm is not installed: "
                "pip install 'treepack[progress]' (or tqdm), or pass a callback progress(done, total)"
            ) from None
        self._bar = tqdm(desc=desc, unit="B", unit_scale=True, unit_divisor=1024)
        self._done = 0

    def __call__(self, done: int, total: int) -> None:
        if self._bar.total != total:
            self._bar.total = total
        self._bar.update(done - self._done)
        self._done = done

    def close(self) -> None:
        self._bar.close()


def _progress_callback(progress: Progress, desc: str) -> Tuple[Optional[Callable[[int, int], Any]], Callable[[], None]]:
    """The callback ``progress`` asks for (see ``Progress``) and what to call when the operation
    ends. Checked in the caller's thread, so that a bad value fails before anything is written."""
    if progress is None or progress is False:
        return None, _nothing
    if progress is True:
        bar = _Bar(desc)
        return bar, bar.close
    if not callable(progress):
        raise TypeError(f"progress must be True, False, None or a callable(done, total), not {type(progress).__name__}")
    return progress, _nothing


def _nothing() -> None:
    pass


def _opts(storage_options: StorageOptions) -> Any:
    # A dict of strings, or (dict, key) for an encrypted tree (_encryption.keyed).
    return _encryption.core_options(storage_options)


class UntrustedTypeError(TreepackError):
    """A file names types that are not allowed. ``.types`` maps each type name to its key paths."""

    def __init__(self, path: str, types: Dict[str, List[str]], omitted: Sequence[str] = (), call: str = "load") -> None:
        self.types = types
        lines = [f"  {name}: at {', '.join(paths[:5])}{' …' if len(paths) > 5 else ''}" for name, paths in sorted(types.items())]
        hints = _untrusted_hints(types, call)
        if omitted:
            # Trusting those would only lead to the next refusal: the static data is not there.
            many = len(omitted) > 1
            hints.insert(0, f"  - the node{'s' if many else ''} at {', '.join(omitted[:5])} {'were' if many else 'was'} "
                         f"saved with omit_static=True: {'their' if many else 'its'} static data (code) was left out, and "
                         "trust= cannot bring it back: load with like=<an instance> (say like=TrainState.create(...)), "
                         "whose static data is used")
        super().__init__(
            f"{path}: refusing to load types that are not trusted (nothing was imported or constructed):\n"
            + "\n".join(lines)
            + "\nTo load them:\n"
            + "\n".join(hints)
            + "\nor pass on_missing='placeholder' to get treepack.Unloadable objects in their place."
        )


def _untrusted_hints(types: Dict[str, List[str]], call: str = "load") -> List[str]:
    # Each kind of name is allowed a different way: say the one that works for each.
    classes = sorted(n for n in types if ":" in n and not n.startswith("pickle ("))
    registered = sorted(n for n in types if ":" not in n and not n.startswith(("pickle (", "py.")))
    out = []
    if classes:
        modules = sorted({n.split(":", 1)[0] for n in classes})
        out.append(
            f"  - dataclasses, attrs classes, namedtuples, pydantic models, enums and dict subclasses: "
            f"{call}(..., trust={[m + '.*' for m in modules]!r}) (imports those modules)"
        )
    if registered:
        out.append(
            f"  - registered types ({', '.join(registered)}): call treepack.register(cls, name=..., to_data=..., "
            "from_data=...) (or save=..., load=... for file-backed types) for each in this process before loading "
            "(trust= does not apply to them)"
        )
    if any(n.startswith("pickle (") for n in types):
        out.append("  - pickled objects: allow_pickle=True (unpickling runs code from the file: only for files you trust)")
    if any(n.startswith("py.") for n in types):
        out.append("  - built-in types this treepack does not know (written by a newer version?): upgrade treepack")
    return out


SaveInfo = _core.SaveInfo
"""What a save wrote: ``leaves``, ``bytes_written``, ``location``, ``arrays``, ``array_bytes``."""


def _path(p: PathLike) -> str:
    return os.fspath(p)


def save(
    tree: Any,
    path: PathLike,
    *,
    overwrite: bool = False,
    metadata: Optional[Any] = None,
    allow_pickle: bool = False,
    chunk_bytes: Optional[int] = None,
    storage_options: StorageOptions = None,
    progress: Progress = None,
    blocking: bool = True,
    compression: Compression = None,
    embed: bool = False,
    shared: bool = True,
    durable: bool = True,
    omit_static: bool = False,
    compress_manifest: Optional[bool] = None,
    encryption: Any = None,
) -> Any:
    """Save ``tree`` at ``path``: a directory, a ``.tpk`` file, ``s3://…``, ``gs://…``, ``az://…``,
    ``file://…`` or ``memory://…``.

    numpy arrays are written without copying when C-contiguous and little-endian. Objects other
    than the built-in kinds must be dataclasses, namedtuples, enums or registered types; anything
    else is refused unless ``allow_pickle=True``. Raises ``FileExistsError`` if a tree is already
    there and ``overwrite`` is false.

    ``blocking=False`` returns a :class:`SaveHandle` at once: the tree is converted and its arrays
    copied (a consistent snapshot) before returning, so the caller may change them immediately;
    storage I/O runs on a background thread. With ``blocking=True`` (the default) nothing is
    copied, so do not mutate the arrays while ``save`` runs.

    An object met at several places of the tree (a list, dict, array, dataclass or other object:
    the same ``id()``) is stored once and comes back as one object at every place, and objects
    that contain themselves (cycles) round-trip, as with pickle. ``shared=False`` stores a copy at
    each place instead (and refuses cycles): a plain tree, readable by treepack before 0.2.

    ``embed=True`` stores every ``pathlib.Path`` that names a regular file as the file's bytes
    (it loads back as a :class:`treepack.File`, whose ``path`` says where it came from); by
    default a path is stored as a path.

    ``durable`` (default ``True``): on local disk, every file is fsynced before the manifest
    that names it is committed, and the manifest before ``save`` returns, so the tree survives a
    power cut or a kernel crash, not only a killed process (docs/security.md). ``durable=False``
    skips the fsyncs (scratch data; still atomic against a killed process). Object stores are
    durable once a write succeeds either way.

    JAX (docs/jax.md): ``jax.Array`` leaves are stored with their sharding, typed PRNG keys as
    keys, and registered pytree nodes (``FrozenDict``, ``nnx.State``, optax states, a
    ``flax.struct`` ``TrainState``) as their children plus their static data. Static data that
    is code (``TrainState.apply_fn``, ``tx``) is refused unless ``omit_static=True``, which leaves
    it out: load such a tree with ``like=`` an instance to take it from there.

    ``compression`` (docs/compression.md): ``None``/``"none"`` (the default) stores every chunk as
    is; ``"auto"``, ``"zstd"``, ``"zstd:LEVEL"`` or ``"lz4"`` compress stored leaves of 16 KiB or
    more (arrays shuffled by element size first where that helps); a list of rule dicts (``paths``, ``dtypes``,
    ``min_size``, ``codec``, ``level``, ``filter``) decides leaf by leaf, the first matching rule
    winning. A chunk that does not shrink by at least 20 % is stored raw. A bad policy raises
    ``ValueError`` before anything is written.

    ``compress_manifest``: store the manifest (the tree's structure, its small values and
    strings) as one zstd frame (format 1.6) — ``None`` (the default) does when ``compression``
    is on and the tree is a ``.tpk`` file or a repository's, ``True`` always (a directory's
    ``treepack.json`` too), ``False`` never. A tree of many small values (a log of traced calls)
    is mostly manifest. ``treepack inspect`` and every load read it as usual.

    ``encryption`` (docs/encryption.md): 32 bytes, a :class:`treepack.Passphrase` or a key
    provider. Every file of the tree — its structure and values as well as its arrays — is
    encrypted (AES-256-GCM) with a fresh data key the key given wraps; reading it needs the same
    key (``load(..., encryption=...)``).
    """
    p = _path(path)
    storage_options = _encryption.keyed(storage_options, encryption)
    policy = _compression_text(compression)

    # The save as integrations see it: what they keep for it lives in `run` (torch's shared
    # storages, Dask's arrays), reached through the memo encode_other passes them.
    run = _registry.SaveRun(chunk_bytes)
    memo: dict = {_registry.SAVE: run}

    def enc(obj: Any, where: str) -> Any:
        return _codec.encode_other(obj, where, allow_pickle, memo, embed, omit_static)

    md = _metadata_json(metadata) if metadata is not None else None

    def prepare(t: Any) -> Any:
        # A tree holding a plain dict or list at two places may be walked twice (the first
        # walk wrote it as text): the integrations forget what they met (`reset`).
        def walk() -> Any:
            return _core.prepare(
                t, enc, _codec.encode_array, snapshot=not blocking,
                fast_datetime=_registry.lookup_class(_dt.datetime) is None, shared=shared, reset=run.reset,
                context=_encode_context(),
            )

        out = walk()
        if run.walk_again():
            # An integration learnt what the first walk could not annotate (tensors sharing a
            # storage). The first walk's copies, for a background save, go before the second
            # makes its own.
            out = None
            run.reset()
            out = walk()
        if not blocking:
            # The arrays' copies, made once the last walk is done, before the caller goes on.
            out.snapshot()
        return out

    if compress_manifest is not None and not isinstance(compress_manifest, bool):
        raise TypeError(f"compress_manifest= takes True, False or None, not {type(compress_manifest).__name__}")
    write_opts = dict(overwrite=overwrite, metadata=md, chunk_bytes=chunk_bytes, storage_options=_opts(storage_options),
                      compression=policy, durable=durable, compress_manifest=compress_manifest)
    for hook in _registry.gated("save"):
        # A save an integration writes whole (every process of a JAX job writes its part).
        whole = hook(tree, p, prepare, write_opts, chunk_bytes)
        if whole is not None:
            return _in_order(whole, p, blocking)
    prepared = prepare(tree)
    other = run.writer(prepared, p, write_opts)
    if other is not None:
        # Written by an integration (Dask arrays: their blocks by the tasks computing them).
        return _in_order(other, p, blocking)
    callback, done = _progress_callback(progress, f"save {p}")

    def write() -> Any:
        try:
            # In the background, on a thread of the save pool: its CPU is what the program
            # leaves idle (docs/python.md, Concurrency).
            return prepared.write(p, progress=callback, background=not blocking, **write_opts)
        finally:
            done()

    return _in_order(write, p, blocking)


def _in_order(write: Callable[[], Any], p: str, blocking: bool) -> Any:
    """``write()`` after the background saves to ``p`` begun before (two saves of one place
    commit in the order they were called): here when ``blocking``, else in the background (a
    ``SaveHandle``)."""
    if blocking:
        _async.after_earlier(p)
        return write()
    return SaveHandle(_async.submit(write, p), p)


def _compression_text(compression: Compression) -> Optional[str]:
    """The policy as the extension parses it (checked here, before anything is converted)."""
    if compression is None:
        return None
    if isinstance(compression, str):
        text = compression
    elif isinstance(compression, (list, tuple)) and all(isinstance(r, dict) for r in compression):
        try:
            text = json.dumps(list(compression))
        except (TypeError, ValueError) as e:
            raise ValueError(f"compression=: the rules must hold only str, int and lists of str ({e})") from None
    else:
        raise TypeError(
            f"compression= takes a str (\"none\", \"auto\", \"zstd\", \"zstd:3\", \"lz4\") or a list of rule dicts, "
            f"not {type(compression).__name__}"
        )
    _core.check_compression(text)
    return text


def _metadata_json(metadata: Any) -> str:
    try:
        return json.dumps(metadata, allow_nan=True)
    except (TypeError, ValueError):
        pass
    # Name the first value JSON cannot hold, and where it is.
    stack: List[Tuple[str, Any]] = [("", metadata)]
    while stack:
        where, x = stack.pop()
        if isinstance(x, dict):
            for k, v in x.items():
                if not isinstance(k, (str, int, float, bool)) and k is not None:
                    raise TypeError(f"metadata=: the key {k!r} at `{where or '<root>'}` is a {type(k).__name__}; JSON object keys must be strings")
                stack.append((f"{where}/{k}" if where else str(k), v))
        elif isinstance(x, (list, tuple)):
            stack.extend((f"{where}/{i}" if where else str(i), v) for i, v in enumerate(x))
        elif not (x is None or isinstance(x, (str, int, float, bool))):
            hint = " (convert numpy scalars with .item(), arrays with .tolist())" if isinstance(x, (np.generic, np.ndarray)) else ""
            raise TypeError(
                f"metadata=: the value at `{where or '<root>'}` is a {type(x).__module__}.{type(x).__qualname__}, which JSON "
                f"cannot hold; metadata must be JSON: dicts, lists, str, int, float, bool, None{hint}. "
                "Put arrays and other objects in the tree itself"
            )
    raise TypeError("metadata=: not JSON-serialisable (a reference cycle?)")


def _check(reader: Any, p: str, trust: Tuple[str, ...], allow_pickle: bool, on_missing: str, select: Any = None, keep: Any = None) -> None:
    # Only what this load will construct is audited: records and custom objects with nothing
    # selected below them come back as None (never built), so they need no trust.
    types = reader.types(_codec.AUDIT_FREE, select, keep, _codec.PARTIAL_TYPES)
    bad = _codec.audit(types, trust, allow_pickle)
    if bad and on_missing == "error":
        raise UntrustedTypeError(p, bad, _static_omitted(types))


def _static_omitted(types: List[Tuple[str, str, Optional[str], str]]) -> List[str]:
    """The key paths of custom nodes saved without their static data (``"static": "omitted"``
    in a ``jax.pytree`` node's data, docs/jax.md), which only ``like=`` loads."""
    out = []
    for _kind, _t, data, path in types:
        if data and '"omitted"' in data:
            try:
                d = json.loads(data)
            except ValueError:
                continue
            if isinstance(d, dict) and d.get("static") == "omitted":
                out.append(f"`{path}`" if path else "the root")
    return out


def load(
    path: PathLike,
    *,
    select: Optional[Sequence[str]] = None,
    like: Any = None,
    trust: Iterable[str] = (),
    allow_pickle: bool = False,
    on_missing: str = "error",
    mmap: bool = False,
    verify: Optional[bool] = None,
    storage_options: StorageOptions = None,
    progress: Progress = None,
    numpy: bool = False,
    expect_root: Optional[str] = None,
    separator: Optional[str] = None,
    framework: Optional[str] = None,
    signed_by: Any = None,
    min_version: Optional[int] = None,
    not_before: Any = None,
    encryption: Any = None,
    **options: Any,
) -> Any:
    """Load a tree from a local path, ``.tpk`` file, ``s3://``, ``gs://``, ``az://`` or ``http(s)://`` location.

    - ``select``: key-path globs (``"params/**"``); other leaves come back as ``None``, and so do
      records and custom objects with nothing selected below them (they are not constructed, so
      they need no trust).
    - ``like``: a tree shaped like the stored one (``load_structure``'s, or an abstract tree of
      arrays / ``jax.ShapeDtypeStruct``s): ``None``/``False`` skips a leaf or subtree, ``True``,
      a ``LeafInfo`` or an array-like loads it (shape and dtype checked). A ``like`` that differs
      from the stored structure raises, naming the key path. Skipped places come back as with
      ``select``.
    - ``trust``: globs of ``module:qualname`` / ``module.qualname`` names whose dataclasses,
      namedtuples and enums may be rebuilt (their modules may then be imported).
    - ``on_missing="placeholder"``: unknown or untrusted objects become ``Unloadable``.
    - ``mmap=True``: arrays are read-only views of the (local, uncompressed) file, no copy.
    - ``verify``: check chunk hashes (default: True; False with ``mmap`` since it would read everything).
    - ``storage_options``: credentials/endpoint/tuning for remote locations; ``progress(done, total)``.
    - ``numpy=True``: every array comes back as a numpy array, whatever library saved it (torch
      tensors, ``jax.Array``s, typed JAX keys as their key data); torch and JAX are not imported.
      ``like=`` leaves that are JAX or torch arrays still give those.
    - ``expect_root``: a root hash (``root_hash``'s 64 hex digits); the load raises
      ``RootMismatchError`` before reading any data unless the stored tree has that root.
    - ``separator``: for a file of flat names another tool wrote (safetensors, ``.npz``), the
      text its names are split into nested dicts at (``"."``: ``layers.0.w`` is
      ``tree["layers"]["0"]["w"]``). ``None`` (the default) keeps the names as stored: a
      safetensors file loads as the flat mapping it holds, which ``load_state_dict`` takes.
    - ``framework``: the library every array of the tree comes back as, whatever wrote it:
      ``"torch"`` (tensors, zero-copy from what was read; ``map_location`` applies),
      ``"jax"`` (``jax.Array``s) or ``"numpy"`` (as ``numpy=True``). Arrays inside dicts,
      lists and tuples (OrderedDicts and namedtuples kept) are converted; an array met at two
      places is one object after. ``model.load_state_dict(treepack.load("model.safetensors",
      framework="torch"))`` works for any safetensors file.
    - ``signed_by``: a public key (a PEM file's path, PEM bytes, a ``cryptography`` key) or a
      list of them: the load raises a ``SignatureError`` before reading any data unless the
      tree is signed by one of them and unchanged since (docs/signing.md), then checks every
      chunk against the signed manifest (``mmap=True`` too, unless ``verify=False``);
      ``min_version`` / ``not_before`` also refuse an older signed tree put back in its place.
    - ``encryption``: the key of an encrypted tree (32 bytes, a :class:`treepack.Passphrase`, a
      key provider; docs/encryption.md). A tree that is not encrypted is then refused
      (``NotEncryptedError``), as is an encrypted one without its key (``EncryptedError``).

    Options of the framework integrations (each passed to the integration that takes it; any
    other keyword is a ``TypeError``):

    - ``map_location``: where torch tensors go, as in ``torch.load``: ``None`` (the CPU), a
      device, a dict from saved device names (``"cuda:0"``, ``"cpu"``) to devices, or a callable
      ``(tensor, saved_device) -> tensor``. A tree of tensors needs torch installed (else an
      ``ImportError`` naming the leaves; ``on_missing="placeholder"`` gives numpy arrays).
    - ``dask=True``: chunked arrays (in dicts, lists and tuples) come back as Dask arrays whose
      tasks read only their own chunks (docs/dask.md); everything else loads as usual.

    The whole manifest is audited before any record or custom object is built: untrusted types
    raise ``UntrustedTypeError`` listing every type and key path, and nothing is imported. (A
    tree of plain containers, values and built-in types such as datetime is built in one pass
    while its manifest is read; the audit has nothing to refuse there.)
    """
    storage_options = _encryption.keyed(storage_options, encryption)
    trust = _registry.trust_globs(trust)
    signed = None
    if signed_by is not None:
        # Checked before anything is built, against the very manifest the load builds from (the
        # core's one pass), or by the reader the load reads through (`LoadRequest.reader`).
        from . import _signing

        signed = _signing.Signed(signed_by, min_version, not_before)
        # Every chunk is checked against the signed manifest, memory-mapped loads too, unless
        # verify=False says otherwise.
        verify = True if verify is None else verify
    elif min_version is not None or not_before is not None:
        from . import _signing

        _signing.no_policy_without_keys(min_version, not_before)
    if framework is not None:
        if framework not in _FRAMEWORKS:
            raise ValueError(f"framework={framework!r}: one of {', '.join(map(repr, _FRAMEWORKS))}")
        if framework == "numpy":
            numpy = True
        else:
            # Torch tensors the tree holds load as they do (shared storages kept); JAX gets
            # every array as the numpy array it is stored as, then made a jax.Array.
            out = load(path, select=select, like=like, trust=trust, allow_pickle=allow_pickle, on_missing=on_missing,
                       mmap=mmap, verify=verify, storage_options=storage_options, progress=progress,
                       numpy=numpy or framework == "jax", expect_root=expect_root, separator=separator,
                       signed_by=signed_by, min_version=min_version, not_before=not_before, **options)
            return _as_framework(out, framework, options)
    p = _path(path)
    # (a TypeError for a keyword no integration takes; options checked before the file is read)
    hooks = _registry.load_hooks(options, p)
    fmt = _foreign(p)
    if fmt == "safetensors" and separator is None:
        fmt = None  # the core reads a safetensors file as the flat tree it holds, wherever a location is
    elif fmt is None and separator is not None:
        raise TypeError(f"load() of {p}: separator= applies to files of flat names (safetensors, npz), not to this")
    if fmt is not None and encryption is not None:
        raise _core.NotEncryptedError(f"{p}: a {fmt} file is not encrypted, and encryption= was given: load it "
                                      "without a key")
    if fmt is not None and signed is not None:
        raise _core.UnsignedError(f"{p}: a {fmt} file holds no treepack signature, and signed_by= asks for one: store "
                                  "it as a treepack tree (treepack.convert), sign that, and load it")
    if fmt is not None:
        from ._convert import load_foreign

        kwargs = dict(select=select, like=like, trust=trust, allow_pickle=allow_pickle, on_missing=on_missing,
                      mmap=mmap, verify=verify, storage_options=storage_options, progress=progress,
                      numpy=numpy, expect_root=expect_root, separator=separator, **options)
        return load_foreign(p, fmt, kwargs)
    trust_t = trust
    if on_missing not in ("error", "placeholder"):
        raise ValueError("on_missing must be 'error' or 'placeholder'")
    opts = _opts(storage_options)
    dec = _codec.Decoder(trust_t, allow_pickle, on_missing == "placeholder", options, plain=numpy)
    verify = (not mmap) if verify is None else verify
    request = LoadRequest(p, storage_options, select, like, trust_t, allow_pickle, on_missing, mmap, verify,
                          expect_root, dec, options, signed)
    try:
        for hook in hooks:
            # A load an integration makes its own way (dask=True: lazy Dask arrays).
            out = hook(request)
            if out is not _registry.DECLINE:
                break
        else:
            # (JAX arrays bound for an accelerator: read from the mapped file, staged to the device)
            request.finishing += [f for f in (prepare(request) for prepare in _registry.gated("prepare_load"))
                                  if f is not None]
            out = _load_reporting(request, progress, p, opts)
    except BaseException:
        _finish(request, False)
        raise
    _finish(request, True)
    return out


def _finish(request: "LoadRequest", ok: bool) -> None:
    """Call every ``request.finishing`` (each, whatever the others do); the first failure is
    raised once all have run. After a failed load (``not ok``) the load's own error stands."""
    failed: Optional[BaseException] = None
    for f in request.finishing:
        try:
            f(ok)
        except BaseException as e:  # noqa: BLE001 (an interrupt too: every copy must be waited for)
            failed = failed or e
    if failed is not None and ok:
        raise failed


def _load_reporting(request: "LoadRequest", progress: Progress, p: str, opts: Any) -> Any:
    """``_load``, its build errors located in the tree and a missing framework named."""
    try:
        return _load(request, progress)
    except _codec.BuildError as e:
        raise (_placed(e, p) or e.located(p, _build_paths(p, opts, e))) from e
    except (ValueError, TypeError, OverflowError) as e:
        placed = _placed(e, p)
        if placed is None:
            raise
        raise placed from e
    except _codec.MissingFramework as e:
        lib = e.type_name.partition(".")[0]
        paths = [path for t, path in _core.Reader(p, opts).array_types() if t.startswith(lib + ".")]
        raise ImportError(e.message(paths)) from None


# The array annotation whose integration builds each framework's arrays (docs/format.md 5).
_FRAMEWORKS = {"torch": "torch.Tensor", "jax": "jax.Array", "numpy": None}


def _as_framework(tree: Any, framework: str, options: Mapping[str, Any]) -> Any:
    """``tree`` with every numpy array in its dicts, lists and tuples made an array of
    ``framework`` by the integration that builds that framework's arrays."""
    kind = _FRAMEWORKS[framework]
    h = _registry.array_handlers(kind)
    if h is None:
        raise ValueError(f"framework={framework!r}: no integration builds {kind} arrays")
    build = h.arrays(dict(options))  # an ImportError when the framework is not installed
    ann = {"type": kind}
    convert = lambda a: build(a, ann)  # noqa: E731
    done: Dict[int, Any] = {}

    def foreign(x: Any) -> bool:
        # Another library's array (a jax.Array where torch is asked for, a tensor where JAX is).
        top = type(x).__module__.partition(".")[0]
        return top not in (framework, "numpy", "builtins") and all(hasattr(x, a) for a in ("__array__", "shape", "dtype"))

    def walk(x: Any) -> Any:
        if (isinstance(x, np.ndarray) and x.dtype != object) or foreign(x):
            if id(x) not in done:
                done[id(x)] = convert(x if isinstance(x, np.ndarray) else np.asarray(x))
            return done[id(x)]
        if isinstance(x, dict):
            for k, v in x.items():
                x[k] = walk(v)  # in place: an OrderedDict keeps its type and attributes
        elif isinstance(x, list):
            x[:] = [walk(v) for v in x]
        elif isinstance(x, tuple):
            items = [walk(v) for v in x]
            if any(a is not b for a, b in zip(items, x)):
                return type(x)(*items) if hasattr(x, "_fields") else type(x)(items)
        return x

    # A tree nests up to 1000 deep (the format's limit): deeper than Python's default recursion.
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 5000))
    try:
        return walk(tree)
    finally:
        sys.setrecursionlimit(limit)


class LoadRequest:
    """One load, as the integrations' load hooks see it: its arguments, its decoder, and the
    steps of a load they may take (a reader, the structure, the audit, a load of some leaves)."""

    def __init__(self, path: str, storage_options: StorageOptions, select: Any, like: Any, trust: Tuple[str, ...],
                 allow_pickle: bool, on_missing: str, mmap: bool, verify: bool, expect_root: Optional[str],
                 decoder: Any, options: Mapping[str, Any], signed: Any = None) -> None:
        self.path, self.storage_options, self.select, self.like = path, storage_options, select, like
        self.trust, self.allow_pickle, self.on_missing = trust, allow_pickle, on_missing
        self.mmap, self.verify, self.expect_root = mmap, verify, expect_root
        self.decoder, self.options, self.signed = decoder, options, signed
        #: ``finish(ok)`` of each integration that staged part of this load (copies to a device
        #: still running): called when the load ends, ``ok`` when without an error.
        self.finishing: List[Callable[[bool], None]] = []

    def reader(self) -> Any:
        """A Reader of the location (checked against ``expect_root`` and, for a signed load,
        its signature: before anything is read through it)."""
        r = _core.Reader.torch_placeholders(self.path) if _torch_placeholders(self) else \
            _core.Reader(self.path, _opts(self.storage_options))
        if self.expect_root is not None:
            r.expect_root(self.expect_root)
        if self.signed is not None:
            self.signed.check(r)
        return r

    def may_map(self, *own_options: str) -> bool:
        """Whether an integration may switch this load to reading the file's pages (``mmap``):
        a local tree that exists, with no template, ``mmap``, storage options or key (an
        encrypted tree), signature, ``numpy=True``, or ``load()`` option but ``own_options``."""
        if self.mmap or self.like is not None or self.storage_options is not None or self.signed is not None \
                or self.decoder.plain or any(k not in own_options for k in self.options):
            return False
        return "://" not in self.path and os.path.exists(self.path)

    def structure(self, reader: Any) -> Any:
        """``load_structure``'s tree, from ``reader``."""
        return reader.structure(_struct_node)

    def load_kept(self, reader: Any, keep: Any, decoder: Any) -> Any:
        """The tree with only the leaves in ``keep`` read, after the audit of what it builds."""
        _check(reader, self.path, self.trust, self.allow_pickle, self.on_missing, None, keep)
        return reader.load(decoder, _codec.np_dtype, keep=keep, verify=self.verify, partial_types=_codec.PARTIAL_TYPES)

    def audit_built(self, reader: Any, subtrees: List[str], nodes: List[Tuple[str, str, Optional[str], str]]) -> None:
        """The audit of a load that builds the stored subtrees at ``subtrees`` whole and the
        records and custom nodes ``nodes`` ((kind, type, data JSON, path), from ``like``'s
        ``StructNode``s; the template's own containers are the caller's objects)."""
        # Those subtrees, and the objects their refs name wherever those are stored.
        stored = reader.types_within(list(dict.fromkeys(subtrees)), _codec.AUDIT_FREE) if subtrees else []
        types = list(stored) + list(nodes)
        bad = _codec.audit(types, self.trust, self.allow_pickle)
        if bad and self.on_missing == "error":
            raise UntrustedTypeError(self.path, bad)


def _placed(e: BaseException, p: str) -> Optional[BaseException]:
    """A build's error the core marked with the key path of the node it failed at (an object
    that could not be built, a dict of keys made to share one hash): the same error, its
    message naming the file and that path. None for any other error."""
    at = getattr(e, "_treepack_at", None)
    if at is None:
        return None
    if isinstance(e, _codec.BuildError):
        return e.located(p, [at])
    if type(e) not in (ValueError, TypeError, OverflowError):
        return None
    return type(e)(f"{p}: at `{at or '<root>'}`: {e}")


def _build_paths(p: str, opts: Any, e: Any) -> List[str]:
    """Where the objects of a failed build stand (the load builds without key paths; only a
    failure looks them up, reading the manifest again)."""
    try:
        rows = _core.Reader(p, opts).types()
    except Exception:  # the error being reported matters more than its place
        return []
    return [
        path for _kind, name, data, path in rows
        if name == e.node_type and (name == e.type_name or (data is not None and json.dumps(e.type_name) in data))
    ]


def _foreign(p: str) -> Optional[str]:
    """The foreign format of a local file or folder ``load`` was given (safetensors, npz, npy,
    Zarr, HDF5, Orbax, JAX: known by its content, as ``convert`` and the CLI know it), read by
    converting it; None for treepack locations. (Nothing is imported to ask: a treepack load
    imports no converter.)"""
    if "://" in p or not os.path.exists(p):
        return None
    found = _core.detect_format(p, True)
    # A torch.save checkpoint (or a folder of its shards), a GGUF file and a torch distributed
    # checkpoint are read by the core as the tree each holds, wherever a location is (load,
    # open, load_structure), without pickle: no conversion here.
    return None if found in ("treepack", "torch", "gguf", "dcp") else found


_ENCODING = threading.local()


def _encode_context() -> Any:
    """This thread's encoder context: the room its next save's walk starts with, learnt from its
    saves before (a thread saving trees of one shape); saves on other threads keep their own."""
    c = getattr(_ENCODING, "context", None)
    if c is None:
        c = _ENCODING.context = _core.EncodeContext()
    return c


def _load(request: LoadRequest, progress: Progress) -> Any:
    """The load, on the path the core's policy picks (``_core.load``): a whole tree that needs no
    audit is built in one pass over its manifest (its few reads of stored leaves report no
    progress); anything else, or any failure there, goes through ``_through_reader`` on the
    request's reader, which audits, fetches stored leaves in parallel batches and reports errors
    in full. The core starts over when an overwrite replaced the tree meanwhile."""
    select, like = request.select, request.like
    sel = [select] if isinstance(select, str) else (list(select) if select is not None else None)
    if _torch_placeholders(request):
        return _through_reader(request, request.reader(), sel, progress)
    return _core.load(
        request.path, request.decoder, _codec.np_dtype, _codec.AUDIT_FREE,
        request.reader, lambda r: _through_reader(request, r, sel, progress),
        select=sel, like=like is not None, mmap=request.mmap, progress=not (progress is None or progress is False),
        verify=request.verify, expect_root=request.expect_root, storage_options=_opts(request.storage_options),
        **(request.signed.core_kwargs() if request.signed is not None else {}),
    )


def _torch_placeholders(request: LoadRequest) -> bool:
    """Whether the load reads a local torch.save checkpoint with ``on_missing="placeholder"``:
    then objects its pickle builds from globals outside the reader's allow-list come back as
    ``Unloadable`` (nothing imported or run) instead of refusing the whole file."""
    p = request.path
    return request.on_missing == "placeholder" and "://" not in p and os.path.isfile(p) \
        and _core.detect_format(p, True) == "torch"


def _through_reader(request: LoadRequest, r: Any, sel: Optional[List[str]], progress: Progress) -> Any:
    """The Python steps of a load through the reader ``r``: integrations' like= hooks, the audit
    of every record/custom node that will be built, the leaves read into like= objects, the load."""
    p, dec, like, mmap, verify = request.path, request.decoder, request.like, request.mmap, request.verify
    into: Dict[str, Any] = {}
    structure = r.structure(_struct_node) if like is not None else None
    try:
        if like is not None:
            for hook in _registry.gated("like"):
                # A template an integration loads its own way (JAX: arrays onto shardings).
                out = hook(request, r, like, structure)
                if out is not _registry.DECLINE:
                    return out
        keep = _like.keep_paths(like, structure, into) if like is not None else None
    except (ValueError, TypeError) as e:
        # A like= that does not match the file: said with the file's name.
        if type(e) not in (ValueError, TypeError) or not str(e).startswith("like=:"):
            raise
        raise type(e)(f"{p}: {e}") from e
    _check(r, p, request.trust, request.allow_pickle, request.on_missing, sel, keep)
    callback, done = _progress_callback(progress, f"load {p}")
    try:
        # Leaves of like= read into its objects (torch tensors) in place, no second copy of
        # the model: each integration gets all of its leaves at once (to overlap a device's
        # copies with the reads).
        groups: Dict[Any, List[Tuple[str, Any]]] = {}
        for path, (target, read_into) in into.items():
            groups.setdefault(read_into, []).append((path, target))
        for read_into, items in groups.items():
            read_into(r, items, verify)
        out = r.load(dec, _codec.np_dtype, select=sel, keep=keep, mmap=mmap, verify=verify, progress=callback,
                     partial_types=_codec.PARTIAL_TYPES)
        if like is None:
            return out
        return _like.graft(out, like, structure, {id(t) for t, _ in into.values()}, dec.options)
    finally:
        done()


def load_structure(path: PathLike, *, storage_options: StorageOptions = None, encryption: Any = None) -> Any:
    """The tree with a ``LeafInfo`` at every leaf, reading only the manifest.

    Containers come back as dict/list/tuple; records and custom objects as ``StructNode`` (their
    classes are never constructed or imported). When JAX is imported, ``StructNode`` is a pytree
    node, so ``jax.tree.map`` over the structure reaches the fields of records.
    """
    p, opts = _path(path), _opts(_encryption.keyed(storage_options, encryption))
    for hook in _registry.gated("structure"):
        hook()  # (JAX: StructNode as a pytree node)
    # One pass over the manifest, building these objects as it is read; whenever that path does
    # not apply (or fails), the Reader path below gives the result or the full error.
    try:
        fast = _core.structure_one_pass(p, _struct_node, opts)
        if fast is not None:
            return fast
        return _core.Reader(p, opts).structure(_struct_node)
    except Exception as e:
        placed = _placed(e, p)
        if placed is not None:
            raise placed from e
        # Not a treepack tree: an Orbax or JAX checkpoint is read as the tree it holds (asked
        # only here, so that a treepack load pays nothing for it).
        fmt = _foreign(p)
        if fmt not in ("orbax", "jax", "npy", "npz", "zarr", "hdf5"):
            raise
    from ._foreign_view import structure

    return structure(p, fmt)


def untrusted_types(
    path: PathLike, trust: Iterable[str] = (), allow_pickle: bool = False, *, storage_options: StorageOptions = None,
    encryption: Any = None,
) -> Dict[str, List[str]]:
    """What loading ``path`` would need trusted: {type name: [key paths]}. Constructs nothing."""
    return _codec.audit(
        _core.Reader(_path(path), _opts(_encryption.keyed(storage_options, encryption))).types(_codec.AUDIT_FREE),
        _registry.trust_globs(trust), allow_pickle
    )


VerifyReport = _core.VerifyReport
"""What ``verify`` found: ``ok``, ``chunks_checked``, ``bytes_checked``, ``problems`` (one line each)."""


def root_hash(path: PathLike, *, key: Optional[str] = None, storage_options: StorageOptions = None,
              encryption: Any = None) -> str:
    """The tree's root hash, 64 hex digits (docs/format.md section 9), or the subtree's at ``key``.

    A Merkle hash over the structure and the leaves' canonical bytes, computed from the manifest
    (no array data is read): the same whether the tree is a directory, a ``.tpk``, compressed or
    in a repository. Pass it to ``load(expect_root=...)`` to be sure to load that very tree.
    """
    return _core.Reader(_path(path), _opts(_encryption.keyed(storage_options, encryption))).root_hash(key)


def diff(a: PathLike, b: PathLike, *, storage_options: StorageOptions = None,
         encryption: Any = None) -> List[Dict[str, Any]]:
    """What differs between the trees at ``a`` and ``b``, from their manifests (no array data is
    read): a list of ``{"path", "op", "old", "new"}`` dicts — ``op`` is ``"+"`` (only in ``b``),
    ``"-"`` (only in ``a``) or ``"~"`` (changed); arrays with the same dtype, shape and chunk grid
    also get ``"chunks_differ"`` and ``"chunks"``, counted by hash. Empty when the trees are equal.
    """
    return json.loads(_core.diff(_path(a), _path(b), _opts(_encryption.keyed(storage_options, encryption))))


def verify(path: PathLike, *, storage_options: StorageOptions = None, encryption: Any = None) -> VerifyReport:
    """Re-hash every chunk; the report names corrupt chunks."""
    return _core.Reader(_path(path), _opts(_encryption.keyed(storage_options, encryption))).verify()


def gc(path: PathLike, grace_secs: float = 3600.0, *, storage_options: StorageOptions = None,
       encryption: Any = None) -> List[str]:
    """Remove leftovers of interrupted saves older than ``grace_secs``; returns what was removed."""
    return _core.gc(_path(path), grace_secs, _opts(_encryption.keyed(storage_options, encryption)))

