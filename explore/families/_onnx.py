"""The ONNX family: a model of the user's, read from an ``.onnx`` file, trained in a
search (the data set, the training parameters, which layers to freeze)::

    model:
      onnx: models/lenet.onnx    # relative to the YAML file
      freeze: ["conv*"]          # parameters (fnmatch globs) kept as the file has them
      head: 1                    # the last N weight layers re-initialised, the last one
                                 # resized to the data set's outputs

The file is imported once per process (:func:`load`, by path and modification time)
with :func:`engine.onnx_io.import_onnx`, twice: as inference (the ``infer`` path) and as
training (Dropout drawing, batch norm on the batch's statistics), which gives the same
nodes with each mode's attributes.  :meth:`Onnx.build` replays them on the family's two
paths, in the conventions of :mod:`explore.families.tasks`:

- the model's one data input is fed from ``x`` (dequantized first where the data set
  keeps uint8 pixels; reshaped from flattened rows to the model's input shape, e.g.
  ``[N, 784] -> [N, 1, 28, 28]``);
- its first output, less a final Softmax or LogSoftmax (and a Dropout or Identity
  after the scores; flattened to ``[N, scores]``), is ``logits`` on the ``eval`` path,
  which ends in the task's metric ops; the ``train`` path (first) runs the same nodes
  in training mode into the task's loss;
- the initializers are parameters with the file's values: trainable when they are
  floats, not a batch norm's running statistics and not matched by a ``freeze`` glob (a
  batch norm whose running statistics are frozen runs on them in training too, so
  nothing of it changes);
- ``head: N`` re-initialises the last N weight layers (Gemm, MatMul and Conv weights and
  their biases: uniform in +-1/sqrt(fan_in), PyTorch's defaults) and resizes the last
  one's outputs to the data set's (its classes, or 1 for a regression); they are
  trained whatever ``freeze`` says.  With ``head: 0`` the model's output size must be
  the data set's.

>>> import numpy as np, tempfile, onnx
>>> from onnx import TensorProto, helper, numpy_helper
>>> w = numpy_helper.from_array(np.ones((3, 4), np.float32), "fc.weight")
>>> node = helper.make_node("Gemm", ["input", "fc.weight"], ["out"], transB=1)
>>> g = helper.make_graph([node], "tiny", [helper.make_tensor_value_info(
...     "input", TensorProto.FLOAT, ["N", 4])], [helper.make_tensor_value_info(
...     "out", TensorProto.FLOAT, ["N", 3])], [w])
>>> with tempfile.TemporaryDirectory() as d:
...     onnx.save(helper.make_model(g), f"{d}/tiny.onnx")
...     m = load(f"{d}/tiny.onnx")
>>> m.input, m.input_shape, m.logits, [layer.weight for layer in m.layers]
('input', (4,), 'out', ['fc.weight'])
"""

from __future__ import annotations

import fnmatch
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from engine import CalcGraph, EngineError, GraphError, Init, Mode, lower
from engine.graph import Kind, Node, Variable
from engine.onnx_io import import_onnx
from explore.families._base import AtKey, BaseFamily, BuildError, DataShape, register
from explore.families.tasks import REGRESSION_LOSS_OPS, task_loss
from explore.ranges import Choice, Range

# The model section's keys of the built-in families: a model from a file has its own
# architecture, so none of them may be searched.
ARCHITECTURE_KEYS = ("depth", "width", "activation", "dropout", "init", "blocks", "channels",
                     "kernel", "stride", "pool", "batch_norm", "residual")
WEIGHT_LAYERS = ("Gemm", "MatMul", "Conv")
# Dropped after the scores: the logits are their input
SCORES_AFTER = ("Softmax", "LogSoftmax", "Dropout", "Identity")
# Names the family's graph gives its own values
RESERVED = {"x", "y", "logits", "loss", "eval_loss", "log_prob", "eval_log_prob", "accuracy",
            "class_counts", "positive_score", "regression_sums"}


@dataclass(frozen=True)
class Layer:
    """A weight layer: the node's index, its weight and bias parameters (a MatMul's is
    the parameter an Add right after it adds), the weight's output and fan-in
    dimensions."""

    node: int
    weight: str
    bias: str | None
    out_dim: int
    in_dims: tuple[int, ...]


