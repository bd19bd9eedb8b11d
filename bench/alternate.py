"""Timing cases alternated in one process (the in-process A/B scripts' loop): on a shared,
drifting machine each case sees the same spells of noise."""

import statistics
import time


def alternate(cases: dict, runs: int) -> dict:
    """Call each case of `cases` (name -> f(run index)) once per run, in turn, `runs` times;
    the seconds each call took, per name."""
    times = {k: [] for k in cases}
    for i in range(runs):
        for k, f in cases.items():
            t = time.perf_counter()
            f(i)
            times[k].append(time.perf_counter() - t)
    return times


def print_medians(times: dict, prefix: str = "") -> None:
    """One line per case of `times` (what `alternate` returned): its fastest and median call."""
    for k, v in times.items():
        print(f"{prefix}{k:30} min {min(v) * 1e3:7.2f} ms  median {statistics.median(v) * 1e3:7.2f} ms")
