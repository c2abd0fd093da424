"""Attention's functional forms: ``scaled_dot_product_attention``, ``masked_fill``,
``einsum`` and a broadcasting ``matmul``, as in PyTorch (re-exported by
:mod:`engine.nn.functional`).

Everything is composed of differentiable ops of the table (``MatMulT``, ``Mul``,
``Add`` or ``Where``, ``Softmax``, ``Dropout``, ``MatMul``, ``Transpose``,
``Reshape``, ``ReduceSum``), so the backward is derived, fused and planned like any
other: the scores ``[batch, heads, L, S]`` are ordinary buffers, which ``max_batch``
and the packer see.

Masks.  A mask is one of: a numpy array (bool or float: a frozen constant, e.g. a
causal mask), a traced tensor of dtype ``bool`` (a comparison, or a graph input
declared ``((0, S), "bool")``; selected with ``Where``) or of a float
dtype (added to the scores), or ``is_causal=True``.  As in PyTorch, a bool mask of
``scaled_dot_product_attention`` is True where a position *takes part*, a float mask
is added, and a row with every position masked is NaN (a softmax of ``-inf`` only).

>>> import numpy as np
>>> from engine import nn
>>> from engine.nn.attention import scaled_dot_product_attention
>>> class Attend(nn.Module):
...     def forward(self, x):
...         q = x.reshape(-1, 2, 4, 3)              # [batch, heads, L, head_dim]
...         return scaled_dot_product_attention(q, q, q, is_causal=True).flatten(1)
>>> g = nn.to_graph(Attend(), inputs={"x": (0, 24)}, loss=None)
>>> [n.op for n in g.paths[0].nodes]
['Reshape', 'Mul', 'MatMulT', 'Add', 'Softmax', 'MatMul', 'Reshape']
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from engine.nn._tensor import Tensor, _Ops, as_tensor, masked_fill, reshape
from engine.nn._trace import TraceError

__all__ = ["einsum", "masked_fill", "matmul", "scaled_dot_product_attention"]


def _t(x: Any, what: str) -> Tensor:
    if not isinstance(x, _Ops):
        raise TraceError(f"{what} must be a traced tensor, got {type(x).__name__}")
    return x._t()


def matmul(input: Any, other: Any) -> Tensor:
    """``input @ other`` with numpy's (and PyTorch's) semantics: the last two axes are
    matrices, the leading ones broadcast (a parameter ``[K, N]`` meets ``[batch, ...,
    M, K]``); a 1-D operand is a vector.  One ``MatMul``, whose gradient reduces each
    operand's gradient back over the axes it was broadcast along."""
    a, b = _t(input, "matmul's input"), _t(other, "matmul's other")
    return a._emit("MatMul", a, b)


def causal_mask(L: int, S: int) -> np.ndarray:
    """PyTorch's ``is_causal`` mask as an additive float32 ``[L, S]`` array: 0 where key
    ``j <= i`` (aligned to the top left, ``torch.ones(L, S).tril()``), ``-inf`` above.

    >>> causal_mask(2, 3).tolist()
    [[0.0, -inf, -inf], [0.0, 0.0, -inf]]
    """
    keep = np.tril(np.ones((L, S), dtype=bool))
    return np.where(keep, 0.0, -np.inf).astype(np.float32)


def _check_mask_shape(mask_shape: tuple[Any, ...], mask_batched: bool, scores: Tensor,
                      what: str) -> None:
    """The mask must broadcast to the scores without stretching the scores; a batched
    mask (its leading axis the symbolic batch) must meet the batch axis of the scores."""
    sshape = scores.shape
    ok = len(mask_shape) <= len(sshape)
    if ok and mask_batched:
        ok = scores.batched and len(mask_shape) == len(sshape)
    if ok:
        for m, s in zip(reversed(mask_shape), reversed(sshape), strict=False):
            if not (m == s or m == 1):
                ok = False
    if not ok:
        shown = tuple("batch" if (i == 0 and mask_batched) else d
                      for i, d in enumerate(mask_shape))
        raise TraceError(f"{what} of shape {shown} does not broadcast to the attention "
                         f"scores {scores.shape} ([..., L, S]: query length L, key length S)")


