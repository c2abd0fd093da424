"""Every engine.nn layer against PyTorch's, with the same weights: the eval forward, the
train path's loss and the gradient of every parameter, and the parameters (and batch
norm's running statistics) after two SGD (momentum, weight decay) and two Adam steps.

A layer without parameters follows a small Linear or 1x1 Conv, whose gradients then
carry the layer's backward."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from engine import nn
from tests.engine.nn.harness import compare

torch = pytest.importorskip("torch", reason="PyTorch (pip install torch==2.13.0) is the reference")
tnn = torch.nn

R = np.random.default_rng(0)
X2 = R.normal(size=(6, 5)).astype(np.float32)
X3 = R.normal(size=(6, 4, 5)).astype(np.float32)
X4 = R.normal(size=(4, 3, 7, 7)).astype(np.float32)


def dense(make: Callable[[Any], Any]) -> tuple[nn.Module, Any, np.ndarray]:
    """``make(lib)`` after a Linear(5, 6) on [b, 5]."""
    return (nn.Sequential(nn.Linear(5, 6), make(nn)), tnn.Sequential(tnn.Linear(5, 6), make(tnn)),
            X2)


def spatial(make: Callable[[Any], Any], x: np.ndarray = X4) -> tuple[nn.Module, Any, np.ndarray]:
    """``make(lib)`` after a 1x1 Conv2d(3, 3) on [b, 3, 7, 7]."""
    return (nn.Sequential(nn.Conv2d(3, 3, 1), make(nn)),
            tnn.Sequential(tnn.Conv2d(3, 3, 1), make(tnn)), x)


def same(make: Callable[[Any], Any], x: np.ndarray) -> tuple[nn.Module, Any, np.ndarray]:
    return make(nn), make(tnn), x


CASES: dict[str, Callable[[], tuple[nn.Module, Any, np.ndarray]]] = {
    "Linear": lambda: same(lambda L: L.Linear(5, 3), X2),
    "Linear-nobias": lambda: same(lambda L: L.Linear(5, 3, bias=False), X2),
    "Linear-3d": lambda: same(lambda L: L.Linear(5, 3), X3),
    "Conv2d": lambda: same(lambda L: L.Conv2d(3, 4, 3), X4),
    "Conv2d-stride-pad": lambda: same(lambda L: L.Conv2d(3, 4, 3, stride=2, padding=1), X4),
    "Conv2d-pad-tuple": lambda: same(lambda L: L.Conv2d(3, 2, (3, 2), padding=(1, 2)), X4),
    "Conv2d-same-odd": lambda: same(lambda L: L.Conv2d(3, 4, 5, padding="same"), X4),
    "Conv2d-same-even": lambda: same(lambda L: L.Conv2d(3, 4, 4, padding="same"), X4),
    "Conv2d-valid": lambda: same(lambda L: L.Conv2d(3, 4, 2, padding="valid"), X4),
    "Conv2d-dilation": lambda: same(lambda L: L.Conv2d(3, 4, 3, dilation=2, padding=2), X4),
    "Conv2d-groups": lambda: same(lambda L: L.Conv2d(4, 6, 3, groups=2, padding=1),
                                  R.normal(size=(3, 4, 6, 6)).astype(np.float32)),
    "Conv2d-depthwise": lambda: same(lambda L: L.Conv2d(3, 3, 3, groups=3, bias=False), X4),
    "Conv2d-reflect": lambda: same(lambda L: L.Conv2d(3, 2, 3, padding=1,
                                                      padding_mode="reflect"), X4),
    "Conv2d-replicate": lambda: same(lambda L: L.Conv2d(3, 2, 3, padding=(2, 1),
                                                        padding_mode="replicate"), X4),
    "Conv2d-circular": lambda: same(lambda L: L.Conv2d(3, 2, 3, padding=1,
                                                       padding_mode="circular"), X4),
    "BatchNorm1d": lambda: dense(lambda L: L.BatchNorm1d(6)),
    "BatchNorm1d-3d": lambda: same(lambda L: L.BatchNorm1d(4, momentum=0.3), X3),
    "BatchNorm2d": lambda: spatial(lambda L: L.BatchNorm2d(3)),
    "BatchNorm2d-eps-momentum": lambda: spatial(lambda L: L.BatchNorm2d(3, eps=1e-3,
                                                                       momentum=0.5)),
    "BatchNorm2d-no-affine": lambda: spatial(lambda L: L.BatchNorm2d(3, affine=False)),
    "BatchNorm2d-no-running": lambda: spatial(lambda L: L.BatchNorm2d(
        3, track_running_stats=False)),
    "LayerNorm": lambda: dense(lambda L: L.LayerNorm(6)),
    "LayerNorm-2d": lambda: same(lambda L: L.LayerNorm((4, 5), eps=1e-3), X3),
    "LayerNorm-no-affine": lambda: dense(lambda L: L.LayerNorm(6, elementwise_affine=False)),
    "LayerNorm-no-bias": lambda: dense(lambda L: L.LayerNorm(6, bias=False)),
    "Dropout-0": lambda: dense(lambda L: L.Dropout(0.0)),
    "MaxPool2d": lambda: spatial(lambda L: L.MaxPool2d(2)),
    "MaxPool2d-stride-pad": lambda: spatial(lambda L: L.MaxPool2d(3, stride=2, padding=1)),
    "MaxPool2d-ceil": lambda: spatial(lambda L: L.MaxPool2d(2, ceil_mode=True)),
    "MaxPool2d-dilation": lambda: spatial(lambda L: L.MaxPool2d(2, stride=1, dilation=2)),
    "AvgPool2d": lambda: spatial(lambda L: L.AvgPool2d(2)),
    "AvgPool2d-pad": lambda: spatial(lambda L: L.AvgPool2d(3, stride=2, padding=1)),
    "AvgPool2d-pad-excluded": lambda: spatial(lambda L: L.AvgPool2d(
        3, stride=2, padding=1, count_include_pad=False)),
    "AvgPool2d-ceil": lambda: spatial(lambda L: L.AvgPool2d(2, ceil_mode=True)),
    "AdaptiveAvgPool2d-1": lambda: spatial(lambda L: L.AdaptiveAvgPool2d((1, 1))),
    "AdaptiveAvgPool2d-2": lambda: spatial(lambda L: L.AdaptiveAvgPool2d(2),
                                           R.normal(size=(2, 3, 4, 6)).astype(np.float32)),
    "Flatten": lambda: spatial(lambda L: L.Flatten()),
    "Flatten-range": lambda: spatial(lambda L: L.Flatten(2, 3)),
    "Identity": lambda: dense(lambda L: L.Identity()),
    "ReLU": lambda: dense(lambda L: L.ReLU()),
    "Tanh": lambda: dense(lambda L: L.Tanh()),
    "Sigmoid": lambda: dense(lambda L: L.Sigmoid()),
    "LeakyReLU": lambda: dense(lambda L: L.LeakyReLU(0.2)),
    "ELU": lambda: dense(lambda L: L.ELU(0.7)),
    "GELU": lambda: dense(lambda L: L.GELU()),
    "GELU-tanh": lambda: dense(lambda L: L.GELU(approximate="tanh")),
    "SiLU": lambda: dense(lambda L: L.SiLU()),
    "Softplus": lambda: dense(lambda L: L.Softplus()),
    "Softplus-beta": lambda: dense(lambda L: L.Softplus(beta=2.0)),
    "Hardswish": lambda: dense(lambda L: L.Hardswish()),
    "Mish": lambda: dense(lambda L: L.Mish()),
    "SELU": lambda: dense(lambda L: L.SELU()),
    "CELU": lambda: dense(lambda L: L.CELU(0.6)),
    "PReLU": lambda: dense(lambda L: L.PReLU()),
    "PReLU-per-channel": lambda: spatial(lambda L: L.PReLU(3, init=0.1)),
    "GroupNorm": lambda: same(lambda L: L.GroupNorm(2, 4),
                              R.normal(size=(3, 4, 5, 5)).astype(np.float32)),
    "GroupNorm-no-affine": lambda: spatial(lambda L: L.GroupNorm(3, 3, eps=1e-3,
                                                                 affine=False)),
    "InstanceNorm2d": lambda: spatial(lambda L: L.InstanceNorm2d(3)),
    "InstanceNorm2d-affine": lambda: spatial(lambda L: L.InstanceNorm2d(3, affine=True)),
    "InstanceNorm1d": lambda: same(lambda L: L.InstanceNorm1d(4, affine=True), X3),
    "Upsample": lambda: spatial(lambda L: L.Upsample(scale_factor=2)),
    "Upsample-size": lambda: spatial(lambda L: L.Upsample(size=(14, 21))),
    "Softmax": lambda: dense(lambda L: L.Softmax(dim=1)),
    "LogSoftmax": lambda: dense(lambda L: L.LogSoftmax(dim=-1)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_layer_matches_pytorch(case: str) -> None:
    torch.manual_seed(0)
    em, tm, x = CASES[case]()
    compare(torch, tm, em, x)


def test_embedding_matches_pytorch() -> None:
    torch.manual_seed(0)
    idx = np.random.default_rng(1).integers(0, 10, size=(5, 3)).astype(np.int64)
    compare(torch, tnn.Embedding(10, 4), nn.Embedding(10, 4), idx, x_dtype="int64")


def test_every_layer_is_covered() -> None:
    """Each layer the package exports has a case here (or its own test)."""
    from engine.nn.layers import LAYERS
    from tests.engine.nn.test_conv1d_vs_torch import CASES as CASES_1D

    covered = {c.split("-")[0] for c in (*CASES, *CASES_1D)} | {"Embedding"}
    assert set(LAYERS) <= covered, set(LAYERS) - covered


def test_dropout_drops_in_training_only() -> None:
    """Dropout's masks are the VM's own draws (not PyTorch's): check the law instead:
    zeros with probability p, the rest scaled by 1/(1-p), and nothing in eval."""
    from tests.engine.nn.harness import compile_checked

    class Drop(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(np.ones((1, 400), np.float32))
            self.drop = nn.Dropout(0.25)

        def forward(self, x: Any) -> Any:
            return self.drop(x * self.w)

    captured = {}

    def loss(out: Any, y: Any) -> Any:
        return (out * y).sum()

    g = nn.to_graph(Drop(), inputs={"x": (0, 400)}, loss=loss, target_shape=(0, 400))
    _, vm = compile_checked(g, 8)
    x = np.ones((8, 400), np.float32)
    vm.set("x", x)
    vm.set("y", x)
    vm.forward("train")
    vm.apply_loss("train")
    vm.backward("train")
    grad = vm.grad("w")  # the sum over the batch of the kept elements, each 1/(1-p)
    captured["kept"] = grad.sum() / (8 * 400) * 0.75
    assert abs(captured["kept"] - 0.75) < 0.03
    assert abs(float(vm.get("loss")) - grad.sum()) < 1e-2 * grad.sum()
    vm.forward("eval")
    assert np.array_equal(vm.get("logits"), x)


@pytest.mark.parametrize(("name", "width"), [("cross_entropy", 2), ("cross_entropy", 3),
                                             ("mse", 1), ("mae", 1), ("huber", 1), ("bce", 1)])
def test_losses_match_pytorch(name: str, width: int) -> None:
    """The built-in losses' values and gradients (through a Linear) and the eval loss;
    the regression losses and bce flatten a [b, 1] output to meet a [b] target."""
    torch.manual_seed(0)
    tm = tnn.Linear(5, width)
    em = nn.Linear(5, width)
    em.load_state_dict(tm.state_dict())
    rng = np.random.default_rng(2)
    x = (rng.normal(size=(8, 5)) * 2).astype(np.float32)
    if name == "cross_entropy":
        y = rng.integers(0, width, size=8).astype(np.int64)
        ref = tnn.functional.cross_entropy(tm(torch.from_numpy(x)), torch.from_numpy(y))
    else:
        y = (rng.normal(size=8) * 2).astype(np.float32)
        if name == "bce":
            y = (y > 0).astype(np.float32)
        out = tm(torch.from_numpy(x))[:, 0]
        f = {"mse": tnn.functional.mse_loss, "mae": tnn.functional.l1_loss,
             "huber": tnn.functional.huber_loss,
             "bce": tnn.functional.binary_cross_entropy_with_logits}[name]
        ref = f(out, torch.from_numpy(y))
    ref.backward()
    from tests.engine.nn.harness import close, compile_checked

    g = nn.to_graph(em, inputs={"x": (0, 5)}, loss=name, metrics=["loss"])
    _, vm = compile_checked(g, 8)
    vm.set("x", x)
    vm.set("y", y)
    vm.forward("train")
    vm.apply_loss("train")
    vm.backward("train")
    close(vm.get("loss"), ref.item())
    close(vm.grad("weight"), tm.weight.grad.numpy())
    close(vm.grad("bias"), tm.bias.grad.numpy())
    vm.forward("eval")
    close(vm.get("eval_loss"), ref.item())


def test_functional_forms_match_pytorch() -> None:
    """nn.functional's forms that the layers do not already cover, in one model."""
    F, TF = nn.functional, tnn.functional

    def body(f: Any, x: Any, w: Any) -> Any:
        h = f.linear(x, w)
        a = f.elu(h, 0.5) + f.leaky_relu(h, 0.3) + f.softplus(h, beta=0.5) + f.gelu(h)
        b = f.log_softmax(h, dim=1) * f.softmax(h, dim=1) + f.silu(h) * f.sigmoid(h)
        return f.relu(a) - f.tanh(b)

    class E(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(np.ones((4, 5), np.float32))

        def forward(self, x: Any) -> Any:
            return body(F, x, self.w)

    class T(tnn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = tnn.Parameter(torch.randn(4, 5))

        def forward(self, x: Any) -> Any:
            return body(TF, x, self.w)

    torch.manual_seed(0)
    compare(torch, T(), E(), X2)


def test_dequantize_linear_matches_pytorch() -> None:
    class E(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(6, 3)

        def forward(self, x: Any) -> Any:
            return self.fc(nn.functional.dequantize_linear(x, 1 / 255))

    class T(tnn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = tnn.Linear(6, 3)

        def forward(self, x: Any) -> Any:
            return self.fc(x.float() * (1 / 255))

    torch.manual_seed(0)
    x = np.random.default_rng(3).integers(0, 256, size=(5, 6)).astype(np.uint8)
    compare(torch, T(), E(), x, x_dtype="uint8")
