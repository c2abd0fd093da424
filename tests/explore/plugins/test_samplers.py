"""A sampler is one module: a throwaway one, registered here, drives a space by name."""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import optuna
import pytest

from explore import samplers
from explore.samplers import BaseSampler, SamplerArgs
from explore.sampling import suggest
from explore.space import parse_space
from explore.study import make_sampler
from explore.yamlio import SpaceError


class Qmc(BaseSampler):
    """Optuna's quasi-Monte Carlo sampler (one objective, say, to show a check)."""

    def create(self, args: SamplerArgs) -> optuna.samplers.BaseSampler:
        with warnings.catch_warnings():  # "experimental"
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.QMCSampler(seed=args.seed)

    def check(self, objectives: int, params: Mapping[str, Any]) -> None:
        if objectives > 1:
            raise ValueError("qmc here searches for one objective")


@pytest.fixture
def qmc() -> Iterator[None]:
    samplers.register("qmc")(Qmc)
    yield
    samplers.SAMPLERS.unregister("qmc")


SPACE = {"dataset": "digits", "budget": {"trials": 1, "rounds": 1, "memory": "64MB",
                                         "seed": 7},
         "training": {"lr": {"float": [1e-3, 1e-1], "log": True}}}


def test_a_registered_sampler_is_used_by_name(qmc: None) -> None:
    space = parse_space({**SPACE, "sampler": "qmc"})
    sampler = make_sampler(space)
    assert isinstance(sampler, optuna.samplers.QMCSampler)
    study = optuna.create_study(sampler=sampler)
    for _ in range(3):
        t = study.ask()
        study.tell(t, suggest(t, space)["lr"])
    assert len({t.params["lr"] for t in study.trials}) == 3


def test_a_sampler_checks_the_space(qmc: None) -> None:
    with pytest.raises(SpaceError, match="qmc here searches for one objective"):
        parse_space({**SPACE, "sampler": "qmc",
                     "objectives": [{"metric": "accuracy"}, {"metric": "planned_bytes"}]})


def test_unknown_samplers_are_listed() -> None:
    with pytest.raises(SpaceError, match="'tpe', 'random', 'grid', 'cmaes' or 'nsga2'"):
        parse_space({**SPACE, "sampler": "qmc"})


@pytest.mark.parametrize("name, default", [("tpe", 10), ("cmaes", 1)])
def test_startup_trials_of_zero_is_zero_not_the_default(name: str, default: int) -> None:
    """``startup_trials: 0`` models from the first trial (Optuna takes 0), and draws
    none ahead; left out, the sampler's own default."""
    def startup(**sampler: Any) -> tuple[int, int | None]:
        space = parse_space({**SPACE, "sampler": {"name": name, **sampler}})
        made: Any = make_sampler(space)
        return made._n_startup_trials, samplers.get(name).blind(
            SamplerArgs(0, space.sampler.startup_trials, 1, space.params()))

    assert startup(startup_trials=0) == (0, 0)
    assert startup(startup_trials=3) == (3, 3)
    assert startup() == (default, default)