@dataclass(frozen=True, eq=False)  # one per file version (load): hashed by identity
class Imported:
    """An ONNX model, imported: what :meth:`Onnx.build` replays."""

    path: str
    infer: list[Node]  # the inference nodes that the logits need, in order
    train: list[Node]  # the same nodes as imported for training
    params: dict[str, Variable]  # the parameters those nodes read
    input: str  # the data input
    input_shape: tuple[int, ...]  # its shape after the batch dimension (0: unknown)
    logits: str  # the value that is the model's scores
    logits_shape: tuple[int, ...]  # its shape (0: the batch)
    layers: tuple[Layer, ...]  # the weight layers, in order

    def matching(self, glob: str) -> list[str]:
        return [p for p in self.params if fnmatch.fnmatchcase(p, glob)]


def load(path: str | os.PathLike[str]) -> Imported:
    """The model of the ONNX file at ``path``, imported once per process while the file
    is unchanged (raises :class:`~engine.GraphError` or :class:`BuildError` saying why a
    file cannot be a model of this family)."""
    p = os.path.abspath(os.fspath(path))
    try:
        st = os.stat(p)
    except OSError:
        raise GraphError(f"{p}: no such ONNX file") from None
    return _load(p, st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=16)
def _load(path: str, mtime_ns: int, size: int) -> Imported:
    infer = import_onnx(path)
    inputs = [v for v in infer.variables.values() if v.kind is Kind.PLACEHOLDER]
    if len(inputs) != 1:
        raise BuildError(f"{path}: a model of family onnx takes one input, this one takes "
                         f"{len(inputs)} ({', '.join(v.name for v in inputs)})")
    (inp,) = inputs
    assert inp.desc is not None
    if not inp.desc.dtype.is_float:
        raise BuildError(f"{path}: the model's input {inp.name!r} is {inp.desc.dtype.value}; "
                         "family onnx feeds it floats")
    if not inp.desc.shape or inp.desc.shape[0] != 0:
        raise BuildError(f"{path}: the model's input {inp.name!r} has no batch dimension "
                         f"(shape {inp.desc.shape})")
    output = infer.outputs[0]
    # The same nodes in training mode: the model's output named as its loss makes
    # the importer build a BACKWARD_ENABLED path with no placeholder of its own.
    train = import_onnx(path, loss=output)
    a, b = infer.paths[0].nodes, train.paths[0].nodes
    if [(n.op, n.outputs) for n in a] != [(n.op, n.outputs) for n in b]:
        raise BuildError(f"{path}: importing for training gave other nodes than for "
                         "inference")  # the importer builds both from the same nodes
    made = {o: i for i, n in enumerate(a) for o in n.outputs}
    logits = output
    while logits in made and a[made[logits]].op in SCORES_AFTER:
        logits = a[made[logits]].inputs[0]
    if logits not in made:
        raise BuildError(f"{path}: the model's output {output!r} is not computed by a node")
    need, keep = {logits}, []
    for i in range(made[logits], -1, -1):
        if any(o in need for o in a[i].outputs):
            keep.append(i)
            need.update(a[i].inputs)
    keep.reverse()
    ir = lower(infer, passes=())
    params = {k: v for k, v in infer.variables.items()
              if v.kind is Kind.PARAMETER and k in need}
    clash = sorted(RESERVED & set(params))
    if clash:
        raise BuildError(f"{path}: parameter(s) named {', '.join(clash)}, which family onnx "
                         "names its own values")
    nodes = [a[i] for i in keep]
    return Imported(path, nodes, [b[i] for i in keep], params, inp.name,
                    tuple(inp.desc.shape[1:]), logits,
                    tuple(ir.descs[logits].shape), _layers(nodes, params))


def _layers(nodes: list[Node], params: dict[str, Variable]) -> tuple[Layer, ...]:
    """The weight layers (Gemm, MatMul, Conv reading a float parameter as weight)."""
    readers: dict[str, list[int]] = {}
    for i, n in enumerate(nodes):
        for x in n.inputs:
            readers.setdefault(x, []).append(i)

    def param(name: str) -> Variable | None:
        v = params.get(name)
        return v if v is not None and v.desc is not None and v.desc.dtype.is_float else None

    out = []
    for i, n in enumerate(nodes):
        if n.op not in WEIGHT_LAYERS or len(n.inputs) < 2:
            continue
        w = param(n.inputs[1])
        if w is None:
            continue
        assert w.desc is not None
        rank = len(w.desc.shape)
        in_dims: tuple[int, ...]
        bias = n.inputs[2] if len(n.inputs) > 2 and param(n.inputs[2]) else None
        if n.op == "Gemm":
            if rank != 2 or n.attrs.get("transA", 0):
                continue
            t = int(n.attrs.get("transB", 0))
            out_dim, in_dims = (0, (1,)) if t else (1, (0,))
        elif n.op == "MatMul":
            if rank != 2:
                continue
            out_dim, in_dims = 1, (0,)
            after = readers.get(n.outputs[0], [])
            if len(after) == 1 and nodes[after[0]].op == "Add":
                other = [x for x in nodes[after[0]].inputs if x != n.outputs[0]]
                if len(other) == 1 and param(other[0]):
                    bias = other[0]
        else:  # Conv: [out, in / group, *kernel]
            out_dim, in_dims = 0, tuple(range(1, rank))
        out.append(Layer(i, w.name, bias, out_dim, in_dims))
    return tuple(out)


