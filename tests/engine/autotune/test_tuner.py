"""The online selector on programs: cycling with a fake clock, groups, nested choices,
freezing into the bound steps, exact memory, persistence and its invalidation, a
damaged cache, and a user's choice left alone."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine import SGD, VM, CalcGraph, Init, Mode, Program, compile_graph
from engine.autotune import DecisionCache, Probe, Tuner, keys
from engine.models import mnist_cnn
from engine.ops import KernelArgs, get_op
from engine.ops._base import Step, Variant, variant_named
from engine.ops.linalg import DENSE_LAYOUT, GEMM_VARIANTS, _blas_ws, _gemm_blas
from tests.allocations import step_allocations


class FakeClock:
    """Seconds that pass only when a fake kernel says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


CLOCK = FakeClock()


def fake(cost: Any, group: str = DENSE_LAYOUT, inner: dict[str, Variant] | None = None
         ) -> Variant:
    """Gemm's BLAS kernel, charged ``cost(attrs, call)`` fake seconds per call."""
    def kernel(k: KernelArgs) -> Step:
        step, calls = _gemm_blas(k), [0]

        def run() -> None:
            calls[0] += 1
            CLOCK.now += cost(k.attrs, calls[0])
            step()

        return run

    return Variant(applies=lambda ins, outs, attrs: True, workspace=_blas_ws, kernel=kernel,
                   doc="a fake, timed by the fake clock", group=group, inner=inner or {})


@pytest.fixture
def gemm_variants() -> Iterator[dict[str, Variant]]:
    """Gemm's variants, replaced by the test's own (restored after, in their order: the
    first is the default)."""
    saved = dict(GEMM_VARIANTS)
    GEMM_VARIANTS.clear()
    try:
        yield GEMM_VARIANTS
    finally:
        GEMM_VARIANTS.clear()
        GEMM_VARIANTS.update(saved)


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ENGINE_CACHE_DIR", str(tmp_path))
    return tmp_path


def dense(train: bool = False, batch: int = 4) -> tuple[Program, dict[str, np.ndarray]]:
    """x [b, 6] @ w [6, 3]: a forward Gemm (and, to train, its weight gradient and a
    second layer whose input gradient is a Gemm too); no other op with variants."""
    g = CalcGraph()
    x = g.placeholder("x", (0, 6))
    w = g.parameter("w", (6, 3), init=Init.xavier_uniform())
    p = g.path("f", Mode.BACKWARD_ENABLED if train else Mode.FORWARD_ONLY)
    h = p.Gemm(x, w)
    if train:
        w2 = g.parameter("w2", (3, 2), init=Init.xavier_uniform())
        # h * h, not an activation: the activations' gradients have kernel variants of
        # their own (numpy, numba), which would be decisions beside the Gemms'
        p.set_loss(p.ReduceSum(p.Gemm(p.Mul(h, h), w2), keepdims=0))
    prog = compile_graph(g, batch_size=batch, optimizer=SGD(lr=0.1) if train else None,
                         autotune=True)
    return prog, {"x": np.random.default_rng(0).normal(size=(batch, 6)).astype(np.float32)}


def tune(vm: VM, train: bool, limit: int = 100) -> int:
    """Steps until no decision explores."""
    for n in range(1, limit + 1):
        if train:
            vm.train_step("f")
        else:
            vm.forward("f")
        if not vm.autotune.tuning:  # type: ignore[union-attr]
            return n
    raise AssertionError("still tuning")


def bound_steps(vm: VM) -> list[Step]:
    b = vm._binding
    return [f for fs in (*b.forward, *b.backward.values()) for f in fs]


def test_cycling_picks_the_faster_variant_and_discards_each_first_call(
        gemm_variants: dict[str, Variant]) -> None:
    # slow costs 3 per call; fast 1, but 100 on its first call (a cold cache): the first
    # call of each option is a warm-up, so with two calls per option fast must win
    gemm_variants["slow"] = fake(lambda attrs, i: 3.0)
    gemm_variants["fast"] = fake(lambda attrs, i: 100.0 if i == 1 else 1.0)
    prog, feed = dense()
    assert [i.variants for i in prog.instrs] == [("slow", "fast")]
    vm = VM(prog, tune=Tuner(clock=CLOCK, calls=2, rounds=1, cache=False))
    vm.feed(feed)
    assert tune(vm, False) == 4  # slow twice, then fast twice
    assert vm.autotune.choices() == {0: "fast"}  # type: ignore[union-attr]
    [row] = vm.autotune.report()  # type: ignore[union-attr]
    assert row["ms"] == {"slow": 3000.0, "fast": 1000.0}


