"""The fused (numba) variants against the numpy ones, on the ops that have both: the
same values to rounding, for float32 and float64, small and large, and no allocation
in a step.  Without numba (or with CALCGRAPH_JIT=0) every op runs its numpy kernel."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from engine.graph import DType, TensorDesc
from engine.ops import OP_TABLE, KernelArgs, get_op, jit
from engine.ops.linalg import GEMM_ATTRS
from tests.allocations import step_allocations

FUSED = sorted(name for name, op in OP_TABLE.items() if "numba" in op.variants)
R = np.random.default_rng(11)


def case(op: str, n: int, dtype: Any, variant: int = 0) -> tuple[list, list, dict]:
    """(inputs, output shapes and types, attributes) of one instruction of ``op``."""
    c, k = 17, 9
    x = R.normal(size=(n, c)).astype(dtype)
    dy = R.normal(size=(n, c)).astype(dtype)
    if op in ("Sigmoid", "Tanh"):
        return [x * 4], [x.shape], {}
    if op in ("SigmoidGrad", "TanhGrad", "ReluGrad"):
        y = {"SigmoidGrad": 1 / (1 + np.exp(-x)), "TanhGrad": np.tanh(x),
             "ReluGrad": np.maximum(x, 0)}[op].astype(dtype)
        return [y, dy], [x.shape], {}
    if op == "SumTo":
        if variant:
            x3 = R.normal(size=(n, 3, c)).astype(dtype)
            return [x3], [(c,)], {"axes": (0, 1), "shape": (c,)}
        return [x], [(1, c)], {"axes": (0,), "shape": (1, c)}
    if op in ("ReduceSum", "ReduceMean"):  # a bias gradient: N, H and W summed
        x4 = R.normal(size=(n, 3, c, 5)).astype(dtype)
        if variant:  # kept axes 1 and 2 as one block, kept dims
            return [x4], [(1, 3, c, 1)], {"axes": (0, 3), "keepdims": 1,
                                          "noop_with_empty_axes": 0}
        return [x4], [(3,)], {"axes": (0, 2, 3), "keepdims": 0, "noop_with_empty_axes": 0}
    if op == "MaxPool":  # 2x2 windows; variant 1: a floored pooling of odd sizes
        img = R.normal(size=(2 if n < 10 else 20, 3, 8 + variant, 6 + variant)).astype(dtype)
        img[0, 0, :2, :2] = 1.0
        return [img], [(img.shape[0], 3, 4, 3)], {**get_op("MaxPool").attrs,
                                                  "kernel_shape": (2, 2), "strides": (2, 2)}
    if op == "FusedGemm":
        a, w, b = (R.normal(size=s).astype(dtype) for s in ((n, k), (k, c), (c,)))
        act = ("Relu", "Sigmoid", "Tanh")[variant]  # Tanh (float32): its own test below
        return [a, w, b], [(n, c)], {**GEMM_ATTRS, "activation": act}
    if op == "MaxPoolGrad":  # variant 0: windows tiling the input; 1: overlapping, padded
        img = R.normal(size=(2 if n < 10 else 20, 3, 9, 9)).astype(dtype)
        img[0, 0, :2, :2] = 1.0  # a tie: the first maximum takes the gradient
        pool = ({"kernel_shape": (2, 2), "strides": (2, 2)},
                {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 0, 1, 1)})[variant]
        mp = get_op("MaxPool")
        y = np.zeros(mp.shape([TensorDesc(DType.of(np.dtype(dtype).name), img.shape)],
                              {**mp.attrs, **pool})[0].shape, dtype)
        mp.kernel(KernelArgs(np, [img], [y], np.zeros(1 << 20, np.uint8),
                             {**mp.attrs, **pool}))()
        return [img, y, R.normal(size=y.shape).astype(dtype)], [img.shape], \
            {**get_op("MaxPoolGrad").attrs, **pool}
    labels = R.integers(0, c, size=n)
    attrs = {"reduction": ("mean", "sum")[variant], "ignore_index": None}
    if op.startswith("Stacked"):  # 4 models' scores [n, 4, c]
        x3 = R.normal(size=(n, 4, c)).astype(dtype)
        if op == "StackedSoftmaxCrossEntropyLoss":
            return [x3, labels], [(4,), x3.shape], {"reduction": attrs["reduction"]}
        logp3 = (x3 - np.log(np.exp(x3).sum(2, keepdims=True))).astype(dtype)
        return [R.uniform(0.5, 2, size=4).astype(dtype), logp3, labels], [x3.shape], \
            {"reduction": attrs["reduction"]}
    if op == "SoftmaxCrossEntropyLoss":
        return [x, labels], [(), x.shape], attrs
    logp = (x - np.log(np.exp(x).sum(1, keepdims=True))).astype(dtype)
    return [np.array(0.75, dtype), logp, labels], [x.shape], attrs


def reference(op: str) -> str:
    """The variant the fused one is checked against: numpy's, or the op's first."""
    return "numpy" if "numpy" in get_op(op).variants else next(iter(get_op(op).variants))


def bind(op: str, variant: str, ins: list, outs: list, attrs: dict) -> tuple[Any, list]:
    dtype = ins[1].dtype if op.endswith("SoftmaxCrossEntropyLossGrad") else ins[0].dtype
    out = [np.zeros(s, dtype) for s in outs]
    ws = np.zeros(1 << 20, np.uint8)
    step = get_op(op).variants[variant].kernel(KernelArgs(np, ins, out, ws, attrs))
    return step, out


@pytest.fixture
def fused_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(jit.ENV, raising=False)
    if jit.kernels() is None:
        pytest.skip("numba is not importable")


@pytest.mark.usefixtures("fused_on")
@pytest.mark.parametrize("op", FUSED)
@pytest.mark.parametrize("n", [3, 1000])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("variant", [0, 1])
def test_fused_variant_matches_numpy(op: str, n: int, dtype: Any, variant: int) -> None:
    ins, outs, attrs = case(op, n, dtype, variant)
    in_descs = [TensorDesc(DType.of(np.asarray(a).dtype.name), np.shape(a)) for a in ins]
    descs = [TensorDesc(DType.of(np.dtype(dtype).name), tuple(s)) for s in outs]
    if not get_op(op).variants["numba"].applies(in_descs, descs, attrs):
        assert (op, dtype) == ("Tanh", np.float64)  # the rational tanh is float32's only
        return
    ref_step, ref = bind(op, reference(op), ins, outs, attrs)
    step, got = bind(op, "numba", ins, outs, attrs)
    assert step.__qualname__ != ref_step.__qualname__, "the numba variant fell back to numpy"
    ref_step()
    step()
    if op in ("ReduceSum", "ReduceMean"):  # reassociated: judged by its error, not by
        #  how numpy's pairwise order happened to round
        x64, keep = ins[0].astype(np.float64), bool(attrs["keepdims"])
        reduce = np.mean if op == "ReduceMean" else np.sum
        exact = reduce(x64, axis=attrs["axes"], keepdims=keep)
        size = reduce(np.abs(x64), axis=attrs["axes"], keepdims=keep)
        assert np.all(np.abs(got[0] - exact) <= 8 * np.finfo(dtype).eps * size)
        return
    tol = 2e-6 if dtype == np.float32 else 1e-12
    for a, b in zip(got, ref, strict=True):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


@pytest.mark.usefixtures("fused_on")
@pytest.mark.parametrize("op", FUSED)
def test_fused_variant_allocates_nothing(op: str) -> None:
    ins, outs, attrs = case(op, 500, np.float32)
    step, _ = bind(op, "numba", ins, outs, attrs)
    # The least of three: numba fills a cache of its own once (32 bytes) on early calls,
    # and tracemalloc also sees the test runner's threads.
    retained, peak = min(step_allocations(step) for _ in range(3))
    assert retained <= 0
    assert peak < 1024  # numba's dispatch: a few small objects at most, never a tensor


@pytest.mark.usefixtures("fused_on")
@pytest.mark.parametrize("op", ["SoftmaxCrossEntropyLoss", "StackedSoftmaxCrossEntropyLoss"])
def test_labels_out_of_range_are_an_error_in_the_fused_loss_too(op: str) -> None:
    from engine.errors import InputError

    ins, outs, attrs = case(op, 4, np.float32)
    ins[1][2] = 17
    step, _ = bind(op, "numba", ins, outs, attrs)
    with pytest.raises(InputError, match=r"labels must lie in \[0, 17\)"):
        step()


def test_without_numba_every_op_runs_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "numba", None)  # import numba raises ImportError
    jit.reset()
    try:
        assert jit.kernels() is None
        assert not jit.use_fused("optimizer", 10**9)
        for op in FUSED:
            ins, outs, attrs = case(op, 50, np.float32)
            ref_step, _ = bind(op, reference(op), ins, outs, attrs)
            step, _ = bind(op, "numba", ins, outs, attrs)
            assert step.__qualname__ == ref_step.__qualname__
    finally:
        jit.reset()


def test_without_numba_training_is_numpys(monkeypatch: pytest.MonkeyPatch) -> None:
    """numba failing to import changes nothing: the same parameters, bit for bit, as
    with the fused kernels switched off."""
    from engine import VM, Adam, compile_graph
    from engine.models import paper_mlp

    x = R.random((32, 20), dtype=np.float32)
    y = R.integers(0, 5, 32)

    def trained() -> np.ndarray:
        vm = VM(compile_graph(paper_mlp((20, 16, 5)), batch_size=32, optimizer=Adam()), seed=3)
        vm.set("x", x)
        vm.set("y", y)
        for _ in range(5):
            vm.train_step("train")
        return vm.get("w0")

    monkeypatch.setenv(jit.ENV, "0")
    off = trained()
    monkeypatch.delenv(jit.ENV)
    monkeypatch.setitem(sys.modules, "numba", None)
    jit.reset()
    try:
        np.testing.assert_array_equal(trained(), off)
    finally:
        jit.reset()


def test_off_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(jit.ENV, "0")
    assert jit.kernels() is None


def test_importing_the_engine_does_not_import_numba() -> None:
    code = "import sys, engine, engine.runtime.vm; print('numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_the_compiled_reduction_is_offered_only_where_it_differs_from_numpys() -> None:
    """A tuner's candidates: axes around a kept block with axes after it, in floats."""
    from engine.ops._base import applicable_variants

    op = get_op("ReduceSum")

    def offered(shape: tuple[int, ...], axes: tuple[int, ...], dtype: DType = DType.FLOAT32
                ) -> tuple[str, ...]:
        ins = [TensorDesc(dtype, shape)]
        attrs = {**op.attrs, "axes": axes, "keepdims": 0}
        return applicable_variants(op, ins, op.shape(ins, attrs), attrs)

    assert offered((8, 4, 5, 5), (0, 2, 3)) == ("numpy", "numba")  # a bias gradient
    assert offered((8, 4, 5, 5), (0,)) == ("numpy",)  # leading axes: numpy's order
    assert offered((8, 4, 5, 5), (0, 1, 2, 3)) == ("numpy",)
    assert offered((8, 4, 5, 5), (1, 3)) == ("numpy",)  # the kept axes are not one block
    assert offered((8, 4, 5, 5), (0, 2, 3), DType.INT64) == ("numpy",)


