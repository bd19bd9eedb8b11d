"""`treepack view` (issue 56): first paint in headless Chromium of

- a tree of 100,000 leaves (1,000 groups of 100 small arrays) and one of 1,000,000 (1,000 groups
  of 1,000): from the page's navigation start until its first rows are on screen, and from
  `treepack view` starting (a fresh process) until then — the issue asks that a 1M-leaf tree
  open in under a second;
- a 4096 x 4096 float32 heatmap (64 MiB saved with `chunk_bytes=1 MiB`): from navigation start
  (the page's address opens the array) until the canvas holds the picture; and the same
  array's 1024 x 1024 corner asked for in the slice box, from the Enter key until it is drawn.
  The bytes each read took from the tree (`/api/io`) are recorded, with the chunks the region
  touches: it must read those only.

    .venv/bin/python bench/view_bench.py [--runs 5] [--cli target/release/treepack] [--append]

Chromium and its driver are Debian's (`scripts/browser.sh`), driven by Selenium as
python/tests/test_view_browser.py drives them. The viewer is the CLI's (`treepack view
--no-browser`; build it with `cargo build --release -p treepack-cli`), one server per tree,
page cache warm (a first, untimed run reads the files once). A time is `performance.now()` in
the page when a requestAnimationFrame poll first sees the result, so each is within a frame
(~16 ms) above the true paint; medians of `--runs` page loads. `--append` writes the results into
bench/RESULTS.md as its "Session 34: viewer" section (replacing an earlier run's); they are
printed as JSON either way.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np

import treepack

ROOT = Path(__file__).resolve().parents[1]

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--window-size=1400,900"]

# Resolves with performance.now() once `cond` holds, polled every animation frame.
WHEN = """
const done = arguments[arguments.length - 1];
const check = () => { if (%s) done(performance.now()); else requestAnimationFrame(check); };
check();
"""

TREE_ROWS = "document.querySelectorAll('#tree-rows .row').length >= 2"
HEATMAP = ("document.getElementById('heatmap-canvas') && document.getElementById('heatmap-canvas').width > 0 "
           "&& /elements read/.test(document.querySelector('#view-body .muted').textContent)")


def browser(profile: Path):
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not (chromium and driver):
        sys.exit("chromium and chromium-driver are needed: bash scripts/browser.sh")
    opts = Options()
    for f in FLAGS:
        opts.add_argument(f)
    opts.add_argument(f"--user-data-dir={profile}")
    opts.binary_location = chromium
    d = webdriver.Chrome(options=opts, service=Service(driver))
    d.set_page_load_timeout(120)
    d.set_script_timeout(120)
    return d


class Viewer:
    def __init__(self, cli: str, location: Path):
        self.proc = subprocess.Popen([cli, "view", str(location), "--no-browser"], stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        self.url = next(w for w in line.split() if w.startswith("http://127.0.0.1:"))
        self.base, self.token = self.url.split("/?token=")

    def api(self, endpoint: str, **params) -> dict:
        q = urllib.parse.urlencode({"token": self.token, **params})
        with urllib.request.urlopen(f"{self.base}/api/{endpoint}?{q}") as r:
            return json.load(r)

    def bytes_read(self) -> int:
        return self.api("io")["bytes_read"]

    def close(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)


def first_paint(d, url: str, cond: str) -> float:
    """ms from navigation start until `cond` holds."""
    d.get("about:blank")
    d.get(url)
    return d.execute_async_script(WHEN % cond)


def make_trees(tmp: Path) -> tuple[Path, Path, Path]:
    wide = tmp / "wide"
    rng = np.random.default_rng(0)
    tree = {f"g{i:04d}": {f"w{j:03d}": rng.standard_normal(4).astype(np.float32) for j in range(100)} for i in range(1000)}
    treepack.save(tree, wide)
    # A million float32[4] arrays (views of one block: each saved as an array of its own).
    million = tmp / "million"
    block = rng.standard_normal((1000, 1000, 4)).astype(np.float32)
    treepack.save({f"g{i:04d}": {f"w{j:03d}": block[i, j] for j in range(1000)} for i in range(1000)}, million)
    del block
    big = tmp / "big"
    x = np.add.outer(np.arange(4096, dtype=np.float32), np.arange(4096, dtype=np.float32))
    treepack.save({"big": x}, big, chunk_bytes=1 << 20)
    return wide, million, big


def tree_paint(d, cli: str, location: Path, runs: int) -> tuple[dict, dict]:
    """First paint of a tree's rows: the page loaded again (server warm), and from `treepack view`
    starting (the manifest opened, the server bound) in a fresh process each time: wall-clock,
    Selenium's round trips included."""
    v = Viewer(cli, location)
    try:
        first_paint(d, v.url, TREE_ROWS)  # untimed: files into the page cache
        times = [first_paint(d, v.url, TREE_ROWS) for _ in range(runs)]
    finally:
        v.close()
    fresh, ready = [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        v = Viewer(cli, location)
        ready.append((time.perf_counter() - t0) * 1000)  # the URL printed: the manifest read
        try:
            first_paint(d, v.url, TREE_ROWS)
            fresh.append((time.perf_counter() - t0) * 1000)
        finally:
            v.close()
    summary = lambda xs: {"median": round(statistics.median(xs)), "runs": [round(t) for t in xs]}  # noqa: E731
    return summary(times), dict(summary(fresh), url_printed_ms=round(statistics.median(ready)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cli", default=str(ROOT / "target" / "release" / "treepack"))
    ap.add_argument("--append", action="store_true", help="append the results to bench/RESULTS.md")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="view-bench-"))
    d = None
    try:
        t0 = time.perf_counter()
        wide, million, big = make_trees(tmp)
        made = time.perf_counter() - t0
        d = browser(tmp / "profile")
        out = {"runs": args.runs, "made_s": round(made, 1)}
        out["tree_100k_ms"], out["tree_100k_fresh_ms"] = tree_paint(d, args.cli, wide, args.runs)
        out["tree_1m_ms"], out["tree_1m_fresh_ms"] = tree_paint(d, args.cli, million, args.runs)
        out["tree_1m_manifest_mib"] = round(sum(f.stat().st_size for f in million.iterdir()) / (1 << 20))

        v = Viewer(args.cli, big)
        url = v.url + "#tab=tree&t=a&path=big"
        try:
            st = v.api("node", path="big")["storage"]
            cs, grid = st["chunk_shape"], st["grid"]
            touched = -(-1024 // cs[0]) * -(-1024 // cs[1])
            out["chunks"] = {"chunk_shape": cs, "grid": grid, "chunks": st["chunks"], "region_touches": touched,
                             "chunk_bytes": 4 * cs[0] * cs[1]}
            first_paint(d, url, HEATMAP)
            times, reads, region_times, region_reads = [], [], [], []
            for _ in range(args.runs):
                before = v.bytes_read()
                times.append(first_paint(d, url, HEATMAP))
                reads.append(v.bytes_read() - before)
                # The corner region, asked for in the slice box.
                before = v.bytes_read()
                t = d.execute_async_script("""
                    const done = arguments[arguments.length - 1];
                    const input = document.querySelector('#view-controls input[type=text]');
                    const status = document.querySelector('#view-body .muted');
                    status.textContent = '';
                    const t0 = performance.now();
                    input.value = '0:1024, 0:1024';
                    input.dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter'}));
                    const check = () => /1,048,576 elements read/.test(status.textContent)
                        ? done(performance.now() - t0) : requestAnimationFrame(check);
                    check();
                """)
                region_times.append(t)
                region_reads.append(v.bytes_read() - before)
            out["heatmap_4096_ms"] = {"median": round(statistics.median(times)), "runs": [round(t) for t in times],
                                      "bytes_read": statistics.median(reads), "array_bytes": 4096 * 4096 * 4}
            out["heatmap_region_1024_ms"] = {"median": round(statistics.median(region_times)),
                                             "runs": [round(t) for t in region_times],
                                             "bytes_read": statistics.median(region_reads)}
        finally:
            v.close()
        chromium = subprocess.run([shutil.which("chromium") or "chromium", "--version"], capture_output=True, text=True).stdout.strip()
        out["machine"] = f"{platform.machine()}, {os.cpu_count()} CPUs ({cpu_name()}), {platform.system()} {platform.release()}; {chromium}"
        print(json.dumps(out, indent=1))
        if args.append:
            append(out)
    finally:
        if d is not None:
            d.quit()
        shutil.rmtree(tmp, ignore_errors=True)


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def append(out: dict) -> None:
    mib = 1 << 20
    h, r, c = out["heatmap_4096_ms"], out["heatmap_region_1024_ms"], out["chunks"]
    grid = f"{c['chunks']} chunks of {c['chunk_shape'][0]} × {c['chunk_shape'][1]}"
    text = f"""
## Session 34: viewer

`bench/view_bench.py` (issue 56), `treepack view` (release CLI) in headless Chromium driven by
Selenium, page cache warm, medians of {out['runs']} page loads; times from the page's navigation
start (a requestAnimationFrame poll: within a frame above the paint). Machine: {out['machine']}
(shared with other work).

| first paint | median | runs | read from the tree |
| --- | --- | --- | --- |
| tree of 100,000 leaves (1,000 × 100 arrays), page loaded again | {out['tree_100k_ms']['median']} ms | {', '.join(map(str, out['tree_100k_ms']['runs']))} | nothing (the manifest is in memory) |
| the same from `treepack view` starting (a fresh process: wall-clock; {out['tree_100k_fresh_ms']['url_printed_ms']} ms until it prints the URL) | {out['tree_100k_fresh_ms']['median']} ms | {', '.join(map(str, out['tree_100k_fresh_ms']['runs']))} | the manifest |
| tree of 1,000,000 leaves (1,000 × 1,000 arrays), page loaded again | {out['tree_1m_ms']['median']} ms | {', '.join(map(str, out['tree_1m_ms']['runs']))} | nothing (the manifest is in memory) |
| the same from `treepack view` starting (a fresh process: wall-clock; {out['tree_1m_fresh_ms']['url_printed_ms']} ms until it prints the URL) | {out['tree_1m_fresh_ms']['median']} ms | {', '.join(map(str, out['tree_1m_fresh_ms']['runs']))} | the manifest ({out['tree_1m_manifest_mib']} MiB: the arrays are small enough to be inline) |
| heatmap of float32[4096, 4096] ({grid}; the page reads `::2, ::2`, shows 512 × 512 block means) | {h['median']} ms | {', '.join(map(str, h['runs']))} | {h['bytes_read'] / mib:.0f} MiB of {h['array_bytes'] / mib:.0f} |
| its region `0:1024, 0:1024` from the slice box ({c['region_touches']} of the {c['chunks']} chunks: {c['region_touches'] * c['chunk_bytes'] / mib:.0f} MiB) | {r['median']} ms | {', '.join(map(str, r['runs']))} | {r['bytes_read'] / mib:.0f} MiB |

The whole-array view reads every chunk (a step of 2 on both axes touches them all); the region
reads the chunks it touches and no others (`read from the tree` is the reader's `/api/io` count).
A tree of a million leaves paints in {out['tree_1m_ms']['median']} ms once the server has it open (the page
asks for the first thousand rows; the list is virtualised); from a fresh `treepack view` it
takes {out['tree_1m_fresh_ms']['median']} ms, of which {out['tree_1m_fresh_ms']['url_printed_ms']} ms pass before the server answers at all: the engine
reading and parsing the {out['tree_1m_manifest_mib']} MiB manifest (`treepack.open`'s cost, not the viewer's).
"""
    # The section replaces the one an earlier run wrote (up to the next section), else ends the file.
    results = ROOT / "bench" / "RESULTS.md"
    old = results.read_text()
    start = old.find("\n## Session 34: viewer\n")
    if start < 0:
        results.write_text(old + text)
    else:
        end = old.find("\n## ", start + 1)
        results.write_text(old[:start] + text + ("" if end < 0 else old[end:]))


if __name__ == "__main__":
    main()
