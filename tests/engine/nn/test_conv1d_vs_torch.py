"""engine.nn's 1-D layers (Conv1d, MaxPool1d, AvgPool1d, AdaptiveAvgPool1d) and their
functional forms against PyTorch's, with the same weights: the eval forward, the train
path's loss and every parameter's gradient, the parameters after optimizer steps, exact
memory and steps that allocate nothing (:func:`tests.engine.nn.harness.compare`).

A pooling layer follows a 1x1 Conv1d, whose weight gradient then carries the pooling's
input gradient."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from engine import SGD, compile_graph, nn
from engine.nn import NNError, TraceError
from engine.nn import functional as F
from engine.nn import layers as L
from tests.engine.nn.harness import compare, sum_loss

torch = pytest.importorskip("torch", reason="PyTorch (pip install torch==2.13.0) is the reference")
tnn = torch.nn

R = np.random.default_rng(0)
X = R.normal(size=(4, 3, 11)).astype(np.float32)  # [batch, channels, length]
X4 = R.normal(size=(3, 4, 10)).astype(np.float32)  # four channels, for groups
X12 = R.normal(size=(2, 3, 12)).astype(np.float32)


def same(make: Callable[[Any], Any], x: np.ndarray = X) -> tuple[nn.Module, Any, np.ndarray]:
    """``make(L)`` with L the engine's layers or torch.nn."""
    return make(L), make(tnn), x


def pooled(make: Callable[[Any], Any], x: np.ndarray = X) -> tuple[nn.Module, Any, np.ndarray]:
    """``make(L)`` after a 1x1 Conv1d(3, 3)."""
    return (nn.Sequential(L.Conv1d(3, 3, 1), make(L)),
            tnn.Sequential(tnn.Conv1d(3, 3, 1), make(tnn)), x)


CASES: dict[str, Callable[[], tuple[nn.Module, Any, np.ndarray]]] = {
    "Conv1d": lambda: same(lambda M: M.Conv1d(3, 5, 3)),
    "Conv1d-nobias": lambda: same(lambda M: M.Conv1d(3, 5, 4, bias=False)),
    "Conv1d-kernel-tuple": lambda: same(lambda M: M.Conv1d(3, 2, (5,), stride=(2,),
                                                           padding=(1,))),
    "Conv1d-stride-pad": lambda: same(lambda M: M.Conv1d(3, 4, 3, stride=2, padding=1)),
    "Conv1d-stride3-uneven": lambda: same(lambda M: M.Conv1d(3, 4, 2, stride=3)),
    "Conv1d-same-odd": lambda: same(lambda M: M.Conv1d(3, 4, 5, padding="same")),
    "Conv1d-same-even": lambda: same(lambda M: M.Conv1d(3, 4, 4, padding="same")),
    "Conv1d-same-dilation": lambda: same(lambda M: M.Conv1d(3, 4, 4, padding="same",
                                                            dilation=3)),
    "Conv1d-valid": lambda: same(lambda M: M.Conv1d(3, 4, 2, padding="valid")),
    "Conv1d-dilation": lambda: same(lambda M: M.Conv1d(3, 4, 3, dilation=2, padding=2)),
    "Conv1d-dilation-stride": lambda: same(lambda M: M.Conv1d(3, 4, 3, stride=2,
                                                              dilation=3)),
    "Conv1d-groups": lambda: same(lambda M: M.Conv1d(4, 6, 3, groups=2, padding=1), X4),
    "Conv1d-depthwise": lambda: same(lambda M: M.Conv1d(4, 8, 3, groups=4, bias=False), X4),
    "Conv1d-kernel-whole": lambda: same(lambda M: M.Conv1d(3, 2, 11)),
    "Conv1d-reflect": lambda: same(lambda M: M.Conv1d(3, 2, 3, padding=2,
                                                      padding_mode="reflect")),
    "Conv1d-replicate": lambda: same(lambda M: M.Conv1d(3, 2, 4, padding="same",
                                                        padding_mode="replicate")),
    "Conv1d-circular": lambda: same(lambda M: M.Conv1d(3, 2, 3, stride=2, padding=1,
                                                       padding_mode="circular")),
    "MaxPool1d": lambda: pooled(lambda M: M.MaxPool1d(2)),
    "MaxPool1d-stride-pad": lambda: pooled(lambda M: M.MaxPool1d(3, stride=2, padding=1)),
    "MaxPool1d-overlap": lambda: pooled(lambda M: M.MaxPool1d(4, stride=1)),
    "MaxPool1d-ceil": lambda: pooled(lambda M: M.MaxPool1d(2, ceil_mode=True)),
    "MaxPool1d-ceil-pad": lambda: pooled(lambda M: M.MaxPool1d(4, stride=3, padding=2,
                                                               ceil_mode=True)),
    "MaxPool1d-dilation": lambda: pooled(lambda M: M.MaxPool1d(3, stride=2, dilation=2,
                                                               padding=1)),
    "AvgPool1d": lambda: pooled(lambda M: M.AvgPool1d(2)),
    "AvgPool1d-pad": lambda: pooled(lambda M: M.AvgPool1d(3, stride=2, padding=1)),
    "AvgPool1d-pad-excluded": lambda: pooled(lambda M: M.AvgPool1d(
        3, stride=2, padding=1, count_include_pad=False)),
    "AvgPool1d-ceil": lambda: pooled(lambda M: M.AvgPool1d(3, ceil_mode=True)),
    "AvgPool1d-ceil-pad-excluded": lambda: pooled(lambda M: M.AvgPool1d(
        4, stride=3, padding=2, ceil_mode=True, count_include_pad=False)),
    "AdaptiveAvgPool1d-1": lambda: pooled(lambda M: M.AdaptiveAvgPool1d(1)),
    "AdaptiveAvgPool1d-even": lambda: pooled(lambda M: M.AdaptiveAvgPool1d(4), X12),
    "AdaptiveAvgPool1d-uneven": lambda: pooled(lambda M: M.AdaptiveAvgPool1d((4,))),
    "AdaptiveAvgPool1d-longer": lambda: pooled(lambda M: M.AdaptiveAvgPool1d(15)),
}


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")
@pytest.mark.parametrize("case", sorted(CASES))
def test_layer_matches_pytorch(case: str) -> None:
    """One optimizer (the layers' forward and backward are what is new here); the whole
    network below runs both."""
    torch.manual_seed(0)
    em, tm, x = CASES[case]()
    compare(torch, tm, em, x, optimizers=("sgd",))


