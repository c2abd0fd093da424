"""Sampled parameters from a space, through Optuna's define-by-run trial API.

Model parameters come first and ``depth`` before everything per layer, so a
per-layer parameter is asked once per layer (``width_0``, ``width_1`` ...); a
parameter with ``when`` is asked only when the parameters it names have the given
values, which is how Optuna learns the conditional space (momentum only for SGD).

>>> import optuna
>>> from explore.space import parse_space
>>> space = parse_space({"dataset": "digits", "budget": {"trials": 1, "rounds": 1,
...     "memory": "64MB"}, "model": {"depth": {"int": [2, 2]},
...     "width": {"choice": [8, 16], "per_layer": True}},
...     "training": {"optimizer": {"choice": ["sgd"]},
...                  "momentum": {"float": [0.5, 0.9], "when": {"optimizer": "sgd"}}}})
>>> p = suggest(optuna.create_study().ask(), space)
>>> p["depth"], len(p["widths"]), p["momentum"] >= 0.5, p["blocks"], p["channels"]
(2, 2, True, 0, [])
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from explore import families
from explore.ranges import Choice, FloatRange, IntRange, Range
from explore.space import WHEN_DEFAULTS, Space, can_be, describe

PER_LAYER = {"width": "widths", "activation": "activations", "dropout": "dropouts",
             "channels": "channels"}
COUNT = {"width": "depth", "activation": "depth", "dropout": "depth", "channels": "blocks"}
COUNTS = ("depth", "blocks")  # asked first: they say how many per-layer values there are


class TrialLike(Protocol):
    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1,
                    log: bool = False) -> int: ...

    def suggest_float(self, name: str, low: float, high: float, *, step: float | None = None,
                      log: bool = False) -> float: ...

    def suggest_categorical(self, name: str, choices: Any) -> Any: ...


def suggest(trial: TrialLike, space: Space) -> dict[str, Any]:
    """The parameters of one candidate (per-layer ones as lists).  A parameter with
    ``when`` is asked after the ones it names (the schema refuses circles) and, when
    they do not match, takes its off value (:data:`~explore.space.WHEN_DEFAULTS`)."""
    params = space.params()
    # per-layer parameters the family also reads as one value (a transformer's dropout)
    scalar = () if space.model.builder is not None else \
        families.get(space.model.family).scalar_keys
    out: dict[str, Any] = {c: int(_one(trial, c, params[c])) for c in COUNTS}
    chosen: dict[str, Any] = dict(out)  # single values by parameter name, for when
    todo = [n for n in params if n not in COUNTS]
    while todo:
        name = next((n for n in todo if not _waits(params[n], todo)), todo[0])
        todo.remove(name)
        p = params[name]
        if isinstance(p, Range) and p.when and not _applies(p.when, chosen):
            value = WHEN_DEFAULTS[name]
            chosen[name] = value
            if name in PER_LAYER:
                out[PER_LAYER[name]] = [value] * out[COUNT[name]]
                if name in scalar:
                    out[name] = value
            else:
                out[name] = value
            continue
        if name in PER_LAYER:
            n = out[COUNT[name]]
            if isinstance(p, Range) and p.per_layer:
                out[PER_LAYER[name]] = [_one(trial, f"{name}_{i}", p) for i in range(n)]
            else:
                one = [_one(trial, name, p)] if n or name in scalar else []
                out[PER_LAYER[name]] = one * n
                if one:
                    chosen[name] = one[0]
                    if name in scalar:
                        out[name] = one[0]
        else:
            out[name] = chosen[name] = _one(trial, name, p)
    return out


def _waits(p: Any, todo: list[str]) -> bool:
    """Whether ``p`` names, in its ``when``, a parameter not asked yet."""
    return isinstance(p, Range) and p.when is not None and any(k in todo for k in p.when)


def _same(given: Any, fixed_value: Any) -> bool:
    """Whether ``given`` is the value the space fixes: names in any case, as the
    schema reads them (``Adam`` is ``adam``)."""
    if isinstance(given, str) and isinstance(fixed_value, str):
        return given.lower() == fixed_value.lower()
    return bool(given == fixed_value)


def fixed(space: Space, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """One candidate without a study: ranges take their low end (or first choice),
    ``overrides`` (``name=value``, per-layer lists allowed) win."""
    class _Low:
        def suggest_int(self, name: str, low: int, high: int, **kw: Any) -> int:
            return low

        def suggest_float(self, name: str, low: float, high: float, **kw: Any) -> float:
            return low

        def suggest_categorical(self, name: str, choices: Any) -> Any:
            return choices[0]

    out = suggest(_Low(), space)
    overrides = dict(overrides or {})
    params = space.params()
    for k, v in overrides.items():
        if PER_LAYER.get(k, k) not in out:
            base, _, index = k.rpartition("_")
            if base in PER_LAYER and index.isdigit():
                raise KeyError(f"no parameter {k!r}: give per-layer values as one list, "
                               f"{base}=[first,second,...] (one per layer), or one value "
                               f"for every layer, {base}=64")
            names = sorted(set(out) - set(PER_LAYER.values())) + list(PER_LAYER)
            raise KeyError(f"no parameter {k!r}; parameters: {', '.join(names)}")
        if isinstance(v, list) and k not in PER_LAYER:
            raise ValueError(f"{k} takes one value, not a list (lists are for the per-layer "
                             f"parameters {', '.join(PER_LAYER)})")
        p = params.get(k)
        if isinstance(p, Range):  # a searched parameter: one of its values
            for x in v if isinstance(v, list) else [v]:
                if not can_be(p, x):
                    raise ValueError(f"{k}={x!r} is not a value the space searches: {k} "
                                     f"is {describe(p)}")
        elif k in params and p is not None and p != "auto" and \
                any(not _same(x, p) for x in (v if isinstance(v, list) else [v])):
            raise ValueError(f"{k}={v!r}: the space fixes {k} at {p!r}; a candidate of it "
                             "takes that value")
    for c in COUNTS:
        if c in overrides:
            out[c] = int(overrides.pop(c))
    for k, v in overrides.items():
        key = PER_LAYER.get(k, k)
        if k in PER_LAYER:
            n = out[COUNT[k]]
            v = list(v) if isinstance(v, list) else [v] * n
            if len(v) != n:
                raise ValueError(f"{k}: {len(v)} values for {n} layers ({COUNT[k]} {n}); "
                                 f"give {COUNT[k]}={len(v)} too, or {n} values")
        out[key] = v
    for name, key in PER_LAYER.items():  # a count override: repeat the last value
        n = out[COUNT[name]]
        vals = out[key] or [_one(_Low(), name, params[name])]
        out[key] = (vals + [vals[-1]] * n)[:n]
    return out


def assumed(space: Space, params: dict[str, Any], given: Iterable[str] = ()
            ) -> dict[str, Any]:
    """The searched parameters of ``params`` (from :func:`fixed`) that ``given`` (the
    names fixed by hand) did not name, with the value each took: a range's low end or
    a choice's first, per layer a list (one value for every layer when the range is not
    per layer).  A parameter whose ``when`` does not hold was not asked, and is not
    listed.

    >>> from explore.space import parse_space
    >>> space = parse_space({"budget": {"trials": 1, "rounds": 1, "memory": "64MB"},
    ...     "model": {"depth": {"int": [1, 3]}, "width": {"int": [16, 64]}},
    ...     "training": {"optimizer": {"choice": ["adam", "sgd"]},
    ...                  "momentum": {"float": [0.5, 0.9], "when": {"optimizer": "sgd"}}}})
    >>> assumed(space, fixed(space, {"depth": 2}), ["depth"])
    {'width': 16, 'optimizer': 'adam'}
    """
    named = set(given)
    chosen = {k: v for k, v in params.items() if k not in PER_LAYER.values()}
    for name, key in PER_LAYER.items():
        if params.get(key):
            chosen[name] = params[key][0]
    out: dict[str, Any] = {}
    for name, p in space.params().items():
        if not isinstance(p, Range) or name in named or PER_LAYER.get(name) in named:
            continue
        if p.when and not _applies(p.when, chosen):
            continue
        value = params[PER_LAYER.get(name, name)]
        if name in PER_LAYER:
            if not value:  # no layer of that kind (depth 0): nothing asked
                continue
            if not p.per_layer:
                value = value[0]
        out[name] = value
    return out


def _one(trial: TrialLike, name: str, p: Any) -> Any:
    if isinstance(p, IntRange):
        return trial.suggest_int(name, p.bounds[0], p.bounds[1], step=p.step, log=p.log)
    if isinstance(p, FloatRange):
        return trial.suggest_float(name, p.bounds[0], p.bounds[1], step=p.step, log=p.log)
    if isinstance(p, Choice):
        return trial.suggest_categorical(name, p.options)
    return p


def _applies(when: dict[str, Any], chosen: dict[str, Any]) -> bool:
    for k, want in when.items():
        have = chosen.get(k)
        if have is None:
            return False
        if (have not in want) if isinstance(want, list) else (have != want):
            return False
    return True