def test_each_option_is_measured_by_its_best_round(gemm_variants: dict[str, Variant]) -> None:
    """A burst of load during a's first round (its calls 1-3) would make b win in one
    round; a's second round shows its own speed."""
    gemm_variants["a"] = fake(lambda attrs, i: 50.0 if i <= 3 else 1.0)
    gemm_variants["b"] = fake(lambda attrs, i: 2.0)
    prog, feed = dense()
    vm = VM(prog, tune=Tuner(clock=CLOCK, calls=3, rounds=2, prune=100.0, cache=False))
    vm.feed(feed)
    seen = []
    while True:
        seen.append(vm.autotune.choices()[0])  # type: ignore[union-attr]
        vm.forward("f")
        if not vm.autotune.tuning:  # type: ignore[union-attr]
            break
    assert seen == ["a"] * 3 + ["b"] * 3 + ["a"] * 3 + ["b"] * 3
    assert vm.autotune.choices() == {0: "a"}  # type: ignore[union-attr]
    assert vm.autotune.report()[0]["ms"] == {"a": 1000.0, "b": 2000.0}  # type: ignore[union-attr]


def test_a_pinned_static_choice_does_not_tune(gemm_variants: dict[str, Variant]) -> None:
    gemm_variants["a"] = fake(lambda attrs, i: 2.0)
    gemm_variants["b"] = fake(lambda attrs, i: 1.0)
    prog, _ = dense(train=True)
    for pin, want in (("a", "a"), ("absent", "a"), ("b", "b")):
        vm = VM(prog, tune=Tuner(cache=False, pin={"dense layout": pin}))
        assert vm.autotune.frozen and not vm.autotune.tuning  # type: ignore[union-attr]
        assert set(vm.autotune.choices().values()) == {want}  # type: ignore[union-attr]
        assert not any(isinstance(f, Probe) for f in bound_steps(vm))


def test_an_option_far_slower_than_the_best_is_cut_early(
        gemm_variants: dict[str, Variant]) -> None:
    gemm_variants["fast"] = fake(lambda attrs, i: 1.0)
    gemm_variants["slow"] = fake(lambda attrs, i: 10.0)
    prog, feed = dense()
    vm = VM(prog, tune=Tuner(clock=CLOCK, calls=5, rounds=3, prune=2.0, cache=False))
    vm.feed(feed)
    # slow is cut after its warm-up and one timed call, and not tried in later rounds
    assert tune(vm, False) == 5 + 2 + 5 + 5
    assert vm.autotune.choices() == {0: "fast"}  # type: ignore[union-attr]


def test_a_group_chooses_together_by_the_sum_of_its_members(
        gemm_variants: dict[str, Variant]) -> None:
    """Alone, the forward product would take a and the gradients b; the layer's sum
    (a: 1 + 5 + 5, b: 4 + 1 + 1) makes every member take b."""
    def cost(fwd: float, grad: float) -> Any:
        return lambda attrs, i: grad if attrs["transA"] or attrs["transB"] else fwd

    gemm_variants["a"] = fake(cost(1.0, 5.0))
    gemm_variants["b"] = fake(cost(4.0, 1.0))
    prog, feed = dense(train=True)
    groups = {i.group for i in prog.instrs if i.variants}
    assert groups == {"dense layout:w", "dense layout:w2"}
    members = [k for k in prog.tunable if prog.instrs[k].group == "dense layout:w2"]
    assert len(members) == 3  # the product, its input and weight gradients
    vm = VM(prog, tune=Tuner(clock=CLOCK, calls=3, cache=False))
    vm.feed(feed)
    tune(vm, True)
    choices = vm.autotune.choices()  # type: ignore[union-attr]
    assert {choices[k] for k in members} == {"b"}
    rows = {tuple(r["instrs"]): r for r in vm.autotune.report()}  # type: ignore[union-attr]
    assert rows[tuple(members)]["ms"] == {"a": 11000.0, "b": 6000.0}


