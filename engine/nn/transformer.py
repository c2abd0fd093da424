"""Transformer modules with PyTorch's constructors, parameter names, shapes and inits:
:class:`MultiheadAttention`, :class:`TransformerEncoderLayer`,
:class:`TransformerEncoder`; and two positional encodings that torch.nn lacks,
:class:`LearnedPositionalEmbedding` and :class:`SinusoidalPositionalEncoding`.

A traced graph's batch is its leading axis, so build them with ``batch_first=True``
(``[batch, L, E]``).  ``batch_first=False`` (PyTorch's default, ``[L, N, E]``) works
on unbatched tensors only (a graph input without the batch axis), where ``N`` is a
fixed size; on a batched tensor it is a :class:`~engine.nn.TraceError` saying so.

>>> from engine import nn
>>> from engine.nn.transformer import TransformerEncoder, TransformerEncoderLayer
>>> layer = TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16, batch_first=True)
>>> enc = TransformerEncoder(layer, num_layers=2)
>>> [(k, p.shape) for k, p in enc.named_parameters()][:2]
[('layers.0.self_attn.in_proj_weight', (24, 8)), ('layers.0.self_attn.in_proj_bias', (24,))]
>>> class Model(nn.Module):
...     def __init__(self):
...         super().__init__(); self.enc = enc; self.head = nn.Linear(8, 3)
...     def forward(self, x, pad):
...         return self.head(self.enc(x, src_key_padding_mask=pad).mean(1))
>>> g = nn.to_graph(Model(), inputs={"x": (0, 5, 8), "pad": ((0, 5), "bool")})
>>> g.outputs
['loss', 'logits']
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from engine.graph import Init
from engine.nn import functional as F
from engine.nn._tensor import Tensor, _Ops, as_tensor
from engine.nn._trace import NNError, TraceError
from engine.nn.attention import (
    apply_mask,
    attention_scores,
    causal_mask,
    dropout_on_train_path,
)
from engine.nn.layers import Dropout, LayerNorm, Linear
from engine.nn.module import Module, ModuleList, Parameter

__all__ = [
    "LearnedPositionalEmbedding",
    "MultiheadAttention",
    "SinusoidalPositionalEncoding",
    "TransformerEncoder",
    "TransformerEncoderLayer",
]


def _tensor(x: Any, what: str) -> Tensor:
    if not isinstance(x, _Ops):
        raise TraceError(f"{what} must be a traced tensor, got {type(x).__name__}")
    return x._t()


class MultiheadAttention(Module):
    """PyTorch's ``nn.MultiheadAttention``: ``num_heads`` heads of ``embed_dim //
    num_heads`` over projections of query, key and value, joined by ``out_proj``.

    Parameters as PyTorch's: ``in_proj_weight [3E, E]`` (xavier uniform) and
    ``in_proj_bias [3E]`` (zeros), or, when ``kdim``/``vdim`` differ from ``E``,
    ``q_proj_weight [E, E]``, ``k_proj_weight [E, kdim]``, ``v_proj_weight [E, vdim]``
    (each xavier uniform); ``out_proj`` a Linear(E, E) with a zero bias.  ``bias=False``
    drops both biases.  ``add_bias_kv`` and ``add_zero_attn`` are not supported (an
    :class:`~engine.nn.NNError`).

    ``forward(query, key, value, key_padding_mask=None, need_weights=True,
    attn_mask=None, average_attn_weights=True, is_causal=False)`` returns ``(output,
    weights)``: ``output [batch, L, E]``, ``weights`` the attention weights (after
    dropout, as PyTorch's), averaged over the heads ``[batch, L, S]`` or per head
    ``[batch, heads, L, S]``, or None without ``need_weights``.  Masks as PyTorch's
    (True means *not* attended): ``key_padding_mask [batch, S]``, a traced tensor
    (a ``bool`` graph input, or float, added); ``attn_mask [L, S]``, a numpy array
    (bool or float) or an unbatched traced tensor (PyTorch's per-sample ``[batch *
    heads, L, S]`` cannot be given: it would merge the symbolic batch).  With
    ``is_causal`` and no ``attn_mask``, the causal mask is made (PyTorch requires the
    mask as well, and takes ``is_causal`` as a hint about it).  A query whose keys are
    all masked gives NaN, as PyTorch's reference implementation.

    >>> mha = MultiheadAttention(16, 4, batch_first=True)
    >>> [(k, p.shape) for k, p in mha.named_parameters()][:3]
    [('in_proj_weight', (48, 16)), ('in_proj_bias', (48,)), ('out_proj.weight', (16, 16))]
    >>> [k for k, _ in MultiheadAttention(16, 4, kdim=8, vdim=8).named_parameters()][:3]
    ['q_proj_weight', 'k_proj_weight', 'v_proj_weight']
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim: int | None = None,
                 vdim: int | None = None, batch_first: bool = False) -> None:
        super().__init__()
        if embed_dim <= 0 or num_heads <= 0:
            raise NNError(f"MultiheadAttention: embed_dim ({embed_dim}) and num_heads "
                          f"({num_heads}) must be positive")
        if embed_dim % num_heads:
            raise NNError(f"MultiheadAttention: embed_dim {embed_dim} must be divisible by "
                          f"num_heads {num_heads}")
        if add_bias_kv or add_zero_attn:
            raise NNError("MultiheadAttention(add_bias_kv=True / add_zero_attn=True) is not "
                          "supported")
        if not 0.0 <= dropout < 1.0:
            raise NNError(f"MultiheadAttention: dropout must be in [0, 1), got {dropout}")
        self.embed_dim, self.num_heads = int(embed_dim), int(num_heads)
        self.head_dim = self.embed_dim // self.num_heads
        self.kdim = int(kdim) if kdim is not None else self.embed_dim
        self.vdim = int(vdim) if vdim is not None else self.embed_dim
        self._qkv_same_embed_dim = self.kdim == self.embed_dim and self.vdim == self.embed_dim
        self.dropout, self.batch_first = float(dropout), bool(batch_first)
        e = self.embed_dim
        if self._qkv_same_embed_dim:
            self.in_proj_weight = Parameter(shape=(3 * e, e),
                                            init=Init.xavier_uniform(fan_in=e, fan_out=3 * e))
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        else:
            self.q_proj_weight = Parameter(shape=(e, e), init=Init.xavier_uniform(e, e))
            self.k_proj_weight = Parameter(shape=(e, self.kdim),
                                           init=Init.xavier_uniform(self.kdim, e))
            self.v_proj_weight = Parameter(shape=(e, self.vdim),
                                           init=Init.xavier_uniform(self.vdim, e))
            self.register_parameter("in_proj_weight", None)
        if bias:
            self.in_proj_bias = Parameter(shape=(3 * e,), init=Init.zeros())
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = Linear(e, e, bias=bias)
        if bias:
            self.out_proj.bias = Parameter(shape=(e,), init=Init.zeros())

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"batch_first={self.batch_first}")

    def _projection(self, x: Tensor, i: int) -> Tensor:
        """Query (0), key (1) or value (2) projection: the weight's rows ``i*E:(i+1)*E``
        (a Slice of the parameter: its gradient lands in those rows)."""
        e = self.embed_dim
        if self._qkv_same_embed_dim:
            w = as_tensor(self.in_proj_weight)[i * e:(i + 1) * e]
        else:
            w = as_tensor((self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)[i])
        b = None if self.in_proj_bias is None else as_tensor(self.in_proj_bias)[i * e:(i + 1) * e]
        want = (e, self.kdim, self.vdim)[i]
        if x.desc.shape[-1] != want:
            what = ("query", "key", "value")[i]
            raise TraceError(f"MultiheadAttention: the {what}'s last axis is "
                             f"{x.desc.shape[-1]}, expected {want}")
        return F.linear(x, w, b)

    def _heads(self, x: Tensor) -> Tensor:
        """``[N, L, E]`` as ``[N, heads, L, head_dim]``."""
        n_lead = -1 if x.batched else x.desc.shape[0]
        return x.reshape(n_lead, x.desc.shape[1], self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, query: Any, key: Any, value: Any, key_padding_mask: Any = None,
                need_weights: bool = True, attn_mask: Any = None,
                average_attn_weights: bool = True, is_causal: bool = False
                ) -> tuple[Tensor, Tensor | None]:
        q, k, v = (_tensor(t, n) for t, n in ((query, "query"), (key, "key"),
                                               (value, "value")))
        for t, name in ((q, "query"), (k, "key"), (v, "value")):
            if t.ndim != 3:
                raise TraceError(f"MultiheadAttention: the {name} must be 3-D ([batch, L, E] "
                                 f"with batch_first=True), got {t.shape}")
        if not self.batch_first:
            if q.batched or k.batched or v.batched:
                raise TraceError("MultiheadAttention(batch_first=False) takes [L, batch, E], "
                                 "but a traced graph's batch is the leading axis: build it "
                                 "with batch_first=True ([batch, L, E])")
            q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
        if k.desc.shape[:2] != v.desc.shape[:2]:
            raise TraceError(f"MultiheadAttention: key {k.shape} and value {v.shape} differ in "
                             "batch or length")
        L, S = q.desc.shape[1], k.desc.shape[1]
        qh = self._heads(self._projection(q, 0))
        kh = self._heads(self._projection(k, 1))
        vh = self._heads(self._projection(v, 2))
        scores = attention_scores(qh, kh, None)  # [N, heads, L, S]
        if attn_mask is None and is_causal:
            attn_mask = causal_mask(L, S)
        if attn_mask is not None:
            shape = attn_mask.shape if isinstance(attn_mask, np.ndarray) else \
                _tensor(attn_mask, "attn_mask").shape
            if tuple(shape) != (L, S):
                raise TraceError(f"MultiheadAttention: attn_mask must be [L, S] = {(L, S)}, got "
                                 f"{shape} (a per-sample [batch * heads, L, S] mask is not "
                                 "supported: use key_padding_mask)")
            scores = apply_mask(scores, attn_mask, "ignore", "attn_mask")
        if key_padding_mask is not None:
            kpm = _tensor(key_padding_mask, "key_padding_mask (a traced [batch, S] tensor, "
                          "e.g. a graph input declared ((0, S), 'bool'))")
            want = (q.desc.shape[0], S)
            if kpm.desc.shape != want:
                shown = ("batch" if q.batched else q.desc.shape[0], S)
                raise TraceError(f"MultiheadAttention: key_padding_mask must be [batch, S] = "
                                 f"{shown}, got {kpm.shape}")
            scores = apply_mask(scores, kpm.unsqueeze(1).unsqueeze(1), "ignore",
                                "key_padding_mask")
        weights = scores._emit("Softmax", scores, axis=3)
        p = self.dropout if self.training else 0.0
        weights = dropout_on_train_path(weights, p, "dropout")
        heads = weights._emit("MatMul", weights, vh)  # [N, heads, L, head_dim]
        joined = heads.transpose(1, 2).reshape(-1 if heads.batched else heads.desc.shape[0],
                                               L, self.embed_dim)
        out = self.out_proj(joined)
        if not self.batch_first:
            out = out.transpose(0, 1)
        if not need_weights:
            return out, None
        return out, (weights.mean(1) if average_attn_weights else weights)


