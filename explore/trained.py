"""A kept model of a study, loaded to predict, evaluate and export.

A study run with ``keep_models`` holds the final weights of its best trials
(:mod:`explore.keeper`), and with them what a model takes and gives (the study's
``data`` record: task, features, classes, the preprocessing fitted on the training
split).  :func:`load_model` rebuilds the trial's CalcGraph from its parameters,
compiles it, and loads the weights into a VM; :class:`TrainedModel` then takes raw
rows (a DataFrame with the data set's columns, or an array of its numeric features)
through the same preprocessing as the search did.  A model that came from a Python
builder (:mod:`explore.families.builder`) is rebuilt by calling the builder again, with
what the trial chose and the recorded data's facts: the builder the study names
(``module:function``), or the one given, which a builder defined in a notebook needs.
``load_model(..., refit=True)`` loads the study's refit model instead
(:mod:`explore.refit`: the best trial trained again on the training and validation
rows).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from optuna.artifacts import FileSystemArtifactStore
from optuna.artifacts.exceptions import ArtifactNotFound

from engine import VM, InputError, compile_graph
from explore import families
from explore.attrs import BUILDER_DIR_ATTR, DATA_ATTR, REFIT_ATTR, SPACE_ATTR
from explore.candidate import BUILDER_PARAMS
from explore.datasets.quantize import to_pixels
from explore.datasets.sequence_shape import SequenceShape
from explore.datasets.table import Preprocess
from explore.families.builder import (
    BuilderError,
    builder_name,
    call_builder,
    graph_of_model,
    load_builder,
    replay,
)
from explore.keeper import ARTIFACTS_ATTR, MODELS_ATTR
from explore.onnx_model import model_to_onnx
from explore.optimizers import build_optimizer
from explore.optuna_adapter import storage_of
from explore.scheduler.worker import Validation
from explore.storages import release
from explore.study import PARAMS_ATTR, RECORD_ATTR, load_stored, storage_url
from explore.weights import parameter_names

PREDICT_BATCH = 512


class ModelError(LookupError):
    """No kept model answers the request (no such study, trial or artifact)."""


@dataclass
class StoredData:
    """A data set as a study recorded it: what a model family needs to build a model
    of it (the arrays are not needed).  ``BaseDataset``'s attributes, from the record."""

    task: str
    features: int
    classes: int
    image: tuple[int, int, int] | None
    pixel_scale: float | None
    target_scale: tuple[float, float] | None
    preprocess: Any  # explore.datasets.table.Preprocess | None
    sequence: SequenceShape | None = None

    @classmethod
    def from_record(cls, r: dict[str, Any]) -> StoredData:
        pre = None
        if r.get("preprocess"):
            pre = Preprocess.from_dict(r["preprocess"])
        return cls(r["task"], int(r["features"]), int(r.get("classes") or 0),
                   tuple(r["image"]) if r.get("image") else None,
                   r.get("pixel_scale"),
                   tuple(r["target_scale"]) if r.get("target_scale") else None,
                   pre, SequenceShape(**r["sequence"]) if r.get("sequence") else None)

    @classmethod
    def of(cls, ds: Any) -> StoredData:
        """The facts of the data set ``ds`` as a study records them
        (:func:`explore.runner.data_record`), for comparing with a record."""
        image = getattr(ds, "image", None)
        scale = getattr(ds, "target_scale", None)
        return cls(getattr(ds, "task", "classification"), int(ds.features),
                   int(getattr(ds, "classes", 0) or 0), tuple(image) if image else None,
                   getattr(ds, "pixel_scale", None),
                   (float(scale[0]), float(scale[1])) if scale else None,
                   getattr(ds, "preprocess", None), getattr(ds, "sequence", None))

    def differs(self, ds: Any) -> str | None:
        """What differs between the data set ``ds`` and this one (task, features,
        classes, image shape, pixel scale, target scale, preprocessing), or None."""
        have = StoredData.of(ds)
        for key in ("task", "features", "classes", "image", "sequence", "pixel_scale",
                    "target_scale"):
            a, b = getattr(have, key), getattr(self, key)
            if a != b:
                return f"{key}: {a!r} where the model has {b!r}"
        pa = have.preprocess.to_dict() if have.preprocess is not None else None
        pb = self.preprocess.to_dict() if self.preprocess is not None else None
        if pa != pb:
            return "its preprocessing (columns, scaling, categories or labels) differs"
        return None

    @property
    def outputs(self) -> int:
        return self.classes if self.task == "classification" else 1


