"""What the decision core (:mod:`.core`) is told and what it asks for.

Events come in from the loop (a worker's message, a worker's death, a candidate
admitted, the clock, Ctrl-C); commands go out, in the order they are to be carried out.
Both are plain data: the core never touches a process, a pipe, a clock or a storage,
so a test or a simulation (``tests/explore/scheduler/``) drives it with events and
checks the commands, without any.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from optuna.trial import TrialState

from explore.scheduler.placement import Stack
from explore.scheduler.protocol import Done, Report, SwitchedOut, ToWorker, TrialFailed
from explore.scheduler.stacking import Pending

# -- events: what the loop tells the core ---------------------------------------------


@dataclass(frozen=True)
class Tick:
    """The time now (seconds since the run began): what the records' times read."""

    now: float


@dataclass(frozen=True)
class Admitted:
    """A candidate (or a stack of them) compiled and sized: it waits for room, or, drawn
    ``ahead`` of its turn, until :meth:`~explore.scheduler.core.Core.release` lets it."""

    pending: Pending
    ahead: bool = False


@dataclass(frozen=True)
class Reported:
    """A trial's report after a round, from worker ``worker``."""

    worker: int
    msg: Report


@dataclass(frozen=True)
class Finished:
    """A trial trained all its rounds (or a stack's member did)."""

    worker: int
    msg: Done


@dataclass(frozen=True)
class Failed:
    """A trial failed in its worker (an error, or its loss diverged)."""

    worker: int
    msg: TrialFailed


@dataclass(frozen=True)
class RegroupedStack:
    """The worker copied a stack's members out: the stack's region is free."""

    worker: int
    number: int


@dataclass(frozen=True)
class LeftArena:
    """A trial's state is in its file and its region of the worker's arena is free."""

    worker: int
    msg: SwitchedOut


@dataclass(frozen=True)
class WorkerDied:
    """Worker ``worker`` is gone (its process ended, or a send to it failed)."""

    worker: int
    exitcode: int | None
    pid: int


@dataclass(frozen=True)
class Idle:
    """Nothing runs: only paused trials are held, and no result can come to promote
    them."""


@dataclass(frozen=True)
class Interrupted:
    """Ctrl-C, SIGTERM or SIGHUP: every trial in hand fails and is queued again."""


Event = Tick | Admitted | Reported | Finished | Failed | RegroupedStack | LeftArena | \
    WorkerDied | Idle | Interrupted


# -- commands: what the core asks the loop to do --------------------------------------


@dataclass(frozen=True)
class Launch:
    """Start ``pending`` in worker ``worker`` at ``offset`` of its arena, as ``program``
    (as ``stack``, a new stack, when it holds several trials)."""

    worker: int
    pending: Pending
    offset: int
    program: Any  # engine.Program
    stack: Stack | None


@dataclass(frozen=True)
class Send:
    """Send ``msg`` (Continue, Pause, Stop, Regroup, SwitchOut or SwitchIn) to worker
    ``worker``."""

    worker: int
    msg: ToWorker


@dataclass(frozen=True)
class Note:
    """Add ``values`` to the trial's record; ``write``: store it now; ``ending``: the
    trial is about to end, and its end stores the record."""

    trial: Any  # optuna.trial.Trial
    values: dict[str, Any] = field(default_factory=dict)
    write: bool = False
    ending: bool = False


@dataclass(frozen=True)
class Moved:
    """A stack's member was moved into a new program (appended to its ``moves``)."""

    number: int
    move: dict[str, Any]


@dataclass(frozen=True)
class Tell:
    """End the trial in the study: ``values`` (COMPLETE) or ``state``; ``retry``: queue
    a trial with its parameters again; ``saved``: its worker saved its model."""

    trial: Any  # optuna.trial.Trial
    values: Any = None
    state: TrialState | None = None
    retry: bool = False
    saved: bool = False


@dataclass(frozen=True)
class DropState:
    """Trial ``number`` ended while switched out: its state's file is not needed."""

    number: int


@dataclass(frozen=True)
class Measure:
    """The accounting changed: measure and show it."""


Command = Launch | Send | Note | Moved | Tell | DropState | Measure
