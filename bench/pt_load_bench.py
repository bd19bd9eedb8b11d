"""Loading another tool's checkpoint of GPT-2 124M (random init from its config, no download)
through treepack against the tool's own loader, each load in a fresh process, the peers
alternating, medians reported (issue 54's benchmark; results in bench/RESULTS.md):

- `pytorch_model.bin` (torch.save): treepack (read without pickle) vs torch.load(weights_only=True)
  and torch.load(mmap=True, weights_only=True);
- `model.safetensors`: treepack vs safetensors.torch.load_file;
- a `save_pretrained` folder of 8 safetensors shards (55 MB each at most) and its index: treepack vs load_file of each
  shard;
- converting `pytorch_model.bin` to a `.tpk` and to safetensors with `treepack.convert` vs
  `torch.load` + safetensors' `save_file`.

Lazy loaders (mmap: torch's, safetensors' `load_file`, `treepack.load(mmap=True)`) touch every
tensor's last element, so that every peer has its tensors' pages mapped when the clock stops;
treepack's default load and torch.load copy the bytes.

    .venv/bin/python bench/pt_load_bench.py [--runs 5] [--dir DIR]
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import sys, time, glob, os
import torch
path, peer = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
if peer == "treepack":
    import treepack
    sd = treepack.load(path)
elif peer == "treepack-mmap":
    import treepack
    sd = treepack.load(path, mmap=True)
elif peer == "torch-mmap":
    sd = torch.load(path, mmap=True, weights_only=True)
elif peer == "torch":
    sd = torch.load(path, weights_only=True)
else:
    from safetensors.torch import load_file
    files = sorted(glob.glob(os.path.join(path, "*.safetensors"))) if os.path.isdir(path) else [path]
    sd = {}
    for f in files:
        sd.update(load_file(f))
if peer in ("torch-mmap", "load_file", "treepack-mmap"):
    sum(float(t.view(-1)[-1]) for t in sd.values() if t.numel())  # touch every tensor's last page
print(time.perf_counter() - t0, sum(t.numel() for t in sd.values()))
"""


CONVERT = r"""
import sys, time, os
import torch
src, peer, out = sys.argv[1], sys.argv[2], sys.argv[3]
t0 = time.perf_counter()
if peer == "torch.load+save_file":
    from safetensors.torch import save_file
    sd = torch.load(src, weights_only=True)
    seen = set()
    # safetensors refuses tensors that share memory: the tied copy is left out, as
    # save_model does.
    keep = {}
    for k, v in sd.items():
        if v.untyped_storage().data_ptr() not in seen:
            seen.add(v.untyped_storage().data_ptr())
            keep[k] = v.contiguous()
    save_file(keep, out)
else:
    import treepack
    durable = peer != "treepack->tpk(durable=False)"
    kwargs = {} if out.endswith(".safetensors") else {"durable": durable}
    treepack.convert(src, out, overwrite=True, **kwargs)
print(time.perf_counter() - t0)
"""


def convert_cases(bin_: str, d: str, runs: int) -> None:
    """Converting the checkpoint: to a treepack .tpk (durable, and not) and to safetensors, by
    treepack (read without pickle), against torch.load + safetensors' save_file."""
    peers = [("torch.load+save_file", "peer.safetensors"), ("treepack->safetensors", "tp.safetensors"),
             ("treepack->tpk", "tp.tpk"), ("treepack->tpk(durable=False)", "tp2.tpk")]
    times = {k: [] for k, _ in peers}
    for _ in range(runs):
        for peer, name in peers:
            out = subprocess.run([sys.executable, "-c", CONVERT, bin_, peer, os.path.join(d, name)],
                                 capture_output=True, text=True, check=True)
            times[peer].append(float(out.stdout.split()[-1]))
    size = os.path.getsize(bin_)
    base = statistics.median(times[peers[0][0]])
    print(f"converting GPT-2 pytorch_model.bin ({size / 2**20:.0f} MiB); medians of {runs} fresh processes")
    for peer, _ in peers:
        m = statistics.median(times[peer])
        print(f"  {peer:28s} {m * 1e3:8.1f} ms  {peers[0][0]} time / this: {base / m:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    import torch
    import transformers
    from safetensors.torch import save_file

    d = args.dir or tempfile.mkdtemp()
    bin_, st, sharded = (os.path.join(d, n) for n in ("pytorch_model.bin", "model.safetensors", "sharded"))
    if not all(os.path.exists(p) for p in (bin_, st, sharded)):
        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config())
        torch.save(model.state_dict(), bin_)
        save_file({k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}, st,
                  metadata={"format": "pt"})
        model.save_pretrained(sharded, max_shard_size="55MB")  # 8 shards, as the issue asks
    cases = [
        ("GPT-2 pytorch_model.bin", bin_, ["torch", "torch-mmap", "treepack", "treepack-mmap"]),
        ("GPT-2 model.safetensors", st, ["load_file", "treepack", "treepack-mmap"]),
        (f"GPT-2 in {len([f for f in os.listdir(sharded) if f.endswith('.safetensors')])} safetensors shards", sharded,
         ["load_file", "treepack", "treepack-mmap"]),
    ]
    for title, path, peers in cases:
        size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)) if os.path.isdir(path) \
            else os.path.getsize(path)
        times = {k: [] for k in peers}
        for _ in range(args.runs):
            for peer in peers:
                out = subprocess.run([sys.executable, "-c", CHILD, path, peer], capture_output=True, text=True,
                                     check=True)
                t, n = out.stdout.split()
                times[peer].append(float(t))
        base = statistics.median(times[peers[0]])
        print(f"{title}, {size / 2**20:.0f} MiB, {n} parameters; medians of {args.runs} fresh processes")
        for peer in peers:
            m = statistics.median(times[peer])
            print(f"  {peer:11s} {m * 1e3:8.1f} ms  {size / m / 2**30:5.2f} GiB/s  {peers[0]} time / this: {base / m:.2f}x")
    convert_cases(bin_, d, args.runs)


if __name__ == "__main__":
    main()
