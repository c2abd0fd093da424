"""Workers started early: while the driver opens its study and readies the run.

A worker takes about a second to start (a spawned interpreter importing the engine,
numba and its cached kernels when they are on, then a warm-up), and until now the driver
started its workers only once everything of its own was ready: the study opened (a
database's schema checked), the scheduler built.  :meth:`EarlyWorkers.start` spawns
them as soon as the run's data is loaded, so they start while the driver does the rest;
the scheduler then takes them (:meth:`EarlyWorkers.take`) where it would have spawned
its own, and ends those it does not take.

They start only where the run is sure to use them as they are: the workers' cost on this
machine known from an earlier run (:mod:`.constants`; the first run measures one worker
on its own) and the budget holding every worker asked for beside the driver as it is
now (:func:`.admission.workers_held`, the scheduler's own rule), so that they never take
memory the run would not give them.  A worker whose settings (kernels, thread share,
device) are not those the scheduler decides is ended and another spawned.

The scheduler charges its own process what it would hold with no worker beside it (its
PSS alone: see :mod:`explore.procmem`), since a worker that dies gives its share of the
pages they map together back to it.  Measured once workers run, its PSS would be that
share short; so the driver's PSS is read before they start, and what it maps later is
added as its resident size grows (:meth:`EarlyWorkers.driver_alone`: a page it maps
later counts whole, which is never less than its share).

>>> EarlyWorkers.none().take(0, 0, "0", 2) is None
True
"""

from __future__ import annotations

import gc
import multiprocessing as mp
from dataclasses import dataclass, field

from explore.binding import BoundSpace
from explore.procmem import pss, rss
from explore.scheduler import admission
from explore.scheduler.constants import load as load_constants
from explore.scheduler.constants import machine_key
from explore.scheduler.kernels import for_workers
from explore.scheduler.placement import Worker
from explore.scheduler.processes import spawn
from explore.scheduler.shared_arrays import SharedArrays
from explore.scheduler.worker import release_heap_memory


@dataclass
class EarlyWorkers:
    """Workers spawned before the scheduler that will use them exists, by index, with
    the settings they were started with; and the driver's memory when they started."""

    workers: dict[int, Worker] = field(default_factory=dict)
    jit: str = "0"  # their CALCGRAPH_JIT
    share: int = 1  # the workers the cores were shared among (their BLAS threads)
    pss_before: int = 0  # the driver's PSS and resident size just before they started
    rss_before: int = 0

    @classmethod
    def none(cls) -> EarlyWorkers:
        """No worker started early (the scheduler then spawns every one)."""
        return cls()

    @classmethod
    def start(cls, bound: BoundSpace, data: SharedArrays, *, workers: int, memory: int,
              device: str, devices: list[int] | None = None, smallest: int,
              baseline: int = 0) -> EarlyWorkers:
        """Spawn the ``workers`` (on each of ``devices``) a run of ``bound``'s space on
        ``data`` within ``memory`` bytes per device will start, as the scheduler would
        (:class:`~.loop.Scheduler`'s arguments), where it is sure to use them; else
        none.  ``smallest``: the smallest candidate's heap (:func:`.admission.admit`);
        ``baseline``: what the driver held before the run, not the run's."""
        ordinals = list(devices) if devices else [0]
        jit = for_workers(bound.space.budget.kernels, memory, workers, device=device)
        known = load_constants(machine_key(device, jit))
        if known is None:  # the first run here measures a worker on its own
            return cls.none()
        gc.collect()
        release_heap_memory()  # as the scheduler measures itself
        before_pss, before_rss = pss(), rss()
        host = 0  # on a GPU the host's memory is not the budget's
        if device == "cpu":
            main = max(0, before_pss - data.nbytes - baseline)
            host = -(-(main + known.tracker + data.nbytes) // len(ordinals))
        if admission.workers_held(memory, workers, host, known.worker, smallest,
                                  device) < workers:
            return cls.none()  # the scheduler starts fewer, each on a bigger share
        share = workers * len(ordinals)
        ctx = mp.get_context("spawn")
        early = cls(jit=jit, share=share, pss_before=before_pss, rss_before=before_rss)
        try:
            for i in range(share):
                early.workers[i] = spawn(ctx, i, data.spec, device, share,
                                         ordinals[i % len(ordinals)], jit=jit)
        except BaseException:
            early.close()
            raise
        return early

    @property
    def started(self) -> bool:
        """Whether workers were started early (taken since or not)."""
        return self.pss_before > 0

    def take(self, index: int, ordinal: int, jit: str, share: int) -> Worker | None:
        """Worker ``index``, started on device ``ordinal`` with kernels ``jit`` and a
        thread share of ``share`` workers, if one was started so; None otherwise (one
        started otherwise is ended)."""
        w = self.workers.pop(index, None)
        if w is None:
            return None
        if (w.device, self.jit, self.share) != (ordinal, jit, share):
            _end([w])
            return None
        return w

    def driver_alone(self) -> int:
        """The driver's PSS now as it would be with no worker beside it: its PSS
        before they started, and what its resident size has grown by since (a page it
        mapped since counted whole)."""
        return max(0, self.pss_before + rss() - self.rss_before)

    def close(self) -> None:
        """End the workers not taken: none holds anything of the run yet."""
        _end(list(self.workers.values()))
        self.workers.clear()


def _end(workers: list[Worker]) -> None:
    """Kill workers that hold no arena and no trial (killed, not asked: one still
    warming up would answer only once it is done)."""
    for w in workers:
        w.process.kill()
    for w in workers:
        w.process.join(timeout=10)
        w.conn.close()
