"""ONNX's own machinery that import folding runs: one node evaluated by the reference
implementation, and a model's shapes inferred (the data inputs' first dimension named
:data:`BATCH_SYMBOL`, so that nothing the batch size reaches passes for a constant).

>>> from onnx import helper
>>> node = helper.make_node("Add", ["a", "b"], ["c"])
>>> evaluate_node(node, {"a": np.array([1, 2]), "b": np.array([3, 4])}, opset=18)[0].tolist()
[4, 6]
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from engine.errors import GraphError

CONTROL = {"Loop", "Scan", "If", "SequenceMap"}
# ONNX's operators that draw (most of which this engine lacks): never folded
RANDOM = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
          "Bernoulli", "Multinomial", "Dropout"}


BATCH_SYMBOL = "batch"  # the data inputs' first dimension, while shapes are inferred


def inferred_model(model: Any, nodes: list[Any], consts: dict[str, np.ndarray], batch: bool
                   ) -> Any:
    """``model`` with ``nodes`` and ``consts``, its shapes inferred by ONNX (the data
    inputs' first dimension named :data:`BATCH_SYMBOL` with ``batch``)."""
    from onnx import helper, numpy_helper, shape_inference

    read = {i for n in nodes for i in n.input if i}
    g = model.graph
    small = {k for k in read if k in consts and consts[k].size <= 1 << 16}
    # Shape-sized constants as initializers (their values propagate); weights only as
    # typed inputs: their shapes are all the inference needs.
    big = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(consts[k].dtype),
                                         consts[k].shape)
           for k in sorted(read - small) if k in consts]
    data = [vi for vi in g.input if vi.name not in consts]
    graph = helper.make_graph(
        nodes, g.name, data + big, list(g.output),
        [numpy_helper.from_array(np.ascontiguousarray(consts[k]), k) for k in sorted(small)],
        value_info=list(g.value_info))
    m = helper.make_model(graph, opset_imports=list(model.opset_import))
    m.ir_version = max(model.ir_version, 4)
    if batch:
        for vi in m.graph.input[:len(data)]:
            dims = vi.type.tensor_type.shape.dim
            if len(dims):
                dims[0].dim_param = BATCH_SYMBOL
    return shape_inference.infer_shapes(m, data_prop=True)


def evaluate_node(node: Any, consts: dict[str, np.ndarray], opset: int) -> list[Any]:
    """Run one node with ONNX's reference implementation at the model's opset (a bare
    node would run at the newest one, whose attributes may differ)."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    ins = [i for i in node.input if i]
    graph = helper.make_graph(
        [node], "fold",
        [helper.make_tensor_value_info(i, helper.np_dtype_to_tensor_dtype(consts[i].dtype),
                                       consts[i].shape) for i in ins],
        [helper.make_tensor_value_info(o, 0, None) for o in node.output if o])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    try:
        return list(ReferenceEvaluator(model).run(None, {i: consts[i] for i in ins}))
    except Exception as e:  # the reference raises whatever its kernels raise
        raise GraphError(f"node {node.name or node.output[0]!r} ({node.op_type}): its "
                         f"constant inputs do not evaluate: {type(e).__name__}: {e}") from None


def inferred_shapes(inferred: Any) -> Iterator[tuple[str, tuple[int, ...], bool]]:
    """Each value of an :func:`inferred_model` with a shape: its name, its dimensions (0
    for an unknown one) and whether its first is the batch (:data:`BATCH_SYMBOL`)."""
    for vi in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        t = vi.type.tensor_type
        if t.HasField("shape"):
            dims = t.shape.dim
            yield (vi.name, tuple(d.dim_value if d.HasField("dim_value") else 0 for d in dims),
                   bool(len(dims)) and dims[0].dim_param == BATCH_SYMBOL)