@pytest.mark.usefixtures("fused_on")
def test_the_compiled_max_pooling_keeps_nan_and_inf_as_numpy_does() -> None:
    img = R.normal(size=(1, 2, 4, 4)).astype(np.float32)
    img[0, 0, 0, 1] = np.nan
    img[0, 0, 2, 2], img[0, 0, 3, 3] = np.inf, -np.inf  # a window with both infinities
    img[0, 1, :2, :2] = -np.inf
    attrs = {**get_op("MaxPool").attrs, "kernel_shape": (2, 2), "strides": (2, 2)}
    ref_step, ref = bind("MaxPool", "views", [img], [(1, 2, 2, 2)], attrs)
    step, got = bind("MaxPool", "numba", [img], [(1, 2, 2, 2)], attrs)
    ref_step()
    step()
    np.testing.assert_array_equal(got[0], ref[0])
    assert np.isnan(got[0][0, 0, 0, 0]) and got[0][0, 0, 1, 1] == np.inf


@pytest.mark.usefixtures("fused_on")
@pytest.mark.parametrize(("op", "over"), [("Sigmoid", 0), ("Tanh", 0), ("SigmoidGrad", 0),
                                          ("SigmoidGrad", 1), ("TanhGrad", 0),
                                          ("TanhGrad", 1), ("ReluGrad", 0), ("ReluGrad", 1)])
