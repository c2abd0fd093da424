"""Parameters of a search space: a fixed value or a range to search.

    lr: {float: [1.0e-4, 1.0e-1], log: true}
    depth: {int: [1, 4]}
    optimizer: {choice: [sgd, adam]}

These types are the schema's vocabulary (:mod:`explore.space`); they live apart from
it so that plugins (a model family checking its section, a sampler checking that a
grid is finite) can read them without importing the schema, which imports the plugins.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)
from pydantic import Strict as StrictMode


class Strict(BaseModel):
    """Unknown keys are errors; parsed values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


Scalar = int | float | str | bool
# Numbers as written: an integer is never a bool, a float or a string ("3"), a float
# bound is a finite number (an integer is one too), never a string or a bool.
Int = Annotated[int, StrictMode()]
Num = Annotated[float, StrictMode(), Field(allow_inf_nan=False)]


def _flag(v: Any) -> Any:
    if not isinstance(v, bool):  # YAML 1.2: yes, on and 1 are not booleans
        raise ValueError(f"true or false, not {v!r}")
    return v


Flag = Annotated[bool, BeforeValidator(_flag)]


def finite(v: Any) -> Any:
    """``v``, unless it is a NaN or infinite float (ValueError)."""
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"{v} is not a finite number")
    return v


class Range(Strict):
    """Common to every searched parameter."""

    when: dict[str, Scalar | list[Scalar]] | None = None  # asked only when these match
    per_layer: Flag = False  # one value per layer (model parameters only)

    @field_validator("when", mode="before")
    @classmethod
    def _some_condition(cls, v: Any) -> Any:
        if isinstance(v, dict) and not v:
            raise ValueError("an empty condition: name the parameters and values it asks "
                             "for ({optimizer: sgd}), or leave when out")
        return v

    def values(self) -> list[Any] | None:
        """The finite list of values, if the parameter has one (grid search)."""
        return None

    def count(self) -> int | None:
        """How many values :meth:`values` would list, without listing them."""
        return None


def _check_bounds(lo: float, hi: float, log: bool, stepped: bool) -> None:
    if lo > hi:
        raise ValueError(f"empty range [{lo}, {hi}]: the low bound is above the high one")
    if log and lo <= 0:
        raise ValueError(f"a log scale needs a positive low bound, got {lo}")
    if log and stepped:
        raise ValueError("log and step cannot be combined")


class IntRange(Range):
    bounds: tuple[Int, Int] = Field(alias="int")
    log: Flag = False
    step: Int = Field(1, ge=1)

    @model_validator(mode="after")
    def _check(self) -> IntRange:
        _check_bounds(*self.bounds, self.log, self.step != 1)
        lo, hi = self.bounds
        if (hi - lo) % self.step:
            raise ValueError(f"step {self.step} does not divide the range [{lo}, {hi}]: "
                             f"the high bound would never be reached")
        return self

    def values(self) -> list[Any] | None:
        return list(range(self.bounds[0], self.bounds[1] + 1, self.step))

    def count(self) -> int | None:
        return (self.bounds[1] - self.bounds[0]) // self.step + 1


MAX_FLOAT_STEPS = 10**9  # a float range's steps: beyond, a step means nothing to a search


class FloatRange(Range):
    bounds: tuple[Num, Num] = Field(alias="float")
    log: Flag = False
    step: Num | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _check(self) -> FloatRange:
        _check_bounds(*self.bounds, self.log, self.step is not None)
        lo, hi = self.bounds
        if self.step is not None:
            n = (hi - lo) / self.step
            if math.isfinite(n) and n > MAX_FLOAT_STEPS:  # Optuna's Decimal arithmetic
                raise ValueError(f"step {self.step} cuts the range [{lo}, {hi}] into "  # fails
                                 f"{n:.3g} steps, more than {MAX_FLOAT_STEPS:,}: give a "
                                 "coarser step, or none for a continuous range")
            if not math.isfinite(n) or abs(n - round(n)) > 1e-9 * max(1.0, n):
                raise ValueError(f"step {self.step} does not divide the range [{lo}, {hi}]: "
                                 f"the high bound would never be reached")
        return self


class Choice(Range):
    options: list[Scalar] = Field(alias="choice", min_length=1)

    @field_validator("options", mode="before")
    @classmethod
    def _scalars(cls, v: Any) -> Any:
        # one message, not one per member of the Scalar union for each bad option
        for i, x in enumerate(v if isinstance(v, list) else []):
            if not isinstance(x, int | float | str | bool):
                raise ValueError(f"option {i} is a {type(x).__name__}: each choice is one "
                                 "value (a number, a name, true or false); for one value "
                                 "per layer use per_layer: true")
        return v

    @model_validator(mode="after")
    def _check(self) -> Choice:
        for v in self.options:
            finite(v)
        if len(set(map(repr, self.options))) != len(self.options):
            raise ValueError(f"choices repeat a value: {self.options}")
        return self

    def values(self) -> list[Any] | None:
        return list(self.options)

    def count(self) -> int | None:
        return len(self.options)


def _param(v: Any) -> Any:
    if isinstance(v, dict):
        kinds = [k for k in ("int", "float", "choice") if k in v]
        if len(kinds) != 1:
            raise ValueError("a searched parameter has exactly one of int: [low, high], "
                             f"float: [low, high] or choice: [...]; got keys {sorted(v)}")
        kinds_: dict[str, type[Range]] = {"int": IntRange, "float": FloatRange,
                                          "choice": Choice}
        return kinds_[kinds[0]].model_validate(v)
    if isinstance(v, int | float | str | bool):
        return finite(v)
    raise ValueError(f"a parameter is a value or a range, not {type(v).__name__}")


Param = Annotated[IntRange | FloatRange | Choice | Scalar, BeforeValidator(_param)]


def values_of(p: Any) -> list[Any] | None:
    """Every value ``p`` (a range or a fixed value) can take; None for a float range."""
    return p.values() if isinstance(p, Range) else [p]


def bounds(p: Any) -> tuple[Any, Any]:
    """The lowest and highest value ``p`` (a range or a fixed value) can take."""
    if isinstance(p, IntRange):
        return p.bounds
    if isinstance(p, Choice):
        return min(p.options), max(p.options)
    return p, p
