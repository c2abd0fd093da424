"""What a run's processes cost before any trial, measured, and remembered per machine.

The budget holds everything the run uses (docs/architecture.md, "The budget"): the
scheduler's own process, multiprocessing's resource tracker, every worker, the shared
data set once, and the trials' heaps.  The first three are *constants* of a machine and
its libraries: the scheduler measures its own at the start of every run, and a worker
measures itself after a warm-up (:func:`explore.scheduler.worker.warm_up`).  A worker's and the
tracker's figures are kept in a small JSON file per machine and library versions, so
that the next run knows them before it starts a process: it can then refuse a budget
too small, or start fewer workers, without first going over the budget to find out.

>>> key = machine_key("cpu")
>>> "numpy" in key and "cpu" in key
True
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy

from explore.cache_dir import cache_root
from explore.scheduler.worker import JIT_DEFAULT
from explore.version import __version__ as explore_version


@dataclass(frozen=True)
class Measured:
    """A worker's and the resource tracker's bytes on one machine (cached)."""

    worker: int
    tracker: int


def machine_key(device: str, jit: str | None = None) -> str:
    """What the constants depend on: the machine, Python and the libraries a worker
    loads (numba's LLVM, about 100 MB, only with the fused kernels on: ``jit``, the
    workers' ``CALCGRAPH_JIT``, by default this process's), and the device."""
    jit = jit if jit is not None else os.environ.get("CALCGRAPH_JIT", JIT_DEFAULT)
    return "|".join((platform.node(), platform.machine(), sys.version.split()[0],
                     f"numpy {numpy.__version__}", f"explore {explore_version}", device,
                     f"cores {os.cpu_count()}", f"jit {jit}"))


def cache_file() -> Path:
    """``constants.json`` in explore's cache folder (:func:`explore.cache_dir.cache_root`)."""
    return cache_root() / "constants.json"


def load(key: str) -> Measured | None:
    """The figures measured on this machine before, if any (a damaged file is ignored:
    the run then measures again)."""
    try:
        entry = json.loads(cache_file().read_text())[key]
        return Measured(int(entry["worker"]), int(entry["tracker"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save(key: str, measured: Measured) -> None:
    """Remember ``measured`` for ``key``: the larger of it and what is there, so one
    lucky start does not lower the figure.  Written atomically; a cache that cannot be
    written is skipped (the next run measures again)."""
    old = load(key)
    if old is not None:
        measured = Measured(max(old.worker, measured.worker),
                            max(old.tracker, measured.tracker))
    write_entry(cache_file(), key, asdict(measured))


def write_entry(path: Path, key: str, entry: object) -> None:
    """Set ``key`` to ``entry`` in the JSON table at ``path`` (a damaged table is
    started afresh), written atomically: a temporary file in its folder, then a rename.
    A folder that cannot be written is skipped (the next run measures again)."""
    with contextlib.suppress(OSError):
        try:
            table = json.loads(path.read_text())
            if not isinstance(table, dict):
                table = {}
        except (OSError, ValueError):
            table = {}
        table[key] = entry
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-")
        with os.fdopen(fd, "w") as f:
            json.dump(table, f, indent=1, sort_keys=True)
        os.replace(tmp, path)


def workers_that_fit(budget: int, fixed: int, worker: int, smallest_heap: int) -> int:
    """How many workers, each with room for the smallest candidate, ``budget`` holds
    beside ``fixed`` bytes (the scheduler, the tracker, the data)."""
    return max(0, (budget - fixed) // (worker + smallest_heap))
