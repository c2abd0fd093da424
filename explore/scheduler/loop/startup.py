"""The run's workers started within its budget: what the processes cost (measured, or
remembered from an earlier run on this machine: :mod:`explore.scheduler.constants`), how
many workers the budget holds, each one's arena (sized by
:mod:`explore.scheduler.admission`), and their end."""

from __future__ import annotations

import gc

from explore.procmem import children, pss, pss_and_shmem
from explore.scheduler import admission
from explore.scheduler.constants import Measured, machine_key, workers_that_fit
from explore.scheduler.constants import load as load_constants
from explore.scheduler.constants import save as save_constants
from explore.scheduler.errors import SchedulerError
from explore.scheduler.loop.state import RunState
from explore.scheduler.placement import Worker
from explore.scheduler.processes import attach_data, await_ready, open_arena, spawn, stop_all
from explore.scheduler.switched import SwitchFolder
from explore.scheduler.worker import release_heap_memory


class Startup(RunState):
    """Starting, sizing and stopping the run's worker processes."""

    def _spawn(self, index: int) -> Worker:
        # Each worker's share of the cores: of the workers that run (fewer than asked
        # when the budget holds fewer), once that is known.  Workers take the devices
        # in turn, so each has as many as the others (a replacement keeps its index).
        ordinal = self.devices[index % len(self.devices)]
        if self.prestarted is not None:  # one started ahead of the run, if it fits
            w = self.prestarted.take(index, self.device, self.n_running, ordinal, self.jit)
            if w is not None:
                try:
                    attach_data(w, self.arrays.spec)
                except SchedulerError:  # it died since: one is spawned in its place
                    stop_all([w])
                else:
                    self.stats.started_ahead += 1
                    return w
        return spawn(self.ctx, index, self.arrays.spec, self.device, self.n_running,
                     ordinal, jit=self.jit)

    def start(self) -> None:
        """Measure what the run costs before any trial, start as many workers as the
        budget holds (at most ``workers``), and give each an equal arena of the rest.

        The scheduler's own process is measured now (the data it has loaded excluded:
        that is counted once, as ``data``); a worker's cost and the resource tracker's
        come from an earlier run on this machine (:mod:`explore.scheduler.constants`) or,
        on the first, from starting one worker and measuring.  A budget that cannot hold
        the scheduler, one worker and the space's smallest candidate is refused with the
        minimum that would do; one that holds fewer workers than asked runs with fewer,
        and says so."""
        s = self.stats
        # first (or by the runner's admission): compiling is part of this process's cost
        smallest = admission.smallest_heap(self.bound) if self.smallest is None else self.smallest
        if self.main is not None:
            s.main = self.main
        elif self.device == "cpu":  # on a GPU the host processes hold none of the budget
            gc.collect()
            release_heap_memory()  # what loading the data freed goes back to the system
            total, shmem = pss_and_shmem()
            s.main = max(0, total - s.data - self.baseline)  # it wrote every data page
            s.data_unshared = max(0, s.data - shmem)
            if self.prestarted is not None and self.prestarted.driver_pss:
                # beside workers started ahead its shared pages are split with them
                s.main = max(s.main, self.prestarted.driver_alone() - s.data - self.baseline)
        key = machine_key(self.device, self.jit)
        known = load_constants(key)
        if known is None:  # the first run here: start one worker to measure one (even
            # for a budget about to be refused: the minimum it names must be right)
            self._start_workers(1)
            known = self._measured(key)
        per, ndev = self.per_device, len(self.devices)
        s.headroom = admission.headroom(per) * ndev
        n = min(self.n_workers, workers_that_fit(per - admission.headroom(per),
                                                 self._host_share(known.tracker),
                                                 known.worker,
                                                 admission.admitted_heap(smallest, self.device)))
        if n < 1:
            raise SchedulerError(self._too_small(smallest, known))
        self.n_running = n * ndev
        if self.prestarted is not None and self.prestarted.n_running != self.n_running:
            self.prestarted.close()  # none fits this run's share of the cores: gone
            # before any worker is spawned in their place
        self._start_workers(n * ndev - len(self.workers))
        known = self._measured(key)
        ws = list(self.workers.values())
        if n < self.n_workers:
            where = f"each device's budget of {per:,} bytes" if ndev > 1 else \
                f"the budget of {per:,} bytes"
            costs = (f"{known.worker:,} bytes of device memory before any trial (its CUDA "
                     f"context and libraries)" if self.device == "gpu" else
                     f"{known.worker:,} bytes before any trial, beside "
                     f"{s.main + s.tracker:,} for the scheduler and {s.data:,} for the data")
            s.notes.append(f"{where} holds {n} of the {self.n_workers} "
                           f"workers asked for: each costs {costs}")
        s.overheads = [w.overhead for w in ws]
        arenas = {d: self._arena_on(d, [w for w in ws if w.device == d])
                  for d in self.devices}
        if min(arenas.values()) < smallest:
            raise SchedulerError(self._too_small(smallest, known))
        self.switched = SwitchFolder(self.switch_dir)
        self.stats.switch_folder = str(self.switched.path)
        if self.switched.in_memory and self.device == "cpu" and self.core.switching:
            # there a state out would be memory beside the arenas (which the budget
            # counts whole): switching would add to the run's memory, not free any
            if self.rotation is not None:
                raise SchedulerError(
                    f"budget.in_flight: the trials waiting their turn are switched out "
                    f"to files under {self.switched.path.parent}, which is in memory "
                    f"(tmpfs) that the budget would not hold; set the space's artifacts "
                    f"to a folder on disk")
            self.core.switching = False
            self.stats.notes.append(
                f"paused trials are pruned for room instead of switched out: "
                f"{self.switched.path.parent} is in memory (tmpfs), which the budget "
                f"would not hold; set the space's artifacts to a folder on disk")
        if self.prestarted is not None:  # those the run did not take
            self.prestarted.close()
        for w in ws:
            open_arena(w, arenas[w.device], str(self.switched.path))
        s.arena = min(arenas.values())  # what a candidate is compiled to fit
        self._sample()

    def _host_share(self, tracker: int) -> int:
        """What each device carries of the processes' bytes that are no worker's (the
        scheduler, the resource tracker, the data): all of it with one device, an
        equal share with several simulated on the CPU (on a GPU the host's memory is
        not the budget's: none is measured there)."""
        s = self.stats
        return -(-(s.main + tracker + s.data) // len(self.devices))

    def _arena_on(self, device: int, ws: list[Worker]) -> int:
        """Each arena of ``ws``, the workers on ``device``: an equal part of what the
        device's budget leaves beside their overheads, its share of the host's bytes
        and its headroom."""
        per = self.per_device
        left = per - admission.headroom(per) - self._host_share(self.stats.tracker) - \
            sum(w.overhead for w in ws)
        return admission.arena_size(left // len(ws), self.device)

    def _start_workers(self, count: int) -> None:
        """Start ``count`` more workers (in parallel) and wait until each is ready."""
        ws = [self._spawn(len(self.workers) + i) for i in range(count)]
        for w in ws:
            self.workers[w.index] = w  # known to stop() from now on
        for w in ws:
            await_ready(w)

    def _measured(self, key: str) -> Measured:
        """The constants as this run's processes measure now; remembered for the next."""
        tracker = self._tracker_bytes() if self.device == "cpu" else 0
        m = Measured(max(w.overhead for w in self.workers.values()), tracker)
        save_constants(key, m)
        self.stats.tracker = m.tracker
        return m

    def _tracker_bytes(self) -> int:
        """multiprocessing's resource tracker (a child of this process, started with the
        first worker): every descendant that is not a worker."""
        workers = {w.pid for w in self.workers.values()}
        if self.prestarted is not None:  # started ahead of the run, not yet taken
            workers |= {w.process.pid for w in self.prestarted.workers.values()}
        return sum(pss(c) for c in children() if c not in workers)

    def _too_small(self, smallest: int, known: Measured) -> str:
        return admission.too_small(budget=self.per_device, devices=len(self.devices),
                         device=self.device, smallest=smallest, known=known,
                         host_share=self._host_share(known.tracker), main=self.stats.main,
                         data=self.stats.data)

    def stop(self) -> None:
        """End the workers, free the shared data set and remove the switched-out states."""
        stop_all(self.workers.values())
        if self.prestarted is not None:  # stopped before it took them all
            self.prestarted.close()
        self.arrays.close()
        if self.switched is not None:
            self.switched.close()