def test_a_nested_choice_is_made_first_then_measures_its_parent(
        gemm_variants: dict[str, Variant], cache_dir: Path) -> None:
    """tiled holds an inner choice (x or y): while the outer decision holds tiled it is
    locked and the inner one explores; its best median is tiled's measure."""
    gemm_variants["plain"] = fake(lambda attrs, i: 2.5)
    gemm_variants["tiled"] = fake(lambda attrs, i: 0.0, inner={
        "x": fake(lambda attrs, i: 3.0), "y": fake(lambda attrs, i: 2.0)})
    prog, feed = dense()
    assert prog.instrs[0].variants == ("plain", "tiled/x", "tiled/y")
    vm = VM(prog, tune=Tuner(clock=CLOCK, calls=2, rounds=1))
    vm.feed(feed)
    seen = []
    for _ in range(6):
        seen.append(vm.autotune.choices()[0])  # type: ignore[union-attr]
        vm.forward("f")
    assert seen == ["plain"] * 2 + ["tiled/x"] * 2 + ["tiled/y"] * 2
    assert not vm.autotune.tuning  # type: ignore[union-attr]
    [row] = vm.autotune.report()  # type: ignore[union-attr]
    assert row["choice"] == "tiled/y"
    assert row["ms"] == {"plain": 2500.0, "tiled": 2000.0}
    assert row["inner"]["tiled"] == {"choice": "tiled/y",
                                     "ms": {"tiled/x": 3000.0, "tiled/y": 2000.0}}
    saved = json.loads((cache_dir / "autotune.json").read_text())["decisions"]
    assert sorted(e["choice"] for e in saved.values()) == ["tiled/y", "tiled/y"]  # both levels


def test_a_user_named_outer_variant_leaves_its_inner_choice_open(
        gemm_variants: dict[str, Variant]) -> None:
    gemm_variants["plain"] = fake(lambda attrs, i: 1.0)
    gemm_variants["tiled"] = fake(lambda attrs, i: 0.0, inner={
        "x": fake(lambda attrs, i: 3.0), "y": fake(lambda attrs, i: 2.0)})
    g = CalcGraph()
    x, w = g.placeholder("x", (0, 6)), g.parameter("w", (6, 3))
    p = g.path("f")
    p.Gemm(x, w, algorithm="tiled")
    p.Gemm(x, w, algorithm="tiled/x", outputs=["fixed"])
    prog = compile_graph(g, batch_size=2, autotune=True)
    assert [i.variants for i in prog.instrs] == [("tiled/x", "tiled/y"), ()]


def test_frozen_winners_are_bound_directly_and_allocate_nothing(
        gemm_variants: dict[str, Variant]) -> None:
    gemm_variants["a"] = fake(lambda attrs, i: 2.0)
    gemm_variants["b"] = fake(lambda attrs, i: 1.0)
    prog, feed = dense(train=True)
    vm = VM(prog, tune=Tuner(clock=CLOCK, calls=2, cache=False))
    vm.feed(feed)
    assert any(isinstance(f, Probe) for f in bound_steps(vm))
    tune(vm, True)
    vm.train_step("f")  # binds the backward again, with the winners
    steps = bound_steps(vm)
    assert steps and not any(isinstance(f, Probe) for f in steps)
    retained, _ = step_allocations(lambda: vm.train_step("f"), warmup=3, runs=100)
    assert retained < 4096


def test_a_smaller_batch_runs_the_winner(gemm_variants: dict[str, Variant]) -> None:
    gemm_variants["a"] = fake(lambda attrs, i: 2.0)
    gemm_variants["b"] = fake(lambda attrs, i: 1.0)
    prog, feed = dense(batch=4)
    vm = VM(prog, tune=Tuner(clock=CLOCK, calls=2, cache=False))
    vm.set("x", feed["x"][:3])  # the last mini-batch, before tuning: the first candidate
    vm.forward("f")
    assert not any(isinstance(f, Probe) for f in bound_steps(vm))
    vm.set("x", feed["x"])
    tune(vm, False)
    vm.set("x", feed["x"][:3])
    vm.forward("f")
    assert vm.autotune.choices() == {0: "b"}  # type: ignore[union-attr]


