"""treepack benchmarks against the tools people use today.

    python bench/run.py            # full run (~1 GiB W1; fits in 15 minutes on 2 cores / 24 GiB)
    python bench/run.py --quick    # smoke test (~64 MiB W1, fewer runs; < 2 minutes), used by CI

Every case runs in a fresh subprocess: one warm-up per peer, then N timed runs taken round-robin
across the peers of that workload and operation (so drift in disk speed hits all peers alike);
the median is reported. Each run
reports wall time, peak RSS of its process, bytes moved; saves also report bytes on disk.
Results go to bench/results/<date>-<host>.json (<date>T<HHMM>-<host>.json when a run that day
already wrote one) and a readable bench/RESULTS.md (quick runs write bench/results/quick-*.json and
do not overwrite RESULTS.md). Numbers are printed, never asserted.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PEERS = ["treepack", "treepack-tpk", "treepack-nosync", "pickle", "npz", "safetensors", "safetensors-fsync", "h5py",
         "flax-msgpack", "orbax", "jax-ts", "raw", "raw-fsync"]
PLAN = [
    ("W1", "save"), ("W1", "load"), ("W4", "partial"), ("W6", "mmap"),
    ("W2", "save"), ("W2", "load"), ("W5", "structure"),
    ("W3", "save"), ("W3", "load"),
]
DATA_OF = {"W4": "W1", "W6": "W1", "W5": "W2"}
# W7, the compressible checkpoint (issue 25), is its own suite with compressing peers:
# `python bench/run.py --workloads W7` (it would take the full run past 15 minutes). Each step
# names its peers. `warm` loads with the files in the page cache: the decoding speed, which the
# cold `load` (disk-bound here) hides. W1r (W1's layout, random float32 weights) and W2 under
# `auto` measure what the policy costs where it cannot help (incompressible; small inline leaves).
PEERS_W7 = ["treepack", "treepack-lz4", "npz", "npz-compressed", "h5py-gzip", "h5py-lzf", "zarr", "orbax", "safetensors-zstd"]
PLAN_W7 = [
    ("W7", "save", PEERS_W7), ("W7", "load", PEERS_W7),
    ("W7", "warm", ["treepack", "treepack-lz4", "npz", "npz-compressed", "zarr", "orbax"]),
    ("W1r", "save", ["treepack", "treepack-auto"]), ("W1r", "load", ["treepack", "treepack-auto"]),
    ("W2", "save", ["treepack", "treepack-auto", "pickle"]), ("W2", "load", ["treepack", "treepack-auto", "pickle"]),
]
# W3i, a dataset of images (issue 26), is its own suite too: `--workloads W3i`. Its `-s3` peers
# store to a moto server this script starts on 127.0.0.1 (one PNG object per row, the pattern of
# a tracer that stores each custom object as a file, against one treepack tree).
PEERS_W3I = ["treepack", "pickle", "png-files", "treepack-s3", "png-files-s3"]
PLAN_W3I = [("W3i", "save", PEERS_W3I), ("W3i", "load", PEERS_W3I)]
# W11, scalar-only trees (issue 34) at 10k, 100k and 1M leaves, is its own suite too:
# `--workloads W11`. Its cases time each operation several times in one process with a warm
# page cache (a logging loop's saves and loads), and report the median.
PEERS_W11 = ["treepack", "treepack-nosync", "treepack-tpk", "pickle", "pickle-fsync", "json", "orjson", "msgpack", "flax-msgpack"]
W11_NAMES = ["W11-10k", "W11-100k", "W11-1M"]
PLAN_W11 = [(w, o, PEERS_W11) for w in W11_NAMES for o in ("save", "load")]
WARM_WORKLOADS = set(W11_NAMES)
# Baselines that need no save of their own: raw's W5 builds the W2 tree's bare skeleton.
NO_SAVE_NEEDED = {("W5", "raw")}
CASE_TIMEOUT = 300
SLOW_CASE_S = 10  # a case whose first run takes this long is reported from that run alone
# A peer's read (load, structure, ...) still running after this long is stopped and reported as
# taking at least this long: a lower bound is conclusive against treepack's tens of ms, and
# orbax's reads of 10k-100k leaves (50-90 s each) would otherwise push the run past 15 minutes.
# Saves always finish (the reads need their files); orbax's W2 and W3 saves alone took 70-120 s
# each in a slow spell (session 11), which is why 15 s and not 30 s: it keeps a slow machine's
# full run inside 15 minutes, and `> 15000 ms` is still > 100x treepack's time for each read.
STOP_AFTER_S = 15


def drop_caches() -> bool:
    try:
        subprocess.run(["sync"], check=False)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def run_case(wl, peer, op, d, scale):
    data_wl = DATA_OF.get(wl, wl)
    cmd = [sys.executable, os.path.join(HERE, "case.py"), data_wl, peer, op, d, str(scale)]
    stoppable = op != "save" and not peer.startswith("treepack")
    limit = STOP_AFTER_S if stoppable else CASE_TIMEOUT
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        if stoppable:
            return {"wall": float(STOP_AFTER_S), "bytes": 0, "stopped": True,
                    "note": f"stopped after {STOP_AFTER_S:g} s: the time is a lower bound"}
        return {"wall": None, "note": f"timeout after {CASE_TIMEOUT}s"}
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if not lines:
        return {"wall": None, "note": f"crashed: {out.stderr.strip()[-200:]}"}
    return json.loads(lines[-1])


def disk_usage(d, wl, peer):
    base = os.path.join(d, f"{wl}-{peer}")
    total = 0
    for cand in [base, base + ".tpk", base + ".npz", base + ".safetensors", base + ".h5", base + ".msgpack", base + ".orbax", base + ".raw", base + ".zarr", base + ".safetensors.zst"]:
        if os.path.isfile(cand):
            total += os.path.getsize(cand)
        elif os.path.isdir(cand):
            for root, _, files in os.walk(cand):
                total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


def clean(d, wl, peer):
    base = os.path.join(d, f"{wl}-{peer}")
    for cand in [base, base + ".tpk", base + ".npz", base + ".safetensors", base + ".h5", base + ".msgpack", base + ".orbax", base + ".raw", base + ".zarr", base + ".safetensors.zst"]:
        if os.path.isdir(cand):
            shutil.rmtree(cand)
        elif os.path.exists(cand):
            os.remove(cand)


def memcpy_bandwidth(nbytes):
    import numpy as np

    a = np.ones(nbytes // 8, np.float64)
    b = np.empty_like(a)
    times = []
    for _ in range(5):
        t = time.perf_counter()
        np.copyto(b, a)
        times.append(time.perf_counter() - t)
    return a.nbytes / statistics.median(times)


def main():
    global STOP_AFTER_S
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int, default=None)
    ap.add_argument("--peers", default=",".join(PEERS))
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    ap.add_argument("--workloads", default=None, help="comma-separated subset, e.g. W2,W5 (W5 needs W2's save)")
    ap.add_argument("--md", default=None, help="where to write the table (default: RESULTS.md for a full run only)")
    ap.add_argument("--stop-after", type=float, default=None,
                    help=f"stop a peer's read after this many seconds (default {STOP_AFTER_S})")
    args = ap.parse_args()
    if args.stop_after:
        STOP_AFTER_S = args.stop_after
    scale = ({"W1": 1 / 16, "W1r": 1 / 16, "W2": 0.1, "W3": 0.1, "W3i": 0.1, "W7": 1 / 16} if args.quick
             else {"W1": 1.0, "W1r": 1.0, "W2": 1.0, "W3": 1.0, "W3i": 1.0, "W7": 1.0})
    scale.update({w: 0.1 if args.quick else 1.0 for w in W11_NAMES})
    runs = args.runs or (2 if args.quick else 5)
    peers = args.peers.split(",")
    wanted = set(args.workloads.split(",")) if args.workloads else None
    plan = [(wl, op, peers) for wl, op in PLAN if wanted is None or wl in wanted]
    if wanted == {"W7"}:
        plan = [(wl, op, p if args.peers == ",".join(PEERS) else peers) for wl, op, p in PLAN_W7]
    if wanted == {"W3i"}:
        plan = [(wl, op, p if args.peers == ",".join(PEERS) else peers) for wl, op, p in PLAN_W3I]
    if wanted and wanted & {"W11", *W11_NAMES}:
        sizes = W11_NAMES if "W11" in wanted else [w for w in W11_NAMES if w in wanted]
        plan = [(wl, op, p if args.peers == ",".join(PEERS) else peers) for wl, op, p in PLAN_W11 if wl in sizes]
    moto = start_moto() if any(p.endswith("-s3") for _, _, ps in plan for p in ps) else None
    full = wanted is None and peers == PEERS and not args.quick
    d = args.dir or tempfile.mkdtemp(prefix="treepack-bench-")
    os.makedirs(d, exist_ok=True)
    dropped = drop_caches()
    results = []
    skipped = {}  # (data workload, peer) -> why its save did not apply
    started = time.time()
    for wl, op, step_peers in plan:
        data_wl = DATA_OF.get(wl, wl)
        sc = scale[data_wl]
        # Warm-up of every peer first, then the timed runs round-robin across peers (run 1 of
        # each, run 2 of each, ...): this VM's disk and page-cache speed drift by 2-4x over
        # minutes, and interleaving spreads that drift over all peers instead of charging it
        # to whichever peer happened to run during a slow spell.
        state = {}
        for peer in step_peers:
            if op != "save" and (data_wl, peer) in skipped and (wl, peer) not in NO_SAVE_NEEDED:
                state[peer] = {"samples": [], "note": skipped[(data_wl, peer)], "live": False, "skip": True}
                continue
            if op == "save":
                clean(d, data_wl, peer)
            first = run_case(wl, peer, op, d, sc)  # warm-up (for saves it also creates the files to load)
            st = {"samples": [], "note": first.get("note", ""), "live": first.get("wall") is not None, "skip": False}
            if first.get("stopped"):
                st["samples"].append(first)
                st["live"] = False
            elif st["live"] and first["wall"] >= SLOW_CASE_S:
                # A case this slow (orbax on 60k-100k leaves: 100x+ treepack) is reported from its
                # one run, so the whole benchmark stays within its time budget; the ratio is
                # conclusive anyway.
                st["samples"].append(first)
                st["note"] = (st["note"] + "; " if st["note"] else "") + f"1 run (over {SLOW_CASE_S:.0f} s)"
                st["live"] = False
            state[peer] = st
        for rnd in range(runs):
            for peer in step_peers:
                st = state[peer]
                if not st["live"]:
                    continue
                if op == "save":
                    clean(d, data_wl, peer)
                    # Start every save with nothing dirty in the page cache: otherwise a save
                    # pays for the writeback of whichever peer's gigabyte was written just before.
                    subprocess.run(["sync"], check=False)
                if dropped and op not in ("save", "warm") and wl not in WARM_WORKLOADS:
                    drop_caches()
                r = run_case(wl, peer, op, d, sc)
                if r.get("wall") is None:
                    st["note"], st["live"] = r.get("note", ""), False
                    continue
                r["round"] = rnd
                st["samples"].append(r)
        for peer in step_peers:
            st = state[peer]
            samples, note = st["samples"], st["note"]
            row = {"workload": wl, "op": op, "peer": peer, "note": note}
            if st["skip"]:
                results.append(row)
                continue
            if samples:
                walls = [s["wall"] for s in samples]
                row.update(
                    wall_median=statistics.median(walls),
                    wall_min=min(walls),
                    runs=len(walls),
                    # Per round of the round-robin (None: no run that round), for paired ratios.
                    walls=[next((s["wall"] for s in samples if s.get("round") == i), None) for i in range(runs)],
                    bytes=samples[0]["bytes"],
                    rss_peak=max((s.get("rss_peak") or 0) for s in samples),
                    lower_bound=any(s.get("stopped") for s in samples),
                )
                if row["wall_median"] > 0 and row["bytes"]:
                    row["throughput"] = row["bytes"] / row["wall_median"]
                if op == "save":
                    row["disk_bytes"] = disk_usage(d, data_wl, peer)
                for extra in ("needed_bytes", "distinct_bytes", "pack_bytes"):
                    if samples[0].get(extra) is not None:
                        row[extra] = samples[0][extra]
                reads = [s["read_bytes"] for s in samples if s.get("read_bytes") is not None]
                if reads and dropped:
                    row["read_bytes"] = int(statistics.median(reads))  # from storage, cold cache
            if op == "save" and not samples:
                skipped[(data_wl, peer)] = note if note.startswith("n/a") else f"n/a: save failed ({note})"
            results.append(row)
            status = f"{row['wall_median'] * 1e3:9.1f} ms" if samples else f"  {note}"
            print(f"{wl} {op:9s} {peer:13s} {status}", flush=True)
    mem_bw = memcpy_bandwidth(256 << 20 if args.quick else 1 << 30)
    host = socket.gethostname()
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": host,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "quick": args.quick,
        "runs_per_case": runs,
        "page_cache_dropped": dropped,
        "memcpy_bytes_per_s": mem_bw,
        "elapsed_s": round(time.time() - started, 1),
        "scale": scale,
    }
    out_dir = os.path.join(HERE, "results")
    os.makedirs(out_dir, exist_ok=True)
    stamp = datetime.date.today().isoformat()
    subset = "" if peers == PEERS and wanted is None else "subset-"
    name = f"{'quick-' if args.quick else ''}{subset}{stamp}-{host}.json"
    if os.path.exists(os.path.join(out_dir, name)):
        # A second run on the same day keeps the first: the time joins the date.
        stamp = datetime.datetime.now().strftime("%Y-%m-%dT%H%M")
        name = f"{'quick-' if args.quick else ''}{subset}{stamp}-{host}.json"
    with open(os.path.join(out_dir, name), "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
    table = render(meta, results)
    print(table)
    md = args.md or (os.path.join(HERE, "RESULTS.md") if full else None)
    if md:
        with open(md, "w") as f:
            f.write(table)
    if not args.dir:
        shutil.rmtree(d, ignore_errors=True)
    if moto is not None:
        moto.kill()
        moto.wait()


def start_moto():
    """A moto S3 server on 127.0.0.1 with bucket `bench`, for the `-s3` peers (their cases find it
    through TREEPACK_BENCH_S3)."""
    sys.path.insert(0, os.path.join(HERE, "..", "tests", "servers"))
    import local_s3

    proc, endpoint = local_s3.start("bench")
    os.environ["TREEPACK_BENCH_S3"] = endpoint
    return proc


def fmt_bytes(n):
    for unit in ["B", "KiB", "MiB", "GiB"]:
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return str(n)


def render(meta, results):
    lines = [
        "# Benchmark results",
        "",
        f"{meta['date']} on `{meta['host']}` ({meta['platform']}, {meta['cpus']} CPUs, Python {meta['python']}); "
        f"median of {meta['runs_per_case']} runs after a warm-up, each in a fresh process, the runs of a "
        f"workload's peers interleaved round-robin. "
        f"Page cache {'dropped before reads' if meta['page_cache_dropped'] else 'NOT dropped (not permitted here): reads are warm'}. "
        f"memcpy bandwidth {fmt_bytes(meta['memcpy_bytes_per_s'])}/s. Run took {meta['elapsed_s']} s.",
        "",
        "| workload | op | peer | median | throughput | peak RSS | on disk | read from disk | vs treepack | note |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    by = {(r["workload"], r["op"], r["peer"]): r for r in results}
    for r in results:
        tp = by.get((r["workload"], r["op"], "treepack"), {})
        ratio = ""
        more = "> " if r.get("lower_bound") else ""
        if r.get("wall_median") and tp.get("wall_median"):
            ratio = f"{more}{r['wall_median'] / tp['wall_median']:.2f}×"
        lines.append(
            "| {w} | {o} | {p} | {m} | {t} | {rss} | {disk} | {read} | {ratio} | {note} |".format(
                w=r["workload"], o=r["op"], p=r["peer"],
                m=f"{more}{r['wall_median'] * 1e3:.1f} ms" if r.get("wall_median") is not None else "—",
                t=f"{fmt_bytes(r['throughput'])}/s" if r.get("throughput") else "",
                rss=fmt_bytes(r["rss_peak"]) if r.get("rss_peak") else "",
                disk=fmt_bytes(r["disk_bytes"]) if r.get("disk_bytes") else "",
                read=fmt_bytes(r["read_bytes"]) if r.get("read_bytes") is not None else "",
                ratio=ratio, note=r.get("note", ""),
            )
        )
    lines += [
        "",
        "`vs treepack` = peer time / treepack (directory layout) time: above 1× means treepack is faster.",
        "Targets against a peer are judged on the median over rounds of that ratio taken within each round "
        "(runs seconds apart, so the disk's drift over minutes cancels), shown next to the ratio of medians.",
        "`read from disk` = bytes the case's process fetched from storage with a cold page cache "
        "(/proc/self/io `read_bytes`: mmap faults and kernel readahead included), median of its runs.",
        "",
    ]
    lines += targets(meta, by)
    return "\n".join(lines) + "\n"


def paired_ratio(by, w, o, peer, me="treepack"):
    """Median over the rounds of peer time / treepack time in the same round, or None.

    The runs of one round are seconds apart, the rounds minutes: this VM's disk speed drifts
    2-4x over minutes, so a ratio taken within each round cancels the drift that a ratio of
    medians (each from different minutes) keeps. Needs at least 3 rounds with both.
    """
    a = by.get((w, o, peer), {}).get("walls") or []
    b = by.get((w, o, me), {}).get("walls") or []
    pairs = [x / y for x, y in zip(a, b) if x and y]
    return statistics.median(pairs) if len(pairs) >= 3 else None


def targets(meta, by):
    """The issue's targets, evaluated against peers measured in the same run."""

    def t(w, o, p):
        return by.get((w, o, p), {}).get("wall_median")

    def versus(w, o, peer, at_least, fmt="{:.2f}×", strict=False, me="treepack"):
        """(text, met) for 'treepack (or the variant `me`) is `at_least` times as fast as peer'
        (`strict`: faster than): met on the median of per-round ratios where there are enough
        rounds, else on the ratio of medians."""
        meets = (lambda r: r > at_least) if strict else (lambda r: r >= at_least)
        tp, other = t(w, o, me), t(w, o, peer)
        if not tp or not other:
            return "n/a", None
        medians = other / tp
        if by.get((w, o, peer), {}).get("lower_bound"):
            # The peer was stopped: its time, hence the ratio, is a lower bound, conclusive only
            # when it already meets the target.
            return f"> {fmt.format(medians)} (peer stopped after {STOP_AFTER_S:g} s)", True if meets(medians) else None
        paired = paired_ratio(by, w, o, peer, me)
        if paired is None:
            return fmt.format(medians), meets(medians)
        return f"{fmt.format(paired)} per round (medians: {fmt.format(medians)})", meets(paired)

    out = ["## Targets", "", "| target | measured | met |", "| --- | --- | --- |"]

    def row(name, value, ok):
        out.append(f"| {name} | {value} | {'yes' if ok else ('no' if ok is not None else 'n/a')} |")

    if t("W11-100k", "load", "treepack"):
        # The W11 suite (scalar-only trees, issue 34): pickle and json at 100k and 1M leaves.
        for w in ("W11-100k", "W11-1M"):
            for o in ("save", "load"):
                if t(w, o, "treepack"):
                    row(f"{w} {o} ≥ 1.0× pickle", *versus(w, o, "pickle", 1.0))
                    row(f"{w} {o} ≥ 1.5× json", *versus(w, o, "json", 1.5))
                    if o == "save" and t(w, o, "pickle-fsync"):
                        # Like for like: treepack's durable default against pickle fsynced, and
                        # durable=False against plain pickle (what neither target row shows).
                        row(f"{w} save (durable) vs pickle + fsync", *versus(w, o, "pickle-fsync", 1.0))
                    if o == "save" and t(w, o, "treepack-nosync"):
                        row(f"{w} save, durable=False vs pickle", *versus(w, o, "pickle", 1.0, me="treepack-nosync"))
    if t("W3i", "load", "treepack"):
        # The W3i suite (objects, issue 26): a dataset of 10k rows holding 100 distinct images.
        for o in ("save", "load"):
            row(f"W3i {o} ≥ 2× pickle", *versus("W3i", o, "pickle", 2.0))
            mine, theirs = t("W3i", o, "treepack-s3"), t("W3i", o, "png-files-s3")
            more = "> " if by.get(("W3i", o, "png-files-s3"), {}).get("lower_bound") else ""
            row(f"W3i {o} on S3 (moto) ≥ 10× one PNG object per row",
                f"{more}{theirs / mine:.1f}×" if mine and theirs else "n/a", (theirs / mine >= 10) if mine and theirs else None)
        stored = by.get(("W3i", "save", "treepack"), {}).get("pack_bytes")
        distinct = by.get(("W3i", "save", "png-files"), {}).get("distinct_bytes")
        row("W3i image bytes stored (packs) ≤ 1.1 × the distinct images (as PNG)",
            f"{fmt_bytes(stored)} vs {fmt_bytes(distinct)}" if stored and distinct else "n/a",
            (stored <= 1.1 * distinct) if stored and distinct else None)
        return out

    if t("W7", "load", "treepack"):
        # The W7 suite (compression, issue 25): treepack's `auto` policy against compressing
        # peers, and what `auto` costs where it cannot help. Its W1/W2 steps lack the full run's
        # peers, so the full run's targets are not judged here.
        disk = lambda p: by.get(("W7", "save", p), {}).get("disk_bytes")
        for peer in ("npz-compressed", "zarr"):
            mine, theirs = disk("treepack"), disk(peer)
            row(f"W7 auto: smaller on disk than {peer}", f"{fmt_bytes(mine)} vs {fmt_bytes(theirs)}" if mine and theirs else "n/a",
                (mine < theirs) if mine and theirs else None)
            for o in ("save", "load", "warm"):
                row(f"W7 {o} ≥ 2× {peer}", *versus("W7", o, peer, 2.0))
        for o in ("load", "warm"):
            tput = by.get(("W7", o, "treepack"), {}).get("throughput")
            row(f"W7 {o} (decompression) ≥ 1.5 GiB/s", f"{fmt_bytes(tput)}/s" if tput else "n/a",
                (tput >= 1.5 * (1 << 30)) if tput else None)
        for o in ("save", "load"):
            # versus() gives peer/treepack; here the peer is treepack-auto and at most 1.10× is the goal.
            tp, auto = t("W1r", o, "treepack"), t("W1r", o, "treepack-auto")
            r = paired_ratio(by, "W1r", o, "treepack-auto") or (auto / tp if tp and auto else None)
            row(f"W1r (incompressible) {o} under auto ≤ 1.10× none",
                f"{r:.2f}× per round (medians: {auto / tp:.2f}×)" if r else "n/a", (r <= 1.10) if r else None)
        return out

    row("W1 save ≥ 1.0× safetensors throughput", *versus("W1", "save", "safetensors", 1.0))
    row("W1 save ≥ 0.7× single-write baseline", *versus("W1", "save", "raw", 0.7))
    # Issue 32: treepack's saves are durable by default (fsynced); the peers above are not. The
    # same targets against the peers made durable, and treepack with durable=False against the
    # peers as they are.
    row("W1 save (durable) ≥ 1.0× safetensors + fsync", *versus("W1", "save", "safetensors-fsync", 1.0))
    row("W1 save (durable) ≥ 0.7× single write + fsync", *versus("W1", "save", "raw-fsync", 0.7))
    row("W1 save, durable=False ≥ 1.0× safetensors", *versus("W1", "save", "safetensors", 1.0, me="treepack-nosync"))
    row("W1 save, durable=False ≥ 0.7× single write", *versus("W1", "save", "raw", 0.7, me="treepack-nosync"))
    tp, ns = t("W1", "save", "treepack"), t("W1", "save", "treepack-nosync")
    row("W1 cost of durable (default) over durable=False", f"{tp / ns:.2f}× ({(tp - ns) * 1e3:.0f} ms)" if tp and ns else "n/a", None)
    tp, ns = t("W2", "save", "treepack"), t("W2", "save", "treepack-nosync")
    row("W2 cost of durable (default) over durable=False", f"{tp / ns:.2f}× ({(tp - ns) * 1e3:.0f} ms)" if tp and ns else "n/a", None)
    row("W1 load ≥ safetensors", *versus("W1", "load", "safetensors", 1.0))
    for w in ("W2", "W3"):
        for o in ("save", "load"):
            row(f"{w} {o} faster than pickle", *versus(w, o, "pickle", 1.0, strict=True))
            row(f"{w} {o} ≥ 10× faster than orbax", *versus(w, o, "orbax", 10.0, "{:.1f}×"))
    p4, l1 = t("W4", "partial", "treepack"), t("W1", "load", "treepack")
    row("W4 partial < 5% of a full W1 load", f"{p4 / l1 * 100:.1f}%" if p4 and l1 else "n/a", (p4 / l1 < 0.05) if p4 and l1 else None)
    # "Reads only the bytes it needs": what left the disk (cold cache) against what the request
    # needs. A verified read fetches whole chunks (a chunk's BLAKE3 covers all of it), so "needs"
    # is the manifest plus the chunks the request touches, computed from the manifest; 1 MiB of
    # slack covers the extension's own code pages faulted in from a cold cache.
    w4 = by.get(("W4", "partial", "treepack"), {})
    if w4.get("read_bytes") is not None and w4.get("needed_bytes"):
        data = by.get(("W1", "save", "treepack"), {}).get("bytes") or 0
        row(
            f"W4 reads only the chunks it needs (asked {fmt_bytes(w4['bytes'])} of {fmt_bytes(data)}; "
            f"manifest + touched chunks {fmt_bytes(w4['needed_bytes'])})",
            f"read {fmt_bytes(w4['read_bytes'])} from disk",
            w4["read_bytes"] <= w4["needed_bytes"] + (1 << 20),
        )
    else:
        row("W4 reads only the chunks it needs", "n/a (no /proc/self/io or cache not dropped)", None)
    w5 = t("W5", "structure", "treepack")
    w5_floor = t("W5", "structure", "raw")
    floor = f" (the bare containers, one int per leaf: {w5_floor * 1e3:.1f} ms)" if w5_floor else ""
    row("W5 structure < 50 ms", f"{w5 * 1e3:.1f} ms{floor}" if w5 else "n/a", (w5 < 0.05) if w5 else None)
    w6 = t("W6", "mmap", "treepack")
    # "< 10 ms plus the bytes touched": the touched array's bytes read with one pread() (the
    # `raw` peer of W6, same page-cache state).
    touched = by.get(("W6", "mmap", "treepack"), {}).get("bytes") or 0
    w6_limit = 0.01 + (t("W6", "mmap", "raw") or 0.0)
    row(
        f"W6 mmap open + touch < 10 ms + {fmt_bytes(touched)} touched ({w6_limit * 1e3:.1f} ms)",
        f"{w6 * 1e3:.1f} ms" if w6 else "n/a",
        (w6 < w6_limit) if w6 else None,
    )
    for w, o in (("W1", "save"), ("W1", "load")):
        r = by.get((w, o, "treepack"), {})
        if r.get("rss_peak") and r.get("bytes"):
            limit = r["bytes"] * 1.1 + (64 << 20)
            row(f"{w} {o} peak RSS ≤ data × 1.1 + 64 MiB", f"{fmt_bytes(r['rss_peak'])} (limit {fmt_bytes(limit)})", r["rss_peak"] <= limit)
    out.append("")
    return out


if __name__ == "__main__":
    main()
