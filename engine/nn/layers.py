"""Layers with PyTorch's constructors, parameter names, shapes and default inits.

Inits (drawn lazily, see :class:`~engine.nn.Parameter`): Linear, Conv1d and Conv2d
weight and bias ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` (PyTorch's
``kaiming_uniform_(a=sqrt 5)`` works out to that bound; ``fan_in = in_features``,
``in_channels/groups * k`` or ``in_channels/groups * kh * kw``);
BatchNorm weight 1, bias 0, ``running_mean`` 0, ``running_var`` 1 (buffers:
non-trainable parameters of the graph); LayerNorm, GroupNorm and an affine InstanceNorm
1 and 0; PReLU 0.25; Embedding ``N(0, 1)``.

>>> from engine import nn
>>> conv = nn.Conv2d(3, 8, 3, padding="same", groups=1, bias=False)
>>> [(k, p.shape) for k, p in conv.named_parameters()], conv.weight.init.high
([('weight', (8, 3, 3, 3))], 0.19245008972987526)
>>> bn = nn.BatchNorm2d(8)
>>> [k for k in dict(bn._state_items())]
['weight', 'bias', 'running_mean', 'running_var']
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from engine.graph import Init
from engine.nn import functional as F
from engine.nn._tensor import Tensor
from engine.nn._trace import NNError, TraceError
from engine.nn.module import Module, Parameter


def _bound_uniform(fan_in: int) -> Init:
    b = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
    return Init.uniform(-b, b)


class Linear(Module):
    """``y = x @ weight.T + bias``; ``weight [out_features, in_features]``."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        self.in_features, self.out_features = int(in_features), int(out_features)
        init = _bound_uniform(self.in_features)
        self.weight = Parameter(shape=(self.out_features, self.in_features), init=init)
        self.bias = Parameter(shape=(self.out_features,), init=init) if bias else None

    def forward(self, x: Any) -> Tensor:
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


def _pair(v: Any) -> tuple[int, int]:
    return (int(v), int(v)) if isinstance(v, int) else (int(v[0]), int(v[1]))


def _single(v: Any) -> tuple[int]:
    return (int(v),) if isinstance(v, int) else (int(v[0]),)


class Conv1d(Module):
    """1-D convolution of ``[b, C, L]``; ``weight [out, in/groups, k]``; ``padding`` an
    int, ``"same"`` or ``"valid"``; ``padding_mode`` zeros, reflect, replicate or
    circular.  Runs as the 2-D Conv of a height-1 image (see
    :func:`~engine.nn.functional.conv1d`).

    >>> from engine.nn.layers import Conv1d
    >>> conv = Conv1d(4, 6, 3, padding="same", groups=2)
    >>> [(k, p.shape) for k, p in conv.named_parameters()], conv.weight.init.high
    ([('weight', (6, 2, 3)), ('bias', (6,))], 0.4082482904638631)
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1,
                 padding: Any = 0, dilation: Any = 1, groups: int = 1, bias: bool = True,
                 padding_mode: str = "zeros") -> None:
        super().__init__()
        if in_channels % groups or out_channels % groups:
            raise NNError(f"Conv1d: in_channels {in_channels} and out_channels {out_channels} "
                          f"must be divisible by groups {groups}")
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.kernel_size = _single(kernel_size)
        self.stride, self.dilation = _single(stride), _single(dilation)
        self.padding = padding if isinstance(padding, str) else _single(padding)
        self.groups, self.padding_mode = int(groups), padding_mode
        init = _bound_uniform(self.in_channels // self.groups * self.kernel_size[0])
        self.weight = Parameter(shape=(self.out_channels, self.in_channels // self.groups,
                                       *self.kernel_size), init=init)
        self.bias = Parameter(shape=(self.out_channels,), init=init) if bias else None

    def forward(self, x: Any) -> Tensor:
        return F.conv1d(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                        self.groups, self.padding_mode)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}")


class Conv2d(Module):
    """2-D convolution; ``weight [out, in/groups, kh, kw]``; ``padding`` an int, a pair,
    ``"same"`` or ``"valid"``; ``padding_mode`` zeros, reflect, replicate or circular."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1,
                 padding: Any = 0, dilation: Any = 1, groups: int = 1, bias: bool = True,
                 padding_mode: str = "zeros") -> None:
        super().__init__()
        if in_channels % groups or out_channels % groups:
            raise NNError(f"Conv2d: in_channels {in_channels} and out_channels {out_channels} "
                          f"must be divisible by groups {groups}")
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.kernel_size = _pair(kernel_size)
        self.stride, self.dilation = _pair(stride), _pair(dilation)
        self.padding = padding if isinstance(padding, str) else _pair(padding)
        self.groups, self.padding_mode = int(groups), padding_mode
        fan_in = self.in_channels // self.groups * self.kernel_size[0] * self.kernel_size[1]
        init = _bound_uniform(fan_in)
        self.weight = Parameter(shape=(self.out_channels, self.in_channels // self.groups,
                                       *self.kernel_size), init=init)
        self.bias = Parameter(shape=(self.out_channels,), init=init) if bias else None

    def forward(self, x: Any) -> Tensor:
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                        self.groups, self.padding_mode)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}")


