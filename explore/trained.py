"""A kept model of a study, loaded to predict, evaluate and export.

A study run with ``keep_models`` holds the final weights of its best trials
(:mod:`explore.keeper`), and with them what a model takes and gives (the study's
``data`` record: task, features, classes, the preprocessing fitted on the training
split).  :func:`load_model` rebuilds the trial's CalcGraph from its parameters,
compiles it, and loads the weights into a VM; :class:`TrainedModel` then takes raw
rows (a DataFrame with the data set's columns, or an array of its numeric features)
through the same preprocessing as the search did.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from optuna.artifacts import FileSystemArtifactStore
from optuna.artifacts.exceptions import ArtifactNotFound

from engine import VM, compile_graph
from explore import families
from explore.attrs import BUILDER_DIR_ATTR, DATA_ATTR, SPACE_ATTR
from explore.candidate import BUILDER_PARAMS
from explore.datasets.quantize import quantize
from explore.datasets.table import Preprocess
from explore.families.builder import (
    BuilderError,
    call_builder,
    graph_of_model,
    load_builder,
    replay,
)
from explore.keeper import ARTIFACTS_ATTR, MODELS_ATTR
from explore.onnx_model import model_to_onnx
from explore.optimizers import build_optimizer
from explore.runner import data_record
from explore.scheduler.worker import Validation
from explore.study import PARAMS_ATTR, RECORD_ATTR, storage_url

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

    @classmethod
    def from_record(cls, r: dict[str, Any]) -> StoredData:
        pre = None
        if r.get("preprocess"):
            pre = Preprocess.from_dict(r["preprocess"])
        return cls(r["task"], int(r["features"]), int(r.get("classes") or 0),
                   tuple(r["image"]) if r.get("image") else None,
                   r.get("pixel_scale"),
                   tuple(r["target_scale"]) if r.get("target_scale") else None,
                   pre)

    @property
    def outputs(self) -> int:
        return self.classes if self.task == "classification" else 1


@dataclass
class TrainedModel:
    """A trial's model, weights loaded: ``vm`` runs its ``eval`` path, whose last
    layer ``logits`` is what :meth:`predict` reads.

    ``predict(rows)`` gives the class labels (as the data had them) or the
    regression's values in the target's units; ``predict_proba(rows)`` the class
    probabilities; ``features(rows)`` the preprocessed model input."""

    vm: Any  # engine.VM
    graph: Any  # engine.CalcGraph
    data: StoredData
    params: dict[str, Any]
    trial: int
    study: str

    def features(self, rows: Any) -> np.ndarray:
        """Raw rows -> the model's input (the search's preprocessing, if any)."""
        pre = self.data.preprocess
        if pre is not None:
            return np.ascontiguousarray(pre.transform(rows))
        x = np.asarray(rows)
        return self.model_input(x.reshape(len(x), -1) if x.ndim > 2 else x)

    def model_input(self, x: np.ndarray) -> np.ndarray:
        """Features as the model takes them: images of a pixel scale as exact uint8
        pixels (see :mod:`explore.datasets.quantize`)."""
        scale = self.data.pixel_scale
        if scale is not None and x.dtype != np.uint8:
            return quantize(np.asarray(x, np.float32), scale)
        return x

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
    have = StoredData.from_record(data_record(ds))
    want = model.data
    for key in ("task", "features", "classes", "image", "pixel_scale", "target_scale"):
        a, b = getattr(have, key), getattr(want, key)
        if a != b:
            return f"{key}: {a!r} where the model has {b!r}"
    pa = have.preprocess.to_dict() if have.preprocess is not None else None
    pb = want.preprocess.to_dict() if want.preprocess is not None else None
    if pa != pb:
        return "its preprocessing (columns, scaling, categories or labels) differs"
    return None


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
        raise ModelError(f"study {study.study_name!r} keeps no models: run it with "
                         "keep_models > 0 (the default is 3)")
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


def load_model(storage: str | Path | Any, study: str, trial: int | None = None,
               builder: Any = None) -> TrainedModel:
    """The kept model of ``trial`` (default: the best kept) of ``study`` in
    ``storage`` (a URL, a SQLite file's path or an Optuna storage), ready to predict.
    A study whose models came from a Python builder rebuilds them with it: the one it
    recorded (``module:function``), or ``builder`` (a function defined in a notebook
    cannot be imported again).  Raises :class:`ModelError` when there is none."""
    s = open_stored(storage, study)
    t, artifact = find_model(s, trial)
    record = s.user_attrs.get(DATA_ATTR)
    space = s.user_attrs.get(SPACE_ATTR)
    if not record or not space:
        raise ModelError(f"study {study!r} does not record its data set and space")
    data = StoredData.from_record(record)
    params = dict((t.user_attrs.get(RECORD_ATTR) or {}).get(PARAMS_ATTR) or
                  t.user_attrs.get(PARAMS_ATTR) or t.params)
    graph = rebuild(space, params, data, builder, s.user_attrs.get(BUILDER_DIR_ATTR))
    prog = compile_graph(graph, batch_size=PREDICT_BATCH, optimizer=build_optimizer(params),
                         keep=["logits"])
    vm = VM(prog)
    for name, value in read_model(s, artifact, t.number).items():
        vm.assign(name, value)
    return TrainedModel(vm, graph, data, params, t.number, study)


def rebuild(space: dict[str, Any], params: dict[str, Any], data: StoredData,
            builder: Any = None, builder_dir: str | None = None) -> Any:
    """A trial's CalcGraph again, from its recorded parameters: by its family, or by the
    space's model builder replaying what it chose."""
    spec = space["model"].get("builder")
    if builder is None and spec is None:
        return families.get(space["model"]["family"]).build(params, data)
    try:
        fn = builder or load_builder(spec, builder_dir)
        return graph_of_model(call_builder(fn, replay(params.get(BUILDER_PARAMS) or {})),
                              data, params)
    except BuilderError as e:
        raise ModelError(f"cannot rebuild the model: {e}" + (
            "" if spec else "; its builder was a function defined where it cannot be "
            "imported again: pass it, load_model(..., builder=build)")) from None


def read_model(study: optuna.Study, artifact: str, number: int) -> dict[str, np.ndarray]:
    """The weights of a kept model, read through the study's artifact store."""
    directory = study.user_attrs.get(ARTIFACTS_ATTR)
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
        return optuna.load_study(study_name=study, storage=url)
    except KeyError:
        raise ModelError(f"no study {study!r} in {storage}") from None
