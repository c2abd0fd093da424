"""Stacks of models (engine.compile.stack): K models trained as one program behave like the
K models trained one by one, use exactly their planned memory, and refuse what
does not stack with an error naming it."""

from __future__ import annotations

import numpy as np
import pytest

from engine import SGD, VM, Adagrad, Adam, AdamW, RMSProp, compile_graph
from engine.compile.stack import StackError, member_params, stack_graphs, stack_optimizers
from engine.graph import CalcGraph, Init, Mode
from engine.models import deep_mlp, paper_mlp
from engine.runtime.optim import PerModelLR, optimizer_from_dict
from engine.runtime.program import Program
from engine.runtime.train import evaluate, train_epoch
from tests.allocations import step_allocations

RNG = np.random.default_rng(0)
X = RNG.random((96, 12), dtype=np.float32)
Y = (X[:, 0] * 4).astype(np.int64) % 4
SIZES = (12, 16, 8, 4)
INITS = (Init.xavier_uniform(), Init.he_uniform(), Init.normal(0.0, 0.1))

OPTIMIZERS = [
    [SGD(lr=0.05, momentum=0.9), SGD(lr=0.2, momentum=0.9), SGD(lr=0.01, momentum=0.9)],
    [SGD(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3),
     SGD(lr=0.3, momentum=0.9, nesterov=True, weight_decay=1e-3),
     SGD(lr=0.02, momentum=0.9, nesterov=True, weight_decay=1e-3)],
    [Adam(lr=1e-3), Adam(lr=1e-2), Adam(lr=3e-2)],
    [AdamW(lr=1e-3), AdamW(lr=1e-2), AdamW(lr=3e-2)],
    [RMSProp(lr=1e-3, momentum=0.5), RMSProp(lr=1e-2, momentum=0.5),
     RMSProp(lr=3e-3, momentum=0.5)],
    [Adagrad(lr=0.05), Adagrad(lr=0.2), Adagrad(lr=0.01)],
]


def _single_vms(graphs: list[CalcGraph], opts: list, stacked: VM) -> list[VM]:
    """The models one by one, starting from the stack's initial parameters."""
    vms = []
    for k, (g, o) in enumerate(zip(graphs, opts, strict=True)):
        vm = VM(compile_graph(g, batch_size=32, optimizer=o))
        for name, value in member_params(stacked, k).items():
            vm.assign(name, value)
        vms.append(vm)
    return vms


def _trained_alike(graphs: list[CalcGraph], opts: list) -> tuple[VM, list[VM]]:
    """The stack of ``graphs`` and the models alone, trained three epochs on the same
    batches: each epoch's losses and then every parameter agree."""
    stacked = VM(compile_graph(stack_graphs(graphs), batch_size=32,
                               optimizer=stack_optimizers(opts)))
    singles = _single_vms(graphs, opts, stacked)
    for epoch in range(3):
        losses = train_epoch(stacked, X, Y, np.random.default_rng(epoch), loss="loss")
        alone = [train_epoch(vm, X, Y, np.random.default_rng(epoch)) for vm in singles]
        np.testing.assert_allclose(losses, alone, rtol=2e-5, atol=1e-6)
    for k, vm in enumerate(singles):
        for name, value in member_params(stacked, k).items():
            np.testing.assert_allclose(value, vm.get(name), rtol=1e-4, atol=2e-6,
                                       err_msg=f"model {k}, {name}")
    return stacked, singles


@pytest.mark.parametrize("opts", OPTIMIZERS, ids=lambda o: type(o[0]).__name__)
def test_a_stack_trains_each_model_as_if_alone(opts: list) -> None:
    stacked, singles = _trained_alike(
        [paper_mlp(SIZES, activation="Tanh", init=i) for i in INITS], opts)
    acc = evaluate(stacked, X, Y, metric="accuracy")
    np.testing.assert_allclose(acc, [evaluate(vm, X, Y) for vm in singles], atol=1e-6)


def masked_mlp(init: Init) -> CalcGraph:
    """A ReLU written with a mask (``h * (h > 0)``) and a masked fill of the exact zeros
    (``where(h == 0, 0, h)``, ``not``): comparisons, Not, Cast and Where in a stack."""
    g = CalcGraph(name="masked")
    x = g.placeholder("x", (0, 12))
    y = g.placeholder("y", (0,), dtype="int64")
    w0 = g.parameter("w0", (12, 16), init=init)
    b0 = g.parameter("b0", (16,), init=Init.zeros())
    w1 = g.parameter("w1", (16, 4), init=init)
    b1 = g.parameter("b1", (4,), init=Init.zeros())
    zero = g.constant([0.0], shape=(), name="zero")
    p = g.path("train", Mode.BACKWARD_ENABLED)
    h = p.Gemm(x, w0, b0)
    h = p.Mul(h, p.Cast(p.Greater(h, zero), to="float32"))
    h = p.Where(p.Not(p.Not(p.Equal(h, zero))), zero, h)
    loss, _ = p.SoftmaxCrossEntropyLoss(p.Gemm(h, w1, b1), y, outputs=["loss", "log_prob"])
    p.set_loss(loss)
    return g


