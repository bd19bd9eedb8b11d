"""Signed trees (docs/signing.md): ``sign``, ``verify_signature``, ``signature``,
``generate_key``, and what ``load(signed_by=)`` / ``open(signed_by=)`` check.

A signature is over the tree's root hash with its format version and metadata, so it is
checked from the manifest and the signature file alone, before any data is read. Keys are
Ed25519 or ECDSA P-256 PEM files (PKCS#8 private, SubjectPublicKeyInfo public), PEM bytes, or
objects of the ``cryptography`` package."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import _core, _encryption

KeyLike = Union[str, "os.PathLike[str]", bytes, Any]
"""A key: a path to a PEM file, the PEM text or bytes, or a ``cryptography`` key object."""


@dataclasses.dataclass(frozen=True)
class SignatureInfo:
    """A tree's signature: what it states, who signed, and whether that was checked."""

    file: str
    """The signature file (``ckpt/treepack.sig``, ``model.tpk.sig``, ``repo/signatures/NAME.sig``)."""
    name: str
    """The tree's name as the signer gave it."""
    root: str
    """The root hash signed (BLAKE3-based, 64 hex digits; ``treepack.root_hash``)."""
    format_version: Tuple[int, int]
    metadata_blake3: Optional[str]
    signed_at: _dt.datetime
    """When it was signed (UTC, whole seconds)."""
    tree_version: Optional[int]
    """The version number the signer gave the tree (what ``min_version=`` compares)."""
    algorithm: Optional[str]
    """``"ed25519"`` or ``"ecdsa-p256"``; ``None`` when the signer cannot be told."""
    fingerprint: Optional[str]
    """SHA-256 of the signer's public key PEM, 64 hex digits (model-signing's key hint)."""
    trusted: bool
    """True when checked against keys the caller trusts (``verify_signature``, ``signed_by=``);
    False from ``signature()``, which only says who the file claims signed."""
    matches_tree: bool
    mismatch: Optional[str]
    model_signing_files: Optional[int]
    """How many files' SHA-256 it lists for the model-signing verifier (``model_signing=True``)."""

    @classmethod
    def _from_json(cls, text: str) -> "SignatureInfo":
        d: Dict[str, Any] = json.loads(text)
        return cls(
            file=d["file"], name=d["name"], root=d["root"], format_version=tuple(d["format_version"]),
            metadata_blake3=d["metadata_blake3"],
            signed_at=_dt.datetime.fromtimestamp(d["signed_at_ms"] / 1000, _dt.timezone.utc),
            tree_version=d["tree_version"], algorithm=d["algorithm"], fingerprint=d["fingerprint"],
            trusted=d["trusted"], matches_tree=d["matches_tree"], mismatch=d["mismatch"],
            model_signing_files=d["model_signing_files"],
        )


def _pem(key: KeyLike, private: bool) -> Tuple[str, str]:
    """``(label, PEM text)`` of a key: a path is read (and names the key in errors)."""
    if hasattr(key, "private_bytes") or hasattr(key, "public_bytes"):
        from cryptography.hazmat.primitives import serialization as s  # a cryptography key object

        if hasattr(key, "private_bytes"):
            if not private:
                key = key.public_key()
            else:
                return "a private key object", key.private_bytes(
                    s.Encoding.PEM, s.PrivateFormat.PKCS8, s.NoEncryption()).decode("ascii")
        return "a public key object", key.public_bytes(s.Encoding.PEM, s.PublicFormat.SubjectPublicKeyInfo).decode("ascii")
    if isinstance(key, (bytes, bytearray, memoryview)):
        return "key bytes", bytes(key).decode("ascii", errors="replace")
    if isinstance(key, str) and key.lstrip().startswith("-----BEGIN "):
        return "key text", key
    if isinstance(key, (str, os.PathLike)):
        with open(key, "rb") as f:
            return os.fspath(key), f.read().decode("ascii", errors="replace")
    raise TypeError(f"a key is a PEM file's path, PEM bytes or a cryptography key, not {type(key).__name__}")


def _keys(signed_by: Union[KeyLike, Sequence[KeyLike]]) -> List[Tuple[str, str]]:
    many = isinstance(signed_by, (list, tuple, set, frozenset))
    keys = [_pem(k, False) for k in (signed_by if many else [signed_by])]
    if not keys:
        raise ValueError("signed_by= is empty: give the public key (or keys) the tree must be signed by")
    return keys


def _ms(not_before: Any) -> Optional[int]:
    """Milliseconds since the epoch of ``not_before``: a datetime (naive ones are UTC), a
    date, an ISO string, or seconds since the epoch."""
    if not_before is None:
        return None
    if isinstance(not_before, str):
        not_before = _dt.datetime.fromisoformat(not_before.replace("Z", "+00:00"))
    if isinstance(not_before, _dt.datetime):
        if not_before.tzinfo is None:
            not_before = not_before.replace(tzinfo=_dt.timezone.utc)
        return max(0, int(not_before.timestamp() * 1000))
    if isinstance(not_before, _dt.date):
        return max(0, int(_dt.datetime(not_before.year, not_before.month, not_before.day,
                                       tzinfo=_dt.timezone.utc).timestamp() * 1000))
    if isinstance(not_before, (int, float)):
        return max(0, int(not_before * 1000))
    raise TypeError(f"not_before=: a datetime, date, ISO string or seconds since the epoch, not {type(not_before).__name__}")