def globs(freeze: Any) -> list[str]:
    """A ``freeze`` value as a list of globs: a list, or one string of globs separated by
    commas (what a ``choice`` offers); ``""`` and ``"none"`` freeze nothing.

    >>> globs(["conv*", "fc1.*"]), globs("conv*, fc1.*"), globs("none"), globs(None)
    (['conv*', 'fc1.*'], ['conv*', 'fc1.*'], [], [])
    """
    if freeze is None:
        return []
    if not isinstance(freeze, str | list | tuple) or \
            not all(isinstance(g, str) for g in (freeze if not isinstance(freeze, str) else [])):
        raise ValueError(f"freeze is a list of parameter names (globs) such as ['conv*'], "
                         f"or one string of comma-separated globs, not {freeze!r}")
    if isinstance(freeze, str):
        return [] if freeze.strip().lower() in ("", "none") else \
            [g.strip() for g in freeze.split(",") if g.strip()]
    return [str(g) for g in freeze]


def check_freeze(model: Imported, freeze: Any) -> None:
    """Every glob of ``freeze`` (a value, or every option of a choice) must match a
    parameter of the model (ValueError listing them)."""
    values = freeze.options if isinstance(freeze, Choice) else [freeze]
    for value in values:
        for g in globs(value):
            if not model.matching(g):
                raise ValueError(f"{g!r} matches no parameter of {os.path.basename(model.path)}"
                                 f"; its parameters: {', '.join(model.params)}")


def check_trainable(model: Imported, freeze: Any, head: int) -> None:
    """Something must be left to train: with no head, ``freeze`` (every option of a
    choice) must leave a trainable parameter (ValueError)."""
    if head > 0:
        return  # the head is always trained
    values = freeze.options if isinstance(freeze, Choice) else [freeze]
    for value in values:
        gs = globs(value)
        if not any(v.trainable and not any(fnmatch.fnmatchcase(n, g) for g in gs)
                   for n, v in model.params.items()):
            raise ValueError(f"freeze {value!r} with head 0 leaves nothing of "
                             f"{os.path.basename(model.path)} to train; freeze less, or "
                             "re-initialise a head (head: 1)")


def check_head(model: Imported, head: int) -> None:
    if head > len(model.layers):
        raise ValueError(f"head {head}: {os.path.basename(model.path)} has "
                         f"{len(model.layers)} weight layer(s) (Gemm, MatMul, Conv) to "
                         "re-initialise")


def check_onnx_key(key: str, value: Any, base: Path | None) -> Any:
    """The schema's check of this family's keys of the model section
    (:class:`explore.space.Model`), one at a time as they are validated, reading no
    file: ``onnx`` is resolved against ``base`` (the YAML file's folder, else the
    current one), ``freeze`` must be globs.  The file itself is read when the space is
    bound (:meth:`Onnx.check_files`).  Returns the value (the file's absolute path for
    ``onnx``); ValueError."""
    if key == "onnx":
        if value is None:
            return value
        if not value.is_absolute():
            value = Path(base or Path.cwd()) / value
        return value.resolve()
    if key == "freeze":
        if isinstance(value, Range) and not isinstance(value, Choice):
            raise ValueError("freeze is a list of parameter names (globs), or a choice of "
                             "comma-separated globs")
        for option in value.options if isinstance(value, Choice) else [value]:
            globs(option)  # a number or a flag is no glob (ValueError)
    return value


