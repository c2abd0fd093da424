"""The state a run's parts share: :class:`~.scheduler.Scheduler` sets it, and each
part (:mod:`.startup`, :mod:`.relay`), a class of its own module, is checked against
what is declared here."""

from __future__ import annotations

import os
import time
from multiprocessing.context import SpawnContext
from typing import Any

from explore.binding import BoundSpace
from explore.keeper import ModelKeeper
from explore.live import LiveStudy
from explore.scheduler.core import Core
from explore.scheduler.placement import Worker
from explore.scheduler.prestart import Prestarted
from explore.scheduler.shared_arrays import SharedArrays
from explore.scheduler.stacking import Pending
from explore.scheduler.switched import SwitchFolder
from explore.scheduler.telemetry import MemorySampler, Progress, RunStats, Sample
from explore.space import Space


class RunState:
    """What every part of a run reads and changes (see :class:`~.scheduler.Scheduler`'s
    ``__init__`` for what each holds), the core's state as callers read it, and the
    run's accounting."""

    bound: BoundSpace
    space: Space
    device: str
    devices: list[int]
    per_device: int  # each device's budget
    keeper: ModelKeeper | None
    switch_dir: str | os.PathLike[str] | None
    switched: SwitchFolder | None
    prestarted: Prestarted | None
    smallest: int | None
    target_std: float
    live: LiveStudy
    n_workers: int
    n_running: int
    jit: str  # the workers' CALCGRAPH_JIT (explore.scheduler.kernels)
    main: int | None
    baseline: int
    stats: RunStats
    progress: Progress
    arrays: SharedArrays
    ctx: SpawnContext
    notes: dict[int, dict[str, Any]]
    rotation: int | None
    lockstep: bool
    gated: bool
    validate_every: int
    refresh_statistics: int
    core: Core
    remaining: int
    memory: MemorySampler
    t0: float

    # The core's state, as tests and callers read it.
    @property
    def workers(self) -> dict[int, Worker]:
        return self.core.workers

    @property
    def waiting(self) -> list[Pending]:
        return self.core.waiting

    # -- accounting ----------------------------------------------------------------------
    def _sample(self) -> None:
        # trials drawn ahead are claimed but not yet let in (not waiting for room): to
        # come, as the trials not yet asked are
        ahead = sum(len(p.trials) for p in self.core.ahead)
        self.stats.record(Sample(time.time() - self.t0, self.core.heaps(), self.stats.fixed,
                                 len(self.waiting), self.remaining + ahead))
        self.memory.measure(self.workers.values())
        self.stats.counts["running"] = self.core.in_hand()
        self.stats.counts["waiting"] = len(self.waiting)
        self.progress(self.stats)
