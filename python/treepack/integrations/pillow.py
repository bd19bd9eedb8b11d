"""Pillow images as built-in file-backed objects (``py.image``): the image's file bytes are stored
as they came (PNG, JPEG or WebP read from a file or a file object, when its pixels are still
those of the file),
otherwise the pixels as PNG — lossless either way. Loading opens the bytes with Pillow, allowing
only those three formats and keeping Pillow's decompression-bomb limit; pixels are decoded when
first used, as ``Image.open`` does. Used only when Pillow is already imported (saving) or
installed (loading): ``import treepack`` never imports it."""

from __future__ import annotations

import io
import json
import os
import sys
from typing import Any, Dict, Optional, Tuple

from .. import _plugin
from .._plugin import ForeignFileError

#: Formats a load may decode (Pillow has had CVEs in rarer decoders). docs/security.md.
FORMATS = ("PNG", "JPEG", "WEBP")


def is_image(obj: Any) -> bool:
    mod = sys.modules.get("PIL.Image")
    return mod is not None and isinstance(obj, mod.Image)


def encode(img: Any) -> Tuple[Dict[str, Any], bytes]:
    """(data, file bytes) for an image."""
    b, fmt = _source_bytes(img) or _png(img)
    return {"format": fmt, "mode": img.mode, "size": list(img.size)}, b


def _source_bytes(img: Any) -> Optional[Tuple[bytes, str]]:
    """The file the image was opened from, if its format is allowed and its pixels are unchanged:
    a path, or a file object (``Image.open(io.BytesIO(data))``, as images fetched over HTTP or
    read from archives are) that Pillow still holds, i.e. before the pixels were loaded."""
    fmt = getattr(img, "format", None)
    if fmt not in FORMATS:
        return None
    b = _file_bytes(img)
    if b is None:
        return None
    from PIL import Image

    try:
        with Image.open(io.BytesIO(b), formats=[fmt]) as again:
            same = again.mode == img.mode and again.size == img.size and again.tobytes() == img.tobytes()
    except Exception:
        return None
    return (b, fmt) if same else None


def _file_bytes(img: Any) -> Optional[bytes]:
    path = getattr(img, "filename", "")
    if isinstance(path, str) and path and os.path.isfile(path):
        with open(path, "rb") as f:
            return f.read()
    fp = getattr(img, "fp", None)
    if fp is None or not hasattr(fp, "seek") or not hasattr(fp, "read"):
        return None
    # Image.open read the image from the file object's start (it seeks to 0 first); the
    # position is put back for Pillow's lazy decoder.
    try:
        at = fp.tell()
        fp.seek(0)
        b = fp.read()
        fp.seek(at)
    except (OSError, ValueError, AttributeError):
        return None
    return b if isinstance(b, bytes) else None


def _png(img: Any) -> Tuple[bytes, str]:
    if img.width == 0 or img.height == 0:
        raise TypeError(f"an empty Pillow image ({img.width}x{img.height}) has no PNG file and cannot be stored")
    if not img.info:
        # Pixels and nothing else (no palette, transparency key, ICC profile or other info
        # Pillow would write): encoded in Rust, which is faster than Pillow's encoder.
        b = _plugin.core.encode_png(img.tobytes(), img.width, img.height, img.mode)
        if b is not None:
            return b, "PNG"
    buf = io.BytesIO()
    try:
        img.save(buf, format="PNG")
    except (OSError, ValueError) as e:
        raise TypeError(f"a Pillow image of mode {img.mode} cannot be stored losslessly as PNG ({e}); convert it first") from None
    return buf.getvalue(), "PNG"


def decode(data: Dict[str, Any], b: bytes) -> Any:
    """The image, opened lazily from its bytes."""
    try:
        from PIL import Image
    except ImportError:
        raise LookupError("loading images needs Pillow (pip install pillow)") from None
    fmt = data.get("format")
    if fmt not in FORMATS:
        raise ForeignFileError(f"image format {fmt!r} is not allowed (only {', '.join(FORMATS)})")
    try:
        return Image.open(io.BytesIO(b), formats=[fmt])
    except Image.DecompressionBombError as e:
        raise ForeignFileError(
            f"the stored {fmt} image is refused as a possible decompression bomb ({e}); if you trust the file, "
            "raise PIL.Image.MAX_IMAGE_PIXELS before loading it") from None
    except Exception as e:  # noqa: BLE001 - Pillow raises many types for damaged files
        what = "not a readable" if isinstance(e, Image.UnidentifiedImageError) else "a damaged"
        raise ForeignFileError(
            f"the stored bytes ({len(b)} bytes, starting {b[:8]!r}) are {what} {fmt} image"
            f"{'' if isinstance(e, Image.UnidentifiedImageError) else f' ({type(e).__name__}: {e})'}; "
            "the file was damaged or written by something else") from None


# ---------------------------------------------------------------- the plug-in


NAME = "py.image"


def _encode(obj: Any, where: str, memo: Any, omit_static: bool) -> Any:
    if not is_image(obj):
        return None
    try:
        data, image = encode(obj)
    except TypeError as e:
        raise _plugin.UnsupportedObjectError(where, _plugin.type_name(type(obj)), str(e)) from None
    return ("custom", NAME, json.dumps(data), [("files", {"image": image})])


def _decode(dec: Any, t: str, data: Any, kids: Dict[str, Any]) -> Any:
    found = _plugin.files_of(kids)
    if found is None or "image" not in found or not isinstance(data, dict):
        raise ValueError("py.image: the node has no image file")
    try:
        return decode(data, found["image"])
    except (LookupError, ForeignFileError) as e:
        return dec.missing(t, data, str(e), found)


_plugin.integrate(__name__, encode=_encode, nodes={NAME: _decode})
