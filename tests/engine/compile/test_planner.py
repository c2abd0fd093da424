"""The memory planner: sharing by lifetime, in place, what stays readable, the plan
report, and exact bytes."""

from __future__ import annotations

import numpy as np
import pytest

from engine import SGD, VM, Adam, CalcGraph, EngineError, Init, InputError, Mode, compile_graph
from engine.alignment import ALIGN
from engine.models import branching_graph, chain_graph, deep_mlp, paper_mlp
from tests.planverify import assert_no_clobber, lifetimes

MODELS = {
    "paper_mlp": lambda: paper_mlp((20, 16, 16, 4), dropout=0.2),
    "deep_mlp": lambda: deep_mlp(depth=5, width=16, n_in=20, n_out=4),
    "branching": lambda: branching_graph(nodes=61, width=8, train=True),
    "chain": lambda: chain_graph(nodes=50, width=16),
}


def _chain(op: str, n: int, mode: Mode = Mode.FORWARD_ONLY) -> CalcGraph:
    g = CalcGraph()
    h = g.placeholder("x", (0, 16))
    w = g.parameter("w", (16, 16), init=Init.normal())
    p = g.path("f", mode)
    for _ in range(n):
        h = p.MatMul(h, w) if op == "MatMul" else p.op(op, h)
    if mode is Mode.BACKWARD_ENABLED:
        p.set_loss(p.ReduceSum(h, keepdims=0))
    return g


