"""Traced tensor operations (arithmetic with tensors, numbers and numpy arrays,
reshape/view with the symbolic batch, flatten, transpose/permute, cat, indexing,
sum/mean, squeeze/unsqueeze, matmul, ...) written once and run by both libraries: the
same outputs, gradients and optimizer steps as PyTorch."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from engine import nn
from tests.engine.nn.harness import compare, compile_checked

torch = pytest.importorskip("torch", reason="PyTorch (pip install torch==2.13.0) is the reference")

C = np.linspace(-1.0, 1.0, 6, dtype=np.float32)


def body(x: Any, w: Any, v: Any, cat: Any, c: Any) -> Any:
    """[b, 4, 6] and parameters w [6, 6], v [4, 1] -> [b, ...]."""
    b = x.shape[0]
    h = x @ w + v  # matmul, broadcasting add
    h = (h * 0.5 - 1.0) / 2.0 + c  # numbers and a numpy array (torch: a tensor)
    h = 1.0 - h + 3.0 * h - (2.0 / (h ** 2 + 1.0))  # reflected operators, ** 2
    h = -h + abs(h) + (h.abs() + 1.0) ** 0.5 + h.clamp(-0.5, 0.5).exp() + (h * h + 1.0).log()
    t = h.transpose(1, 2)  # [b, 6, 4]
    p = h.permute(0, 2, 1) * t * 0.01  # [b, 6, 4]
    s = p[:, 1:5, ::2] + p[..., 1:5, 1:3]  # slices with steps, an ellipsis
    q = s[:, 0] * s[:, -1, None, 1]  # int index, a new axis
    r = q.unsqueeze(1).squeeze(1).reshape(b, 2, 1)
    m = cat([r, r * 2.0, r.sum(2, keepdim=True)], 2)  # [b, 2, 3]
    m = (m + m.mean(1, keepdim=True) + m.sum((1, 2), keepdim=True)) * 0.1
    z = (m.view(-1, 6) @ w.T + h.flatten(1)[:, :6]) * 0.1
    return ((z * z + 1.0).sqrt().tanh() * z.sigmoid() + z.relu() + z.softmax(1)
            + z.log_softmax(dim=-1)) * 0.01


class E(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(np.zeros((6, 6), np.float32))
        self.v = nn.Parameter(np.zeros((4, 1), np.float32))

    def forward(self, x: Any) -> Any:
        return body(x, self.w, self.v, nn.cat, C)


class T(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(6, 6) * 0.3)
        self.v = torch.nn.Parameter(torch.randn(4, 1) * 0.3)

    def forward(self, x: Any) -> Any:
        return body(x, self.w, self.v, torch.cat, torch.from_numpy(C))


def test_tensor_operations_match_pytorch() -> None:
    torch.manual_seed(0)
    x = np.random.default_rng(0).normal(size=(5, 4, 6)).astype(np.float32)
    compare(torch, T(), E(), x)


def test_shape_shows_the_symbolic_batch() -> None:
    seen = {}

    class M(nn.Module):
        def forward(self, x: Any) -> Any:
            seen["shape"], seen["size1"], seen["ndim"] = x.shape, x.size(1), x.ndim
            seen["flat"] = x.flatten(1).shape
            y = x.reshape(x.shape[0], 12)
            seen["y"] = y.shape
            seen["len"] = len(x.sum(0))  # over the batch: [3, 4]
            return y

    nn.to_graph(M(), inputs={"x": (None, 3, 4)}, loss="mse", target_shape=(0, 12))
    assert seen["shape"] == (nn.batch, 3, 4) and seen["size1"] == 3 and seen["ndim"] == 3
    assert seen["flat"] == (nn.batch, 12) and seen["y"] == (nn.batch, 12)
    assert seen["len"] == 3 and repr(nn.batch) == "batch"


def test_inputs_by_name_and_position() -> None:
    """forward receives the inputs by keyword when its signature names them, else in
    the order of ``inputs``; dtypes come with ``(shape, dtype)``."""

    class Named(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(10, 3)

        def forward(self, tokens: Any, scale: Any) -> Any:
            return self.emb(tokens).sum(1) * scale

    class Positional(Named):
        def forward(self, *args: Any) -> Any:
            return super().forward(*args)

    for cls in (Named, Positional):
        inputs = {"scale": (0, 1), "tokens": ((0, 4), "int64")} if cls is Named else \
            {"tokens": ((0, 4), "int64"), "scale": (0, 1)}
        g = nn.to_graph(cls(), inputs=inputs, loss="mse", target_shape=(0, 3))
        assert g.variables["tokens"].desc.dtype.value == "int64"
        _, vm = compile_checked(g, 2)
        vm.set("tokens", np.array([[1, 2, 3, 4], [0, 0, 0, 9]]))
        vm.set("scale", np.array([[1.0], [2.0]], np.float32))
        vm.forward("eval")
        w = vm.get("emb.weight")
        np.testing.assert_allclose(vm.get("logits"),
                                   [w[1:5].sum(0), 2 * (3 * w[0] + w[9])], rtol=1e-5)
