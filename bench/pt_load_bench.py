"""Loading a torch.save checkpoint (a GPT-2 124M state_dict, random init from its config, no
download) through treepack (read without pickle) against torch.load(weights_only=True) and
torch.load(mmap=True, weights_only=True): each load in a fresh process, the peers alternating,
medians reported (issue 54's benchmark; results in bench/RESULTS.md).

    .venv/bin/python bench/pt_load_bench.py [--runs 5] [--dir DIR]
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import sys, time
import torch
t0 = time.perf_counter()
if sys.argv[2] == "treepack":
    import treepack
    sd = treepack.load(sys.argv[1])
elif sys.argv[2] == "torch-mmap":
    sd = torch.load(sys.argv[1], mmap=True, weights_only=True)
    sum(float(t.view(-1)[-1]) for t in sd.values())  # touch every tensor's last page
else:
    sd = torch.load(sys.argv[1], weights_only=True)
print(time.perf_counter() - t0, sum(t.numel() for t in sd.values()))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    import torch
    import transformers

    d = args.dir or tempfile.mkdtemp()
    p = os.path.join(d, "pytorch_model.bin")
    if not os.path.exists(p):
        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config())
        torch.save(model.state_dict(), p)
    size = os.path.getsize(p)
    peers = ["torch", "torch-mmap", "treepack"]
    times = {k: [] for k in peers}
    for _ in range(args.runs):
        for peer in peers:
            out = subprocess.run([sys.executable, "-c", CHILD, p, peer], capture_output=True, text=True, check=True)
            t, n = out.stdout.split()
            times[peer].append(float(t))
    base = statistics.median(times["torch"])
    print(f"GPT-2 state_dict, {size / 2**20:.0f} MiB, {n} parameters; medians of {args.runs} fresh processes")
    for peer in peers:
        m = statistics.median(times[peer])
        print(f"  {peer:11s} {m * 1e3:8.1f} ms  {size / m / 2**30:5.2f} GiB/s  torch.load time / this: {base / m:.2f}x")


if __name__ == "__main__":
    main()
