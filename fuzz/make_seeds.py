"""Write small seed inputs for the fuzz targets (run with the repo's .venv python).

Seeds are small trees that still use every storage path: chunked arrays of several dtypes,
multi-chunk arrays, blob strings/bytes, records, custom nodes, typed keys. Kept small so the
fuzzer runs fast (libFuzzer's -max_len applies to whole inputs).
"""
import dataclasses
import datetime
import os
import struct
import sys
import tempfile

import numpy as np

import treepack

HERE = os.path.dirname(os.path.abspath(__file__))


@dataclasses.dataclass
class Rec:
    a: int
    w: np.ndarray


def trees():
    yield {"w": np.arange(300, dtype=np.float32).reshape(20, 15), "b": np.ones(40, np.int8)}
    yield {"x": [1, 2.5, "s" * 5000, b"\x00" * 300, None, True, 3 + 4j, 2**70], ("t", 1): (1, 2), 7: {}}
    yield {"r": Rec(3, np.zeros((16, 8), np.uint16)), "when": datetime.datetime(2026, 1, 2), "s": {1, 2}}
    yield {"big": np.arange(5000, dtype=np.float64), "bf": np.arange(100, dtype=np.complex64)}


def body_of(manifest: bytes) -> bytes:
    return manifest[: manifest.rindex(b',\n"manifest_hash"')]


def main() -> None:
    out = {k: os.path.join(HERE, "corpus", k) for k in ("manifest", "directory", "single_file")}
    for d in out.values():
        os.makedirs(d, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for i, t in enumerate(trees()):
            d = os.path.join(tmp, f"t{i}")
            treepack.save(t, d, chunk_bytes=256)
            m = open(os.path.join(d, "treepack.json"), "rb").read()
            body = body_of(m)
            open(os.path.join(out["manifest"], f"small{i}"), "wb").write(body)
            pdir = os.path.join(d, "packs")
            packs = sorted(os.listdir(pdir)) if os.path.isdir(pdir) else []
            pack = open(os.path.join(d, "packs", packs[0]), "rb").read() if packs else b""
            open(os.path.join(out["directory"], f"small{i}"), "wb").write(struct.pack("<I", len(body)) + body + pack)
            f = os.path.join(tmp, f"t{i}.tpk")
            treepack.save(t, f, chunk_bytes=256)
            raw = open(f, "rb").read()
            open(os.path.join(out["single_file"], f"raw{i}"), "wb").write(b"\x00" + raw)
            off, ln = struct.unpack("<QQ", raw[-64:-48])
            b = body_of(raw[off : off + ln])
            open(os.path.join(out["single_file"], f"built{i}"), "wb").write(b"\x01" + struct.pack("<I", len(b)) + b + raw[:off])
    print("seeds written under", os.path.join(HERE, "corpus"), file=sys.stderr)


if __name__ == "__main__":
    main()