_ACTIVATIONS: dict[str, Callable[[Any], Tensor]] = {"relu": F.relu, "gelu": F.gelu}


class TransformerEncoderLayer(Module):
    """PyTorch's ``nn.TransformerEncoderLayer``: self-attention and a feed-forward block
    (``linear1``, activation, dropout, ``linear2``), each added to its input, with
    ``norm1``/``norm2`` after (``norm_first=False``) or before (``norm_first=True``)
    them; dropout ``dropout`` on the attention weights and after each block, active on
    the training path only.  ``activation`` is ``"relu"``, ``"gelu"`` or a callable (a
    module is registered as ``activation``).

    ``forward(src, src_mask=None, src_key_padding_mask=None, is_causal=False)`` with
    the masks of :class:`MultiheadAttention`.
    """

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation: str | Callable[[Any], Any] = "relu",
                 layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True) -> None:
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                            batch_first=batch_first)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias)
        self.norm_first = bool(norm_first)
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        if isinstance(activation, str):
            if activation not in _ACTIVATIONS:
                raise NNError(f"TransformerEncoderLayer: activation must be 'relu', 'gelu' or "
                              f"a callable, got {activation!r}")
            self.activation: Any = _ACTIVATIONS[activation]
        elif callable(activation):
            self.activation = activation
        else:
            raise NNError(f"TransformerEncoderLayer: activation must be 'relu', 'gelu' or a "
                          f"callable, got {type(activation).__name__}")

    def forward(self, src: Any, src_mask: Any = None, src_key_padding_mask: Any = None,
                is_causal: bool = False) -> Tensor:
        x = _tensor(src, "src")
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._ff_block(self.norm2(x))
        x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._ff_block(x))

    def _sa_block(self, x: Tensor, attn_mask: Any, key_padding_mask: Any,
                  is_causal: bool) -> Tensor:
        y = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                           need_weights=False, is_causal=is_causal)[0]
        return self.dropout1(y)

    def _ff_block(self, x: Tensor) -> Tensor:
        return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))


