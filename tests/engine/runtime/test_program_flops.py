"""A program's FLOPs (:mod:`engine.runtime.flops`): the paper MLP's training step equals
its hand count; a stack of K models counts K models' work; fusing changes nothing;
each optimizer's update is counted from its kernel; the count is cheap and kept."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from engine import SGD, Adam, CalcGraph, Init, Mode, compile_graph
from engine.compile.stack import stack_graphs, stack_optimizers
from engine.errors import EngineError
from engine.graph import Regularization
from engine.models import paper_mlp
from engine.ops import OP_TABLE
from engine.runtime import Adagrad, AdamW, Optimizer, Program, RMSProp
from engine.runtime.flops import ProgramFlops, program_flops, update_flops_per_element

B = 64
LAYERS = ((784, 64), (64, 64), (64, 10))


def hand_forward(b: int) -> int:
    """The paper MLP's train path by hand: three dense layers, two sigmoids,
    softmax cross-entropy (5 per score, 1 per row)."""
    products = 2 * b * (784 * 64 + 64 * 64 + 64 * 10)
    biases = b * (64 + 64 + 10)
    sigmoids = b * (64 + 64)
    loss = 5 * b * 10 + b
    return products + biases + sigmoids + loss


def hand_backward(b: int) -> int:
    """Its backward: the loss gradient (2 per score, 1 per row), each layer's weight
    gradient, the input gradients of layers 2 and 3 (the data's is never computed),
    the bias gradients (sums over the batch) and the sigmoid gradients (3 per element)."""
    loss = 2 * b * 10 + b
    weights = 2 * b * (784 * 64 + 64 * 64 + 64 * 10)
    inputs = 2 * b * (64 * 64 + 64 * 10)
    biases = b * (64 + 64 + 10)
    sigmoids = 3 * b * (64 + 64)
    return loss + weights + inputs + biases + sigmoids


PARAMS = 784 * 64 + 64 + 64 * 64 + 64 + 64 * 10 + 10


def test_paper_mlp_training_step_is_its_hand_count() -> None:
    prog = compile_graph(paper_mlp(), batch_size=B, optimizer=Adam(lr=1e-3))
    f = prog.flops
    assert f.batch_size == B and f.paths == ("train", "eval")
    assert f.forward["train"] == hand_forward(B)
    assert f.backward["train"] == hand_backward(B)
    assert f.update == f.updates["train"] == 10 * PARAMS  # Adam: 10 per parameter
    assert f.train_step() == f.train_step("train") == \
        hand_forward(B) + hand_backward(B) + 10 * PARAMS
    # eval reads train's logits: its own forward is the accuracy (arg-max, compare, count)
    assert f.forward["eval"] == B * (10 + 2) and f.backward["eval"] == f.updates["eval"] == 0
    assert f.per_row("train") == hand_forward(B) / B
    assert f.per_row(1) == 12.0


def test_another_batch_has_its_own_counts() -> None:
    prog = compile_graph(paper_mlp(), batch_size=10, optimizer=SGD(lr=0.1))
    f = prog.flops
    assert f.forward["train"] == hand_forward(10)
    assert f.backward["train"] == hand_backward(10)
    assert f.update == 2 * PARAMS  # plain SGD: lr * g, p -= that
    assert f.per_row("train") == hand_forward(10) / 10


def test_inference_program_counts_per_row() -> None:
    prog = compile_graph(paper_mlp(train=False), batch_size=1)
    f = prog.flops
    # the dense layers, the sigmoids and the softmax (5 per class); no update
    per_row = 2 * (784 * 64 + 64 * 64 + 64 * 10) + (64 + 64 + 10) + 128 + 5 * 10
    assert f.per_row("infer") == per_row and f.update == 0
    assert f.train_step("infer") == per_row  # forward only: no backward, no update


def test_a_stack_counts_each_models_work() -> None:
    """K models stacked: K times one model's step, plus the K losses summed into the
    one seed the stack's backward starts from."""
    k = 3
    single = compile_graph(paper_mlp(), batch_size=B, optimizer=Adam(lr=1e-3)).flops
    stack = compile_graph(stack_graphs([paper_mlp()] * k), batch_size=B,
                          optimizer=stack_optimizers([Adam(lr=lr) for lr in (1e-3, 1e-2, 0.1)])
                          ).flops
    assert stack.forward["train"] == k * single.forward["train"] + k
    assert stack.backward["train"] == k * single.backward["train"]
    assert stack.update == k * single.update  # per-model rates: the same arithmetic
    assert stack.forward["eval"] == k * single.forward["eval"]


def test_a_stacks_products_are_k_models_products() -> None:
    k, batch = 4, 8
    prog = compile_graph(stack_graphs([paper_mlp((5, 7, 3))] * k), batch_size=batch,
                         optimizer=stack_optimizers([SGD(lr=0.1)] * k))
    # the product instructions alone, as a path of their own
    gemms = tuple(n for n, i in enumerate(prog.instrs) if i.op.startswith("StackedGemm"))
    only = dataclasses.replace(prog, paths=(dataclasses.replace(
        prog.paths[0], name="products", forward=gemms, backward=(), seed=None),))
    # one model: both layers forward and their weight gradients, layer 2's input
    # gradient (the data's is never computed); the stack adds each model's biases
    one_model = 2 * 2 * batch * (5 * 7 + 7 * 3) + 2 * batch * 7 * 3
    assert program_flops(only).forward["products"] == k * one_model + k * batch * (7 + 3)


def test_fusing_changes_no_count() -> None:
    """Gemm + activation fused, DequantizeLinear into the Gemm: the model's FLOPs stay."""
    fused = compile_graph(paper_mlp(), batch_size=16, optimizer=Adam())
    plain = compile_graph(paper_mlp(), batch_size=16, optimizer=Adam(), passes=())
    assert {i.op for i in fused.instrs} != {i.op for i in plain.instrs}
    assert fused.flops == plain.flops

    def quantized() -> CalcGraph:
        g = CalcGraph()
        x = g.placeholder("x", (0, 12), dtype="uint8")
        y = g.placeholder("y", (0,), dtype="int64")
        w = g.parameter("w", (12, 5), init=Init.zeros())
        b = g.parameter("b", (5,), init=Init.zeros())
        p = g.path("train", Mode.BACKWARD_ENABLED)
        z = p.Relu(p.Gemm(p.DequantizeLinear(x, scale=0.25, zero_point=3), w, b))
        loss, _ = p.SoftmaxCrossEntropyLoss(z, y, outputs=["loss", "lp"])
        p.set_loss(loss)
        return g

    fused = compile_graph(quantized(), batch_size=16, optimizer=SGD(lr=0.1))
    plain = compile_graph(quantized(), batch_size=16, optimizer=SGD(lr=0.1), passes=())
    assert "DequantizeGemm" in {i.op for i in fused.instrs}
    assert fused.flops == plain.flops


@pytest.mark.parametrize(("opt", "per"), [
    (SGD(lr=0.1), 2), (SGD(lr=0.1, momentum=0.9), 4), (SGD(lr=0.1, momentum=0.9, nesterov=True), 6),
    (SGD(lr=0.1, weight_decay=1e-4), 4), (Adam(), 10), (Adam(weight_decay=1e-4), 12),
    (AdamW(), 11), (AdamW(weight_decay=0.0), 10), (RMSProp(), 8), (RMSProp(momentum=0.9), 10),
    (Adagrad(), 7),
])
def test_update_per_parameter_element(opt: object, per: int) -> None:
    assert update_flops_per_element(opt) == per  # type: ignore[arg-type]
    prog = compile_graph(paper_mlp((4, 6, 3)), batch_size=8, optimizer=opt)  # type: ignore[arg-type]
    assert prog.flops.update == per * (4 * 6 + 6 + 6 * 3 + 3)


def test_regularization_and_frozen_parameters() -> None:
    g = CalcGraph()
    x = g.placeholder("x", (0, 4))
    w = g.parameter("w", (4, 3), init=Init.zeros(), regularization=Regularization.l1(1e-3))
    v = g.parameter("v", (3, 2), init=Init.zeros(), regularization=Regularization.l2(1e-3))
    frozen = g.constant([1.0, 2.0], shape=(2,), name="c")
    p = g.path("fit", Mode.BACKWARD_ENABLED)
    out = p.Add(p.MatMul(p.MatMul(x, w), v), frozen)
    p.set_loss(p.ReduceSum(p.Mul(out, out), keepdims=0))
    prog = compile_graph(g, batch_size=5, optimizer=SGD(lr=0.1))
    # SGD 2 per element; L1 adds 3 (sign, scale, add), L2 2; the constant is not learned
    assert prog.flops.update == (2 + 3) * 12 + (2 + 2) * 6


def test_json_round_trip_and_the_program_keeps_one_count() -> None:
    prog = compile_graph(paper_mlp(), batch_size=B, optimizer=Adam())
    f = prog.flops
    assert prog.flops is f  # counted once
    assert ProgramFlops.from_dict(json.loads(json.dumps(f.to_dict()))) == f
    assert Program.from_json(prog.to_json()).flops == f
    with pytest.raises(KeyError, match="no path named 'valid'"):
        f.per_row("valid")
    with pytest.raises(IndexError, match="no path 2"):
        f.train_step(2)


def test_an_op_without_a_rule_is_named() -> None:
    prog = compile_graph(paper_mlp((4, 6, 3)), batch_size=8, optimizer=SGD(lr=0.1))
    bad = dataclasses.replace(prog, instrs=(dataclasses.replace(prog.instrs[0], op="Nope"),
                                            *prog.instrs[1:]))
    with pytest.raises(EngineError, match=r"instruction 0 \(Nope\): no such op"):
        program_flops(bad)
    # a program written without the attributes at their defaults is counted with them
    bare = dataclasses.replace(prog, instrs=tuple(dataclasses.replace(i, attrs={
        k: v for k, v in i.attrs.items() if OP_TABLE[i.op].attrs.get(k, ...) != v})
        for i in prog.instrs))
    assert any(not i.attrs for i in bare.instrs if i.op == "Gemm")
    assert program_flops(bare) == prog.flops


def test_an_unknown_optimizer_is_named() -> None:
    @dataclasses.dataclass(frozen=True)
    class Lion(Optimizer):
        pass

    with pytest.raises(EngineError, match="optimizer Lion"):
        update_flops_per_element(Lion())


def test_ten_thousand_instructions_are_counted_quickly() -> None:
    """The target is well under 50 ms; the bound leaves room for a loaded machine."""
    prog = compile_graph(paper_mlp(), batch_size=B, optimizer=Adam())
    copies = 10_000 // len(prog.instrs) + 1
    big = dataclasses.replace(prog, instrs=prog.instrs * copies, paths=(dataclasses.replace(
        prog.paths[0], forward=tuple(range(len(prog.instrs) * copies)), backward=()),))
    best = min(_timed(big) for _ in range(3))
    assert best < 0.2, f"{len(big.instrs)} instructions took {best * 1e3:.0f} ms"
    assert big.flops.forward["train"] == copies * (prog.flops.forward["train"] +
                                                   prog.flops.backward["train"] +
                                                   prog.flops.forward["eval"])


def _timed(prog: Program) -> float:
    t0 = time.perf_counter()
    program_flops(prog)
    return time.perf_counter() - t0
