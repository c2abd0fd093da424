"""A trial's model trained again on the training and validation rows, as scikit-learn's
``GridSearchCV(refit=True).best_estimator_``: the search chose it by its validation
metrics, and the model to use learns from those rows too.

:func:`refit` rebuilds the trial's model from its recorded parameters (the builder
rules of :func:`explore.trained.load_model`), initialises it from the trial's own seed
(the budget's ``seed`` plus its number, as the search did) and trains it for the
rounds the trial trained, with its optimizer, learning rate and mini-batch, on the
training rows followed by the validation rows of the split the search used (the
space's ``train``/``valid`` row counts too); the test rows stay held out and measure
it.  Its weights go into the study's artifact store as the study's *refit model*, one
per study (:func:`explore.keeper.keep_refit`), recorded in the study's user attribute
``refit``: trial, rounds, rows, seed, batch, heap bytes, test metrics, artifact.
``load_model(..., refit=True)`` and ``explore evaluate / export-model / predict
--refit`` use it.

It runs in the calling process, on the CPU, with one program compiled as the trial's
was (its heap is the program's planned bytes, allocated once) and the kernels a
search's worker binds (``CALCGRAPH_JIT``): trained on the training rows alone, the same
recipe gives the searched model bit for bit, so the refit differs from it by the rows
alone.  A trial that ran in a stack (``budget.stack``) drew its initial weights and
data order from its stack's seed; its refit, alone, from its own.

>>> refit("no-such.db", "s")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
explore.trained.ModelError: ...no-such.db...
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from optuna.trial import FrozenTrial, TrialState
from pydantic import ValidationError

from engine import VM, compile_graph
from engine.ops import jit
from engine.runtime.train import train_epoch
from explore.attrs import BUILDER_DIR_ATTR, DATA_ATTR, PARAMS_ATTR, RECORD_ATTR, SPACE_ATTR
from explore.datasets import BaseDataset, DataError, Split, compact, resolve
from explore.keeper import ARTIFACTS_ATTR, default_artifacts, keep_refit
from explore.optimizers import build_optimizer
from explore.scheduler.kernels import jit_of, jit_set
from explore.scheduler.worker import JIT_DEFAULT, diverged
from explore.space_sections import DatasetSection
from explore.trained import (
    ModelError,
    StoredData,
    TrainedModel,
    check_trial_number,
    evaluate_split,
    find_model,
    model_of,
    open_stored,
    rebuild,
)
from explore.weights import save_weights

Builder = Callable[..., Any] | str | None


class RefitFailed(RuntimeError):
    """The refit's training diverged (a NaN or infinite loss): nothing was stored."""


@dataclass(frozen=True)
class Recipe:
    """How a trial trained, from its record: what a refit repeats."""

    trial: int
    params: dict[str, Any]
    seed: int  # of the initial weights and of the data order
    rounds: int
    batch: int  # the training mini-batch
    compiled_batch: int  # the program's batch (validation chunks; >= batch)
    kernels: str = ""  # the worker's, numpy or compiled ("": a record from before)

    @classmethod
    def of(cls, study: optuna.Study, t: FrozenTrial) -> Recipe:
        """The recipe of ``t``, a completed trial of ``study`` (:class:`ModelError`
        naming what its record lacks)."""
        record = t.user_attrs.get(RECORD_ATTR) or {}
        params = dict(record.get(PARAMS_ATTR) or t.user_attrs.get(PARAMS_ATTR) or t.params)
        budget = (study.user_attrs.get(SPACE_ATTR) or {}).get("budget") or {}
        rounds = record.get("rounds") or budget.get("rounds")
        batch = record.get("batch_size") or params.get("batch_size")
        if not isinstance(rounds, int) or not isinstance(batch, int):
            raise ModelError(f"trial {t.number} of study {study.study_name!r} does not "
                             "record the rounds and mini-batch it trained with: it was "
                             "not run by explore, or its record was lost")
        compiled = record.get("compiled_batch")
        kernels = record.get("kernels")
        return cls(t.number, params, int(budget.get("seed") or 0) + t.number, rounds,
                   batch, compiled if isinstance(compiled, int) and compiled >= batch
                   else batch, kernels if kernels in ("numpy", "compiled") else "")


