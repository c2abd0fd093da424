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

import math
import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from explore import builders, datasets, families, metrics, optimizers, pruners, samplers
from explore.datasets import BaseDataset, DataError
from explore.datasets.table import resolve
from explore.ranges import (  # the parameter types are part of the schema's vocabulary
    Choice,
    Flag,
    FloatRange,
    Int,
    IntRange,
    Num,
    Param,
    Range,
    Scalar,
    Strict,
    finite,
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

# -- limits (search_spaces/README.md, "Limits"): checked before anything is allocated ----
MAX_MEMORY = 10**15  # 1 PB: a memory budget beyond it is a typo
MAX_LAYERS = 64  # depth, blocks, stage_blocks
MAX_WIDTH = 1_048_576  # width (units per layer), channels (filters per block)
MAX_KERNEL = 63  # a convolution's kernel side (odd)
MAX_STRIDE = 64
MAX_BATCH = 1_048_576  # batch_size, auto_max_batch, eval_batch_size
MAX_TRIALS = 1_000_000
MAX_ROUNDS = 100_000
MAX_STACK = 64  # trials trained as one stacked program
MAX_SEED = 2**32 - 1  # numpy's and Optuna's samplers take seeds in [0, 2**32 - 1]
MAX_DEVICES = 64  # budget.devices: more GPUs than one host carries


def _shown(value: Any) -> str:
    """``value`` as a message quotes it: a long one cut short."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:30]}... ({len(text)} characters)"


def parse_size(value: Any) -> int:
    """Bytes from ``512MB``, ``4GiB``, ``1.5 GB`` or a number: at least one byte and at
    most :data:`MAX_MEMORY` (1 PB).

    >>> parse_size("512MB"), parse_size("4GiB"), parse_size(1024)
    (512000000, 4294967296, 1024)
    """
    if isinstance(value, bool):
        raise ValueError(f"a size, not {value!r}")
    shown = _shown(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"a size is a finite number of bytes, not {value}")
    if isinstance(value, int | float):
        n = Decimal(value)
    elif isinstance(value, str) and (m := _SIZE.match(value)):
        unit = m.group(2).upper()
        if unit not in _UNITS:
            raise ValueError(f"unknown unit {m.group(2)!r} in {value!r}; use B, KB, MB, GB, "
                             "KiB, MiB or GiB")
        try:
            n = Decimal(m.group(1)) * _UNITS[unit]
        except InvalidOperation:  # pragma: no cover (the pattern admits only digits)
            raise ValueError(f"{value!r} is not a size such as 512MB or 4GiB") from None
    else:
        raise ValueError(f"{shown} is not a size such as 512MB or 4GiB")
    if n <= 0:
        raise ValueError(f"a size must be positive, got {shown}")
    if n < 1:
        raise ValueError(f"{shown} is less than one byte")
    if n > MAX_MEMORY:
        raise ValueError(f"{shown} is more than 1 PB ({MAX_MEMORY:,} bytes), the most a "
                         "budget may be")
    return int(n)


ByteSize = Annotated[int, BeforeValidator(parse_size)]

# -- parameters ------------------------------------------------------------------------------
# What each model and training parameter may be, checked for a fixed value, both bounds
# of a range and every choice, so that no trial is the first to find out.


def _integer(lo: int, hi: int, odd: bool = False) -> Callable[[Any], None]:
    def check(v: Any) -> None:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"an integer, not {_shown(v)}")
        if not lo <= v <= hi:
            raise ValueError(f"{_shown(v)} is outside [{lo:,}, {hi:,}]")
        if odd and v % 2 == 0:
            raise ValueError(f"{v} is even: the kernel is odd (3, 5, ...) so that padding "
                             "keeps the image's size")
    check.numeric = "int"  # type: ignore[attr-defined]
    return check


def _number(lo: float, hi: float | None, lo_open: bool = False,
            hi_open: bool = False) -> Callable[[Any], None]:
    where = f"{'(' if lo_open else '['}{lo:g}, {'inf)' if hi is None else f'{hi:g}'}" + \
        ("" if hi is None else (")" if hi_open else "]"))

    def check(v: Any) -> None:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ValueError(f"a number, not {_shown(v)}")
        finite(v)
        if (v < lo or (lo_open and v == lo)) or \
                (hi is not None and (v > hi or (hi_open and v == hi))):
            raise ValueError(f"{_shown(v)} is outside {where}")
    check.numeric = "float"  # type: ignore[attr-defined]
    return check


def _name(what: str, known: Callable[[], list[str]]) -> Callable[[Any], None]:
    def check(v: Any) -> None:
        names = known()
        if not isinstance(v, str) or v.lower() not in names:
            raise ValueError(f"unknown {what} {_shown(v)}; known: {', '.join(names)}")
    return check


def _flag(v: Any) -> None:
    if not isinstance(v, bool):
        raise ValueError(f"true or false, not {_shown(v)}")


def _batch(v: Any) -> None:
    if v != "auto":
        try:
            _integer(1, MAX_BATCH)(v)
        except ValueError as e:
            raise ValueError(f"a batch size is 'auto' or an integer in [1, {MAX_BATCH:,}]; "
                             f"{e}") from None


_batch.numeric = "int"  # type: ignore[attr-defined]


def _losses() -> list[str]:
    return ["auto", *dict.fromkeys(n for names in builders.LOSSES.values() for n in names)]


RULES: dict[str, Callable[[Any], None]] = {
    "depth": _integer(0, MAX_LAYERS),  # 0: no hidden layer
    "blocks": _integer(0, MAX_LAYERS),
    "width": _integer(1, MAX_WIDTH),
    "channels": _integer(1, MAX_WIDTH),
    "activation": _name("activation", lambda: list(builders.ACTIVATIONS)),
    "dropout": _number(0, 1, hi_open=True),
    "init": _name("init", lambda: list(builders.INITS)),
    "kernel": _integer(1, MAX_KERNEL, odd=True),
    "stride": _integer(1, MAX_STRIDE),
    "pool": _flag,
    "batch_norm": _flag,
    "residual": _flag,
    "stage_blocks": _integer(1, MAX_LAYERS),
    "loss": _name("loss", _losses),
    "optimizer": _name("optimizer", lambda: [n.lower() for n in optimizers.names()]),
    "lr": _number(0, None, lo_open=True),
    "momentum": _number(0, 1, hi_open=True),
    "weight_decay": _number(0, None),
    "batch_size": _batch,
}


def check_value(name: str, value: Any) -> None:
    """A ValueError when ``value`` (a fixed value, or a list of per-layer values) is not
    one ``name`` may take; a name without a rule takes anything."""
    rule = RULES.get(name)
    if rule is None:
        return
    for v in value if isinstance(value, list) else [value]:
        rule(v)


def check_param(name: str, p: Any) -> Any:
    """``p`` (a fixed value or a range) if every value it can take suits ``name``."""
    rule = RULES.get(name)
    if rule is None:
        return p
    numeric = getattr(rule, "numeric", None)
    if isinstance(p, IntRange | FloatRange):
        kind = "int" if isinstance(p, IntRange) else "float"
        if numeric is None or (numeric == "int" and kind == "float"):
            use = "whole numbers: use int" if numeric else "names or flags: use choice"
            raise ValueError(f"{name} takes {use} rather than {kind}: [low, high]")
        for b in p.bounds:
            rule(b)
    elif isinstance(p, Choice):
        for i, v in enumerate(p.options):
            try:
                rule(v)
            except ValueError as e:
                raise ValueError(f"choice {i}: {e}") from None
    else:
        rule(p)
    return p

# -- sections ------------------------------------------------------------------------------


# Names of plugins: the schema accepts what is registered when a file is read (a
# Literal would freeze the list when this module is imported), with a Literal's message.
DatasetName = Annotated[str, BeforeValidator(datasets.DATASETS.check)]
MetricName = Annotated[str, BeforeValidator(metrics.METRICS.check)]
SamplerName = Annotated[str, BeforeValidator(samplers.SAMPLERS.check)]
PrunerName = Annotated[str, BeforeValidator(pruners.PRUNERS.check)]
FamilyName = Annotated[str, BeforeValidator(families.FAMILIES.check)]


class Dataset(Strict):
    """The ``dataset:`` section: a registered name, or a file of the user's::

        dataset: digits                               # a name: mnist, digits, iris, ...
        dataset: {name: mnist, train: 5000, valid: 2000}  # the first n rows of a split
        dataset:
          path: data/churn.csv      # relative to the YAML file: .csv, .parquet, .npz
          target: churned           # a column (tables) or an array name (.npz)
          features: [age, plan]     # default: every other column
          categorical: [plan]       # one-hot encoded; categories learned on train
          valid: 0.2                # a fraction (stratified for classification) or a
          test: 0.1                 #   path; test only reports the final model
          scale: standard           # none | standard | minmax, fitted on train only
          task: classification      # or regression; inferred from the target if omitted
          seed: 0                   # the split's seed
        dataset: {x: X.npy, y: y.npy}                 # arrays, memory-mapped

    Exactly one of ``name``, ``path`` or ``x`` and ``y``.  An integer ``train`` or
    ``valid`` keeps that many rows of the split (any dataset); a fraction or a path
    makes the split.  Named sets take the table options that they support (the
    scikit-learn tables: ``valid``/``test`` fractions, ``scale``, ``seed``).  Relative
    paths are resolved against the YAML file's folder (:func:`load_space`), or the
    current one for a space given from Python.  What the data says is checked when it
    is resolved (:attr:`Space.data`)."""

    name: DatasetName | None = None
    path: Path | None = None
    x: Path | None = None
    y: Path | None = None
    target: str | None = None
    features: list[str] | None = None
    categorical: list[str] = Field(default_factory=list)
    train: Int | None = Field(None, ge=1)  # use only the first n training samples
    valid: Int | Num | Path | None = None  # head count, fraction or file
    test: Num | Path | None = None
    scale: Literal["none", "standard", "minmax"] | None = None
    task: Literal["classification", "regression"] | None = None
    seed: Int | None = Field(None, ge=0, le=MAX_SEED)

    @field_validator("path", "x", "y", "valid", "test", mode="after")
    @classmethod
    def _relative(cls, v: Any, info: ValidationInfo) -> Any:
        base = (info.context or {}).get("base")
        return Path(base) / v if isinstance(v, Path) and base is not None and \
            not v.is_absolute() else v

    @field_validator("valid", "test", mode="before")
    @classmethod
    def _not_a_flag(cls, v: Any, info: ValidationInfo) -> Any:
        # one message, not one per member of the union
        if isinstance(v, bool) or not isinstance(v, int | float | str | Path | None):
            want = "a row count, " if info.field_name == "valid" else ""
            raise ValueError(f"{want}a fraction or a file, not {v!r}")
        return v

    @field_validator("valid", mode="after")
    @classmethod
    def _valid(cls, v: Any) -> Any:
        if isinstance(v, int) and not isinstance(v, bool) and v < 1:
            raise ValueError("a row count of at least 1, a fraction in (0, 1) or a file")
        if isinstance(v, float) and not 0 < v < 1:
            raise ValueError(f"a fraction in (0, 1), got {v}")
        return v

    @field_validator("test", mode="after")
    @classmethod
    def _test(cls, v: Any) -> Any:
        if isinstance(v, float) and not 0 <= v < 1:
            raise ValueError(f"a fraction in [0, 1), got {v}")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> Dataset:
        sources = [k for k in ("name", "path") if getattr(self, k) is not None]
        if self.x is not None or self.y is not None:
            if self.x is None or self.y is None:
                raise ValueError("x and y go together: the features and the target .npy "
                                 "files")
            sources.append("x and y")
        if len(sources) != 1:
            raise ValueError("exactly one of name (a built-in dataset), path (a .csv, "
                             ".parquet or .npz file) or x and y (.npy files)"
                             + (f"; got {' and '.join(sources)}" if sources else ""))
        if self.name is not None or self.x is not None:
            what = "a named dataset" if self.name is not None else "x and y arrays"
            for k in ("target", "features"):
                if getattr(self, k) is not None:
                    raise ValueError(f"{k} is for a table file (path:); {what} has none")
            if self.categorical:
                raise ValueError(f"categorical is for a table file (path:); {what} has none")
        if self.name is not None and self.task is not None:
            raise ValueError("task is for your own data: a named dataset has its own")
        if self.path is not None and self.path.suffix.lower() in (".csv", ".parquet") and \
                self.target is None:
            raise ValueError("target: name the column to predict")
        return self

    @property
    def heads(self) -> tuple[int | None, int | None]:
        """The row counts to keep of the training and validation splits (None: all)."""
        valid = self.valid if isinstance(self.valid, int) and \
            not isinstance(self.valid, bool) else None
        return self.train, valid


def _dataset(v: Any) -> Any:
    return {"name": v} if isinstance(v, str) else v


class Objective(Strict):
    metric: MetricName
    direction: Literal["maximize", "minimize"] | None = None

    @property
    def dir(self) -> str:
        return self.direction or metrics.get(self.metric).direction


class Budget(Strict):
    trials: int = Field(ge=1, le=MAX_TRIALS, strict=True)
    rounds: int = Field(ge=1, le=MAX_ROUNDS, strict=True)  # rounds (epochs) per trial
    device: Literal["cpu", "gpu"] = "cpu"
    # Several devices of this machine (GPU ordinals as CUDA numbers them; on the CPU
    # simulated): each gets ``memory`` and ``workers`` of its own, and a trial runs on
    # one of them.  None: one device (the GPU is the process's current one).
    devices: list[Annotated[int, Field(ge=0, le=1023, strict=True)]] | None = Field(
        None, min_length=1, max_length=MAX_DEVICES)
    memory: ByteSize  # for trial heaps, worker overheads and data on each device
    workers: int = Field(1, ge=1, le=256, strict=True)  # on each device
    # held at once: one running, one ready
    trials_per_worker: int = Field(2, ge=1, le=64, strict=True)
    # Trials asked of the sampler at once and trained as one stacked program when they
    # share an architecture and an optimizer kind (engine.compile.stack): at most this
    # many per stack.  1: every trial alone.
    stack: int = Field(1, ge=1, le=MAX_STACK, strict=True)
    seed: int = Field(0, ge=0, le=MAX_SEED, strict=True)
    # seconds a driver may be silent before its running trials are failed as stale and
    # re-queued by another driver or the next run (explore.live); a driver's heartbeat is
    # every 5 s, or a quarter of the grace if that is shorter
    grace: Num = Field(60.0, ge=2, le=86_400)

    @property
    def ordinals(self) -> list[int]:
        """The devices the run uses: ``devices``, or the one device."""
        return list(self.devices) if self.devices else [0]

    @model_validator(mode="after")
    def _machine(self) -> Budget:
        if self.devices is not None and len(set(self.devices)) < len(self.devices):
            twice = sorted({d for d in self.devices if self.devices.count(d) > 1})
            raise Located(("devices",), f"device {twice[0]} is listed twice: each device "
                          "gets a budget of its own once")
        have = machine_memory() if self.device == "cpu" else None
        # simulated devices on the CPU share this machine's memory
        need = self.memory * len(self.ordinals)
        if have is not None and need > have:
            each = f" ({len(self.ordinals)} devices of {self.memory:,})" \
                if len(self.ordinals) > 1 else ""
            raise Located(("memory",), f"{need:,} bytes{each} is more than this machine "
                          f"has ({have:,} bytes of memory and swap)")
        return self


def machine_memory() -> int | None:
    """Bytes of physical memory and swap on this machine (a budget above them could
    never be honoured); None where the system does not say."""
    import os

    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("SwapTotal:"):
                    total += int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return int(total)


class Sampler(Strict):
    name: SamplerName = "tpe"
    seed: Int | None = Field(None, ge=0, le=MAX_SEED)
    startup_trials: Int | None = Field(None, ge=0)


class Pruner(Strict):
    name: PrunerName = "median"
    warmup_rounds: Int = Field(1, ge=0)
    # successive_halving and hyperband: a trial not promoted at a rung waits there and
    # resumes if later results promote it (explore.rungs); false: it is pruned at once
    pause: Flag = True


def _named(v: Any) -> Any:
    return {"name": v} if isinstance(v, str) else v


class Model(Strict):
    family: FamilyName = "mlp"
    # A Python function, "module:function", that builds each trial's model and asks the
    # trial for its own parameters (explore.model_builders); the other keys then unused.
    builder: str | None = None
    _base: Path | None = PrivateAttr(default=None)  # the space's folder: where to import

    @model_validator(mode="after")
    def _builder(self, info: ValidationInfo) -> Model:
        if self.builder is None:
            return self
        module, sep, attr = self.builder.partition(":")
        if not (sep and module and attr):
            raise ValueError(f"builder {self.builder!r}: write module:function, e.g. "
                             "my_models:build")
        unused = [k for k, f in type(self).model_fields.items()
                  if k not in ("family", "builder") and
                  getattr(self, k) != f.get_default(call_default_factory=True)]
        if unused:
            raise ValueError(f"{', '.join(unused)}: a model builder asks the trial for its "
                             "own parameters; the family's keys are not used with builder")
        base = (info.context or {}).get("base")
        self._base = Path(base) if base is not None else None
        return self
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
    stage_blocks: Param = 1  # resnet: residual blocks per stage (blocks: the stages)

    @field_validator("depth", "width", "activation", "dropout", "init", "blocks", "channels",
                     "kernel", "stride", "pool", "batch_norm", "residual", "stage_blocks",
                     mode="after")
    @classmethod
    def _rules(cls, v: Any, info: ValidationInfo) -> Any:
        return check_param(str(info.field_name), v)
    # family onnx (implied by onnx): a model of the user's, trained (explore.families._onnx)
    onnx: Path | None = None  # the .onnx file, relative to the YAML file
    freeze: list[str] | Param = Field(default_factory=list)  # parameters kept (globs)
    head: Int = Field(0, ge=0)  # the last N weight layers re-initialised, resized

    @model_validator(mode="before")
    @classmethod
    def _onnx_family(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("onnx") is not None and "family" not in data:
            return {**data, "family": "onnx"}
        return data

    @field_validator("onnx", mode="after")
    @classmethod
    def _onnx_file(cls, v: Path | None, info: ValidationInfo) -> Path | None:
        """Resolved against the YAML file's folder; the file must import as a model."""
        if v is None:
            return v
        base = (info.context or {}).get("base")
        if not v.is_absolute():
            v = Path(base or Path.cwd()) / v
        v = v.resolve()
        from explore.families._onnx import load

        try:
            load(v)
        except Exception as e:  # the importer's errors, as the schema's
            raise ValueError(str(e)) from None
        return v

    @field_validator("freeze", mode="after")
    @classmethod
    def _freeze(cls, v: Any, info: ValidationInfo) -> Any:
        if isinstance(v, Range) and not isinstance(v, Choice):
            raise ValueError("freeze is a list of parameter names (globs), or a choice of "
                             "comma-separated globs")
        from explore.families._onnx import globs

        for option in v.options if isinstance(v, Choice) else [v]:
            globs(option)  # a number or a flag is no glob (ValueError)
        path = info.data.get("onnx")
        if path is not None:
            from explore.families._onnx import check_freeze, load

            check_freeze(load(path), v)
        return v

    @field_validator("head", mode="after")
    @classmethod
    def _head(cls, v: int, info: ValidationInfo) -> int:
        path = info.data.get("onnx")
        if path is not None:
            from explore.families._onnx import check_head, load

            check_head(load(path), v)
        return v

    @model_validator(mode="after")
    def _family(self) -> Model:
        if self.builder is not None:
            return self
        if self.onnx is not None and self.family != "onnx":
            raise ValueError(f"onnx is the file of family onnx, not of family {self.family}")
        if self.onnx is not None:
            from explore.families._onnx import check_trainable, load

            try:
                check_trainable(load(self.onnx), self.freeze, self.head)
            except ValueError as e:
                raise Located(("freeze",), str(e)) from None
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
    auto_max_batch: int = Field(512, ge=1, le=MAX_BATCH, strict=True)
    # validation runs in chunks this big
    eval_batch_size: int = Field(512, ge=1, le=MAX_BATCH, strict=True)

    @field_validator("loss", "optimizer", "lr", "momentum", "weight_decay", "batch_size",
                     mode="after")
    @classmethod
    def _rules(cls, v: Any, info: ValidationInfo) -> Any:
        return check_param(str(info.field_name), v)


class Space(Strict):
    name: str | None = None

    @field_validator("name", mode="after")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        if v is not None:
            check_study_name(v)
        return v
    # None: the data is given from Python (with_data)
    dataset: Annotated[Dataset | None, BeforeValidator(_dataset)] = None
    objectives: list[Objective] = Field(
        default_factory=lambda: [Objective(metric="accuracy")], min_length=1, max_length=3)
    budget: Budget
    sampler: Annotated[Sampler, BeforeValidator(_named)] = Field(default_factory=Sampler)
    pruner: Annotated[Pruner, BeforeValidator(_named)] = Field(default_factory=Pruner)
    model: Model = Field(default_factory=Model)
    training: Training = Field(default_factory=Training)
    # The final weights of this many best trials (first objective) are kept, in
    # Optuna's artifact store at ``artifacts`` (default: next to a SQLite study).
    keep_models: Int = Field(3, ge=0, le=MAX_TRIALS)
    artifacts: str | None = None

    _data: BaseDataset | None = PrivateAttr(default=None)
    _builder: Any = PrivateAttr(default=None)

    @property
    def data(self) -> BaseDataset:
        """The data set the ``dataset`` section names, resolved once (a file is read and
        checked then: :class:`~explore.datasets.DataError`) and kept, so compiling many
        candidates reads nothing; or the one given to :meth:`with_data`."""
        if self._data is None:
            if self.dataset is None:
                raise DataError("the space names no dataset: give one in its dataset "
                                "section or bind one with Space.with_data(...)")
            data = resolve(self.dataset)
            train, valid = self.dataset.heads
            have = getattr(data, "rows", None)
            if valid is not None and valid > data.valid:
                raise DataError(f"{valid:,} validation rows asked for, but the split has "
                                f"{data.valid:,}", key="valid")
            if train is not None and have is not None and train > have[0]:
                raise DataError(f"{train:,} training rows asked for, but the split has "
                                f"{have[0]:,}", key="train")
            self._data = data
        return self._data

    def with_data(self, data: BaseDataset) -> Space:
        """A copy of the space bound to ``data`` (from Python: a
        :func:`~explore.datasets.from_python` table, say); its ``dataset`` section's row
        counts (``train``, ``valid``) still apply.

        >>> from explore.datasets import from_python
        >>> ds = from_python(([[0.0], [1.0], [2.0], [3.0], [4.0]], [0, 1, 0, 1, 0]))
        >>> s = parse_space({"budget": {"trials": 1, "rounds": 1, "memory": "64MB"}})
        >>> s.with_data(ds).data is ds, s.dataset is None
        (True, True)
        """
        if not isinstance(data, BaseDataset):
            raise TypeError(f"with_data takes a dataset (explore.datasets.from_python(...) "
                            f"makes one of a DataFrame or arrays), not {type(data).__name__}")
        out = self.model_copy()
        out._data = data
        return out

    @property
    def uses_builder(self) -> bool:
        """Whether each trial's model comes from a Python builder (model.builder, or
        one bound with :meth:`with_builder`)."""
        return self._builder is not None or self.model.builder is not None

    @property
    def builder(self) -> Any:
        """The model builder function (imported once from ``model.builder``; raises
        :class:`~explore.model_builders.BuilderError` when it cannot be)."""
        if self._builder is None:
            from explore.model_builders import BuilderError, load_builder

            if self.model.builder is None:
                raise BuilderError("the space has no model builder")
            self._builder = load_builder(self.model.builder, self.model._base)
        return self._builder

    def with_builder(self, fn: Any) -> Space:
        """A copy of the space whose trials' models come from ``fn(trial)``."""
        if not callable(fn):
            raise TypeError(f"a model builder is a function of the trial, not a "
                            f"{type(fn).__name__}")
        out = self.model_copy()
        out._builder = fn
        return out

    def params(self) -> dict[str, Any]:
        """Every parameter by its name (model ones first: depth before the layers)."""
        out = {k: getattr(self.model, k) for k in ("depth", "blocks", "width", "activation",
                                                   "dropout", "init", "channels", "kernel",
                                                   "stride", "pool", "batch_norm",
                                                   "residual", "stage_blocks")}
        if self.model.onnx is not None:  # fixed values: each trial's record rebuilds it
            out.update(onnx=str(self.model.onnx), freeze=self.model.freeze,
                       head=self.model.head)
        out.update({k: getattr(self.training, k) for k in ("loss", "optimizer", "lr",
                                                           "momentum", "weight_decay",
                                                           "batch_size")})
        return out

    @model_validator(mode="after")
    def _artifacts(self) -> Space:
        if self.keep_models > 0 and self.artifacts:
            from explore.folders import directory_problem

            problem = directory_problem(self.artifacts)
            if problem is not None:
                raise Located(("artifacts",), f"{problem}; name a folder that exists or "
                              "can be made, and is writable (or keep_models: 0)")
        return self

    @model_validator(mode="after")
    def _cross(self) -> Space:
        params = self.params()
        for name, p in params.items():
            section = "model" if name in Model.model_fields else "training"
            if isinstance(p, Range) and p.when:
                if name in p.when:
                    raise Located((section, name, "when", name),
                                  f"names {name} itself: a parameter cannot depend on its "
                                  "own value")
                for other, want in p.when.items():
                    if other not in params:
                        raise Located((section, name, "when", other),
                                      f"names {other!r}, which is not a parameter; "
                                      f"parameters: {', '.join(params)}")
                    if other in PER_LAYER_NAMES and isinstance(params[other], Range) and \
                            params[other].per_layer:
                        raise Located((section, name, "when", other),
                                      f"names {other}, which has one value per layer "
                                      "(per_layer): a when names a single value")
                    if _depends_on(params, other, name):
                        raise Located((section, name, "when", other),
                                      f"{other} depends on {name} in turn (through when): "
                                      "a circular condition, neither would be asked first")
                    wanted = want if isinstance(want, list) else [want]
                    if not any(can_be(params[other], v) for v in wanted):
                        raise Located((section, name, "when", other),
                                      f"{want!r} is never a value of {other} "
                                      f"({describe(params[other])}): {name} would never "
                                      "be asked for")
                if name not in WHEN_DEFAULTS:
                    raise Located((section, name, "when"),
                                  f"{name} is a parameter every trial needs, so it cannot "
                                  "have when: (a trial not asking for it would have no "
                                  f"value); only {', '.join(WHEN_DEFAULTS)} can, which "
                                  "are off when not asked")
            if isinstance(p, Range) and p.per_layer and name not in PER_LAYER_NAMES:
                raise Located((section, name, "per_layer"), "per_layer applies to width, "
                              "activation, dropout and channels only")
        bs = params["batch_size"]
        if isinstance(bs, str) and bs != "auto":
            raise Located(("training", "batch_size"),
                          f"a number, a range or 'auto', not {bs!r}")
        try:  # the sampler's own rules (CMA-ES: numbers only, ...): on the sampler's line
            samplers.get(self.sampler.name).check(len(self.objectives), params)
        except Located:
            raise
        except ValueError as e:
            raise Located(("sampler", "name"), str(e)) from None
        return self


# A parameter with ``when`` that a trial does not ask for takes this value (off): one
# every trial needs (lr, batch_size, width, depth, ...) cannot be conditional.
WHEN_DEFAULTS: dict[str, Any] = {"momentum": 0.0, "weight_decay": 0.0, "dropout": 0.0,
                                 "loss": "auto"}
PER_LAYER_NAMES = ("width", "activation", "dropout", "channels")


def _depends_on(params: dict[str, Any], start: str, target: str) -> bool:
    """Whether ``start``'s ``when`` leads (directly or through others) to ``target``."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        p = params.get(name)
        if isinstance(p, Range) and p.when:
            if target in p.when:
                return True
            todo.extend(p.when)
    return False


def check_study_name(name: str) -> None:
    """A study name the storage can hold: not blank, UTF-8 (a lone surrogate such as
    "\\ud800" is not), no control characters (ValueError)."""
    if not name.strip():
        raise ValueError("a study name is not blank")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{name!r} is not valid text (it cannot be written as UTF-8)"
                         ) from None
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise ValueError(f"{name!r} holds a control character")


def can_be(p: Any, v: Any) -> bool:
    """Whether parameter ``p`` (a fixed value or a range) can take the value ``v``.

    >>> can_be(Choice.model_validate({"choice": ["sgd", "adam"]}), "sgd"), can_be(2, True)
    (True, False)
    """
    def same(a: Any, b: Any) -> bool:  # True is not 1 here
        return isinstance(a, bool) == isinstance(b, bool) and a == b

    if isinstance(p, Choice):
        return any(same(v, x) for x in p.options)
    if isinstance(p, IntRange | FloatRange):
        if isinstance(v, bool) or not isinstance(v, int | float):
            return False
        lo, hi = p.bounds
        if not lo <= v <= hi:
            return False
        if isinstance(p, IntRange):
            return float(v).is_integer() and (int(v) - lo) % p.step == 0
        return True
    return same(v, p)


def describe(p: Any) -> str:
    """A parameter's values, for a message."""
    if isinstance(p, Choice):
        return f"one of {p.options}"
    if isinstance(p, IntRange | FloatRange):
        return f"in [{p.bounds[0]}, {p.bounds[1]}]"
    return f"fixed at {p!r}"


# -- loading --------------------------------------------------------------------------------


class Located(ValueError):
    """A check across sections that knows the key at fault (reported at its line, not at
    the top of the file)."""

    def __init__(self, loc: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc



def parse_space(data: Any, doc: Document | None = None, resolve_data: bool = True) -> Space:
    """Validate ``data`` (already read) as a :class:`Space`; every error at once.  Data
    file paths are relative to ``doc``'s folder, or the current one.  With
    ``resolve_data`` the dataset is resolved too (:attr:`Space.data`: a file is read and
    checked), and what is wrong with it is an error of the ``dataset`` section."""
    base = Path(doc.file).parent if doc else Path.cwd()
    try:
        space = Space.model_validate(data, context={"base": base})
    except ValidationError as e:
        file = doc.file if doc else "<space>"
        errors = []
        for err in e.errors():
            loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and
                                                     ("[" in p or p.startswith("function"))))
            cause = (err.get("ctx") or {}).get("error")
            if isinstance(cause, Located):
                loc = (*loc, *cause.loc)
            line = doc.line(loc) if doc else None
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown key"
            errors.append(SourceError(file, line, ".".join(map(str, loc)), msg))
        raise SpaceError(errors) from None
    if resolve_data and space.dataset is not None:
        try:
            space.data  # noqa: B018 (resolved and kept)
        except DataError as e:
            loc = ("dataset", e.key) if e.key else ("dataset",)
            raise SpaceError([SourceError(doc.file if doc else "<space>",
                                          doc.line(loc) if doc else None,
                                          ".".join(loc), str(e))]) from e
    if space.model.builder is not None:
        from explore.model_builders import BuilderError

        try:
            space.builder  # noqa: B018 (imported and kept)
        except BuilderError as e:
            raise SpaceError([SourceError(doc.file if doc else "<space>",
                                          doc.line(("model", "builder")) if doc else None,
                                          "model.builder", str(e))]) from e
    return space


def load_space(path: str | Path, resolve_data: bool = True) -> Space:
    """Read and validate a search-space file (raises :class:`SpaceError`); with
    ``resolve_data`` its dataset is resolved too (a data file read and checked)."""
    doc = load_file(path)
    if not isinstance(doc.data, dict):
        raise SpaceError([SourceError(doc.file, 1, "", "a search space is a mapping of keys "
                                      "(dataset, budget, model, training, ...)")])
    space = parse_space(doc.data, doc, resolve_data)
    if space.dataset is None:
        raise SpaceError([SourceError(doc.file, 1, "dataset", "Field required: a name "
                                      f"({', '.join(datasets.names())}) or a file (path:)")])
    if space.name is None:
        space = space.model_copy(update={"name": Path(path).stem})
    return space
