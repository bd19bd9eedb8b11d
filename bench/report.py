"""What the framework benchmarks (dask_bench, jax_bench, torch_bench) write when they are done:
bench/results/NAME-DATE[-quick].json (or --out), with the run's settings and the machine."""

from __future__ import annotations

import json
import os
import platform
import time
from typing import Any, Dict, List


def write(name: str, args: Any, runs: int, results: List[Dict[str, Any]], **meta: Any) -> str:
    """Write `results` with their metadata (`meta`: the framework's versions, sizes...)."""
    meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "quick": args.quick, "runs": runs, **meta,
            "python": platform.python_version(), "cpus": os.cpu_count()}
    stamp = time.strftime("%Y%m%d-%H%M") + ("-quick" if args.quick else "")
    out = args.out or os.path.join(os.path.dirname(__file__), "results", f"{name}-{stamp}.json")
    with open(out, "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
    print("wrote", out)
    return out
