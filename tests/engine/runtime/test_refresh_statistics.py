"""refresh_statistics: batch norms' running statistics taken again under the weights
now, before a validation.  It moves them as the op's momentum says, batch after batch;
reads rows spread over the data; leaves every weight and optimizer state as it was;
allocates nothing; and a network whose statistics lag its weights validates as it
should again."""

from __future__ import annotations

import numpy as np

from engine import VM, Adam, compile_graph, nn
from engine.runtime.train import evaluate, refresh_statistics, running_statistics, train_epoch
from tests.allocations import step_allocations

BATCH = 8


def program(norm: bool = True, momentum: float = 0.1, batch: int = BATCH) -> object:
    nn.manual_seed(0)
    layers = [nn.Linear(4, 6)] + ([nn.BatchNorm1d(6, momentum=momentum)] if norm else []) + \
        [nn.ReLU(), nn.Linear(6, 3)]
    g = nn.to_graph(nn.Sequential(*layers), inputs={"x": (0, 4)}, loss="cross_entropy",
                    metrics=["accuracy"])
    return compile_graph(g, batch_size=batch, optimizer=Adam(lr=0.05))


def data(n: int = 96, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 1).astype(np.int64)


def test_only_a_program_that_keeps_running_statistics_has_them() -> None:
    assert running_statistics(program())
    assert not running_statistics(program(norm=False))


def test_each_batch_moves_the_statistics_by_the_momentum() -> None:
    """Rows all alike: each batch's mean is theirs, its variance 0, so after k batches
    the running mean is ``mean * (1 - 0.9**k)`` and the variance ``0.9**k`` of what it
    was (1)."""
    vm = VM(program(), seed=1)
    x = np.tile(np.float32([[1.0, -2.0, 0.5, 3.0]]), (64, 1))
    y = np.zeros(64, np.int64)
    vm.set("x", x[:BATCH])
    vm.forward("eval")  # the linear layer's output for these rows: what BN sees
    h = vm.get("0.weight") @ x[0] + vm.get("0.bias")
    assert refresh_statistics(vm, x, y, 5, batch=BATCH) == 5
    np.testing.assert_allclose(vm.get("1.running_mean"), h * (1 - 0.9 ** 5), rtol=1e-5)
    np.testing.assert_allclose(vm.get("1.running_var"), np.full(6, 0.9 ** 5), rtol=1e-5)
    # no more batches than the data holds
    assert refresh_statistics(vm, x[:20], y[:20], 30, batch=BATCH) == 2
    assert refresh_statistics(vm, x[:5], y[:5], 30, batch=BATCH) == 0


def test_the_rows_are_spread_over_the_data() -> None:
    """Data sorted in two halves (0s, then 1s): batches spread over it each hold both,
    so each batch's mean is the same and the running mean ends where a batch's is; the
    first rows in order (all 0s) would leave it far from there."""
    vm = VM(program(), seed=1)
    x = np.zeros((64, 4), np.float32)
    x[32:] = 1.0
    y = np.zeros(64, np.int64)
    w, b = vm.get("0.weight"), vm.get("0.bias")
    h0, h1 = b, w @ x[-1] + b
    for turn in range(3):
        assert refresh_statistics(vm, x, y, 200, batch=BATCH, turn=turn) == 8  # all it has
        np.testing.assert_allclose(vm.get("1.running_mean"),
                                   (h0 + h1) / 2 * (1 - 0.9 ** (8 * (turn + 1))),
                                   rtol=1e-4, atol=1e-6)


def test_the_weights_and_the_optimizer_are_left_as_they_were() -> None:
    vm = VM(program(), seed=1)
    x, y = data()
    train_epoch(vm, x, y, np.random.default_rng(0), batch=BATCH)
    params = {n: vm.get(n).copy() for n in ("0.weight", "0.bias", "1.weight", "1.bias",
                                            "3.weight", "3.bias")}
    refresh_statistics(vm, x, y, 30, batch=BATCH)
    for n, v in params.items():
        np.testing.assert_array_equal(vm.get(n), v)
    # the next step is the one the trial would have taken without the refresh
    other = VM(program(), seed=1)
    train_epoch(other, x, y, np.random.default_rng(0), batch=BATCH)
    rng_a, rng_b = np.random.default_rng(1), np.random.default_rng(1)
    train_epoch(vm, x, y, rng_a, batch=BATCH)
    train_epoch(other, x, y, rng_b, batch=BATCH)
    for n in params:
        np.testing.assert_array_equal(vm.get(n), other.get(n))


def test_a_refresh_allocates_nothing() -> None:
    vm = VM(program(), seed=1)
    x, y = data()
    allocated = vm.allocated_bytes
    # the better of two, as the in-place feed's test takes: tracemalloc counts numpy's
    # and the interpreter's own small caches now and then
    retained, peak = min(step_allocations(
        lambda: refresh_statistics(vm, x, y, 4, batch=BATCH), warmup=3, runs=20)
        for _ in range(2))
    assert retained <= 0
    assert peak < 4096  # the rows' indices: a few hundred bytes on the host
    assert vm.allocated_bytes == allocated == vm.program.total_bytes


def test_statistics_of_other_weights_validate_low_and_refreshed_ones_as_learnt() -> None:
    """A trained network whose running statistics are not its weights' (here those it
    started with, as a network whose statistics lag far behind has) validates far below
    what it learnt; refreshed, as well as on the statistics of its hidden layer over
    every training row, computed here by hand, do."""
    x, y = data(2048)
    xv, yv = data(512, seed=1)
    vm = VM(program(batch=32), seed=3)
    for r in range(3):
        train_epoch(vm, x, y, np.random.default_rng(r), batch=32)
    h = x @ vm.get("0.weight").T + vm.get("0.bias")
    vm.assign("1.running_mean", h.mean(0))
    vm.assign("1.running_var", h.var(0, ddof=1))
    exact = evaluate(vm, xv, yv)
    vm.assign("1.running_mean", np.zeros(6, np.float32))
    vm.assign("1.running_var", np.ones(6, np.float32))
    stale = evaluate(vm, xv, yv)
    refresh_statistics(vm, x, y, 30, batch=32)
    refreshed = evaluate(vm, xv, yv)
    assert stale < exact - 0.05 and refreshed > stale + 0.05, (stale, refreshed, exact)
    assert refreshed > exact - 0.03, (stale, refreshed, exact)
    # an average over some 600 rows: the mean within a quarter of a standard
    # deviation, the variance within a quarter of itself
    std = h.std(0)
    assert np.all(np.abs(vm.get("1.running_mean") - h.mean(0)) < 0.25 * std)
    assert np.all(np.abs(vm.get("1.running_var") / h.var(0) - 1) < 0.25)
