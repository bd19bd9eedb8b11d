"""File-backed objects: a registered type (or a built-in handler such as Pillow images) stored as
named files inside the tree's packs, next to inline data. The files are bytes leaves, so identical
files anywhere in the tree are stored once (chunks are deduplicated by hash), read with the tree's
coalesced ranged reads, and read once on load however many objects hold them."""

from __future__ import annotations

import io
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

BytesLike = Union[bytes, bytearray, memoryview]


class FileSink:
    """What a ``save(obj, files)`` function writes its files to."""

    __slots__ = ("_files", "_where")

    def __init__(self, where: str) -> None:
        self._files: Dict[str, bytes] = {}
        self._where = where

    def write(self, name: str, data: Union[BytesLike, Any]) -> None:
        """Store ``data`` (bytes-like, or a binary stream read to its end) as the file ``name``."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"cannot save `{self._where}`: a file name must be a non-empty str, got {name!r}")
        if name in self._files:
            raise ValueError(f"cannot save `{self._where}`: file {name!r} written twice")
        if isinstance(data, (bytes, bytearray, memoryview)):
            b = bytes(data)
        elif hasattr(data, "read"):
            b = data.read()
            if not isinstance(b, (bytes, bytearray)):
                raise TypeError(f"cannot save `{self._where}`: stream for file {name!r} gave {type(b).__name__}, not bytes (open it in binary mode)")
            b = bytes(b)
        else:
            raise TypeError(f"cannot save `{self._where}`: file {name!r} must be bytes or a binary stream, got {type(data).__name__}")
        self._files[name] = b

    @property
    def files(self) -> Dict[str, bytes]:
        return self._files


class Files:
    """What a ``load(files)`` function reads: the files by name, and ``data`` (what ``save``
    returned)."""

    __slots__ = ("_files", "data")

    def __init__(self, files: Dict[str, bytes], data: Any) -> None:
        self._files = files
        self.data = data

    def open(self, name: str) -> io.BytesIO:
        """The file ``name`` as a binary stream."""
        return io.BytesIO(self.read(name))

    def read(self, name: str) -> bytes:
        """The bytes of the file ``name``."""
        try:
            return self._files[name]
        except KeyError:
            raise KeyError(f"no file {name!r} (the object has {sorted(self._files)})") from None

    def names(self) -> List[str]:
        """The file names, in the order they were written."""
        return list(self._files)

    def __iter__(self) -> Iterator[str]:
        return iter(self._files)

    def __len__(self) -> int:
        return len(self._files)

    def __repr__(self) -> str:
        return f"Files({self.names()!r})"


def describe(name: str, data: Any, sink: FileSink) -> Tuple[str, str, Optional[str], List[Tuple[str, Any]]]:
    """The custom node of a file-backed object: child ``data`` (if any), then child ``files`` (a
    dict of name -> bytes)."""
    kids: List[Tuple[str, Any]] = []
    if data is not None:
        kids.append(("data", data))
    kids.append(("files", dict(sink.files)))
    return ("custom", name, None, kids)


def files_of(kids: Dict[str, Any]) -> Optional[Dict[str, bytes]]:
    """The files of a loaded file-backed node, or None when it is not one."""
    f = kids.get("files")
    if isinstance(f, dict) and all(isinstance(k, str) and isinstance(v, bytes) for k, v in f.items()):
        return f
    return None


def check_file_name(name: Any) -> str:
    """A stored file name is one relative path segment: no separators, not ``.`` or ``..``, no
    NUL. ``File.save_to(folder)`` puts the file in the folder under this name, so a name such as
    ``../../x`` or ``/etc/x`` must never come back from a file."""
    import os

    bad = (
        not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\\" in name or "\0" in name
        or (os.altsep is not None and os.altsep in name)
    )
    if bad:
        raise ValueError(
            f"invalid file name {name!r}: a File's name is one file name (no folders, not '.' or '..'); "
            "give the folder to save_to() instead"
        )
    return name


class File:
    """A file's bytes carried in a tree (built-in ``py.file`` node): ``File("report.pdf")`` reads
    the file when the tree is saved; ``File(data=b"...", name="x.bin")`` holds bytes. Saving with
    ``embed=True`` stores every ``pathlib.Path`` that names a regular file this way, and loads
    give back ``File`` objects whose ``path`` is the path they came from."""

    __slots__ = ("name", "path", "_data")

    def __init__(self, path: Any = None, *, name: Optional[str] = None, data: Optional[BytesLike] = None) -> None:
        if (path is None) == (data is None):
            raise TypeError("File() takes a path, or data= (and a name=)")
        import os

        self.path = os.fspath(path) if path is not None else None
        self.name = name if name is not None else (os.path.basename(self.path) if self.path else "")
        if self.name:
            check_file_name(self.name)
        self._data = bytes(data) if data is not None else None

    @property
    def data(self) -> bytes:
        """The file's bytes (read from ``path`` on first use)."""
        if self._data is None:
            with open(self.path, "rb") as f:  # type: ignore[arg-type]
                self._data = f.read()
        return self._data

    def open(self) -> io.BytesIO:
        return io.BytesIO(self.data)

    def save_to(self, where: Any) -> str:
        """Write the bytes to ``where``: a file path, or a folder to put the file in under its
        ``name``. The file is never written through a symbolic link (a link at the target is
        refused), so a folder given here is the only place it can land."""
        import os

        target = os.fspath(where)
        if os.path.isdir(target):
            target = os.path.join(target, check_file_name(self.name or "file"))
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
        try:
            fd = os.open(target, flags, 0o666)
        except OSError as e:
            if os.path.islink(target):
                raise OSError(e.errno, f"{target} is a symbolic link; File.save_to does not write through links (remove it or pick another name)") from None
            raise
        with os.fdopen(fd, "wb") as f:
            f.write(self.data)
        return target

    def __eq__(self, other: object) -> bool:
        return isinstance(other, File) and (self.name, self.data) == (other.name, other.data)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"File(name={self.name!r}, path={self.path!r}, {len(self.data)} bytes)"
