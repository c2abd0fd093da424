"""The sections of a search space other than the space itself (:mod:`explore.space`):
``dataset``, ``objectives``, ``budget``, ``sampler``, ``pruner``, ``model`` and
``training``.  A model family's own rules are its ``check`` (and family onnx's keys its
:func:`~explore.families.check_onnx_key`), which the ``model`` section calls."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BeforeValidator,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from explore import datasets, families, metrics, pruners, samplers
from explore.ranges import Flag, Int, Num, Param, Strict
from explore.space_rules import (
    MAX_BATCH,
    MAX_DEVICES,
    MAX_ROUNDS,
    MAX_SEED,
    MAX_STACK,
    MAX_TRIALS,
    ByteSize,
    Located,
    check_param,
)

# Names of plugins: the schema accepts what is registered when a file is read (a
# Literal would freeze the list when this module is imported), with a Literal's message.
DatasetName = Annotated[str, BeforeValidator(datasets.DATASETS.check)]
MetricName = Annotated[str, BeforeValidator(metrics.METRICS.check)]
SamplerName = Annotated[str, BeforeValidator(samplers.SAMPLERS.check)]
PrunerName = Annotated[str, BeforeValidator(pruners.PRUNERS.check)]
FamilyName = Annotated[str, BeforeValidator(families.FAMILIES.check)]

# refresh_statistics: "auto": mini-batches forwarded before a validation.  At PyTorch's
# batch-norm momentum (0.1) 30 leave 4% of the statistics training left.
REFRESH_AUTO = 30


class DatasetSection(Strict):
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
          missing: impute           # error (default) | drop | impute: missing values
          impute: median            # with impute: median | mean | most_frequent
        dataset: {x: X.npy, y: y.npy}                 # arrays, memory-mapped
        dataset: {name: sunspots, window: 22}         # a built-in series' windows
        dataset:
          kind: series              # windows of a time series (.csv or .parquet)
          path: data/load.csv
          target: load              # the column predicted, horizon steps ahead
          columns: [load, temp]     # the inputs (default: the target alone)
          time: timestamp           # sort the rows by it (default: file order)
          window: 48                # steps per window
          horizon: 1                # the target that many steps after the window
          stride: 1                 # a window starting every stride steps
          valid: 0.2                # fractions of the time axis: train, then valid,
          test: 0.1                 #   then test, contiguous (no window straddles)
        dataset:
          kind: sequences           # token ids [N, L] or features [N, L, F]
          x: data/x.npy             # or path: data.npz (arrays x, y, lengths)
          y: data/y.npy
          lengths: data/lengths.npy # real steps per row; the rest is padding
          padding: 0                # or the value that marks a padded step
          vocab: 20000              # token ids 0..vocab-1 (default: largest id + 1)

    Exactly one of ``name``, ``path`` or ``x`` and ``y``.  An integer ``train`` or
    ``valid`` keeps that many rows of the split (any dataset); a fraction or a path
    makes the split.  Named sets take the table options that they support (the
    scikit-learn tables: ``valid``/``test`` fractions, ``scale``, ``seed``).
    ``missing`` says what a missing value of your data does: ``error`` refuses the
    table naming every column at fault, ``drop`` drops its row before the split,
    ``impute`` fills it from the training split (a numeric column's ``impute``
    statistic, a category's most frequent value; a row without a target is dropped),
    see :mod:`explore.datasets.missing`.  ``kind`` says what a file holds: a table (no
    kind, or ``table``), a time series cut into windows (``series``:
    :mod:`explore.datasets.series`) or sequences (``sequences``:
    :mod:`explore.datasets.sequences`); each kind's keys are refused on the others.
    Relative
    paths are resolved against the YAML file's folder (:func:`load_space`), or the
    current one for a space given from Python.  What the data says is checked when it
    is resolved (:attr:`Space.data`, a :class:`~explore.datasets.BaseDataset`)."""

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
    missing: Literal["error", "drop", "impute"] | None = None  # None: error
    impute: Literal["median", "mean", "most_frequent"] | None = None  # None: median
    kind: Literal["table", "series", "sequences"] | None = None  # None: a table
    columns: list[str] | None = None  # series: the input columns (None: the target)
    time: str | None = None  # series: the column the rows are sorted by
    window: Int | None = Field(None, ge=1)  # series: steps per window
    horizon: Int | None = Field(None, ge=1)  # series: steps from a window to its target
    stride: Int | None = Field(None, ge=1)  # series: steps between windows' starts
    lengths: Path | None = None  # sequences: .npy of each row's real steps
    padding: Int | Num | None = None  # sequences: the value of a padded step
    vocab: Int | None = Field(None, ge=1)  # sequences: token ids 0..vocab-1

    # which kinds of your data each kind's own key is for
    _KIND_KEYS: ClassVar[dict[str, tuple[str, ...]]] = {
        "table": ("features", "categorical", "missing", "impute"),
        "series": ("columns", "time", "window", "horizon", "stride"),
        "sequences": ("lengths", "padding", "vocab"),
    }

    @field_validator("path", "x", "y", "valid", "test", "lengths", mode="after")
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
    def _one_source(self) -> DatasetSection:
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
        if self.impute is not None and self.missing != "impute":
            raise Located(("impute",), f"{self.impute} is what missing: impute fills a "
                          "missing value with; set missing: impute as well (missing is "
                          f"{self.missing or 'error'})")
        if self.name is not None:
            for k in ("missing", "impute"):
                if getattr(self, k) is not None:
                    raise Located((k,), f"{k} is for your own data (path: or x and y); "
                                  "a named dataset has no missing values")
        if self.name is not None and self.task is not None:
            raise ValueError("task is for your own data: a named dataset has its own")
        if self.path is not None and self.path.suffix.lower() in (".csv", ".parquet") and \
                self.target is None and self.kind != "sequences":
            raise ValueError("target: name the column to predict")
        return self

    @model_validator(mode="after")
    def _kind_keys(self) -> DatasetSection:
        kind = self.kind or "table"
        if self.name is not None:
            if self.kind is not None:
                raise Located(("kind",), "kind is for your own data (path: or x and y); "
                              f"the named dataset {self.name!r} has its own")
            # a named series takes window, horizon and stride (resolve asks it)
            for k in (*self._KIND_KEYS["series"][:2], *self._KIND_KEYS["sequences"]):
                if getattr(self, k) is not None:
                    raise Located((k,), f"{k} is for your own data (kind: "
                                  f"{self._kind_of(k)}); a named dataset has none")
            return self
        for other, keys in self._KIND_KEYS.items():
            if other == kind:
                continue
            for k in keys:
                v = getattr(self, k)
                if v is not None and v != []:
                    raise Located((k,), f"{k} is for kind: {other}; this dataset is "
                                  f"kind: {kind}" + (" (the default)" if self.kind is None
                                                      else ""))
        if kind == "table":
            return self
        for k in ("valid", "test"):
            if isinstance(getattr(self, k), Path):
                raise Located((k,), f"{k}: a fraction; kind: {kind} is split by fraction "
                              "(a file of its own is for tables)")
        if kind == "series":
            if self.path is None or self.path.suffix.lower() not in (".csv", ".parquet"):
                raise Located(("path",) if self.path is not None else ("kind",),
                              "kind: series reads a .csv or .parquet table: give path:")
            if self.seed is not None:
                raise Located(("seed",), "a series is split in time order: it has no "
                              "random split to seed")
            if self.window is None:
                raise Located(("kind",), "window: the steps each window holds (kind: "
                              "series needs it), e.g. window: 24")
        if kind == "sequences":
            if self.path is not None and self.path.suffix.lower() != ".npz":
                raise Located(("path",), "kind: sequences reads an .npz (arrays x, y and "
                              "lengths) or x: and y: .npy files")
            if self.path is not None and self.lengths is not None:
                raise Located(("lengths",), "lengths is an array of the .npz (path:), not "
                              "a file of its own")
            if self.target is not None:
                raise Located(("target",), "kind: sequences predicts y: it has no target "
                              "column")
        return self

    @classmethod
    def _kind_of(cls, key: str) -> str:
        return next(k for k, keys in cls._KIND_KEYS.items() if key in keys)

    @property
    def heads(self) -> tuple[int | None, int | None]:
        """The row counts to keep of the training and validation splits (None: all)."""
        valid = self.valid if isinstance(self.valid, int) and \
            not isinstance(self.valid, bool) else None
        return self.train, valid



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
    # The workers' kernels: numpy's, or the engine's fused ones compiled by numba
    # (faster, about 100 MB more per worker).  auto: compiled where each worker's share
    # of ``memory`` is 500 MB or more (explore.scheduler.kernels).
    kernels: Literal["auto", "numpy", "compiled"] = "auto"
    # Trials advanced together, round by round, the one fewest rounds along first:
    # more than the arenas hold are switched out of them and back in, in turn
    # (explore.scheduler.core).  None: as many as the arenas hold (trials_per_worker).
    in_flight: int | None = Field(None, ge=1, le=MAX_TRIALS, strict=True)
    # A paused trial whose room another needs leaves its arena for a file (true), or
    # is pruned (false: nothing is written to disk, and the search prunes for room).
    switching: bool = True
    # The most bytes of switched-out states on disk at once (None: as the disk holds).
    switch_limit: ByteSize | None = None
    seed: int = Field(0, ge=0, le=MAX_SEED, strict=True)
    # seconds a driver may be silent before its running trials are failed as stale and
    # re-queued by another driver or the next run (explore.live); a driver's heartbeat is
    # every 5 s, or a quarter of the grace if that is shorter
    grace: Num = Field(60.0, ge=2, le=86_400)
    # Seconds from the run's start after which no new trial starts (Optuna's
    # ``optimize(timeout=)``): the trials in hand finish, and the run ends as complete
    # with fewer trials than ``trials``; the next run goes on.  None: no limit.
    timeout: Num | None = Field(None, gt=0, le=365 * 86_400)

    @property
    def ordinals(self) -> list[int]:
        """The devices the run uses: ``devices``, or the one device."""
        return list(self.devices) if self.devices else [0]

    @model_validator(mode="after")
    def _machine(self) -> Budget:
        if self.in_flight is not None and not self.switching:
            raise Located(("in_flight",), "more trials in flight than the arenas hold "
                          "wait their turn switched out: it needs switching: true")
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