def apply_mask(scores: Tensor, mask: Any, true_means: str, what: str) -> Tensor:
    """``scores`` with ``mask`` applied: a float mask (numpy or traced) is added; a bool
    one keeps the scores where it is True (``true_means="keep"``: PyTorch's
    ``scaled_dot_product_attention``) or where it is False (``"ignore"``:
    ``MultiheadAttention``'s masks), ``-inf`` elsewhere."""
    if isinstance(mask, np.ndarray):
        if mask.dtype == np.bool_:
            keep = mask if true_means == "keep" else ~mask
            mask = np.where(keep, 0.0, -np.inf).astype(np.float32)
        elif mask.dtype.kind != "f":
            raise TraceError(f"{what} must be bool or float, got a numpy array of "
                             f"{mask.dtype}")
        _check_mask_shape(mask.shape, False, scores, what)
        return scores + as_tensor(mask.astype(np.float32, copy=False), like=scores)
    if not isinstance(mask, _Ops):
        raise TraceError(f"{what} must be a numpy array or a traced tensor (bool or float), "
                         f"got {type(mask).__name__}")
    m = mask._t()
    _check_mask_shape(m.shape, m.batched, scores, what)
    if m.dtype == "bool":
        neg_inf = as_tensor(float("-inf"), like=scores)
        if true_means == "keep":
            return scores._emit("Where", m, scores, neg_inf)
        return scores._emit("Where", m, neg_inf, scores)
    if m.dtype != scores.dtype:
        raise TraceError(f"{what} must be bool or {scores.dtype}, got {m.dtype}")
    return scores + m


def dropout_on_train_path(x: Tensor, p: float, what: str) -> Tensor:
    """Dropout(ratio=p) on the training path; the eval path is forward-only and has none."""
    if not 0.0 <= p < 1.0:
        raise TraceError(f"{what} must be in [0, 1), got {p}")
    if p == 0.0 or not x.tracer.training:
        return x
    return x._emit("Dropout", x, ratio=float(p))


def attention_scores(query: Tensor, key: Tensor, scale: float | None) -> Tensor:
    """``query @ key^T * scale`` (scale ``1/sqrt(E)`` by default), scaling the smaller
    ``query`` rather than the ``[..., L, S]`` scores; the transpose is MatMulT's flag."""
    if query.ndim < 2 or key.ndim < 2:
        raise TraceError(f"attention needs query [..., L, E] and key [..., S, E], got "
                         f"{query.shape} and {key.shape}")
    e = query.desc.shape[-1]
    if key.desc.shape[-1] != e:
        raise TraceError(f"query {query.shape} and key {key.shape} differ in their last "
                         "axis (the embedding E)")
    s = 1.0 / math.sqrt(e) if scale is None else float(scale)
    q = query * s if s != 1.0 else query
    return q._emit("MatMulT", q, key, transB=1)


def scaled_dot_product_attention(query: Any, key: Any, value: Any, attn_mask: Any = None,
                                 dropout_p: float = 0.0, is_causal: bool = False,
                                 scale: float | None = None, enable_gqa: bool = False
                                 ) -> Tensor:
    """PyTorch's ``F.scaled_dot_product_attention``: ``softmax(q k^T * scale + mask) v``
    over ``query [..., L, E]``, ``key [..., S, E]``, ``value [..., S, Ev]`` (leading
    axes broadcast), ``scale`` ``1/sqrt(E)`` by default.

    ``attn_mask`` broadcasts to ``[..., L, S]``: bool True where a position takes part
    (a numpy array, or a traced ``bool`` tensor), or float, added.  ``is_causal``: the
    top-left-aligned causal mask (with ``attn_mask`` a :class:`TraceError`, as in
    PyTorch).  ``dropout_p`` drops attention weights on the training path only (the
    eval path is forward-only); PyTorch applies it whenever it is given.  A fully
    masked row is NaN, as in PyTorch's reference (math) implementation.

    >>> import numpy as np
    >>> from engine import VM, compile_graph, nn
    >>> class Attend(nn.Module):
    ...     def forward(self, x):
    ...         return scaled_dot_product_attention(x, x, x).flatten(1)
    >>> g = nn.to_graph(Attend(), inputs={"x": (0, 3, 2)}, loss=None)
    >>> vm = VM(compile_graph(g, batch_size=1))
    >>> vm.set("x", np.array([[[1, 0], [0, 1], [1, 0]]], np.float32)); vm.forward("eval")
    >>> [round(float(v), 2) for v in vm.get("logits")[0]]   # as torch's
    [0.8, 0.2, 0.5, 0.5, 0.8, 0.2]
    """
    q = _t(query, "query")
    k = _t(key, "key")
    v = _t(value, "value")
    if enable_gqa:
        raise TraceError("scaled_dot_product_attention(enable_gqa=True) is not supported")
    if is_causal and attn_mask is not None:
        raise TraceError("scaled_dot_product_attention: give attn_mask or is_causal=True, "
                         "not both (as in PyTorch)")
    scores = attention_scores(q, k, scale)
    if is_causal:
        L, S = scores.desc.shape[-2], scores.desc.shape[-1]
        scores = apply_mask(scores, causal_mask(L, S), "keep", "the causal mask")
    elif attn_mask is not None:
        scores = apply_mask(scores, attn_mask, "keep", "attn_mask")
    weights = scores._emit("Softmax", scores, axis=scores.ndim - 1)
    weights = dropout_on_train_path(weights, dropout_p, "dropout_p")
    if v.ndim < 2 or v.desc.shape[-2] != k.desc.shape[-2]:
        raise TraceError(f"value {v.shape} must be [..., S, Ev] with the key's length S = "
                         f"{k.desc.shape[-2]}")
    return weights._emit("MatMul", weights, v)


