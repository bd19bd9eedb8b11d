"""W12: a PyTorch checkpoint (issue 29) — treepack against torch.save / torch.load and safetensors.

    .venv/bin/python bench/torch_bench.py [--quick] [--runs N] [--out bench/results/torch-….json]

Two trees, made deterministically before any clock starts:
- *model*: a ~1 GiB state_dict shaped like a 38-layer transformer (bf16 attention and MLP
  weights, fp32 embeddings, norms and biases: 534 tensors, many of them small);
- *checkpoint*: a quarter-size model (~256 MiB) with its AdamW state after one step (exp_avg,
  exp_avg_sq, step) and scalars, as `{"model", "optim", "epoch"}` — what torch.save users write.
  safetensors cannot hold the optimizer's nested dicts, so it is measured on *model* only.

Every case runs in a fresh subprocess (peak RSS is the process's high-water mark, minus what
the process held before the operation), page cache warm, medians of the runs. Loads are checked
for equality with the saved tree once per peer. treepack saves are durable by default (fsync of
every file and directory); torch.save and safetensors do not fsync, so `treepack-nosync`
(durable=False) is the like-for-like peer.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import report
from procmem import peak, rss

GiB = 1 << 30


def make_model(scale: float):
    import torch

    g = torch.Generator().manual_seed(0)
    d, layers = 1024, max(1, int(38 * scale))
    sd = {"embed.weight": torch.randn(32000 // (4 if scale < 1 else 1), d, generator=g)}
    for i in range(layers):
        p = f"layers.{i}."
        for name in ("q", "k", "v", "o"):
            sd[p + f"attn.{name}.weight"] = torch.randn(d, d, generator=g).to(torch.bfloat16)
            sd[p + f"attn.{name}.bias"] = torch.randn(d, generator=g)
        sd[p + "mlp.up.weight"] = torch.randn(4 * d, d, generator=g).to(torch.bfloat16)
        sd[p + "mlp.down.weight"] = torch.randn(d, 4 * d, generator=g).to(torch.bfloat16)
        sd[p + "mlp.up.bias"] = torch.randn(4 * d, generator=g)
        sd[p + "mlp.down.bias"] = torch.randn(d, generator=g)
        for n in ("ln1", "ln2"):
            sd[p + f"{n}.weight"] = torch.ones(d)
            sd[p + f"{n}.bias"] = torch.zeros(d)
    sd["norm.weight"] = torch.ones(d)
    import collections

    return collections.OrderedDict(sd)


def make_tree(kind: str, quick: bool):
    import torch

    if kind == "model":
        return make_model(1 / 8 if quick else 1.0)
    model = make_model(1 / 32 if quick else 1 / 4)
    params = [torch.nn.Parameter(v.float()) for v in model.values()]
    opt = torch.optim.AdamW(params, lr=1e-3)
    g = torch.Generator().manual_seed(1)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g) * 1e-3
    opt.step()
    return {"model": model, "optim": opt.state_dict(), "epoch": 3}


def tree_bytes(tree) -> int:
    import torch

    if isinstance(tree, torch.Tensor):
        return tree.numel() * tree.element_size()
    if isinstance(tree, dict):
        return sum(tree_bytes(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return sum(tree_bytes(v) for v in tree)
    return 0


def equal(a, b) -> bool:
    import torch

    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        # (safetensors sorts its keys: order is not compared)
        return isinstance(b, dict) and sorted(a) == sorted(b) and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))
    return a == b


def case(kind: str, peer: str, op: str, path: str, quick: bool, check: bool) -> dict:
    """One timed operation in this (fresh) process."""
    import torch

    import treepack

    tree = make_tree(kind, quick) if (op == "save" or check or op == "load-into") else None
    if op == "load-into":
        # The model exists (fresh, other values); the checkpoint is loaded into its tensors.
        target = make_tree(kind, quick)
        for v in target.values():
            v.zero_()
        target_ptrs = {k: v.data_ptr() for k, v in target.items()}
    import safetensors.torch as st

    base_rss = rss()
    os.sched_yield()
    t0 = time.perf_counter()
    out = None
    if op == "save":
        if peer == "treepack":
            treepack.save(tree, path)
        elif peer == "treepack-nosync":
            treepack.save(tree, path, durable=False)
        elif peer == "torch":
            torch.save(tree, path)
        elif peer == "safetensors":
            st.save_file(tree, path)
    elif op == "load":
        if peer in ("treepack", "treepack-nosync"):
            out = treepack.load(path)
        elif peer == "treepack-noverify":
            out = treepack.load(path, verify=False)
        elif peer == "treepack-mmap":
            out = treepack.load(path, mmap=True)
        elif peer == "torch":
            out = torch.load(path, weights_only=True)
        elif peer == "torch-mmap":
            out = torch.load(path, weights_only=True, mmap=True)
        elif peer == "safetensors":
            out = st.load_file(path)
    elif op == "load-into":
        if peer in ("treepack", "treepack-noverify"):
            out = treepack.load(path, like=target, verify=peer == "treepack")
        elif peer == "torch":
            # The usual way: load, then copy into the model (load_state_dict does the copy).
            sd = torch.load(path, weights_only=True, mmap=True)
            with torch.no_grad():
                for k, v in target.items():
                    v.copy_(sd[k])
            out = target
        elif peer == "safetensors":
            from safetensors import safe_open

            with safe_open(path, "pt") as f, torch.no_grad():
                for k, v in target.items():
                    v.copy_(f.get_tensor(k))
            out = target
    wall = time.perf_counter() - t0
    res = {"wall": wall, "rss_peak_extra": max(0, peak() - base_rss), "bytes": tree_bytes(tree) if tree is not None else None}
    if op == "load-into" and peer == "treepack":
        res["in_place"] = all(out[k].data_ptr() == p for k, p in target_ptrs.items())
    if check and out is not None:
        want = {k: v for k, v in tree.items()} if isinstance(tree, dict) else tree
        got = out
        if peer == "safetensors" and op == "load":
            want = dict(tree)
        res["equal"] = equal(want, dict(got) if isinstance(got, dict) and not isinstance(tree, dict) else got)
    return res


PLAN = [
    # (tree, op, peers)
    ("model", "save", ["treepack", "treepack-nosync", "torch", "safetensors"]),
    ("model", "load", ["treepack", "treepack-noverify", "treepack-mmap", "torch", "torch-mmap", "safetensors"]),
    ("model", "load-into", ["treepack", "treepack-noverify", "torch", "safetensors"]),
    ("checkpoint", "save", ["treepack", "treepack-nosync", "torch"]),
    ("checkpoint", "load", ["treepack", "treepack-noverify", "treepack-mmap", "torch", "torch-mmap"]),
]


def file_of(d: str, kind: str, peer: str) -> str:
    base = {"treepack-nosync": "treepack", "treepack-mmap": "treepack", "treepack-noverify": "treepack",
            "torch-mmap": "torch"}.get(peer, peer)
    ext = {"treepack": "", "torch": ".pt", "safetensors": ".safetensors"}[base]
    return os.path.join(d, f"{kind}-{base}{ext}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int, default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--ops", default=None, help="only these operations, e.g. load,load-into (their files must exist: --keep)")
    ap.add_argument("--keep", default=None, help="scratch directory to use and keep (default: a temp dir, removed)")
    ap.add_argument("--case", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        kind, peer, op, path, flags = args.case
        print(json.dumps(case(kind, peer, op, path, "q" in flags, "c" in flags)))
        return
    runs = args.runs or (1 if args.quick else 3)
    d = args.keep or tempfile.mkdtemp(prefix="treepack-torch-bench-")
    os.makedirs(d, exist_ok=True)
    ops = set(args.ops.split(",")) if args.ops else None
    results = []
    try:
        for kind, op, peers in PLAN:
            if ops is not None and op not in ops:
                continue
            samples = {p: [] for p in peers}
            notes = {}
            for r in range(runs + 1):  # run 0: warm-up (and the equality check)
                for peer in peers:
                    path = file_of(d, kind, peer)
                    if op == "save":
                        shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else (os.path.exists(path) and os.remove(path))
                    flags = ("q" if args.quick else "") + ("c" if r == 0 and op != "save" else "") + "-"
                    cmd = [sys.executable, __file__, "--case", kind, peer, op, path, flags]
                    p = subprocess.run(cmd, capture_output=True, text=True)
                    if p.returncode != 0:
                        raise SystemExit(f"{kind} {op} {peer} failed:\n{p.stderr[-3000:]}")
                    res = json.loads(p.stdout.strip().splitlines()[-1])
                    if r == 0:
                        notes[peer] = {k: res[k] for k in ("equal", "in_place", "bytes") if k in res}
                        if res.get("equal") is False:
                            raise SystemExit(f"{kind} {op} {peer}: loaded tree differs from the saved one")
                    else:
                        samples[peer].append(res)
            for peer in peers:
                s = samples[peer]
                results.append({
                    "tree": kind, "op": op, "peer": peer,
                    "wall_median_s": statistics.median(x["wall"] for x in s),
                    "rss_peak_extra_median": statistics.median(x["rss_peak_extra"] for x in s),
                    "runs": len(s), **notes.get(peer, {}),
                })
                print(f"{kind:10s} {op:9s} {peer:16s} {results[-1]['wall_median_s']*1000:9.1f} ms  "
                      f"peak +{results[-1]['rss_peak_extra_median']/2**20:8.1f} MiB  {notes.get(peer, {})}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(d, ignore_errors=True)
    sizes = {}
    for kind in ("model", "checkpoint"):
        sizes[kind] = next((r.get("bytes") for r in results if r["tree"] == kind and r.get("bytes")), None)
    import torch

    report.write("torch", args, runs, results, torch=torch.__version__, tree_bytes=sizes)


if __name__ == "__main__":
    main()