def test_every_1d_layer_is_covered() -> None:
    names = {c.split("-")[0] for c in CASES}
    assert {"Conv1d", "MaxPool1d", "AvgPool1d", "AdaptiveAvgPool1d"} <= names
    assert names <= set(L.LAYERS)


def test_defaults_match_pytorch() -> None:
    """Parameter names, shapes and the init's bound (PyTorch's kaiming_uniform_(a=sqrt 5)
    gives 1/sqrt(fan_in) for weight and bias alike)."""
    for args, kw in [((3, 5, 4), {}), ((4, 6, 3), {"groups": 2, "bias": False}),
                     ((2, 2, (7,)), {"padding": "same"})]:
        em, tm = L.Conv1d(*args, **kw), tnn.Conv1d(*args, **kw)
        got = {k: p.shape for k, p in em.named_parameters()}
        assert got == {k: tuple(v.shape) for k, v in tm.state_dict().items()}
        bound = float(tm.weight.detach().abs().max())
        assert bound <= em.weight.init.high < bound * 1.5
        assert em.weight.init.low == -em.weight.init.high
        assert (em.kernel_size, em.stride, em.padding, em.dilation) == \
            (tm.kernel_size, tm.stride, tm.padding, tm.dilation)


def test_functional_forms_match_pytorch() -> None:
    """conv1d, max_pool1d, avg_pool1d and adaptive_avg_pool1d called as functions, with
    PyTorch's tuple arguments, in one model."""

    def body(f: Any, x: Any, w: Any, b: Any) -> Any:
        h = f.conv1d(x, w, b, stride=(1,), padding=(2,), dilation=(2,), groups=1)
        a = f.max_pool1d(h, (3,), stride=(2,), padding=(1,), ceil_mode=True)
        c = f.avg_pool1d(h, 2, padding=1, count_include_pad=False)
        return f.adaptive_avg_pool1d(a, 3) + f.adaptive_avg_pool1d(c, (3,))

    class E(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(np.ones((4, 3, 3), np.float32))
            self.b = nn.Parameter(np.ones((4,), np.float32))

        def forward(self, x: Any) -> Any:
            return body(F, x, self.w, self.b)

    class T(tnn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = tnn.Parameter(torch.randn(4, 3, 3))
            self.b = tnn.Parameter(torch.randn(4))

        def forward(self, x: Any) -> Any:
            return body(tnn.functional, x, self.w, self.b)

    torch.manual_seed(0)
    compare(torch, T(), E(), X, optimizers=("adam",))


def cnn(M: Any) -> Any:
    """Conv1d-ReLU-MaxPool1d-Conv1d-ReLU-AdaptiveAvgPool1d-Flatten-Linear, in ``M``
    (the engine's layers or torch.nn)."""
    if M is L:
        M = SimpleNamespace(**vars(L), Sequential=nn.Sequential)
    return M.Sequential(M.Conv1d(3, 8, 5, padding="same"), M.ReLU(), M.MaxPool1d(2),
                        M.Conv1d(8, 6, 3, stride=2, padding=1, groups=2), M.ReLU(),
                        M.AdaptiveAvgPool1d(2), M.Flatten(), M.Linear(12, 4))


def test_small_1d_cnn_matches_pytorch() -> None:
    """The whole network, three steps of each optimizer: the second Conv1d's input
    gradient carries the first one's."""
    torch.manual_seed(0)
    seq = R.normal(size=(5, 3, 20)).astype(np.float32)
    compare(torch, cnn(tnn), cnn(L), seq, steps=3)


VIEWS = ("Unsqueeze", "Squeeze", "Reshape")


def test_eval_path_exports_to_onnx() -> None:
    """The 1-D layers' ops (Unsqueeze, Conv, Squeeze, 1-D MaxPool and AveragePool, the
    adaptive pooling's MatMul) export and run in onnxruntime with the engine's outputs."""
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is a dev extra")
    from engine import VM
    from engine.onnx_io import export_onnx

    net = nn.Sequential(L.Conv1d(2, 4, 3, padding="same"), L.ReLU(),
                        L.MaxPool1d(2, ceil_mode=True), L.AvgPool1d(2, padding=1),
                        L.Conv1d(4, 4, 3, groups=2), L.AdaptiveAvgPool1d(3), L.Flatten(),
                        L.Linear(12, 3))
    g = nn.to_graph(net, inputs={"x": (0, 2, 17)})
    vm = VM(compile_graph(g, batch_size=5), seed=2)
    x = R.normal(size=(5, 2, 17)).astype(np.float32)
    vm.set("x", x)
    vm.forward("eval")
    model = export_onnx(g, ["logits"], vm=vm)
    got = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, vm.get("logits"), rtol=1e-5, atol=1e-6)


def test_reshapes_copy_only_into_memory_of_its_own() -> None:
    """The Unsqueeze and Squeeze around Conv are views: each is planned in its input's
    bytes, whether that input dies there or stays live (a parameter, the input, an
    activation the backward reads again), so they copy nothing.  What remains copied is
    a view whose output keeps memory of its own: each weight's gradient and the eval
    path's logits (read back)."""
    model = nn.Sequential(L.Conv1d(3, 4, 3, padding=1), L.ReLU(), L.Conv1d(4, 4, 3),
                          L.ReLU(), L.Conv1d(4, 2, 1), L.Flatten())
    g = nn.to_graph(model, inputs={"x": (0, 3, 9)}, loss=sum_loss, target_shape=(0, 14))
    prog = compile_graph(g, batch_size=4, optimizer=SGD(lr=0.1))
    last_read: dict[int, int] = {}
    for t, instr in enumerate(prog.instrs):
        last_read.update(dict.fromkeys(instr.ins, t))
    copies: dict[str, list[str]] = {}
    live_views: dict[str, int] = {}
    for path in prog.paths:
        copies[path.name] = []
        live_views[path.name] = 0
        for t in (*path.forward, *path.backward):
            instr = prog.instrs[t]
            if instr.op not in ("Unsqueeze", "Squeeze", "Reshape"):
                continue
            src, dst = prog.buffers[instr.ins[0]], prog.buffers[instr.outs[0]]
            if (src.zone, src.offset) == (dst.zone, dst.offset):
                live_views[path.name] += last_read[instr.ins[0]] > t or not src.shared
                continue
            assert dst.shared is False, instr  # a copy only into memory of its own
            copies[path.name].append(dst.name)
    weights = ["0.weight", "2.weight", "4.weight"]
    assert sorted(copies["train"]) == [f"{w}.grad" for w in weights]
    assert copies["eval"] == ["logits"]
    # x, the three weights; in train also the two ReLU outputs the backward reads
    assert live_views == {"train": 6, "eval": 4}


# -- bad input -----------------------------------------------------------------------------


def same_x(x: Any) -> Any:
    return x


def trace(make: Callable[[], Any], prep: Callable[[Any], Any]) -> TraceError:
    """Trace ``make()`` (a layer, made in ``__init__``, or a function) on ``prep(x)``
    of an input ``[batch, 3, 6]``; the TraceError it raises, which points here."""

    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.f = make()

        def forward(self, x: Any) -> Any:
            return self.f(prep(x))

    with pytest.raises(TraceError) as info:
        nn.to_graph(M(), inputs={"x": (0, 3, 6)}, loss=None)
    assert info.value.filename == __file__, str(info.value)
    return info.value


BAD: dict[str, tuple[Callable[[], Any], Callable[[Any], Any], list[str]]] = {
    "conv-kernel-too-long": (lambda: L.Conv1d(3, 2, 7), same_x,
                             ["conv1d", "kernel spans 7", "padded input's length 6"]),
    "conv-dilated-too-long": (lambda: L.Conv1d(3, 2, 3, dilation=3), same_x,
                              ["conv1d", "kernel spans 7", "dilation 3", "length 6"]),
    "maxpool-too-long": (lambda: L.MaxPool1d(4, padding=2, dilation=4), same_x,
                         ["max_pool1d", "kernel spans 13", "padded input's length 10",
                          "padding (2, 2)"]),
    "avgpool-too-long": (lambda: L.AvgPool1d(9), same_x,
                         ["avg_pool1d", "kernel spans 9", "length 6"]),
    "conv-rank": (lambda: L.Conv1d(3, 2, 3), lambda x: x.unsqueeze(2),
                  ["conv1d needs a 3-D input [batch, channels, length]", "(batch, 3, 1, 6)"]),
    "maxpool-rank": (lambda: L.MaxPool1d(2), lambda x: x.flatten(1),
                     ["max_pool1d needs a 3-D input", "(batch, 18)"]),
    "avgpool-rank": (lambda: L.AvgPool1d(2), lambda x: x.unsqueeze(3),
                     ["avg_pool1d needs a 3-D input"]),
    "adaptive-rank": (lambda: L.AdaptiveAvgPool1d(2), lambda x: x.flatten(1),
                      ["adaptive_avg_pool1d needs a 3-D input"]),
    "conv-channels": (lambda: L.Conv1d(4, 2, 3), same_x,
                      ["input of 3 channels", "takes 4 channels"]),
    "conv-stride": (lambda: L.Conv1d(3, 2, 3, stride=0), same_x,
                    ["stride must be an int >= 1", "got 0"]),
    "conv-same-strided": (lambda: L.Conv1d(3, 2, 3, stride=2, padding="same"), same_x,
                          ["padding='same'", "stride 1"]),
    "conv-padding-name": (lambda: L.Conv1d(3, 2, 3, padding="full"), same_x,
                          ["padding must be", "'full'"]),
    "conv-padding-mode": (lambda: L.Conv1d(3, 2, 3, padding=1, padding_mode="mirror"), same_x,
                          ["padding_mode", "'mirror'"]),
    "maxpool-padding": (lambda: L.MaxPool1d(3, padding=2), same_x,
                        ["padding 2 is more than half the kernel_size 3"]),
    "kernel-pair": (lambda: lambda x: F.max_pool1d(x, (2, 2)), same_x,
                    ["kernel_size must be an int", "(2, 2)"]),
    "negative-padding": (lambda: lambda x: F.avg_pool1d(x, 2, padding=-1), same_x,
                         ["padding must be an int >= 0", "got -1"]),
    "output-size": (lambda: lambda x: F.adaptive_avg_pool1d(x, 0), same_x,
                    ["output_size must be an int >= 1"]),
    "return-indices": (lambda: lambda x: F.max_pool1d(x, 2, return_indices=True), same_x,
                       ["max_pool1d(return_indices=True) is not supported"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_a_clear_trace_error(case: str) -> None:
    make, prep, words = BAD[case]
    text = str(trace(make, prep))
    for w in words:
        assert w in text, text


def test_conv1d_weight_must_be_3d() -> None:
    w = nn.Parameter(np.ones((2, 3, 1, 3), np.float32))

    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = w

        def forward(self, x: Any) -> Any:
            return F.conv1d(x, self.w)

    with pytest.raises(TraceError, match=r"conv1d needs a 3-D weight .*\(2, 3, 1, 3\)"):
        nn.to_graph(M(), inputs={"x": (0, 3, 6)}, loss=None)


def test_constructor_errors() -> None:
    with pytest.raises(NNError, match="in_channels 3 and out_channels 4 must be divisible "
                                      "by groups 2"):
        L.Conv1d(3, 4, 3, groups=2)
    with pytest.raises(NNError, match=r"MaxPool1d\(return_indices=True\) is not supported"):
        L.MaxPool1d(2, return_indices=True)