class _BatchNorm(Module):
    _dims: tuple[int, ...] = ()

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True) -> None:
        super().__init__()
        if momentum is None:
            raise NNError(f"{type(self).__name__}(momentum=None) (a cumulative moving average) "
                          "is not supported: give a momentum")
        self.num_features, self.eps, self.momentum = int(num_features), float(eps), momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        c = (self.num_features,)
        self.weight = Parameter(shape=c, init=Init.ones()) if affine else None
        self.bias = Parameter(shape=c, init=Init.zeros()) if affine else None
        if track_running_stats:
            self.register_buffer("running_mean", Parameter(shape=c, init=Init.zeros(),
                                                           requires_grad=False))
            self.register_buffer("running_var", Parameter(shape=c, init=Init.ones(),
                                                          requires_grad=False))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)

    def forward(self, x: Any) -> Tensor:
        t = F._t(x)
        if t.ndim not in self._dims:
            dims = " or ".join(map(str, self._dims))
            raise TraceError(f"{type(self).__name__} expects a {dims}-D input, got {t.shape}")
        return F.batch_norm(t, self.running_mean, self.running_var, self.weight, self.bias,
                            self.training or not self.track_running_stats, self.momentum,
                            self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}"


class BatchNorm1d(_BatchNorm):
    """Batch normalisation of ``[b, C]`` or ``[b, C, L]`` (PyTorch's momentum: the
    running statistics move ``momentum`` of the way to the batch's, whose variance is
    the unbiased one)."""

    _dims = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Batch normalisation of ``[b, C, H, W]`` (see :class:`BatchNorm1d`)."""

    _dims = (4,)


class LayerNorm(Module):
    """Normalisation over the last axes, ``normalized_shape``."""

    def __init__(self, normalized_shape: Any, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True) -> None:
        super().__init__()
        shape = (int(normalized_shape),) if isinstance(normalized_shape, int) else \
            tuple(int(d) for d in normalized_shape)
        self.normalized_shape, self.eps = shape, float(eps)
        self.weight = Parameter(shape=shape, init=Init.ones()) if elementwise_affine else None
        self.bias = Parameter(shape=shape, init=Init.zeros()) if elementwise_affine and bias \
            else None

    def forward(self, x: Any) -> Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"


class GroupNorm(Module):
    """Each sample's groups of channels normalised, then a weight and bias per channel
    (1 and 0, ``affine``)."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5,
                 affine: bool = True) -> None:
        super().__init__()
        if num_groups < 1 or num_channels % num_groups:
            raise NNError(f"GroupNorm: {num_channels} channels do not split into "
                          f"{num_groups} groups")
        self.num_groups, self.num_channels, self.eps = num_groups, num_channels, float(eps)
        self.weight = Parameter(shape=(num_channels,), init=Init.ones()) if affine else None
        self.bias = Parameter(shape=(num_channels,), init=Init.zeros()) if affine else None

    def forward(self, x: Any) -> Tensor:
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}"


