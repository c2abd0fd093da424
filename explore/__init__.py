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

    from explore.trained import TrainedModel


def run(space: Any, data: Any = None, target: str | None = None, storage: str | None = None,
        study: str | None = None, trials: int | None = None, workers: int | None = None,
        memory: int | str | None = None, builder: Any = None, device: str | None = None,
        devices: list[int] | None = None, space_changed: bool = False) -> optuna.Study:
    """Run a search, as ``explore run`` does, and return its Optuna study.

    ``space`` is a search-space file or a dict of the YAML's structure.  ``data``
    replaces the space's data set with your own: a DataFrame (``target`` names the
    label column) or a tuple ``(X, y)`` of arrays; the space's ``dataset:`` options
    (valid, test, scale, categorical, task) apply to it.  ``storage`` is an Optuna
    storage URL (default: a SQLite file next to the space file, or ``<name>.db`` in the
    working directory for a dict), ``study`` the study's name (default: the space's);
    ``trials``, ``workers``, ``memory``, ``device`` and ``devices`` override the
    space's budget (with several devices, each gets ``workers`` and ``memory``).
    A study remembers its space: running it with another is refused unless
    ``space_changed`` says the change is meant (:mod:`explore.space_change`).  ``builder``,
    a function ``build(trial) -> engine.nn.Module | CalcGraph`` that asks the trial
    for its own parameters, makes each trial's model (:mod:`explore.families.builder`;
    the space's ``model.builder`` names one from a file).  The budget
    counts the whole run: its worker processes, the data, and what this process grows
    by from the call on (what it held before, a notebook's own data, is not the
    run's).  Raises
    :class:`explore.runner.RunRefused` (a ValueError) for bad input, before anything
    is written.

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
                   device=device, devices=devices, space_changed=space_changed)
    result, _ = execute(prep, baseline=before)
    return result


def load_model(storage: Any, study: str, trial: int | None = None,
               builder: Any = None) -> TrainedModel:
    """The kept model of ``trial`` (default: the best kept) of ``study``, ready to
    predict: see :func:`explore.trained.load_model`."""
    from explore.trained import load_model as load  # noqa: PLC0415 (keeps `import explore` light)

    return load(storage, study, trial, builder)


__all__ = ["__version__", "load_model", "run"]
