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
file, line and key at once (:class:`~explore.yamlio.SpaceError`).  The sections are in
:mod:`explore.space_sections`, sizes, limits and each parameter's rule in
:mod:`explore.space_rules` (their names are importable from here too).

>>> s = parse_space({"dataset": "digits", "budget": {"trials": 4, "rounds": 2,
...     "memory": "64MB"}, "model": {"depth": 1, "width": 8},
...     "training": {"optimizer": "adam", "lr": {"float": [1e-3, 1e-1], "log": True}}})
>>> s.budget.memory, s.objectives[0].metric, s.training.lr.log
(64000000, 'accuracy', True)
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, get_args

from pydantic import (
    BaseModel,
    BeforeValidator,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from explore import datasets, families, samplers
from explore.folders import directory_problem
from explore.ranges import (  # the parameter types are part of the schema's vocabulary
    Choice,
    FloatRange,
    Int,
    IntRange,
    Param,
    Range,
    Scalar,
    Strict,
)
from explore.space_rules import (  # sizes, limits and each parameter's rule
    MAX_TRIALS,
    ByteSize,
    Located,
    can_be,
    check_value,
    describe,
    parse_size,
)
from explore.space_sections import (  # the sections
    Budget,
    DatasetSection,
    Model,
    Objective,
    Pruner,
    Sampler,
    Training,
    machine_memory,
)
from explore.suggest import close, quoted
from explore.yamlio import Document, Loc, SourceError, SpaceError, key_of, load_file

__all__ = ["MAX_STUDY_NAME", "WHEN_DEFAULTS", "Budget", "ByteSize", "Choice",
           "DatasetSection", "FloatRange", "IntRange", "Located", "Model", "Objective",
           "Param", "Pruner", "Range", "Sampler", "Scalar", "Space", "SpaceError",
           "Training", "can_be", "check_study_name", "check_value", "describe",
           "load_space", "machine_memory", "parse_size", "parse_space", "unknown_key"]

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


# Optuna's relational storage keeps a study's name in a VARCHAR(512): PostgreSQL refuses
# a longer one, while SQLite and the journal take it.  The limit holds on every storage,
# so that a study can be moved to PostgreSQL and a name is refused before anything is
# written, not by the database at the first write.
MAX_STUDY_NAME = 512


def check_study_name(name: str) -> None:
    """A study name the storage can hold: not blank, at most :data:`MAX_STUDY_NAME`
    characters, UTF-8 (a lone surrogate such as "\\ud800" is not), no control
    characters (ValueError).

    >>> check_study_name("s" * 513)
    Traceback (most recent call last):
    ...
    ValueError: a study name is at most 512 characters, and this one has 513
    """
    if not name.strip():
        raise ValueError("a study name is not blank")
    if len(name) > MAX_STUDY_NAME:  # said before the name: it is too long to quote
        raise ValueError(f"a study name is at most {MAX_STUDY_NAME} characters, and this "
                         f"one has {len(name):,}")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{name!r} is not valid text (it cannot be written as UTF-8)"
                         ) from None
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise ValueError(f"{name!r} holds a control character")


def _dataset(v: Any) -> Any:
    return {"name": v} if isinstance(v, str) else v


def _named(v: Any) -> Any:
    return {"name": v} if isinstance(v, str) else v


