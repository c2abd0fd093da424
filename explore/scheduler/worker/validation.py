"""What a round measures on the validation rows, and when a trial has diverged."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.runtime.train import evaluate_metrics
from explore import metrics
from explore.metrics.evaluation import MEANS, ROWS, SUMS, Evaluation, compute_all


@dataclass
class Validation:
    """What a trial's validation pass reads from its eval path, and the metrics it
    computes from that (every registered metric whose outputs the program has)."""

    metrics: tuple[str, ...]
    means: tuple[str, ...]
    sums: tuple[str, ...]
    per_row: dict[str, np.ndarray]  # one host value per validation row (ROC AUC)
    target_std: float = 1.0

    @classmethod
    def of(cls, program: Any, valid_rows: int, target_std: float = 1.0,
           ) -> Validation:
        have = {b.name for b in program.buffers}
        names = tuple(n for n, m in metrics.METRICS.items()
                      if m.needs and all(o in have for o in m.needs))
        return cls(names, tuple(o for o in MEANS if o in have),
                   tuple(o for o in SUMS if o in have),
                   {o: np.empty(valid_rows, np.float32) for o in ROWS if o in have},
                   target_std)

    def measure(self, vm: Any, x: np.ndarray, y: np.ndarray) -> dict[str, float]:
        """Every metric over the validation rows ``(x, y)``, by name."""

        return self._compute(self._evaluate(vm, x, y), y, None)

    def measure_members(self, vm: Any, x: np.ndarray, y: np.ndarray, models: int
                        ) -> list[dict[str, float]]:
        """:meth:`measure` for each model of a stack, from one pass over the rows (each
        output read holds one value per model)."""
        got = self._evaluate(vm, x, y)
        return [self._compute(got, y, k) for k in range(models)]

    def _evaluate(self, vm: Any, x: np.ndarray, y: np.ndarray) -> dict[str, Any]:
        return evaluate_metrics(vm, x, y, self.means, check=False, sums=self.sums,
                                per_row=self.per_row)

    def _compute(self, got: dict[str, Any], y: np.ndarray, k: int | None) -> dict[str, float]:
        def of(v: Any) -> Any:
            return v if k is None else np.asarray(v)[k]

        ev = Evaluation(len(y), "regression" if "regression_sums" in got else
                        "classification", {m: of(got[m]) for m in self.means},
                        {m: of(got[m]) for m in self.sums}, self.per_row,
                        y if self.per_row else None, self.target_std)
        return compute_all(self.metrics, ev)


def diverged(loss: Any, which: str, round_: int) -> str | None:
    """The reason a trial whose ``which`` loss after round ``round_`` is NaN or
    infinite fails (checked once a round, on the host), or None.

    >>> diverged(float("nan"), "training", 1), diverged(0.3, "training", 1)
    ('diverged: training loss nan at round 1', None)
    """
    if loss is None or bool(np.all(np.isfinite(loss))):
        return None
    shown = float(loss) if np.ndim(loss) == 0 else np.asarray(loss).tolist()
    return f"diverged: {which} loss {shown} at round {round_}"
