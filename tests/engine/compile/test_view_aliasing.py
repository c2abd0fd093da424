"""Views (``OpDef.view``: Reshape, Flatten, Squeeze, Unsqueeze) planned in their input's
bytes while the input stays live, and what that must never allow: an in-place write over
bytes a live view still shows.  Every program here passes :mod:`tests.planverify` and
computes, bit for bit, what the same program with every buffer in bytes of its own does."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from engine import VM, Adam, CalcGraph, Mode, compile_graph, nn
from engine.compile.passes import liveness
from engine.nn import layers as L
from engine.ops import OP_TABLE, get_op
from engine.ops._base import KernelArgs
from engine.runtime import vm as vm_module
from engine.runtime.program import Program
from explore import families
from explore.datasets.sequence_shape import SequenceShape
from explore.families import Shape
from tests.engine.nn.harness import sum_loss
from tests.explore.families.test_sequence_families import TRANSFORMER, rows
from tests.planverify import assert_no_clobber, lifetimes

X = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)


def where(prog: Program, name: str) -> tuple[str, int]:
    b = next(b for b in prog.buffers if b.name == name)
    return b.zone, b.offset


def index(prog: Program, name: str) -> int:
    return next(i for i, b in enumerate(prog.buffers) if b.name == name)


def forward(prog: Program, feed: dict[str, np.ndarray], out: str) -> np.ndarray:
    vm = VM(prog)
    vm.feed(feed)
    vm.forward(prog.paths[0].name)
    return vm.get(out)


def compiled(g: CalcGraph, **kw: Any) -> tuple[Program, Program]:
    """``g`` planned with sharing, checked, and without."""
    prog = compile_graph(g, batch_size=4, passes=(), **kw)
    assert_no_clobber(prog)
    return prog, compile_graph(g, batch_size=4, passes=(), sharing="none", **kw)


def test_only_the_pure_reshapes_are_views() -> None:
    assert sorted(n for n, op in OP_TABLE.items() if op.view) == \
        ["Flatten", "Reshape", "Squeeze", "Unsqueeze"]
    assert all(op.inplace == (0,) and op.num_outputs == 1 for op in OP_TABLE.values() if op.view)


def _viewed_then_updated(read_view_late: bool) -> CalcGraph:
    """``a = tanh(x)``, ``v = a`` as [b, 4, 4], then ``b = tanh(a)`` at a's last read:
    in place over ``a`` unless ``v`` is read after it."""
    g = CalcGraph()
    x = g.placeholder("x", (0, 16))
    p = g.path("f")
    a = p.Tanh(x, outputs=["a"])
    v = p.Reshape(a, shape=(0, 4, 4), outputs=["v"])
    if read_view_late:
        b = p.Tanh(a, outputs=["b"])
        out = p.Add(v, p.Reshape(b, shape=(0, 4, 4)), outputs=["out"])
    else:
        s = p.Neg(v, outputs=["s"])
        b = p.Tanh(a, outputs=["b"])
        out = p.Add(s, p.Reshape(b, shape=(0, 4, 4)), outputs=["out"])
    g.output(out)
    return g


class CountingNumpy:
    """numpy for a kernel, its copies counted."""

    def __init__(self) -> None:
        self.copies = 0

    def copyto(self, dst: np.ndarray, src: np.ndarray) -> None:
        self.copies += 1
        np.copyto(dst, src)


VIEWS: dict[str, tuple[tuple[int, ...], tuple[int, ...], dict[str, Any]]] = {
    # op: (input shape, output shape, attributes)
    "Reshape": ((2, 12), (2, 3, 4), {"shape": (2, 3, 4)}),
    "Flatten": ((2, 3, 4), (2, 12), {"axis": 1}),
    "Squeeze": ((2, 1, 12), (2, 12), {"axes": (1,)}),
    "Unsqueeze": ((2, 12), (2, 1, 12), {"axes": (1,)}),
}


@pytest.mark.parametrize("op", sorted(VIEWS))
@pytest.mark.parametrize("aliased", [True, False])
def test_a_view_kernel_copies_only_into_other_bytes(op: str, aliased: bool) -> None:
    shape_in, shape_out, attrs = VIEWS[op]
    heap = np.arange(48, dtype=np.float32)
    x = heap[:24].reshape(shape_in)
    y = heap[:24].reshape(shape_out) if aliased else heap[24:].reshape(shape_out)
    xp = CountingNumpy()
    opdef = get_op(op)
    step = opdef.kernel(KernelArgs(xp, [x], [y], np.zeros(0, np.uint8),
                                   opdef.with_defaults(attrs)))
    step()
    assert xp.copies == (0 if aliased else 1)
    np.testing.assert_array_equal(y, np.arange(24, dtype=np.float32).reshape(shape_out))


def test_a_view_takes_the_bytes_of_an_input_that_stays_live() -> None:
    prog, alone = compiled(_viewed_then_updated(read_view_late=True))
    live = lifetimes(prog)
    a, v = index(prog, "a"), index(prog, "v")
    assert live[a][1] > live[v][0]  # a is read after the view
    assert where(prog, "v") == where(prog, "a")
    np.testing.assert_array_equal(forward(prog, {"x": X}, "out"), forward(alone, {"x": X}, "out"))


@pytest.mark.parametrize("read_view_late", [True, False])
def test_an_in_place_write_waits_for_every_view_of_its_input(read_view_late: bool) -> None:
    """``b`` may go over ``a`` only once ``v``, which shows a's bytes, is read no more."""
    prog, alone = compiled(_viewed_then_updated(read_view_late))
    assert (where(prog, "b") == where(prog, "a")) is not read_view_late
    np.testing.assert_array_equal(forward(prog, {"x": X}, "out"), forward(alone, {"x": X}, "out"))