# -- einsum --------------------------------------------------------------------------------


def _einsum_error(equation: str, why: str) -> TraceError:
    return TraceError(f"einsum({equation!r}): {why}; supported: one operand (a "
                      "permutation, sums over dropped letters) or two (matrix products "
                      "such as 'bhld,bhmd->bhlm', 'bhlm,bhmd->bhld', 'bld,de->ble', outer "
                      "products), explicit '->', no '...' and no repeated letter in an "
                      "operand")


def _parse(equation: str, n: int) -> tuple[list[str], str]:
    eq = equation.replace(" ", "")
    if "..." in eq:
        raise _einsum_error(equation, "ellipsis ('...') is not supported")
    if "->" not in eq:
        raise _einsum_error(equation, "give the output explicitly with '->'")
    lhs, out = eq.split("->", 1)
    terms = lhs.split(",")
    if len(terms) != n:
        raise _einsum_error(equation, f"{len(terms)} operand(s) in the equation, {n} given")
    for term in [*terms, out]:
        if not term.isalpha() and term:
            raise _einsum_error(equation, f"{term!r} is not a string of letters")
        if len(set(term)) != len(term):
            raise _einsum_error(equation, f"letter repeated in {term!r} (diagonals)")
    for c in out:
        if not any(c in t for t in terms):
            raise _einsum_error(equation, f"output letter {c!r} is in no operand")
    return terms, out


def _permute(x: Tensor, have: str, want: str) -> Tensor:
    if have == want:
        return x
    return x._emit("Transpose", x, perm=tuple(have.index(c) for c in want))


def _sum_out(x: Tensor, have: str, keep: set[str]) -> tuple[Tensor, str]:
    """Sum over the letters not in ``keep``."""
    axes = tuple(i for i, c in enumerate(have) if c not in keep)
    if not axes:
        return x, have
    return x._emit("ReduceSum", x, axes=axes, keepdims=0), "".join(c for c in have
                                                                 if c in keep)


def einsum(equation: str, *operands: Any) -> Tensor:
    """``torch.einsum`` for one or two operands, as Transpose, ReduceSum, Reshape and one
    broadcasting MatMul: letters in both operands and the output are batch axes, in
    both but not the output contracted, in one operand and the output kept, in neither
    of the others summed first.  A batched operand's batch letter must lead the
    output (the batch axis of a traced tensor stays first).  Anything else (``...``,
    a repeated letter, three operands) is a :class:`TraceError` naming the equation.

    >>> from engine import nn
    >>> class Proj(nn.Module):
    ...     def __init__(self):
    ...         super().__init__(); self.w = nn.Parameter(np.ones((4, 2), np.float32))
    ...     def forward(self, x):
    ...         return einsum("bld,de->ble", x, self.w).flatten(1)
    >>> g = nn.to_graph(Proj(), inputs={"x": (0, 3, 4)}, loss=None)
    >>> [n.op for n in g.paths[0].nodes]
    ['MatMul', 'Reshape']
    """
    if len(operands) == 1 and isinstance(operands[0], list | tuple):
        operands = tuple(operands[0])
    if not isinstance(equation, str):
        raise TraceError(f"einsum's equation must be a string, got {type(equation).__name__}")
    if len(operands) not in (1, 2):
        raise _einsum_error(equation, f"{len(operands)} operands")
    terms, out = _parse(equation, len(operands))
    xs = [_t(x, "an einsum operand") for x in operands]
    for x, term in zip(xs, terms, strict=True):
        if x.ndim != len(term):
            raise _einsum_error(equation, f"operand {term!r} has {len(term)} letters but the "
                                f"tensor is {x.ndim}-D {x.shape}")
        if x.batched and (not out or out[0] != term[0]):
            raise _einsum_error(equation, f"the batch axis {term[0]!r} of a batched operand "
                                "must lead the output")
    if len(xs) == 1:
        y, have = _sum_out(xs[0], terms[0], set(out))
        return _permute(y, have, out)
    return _einsum2(equation, xs[0], terms[0], xs[1], terms[1], out)