def _opts(storage_options: Any, encryption: Any = None) -> Any:
    return _encryption.core_options(_encryption.keyed(storage_options, encryption))


def sign(path: Any, key: KeyLike, *, tree_version: Optional[int] = None, name: Optional[str] = None,
         model_signing: bool = False, storage_options: Optional[Dict[str, str]] = None,
         encryption: Any = None) -> SignatureInfo:
    """Sign the tree at ``path`` with a private ``key``: its root hash, format version and
    metadata, as a DSSE envelope over an in-toto statement, written beside the tree
    (``ckpt/treepack.sig``, ``model.tpk.sig``, a repository's ``signatures/NAME.sig``). Reads
    only the manifest.

    - ``tree_version``: a number raised with each release, so that ``load(min_version=)``
      refuses an older signed tree put back in its place (rollback).
    - ``name``: the tree's name in the statement (default: the location's last name).
    - ``model_signing=True``: also list every file's SHA-256 as the OpenSSF model-signing
      specification does, so its verifier (P-256 keys) checks this layout's files too; reads
      every byte.
    - ``encryption``: the key of an encrypted tree, to read its manifest. The signature itself
      is stored in the clear and names the root hash (docs/encryption.md, what stays visible).
    """
    text = _core.sign(os.fspath(path), _pem(key, True), tree_version, name, model_signing,
                      _opts(storage_options, encryption))
    return SignatureInfo._from_json(text)


def verify_signature(path: Any, signed_by: Union[KeyLike, Sequence[KeyLike]], *, min_version: Optional[int] = None,
                     not_before: Any = None, storage_options: Optional[Dict[str, str]] = None,
                     encryption: Any = None) -> SignatureInfo:
    """Check that the tree at ``path`` is signed by ``signed_by`` (a public key, or a list:
    any one of them), reading its manifest and signature only. Raises ``UnsignedError``,
    ``UntrustedSignerError``, ``SignatureMismatchError`` (modified, another tree's signature,
    or older than ``min_version``/``not_before``) or ``InvalidSignatureError``."""
    text = _core.verify_signature(os.fspath(path), _keys(signed_by), min_version, _ms(not_before),
                                  _opts(storage_options, encryption))
    return SignatureInfo._from_json(text)


def signature(path: Any, *, storage_options: Optional[Dict[str, str]] = None,
              encryption: Any = None) -> Optional[SignatureInfo]:
    """The tree's signature as it states itself — who it names, whether that key made it,
    whether it holds for the tree — with nothing trusted (``trusted`` is False); ``None`` when
    unsigned. Trust needs ``verify_signature`` or ``load(signed_by=)``."""
    text = _core.signature(os.fspath(path), _opts(storage_options, encryption))
    return None if text is None else SignatureInfo._from_json(text)


def generate_key(path: Any = None, *, algorithm: str = "ed25519", overwrite: bool = False) -> Tuple[bytes, bytes]:
    """A new key pair, ``(private PEM, public PEM)``; with ``path``, also written there
    (private, mode 0600) and beside it as ``NAME.pub.pem``. ``algorithm``: ``"ed25519"`` or
    ``"ecdsa-p256"`` (the one the model-signing verifier checks)."""
    private, public, _fingerprint = _core.generate_key(algorithm)
    if path is not None:
        p = os.fspath(path)
        pub = (p[:-4] if p.endswith(".pem") else p) + ".pub.pem"
        flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if overwrite else os.O_EXCL)
        for target, text, mode in ((p, private, 0o600), (pub, public, 0o644)):
            fd = os.open(target, flags, mode)
            with os.fdopen(fd, "w") as f:
                f.write(text)
    return private.encode("ascii"), public.encode("ascii")


class Signed:
    """What a signed load requires (``load``'s ``signed_by``, ``min_version``, ``not_before``),
    keys read once: the core checks the manifest its one pass builds from, and each reader the
    load opens is checked before anything is read through it."""

    def __init__(self, signed_by: Any, min_version: Optional[int], not_before: Any) -> None:
        self.keys, self.min_version, self.not_before_ms = _keys(signed_by), min_version, _ms(not_before)

    def core_kwargs(self) -> Dict[str, Any]:
        return {"signed_by": self.keys, "min_version": self.min_version, "not_before_ms": self.not_before_ms}

    def check(self, reader: Any) -> SignatureInfo:
        return SignatureInfo._from_json(
            _core.reader_verify_signature(reader, self.keys, self.min_version, self.not_before_ms))


def check_reader(reader: Any, signed_by: Any, min_version: Optional[int], not_before: Any) -> SignatureInfo:
    """``open(signed_by=)``'s check, against the manifest the lazy view reads through."""
    return SignatureInfo._from_json(_core.reader_verify_signature(reader, _keys(signed_by), min_version, _ms(not_before)))


def no_policy_without_keys(min_version: Any, not_before: Any) -> None:
    if min_version is not None or not_before is not None:
        raise TypeError("min_version= and not_before= check a signature: pass signed_by= too")