class Space(Strict):
    name: str | None = None

    @field_validator("name", mode="after")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        if v is not None:
            check_study_name(v)
        return v
    # None: the data is given from Python (with_data)
    dataset: Annotated[DatasetSection | None, BeforeValidator(_dataset)] = None
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
    # After a run, its best trial trained again on train+valid and kept as the study's
    # refit model (explore.refit), as scikit-learn's refit=True.
    refit: bool = Field(False, strict=True)

    # The file it was read from (None: given from Python): errors found later, when the
    # space is bound to its data and builder (explore.binding), point at their line.
    _doc: Document | None = PrivateAttr(default=None)

    def error_at(self, loc: Loc, message: str) -> SpaceError:
        """``message`` as an error of the key at ``loc``, at its line of the space's file
        where it came from one.

        >>> s = parse_space({"budget": {"trials": 1, "rounds": 1, "memory": "64MB"}})
        >>> str(s.error_at(("dataset",), "none given"))
        '<space>: dataset: none given'
        >>> str(s.error_at(("objectives", 0, "metric"), "not this one"))
        '<space>: objectives[0].metric: not this one'
        """
        doc = self._doc
        return SpaceError([SourceError(doc.file if doc else "<space>",
                                       doc.line(loc) if doc else None, key_of(loc),
                                       message)])

    def params(self) -> dict[str, Any]:
        """Every parameter by its name (model ones first: depth before the layers)."""
        out = {k: getattr(self.model, k) for k in ("depth", "blocks", "width", "activation",
                                                   "dropout", "init", "channels", "kernel",
                                                   "stride", "pool", "batch_norm",
                                                   "residual", "stage_blocks")}
        if self.model.builder is None:  # the family's own keys (a transformer's heads...)
            out.update({k: getattr(self.model, k)
                        for k in families.get(self.model.family).keys})
        if self.model.onnx is not None:  # fixed values: each trial's record rebuilds it
            out.update(onnx=str(self.model.onnx), freeze=self.model.freeze,
                       head=self.model.head)
        out.update({k: getattr(self.training, k) for k in ("loss", "optimizer", "lr",
                                                           "momentum", "weight_decay",
                                                           "batch_size")})
        return out

    @model_validator(mode="after")
    def _distinct_objectives(self) -> Space:
        seen: dict[tuple[str, str], int] = {}
        for i, o in enumerate(self.objectives):
            key = (o.metric, o.dir)
            if key in seen:  # a second copy would only weigh the first twice
                raise Located(("objectives", i, "metric"), f"{o.metric!r} ({key[1]}) is "
                              f"objective {seen[key]} already; an objective is given once")
            seen[key] = i
        return self

    @model_validator(mode="after")
    def _refit(self) -> Space:
        if self.refit and len(self.objectives) > 1:
            raise Located(("refit",), f"refit trains the best trial again, and "
                          f"{len(self.objectives)} objectives have no single best; leave "
                          "refit out and run `explore refit SPACE --trial N` with the "
                          "trial you choose")
        return self

    @model_validator(mode="after")
    def _artifacts(self) -> Space:
        if self.keep_models > 0 and self.artifacts:
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


# Keys that other tools (and habit) use for ours, which no spelling distance finds:
# the key -> where it is in a space (section.key; a top-level key alone).  Suggested
# wherever such a key is unknown.  Every target is a key of the schema (tested).
SYNONYMS: dict[str, str] = {
    "learning_rate": "training.lr", "learningrate": "training.lr", "eta": "training.lr",
    "epochs": "budget.rounds", "n_epochs": "budget.rounds", "num_epochs": "budget.rounds",
    "max_epochs": "budget.rounds", "iterations": "budget.rounds",
    "n_trials": "budget.trials", "num_trials": "budget.trials",
    "max_trials": "budget.trials",
    "batch": "training.batch_size", "bs": "training.batch_size",
    "optim": "training.optimizer", "wd": "training.weight_decay",
    "l2": "training.weight_decay",
    "layers": "model.depth", "n_layers": "model.depth", "num_layers": "model.depth",
    "hidden_layers": "model.depth", "units": "model.width", "hidden_size": "model.width",
    "hidden_units": "model.width", "neurons": "model.width", "filters": "model.channels",
    "kernel_size": "model.kernel", "act": "model.activation",
    "n_jobs": "budget.workers", "jobs": "budget.workers", "gpu": "budget.device",
    "metric": "objectives", "objective": "objectives", "direction": "objectives",
    "data": "dataset", "study_name": "name",
}


def _models_in(tp: Any) -> list[type[BaseModel]]:
    """The pydantic models a field's type can hold (through ``X | None``, ``list[X]``,
    ``Annotated[...]``)."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    return list(dict.fromkeys(m for arg in get_args(tp) for m in _models_in(arg)))


def _keys(model: type[BaseModel]) -> list[str]:
    """The keys a section's model accepts, as a file writes them (an alias, if any)."""
    return [f.alias or name for name, f in model.model_fields.items()]


def _sections() -> dict[str, list[str]]:
    """Every section's keys by the section's name ("" for the top level)."""
    out = {"": _keys(Space)}
    for name, f in Space.model_fields.items():
        for model in _models_in(f.annotation):
            out.setdefault(name, []).extend(_keys(model))
    return out


