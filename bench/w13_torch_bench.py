"""W13 (issue 53): a GPT-2 (124M) checkpoint loaded into torch — treepack against torch.save /
torch.load(mmap=True, weights_only=True) and safetensors save_model / load_model.

    .venv/bin/python bench/w13_torch_bench.py [--runs N] [--dir D] [--json out.json]

The model is GPT-2 small from ``transformers.GPT2Config()`` (no download), its weights drawn from
a seeded generator (built on the meta device and filled, which is quicker than transformers'
init and gives the same shapes, dtypes and tied lm_head/wte). The checkpoint is
``{"model": state_dict, "optim": AdamW state after one step}``; safetensors holds the model only,
so it is compared on the model. Every case runs in a fresh process, the cases interleaved round
by round, page cache warm; the table gives medians (and the spread) of the runs.

- *load*: the library's load; *into model*: ``model.load_state_dict`` (and the optimizer's) from
  what it gave; *total*: both (treepack ``like=`` reads straight into the model: no second step).
- *first step*, *total + step* (the checkpoint): the optimizer's first step after loading, which
  reads and writes every parameter and state tensor — where a lazily mapped load
  (``torch.load(mmap=True)``) pays its page faults and copy-on-write copies.
- *first / later*: the first treepack load in a fresh process against the mean of the next
  two in it; *after save*: the first load right after a save in the same process.

Saves of treepack are durable (fsync) by default; torch.save and safetensors do not fsync, so
``durable=False`` is the like-for-like peer.
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

HERE = os.path.dirname(os.path.abspath(__file__))

CHILD = r'''
import json, os, sys, time
import torch, transformers
case, d = sys.argv[1], sys.argv[2]

def build():
    with torch.device("meta"):
        m = transformers.GPT2LMHeadModel(transformers.GPT2Config())
    m = m.to_empty(device="cpu")
    m.tie_weights()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.02, generator=g)
    return m

def optimizer(m, step):
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    if step:
        for p in m.parameters():
            p.grad = torch.full_like(p, 1e-3)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return opt

m = build()
opt = optimizer(m, case in ("make", "load-tplike-ckpt", "load-tplikenv-ckpt"))  # like= needs the state to read into
import treepack
import safetensors.torch as st
out = {}
clock = time.perf_counter
P = os.path.join
if case == "make":
    ck = {"model": m.state_dict(), "optim": opt.state_dict()}
    treepack.save(ck, P(d, "ckpt.tp"), overwrite=True)
    treepack.save(m.state_dict(), P(d, "model.tp"), overwrite=True)
    torch.save(ck, P(d, "ckpt.pt"))
    torch.save(m.state_dict(), P(d, "model.pt"))
    st.save_model(m, P(d, "model.st"))
elif case.startswith("save-"):
    lib, what = case.split("-")[1:]
    tree = {"model": m.state_dict(), "optim": opt.state_dict()} if what == "ckpt" else m.state_dict()
    t = clock()
    if lib == "tp":
        treepack.save(tree, P(d, f"s-{what}.tp"))
    elif lib == "tpnosync":
        treepack.save(tree, P(d, f"s-{what}.tp"), durable=False)
    elif lib == "pt":
        torch.save(tree, P(d, f"s-{what}.pt"))
    elif lib == "st":
        st.save_model(m, P(d, "s-model.st"))
    out["save"] = clock() - t
else:
    lib, what = case.split("-")[1:]
    ck = what == "ckpt"
    def into(tree):
        if ck:
            m.load_state_dict(tree["model"])
            opt.load_state_dict(tree["optim"])
        else:
            m.load_state_dict(tree)
    if ck:
        for p in m.parameters():  # (the first training step's gradients, made outside the clock)
            p.grad = torch.zeros_like(p)
    t0 = clock()
    if lib in ("tp", "tpnv"):
        tree = treepack.load(P(d, f"{what}.tp"), verify=lib == "tp")
    elif lib == "tpmmap":  # (the like-for-like of torch.load(mmap=True): tensors over the file)
        tree = treepack.load(P(d, f"{what}.tp"), mmap=True)
    elif lib in ("tplike", "tplikenv"):
        like = {"model": m.state_dict(), "optim": opt.state_dict()} if ck else m.state_dict()
        tree = None
        treepack.load(P(d, f"{what}.tp"), like=like, verify=lib == "tplike")
    elif lib == "pt":
        tree = torch.load(P(d, f"{what}.pt"), mmap=True, weights_only=True)
    elif lib == "st":
        tree = None
        st.load_model(m, P(d, "model.st"))
    t1 = clock()
    if tree is not None:
        into(tree)
    t2 = clock()
    out.update(load=t1 - t0, into=t2 - t1, total=t2 - t0)
    if ck:
        # Resumed: the first optimizer step reads and writes every parameter and every state
        # tensor. Lazily mapped tensors (torch.load(mmap=True)'s) pay their page faults and
        # copy-on-write copies here; tensors already read pay the step alone.
        opt.step()
        out["step"] = clock() - t2
        out["ready"] = clock() - t0
    if lib in ("tp", "tpnv"):
        del tree
        later = []
        for _ in range(2):
            t = clock()
            x = treepack.load(P(d, f"{what}.tp"), verify=lib == "tp")
            later.append(clock() - t)
            del x
        out["later"] = sum(later) / len(later)
    if lib == "tp" and what == "ckpt":
        ckpt = {"model": m.state_dict(), "optim": opt.state_dict()}
        treepack.save(ckpt, P(d, "again.tp"))
        t = clock()
        x = treepack.load(P(d, "again.tp"))
        out["after_save"] = clock() - t
print(json.dumps(out))
'''

LOADS = ["load-tp-ckpt", "load-tpnv-ckpt", "load-tpmmap-ckpt", "load-tplike-ckpt", "load-tplikenv-ckpt", "load-pt-ckpt",
         "load-tp-model", "load-tpnv-model", "load-tpmmap-model", "load-tplike-model", "load-tplikenv-model", "load-pt-model",
         "load-st-model"]
SAVES = ["save-tp-ckpt", "save-tpnosync-ckpt", "save-pt-ckpt", "save-tpnosync-model", "save-pt-model", "save-st-model"]


def run(case: str, d: str, env: dict) -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD, case, d], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"{case} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where the checkpoints go (default: a temporary directory)")
    ap.add_argument("--json", default=None, help="write the raw runs here")
    ap.add_argument("--no-saves", action="store_true")
    ap.add_argument("--cases", nargs="*", help="only these cases (names as in LOADS and SAVES)")
    args = ap.parse_args()
    d = args.dir or tempfile.mkdtemp(prefix="w13-")
    os.makedirs(d, exist_ok=True)
    env = dict(os.environ)
    run("make", d, env)
    cases = LOADS + ([] if args.no_saves else SAVES)
    if args.cases:
        cases = [c for c in cases if c in args.cases]
    res: dict = {c: [] for c in cases}
    for _ in range(args.runs):
        for c in cases:
            res[c].append(run(c, d, env))
            for name in os.listdir(d):
                if name.startswith(("s-", "again")):
                    p = os.path.join(d, name)
                    shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    if not args.dir:
        shutil.rmtree(d, ignore_errors=True)

    def med(c: str, k: str) -> str:
        v = [r[k] * 1e3 for r in res.get(c, []) if k in r]
        if not v:
            return ""
        return f"{statistics.median(v):.0f} ({min(v):.0f}–{max(v):.0f})"

    print(f"\nW13: GPT-2 124M, {args.runs} fresh processes per case, ms: median (min–max)\n")
    print("| case | load | into model | total | first step | total + step | later loads | first after save |")
    print("|---|---|---|---|---|---|---|---|")
    names = {"tp": "treepack.load", "tpnv": "treepack.load(verify=False)", "tpmmap": "treepack.load(mmap=True)", "tplike": "treepack.load(like=state dicts)",
             "tplikenv": "treepack.load(like=state dicts, verify=False)",
             "pt": "torch.load(mmap=True, weights_only=True)", "st": "safetensors load_model"}
    for c in [c for c in LOADS if c in cases]:
        lib, what = c.split("-")[1:]
        print(f"| {what}: {names[lib]} | {med(c, 'load')} | {med(c, 'into')} | {med(c, 'total')} | {med(c, 'step')} | "
              f"{med(c, 'ready')} | {med(c, 'later')} | {med(c, 'after_save')} |")
    if not args.no_saves:
        print("\n| save | ms |\n|---|---|")
        snames = {"tp": "treepack.save (durable)", "tpnosync": "treepack.save(durable=False)", "pt": "torch.save", "st": "safetensors save_model"}
        for c in [c for c in SAVES if c in cases]:
            lib, what = c.split("-")[1:]
            print(f"| {what}: {snames[lib]} | {med(c, 'save')} |")


if __name__ == "__main__":
    main()
