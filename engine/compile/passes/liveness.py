"""Lifetime analysis over the emitted instruction order (each path's forward then
its backward instructions), and the in-place decisions that follow from it.

A value is *persistent* — it keeps its own memory for the program's whole life —
when it is a parameter, a placeholder, a parameter gradient, a loss seed, a value
the user reads back (``IR.keep``), or a value one path computes and another reads
(paths run in any order the user likes).  Every other value lives from the
instruction that writes it to the last one that reads it; values that are never
live at the same instruction may share memory.

A value read by a path's backward instructions is live until then, so the memory
of what the gradients need is never reused before they have read it (which is why
``VM.backward(p)`` must follow ``VM.forward(p)`` with no other path's forward in
between).

In place: an op whose table entry allows it writes its output over an input that
dies at that op, if both hold the same bytes in the same zone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.compile.passes.ir import IR
from engine.graph import TensorDesc
from engine.ops import get_op

PERSISTENT_KINDS = ("param", "placeholder", "grad", "seed")


@dataclass
class Lifetimes:
    steps: int  # instructions in the schedule
    start: dict[str, int] = field(default_factory=dict)  # shared values only
    end: dict[str, int] = field(default_factory=dict)
    persistent: set[str] = field(default_factory=set)
    alias: dict[str, str] = field(default_factory=dict)  # value -> root whose memory it takes

    def root(self, name: str) -> str:
        return self.alias.get(name, name)

    def groups(self) -> dict[str, tuple[int, int]]:
        """Each memory-owning (root) shared value -> the interval its memory is busy."""
        out = {n: (s, self.end[n]) for n, s in self.start.items() if n not in self.alias}
        for member, root in self.alias.items():
            s, e = out[root]
            out[root] = (s, max(e, self.end[member]))
        return out


def analyze(ir: IR, inplace: bool = True) -> Lifetimes:
    nodes = ir.nodes()
    lt = Lifetimes(len(nodes))
    lt.persistent = {n for n, k in ir.kind.items() if k in PERSISTENT_KINDS} | ir.keep
    owner: dict[str, int] = {}
    for t, node in enumerate(nodes):
        for x in node.inputs:
            if x in owner:
                lt.end[x] = t
                if owner[x] != node.path:
                    lt.persistent.add(x)  # computed by one path, read by another
        for o in node.outputs:
            lt.start[o] = lt.end[o] = t
            owner[o] = node.path
    for name in lt.persistent:
        lt.start.pop(name, None)
        lt.end.pop(name, None)
    if inplace:
        _in_place(ir, nodes, lt)
    return lt


def _in_place(ir: IR, nodes: list, lt: Lifetimes) -> None:
    for t, node in enumerate(nodes):
        allowed = get_op(node.op).inplace
        out = node.outputs[0]
        if not allowed or out not in lt.start or node.param_sink is not None:
            continue
        for k in allowed:
            x = node.inputs[k]
            if x in lt.start and lt.end[x] == t and ir.zone[x] == ir.zone[out] and \
                    _same_bytes(ir.descs[x], ir.descs[out]):
                lt.alias[out] = lt.root(x)
                break


def _same_bytes(a: TensorDesc, b: TensorDesc) -> bool:
    """Equal sizes at every batch, and the same element type."""
    return a.dtype == b.dtype and a.batched == b.batched and a.numel() == b.numel()
