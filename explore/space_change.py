"""What changed between the space a study was searched with and the one a run brings.

A study stores its space (``runner.space_record``, the study's user attribute
``space``).  A run of another space under the same study name would mix trials of both
in one study, so :mod:`explore.runner` refuses it, listing what changed, unless the
user says the change is meant (``explore run --space-changed``); then the change is
recorded in the study (its user attribute ``space_changes``).  What the search is made
of counts (the model, the training, the data set, the objectives); the budget, the
sampler, the pruner and the validation chunk do not (a resumed run may take more trials,
other workers or memory).

Some changes no Optuna study can hold even when meant: a parameter whose choices, kind
(a choice, an integer or a float range) or log scale changed; Optuna keeps one such
distribution per parameter name and study.  Those are refused either way.

>>> old = {"training": {"lr": {"bounds": [0.001, 0.1], "log": True, "step": None},
...                     "optimizer": {"options": ["sgd", "adam"]}, "batch_size": 64}}
>>> new = {"training": {"lr": {"bounds": [0.001, 0.5], "log": True, "step": None},
...                     "optimizer": {"options": ["adam"]}, "batch_size": 64}}
>>> for c in changes(old, new):
...     print(c, "|", c.compatible)
training.lr: in [0.001, 0.1] (log) -> in [0.001, 0.5] (log) | True
training.optimizer: one of ['sgd', 'adam'] -> one of ['adam'] | False
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from explore.attrs import CHANGES_ATTR as CHANGES_ATTR  # named in explore.attrs

SECTIONS = ("model", "training", "dataset", "objectives")
# settings that do not change what a trial computes
IGNORED = {"training.eval_batch_size"}


@dataclass(frozen=True)
class Change:
    """One setting that differs: its dotted path, the old and the new value."""

    path: str
    old: Any
    new: Any

    @property
    def compatible(self) -> bool:
        """Whether one Optuna study can hold trials of both: not when a searched
        parameter's choices, kind or log scale changed."""
        a, b = _kind(self.old), _kind(self.new)
        if "fixed" in (a, b):
            return True  # a parameter that is asked on one side only
        if a != b:
            return False
        if a == "choice":
            return bool(self.old.get("options") == self.new.get("options"))
        return bool(self.old.get("log", False) == self.new.get("log", False))

    def __str__(self) -> str:
        return f"{self.path}: {_show(self.old)} -> {_show(self.new)}"


def changes(old: dict[str, Any], new: dict[str, Any]) -> list[Change]:
    """Every setting of the search (:data:`SECTIONS`) that differs between the stored
    space ``old`` and ``new`` (both as ``runner.space_record`` gives them)."""
    out: list[Change] = []
    for section in SECTIONS:
        _diff(section, old.get(section), new.get(section), out)
    return [c for c in out if c.path not in IGNORED]


def _diff(path: str, a: Any, b: Any, out: list[Change]) -> None:
    if isinstance(a, dict) and isinstance(b, dict) and not _is_range(a) and \
            not _is_range(b):
        for key in [*a, *(k for k in b if k not in a)]:
            _diff(f"{path}.{key}", a.get(key), b.get(key), out)
    elif a != b:
        out.append(Change(path, a, b))


def _is_range(v: Any) -> bool:
    return isinstance(v, dict) and ("options" in v or "bounds" in v)


def _kind(v: Any) -> str:
    if not _is_range(v):
        return "fixed"
    if "options" in v:
        return "choice"
    step = v.get("step")
    return "int" if isinstance(step, int) and not isinstance(step, bool) and \
        all(isinstance(x, int) for x in v["bounds"]) else "float"


def _show(v: Any) -> str:
    kind = _kind(v)
    if kind == "choice":
        return f"one of {v['options']}"
    if kind in ("int", "float"):
        lo, hi = v["bounds"]
        return f"in [{lo}, {hi}]" + (" (log)" if v.get("log") else "")
    return "(none)" if v is None else repr(v)
