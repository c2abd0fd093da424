"""How close a run came to what the machine can do: its model FLOPs against the
machine's GEMM peak, and where the rest of its time went.

The compiler knows every op's FLOPs (:mod:`engine.runtime.flops`), so a trial's work is
counted, not estimated: each round trains its rows (forward, backward and one optimizer
update per mini-batch) and validates its rows (forward), at the trial's own model
(:func:`round_flops`; a stack's FLOPs are divided among its models).  This is the
large-model trainers' *model FLOPs utilisation* (MFU): what the model needs, not what a
kernel happened to do (a sparse kernel that skips zeros does not count less; a round
begun and abandoned for a pruned trial does not count at all).

The peak is one number per machine (:mod:`explore.scheduler.peak`: float32 GEMMs on
every core, or the device's), so the run's utilisation is its FLOPs over its wall time
over that peak, and a trial's is its FLOP rate over its worker's share of the peak (the
peak divided among the workers).  The workers' time (workers x wall seconds) is split
by what it went to (:data:`explore.scheduler.protocol.SPENT`): training, validating,
rounds lost to pruning, switching trials in and out, binding programs, and waiting.

>>> u = of_run({"work": {"wall_s": 10.0, "workers": 2, "peak_flops": 1e11,
...     "flops": {"train": 6e11, "valid": 2e11}, "asking_s": 0.5,
...     "spent": {"train": 12.0, "valid": 3.0, "lost": 1.0, "switch": 0.5, "setup": 0.5}}})
>>> round(u.utilisation, 2), round(u.achieved / 1e9), u.shares["idle"]
(0.8, 80, 0.15)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.runtime.train import refresh_batches, running_statistics

# What a worker's time went to, in the order shown; "idle" is the rest of its life.
PARTS = ("train", "valid", "lost", "switch", "setup", "idle")
WORDS = {"train": "training", "valid": "validating", "lost": "rounds lost to pruning",
         "switch": "switching in and out", "setup": "binding programs",
         "idle": "waiting (starting, for candidates and for the pruner's word)"}


def round_flops(program: Any, train_batch: int, rows: tuple[int, int], models: int = 1,
                refresh: int = 0) -> tuple[int, int]:
    """One model's FLOPs in a round of ``program``: training ``rows[0]`` rows in
    mini-batches of ``train_batch`` (the forward and backward passes of its ``train``
    path per row, and one optimizer update per mini-batch) and validating ``rows[1]``
    rows (its ``eval`` path, forward, and where the program keeps running statistics
    the ``train`` path's forward of the ``refresh`` mini-batches that refresh them:
    :func:`engine.runtime.train.refresh_statistics`); a stack's (``models``) divided
    among its models.  A path the program lacks counts 0.

    >>> from engine import Adam, compile_graph
    >>> from engine.models import paper_mlp
    >>> prog = compile_graph(paper_mlp(), batch_size=64, optimizer=Adam(lr=1e-3))
    >>> train, valid = round_flops(prog, 64, (640, 0))
    >>> train == 10 * prog.flops.train_step("train") and valid == 0
    True
    """
    flops = program.flops
    names = {p.name for p in program.paths}
    n_train, n_valid = rows
    train = valid = 0.0
    if "train" in names and n_train:
        per_row = (flops.forward["train"] + flops.backward["train"]) / program.batch_size
        train = n_train * per_row + math.ceil(n_train / max(train_batch, 1)) * flops.update
    if "eval" in names and n_valid:
        valid = n_valid * flops.per_row("eval")
        if refresh and running_statistics(program):
            valid += refresh_batches(n_train, refresh, train_batch) * train_batch * \
                flops.forward["train"] / program.batch_size
    return round(train / models), round(valid / models)


@dataclass(frozen=True)
class Utilisation:
    """A run's utilisation (:func:`of_run`)."""

    wall_s: float
    workers: int
    peak: float | None  # the machine's GEMM peak, FLOP/s (None: not measured)
    flops: dict[str, float]  # model FLOPs of the trials that ended: train, valid
    seconds: dict[str, float]  # the workers' seconds by PARTS
    asking_s: float = 0.0  # the driver's seconds sampling and compiling candidates
    device: str = "cpu"
    shares: dict[str, float] = field(default_factory=dict)  # of the workers' time
    kernels: str = ""  # the workers' kernels, numpy or compiled ("": not recorded)

    @property
    def total_flops(self) -> float:
        return sum(self.flops.values())

    @property
    def achieved(self) -> float:
        """The run's model FLOPs per second of wall time."""
        return self.total_flops / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def utilisation(self) -> float | None:
        """:attr:`achieved` as a share of the peak (None: no peak)."""
        return self.achieved / self.peak if self.peak else None

    @property
    def while_training(self) -> float | None:
        """The training FLOP rate while training, as a share of a worker's part of the
        peak: how well the kernels run, apart from the time between them."""
        busy = self.seconds.get("train", 0.0)
        if not self.peak or busy <= 0 or not self.workers:
            return None
        return self.flops.get("train", 0.0) / busy / (self.peak / self.workers)

    @property
    def while_validating(self) -> float | None:
        """As :attr:`while_training`, for validation."""
        busy = self.seconds.get("valid", 0.0)
        if not self.peak or busy <= 0 or not self.workers:
            return None
        return self.flops.get("valid", 0.0) / busy / (self.peak / self.workers)


