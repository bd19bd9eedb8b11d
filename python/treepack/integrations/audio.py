"""Audio read with the standard library's ``wave`` module as built-in file-backed objects
(``py.audio``): a ``wave.Wave_read`` is stored as one WAV file (its parameters and all its
frames) in the tree's packs, deduplicated like any file; loading gives a ``Wave_read`` over those
bytes, positioned at the start. Only ``wave`` itself parses the bytes (pure Python, no codec
library). Samples held as numpy arrays need nothing of this: they are arrays."""

from __future__ import annotations

import io
import json
import wave
from typing import Any, Dict, Tuple

from .. import _plugin
from .._plugin import ForeignFileError

NAME = "py.audio"


def is_audio(obj: Any) -> bool:
    return type(obj) is wave.Wave_read


def encode(w: Any) -> Tuple[Dict[str, Any], bytes]:
    """(data, WAV bytes) for a reader; its position is kept."""
    at = w.tell()
    try:
        w.rewind()
        frames = w.readframes(w.getnframes())
    finally:
        w.setpos(at)
    buf = io.BytesIO()
    with wave.open(buf, "wb") as out:
        out.setnchannels(w.getnchannels())
        out.setsampwidth(w.getsampwidth())
        out.setframerate(w.getframerate())
        out.writeframes(frames)
    data = {"format": "WAV", "channels": w.getnchannels(), "sampwidth": w.getsampwidth(),
            "framerate": w.getframerate(), "nframes": w.getnframes()}
    return data, buf.getvalue()


def decode(data: Any, b: bytes) -> Any:
    """A reader over the stored WAV bytes, checked: its header must parse, and the frames its
    ``data`` chunk declares must be in the bytes."""
    try:
        w = wave.open(io.BytesIO(b), "rb")
    except Exception as e:  # noqa: BLE001 - wave raises Error, EOFError, RuntimeError, struct.error, ...
        why = str(e) or {EOFError: "a chunk is shorter than what it must hold, or the file ends inside one"}.get(
            type(e), "its header cannot be parsed")
        raise ForeignFileError(f"{NAME}: the stored bytes are not a WAV file ({len(b)} bytes): {type(e).__name__}: "
                               f"{why}; the file was damaged or written by something else") from None
    need = w.getnframes() * w.getsampwidth() * w.getnchannels()
    if need > len(b):
        w.close()
        raise ForeignFileError(f"{NAME}: the stored WAV file declares {w.getnframes()} frames ({need} bytes) but holds "
                               f"{len(b)} bytes; the file was damaged or written by something else")
    return w


# ---------------------------------------------------------------- the plug-in


def _encode(obj: Any, where: str, memo: Any, omit_static: bool) -> Any:
    if not is_audio(obj):
        return None
    data, wav = encode(obj)
    return ("custom", NAME, json.dumps(data), [("files", {"audio.wav": wav})])


def _decode(dec: Any, t: str, data: Any, kids: Dict[str, Any]) -> Any:
    found = _plugin.files_of(kids)
    if found is None or "audio.wav" not in found:
        raise ValueError(f"{NAME}: the node has no audio.wav file")
    try:
        return decode(data, found["audio.wav"])
    except ForeignFileError as e:
        return dec.missing(t, data, str(e), found)


_plugin.integrate(__name__, encode=_encode, nodes={NAME: _decode})
