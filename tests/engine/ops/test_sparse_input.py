"""A stack's first layer over shared data: weights kept ``[in, K, out]`` (one GEMM for
the K models, and each input feature's weights of every model one row), and the
``sparse`` form that skips the data's zeros.  The compiled kernels are checked against
numpy's products on data of every density (all zeros, one nonzero, pixels, dense), in
float32 and float64, serial and split over threads; a stack trained under the sparse
form trains each model as alone; the parallel kernel runs only beside a one-thread
BLAS; and a program written with the old ``[K, out, in]`` layout is refused by name."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from engine import SGD, VM, Adam, compile_graph
from engine.autotune import Tuner
from engine.compile.stack import member_params, stack_graphs, stack_optimizers
from engine.errors import EngineError
from engine.graph import Init
from engine.models import paper_mlp
from engine.ops import jit
from engine.runtime.optim import PerModelLR
from engine.runtime.program import Program
from engine.runtime.train import train_epoch
from tests.allocations import step_allocations

ks = jit.kernels()
needs_numba = pytest.mark.skipif(ks is None, reason="numba is not installed")


def _data(rows: int, cols: int, density: float, dtype: Any, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)).astype(dtype)
    x[rng.random((rows, cols)) >= density] = 0
    return x


DENSITIES = [0.0, 0.02, 0.19, 1.0]


@needs_numba
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("density", DENSITIES)
@pytest.mark.parametrize("parts", [1, 2, 3])
def test_the_sparse_kernels_equal_numpy_products(density: float, dtype: Any,
                                                 parts: int) -> None:
    rows, n_in, n_out = 13, 37, 24
    x = _data(rows, n_in, density, dtype)
    x[4] = 0  # a row with nothing to add
    w = np.random.default_rng(1).standard_normal((n_in, n_out)).astype(dtype)
    dy = np.random.default_rng(2).standard_normal((rows, n_out)).astype(dtype)
    y = np.full((rows, n_out), np.nan, dtype)  # every element must be written
    dw = np.full((n_in, n_out), np.nan, dtype)
    if parts == 1:
        ks.sparse_rows_product(x, w, y, 0, rows)
        ks.sparse_rows_weight_grad(x, dy, dw, 0, n_in)
    else:
        ks.sparse_rows_product_parallel(x, w, y, parts)
        ks.sparse_rows_weight_grad_parallel(x, dy, dw, parts)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(y, x.astype(np.float64) @ w, rtol=tol, atol=tol)
    np.testing.assert_allclose(dw, x.T.astype(np.float64) @ dy, rtol=tol, atol=tol)


@needs_numba
def test_a_range_of_rows_leaves_the_others_alone() -> None:
    x = _data(6, 5, 0.5, np.float32)
    w = np.ones((5, 3), np.float32)
    y = np.full((6, 3), -7.0, np.float32)
    ks.sparse_rows_product(x, w, y, 2, 4)
    np.testing.assert_allclose(y[2:4], x[2:4] @ w, rtol=1e-6)
    assert (y[:2] == -7).all() and (y[4:] == -7).all()


def _stack(k: int = 3, sizes: tuple[int, ...] = (20, 8, 4)) -> Any:
    inits = [Init.xavier_uniform(), Init.he_uniform(), Init.normal(0.0, 0.1)]
    return [paper_mlp(sizes, activation="Tanh", init=inits[i % 3]) for i in range(k)]


def test_shared_data_weights_are_kept_in_k_out_with_one_gemm() -> None:
    graphs = _stack()
    prog = compile_graph(stack_graphs(graphs), batch_size=8, optimizer=SGD(lr=0.1))
    w0 = next(b for b in prog.buffers if b.name == "w0")
    w1 = next(b for b in prog.buffers if b.name == "w1")
    assert w0.shape == (20, 3, 8) and w1.shape == (3, 8, 4)
    first = next(i for i in prog.instrs if i.op == "StackedGemm")
    assert first.attrs["model_axis"] == 1 and first.attrs["transB"] == 0
    vm = VM(prog, seed=4)
    # each model's slice is its own [in, out] matrix, drawn as the model alone draws it
    alone = VM(compile_graph(graphs[1], batch_size=8, optimizer=SGD(lr=0.1)), seed=4)
    assert member_params(vm, 1)["w0"].shape == alone.get("w0").shape == (20, 8)


def test_per_model_rates_follow_an_interleaved_parameter() -> None:
    opt = PerModelLR(base=SGD(), lrs=(0.1, 0.2, 0.3))
    runs = opt.rate_runs([(10, 12, 2)])  # [2 rows, 3 models, 2 outputs] at element 10
    assert runs == [(10, 2, 0.1), (12, 2, 0.2), (14, 2, 0.3),
                    (16, 2, 0.1), (18, 2, 0.2), (20, 2, 0.3)]
    with pytest.raises(ValueError, match="runs of 5"):
        opt.rate_runs([(0, 12, 5)])


@pytest.mark.parametrize("form", ["blas", "sparse"])
def test_a_stack_trains_each_model_as_if_alone_in_either_form(form: str) -> None:
    graphs = _stack()
    opts = [Adam(lr=1e-3), Adam(lr=1e-2), Adam(lr=3e-2)]
    prog = compile_graph(stack_graphs(graphs), batch_size=16,
                         optimizer=stack_optimizers(opts), autotune=True)
    stacked = VM(prog, tune=Tuner(cache=False, pin={"stacked form": form}))
    assert stacked.autotune is not None
    assert "sparse" in next(i.variants for i in prog.instrs if i.op == "StackedGemm")
    singles = []
    for k, (g, o) in enumerate(zip(graphs, opts, strict=True)):
        vm = VM(compile_graph(g, batch_size=16, optimizer=o))
        for name, value in member_params(stacked, k).items():
            vm.assign(name, value)
        singles.append(vm)
    x, y = _data(64, 20, 0.2, np.float32, seed=3), np.arange(64) % 4
    for epoch in range(2):
        losses = train_epoch(stacked, x, y, np.random.default_rng(epoch), loss="loss")
        alone = [train_epoch(vm, x, y, np.random.default_rng(epoch)) for vm in singles]
        np.testing.assert_allclose(losses, alone, rtol=2e-5, atol=1e-6)
    first = next(k for k, i in enumerate(prog.instrs)
                 if i.op == "StackedGemm" and i.attrs["model_axis"])
    assert stacked.autotune.choices()[first] == form
    for k, vm in enumerate(singles):
        for name, value in member_params(stacked, k).items():
            np.testing.assert_allclose(value, vm.get(name), rtol=1e-4, atol=2e-6)
    for _ in range(1000):  # the other ops' decisions (fused or numpy) are still timed
        if stacked.autotune.frozen:
            break
        stacked.train_step("train")
    assert stacked.autotune.frozen
    retained, _ = step_allocations(lambda: stacked.train_step("train"), warmup=3, runs=10)
    assert retained < 4096


def test_the_parallel_kernel_waits_for_a_one_thread_blas(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    pytest.importorskip("numba")
    threadpoolctl = pytest.importorskip("threadpoolctl")
    import numba

    monkeypatch.setattr(numba.config, "NUMBA_NUM_THREADS", 4)
    for blas_threads, want in ((2, 1), (1, 4)):
        info = [{"user_api": "blas", "num_threads": blas_threads}]
        monkeypatch.setattr(threadpoolctl, "threadpool_info", lambda info=info: info)
        monkeypatch.setattr(jit, "_threads", None)
        assert jit.parallel_threads() == want
    monkeypatch.setattr(jit, "_threads", None)


def test_a_program_written_with_the_old_transposed_layout_is_refused() -> None:
    prog = compile_graph(stack_graphs(_stack(2)), batch_size=4, optimizer=SGD(lr=0.1))
    d = json.loads(prog.to_json())
    ps = next(p for p in d["params"] if p["init"]["method"] == "stacked")
    ps["init"]["transposed"] = False  # what older versions wrote for every stacked init
    Program.from_json(json.dumps(d))
    ps["init"]["transposed"] = True
    with pytest.raises(EngineError, match=r"\[K, out, in\]"):
        Program.from_json(json.dumps(d))