class _InstanceNorm(Module):
    """Each sample's channel normalised over its positions; a weight and bias per
    channel with ``affine`` (PyTorch's default: none).  Running statistics are not kept
    (``track_running_stats=True`` is refused)."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1,
                 affine: bool = False, track_running_stats: bool = False) -> None:
        super().__init__()
        if track_running_stats:
            raise NNError(f"{type(self).__name__}: track_running_stats=True is not supported")
        self.num_features, self.eps = num_features, float(eps)
        self.weight = Parameter(shape=(num_features,), init=Init.ones()) if affine else None
        self.bias = Parameter(shape=(num_features,), init=Init.zeros()) if affine else None

    def forward(self, x: Any) -> Tensor:
        return F.instance_norm(x, weight=self.weight, bias=self.bias, eps=self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}"


class InstanceNorm1d(_InstanceNorm):
    pass


class InstanceNorm2d(_InstanceNorm):
    pass


class Upsample(Module):
    """Nearest-neighbour upsampling of the positions by whole factors (``scale_factor``,
    or a ``size`` that is a whole multiple)."""

    def __init__(self, size: Any = None, scale_factor: Any = None, mode: str = "nearest"
                 ) -> None:
        super().__init__()
        if mode != "nearest":
            raise NNError(f"Upsample: mode {mode!r} is not supported (nearest only)")
        self.size, self.scale_factor, self.mode = size, scale_factor, mode

    def forward(self, x: Any) -> Tensor:
        return F.interpolate(x, self.size, self.scale_factor, self.mode)

    def extra_repr(self) -> str:
        return f"scale_factor={self.scale_factor}" if self.size is None else f"size={self.size}"


class Dropout(Module):
    """Dropout with probability ``p`` in training mode (the train path); nothing in eval."""

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise NNError(f"Dropout probability must be in [0, 1), got {p}")
        self.p = float(p)

    def forward(self, x: Any) -> Tensor:
        return F.dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class MaxPool1d(Module):
    """Max pooling of ``[b, C, L]`` (stride defaults to the kernel size)."""

    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
                 return_indices: bool = False, ceil_mode: bool = False) -> None:
        super().__init__()
        if return_indices:
            raise NNError("MaxPool1d(return_indices=True) is not supported")
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.dilation, self.ceil_mode = dilation, ceil_mode

    def forward(self, x: Any) -> Tensor:
        return F.max_pool1d(x, self.kernel_size, self.stride, self.padding, self.dilation,
                            self.ceil_mode)


class AvgPool1d(Module):
    """Average pooling of ``[b, C, L]`` (stride defaults to the kernel size; PyTorch's
    ``count_include_pad=True``)."""

    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0,
                 ceil_mode: bool = False, count_include_pad: bool = True) -> None:
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.ceil_mode, self.count_include_pad = ceil_mode, count_include_pad

    def forward(self, x: Any) -> Tensor:
        return F.avg_pool1d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                            self.count_include_pad)


class AdaptiveAvgPool1d(Module):
    """Average pooling of ``[b, C, L]`` to ``[b, C, output_size]`` over PyTorch's
    adaptive windows, even or not (see :func:`~engine.nn.functional.adaptive_avg_pool1d`)."""

    def __init__(self, output_size: Any) -> None:
        super().__init__()
        self.output_size = output_size

    def forward(self, x: Any) -> Tensor:
        return F.adaptive_avg_pool1d(x, self.output_size)


class MaxPool2d(Module):
    """Max pooling (stride defaults to the kernel size)."""

    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
                 return_indices: bool = False, ceil_mode: bool = False) -> None:
        super().__init__()
        if return_indices:
            raise NNError("MaxPool2d(return_indices=True) is not supported")
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.dilation, self.ceil_mode = dilation, ceil_mode

    def forward(self, x: Any) -> Tensor:
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation,
                            self.ceil_mode)


class AvgPool2d(Module):
    """Average pooling (stride defaults to the kernel size; PyTorch's
    ``count_include_pad=True``)."""

    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0,
                 ceil_mode: bool = False, count_include_pad: bool = True,
                 divisor_override: int | None = None) -> None:
        super().__init__()
        if divisor_override is not None:
            raise NNError("AvgPool2d(divisor_override=...) is not supported")
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.ceil_mode, self.count_include_pad = ceil_mode, count_include_pad

    def forward(self, x: Any) -> Tensor:
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                            self.count_include_pad)


class AdaptiveAvgPool2d(Module):
    """Average pooling to ``output_size``: GlobalAveragePool for 1 (or (1, 1))."""

    def __init__(self, output_size: Any) -> None:
        super().__init__()
        self.output_size = output_size

    def forward(self, x: Any) -> Tensor:
        return F.adaptive_avg_pool2d(x, self.output_size)


class Flatten(Module):
    """Axes ``start_dim..end_dim`` merged (default from 1: everything but the batch)."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x: Any) -> Tensor:
        return F.flatten(x, self.start_dim, self.end_dim)


