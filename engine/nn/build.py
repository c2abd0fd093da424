"""``to_graph``: trace a module into a CalcGraph with a training path and an eval path.

The module's ``forward`` runs twice on symbolic tensors: in training mode into the
BACKWARD_ENABLED path ``train`` (dropout active, batch norm on the batch's statistics,
updating the running ones), which ends in the loss ``loss``; then in eval mode into the
FORWARD_ONLY path ``eval`` (no dropout, running statistics), whose model output is
``logits`` and which ends in the metrics.  Both paths read the same parameters, one
graph variable each, named by its state-dict name.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from engine.errors import EngineError
from engine.graph import BATCH, CalcGraph, DType, Mode
from engine.nn import functional as F
from engine.nn._tensor import Tensor, _Ops
from engine.nn._trace import GraphState, TraceError, Tracer, trace
from engine.nn.module import Module

LOSSES = ("cross_entropy", "mse", "mae", "huber", "bce")
"""The built-in losses: SoftmaxCrossEntropyLoss, MSELoss, MAELoss, HuberLoss (delta 1) and
binary cross-entropy with logits (composed: Softplus, Mul, Sub, ReduceMean)."""
METRICS = ("accuracy", "loss", "class_counts", "positive_score", "regression_sums")
"""The built-in metrics (ops on the eval path): Accuracy, the loss (output
``eval_loss``), ClassCounts, PositiveScore (two classes), RegressionSums."""
_REGRESSION = {"mse": F.mse_loss, "mae": F.l1_loss, "huber": F.huber_loss}

LossFn = Callable[[Tensor, Tensor], Tensor]


def to_graph(module: Module, inputs: Mapping[str, Any], loss: str | LossFn | None = "cross_entropy",
             metrics: Sequence[str] = (), target: str = "y", name: str | None = None, *,
             target_shape: Sequence[int] | None = None, target_dtype: str | None = None,
             dequantize: Mapping[str, float] | None = None) -> CalcGraph:
    """Trace ``module`` into a :class:`~engine.CalcGraph`.

    ``inputs``: placeholder name -> shape (a leading ``0`` or ``None`` is the batch) or
    ``(shape, dtype)``; ``forward`` receives them in that order (as keywords when its
    signature has those names).  ``loss``: one of :data:`LOSSES`, a callable
    ``loss_fn(logits, y) -> scalar tensor`` (traced), or None for an eval path alone.
    The target placeholder ``target`` is int64 ``[b]`` for cross-entropy (``[b, ...]``
    for N-D scores) and float32 for the others, ``[b]`` when the logits are ``[b]`` or
    ``[b, 1]`` (which the regression losses and bce flatten), else the logits' shape;
    ``target_shape``/``target_dtype`` override that (for a callable loss).
    ``dequantize``: input name -> scale, for uint8 inputs that ``forward`` receives as
    ``dequantize_linear(x, scale)`` (data kept as exact 8-bit pixels: a quarter of the
    bytes, and the compiler fuses the conversion into the first layer).
    ``metrics``: names of :data:`METRICS`, each an output of that name (``loss`` is
    ``eval_loss``).  The graph's declared outputs are ``loss``, ``logits`` and the
    metrics.

    >>> import numpy as np
    >>> from engine import SGD, VM, compile_graph, nn
    >>> nn.manual_seed(0)
    >>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.1), nn.Linear(8, 3))
    >>> g = nn.to_graph(net, inputs={"x": (0, 4)}, loss="cross_entropy",
    ...                 metrics=["accuracy", "loss"])
    >>> [(p.name, p.mode.value) for p in g.paths]
    [('train', 'backward_enabled'), ('eval', 'forward_only')]
    >>> g.outputs
    ['loss', 'logits', 'accuracy', 'eval_loss']
    >>> vm = VM(compile_graph(g, batch_size=5, optimizer=SGD(lr=0.1)))
    >>> vm.assign("0.weight", net[0].weight.value)   # PyTorch's names and shapes
    >>> vm.set("x", np.ones((5, 4), np.float32)); vm.set("y", np.zeros(5, np.int64))
    >>> vm.train_step("train"); vm.forward("eval"); vm.get("logits").shape
    (5, 3)
    """
    if not isinstance(module, Module):
        raise TraceError(f"to_graph needs an engine.nn.Module, got {type(module).__name__}")
    specs = _input_specs(inputs)
    scales = dict(dequantize or {})
    unknown = sorted(set(scales) - {key for key, _, _ in specs})
    if unknown:
        raise TraceError(f"dequantize names {', '.join(map(repr, unknown))}, which are not "
                         "inputs")
    if isinstance(loss, str) and loss not in LOSSES:
        raise TraceError(f"unknown loss {loss!r}; known: {', '.join(LOSSES)}, or a callable "
                         "loss_fn(logits, y)")
    metric_names = [metrics] if isinstance(metrics, str) else list(metrics)
    for m in metric_names:
        if m not in METRICS:
            raise TraceError(f"unknown metric {m!r}; known: {', '.join(METRICS)}")
    if "loss" in metric_names and loss is None:
        raise TraceError("metric 'loss' needs a loss")
    g = CalcGraph(name=name or type(module).__name__.lower())
    state = GraphState(g)
    _declare(state, module, specs, target)
    was_training = module.training
    outputs: list[str] = []
    target_info: dict[str, Any] = {"shape": target_shape, "dtype": target_dtype}
    try:
        if loss is not None:
            module.train()
            tracer = Tracer(state, g.path("train", Mode.BACKWARD_ENABLED), training=True)
            with trace(tracer):
                out = _run(tracer, module, specs, scales)
                value = _loss(tracer, loss, out, state, target, target_info)
                value = _scalar_loss(value, loss)
                value = tracer.rename(value, "loss")
                tracer.path.set_loss(value.name)
            outputs.append("loss")
        module.eval()
        tracer = Tracer(state, g.path("eval", Mode.FORWARD_ONLY), training=False)
        with trace(tracer):
            out = _run(tracer, module, specs, scales)
            logits = tracer.rename(out, "logits")
            outputs.append("logits")
            outputs += _metrics(tracer, metric_names, loss, logits, state, target, target_info)
    finally:
        module.train(was_training)
    g.output(*outputs)
    return g


def _input_specs(inputs: Mapping[str, Any]) -> list[tuple[str, tuple[int, ...], DType]]:
    if not isinstance(inputs, Mapping) or not inputs:
        raise TraceError("inputs must be a dict: name -> shape or (shape, dtype)")
    specs = []
    for key, spec in inputs.items():
        dtype: Any = "float32"
        if isinstance(spec, Sequence) and len(spec) == 2 and isinstance(spec[0], Sequence) \
                and not isinstance(spec[0], str):
            spec, dtype = spec
        try:
            shape = tuple(BATCH if (d is None and i == 0) else int(d) for i, d in enumerate(spec))
            specs.append((str(key), shape, DType.of(np.dtype(dtype).name if not isinstance(
                dtype, str | DType) else dtype)))
        except (TypeError, ValueError) as e:
            raise TraceError(f"input {key!r}: {spec!r} is not a shape or (shape, dtype): "
                             f"{e}") from None
    return specs


def _declare(state: GraphState, module: Module,
             specs: list[tuple[str, tuple[int, ...], DType]], target: str) -> None:
    """Placeholders for the inputs, one parameter per module parameter and buffer (its
    values as ``Init.from_array`` when it has them, else its init)."""
    from engine.graph import Init, TensorDesc

    g = state.graph
    try:
        for key, shape, dtype in specs:
            if key == target:
                raise TraceError(f"input {key!r} has the target's name; pass target=...")
            g.placeholder(key, shape, dtype)
            state.descs[key] = TensorDesc(dtype, shape)
        for mname, m in module.named_modules():
            state.module_names[id(m)] = mname
        for key, p in module._state_items():
            if id(p) in state.params:  # shared: one variable, its first name
                continue
            init = Init.from_array(p._value) if p.has_value else p.init
            dtype = DType.of(p.dtype)
            g.parameter(key, p.shape, init=init, dtype=dtype, trainable=p.requires_grad)
            state.params[id(p)] = key
            state.descs[key] = TensorDesc(dtype, p.shape)
    except (ValueError, EngineError) as e:
        if isinstance(e, TraceError):
            raise
        raise TraceError(str(e)) from None


def _run(tracer: Tracer, module: Module, specs: list[tuple[str, tuple[int, ...], DType]],
         scales: Mapping[str, float] | None = None) -> Tensor:
    from engine.nn.functional import dequantize_linear

    scales = scales or {}
    args = [dequantize_linear(tracer.tensor(key), scales[key]) if key in scales
            else tracer.tensor(key) for key, _, _ in specs]
    names = [key for key, _, _ in specs]
    try:
        inspect.signature(module.forward).bind(**dict(zip(names, args, strict=True)))
        by_name = True
    except (TypeError, ValueError):
        by_name = False
    out = module(**dict(zip(names, args, strict=True))) if by_name else module(*args)
    if isinstance(out, _Ops):
        return out._t()
    raise TraceError(f"{type(module).__name__}.forward returned {type(out).__name__}; it must "
                     "return one tensor (the logits)", where=_forward_site(module))


def _forward_site(module: Module) -> tuple[str, int] | None:
    try:
        fn = type(module).forward
        return inspect.getsourcefile(fn) or "", fn.__code__.co_firstlineno
    except (TypeError, OSError, AttributeError):
        return None


def _placeholder(tracer: Tracer, state: GraphState, target: str, shape: tuple[int, ...],
                 dtype: str, info: dict[str, Any]) -> Tensor:
    """The target placeholder, declared when the first path needs it."""
    from engine.graph import TensorDesc

    if target not in state.graph.variables:
        if info["shape"] is not None:
            shape = tuple(BATCH if (d is None and i == 0) else int(d)
                          for i, d in enumerate(info["shape"]))
        dt = DType.of(info["dtype"] or dtype)
        state.graph.placeholder(target, shape, dt)
        state.descs[target] = TensorDesc(dt, shape)
    return tracer.tensor(target)


def _flat(x: Tensor) -> Tensor:
    """``[b, 1]`` logits as ``[b]`` (the regression target's shape)."""
    if x.batched and x.ndim == 2 and x.desc.shape[1] == 1:
        return x.reshape(-1)
    return x


def _loss(tracer: Tracer, loss: str | LossFn, out: Tensor, state: GraphState, target: str,
          info: dict[str, Any]) -> Tensor:
    if callable(loss):
        y = _placeholder(tracer, state, target, out.desc.shape, "float32", info)
        value = loss(out, y)
        if not isinstance(value, _Ops):
            raise TraceError(f"the loss function returned {type(value).__name__}, not a tensor")
        return value._t()
    if loss == "cross_entropy":
        if out.ndim < 2:
            raise TraceError(f"cross_entropy needs scores [batch, classes, ...], the model "
                             f"returned {out.shape}")
        shape = (out.desc.shape[0], *out.desc.shape[2:])
        y = _placeholder(tracer, state, target, shape, "int64", info)
        return F.cross_entropy(out, y)
    pred = _flat(out)
    y = _placeholder(tracer, state, target, pred.desc.shape, "float32", info)
    if loss == "bce":
        return F.binary_cross_entropy_with_logits(pred, y)
    return _REGRESSION[loss](pred, y)


def _scalar_loss(value: Tensor, loss: Any) -> Tensor:
    if value.desc.shape != ():
        raise TraceError(f"the loss must be a scalar, got shape {value.shape}; reduce it "
                         "(.mean())")
    return value


def _two_class_scores(z: Tensor) -> Tensor:
    """``[b]`` logits of class 1 as scores ``[b, 2]`` ``(0, z)``: their softmax is
    ``(1 - sigmoid(z), sigmoid(z))``, their arg-max ``z > 0``."""
    col = z.unsqueeze(1)
    return F.cat([col * 0.0, col], dim=1)


def _metrics(tracer: Tracer, names: list[str], loss: str | LossFn | None, logits: Tensor,
             state: GraphState, target: str, info: dict[str, Any]) -> list[str]:
    out = []
    regression = loss in _REGRESSION
    bce = loss == "bce"
    scores = _two_class_scores(_flat(logits)) if bce and names else logits
    for m in names:
        if m == "loss":
            value = _scalar_loss(_loss(tracer, loss, logits, state, target, info),  # type: ignore[arg-type]
                                 loss)
            tracer.rename(value, "eval_loss")
            out.append("eval_loss")
            continue
        if m == "regression_sums":
            pred = _flat(logits)
            y = _placeholder(tracer, state, target, pred.desc.shape, "float32", info)
            value = tracer.emit("RegressionSums", [pred, y])
        else:
            if regression:
                raise TraceError(f"metric {m!r} needs class scores; loss {loss!r} is a "
                                 "regression (use regression_sums or loss)")
            if m == "positive_score":
                if scores.ndim != 2 or scores.desc.shape[1] != 2:
                    raise TraceError(f"positive_score needs two classes, the model returned "
                                     f"{logits.shape}")
                value = tracer.emit("PositiveScore", [scores])
            else:
                shape = (scores.desc.shape[0], *scores.desc.shape[2:])
                y = _placeholder(tracer, state, target, shape, "int64", info)
                if y.dtype != "int64":
                    y = y.long()
                value = tracer.emit("Accuracy" if m == "accuracy" else "ClassCounts",
                                    [scores, y])
        tracer.rename(value, m)
        out.append(m)
    return out