def _arena(prog, zone: str) -> int:  # bytes of the zone's shared part
    return prog.zone_bytes[zone] - sum(
        -(-b.desc.nbytes(prog.batch_size) // ALIGN) * ALIGN
        for b in prog.buffers if b.zone == zone and not b.shared)


@pytest.mark.parametrize("sharing", ["auto", "best_fit", "greedy_by_size"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_no_two_live_buffers_share_bytes(name: str, sharing: str) -> None:
    opt = Adam() if name != "chain" else None
    prog = compile_graph(MODELS[name](), batch_size=8, optimizer=opt, sharing=sharing)
    assert assert_no_clobber(prog) > 0  # it shares, and safely
    for z, st in prog.memory.items():
        assert st["planned"] == prog.zone_bytes[z]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_allocated_is_predicted_with_sharing(name: str) -> None:
    opt = Adam() if name != "chain" else None
    for batch in (1, 7, 64):
        prog = compile_graph(MODELS[name](), batch_size=batch, optimizer=opt)
        vm = VM(prog)
        assert vm.heap.allocated_bytes == prog.total_bytes == sum(prog.zone_bytes.values())
        for z in prog.zone_bytes:
            assert vm.heap.capacity(z) == prog.zone_bytes[z]


def test_a_forward_chain_keeps_two_activation_buffers() -> None:
    prog = compile_graph(_chain("MatMul", 12), batch_size=4, passes=())
    assert _arena(prog, "forward") == 2 * 4 * 16 * 4


def test_an_elementwise_chain_runs_in_place_in_one_buffer() -> None:
    prog = compile_graph(_chain("Tanh", 12), batch_size=4, passes=())
    assert _arena(prog, "forward") == 4 * 16 * 4
    st = prog.memory["forward"]
    # the bound is over the pieces the plan packs: the chain's one piece, optimal
    assert st["planned"] == st["lower_bound"]


def test_training_keeps_exactly_what_the_gradients_read() -> None:
    # MatMul outputs are not read by any gradient (Sigmoid's reads its output), so
    # they die in the forward program; Sigmoid outputs live until the backward.
    prog = compile_graph(_chain_mix(), batch_size=4, passes=(), optimizer=SGD(lr=0.1))
    live = lifetimes(prog)
    pc = prog.paths[0]
    turn = len(pc.forward)  # schedule position of the first backward instruction
    read_by_backward = {j for k in pc.backward for j in prog.instrs[k].ins}
    alive = {j for j, (s, e) in live.items() if prog.buffers[j].zone == "forward"
             and prog.buffers[j].shared and s < turn <= e}
    assert alive == {j for j in read_by_backward if prog.buffers[j].shared
                     and prog.buffers[j].zone == "forward"}
    assert {prog.buffers[j].name.split("_")[0] for j in alive} == {"sigmoid"}


def _chain_mix() -> CalcGraph:
    g = CalcGraph()
    h = g.placeholder("x", (0, 16))
    p = g.path("train", Mode.BACKWARD_ENABLED)
    for i in range(4):
        h = p.Sigmoid(p.MatMul(h, g.parameter(f"w{i}", (16, 16))))
    p.set_loss(p.ReduceSum(h, keepdims=0))
    return g


def test_gradient_temporaries_share_the_gradient_zone() -> None:
    prog = compile_graph(deep_mlp(depth=8, width=32, n_in=32), batch_size=64, optimizer=SGD())
    st = prog.memory["gradient"]
    assert st["planned"] < st["no_sharing"] / 2
    assert st["planned"] <= st["lower_bound"] * 1.05


def test_without_sharing_every_buffer_has_its_own_bytes() -> None:
    prog = compile_graph(paper_mlp(), batch_size=32, optimizer=Adam(), sharing="none")
    assert not any(b.shared for b in prog.buffers)
    assert assert_no_clobber(prog) == 0
    for st in prog.memory.values():
        assert st["planned"] == st["no_sharing"]


def test_sharing_fits_a_larger_batch_in_the_same_budget() -> None:
    budget = 64 << 20
    plain = compile_graph(paper_mlp(), memory=budget, optimizer=Adam(), sharing="none")
    shared = compile_graph(paper_mlp(), memory=budget, optimizer=Adam())
    assert shared.batch_size > plain.batch_size
    assert shared.total_bytes <= budget
    bigger = compile_graph(paper_mlp(), batch_size=shared.batch_size + 1, optimizer=Adam())
    assert bigger.total_bytes > budget


def test_temporaries_cannot_be_read_back_unless_kept() -> None:
    g = _chain("MatMul", 3)
    vm = VM(compile_graph(g, batch_size=2, passes=()))
    hidden = vm.program.buffers[vm.program.instrs[0].outs[0]].name
    vm.set("x", np.ones((2, 16), np.float32))
    vm.forward()
    with pytest.raises(InputError, match="keep="):
        vm.get(hidden)
    kept = VM(compile_graph(g, batch_size=2, passes=(), keep=[hidden]))
    kept.set("x", np.ones((2, 16), np.float32))
    kept.forward()
    w = kept.get("w")
    np.testing.assert_allclose(kept.get(hidden), np.ones((2, 16)) @ w, rtol=1e-5, atol=1e-7)


def test_keep_must_name_a_variable() -> None:
    with pytest.raises(Exception, match="keep= names 'nope'"):
        compile_graph(_chain("Tanh", 2), batch_size=2, keep=["nope"])


def test_keep_all_shares_nothing_in_the_forward_zone() -> None:
    prog = compile_graph(_chain("Tanh", 5), batch_size=2, keep="all")
    assert not any(b.shared for b in prog.buffers if b.zone == "forward")


def test_backward_must_follow_its_own_forward() -> None:
    vm = VM(compile_graph(paper_mlp((8, 4, 3)), batch_size=4, optimizer=SGD()))
    vm.set("x", np.ones((4, 8), np.float32))
    vm.set("y", np.zeros(4, np.int64))
    with pytest.raises(EngineError, match="needs forward"):
        vm.backward("train")
    vm.forward("train")
    vm.forward("eval")
    vm.apply_loss("train")
    with pytest.raises(EngineError, match="forward\\('eval'\\) ran since"):
        vm.backward("train")
    vm.forward("train")
    vm.backward("train")  # fine again


def test_plan_report_lists_every_zone_and_the_total() -> None:
    prog = compile_graph(paper_mlp(), batch_size=100, optimizer=Adam())
    report = prog.plan_report()
    lines = report.splitlines()
    assert [ln.split()[0] for ln in lines] == ["zone", "forward", "gradient", "optimizer",
                                              "workspace", "total"]
    total = lines[-1].split()
    assert int(total[2].replace(",", "")) == prog.total_bytes
    for st in prog.memory.values():
        assert st["lower_bound"] <= st["planned"] <= st["no_sharing"]
