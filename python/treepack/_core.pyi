"""Type stubs for the compiled extension ``treepack._core`` (the Rust side of the package)."""

from typing import AbstractSet, Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

__version__: str

class TreepackError(Exception): ...
class CorruptError(TreepackError): ...
class FormatError(TreepackError): ...
class RootMismatchError(TreepackError): ...
class SignatureError(TreepackError): ...
class UnsignedError(SignatureError): ...
class UntrustedSignerError(SignatureError): ...
class SignatureMismatchError(SignatureError): ...
class InvalidSignatureError(SignatureError): ...
class EncryptionError(TreepackError): ...
class EncryptedError(EncryptionError): ...
class NotEncryptedError(EncryptionError): ...
class WrongKeyError(EncryptionError): ...
class TamperedError(CorruptError): ...

EncodeOther = Callable[[Any, str], Tuple[str, str, Optional[str], List[Tuple[str, Any]]]]
EncodeArray = Callable[[Any], Tuple[Any, str]]
DecodeOther = Callable[[str, str, Optional[str], List[Tuple[str, Any]]], Any]

Progress = Optional[Callable[[int, int], Any]]
StorageOptions = Optional[Dict[str, str]]

class SaveInfo:
    """What a save wrote."""
    leaves: int
    bytes_written: int
    location: str
    arrays: int
    array_bytes: int
    bytes_reused: int
    root: Optional[str]

class VerifyReport:
    """What verify found: one line per problem, naming the leaf, chunk and file."""
    ok: bool
    chunks_checked: int
    bytes_checked: int
    problems: List[str]

class Prepared:
    """A Python tree converted to treepack's model, ready to be written once (on any thread)."""
    def snapshot(self) -> int:
        """Make a ``snapshot=True`` tree's deferred array copies (GIL held); the bytes copied."""
    def write(
        self,
        path: str,
        overwrite: bool = False,
        metadata: Optional[str] = None,
        chunk_bytes: Optional[int] = None,
        storage_options: StorageOptions = None,
        progress: Progress = None,
        compression: Optional[str] = None,
        durable: bool = True,
        background: bool = False,
        compress_manifest: Optional[bool] = None,
    ) -> SaveInfo:
        """Write with the GIL released (``compression``: a policy as text, see ``check_compression``;
        ``background``: at the lowest CPU priority, from a thread kept for background saves)."""
    def write_part(
        self,
        path: str,
        overwrite: bool = False,
        metadata: Optional[str] = None,
        chunk_bytes: Optional[int] = None,
        storage_options: StorageOptions = None,
        compression: Optional[str] = None,
        durable: bool = True,
        compress_manifest: Optional[bool] = None,
    ) -> Tuple[bytes, SaveInfo]:
        """Write this process's part of a save shared by processes (packs only); returns the
        part's manifest, for ``commit_parts``."""

def key_text(key: Any) -> str:
    """The key-path segment of a dict key (or of a field's or child's name), as the core writes
    it: ``~i1`` for the int key 1, ``a~1b`` for ``"a/b"``, ``~e`` for ``""``."""

def few_same_hashes(items: Iterable[Any], what: str) -> List[Any]:
    """``items`` as a list, unless so many of them share a hash (strings aside) that a set or
    dict of them would take time quadratic in their number: then a ``ValueError`` naming
    ``what`` (``"a set"``), before anything is built (design decision 106)."""

def release_snapshot_buffers() -> int:
    """Free the buffers background saves keep for the next one; the bytes freed."""

def commit_parts(
    path: str, parts: List[bytes], overwrite: bool = False, storage_options: StorageOptions = None, durable: bool = True,
    compress_manifest: Optional[bool] = None,
) -> SaveInfo:
    """Merge the parts of a save written by several processes (the committer's first) and commit it."""

def block_chunk_shape(shape: Sequence[int], block: Sequence[int], itemsize: int, target: Optional[int] = None) -> List[int]:
    """The chunk shape of an array held in blocks (shards): chunks tile every block."""

def check_compression(policy: str) -> None:
    """Raise ``ValueError`` if a compression policy (as text) cannot be used."""