class TransformerEncoder(Module):
    """PyTorch's ``nn.TransformerEncoder``: ``num_layers`` deep copies of
    ``encoder_layer`` (``layers.0``, ``layers.1``, ...: copies of its values too, when
    it has any) applied in turn, then ``norm`` if given.  ``enable_nested_tensor``
    and ``mask_check`` (PyTorch's fast-path switches) are accepted and change nothing.

    ``forward(src, mask=None, src_key_padding_mask=None, is_causal=None)``.
    """

    def __init__(self, encoder_layer: Module, num_layers: int, norm: Module | None = None,
                 enable_nested_tensor: bool = True, mask_check: bool = True) -> None:
        super().__init__()
        if not isinstance(encoder_layer, Module):
            raise NNError(f"TransformerEncoder needs an engine.nn Module as its layer, got "
                          f"{type(encoder_layer).__name__}")
        if num_layers < 1:
            raise NNError(f"TransformerEncoder: num_layers must be at least 1, got {num_layers}")
        self.layers = ModuleList([copy.deepcopy(encoder_layer) for _ in range(num_layers)])
        self.num_layers = int(num_layers)
        self.norm = norm
        self.enable_nested_tensor, self.mask_check = enable_nested_tensor, mask_check

    def forward(self, src: Any, mask: Any = None, src_key_padding_mask: Any = None,
                is_causal: bool | None = None) -> Tensor:
        x = _tensor(src, "src")
        for layer in self.layers:
            x = layer(x, src_mask=mask, src_key_padding_mask=src_key_padding_mask,
                      is_causal=bool(is_causal))
        return self.norm(x) if self.norm is not None else x


