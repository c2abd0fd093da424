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

from engine.compile.passes.ir import IR, IRNode
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

    def alias_ends(self) -> dict[str, int]:
        """Each root that values written in place over it alias -> the last instruction
        that reads one of them (its memory is busy until then, or its own end)."""
        last: dict[str, int] = {}
        end = self.end
        for member, root in self.alias.items():
            e = end[member]
            if e > last.get(root, -1):
                last[root] = e
        return last


def analyze(ir: IR, inplace: bool = True) -> Lifetimes:
    nodes = ir.nodes()
    lt = Lifetimes(len(nodes))
    persistent = {n for n, k in ir.kind.items() if k in PERSISTENT_KINDS} | ir.keep
    start, end = lt.start, lt.end
    t = 0
    for path in ir.paths:
        first = t  # a value that starts before this is another path's
        for node in (*path.forward, *path.backward):
            for x in node.inputs:
                s = start.get(x)
                if s is not None:
                    end[x] = t
                    if s < first:
                        persistent.add(x)  # computed by one path, read by another
            for o in node.outputs:
                start[o] = end[o] = t
            t += 1
    for name in persistent:
        start.pop(name, None)
        end.pop(name, None)
    lt.persistent = persistent
    if inplace:
        _in_place(ir, nodes, lt)
    return lt


def _in_place(ir: IR, nodes: list[IRNode], lt: Lifetimes) -> None:
    start, end, alias, zone, descs = lt.start, lt.end, lt.alias, ir.zone, ir.descs
    inplace = {name: get_op(name).inplace for name in {node.op for node in nodes}}
    for t, node in enumerate(nodes):
        allowed = inplace[node.op]
        if not allowed or node.param_sink is not None:
            continue
        out = node.outputs[0]
        if out not in start:
            continue
        for k in allowed:
            x = node.inputs[k]
            if end.get(x) == t and zone[x] == zone[out]:
                a, b = descs[x], descs[out]
                if a is b or _same_bytes(a, b):  # one object: the IR interns descriptors
                    alias[out] = alias.get(x, x)
                    break


def _same_bytes(a: TensorDesc, b: TensorDesc) -> bool:
    """Equal sizes at every batch, and the same element type."""
    return a.dtype == b.dtype and a.batched == b.batched and a.numel() == b.numel()
