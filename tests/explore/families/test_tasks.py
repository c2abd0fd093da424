"""The models of each task, as the families build them: the eval path carries the ops
every metric reads, and they keep the exact-memory promise (planned bytes are the
allocated bytes, no value overwritten while live, a step allocates nothing)."""

from __future__ import annotations

import numpy as np
import pytest

from engine import SGD, VM, compile_graph
from engine.runtime.train import train_epoch
from explore.families import BuildError, Shape, get
from explore.scheduler.worker import Validation
from tests.allocations import step_allocations
from tests.planverify import assert_no_clobber

P = {"depth": 1, "widths": [16], "activations": ["relu"], "dropouts": [0.1],
     "init": "he_uniform"}
CASES = [("classification", 2, "auto"), ("classification", 7, "cross_entropy"),
         ("regression", 0, "mse"), ("regression", 0, "mae"), ("regression", 0, "huber")]


def data(task: str, classes: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6)).astype(np.float32)
    if task == "regression":
        return x, (x @ np.linspace(-1, 1, 6)).astype(np.float32)
    return x, (np.abs(x[:, 0] * 3).astype(np.int64) % classes)


@pytest.mark.parametrize(("task", "classes", "loss"), CASES)
def test_each_task_model_is_planned_exactly_and_steps_allocate_nothing(
        task: str, classes: int, loss: str) -> None:
    g = get("mlp").build({**P, "loss": loss}, Shape(6, classes, task))
    for b in (1, 32, 500):
        prog = compile_graph(g, batch_size=b, optimizer=SGD(lr=0.05))
        assert VM(prog).allocated_bytes == prog.total_bytes
        assert_no_clobber(prog)
    big = 32768  # a batched float32 vector alone (128 KiB) exceeds the bound below
    vm = VM(compile_graph(g, batch_size=big, optimizer=SGD(lr=0.05)))
    x, y = data(task, classes, big)
    for rows in (big, 20000):  # the compiled batch, and a last smaller one
        vm.set("x", x[:rows])
        vm.set("y", y[:rows])

        def step() -> None:
            vm.train_step("train")
            vm.forward("eval")

        retained, peak = step_allocations(step, warmup=3, runs=10)
        # numpy's iteration buffer (8,192 elements: a broadcast, or Accuracy's bool ->
        # int64 sum, 64 KiB) is the only transient, whatever the batch; a copy of any
        # batched tensor would exceed the bound
        assert retained < 4096 and peak < 80 * 1024, (rows, retained, peak)


@pytest.mark.parametrize(("task", "classes", "loss"), CASES)
def test_the_eval_path_measures_every_metric_of_the_task(task: str, classes: int,
                                                         loss: str) -> None:
    g = get("mlp").build({**P, "loss": loss}, Shape(6, classes, task))
    prog = compile_graph(g, batch_size=64, optimizer=SGD(lr=0.05))
    x, y = data(task, classes, 300)
    vm = VM(prog)
    rng = np.random.default_rng(1)
    for _ in range(3):
        train_epoch(vm, x, y, rng, batch=32)
    got = Validation.of(prog, len(y)).measure(vm, x, y)
    want = {"classification": {"accuracy", "loss", "f1"} | ({"roc_auc"} if classes == 2
                                                              else set()),
            "regression": {"loss", "rmse", "mae", "r2"}}[task]
    assert set(got) == want and all(np.isfinite(v) for v in got.values())


def test_a_loss_that_does_not_suit_the_task_is_a_build_error() -> None:
    with pytest.raises(BuildError, match="loss 'mse' does not suit a classification"):
        get("mlp").build({**P, "loss": "mse"}, Shape(6, 3))
    with pytest.raises(BuildError, match="mse or mae or huber"):
        get("mlp").build({**P, "loss": "cross_entropy"}, Shape(6, 0, "regression"))
