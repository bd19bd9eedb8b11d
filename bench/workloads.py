"""The benchmark workloads: deterministic trees that bench/case.py saves and loads.

Each takes a scale (1.0 for the full run) and builds its tree before any clock starts.
"""

from __future__ import annotations

import datetime as dt

import numpy as np

def _w1_layout(scale: float, seed: int, make):
    """W1's layout: ~1 GiB (× scale) in 200 arrays of 1024 columns in nested dicts, array `i`
    (of `rows` rows) made by `make(i, rows, rng)`."""
    total = int((1 << 30) * scale)
    n = 200
    rng = np.random.default_rng(seed)
    weights = rng.uniform(0.2, 1.8, n)
    sizes = (weights / weights.sum() * total).astype(np.int64)
    tree: dict = {"layers": {}}
    for i in range(n):
        a = make(i, max(1, int(sizes[i]) // (4 * 1024)), rng)
        tree["layers"].setdefault(f"{i // 4:03d}", {})[["attn_q", "attn_o", "mlp_in", "mlp_out"][i % 4]] = a
    return tree


def w1(scale: float):
    """~1 GiB (× scale) in 200 float32 / bfloat16 arrays in nested dicts: a model checkpoint."""
    import ml_dtypes

    def make(i, rows, rng):
        base = np.arange(rows * 1024, dtype=np.float32)
        base *= np.float32(1e-3)
        base += np.float32(i)
        a = base.reshape(rows, 1024)
        return a.astype(ml_dtypes.bfloat16) if i % 2 else a

    return _w1_layout(scale, 1, make)


def w1r(scale: float):
    """W1's layout (~1 GiB × scale, 200 arrays) holding float32 weights drawn from a normal
    distribution: incompressible (zstd saves ~4 %), what `compression="auto"` must detect
    cheaply. W1 itself (arange-based values) compresses very well."""

    def make(i, rows, rng):
        a = rng.standard_normal((rows, 1024), dtype=np.float32)
        a *= np.float32(0.02)
        return a

    return _w1_layout(scale, 11, make)


def w2(scale: float):
    """100k (× scale) small leaves: ints, floats, strings and tiny arrays (optimizer state, configs)."""
    groups = max(1, int(25_000 * scale))
    return {
        "opt": {
            f"p{i}": {"step": i, "lr": 1e-3 * (i % 7), "name": f"param_{i}", "m": np.full(4, i, np.float32)}
            for i in range(groups)
        }
    }


def w3(scale: float):
    """10k (× scale) records: str, int, float, datetime, a small array and 4 KiB of bytes."""
    n = max(1, int(10_000 * scale))
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    img = bytes(range(256)) * 16
    return [
        {"id": f"call-{i}", "n": i, "score": i / 7, "ts": t0 + dt.timedelta(seconds=i), "emb": np.full(16, i, np.float32), "img": img}
        for i in range(n)
    ]


def w3i(scale: float):
    """10k (× scale) records, each holding one Pillow image: 100 distinct 64×64 RGB images
    (smooth gradients with noise, as photos are), each in 100 rows — a dataset of images as
    W&B Weave stores one (issue 26). Deterministic."""
    from PIL import Image

    n = max(1, int(10_000 * scale))
    rng = np.random.default_rng(3)
    yy, xx = np.mgrid[0:64, 0:64]
    images = []
    for i in range(100):
        base = np.stack([xx * 4 + i, yy * 4, (xx + yy) * 2 + 3 * i], -1) % 256
        images.append(Image.fromarray((base + rng.integers(0, 8, (64, 64, 3))).astype(np.uint8), "RGB"))
    return [{"id": f"row-{i}", "label": i % 10, "image": images[i % 100]} for i in range(n)]


def w7(scale: float):
    """~512 MiB (× scale) compressible checkpoint: bfloat16 weights drawn from a normal
    distribution (200 MiB), float32 Adam moments of which 70 % are zero (2 × 96 MiB), int32
    token ids below 32 000 (64 MiB) and bool masks (32 MiB), in 8 layers. Deterministic."""
    import ml_dtypes

    mib = lambda m: max(1, int((m << 20) * scale))
    rng = np.random.default_rng(7)
    tree: dict = {"params": {}, "opt": {"mu": {}, "nu": {}}, "data": {}}
    for i in range(8):
        n = mib(200) // 8 // 2
        w = (rng.standard_normal(n, np.float32) * np.float32(0.02)).astype(ml_dtypes.bfloat16)
        tree["params"][f"layer{i}"] = w.reshape(-1, 1024) if n % 1024 == 0 else w
        n = mib(96) // 8 // 4
        keep = rng.random(n) < 0.3
        g = rng.standard_normal(n, np.float32) * np.float32(1e-3)
        tree["opt"]["mu"][f"layer{i}"] = np.where(keep, g, np.float32(0))
        tree["opt"]["nu"][f"layer{i}"] = np.where(keep, g * g, np.float32(0))
    tree["data"]["tokens"] = rng.integers(0, 32_000, mib(64) // 4, dtype=np.int32).reshape(-1, 1024)
    tree["data"]["mask"] = (rng.random(mib(32)) < 0.5).reshape(-1, 1024)
    return tree


def w11(leaves: int):
    """Scalar-only trees (issue 34): traced calls as W&B Weave logs them, `leaves` leaves in all.
    Each record holds 10: a short id, a step (int), a loss (float), a flag (bool), a parent
    (None or int), a long prompt (~120 characters, distinct per record), two sampling settings
    (float, int) one dict deeper, and two short tags in a list; every 7th record nests a
    3-level `trace` dict of one more int instead of its parent. Keys repeat across records, as
    in real logs. Deterministic; only JSON types, so every peer stores the same values."""
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]
    out = []
    for i in range(max(1, leaves // 10)):
        r = {
            "id": f"call-{i:07d}",
            "step": i * 7,
            "loss": 1.0 / (i + 1),
            "ok": i % 3 != 0,
            "parent": None if i % 2 else i // 2,
            "inputs": {
                "prompt": f"Summarize document {i}: " + " ".join(words[(i + j) % 10] for j in range(16)),
                "temperature": (i % 10) / 10,
                "max_tokens": 256 + i % 512,
            },
            "tags": [words[i % 10], f"run-{i % 97}"],
        }
        if i % 7 == 0:
            del r["parent"]
            r["trace"] = {"span": {"child": {"depth": i % 5}}}
        out.append(r)
    return out


W11_SIZES = {"W11-10k": 10_000, "W11-100k": 100_000, "W11-1M": 1_000_000}
WORKLOADS = {"W1": w1, "W1r": w1r, "W2": w2, "W3": w3, "W3i": w3i, "W7": w7,
             **{name: (lambda n: lambda scale: w11(max(10, int(n * scale))))(n) for name, n in W11_SIZES.items()}}
# W11 cases time their operation several times in one process (warm cache, medians), as a
# logging loop saves and loads: a 10k-leaf tree takes milliseconds, too little for one timing.
W11_REPS = {"W11-10k": 9, "W11-100k": 7, "W11-1M": 3}
ARRAY_WORKLOADS = ("W1", "W1r", "W7")
