"""What an exported model says about itself: ONNX ``metadata_props``, doc strings
on the model and on its graph's inputs and outputs, and a snippet that runs it.

:func:`annotate` writes, for a :class:`explore.trained.TrainedModel` and the
``ModelProto`` :func:`explore.onnx_model.model_to_onnx` made of it, these keys (each
value is JSON)::

    explore.version      the explore that wrote the file           "0.1.0"
    explore.study        the study's name                          "churn"
    explore.trial        the trial's number                        3
    explore.task         "classification" or "regression"
    explore.metrics      the trial's metrics on the validation split, when the model
                         knows them                                {"accuracy": 0.93, ...}
    explore.features     the columns of input x, in order (null: x is images)
                                                                   ["age", "spend"]
    explore.categorical  each categorical input: its categories, in encoding order
                                                                   {"plan": ["basic", "pro"]}
    explore.scaling      what the model does to x first: a table's numeric columns
                         (x - offset) / scale, per column of explore.features
                         {"method": "standard", "offset": [...], "scale": [...]},
                         or images' integer pixels times a pixel scale
                         {"method": "pixels", "pixel_scale": 0.0625, "max_pixel": 16};
                         null: x is taken as it is
    explore.missing      what a missing value becomes where the data set imputes
                         (dataset.missing: impute), per column; null: nothing is imputed
                         {"impute": "median", "numeric": {"age": 45.0},
                          "categorical": {"plan": "basic"}}
    explore.image        (channels, height, width) of x's rows, or null
    explore.classes      the class labels (as the data has them) in the order of the
                         probabilities' columns; null for a regression
    explore.inputs       each input's layout: {"x": "float32 [N, 2]: ..."}
    explore.outputs      each output's: {"label": "string [N]: ..."}

The layouts are also the ``doc_string`` of each graph input and output, where viewers
such as Netron show them.  :func:`read_metadata` reads the keys back from a file
(``onnx.load``), :func:`example_code` writes a runnable onnxruntime snippet for it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from onnx import TensorProto, helper

from explore.datasets.quantize import max_pixel
from explore.version import __version__

PREFIX = "explore."
EXAMPLE_COLUMNS = 12  # wider rows are written as zeros in the snippet, not as a literal
LISTED = 30  # columns, categories and classes a layout names; the metadata has them all


def annotate(proto: Any, model: Any, metrics: Mapping[str, float] | None = None) -> Any:
    """Write what ``model`` (a :class:`~explore.trained.TrainedModel`) is into
    ``proto``, its ONNX ``ModelProto`` (see the module's docstring): the ``explore.*``
    metadata, replacing any written before, and the doc strings.  ``metrics``: the
    trial's metrics (default: the model's ``metrics``, where it has them).  Returns
    ``proto``, changed in place."""
    if metrics is None:
        metrics = getattr(model, "metrics", None)
    keys = metadata(model, proto, metrics)
    others = {p.key: p.value for p in proto.metadata_props if not p.key.startswith(PREFIX)}
    helper.set_model_props(proto, {**others, **keys})  # replaces them all
    layouts = {**json.loads(keys[PREFIX + "inputs"]), **json.loads(keys[PREFIX + "outputs"])}
    for v in (*proto.graph.input, *proto.graph.output):
        v.doc_string = layouts.get(v.name, "")
    proto.producer_version = __version__
    proto.doc_string = summary(model, proto)
    return proto


def metadata(model: Any, proto: Any, metrics: Mapping[str, float] | None = None
             ) -> dict[str, str]:
    """The ``explore.*`` keys of ``model`` exported as ``proto``, values as JSON text."""
    data = model.data
    pre = data.preprocess
    values: dict[str, Any] = {
        "version": __version__, "study": model.study, "trial": int(model.trial),
        "task": data.task,
        "features": list(pre.numeric) if pre is not None else None,
        "categorical": {c: list(cats) for c, cats in
                        zip(pre.categorical, pre.categories, strict=True)}
        if pre is not None else {},
        "scaling": _scaling(data),
        "missing": _missing(pre),
        "image": list(data.image) if data.image else None,
        "classes": classes(data),
        "inputs": {v.name: _input_layout(v, data) for v in proto.graph.input},
        "outputs": {v.name: _output_layout(v, data) for v in proto.graph.output},
    }
    if metrics:
        values["metrics"] = dict(metrics)
    return {PREFIX + k: json.dumps(_plain(v), allow_nan=False) for k, v in values.items()}


def read_metadata(proto: Any) -> dict[str, Any]:
    """The ``explore.*`` metadata of an ONNX model, decoded, the prefix dropped.

    >>> import onnx
    >>> m = onnx.ModelProto()
    >>> onnx.helper.set_model_props(m, {"explore.trial": "3", "author": "me"})
    >>> read_metadata(m)
    {'trial': 3}
    """
    return decode({p.key: p.value for p in proto.metadata_props})


def decode(keys: Mapping[str, str]) -> dict[str, Any]:
    """The ``explore.*`` keys of ``keys`` (as :func:`metadata` gives them), decoded,
    the prefix dropped."""
    return {k[len(PREFIX):]: json.loads(v) for k, v in keys.items() if k.startswith(PREFIX)}


def classes(data: Any) -> list[Any] | None:
    """The class labels in output order (as the data has them; the class indices where
    the data set's labels are its indices), or None for a regression."""
    if data.task == "regression":
        return None
    labels = getattr(data.preprocess, "labels", None) if data.preprocess is not None else None
    return list(labels) if labels else list(range(data.classes))


def summary(model: Any, proto: Any) -> str:
    """The model's ``doc_string``: what it is, and its inputs and outputs."""
    data = model.data
    kind = f"a classification into {data.classes} classes" \
        if data.task == "classification" else f"a {data.task}"
    lines = [f"Trial {model.trial} of explore study {model.study!r} "
             f"(explore {__version__}): {kind}."]
    for title, values, layout in (("Inputs", proto.graph.input, _input_layout),
                                  ("Outputs", proto.graph.output, _output_layout)):
        lines.append(f"{title}:")
        lines += [f"  {v.name}: {layout(v, data)}" for v in values]
    return "\n".join(lines)


def type_of(value: Any) -> tuple[str, str]:
    """The element type (numpy's name; ``string``) and shape (``[N, 4]``) of a graph
    input or output."""
    t = value.type.tensor_type
    dtype = "string" if t.elem_type == TensorProto.STRING else \
        str(helper.tensor_dtype_to_np_dtype(t.elem_type))
    dims = [d.dim_param or str(d.dim_value) for d in t.shape.dim]
    return dtype, f"[{', '.join(dims)}]"


def example_code(proto: Any, path: str, meta: Mapping[str, Any] | None = None) -> str:
    """Python that runs the ONNX model of ``proto``, saved at ``path``, on one example
    row with onnxruntime and prints its last output (the label, or the prediction).
    The row is made of what the metadata ``meta`` (default: the file's,
    :func:`read_metadata`) says: the training data's middle (a table's offsets), the
    first category, a blank image."""
    if meta is None:
        meta = read_metadata(proto)
    outs = [v.name for v in proto.graph.output]
    feeds = []
    for v in proto.graph.input:
        value, note = _example(v, meta)
        feeds.append(f"    {json.dumps(v.name)}: {value}," + (f"  # {note}" if note else ""))
    got = f"({outs[0]},)" if len(outs) == 1 else ", ".join(outs)
    return "\n".join(["import numpy as np", "import onnxruntime as ort", "",
                      f"sess = ort.InferenceSession({json.dumps(path)})",
                      "feeds = {", *feeds, "}", f"{got} = sess.run(None, feeds)",
                      f"print({outs[-1]})"])


def _input_layout(v: Any, data: Any) -> str:
    dtype, shape = type_of(v)
    pre = data.preprocess
    head = f"{dtype} {shape}"
    if pre is not None and v.name in pre.categorical:
        cats = pre.categories[pre.categorical.index(v.name)]
        gaps = "; a missing one takes its fill value: explore.missing" if _missing(pre) \
            else ""
        return f"{head}: column {v.name!r}, one of {_few(list(cats), LISTED)} (another " \
               f"value counts as none of them){gaps}"
    seq = getattr(data, "sequence", None)
    if seq is not None and v.name == "x":
        what = f"{seq.length} token ids each (0..{seq.vocab - 1}" + \
            (f"; {seq.pad} pads" if seq.pad is not None else "") + ")" if seq.tokens else \
            f"{seq.length} steps of {seq.channels} values each" + \
            (", then its presence flag (1 real, 0 padding)" if seq.masked else "")
        scaled = " (the model scales them: explore.scaling)" \
            if pre is not None and not seq.tokens else ""
        return f"{head}: sequences of {what}, as the data has them{scaled}"
    if pre is not None and v.name == "x":
        names = ", ".join(pre.numeric) if len(pre.numeric) <= LISTED else \
            f"{', '.join(pre.numeric[:LISTED])}, ... ({len(pre.numeric)} in all: " \
            "explore.features)"
        gaps = "; NaN takes its column's fill value: explore.missing" \
            if _missing(pre) else ""
        return f"{head}: the columns {names}, in this order, as the data has them (the " \
               f"model scales them: explore.scaling){gaps}"
    if v.name == "x" and data.pixel_scale is not None:
        image = "x".join(map(str, data.image)) + " images flattened (channel, row, column)" \
            if data.image else "pixels"
        return f"{head}: {image}, integer pixels 0..{max_pixel(data.pixel_scale)}; the " \
               f"model sees pixel * {data.pixel_scale:g}"
    if v.name == "x" and data.image:
        return f"{head}: {'x'.join(map(str, data.image))} images flattened (channel, row, " \
               "column)"
    return f"{head}: {data.features} features"


def _output_layout(v: Any, data: Any) -> str:
    dtype, shape = type_of(v)
    head = f"{dtype} {shape}"
    if v.name == "probabilities":
        labels = classes(data) or []
        return f"{head}: each class's probability, columns in the order of explore.classes " \
               f"({_few(labels, LISTED)})"
    if v.name == "label":
        return f"{head}: the most probable class, as the data has it"
    if v.name == "prediction":
        return f"{head}: the predicted target, in its units"
    return head


def _scaling(data: Any) -> dict[str, Any] | None:
    pre = data.preprocess
    if pre is not None:
        return {"method": pre.scaling, "offset": list(pre.offset), "scale": list(pre.scale)} \
            if pre.numeric else None
    if data.pixel_scale is not None:
        return {"method": "pixels", "pixel_scale": float(data.pixel_scale),
                "max_pixel": max_pixel(data.pixel_scale)}
    return None


def _missing(pre: Any) -> dict[str, Any] | None:
    """What a missing value becomes, where the preprocessing imputes (``dataset.missing:
    impute``): each column's fill value, a numeric one before scaling."""
    if pre is None or not getattr(pre, "impute", None):
        return None
    fills = getattr(pre, "fill_categories", ()) or ()
    return {"impute": pre.impute,
            "numeric": dict(zip(pre.numeric, getattr(pre, "fill", ()) or (), strict=False)),
            "categorical": dict(zip(pre.categorical, fills, strict=False))}


def _plain(v: Any) -> Any:
    """JSON-ready: numpy scalars as Python's, non-finite floats (a metric that could
    not be measured) as null."""
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _example(v: Any, meta: Mapping[str, Any]) -> tuple[str, str]:
    """A numpy expression of one example row of input ``v``, and a comment on it."""
    t = v.type.tensor_type
    dims = [d.dim_value if d.dim_value else 1 for d in t.shape.dim]
    categories = (meta.get("categorical") or {}).get(v.name)
    note = f"one of {_few(categories)}" if categories else ""
    if t.elem_type == TensorProto.STRING:
        first = categories[0] if categories else ""
        return f"np.array([[{json.dumps(str(first))}]], dtype=object)", note
    dtype = f"np.{helper.tensor_dtype_to_np_dtype(t.elem_type)}"
    if categories:
        return f"np.array([[{json.dumps(categories[0])}]], {dtype})", note
    scaling = meta.get("scaling") or {}
    names = meta.get("features") or []
    shape = ", ".join(map(str, dims))
    if scaling.get("method") == "pixels":
        image = "x".join(map(str, meta.get("image") or [])) or "flat"
        return f"np.zeros(({shape}), {dtype})", \
            f"{image} images, pixels 0..{scaling['max_pixel']}"
    if v.name == "x" and scaling.get("offset") and len(dims) == 2 and \
            dims[1] <= EXAMPLE_COLUMNS:
        mid = [o + s / 2 if scaling.get("method") == "minmax" else o
               for o, s in zip(scaling["offset"], scaling["scale"], strict=True)]
        return f"np.array([[{', '.join(f'{m:.4g}' for m in mid)}]], {dtype})", \
            ", ".join(names)
    if len(dims) == 3:  # a sequence model's input: steps of values
        return f"np.zeros(({shape}), {dtype})", \
            f"sequences of {dims[1]} steps of {dims[2]} values (explore.features)"
    if names:
        return f"np.zeros(({shape}), {dtype})", f"{len(names)} columns: explore.features"
    return f"np.zeros(({shape}), {dtype})", ""


def _few(values: list[Any], most: int = 5) -> str:
    """``'basic', 'pro'``: the first few values of a list, and how many in all."""
    shown = ", ".join(map(repr, values[:most]))
    return shown if len(values) <= most else f"{shown}, ... ({len(values)} in all)"
