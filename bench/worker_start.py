"""How long a worker takes to start, and what it costs before any trial: one worker
spawned as the scheduler spawns it (:func:`explore.scheduler.processes.spawn`), timed
from the spawn to its ``Ready`` (the interpreter's start, the engine's import, numba's
and its cached kernels' with the compiled kernels, the warm-up), with the overhead it
measured then (its PSS: what the budget is charged for it).

Each run is a fresh process that spawns one worker; numpy's kernels and the compiled
ones alternate, medians of ``--repeats``.  The worker gets one BLAS thread, as each of
two workers on a 2-core machine does.

    python bench/worker_start.py --json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._sides import emit, median, run_side

KERNELS = {"numpy": "0", "compiled": "1"}


def child(kernels: str) -> None:
    import multiprocessing as mp

    import numpy as np

    from explore.scheduler.processes import await_ready, spawn, stop_all
    from explore.scheduler.shared_arrays import SharedArrays

    with SharedArrays({"x": np.zeros((4, 4), np.float32)}) as arrays:
        t = time.perf_counter()
        w = spawn(mp.get_context("spawn"), 0, arrays.spec, "cpu", os.cpu_count() or 1,
                  jit=KERNELS[kernels])
        try:
            await_ready(w)
            seconds = time.perf_counter() - t
        finally:
            stop_all([w])
    emit({"start_s": seconds, "overhead_bytes": w.overhead})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--child", choices=list(KERNELS), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in KERNELS}
    names = list(KERNELS)
    for i in range(args.repeats):  # the order rotated each repeat
        for name in names[i % 2:] + names[:i % 2]:
            runs[name].append(run_side(__file__, ["--child", name], timeout=300))
    result = {"repeats": args.repeats, "kernels": {
        name: {"start_s": round(median(rs, "start_s"), 3),
               "overhead_mb": round(median(rs, "overhead_bytes") / 1e6, 1)}
        for name, rs in runs.items()}}
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