def test_a_stack_with_masks_trains_each_model_as_if_alone() -> None:
    _trained_alike([masked_mlp(i) for i in INITS],
                   [Adam(lr=1e-3), Adam(lr=1e-2), Adam(lr=3e-2)])


def linear_mlp(init: Init, both_ways: bool = False) -> CalcGraph:
    """PyTorch's layout: ``Linear`` weights ``[out, in]``, read by ``Gemm(transB=1)``.
    With ``both_ways`` the first layer's (square) weight also multiplies the data
    untransposed: a weight read both ways from the data."""
    g = CalcGraph(name="linear")
    x = g.placeholder("x", (0, 12))
    y = g.placeholder("y", (0,), dtype="int64")
    width = 12 if both_ways else 16
    w0 = g.parameter("w0", (width, 12), init=init)
    b0 = g.parameter("b0", (width,), init=Init.zeros())
    w1 = g.parameter("w1", (4, width), init=init)
    p = g.path("train", Mode.BACKWARD_ENABLED)
    h = p.Gemm(x, w0, b0, transB=1)
    if both_ways:
        h = p.Add(h, p.Gemm(x, w0))
    loss, _ = p.SoftmaxCrossEntropyLoss(p.Gemm(p.Tanh(h), w1, transB=1), y,
                                        outputs=["loss", "log_prob"])
    p.set_loss(loss)
    return g


@pytest.mark.parametrize("opts", OPTIMIZERS[:3:2], ids=lambda o: type(o[0]).__name__)
def test_a_data_fed_out_by_in_weight_is_stored_in_by_models_by_out(opts: list) -> None:
    """A ``[out, in]`` weight fed by the data is stored ``[in, K, out]``, each model's
    slice transposed: the K products are one untransposed GEMM (the faster one, and
    the layout the sparse form reads); each model still reads and trains as alone."""
    stacked, _ = _trained_alike([linear_mlp(i) for i in INITS], opts)
    prog = stacked.program
    shapes = {prog.buffers[ps.buffer].name: (prog.buffers[ps.buffer].desc.shape, ps.init)
              for ps in prog.params}
    assert shapes["w0"][0] == (12, 3, 16) and shapes["w0"][1].member_transposed
    assert shapes["w1"][0] == (3, 4, 16) and not shapes["w1"][1].member_transposed  # fed by h
    first = next(i for i in prog.instrs if i.op == "StackedGemm")
    assert (first.attrs["transB"], first.attrs["model_axis"]) == (0, 1)
    assert member_params(stacked, 2)["w0"].shape == (16, 12)
    np.testing.assert_array_equal(member_params(stacked, 1)["w0"],
                                  stacked.get("w0")[:, 1, :].T)
    assert Program.from_json(prog.to_json()) == prog


def test_a_weight_read_both_ways_keeps_the_models_layout() -> None:
    stacked, _ = _trained_alike([linear_mlp(i, both_ways=True) for i in INITS],
                                OPTIMIZERS[2])
    w0 = next(ps for ps in stacked.program.params
              if stacked.program.buffers[ps.buffer].name == "w0")
    assert stacked.program.buffers[w0.buffer].desc.shape == (3, 12, 12)
    assert not w0.init.member_transposed and w0.init.model_axis == 0


def test_a_stack_of_matmul_add_layers_with_dropout_trains() -> None:
    graphs = [deep_mlp(depth=3, width=16, n_in=12, n_out=4) for _ in range(4)]
    prog = compile_graph(stack_graphs(graphs), batch_size=32,
                         optimizer=stack_optimizers([Adam(lr=10.0**-e) for e in (1, 2, 3, 4)]))
    vm = VM(prog)
    first = train_epoch(vm, X, Y, np.random.default_rng(0), loss="loss")
    for e in range(30):
        last = train_epoch(vm, X, Y, np.random.default_rng(e), loss="loss")
    assert first.shape == (4,)
    assert last[1] < first[1] and last[2] < first[2]
    # A learning rate of 1e-4 moves its model least.
    assert first[3] - last[3] < first[2] - last[2]


