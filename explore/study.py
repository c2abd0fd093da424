"""The Optuna side: storage, samplers, pruners, and what a trial records.

The default storage is a SQLite file next to the search-space file
(``search_spaces/quick.yaml`` -> ``search_spaces/quick.db``): an embedded database
that needs no server; any Optuna storage URL may be given instead.  The study is
named after the space, so running the same command again resumes it.

>>> from explore.space import parse_space
>>> s = parse_space({"dataset": "digits", "budget": {"trials": 1, "rounds": 1,
...     "memory": "64MB"}, "sampler": {"name": "random", "seed": 3}, "pruner": "hyperband"})
>>> type(make_sampler(s)).__name__, type(make_pruner(s)).__name__
('RandomSampler', 'HyperbandPruner')
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import Any, Protocol

import optuna
from optuna.trial import FrozenTrial, TrialState

from explore import pruners, samplers
from explore.optuna_adapter import storage_of, trial_id
from explore.pruners import PrunerArgs
from explore.samplers import SamplerArgs
from explore.space import Space
from explore.storages import connect

PARAMS_ATTR = "params"  # the full parameters (per-layer lists) of a trial
RECORD_ATTR = "explore"  # everything a trial records: sizes, placement, times, reasons


def default_storage(space_path: str | Path) -> str:
    p = Path(space_path).resolve()
    return f"sqlite:///{p.with_suffix('.db')}"


def storage_url(storage: str | Path | optuna.storages.BaseStorage
                ) -> optuna.storages.BaseStorage:
    """The storage ``storage`` names, opened to read a study and creating nothing: an
    Optuna storage as it is, a storage URL, or a plain path to a SQLite file
    (``search_spaces/quick.db``, a :class:`~pathlib.Path`).  A SQLite file that does
    not exist raises :class:`FileNotFoundError` naming it (opening it would create an
    empty one); a URL that cannot be opened,
    :class:`~explore.storages.StorageError` (:func:`explore.storages.connect`).

    >>> type(storage_url("sqlite:///:memory:")).__name__
    'RDBStorage'
    >>> storage_url("no/such/study.db")
    Traceback (most recent call last):
    ...
    FileNotFoundError: no SQLite database no/such/study.db (is the path right?)
    """
    if isinstance(storage, optuna.storages.BaseStorage):
        return storage
    text = str(storage)
    if isinstance(storage, Path) or "://" not in text:
        if not Path(text).is_file():
            raise FileNotFoundError(f"no SQLite database {text} (is the path right?)")
        text = f"sqlite:///{Path(text).resolve()}"
    return connect(text, write=False)


def make_sampler(space: Space) -> optuna.samplers.BaseSampler:
    """A new Optuna sampler for the space (:mod:`explore.samplers`)."""
    s = space.sampler
    seed = s.seed if s.seed is not None else space.budget.seed
    return samplers.get(s.name).create(SamplerArgs(seed, s.startup_trials,
                                                   len(space.objectives), space.params()))


def make_pruner(space: Space) -> optuna.pruners.BasePruner:
    """A new Optuna pruner for the space (:mod:`explore.pruners`); none for several
    objectives, which Optuna cannot prune by."""
    p = space.pruner
    if len(space.objectives) > 1:
        return optuna.pruners.NopPruner()
    return pruners.get(p.name).create(PrunerArgs(p.warmup_rounds, space.budget.rounds))


def open_study(space: Space, storage: str, name: str | None = None) -> optuna.Study:
    """Create the study, or load it to resume (same name, same directions).  The
    storage is checked first (:func:`explore.storages.connect`: a
    :class:`~explore.storages.StorageError` says what is wrong with it)."""
    directions: list[Any] = [o.dir for o in space.objectives]
    study = optuna.create_study(storage=connect(storage, write=True), study_name=name or space.name,
                                directions=directions, sampler=make_sampler(space),
                                pruner=make_pruner(space), load_if_exists=True)
    if [d.name.lower() for d in study.directions] != directions:
        raise ValueError(f"study {study.study_name!r} in {storage} optimises "
                         f"{[d.name.lower() for d in study.directions]}, the space asks for "
                         f"{directions}")
    return study


def working_copy(study: optuna.Study, space: Space) -> optuna.Study:
    """An in-memory study with ``study``'s name, finished trials, directions, sampler
    and pruner: the scheduler works on it and writes each trial back once, when it ends
    (:class:`StudyWriter`).  Optuna's relational storage reads every trial back for each
    ask, report and prune decision (13 ms a time for 60 trials in SQLite): over a
    search of small models that took a third of a core from the workers."""
    # The stored study's name: Hyperband assigns a trial to a bracket by a hash of the
    # study's name and the trial's number, and an unnamed study gets a random one.
    work = optuna.create_study(study_name=study.study_name, directions=list(study.directions),
                               sampler=make_sampler(space), pruner=make_pruner(space))
    done = [t for t in study.get_trials(deepcopy=False) if t.state.is_finished()]
    if done:
        work.add_trials(done)
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)):
        # Trials enqueued in the storage (study.enqueue_trial) run first, with their
        # parameters, and are written back into the same stored trial.
        work.enqueue_trial(t.system_attrs.get("fixed_params", t.params),
                           user_attrs={**t.user_attrs, STORED_ID: trial_id(t)})
    return work


STORED_ID = "explore_stored_id"  # the stored WAITING trial a working-copy trial fills


def add_trial(study: optuna.Study, trial: FrozenTrial) -> int:
    """``study.add_trial(trial)``, returning the number the stored trial got (the
    working copy numbers trials as they were asked, the storage as they end)."""
    storage = storage_of(study)
    trial_id = storage.create_new_trial(storage.get_study_id_from_name(study.study_name),
                                        template_trial=trial)
    return storage.get_trial_number_from_id(trial_id)


def write_trial(study: optuna.Study, trial: FrozenTrial) -> int:
    """Add a finished trial to ``study``, or fill in the stored trial it was enqueued
    as (left WAITING, it would run again in every later run); returns its number in
    the storage."""
    target = trial.user_attrs.get(STORED_ID)
    if target is None:
        return add_trial(study, trial)
    attrs = {k: v for k, v in trial.user_attrs.items() if k != STORED_ID}
    storage = storage_of(study)
    try:
        claimed = storage.set_trial_state_values(target, TrialState.RUNNING)
    except (KeyError, RuntimeError):  # gone, or finished meanwhile by someone else
        claimed = False
    if not claimed:  # another process took it: keep this result as a trial of its own
        return add_trial(study, optuna.trial.create_trial(
            state=trial.state, values=trial.values, params=trial.params,
            distributions=trial.distributions, user_attrs=attrs,
            system_attrs=trial.system_attrs, intermediate_values=trial.intermediate_values))
    for name, value in trial.params.items():
        dist = trial.distributions[name]
        storage.set_trial_param(target, name, dist.to_internal_repr(value), dist)
    for step, v in trial.intermediate_values.items():
        storage.set_trial_intermediate_value(target, step, v)
    for k, v in attrs.items():
        storage.set_trial_user_attr(target, k, v)
    for k, v in trial.system_attrs.items():
        storage.set_trial_system_attr(target, k, v)
    storage.set_trial_state_values(target, trial.state, trial.values)
    return storage.get_trial_number_from_id(target)


class Keep(Protocol):
    """Work around a trial's write (see :meth:`StudyWriter.put`)."""

    def before(self, trial: FrozenTrial) -> FrozenTrial: ...

    def after(self, number: int) -> None: ...


