"""The graph optimisations, one by one, and the pass list as data."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from engine import VM, CalcGraph, CompileError, Init, ShapeError, compile_graph, lower
from engine.compile.dot import to_dot
from engine.compile.passes.fold import FOLD_LIMIT
from engine.compile.passes.ir import IR
from engine.compile.passes.pipeline import DEFAULT_PASSES, PASSES, Pass
from engine.models import paper_mlp

R = np.random.default_rng(5)


def ops(g: CalcGraph, passes: list[str] | None = None) -> list[str]:
    return [i.op for i in compile_graph(g, batch_size=3, passes=passes).instrs]


def outputs(g: CalcGraph, passes: list[str] | None) -> dict[str, np.ndarray]:
    vm = VM(compile_graph(g, batch_size=3, passes=passes), seed=2)
    for b in vm.program.buffers:
        if b.kind == "placeholder":
            vm.set(b.name, R.normal(size=b.desc.at_batch(3).shape).astype(b.dtype))
    for p in vm.program.paths:
        vm.forward(p.name)
    return {n: vm.get(n) for n in g.outputs}


def same_results(g: CalcGraph, passes: list[str] | None = None) -> None:
    R2 = np.random.default_rng(9)
    global R
    R, saved = R2, R
    a = outputs(g, passes)
    R = np.random.default_rng(9)
    b = outputs(g, [])
    R = saved
    assert a.keys() == b.keys() and a
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-6, atol=1e-7, err_msg=k)


def graph(build: Callable[[CalcGraph, object, object], object], shape=(0, 4)) -> CalcGraph:
    g = CalcGraph()
    x = g.placeholder("x", shape)
    p = g.path("f")
    g.output(build(g, p, x))
    return g


# -- dead code -------------------------------------------------------------------------

def test_dce_drops_what_no_output_needs() -> None:
    g = graph(lambda g, p, x: (p.Exp(x), p.Tanh(x))[1])
    assert ops(g) == ["Tanh"]
    assert ops(g, []) == ["Exp", "Tanh"]


def test_without_declared_outputs_every_leaf_is_kept() -> None:
    g = CalcGraph()
    x = g.placeholder("x", (0, 4))
    p = g.path("f")
    p.Exp(x), p.Tanh(x)
    assert ops(g) == ["Exp", "Tanh"]


# -- constant folding -----------------------------------------------------------------

def test_constants_fold_and_leave_no_trace() -> None:
    def build(g, p, x):
        c = p.Mul(g.constant([1.0, 2.0, 3.0, 4.0]), g.constant(2.0))
        return p.Add(x, p.Exp(c))
    g = graph(build)
    prog = compile_graph(g, batch_size=3)
    assert [i.op for i in prog.instrs] == ["Add"]
    assert not any(b.name.startswith("const") for b in prog.buffers)  # inputs dropped
    same_results(g)


def test_folding_respects_its_limit_and_purity() -> None:
    big = graph(lambda g, p, x: p.Add(x, p.Exp(g.constant(0.5, shape=(FOLD_LIMIT + 1,)))),
                shape=(0, FOLD_LIMIT + 1))
    assert ops(big) == ["Exp", "Add"]
    drop = graph(lambda g, p, x: p.Add(x, p.Dropout(g.constant(1.0, shape=(4,)), ratio=0.5,
                                                    training=1)))
    assert "Dropout" in ops(drop)


# -- algebraic no-ops -----------------------------------------------------------------

@pytest.mark.parametrize("build", [
    lambda g, p, x: p.Tanh(p.Add(x, g.constant(0.0))),
    lambda g, p, x: p.Tanh(p.Add(g.constant(0.0), x)),
    lambda g, p, x: p.Tanh(p.Sub(x, g.constant(0.0, shape=(4,)))),
    lambda g, p, x: p.Tanh(p.Mul(g.constant(1.0), x)),
    lambda g, p, x: p.Tanh(p.Div(x, g.constant(1.0))),
    lambda g, p, x: p.Tanh(p.Identity(x)),
    lambda g, p, x: p.Tanh(p.Reshape(x, shape=(0, 4))),
    lambda g, p, x: p.Tanh(p.Flatten(p.Reshape(x, shape=(0, 2, 2)))),
    lambda g, p, x: p.Tanh(p.Transpose(p.Transpose(x, perm=(0, 1)), perm=(0, 1))),
], ids=["x+0", "0+x", "x-0", "1*x", "x/1", "identity", "reshape", "reshape-pair", "perm-id"])
def test_no_ops_disappear(build) -> None:
    g = graph(build)
    assert ops(g) == ["Tanh"]
    same_results(g)


def test_transposes_compose_and_cancel() -> None:
    g = graph(lambda g, p, x: p.Tanh(p.Transpose(p.Transpose(x, perm=(0, 2, 1)),
                                                 perm=(0, 2, 1))), shape=(0, 2, 3))
    assert ops(g) == ["Tanh"]
    g = graph(lambda g, p, x: p.Tanh(p.Transpose(p.Transpose(x, perm=(0, 2, 3, 1)),
                                                 perm=(0, 2, 3, 1))), shape=(0, 2, 3, 4))
    prog = compile_graph(g, batch_size=3)
    assert [(i.op, i.attrs.get("perm")) for i in prog.instrs] == \
        [("Transpose", (0, 3, 1, 2)), ("Tanh", None)]
    same_results(g)


def test_no_op_that_changes_the_shape_stays() -> None:
    g = graph(lambda g, p, x: p.Tanh(p.Add(x, g.constant(0.0, shape=(2, 4)))),
              shape=(4,))  # broadcasting makes it [2, 4]: not x
    assert "Add" in ops(g, ["simplify"])


def test_a_value_the_user_reads_is_never_simplified_away() -> None:
    g = CalcGraph()
    x = g.placeholder("x", (0, 4))
    p = g.path("f")
    same = p.Mul(x, g.constant(1.0))
    g.output(same, p.Tanh(same))
    assert ops(g) == ["Mul", "Tanh"]


# -- common subexpressions --------------------------------------------------------------

def test_cse_merges_equal_pure_nodes_only() -> None:
    g = graph(lambda g, p, x: p.Add(p.Mul(p.Exp(x), p.Exp(x)), p.Exp(x)))
    assert ops(g) == ["Exp", "Mul", "Add"]
    same_results(g)
    g = graph(lambda g, p, x: p.Add(p.Softmax(x, axis=1), p.Softmax(x, axis=0)))
    assert ops(g).count("Softmax") == 2
    g = graph(lambda g, p, x: p.Add(p.Dropout(x, ratio=0.5, training=1),
                                    p.Dropout(x, ratio=0.5, training=1)))
    assert ops(g).count("Dropout") == 2


def test_cse_stays_inside_a_path() -> None:
    g = CalcGraph()
    x = g.placeholder("x", (0, 4))
    a, b = g.path("a"), g.path("b")
    g.output(a.Exp(x), b.Exp(x))
    assert ops(g) == ["Exp", "Exp"]


# -- fusion ---------------------------------------------------------------------------

def _linear(act: str | None, bias_first: bool = False, extra_reader: bool = False,
            rank3: bool = False) -> CalcGraph:
    g = CalcGraph()
    x = g.placeholder("x", (0, 2, 4) if rank3 else (0, 4))
    w = g.parameter("w", (4, 5), init=Init.normal())
    b = g.parameter("b", (5,), init=Init.normal())
    p = g.path("f")
    m = p.MatMul(x, w)
    h = p.Add(b, m) if bias_first else p.Add(m, b)
    y = p.op(act, h) if act else h
    g.output(y)
    if extra_reader:
        g.output(p.Exp(m))
    return g


@pytest.mark.parametrize("bias_first", [False, True])
def test_matmul_and_bias_fuse_into_gemm(bias_first: bool) -> None:
    g = _linear(None, bias_first)
    assert ops(g) == ["Gemm"]
    same_results(g)


def test_fusion_needs_a_private_2d_intermediate() -> None:
    assert ops(_linear(None, extra_reader=True)) == ["MatMul", "Add", "Exp"]
    assert ops(_linear(None, rank3=True)) == ["MatMul", "Add"]


@pytest.mark.parametrize("act", ["Relu", "Sigmoid", "Tanh"])
def test_gemm_and_activation_fuse(act: str) -> None:
    g = _linear(act)
    prog = compile_graph(g, batch_size=3)
    assert [(i.op, i.attrs.get("activation")) for i in prog.instrs] == [("FusedGemm", act)]
    same_results(g)


def test_an_activation_that_needs_its_input_is_not_fused() -> None:
    assert ops(_linear("LeakyRelu")) == ["Gemm", "LeakyRelu"]


def test_fusion_can_be_switched_off() -> None:
    no_fuse = [p for p in DEFAULT_PASSES if not p.startswith("fuse")]
    assert ops(_linear("Relu"), no_fuse) == ["MatMul", "Add", "Relu"]
    assert ops(_linear("Relu"), ["fuse_gemm"]) == ["Gemm", "Relu"]


def test_fused_training_matches_unfused() -> None:
    from tests.engine.compile.test_sharing_identical import _train

    fused, plain = _train("deep_mlp", "auto"), _train("deep_mlp", "auto", passes=[])
    for k in fused.keys() & plain.keys():
        np.testing.assert_allclose(fused[k], plain[k], rtol=1e-5, atol=1e-6)


# -- the pipeline -----------------------------------------------------------------------

def test_the_pass_list_is_data() -> None:
    assert set(DEFAULT_PASSES) <= set(PASSES)
    with pytest.raises(CompileError, match=r"unknown pass 'nope'.*dce"):
        compile_graph(_linear("Relu"), batch_size=2, passes=["nope"])
    ir = lower(paper_mlp(), passes=[])
    assert ir.counts["nodes_before"] == ir.counts["nodes_after"] == 7


def test_debug_names_the_pass_that_broke_the_graph() -> None:
    def drop_first(ir: IR) -> IR:
        ir.paths[0].forward.pop(0)
        return ir

    broken = Pass("drop_first", drop_first)
    g = _linear("Relu")
    with pytest.raises(ShapeError, match="after pass 'drop_first'"):
        compile_graph(g, batch_size=2, passes=[broken, "dce"], debug=True)


def test_counts_show_what_the_passes_removed() -> None:
    prog = compile_graph(paper_mlp(), batch_size=2)
    assert prog.counts == {"nodes_before": 7, "nodes_after": 5}  # two FusedGemm


# -- to_dot ---------------------------------------------------------------------------

def test_to_dot_before_and_after() -> None:
    g = paper_mlp((6, 5, 3))
    before = to_dot(g)
    assert before.startswith('digraph "paper_mlp"') and before.rstrip().endswith("}")
    assert "#0 Gemm" in before and "#1 Sigmoid" in before and "FusedGemm" not in before
    prog = compile_graph(g, batch_size=4)
    after = to_dot(prog)
    assert "#0 FusedGemm" in after and "Sigmoid" not in after.split("#1")[0]
    for i, ins in enumerate(prog.instrs):
        assert f"#{i} {ins.op}" in after
        for j in ins.outs:
            b = prog.buffers[j]
            assert f"{b.zone}@{b.offset}" in after
    assert after.count(" -> ") >= len(prog.instrs)
