"""Audio read with the standard library's ``wave`` module as built-in file-backed objects
(``py.audio``): a ``wave.Wave_read`` is stored as one WAV file (its parameters and all its
frames) in the tree's packs, deduplicated like any file; loading gives a ``Wave_read`` over those
bytes, positioned at the start. Only ``wave`` itself parses the bytes (pure Python, no codec
library). Samples held as numpy arrays need nothing of this: they are arrays."""

from __future__ import annotations

import io
import wave
from typing import Any, Dict, Tuple

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
    try:
        return wave.open(io.BytesIO(b), "rb")
    except (wave.Error, EOFError) as e:
        raise ValueError(f"{NAME}: the stored bytes are not a WAV file: {e}") from None
