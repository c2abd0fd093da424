"""DequantizeLinear fused into the first Gemm: same numbers, smaller heap, no allocation."""

from __future__ import annotations

import numpy as np
import pytest

from engine import DEFAULT_PASSES, SGD, VM, CalcGraph, Init, Mode, Program, compile_graph
from engine.ops.dequantize_gemm import BLOCK_BYTES
from tests.allocations import step_allocations

FEATURES, CLASSES = 784, 10
BATCH = 700  # > BLOCK_BYTES / (784 * 4) = 334 rows: three blocks, the last one short
UNFUSED = [p for p in DEFAULT_PASSES if p != "fuse_dequantize"]


def mlp(scale: object = 1 / 256, trans_a: bool = False, reread: bool = False) -> CalcGraph:
    g = CalcGraph()
    # transposed: the rows of A are the features, a fixed batch of FEATURES samples
    x = g.placeholder("x", (FEATURES, FEATURES) if trans_a else (0, FEATURES), dtype="uint8")
    y = g.placeholder("y", (FEATURES,) if trans_a else (0,), dtype="int64")
    w = g.parameter("w", (FEATURES, 32), init=Init.xavier_uniform())
    b = g.parameter("b", (32,), init=Init.zeros())
    v = g.parameter("v", (32, CLASSES), init=Init.xavier_uniform())
    p = g.path("train", Mode.BACKWARD_ENABLED)
    xf = p.DequantizeLinear(x, scale=scale, axis=1)
    h = p.Sigmoid(p.Gemm(xf, w, b, transA=int(trans_a)))
    logits = p.MatMul(h, v)
    if reread:  # the float copy is read twice: it must be kept
        logits = p.Add(logits, p.ReduceMean(xf, axes=(1,), keepdims=1))
    p.set_loss(p.SoftmaxCrossEntropyLoss(logits, y, outputs=["loss"]))
    return g


def data(rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 256, (rows, FEATURES)).astype(np.uint8),
            rng.integers(0, CLASSES, rows).astype(np.int64))


def ops(prog: Program) -> list[str]:
    return [i.op for i in prog.instrs]


def compiled(passes: list[str] | None = None, **kw: object) -> Program:
    return compile_graph(mlp(**kw), batch_size=BATCH, optimizer=SGD(lr=0.5), passes=passes)


def test_the_fused_program_trains_as_the_unfused_one() -> None:
    fused, plain = compiled(), compiled(UNFUSED)
    assert "DequantizeGemm" in ops(fused) and "DequantizeLinear" not in ops(fused)
    assert "DequantizeGemmGradB" in ops(fused)
    assert "DequantizeLinear" in ops(plain)
    a, b = VM(fused, seed=3), VM(plain, seed=3)
    for step in range(3):
        x, y = data(BATCH if step < 2 else 50, seed=step)  # then a smaller batch
        for vm in (a, b):
            vm.set("x", x)
            vm.set("y", y)
            vm.train_step("train")
        assert float(a.view("loss")) == pytest.approx(float(b.view("loss")), rel=1e-6)
    for name in ("w", "b", "v"):
        np.testing.assert_allclose(a.get(name), b.get(name), rtol=1e-5, atol=1e-7)


def test_the_float_copy_leaves_the_heap() -> None:
    fused, plain = compiled(), compiled(UNFUSED)
    copy = BATCH * FEATURES * 4
    # Gone: the float copy; added: one block of converted rows (and the weight
    # gradient's partial sum: three blocks) in the workspace.
    assert plain.total_bytes - fused.total_bytes >= copy - 2 * BLOCK_BYTES
    assert VM(fused).allocated_bytes == fused.total_bytes


def test_a_fused_step_over_several_blocks_allocates_nothing() -> None:
    vm = VM(compiled())
    x, y = data(BATCH)

    def step() -> None:
        vm.set("x", x, check=False)
        vm.set("y", y, check=False)
        vm.train_step("train")

    # The one transient allowed is numpy's broadcasting buffer, at most 8,192 elements
    # (the bias add; see tests/test_vm.py): a float copy of one block alone is 1 MiB.
    retained, peak = step_allocations(step, warmup=20, runs=50)
    assert retained < 4096 and peak < 48 * 1024


@pytest.mark.parametrize("kw", [{"scale": [1 / 256] * FEATURES}, {"trans_a": True},
                                {"reread": True}],
                         ids=["per-axis scale", "transposed rows", "read twice"])
def test_what_cannot_fuse_stays_as_written(kw: dict[str, object]) -> None:
    assert "DequantizeLinear" in ops(compiled(**kw))  # type: ignore[arg-type]
