"""Issue 53, accelerators: loading a checkpoint onto a GPU — treepack against safetensors, with
the host-to-device bandwidth measured in the same run as the limit.

    .venv/bin/python bench/gpu_load_bench.py [--gib 2] [--runs 3] [--device cuda] [--out FILE]

Prepared for a session lent a GPU machine (one script, run once): it writes a float16/bfloat16
checkpoint of `--gib` GiB as a treepack directory and a safetensors file, then in fresh
processes, page cache warm, times
- `treepack.load(p, map_location=DEVICE)` (tensors read as views of the file, each copied through
  the reused pinned buffers to the device: `_to`, `_stage_into`);
- `treepack.load(p, like=template_on_device)` (read into the device tensors of a template: rows
  read into three reused pinned buffers, each copied to the device on a stream of its own while
  the next is read; integrations/torch.py `_read_staged`);
- `safetensors.torch.load_file(f, device=DEVICE)` and `safe_open(f, "pt", device=DEVICE)`;
- fastsafetensors' loader when it is installed;
- the limit: pinned host memory copied to the device (`torch.Tensor.copy_` of pinned buffers).
Results are printed as GiB/s and written with the machine's GPU name.

Without a GPU (`torch.cuda.is_available()` false) it says so and exits 0; `--device cpu` runs
the same cases on the CPU, to check the script itself.
"""

from __future__ import annotations

import argparse
import json
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


def make(d: str, gib: float) -> tuple:
    import torch
    import safetensors.torch as sft

    import treepack

    g = torch.Generator().manual_seed(0)
    n = int(gib * (1 << 30)) // 2
    per = 64 << 20
    sd = {}
    i = 0
    while n > 0:
        k = min(per, n)
        dt = torch.float16 if i % 2 else torch.bfloat16
        sd[f"layers.{i}.weight"] = torch.randn(k, generator=g).to(dt)
        n -= k
        i += 1
    path, st = os.path.join(d, "ckpt"), os.path.join(d, "ckpt.safetensors")
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
        times = {c: [] for c in CASES}
        checks: dict = {}
        bad: list = []
        for _ in range(runs):
            for c in CASES:
                out = subprocess.run([sys.executable, "-c", CHILD, c, path, st, args.device], capture_output=True, text=True)
                if out.returncode != 0:
                    if c == "fastsafetensors" and "No module named" in out.stderr:
                        continue
                    print(f"{c}: failed\n{out.stderr[-2000:]}")
                    continue
                res = json.loads(out.stdout.strip().splitlines()[-1])
                checks.setdefault(c, res["check"])
                if res["check"] != checks[CASES[0]] and CASES[0] in checks:
                    print(f"{c}: MISMATCH: what it loaded differs from {CASES[0]}'s")
                    bad.append(c)
                times[c].append(res["seconds"])
                nbytes = res["bytes"]
        print(f"\n{name}, {gib} GiB, medians of {runs}:")
        for c in CASES:
            if times[c]:
                m = statistics.median(times[c])
                print(f"  {c:16} {m * 1000:8.1f} ms  {nbytes / m / (1 << 30):6.2f} GiB/s")
                results.append({"case": c, "seconds": m, "gib_s": nbytes / m / (1 << 30)})
    report.write("gpu-load", args, runs, results, device=name, gib=gib)
    if bad:
        sys.exit(f"cases that loaded different values: {', '.join(sorted(set(bad)))}")


if __name__ == "__main__":
    main()
