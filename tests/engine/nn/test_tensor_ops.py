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


def pieces(x: Any, w: Any) -> Any:
    """[b, 4, 6] -> [b, 4, 6]: chunk, split by size and by sections, contiguous."""
    h = x @ w
    a, b, c = h.chunk(3, dim=-1)  # [b, 4, 2] each
    first, rest = h.split([1, 3], dim=1)  # [b, 1, 6], [b, 3, 6]
    wide, narrow = h.split(4, dim=2)  # [b, 4, 4], [b, 4, 2] (the last shorter)
    odd = h.chunk(4, dim=2)  # ceil(6 / 4) = 2 long: 3 pieces, as PyTorch gives
    assert len(odd) == 3
    mixed = a * b + c + narrow + odd[1]
    t = h.transpose(1, 2).contiguous().view(-1, 4, 6)
    return cat([mixed, wide[..., :2] * rest.mean(1, keepdim=True)[..., 2:4] + first[..., :2]],
               2) + t[..., :4] * 0.5


class Pieces(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(np.zeros((6, 6), np.float32))

    def forward(self, x: Any) -> Any:
        return pieces(x, self.w)


class TorchPieces(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(6, 6) * 0.3)

    def forward(self, x: Any) -> Any:
        return pieces(x, self.w)


def cat(xs: list[Any], dim: int) -> Any:
    return nn.cat(xs, dim) if isinstance(xs[0], nn.Tensor) else torch.cat(xs, dim)


def test_split_chunk_and_contiguous_match_pytorch() -> None:
    torch.manual_seed(0)
    x = np.random.default_rng(1).normal(size=(3, 4, 6)).astype(np.float32)
    compare(torch, TorchPieces(), Pieces(), x)


def causal_layers(self: Any, lib: Any, d: int = 8, heads: int = 2, length: int = 5) -> None:
    """nanoGPT's attention's layers, from ``lib`` (engine.nn or torch.nn)."""
    self.heads = heads
    self.c_attn = lib.Linear(d, 3 * d)
    self.c_proj = lib.Linear(d, d)
    self.mask = np.triu(np.ones((length, length), bool), 1)  # True: not attended


def causal_attention(self: Any, x: Any) -> Any:
    """nanoGPT's attention as its users write it: one projection split into q, k, v,
    heads by view and transpose, a causal mask filled with -inf, contiguous().view."""
    b, t, d = x.shape
    q, k, v = self.c_attn(x).split(d, dim=2)
    q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
    att = (q @ k.transpose(-2, -1)) * (1.0 / np.sqrt(d // self.heads))
    mask = self.mask[:t, :t]
    att = att.masked_fill(torch.from_numpy(mask) if isinstance(att, torch.Tensor) else mask,
                          float("-inf")).softmax(dim=-1)
    y = (att @ v).transpose(1, 2).contiguous().view(b, t, d)
    return self.c_proj(y)


class CausalSelfAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        causal_layers(self, nn)

    forward = causal_attention


class TorchCausal(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        causal_layers(self, torch.nn)

    forward = causal_attention


def test_a_nanogpt_attention_block_matches_pytorch() -> None:
    torch.manual_seed(0)
    x = np.random.default_rng(2).normal(size=(3, 5, 8)).astype(np.float32)
    compare(torch, TorchCausal(), CausalSelfAttention(), x)


def buffered_causal_layers(self: Any, lib: Any, d: int = 8, heads: int = 2,
                           length: int = 6) -> None:
    """nanoGPT's own form: the causal mask a registered buffer of ones below the diagonal
    (``torch.tril``), ``[1, 1, L, L]``, longer than the sequences it masks."""
    self.heads = heads
    self.c_attn = lib.Linear(d, 3 * d)
    self.c_proj = lib.Linear(d, d)
    tril = np.tril(np.ones((length, length), np.float32)).reshape(1, 1, length, length)
    self.register_buffer("bias", torch.from_numpy(tril) if lib is torch.nn else tril)


def buffered_causal_attention(self: Any, x: Any) -> Any:
    """nanoGPT's forward line for line: ``masked_fill(self.bias[:, :, :T, :T] == 0, ...)``."""
    b, t, d = x.size()
    q, k, v = self.c_attn(x).split(d, dim=2)
    k = k.view(b, t, self.heads, d // self.heads).transpose(1, 2)
    q = q.view(b, t, self.heads, d // self.heads).transpose(1, 2)
    v = v.view(b, t, self.heads, d // self.heads).transpose(1, 2)
    att = (q @ k.transpose(-2, -1)) * (1.0 / np.sqrt(k.size(-1)))
    att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
    att = att.softmax(dim=-1)
    y = (att @ v).transpose(1, 2).contiguous().view(b, t, d)
    return self.c_proj(y)


class BufferedCausal(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        buffered_causal_layers(self, nn)

    forward = buffered_causal_attention


class TorchBufferedCausal(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        buffered_causal_layers(self, torch.nn)

    forward = buffered_causal_attention


def test_nanogpts_mask_from_a_buffer_compared_with_zero_matches_pytorch() -> None:
    """A comparison is a bool tensor (Equal), the mask masked_fill takes."""
    torch.manual_seed(0)
    x = np.random.default_rng(3).normal(size=(3, 5, 8)).astype(np.float32)
    compare(torch, TorchBufferedCausal(), BufferedCausal(), x)


@pytest.mark.parametrize("mask,want", [
    (lambda x: x > 0.5, lambda a: a > 0.5),
    (lambda x: x >= 0.5, lambda a: a >= 0.5),
    (lambda x: x < 0.5, lambda a: a < 0.5),
    (lambda x: x <= 0.5, lambda a: a <= 0.5),
    (lambda x: x == 0.5, lambda a: a == 0.5),
    (lambda x: x != 0.5, lambda a: a != 0.5),
    (lambda x: 0.5 < x, lambda a: 0.5 < a),  # noqa: SIM300 (the reflected form)
    (lambda x: ~(x > 0.5), lambda a: ~(a > 0.5)),
    (lambda x: x > x.mean(dim=1, keepdim=True), lambda a: a > a.mean(1, keepdims=True)),
])
def test_comparisons_are_elementwise_masks(mask: Any, want: Any) -> None:
    """Each comparison as PyTorch's: a mask filled where it holds (the gradient flows to
    the values masked_fill keeps, none through the mask)."""
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: Any) -> Any:
            h = self.fc(x)
            return h.masked_fill(mask(x), 0.0)

    from engine import VM, compile_graph

    g = nn.to_graph(M(), inputs={"x": (0, 4)}, loss="mse", target_shape=(0, 4))
    vm = VM(compile_graph(g, batch_size=6))
    a = np.round(np.random.default_rng(4).random((6, 4)), 1).astype(np.float32)
    a[0, :2] = 0.5  # equal to the constant, exactly
    vm.set("x", a)
    vm.forward("eval")
    h = a @ vm.get("fc.weight").T + vm.get("fc.bias")
    np.testing.assert_allclose(vm.get("logits"), np.where(want(a), 0.0, h), rtol=1e-6,
                               atol=1e-6)


class HandRelu(nn.Module):
    """A ReLU as a mask multiplied in: the gradient flows through the product, none
    through the comparison (as in PyTorch)."""

    def __init__(self, lib: Any = nn) -> None:
        super().__init__()
        self.fc = lib.Linear(4, 6)
        self.out = lib.Linear(6, 3)

    def forward(self, x: Any) -> Any:
        h = self.fc(x)
        return self.out(h * (h > 0).to(np.float32 if isinstance(h, nn.Tensor) else torch.float32))


class TorchHandRelu(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 6)
        self.out = torch.nn.Linear(6, 3)

    forward = HandRelu.forward


def test_a_mask_multiplied_in_trains_as_in_pytorch() -> None:
    torch.manual_seed(1)
    x = np.random.default_rng(6).normal(size=(5, 4)).astype(np.float32)
    compare(torch, TorchHandRelu(), HandRelu(), x)


def test_a_comparison_outside_the_numbers_and_tensors_is_pythons() -> None:
    """``==`` with None or a module is Python's (False; identity for parameters), so
    parameters stay items of lists and sets; ~ of a float tensor says what it is."""
    p = nn.Parameter(np.zeros(3, np.float32))
    assert p == p and p != nn.Parameter(np.zeros(3, np.float32)) and p != None  # noqa: E711
    assert p in [nn.Parameter(np.ones(3, np.float32)), p] and len({p, p}) == 1

    class M(nn.Module):
        def forward(self, x: Any) -> Any:
            assert (x == None) is False and (x != "a") is True  # noqa: E711
            return ~x

    with pytest.raises(nn.TraceError, match="~ of a float32 tensor"):
        nn.to_graph(M(), inputs={"x": (0, 4)}, loss=None)


@pytest.mark.parametrize("make,words", [
    (lambda x: x.split(2, dim=0), "split along the batch axis"),
    (lambda x: x.chunk(2, dim=0), "chunk along the batch axis"),
    (lambda x: x.split([2, 2], dim=2), r"split sizes \[2, 2\]: each at least 1, summing to"),
    (lambda x: x.split(0, dim=1), "split size 0"),
    (lambda x: x.chunk(0, dim=1), "chunk into 0 pieces"),
])
def test_bad_splits_say_what_is_wrong(make: Any, words: str) -> None:
    class M(nn.Module):
        def forward(self, x: Any) -> Any:
            return make(x)[0]

    with pytest.raises(nn.TraceError, match=words):
        nn.to_graph(M(), inputs={"x": (0, 4, 6)}, loss="mse", target_shape=(0, 4, 6))


def _mask_of(make: Any, a: np.ndarray, dtype: str) -> np.ndarray:
    """``make(x)``'s mask for an input ``a`` of ``dtype``, as 1.0 where it holds."""
    from engine import VM, compile_graph

    class M(nn.Module):
        def forward(self, x: Any) -> Any:
            return make(x).to("float32")

    g = nn.to_graph(M(), inputs={"x": ((0, *a.shape[1:]), dtype)}, loss=None)
    vm = VM(compile_graph(g, batch_size=len(a)))
    vm.set("x", a)
    vm.forward(g.paths[0].name)
    return vm.get(g.outputs[0])


@pytest.mark.parametrize("dtype,make,words", [
    ("int64", lambda x: x < 2.5, "not a value a int64 holds"),
    ("uint8", lambda x: x > -1, "not a value a uint8 holds"),
    ("uint8", lambda x: x < 300, "not a value a uint8 holds"),
    ("uint8", lambda x: x >= 0.5, "cast the tensor first"),
    ("int32", lambda x: x == np.array([0.5, 1.0]), "not a value a int32 holds"),
    ("float32", lambda x: (x > 0) == 2, "not a value a bool holds"),
    ("float32", lambda x: (x > 0) < 1, "masks compare with == and != only"),
])
def test_a_number_an_integer_or_bool_tensor_cannot_hold_is_refused(
        dtype: str, make: Any, words: str) -> None:
    """Converted to the tensor's type it would compare something else (2.5 -> 2)."""
    with pytest.raises(nn.TraceError, match=words):
        _mask_of(make, np.zeros((2, 2), dtype), dtype)


@pytest.mark.parametrize("dtype,make,want", [
    ("int64", lambda x: x <= 2, lambda a: a <= 2),
    ("uint8", lambda x: x == 255, lambda a: a == 255),
    ("float32", lambda x: (x > 1) == True, lambda a: a > 1),  # noqa: E712 (PyTorch's form)
    ("float32", lambda x: (x > 1) != False, lambda a: a > 1),  # noqa: E712
    ("float32", lambda x: x == True, lambda a: a == 1),  # noqa: E712
    ("float32", lambda x: np.float32(1.5) < x, lambda a: a > 1.5),
    ("float32", lambda x: np.array([0, 1, 2, 3], np.float32) == x, lambda a: a == [0, 1, 2, 3]),
    ("float32", lambda x: np.ones(4, np.float32) != x, lambda a: a != 1),
])
def test_comparisons_with_values_the_type_holds_and_numpy_on_the_left(
        dtype: str, make: Any, want: Any) -> None:
    a = np.array([[0, 1, 2, 3], [3, 2, 255 if dtype == "uint8" else 1, 0]], dtype)
    np.testing.assert_array_equal(_mask_of(make, a, dtype), want(a).astype(np.float32))


def test_iterating_over_a_parameter_says_so() -> None:
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(np.ones((2, 4), np.float32))

        def forward(self, x: Any) -> Any:
            a, b = self.w
            return x * a + b

    with pytest.raises(nn.TraceError, match="iterating over a parameter"):
        nn.to_graph(M(), inputs={"x": (0, 4)}, loss=None)
    p = nn.Parameter(np.zeros(3, np.float32))
    assert (p == 0) is False and (p != 0) is True  # outside a trace: identity, as before
