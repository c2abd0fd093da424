"""What the values of a search space may be: sizes, the limits, and each model and
training parameter's rule (checked for a fixed value, both bounds of a range and every
choice), for the schema (:mod:`explore.space`, whose names these are too).

>>> parse_size("1.5 GB"), check_param("kernel", 3)
(1500000000, 3)
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any

from pydantic import BeforeValidator

from explore import optimizers
from explore.families._conv1d import READOUTS
from explore.families._transformer import NORMS, POOLINGS, POSITIONALS
from explore.families.layers import ACTIVATIONS, INITS
from explore.families.tasks import LOSSES
from explore.ranges import Choice, FloatRange, IntRange, finite

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
MAX_HEADS = 1024  # a transformer's attention heads
MAX_FF_RATIO = 64  # a transformer's feed-forward width over d_model
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


FLOAT32_MAX = 3.4028234663852886e38  # the largest float32: more overflows to infinity


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
    return ["auto", *dict.fromkeys(n for names in LOSSES.values() for n in names)]


RULES: dict[str, Callable[[Any], None]] = {
    "depth": _integer(0, MAX_LAYERS),  # 0: no hidden layer
    "blocks": _integer(0, MAX_LAYERS),
    "width": _integer(1, MAX_WIDTH),
    "channels": _integer(1, MAX_WIDTH),
    "activation": _name("activation", lambda: list(ACTIVATIONS)),
    "dropout": _number(0, 1, hi_open=True),
    "init": _name("init", lambda: list(INITS)),
    "kernel": _integer(1, MAX_KERNEL, odd=True),
    "stride": _integer(1, MAX_STRIDE),
    "pool": _flag,
    "batch_norm": _flag,
    "residual": _flag,
    "stage_blocks": _integer(1, MAX_LAYERS),
    "d_model": _integer(1, MAX_WIDTH),
    "heads": _integer(1, MAX_HEADS),
    "layers": _integer(1, MAX_LAYERS),
    "ff_ratio": _number(0, MAX_FF_RATIO, lo_open=True),
    "pooling": _name("pooling", lambda: list(POOLINGS)),
    "positional": _name("positional", lambda: list(POSITIONALS)),
    "norm": _name("norm", lambda: list(NORMS)),
    "dilation": _integer(1, MAX_STRIDE),
    "readout": _name("readout", lambda: list(READOUTS)),
    "loss": _name("loss", _losses),
    "optimizer": _name("optimizer", lambda: [n.lower() for n in optimizers.names()]),
    "lr": _number(0, FLOAT32_MAX, lo_open=True),  # the optimizer computes in float32
    "momentum": _number(0, 1, hi_open=True),
    "weight_decay": _number(0, FLOAT32_MAX),
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


# -- where a problem is ----------------------------------------------------------------------


class Located(ValueError):
    """A check across sections that knows the key at fault (reported at its line, not at
    the top of the file)."""

    def __init__(self, loc: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc
