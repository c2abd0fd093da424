"""Workers started ahead of their run, while the driver still opens the study: a
worker's start (the interpreter, the engine, numba's kernels and the warm-up, 0.3-0.7 s
on a CPU) then overlaps the driver's instead of following it, and a run's first trials
start that much sooner.

Such a worker warms up with no data and waits; the run's :class:`~.loop.Scheduler`
takes it in place of spawning one, gives it the data set
(:class:`~explore.scheduler.protocol.Attach`), and only then does it measure and
report its overhead, as a worker spawned with the data does.  A worker the run turns
out not to need (their share of the cores differs, the run stopped first) is told to
exit.

The budget counts every process of the run from its first moment, so only the
workers it holds start ahead (:func:`how_many`): by a worker's and the resource
tracker's costs remembered on this machine (:mod:`explore.scheduler.constants`),
beside the data set and twice the driver's size when they start (it grows by far less
than that while it opens the study).  On a machine that has not run yet none do: the
run measures one worker first.

>>> from explore.space import Budget
>>> budget = Budget(trials=1, rounds=1, workers=2, memory="300MB", kernels="numpy")
>>> how_many(budget, smallest=10_000, data=1_000_000, main=100_000_000,
...          known=Measured(worker=30_000_000, tracker=10_000_000))
2
>>> how_many(budget, smallest=10_000, data=1_000_000, main=100_000_000, known=None)
0
"""

from __future__ import annotations

import gc
import multiprocessing as mp
from dataclasses import dataclass, field
from multiprocessing.context import SpawnContext
from typing import Any

from explore.procmem import pss, uss
from explore.scheduler.admission import admitted_heap, headroom
from explore.scheduler.constants import Measured, machine_key, workers_that_fit
from explore.scheduler.constants import load as load_constants
from explore.scheduler.kernels import for_workers
from explore.scheduler.placement import Worker
from explore.scheduler.processes import spawn, stop_all
from explore.scheduler.worker import release_heap_memory


@dataclass
class Prestarted:
    """Workers spawned for a run on ``device``, ``n_running`` in all (their share of
    the cores), their kernels as ``jit`` says; by index."""

    device: str
    n_running: int
    jit: str
    workers: dict[int, Worker] = field(default_factory=dict)
    # The driver before they started: its PSS (its libraries' pages its own, as a
    # driver that starts its workers later is measured) and its private bytes, from
    # which what it grows by afterwards is read (:meth:`driver_alone`).
    driver_pss: int = 0
    driver_private: int = 0

    def driver_alone(self) -> int:
        """The driver's PSS as if it shared no page with these workers: its PSS before
        they started, plus the private bytes it has grown by since.  Beside them it
        measures less (the libraries' pages they share are split among them), a figure
        that rises again as soon as they end: the run charges the driver this instead,
        the margin that a driver measured before its workers start has always had."""
        return self.driver_pss + max(0, uss() - self.driver_private)

    def take(self, index: int, device: str, n_running: int, ordinal: int, jit: str
             ) -> Worker | None:
        """Worker ``index``, if it was started as the run now asks for it (the same
        device and kernels, and the same share of the cores), no longer kept here;
        None otherwise (one started otherwise is told to exit)."""
        w = self.workers.pop(index, None)
        if w is None:
            return None
        if (device, n_running, jit) != (self.device, self.n_running, self.jit) or \
                w.device != ordinal or not w.process.is_alive():
            stop_all([w])
            return None
        return w

    def close(self) -> None:
        """Tell every worker not taken to exit (and wait for it: at most seconds)."""
        stop_all(self.workers.values())
        self.workers.clear()


def how_many(budget: Any, smallest: int, data: int, main: int | None = None,
             known: Measured | bool | None = True) -> int:
    """How many workers of each device a run of ``budget`` may start ahead of itself
    (see the module's text), its smallest candidate's heap ``smallest`` bytes, its data
    set ``data`` bytes (in shared memory) and its driver ``main`` bytes now (default:
    this process's PSS less the data, as the run will measure it); ``known``: the costs
    remembered on this machine (True: read them)."""
    jit = for_workers(budget.kernels, budget.memory, budget.workers, device=budget.device)
    if known is True:
        known = load_constants(machine_key(budget.device, jit))
    if not isinstance(known, Measured):
        return 0
    ndev = len(budget.ordinals or [0])
    per = budget.memory
    host = 0 if budget.device != "cpu" else \
        -(-(2 * (max(0, pss() - data) if main is None else main) + known.tracker + data)
          // ndev)
    return min(budget.workers, workers_that_fit(per - headroom(per), host, known.worker,
                                                admitted_heap(smallest, budget.device)))


def prestart(budget: Any, smallest: int = 0, data: int = 0, *, each: int | None = None,
             ctx: SpawnContext | None = None) -> Prestarted:
    """Spawn, without their data, ``each`` workers per device of a run of ``budget`` (a
    space's :class:`~explore.space.Budget`; default: as many as :func:`how_many` allows
    for its smallest candidate's heap ``smallest`` and its data set's ``data`` bytes):
    each warms up while the caller goes on.  Pass the result to the run's
    :class:`~.loop.Scheduler` (``prestarted=``), and :meth:`Prestarted.close` it whether
    or not the run took them."""
    ordinals = list(budget.ordinals or [0])
    if each is None:
        each = how_many(budget, smallest, data)
    n = each * len(ordinals)
    jit = for_workers(budget.kernels, budget.memory, budget.workers, device=budget.device)
    gc.collect()
    release_heap_memory()  # as the run measures the driver
    started = Prestarted(budget.device, n, jit, driver_pss=pss(),
                         driver_private=uss())
    ctx = ctx or mp.get_context("spawn")
    try:
        for i in range(n):
            started.workers[i] = spawn(ctx, i, None, budget.device, n,
                                       ordinals[i % len(ordinals)], jit=jit)
    except BaseException:
        started.close()
        raise
    return started
