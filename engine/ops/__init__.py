"""The instruction set: one table from op name to :class:`OpDef`.

>>> from engine.ops import OP_TABLE, get_op
>>> get_op("Gemm").attrs["transB"]
0
>>> "MatMul" in OP_TABLE
True
"""

from __future__ import annotations

from engine.errors import GraphError
from engine.ops import (
    activations,
    cast,
    compare,
    constant,
    conv,
    conv_transpose,
    conv_variants,
    dequantize_gemm,
    elementwise,
    fused,
    gelu,
    instance_norm,
    linalg,
    loss,
    metric_stats,
    nll,
    norm,
    pool,
    power,
    reduce,
    reduce_family,
    resize,
    select,
    shape,
    slicing,
    stacked,
)
from engine.ops._base import (
    FIRST_ORDER_ONLY,
    NON_DIFFERENTIABLE_METRIC,
    DoesNotStack,
    GradBuilder,
    KernelArgs,
    NodeView,
    NonDifferentiable,
    OpDef,
    StackRule,
)

OP_TABLE: dict[str, OpDef] = {}
for _module in (elementwise, activations, gelu, cast, compare, constant, linalg, fused,
                dequantize_gemm, conv, conv_transpose, pool, power, reduce, reduce_family,
                select, shape, slicing, loss, metric_stats, nll, norm, instance_norm, resize,
                stacked):
    for _op in _module.OPS:
        if _op.name in OP_TABLE:
            raise RuntimeError(f"op {_op.name} is defined twice")
        OP_TABLE[_op.name] = _op
conv_variants.register(conv.VARIANTS)  # after conv: the variants use its helpers


def get_op(name: str) -> OpDef:
    """The definition of ``name``; a clear error listing what exists otherwise."""
    try:
        return OP_TABLE[name]
    except KeyError:
        raise GraphError(
            f"unknown op {name!r}. Available: {', '.join(sorted(OP_TABLE))}"
        ) from None


__all__ = [
    "FIRST_ORDER_ONLY",
    "NON_DIFFERENTIABLE_METRIC",
    "OP_TABLE",
    "DoesNotStack",
    "GradBuilder",
    "KernelArgs",
    "NodeView",
    "NonDifferentiable",
    "OpDef",
    "StackRule",
    "get_op",
]