@dataclass
class TrainedModel:
    """A trial's model, weights loaded: ``vm`` runs its ``eval`` path, whose last
    layer ``logits`` is what :meth:`predict` reads.

    ``predict(rows)`` gives the class labels (as the data had them) or the
    regression's values in the target's units; ``predict_proba(rows)`` the class
    probabilities; ``features(rows)`` the preprocessed model input.  ``refit``: for a
    refit model (:mod:`explore.refit`), its record (rounds, rows, seed, test metrics);
    None for a model the search kept."""

    vm: Any  # engine.VM
    graph: Any  # engine.CalcGraph
    data: StoredData
    params: dict[str, Any]
    trial: int
    study: str
    refit: dict[str, Any] | None = None
    metrics: dict[str, float] = field(default_factory=dict)  # the trial's, as recorded

    def features(self, rows: Any) -> np.ndarray:
        """Raw rows -> the model's input (the search's preprocessing, if any).  A
        sequence model takes its sequences flat or as they come (``[n, length, values
        per step]``, or ``[n, length]`` token ids)."""
        if self.data.sequence is not None:
            x = np.asarray(rows)
            rows = x.reshape(len(x), -1)
        pre = self.data.preprocess
        if pre is not None:  # images of a table too: pixels checked, never wrapped
            return self.model_input(np.ascontiguousarray(pre.transform(rows)))
        x = np.asarray(rows)
        return self.model_input(x.reshape(len(x), -1) if x.ndim > 2 else x)

    def model_input(self, x: np.ndarray) -> np.ndarray:
        """Features as the model takes them: images of a pixel scale as exact uint8
        pixels, given as the data set has them or scaled (see
        :func:`explore.datasets.quantize.to_pixels`)."""
        scale = self.data.pixel_scale
        return to_pixels(x, scale) if scale is not None else x

    def logits(self, x: np.ndarray) -> np.ndarray:
        """The ``logits`` layer for model inputs ``x`` (already preprocessed), in
        batches of at most the compiled batch."""
        vm = self.vm
        want = np.dtype(vm.program.buffers[_index(vm, "x")].dtype)
        x = np.ascontiguousarray(x, dtype=want)
        b = vm.program.batch_size
        ydt = np.float32 if self.data.task == "regression" else np.int64
        out = np.empty((len(x), max(self.data.outputs, 1)), np.float32)
        for start in range(0, len(x), b):
            chunk = x[start:start + b]
            vm.set("x", chunk)
            vm.set("y", np.zeros(len(chunk), ydt))
            vm.forward("eval")
            out[start:start + len(chunk)] = vm.get("logits").reshape(len(chunk), -1)
        return out

    def predict_proba(self, rows: Any) -> np.ndarray:
        """Class probabilities ``[n, classes]`` (a classification only)."""
        if self.data.task != "classification":
            raise ValueError("predict_proba is for a classification; this model is a "
                             f"{self.data.task}")
        s = self.logits(self.features(rows))
        s = s - s.max(axis=1, keepdims=True)
        e = np.exp(s)
        return e / e.sum(axis=1, keepdims=True)

    def predict(self, rows: Any) -> np.ndarray:
        """Labels as the data had them (classification) or values in the target's
        units (regression)."""
        s = self.logits(self.features(rows))
        if self.data.task == "regression":
            mean, std = self.data.target_scale or (0.0, 1.0)
            return s[:, 0] * std + mean
        idx = s.argmax(axis=1)
        pre = self.data.preprocess
        labels = getattr(pre, "labels", None) if pre is not None else None
        return np.asarray(labels)[idx] if labels else idx

    def to_onnx(self) -> Any:
        """The model as ONNX, preprocessing included (:mod:`explore.onnx_model`)."""
        return model_to_onnx(self)


def data_mismatch(model: TrainedModel, ds: Any) -> str | None:
    """What differs between the data set ``ds`` and the one ``model`` was trained on
    (task, features, classes, image shape, pixel scale, target scale, preprocessing),
    or None: a model evaluated on rows prepared for another data set measures nothing."""
    return model.data.differs(ds)