def test_memory_stays_exact_with_tuning_on() -> None:
    prog = compile_graph(mnist_cnn(), batch_size=8, optimizer=SGD(lr=0.01), autotune=True)
    # and the elementwise ops with a fused form (numpy, numba)
    assert {prog.instrs[k].op for k in prog.tunable} >= {"Conv", "MaxPool", "Gemm"}
    for k in prog.tunable:  # each tunable instruction plans the largest candidate's need
        ins = prog.instrs[k]
        op = get_op(ins.op)
        descs = [prog.buffers[j].desc.at_batch(prog.batch_size) for j in (*ins.ins, *ins.outs)]
        needs = [variant_named(ins.op, op.variants, v).workspace(
            descs[:len(ins.ins)], descs[len(ins.ins):], ins.attrs, "cpu") for v in ins.variants]
        sink = 0 if ins.param_sink is None else prog.buffers[ins.outs[0]].desc.nbytes()
        assert ins.workspace >= max(needs) + sink
        assert ins.workspace <= prog.zone_bytes["workspace"]
    vm = VM(prog, tune=Tuner(calls=2, cache=False))
    assert vm.allocated_bytes == prog.total_bytes
    rng = np.random.default_rng(0)
    vm.set("x", rng.random((8, 784), dtype=np.float32))
    vm.set("y", rng.integers(0, 10, 8))
    for _ in range(60):
        vm.train_step("train")
    assert not vm.autotune.tuning  # type: ignore[union-attr]
    assert vm.allocated_bytes == prog.total_bytes


def test_tuned_training_matches_untuned_training_to_rounding() -> None:
    rng = np.random.default_rng(0)
    feed = {"x": rng.random((8, 784), dtype=np.float32), "y": rng.integers(0, 10, 8)}
    losses = []
    for autotune in (False, True):
        vm = VM(compile_graph(mnist_cnn(), batch_size=8, optimizer=SGD(lr=0.05),
                              autotune=autotune), tune=Tuner(calls=2, cache=False))
        vm.feed(feed)
        run = []
        for _ in range(12):
            vm.train_step("train")
            run.append(float(vm.get("loss")))
        losses.append(run)
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-4)


def test_decisions_persist_and_a_new_vm_starts_frozen(
        gemm_variants: dict[str, Variant], cache_dir: Path) -> None:
    gemm_variants["a"] = fake(lambda attrs, i: 2.0)
    gemm_variants["b"] = fake(lambda attrs, i: 1.0)
    prog, feed = dense(train=True)
    first = VM(prog, tune=Tuner(clock=CLOCK, calls=2))
    first.feed(feed)
    tune(first, True)
    assert (cache_dir / "autotune.json").exists()
    again = VM(Program.from_json(prog.to_json()))  # the default tuner: the cache file
    assert again.autotune is not None and again.autotune.frozen
    assert not again.autotune.tuning
    assert again.autotune.choices() == first.autotune.choices()  # type: ignore[union-attr]
    assert set(again.autotune.choices().values()) == {"b"}
    assert not any(isinstance(f, Probe) for f in bound_steps(again))


def test_a_library_version_change_invalidates_decisions(
        gemm_variants: dict[str, Variant], monkeypatch: pytest.MonkeyPatch) -> None:
    gemm_variants["a"] = fake(lambda attrs, i: 2.0)
    gemm_variants["b"] = fake(lambda attrs, i: 1.0)
    prog, feed = dense()
    vm = VM(prog, tune=Tuner(clock=CLOCK, calls=2))
    vm.feed(feed)
    tune(vm, False)
    assert VM(prog).autotune.frozen  # type: ignore[union-attr]
    real = keys.versions
    for change in ({"numpy": "0.0.1"}, {"engine": "0"}):
        monkeypatch.setattr(keys, "versions", lambda device, c=change: {**real(device), **c})
        fresh = VM(prog)
        assert fresh.autotune is not None and not fresh.autotune.frozen, change
        assert any(isinstance(f, Probe) for f in bound_steps(fresh))


