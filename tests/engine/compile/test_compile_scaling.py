"""What keeps compiling a large graph fast, checked as properties rather than timings
(``bench/planner.py`` measures the time): each pure rule of the op table runs once per
distinct argument set, a gradient rule's emissions are replayed for nodes alike (and
give the program the rule itself would), the planner's batch-independent work is done
once for a max-batch search, the small-item packing agrees with the array one, every
instruction owns its attributes (the emitter hands them over without a copy), and
compiling leaves the cycle collector as it found it."""

from __future__ import annotations

import dataclasses
import gc
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from engine import SGD, Adam, CalcGraph, Init, Mode, compile_graph
from engine.alignment import align_up
from engine.compile import lower, packing, stack_graphs, stack_optimizers
from engine.compile.autodiff import _Builder
from engine.compile.packing import STRATEGIES, Item, best_fit, greedy_by_size, lower_bound, pack
from engine.compile.passes.liveness import Values
from engine.compile.passes.shapes import rule_key
from engine.compile.planner import Planner, plan_memory
from engine.errors import GraphError, ShapeError
from engine.free_list import FreeList
from engine.graph import DType, TensorDesc
from engine.models import branching_graph, deep_mlp, mnist_cnn, paper_mlp
from engine.ops import OP_TABLE, get_op

MODELS: dict[str, Callable[[], CalcGraph]] = {
    "branching": lambda: branching_graph(nodes=301, width=8, train=True),
    "mlp": lambda: paper_mlp((20, 16, 8, 4)),
    "deep_mlp": lambda: deep_mlp(depth=6, width=16, n_in=12, n_out=3),
    "cnn": mnist_cnn,
}


def _counting(monkeypatch: pytest.MonkeyPatch, op: str, rule: str) -> list[int]:
    """Replace ``op``'s ``rule`` (``shape``, ``workspace`` or ``grad``) by one that
    counts calls."""
    calls: list[int] = []
    real = getattr(OP_TABLE[op], rule)

    def counted(*args: Any) -> Any:
        calls.append(1)
        return real(*args)

    monkeypatch.setitem(OP_TABLE, op, dataclasses.replace(OP_TABLE[op], **{rule: counted}))
    return calls


def test_each_shape_rule_runs_once_per_distinct_arguments(
        monkeypatch: pytest.MonkeyPatch) -> None:
    adds = _counting(monkeypatch, "Add", "shape")
    gemms = _counting(monkeypatch, "Gemm", "shape")
    prog = compile_graph(branching_graph(nodes=601, width=8, train=True), batch_size=4,
                         optimizer=SGD(lr=0.1))
    n_add = sum(i.op == "Add" for i in prog.instrs)
    n_gemm = sum(i.op == "Gemm" for i in prog.instrs)
    assert n_add > 300 and n_gemm > 300
    # a handful of distinct (inputs, attributes): the 8 shared weights' gradients,
    # the activations and their sums
    assert len(adds) <= 12 and len(gemms) <= 20, (len(adds), len(gemms))


def test_a_memoised_rule_still_rejects_what_it_rejects() -> None:
    g = CalcGraph()
    x = g.placeholder("x", (0, 4))
    y = g.placeholder("y", (0, 3))
    p = g.path("f", Mode.FORWARD_ONLY)
    p.Add(x, x)
    p.Add(x, x)  # the same arguments: served from the memo
    p.Add(x, y)  # others: the rule runs, and fails
    with pytest.raises(ShapeError, match=r"op #2 'Add'"):
        compile_graph(g, batch_size=2)


def test_rule_keys_tell_equal_values_of_other_types_apart() -> None:
    d = TensorDesc(DType.FLOAT32, (0, 4))
    same = TensorDesc(DType.FLOAT32, (0, 4))  # equal, another object: another key
    keys = {rule_key("Gemm", [d], {"alpha": v}) for v in (1, 1.0, True)}
    assert len(keys) == 3
    assert rule_key("Gemm", [d], {"alpha": 1}) == rule_key("Gemm", [d], {"alpha": 1})
    assert rule_key("Add", [d, d], {}) != rule_key("Add", [same, d], {})
    assert rule_key("Add", [d], {}, 1) != rule_key("Add", [d], {}, 2)
    for value in ((1, 2), [1, 2], {"a": 1}):  # could hide 1 vs 1.0, or unhashable
        assert rule_key("Reshape", [d], {"shape": value}) is None