class StudyWriter:
    """Writes finished trials to the study's storage on a thread of its own, in the
    order they finished.  A write to SQLite takes ~40 ms of ORM work; on the
    scheduler's thread it held up the answers the workers wait for.  ``close()``
    waits for every write and raises the first one that failed, so a run never
    reports trials its storage does not hold.

    >>> import optuna
    >>> optuna.logging.set_verbosity(optuna.logging.WARNING)
    >>> work, stored = optuna.create_study(), optuna.create_study()
    >>> t = work.ask(); _ = work.tell(t, 1.0)
    >>> from explore.optuna_adapter import frozen_trial
    >>> w = StudyWriter(stored); w.put(frozen_trial(work, t)); w.close()
    >>> [x.value for x in stored.trials]
    [1.0]
    """

    def __init__(self, study: optuna.Study) -> None:
        self.study = study
        self.queue: queue.Queue[tuple[FrozenTrial, Keep | None] | None] = queue.Queue()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="explore-study-writer",
                                       daemon=True)
        self.thread.start()

    def put(self, trial: FrozenTrial, keep: Keep | None = None) -> None:
        """Write ``trial``; with ``keep`` (on the writer's thread), first do slow work
        the trial's record depends on (``keep.before``: keeping its model, returning
        the trial amended), and afterwards tell it the stored number (``keep.after``)."""
        self.queue.put((trial, keep))

    def _run(self) -> None:
        while (item := self.queue.get()) is not None:
            trial, keep = item
            if self.error is None:  # after a failure, the rest would fail the same way
                try:
                    number = write_trial(self.study, keep.before(trial) if keep else trial)
                    if keep is not None:
                        keep.after(number)
                except BaseException as e:  # re-raised by close()
                    self.error = e

    def close(self) -> None:
        if self.thread.is_alive():
            self.queue.put(None)
            self.thread.join()
        if self.error is not None:
            raise self.error