def _keys_at(section: tuple[Any, ...], data: Any) -> list[str]:
    """The keys the mapping at ``section`` (a key path into the space) accepts: its
    model's, found by walking the schema's types along the path.  Where the path can
    hold several models (a parameter: ``int:``, ``float:`` or ``choice:``), those the
    mapping's other keys name, or all of them."""
    models: list[type[BaseModel]] = [Space]
    for part in section:
        if isinstance(data, dict):
            data = data.get(part)
        elif isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data):
            data = data[part]
        else:
            data = None
        if isinstance(part, int):  # an item of a list: the list's model
            continue
        models = list(dict.fromkeys(
            m for model in models for name, f in model.model_fields.items()
            if part in (name, f.alias) for m in _models_in(f.annotation)))
    if isinstance(data, dict) and len(models) > 1:
        given = {str(k) for k in data}
        models = [m for m in models if given & set(_keys(m))] or models
    return list(dict.fromkeys(k for m in models for k in _keys(m)))


def unknown_key(loc: tuple[Any, ...], data: Any) -> str:
    """The message for the unknown key at ``loc`` of the space ``data``: what was
    likely meant (a synonym's key, a close spelling among the section's keys, or the
    section that has the key), else the keys the section takes.

    >>> unknown_key(("budget", "round"), {"budget": {"round": 3}})
    "unknown key; did you mean 'rounds'?"
    >>> unknown_key(("training", "learning_rate"), {})
    "unknown key; did you mean 'lr'?"
    >>> unknown_key(("epochs",), {})
    "unknown key; did you mean 'budget.rounds'?"
    >>> unknown_key(("sampler", "zzz"), {})
    'unknown key; sampler takes name, seed, startup_trials'
    """
    *section, key = loc
    keys = _keys_at(tuple(section), data)
    if not keys:  # pragma: no cover (pydantic reports extra keys of models only)
        return "unknown key"
    name = ".".join(str(p) for p in section if not isinstance(p, int))
    if isinstance(key, str):
        sections = _sections()

        def shown(paths: list[str]) -> str:  # a path in this section by its key alone
            out = [repr(p.rpartition(".")[2]) if p.rpartition(".")[0] == name else
                   repr(p) if "." in p else f"{p!r} at the top level" for p in paths]
            return out[0] if len(out) == 1 else f"{', '.join(out[:-1])} or {out[-1]}"

        meant = SYNONYMS.get(key.lower())
        if meant is not None:
            return f"unknown key; did you mean {shown([meant])}?"
        near = close(key, keys)
        if near:
            return f"unknown key; did you mean {quoted(near)}?"
        # a key of another section, as written or misspelt, or a synonym misspelt
        paths = {k: [f"{s}.{k}" if s else k for s, ks in sections.items() if k in ks]
                 for ks in sections.values() for k in ks}
        elsewhere = paths.get(key) or [
            p for k in close(key, [*paths, *SYNONYMS])
            for p in (paths[k] if k in paths else [SYNONYMS[k]])]
        if elsewhere:
            return f"unknown key; did you mean {shown(list(dict.fromkeys(elsewhere)))}?"
    return f"unknown key; {name or 'the top level'} takes {', '.join(keys)}"


def parse_space(data: Any, doc: Document | None = None) -> Space:
    """Validate ``data`` (already read) as a :class:`Space`; every error at once.  Data
    file paths are relative to ``doc``'s folder, or the current one.  Nothing is read or
    imported: :func:`explore.binding.bind` binds the space to its data and builder."""
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
                msg = unknown_key(loc, data)
            errors.append(SourceError(file, line, key_of(loc), msg))
        raise SpaceError(errors) from None
    space._doc = doc
    return space


def load_space(path: str | Path) -> Space:
    """Read and validate a search-space file (raises :class:`SpaceError`); its data set
    and builder are bound later (:func:`explore.binding.bind`)."""
    doc = load_file(path)
    if not isinstance(doc.data, dict):
        raise SpaceError([SourceError(doc.file, 1, "", "a search space is a mapping of keys "
                                      "(dataset, budget, model, training, ...)")])
    space = parse_space(doc.data, doc)
    if space.dataset is None:
        raise SpaceError([SourceError(doc.file, 1, "dataset", "Field required: a name "
                                      f"({', '.join(datasets.names())}) or a file (path:)")])
    if space.name is None:
        space = space.model_copy(update={"name": Path(path).stem})
    return space