class Embedding(Module):
    """Rows of ``weight [num_embeddings, embedding_dim]`` (init ``N(0, 1)``) at int64
    indices."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None
                 ) -> None:
        super().__init__()
        if padding_idx is not None:
            raise NNError("Embedding(padding_idx=...) is not supported")
        self.num_embeddings, self.embedding_dim = int(num_embeddings), int(embedding_dim)
        self.weight = Parameter(shape=(self.num_embeddings, self.embedding_dim),
                                init=Init.normal(0.0, 1.0))

    def forward(self, x: Any) -> Tensor:
        return F.embedding(x, self.weight)


# -- activations ---------------------------------------------------------------------------


class Identity(Module):
    """The input, unchanged (no op)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()

    def forward(self, x: Any) -> Any:
        return x


class ReLU(Module):
    def __init__(self, inplace: bool = False) -> None:
        super().__init__()

    def forward(self, x: Any) -> Tensor:
        return F.relu(x)


class Tanh(Module):
    def forward(self, x: Any) -> Tensor:
        return F.tanh(x)


class Sigmoid(Module):
    def forward(self, x: Any) -> Tensor:
        return F.sigmoid(x)


class LeakyReLU(Module):
    def __init__(self, negative_slope: float = 0.01, inplace: bool = False) -> None:
        super().__init__()
        self.negative_slope = float(negative_slope)

    def forward(self, x: Any) -> Tensor:
        return F.leaky_relu(x, self.negative_slope)


class ELU(Module):
    def __init__(self, alpha: float = 1.0, inplace: bool = False) -> None:
        super().__init__()
        self.alpha = float(alpha)

    def forward(self, x: Any) -> Tensor:
        return F.elu(x, self.alpha)


class GELU(Module):
    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.approximate = approximate

    def forward(self, x: Any) -> Tensor:
        return F.gelu(x, self.approximate)


class SiLU(Module):
    def __init__(self, inplace: bool = False) -> None:
        super().__init__()

    def forward(self, x: Any) -> Tensor:
        return F.silu(x)


class Hardswish(Module):
    def __init__(self, inplace: bool = False) -> None:
        super().__init__()

    def forward(self, x: Any) -> Tensor:
        return F.hardswish(x)


class Mish(Module):
    def __init__(self, inplace: bool = False) -> None:
        super().__init__()

    def forward(self, x: Any) -> Tensor:
        return F.mish(x)


class SELU(Module):
    def __init__(self, inplace: bool = False) -> None:
        super().__init__()

    def forward(self, x: Any) -> Tensor:
        return F.selu(x)


class CELU(Module):
    def __init__(self, alpha: float = 1.0, inplace: bool = False) -> None:
        super().__init__()
        self.alpha = float(alpha)

    def forward(self, x: Any) -> Tensor:
        return F.celu(x, self.alpha)


class PReLU(Module):
    """``x if x > 0 else weight x``, one learnt slope or one per channel (PyTorch's
    ``num_parameters``), each starting at ``init``."""

    def __init__(self, num_parameters: int = 1, init: float = 0.25) -> None:
        super().__init__()
        self.num_parameters = int(num_parameters)
        self.weight = Parameter(shape=(self.num_parameters,), init=Init.constant(float(init)))

    def forward(self, x: Any) -> Tensor:
        return F.prelu(x, self.weight)

    def extra_repr(self) -> str:
        return f"num_parameters={self.num_parameters}"


class Softplus(Module):
    def __init__(self, beta: float = 1.0, threshold: float = 20.0) -> None:
        super().__init__()
        self.beta, self.threshold = float(beta), float(threshold)

    def forward(self, x: Any) -> Tensor:
        return F.softplus(x, self.beta, self.threshold)


class Softmax(Module):
    def __init__(self, dim: int | None = None) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: Any) -> Tensor:
        return F.softmax(x, self.dim)


class LogSoftmax(Module):
    def __init__(self, dim: int | None = None) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: Any) -> Tensor:
        return F.log_softmax(x, self.dim)


LAYERS: Sequence[str] = (
    "Linear", "Conv1d", "Conv2d", "BatchNorm1d", "BatchNorm2d", "LayerNorm", "Dropout",
    "MaxPool1d", "MaxPool2d", "AvgPool1d", "AvgPool2d", "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d", "Flatten", "Embedding", "Identity", "ReLU", "Tanh", "Sigmoid",
    "LeakyReLU", "ELU", "GELU", "SiLU", "Softplus", "Softmax", "LogSoftmax", "GroupNorm",
    "InstanceNorm1d", "InstanceNorm2d", "Upsample", "Hardswish", "Mish", "SELU", "CELU",
    "PReLU",
)
