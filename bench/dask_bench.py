"""W10: a Dask array written and read through a 2-worker LocalCluster (issue 30) — treepack
against dask.array.to_zarr / from_zarr (Zarr v3) and plain np.save / np.load per block.

    .venv/bin/python bench/dask_bench.py [--quick] [--runs N] [--out bench/results/dask-….json]

The array: float32 random values, 4 GiB in 64 MiB blocks (--quick: 256 MiB in 16 MiB blocks),
persisted in the two worker processes (one thread each, on 127.0.0.1) before any clock starts,
so writes time the writing only. Reads time `.sum().compute()` over the whole array read back
lazily. Medians of the runs, peers interleaved run by run, every file on local disk.

- write: treepack (durable: fsync), treepack-nosync, treepack-zstd (compression="zstd", no
  fsync), zarr (Zarr v3 default codecs: zstd), zarr-raw (compressors=None), npsave (each
  worker writes each block with np.save: the engine's own limit);
- read: treepack (hashes verified), treepack-zstd, zarr, zarr-raw, npload.
Like for like: treepack-nosync against zarr-raw (no compression, no fsync), treepack-zstd
against zarr.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import numpy as np

import report


def np_write(block, block_info=None, *, root):
    loc = block_info[0]["chunk-location"]
    np.save(os.path.join(root, "_".join(map(str, loc)) + ".npy"), block)
    return np.zeros((1,) * block.ndim, dtype=np.int8)


def np_read(_, block_info=None, *, root):
    loc = block_info[None]["chunk-location"]
    return np.load(os.path.join(root, "_".join(map(str, loc)) + ".npy"))


def make_blocks(shape, chunks):
    import dask.array as da

    z = da.zeros(shape, chunks=chunks, dtype=np.float32)

    def fill(b, block_info=None):
        loc = block_info[0]["chunk-location"]
        rng = np.random.default_rng(1 + loc[0] * 1000 + loc[1])
        return rng.random(b.shape, dtype=np.float32)

    return z.map_blocks(fill, dtype=np.float32)


def write(peer, x, path):
    import dask.array as da

    import treepack

    if peer == "treepack":
        treepack.save({"x": x}, path)
    elif peer == "treepack-nosync":
        treepack.save({"x": x}, path, durable=False)
    elif peer == "treepack-zstd":
        treepack.save({"x": x}, path, durable=False, compression="zstd")
    elif peer == "zarr":
        da.to_zarr(x, path)
    elif peer == "zarr-raw":
        da.to_zarr(x, path, compressors=None)
    elif peer == "npsave":
        os.makedirs(path)
        x.map_blocks(np_write, root=path, dtype=np.int8, chunks=tuple((1,) * len(c) for c in x.chunks)).compute()


def read(peer, path, like):
    import dask.array as da

    import treepack

    if peer.startswith("treepack"):
        return treepack.open(path)["x"].to_dask(chunks=like.chunks).sum().compute()
    if peer.startswith("zarr"):
        return da.from_zarr(path).sum().compute()
    return like.map_blocks(np_read, root=path, dtype=np.float32).sum().compute()


WRITE = ["treepack", "treepack-nosync", "treepack-zstd", "zarr", "zarr-raw", "npsave"]
#: reader -> the writer whose files it reads.
READ = {"treepack": "treepack-nosync", "treepack-zstd": "treepack-zstd", "zarr": "zarr", "zarr-raw": "zarr-raw",
        "npload": "npsave"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int, default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    runs = args.runs or (1 if args.quick else 3)
    import dask
    import distributed

    rows, cols, block_rows = (4096, 16384, 1024) if args.quick else (65536, 16384, 1024)
    d = tempfile.mkdtemp(prefix="treepack-dask-bench-")
    w = {p: [] for p in WRITE}
    r = {p: [] for p in READ}
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None, silence_logs=40) as cluster, distributed.Client(cluster):
        x = make_blocks((rows, cols), (block_rows, cols)).persist()
        distributed.wait(x)
        total = x.nbytes
        want = float(x.sum().compute())
        try:
            for run in range(runs + 1):  # run 0: warm-up (and the sum check)
                for peer in WRITE:
                    path = os.path.join(d, peer)
                    t = time.perf_counter()
                    write(peer, x, path)
                    if run:
                        w[peer].append(time.perf_counter() - t)
                    # Read what this peer wrote, then remove it: one copy on disk at a time.
                    for reader in [k for k, v in READ.items() if v == peer]:
                        t = time.perf_counter()
                        got = float(read(reader, path, x))
                        if run:
                            r[reader].append(time.perf_counter() - t)
                        elif abs(got - want) > 1e-3 * abs(want):
                            raise SystemExit(f"read {reader}: sum {got} != {want}")
                    shutil.rmtree(path, ignore_errors=True)
                print(f"run {run} done", flush=True)
        finally:
            shutil.rmtree(d, ignore_errors=True)
    results = []
    for op, table in (("write", w), ("read", r)):
        for peer, s in table.items():
            med = statistics.median(s)
            results.append({"op": op, "peer": peer, "wall_median_s": med, "gib_per_s": total / med / 2**30, "runs": len(s)})
            print(f"{op:5s} {peer:16s} {med*1000:9.1f} ms  {total / med / 2**30:6.2f} GiB/s", flush=True)
    import zarr

    report.write("dask", args, runs, results, bytes=total, block_bytes=block_rows * cols * 4, dask=dask.__version__,
                 zarr=zarr.__version__, workers=2)


if __name__ == "__main__":
    main()