def test_stacked_memory_is_exact_and_a_step_allocates_nothing() -> None:
    graphs = [paper_mlp((784, 64, 64, 10), dropout=0.1) for _ in range(8)]
    prog = compile_graph(stack_graphs(graphs), batch_size=64,
                         optimizer=stack_optimizers([Adam(lr=1e-3 * (k + 1)) for k in range(8)]))
    vm = VM(prog)
    assert vm.allocated_bytes == prog.total_bytes
    single = compile_graph(graphs[0], batch_size=64, optimizer=Adam())
    # Eight models' parameters, four optimizer slots (m, v, the rates) and gradients.
    assert prog.param_region == pytest.approx(8 * single.param_region, rel=0.01)
    assert prog.zone_bytes["optimizer"] == 3 * prog.param_region
    x = RNG.random((64, 784), dtype=np.float32)
    y = RNG.integers(0, 10, 64)

    def step() -> None:
        vm.set("x", x)
        vm.set("y", y)
        vm.train_step("train")

    retained, peak = step_allocations(step, warmup=5, runs=50)
    assert retained < 4096
    assert peak < 48 * 1024


MOMENTA = [
    [SGD(lr=0.05, momentum=0.9), SGD(lr=0.2, momentum=0.3), SGD(lr=0.01, momentum=0.6)],
    [SGD(lr=0.1, momentum=0.95, nesterov=True, weight_decay=1e-3),
     SGD(lr=0.3, momentum=0.4, nesterov=True, weight_decay=1e-3),
     SGD(lr=0.02, momentum=0.7, nesterov=True, weight_decay=1e-3)],
]


@pytest.mark.parametrize("opts", MOMENTA, ids=["heavy_ball", "nesterov"])
def test_sgd_models_of_different_momenta_stack_each_as_if_alone(opts: list,
                                                                kernel_path: str) -> None:
    opt = stack_optimizers(opts)
    assert opt.momenta == tuple(o.momentum for o in opts)
    stacked, _ = _trained_alike(
        [paper_mlp(SIZES, activation="Tanh", init=i) for i in INITS], opts)
    # the momenta are one more slot of the program's, sized exactly
    prog = stacked.program
    assert opt.state_slots == 3  # the buffer, the rates, the momenta
    assert prog.zone_bytes["optimizer"] == opt.state_slots * prog.param_region
    assert optimizer_from_dict(opt.to_dict()) == opt
    assert Program.from_json(prog.to_json()) == prog


def test_sgd_models_of_one_momentum_keep_no_momenta_slot() -> None:
    opt = stack_optimizers([SGD(lr=0.1, momentum=0.9), SGD(lr=0.2, momentum=0.9)])
    assert opt.momenta == () and opt.state_slots == 2
    assert "momenta" not in opt.to_dict()  # what a stack of one momentum always wrote


def test_per_model_learning_rates_survive_serialisation() -> None:
    opt = stack_optimizers([Adam(lr=1e-3), Adam(lr=2e-3)])
    assert optimizer_from_dict(opt.to_dict()) == opt
    prog = compile_graph(stack_graphs([paper_mlp(SIZES)] * 2), batch_size=8, optimizer=opt)
    assert Program.from_json(prog.to_json()) == prog
    assert isinstance(prog.optimizer, PerModelLR)


def test_what_does_not_stack_is_named() -> None:
    with pytest.raises(StackError, match="more than the learning rate"):
        stack_optimizers([SGD(lr=0.1, momentum=0.9), SGD(lr=0.1)])
    with pytest.raises(StackError, match="variable 'w0' differs"):
        stack_graphs([paper_mlp((4, 8, 3)), paper_mlp((4, 9, 3))])
    g = CalcGraph()
    x = g.placeholder("x", (0, 4))
    t = g.placeholder("t", (0, 2))
    w = g.parameter("w", (4, 2))
    p = g.path("fit", Mode.BACKWARD_ENABLED)
    p.set_loss(p.MSELoss(p.MatMul(x, w), t))
    with pytest.raises(StackError, match=r"op MSELoss .* has no stacking rule"):
        stack_graphs([g, g])
    g2 = CalcGraph()
    x = g2.placeholder("x", (0, 4))
    w = g2.parameter("w", (4, 4))
    p = g2.path("f")
    p.Add(p.MatMul(x, w), x)
    with pytest.raises(StackError, match="per-sample data the models share"):
        stack_graphs([g2, g2])


def test_every_stacking_rule_kind_has_a_rule() -> None:
    from engine.compile.stack import _RULES
    from engine.ops import StackRule

    assert set(_RULES) == set(StackRule)
