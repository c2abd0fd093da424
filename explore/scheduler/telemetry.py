"""What a run measured: the accounting at every change (the packing timeline), the
trials' outcomes, the constants it charged to the budget and the peak memory of its
whole process tree as the operating system counts it."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from explore.live import StorageTime
    from explore.scheduler.placement import Worker

from explore.procmem import PssMeter, children, gpu_processes

# The process tree's memory is sampled at most this often (seconds): the accounting is
# sampled after every event (several a second per worker).  Each process's PSS is read
# through a meter (:class:`explore.procmem.PssMeter`): in full now and then, as a full
# read walks every page of the process, and from its anonymous pages in between.
SAMPLE_EVERY = 0.2
# On a GPU the driver's management library is asked instead: it lists every process
# of every device in one call, but starting the library is slower than reading /proc.
SAMPLE_EVERY_GPU = 1.0


@dataclass
class Sample:
    """The accounting at one moment (the packing timeline)."""

    t: float
    heaps: int  # bytes of trial heaps placed
    fixed: int  # data and worker overheads
    waiting: int  # candidates compiled and waiting for room
    remaining: int = 0  # trials not yet asked


@dataclass
class RunStats:
    """A run's figures, handed to the progress callback after every change and
    returned by :meth:`explore.scheduler.Scheduler.run`."""

    budget: int
    arena: int = 0
    data: int = 0  # the shared data set, counted once
    # the part of it that is not shared memory (a folder on disk where no RAM file
    # system is at hand): the processes' own pages (procmem.PssMeter.read_own) hold it
    data_unshared: int = 0
    main: int = 0  # the scheduler's own process, measured at the start (data excluded)
    tracker: int = 0  # multiprocessing's resource tracker process
    overheads: list[int] = field(default_factory=list)  # each worker's, after its warm-up
    growth: int = 0  # what the processes grew by during the run, beyond the constants
    headroom: int = 0  # held back for the drift of shared pages' PSS (see HEADROOM)
    timeline: list[Sample] = field(default_factory=list)
    measured_peak: int = 0  # the process tree's PSS at its highest (procmem.tree_pss)
    notes: list[str] = field(default_factory=list)  # what the run decided and why
    devices: list[int] = field(default_factory=lambda: [0])  # budget.devices
    device: str = "cpu"  # where trials ran: "gpu" measures device memory, not PSS
    kernels: str = ""  # the workers' kernels: "numpy" or "compiled" ("": not said)
    started_ahead: int = 0  # workers the run took from those started ahead of it
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("complete", "pruned", "failed", "running", "waiting", "paused", "resumed"), 0))
    best: float | None = None
    # this driver's time in the study's storage (explore.live.StorageTime), its own
    # figures as the run goes on: final once the run has returned
    storage: StorageTime | None = None
    # Paused trials switched out of an arena to a file (counts["switched_out"] and
    # ["switched_in"] say how often): the bytes of state written out in all, and the
    # folder they went to (the Scheduler's SwitchFolder, removed when the run ends).
    switch_bytes: int = 0
    switch_folder: str | None = None
    # Where the time went (explore.utilisation): each worker's seconds by what they
    # went to (protocol.SPENT, by worker index, as it last said), the model FLOPs of the
    # trials that ended (training and validating the rounds they reported), the
    # driver's seconds asking for candidates (sampling and compiling them), the run's
    # wall time and the machine's GEMM peak (FLOP/s, explore.scheduler.peak).
    spent: dict[int, dict[str, float]] = field(default_factory=dict)
    flops: dict[str, int] = field(default_factory=lambda: {"train": 0, "valid": 0})
    asking_s: float = 0.0
    wall_s: float = 0.0
    peak_flops: float | None = None

    @property
    def fixed(self) -> int:
        """What the budget holds besides the trials' heaps: the processes' constants and
        the data (``growth`` beyond them is kept apart: the scheduler places less while
        there is any)."""
        return self.main + self.tracker + sum(self.overheads) + self.data

    @property
    def peak(self) -> int:
        """The planned peak: the most the accounting ever held (heaps and constants)."""
        return max((s.heaps + s.fixed for s in self.timeline), default=0)

    def record(self, sample: Sample) -> None:
        """Add ``sample`` to the timeline; what is placed must fit the budget."""
        if sample.heaps + sample.fixed > self.budget:
            raise AssertionError(f"placed {sample.heaps + sample.fixed:,} bytes over a "
                                 f"budget of {self.budget:,}")
        self.timeline.append(sample)

    def packing_efficiency(self, of: int | None = None) -> float | None:
        """Time-weighted mean fraction of the budget (or of ``of`` bytes) held by trial
        heaps while trials were waiting: compiled and waiting for room, or not yet
        asked (None if the run never had any)."""
        num = den = 0.0
        for a, b in zip(self.timeline, self.timeline[1:], strict=False):
            if a.waiting or a.remaining:
                num += (b.t - a.t) * a.heaps / (of or self.budget)
                den += b.t - a.t
        return num / den if den else None


    def switching(self) -> dict[str, Any]:
        """What the run switched out of its arenas: how often trials left and came back,
        the bytes written out, and the folder the states went to.

        >>> s = RunStats(100, switch_bytes=4_000, switch_folder="/a/.switched/h-1-x")
        >>> s.counts.update(switched_out=2, switched_in=1)
        >>> s.switching()
        {'switched_out': 2, 'switched_in': 1, 'bytes': 4000, 'folder': '/a/.switched/h-1-x'}
        """
        return {"switched_out": self.counts.get("switched_out", 0),
                "switched_in": self.counts.get("switched_in", 0),
                "bytes": self.switch_bytes, "folder": self.switch_folder}

    def work(self) -> dict[str, Any]:
        """Where the run's time went, for :mod:`explore.utilisation`: the wall time,
        the workers, their seconds summed by what they went to, the model FLOPs, the
        driver's seconds asking, and the machine's peak.

        >>> s = RunStats(100, overheads=[1, 1], wall_s=10.0, peak_flops=1e11)
        >>> s.spent = {0: {"train": 6.0, "valid": 2.0}, 1: {"train": 7.0, "valid": 1.0}}
        >>> s.work()["spent"], s.work()["workers"]
        ({'train': 13.0, 'valid': 3.0}, 2)
        """
        total: dict[str, float] = {}
        for by_what in self.spent.values():
            for k, v in by_what.items():
                total[k] = total.get(k, 0.0) + v
        return {"wall_s": round(self.wall_s, 3), "workers": len(self.overheads),
                "spent": {k: round(v, 3) for k, v in total.items()},
                "flops": dict(self.flops), "asking_s": round(self.asking_s, 3),
                "peak_flops": self.peak_flops, "device": self.device,
                "kernels": self.kernels}

    def record_dict(self) -> dict[str, Any]:
        """What a study keeps of the run (``study.user_attrs["runs"]``): the budget, the
        constants charged to it, the planned and the measured peak, packing efficiency,
        what the run decided, the time spent in the study's storage, what it switched
        out of its arenas (:meth:`switching`), and the packing timeline."""
        return {"budget": self.budget, "arena": self.arena, "data": self.data,
                "main": self.main, "tracker": self.tracker, "overheads": self.overheads,
                "growth": self.growth, "headroom": self.headroom,
                "workers": len(self.overheads), "started_ahead": self.started_ahead,
                "devices": self.devices,
                "device": self.device,
                "peak": self.peak, "measured_peak": self.measured_peak,
                "packing_efficiency": self.packing_efficiency(), "notes": self.notes,
                "storage": self.storage.as_dict() if self.storage is not None else None,
                "switching": self.switching(), "work": self.work(),
                "timeline": [[round(s.t, 3), s.heaps, s.fixed, s.waiting]
                             for s in self.timeline]}


Progress = Callable[[RunStats], None]


class MemorySampler:
    """Keeps ``stats.measured_peak``, the PSS of this process and all its descendants,
    read at most every ``SAMPLE_EVERY`` seconds, each process through a
    :class:`~explore.procmem.PssMeter` (or at once and in full when asked), and
    ``stats.growth``: how far the processes have grown beyond the constants charged for
    them.  The workers' part of that comes from their own reports (their memory less
    the heaps they hold, measured together), so a heap given back a moment before the
    scheduler hears of it is never taken for growth.

    On a GPU (``device="gpu"``) the budget is device memory: the peak is the device
    memory the driver lists for this process and its descendants (the workers; the
    scheduler itself makes no CUDA context, so it holds none), and a worker's growth is
    its device memory beyond its arena and its measured constant (a worker holds its
    whole arena from the start, so its heaps need no report).  The scheduler's own
    process is counted too, should it hold any.  Where the driver lists no processes,
    nothing is measured there."""

    def __init__(self, stats: RunStats, enabled: bool = True, this_process: bool = True,
                 baseline: int = 0, device: str = "cpu") -> None:
        self.stats = stats
        self.enabled = enabled
        self.device = device
        # Whether this process is the run's (measured), or a bigger one (a test, a
        # notebook) of which the run is charged ``stats.main`` as it said.
        self.this_process = this_process
        self.baseline = baseline  # of this process, not the run's (see Scheduler)
        self._at = -SAMPLE_EVERY
        self._meters: dict[int | str, PssMeter] = {}

    def measure(self, workers: Iterable[Worker], now: bool = False) -> None:
        t = time.monotonic()
        every = SAMPLE_EVERY_GPU if self.device == "gpu" else SAMPLE_EVERY
        if not self.enabled or (not now and t - self._at < every):
            return
        self._at = t
        s = self.stats
        ws = list(workers)
        if self.device == "gpu":
            self._measure_device(ws)
            return
        pids = {w.pid for w in ws}
        if self.this_process:
            me = self._meter("self")
            main = max(0, me.read(now) - self.baseline)
            main_own = max(0, main - me.shmem)
        else:
            main = main_own = s.main
        kids = children()
        others = {c: self._meter(c).read(now) for c in kids}
        for gone in set(self._meters) - {"self", *kids}:
            del self._meters[gone]
        tracker = sum(v - self._meters[c].shmem for c, v in others.items() if c not in pids)
        if not now and main + sum(others.values()) > s.measured_peak:
            # a new peak is read in full: between full readings a meter adds the change
            # of the kernel's count of anonymous pages, which was seen tens of MB above
            # what a full reading gave at that moment (a rotating run's worker: 262.8
            # against 239.1 MB), and the record's peak went over a budget kept
            self.measure(ws, now=True)
            return
        s.measured_peak = max(s.measured_peak, main + sum(others.values()))
        if s.overheads:  # started: the constants are known
            # each process's own pages, the data set's shared ones apart: those are
            # charged whole as ``data``, and every process's share of them moves as
            # another first reads a page, seen by two meters at different moments
            now_bytes = main_own + tracker + sum(w.overhead_now or w.overhead for w in ws)
            s.growth = max(s.growth, now_bytes - (s.fixed - s.data + s.data_unshared))

    def _meter(self, pid: int | str) -> PssMeter:
        meter = self._meters.get(pid)
        if meter is None:
            meter = self._meters[pid] = PssMeter(pid)
        return meter

    def _measure_device(self, ws: list[Worker]) -> None:
        listed = gpu_processes()
        if not listed:
            return
        s = self.stats
        run = {*children(), *([os.getpid()] if self.this_process else [])}
        s.measured_peak = max(s.measured_peak,
                              sum(v for pid, v in listed.items() if pid in run))
        if s.overheads and all(w.arena for w in ws):  # started, each arena open
            # each worker's own growth: one reading under its constant (a page the
            # driver has not mapped yet) does not cancel another's growth
            grown = sum(max(0, listed.get(w.pid, w.overhead + w.arena) - w.arena -
                            w.overhead) for w in ws)
            s.growth = max(s.growth, grown)