def test_the_ir_holds_one_object_per_distinct_descriptor() -> None:
    ir = lower(branching_graph(nodes=301, width=8, train=True), SGD(lr=0.1))
    by_value: dict[TensorDesc, set[int]] = {}
    for d in ir.descs.values():
        by_value.setdefault(d, set()).add(id(d))
    assert all(len(ids) == 1 for ids in by_value.values())
    assert len(by_value) < 10 < len(ir.descs)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_each_instruction_has_the_workspace_its_rule_gives(name: str) -> None:
    """The planner asks each group of alike instructions once; every member must get
    what its op's rule says for it alone (plus a sink's scratch for accumulation)."""
    prog = compile_graph(MODELS[name](), batch_size=5, optimizer=Adam())
    descs = [b.desc.at_batch(prog.batch_size) for b in prog.buffers]
    for ins in prog.instrs:
        op = get_op(ins.op)
        need = align_up(op.workspace([descs[i] for i in ins.ins], [descs[i] for i in ins.outs],
                                     ins.attrs, "cpu"))
        if ins.param_sink is not None:
            grad = prog.params[ins.param_sink].grad
            assert grad is not None
            need += align_up(descs[grad].nbytes())
        assert ins.workspace == need, ins


@pytest.mark.parametrize("sharing", ["auto", "best_fit", "greedy_by_size", "none"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_one_planner_plans_every_batch_as_a_fresh_one_would(name: str, sharing: str) -> None:
    ir = lower(MODELS[name](), Adam())
    planner = Planner(ir, Adam(), "cpu", sharing)
    for batch in (1, 2, 7, 64, 3):
        assert planner.plan(batch) == plan_memory(ir, batch, Adam(), "cpu", sharing)


def test_the_workspace_rule_runs_once_per_group_in_a_max_batch_search(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting(monkeypatch, "Gemm", "workspace")
    plans: list[int] = []
    plan = Planner.plan
    monkeypatch.setattr(Planner, "plan", lambda self, b: plans.append(b) or plan(self, b))
    prog = compile_graph(branching_graph(nodes=301, width=8, train=True), memory=1 << 22,
                         optimizer=SGD(lr=0.1))
    n_gemm = sum(i.op == "Gemm" for i in prog.instrs)
    assert n_gemm > 150 and len(plans) > 10
    assert len(calls) <= 8 * len(plans), (len(calls), len(plans), n_gemm)  # not n_gemm x


def _random_items(r: random.Random, n: int, sizes: list[int]) -> Iterator[Item]:
    for _ in range(n):
        s = r.randint(0, 20)
        yield s, s + r.randint(0, 8), r.choice(sizes)


def test_greedy_by_size_on_lists_agrees_with_the_array_version(
        monkeypatch: pytest.MonkeyPatch) -> None:
    r = random.Random(35)
    cases = [list(_random_items(r, r.randint(1, packing.SMALL),
                                [0, 64, 128, 192, 64 * r.randint(1, 16)]))
             for _ in range(400)]
    small = [greedy_by_size(items) for items in cases]
    monkeypatch.setattr(packing, "SMALL", 0)  # the arrays for every size
    assert small == [greedy_by_size(items) for items in cases]


def _best_fit_reference(items: list[Item]) -> tuple[list[int], int]:
    """Best fit as first written: births by (start, larger first, index), deaths by
    (end, index), births at an instruction before its deaths."""
    n = len(items)
    offsets = [0] * n
    born = sorted(range(n), key=lambda i: (items[i][0], -items[i][2], i))
    dies = sorted(range(n), key=lambda i: (items[i][1], i))
    free, top, b, d = FreeList(), 0, 0, 0
    while d < n:
        if b < n and items[born[b]][0] <= items[dies[d]][1]:
            i, b = born[b], b + 1
            fit, last = free.best_fit(items[i][2]), free.last()
            if fit is not None:
                free.take(fit[0], items[i][2])
                offsets[i] = fit[0]
            elif last is not None and last[0] + last[1] == top:
                free.take(*last)
                offsets[i], top = last[0], last[0] + items[i][2]
            else:
                offsets[i], top = top, top + items[i][2]
        else:
            i, d = dies[d], d + 1
            free.release(offsets[i], items[i][2])
    return offsets, top


def test_best_fit_places_as_its_definition_says() -> None:
    r = random.Random(53)
    for _ in range(500):
        items = list(_random_items(r, r.randint(0, 60), [64, 128, 64 * r.randint(1, 9)]))
        assert best_fit(items) == _best_fit_reference(items)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_instruction_owns_its_attributes(name: str) -> None:
    prog = compile_graph(MODELS[name](), batch_size=3, optimizer=Adam())
    assert len({id(i.attrs) for i in prog.instrs}) == len(prog.instrs)


def _varied(repeats: int = 4) -> CalcGraph:
    """A training graph whose block repeats: gradients of equal inputs (x * x) and of
    distinct ones, one whose gradient op has three outputs, attributes that differ
    (transB) and ones that are tuples, a weight shared by every block."""
    g = CalcGraph(name="varied")
    x, t = g.placeholder("x", (0, 8)), g.placeholder("t", (0, 8))
    w = g.parameter("w", (8, 8), init=Init.normal(0.0, 0.3))
    v = g.parameter("v", (8, 8), init=Init.normal(0.0, 0.3))
    b = g.parameter("b", (8,), init=Init.zeros())
    s = g.parameter("s", (8,), init=Init.ones())
    p = g.path("train", Mode.BACKWARD_ENABLED)
    h = x
    for i in range(repeats):
        a = p.Gemm(h, w, b, transB=i % 2)
        m = p.Mul(p.Mul(a, a), p.Sigmoid(p.MatMul(h, v)))
        n = p.LayerNormalization(m, s, b, epsilon=1e-5)
        d = p.Div(n, p.Add(p.Exp(p.Neg(h)), s))
        h = p.Add(h, p.Reshape(p.Reshape(p.Tanh(d), shape=(0, 2, 4)), shape=(0, 8)))
        h = p.Sub(h, p.ReduceMean(h, axes=(1,), keepdims=1))
    p.set_loss(p.MSELoss(h, t))
    return g


def _stack() -> CalcGraph:
    return stack_graphs([paper_mlp((20, 16, 8, 4), activation="Tanh") for _ in range(3)])


REPLAYED: dict[str, tuple[Callable[[], CalcGraph], Callable[[], Any]]] = {
    "varied": (_varied, lambda: Adam(lr=1e-3)),
    "branching": (lambda: branching_graph(nodes=121, width=8, train=True), SGD),
    "mlp": (lambda: paper_mlp((20, 16, 8, 4)), SGD),
    "cnn": (mnist_cnn, lambda: SGD(lr=0.1, momentum=0.9)),
    "stack": (_stack, lambda: stack_optimizers([SGD(lr=0.1 * (k + 1)) for k in range(3)])),
}


def _replays(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = _Builder._replay

    def counted(self: _Builder, *args: Any) -> Any:
        calls.append(1)
        return real(self, *args)

    monkeypatch.setattr(_Builder, "_replay", counted)
    return calls


@pytest.mark.parametrize("name", sorted(REPLAYED))
def test_replayed_gradients_are_what_the_rules_emit(monkeypatch: pytest.MonkeyPatch,
                                                     name: str) -> None:
    make, opt = REPLAYED[name]
    replays = _replays(monkeypatch)
    replayed = compile_graph(make(), batch_size=4, optimizer=opt()).to_json()
    if name in ("varied", "branching"):
        assert replays
    monkeypatch.setattr(_Builder, "_tape", lambda self, names, grads: None)  # never replay
    replays.clear()
    asked = compile_graph(make(), batch_size=4, optimizer=opt()).to_json()
    assert not replays
    assert replayed == asked


def test_a_gradient_rule_runs_a_handful_of_times_on_a_large_graph(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting(monkeypatch, "FusedGemm", "grad")
    prog = compile_graph(branching_graph(nodes=601, width=8, train=True), batch_size=4,
                         optimizer=SGD(lr=0.1))
    n_fused = sum(i.op == "FusedGemm" for i in prog.instrs)
    assert n_fused > 150
    # two kinds of FusedGemm (Relu with a bias, Tanh without), and the first block's
    # (its input is the data: no gradient flows back into it): asked twice each
    assert len(calls) <= 6, (len(calls), n_fused)


def _tanh_chain(n: int = 6) -> CalcGraph:
    g = CalcGraph(name="tanh_chain")
    h = g.placeholder("x", (0, 8))
    s = g.parameter("s", (8,), init=Init.ones())
    p = g.path("train", Mode.BACKWARD_ENABLED)
    for _ in range(n):
        h = p.Tanh(p.Mul(h, s))
    p.set_loss(p.ReduceSum(h, keepdims=0))
    return g


def test_a_rule_reading_a_value_outside_its_node_is_asked_every_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A rule whose emissions name a value that is neither its node's, a constant nor
    one it made (here the parameter "s", by name) cannot be replayed: it is asked for
    every node, and the program is the same."""
    real = OP_TABLE["Tanh"].grad
    assert callable(real)

    def rule(gb: Any, n: Any, g: list[str | None]) -> list[str | None]:
        dx = real(gb, n, g)[0]
        assert dx is not None
        return [gb.op("Add", dx, gb.op("Mul", dx, gb.op("ReduceMean", "s")))]

    monkeypatch.setitem(OP_TABLE, "Tanh", dataclasses.replace(OP_TABLE["Tanh"], grad=rule))
    calls = _counting(monkeypatch, "Tanh", "grad")
    replayed = compile_graph(_tanh_chain(), batch_size=2, optimizer=SGD()).to_json()
    assert len(calls) == 6
    monkeypatch.setattr(_Builder, "_tape", lambda self, names, grads: None)
    assert compile_graph(_tanh_chain(), batch_size=2, optimizer=SGD()).to_json() == replayed


def test_a_rule_is_replayed_from_the_third_alike_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """Asked for the first (a graph without repeats records nothing), recorded on the
    second, replayed for the rest."""
    calls = _counting(monkeypatch, "Tanh", "grad")
    replays = _replays(monkeypatch)
    compile_graph(_tanh_chain(), batch_size=2, optimizer=SGD())
    assert len(calls) == 2 and len(replays) >= 4


def test_values_are_numbered_in_zone_order_and_operands_map_back() -> None:
    ir = lower(_varied(), Adam())
    values = Values.of(ir)
    assert values.names == [n for n in ir.zone if n in ir.descs]
    assert [values.number[n] for n in values.names] == list(range(len(values.names)))
    assert values.nodes == ir.nodes()
    for node, ins, outs in zip(values.nodes, values.ins, values.outs, strict=True):
        assert tuple(values.names[v] for v in ins) == node.inputs
        assert tuple(values.names[v] for v in outs) == node.outputs
        assert all(values.desc[v] is ir.descs[x] for v, x in zip(ins, node.inputs,
                                                                  strict=True))


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_pack_gives_the_strategys_packing_and_the_lower_bound(strategy: str) -> None:
    r = random.Random(7)
    for _ in range(300):
        items = list(_random_items(r, r.randint(0, 40), [64, 128, 64 * r.randint(1, 9)]))
        assert pack(strategy, items) == (*STRATEGIES[strategy](items), lower_bound(items))


def test_compiling_leaves_the_collector_as_it_found_it() -> None:
    was = gc.isenabled()
    try:
        gc.enable()
        prog = compile_graph(paper_mlp((20, 16, 8, 4)), batch_size=4, optimizer=Adam())
        assert gc.isenabled()
        # what it made went straight to the oldest generation, where full collections
        # still see it
        oldest = {id(o) for o in gc.get_objects(generation=2)}
        assert id(prog.instrs[0]) in oldest and id(prog.buffers[0]) in oldest
        gc.disable()
        compile_graph(paper_mlp((20, 16, 8, 4)), batch_size=4)
        assert not gc.isenabled()
        gc.enable()
        with pytest.raises(GraphError):
            compile_graph(CalcGraph(), batch_size=4)  # no path
        assert gc.isenabled()
        gc.freeze()  # the caller's frozen objects stay frozen
        try:
            frozen = gc.get_freeze_count()
            compile_graph(paper_mlp((20, 16, 8, 4)), batch_size=4)
            assert gc.get_freeze_count() == frozen > 0
        finally:
            gc.unfreeze()
    finally:
        (gc.enable if was else gc.disable)()