class Model(Strict):
    family: FamilyName = "mlp"
    # A Python function, "module:function", that builds each trial's model and asks the
    # trial for its own parameters (explore.families.builder); the other keys then unused.
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
    # transformer: the width of every step's vector (conv1d: of a token's embedding)
    d_model: Param = 64
    heads: Param = 4  # transformer: attention heads; d_model is a multiple of them
    layers: Param = 2  # transformer: encoder layers
    ff_ratio: Param = 4  # transformer: the feed-forward's width over d_model
    pooling: Param = "mean"  # transformer: mean (of the real steps) | cls (a class token)
    positional: Param = "learned"  # transformer: learned | sinusoidal | none
    norm: Param = "pre"  # transformer: layer norm before (pre) or after (post) each sublayer
    dilation: Param = 1  # conv1d: block i is dilated by dilation ** i
    readout: Param = "mean"  # conv1d: mean (over the steps) | last (step) | flatten

    @field_validator("depth", "width", "activation", "dropout", "init", "blocks", "channels",
                     "kernel", "stride", "pool", "batch_norm", "residual", "stage_blocks",
                     "d_model", "heads", "layers", "ff_ratio", "pooling", "positional",
                     "norm", "dilation", "readout", mode="after")
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

    @field_validator("onnx", "freeze", "head", mode="after")
    @classmethod
    def _onnx_keys(cls, v: Any, info: ValidationInfo) -> Any:
        # the file's path resolved against the YAML file's folder, freeze's globs checked:
        # the family's own rules (explore.families._onnx); the file is read when bound
        return families.check_onnx_key(str(info.field_name), v,
                                       (info.context or {}).get("base"))

    @model_validator(mode="after")
    def _family(self) -> Model:
        if self.builder is not None:
            return self
        if self.onnx is not None and self.family != "onnx":
            raise ValueError(f"onnx is the file of family onnx, not of family {self.family}")
        family = families.get(self.family)
        for key in families.FAMILY_ONLY_KEYS:  # a key no family of the space reads: said
            if key not in family.keys and getattr(self, key) != \
                    type(self).model_fields[key].get_default():
                users = [n for n in families.names() if key in families.get(n).keys]
                raise Located((key,), f"{key} is a key of family {' and '.join(users)}; "
                              f"family {self.family} does not read it")
        try:
            families.get(self.family).check({k: getattr(self, k)
                                             for k in type(self).model_fields})
        except families.AtKey as e:  # at that key's line (onnx: freeze leaving nothing)
            raise Located((e.key,), str(e)) from None
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
    # Validate after every k-th round and after the last; "auto": after every round
    # where a pruner reads the values, after the last alone where none does (a trial's
    # value is its last round's).  A round not validated reports no intermediate value.
    validate_every: Annotated[Int, Field(ge=1)] | Literal["auto"] = 1
    # Before each validation, forward this many mini-batches of training rows (the
    # weights unchanged) so that batch norms' running statistics are the weights'
    # now, not an average over the round's last steps, which lags them
    # (engine.runtime.train.refresh_statistics); only for models that keep such
    # statistics.  "auto": 30.  0: validate on the statistics training left.
    refresh_statistics: Annotated[Int, Field(ge=0, le=100_000)] | Literal["auto"] = "auto"

    def statistics_batches(self) -> int:
        """Mini-batches forwarded before each validation where the model keeps running
        statistics (``refresh_statistics``).

        >>> Training().statistics_batches(), Training(refresh_statistics=0).statistics_batches()
        (30, 0)
        """
        return REFRESH_AUTO if self.refresh_statistics == "auto" else \
            int(self.refresh_statistics)

    def validation_interval(self, rounds: int, prunes: bool) -> int:
        """Rounds between validations (``rounds``: after the last alone).

        >>> Training(validate_every="auto").validation_interval(10, prunes=False)
        10
        >>> Training(validate_every="auto").validation_interval(10, prunes=True)
        1
        """
        if self.validate_every == "auto":
            return 1 if prunes else max(1, rounds)
        return int(self.validate_every)

    @field_validator("loss", "optimizer", "lr", "momentum", "weight_decay", "batch_size",
                     mode="after")
    @classmethod
    def _rules(cls, v: Any, info: ValidationInfo) -> Any:
        return check_param(str(info.field_name), v)
