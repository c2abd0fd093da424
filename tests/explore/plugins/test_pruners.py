"""A pruner is one module: a throwaway one, registered here, is used by name."""

from __future__ import annotations

from collections.abc import Iterator

import optuna
import pytest

from explore import pruners
from explore.pruners import BasePruner, PrunerArgs
from explore.space import parse_space
from explore.study import make_pruner
from explore.yamlio import SpaceError


class Quartile(BasePruner):
    """Prune below the first quartile (Optuna's percentile pruner at 25)."""

    def create(self, args: PrunerArgs) -> optuna.pruners.BasePruner:
        return optuna.pruners.PercentilePruner(25.0, n_warmup_steps=args.warmup_rounds)


@pytest.fixture
def quartile() -> Iterator[None]:
    pruners.register("quartile")(Quartile)
    yield
    pruners.PRUNERS.unregister("quartile")


SPACE = {"dataset": "digits", "budget": {"trials": 1, "rounds": 3, "memory": "64MB"}}


def test_a_registered_pruner_is_used_by_name(quartile: None) -> None:
    space = parse_space({**SPACE, "pruner": {"name": "quartile", "warmup_rounds": 2}})
    assert isinstance(make_pruner(space), optuna.pruners.PercentilePruner)


def test_unknown_pruners_are_listed() -> None:
    with pytest.raises(SpaceError, match=r"pruner\.name: Input should be 'none', 'median'"):
        parse_space({**SPACE, "pruner": "quartile"})