def test_planverify_finds_a_write_over_bytes_a_live_view_shows() -> None:
    prog, _ = compiled(_viewed_then_updated(read_view_late=True))
    prog.buffers[index(prog, "b")].offset = where(prog, "a")[1]
    with pytest.raises(AssertionError, match="live at once"):
        assert_no_clobber(prog)


def test_an_in_place_kernel_never_reads_its_output_through_another_name() -> None:
    """``a * view(a)``: both die at the Mul, but its output goes over neither, since the
    kernel may overwrite only the input it runs in place over."""
    g = CalcGraph()
    x = g.placeholder("x", (0, 16))
    p = g.path("f")
    a = p.Tanh(x, outputs=["a"])
    m = p.Mul(a, p.Reshape(a, shape=(0, 16), outputs=["v"]), outputs=["m"])
    g.output(p.Neg(m, outputs=["out"]))
    prog, alone = compiled(g)
    assert where(prog, "v") == where(prog, "a") != where(prog, "m")
    np.testing.assert_array_equal(forward(prog, {"x": X}, "out"), forward(alone, {"x": X}, "out"))


def test_a_view_of_a_parameter_or_placeholder_shows_its_bytes() -> None:
    """Neither is written during a step (the update and the feeds come between steps):
    a view of either is free, and no in-place op writes over it."""
    g = CalcGraph()
    x = g.placeholder("x", (0, 16))
    w = g.parameter("w", (16,))
    p = g.path("f")
    xv = p.Reshape(x, shape=(0, 4, 4), outputs=["xv"])
    wv = p.Reshape(w, shape=(4, 4), outputs=["wv"])
    y = p.Tanh(p.Add(xv, wv, outputs=["s"]), outputs=["y"])  # in place over s, a temporary
    g.output(p.Add(p.Relu(xv, outputs=["r"]), y, outputs=["out"]))  # r: not over xv's bytes
    prog, alone = compiled(g)
    assert where(prog, "xv") == where(prog, "x")
    assert where(prog, "wv") == where(prog, "w")
    assert where(prog, "r") not in (where(prog, "x"), where(prog, "w"))
    assert where(prog, "y") == where(prog, "s")
    np.testing.assert_array_equal(forward(prog, {"x": X}, "out"), forward(alone, {"x": X}, "out"))


