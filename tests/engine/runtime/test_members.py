"""A stack's member moved into another program trains on exactly as it would have in
the stack: parameters, optimizer state, step count and generator all carried."""

from __future__ import annotations

import numpy as np
import pytest

from engine import SGD, VM, Adam, EngineError, compile_graph
from engine.compile.stack import member_params, stack_graphs, stack_optimizers
from engine.graph import Init
from engine.models import paper_mlp
from engine.runtime.members import models, move_member
from engine.runtime.optim import Optimizer
from tests.allocations import step_allocations

INITS = [Init.xavier_uniform(), Init.he_uniform(), Init.uniform(-0.3, 0.3)]
LRS = [1e-3, 3e-3, 1e-2]
BATCH = 16


def stack_of(members: list[int], make: type[Optimizer] = Adam) -> VM:
    graphs = [paper_mlp((6, 10, 7, 3), init=INITS[m]) for m in members]
    opts = [make(lr=LRS[m]) for m in members]  # type: ignore[call-arg]
    if len(members) == 1:
        return VM(compile_graph(graphs[0], batch_size=BATCH, optimizer=opts[0]))
    return VM(compile_graph(stack_graphs(graphs), batch_size=BATCH,
                            optimizer=stack_optimizers(opts)), seed=5)


def train(vm: VM, steps: int, at: int = 0) -> None:
    rng = np.random.default_rng(at)
    for _ in range(steps):
        vm.set("x", rng.normal(size=(BATCH, 6)).astype(np.float32))
        vm.set("y", rng.integers(0, 3, BATCH))
        vm.train_step("train")


def params_of(vm: VM, k: int | None) -> dict[str, np.ndarray]:
    if k is None:
        return {n: vm.get(n) for n in member_params(stack_of([0, 1]), 0)}
    return member_params(vm, k)


@pytest.mark.parametrize("make", [Adam, SGD])
def test_a_split_stack_trains_on_as_the_whole_stack_would(make: type[Optimizer]) -> None:
    whole = stack_of([0, 1, 2], make)
    train(whole, 4)
    pair, alone = stack_of([0, 2], make), stack_of([1], make)
    move_member(whole, 0, pair, 0)
    move_member(whole, 2, pair, 1)
    move_member(whole, 1, alone, None)
    assert models(pair.program) == 2 and models(alone.program) is None
    for vm in (whole, pair, alone):
        train(vm, 5, at=1)
    for k, (vm, j) in enumerate([(pair, 0), (alone, None), (pair, 1)]):
        got, want = params_of(vm, j), member_params(whole, k)
        assert got.keys() == want.keys()
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=2e-5, atol=2e-6,
                                       err_msg=f"member {k}: {name}")


def test_a_lone_model_joins_a_stack() -> None:
    alone = stack_of([1])
    train(alone, 3)
    pair = stack_of([0, 1])
    move_member(alone, None, pair, 1)
    np.testing.assert_array_equal(member_params(pair, 1)["w0"], alone.get("w0"))
    assert pair.round == alone.round


def test_moving_allocates_nothing() -> None:
    whole, pair = stack_of([0, 1, 2]), stack_of([0, 2])
    train(whole, 1)
    retained, peak = step_allocations(lambda: move_member(whole, 2, pair, 1), warmup=2,
                                      runs=5)
    assert retained < 4096 and peak < 16_384, (retained, peak)


def test_wrong_members_and_kinds_are_refused() -> None:
    whole, alone = stack_of([0, 1, 2]), stack_of([1])
    with pytest.raises(EngineError, match="model 3 is not one of them"):
        move_member(whole, 3, alone, None)
    with pytest.raises(EngineError, match="runs one model: model 0"):
        move_member(whole, 0, alone, 0)
    with pytest.raises(EngineError, match="not one optimizer kind"):
        move_member(whole, 0, stack_of([1], SGD), None)
