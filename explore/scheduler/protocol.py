"""The messages between the scheduler and its workers: one frozen dataclass per kind.

What crosses the process boundary, and how:

- **At spawn**, as the arguments of :func:`explore.scheduler.worker.main` (pickled by
  ``multiprocessing``'s spawn method): the child end of a ``multiprocessing.Pipe``,
  the data set's :class:`explore.scheduler.shared_arrays.ArraySpec` per array (names and offsets in
  one shared-memory block: the arrays themselves are never pickled, each worker maps
  the same pages) and the device name.
- **Over the pipe**, every message is one instance of a class below, pickled by
  ``Connection.send``.  Everything in them is plain (ints, floats, strings, dicts of
  floats) except :attr:`Start.program`, the compiled :class:`engine.Program` itself:
  pickled, an order of magnitude faster than through its JSON, on the scheduler's
  thread while it fills the arenas.  Neither side keeps a reference to what it sent,
  and a message is not changed once made (``frozen``; the dicts inside are not to be
  mutated either).
- **Never**: trial heaps, VMs, arenas and random generators live in the worker only;
  Optuna's trials and studies in the scheduler only.

Scheduler -> worker (:data:`ToWorker`): :class:`Attach` once to a worker started before
its run's data was loaded (:mod:`explore.scheduler.prestart`), :class:`OpenArena` once,
then :class:`Start`, :class:`Regroup` (stacks), :class:`Continue`, :class:`Pause`,
:class:`Stop`, :class:`SwitchOut` and :class:`SwitchIn` for trials, and :class:`Exit`.
Worker -> scheduler (:data:`FromWorker`): :class:`Ready` after start-up,
:class:`ArenaOpened`, then :class:`Report`, :class:`Done`, :class:`SwitchedOut` and
:class:`TrialFailed` for trials (a stack's members each by their own number), and
:class:`Regrouped` for stacks. Trials are named by their Optuna number.

- **Through files**, a switched-out trial's state: written by the worker that held it
  to :func:`state_file` of the folder OpenArena names, read back by whichever worker
  switches it in (the scheduler only names the trial).

>>> import pickle
>>> pickle.loads(pickle.dumps(Report(3, 1, {"accuracy": 0.5}, 0.0))).metrics
{'accuracy': 0.5}
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

# -- scheduler -> worker --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Attach:
    """Map the run's data set, ``data`` (its arrays' specs in the shared block), then
    answer Ready: sent once to a worker started before the data was loaded, which
    warms up meanwhile."""

    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class OpenArena:
    """Allocate the worker's arena, once, of ``nbytes`` (answered by ArenaOpened);
    ``switch_dir``: the folder switched-out trials' states are written to."""

    nbytes: int
    switch_dir: str = ""


@dataclass(frozen=True, slots=True)
class Start:
    """Host trial ``number`` at ``offset`` in the arena and run it for ``rounds``
    rounds of mini-batches of ``train_batch`` rows (``program`` may be compiled for a
    bigger validation chunk).  A ``gated`` trial waits for Continue (or Pause) after
    each report; an ungated one goes straight on.  After each round the worker
    measures every metric whose eval-path outputs the program has
    (:mod:`explore.metrics`); ``target_std`` turns a regression's errors back into the
    target's units.  With ``save_to``, the trial's final weights are written there
    (:mod:`explore.weights`) before it is reported done."""

    number: int
    program: Any  # engine.Program
    offset: int
    seed: int
    rounds: int
    train_batch: int
    gated: bool
    target_std: float = 1.0
    save_to: str | None = None
    # A stack of trials (engine.compile.stack): their numbers in the program's model
    # order, and each one's save_to.  ``number`` is then the stack's own (negative, never
    # a trial's); the worker reports, pauses and stops each member by its trial number.
    members: tuple[int, ...] = ()
    member_save_to: tuple[str | None, ...] = ()
    # Validate after every k-th round and after the last (training.validate_every); a
    # round not validated is reported with its training figures alone (``validated``).
    validate_every: int = 1
    # Mini-batches forwarded before each validation where the program keeps running
    # statistics (training.refresh_statistics).
    refresh_statistics: int = 0


@dataclass(frozen=True, slots=True)
class Part:
    """What a :class:`Regroup` makes of some of a stack's members: a program (a smaller
    stack, or one member alone) at ``offset`` in the arena, named ``number`` (a
    member alone: its trial number), holding ``members`` in its model order;
    ``paused``: it waits at a rung."""

    number: int
    program: Any  # engine.Program
    offset: int
    members: tuple[int, ...]
    paused: bool = False


@dataclass(frozen=True, slots=True)
class Regroup:
    """Move the members of stack ``number`` into ``parts`` (each member's parameters and
    optimizer state, :func:`engine.runtime.members.move_member`), then drop the stack:
    its members in no part (pruned, failed) end there."""

    number: int
    parts: tuple[Part, ...]


@dataclass(frozen=True, slots=True)
class Continue:
    """Trial ``number`` goes on (a gated trial after its report, or a paused one)."""

    number: int


