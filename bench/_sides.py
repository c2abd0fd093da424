"""Plumbing shared by the benchmarks that compare libraries: each side in a fresh process.

On a small machine one library's idle thread pool spinning beside another's work
(PyTorch's OpenMP pool, numpy's OpenBLAS pool) slows either side by up to 2.3x, so a
comparison never times two libraries in one process.  A benchmark script is its own
child: the parent runs ``python SCRIPT --side NAME ...`` once per side and repeat,
each in a fresh process that imports only its side's library, trains, and prints one
JSON line (its times, and its peak RSS from :func:`peak_rss`); :func:`alternate`
runs the repeats with the sides in an order rotated each time, so that no side
always goes first or always follows the same neighbour, and :func:`median` reduces
them.  Times exclude starting Python, importing and loading data.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def cores() -> int:
    """The threads a side may use: ``OMP_NUM_THREADS`` where set, else every core."""
    return int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1)


def peak_rss() -> int:
    """Peak resident set of this process in bytes.  /proc's VmHWM belongs to the
    address space, unlike ru_maxrss, which Linux carries over from the forking parent."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def emit(result: Mapping[str, Any]) -> None:
    """A child's answer: one JSON line on stdout, with this process's peak RSS."""
    print(json.dumps({**result, "peak_rss_bytes": peak_rss()}), flush=True)


def run_side(script: str, args: Sequence[str], timeout: float | None = None
             ) -> dict[str, Any]:
    """Run ``python SCRIPT ARGS`` in a fresh process; the last line it prints, as JSON.
    A failing child raises with the end of its stderr."""
    cmd = [sys.executable, os.path.abspath(script), *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {out.returncode}:\n{out.stderr[-3000:]}")
    lines = out.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(f"{' '.join(cmd)} printed nothing:\n{out.stderr[-3000:]}")
    return dict(json.loads(lines[-1]))


def alternate(script: str, sides: Mapping[str, Sequence[str]], repeats: int,
              per_repeat: Callable[[int], Sequence[str]] | None = None,
              timeout: float | None = None, log: bool = False) -> dict[str, list[dict[str, Any]]]:
    """Each side's child ``repeats`` times, each run in a fresh process: repeat i runs
    every side once (with ``per_repeat(i)`` added to its arguments: a seed), the order
    rotated by i.  ``{side: [answer per repeat]}``; each run said on stderr as it ends
    (with its answer, given ``log``).  Interrupted (Ctrl-C, or SIGINT at a
    time limit), it returns the answers it has, fewer for some sides, and says so on
    stderr: a run cut short still reports what it measured."""
    names = list(sides)
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    total, start = repeats * len(names), time.perf_counter()
    try:
        for i in range(repeats):
            k = i % len(names) if names else 0
            extra = list(per_repeat(i)) if per_repeat else []
            for name in names[k:] + names[:k]:
                t0 = time.perf_counter()
                runs[name].append(run_side(script, [*sides[name], *extra], timeout))
                # progress on stderr (a long comparison is not silent; --json stays on
                # stdout): which run, how long it took, and the time so far
                done = sum(len(r) for r in runs.values())
                answer = f": {runs[name][-1]}" if log else ""
                print(f"  [{done}/{total}] repeat {i + 1}/{repeats} {name} "
                      f"{time.perf_counter() - t0:.1f} s (all {time.perf_counter() - start:.0f} s)"
                      f"{answer}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        done = {n: len(r) for n, r in runs.items()}
        print(f"  interrupted: runs per side {done}", file=sys.stderr, flush=True)
    return runs


def median(runs: Sequence[Mapping[str, Any]], key: str) -> Any:
    """The median of ``key`` over the runs that have it (None where none has)."""
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def fastest(medians: Mapping[str, float | None]) -> str:
    """The name of the smallest of several variants' median times."""
    known = {k: v for k, v in medians.items() if v is not None}
    return min(known, key=lambda k: known[k])


def timed(fn: Callable[[], Any], sync: Callable[[], None], k: int = 1) -> float:
    """Milliseconds per call, over ``k`` back-to-back calls."""
    sync()
    t = time.perf_counter()
    for _ in range(k):
        fn()
    sync()
    return (time.perf_counter() - t) * 1e3 / k


def calls_per_sample(fn: Callable[[], Any], sync: Callable[[], None]) -> int:
    """Enough calls that one sample lasts ~20 ms (timer and loop noise amortised)."""
    return max(1, min(1000, int(20.0 / max(timed(fn, sync, 3), 1e-4))))
