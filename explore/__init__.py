"""explore: search spaces, packing scheduler and study analysis on top of ``engine``.

In a notebook::

    import explore
    study = explore.run("search_spaces/tabular.yaml")       # or a dict; data=, builder=
    model = explore.load_model("search_spaces/tabular.db", "tabular")  # best kept model
    model.predict(rows)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from explore.procmem import pss
from explore.version import __version__

if TYPE_CHECKING:
    import optuna

    from explore.splits import Splits
    from explore.trained import TrainedModel


def run(space: Any, data: Any = None, target: str | None = None, storage: str | None = None,
        study: str | None = None, trials: int | None = None, workers: int | None = None,
        memory: int | str | None = None, builder: Any = None, device: str | None = None,
        devices: list[int] | None = None, timeout: float | None = None,
        kernels: str | None = None, space_changed: bool = False) -> optuna.Study:
    """Run a search, as ``explore run`` does, and return its Optuna study.

    ``space`` is a search-space file or a dict of the YAML's structure.  ``data``
    replaces the space's data set with your own: a DataFrame (``target`` names the
    label column) or a tuple ``(X, y)`` of arrays, to which the space's ``dataset:``
    options (valid, test, scale, categorical, task) apply; or a data set made with its
    own options (:class:`explore.datasets.SequenceDataset`,
    :class:`~explore.datasets.SeriesDataset`, any
    :class:`~explore.datasets.BaseDataset`).  ``storage`` is an Optuna storage URL
    (default: a SQLite file next to the space file, or ``<name>.db`` in the working
    directory for a dict), ``study`` the study's name (default: the space's);
    ``trials``, ``workers``, ``memory``, ``device``, ``devices``, ``timeout`` and
    ``kernels`` override the space's budget (with several devices, each gets
    ``workers`` and ``memory``).  ``timeout``: seconds from the run's start after which
    no new trial starts, as Optuna's ``optimize(timeout=)``; the trials in hand finish,
    and a later call goes on with the study.  ``kernels``: the workers' ``numpy``,
    ``compiled`` (numba's) or ``auto`` (:mod:`explore.scheduler.kernels`).
    A study remembers its space: running it with another is refused unless
    ``space_changed`` says the change is meant (:mod:`explore.space_change`).  ``builder``,
    a function ``build(trial) -> engine.nn.Module | CalcGraph`` that asks the trial
    for its own parameters, makes each trial's model (:mod:`explore.families.builder`;
    the space's ``model.builder`` names one from a file).  The budget
    counts the whole run: its worker processes, the data, and what this process grows
    by from the call on (what it held before, a notebook's own data, is not the
    run's).  Raises
    :class:`explore.runner.RunRefused` (a ValueError) for bad input, before anything
    is written.  When every trial of the run failed, it warns (a UserWarning naming
    the reasons; each in full in :func:`explore.results.load`'s ``fail_reason``) and
    returns the study all the same.

    >>> import explore, numpy as np, tempfile
    >>> x = np.random.default_rng(0).normal(size=(200, 3)).astype("float32")
    >>> with tempfile.TemporaryDirectory() as d:
    ...     study = explore.run({"dataset": {"task": "regression"},
    ...                          "objectives": [{"metric": "r2"}],
    ...                          "budget": {"trials": 2, "rounds": 2, "memory": "400MB"},
    ...                          "keep_models": 0},
    ...                         data=(x, x @ [1.0, 2.0, 0.5]), storage=f"sqlite:///{d}/r.db")
    ...     print(len(study.trials), sorted(study.trials[0].user_attrs["explore"]["metrics"]))
    2 ['loss', 'mae', 'r2', 'rmse', 'train_loss']
    """
    # every import of a submodule runs this file first: the runner (optuna, pandas, the
    # engine) would make `explore --help` and each spawned worker load it all
    from explore.runner import execute, prepare  # noqa: PLC0415 (keeps `import explore` light)

    before = pss()
    prep = prepare(space, data=data, target=target, storage=storage, study=study,
                   trials=trials, workers=workers, memory=memory, builder=builder,
                   device=device, devices=devices, timeout=timeout, kernels=kernels,
                   space_changed=space_changed)
    result, record = execute(prep, baseline=before)
    if record is not None:
        from explore.failures import warn_if_run_failed  # noqa: PLC0415 (keeps `import explore` light)

        warn_if_run_failed(result, record, stacklevel=2)  # the warning names our caller
    return result


def load_model(storage: Any, study: str, trial: int | None = None,
               builder: Any = None, refit: bool = False) -> TrainedModel:
    """The kept model of ``trial`` (default: the best kept) of ``study``, ready to
    predict; ``builder`` rebuilds a model of a study searched with a Python builder
    (a function, or ``"module:function"``); ``refit``: the study's refit model
    (:mod:`explore.refit`).  See :func:`explore.trained.load_model`."""
    from explore.trained import load_model as load  # noqa: PLC0415 (keeps `import explore` light)

    return load(storage, study, trial, builder, refit=refit)


def split(space: Any, data: Any = None, target: str | None = None) -> Splits:
    """The train, validation and test rows of ``space``'s data set exactly as a search
    of it uses them, as you have them: DataFrames of a table's columns and its target,
    or arrays of images; see :func:`explore.splits.split`.

    >>> import explore
    >>> train, valid, test = explore.split({"dataset": "iris", "budget": {
    ...     "trials": 1, "rounds": 1, "memory": "1GB"}})
    >>> len(train), len(valid), len(test), train.columns[-1]
    (90, 30, 30, 'y')
    """
    from explore.splits import split as rows  # noqa: PLC0415 (keeps `import explore` light)

    return rows(space, data, target)


__all__ = ["__version__", "load_model", "run", "split"]
