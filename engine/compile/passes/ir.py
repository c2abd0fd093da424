"""The compiler's intermediate form: the graph's nodes in execution order, with every
attribute defaulted, every output named, every variable's generic descriptor and the
zone it lives in.  Passes take an :class:`IR` and return it (or a plan from it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.graph import CalcGraph, Init, Mode, Regularization, TensorDesc


@dataclass(slots=True)  # tens of thousands in a large graph: built and read often
class IRNode:
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict[str, Any]
    path: int
    backward: bool = False
    param_sink: str | None = None  # writes (or accumulates into) this parameter's gradient
    origin: str = ""  # "op #3 'MatMul' in path 'learn'", for error messages
    variant_fixed: bool = False  # the user named its ``algorithm``: never auto-tuned


@dataclass
class IRPath:
    name: str
    mode: Mode
    forward: list[IRNode] = field(default_factory=list)
    backward: list[IRNode] = field(default_factory=list)
    loss: str | None = None
    seed: str | None = None  # the loss gradient that apply_loss writes
    params: list[str] = field(default_factory=list)  # trainable parameters it updates


@dataclass
class IRParam:
    name: str
    init: Init
    regularization: Regularization | None
    trainable: bool
    written: bool = False  # an op updates it in place (running statistics): not a constant


@dataclass
class IR:
    graph: CalcGraph
    paths: list[IRPath]
    descs: dict[str, TensorDesc] = field(default_factory=dict)  # generic: 0 = batch
    zone: dict[str, str] = field(default_factory=dict)
    kind: dict[str, str] = field(default_factory=dict)  # param/placeholder/generic/grad/seed
    params: dict[str, IRParam] = field(default_factory=dict)  # in declaration order
    grad_of: dict[str, str] = field(default_factory=dict)  # parameter -> its gradient buffer
    keep: set[str] = field(default_factory=set)  # read back by the user: never shared
    counts: dict[str, int] = field(default_factory=dict)  # node counts per stage (reports)
    # One object per distinct descriptor (equal descriptors are one object), and the
    # shape rules' results by their arguments (engine.compile.passes.shapes.rule_key):
    # the input descriptors, kept alive here, and the outputs.
    unique: dict[TensorDesc, TensorDesc] = field(default_factory=dict, repr=False)
    shape_memo: dict[tuple[Any, ...], tuple[tuple[TensorDesc, ...], tuple[TensorDesc, ...]]] \
        = field(default_factory=dict, repr=False)

    def intern(self, desc: TensorDesc) -> TensorDesc:
        """The one object equal to ``desc`` that this IR uses."""
        return self.unique.setdefault(desc, desc)

    def nodes(self) -> list[IRNode]:
        """Every node in execution order: each path's forward then its backward nodes
        (the order of the emitted bytecode, over which lifetimes are measured)."""
        out: list[IRNode] = []
        for p in self.paths:
            out.extend(p.forward)
            out.extend(p.backward)
        return out

    def count_forward_nodes(self) -> int:
        """How many nodes the forward programs of all paths hold."""
        return sum(len(p.forward) for p in self.paths)

    def drop(self, name: str) -> None:
        """Forget a value a pass removed."""
        self.descs.pop(name, None)
        self.zone.pop(name, None)
        self.kind.pop(name, None)
        self.params.pop(name, None)

    def trainable(self) -> list[str]:
        return [n for n, p in self.params.items() if p.trainable]