@dataclass(frozen=True, slots=True)
class Pause:
    """Trial ``number`` waits at a rung, its memory kept; the worker may start another."""

    number: int


@dataclass(frozen=True, slots=True)
class Stop:
    """Trial ``number`` is pruned: drop it (its round ends within ``STOP_EVERY``
    mini-batches)."""

    number: int


@dataclass(frozen=True, slots=True)
class SwitchOut:
    """Trial ``number`` (idle: paused at a rung or waiting for its word) leaves the
    arena: its state goes to its :func:`state_file` and its region is given back
    (answered by SwitchedOut, or TrialFailed where the file cannot be written).  A
    member of a stack leaves alone: ``program`` is the member's own (compiled apart,
    as a regroup would), whose layout its state is written in, so that it comes back
    as that program; the stack goes on without it (masked, until regrouped)."""

    number: int
    program: Any = None  # engine.Program: for a stack's member only


@dataclass(frozen=True, slots=True)
class SwitchIn:
    """Bring trial ``number`` back from its :func:`state_file` into the arena at
    ``offset``, as ``program`` (the one it ran as): it resumes exactly where it left,
    waiting for its word (Continue) as after a report."""

    number: int
    program: Any  # engine.Program
    offset: int


@dataclass(frozen=True, slots=True)
class Exit:
    """End the worker (even in the middle of a round)."""


ToWorker = (Attach | OpenArena | Start | Regroup | Continue | Pause | Stop | SwitchOut
            | SwitchIn | Exit)

# -- worker -> scheduler --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ready:
    """The worker has started: its fixed ``overhead`` in bytes (PSS on the CPU, device
    memory in use on the GPU) and its process id."""

    overhead: int
    pid: int


@dataclass(frozen=True, slots=True)
class ArenaOpened:
    """The arena of OpenArena is allocated."""


# What a worker's seconds went to since it started, as it sends them with each Report,
# Done and SwitchedOut (the run's utilisation, :mod:`explore.utilisation`): ``train``
# rounds trained to their end, ``valid`` validating after them, ``lost`` rounds begun
# and abandoned (the trial pruned or stopped meanwhile), ``switch`` writing trials out
# of the arena and reading them back, ``setup`` binding programs to the arena and
# initialising them (and moving a stack's members).  The rest of its life it waited.
SPENT = ("train", "valid", "lost", "switch", "setup")
# The seconds a Report's and a Done's ``metrics`` carry besides the metrics: the trial's
# own (training and validating, its ``busy_s``) and, of those, validating.
SECONDS = ("train_seconds", "valid_seconds")


@dataclass(frozen=True, slots=True)
class Report:
    """Trial ``number`` finished round ``round`` (from 1) with these validation
    ``metrics`` (each metric of the task by name, ``train_loss`` and
    ``train_seconds``: the worker's seconds on it so far); it was taken by the worker
    at ``started`` (``time.time()``)."""

    number: int
    round: int
    metrics: dict[str, float]
    started: float
    overhead: int = 0  # the worker's memory now beyond its trials' heaps (see Done)
    spent: dict[str, float] = field(default_factory=dict)  # the worker's time (see SPENT)
    validated: bool = True  # False: a round not validated (Start.validate_every)


@dataclass(frozen=True, slots=True)
class Done:
    """Trial ``number`` ran all its rounds: the last round's ``metrics`` and what the
    worker measured (rounds run, switches to it, seconds spent on it, and when it was
    taken and ended, ``time.time()``), ``saved``: whether its weights were written
    to Start's ``save_to``, and ``model_error``: why not, where writing them failed (a
    full or read-only model store: the result stands without its model)."""

    number: int
    metrics: dict[str, float]
    rounds: int
    switches: int
    busy_s: float
    started: float
    ended: float
    # The worker's memory now, less the regions of the trials it holds (this one's is
    # given back already): what its constant has become.  0 where not measured (GPU).
    overhead: int = 0
    saved: bool = False
    model_error: str = ""
    spent: dict[str, float] = field(default_factory=dict)  # the worker's time (see SPENT)


@dataclass(frozen=True, slots=True)
class Regrouped:
    """Stack ``number``'s members are in their new parts and its region is free."""

    number: int


@dataclass(frozen=True, slots=True)
class SwitchedOut:
    """Trial ``number``'s state is in its file (``nbytes``, written in ``seconds``) and
    its region of the arena is given back."""

    number: int
    nbytes: int
    seconds: float
    overhead: int = 0  # the worker's memory now beyond its trials' heaps (see Done)
    spent: dict[str, float] = field(default_factory=dict)  # the worker's time (see SPENT)


@dataclass(frozen=True, slots=True)
class TrialFailed:
    """Trial ``number`` raised (at start or in a round): ``reason`` says what; the
    worker has dropped it and goes on."""

    number: int
    reason: str


FromWorker = Ready | ArenaOpened | Report | Done | Regrouped | SwitchedOut | TrialFailed


def state_file(folder: str, number: int) -> str:
    """Where trial ``number``'s state is while it is switched out of every arena."""
    return os.path.join(folder, f"trial-{number}.state")
