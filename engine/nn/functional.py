"""The functional forms (PyTorch's ``torch.nn.functional``), each recording ops of the
engine's table on the path being traced.

Where the table has the op, it is used (``relu`` is ``Relu``, ``conv2d`` is ``Conv``,
``cross_entropy`` is ``SoftmaxCrossEntropyLoss``...); the rest are composed of
differentiable ops: ``silu`` is ``x * Sigmoid(x)``, ``group_norm`` is
InstanceNormalization of the groups and a per-channel affine step,
``binary_cross_entropy_with_logits`` is ``mean(Softplus(x) - x * y)``.

>>> from engine import nn
>>> F = nn.functional
>>> class M(nn.Module):
...     def forward(self, x):
...         return F.log_softmax(F.silu(x), dim=1)
>>> g = nn.to_graph(M(), inputs={"x": (0, 3)}, loss=None)
>>> [n.op for n in g.paths[0].nodes]
['Sigmoid', 'Mul', 'LogSoftmax']
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.nn._tensor import Tensor, _axis, _Ops, as_tensor, reshape
from engine.nn._trace import TraceError
from engine.nn.attention import einsum, masked_fill, matmul, scaled_dot_product_attention

__all__ = [
    "adaptive_avg_pool1d",
    "adaptive_avg_pool2d",
    "avg_pool1d",
    "avg_pool2d",
    "batch_norm",
    "binary_cross_entropy_with_logits",
    "cat",
    "conv1d",
    "conv2d",
    "cross_entropy",
    "dequantize_linear",
    "dropout",
    "einsum",
    "elu",
    "embedding",
    "flatten",
    "gelu",
    "global_avg_pool",
    "huber_loss",
    "l1_loss",
    "layer_norm",
    "leaky_relu",
    "linear",
    "log_softmax",
    "masked_fill",
    "matmul",
    "max_pool1d",
    "max_pool2d",
    "mse_loss",
    "relu",
    "scaled_dot_product_attention",
    "sigmoid",
    "silu",
    "softmax",
    "softplus",
    "tanh",
]


def _t(x: Any) -> Tensor:
    if not isinstance(x, _Ops):
        raise TraceError(f"expected a traced tensor, got {type(x).__name__}")
    return x._t()


def _unary(op: str, x: Any, **attrs: Any) -> Tensor:
    t = _t(x)
    return t._emit(op, t, **attrs)


# -- activations ---------------------------------------------------------------------------


def relu(x: Any, inplace: bool = False) -> Tensor:
    """``max(x, 0)``: Relu."""
    return _unary("Relu", x)


def tanh(x: Any) -> Tensor:
    """Tanh."""
    return _unary("Tanh", x)


def sigmoid(x: Any) -> Tensor:
    """Sigmoid."""
    return _unary("Sigmoid", x)


def leaky_relu(x: Any, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:
    """LeakyRelu(alpha=negative_slope)."""
    return _unary("LeakyRelu", x, alpha=float(negative_slope))


def elu(x: Any, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    """Elu(alpha)."""
    return _unary("Elu", x, alpha=float(alpha))


def silu(x: Any, inplace: bool = False) -> Tensor:
    """``x * sigmoid(x)``: Sigmoid and Mul."""
    t = _t(x)
    return t * sigmoid(t)


def erf(x: Any) -> Tensor:
    """The error function: one Erf op (Abramowitz & Stegun 7.1.26 away from zero, an
    absolute error below 1.5e-7, and its Taylor series near zero)."""
    return _unary("Erf", x)


def hardswish(x: Any, inplace: bool = False) -> Tensor:
    """``x * relu6(x + 3) / 6``: HardSwish."""
    return _unary("HardSwish", x)


def mish(x: Any, inplace: bool = False) -> Tensor:
    """``x * tanh(softplus(x))``: Mish."""
    return _unary("Mish", x)


def selu(x: Any, inplace: bool = False) -> Tensor:
    """Selu, with PyTorch's (and ONNX's) alpha and scale."""
    return _unary("Selu", x)


def celu(x: Any, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    """``max(0, x) + min(0, alpha (exp(x / alpha) - 1))``: Celu."""
    if alpha == 0:
        raise TraceError("celu: alpha must not be 0")
    return _unary("Celu", x, alpha=float(alpha))


def prelu(x: Any, weight: Any) -> Tensor:
    """``x if x > 0 else weight x``: PRelu, ``weight`` one slope, or one per channel
    (axis 1, as PyTorch's)."""
    t, w = _t(x), _t(weight)
    n = 1
    for d in w.desc.shape:
        n *= int(d)
    if n > 1:
        if t.ndim < 2 or int(t.desc.shape[1]) != n:
            raise TraceError(f"prelu: {n} slopes for an input {t.shape} whose axis 1 is not "
                             f"{n} channels")
        w = w.reshape(n, *(1,) * (t.ndim - 2))
    return t._emit("PRelu", t, w)


def gelu(x: Any, approximate: str = "none") -> Tensor:
    """``x * Phi(x)``: one Gelu op (its gradient reads ``x`` alone), the error function
    as :func:`erf` computes it with ``approximate="none"`` (PyTorch's default), or
    ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` with ``"tanh"``."""
    if approximate not in ("none", "tanh"):
        raise TraceError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _unary("Gelu", x, approximate=approximate)


def softplus(x: Any, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """``log(1 + exp(beta x)) / beta``: Softplus (computed as ``logaddexp(0, x)``, which
    equals ``x`` in float32 beyond PyTorch's linear ``threshold``)."""
    t = _t(x)
    if beta == 1.0:
        return _unary("Softplus", t)
    return _unary("Softplus", t * float(beta)) * (1.0 / float(beta))


def _dim(x: Tensor, dim: int | None, name: str) -> int:
    if dim is None:
        raise TraceError(f"{name}: give dim= (PyTorch's implicit choice of dim is deprecated)")
    return _axis(dim, x.ndim)


def softmax(x: Any, dim: int | None = None) -> Tensor:
    """Softmax along ``dim``."""
    t = _t(x)
    return t._emit("Softmax", t, axis=_dim(t, dim, "softmax"))


def log_softmax(x: Any, dim: int | None = None) -> Tensor:
    """LogSoftmax along ``dim``."""
    t = _t(x)
    return t._emit("LogSoftmax", t, axis=_dim(t, dim, "log_softmax"))


def dropout(x: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Dropout(ratio=p) where ``training`` (zeroes with probability ``p``, scales the rest
    by ``1/(1-p)``); the input itself otherwise, and on a FORWARD_ONLY path."""
    t = _t(x)
    if not 0.0 <= p < 1.0:
        raise TraceError(f"dropout probability must be in [0, 1), got {p}")
    if not training or p == 0.0 or not t.tracer.training:
        return t
    return t._emit("Dropout", t, ratio=float(p))


# -- layers --------------------------------------------------------------------------------


def linear(x: Any, weight: Any, bias: Any = None) -> Tensor:
    """``x @ weight.T + bias`` with PyTorch's ``weight [out, in]``: one Gemm (transB=1)
    for a 2-D input, MatMulT and Add for more dimensions."""
    t, w = _t(x), _t(weight)
    b = None if bias is None else _t(bias)
    if t.ndim == 2:
        return t._emit("Gemm", t, w, *([b] if b is not None else []), transB=1)
    y = t._emit("MatMulT", t, w, transB=1)
    return y if b is None else y + b


def _pair(v: Any, name: str) -> tuple[int, int]:
    if isinstance(v, int) and not isinstance(v, bool):
        return (v, v)
    if isinstance(v, Sequence) and len(v) == 2 and all(isinstance(i, int) for i in v):
        return (int(v[0]), int(v[1]))
    raise TraceError(f"{name} must be an int or a pair of ints, got {v!r}")


def conv_pads(padding: Any, kernel: tuple[int, int], dilation: tuple[int, int],
              stride: tuple[int, int]) -> tuple[int, int, int, int]:
    """ONNX pads ``(top, left, bottom, right)`` of PyTorch's ``padding``: an int, a pair,
    ``"valid"`` or ``"same"`` (stride 1; an odd total puts the extra row/column at the
    end, as PyTorch does)."""
    if padding == "valid":
        return (0, 0, 0, 0)
    if padding == "same":
        if stride != (1, 1):
            raise TraceError("padding='same' needs stride 1 (as in PyTorch)")
        tot = [d * (k - 1) for d, k in zip(dilation, kernel, strict=True)]
        return (tot[0] // 2, tot[1] // 2, tot[0] - tot[0] // 2, tot[1] - tot[1] // 2)
    if isinstance(padding, str):
        raise TraceError(f"padding must be 'same', 'valid', an int or a pair, got {padding!r}")
    ph, pw = _pair(padding, "padding")
    return (ph, pw, ph, pw)


_PAD_MODES = {"reflect": "reflect", "replicate": "edge", "circular": "wrap"}


def conv2d(x: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0,
           dilation: Any = 1, groups: int = 1, padding_mode: str = "zeros") -> Tensor:
    """Conv over ``[b, C, H, W]`` with ``weight [out, C/groups, kh, kw]``; ``padding_mode``
    other than zeros pads first with Pad (reflect, edge, wrap)."""
    t, w = _t(x), _t(weight)
    if t.ndim != 4:
        raise TraceError(f"conv2d needs a 4-D input [batch, channels, height, width], got "
                         f"{t.shape}")
    if w.ndim != 4:
        raise TraceError(f"conv2d needs a 4-D weight, got {w.shape}")
    kernel = (int(w.desc.shape[2]), int(w.desc.shape[3]))
    st, dl = _pair(stride, "stride"), _pair(dilation, "dilation")
    pads = conv_pads(padding, kernel, dl, st)
    if padding_mode != "zeros":
        mode = _PAD_MODES.get(padding_mode)
        if mode is None:
            raise TraceError(f"padding_mode must be zeros, reflect, replicate or circular, got "
                             f"{padding_mode!r}")
        if any(pads):
            t = t._emit("Pad", t, pads=pads, mode=mode, axes=(2, 3))
        pads = (0, 0, 0, 0)
    ins = [t, w] + ([_t(bias)] if bias is not None else [])
    return t._emit("Conv", *ins, kernel_shape=kernel, strides=st, dilations=dl, pads=pads,
                   group=int(groups))


def _pool_args(kernel_size: Any, stride: Any, padding: Any, t: Tensor, name: str
               ) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int, int, int]]:
    if t.ndim != 4:
        raise TraceError(f"{name} needs a 4-D input [batch, channels, height, width], got "
                         f"{t.shape}")
    k = _pair(kernel_size, "kernel_size")
    s = k if stride is None or stride == [] else _pair(stride, "stride")
    p = _pair(padding, "padding")
    if p[0] * 2 > k[0] or p[1] * 2 > k[1]:
        raise TraceError(f"{name}: padding {p} is more than half the kernel {k}")
    return k, s, (p[0], p[1], p[0], p[1])


def max_pool2d(x: Any, kernel_size: Any, stride: Any = None, padding: Any = 0,
               dilation: Any = 1, ceil_mode: bool = False, return_indices: bool = False
               ) -> Tensor:
    """MaxPool (pads are -inf; ``ceil_mode`` as PyTorch)."""
    t = _t(x)
    if return_indices:
        raise TraceError("max_pool2d(return_indices=True) is not supported")
    k, s, p = _pool_args(kernel_size, stride, padding, t, "max_pool2d")
    return t._emit("MaxPool", t, kernel_shape=k, strides=s, pads=p,
                   dilations=_pair(dilation, "dilation"), ceil_mode=int(bool(ceil_mode)))


def avg_pool2d(x: Any, kernel_size: Any, stride: Any = None, padding: Any = 0,
               ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override: int | None = None) -> Tensor:
    """AveragePool (``count_include_pad`` as PyTorch, default True)."""
    t = _t(x)
    if divisor_override is not None:
        raise TraceError("avg_pool2d(divisor_override=...) is not supported")
    k, s, p = _pool_args(kernel_size, stride, padding, t, "avg_pool2d")
    return t._emit("AveragePool", t, kernel_shape=k, strides=s, pads=p,
                   ceil_mode=int(bool(ceil_mode)), count_include_pad=int(bool(count_include_pad)))


def global_avg_pool(x: Any) -> Tensor:
    """The mean over the spatial axes, ``[b, C, H, W] -> [b, C, 1, 1]``: GlobalAveragePool
    (PyTorch's ``adaptive_avg_pool2d(x, 1)``)."""
    return _unary("GlobalAveragePool", x)


def adaptive_avg_pool2d(x: Any, output_size: Any) -> Tensor:
    """GlobalAveragePool for an output of 1x1; AveragePool where the output size divides
    the input's (equal windows); anything else is a :class:`TraceError`."""
    t = _t(x)
    if t.ndim != 4:
        raise TraceError(f"adaptive_avg_pool2d needs a 4-D input, got {t.shape}")
    h, w = int(t.desc.shape[2]), int(t.desc.shape[3])
    oh, ow = (output_size, output_size) if isinstance(output_size, int) else output_size
    oh, ow = oh or h, ow or w
    if (oh, ow) == (1, 1):
        return global_avg_pool(t)
    if h % oh or w % ow:
        raise TraceError(f"adaptive_avg_pool2d to {(oh, ow)} from {(h, w)}: only sizes that "
                         "divide the input are supported (equal windows)")
    return avg_pool2d(t, (h // oh, w // ow))


# -- 1-D layers: [batch, channels, length] ------------------------------------------------
#
# The engine's Conv is 2-D, so a 1-D convolution is the 2-D one of a height-1 image: an
# Unsqueeze, Conv with a (1, k) kernel, a Squeeze.  These views run in place over a value
# that dies there; the planner copies one that stays live (the weight, the model's input,
# an activation the backward reads again).  The pooling ops take one to three spatial
# axes and run on [b, C, L] as is.


def _single(v: Any, name: str, least: int) -> int:
    """PyTorch's 1-D argument: an int, or a 1-tuple of one, at least ``least``."""
    if isinstance(v, Sequence) and not isinstance(v, str) and len(v) == 1:
        v = v[0]
    if not isinstance(v, int) or isinstance(v, bool) or v < least:
        raise TraceError(f"{name} must be an int >= {least} (or a 1-tuple of one), got {v!r}")
    return int(v)


def _length(t: Tensor, name: str) -> int:
    if t.ndim != 3:
        raise TraceError(f"{name} needs a 3-D input [batch, channels, length], got {t.shape}")
    return int(t.desc.shape[2])


def _check_span(name: str, length: int, pads: tuple[int, int], kernel: int,
                dilation: int) -> None:
    span = dilation * (kernel - 1) + 1
    if length + pads[0] + pads[1] < span:
        raise TraceError(f"{name}: the kernel spans {span} (kernel_size {kernel}, dilation "
                         f"{dilation}), more than the padded input's length "
                         f"{length + pads[0] + pads[1]} (length {length}, padding {pads})")


def conv1d(x: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0,
           dilation: Any = 1, groups: int = 1, padding_mode: str = "zeros") -> Tensor:
    """Conv over ``[b, C, L]`` with ``weight [out, C/groups, k]``: the 2-D Conv of
    ``[b, C, 1, L]`` by ``[out, C/groups, 1, k]``, between Unsqueeze and Squeeze.
    ``padding`` is an int, ``"same"`` (stride 1; an odd total puts the extra column at
    the end, as PyTorch does) or ``"valid"``; ``padding_mode`` as :func:`conv2d`.

    >>> from engine import nn
    >>> class M(nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.w = nn.Parameter(shape=(4, 2, 3))
    ...     def forward(self, x):
    ...         return nn.functional.conv1d(x, self.w, padding="same")
    >>> g = nn.to_graph(M(), inputs={"x": (0, 2, 10)}, loss=None)
    >>> [n.op for n in g.paths[0].nodes]
    ['Unsqueeze', 'Unsqueeze', 'Conv', 'Squeeze']
    """
    t, w = _t(x), _t(weight)
    n = _length(t, "conv1d")
    if w.ndim != 3:
        raise TraceError(f"conv1d needs a 3-D weight [out_channels, in_channels/groups, "
                         f"kernel_size], got {w.shape}")
    out, per_group, k = (int(v) for v in w.desc.shape)
    s, d = _single(stride, "stride", 1), _single(dilation, "dilation", 1)
    g = _single(groups, "groups", 1)
    c = int(t.desc.shape[1])
    if c != per_group * g or out % g:
        raise TraceError(f"conv1d: an input of {c} channels and a weight {w.shape} with "
                         f"groups={g}: the weight takes {per_group * g} channels and its "
                         f"{out} filters must divide into the {g} groups")
    padding2: Any
    if isinstance(padding, str):
        pads = conv_pads(padding, (1, k), (1, d), (1, s))
        padding2 = padding
    else:
        p = _single(padding, "padding", 0)
        pads, padding2 = (0, p, 0, p), (0, p)
    _check_span("conv1d", n, (pads[1], pads[3]), k, d)
    y = conv2d(t.unsqueeze(2), w.unsqueeze(2), bias, (1, s), padding2, (1, d), g, padding_mode)
    return y.squeeze(2)


def _pool1d_attrs(name: str, t: Tensor, kernel_size: Any, stride: Any, padding: Any,
                  dilation: Any = 1) -> dict[str, Any]:
    n = _length(t, name)
    k = _single(kernel_size, "kernel_size", 1)
    s = k if stride is None or (isinstance(stride, Sequence) and not stride) else \
        _single(stride, "stride", 1)
    p, d = _single(padding, "padding", 0), _single(dilation, "dilation", 1)
    if 2 * p > k:
        raise TraceError(f"{name}: padding {p} is more than half the kernel_size {k}")
    _check_span(name, n, (p, p), k, d)
    return {"kernel_shape": (k,), "strides": (s,), "pads": (p, p), "dilations": (d,)}


def max_pool1d(x: Any, kernel_size: Any, stride: Any = None, padding: Any = 0,
               dilation: Any = 1, ceil_mode: bool = False, return_indices: bool = False
               ) -> Tensor:
    """MaxPool over ``[b, C, L]`` (stride defaults to the kernel size; pads are -inf;
    ``ceil_mode`` as PyTorch: the last window may run past the end, never starting in
    the padding)."""
    t = _t(x)
    if return_indices:
        raise TraceError("max_pool1d(return_indices=True) is not supported")
    attrs = _pool1d_attrs("max_pool1d", t, kernel_size, stride, padding, dilation)
    return t._emit("MaxPool", t, ceil_mode=int(bool(ceil_mode)), **attrs)


def avg_pool1d(x: Any, kernel_size: Any, stride: Any = None, padding: Any = 0,
               ceil_mode: bool = False, count_include_pad: bool = True) -> Tensor:
    """AveragePool over ``[b, C, L]`` (stride defaults to the kernel size;
    ``count_include_pad`` as PyTorch, default True)."""
    t = _t(x)
    attrs = _pool1d_attrs("avg_pool1d", t, kernel_size, stride, padding)
    del attrs["dilations"]
    return t._emit("AveragePool", t, ceil_mode=int(bool(ceil_mode)),
                   count_include_pad=int(bool(count_include_pad)), **attrs)


def adaptive_avg_pool1d(x: Any, output_size: Any) -> Tensor:
    """The mean of PyTorch's adaptive windows ``[floor(i L / o), ceil((i + 1) L / o))``
    of ``[b, C, L]``, giving ``[b, C, o]``: GlobalAveragePool for ``o = 1``, AveragePool
    where ``o`` divides ``L`` (equal windows), and otherwise a MatMul by the constant
    ``[L, o]`` matrix of window averages (uneven or overlapping windows, one op).

    >>> from engine import nn
    >>> class M(nn.Module):
    ...     def forward(self, x):
    ...         y = nn.functional.adaptive_avg_pool1d(x, 3)
    ...         print(y)
    ...         return y
    >>> g = nn.to_graph(M(), inputs={"x": (0, 2, 7)}, loss=None)
    Tensor('mat_mul_2', float32[b,2,3])
    >>> [n.op for n in g.paths[0].nodes]
    ['MatMul']
    """
    t = _t(x)
    n = _length(t, "adaptive_avg_pool1d")
    o = _single(output_size, "output_size", 1)
    if o == 1:
        return global_avg_pool(t)
    if n % o == 0:
        return t._emit("AveragePool", t, kernel_shape=(n // o,), strides=(n // o,))
    import numpy as np

    windows = np.zeros((n, o), np.float32)
    for i in range(o):
        lo, hi = i * n // o, -(-(i + 1) * n // o)
        windows[lo:hi, i] = 1.0 / (hi - lo)
    return t @ as_tensor(windows, like=t)


def _param_or_const(value: Any, fill: float, like: Tensor, n: int) -> Tensor:
    if value is not None:
        return _t(value)
    import numpy as np

    return as_tensor(np.full((n,), fill, dtype=np.float32), like=like)


def batch_norm(x: Any, running_mean: Any, running_var: Any, weight: Any = None,
               bias: Any = None, training: bool = False, momentum: float = 0.1,
               eps: float = 1e-5) -> Tensor:
    """BatchNormalization over ``[b, C, ...]``.  Training (on a BACKWARD_ENABLED path)
    normalises with the batch's statistics and updates the running ones in place with
    PyTorch's meaning of ``momentum`` (the op's momentum is ``1 - momentum``) and its
    unbiased running variance (``unbiased=1``); otherwise the running statistics are
    read.  ``running_mean``/``running_var`` must be the module's buffers, or None (then
    training always uses the batch's statistics)."""
    t = _t(x)
    if t.ndim < 2:
        raise TraceError(f"batch_norm needs [batch, channels, ...], got {t.shape}")
    if momentum is None:
        raise TraceError("batch_norm(momentum=None) (a cumulative average) is not supported")
    c = int(t.desc.shape[1])
    tr = t.tracer
    scale = _param_or_const(weight, 1.0, t, c)
    shift = _param_or_const(bias, 0.0, t, c)
    has_stats = running_mean is not None and running_var is not None
    mean = _param_or_const(running_mean, 0.0, t, c)
    var = _param_or_const(running_var, 1.0, t, c)
    batch_stats = training or not has_stats
    update = training and has_stats and tr.path.mode.value == "backward_enabled"
    return t._emit("BatchNormalization", t, scale, shift, mean, var, epsilon=float(eps),
                   momentum=1.0 - float(momentum), training_mode=int(batch_stats),
                   running_update=int(update), unbiased=int(update))


def layer_norm(x: Any, normalized_shape: Any, weight: Any = None, bias: Any = None,
               eps: float = 1e-5) -> Tensor:
    """LayerNormalization over the last ``len(normalized_shape)`` axes."""
    t = _t(x)
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else \
        tuple(normalized_shape)
    if tuple(t.desc.shape[-len(shape):]) != shape:
        raise TraceError(f"layer_norm over {shape}: the input {t.shape} does not end in it")
    import numpy as np

    scale = _t(weight) if weight is not None else as_tensor(np.ones(shape, np.float32), like=t)
    ins = [t, scale] + ([_t(bias)] if bias is not None else [])
    return t._emit("LayerNormalization", *ins, axis=-len(shape), epsilon=float(eps))


def instance_norm(x: Any, running_mean: Any = None, running_var: Any = None,
                  weight: Any = None, bias: Any = None, use_input_stats: bool = True,
                  momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """Each sample's channel normalised over its positions (InstanceNormalization), then
    ``weight`` and ``bias`` per channel.  Running statistics are not kept."""
    t = _t(x)
    if running_mean is not None or running_var is not None or not use_input_stats:
        raise TraceError("instance_norm with running statistics is not supported "
                         "(track_running_stats=False, PyTorch's default)")
    if t.ndim < 3:
        raise TraceError(f"instance_norm needs [batch, channels, positions...], got {t.shape}")
    c = int(t.desc.shape[1])
    return t._emit("InstanceNormalization", t, _param_or_const(weight, 1.0, t, c),
                   _param_or_const(bias, 0.0, t, c), epsilon=float(eps))


def group_norm(x: Any, num_groups: int, weight: Any = None, bias: Any = None,
               eps: float = 1e-5) -> Tensor:
    """Each sample's group of ``channels / num_groups`` channels normalised together,
    then ``weight`` and ``bias`` per channel: InstanceNormalization of the groups, as
    PyTorch exports it."""
    t = _t(x)
    if t.ndim < 2:
        raise TraceError(f"group_norm needs [batch, channels, ...], got {t.shape}")
    c, g = int(t.desc.shape[1]), int(num_groups)
    if g < 1 or c % g:
        raise TraceError(f"group_norm: {c} channels do not split into {num_groups} groups")
    dims = tuple(int(d) for d in t.desc.shape[1:])
    lead = -1 if t.batched else int(t.desc.shape[0])
    grouped = t.reshape(lead, g, -1)
    normed = grouped._emit("InstanceNormalization", grouped, _param_or_const(None, 1.0, t, g),
                           _param_or_const(None, 0.0, t, g), epsilon=float(eps))
    y = normed.reshape(lead, *dims)
    per_channel = (c, *(1,) * (t.ndim - 2))
    if weight is not None:
        y = y * _t(weight).reshape(*per_channel)
    if bias is not None:
        y = y + _t(bias).reshape(*per_channel)
    return y


def interpolate(x: Any, size: Any = None, scale_factor: Any = None,
                mode: str = "nearest") -> Tensor:
    """Nearest-neighbour upsampling of the positions (axes 2 on) by whole factors:
    Resize.  ``size`` must be whole multiples of the input's positions."""
    t = _t(x)
    if mode != "nearest":
        raise TraceError(f"interpolate: mode {mode!r} is not supported (nearest only)")
    if t.ndim < 3:
        raise TraceError(f"interpolate needs [batch, channels, positions...], got {t.shape}")
    positions = [int(d) for d in t.desc.shape[2:]]
    if (size is None) == (scale_factor is None):
        raise TraceError("interpolate: give size or scale_factor, one of them")
    if size is not None:
        sizes = [size] * len(positions) if isinstance(size, int) else list(size)
        ratios = [s / d for s, d in zip(sizes, positions, strict=True)]
    else:
        ratios = [scale_factor] * len(positions) if isinstance(scale_factor, int | float) \
            else list(scale_factor)
    if len(ratios) != len(positions) or any(r != int(r) or r < 1 for r in ratios):
        raise TraceError(f"interpolate: factors {ratios} for positions {positions}: whole "
                         "numbers >= 1 only (nearest upsampling)")
    return t._emit("Resize", t, factors=(1, 1, *(int(r) for r in ratios)))


def embedding(input: Any, weight: Any) -> Tensor:
    """Rows of ``weight [num, dim]`` at the int64 indices ``input``: Gather(axis=0)."""
    idx, w = _t(input), _t(weight)
    if idx.dtype not in ("int64", "int32"):
        raise TraceError(f"embedding indices must be int64, got {idx.dtype}: declare the "
                         "input as ((0, n), 'int64')")
    return w._emit("Gather", w, idx, axis=0)


def flatten(x: Any, start_dim: int = 1, end_dim: int = -1) -> Tensor:
    """Axes ``start_dim..end_dim`` merged (Reshape)."""
    return _t(x).flatten(start_dim, end_dim)


def cat(tensors: Sequence[Any], dim: int = 0) -> Tensor:
    """Tensors joined along ``dim`` (never the batch axis): Concat."""
    ts = [_t(x) for x in tensors]
    if not ts:
        raise TraceError("cat of no tensors")
    return ts[0]._emit("Concat", *ts, axis=_axis(dim, ts[0].ndim))


concat = cat


def dequantize_linear(x: Any, scale: float, zero_point: int = 0) -> Tensor:
    """``(x - zero_point) * scale`` as float32 of uint8 data: DequantizeLinear (fused
    into the next Gemm by the compiler, so no float copy of the data exists)."""
    t = _t(x)
    return t._emit("DequantizeLinear", t, scale=float(scale), zero_point=int(zero_point))


# -- losses --------------------------------------------------------------------------------


def _reduction(reduction: str, name: str) -> None:
    if reduction != "mean":
        raise TraceError(f"{name}(reduction={reduction!r}): only 'mean' is supported")


def cross_entropy(input: Any, target: Any, weight: Any = None,
                  ignore_index: int = -100, reduction: str = "mean",
                  label_smoothing: float = 0.0) -> Tensor:
    """Softmax cross-entropy of scores ``[b, C, ...]`` against int64 class indices:
    SoftmaxCrossEntropyLoss (``reduction`` mean, sum or none; ``ignore_index`` when it
    is not PyTorch's default -100)."""
    x, y = _t(input), _t(target)
    if label_smoothing:
        raise TraceError("cross_entropy(label_smoothing=...) is not supported")
    if reduction not in ("mean", "sum", "none"):
        raise TraceError(f"cross_entropy: unknown reduction {reduction!r}")
    attrs: dict[str, Any] = {"reduction": reduction}
    if ignore_index != -100:
        attrs["ignore_index"] = int(ignore_index)
    ins = [x, y] + ([_t(weight)] if weight is not None else [])
    return x._emit("SoftmaxCrossEntropyLoss", *ins, **attrs)


def _pair_loss(op: str, name: str, input: Any, target: Any, reduction: str,
               **attrs: Any) -> Tensor:
    _reduction(reduction, name)
    x, y = _t(input), _t(target)
    return x._emit(op, x, y, **attrs)


def mse_loss(input: Any, target: Any, reduction: str = "mean") -> Tensor:
    """``mean((input - target)^2)``: MSELoss."""
    return _pair_loss("MSELoss", "mse_loss", input, target, reduction)


def l1_loss(input: Any, target: Any, reduction: str = "mean") -> Tensor:
    """``mean(|input - target|)``: MAELoss."""
    return _pair_loss("MAELoss", "l1_loss", input, target, reduction)


def huber_loss(input: Any, target: Any, reduction: str = "mean",
               delta: float = 1.0) -> Tensor:
    """PyTorch's HuberLoss: HuberLoss(delta)."""
    return _pair_loss("HuberLoss", "huber_loss", input, target, reduction, delta=float(delta))


def binary_cross_entropy_with_logits(input: Any, target: Any,
                                     reduction: str = "mean") -> Tensor:
    """``mean(softplus(x) - x * y)`` (= ``-y log sigmoid(x) - (1-y) log(1 - sigmoid(x))``
    without overflow): Softplus, Mul, Sub, ReduceMean, all differentiable."""
    x, y = _t(input), _t(target)
    per = _unary("Softplus", x) - x * y
    if reduction == "none":
        return per
    if reduction == "sum":
        return per.sum()
    _reduction(reduction, "binary_cross_entropy_with_logits")
    return per.mean()


__all__ += ["celu", "concat", "erf", "group_norm", "hardswish", "instance_norm", "interpolate",
            "mish", "prelu", "reshape", "selu"]
