"""Issue 53, accelerators: loading a checkpoint onto a GPU — treepack against safetensors, with
the host-to-device bandwidth measured in the same run as the limit.

    .venv/bin/python bench/gpu_load_bench.py [--gib 2] [--runs 3] [--device cuda] [--out FILE]

Prepared for a session lent a GPU machine (one script, run once): it writes a float16/bfloat16
checkpoint of `--gib` GiB as a treepack directory and a safetensors file, then in fresh
processes, page cache warm, times
- `treepack.load(p, map_location=DEVICE)` (tensors read as views of the file, each copied into
  the next free bytes of three reused pinned buffers and on to the device while the load goes on
  with the next tensor: integrations/torch/staging.py `Stager`);
- `treepack.load(p, like=template_on_device)` (read into the device tensors of a template: rows
  read into the same reused pinned buffers, each piece copied to the device while the next is
  read; integrations/torch/staging.py `read_staged`);
- `safetensors.torch.load_file(f, device=DEVICE)` and `safe_open(f, "pt", device=DEVICE)`;
- fastsafetensors' loader when it is installed;
- the limit: pinned host memory copied to the device (`torch.Tensor.copy_` of pinned buffers);
- where JAX runs on the device, the same checkpoint onto it in processes without torch:
  `treepack.load(p, like={k: ShapeDtypeStruct(..., sharding=the device)})` (each array read
  into three reused host buffers registered for DMA and put on the device while the next is read;
  integrations/jax/staging.py), a plain `treepack.load(p)` of the same arrays saved as
  `jax.Array`s, with the device as JAX's default (the file mapped, each array copied into those
  buffers and on to the device: `staging.Stager`), `safetensors.flax.load_file`, Orbax's
  `StandardCheckpointer().restore` of an Orbax checkpoint of the same tensors, and the limit:
  `jax.device_put` of arrays already in pinned host memory (libraries imported outside the
  clock there: Orbax's import takes longer than some loads).
The checkpoint's tensors are of 32 and 96 MiB, below and above the 64 MiB staging buffers. A
second checkpoint, a quarter of the size, holds a model's many small tensors (1.1 to 4.5 MiB, as
GPT-2's): the torch cases marked `@model` load it (where copies of one tensor cannot overlap the
read of the same tensor, only of the next).
Results are printed as GiB/s and written with the machine's GPU name.

Without a GPU (`torch.cuda.is_available()` false) it says so and exits 0; `--device cpu` runs
the same cases on the CPU, to check the script itself.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

import report

CHILD = r"""
import json, sys, time, torch
case, path, st, device = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
torch.zeros(1, device=device); sync()  # the device's context, outside the clock
t0 = time.perf_counter()
if case == "treepack":
    import treepack
    out = treepack.load(path, map_location=device)
elif case == "treepack-like":
    import treepack
    import safetensors.torch as sft
    meta = sft.load_file(st, device="cpu")
    like = {k: torch.empty_like(v, device=device) for k, v in meta.items()}
    sync(); t0 = time.perf_counter()
    out = treepack.load(path, like=like)
elif case == "safetensors":
    import safetensors.torch as sft
    out = sft.load_file(st, device=device)
elif case == "safe_open":
    from safetensors import safe_open
    out = {}
    with safe_open(st, "pt", device=device) as f:
        for k in f.keys():
            out[k] = f.get_tensor(k)
elif case == "fastsafetensors":
    from fastsafetensors import SafeTensorsFileLoader, SingleGroup
    loader = SafeTensorsFileLoader(SingleGroup(), device)
    loader.add_filenames({0: [st]})
    fb = loader.copy_files_to_device()
    out = {k: fb.get_tensor(k) for k in fb.key_to_rank_lidx}
elif case == "h2d-limit":
    import safetensors.torch as sft
    host = {k: v.pin_memory() if device.startswith("cuda") else v for k, v in sft.load_file(st, device="cpu").items()}
    dev = {k: torch.empty_like(v, device=device) for k, v in host.items()}
    sync(); t0 = time.perf_counter()
    for k, v in host.items():
        dev[k].copy_(v, non_blocking=True)
    out = dev