def choose_trial(study: optuna.Study, number: int | None) -> FrozenTrial:
    """Trial ``number`` of ``study``, or its best; completed (:class:`ModelError` saying
    which trials there are, or how the one asked for ended)."""
    name = study.study_name
    if number is None:
        if len(study.directions) > 1:
            front = ", ".join(str(t.number) for t in study.best_trials) or "none"
            raise ModelError(f"study {name!r} has {len(study.directions)} objectives, so "
                             f"no single best trial: name one (trial=N; from the command "
                             f"line --trial N); its Pareto front: trials {front}")
        try:
            return study.best_trial
        except ValueError:
            raise ModelError(f"study {name!r} has no completed trial to refit") from None
    trials = study.get_trials(deepcopy=False)
    for t in trials:
        if t.number == number:
            if t.state != TrialState.COMPLETE:
                raise ModelError(
                    f"trial {number} of study {name!r} "
                    f"{_ENDED.get(t.state, t.state.name.lower())}: only a completed "
                    "trial can be refit, for as many rounds as it trained; completed "
                    f"trials: {_completed(trials)}")
            return t
    raise ModelError(f"study {name!r} has no trial {number}; completed trials: "
                     f"{_completed(trials)}")


_ENDED = {TrialState.FAIL: "failed", TrialState.PRUNED: "was pruned",
          TrialState.RUNNING: "is still running", TrialState.WAITING: "is waiting to run"}


def _completed(trials: list[FrozenTrial]) -> str:
    done = [str(t.number) for t in trials if t.state == TrialState.COMPLETE]
    shown = ", ".join(done[:10]) + (f" and {len(done) - 10} more" if len(done) > 10 else "")
    return shown or "none"


def searched_rows(study: optuna.Study, data: BaseDataset | None = None
                  ) -> tuple[Split, Split, Split]:
    """The training, validation and test rows of the split ``study`` was searched on
    (model inputs: preprocessed, images as uint8 pixels): ``data``, or the data set its
    stored space names, cut to the space's ``train``/``valid`` row counts.  Raises
    :class:`ModelError` when there is no such data set, it cannot be read, or it is
    not the one the study recorded (another split, other preprocessing)."""
    name = study.study_name
    space = study.user_attrs.get(SPACE_ATTR) or {}
    section_of = space.get("dataset")
    try:
        section = DatasetSection.model_validate(section_of) if section_of else None
    except ValidationError as e:
        raise ModelError(f"study {name!r}: its stored dataset section is not one: "
                         f"{e.errors()[0]['msg']}") from None
    if data is None:
        if section is None:
            raise ModelError(f"study {name!r} was searched on data given from Python: pass "
                             "the same data set, refit(..., data=explore.datasets."
                             "from_python(...)) with the run's options (from the command "
                             "line, give a space file that names it)")
        try:
            data = resolve(section)
        except DataError as e:
            raise ModelError(f"the data set of study {name!r} cannot be read: {e}") from None
    elif not isinstance(data, BaseDataset):
        raise ModelError("data: a data set (explore.datasets.from_python(...) makes one "
                         f"of a DataFrame or arrays), not a {type(data).__name__}")
    record = study.user_attrs.get(DATA_ATTR)
    if not record:
        raise ModelError(f"study {name!r} does not record its data set")
    other = StoredData.from_record(record).differs(data)
    if other is not None:
        raise ModelError(f"the data set is not the one study {name!r} was searched on "
                         f"({other}): a refit trains on the search's own split")
    train, valid = section.heads if section is not None else (None, None)
    try:
        loaded = data.load()
        rows = compact(loaded, train, valid, data.pixel_scale)
    except DataError as e:
        raise ModelError(f"the data set of study {name!r} cannot be read: {e}") from None
    return rows.train, rows.valid, loaded.test


def worker_kernels(kernels: str = "") -> contextlib.AbstractContextManager[None]:
    """The kernels the trial's worker bound (``kernels``, its record's: numpy or
    compiled; for a record that does not say, ``CALCGRAPH_JIT``, else the worker's
    default) while the block runs: the numpy and the fused kernels agree only to float32
    rounding, and a refit is to differ from the searched model by its rows alone."""
    return jit_set(jit_of(kernels) if kernels else os.environ.get(jit.ENV, JIT_DEFAULT))


def train(graph: Any, recipe: Recipe, x: np.ndarray, y: np.ndarray) -> tuple[Any, float]:
    """A VM of ``graph`` compiled as the trial's program (its ``logits`` kept for
    predicting), initialised from the recipe's seed and trained for its rounds on
    ``(x, y)``, shuffled by the same seed; with the last round's mean training loss.
    Raises :class:`RefitFailed` when the loss stops being finite."""
    prog = compile_graph(graph, batch_size=recipe.compiled_batch,
                         optimizer=build_optimizer(recipe.params), keep=["logits"])
    with worker_kernels(recipe.kernels):
        vm = VM(prog, seed=recipe.seed)
        rng = np.random.default_rng(recipe.seed)
        loss: Any = None
        for r in range(1, recipe.rounds + 1):
            loss = train_epoch(vm, x, y, rng, batch=recipe.batch)
            why = diverged(loss, "training", r)
            if why is not None:
                raise RefitFailed(f"the refit of trial {recipe.trial} {why}")
    return vm, float(loss)


