"""A kept model as one ONNX file that takes raw rows and gives predictions.

The engine exports the eval path up to its ``logits`` layer
(:func:`engine.onnx_io.export.export_onnx`, trained weights as initializers); around it
go, as ONNX nodes:

- in front, the preprocessing the search fitted on the training split
  (:class:`explore.datasets.table.Preprocess`): with ``dataset.missing: impute``, a
  NaN of a numeric column replaced by its fitted value (``IsNaN``, ``Where``); numeric
  columns scaled, ``(x - offset) / scale``; each categorical column one-hot encoded
  over the categories learned (``ai.onnx.ml.OneHotEncoder``; an unknown category
  encodes as all zeros, as in the search), an empty string in a text column imputed
  as its most frequent category (a string tensor has no other missing value; an
  integer column's int64 input has none, so its rows must come complete);
- behind, a classification's ``probabilities`` (softmax) and ``label`` (the class as
  the data had it), or a regression's ``prediction`` in the target's units.

Inputs: ``x`` (float32 ``[N, numeric columns]``, in the order of
``Preprocess.numeric``; NaN where a value is missing) when the data set has numeric
columns, and one input per categorical column, named after it (``[N, 1]``, string or
int64; ``""`` where a text value is missing).  A data set without
preprocessing (the built-in image sets) keeps the model's own input ``x``.  A sequence
model's ``x`` is the sequences as they come, raw (:func:`sequence_input`): ``[N,
length, values per step]`` (a window of a series, its columns in order), or ``[N,
length]`` int64 token ids.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from engine.onnx_io.export import export_onnx
from explore.onnx_metadata import annotate

OPSET = 17
ML_OPSET = 3


def model_to_onnx(model: Any) -> Any:
    """The ONNX ``ModelProto`` of a :class:`explore.trained.TrainedModel`."""
    core = export_onnx(model.graph, outputs=["logits"], vm=model.vm,
                       name=f"{model.study}-trial-{model.trial}")
    g = core.graph
    nodes = list(g.node)
    inits = list(g.initializer)
    inputs = list(g.input)
    pre = model.data.preprocess
    if pre is not None:
        # the model's own input becomes the preprocessing's output; the raw numeric
        # columns take the name x
        for n in nodes:
            n.input[:] = ["model_input" if i == "x" else i for i in n.input]
        front, front_inits, front_inputs = preprocessing_nodes(pre, "model_input", helper,
                                                                numpy_helper, TensorProto)
        nodes = front + nodes
        inits = front_inits + inits
        inputs = front_inputs
    seq = getattr(model.data, "sequence", None)
    if seq is not None:
        front, front_inits, inputs = sequence_input(seq, inputs, nodes)
        nodes = front + nodes
        inits = front_inits + inits
    back: list[Any] = []
    outputs = []
    if model.data.task == "regression":
        mean, std = model.data.target_scale or (0.0, 1.0)
        inits += [numpy_helper.from_array(np.array(std, np.float32), "target_std"),
                  numpy_helper.from_array(np.array(mean, np.float32), "target_mean"),
                  numpy_helper.from_array(np.array([-1], np.int64), "flat_shape")]
        back += [helper.make_node("Mul", ["logits", "target_std"], ["scaled"]),
                 helper.make_node("Add", ["scaled", "target_mean"], ["unflat"]),
                 helper.make_node("Reshape", ["unflat", "flat_shape"], ["prediction"])]
        outputs.append(helper.make_tensor_value_info("prediction", TensorProto.FLOAT, ["N"]))
    else:
        classes = model.data.classes
        back += [helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1),
                 helper.make_node("ArgMax", ["logits"], ["class_index"], axis=1, keepdims=0)]
        outputs.append(helper.make_tensor_value_info("probabilities", TensorProto.FLOAT,
                                                     ["N", classes]))
        labels = getattr(pre, "labels", None) if pre is not None else None
        if labels:
            arr = np.asarray(labels)
            if arr.dtype.kind in "iub":
                arr = arr.astype(np.int64)
                kind = TensorProto.INT64
            elif arr.dtype.kind == "f":
                arr = arr.astype(np.float32)
                kind = TensorProto.FLOAT
            else:
                arr = arr.astype(object)
                kind = TensorProto.STRING
            inits.append(_constant(numpy_helper, arr, "class_labels"))
            back.append(helper.make_node("Gather", ["class_labels", "class_index"], ["label"],
                                         axis=0))
        else:
            back.append(helper.make_node("Identity", ["class_index"], ["label"]))
            kind = TensorProto.INT64
        outputs.append(helper.make_tensor_value_info("label", kind, ["N"]))
    graph = helper.make_graph(nodes + back, g.name, inputs, outputs, inits)
    opsets = [helper.make_opsetid("", OPSET)]
    if any(n.domain == "ai.onnx.ml" for n in graph.node):
        opsets.append(helper.make_opsetid("ai.onnx.ml", ML_OPSET))
    out = helper.make_model(graph, opset_imports=opsets, producer_name="calcgraph-explore")
    out.ir_version = 8
    annotate(out, model)  # explore.* metadata: columns, categories, scaling, classes
    # the full check also infers every shape and type, so a file that onnxruntime or
    # another loader would refuse is never written
    onnx.checker.check_model(out, full_check=True)
    return out


def sequence_input(seq: Any, inputs: list[Any], nodes: list[Any]
                   ) -> tuple[list[Any], list[Any], list[Any]]:
    """The input ``x`` of a sequence model as the sequences come: ``[N, length,
    values per step]`` (a masked step's last value its presence flag, 1 or 0), or
    ``[N, length]`` int64 token ids; nodes that flatten it into the rows the rest of the
    graph reads (renamed ``x_rows``), their initializers, and the graph's inputs.
    ``seq`` is the data set's :class:`~explore.datasets.sequence_shape.SequenceShape`."""
    flat = next(v for v in inputs if v.name == "x")
    elem = flat.type.tensor_type.elem_type
    for n in nodes:
        n.input[:] = ["x_rows" if i == "x" else i for i in n.input]
    shape = np.array([-1, seq.features], np.int64)
    out: list[Any] = [numpy_helper.from_array(shape, "x_row_shape")]
    if seq.tokens:
        given = helper.make_tensor_value_info("x", TensorProto.INT64, ["N", seq.length])
        front = [helper.make_node("Cast", ["x"], ["x_ids"], to=elem),
                 helper.make_node("Reshape", ["x_ids", "x_row_shape"], ["x_rows"])]
    else:
        given = helper.make_tensor_value_info("x", elem, ["N", seq.length, seq.step_width])
        front = [helper.make_node("Reshape", ["x", "x_row_shape"], ["x_rows"])]
    return front, out, [given if v.name == "x" else v for v in inputs]


def _constant(numpy_helper: Any, arr: np.ndarray, name: str) -> Any:
    if arr.dtype == object:
        values: Any = [str(v).encode() for v in arr.reshape(-1)]
        return helper.make_tensor(name, TensorProto.STRING, list(arr.shape), values)
    return numpy_helper.from_array(arr, name)


def preprocessing_nodes(pre: Any, into: str, helper: Any, numpy_helper: Any,
                        tp: Any) -> tuple[list[Any], list[Any], list[Any]]:
    """Nodes that turn the raw inputs into the model's input ``into`` (the features in
    :class:`~explore.datasets.table.Preprocess` order: scaled numeric columns, then a
    one-hot block per categorical column); their initializers; the raw inputs."""
    nodes, inits, inputs, parts = [], [], [], []
    fill = tuple(getattr(pre, "fill", ()))
    fill_categories = tuple(getattr(pre, "fill_categories", ())) or \
        (None,) * len(pre.categorical)
    if pre.numeric:
        inputs.append(helper.make_tensor_value_info("x", tp.FLOAT, ["N", len(pre.numeric)]))
        raw = "x"
        if fill:  # NaN -> the fitted value, before scaling (as Preprocess.transform_into)
            inits.append(numpy_helper.from_array(np.asarray(fill, np.float32), "pre_fill"))
            nodes += [helper.make_node("IsNaN", ["x"], ["pre_isnan"]),
                      helper.make_node("Where", ["pre_isnan", "pre_fill", "x"],
                                       ["pre_filled"])]
            raw = "pre_filled"
        inits += [numpy_helper.from_array(np.asarray(pre.offset, np.float32), "pre_offset"),
                  numpy_helper.from_array(np.asarray(pre.scale, np.float32), "pre_scale")]
        nodes += [helper.make_node("Sub", [raw, "pre_offset"], ["pre_centred"]),
                  helper.make_node("Div", ["pre_centred", "pre_scale"], ["pre_numeric"])]
        parts.append("pre_numeric")
    for i, (column, cats, most) in enumerate(zip(pre.categorical, pre.categories,
                                                 fill_categories, strict=True)):
        ints = all(isinstance(c, int | np.integer) and not isinstance(c, bool) for c in cats)
        name = f"pre_onehot_{i}"
        inputs.append(helper.make_tensor_value_info(column, tp.INT64 if ints else tp.STRING,
                                                    ["N", 1]))
        # A missing text value ("") gets a one-hot column of its own, which a constant
        # matrix then folds into its fitted category's: [onehot, gap] @ [[I], [e_fill]].
        impute = most is not None and not ints and "" not in cats
        known = [str(c) for c in cats] + ([""] if impute else [])
        attrs = {"cats_int64s": [int(c) for c in cats]} if ints else {"cats_strings": known}
        nodes.append(helper.make_node("OneHotEncoder", [column], [f"{name}_3d"],
                                      domain="ai.onnx.ml", zeros=1, **attrs))
        inits.append(numpy_helper.from_array(np.array([-1, len(known)], np.int64),
                                             f"{name}_shape"))
        flat = f"{name}_wide" if impute else name
        nodes.append(helper.make_node("Reshape", [f"{name}_3d", f"{name}_shape"], [flat]))
        if impute:
            fold = np.vstack([np.eye(len(cats), dtype=np.float32),
                              np.eye(len(cats), dtype=np.float32)[[list(cats).index(most)]]])
            inits.append(numpy_helper.from_array(fold, f"{name}_fold"))
            nodes.append(helper.make_node("MatMul", [flat, f"{name}_fold"], [name]))
        parts.append(name)
    if len(parts) == 1:
        nodes.append(helper.make_node("Identity", parts, [into]))
    else:
        nodes.append(helper.make_node("Concat", parts, [into], axis=1))
    return nodes, inits, inputs
