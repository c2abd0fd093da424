"""An optimizer is one module: a throwaway one, registered here, is built by name."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from engine import SGD, Optimizer
from explore import optimizers
from explore.binding import bind
from explore.candidate import compile_candidate
from explore.families import BuildError
from explore.optimizers import BaseOptimizer, build_optimizer
from explore.sampling import fixed
from explore.space import parse_space


class Nesterovish(BaseOptimizer):
    """SGD with momentum 0.9 whatever the space says."""

    def build(self, lr: float, momentum: float, weight_decay: float) -> Optimizer:
        return SGD(lr=lr, momentum=0.9, weight_decay=weight_decay)


@pytest.fixture
def nesterovish() -> Iterator[None]:
    optimizers.register("nesterovish")(Nesterovish)
    yield
    optimizers.OPTIMIZERS.unregister("nesterovish")


def test_a_registered_optimizer_is_used_by_name(nesterovish: None) -> None:
    space = parse_space({"dataset": "digits", "budget": {"trials": 1, "rounds": 1,
                                                         "memory": "64MB"},
                         "training": {"optimizer": {"choice": ["nesterovish", "adam"]}}})
    p = fixed(space)
    assert p["optimizer"] == "nesterovish" and build_optimizer(p).momentum == 0.9
    prog = compile_candidate(bind(space), p, share=8_000_000).program
    assert prog.zone_bytes["optimizer"] > 0  # the momentum buffers


def test_unknown_optimizers_are_listed() -> None:
    with pytest.raises(BuildError, match="unknown optimizer 'Foo'; known: sgd, adam, adamw"):
        build_optimizer({"optimizer": "Foo", "lr": 0.1})
