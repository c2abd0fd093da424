"""The search-space schema: what a ``search_spaces/*.yaml`` file may say.

A file names the dataset, the objective(s), the budget, the sampler and pruner, the
model family with its architecture parameters and the training parameters.  Every
parameter is either a fixed value or a range to search::

    lr: {float: [1.0e-4, 1.0e-1], log: true}
    depth: {int: [1, 4]}
    width: {int: [16, 256], log: true, per_layer: true}   # width_0, width_1, ...
    optimizer: {choice: [sgd, adam]}
    momentum: {float: [0.0, 0.99], when: {optimizer: sgd}}  # only asked for SGD
    batch_size: auto                                        # the largest that fits

:func:`load_space` validates a file (pydantic) and reports every problem with its
file, line and key at once (:class:`~explore.yamlio.SpaceError`).

>>> s = parse_space({"dataset": "digits", "budget": {"trials": 4, "rounds": 2,
...     "memory": "64MB"}, "model": {"depth": 1, "width": 8},
...     "training": {"optimizer": "adam", "lr": {"float": [1e-3, 1e-1], "log": True}}})
>>> s.budget.memory, s.objectives[0].metric, s.training.lr.log
(64000000, 'accuracy', True)
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationError, model_validator

from explore import datasets, families, metrics, pruners, samplers
from explore.ranges import (  # the parameter types are part of the schema's vocabulary
    Choice,
    FloatRange,
    IntRange,
    Param,
    Range,
    Scalar,
    Strict,
)
from explore.yamlio import Document, SourceError, SpaceError, load_file

__all__ = ["Budget", "ByteSize", "Choice", "Dataset", "FloatRange", "IntRange", "Model",
           "Objective", "Param", "Pruner", "Range", "Sampler", "Scalar", "Space", "Training",
           "load_space", "parse_size", "parse_space"]

# -- sizes -------------------------------------------------------------------------------

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "K": 10**3, "M": 10**6,
          "G": 10**9}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_size(value: Any) -> int:
    """Bytes from ``512MB``, ``4GiB``, ``1.5 GB`` or a number.

    >>> parse_size("512MB"), parse_size("4GiB"), parse_size(1024)
    (512000000, 4294967296, 1024)
    """
    if isinstance(value, bool):
        raise ValueError(f"a size, not {value!r}")
    if isinstance(value, int | float):
        n = value
    elif isinstance(value, str) and (m := _SIZE.match(value)):
        unit = m.group(2).upper()
        if unit not in _UNITS:
            raise ValueError(f"unknown unit {m.group(2)!r} in {value!r}; use B, KB, MB, GB, "
                             "KiB, MiB or GiB")
        n = float(m.group(1)) * _UNITS[unit]
    else:
        raise ValueError(f"{value!r} is not a size such as 512MB or 4GiB")
    if n <= 0:
        raise ValueError(f"a size must be positive, got {value!r}")
    return int(n)


ByteSize = Annotated[int, BeforeValidator(parse_size)]

# -- sections ------------------------------------------------------------------------------


# Names of plugins: the schema accepts what is registered when a file is read (a
# Literal would freeze the list when this module is imported), with a Literal's message.
DatasetName = Annotated[str, BeforeValidator(datasets.DATASETS.check)]
MetricName = Annotated[str, BeforeValidator(metrics.METRICS.check)]
SamplerName = Annotated[str, BeforeValidator(samplers.SAMPLERS.check)]
PrunerName = Annotated[str, BeforeValidator(pruners.PRUNERS.check)]
FamilyName = Annotated[str, BeforeValidator(families.FAMILIES.check)]


class Dataset(Strict):
    name: DatasetName
    train: int | None = Field(None, ge=1)  # use only the first n training samples
    valid: int | None = Field(None, ge=1)


def _dataset(v: Any) -> Any:
    return {"name": v} if isinstance(v, str) else v


class Objective(Strict):
    metric: MetricName
    direction: Literal["maximize", "minimize"] | None = None

    @property
    def dir(self) -> str:
        return self.direction or metrics.get(self.metric).direction


class Budget(Strict):
    trials: int = Field(ge=1)
    rounds: int = Field(ge=1)  # rounds (epochs) per trial
    device: Literal["cpu", "gpu"] = "cpu"
    memory: ByteSize  # for trial heaps, worker overheads and data on the device
    workers: int = Field(1, ge=1, le=256)
    trials_per_worker: int = Field(2, ge=1)  # held at once: one running, one ready
    seed: int = 0


class Sampler(Strict):
    name: SamplerName = "tpe"
    seed: int | None = None
    startup_trials: int | None = Field(None, ge=0)


class Pruner(Strict):
    name: PrunerName = "median"
    warmup_rounds: int = Field(1, ge=0)
    # successive_halving and hyperband: a trial not promoted at a rung waits there and
    # resumes if later results promote it (explore.rungs); false: it is pruned at once
    pause: bool = True


def _named(v: Any) -> Any:
    return {"name": v} if isinstance(v, str) else v


class Model(Strict):
    family: FamilyName = "mlp"
    depth: Param = 2  # hidden dense layers (after the convolution blocks of a cnn)
    width: Param = 64
    activation: Param = "relu"
    dropout: Param = 0.0
    init: Param = "xavier_uniform"
    blocks: Param = 0  # cnn: convolution blocks (conv, relu, optional 2x2 max pooling)
    channels: Param = 16  # cnn: filters per block
    kernel: Param = 3  # cnn: square kernel size (odd: "same" padding)
    stride: Param = 1  # cnn: convolution stride (2 halves the image, as pooling does)
    pool: Param = True  # cnn: 2x2 max pooling after each block
    batch_norm: Param = False  # cnn: batch normalisation between convolution and relu
    residual: Param = False  # cnn: add a block's input to its output where shapes agree

    @model_validator(mode="after")
    def _family(self) -> Model:
        families.get(self.family).check({k: getattr(self, k) for k in type(self).model_fields})
        return self


class Training(Strict):
    # auto: cross-entropy for a classification, mse for a regression (or mae, huber)
    loss: Param = "auto"
    optimizer: Param = "adam"
    lr: Param = 1e-3
    momentum: Param = 0.0
    weight_decay: Param = 0.0
    batch_size: Param = 64  # or "auto": the largest batch that fits the trial's share
    auto_max_batch: int = Field(512, ge=1)
    eval_batch_size: int = Field(512, ge=1)  # validation runs in chunks this big


class Space(Strict):
    name: str | None = None
    dataset: Annotated[Dataset, BeforeValidator(_dataset)]
    objectives: list[Objective] = Field(
        default_factory=lambda: [Objective(metric="accuracy")], min_length=1, max_length=3)
    budget: Budget
    sampler: Annotated[Sampler, BeforeValidator(_named)] = Field(default_factory=Sampler)
    pruner: Annotated[Pruner, BeforeValidator(_named)] = Field(default_factory=Pruner)
    model: Model = Field(default_factory=Model)
    training: Training = Field(default_factory=Training)
    # The final weights of this many best trials (first objective) are kept, in
    # Optuna's artifact store at ``artifacts`` (default: next to a SQLite study).
    keep_models: int = Field(3, ge=0)
    artifacts: str | None = None

    def params(self) -> dict[str, Any]:
        """Every parameter by its name (model ones first: depth before the layers)."""
        out = {k: getattr(self.model, k) for k in ("depth", "blocks", "width", "activation",
                                                   "dropout", "init", "channels", "kernel",
                                                   "stride", "pool", "batch_norm",
                                                   "residual")}
        out.update({k: getattr(self.training, k) for k in ("loss", "optimizer", "lr",
                                                           "momentum", "weight_decay",
                                                           "batch_size")})
        return out

    @model_validator(mode="after")
    def _cross(self) -> Space:
        params = self.params()
        for name, p in params.items():
            if isinstance(p, Range) and p.when:
                for other in p.when:
                    if other not in params:
                        raise ValueError(f"{name}.when names {other!r}, which is not a "
                                         f"parameter; parameters: {', '.join(params)}")
            if isinstance(p, Range) and p.per_layer and name not in ("width", "activation",
                                                                      "dropout", "channels"):
                raise ValueError(f"{name}: per_layer applies to width, activation, dropout "
                                 "and channels only")
        bs = params["batch_size"]
        if isinstance(bs, str) and bs != "auto":
            raise ValueError(f"training.batch_size is a number, a range or 'auto', not {bs!r}")
        samplers.get(self.sampler.name).check(len(self.objectives), params)
        return self


# -- loading --------------------------------------------------------------------------------


def parse_space(data: Any, doc: Document | None = None) -> Space:
    """Validate ``data`` (already read) as a :class:`Space`; every error at once."""
    try:
        return Space.model_validate(data)
    except ValidationError as e:
        file = doc.file if doc else "<space>"
        errors = []
        for err in e.errors():
            loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and
                                                     ("[" in p or p.startswith("function"))))
            line = doc.line(loc) if doc else None
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown key"
            errors.append(SourceError(file, line, ".".join(map(str, loc)), msg))
        raise SpaceError(errors) from None


def load_space(path: str | Path) -> Space:
    """Read and validate a search-space file (raises :class:`SpaceError`)."""
    doc = load_file(path)
    if not isinstance(doc.data, dict):
        raise SpaceError([SourceError(doc.file, 1, "", "a search space is a mapping of keys "
                                      "(dataset, budget, model, training, ...)")])
    space = parse_space(doc.data, doc)
    if space.name is None:
        space = space.model_copy(update={"name": Path(path).stem})
    return space