@register("onnx")
class Onnx(BaseFamily):
    def build(self, params: dict[str, Any], dataset: DataShape,
              eval_loss: bool = True) -> CalcGraph:
        path = params.get("onnx")
        if not path:
            raise BuildError("family onnx needs model.onnx: the path of an .onnx file")
        try:
            model = load(path)
        except BuildError:
            raise
        except Exception as e:  # the importer's errors: a file that is no model
            raise BuildError(f"model.onnx {path}: {e}") from None
        task = getattr(dataset, "task", "classification")
        loss_name = task_loss(params, task)
        regression = task == "regression"
        outputs = 1 if regression else int(dataset.classes)
        head = int(params.get("head") or 0)
        try:
            check_head(model, head)
            check_freeze(model, params.get("freeze"))
            check_trainable(model, params.get("freeze"), head)
        except ValueError as e:
            raise BuildError(str(e)) from None
        shape = _input_shape(model, dataset)
        scores = _probe(model, shape, head, outputs)

        g = CalcGraph(name=os.path.splitext(os.path.basename(model.path))[0] or "onnx")
        pixel_scale = dataset.pixel_scale
        x = g.placeholder("x", (0, dataset.features),
                          dtype="uint8" if pixel_scale else "float32")
        y = g.placeholder("y", (0,), dtype="float32" if regression else "int64")
        frozen = _declare(g, model, globs(params.get("freeze")), head, outputs)
        train = g.path("train", Mode.BACKWARD_ENABLED)
        ev = g.path("eval", Mode.FORWARD_ONLY)
        outs: dict[bool, tuple[Any, Any]] = {}
        for path_, training in ((train, True), (ev, False)):
            h = path_.DequantizeLinear(x, scale=pixel_scale) if pixel_scale else x
            if tuple(shape) != (dataset.features,):
                h = path_.Reshape(h, shape=(0, *shape))
            flat = len(scores) > 2
            h = _replay(path_, model, h, training, frozen,
                        None if training or flat else "logits")
            if flat:  # [N, scores, 1, 1] -> [N, scores]
                h = path_.Flatten(h, axis=1, **({} if training else {"outputs": ["logits"]}))
            if regression:
                h = path_.Reshape(h, shape=(0,))  # [b, 1] -> [b], as the target
            loss = None
            if training or eval_loss:
                name = "loss" if training else "eval_loss"
                if regression:
                    loss = path_.op(REGRESSION_LOSS_OPS[loss_name], h, y, outputs=[name])
                else:
                    loss, _ = path_.SoftmaxCrossEntropyLoss(
                        h, y, outputs=[name, "log_prob" if training else "eval_log_prob"])
            outs[training] = (h, loss)
        train.set_loss(outs[True][1])
        h = outs[False][0]
        if regression:
            stats = [ev.RegressionSums(h, y, outputs=["regression_sums"])]
        else:
            stats = [ev.Accuracy(h, y, outputs=["accuracy"]),
                     ev.ClassCounts(h, y, outputs=["class_counts"])]
            if outputs == 2:
                stats.append(ev.PositiveScore(h, outputs=["positive_score"]))
        g.output(outs[True][1], *stats, *([outs[False][1]] if eval_loss else []))
        return g

    def check(self, model: Mapping[str, Any]) -> None:
        if not model.get("onnx"):
            raise ValueError("family onnx needs onnx: the path of an .onnx file")
        searched = [k for k in ARCHITECTURE_KEYS if isinstance(model.get(k), Range)]
        if searched:
            raise ValueError(f"{', '.join(searched)}: a model of family onnx has its file's "
                             "architecture; search the training parameters, freeze or head")

    def check_files(self, model: Mapping[str, Any]) -> None:
        """The file must import as a model; ``freeze``'s globs must match its
        parameters and leave something to train, ``head`` be at most its weight
        layers."""
        try:
            imported = load(model["onnx"])
        except Exception as e:  # the importer's errors, at the key
            raise AtKey("onnx", str(e)) from None
        freeze, head = model.get("freeze"), model.get("head") or 0
        try:
            check_freeze(imported, freeze)
            check_trainable(imported, freeze, head)
        except ValueError as e:
            raise AtKey("freeze", str(e)) from None
        try:
            check_head(imported, head)
        except ValueError as e:
            raise AtKey("head", str(e)) from None


def _input_shape(model: Imported, dataset: DataShape) -> tuple[int, ...]:
    """The model's input shape (after the batch) that the data set's rows fill."""
    shape = model.input_shape
    image = getattr(dataset, "image", None)
    if math.prod(shape) != dataset.features:
        what = f" (images {'x'.join(map(str, image))})" if image else ""
        raise BuildError(f"the model's input {model.input!r} is [N, {', '.join(map(str, shape))}]"
                         f" ({math.prod(shape)} values a row); the data set's rows have "
                         f"{dataset.features}{what}")
    return shape


