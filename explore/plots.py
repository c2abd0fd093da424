"""Small helpers for plotting a study (``notebooks/analysis.ipynb``): each objective's
name for an axis, and a log axis whose tick labels do not run into each other.

matplotlib is the notebook's extra (``pip install -e ".[notebook]"``): it is imported
only by :func:`log_axis`.

>>> import optuna
>>> study = optuna.create_study(directions=["maximize", "minimize"])
>>> objective_labels(study)
['objective 0 (maximize)', 'objective 1 (minimize)']
"""

from __future__ import annotations

import math
from typing import Any

import optuna

from explore.attrs import SPACE_ATTR

__all__ = ["log_axis", "log_ticks", "objective_labels", "objective_names"]

MOST_TICKS = 6  # labelled ticks on a log axis: few enough for a narrow figure


def objective_names(study: optuna.Study) -> list[str]:
    """Each objective's metric: the study's name for it
    (:func:`explore.study.name_objectives`), or for a study made before studies were
    named, the space recorded with its runs; ``objective i`` when neither says.

    >>> study = optuna.create_study(direction="minimize")
    >>> study.set_user_attr("space", {"objectives": [{"metric": "loss"}]})
    >>> objective_names(study)
    ['loss']
    """
    n = len(study.directions)
    names: list[Any] | None = study.metric_names
    if names is None or len(names) != n:
        space = study.user_attrs.get(SPACE_ATTR)
        recorded = space.get("objectives") if isinstance(space, dict) else None
        names = [o.get("metric") if isinstance(o, dict) else None for o in recorded] \
            if isinstance(recorded, list) and len(recorded) == n else [None] * n
    return [str(name) if name else f"objective {i}" for i, name in enumerate(names)]


def objective_labels(study: optuna.Study) -> list[str]:
    """Each objective as an axis names it, its metric (:func:`objective_names`) and
    direction: ``accuracy (maximize)``."""
    return [f"{name} ({d.name.lower()})"
            for name, d in zip(objective_names(study), study.directions, strict=True)]


def log_ticks(lo: float, hi: float, most: int = MOST_TICKS) -> list[float]:
    """Between 2 and ``most`` values in ``[lo, hi]`` (positive; one if ``lo == hi``) to
    label a log axis with:
    powers of ten (every second, third ... over a wide range), else 1, 2 and 5 times
    them, else 1 to 9 times them, else (a range too narrow for two of those) even
    linear steps.

    >>> log_ticks(0.55, 3.0), log_ticks(1e-3, 1e9)[:3], log_ticks(0.52, 0.58)
    ([1.0, 2.0], [0.001, 1.0, 1000.0], [0.52, 0.54, 0.56, 0.58])
    """
    lo, hi = sorted((lo, hi))
    if not (lo > 0 and math.isfinite(hi)):
        return []
    if hi == lo:
        return [lo]
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    for subs in ((1,), (1, 2, 5), range(1, 10)):
        # float(f"{m}e{k}"): 3e-1 is 0.3, where 3 * 10**-1 is 0.30000000000000004
        ticks = [v for k in range(first, last + 1) for m in subs
                 if lo <= (v := float(f"{m}e{k}")) <= hi]
        if len(ticks) >= 2:
            return ticks[::math.ceil(len(ticks) / most)]
    # A linear step of 1, 2 or 5 times a power of ten, for 2 to 4 ticks: the labels of
    # so narrow a range are long (0.000102).
    span = hi - lo
    for k in range(math.floor(math.log10(span / 4)), math.ceil(math.log10(span)) + 1):
        for m in (1, 2, 5):
            step = float(f"{m}e{k}")
            n0, n1 = math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9)
            if 2 <= n1 - n0 + 1 <= 4:
                return [float(f"{n * step:.12g}") for n in range(n0, n1 + 1)]
    return [lo, hi]  # pragma: no cover (some step of 1, 2 or 5 fits 2 to 4 times)


def log_axis(ax: Any, axis: str = "x") -> None:
    """Put ``axis`` ("x" or "y") of the matplotlib axes ``ax`` on a log scale labelled
    with a few plain numbers (:func:`log_ticks`: ``0.2``, ``0.5``, ``1``, ``2``), the
    minor ticks unlabelled.  Matplotlib's own log axis labels the minor ticks of a
    range under a few decades, ``3×10⁻¹`` beside ``4×10⁻¹``, where they run into each
    other."""
    from matplotlib.ticker import (  # noqa: PLC0415 (the notebook's extra)
        FuncFormatter,
        Locator,
        NullFormatter,
    )

    class _Few(Locator):
        def __call__(self) -> Any:
            if self.axis is None:  # not set on an axis yet: nothing to label
                return []
            return self.tick_values(*self.axis.get_view_interval())

        def tick_values(self, vmin: float, vmax: float) -> Any:
            return log_ticks(vmin, vmax)

    if axis not in ("x", "y"):
        raise ValueError(f"axis is 'x' or 'y', not {axis!r}")
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    which = ax.xaxis if axis == "x" else ax.yaxis
    which.set_major_locator(_Few())
    which.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    which.set_minor_formatter(NullFormatter())