class LearnedPositionalEmbedding(Module):
    """A learned position table added to ``[batch, L, d_model]`` inputs: ``weight
    [max_len, d_model]``, init ``N(0, 0.02)`` (GPT-2's and BERT's), whose first ``L``
    rows are added (``L <= max_len``).  Not in torch.nn; PyTorch's equivalent is
    ``x + self.weight[:x.size(1)]`` with ``weight = nn.Parameter(torch.randn(max_len,
    d_model) * 0.02)``.

    >>> pe = LearnedPositionalEmbedding(16, 8)
    >>> [(k, p.shape) for k, p in pe.named_parameters()], pe.weight.init.std
    ([('weight', (16, 8))], 0.02)
    """

    def __init__(self, max_len: int, d_model: int, std: float = 0.02) -> None:
        super().__init__()
        if max_len < 1 or d_model < 1:
            raise NNError(f"LearnedPositionalEmbedding: max_len ({max_len}) and d_model "
                          f"({d_model}) must be positive")
        self.max_len, self.d_model = int(max_len), int(d_model)
        self.weight = Parameter(shape=(self.max_len, self.d_model), init=Init.normal(0.0, std))

    def forward(self, x: Any) -> Tensor:
        t = _positions(x, self.max_len, self.d_model, type(self).__name__)
        L = t.desc.shape[-2]
        w = as_tensor(self.weight)
        return t + (w if self.max_len == L else w[:L])

    def extra_repr(self) -> str:
        return f"{self.max_len}, {self.d_model}"


