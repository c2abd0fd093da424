"""MAELoss, HuberLoss and the metric statistics (RegressionSums, ClassCounts,
PositiveScore): values against numpy formulas, sums over batches against
scikit-learn's metrics over the whole set, the last smaller batch, exact memory and
no allocation in a step.  (The loss gradients are also checked by finite differences
in test_gradients.)"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.metrics import f1_score, mean_absolute_error, mean_squared_error, r2_score

from engine import SGD, VM, CalcGraph, Init, InputError, Mode, ShapeError, compile_graph
from tests.allocations import step_allocations
from tests.engine.ops.test_ops_forward import run_engine
from tests.planverify import assert_no_clobber

R = np.random.default_rng(11)


def huber(d: np.ndarray, delta: float) -> np.ndarray:
    a = np.abs(d)
    return np.where(a <= delta, 0.5 * d * d, delta * (a - 0.5 * delta))


# -- losses ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_mae_and_huber_match_numpy(dtype: str) -> None:
    p = R.normal(size=(6, 5)).astype(dtype)
    t = (p + R.normal(scale=1.5, size=(6, 5))).astype(dtype)
    rtol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(run_engine("MAELoss", [p, t])[0], np.mean(np.abs(p - t)),
                               rtol=rtol)
    for delta in (0.1, 1.0, 2.5, 100.0):  # mostly linear, mixed, mostly / all quadratic
        np.testing.assert_allclose(run_engine("HuberLoss", [p, t], delta=delta)[0],
                                   np.mean(huber(p - t, delta)), rtol=rtol)


def test_huber_matches_torch() -> None:
    torch = pytest.importorskip("torch", reason="torch: the bench extra; .ci/run installs it")
    p, t = R.normal(size=(7, 3)), R.normal(size=(7, 3))
    for delta in (0.3, 1.0):
        ref = torch.nn.HuberLoss(reduction="mean", delta=delta)(torch.tensor(p),
                                                                 torch.tensor(t))
        np.testing.assert_allclose(run_engine("HuberLoss", [p, t], delta=delta)[0],
                                   float(ref), rtol=1e-12)


def loss_graph(loss: str, **attrs: float) -> CalcGraph:
    """p = x @ w against target t, with ``loss``; ``dp`` reads the gradient."""
    g = CalcGraph(name=loss)
    x = g.placeholder("x", (0, 4), dtype="float64")
    t = g.placeholder("t", (0, 3), dtype="float64")
    w = g.parameter("w", (4, 3), init=Init.from_values(R.normal(size=12).tolist()),
                    dtype="float64")
    p = g.path("train", Mode.BACKWARD_ENABLED)
    p.set_loss(p.op(loss, p.MatMul(x, w, outputs=["pred"]), t, outputs=["loss"], **attrs))
    g.output("loss", "pred")
    return g


@pytest.mark.parametrize(("loss", "attrs"), [("MAELoss", {}), ("HuberLoss", {"delta": 0.8}),
                                             ("HuberLoss", {"delta": 3.0})])
def test_loss_gradient_matches_the_formula(loss: str, attrs: dict) -> None:
    """dL/dw = x^T g with g = sign(d) / n (MAE), clip(d, -delta, delta) / n (Huber), on a
    full batch and on a last, smaller one (n counts only its rows)."""
    vm = VM(compile_graph(loss_graph(loss, **attrs), batch_size=8, optimizer=SGD(lr=0.0)))
    for rows in (8, 5):
        x, t = R.normal(size=(rows, 4)), R.normal(size=(rows, 3))
        vm.set("x", x)
        vm.set("t", t)
        vm.forward(0)
        vm.apply_loss(0)
        vm.backward(0)
        d = vm.get("pred") - t
        if loss == "MAELoss":
            value, g = np.mean(np.abs(d)), np.sign(d)
        else:
            value, g = np.mean(huber(d, attrs["delta"])), np.clip(d, -attrs["delta"],
                                                                   attrs["delta"])
        np.testing.assert_allclose(vm.get("loss"), value, rtol=1e-12)
        np.testing.assert_allclose(vm.grad("w"), x.T @ (g / d.size), rtol=1e-10, atol=1e-14)
        vm.optimize()  # lr 0: consumes the gradient, the next backward writes afresh


def test_huber_rejects_a_non_positive_delta() -> None:
    a = np.zeros((2, 2), dtype=np.float32)
    with pytest.raises(ShapeError, match="delta must be positive"):
        run_engine("HuberLoss", [a, a], delta=0.0)
    with pytest.raises(ShapeError, match="differ"):
        run_engine("MAELoss", [a, np.zeros((2, 3), dtype=np.float32)])


# -- metric statistics -----------------------------------------------------------------


def regression_sums(p: np.ndarray, t: np.ndarray) -> np.ndarray:
    d = p.astype(np.float64) - t
    return np.array([np.sum(d * d), np.sum(np.abs(d)), np.sum(t, dtype=np.float64),
                     np.sum(t.astype(np.float64) ** 2)])


def class_counts(s: np.ndarray, y: np.ndarray, c: int) -> np.ndarray:
    pred = s.argmax(axis=1)
    return np.stack([np.bincount(pred[pred == y], minlength=c), np.bincount(pred, minlength=c),
                     np.bincount(y, minlength=c)]).astype(np.float64)


@pytest.mark.parametrize("shape", [(7,), (5, 3), (4, 2, 3)])
def test_regression_sums_match_numpy(shape: tuple[int, ...]) -> None:
    for _ in range(3):
        p = R.normal(size=shape).astype(np.float32)
        t = R.normal(2.0, 3.0, size=shape).astype(np.float32)
        out = run_engine("RegressionSums", [p, t])[0]
        assert out.shape == (4,) and out.dtype == np.float32
        np.testing.assert_allclose(out, regression_sums(p, t), rtol=1e-5)


@pytest.mark.parametrize("label_dtype", ["int64", "int32"])
def test_class_counts_match_numpy(label_dtype: str) -> None:
    for b, c in ((9, 4), (1, 3), (16, 2)):
        s = R.normal(size=(b, c)).astype(np.float32)
        y = R.integers(0, c, b).astype(label_dtype)
        out = run_engine("ClassCounts", [s, y])[0]
        assert out.shape == (3, c) and out.dtype == np.float32
        np.testing.assert_array_equal(out, class_counts(s, y, c))


def test_class_counts_take_the_first_maximum_and_check_labels() -> None:
    s = np.array([[1.0, 1.0, 0.0], [0.0, 2.0, 2.0]], dtype=np.float32)
    y = np.array([1, 2], dtype=np.int64)
    np.testing.assert_array_equal(run_engine("ClassCounts", [s, y])[0],
                                  [[0, 0, 0], [1, 1, 0], [0, 1, 1]])
    with pytest.raises(InputError, match=r"labels must lie in \[0, 3\)"):
        run_engine("ClassCounts", [s, np.array([0, 3], dtype=np.int64)])
    with pytest.raises(ShapeError, match="labels"):
        run_engine("ClassCounts", [s, np.array([0.0, 1.0], dtype=np.float32)])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_positive_score_is_a_stable_softmax(dtype: str) -> None:
    s = R.normal(scale=3.0, size=(50, 2)).astype(dtype)
    s[:4] = [[0.0, 1e4], [1e4, 0.0], [-30.0, 0.0], [0.0, -30.0]]  # far out both ways
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow
        out = run_engine("PositiveScore", [s])[0]
    z = s[:, 1].astype(np.float64) - s[:, 0]
    e = np.exp(-np.abs(z))
    ref = np.where(z >= 0, 1 / (1 + e), e / (1 + e))
    assert out.shape == (50,) and out.dtype == dtype
    np.testing.assert_allclose(out, ref, rtol=1e-5 if dtype == "float32" else 1e-12)
    assert out[3] > 0 and out[1] == 0  # a small probability keeps its precision
    with pytest.raises(ShapeError, match=r"\[batch, 2\]"):
        run_engine("PositiveScore", [s[:, :1].copy()])


# -- over batches, through a model ------------------------------------------------------

N, F, C = 203, 6, 4  # 203 rows in batches of 32: a last batch of 11


def metric_graph() -> CalcGraph:
    """A linear classifier and a linear regressor trained with Huber and MAE losses, and
    an eval path with every metric statistic."""
    g = CalcGraph(name="metric_stats")
    x = g.placeholder("x", (0, F))
    y = g.placeholder("y", (0,), dtype="int64")
    t = g.placeholder("t", (0, 2))
    wc = g.parameter("wc", (F, C), init=Init.xavier_uniform())
    wr = g.parameter("wr", (F, 2), init=Init.xavier_uniform())
    wb = g.parameter("wb", (F, 2), init=Init.xavier_uniform())
    train = g.path("train", Mode.BACKWARD_ENABLED)
    ce, _ = train.SoftmaxCrossEntropyLoss(train.MatMul(x, wc), y, outputs=2)
    loss = train.Add(train.Add(ce, train.HuberLoss(train.MatMul(x, wr), t, delta=0.5)),
                     train.MAELoss(train.MatMul(x, wb), t))
    train.set_loss(loss)
    ev = g.path("eval", Mode.FORWARD_ONLY)
    ev.ClassCounts(ev.MatMul(x, wc, outputs=["scores"]), y, outputs=["counts"])
    ev.RegressionSums(ev.MatMul(x, wr, outputs=["pred"]), t, outputs=["sums"])
    ev.PositiveScore(ev.MatMul(x, wb), outputs=["positive"])
    g.output("counts", "sums", "positive", "scores", "pred")
    return g


def data() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = R.normal(size=(N, F)).astype(np.float32)
    y = (x[:, :C] + R.normal(scale=0.8, size=(N, C))).argmax(axis=1).astype(np.int64)
    t = (x[:, :2] * [2.0, -1.0] + R.normal(scale=0.3, size=(N, 2)) + 1.0).astype(np.float32)
    return x, y, t


def test_sums_over_batches_give_sklearn_metrics_over_the_set() -> None:
    """Added over batches (the last one smaller), the counts give macro F1 and the sums
    r2, rmse and mae over the whole set, as scikit-learn computes them there."""
    x, y, t = data()
    vm = VM(compile_graph(metric_graph(), batch_size=32, optimizer=SGD(lr=0.05)))
    rng = np.random.default_rng(0)
    for _ in range(3):  # some training, so that predictions are not all one class
        for _ in range(0, N, 32):
            rows = rng.permutation(N)[:32]
            for name, a in (("x", x), ("y", y), ("t", t)):
                vm.set(name, a[rows])
            vm.train_step("train")
    counts, sums = np.zeros((3, C)), np.zeros(4)
    scores, preds, positive = [], [], []
    for start in range(0, N, 32):
        for name, a in (("x", x), ("y", y), ("t", t)):
            vm.set(name, a[start:start + 32])
        vm.forward("eval")
        counts += vm.get("counts")
        sums += vm.get("sums")
        scores.append(vm.get("scores"))
        preds.append(vm.get("pred"))
        positive.append(vm.get("positive"))
    assert vm.batch_size == N % 32  # the last batch ran on prefixes
    pred_class = np.concatenate(scores).argmax(axis=1)
    pred = np.concatenate(preds)
    np.testing.assert_array_equal(counts, class_counts(np.concatenate(scores), y, C))
    tp, npred, ntrue = counts
    seen = npred + ntrue > 0
    macro_f1 = np.mean(2 * tp[seen] / (npred + ntrue)[seen])
    np.testing.assert_allclose(macro_f1, f1_score(y, pred_class, average="macro"), rtol=1e-12)
    n = t.size
    sse, sae, st, st2 = sums
    np.testing.assert_allclose(1 - sse / (st2 - st * st / n),
                               r2_score(t.ravel(), pred.ravel()), rtol=1e-5)
    np.testing.assert_allclose(np.sqrt(sse / n), np.sqrt(mean_squared_error(t, pred)),
                               rtol=1e-5)
    np.testing.assert_allclose(sae / n, mean_absolute_error(t, pred), rtol=1e-5)
    assert np.concatenate(positive).shape == (N,)


def test_plan_is_exact_and_steps_allocate_nothing() -> None:
    """Allocated bytes are the planned bytes, no two live buffers share bytes, and
    training and evaluation steps, full or last-batch, allocate nothing.  The one
    transient allowed is numpy's iteration buffer for a broadcasting ufunc (at most
    8,192 elements per operand: the cross-entropy's row shift takes 34 KB of it); at
    batch 16,384 the smallest batched tensor (PositiveScore's output) is 64 KiB, so a
    temporary copy of any of them would pass the 48 KiB bound."""
    big = 16384
    x, y, t = (np.resize(a, (big, *a.shape[1:])) for a in data())
    for b in (1, 32, 500):
        prog = compile_graph(metric_graph(), batch_size=b, optimizer=SGD(lr=0.05))
        vm = VM(prog)
        assert vm.allocated_bytes == prog.total_bytes
        assert prog.zone_bytes["workspace"] > 0
        assert_no_clobber(prog)
    vm = VM(compile_graph(metric_graph(), batch_size=big, optimizer=SGD(lr=0.05)))
    for rows in (big, 10000):
        for name, a in (("x", x), ("y", y), ("t", t)):
            vm.set(name, a[:rows])

        def step() -> None:
            vm.train_step("train")
            vm.forward("eval")

        retained, peak = step_allocations(step, warmup=10, runs=100)
        assert retained < 4096 and peak < 48 * 1024, (rows, retained, peak)