def prepare(
    tree: Any,
    encode_other: EncodeOther,
    encode_array: EncodeArray,
    snapshot: bool = False,
    fast_datetime: bool = False,
    shared: bool = True,
    text: bool = True,
    reset: Optional[Callable[[], Any]] = None,
    context: Optional[EncodeContext] = None,
) -> Prepared:
    """Convert a tree; with ``snapshot`` array bytes are copied so the caller may mutate them.
    Plain subtrees are written as manifest text during the walk unless ``text=False``; ``reset``
    is called before a second walk (a plain container met twice after it was written as text).
    ``context`` sizes the walk's buffers from the saves made before with it, and learns."""

class EncodeContext:
    """The room an encoder starts with, learnt from the saves made with this context (one per
    thread in ``save``: saves on other threads never change it)."""

    def __init__(self) -> None: ...

def gc(path: str, grace_secs: float = 3600.0, storage_options: StorageOptions = None) -> List[str]: ...
def numpy_dtype_desc(dt: Any) -> Tuple[str, Any]:
    """(the treepack dtype's manifest JSON, the canonical numpy dtype: little-endian, packed) of a
    numpy dtype; ``TypeError`` for dtypes arrays cannot hold."""
    ...

def numpy_dtype(text: str) -> Any:
    """The numpy dtype of a treepack dtype's manifest JSON (ml_dtypes' types need that package)."""
    ...

def datetime_general_json(d: Any) -> str:
    """The general form of a datetime's ``py.datetime`` node (``{"fold", "iso", "tz"}``) as JSON
    text; the zone described by ``_codec.builtins._tz_data``."""
    ...

def encode_png(pixels: bytes, width: int, height: int, mode: str) -> Optional[bytes]:
    """The PNG file of a Pillow image's raw bytes (``tobytes()``); None for modes left to Pillow."""
    ...

def load_one_pass(
    path: str,
    decode_other: Any,
    np_dtype: Any,
    free_types: Set[str],
    verify: bool = True,
    storage_options: StorageOptions = None,
) -> Optional[Any]:
    """A whole-tree load built while the manifest is parsed, for trees whose leaves are all inline;
    None when it needs the type audit or a pack read, or anything fails (then ``Reader.load``)."""

def load(
    path: str,
    decode_other: Any,
    np_dtype: Any,
    free_types: Set[str],
    open_reader: Callable[[], Reader],
    through_reader: Callable[[Reader], Any],
    select: Optional[List[str]] = None,
    like: bool = False,
    mmap: bool = False,
    progress: bool = False,
    verify: bool = True,
    expect_root: Optional[str] = None,
    storage_options: StorageOptions = None,
    signed_by: Optional[List[Tuple[str, str]]] = None,
    min_version: Optional[int] = None,
    not_before_ms: Optional[int] = None,
) -> Any:
    """A load on the path the core's policy picks: one pass over the manifest for a whole tree
    that needs no audit, else ``through_reader(open_reader())``; a ``FileNotFoundError`` from it
    starts over when the reader's ``replaced()`` says an overwrite replaced the tree."""

def structure_one_pass(path: str, make_node: Callable[..., Any], storage_options: StorageOptions = None) -> Optional[Any]:
    """``load_structure``'s tree built while the manifest is parsed; None when that path does not
    apply or fails (the caller then uses ``Reader.structure``, which reports errors in full)."""

def _outline_builds() -> int: ...
def _release_deferred() -> Tuple[int, int]:
    """Release now the Python references treepack's threads let go of without the GIL (else
    released at treepack's next call); returns (released now, ever deferred). For tests."""

class LeafInfo:
    path: str
    kind: str
    dtype: Optional[str]
    shape: Optional[Tuple[int, ...]]
    nbytes: int
    inline: bool
    target: Optional[str]
    def __init__(
        self, path: str, kind: str, dtype: Optional[str] = None, shape: Optional[Sequence[int]] = None, nbytes: int = 0,
        inline: bool = True, target: Optional[str] = None,
    ) -> None: ...

class BytesOwner: ...