def of_run(run: Mapping[str, Any]) -> Utilisation | None:
    """The utilisation of a run's record (``study.user_attrs["runs"][i]``), or None for
    a run recorded without it (before it was measured) or that never ran a worker."""
    work = run.get("work")
    if not work or not work.get("workers") or not work.get("wall_s"):
        return None
    capacity = work["workers"] * work["wall_s"]
    spent = {k: float(work.get("spent", {}).get(k, 0.0)) for k in PARTS if k != "idle"}
    spent["idle"] = max(0.0, capacity - sum(spent.values()))
    return Utilisation(float(work["wall_s"]), int(work["workers"]), work.get("peak_flops"),
                       {k: float(v) for k, v in (work.get("flops") or {}).items()}, spent,
                       float(work.get("asking_s", 0.0)), work.get("device", "cpu"),
                       {k: round(v / capacity, 4) for k, v in spent.items()},
                       str(work.get("kernels") or ""))


def trial_rate(record: Mapping[str, Any]) -> float | None:
    """A trial's model FLOPs per second of its worker's time on it (a stack's member:
    the stack's time, shared by its models), from its record's ``flops``, ``busy_s`` (or
    ``train_seconds``) and ``stack``; None where its record lacks them."""
    flops = record.get("flops")
    busy = record.get("busy_s") or record.get("train_seconds")
    if not flops or not busy:
        return None
    stack = record.get("stack") or {}
    return float(flops) * int(stack.get("models", 1) or 1) / float(busy)


def flop_rate(x: float) -> str:
    """FLOP/s the way the summary writes them.

    >>> flop_rate(1.234e11), flop_rate(5.6e8), flop_rate(2.5e13)
    ('123 GFLOP/s', '0.56 GFLOP/s', '25.0 TFLOP/s')
    """
    if x >= 1e13:
        return f"{x / 1e12:.1f} TFLOP/s"
    return f"{x / 1e9:.3g} GFLOP/s" if x < 1e11 else f"{x / 1e9:.0f} GFLOP/s"


def describe(u: Utilisation) -> list[str]:
    """The lines the summary and ``explore show`` print: the utilisation, then where the
    workers' time went, largest first.

    >>> u = of_run({"work": {"wall_s": 10.0, "workers": 2, "peak_flops": 1e11,
    ...     "flops": {"train": 4e11, "valid": 1e11}, "spent": {"train": 10.0, "valid": 2.0}}})
    >>> first, second = describe(u)
    >>> first.split(" (")[0], first.split("; ")[1][:-1]
    ("utilisation: 50% of the machine's peak", '0.5 TFLOP of model arithmetic in 10.0 s')
    >>> second.split(": ")[1][:57]
    'training 50% (at 80% of their peak), waiting (starting, f'
    >>> second.split(", ")[-1]
    'validating 10% (at 100%)'
    """
    head = (f"{u.total_flops / 1e12:.3g} TFLOP of model arithmetic in {u.wall_s:.1f} s")
    if u.utilisation is None or u.peak is None:
        lines = [f"utilisation: {flop_rate(u.achieved)} ({head}; the machine's peak was "
                 "not measured)"]
    else:
        lines = [f"utilisation: {u.utilisation:.0%} of the machine's peak "
                 f"({flop_rate(u.achieved)} of {flop_rate(u.peak)}; {head})"]
    at = {"train": u.while_training, "valid": u.while_validating}
    parts, said_peak = [], False
    for k in sorted(PARTS, key=lambda k: -u.shares.get(k, 0.0)):
        share, rate = u.shares.get(k, 0.0), at.get(k)
        if share < 0.005:
            continue
        tail = "" if rate is None else f" (at {rate:.0%})" if said_peak else \
            f" (at {rate:.0%} of their peak)"
        said_peak = said_peak or rate is not None
        parts.append(f"{WORDS[k]} {share:.0%}{tail}")
    kernels = f", {u.kernels} kernels" if u.kernels else ""
    lines.append(f"the workers' {u.workers * u.wall_s:.1f} s{kernels}: " + ", ".join(parts))
    if u.asking_s >= 0.05:
        lines.append(f"the driver: {u.asking_s:.1f} s claiming, sampling and compiling "
                     f"candidates ({u.asking_s / u.wall_s:.0%} of the run)")
    return lines
