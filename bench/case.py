"""One benchmark case, run in a fresh subprocess by bench/run.py.

    python bench/case.py WORKLOAD PEER OP DIR SCALE

Prints one JSON line: {"wall": seconds, "bytes": logical bytes moved, "rss_peak": bytes,
"read_bytes": bytes read from storage (where known), "note": ...}. Data generation and imports
happen before the clock starts; only the operation is timed.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import resource
import statistics
import sys
import threading
import time

import numpy as np

from workloads import ARRAY_WORKLOADS, W11_REPS, WORKLOADS  # bench/ is on sys.path (run as a script)


def flat(tree, prefix=""):
    """{'a/b/c': array} for the array leaves of nested dicts."""
    out = {}
    for k, v in tree.items():
        p = f"{prefix}/{k}" if prefix else str(k)
        if isinstance(v, dict):
            out.update(flat(v, p))
        else:
            out[p] = v
    return out


def as_numpy_plain(a):
    """bfloat16 has no numpy-native dtype: peers that need one get the same bytes as uint16."""
    return a.view(np.uint16) if a.dtype.name == "bfloat16" else a


def nbytes(tree) -> int:
    if isinstance(tree, np.ndarray):
        return tree.nbytes
    if hasattr(tree, "getbands") and hasattr(tree, "size"):  # a Pillow image: its pixels
        return tree.size[0] * tree.size[1] * len(tree.getbands())
    if isinstance(tree, dict):
        return sum(nbytes(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return sum(nbytes(v) for v in tree)
    if isinstance(tree, (bytes, str)):
        return len(tree)
    return 8


def largest(tree):
    f = flat(tree)
    return max(f.items(), key=lambda kv: kv[1].nbytes)


# ------------------------------------------------------------------ peers



ADAPTED = {
    ("W3", "flax-msgpack"): "adapted: datetime saved as ISO str, loaded as str",
    ("W3", "orbax"): "adapted: datetime as ISO str, bytes as uint8 array; loaded as such",
}


def adapt_records(records, bytes_as_array):
    """W3 for peers with no datetime (and, for orbax, no bytes) leaves: the closest equivalent
    tree, built before the clock starts. Loading returns the adapted leaves unconverted, which
    favours the peer slightly."""
    out = []
    for r in records:
        r = dict(r)
        r["ts"] = r["ts"].isoformat()
        if bytes_as_array:
            r["img"] = np.frombuffer(r["img"], np.uint8)
        out.append(r)
    return out


class NA(Exception):
    """This peer does not apply to this workload/operation."""


def s3_options():
    """The local moto server bench/run.py started for the `-s3` peers."""
    endpoint = os.environ.get("TREEPACK_BENCH_S3")
    if not endpoint:
        raise NA("no S3 server (bench/run.py starts moto for the W3i suite)")
    return {"endpoint": endpoint, "region": "us-east-1", "aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


def s3_url(path):
    return "s3://bench/" + os.path.basename(path)


def _boto():
    import boto3

    o = s3_options()
    return boto3.client("s3", endpoint_url=o["endpoint"], region_name=o["region"],
                        aws_access_key_id=o["aws_access_key_id"], aws_secret_access_key=o["aws_secret_access_key"])


def _png_put(peer, path):
    if peer == "png-files":
        os.makedirs(os.path.join(path, "img"), exist_ok=True)

        def put(name, data):
            with open(os.path.join(path, name), "wb") as f:
                f.write(data)
        return put
    client, prefix = _boto(), os.path.basename(path)
    return lambda name, data: client.put_object(Bucket="bench", Key=f"{prefix}/{name}", Body=data)


def _png_get(peer, path):
    if peer == "png-files":
        def get(name):
            with open(os.path.join(path, name), "rb") as f:
                return f.read()
        return get
    client, prefix = _boto(), os.path.basename(path)
    return lambda name: client.get_object(Bucket="bench", Key=f"{prefix}/{name}")["Body"].read()


def peer_save(peer, tree, path, wl):
    if peer == "treepack":
        import treepack

        # W7 is the compression workload: treepack's `auto` policy (docs/compression.md).
        treepack.save(tree, path, compression="auto" if wl == "W7" else None)
    elif peer == "treepack-tpk":
        import treepack

        treepack.save(tree, path + ".tpk", compression="auto" if wl == "W7" else None)
    elif peer == "treepack-nosync":
        # Issue 32: the same save without the fsyncs that make it survive a power cut.
        if wl not in ("W1", "W2") and not wl.startswith("W11"):
            raise NA("durability cost: W1, W2 and W11 only")
        import treepack

        treepack.save(tree, path, durable=False)
    elif peer == "treepack-lz4":
        import treepack

        treepack.save(tree, path, compression="lz4")
    elif peer == "treepack-auto":
        import treepack

        # Any workload under the `auto` policy: W1 (random weights, incompressible) and W2 (small
        # leaves, inline) measure what the policy costs where it cannot help.
        treepack.save(tree, path, compression="auto")
    elif peer == "npz-compressed":
        if wl not in ARRAY_WORKLOADS:
            raise NA("arrays only")
        np.savez_compressed(path + ".npz", **{k: as_numpy_plain(v) for k, v in flat(tree).items()})
    elif peer in ("h5py-gzip", "h5py-lzf"):
        if wl not in ARRAY_WORKLOADS:
            raise NA("arrays only")
        import h5py

        with h5py.File(path + ".h5", "w") as f:
            for k, v in flat(tree).items():
                f.create_dataset(k, data=as_numpy_plain(v), compression=peer.split("-")[1], chunks=True)
    elif peer == "zarr":
        if wl not in ARRAY_WORKLOADS:
            raise NA("arrays only")
        import zarr

        # Zarr v3 with its default codecs (zstd).
        g = zarr.open_group(path + ".zarr", mode="w")
        for k, v in flat(tree).items():
            g.create_array(k.replace("/", "."), data=as_numpy_plain(v))
    elif peer == "safetensors-zstd":
        if wl not in ARRAY_WORKLOADS:
            raise NA("flat dict of arrays only")
        # "Just compress the file": safetensors, then the zstd command line at level 3 (all cores).
        from safetensors.numpy import save_file
        import subprocess

        save_file({k: as_numpy_plain(v) for k, v in flat(tree).items()}, path + ".safetensors")
        subprocess.run(["zstd", "-q", "-3", "-T0", "--rm", "-f", path + ".safetensors", "-o", path + ".safetensors.zst"], check=True)
    elif peer == "pickle":
        with open(path, "wb") as f:
            pickle.dump(tree, f, protocol=5)
    elif peer == "pickle-fsync":
        # pickle made as durable as treepack's default (issue 32): the file and its directory
        # fsynced, so that a power cut after the save returns cannot lose it.
        if not wl.startswith("W11"):
            raise NA("durability peer: W11 only")
        with open(path, "wb") as f:
            pickle.dump(tree, f, protocol=5)
        _fsync(path)
    elif peer in ("json", "orjson", "msgpack"):
        if not wl.startswith("W11"):
            raise NA("scalar trees only")
        if peer == "json":
            data = json.dumps(tree).encode()
        elif peer == "orjson":
            import orjson

            data = orjson.dumps(tree)
        else:
            import msgpack

            data = msgpack.packb(tree)
        with open(path, "wb") as f:
            f.write(data)
    elif peer == "treepack-s3":
        import treepack

        treepack.save(tree, s3_url(path), storage_options=s3_options(), overwrite=True)
    elif peer in ("png-files", "png-files-s3"):
        # One PNG file per row and a JSON list of the rows (the pattern of a tracer that stores
        # each custom object as a file of its own).
        if wl != "W3i":
            raise NA("image datasets only")
        put = _png_put(peer, path)
        rows = []
        for i, r in enumerate(tree):
            buf = io.BytesIO()
            r["image"].save(buf, format="PNG")
            put(f"img/{i}.png", buf.getvalue())
            rows.append({"id": r["id"], "label": r["label"], "image": f"img/{i}.png"})
        put("rows.json", json.dumps(rows).encode())
    elif peer == "npz":
        if wl not in ARRAY_WORKLOADS:
            raise NA("arrays only")
        np.savez(path + ".npz", **{k: as_numpy_plain(v) for k, v in flat(tree).items()})
    elif peer == "safetensors-fsync":
        # safetensors made as durable as treepack's default: the file and its directory fsynced.
        if wl != "W1":
            raise NA("durability peer: W1 only")
        from safetensors.numpy import save_file

        save_file({k: as_numpy_plain(v) for k, v in flat(tree).items()}, path + ".safetensors")
        _fsync(path + ".safetensors")
    elif peer == "safetensors":
        if wl != "W1":
            raise NA("flat dict of arrays only")
        from safetensors.numpy import save_file

        save_file({k: as_numpy_plain(v) for k, v in flat(tree).items()}, path + ".safetensors")
    elif peer == "h5py":
        if wl != "W1":
            raise NA("arrays only")
        import h5py

        with h5py.File(path + ".h5", "w") as f:
            for k, v in flat(tree).items():
                f.create_dataset(k, data=as_numpy_plain(v))
    elif peer == "flax-msgpack":
        from flax import serialization

        with open(path + ".msgpack", "wb") as f:
            f.write(serialization.msgpack_serialize(tree))
    elif peer == "orbax":
        import orbax.checkpoint as ocp

        ckptr = ocp.PyTreeCheckpointer()
        ckptr.save(os.path.abspath(path + ".orbax"), tree)
    elif peer == "jax-ts":
        # JAX's own array saver (jax.experimental.array_serialization: one TensorStore zarr array per
        # leaf). Leaves become jax.Arrays first, as in a JAX program; only the save is timed.
        if wl != "W1":
            raise NA("jax.Array leaves only")
        import jax
        from jax.experimental.array_serialization import serialization as ser

        f = flat(tree)
        arrays = [jax.device_put(v) for v in f.values()]
        jax.block_until_ready(arrays)
        base = os.path.abspath(path + ".jaxts")
        specs = [ser.get_tensorstore_spec(os.path.join(base, k.replace("/", "."))) for k in f]
        t = time.perf_counter()
        ser.run_serialization(arrays, specs)
        return time.perf_counter() - t
    elif peer in ("raw", "raw-fsync"):
        if wl != "W1":
            raise NA("baseline for arrays")
        # One writev() of every array's bytes: a single large write of the same bytes, without
        # first copying them into one buffer (that copy doubled this process's memory, and on
        # this VM touching that much fresh memory made the write itself intermittently 10x slower).
        views = [memoryview(as_numpy_plain(a).reshape(-1).view(np.uint8)) for a in flat(tree).values()]
        t = time.perf_counter()
        fd = os.open(path + ".raw", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            while views:
                n = os.writev(fd, views)
                while views and n >= len(views[0]):
                    n -= len(views[0])
                    views.pop(0)
                if views and n:
                    views[0] = views[0][n:]
            if peer == "raw-fsync":
                os.fsync(fd)
        finally:
            os.close(fd)
        if peer == "raw-fsync":
            _fsync_dir(os.path.dirname(path + ".raw"))
        return time.perf_counter() - t  # time only the single write (the concatenation is setup)
    else:
        raise NA(f"unknown peer {peer}")
    return None


def _fsync(file):
    fd = os.open(file, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    _fsync_dir(os.path.dirname(os.path.abspath(file)))


def _fsync_dir(d):
    fd = os.open(d or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def peer_load(peer, path, wl):
    if peer in ("treepack-nosync", "safetensors-fsync", "raw-fsync", "pickle-fsync"):
        raise NA("loads as its durable/plain twin")
    if peer in ("treepack", "treepack-tpk", "treepack-lz4", "treepack-auto"):
        import treepack

        return treepack.load(path + ".tpk" if peer == "treepack-tpk" else path)
    if peer == "npz-compressed":
        with np.load(path + ".npz") as z:
            return {k: z[k] for k in z.files}
    if peer in ("h5py-gzip", "h5py-lzf"):
        import h5py

        out = {}
        with h5py.File(path + ".h5", "r") as f:
            f.visititems(lambda k, d: out.__setitem__(k, d[()]) if isinstance(d, h5py.Dataset) else None)
        return out
    if peer == "zarr":
        import zarr

        g = zarr.open_group(path + ".zarr", mode="r")
        return {k: g[k][...] for k in g.array_keys()}
    if peer == "safetensors-zstd":
        import subprocess
        from safetensors.numpy import load

        raw = subprocess.run(["zstd", "-q", "-d", "-c", path + ".safetensors.zst"], check=True, capture_output=True).stdout
        return load(raw)
    if peer == "pickle":
        with open(path, "rb") as f:
            return pickle.load(f)
    if peer in ("json", "orjson", "msgpack"):
        with open(path, "rb") as f:
            data = f.read()
        if peer == "json":
            return json.loads(data)
        if peer == "orjson":
            import orjson

            return orjson.loads(data)
        import msgpack

        return msgpack.unpackb(data)
    if peer == "treepack-s3":
        import treepack

        return treepack.load(s3_url(path), storage_options=s3_options())
    if peer in ("png-files", "png-files-s3"):
        from PIL import Image

        get = _png_get(peer, path)
        rows = json.loads(get("rows.json"))
        # Opened lazily from bytes in memory, as treepack's loads open images.
        return [{"id": r["id"], "label": r["label"], "image": Image.open(io.BytesIO(get(r["image"])))} for r in rows]
    if peer == "npz":
        with np.load(path + ".npz") as z:
            return {k: z[k] for k in z.files}
    if peer == "safetensors":
        from safetensors.numpy import load_file

        return load_file(path + ".safetensors")
    if peer == "h5py":
        import h5py

        out = {}
        with h5py.File(path + ".h5", "r") as f:
            f.visititems(lambda k, d: out.__setitem__(k, d[()]) if isinstance(d, h5py.Dataset) else None)
        return out
    if peer == "flax-msgpack":
        from flax import serialization

        with open(path + ".msgpack", "rb") as f:
            return serialization.msgpack_restore(f.read())
    if peer == "orbax":
        import orbax.checkpoint as ocp

        return ocp.PyTreeCheckpointer().restore(os.path.abspath(path + ".orbax"))
    if peer == "jax-ts":
        import jax
        from jax.experimental.array_serialization import serialization as ser

        base = os.path.abspath(path + ".jaxts")
        names = sorted(os.listdir(base))
        specs = [ser.get_tensorstore_spec(os.path.join(base, n)) for n in names]
        dev = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        arrays = ser.run_deserialization([dev] * len(specs), specs)
        return {n: np.asarray(a) for n, a in zip(names, arrays)}
    if peer == "raw":
        size = os.path.getsize(path + ".raw")
        buf = np.empty(size, np.uint8)
        with open(path + ".raw", "rb", buffering=0) as f:
            f.readinto(memoryview(buf))
        return buf
    raise NA(peer)


def peer_partial(peer, path, wl, tree_info):
    """W4: one whole leaf, and a 1% slice (leading rows) of the largest array."""
    key, rows = tree_info["largest"], tree_info["rows"]
    sl = max(1, rows // 100)
    if peer in ("treepack", "treepack-tpk"):
        import treepack

        p = path if peer == "treepack" else path + ".tpk"
        v = treepack.open(p)
        node = v
        for part in key.split("/"):
            node = node[part]
        part = node[0:sl]
        one = treepack.load(p, select=[tree_info["small"]])
        return part, one
    if peer == "safetensors":
        from safetensors import safe_open

        with safe_open(path + ".safetensors", "numpy") as f:
            return f.get_slice(key)[0:sl], f.get_tensor(tree_info["small"])
    if peer == "h5py":
        import h5py

        with h5py.File(path + ".h5", "r") as f:
            return f[key][0:sl], f[tree_info["small"]][()]
    if peer == "npz":
        with np.load(path + ".npz") as z:
            return z[key][0:sl], z[tree_info["small"]]
    raise NA("no partial read")


def treepack_chunks_needed(path, info):
    """W4's unit of reading, computed from the manifest (docs/format.md) outside the clock: the
    manifest plus every chunk the request touches (a verified read fetches whole chunks, since a
    chunk's BLAKE3 covers all of it)."""
    with open(os.path.join(path, "treepack.json"), "rb") as f:
        raw = f.read()
    manifest = json.loads(raw)

    def node(key):
        n = manifest["root"]
        for part in key.split("/"):
            n = dict((k, v) for k, v in n["items"])[part]
        return n

    def chunk_bytes(n, first_rows=None):
        if "chunks" not in n:
            return 0  # inline: in the manifest
        chunks = n["chunks"]
        if first_rows is not None:
            cs, shape = n["chunk_shape"], n["shape"]
            per_row = 1
            for dim, c in zip(shape[1:], cs[1:]):
                per_row *= -(-dim // c)
            chunks = chunks[: -(-first_rows // cs[0]) * per_row]
        return sum(c["length"] for c in chunks)

    sl = max(1, info["rows"] // 100)
    return len(raw) + chunk_bytes(node(info["largest"]), sl) + chunk_bytes(node(info["small"]))


def peer_structure(peer, path, wl):
    if peer in ("treepack", "treepack-tpk"):
        import treepack

        return treepack.load_structure(path if peer == "treepack" else path + ".tpk")
    if peer == "orbax":
        import orbax.checkpoint as ocp

        return ocp.PyTreeCheckpointer().metadata(os.path.abspath(path + ".orbax"))
    if peer == "pickle":
        # Not pickle's own feature: the same structure, pre-extracted as plain tuples and
        # pickled, so the table shows what merely building it costs this interpreter.
        with open(path + ".structure.pkl", "rb") as f:
            return pickle.load(f)
    if peer == "raw":
        # The floor for any structure read: the same containers and keys with one int per
        # leaf, unpickled (pickle's C loader is the fastest builder of Python objects at hand).
        with open(path + ".skeleton.pkl", "rb") as f:
            return pickle.load(f)
    raise NA("no structure-only read")


def prepare_structure(peer, path, scale):
    """Untimed setup for W5: pickle's structure file (path, kind, dtype, shape, nbytes per leaf),
    and raw's skeleton (the containers and keys, one distinct int per leaf)."""
    if peer == "raw" and not os.path.exists(path + ".skeleton.pkl"):
        count = iter(range(1 << 20, 1 << 40))  # ints above 256 are distinct objects

        def skeleton(x):
            if isinstance(x, dict):
                return {k: skeleton(v) for k, v in x.items()}
            if isinstance(x, (list, tuple)):
                return type(x)(skeleton(v) for v in x)
            return next(count)

        with open(path + ".skeleton.pkl", "wb") as f:
            pickle.dump(skeleton(WORKLOADS["W2"](scale)), f, protocol=5)
        return
    if peer != "pickle" or os.path.exists(path + ".structure.pkl"):
        return
    with open(path, "rb") as f:
        tree = pickle.load(f)

    def info(x, p):
        if isinstance(x, dict):
            return {k: info(v, f"{p}/{k}" if p else str(k)) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(info(v, f"{p}/{i}" if p else str(i)) for i, v in enumerate(x))
        if isinstance(x, np.ndarray):
            return (p, "array", str(x.dtype), x.shape, x.nbytes)
        return (p, type(x).__name__, None, None, 0)

    with open(path + ".structure.pkl", "wb") as f:
        pickle.dump(info(tree, ""), f, protocol=5)


def peer_mmap_touch(peer, path, wl, tree_info):
    key = tree_info["small"]
    if peer in ("treepack", "treepack-tpk"):
        import treepack

        t = treepack.load(path if peer == "treepack" else path + ".tpk", mmap=True)
        node = t
        for part in key.split("/"):
            node = node[part]
        return float(np.asarray(node, dtype=np.float32).sum())
    if peer == "safetensors":
        from safetensors import safe_open

        with safe_open(path + ".safetensors", "numpy") as f:
            return float(f.get_tensor(key).astype(np.float32).sum())
    if peer == "npz":
        with np.load(path + ".npz", mmap_mode="r") as z:  # npz cannot mmap members: reads the member
            return float(z[key].astype(np.float32).sum())
    if peer == "raw":
        # The physical limit: the touched array's bytes read with one pread() from the
        # single-write file (same page-cache state as the others).
        fd = os.open(path + ".raw", os.O_RDONLY)
        try:
            b = os.pread(fd, tree_info["small_bytes"], tree_info["small_offset"])
        finally:
            os.close(fd)
        return int(np.frombuffer(b, np.uint8).sum())
    raise NA("no mmap")


def clean_path(path):
    """Remove what a save wrote at `path` (any peer's suffix), between timed repetitions."""
    import glob
    import shutil

    for p in [path, *glob.glob(path + ".*")]:
        if os.path.isdir(p):
            shutil.rmtree(p)
        elif os.path.exists(p):
            os.remove(p)


def disk_read_bytes():
    """Bytes this process (all its threads) has caused to be fetched from storage, page faults
    of mappings and readahead included (Linux /proc/self/io); None where unavailable."""
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def preimport(peer):
    """Import a peer's modules before the clock starts: every peer is timed on its work alone."""
    import importlib

    mods = {
        "treepack": ["treepack"], "treepack-tpk": ["treepack"], "treepack-lz4": ["treepack"],
        "treepack-nosync": ["treepack"], "safetensors-fsync": ["safetensors.numpy"],
        "treepack-auto": ["treepack"], "treepack-s3": ["treepack"], "png-files": ["PIL.Image"],
        "png-files-s3": ["PIL.Image", "boto3"], "safetensors": ["safetensors.numpy"],
        "h5py": ["h5py"], "orjson": ["orjson"], "msgpack": ["msgpack"], "flax-msgpack": ["jax", "flax.serialization"],
        "orbax": ["jax", "orbax.checkpoint"], "jax-ts": ["jax", "jax.experimental.array_serialization.serialization"],
    }
    for m in mods.get(peer, []):
        try:
            importlib.import_module(m)
        except ImportError:
            pass  # the case itself reports the missing peer


def thread_cpu_ticks():
    """CPU ticks used so far by each thread of this process except the calling one."""
    me = str(threading.get_native_id())
    out = {}
    for tid in os.listdir("/proc/self/task"):
        if tid == me:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[tid] = int(fields[11]) + int(fields[12])  # utime + stime
        except (OSError, IndexError, ValueError):
            pass  # the thread ended
    return out


def settle(quiet_s=0.05, limit_s=2.0):
    """Wait (untimed) until no other thread of this process uses CPU for `quiet_s`.

    Imports leave threads busy for a while: numpy's OpenBLAS workers spin for ~0.2-0.5 s after
    `import numpy`, which on a 2-core machine takes a whole core from whatever is timed next (a
    multi-threaded manifest parse measured 47 ms instead of 31). Every peer waits the same way,
    so each is timed on its own work. Linux only; elsewhere this returns at once.
    """
    if not os.path.isdir("/proc/self/task"):
        return
    end = time.monotonic() + limit_s
    before = thread_cpu_ticks()
    while time.monotonic() < end:
        time.sleep(quiet_s)
        now = thread_cpu_ticks()
        if all(now[t] == before.get(t, now[t]) for t in now):
            return
        before = now


def main():
    wl, peer, op, d, scale = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5])
    path = os.path.join(d, f"{wl}-{peer}")
    info_path = os.path.join(d, f"{wl}-info.json")
    result = {"wall": None, "bytes": 0, "note": ""}
    io0 = None
    try:
        if op == "save":
            tree = WORKLOADS[wl](scale)
            result["bytes"] = nbytes(tree)
            if wl == "W1" and not os.path.exists(info_path):
                k, a = largest(tree)
                small = min(flat(tree).items(), key=lambda kv: kv[1].nbytes)[0]
                with open(info_path, "w") as f:
                    fl = flat(tree)
                    small_bytes = int(fl[small].nbytes)
                    keys = list(fl)
                    small_offset = int(sum(fl[k].nbytes for k in keys[: keys.index(small)]))  # in the raw file
                    json.dump(
                        {"largest": k, "rows": a.shape[0], "small": small, "small_bytes": small_bytes,
                         "small_offset": small_offset, "bytes": result["bytes"]},
                        f,
                    )
            preimport(peer)
            if (wl, peer) in ADAPTED:
                tree = adapt_records(tree, bytes_as_array=peer == "orbax")
            settle()
            walls = []
            for rep in range(W11_REPS.get(wl, 1)):
                if rep:
                    clean_path(path)
                t = time.perf_counter()
                inner = peer_save(peer, tree, path, wl)
                walls.append(inner if inner is not None else time.perf_counter() - t)
            result["wall"] = statistics.median(walls)
            if peer == "treepack" and wl == "W3i":
                # The images (the packs), apart from the manifest's 10k rows of ids and labels.
                packs = os.path.join(path, "packs")
                result["pack_bytes"] = sum(os.path.getsize(os.path.join(packs, f)) for f in os.listdir(packs))
            if peer == "png-files" and wl == "W3i":
                # The distinct images' PNG bytes (rows i and i + 100 hold the same image).
                result["distinct_bytes"] = sum(os.path.getsize(os.path.join(path, "img", f"{i}.png")) for i in range(min(100, len(tree))))
        else:
            info = json.load(open(info_path)) if os.path.exists(info_path) else {}
            if wl == "W3i":
                import PIL.Image  # noqa: F401 - every peer's rows hold images: not timed for any
            if wl in ("W1", "W1r"):
                # bfloat16 arrays need ml_dtypes whoever reads them: import it before timing,
                # like every peer's own modules (it alone takes 10-30 ms to import here).
                import ml_dtypes  # noqa: F401
            preimport(peer)
            if op == "structure":
                prepare_structure(peer, path, scale)
            settle()
            io0 = disk_read_bytes()
            t = time.perf_counter()
            if op in ("load", "warm"):  # warm: the harness leaves the file in the page cache
                out = peer_load(peer, path, wl)
                walls = [time.perf_counter() - t]
                for _ in range(W11_REPS.get(wl, 1) - 1):
                    del out
                    t = time.perf_counter()
                    out = peer_load(peer, path, wl)
                    walls.append(time.perf_counter() - t)
                result["wall"] = statistics.median(walls)
                result["bytes"] = nbytes(out)
            elif op == "partial":
                out = peer_partial(peer, path, wl, info)
                result["wall"] = time.perf_counter() - t
                result["bytes"] = nbytes(list(out))
                if peer == "treepack":
                    result["needed_bytes"] = treepack_chunks_needed(path, info)
            elif op == "structure":
                peer_structure(peer, path, wl)
                result["wall"] = time.perf_counter() - t
                if peer == "pickle":
                    result["note"] = "the same structure pre-extracted as tuples, unpickled"
                if peer == "raw":
                    result["note"] = "the same containers with one int per leaf, unpickled: the floor"
            elif op == "mmap":
                peer_mmap_touch(peer, path, wl, info)
                result["wall"] = time.perf_counter() - t
                result["bytes"] = info.get("small_bytes", 0)  # the bytes touched
                if peer == "raw":
                    result["note"] = "one pread() of the touched bytes: the physical limit"
        if op != "save" and io0 is not None and result["wall"] is not None:
            result["read_bytes"] = disk_read_bytes() - io0
        if (wl, peer) in ADAPTED and result["wall"] is not None:
            result["note"] = ADAPTED[(wl, peer)]
    except NA as e:
        result["note"] = f"n/a: {e}"
    except Exception as e:  # a peer that fails is reported, not fatal
        result["note"] = f"error: {type(e).__name__}: {str(e)[:160]}"
    result["rss_peak"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps(result))


if __name__ == "__main__":
    main()
