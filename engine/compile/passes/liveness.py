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

The back end (this analysis, the planner and the emitter) works on *numbered*
values (:class:`Values`): each name is looked up once, and what follows indexes
lists.  A 10,000-node training graph has 30,000 values and 75,000 operand slots, and
a lookup in a dict that large costs more than the rest of the work on a value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import count, repeat

from engine.compile.passes.ir import IR, IRNode
from engine.graph import TensorDesc
from engine.ops import get_op

PERSISTENT_KINDS = frozenset({"param", "placeholder", "grad", "seed"})


@dataclass
class Values:
    """The IR's values numbered in the order of ``IR.zone`` (which the layout of the
    memory each keeps for itself follows), with what the back end needs of each,
    and the instructions in execution order with their operands as numbers."""

    names: list[str]
    number: dict[str, int]  # name -> number
    zone: list[str]
    desc: list[TensorDesc]
    kind: list[str]
    nodes: list[IRNode]  # each path's forward then backward nodes (IR.nodes)
    ins: list[tuple[int, ...]]  # per node
    outs: list[tuple[int, ...]]

    @staticmethod
    def of(ir: IR) -> Values:
        descs = ir.descs
        if len(ir.zone) == len(descs):  # the same values: each with a descriptor has a zone
            names, zones = list(ir.zone), list(ir.zone.values())
        else:
            names = [n for n in ir.zone if n in descs]
            zones = list(map(ir.zone.__getitem__, names))
        number = dict(zip(names, count()))
        at = number.__getitem__
        nodes = ir.nodes()
        return Values(names, number, zones, list(map(descs.__getitem__, names)),
                      list(map(ir.kind.__getitem__, names)), nodes,
                      [tuple(map(at, n.inputs)) for n in nodes],
                      [tuple(map(at, n.outputs)) for n in nodes])


@dataclass
class Lifetimes:
    values: Values
    temps: list[int]  # the values that are not persistent, in the order they are produced
    start: list[int]  # per value: the instruction that writes it (-1: none does)
    end: list[int]  # the last instruction that reads it (or start)
    persistent: list[bool]  # per value
    alias: dict[int, int] = field(default_factory=dict)  # value -> root whose memory it takes

    @property
    def steps(self) -> int:
        """Instructions in the schedule."""
        return len(self.values.nodes)

    def alias_ends(self) -> dict[int, int]:
        """Each root that values written in place over it alias -> the last instruction
        that reads one of them (its memory is busy until then, or its own end)."""
        last: dict[int, int] = {}
        end = self.end
        for member, root in self.alias.items():
            e = end[member]
            if e > last.get(root, -1):
                last[root] = e
        return last


def analyze(ir: IR, inplace: bool = True) -> Lifetimes:
    values = Values.of(ir)
    n = len(values.names)
    persistent = list(map(PERSISTENT_KINDS.__contains__, values.kind))
    for name in ir.keep:
        v = values.number.get(name)
        if v is not None:
            persistent[v] = True
    start, end = [-1] * n, [-1] * n
    produced: list[int] = []
    t = 0
    ins, outs = values.ins, values.outs
    for path in ir.paths:
        first = t  # a value that starts before this is another path's
        for _ in range(len(path.forward) + len(path.backward)):
            for x in ins[t]:
                s = start[x]
                if s >= 0:
                    end[x] = t
                    if s < first:
                        persistent[x] = True  # computed by one path, read by another
            for o in outs[t]:
                if start[o] < 0:
                    produced.append(o)
                start[o] = end[o] = t
            t += 1
    lt = Lifetimes(values, [v for v in produced if not persistent[v]], start, end, persistent)
    if inplace:
        _in_place(lt)
    return lt


def _in_place(lt: Lifetimes) -> None:
    values, end, alias = lt.values, lt.end, lt.alias
    temp = [False] * len(end)
    list(map(temp.__setitem__, lt.temps, repeat(True)))
    zone, descs = values.zone, values.desc
    inplace = {name: get_op(name).inplace for name in {node.op for node in values.nodes}}
    steps = zip(values.nodes, values.ins, values.outs, strict=True)
    for t, (node, ins, outs) in enumerate(steps):
        allowed = inplace[node.op]
        if not allowed or node.param_sink is not None:
            continue
        out = outs[0]
        if not temp[out]:
            continue
        for k in allowed:
            x = ins[k]
            if temp[x] and end[x] == t and zone[x] == zone[out]:
                a, b = descs[x], descs[out]
                if a is b or _same_bytes(a, b):  # one object: the IR interns descriptors
                    alias[out] = alias.get(x, x)
                    break


def _same_bytes(a: TensorDesc, b: TensorDesc) -> bool:
    """Equal sizes at every batch, and the same element type."""
    return a.dtype == b.dtype and a.batched == b.batched and a.numel() == b.numel()
