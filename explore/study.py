"""The Optuna side: storage, samplers, pruners, and what a trial records (the study
kept live while a run goes on: :mod:`explore.live`).

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

import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import optuna
from optuna.trial import FrozenTrial

from explore import pruners, samplers

# the trial attributes' names, read through this module by many: explore.attrs names them
from explore.attrs import PARAMS_ATTR as PARAMS_ATTR
from explore.attrs import RECORD_ATTR as RECORD_ATTR
from explore.pruners import PrunerArgs
from explore.samplers import SamplerArgs
from explore.space import Space
from explore.storages import connect, release


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


def load_stored(opened: optuna.storages.BaseStorage, study_name: str, close: bool = True
                ) -> optuna.Study:
    """``optuna.load_study`` of ``study_name`` in ``opened`` (:func:`storage_url`'s).
    If that fails and ``close`` (the storage was opened for this read, not given by the
    caller), its connections are closed first (:func:`~explore.storages.release`): the
    caller may go on (a notebook), and a SQLite connection kept there holds the file's
    ``-wal`` and ``-shm`` and its shared-memory index of the moment."""
    try:
        return optuna.load_study(study_name=study_name, storage=opened)
    except BaseException:
        if close:
            release(opened)
        raise


def make_sampler(space: Space, number: int | None = None, attempt: int = 0
                 ) -> optuna.samplers.BaseSampler:
    """A new Optuna sampler for the space (:mod:`explore.samplers`).  With ``number``
    (the stored trial's number) its randomness is the seed's and that number's (and the
    ``attempt``'s, when a draw is made again), not the process's: drivers of one study,
    and a run resuming it, then draw different points for their different trials, and
    a seeded run draws the same ones again.

    >>> from explore.space import parse_space
    >>> space = parse_space({"dataset": "digits", "budget": {"trials": 1, "rounds": 1,
    ...     "memory": "64MB"}, "training": {"lr": {"float": [0.001, 0.1]}}})
    >>> def first(n):
    ...     study = optuna.create_study(sampler=make_sampler(space, n))
    ...     return study.ask().suggest_float("lr", 0.001, 0.1)
    >>> first(3) == first(3), first(3) == first(4)
    (True, False)
    """
    args = _sampler_args(space)
    if number is not None:
        args = replace(args, seed=int(np.random.SeedSequence(
            [args.seed, number, attempt]).generate_state(1)[0]))
    return samplers.get(space.sampler.name).create(args)


def _sampler_args(space: Space) -> SamplerArgs:
    """What the space's sampler reads of it; its seed the sampler's, else the budget's."""
    s = space.sampler
    seed = s.seed if s.seed is not None else space.budget.seed
    return SamplerArgs(seed, s.startup_trials, len(space.objectives), space.params())


def blind_draws(space: Space) -> int | None:
    """How many of a study's first trials the space's sampler draws without reading a
    result (None: all of them); :meth:`explore.samplers.BaseSampler.blind`.

    >>> from explore.space import parse_space
    >>> space = parse_space({"dataset": "digits", "budget": {"trials": 1, "rounds": 1,
    ...     "memory": "64MB"}, "training": {"lr": {"float": [0.001, 0.1]}}})
    >>> blind_draws(space)
    10
    """
    return samplers.get(space.sampler.name).blind(_sampler_args(space))


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
    if study.metric_names is None:  # a new study, or one made before studies were named
        name_objectives(study, space)
    return study


def metric_names(space: Space) -> list[str]:
    """The objectives' names as the study records them: their metrics, a metric named
    twice numbered from its second (Optuna's tables take one column per name).

    >>> from explore.space import parse_space
    >>> metric_names(parse_space({"budget": {"trials": 1, "rounds": 1, "memory": "64MB"},
    ...     "objectives": [{"metric": "loss"}, {"metric": "planned_bytes"},
    ...                    {"metric": "loss", "direction": "maximize"}]}))
    ['loss', 'planned_bytes', 'loss_2']
    """
    names: list[str] = []
    for o in space.objectives:
        name, n = o.metric, 1
        while name in names:
            n += 1
            name = f"{o.metric}_{n}"
        names.append(name)
    return names


def name_objectives(study: optuna.Study, space: Space) -> None:
    """Record the objectives' metric names in ``study`` (Optuna's ``metric_names``, which
    optuna-dashboard and ``trials_dataframe`` show in place of "Objective 0"), unless it
    holds those already.  Setting the same names again, as every driver of a study does,
    changes nothing.  :func:`open_study` names a study that has no names; a run whose
    space was changed on purpose (``--space-changed``) renames it with this."""
    names = metric_names(space)
    if study.metric_names != names:
        with warnings.catch_warnings():  # experimental since Optuna 3.2, and stable in use
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(names)


class Keep(Protocol):
    """Work around a finished trial's write (:meth:`explore.live.LiveStudy.finish`):
    ``before`` on the writer's thread, first (keeping its model, returning the trial
    amended), ``after`` with the number the storage gave it."""

    def before(self, trial: FrozenTrial) -> FrozenTrial: ...

    def after(self, number: int) -> None: ...