def test_run_in_place_the_fused_variant_takes_its_one_array_form(op: str, over: int) -> None:
    # Given one array as input and output, a two-array loop fails LLVM's overlap check
    # and runs scalar: the in-place form must be the one bound, and agree with numpy.
    ins, outs, attrs = case(op, 1000, np.float32)
    ref_step, ref = bind(op, "numpy", [a.copy() for a in ins], outs, attrs)
    ref_step()
    shared = [a.copy() for a in ins]
    step = get_op(op).variants["numba"].kernel(
        KernelArgs(np, shared, [shared[over]], np.zeros(1 << 20, np.uint8), attrs))
    step()
    bound = [getattr(c.cell_contents, "__name__", "") for c in step.__closure__ or ()]
    want = "_in_place" if over == 0 and not op.endswith("Grad") else \
        ("_over_y", "_over_dy")[over]
    assert any(name.endswith(want) for name in bound), bound
    np.testing.assert_allclose(shared[over], ref[0], rtol=2e-6, atol=2e-6)


@pytest.mark.usefixtures("fused_on")
@pytest.mark.parametrize("bias_row", [True, False])
def test_fused_gemm_tanh_takes_the_compiled_tanh_in_float32(bias_row: bool) -> None:
    # With a bias of one row, in the bias's pass; with a bias of full rows, after the
    # Gemm, by Tanh's own compiled kernel: numpy's float32 tanh in neither.
    ins, outs, attrs = case("FusedGemm", 1000, np.float32, 2)
    if not bias_row:
        ins[2] = np.broadcast_to(ins[2], outs[0]).copy()
    ref_step, ref = bind("FusedGemm", "numpy", ins, outs, attrs)
    step, got = bind("FusedGemm", "numba", ins, outs, attrs)
    ref_step()
    step()
    np.testing.assert_allclose(got[0], ref[0], rtol=2e-6, atol=2e-6)
    if bias_row:
        assert step.__qualname__.startswith("_fused_bias_act")
    else:  # the Gemm, then Tanh's compiled kernel
        cells = dict(zip(step.__code__.co_freevars,
                         (c.cell_contents for c in step.__closure__ or ()), strict=True))
        assert cells["act"].__qualname__.startswith("_one_or_two")
