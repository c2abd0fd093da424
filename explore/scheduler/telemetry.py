"""What a run measured: the accounting at every change (the packing timeline), the
trials' outcomes and the peak resident memory of the scheduler and its workers."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from explore.worker import rss_bytes

# Resident sizes are read from /proc at most this often (seconds): a read is ~0.1 ms
# per process, and the accounting is sampled after every event (5 a second per
# worker on the paper's space); resident memory changes slowly.
RSS_EVERY = 0.2


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
    data: int = 0
    overheads: list[int] = field(default_factory=list)
    timeline: list[Sample] = field(default_factory=list)
    rss_peak: int = 0  # measured: the scheduler's and the workers' resident memory, summed
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("complete", "pruned", "failed", "running", "waiting", "paused", "resumed"), 0))
    best: float | None = None

    @property
    def peak(self) -> int:
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


Progress = Callable[[RunStats], None]


class RssSampler:
    """Keeps ``stats.rss_peak``: the resident memory of this process and the workers',
    summed, read at most every ``RSS_EVERY`` seconds."""

    def __init__(self, stats: RunStats) -> None:
        self.stats = stats
        self._at = -RSS_EVERY

    def measure(self, pids: Iterable[int], now: bool = False) -> None:
        t = time.monotonic()
        if now or t - self._at >= RSS_EVERY:
            self._at = t
            rss = rss_bytes() + sum(rss_bytes(pid) for pid in pids)
            self.stats.rss_peak = max(self.stats.rss_peak, rss)
