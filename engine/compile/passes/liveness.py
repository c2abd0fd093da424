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
dies at that op, if both hold the same bytes in the same zone.  A *view* (an op whose
output is its input's bytes in another shape: ``OpDef.view``) takes its input's memory
even while the input stays live, and so does a view of a parameter or placeholder that
no instruction writes.  Values in one memory form an *alias group* (its root owns the
memory); since a view and its input may be live at once, an op writes in place over a
value only when no member of its group is read after that op, never over a parameter's
or placeholder's bytes, and only through the input it runs in place over: bytes are
written only when nothing else live occupies them.

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
FIXED_KINDS = frozenset({"param", "placeholder"})  # set between steps only: views show them


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
    # value -> the root whose memory it takes: written in place over it (the root's
    # memory busy until the last read of any of them), or a view of it (then the root
    # may be a parameter, its memory its own)
    alias: dict[int, int] = field(default_factory=dict)

    @property
    def steps(self) -> int:
        """Instructions in the schedule."""
        return len(self.values.nodes)

    def alias_ends(self) -> dict[int, int]:
        """Each root that values written in place over it (or views of it) alias -> the
        last instruction that reads one of them (its memory is busy until then, or its
        own end)."""
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
    ops = {name: get_op(name) for name in {node.op for node in values.nodes}}
    # A view may show the bytes of a parameter or placeholder no instruction writes
    # (running statistics are written): they change only between steps, in the update
    # or when fed.  When the VM reads a placeholder from the caller's array, the view's
    # kernel sees two addresses and copies the array into the placeholder's own bytes.
    mutated = {ins[k] for node, ins in zip(values.nodes, values.ins, strict=True)
               for k in ops[node.op].writes}
    fixed = [k in FIXED_KINDS and s < 0 for k, s in zip(values.kind, lt.start, strict=True)]
    group_end: dict[int, int] = {}  # root -> the last read of any value in its memory
    steps = zip(values.nodes, values.ins, values.outs, strict=True)
    for t, (node, ins, outs) in enumerate(steps):
        op = ops[node.op]
        if (not op.inplace and not op.view) or node.param_sink is not None:
            continue
        out = outs[0]
        if not temp[out]:
            continue
        if op.view:
            x = ins[0]
            if (temp[x] or fixed[x]) and zone[x] == zone[out] and x not in mutated \
                    and out not in mutated and _same_bytes(descs[x], descs[out]):
                root = alias.get(x, x)
                alias[out] = root
                group_end[root] = max(group_end.get(root, end[root]), end[out])
                continue
        for k in op.inplace:
            x = ins[k]
            if not temp[x] or zone[x] != zone[out] or not _same_bytes(descs[x], descs[out]):
                continue
            root = alias.get(x, x)
            # Nothing else in x's memory is read later (a view of it, or x viewed), nor
            # read here through another name: the kernel may overwrite only input k.
            if not temp[root] or group_end.get(root, end[root]) != t or any(
                    v != x and alias.get(v, v) == root for v in ins):
                continue
            alias[out] = root
            group_end[root] = end[out]
            break


def _same_bytes(a: TensorDesc, b: TensorDesc) -> bool:
    """Equal sizes at every batch, and the same element type."""
    if a is b:  # one object: the IR interns descriptors
        return True
    return a.dtype == b.dtype and a.batched == b.batched and a.numel() == b.numel()