@lru_cache(maxsize=64)
def _probe(model: Imported, shape: tuple[int, ...], head: int, outputs: int
           ) -> tuple[int, ...]:
    """The logits' shape for these input dimensions and head, checked once per process
    and setting (a BuildError when the sizes do not work out)."""
    if shape == model.input_shape and not head:  # as imported
        scores = model.logits_shape
    else:  # the model with this input shape and head, on one path, shapes inferred
        g = CalcGraph(name="probe")
        x = g.placeholder("x", (0, *shape))
        frozen = _declare(g, model, [], head, outputs)
        p = g.path("eval", Mode.FORWARD_ONLY)
        h = _replay(p, model, x, False, frozen, "logits")
        g.output(h)
        try:
            scores = tuple(lower(g, passes=()).descs["logits"].shape)
        except EngineError as e:
            what = f" with the last layer resized to {outputs}" if head else ""
            raise BuildError(f"the model{what} does not take input [N, "
                             f"{', '.join(map(str, shape))}]: {e}") from None
    if len(scores) < 2 or scores[0] != 0 or math.prod(scores[2:]) != 1:
        raise BuildError(f"the model's output {model.logits!r} has shape {list(scores)} "
                         "(0: the batch); family onnx needs scores [N, outputs]")
    if scores[1] != outputs:
        want = "one output (a regression)" if outputs == 1 else f"{outputs} classes"
        how = ("head: 1 re-initialises the last layer at that size" if not head else
               "the layers after the last weight layer change the size")
        raise BuildError(f"the model gives {scores[1]} scores a row; the data set has {want}: "
                         f"{how}")
    return scores


def _declare(g: CalcGraph, model: Imported, freeze: list[str], head: int,
             outputs: int) -> set[str]:
    """The model's parameters in ``g``: the file's values, trainable unless frozen, the
    head's re-initialised (the last resized to ``outputs``).  Returns the frozen names."""
    fresh: dict[str, tuple[tuple[int, ...], float]] = {}
    layers = model.layers[len(model.layers) - head:] if head else ()
    for k, layer in enumerate(layers):
        w = model.params[layer.weight].desc
        assert w is not None
        shape = list(w.shape)
        if k == len(layers) - 1:
            shape[layer.out_dim] = outputs
        fan_in = math.prod(shape[d] for d in layer.in_dims)
        bound = 1.0 / math.sqrt(fan_in)
        fresh[layer.weight] = (tuple(shape), bound)
        if layer.bias is not None:
            b = model.params[layer.bias].desc
            assert b is not None
            bshape = list(b.shape)
            if k == len(layers) - 1 and bshape and bshape[-1] == w.shape[layer.out_dim]:
                bshape[-1] = outputs
            fresh[layer.bias] = (tuple(bshape), bound)
    frozen = set()
    for name, v in model.params.items():
        assert v.desc is not None
        if name in fresh:
            size, bound = fresh[name]
            g.parameter(name, size, init=Init.uniform(-bound, bound), dtype=v.desc.dtype)
            continue
        cold = any(fnmatch.fnmatchcase(name, f) for f in freeze)
        if cold:
            frozen.add(name)
        g.parameter(name, v.desc.shape, init=v.init, dtype=v.desc.dtype,
                    trainable=v.trainable and not cold)
    return frozen


def _replay(path: Any, model: Imported, h: Any, training: bool, frozen: set[str],
            logits: str | None) -> Any:
    """The model's nodes on ``path`` from input ``h``; the scores' value, named
    ``logits`` when given.  Values are named ``train/...`` or ``eval/...`` after the
    file's; parameters keep their names."""
    prefix = "train/" if training else "eval/"
    names = {model.input: str(h)}
    names.update({p: p for p in model.params})
    nodes = model.train if training else model.infer
    for n, plain in zip(nodes, model.infer, strict=True):
        attrs = n.attrs
        if n.op == "Dropout" and not training:  # the identity it is at inference
            names[n.outputs[0]] = names[n.inputs[0]]
            continue
        if n.op == "BatchNormalization" and training and \
                {n.inputs[3], n.inputs[4]} <= frozen:
            attrs = plain.attrs  # frozen statistics: normalise with them, unchanged
        outs = ["logits" if o == model.logits and logits else prefix + o for o in n.outputs]
        path.op(n.op, *[names[i] for i in n.inputs], outputs=outs, **dict(attrs))
        names.update(zip(n.outputs, outs, strict=True))
    return names[model.logits]
