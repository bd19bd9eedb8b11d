"""Keys for encrypted trees (docs/encryption.md).

``encryption=`` takes 32 bytes (a key, e.g. from :func:`generate_encryption_key`), a
:class:`Passphrase` (stretched by Argon2id), or a key provider: any object with
``wrap_key(data_key) -> (key_id, wrapped)`` and ``unwrap_key(key_id, wrapped) -> data_key`` (the
hook a KMS plugs into). Each save makes a fresh random data key that encrypts the tree; the key
given wraps it.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional, Protocol, Tuple, Union, runtime_checkable


class Passphrase:
    """A passphrase to encrypt or open a tree with (stretched by Argon2id, 64 MiB, 3 passes).

    Kept out of ``repr`` and tracebacks' locals display: ``Passphrase(***)``."""

    __slots__ = ("_value",)

    def __init__(self, passphrase: str) -> None:
        if not isinstance(passphrase, str):
            raise TypeError(f"Passphrase takes a str, not {type(passphrase).__name__}")
        if not passphrase:
            raise ValueError("an empty passphrase protects nothing")
        self._value = passphrase

    def __repr__(self) -> str:
        return "Passphrase(***)"


@runtime_checkable
class KeyProvider(Protocol):
    """Wraps and unwraps a tree's data key with a key it keeps (a KMS)."""

    def wrap_key(self, data_key: bytes) -> Tuple[str, bytes]:
        """The id of the key used, and ``data_key`` wrapped (at most 4 KiB)."""

    def unwrap_key(self, key_id: str, wrapped: bytes) -> bytes:
        """The 32-byte data key ``wrap_key`` wrapped with the key ``key_id``."""


Encryption = Union[bytes, bytearray, memoryview, Passphrase, KeyProvider]


def generate_encryption_key() -> bytes:
    """32 random bytes from the operating system: a key for ``encryption=``. Keep it safe: a
    tree encrypted with it cannot be read without it."""
    return os.urandom(32)


def normalize(encryption: Any) -> Tuple[str, Any]:
    """``encryption=`` as the core takes it: ``("key", bytes)``, ``("passphrase", str)`` or
    ``("provider", obj)``."""
    if isinstance(encryption, Passphrase):
        return ("passphrase", encryption._value)
    if isinstance(encryption, (bytes, bytearray, memoryview)):
        key = bytes(encryption)
        if len(key) != 32:
            raise ValueError(f"encryption= takes a 32-byte key, and {len(key)} bytes were given (for a passphrase: "
                             "treepack.Passphrase(text); for a new key: treepack.generate_encryption_key())")
        return ("key", key)
    if isinstance(encryption, str):
        raise TypeError("encryption= does not take a str: pass treepack.Passphrase(text) for a passphrase, or a "
                        "32-byte key")
    if callable(getattr(encryption, "wrap_key", None)) and callable(getattr(encryption, "unwrap_key", None)):
        return ("provider", encryption)
    raise TypeError(f"encryption= takes 32 bytes, a treepack.Passphrase or a key provider (with wrap_key and "
                    f"unwrap_key), not {type(encryption).__name__}")


class Keyed(dict):
    """Storage options that carry the key of an encrypted tree: passed on wherever storage
    options go (integrations included), and turned into the core's form by :func:`core_options`.
    The key never shows in ``repr``."""

    __slots__ = ("key",)


def keyed(storage_options: Optional[Mapping[str, Any]], encryption: Any) -> Optional[Mapping[str, Any]]:
    """``storage_options`` carrying ``encryption`` (unchanged when it is ``None``)."""
    if encryption is None:
        return storage_options
    out = Keyed(storage_options or {})
    out.key = normalize(encryption)
    return out


def unkeyed(storage_options: Optional[Mapping[str, Any]]) -> Optional[Mapping[str, Any]]:
    """``storage_options`` without a key (for what is written beside a tree, or the other side
    of a copy)."""
    if isinstance(storage_options, Keyed):
        return dict(storage_options) or None
    return storage_options


def core_options(storage_options: Optional[Mapping[str, Any]]) -> Any:
    """Storage options as the core takes them: a dict of strings, or ``(dict, key)``."""
    if storage_options is None:
        return None
    d = {str(k): (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in storage_options.items()}
    if isinstance(storage_options, Keyed):
        return (d or None, storage_options.key)
    return d