def test_a_damaged_cache_is_ignored_with_a_warning_and_rewritten(
        gemm_variants: dict[str, Variant], cache_dir: Path) -> None:
    gemm_variants["a"] = fake(lambda attrs, i: 2.0)
    gemm_variants["b"] = fake(lambda attrs, i: 1.0)
    path = cache_dir / "autotune.json"
    prog, feed = dense()
    for damage in ('{"format": 1, "decisions": {"k": ', '[1, 2]', '{"format": 1, '
                   '"decisions": {"k": {"no choice": 1}}}'):
        path.write_text(damage)
        with pytest.warns(RuntimeWarning, match="damaged"):
            tuner = Tuner(clock=CLOCK, calls=2)
        vm = VM(prog, tune=tuner)
        vm.feed(feed)
        tune(vm, False)
        saved = json.loads(path.read_text())
        assert saved["format"] == 1 and [e["choice"] for e in saved["decisions"].values()] == ["b"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert VM(prog).autotune.frozen  # type: ignore[union-attr]


def test_an_unwritable_cache_warns_and_tuning_still_freezes(
        gemm_variants: dict[str, Variant], tmp_path: Path) -> None:
    gemm_variants["a"] = fake(lambda attrs, i: 2.0)
    gemm_variants["b"] = fake(lambda attrs, i: 1.0)
    blocker = tmp_path / "file"
    blocker.write_text("")
    prog, feed = dense()
    with pytest.warns(RuntimeWarning, match="cannot be read"):
        cache = DecisionCache(blocker / "sub" / "autotune.json")
    vm = VM(prog, tune=Tuner(clock=CLOCK, calls=2, cache=cache))
    vm.feed(feed)
    with pytest.warns(RuntimeWarning, match="cannot be written"):
        tune(vm, False)
    assert vm.autotune.frozen  # type: ignore[union-attr]


def test_a_user_fixed_algorithm_is_never_tuned() -> None:
    fixed = compile_graph(mnist_cnn(algorithm="direct"), batch_size=2, autotune=True)
    ops = {fixed.instrs[k].op for k in fixed.tunable}
    assert "Conv" not in ops and ops >= {"MaxPool", "Gemm"}
    outer = compile_graph(mnist_cnn(algorithm="im2col"), batch_size=2, autotune=True)
    assert {outer.instrs[k].variants for k in outer.tunable if outer.instrs[k].op == "Conv"} \
        == {("im2col/tn", "im2col/nt")}
    g = CalcGraph()
    x, w = g.placeholder("x", (0, 4)), g.parameter("w", (4, 2))
    p = g.path("t", Mode.BACKWARD_ENABLED)
    p.set_loss(p.ReduceSum(p.Gemm(x, w, algorithm="transposed"), keepdims=0))
    prog = compile_graph(g, batch_size=2, optimizer=SGD(lr=0.1), autotune=True)
    assert prog.tunable == ()  # the layer's gradient follows the user's layout
    assert {i.attrs.get("algorithm") for i in prog.instrs if i.op == "Gemm"} == {"transposed"}


def test_tuning_is_off_by_default_and_can_be_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ENGINE_AUTOTUNE", raising=False)
    plain = compile_graph(mnist_cnn(), batch_size=2)
    assert plain.tunable == () and VM(plain).autotune is None
    assert "variants" not in plain.to_dict()["instrs"][1]  # the format untuned programs had
    monkeypatch.setenv("ENGINE_AUTOTUNE", "1")
    prog = compile_graph(mnist_cnn(), batch_size=2)
    assert prog.tunable and Program.from_json(prog.to_json()) == prog
    assert VM(prog).autotune is not None
    assert VM(prog, tune=False).autotune is None
    monkeypatch.setenv("ENGINE_AUTOTUNE", "0")
    assert VM(prog).autotune is None  # a tunable program runs its defaults
    assert not any(isinstance(f, Probe) for f in bound_steps(VM(prog)))