class Reader:
    def __init__(self, path: str, storage_options: StorageOptions = None) -> None: ...
    def types(
        self, skip: Optional[Set[str]] = None, select: Optional[List[str]] = None, keep: Optional[Set[str]] = None,
        partial_types: Optional[AbstractSet[str]] = None,
    ) -> List[Tuple[str, str, Optional[str], str]]: ...
    def types_within(self, paths: List[str], skip: Optional[Set[str]] = None) -> List[Tuple[str, str, Optional[str], str]]: ...
    def array_types(self) -> List[Tuple[str, str]]: ...
    def read_into(self, path: str, out: Any, verify: bool = True, slice: Optional[str] = None) -> None: ...
    def read_many_into(self, items: Sequence[Tuple[str, Any]], verify: bool = True) -> None: ...
    def load(
        self,
        decode_other: DecodeOther,
        np_dtype: Callable[[str], Any],
        select: Optional[Sequence[str]] = None,
        keep: Optional[Set[str]] = None,
        mmap: bool = False,
        verify: bool = True,
        subpath: Optional[str] = None,
        progress: Progress = None,
        partial_types: Optional[AbstractSet[str]] = None,
    ) -> Any: ...
    def convert_keep(self, select: List[str], file: Optional[str] = None, closed: bool = True) -> Optional[Set[str]]: ...
    def structure(self, make_node: Callable[..., Any]) -> Any: ...
    def kind(self, path: str) -> str: ...
    def children(self, path: str) -> List[Tuple[str, Any]]: ...
    def array_info(self, path: str) -> Tuple[str, List[int]]: ...
    def read_array(self, path: str, slice: str, np_dtype: Callable[[str], Any], verify: bool = True) -> Any: ...
    def chunk_shape(self, path: str) -> Optional[List[int]]: ...
    def chunk_codecs(self, path: str) -> List[str]: ...
    def verify(self) -> VerifyReport: ...
    def root_hash(self, key: Optional[str] = None) -> str: ...
    def expect_root(self, expected: str) -> None: ...
    def metadata(self) -> Optional[str]: ...
    def replaced(self) -> bool: ...
    def io_stats(self) -> Tuple[int, int]: ...

class ViewServer:
    """The viewer's server (crates/treepack-view), serving on 127.0.0.1 until closed."""
    def __init__(self, path: str, other: Optional[str] = None, port: int = 0, storage_options: StorageOptions = None) -> None: ...
    @property
    def url(self) -> str: ...
    @property
    def running(self) -> bool: ...
    def open_browser(self) -> None: ...
    def close(self) -> None: ...

def reader_html(reader: Reader, path: str = "", max_rows: int = 300) -> str: ...

class Repository:
    def __init__(self, path: str, storage_options: StorageOptions = None, create: bool = False) -> None: ...
    def tree(self, name: str) -> str: ...
    def names(self) -> List[Tuple[str, str, int, int, int]]: ...
    def root_hash(self, name: str) -> str: ...
    def delete(self, name: str) -> None: ...
    def gc(self, grace_secs: float) -> Tuple[List[str], int, List[str], int]: ...
    def verify(self) -> VerifyReport: ...

def diff(a: str, b: str, storage_options: StorageOptions = None) -> str: ...
def export_json(path: str, encoding: str = "base85", compression: Optional[str] = None,
                storage_options: StorageOptions = None) -> str: ...
def unpack_json(doc: bytes, path: str) -> None: ...
def forget_memory(bucket: str) -> bool: ...
def schema(path: str, storage_options: StorageOptions = None) -> str: ...
def convert(src: str, dst: str, from_format: str, to_format: str, separator: Optional[str] = None, overwrite: bool = False,
            storage_options: StorageOptions = None, compression: Optional[str] = None, durable: bool = True,
            progress: Optional[Callable[[int, int], Any]] = None,
            select: Optional[List[str]] = None) -> Tuple[int, int]: ...
def detect_format(path: str, read: bool = True) -> str:
    """The format of what is at ``path`` (one of treepack, safetensors, npz, npy, zarr, hdf5), as
    ``treepack convert`` tells it: a local source by its content, else by its extension."""
    ...

# Signed trees (_signing.py; keys as (label, PEM text), results as JSON text).
def sign(path: str, key: Tuple[str, str], tree_version: Optional[int] = None, name: Optional[str] = None,
         model_signing: bool = False, storage_options: StorageOptions = None) -> str: ...
def verify_signature(path: str, keys: List[Tuple[str, str]], min_version: Optional[int] = None,
                     not_before_ms: Optional[int] = None, storage_options: StorageOptions = None) -> str: ...
def reader_verify_signature(reader: Reader, keys: List[Tuple[str, str]], min_version: Optional[int] = None,
                            not_before_ms: Optional[int] = None) -> str: ...
def signature(path: str, storage_options: StorageOptions = None) -> Optional[str]: ...
def generate_key(algorithm: str = "ed25519") -> Tuple[str, str, str]: ...
def public_key(key: Tuple[str, str]) -> Tuple[str, str, str]: ...
