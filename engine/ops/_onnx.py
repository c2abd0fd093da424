"""An op's ONNX form (``OpDef.onnx``): the ONNX operator it is, how a node is written out
and how an ONNX node of that operator is read in.

:mod:`engine.onnx_io` keeps no op names of its own: it reads these forms.  onnx itself is
never imported here (nor by the op modules): an exporter receives onnx's ``helper`` and
``numpy_helper`` modules, an importer an :class:`ImportContext`.

- ``export``: ``(node, helper, numpy_helper) -> (ONNX nodes, initializers)``; ``None``
  writes the same node with the same attributes, less ``engine_attrs``;
- ``import_``: ``(ctx, onnx node, inputs, attrs) -> (inputs, attrs)`` of the engine op,
  reading constant inputs into attributes; ``None`` takes them as they are;
- ``build``: ``(ctx, path, onnx node, inputs, attrs) -> bool``, for a node that becomes
  several engine ops (a 1-D Conv); it returns False where one op of the same name does;
- ``attr_inputs``: the ONNX inputs that are attributes here (constants at import);
- ``needs_shapes``: the import reads static shapes (``ctx.shapes``), and the export
  finds its inputs' shapes in the node's attribute ``input_shapes``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from engine.graph import Node

ONNX_DTYPES = {"float32": 1, "float64": 11, "int64": 7, "int32": 6, "int8": 3, "uint8": 2,
               "bool": 9}


class ImportContext(Protocol):
    """What an import converter may read of the model being imported."""

    batch: bool  # the inputs' first dimension is the batch
    declared_batch: int | None  # the first input's leading dimension as written
    training: bool  # imported with a loss: Dropout draws, batch norm uses batch statistics
    opset: int
    shapes: dict[str, tuple[int, ...]]  # static shapes (0: unknown dimension)

    def const(self, name: str, node: Any) -> np.ndarray:
        """The value of a constant input; GraphError naming the node otherwise."""
        ...

    def is_const(self, name: str) -> bool:
        """Whether ``name`` is a constant (an initializer, a Constant or a folded value)."""
        ...

    def state(self, names: list[str]) -> None:
        """Marks parameters the op updates (running statistics): never trainable."""
        ...


Exported = tuple[list[Any], list[Any]]  # ONNX nodes, initializers
Exporter = Callable[[Node, Any, Any], Exported]
Importer = Callable[[ImportContext, Any, list[str], dict[str, Any]],
                    tuple[list[str], dict[str, Any]]]
Builder = Callable[[ImportContext, Any, Any, list[str], dict[str, Any]], bool]


@dataclass(frozen=True, kw_only=True)
class OnnxForm:
    """How an op is written to and read from ONNX (see the module docstring)."""

    name: str  # the ONNX operator
    export: Exporter | None = None
    import_: Importer | None = None
    build: Builder | None = None
    exports: bool = True  # False: imported only
    imports: bool = True  # False: exported only (as another operator)
    engine_attrs: frozenset[str] = frozenset()  # attributes ONNX does not have
    attr_inputs: tuple[int, ...] = ()
    needs_shapes: bool = False


@dataclass(frozen=True)
class EngineInternal:
    """Marks an op with no ONNX form, and says why."""

    reason: str


ENGINE_INTERNAL = EngineInternal("an internal op (a gradient, a fusion or a stacked form)")
NOT_IN_ONNX = EngineInternal("ONNX has no such operator")


def onnx_attrs(attrs: dict[str, Any], drop: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Attributes as ONNX's ``make_node`` takes them; empty ones are ONNX's defaults."""
    out = {}
    for k, v in attrs.items():
        if k in drop:
            continue
        if v is None or (isinstance(v, tuple | list) and len(v) == 0):
            continue  # ONNX's own default
        out[k] = list(v) if isinstance(v, tuple) else v
    return out


def import_axes(ctx: ImportContext, node: Any, ins: list[str], attrs: dict[str, Any]
                ) -> tuple[list[str], dict[str, Any]]:
    """Reduce*, Squeeze and Unsqueeze take their axes as input 1 from opset 13 or 18."""
    if len(ins) > 1:
        attrs["axes"] = tuple(int(v) for v in ctx.const(ins[1], node))
        ins = ins[:1]
    return ins, attrs


def export_axes(n: Node, helper: Any, nh: Any) -> Exported:
    """Squeeze and Unsqueeze take their axes as an input from opset 13."""
    axes = nh.from_array(np.asarray(n.attrs["axes"], dtype=np.int64), f"{n.outputs[0]}:axes")
    return [helper.make_node(n.op, [n.inputs[0], axes.name], list(n.outputs))], [axes]


def inputs_as_attrs(*keys: str) -> Importer:
    """An importer reading ONNX inputs 1, 2, ... (constants) into attributes ``keys``."""

    def convert(ctx: ImportContext, node: Any, ins: list[str], attrs: dict[str, Any]
                ) -> tuple[list[str], dict[str, Any]]:
        for pos, key in enumerate(keys, start=1):
            if pos < len(node.input) and node.input[pos]:
                v = ctx.const(node.input[pos], node)  # a scalar, or a tuple
                attrs[key] = v.item() if v.ndim == 0 else tuple(v.ravel().tolist())
        return ins[:1], attrs

    return convert


def attrs_as_inputs(*keys: str, floats: tuple[str, ...] = (), keep: tuple[str, ...] = ()
                    ) -> Exporter:
    """An exporter writing attributes ``keys`` as ONNX's (optional) inputs 1, 2, ...
    (``floats`` as float32, the others int64), and ``keep`` as attributes."""

    def export(n: Node, helper: Any, nh: Any) -> Exported:
        ins, extra = [n.inputs[0]], []
        for key in keys:
            v = n.attrs.get(key)
            if v is None or (isinstance(v, tuple) and not v):
                ins.append("")
                continue
            dtype = np.float32 if key in floats else np.int64
            t = nh.from_array(np.asarray(v, dtype=dtype), f"{n.outputs[0]}:{key}")
            extra.append(t)
            ins.append(t.name)
        while ins[-1] == "":
            ins.pop()
        attrs = {k: n.attrs[k] for k in keep}
        return [helper.make_node(n.op, ins, list(n.outputs), **attrs)], extra

    return export