def _einsum2(equation: str, a: Tensor, ta: str, b: Tensor, tb: str, out: str) -> Tensor:
    a, ta = _sum_out(a, ta, set(out) | set(tb))
    b, tb = _sum_out(b, tb, set(out) | set(ta))
    dims = {c: d for x, t in ((a, ta), (b, tb)) for c, d in zip(t, x.desc.shape, strict=True)}
    for c in set(ta) & set(tb):
        da, db = a.desc.shape[ta.index(c)], b.desc.shape[tb.index(c)]
        if da != db:
            raise _einsum_error(equation, f"letter {c!r} is {da} in one operand and {db} "
                                "in the other")
    bl = ta[0] if a.batched else tb[0] if b.batched else ""
    for x, t in ((a, ta), (b, tb)):
        if (x.batched and t[0] != bl) or (not x.batched and bl and bl in t):
            raise _einsum_error(equation, f"the batch letter {bl!r} must lead both operands "
                                "(both batched) or be in the batched one only")
    batch = [c for c in out if c in ta and c in tb and c != bl]
    contracted = [c for c in ta if c in tb and c not in out]
    left = [c for c in out if c in ta and c not in tb and c != bl]
    right = [c for c in out if c in tb and c not in ta and c != bl]
    # The product is [lead..., M, N]: the batch letter, the shared letters, then every
    # kept letter but the last of each side (the other operand has a 1 there, which
    # MatMul broadcasts); M and N are the last kept letter of each side.
    lead = ([bl] if bl else []) + batch + left[:-1] + right[:-1]
    m, n = left[-1:], right[-1:]

    def matrix(x: Tensor, t: str, rows: list[str], cols: list[str]) -> tuple[Tensor, int]:
        """x as [lead (1 where x lacks the letter)..., rows, cols], and whether it is
        given transposed (an operand stored [..., cols, rows] is read through MatMulT's
        flag rather than copied by a Transpose)."""
        keep = [c for c in lead if c in t]
        flip = len(rows) == 1 and len(cols) == 1 and t == "".join(keep + cols + rows)
        if not flip:
            x = _permute(x, t, "".join(keep + rows + cols))
        shape = [dims[c] if c in t else 1 for c in lead]
        mat = [math.prod(dims[c] for c in rows), math.prod(dims[c] for c in cols)]
        shape += mat[::-1] if flip else mat
        have = x.desc.shape
        extra = len(shape) - len(have)
        if tuple(shape) == have or (not x.batched and extra > 0 and tuple(shape[extra:]) == have
                                    and all(d == 1 for d in shape[:extra])):
            return x, int(flip)  # MatMul broadcasts the leading axes an unbatched one lacks
        return reshape(x, [-1, *shape[1:]] if x.batched else shape), int(flip)

    (xa, fa), (xb, fb) = matrix(a, ta, m, contracted), matrix(b, tb, contracted, n)
    y = (xa._emit("MatMulT", xa, xb, transA=fa, transB=fb) if fa or fb
         else xa._emit("MatMul", xa, xb))
    have = "".join(lead + m + n)
    full = [dims[c] for c in have]
    if tuple(full) != y.desc.shape:
        y = reshape(y, [-1, *full[1:]] if y.batched else full)
    return _permute(y, have, out)


__all__ += ["causal_mask"]
__all__ = sorted(set(__all__))
masked_fill.__module__ = __name__
