"""The compiler sizes programs exactly and reports bad graphs clearly."""

from __future__ import annotations

import numpy as np
import pytest

from engine import (
    SGD,
    VM,
    Adam,
    BudgetError,
    CalcGraph,
    CompileError,
    GraphError,
    Init,
    Mode,
    ShapeError,
    compile_graph,
    lower,
    size,
)
from engine.compile.compiler import max_batch
from engine.compile.planner import plan_memory
from engine.models import paper_mlp


def test_batch_size_gives_exact_bytes_per_zone() -> None:
    g = CalcGraph()
    x = g.placeholder("x", (0, 6))
    w = g.parameter("w", (6, 3), init=Init.zeros())
    p = g.path("f", Mode.FORWARD_ONLY)
    p.MatMul(x, w)
    # x: 10*6*4 = 240 -> 256 aligned; w: 72 -> 128; y: 10*3*4 = 120 -> 128
    assert size(g, 10) == {"forward": 512, "gradient": 0, "optimizer": 0, "workspace": 0}


def test_zones_of_a_training_program() -> None:
    g = paper_mlp((8, 4, 3))
    prog = compile_graph(g, batch_size=16, optimizer=Adam())
    z = prog.zone_bytes
    # Adam keeps two copies of the parameter region; parameters lead both zones.
    assert z["optimizer"] == 2 * prog.param_region
    params = [b for b in prog.buffers if b.kind == "param"]
    grads = [b for b in prog.buffers if b.kind == "grad"]
    assert sorted(b.offset for b in params) == sorted(b.offset for b in grads)
    assert all(b.offset % 64 == 0 for b in prog.buffers)
    assert z["workspace"] >= prog.param_region  # the update's scratch
    assert prog.total_bytes == sum(z.values())


@pytest.mark.parametrize("budget", [50_000, 123_456, 1 << 20, 50 << 20])
def test_memory_budget_gives_largest_batch_that_fits(budget: int) -> None:
    g = paper_mlp((64, 32, 10))
    opt = Adam()
    prog = compile_graph(g, memory=budget, optimizer=opt)
    b = prog.batch_size
    assert prog.total_bytes <= budget
    assert sum(size(g, b + 1, opt).values()) > budget


def test_max_batch_takes_logarithmically_many_sizings() -> None:
    calls: list[int] = []

    def sizing(b: int) -> int:
        calls.append(b)
        return 1000 + 37 * b

    best = max_batch(sizing, 10_000_000)
    assert 1000 + 37 * best <= 10_000_000 < 1000 + 37 * (best + 1)
    assert len(calls) <= 2 * best.bit_length() + 2


def test_batch_one_that_does_not_fit_is_a_clear_error() -> None:
    g = paper_mlp()
    with pytest.raises(BudgetError, match=r"needs [\d,]+ bytes at batch 1, more than the budget"):
        compile_graph(g, memory=1000, optimizer=Adam())


def test_sizing_is_monotonic_in_batch() -> None:
    ir = lower(paper_mlp(), Adam())
    totals = [plan_memory(ir, b, Adam(), "cpu").total_bytes for b in range(1, 200)]
    assert totals == sorted(totals)


def test_shape_mismatch_names_op_path_and_shapes() -> None:
    g = CalcGraph()
    x = g.placeholder("x", (0, 6))
    w = g.parameter("w", (5, 3))
    p = g.path("learn", Mode.FORWARD_ONLY)
    p.MatMul(x, w)
    with pytest.raises(ShapeError) as e:
        compile_graph(g, batch_size=4)
    msg = str(e.value)
    assert "op #0 'MatMul' in path 'learn'" in msg
    assert "6 vs 5" in msg and "x[b,6]" in msg and "w[5,3]" in msg


def test_unknown_op_lists_available_ones() -> None:
    g = CalcGraph()
    x = g.placeholder("x", (0, 6))
    g.path("p").Frobnicate(x)
    with pytest.raises(GraphError, match=r"unknown op 'Frobnicate'. Available: .*MatMul"):
        compile_graph(g, batch_size=1)


def test_unknown_attribute_and_undefined_input_are_named() -> None:
    g = CalcGraph()
    x = g.placeholder("x", (0, 6))
    g.path("p").Softmax(x, axsi=1)
    with pytest.raises(GraphError, match=r"unknown attribute\(s\) \['axsi'\]; allowed: axis"):
        compile_graph(g, batch_size=1)
    g2 = CalcGraph()
    g2.path("p").Relu("nope")
    with pytest.raises(GraphError, match=r"input 'nope' is not defined"):
        compile_graph(g2, batch_size=1)


def test_optimizer_without_backward_path_is_refused() -> None:
    g = CalcGraph(name="inference")
    x = g.placeholder("x", (0, 6))
    w = g.parameter("w", (6, 3))
    g.path("p", Mode.FORWARD_ONLY).MatMul(x, w)
    with pytest.raises(CompileError, match=r"optimizer \(SGD\).*no BACKWARD_ENABLED path"):
        compile_graph(g, batch_size=2, optimizer=SGD())


def test_backward_path_needs_a_loss_that_depends_on_parameters() -> None:
    g = CalcGraph()
    x = g.placeholder("x", (0, 6))
    g.path("p", Mode.BACKWARD_ENABLED).Relu(x)
    with pytest.raises(GraphError, match=r"BACKWARD_ENABLED but has no loss"):
        compile_graph(g, batch_size=2)
    g2 = CalcGraph()
    x2 = g2.placeholder("x", (0, 6))
    p2 = g2.path("p", Mode.BACKWARD_ENABLED)
    p2.set_loss(p2.Relu(x2))
    with pytest.raises(GraphError, match=r"does not depend on any trainable parameter"):
        compile_graph(g2, batch_size=2)


def test_metric_between_parameter_and_loss_is_refused() -> None:
    g = CalcGraph()
    x = g.placeholder("x", (0, 6))
    y = g.placeholder("y", (0,), dtype="int64")
    w = g.parameter("w", (6, 3))
    p = g.path("p", Mode.BACKWARD_ENABLED)
    p.set_loss(p.Accuracy(p.MatMul(x, w), y))
    with pytest.raises(GraphError, match=r"'Accuracy'.*has no gradient"):
        compile_graph(g, batch_size=2)


def test_batch_must_stay_leading() -> None:
    g = CalcGraph()
    x = g.placeholder("x", (0, 6))
    g.path("p").Reshape(x, shape=(6, -1))
    with pytest.raises(ShapeError, match=r"would move the batch dimension"):
        compile_graph(g, batch_size=2)


def test_program_round_trips_through_json_and_runs_the_same() -> None:
    g = paper_mlp((8, 5, 3))
    prog = compile_graph(g, batch_size=4, optimizer=Adam(lr=0.1))
    again = type(prog).from_json(prog.to_json())
    assert again == prog
    data = {"x": np.ones((4, 8), np.float32), "y": np.array([0, 1, 2, 0])}
    vms = [VM(p, seed=3) for p in (prog, again)]
    for vm in vms:
        vm.feed(data)
        vm.train_step("train")
    np.testing.assert_array_equal(vms[0].get("w0"), vms[1].get("w0"))


def test_typecheck_runs_after_every_pass_in_debug_mode() -> None:
    prog = compile_graph(paper_mlp((8, 5, 3)), batch_size=4, optimizer=Adam(), debug=True)
    assert prog.paths[0].backward
