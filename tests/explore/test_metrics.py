"""A metric is one module: a throwaway one, registered here, is an objective by name."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import pytest

from explore import metrics
from explore.metrics import BaseMetric
from explore.space import parse_space
from explore.yamlio import SpaceError


class ErrorRate(BaseMetric):
    direction = "minimize"

    def value(self, measured: Mapping[str, float], heap_bytes: int) -> float:
        return 1.0 - measured["accuracy"]


@pytest.fixture
def error_rate() -> Iterator[None]:
    metrics.register("error_rate")(ErrorRate)
    yield
    metrics.METRICS.unregister("error_rate")


SPACE = {"dataset": "digits", "budget": {"trials": 1, "rounds": 1, "memory": "64MB"}}


def test_a_registered_metric_is_an_objective_by_name(error_rate: None) -> None:
    space = parse_space({**SPACE, "objectives": [{"metric": "error_rate"}]})
    (o,) = space.objectives
    assert o.dir == "minimize"
    assert metrics.get(o.metric).value({"accuracy": 0.75}, 0) == 0.25


def test_the_built_in_metrics() -> None:
    measured = {"accuracy": 0.5, "eval_loss": 1.5}
    assert [(n, m.direction, m.value(measured, 100)) for n, m in metrics.METRICS.items()] == \
        [("accuracy", "maximize", 0.5), ("loss", "minimize", 1.5),
         ("planned_bytes", "minimize", 100.0)]


def test_unknown_metrics_are_listed() -> None:
    with pytest.raises(SpaceError, match="'accuracy', 'loss' or 'planned_bytes'"):
        parse_space({**SPACE, "objectives": [{"metric": "error_rate"}]})