def _positions(x: Any, max_len: int, d_model: int, name: str) -> Tensor:
    t = _tensor(x, f"{name}'s input")
    if t.ndim < 2 or t.desc.shape[-1] != d_model:
        raise TraceError(f"{name} takes [batch, L, {d_model}], got {t.shape}")
    if t.desc.shape[-2] > max_len:
        raise TraceError(f"{name}: the sequence length {t.desc.shape[-2]} exceeds max_len "
                         f"{max_len}")
    return t


def sinusoidal_table(length: int, d_model: int) -> np.ndarray:
    """The "Attention is all you need" table ``[length, d_model]`` (float32): ``sin(pos
    / 10000^(2i/d))`` in the even columns, ``cos`` in the odd ones, computed as the
    PyTorch tutorial does.

    >>> [[round(float(v), 4) for v in row] for row in sinusoidal_table(2, 4)]
    [[0.0, 1.0, 0.0, 1.0], [0.8415, 0.5403, 0.01, 0.9999]]
    """
    position = np.arange(length, dtype=np.float32)[:, None]
    div_term = np.exp(np.arange(0, d_model, 2, dtype=np.float32)
                      * np.float32(-math.log(10000.0) / d_model))
    pe = np.zeros((length, d_model), dtype=np.float32)
    pe[:, 0::2] = np.sin(position * div_term)
    pe[:, 1::2] = np.cos(position * div_term[: d_model // 2])
    return pe


class SinusoidalPositionalEncoding(Module):
    """The PyTorch tutorial's ``PositionalEncoding`` for ``[batch, L, d_model]`` inputs
    (batch first): ``dropout(x + table[:L])`` with :func:`sinusoidal_table`.  The table
    is a frozen constant of the graph, ``[L, d_model]`` only; unlike the tutorial's
    buffer ``pe`` it is not in the state dict (it depends on ``d_model`` alone), so
    the tutorial's state dict loads with ``strict=False``.

    >>> SinusoidalPositionalEncoding(8, max_len=100).state_dict()
    OrderedDict()
    """

    def __init__(self, d_model: int, max_len: int = 5000, dropout: float = 0.0) -> None:
        super().__init__()
        if max_len < 1 or d_model < 1:
            raise NNError(f"SinusoidalPositionalEncoding: max_len ({max_len}) and d_model "
                          f"({d_model}) must be positive")
        self.d_model, self.max_len = int(d_model), int(max_len)
        self.dropout = Dropout(dropout)

    def forward(self, x: Any) -> Tensor:
        t = _positions(x, self.max_len, self.d_model, type(self).__name__)
        return self.dropout(t + sinusoidal_table(t.desc.shape[-2], self.d_model))

    def extra_repr(self) -> str:
        return f"{self.d_model}, max_len={self.max_len}"
