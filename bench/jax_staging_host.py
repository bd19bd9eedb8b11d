"""Issue 53, the host side of a JAX load onto an accelerator, measurable without one: shards read
into the reused staging buffers (integrations/jax/staging.py) with the copies to the device
replaced by nothing, against the CPU path's reads into memory of each shard's own. 1 GiB of
float32 in tensors of 32 and 96 MiB, one process, page cache warm, rounds interleaved, medians
(the first round left out). Two kinds of load: with a template (`like=`), and plain
(`treepack.load(p)` of the same arrays saved as `jax.Array`s: on an accelerator the file is mapped
and each array copied into the buffers, `staging.Stager`; on the CPU each is read into memory of
its own).

    .venv/bin/python bench/jax_staging_host.py DIR [ROUNDS]
"""
import os
import statistics
import sys
import time

import jax
import numpy as np
from jax.sharding import SingleDeviceSharding

import treepack
from treepack.integrations.jax import staging


def main() -> None:
    d = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    p = os.path.join(d, "ckpt")
    if not os.path.exists(p):
        g = np.random.default_rng(0)
        tree, n, i = {}, 1 << 30, 0
        while n > 0:
            k = min((32 << 20, 96 << 20)[(i // 2) % 2], n)
            tree[f"layers.{i}.weight"] = g.standard_normal(k // 4, dtype=np.float32)
            n -= k
            i += 1
        treepack.save(tree, p)
    pj = os.path.join(d, "ckpt-jax")
    if not os.path.exists(pj):
        treepack.save({k: jax.numpy.asarray(v) for k, v in treepack.load(p).items()}, pj)
    struct = treepack.load_structure(p)
    on = SingleDeviceSharding(jax.devices()[0])
    like = {k: jax.ShapeDtypeStruct(tuple(v.shape), np.float32, sharding=on) for k, v in struct.items()}
    # The staged path with a device that takes nothing: one array per shape stands for each copy.
    dummy: dict = {}
    real = (staging.staged, staging._put, staging._wait, staging.default_device)
    fake = (lambda s, r: True,
            lambda x, s: dummy.setdefault(x.shape, jax.device_put(np.zeros(x.shape, x.dtype), on)),
            lambda h: h, lambda: jax.devices()[0])
    nbytes = sum(v.nbytes for v in struct.values())
    times: dict = {}
    for r in range(rounds):
        for mode in ("fresh", "staged", "plain fresh", "plain staged"):
            for verify in (True, False):
                staged = mode.endswith("staged")
                staging.staged, staging._put, staging._wait, staging.default_device = fake if staged else real
                t = time.perf_counter()
                if mode.startswith("plain"):
                    out = treepack.load(pj, verify=verify)
                else:
                    out = treepack.load(p, like=like, verify=verify)
                jax.block_until_ready(out)
                dt = time.perf_counter() - t
                del out
                if r:
                    times.setdefault((mode, verify), []).append(dt)
    for (mode, verify), ts in times.items():
        m = statistics.median(ts)
        print(f"{mode:12} verify={verify!s:5} {m * 1000:7.1f} ms  {nbytes / m / 2**30:5.2f} GiB/s  "
              f"(range {min(ts) * 1000:.0f}-{max(ts) * 1000:.0f})")


if __name__ == "__main__":
    main()
