"""A worker process's life: its entry point, tied to the driver's, with the engine's
kernels chosen before any is bound."""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
from typing import Any

from explore.scheduler.shared_arrays import ArraySpec
from explore.scheduler.worker.serve import main

JIT_DEFAULT = "0"
"""A worker started without ``CALCGRAPH_JIT`` runs the engine's numpy kernels: the
fused kernels (numba, :mod:`engine.ops.jit`) are 1.1-13x faster per op but numba's
LLVM adds about 100 MB to the worker's measured overhead, several times the worker's
own (``docs/measurements.md``), memory that a budget of a few hundred MB per worker
needs for trials.  The scheduler sets it for its workers as the space's
``budget.kernels`` says (:mod:`explore.scheduler.kernels`)."""


def process_main(conn: Any, data: dict[str, ArraySpec] | None, device: str) -> None:
    """Entry point of a worker process: :func:`~.serve.main`, tied to its driver's life."""
    stay_with_the_driver()
    os.environ.setdefault("CALCGRAPH_JIT", JIT_DEFAULT)  # before any kernel is bound
    main(conn, data, device)


def stay_with_the_driver() -> None:
    """Tie this worker's life to its driver's: the kernel kills it when the driver dies
    (even by ``kill -9``: Linux's parent-death signal), and Ctrl-C, which the terminal
    sends to every process of the group, is the driver's to handle (it stops the
    workers itself; a worker's own KeyboardInterrupt only printed tracebacks).  So are
    SIGTERM and SIGHUP, which systemd and SLURM send to every process of a job: a
    worker ended by one would have its trial failed as died instead of queued again."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:
        os._exit(0)  # the driver died before the signal was set: nothing to work for