sync()
dt = time.perf_counter() - t0
n = sum(v.numel() * v.element_size() for v in out.values())
assert all(str(v.device).startswith(device) for v in out.values()), "a tensor is not on the device"
# What was loaded, outside the clock: every case must give the same sums, in the same key order.
check = [float(out[k].double().sum()) for k in sorted(out)]
print(json.dumps({"case": case, "seconds": dt, "bytes": n, "check": check}))
"""

CASES = ["h2d-limit", "treepack", "treepack-like", "safetensors", "safe_open", "fastsafetensors"]
# The cases run on the checkpoint of small tensors too.
MODEL_CASES = ["h2d-limit", "treepack", "treepack-like", "safetensors"]

# The same checkpoint onto a JAX device, in processes that import JAX and not torch.
JAX_CHILD = r"""
import json, sys, time
import numpy as np
import jax
from jax.sharding import SingleDeviceSharding
case, path, st, platform, index, orbax_dir, jax_path = sys.argv[1:8]
dev = jax.devices(platform)[int(index)]
on = SingleDeviceSharding(dev)
jax.device_put(np.zeros(1), on).block_until_ready()  # the device's context, outside the clock
from safetensors import safe_open
dtypes = {"BF16": jax.numpy.bfloat16, "F16": jax.numpy.float16, "F32": jax.numpy.float32}
with safe_open(st, "numpy") as f:
    meta = {k: (tuple(f.get_slice(k).get_shape()), dtypes[f.get_slice(k).get_dtype()]) for k in f.keys()}
like = {k: jax.ShapeDtypeStruct(shape, dt, sharding=on) for k, (shape, dt) in meta.items()}
if case == "jax-h2d-limit":
    import safetensors.flax as sfx
    pinned = SingleDeviceSharding(dev, memory_kind="pinned_host")
    with jax.default_device(jax.devices("cpu")[0]):
        host = {k: jax.device_put(np.asarray(v), pinned) for k, v in sfx.load_file(st).items()}
    jax.block_until_ready(host)
# Every library imported, and Orbax's checkpointer made, outside the clock (Orbax's import alone
# takes longer than some loads).
if case in ("jax-treepack", "jax-treepack-plain"):
    import treepack
elif case == "jax-safetensors":
    import safetensors.flax as sfx
elif case == "jax-orbax":
    import orbax.checkpoint as ocp
    ckptr = ocp.StandardCheckpointer()
t0 = time.perf_counter()
if case == "jax-treepack":
    out = treepack.load(path, like=like)
elif case == "jax-treepack-plain":
    out = treepack.load(jax_path)  # (onto the default device: the first, `dev` when index is 0)
elif case == "jax-safetensors":
    with jax.default_device(dev):
        out = sfx.load_file(st)
elif case == "jax-orbax":
    out = ckptr.restore(orbax_dir, like)
elif case == "jax-h2d-limit":
    out = {k: jax.device_put(v, on) for k, v in host.items()}