def evaluate_split(model: TrainedModel, x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Every metric of the model's task over preprocessed rows ``x`` and their ``y``
    (as a data set's split holds them), measured by its eval path as in a search."""
    std = model.data.target_scale[1] if model.data.target_scale else 1.0
    v = Validation.of(model.vm.program, len(y), std)
    return v.measure(model.vm, np.ascontiguousarray(model.model_input(x)),
                     np.ascontiguousarray(y))


def _index(vm: Any, name: str) -> int:
    return next(i for i, b in enumerate(vm.program.buffers) if b.name == name)


def kept_models(study: optuna.Study) -> list[dict[str, Any]]:
    """The study's kept models, best first (``[{"trial", "value", "artifact"}]``)."""
    return list(study.user_attrs.get(MODELS_ATTR) or [])


def find_model(study: optuna.Study, trial: int | None = None
               ) -> tuple[optuna.trial.FrozenTrial, str]:
    """The stored trial and the artifact id of its kept model: trial number ``trial``,
    or the best kept one.  Raises :class:`ModelError` saying what is kept."""
    kept = kept_models(study)
    if not kept:
        raise ModelError(none_kept(study))
    artifacts = {m["artifact"] for m in kept}
    by_artifact: dict[str, optuna.trial.FrozenTrial] = {}
    for t in study.get_trials(deepcopy=False):
        a = (t.user_attrs.get(RECORD_ATTR) or {}).get("model")
        if isinstance(a, str) and a in artifacts:
            by_artifact[a] = t
    if trial is None:
        for m in kept:
            if m["artifact"] in by_artifact:
                return by_artifact[m["artifact"]], m["artifact"]
        raise ModelError(f"study {study.study_name!r}: its kept models' trials are missing")
    for a, t in by_artifact.items():
        if t.number == trial:
            return t, a
    numbers = ", ".join(str(t.number) for t in by_artifact.values())
    raise ModelError(f"trial {trial} of study {study.study_name!r} has no kept model; "
                     f"kept: trials {numbers or 'none'} (keep_models keeps the best few)")


def find_refit(study: optuna.Study, trial: int | None = None
               ) -> tuple[optuna.trial.FrozenTrial, dict[str, Any]]:
    """The trial of the study's refit model and its record (:mod:`explore.refit`).
    Raises :class:`ModelError` when the study has none, or it is of another trial than
    ``trial``."""
    name = study.study_name
    entry = study.user_attrs.get(REFIT_ATTR)
    if not isinstance(entry, dict) or not isinstance(entry.get("artifact"), str):
        raise ModelError(f"study {name!r} has no refit model: run `explore refit SPACE` "
                         f"(from Python, explore.refit.refit(storage, {name!r}))")
    number = entry.get("trial")
    if trial is not None and trial != number:
        raise ModelError(f"the refit model of study {name!r} is trial {number}'s, not "
                         f"trial {trial}'s; to refit trial {trial}, run `explore refit "
                         f"SPACE --trial {trial}`")
    for t in study.get_trials(deepcopy=False):
        if t.number == number:
            return t, entry
    raise ModelError(f"study {name!r}: the trial of its refit model ({number}) is missing")


def none_kept(study: optuna.Study) -> str:
    """Why ``study`` lists no kept model, as :func:`find_model` says it: it was run
    with ``keep_models: 0`` (its stored space says), or none of its trials completed
    (how they ended, and the most common reason they failed), or its completed trials'
    models could not be kept."""
    name = study.study_name
    space = study.user_attrs.get(SPACE_ATTR)
    keep = space.get("keep_models") if isinstance(space, dict) else None
    if keep == 0:
        return (f"study {name!r} keeps no models: it was run with keep_models: 0; run "
                "it with keep_models > 0 (the default is 3)")
    trials = study.get_trials(deepcopy=False)
    if not trials:
        return f"study {name!r} keeps no models: it has no trials"
    states = Counter(_ENDED.get(t.state.name, t.state.name.lower()) for t in trials)
    done = states.pop("complete", 0)
    n = len(trials)
    if done == 0:
        failed = [_short((t.user_attrs.get(RECORD_ATTR) or {}).get("fail_reason"))
                  for t in trials if t.state == optuna.trial.TrialState.FAIL]
        # how the others ended first; the failures last, with their commonest reason
        parts = [f"{k} {s}" for s, k in states.most_common() if s != "failed"]
        if failed:
            part = f"{len(failed)} failed"
            reasons = Counter(r for r in failed if r)
            if reasons:
                reason, count = reasons.most_common(1)[0]
                part += (": " if count == len(failed) else f", {count} of them: ") + reason
            parts.append(part)
        return (f"study {name!r} keeps no models: none of its {n} trial"
                f"{'s' * (n != 1)} completed ({'; '.join(parts)})")
    errors = [(t.user_attrs.get(RECORD_ATTR) or {}).get("model_error") for t in trials]
    error = next((e for e in errors if e), None)
    if error is not None:
        return f"study {name!r} keeps no models: {error}"
    if keep is None:  # not run by explore, or before the space was stored
        return (f"study {name!r} keeps no models: run it with keep_models > 0 (the "
                "default is 3)")
    return (f"study {name!r} keeps no models: its {done} completed trial"
            f"{'s' * (done != 1)} kept none")


_ENDED = {"FAIL": "failed", "COMPLETE": "complete"}  # Optuna's states, as said


def _short(reason: Any) -> str | None:
    """A trial's failure in one line: a traceback's first and last lines."""
    if not isinstance(reason, str) or not reason.strip():
        return None
    lines = [x.strip() for x in reason.strip().splitlines() if x.strip()]
    return lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"


def load_model(storage: str | Path | Any, study: str, trial: int | None = None,
               builder: Callable[..., Any] | str | None = None, refit: bool = False
               ) -> TrainedModel:
    """The kept model of ``trial`` (default: the best kept) of ``study`` in
    ``storage`` (a URL, a SQLite file's path or an Optuna storage), ready to predict.
    ``refit``: the study's refit model instead (:func:`explore.refit.refit`: a trial
    trained again on the training and validation rows; ``trial``, if given, must be
    its trial), with its record in :attr:`TrainedModel.refit`.

    A study whose models came from a Python builder rebuilds them by calling it again,
    with what the trial chose and the data's facts as the study recorded them:
    ``builder`` (the function, or its ``module:function``, imported from the current
    folder or the Python path), else the one the study names.  A builder defined in a
    notebook or ``__main__`` cannot be imported again: pass it, ``builder=build``.
    Raises :class:`ModelError` when there is no such model, or it cannot be rebuilt
    (the message says why: no trial completed, no builder to rebuild it with, weights
    that do not fit what the builder builds).

    >>> load_model("no-such.db", "s")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    explore.trained.ModelError: ...no-such.db...
    """
    check_trial_number(trial)
    s = open_stored(storage, study)
    try:
        return model_of(s, trial, builder, refit)
    finally:
        if isinstance(storage, (str, Path)):  # opened here: a caller's storage stays open
            release(storage_of(s))


def check_trial_number(trial: Any) -> None:
    """A trial is given by its number: an int (``"0"``, ``True`` or ``0.5`` were looked up
    as if they were one, and said no such trial was kept while listing trial 0)."""
    if trial is not None and (isinstance(trial, bool) or not isinstance(trial, int | np.integer)):
        raise TypeError(f"trial: a trial's number (an int), not {trial!r}")


def model_of(s: optuna.Study, trial: int | None = None,
             builder: Callable[..., Any] | str | None = None, refit: bool = False
             ) -> TrainedModel:
    """:func:`load_model` of an open study ``s``."""
    study = s.study_name
    entry: dict[str, Any] | None = None
    if refit:
        t, entry = find_refit(s, trial)
        artifact, directory = entry["artifact"], entry.get("artifacts")
    else:
        t, artifact = find_model(s, trial)
        directory = None
    record = s.user_attrs.get(DATA_ATTR)
    space = s.user_attrs.get(SPACE_ATTR)
    if not record or not space:
        raise ModelError(f"study {study!r} does not record its data set and space")
    data = StoredData.from_record(record)
    params = dict((t.user_attrs.get(RECORD_ATTR) or {}).get(PARAMS_ATTR) or
                  t.user_attrs.get(PARAMS_ATTR) or t.params)
    graph = rebuild(space, params, data, builder, s.user_attrs.get(BUILDER_DIR_ATTR),
                    study=study)
    prog = compile_graph(graph, batch_size=PREDICT_BATCH, optimizer=build_optimizer(params),
                         keep=["logits"])
    vm = VM(prog)
    weights = read_model(s, artifact, t.number, directory)
    missing = sorted(set(parameter_names(prog)) - set(weights))
    try:
        for name, value in weights.items():
            vm.assign(name, value)
        if missing:
            raise InputError(f"no kept weights for {', '.join(map(repr, missing[:3]))}"
                             + (f" and {len(missing) - 3} more" if len(missing) > 3 else ""))
    except InputError as e:
        made_by = _maker(space, params, builder)
        which = "refit" if refit else "kept for"
        raise ModelError(f"the weights {which} trial {t.number} of study {study!r} do "
                         f"not fit the model that {made_by} builds ({e}): is it the one the "
                         "study was run with?") from None
    metrics = dict((t.user_attrs.get(RECORD_ATTR) or {}).get("metrics") or {})
    return TrainedModel(vm, graph, data, params, t.number, study, refit=entry,
                        metrics=metrics)


def _maker(space: dict[str, Any], params: dict[str, Any],
           builder: Callable[..., Any] | str | None) -> str:
    """What built a model, for messages: the builder given, or the study's."""
    if callable(builder):
        return f"builder {builder_name(builder)}"
    if builder is not None or _made_by_builder(space, params):
        return f"builder {builder or space['model'].get('builder') or '(given)'}"
    return f"family {space['model'].get('family')!r}"


def _made_by_builder(space: dict[str, Any], params: dict[str, Any]) -> bool:
    """Whether a study's models came from a Python builder: the space names one, or
    (a builder given as a function that cannot be imported again, recorded as none)
    the trial recorded what its builder chose."""
    return space["model"].get("builder") is not None or BUILDER_PARAMS in params


def rebuild(space: dict[str, Any], params: dict[str, Any], data: StoredData,
            builder: Callable[..., Any] | str | None = None,
            builder_dir: str | None = None, study: str = "") -> Any:
    """A trial's CalcGraph again, from its recorded parameters: by its family, or by a
    model builder replaying what it chose (``builder``, a function or its
    ``module:function``; else the one the space names).  Raises :class:`ModelError`
    when the builder cannot be had or fails."""
    spec = space["model"].get("builder")
    if builder is None and not _made_by_builder(space, params):
        return families.get(space["model"]["family"]).build(params, data)
    if builder is None and spec is None:
        raise ModelError(
            f"study {study!r} was run with a model builder given as a Python function "
            "that cannot be imported again (defined in a notebook, in __main__ or inside "
            "another function): pass the same function, load_model(..., builder=build), "
            "or its module:function (from the command line: --builder module:function)")
    given = builder if isinstance(builder, str) else None
    try:
        if given is not None:
            fn = load_builder(given, Path.cwd())
        elif builder is not None:
            if not callable(builder):
                raise ModelError(f"builder: a function or 'module:function', not a "
                                 f"{type(builder).__name__}")
            fn = builder
        else:
            fn = load_builder(str(spec), builder_dir)
        return graph_of_model(call_builder(fn, replay(params.get(BUILDER_PARAMS) or {}),
                                           data), data, params, builder=fn)
    except BuilderError as e:
        hint = "" if builder is not None else (
            "; pass the builder, load_model(..., builder=build), or from the command "
            "line --builder module:function")
        raise ModelError(f"cannot rebuild the model of study {study!r}: {e}{hint}") \
            from None


def read_model(study: optuna.Study, artifact: str, number: int,
               directory: str | None = None) -> dict[str, np.ndarray]:
    """The weights of a kept model, read through the study's artifact store (or the
    one at ``directory``)."""
    directory = directory or study.user_attrs.get(ARTIFACTS_ATTR)
    if not directory or not Path(directory).is_dir():
        raise ModelError(f"the artifact store of study {study.study_name!r} "
                         f"({directory}) is missing")
    try:
        with FileSystemArtifactStore(directory).open_reader(artifact) as f, \
                np.load(f, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except ArtifactNotFound:
        raise ModelError(f"the model of trial {number} ({artifact}) is missing from "
                         f"{directory}") from None


def open_stored(storage: str | Path | Any, study: str) -> optuna.Study:
    """Load ``study`` from a URL, a SQLite file's path or a storage object, creating
    nothing (:class:`ModelError` if there is no such file or study)."""
    try:
        url = storage_url(storage)
    except FileNotFoundError as e:
        raise ModelError(str(e)) from None
    try:
        return load_stored(url, study, close=isinstance(storage, (str, Path)))
    except KeyError:
        raise ModelError(f"no study {study!r} in {storage}") from None