def refit_study(study: optuna.Study, trial: int | None = None, builder: Builder = None,
                data: BaseDataset | None = None, artifacts: str | None = None
                ) -> TrainedModel:
    """:func:`refit` of an open study.  ``artifacts``: the store's folder when the study
    names none (it kept no model); default ``explore-artifacts`` here."""
    name = study.study_name
    check_trial_number(trial)
    t = choose_trial(study, trial)
    recipe = Recipe.of(study, t)
    space = study.user_attrs.get(SPACE_ATTR)
    record = study.user_attrs.get(DATA_ATTR)
    if not space or not record:
        raise ModelError(f"study {name!r} does not record its data set and space")
    train_rows, valid_rows, test = searched_rows(study, data)
    stored = StoredData.from_record(record)
    graph = rebuild(space, recipe.params, stored, builder,
                    study.user_attrs.get(BUILDER_DIR_ATTR), study=name)
    x = np.concatenate([train_rows.x, valid_rows.x])
    y = np.concatenate([train_rows.y, valid_rows.y])
    vm, loss = train(graph, recipe, x, y)
    model = TrainedModel(vm, graph, stored, recipe.params, t.number, name)
    with worker_kernels(recipe.kernels):  # both models evaluated as the search's workers do
        metrics = evaluate_split(model, test.x, test.y) if len(test) else {}
        searched = searched_metrics(study, t.number, builder, test)
    entry = {"trial": t.number, "rounds": recipe.rounds,
             "rows": {"train": len(train_rows), "valid": len(valid_rows)},
             "seed": recipe.seed, "batch_size": recipe.batch,
             "heap_bytes": vm.program.total_bytes, "train_loss": loss,
             "test_rows": len(test), "metrics": metrics,
             "searched_metrics": searched,
             "at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    folder = study.user_attrs.get(ARTIFACTS_ATTR) or space.get("artifacts") or \
        artifacts or default_artifacts("")
    with tempfile.TemporaryDirectory(prefix="explore-refit-") as tmp:
        path = Path(tmp) / "refit.npz"
        save_weights(vm, path)
        try:
            model.refit = keep_refit(study, folder, path, entry)
        except OSError as e:
            raise ModelError(f"the refit model of study {name!r} cannot be stored in "
                             f"{folder}: {e}") from None
    return model


def searched_metrics(study: optuna.Study, trial: int, builder: Builder, test: Split
                     ) -> dict[str, float] | None:
    """The test metrics of the model the search kept of ``trial``, beside its refit's;
    None where it kept none (``keep_models`` keeps the best few) or there are no test
    rows."""
    if not len(test):
        return None
    try:
        find_model(study, trial)
        kept = model_of(study, trial, builder)
    except ModelError:  # not kept, or its store gone: the refit stands alone
        return None
    return evaluate_split(kept, test.x, test.y)


def refit(storage: str | Path | Any, study: str, trial: int | None = None,
          builder: Builder = None, data: BaseDataset | None = None) -> TrainedModel:
    """Train ``trial`` (default: the best trial; a study of several objectives needs
    one) of ``study`` in ``storage`` again on the training and validation rows of the
    split it was searched on, evaluate it on the test rows and store it as the study's
    refit model (see the module docstring); returns it, its record in
    :attr:`~explore.trained.TrainedModel.refit`.

    ``builder``: as :func:`explore.load_model` takes it.  ``data``: the data set, for a
    study searched on data given from Python (``explore.datasets.from_python`` with the
    run's options); by default the data set the study's space names.  Raises
    :class:`~explore.trained.ModelError` for a study, trial or data set that cannot be
    refit (the message says why), :class:`RefitFailed` when its training diverges.
    For example::

        model = refit("search_spaces/tabular.db", "tabular")  # the best trial
        model.refit["metrics"], model.refit["searched_metrics"]  # test: refit, searched
        model.predict(rows)  # later: load_model(storage, study, refit=True)
    """
    return refit_study(open_stored(storage, study), trial, builder, data,
                       artifacts_for(storage))


def artifacts_for(storage: str | Path | Any) -> str | None:
    """The default artifact store of a storage URL or SQLite file's path
    (:func:`explore.keeper.default_artifacts`); None for a storage object."""
    if isinstance(storage, optuna.storages.BaseStorage):
        return None
    text = str(storage)
    return default_artifacts(text if "://" in text else f"sqlite:///{Path(text).resolve()}")


def refit_after_run(study: optuna.Study, data: BaseDataset, builder: Builder,
                    artifacts: str) -> TrainedModel | None:
    """A search's ``refit: true``: refit its best trial once its run ended.  A refit
    that cannot be made is a warning: the search's results stand."""
    try:
        return refit_study(study, None, builder, data, artifacts)
    except (ModelError, RefitFailed) as e:
        warnings.warn(f"refit: {e}", stacklevel=2)
        return None