jax.block_until_ready(out)
dt = time.perf_counter() - t0
n = sum(v.size * v.dtype.itemsize for v in out.values())
assert all(v.devices() == {dev} for v in out.values()), "an array is not on the device"
check = [float(np.asarray(out[k]).astype(np.float64).sum()) for k in sorted(out)]
print(json.dumps({"case": case, "seconds": dt, "bytes": n, "check": check}))
"""

JAX_CASES = ["jax-h2d-limit", "jax-treepack", "jax-treepack-plain", "jax-safetensors", "jax-orbax"]

# The same tensors as a treepack tree of jax.Arrays (for the plain load), and as an Orbax
# checkpoint (written on the CPU: the parent holds no device).
JAX_WRITE = r"""
import sys
import jax
import safetensors.flax as sfx
import treepack
arrays = sfx.load_file(sys.argv[1])
treepack.save(arrays, sys.argv[3])
import orbax.checkpoint as ocp
ckptr = ocp.StandardCheckpointer()
ckptr.save(sys.argv[2], arrays)
ckptr.wait_until_finished()
"""


def jax_platform(device: str) -> str:
    """The JAX platform for ``--device`` (cuda -> gpu), or "" when JAX cannot run there."""
    want = "gpu" if device.startswith("cuda") else device
    probe = subprocess.run([sys.executable, "-c", f"import jax; jax.devices({want!r})"], capture_output=True, text=True)
    return want if probe.returncode == 0 else ""


def make(d: str, gib: float, name: str = "ckpt", sizes: tuple = (16 << 20, 48 << 20)) -> tuple:
    """A checkpoint of ``gib`` GiB of 2-byte floats in tensors of ``sizes`` elements in turn
    (by default 32 and 96 MiB, as a big transformer's attention and MLP weights: below and above
    the staging buffers' 64 MiB), as a treepack directory and a safetensors file."""
    import torch
    import safetensors.torch as sft

    import treepack

    g = torch.Generator().manual_seed(0)
    n = int(gib * (1 << 30)) // 2
    sd = {}
    i = 0
    while n > 0:
        k = min(sizes[(i // 2) % 2], n)
        dt = torch.float16 if i % 2 else torch.bfloat16
        sd[f"layers.{i}.weight"] = torch.randn(k, generator=g).to(dt)
        n -= k
        i += 1
    path, st = os.path.join(d, name), os.path.join(d, name + ".safetensors")
    treepack.save(sd, path)
    sft.save_file(sd, st)
    return path, st


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="0.25 GiB, 1 run")
    ap.add_argument("--out")
    args = ap.parse_args()
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no GPU here (torch.cuda.is_available() is false): nothing measured; run this on a GPU machine")
        return
    gib, runs = (0.25, 1) if args.quick else (args.gib, args.runs)
    name = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu"
    results = []
    with tempfile.TemporaryDirectory() as d:
        path, st = make(d, gib)
        # GPT-2's: 768 x 768 (attention out), 768 x 2304 (qkv), 768 x 3072 and 3072 x 768 (MLP).
        model = make(d, gib / 4, "model", (768 * 768, 768 * 2304, 768 * 3072, 768 * 3072))
        platform = jax_platform(args.device)
        orbax_dir, jax_path = os.path.join(d, "orbax"), os.path.join(d, "jax-ckpt")
        cases = list(CASES)
        if platform:
            cases += JAX_CASES
            if (args.device.partition(":")[2] or "0") != "0":
                cases.remove("jax-treepack-plain")  # (a plain load goes to the first device)
            env = {**os.environ, "JAX_PLATFORMS": "cpu"}
            w = subprocess.run([sys.executable, "-c", JAX_WRITE, st, orbax_dir, jax_path], capture_output=True, text=True,
                               env=env)
            if w.returncode != 0:
                print(f"no Orbax checkpoint (jax-orbax left out):\n{w.stderr[-1000:]}")
                cases.remove("jax-orbax")
                if not os.path.exists(jax_path):
                    cases.remove("jax-treepack-plain")
        else:
            print(f"JAX cannot use {args.device} here: its cases are left out")
        cases += [c + "@model" for c in MODEL_CASES]
        times = {c: [] for c in cases}
        checks: dict = {}
        bad: list = []
        nbytes: dict = {}
        for _ in range(runs):
            for c in cases:
                if c.startswith("jax-"):
                    index = args.device.partition(":")[2] or "0"
                    cmd = [sys.executable, "-c", JAX_CHILD, c, path, st, platform, index, orbax_dir, jax_path]
                elif c.endswith("@model"):
                    cmd = [sys.executable, "-c", CHILD, c.partition("@")[0], *model, args.device]
                else:
                    cmd = [sys.executable, "-c", CHILD, c, path, st, args.device]
                out = subprocess.run(cmd, capture_output=True, text=True)
                if out.returncode != 0:
                    if c == "fastsafetensors" and "No module named" in out.stderr:
                        continue
                    print(f"{c}: failed\n{out.stderr[-2000:]}")
                    continue
                res = json.loads(out.stdout.strip().splitlines()[-1])
                # Every case must load the same values as the first case on its checkpoint
                # (sums in float64, each case's way: equal to a part in 10^9).
                first = "h2d-limit@model" if c.endswith("@model") else cases[0]
                ref = checks.setdefault(first, res["check"])
                if len(ref) != len(res["check"]) or not all(
                        math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6) for a, b in zip(ref, res["check"])):
                    print(f"{c}: MISMATCH: what it loaded differs from {first}'s")
                    bad.append(c)
                times[c].append(res["seconds"])
                nbytes[c] = res["bytes"]
        print(f"\n{name}, {gib} GiB, medians of {runs}:")
        for c in cases:
            if times[c]:
                m = statistics.median(times[c])
                print(f"  {c:22} {m * 1000:8.1f} ms  {nbytes[c] / m / (1 << 30):6.2f} GiB/s")
                results.append({"case": c, "seconds": m, "gib_s": nbytes[c] / m / (1 << 30)})
    report.write("gpu-load", args, runs, results, device=name, gib=gib)
    if bad:
        sys.exit(f"cases that loaded different values: {', '.join(sorted(set(bad)))}")


if __name__ == "__main__":
    main()