def test_a_view_of_a_placeholder_read_from_the_callers_array(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A placeholder the VM reads in place is not in its planned bytes: the view's kernel
    sees two addresses and copies it there, so the view shows the fed rows either way."""
    g = CalcGraph()
    x = g.placeholder("x", (0, 16))
    p = g.path("f")
    xv = p.Reshape(x, shape=(0, 4, 4), outputs=["xv"])
    g.output(p.Add(xv, p.Reshape(x, shape=(0, 4, 4)), outputs=["out"]))
    prog, _ = compiled(g)
    assert where(prog, "xv") == where(prog, "x")
    copied = forward(prog, {"x": X}, "out")
    monkeypatch.setattr(vm_module, "IN_PLACE_BYTES", 0)
    vm = VM(prog)
    vm.set("x", X)
    vm.forward("f")
    np.testing.assert_array_equal(vm.get("out"), copied)
    np.testing.assert_array_equal(copied, 2 * X.reshape(4, 4, 4))
    vm.set("x", -X)  # another array: bound again, copied again
    vm.forward("f")
    np.testing.assert_array_equal(vm.get("out"), -copied)


def test_a_parameter_that_an_op_updates_is_not_viewed_in_place() -> None:
    """Running statistics change during the step (``OpDef.writes``): a view of one is a
    copy, taken before the update."""
    g = CalcGraph()
    x = g.placeholder("x", (0, 3, 4))
    scale, bias = g.parameter("scale", (3,)), g.parameter("bias", (3,))
    mean = g.parameter("mean", (3,), trainable=False)
    var = g.parameter("var", (3,), trainable=False)
    p = g.path("train", Mode.BACKWARD_ENABLED)
    before = p.Reshape(mean, shape=(1, 3, 1), outputs=["before"])
    y = p.BatchNormalization(x, scale, bias, mean, var, training_mode=1, running_update=1)
    loss = p.set_loss(p.ReduceSum(p.Add(y, before), keepdims=0))
    progs = [compile_graph(g, batch_size=4, optimizer=Adam(), passes=(), sharing=sharing)
             for sharing in ("auto", "none")]
    assert_no_clobber(progs[0])
    assert where(progs[0], "before") != where(progs[0], "mean")
    x4 = np.random.default_rng(2).standard_normal((4, 3, 4)).astype(np.float32)
    losses = []
    for prog in progs:
        vm = VM(prog, seed=0)
        vm.set("x", x4)
        vm.train_step("train")
        losses.append(vm.get(loss.name))
    np.testing.assert_array_equal(losses[0], losses[1])


def _conv1d_net() -> CalcGraph:
    model = nn.Sequential(L.Conv1d(3, 8, 3, padding=1), L.ReLU(), L.Conv1d(8, 8, 3),
                          L.ReLU(), L.Conv1d(8, 2, 1), L.Flatten())
    return nn.to_graph(model, inputs={"x": (0, 3, 16)}, loss=sum_loss, target_shape=(0, 28))


def _mnist_transformer() -> CalcGraph:
    seq = SequenceShape(length=28, channels=28)
    shape = Shape(features=seq.features, classes=10, task="classification", sequence=seq)
    return families.get("transformer").build(TRANSFORMER, shape)


def _without_views(monkeypatch: pytest.MonkeyPatch) -> None:
    """The planner as if no op were a view: a reshape takes only a dying input's bytes."""
    monkeypatch.setattr(liveness, "get_op",
                        lambda name: dataclasses.replace(get_op(name), view=False))


@pytest.mark.parametrize("build,batch", [(_conv1d_net, 8), (_mnist_transformer, 64)])
def test_views_of_live_values_lower_the_plan_and_keep_every_bit(
        build: Any, batch: int, monkeypatch: pytest.MonkeyPatch) -> None:
    g = build()
    feed_rng = np.random.default_rng(1)
    feed: dict[str, np.ndarray]
    if build is _conv1d_net:
        feed = {"x": feed_rng.standard_normal((batch, 3, 16)).astype(np.float32),
                "y": feed_rng.standard_normal((batch, 28)).astype(np.float32)}
    else:
        seq = SequenceShape(length=28, channels=28)
        feed = {"x": rows(seq, batch, feed_rng), "y": feed_rng.integers(0, 10, batch)}

    def trained() -> tuple[int, dict[str, np.ndarray]]:
        prog = compile_graph(g, batch_size=batch, optimizer=Adam(lr=1e-2))
        assert_no_clobber(prog)
        vm = VM(prog, seed=0)
        assert vm.allocated_bytes == prog.total_bytes
        vm.feed(feed)
        for _ in range(5):
            vm.train_step("train")
        return prog.total_bytes, {b.name: vm.get(b.name) for b in prog.buffers
                                  if b.kind == "param"}

    planned, params = trained()
    with monkeypatch.context() as m:
        _without_views(m)
        copied, params_copied = trained()
    assert planned < copied
    assert params.keys() == params_copied.keys()
    for name, value in params.items():
        np.testing.assert_array_equal(value, params_copied[name], err_msg=name)
