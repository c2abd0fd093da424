"""A model family is one module: a throwaway one, registered here, is built by name."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from engine import CalcGraph, Init, Mode
from explore import families
from explore.binding import bind
from explore.candidate import compile_candidate, graph_of
from explore.datasets import BaseDataset
from explore.families import BaseFamily
from explore.ranges import bounds
from explore.sampling import fixed
from explore.space import parse_space
from explore.yamlio import SpaceError


class Linear(BaseFamily):
    """Softmax regression: no hidden layer, so ``depth`` must be 0."""

    def build(self, params: dict[str, Any], dataset: BaseDataset,
              eval_loss: bool = True) -> CalcGraph:
        g = CalcGraph(name="linear")
        x = g.placeholder("x", (0, dataset.features), dtype="uint8")
        y = g.placeholder("y", (0,), dtype="int64")
        w = g.parameter("w", (dataset.features, dataset.classes), init=Init.zeros())
        b = g.parameter("b", (dataset.classes,), init=Init.zeros())
        train, ev = g.path("train", Mode.BACKWARD_ENABLED), g.path("eval", Mode.FORWARD_ONLY)
        outs = []
        for path, names in ((train, ["loss", "log_prob"]), (ev, ["eval_loss", "eval_lp"])):
            h = path.Gemm(path.DequantizeLinear(x, scale=dataset.pixel_scale), w, b)
            outs.append((h, path.SoftmaxCrossEntropyLoss(h, y, outputs=names)[0]))
        train.set_loss(outs[0][1])
        g.output(outs[0][1], ev.Accuracy(outs[1][0], y, outputs=["accuracy"]), outs[1][1])
        return g

    def check(self, model: Mapping[str, Any]) -> None:
        if bounds(model["depth"]) != (0, 0) or bounds(model["blocks"]) != (0, 0):
            raise ValueError("a linear model has depth 0 and no blocks")


@pytest.fixture
def linear() -> Iterator[None]:
    families.register("linear")(Linear)
    yield
    families.FAMILIES.unregister("linear")


SPACE = {"dataset": "digits", "budget": {"trials": 1, "rounds": 1, "memory": "64MB"}}


def test_a_registered_family_is_built_by_name(linear: None) -> None:
    space = parse_space({**SPACE, "model": {"family": "linear", "depth": 0}})
    assert graph_of(bind(space), fixed(space)).name == "linear"
    prog = compile_candidate(bind(space), fixed(space), share=8_000_000).program
    assert sorted(prog.buffers[p.buffer].shape for p in prog.params) == [(10,), (64, 10)]


def test_a_family_checks_its_section(linear: None) -> None:
    with pytest.raises(SpaceError, match="model: a linear model has depth 0"):
        parse_space({**SPACE, "model": {"family": "linear", "depth": {"int": [0, 1]}}})


def test_unknown_families_are_listed() -> None:
    with pytest.raises(SpaceError,
                       match=r"model\.family: Input should be 'mlp', 'cnn', 'transformer', "
                             r"'conv1d', 'onnx' or 'resnet'"):
        parse_space({**SPACE, "model": {"family": "linear"}})
